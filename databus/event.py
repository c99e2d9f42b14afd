"""The event wire format: one binary layout for the relay buffer, the wire, the bootstrap
log and the client (docs/wire-format.md). Everything about the bytes lives in this module.

Layout (big-endian, 56-byte fixed header, then key bytes, then the Avro value)::

    offset size field              notes
    ------ ---- ------------------ ----------------------------------------------------
         0    1 magic              0xDB
         1    1 version            1
         2    1 opcode             0 control, 1 upsert, 2 delete
         3    1 flags              bits 0-1 key kind (0 bytes, 1 int64, 2 utf-8 string,
                                   3 composite: JSON array); bit 2 from snapshot/dump
         4    4 header_crc         CRC32 of header bytes 0-3 and 8-55 (all but itself)
         8    4 body_crc           CRC32 of key bytes + value bytes
        12    4 total_length       header + key + value, in bytes
        16    8 scn                window SCN, signed
        24    8 timestamp_ns       source commit time, ns since the epoch
        32    2 partition_id       physical partition id, signed
        34    2 source_id          logical source id; negative ids are control events
        36    8 partition_key      int64: the key if a single int, else stable_key_hash
        44    8 schema_fingerprint CRC-64-AVRO of the value's writer schema, unsigned
        52    4 key_length         length of the key bytes
        56    . key                key_length bytes
         .    . value              total_length - 56 - key_length bytes (Avro binary)

Control events (source_id < 0) carry the SCN of their window. The end-of-window (EOW)
event, source id -2, has an empty key and an 8-byte value: the number of data events
in the window (uint32) and the window checksum (uint32), the CRC32 of the window's data
events' header CRCs in order. Header CRCs cover the body CRCs, so the checksum covers
every byte of the window while costing 4 bytes of hashing per event.

The header CRC is checked before ``total_length`` is trusted, so a flipped length
field can never make a reader run past the event.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal, NamedTuple

from databus._hashing import stable_key_hash
from databus.errors import EventFormatError

MAGIC = 0xDB
VERSION = 1

HEADER = struct.Struct(">BBBBIIIqqhhqQI")
HEADER_SIZE = HEADER.size  # 56
assert HEADER_SIZE == 56

# How far into the header each field lives; used for in-place checks on buffers.
_CRC_OFFSET = 4
_AFTER_CRC = 8
_EOW_VALUE = struct.Struct(">II")
_INT_KEY = struct.Struct(">q")
_U32 = struct.Struct(">I")
# HEADER split at its CRC field (see _pack).
_HEADER_BEFORE_CRC = struct.Struct(">BBBB")
_HEADER_AFTER_CRC = struct.Struct(">IIqqhhqQI")
assert _HEADER_BEFORE_CRC.size == _CRC_OFFSET and _CRC_OFFSET + 4 == _AFTER_CRC
assert _AFTER_CRC + _HEADER_AFTER_CRC.size == HEADER_SIZE

KEY_KIND_MASK = 0x03
FLAG_FROM_SNAPSHOT = 0x04
_KNOWN_FLAGS = KEY_KIND_MASK | FLAG_FROM_SNAPSHOT

# Control source ids (negative, as in Databus).
EOW_SOURCE_ID = -2
CHECKPOINT_SOURCE_ID = -3
ERROR_SOURCE_ID = -4
HEARTBEAT_SOURCE_ID = -5
# Dump markers (DESIGN 8.1): a table's dump starts / ends in this window.
DUMP_START_SOURCE_ID = -6
DUMP_END_SOURCE_ID = -7
# Quarantine marker (DESIGN 17): a source is set aside (or healed) in this window
# (relay/quarantine/_record.py).
QUARANTINE_SOURCE_ID = -8

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class Op(IntEnum):
    CONTROL = 0
    UPSERT = 1
    DELETE = 2


_OPS = tuple(Op)
_MAX_OP = max(_OPS)


class KeyKind(IntEnum):
    BYTES = 0
    INT = 1
    STRING = 2
    COMPOSITE = 3


Key = int | str | bytes | tuple[object, ...]
Buffer = bytes | bytearray | memoryview


class EventHeader(NamedTuple):
    """The decoded fixed header of one event.

    A NamedTuple rather than a frozen dataclass: it is built once per event on every
    hot path, and tuple construction is several times cheaper.
    """

    op: Op
    flags: int
    header_crc: int
    body_crc: int
    total_length: int
    scn: int
    timestamp_ns: int
    partition_id: int
    source_id: int
    partition_key: int
    schema_fingerprint: int
    key_length: int

    @property
    def is_control(self) -> bool:
        return self.source_id < 0

    @property
    def is_eow(self) -> bool:
        return self.source_id == EOW_SOURCE_ID

    @property
    def key_kind(self) -> KeyKind:
        return KeyKind(self.flags & KEY_KIND_MASK)

    @property
    def from_snapshot(self) -> bool:
        return bool(self.flags & FLAG_FROM_SNAPSHOT)

    @property
    def value_length(self) -> int:
        return self.total_length - HEADER_SIZE - self.key_length


class Event(NamedTuple):
    """One decoded event: its header, key bytes and (still Avro-encoded) value bytes."""

    header: EventHeader
    key_bytes: bytes
    value: bytes

    @property
    def scn(self) -> int:
        return self.header.scn

    @property
    def op(self) -> Op:
        return self.header.op

    @property
    def source_id(self) -> int:
        return self.header.source_id

    @property
    def key(self) -> Key:
        return decode_key(self.header.key_kind, self.key_bytes)


@dataclass(frozen=True, slots=True)
class EndOfWindow:
    """The payload of an EOW control event."""

    scn: int
    event_count: int
    checksum: int


# -- keys ---------------------------------------------------------------------------


def encode_key(key: Key) -> tuple[KeyKind, bytes, int]:
    """Key -> (kind, bytes, partition key). Composite keys are a canonical JSON array."""
    if isinstance(key, bool):
        raise EventFormatError("a key cannot be a bool", reason="bad key")
    if isinstance(key, int):
        if not _INT64_MIN <= key <= _INT64_MAX:
            raise EventFormatError(f"int key {key} does not fit in int64", reason="bad key")
        return KeyKind.INT, _INT_KEY.pack(key), key
    if isinstance(key, str):
        try:
            data = key.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate has no UTF-8 form
            raise EventFormatError(f"string key is not UTF-8-encodable: {exc}",
                                   reason="bad key") from exc
        return KeyKind.STRING, data, stable_key_hash(data)
    if isinstance(key, bytes | bytearray | memoryview):
        data = bytes(key)
        return KeyKind.BYTES, data, stable_key_hash(data)
    if isinstance(key, tuple):
        try:
            data = _composite_bytes(list(key))
        except (TypeError, ValueError, RecursionError) as exc:
            raise EventFormatError(f"composite key not JSON-able: {exc}", reason="bad key") from exc
        return KeyKind.COMPOSITE, data, stable_key_hash(data)
    raise EventFormatError(f"unsupported key type {type(key).__name__}", reason="bad key")


def _composite_bytes(items: list[object]) -> bytes:
    # The one canonical form of a composite key; the decoder insists on it.
    return json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode()


def decode_key(kind: KeyKind, data: bytes, offset: int = 0) -> Key:
    """The key of ``kind`` held in ``data``; ``EventFormatError`` for bytes that no
    ``encode_key`` can have written (bad UTF-8, a composite key that is not a JSON array
    in canonical form), whatever the CRCs say: a relay may have recomputed them."""
    if kind is KeyKind.INT:
        if len(data) != 8:
            raise EventFormatError("int key is not 8 bytes", offset=offset, reason="bad key")
        return int(_INT_KEY.unpack(data)[0])
    if kind is KeyKind.STRING:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise EventFormatError("string key is not UTF-8", offset=offset,
                                   reason="bad key") from None
    if kind is KeyKind.COMPOSITE:
        try:
            items = json.loads(data)
            canonical = isinstance(items, list) and _composite_bytes(items) == data
        except (ValueError, RecursionError, TypeError):  # UnicodeDecodeError is a ValueError
            canonical = False
        if not canonical:
            raise EventFormatError("composite key is not a canonical JSON array",
                                   offset=offset, reason="bad key")
        return tuple(items)
    return data


def decode_data_key(header: EventHeader, data: bytes, offset: int = 0) -> Key:
    """The key of a data event whose CRCs checked out, checked against the header:
    the partition key must be the one ``encode_key`` derives from the key bytes. A
    mismatch would route the event to the wrong partition (server-side filters and
    parallel consumers split by it), so it is a bad event, not a key to trust."""
    kind = KeyKind(header.flags & KEY_KIND_MASK)
    key = decode_key(kind, data, offset)
    if kind is KeyKind.INT:
        if key != header.partition_key:
            raise EventFormatError("int key and partition key differ", offset=offset,
                                   reason="bad key")
    elif stable_key_hash(data) != header.partition_key:
        raise EventFormatError("partition key is not the hash of the key", offset=offset,
                               reason="bad key")
    return key


def check_control_fields(header: EventHeader, offset: int = 0) -> None:
    """A control event carries no key, partition key, schema or flags (``_pack`` as
    ``encode_control``/``encode_eow`` call it); an EOW's value is exactly 8 bytes."""
    if header.flags or header.key_length or header.partition_key or header.schema_fingerprint:
        raise EventFormatError("control event with a key, flags or schema", offset=offset,
                               reason="bad field")
    if header.source_id == EOW_SOURCE_ID and header.value_length != _EOW_VALUE.size:
        raise EventFormatError("EOW payload is not 8 bytes", offset=offset, reason="bad length")


# -- encoding -----------------------------------------------------------------------


def _pack(
    op: int,
    flags: int,
    scn: int,
    timestamp_ns: int,
    partition_id: int,
    source_id: int,
    partition_key: int,
    fingerprint: int,
    key: bytes,
    value: bytes,
) -> bytes:
    total = HEADER_SIZE + len(key) + len(value)
    body_crc = zlib.crc32(value, zlib.crc32(key))
    # The header in two packs around its CRC field: the CRC covers both, and joining
    # the pieces costs less than patching a bytearray through memoryviews (this runs
    # once per event of every fetcher and every dumped row).
    try:
        before = _HEADER_BEFORE_CRC.pack(MAGIC, VERSION, op, flags)
        after = _HEADER_AFTER_CRC.pack(
            body_crc, total, scn, timestamp_ns, partition_id, source_id, partition_key,
            fingerprint, len(key),
        )
    except struct.error as exc:
        raise EventFormatError(f"header field out of range: {exc}", reason="bad field") from exc
    crc = zlib.crc32(after, zlib.crc32(before))
    return b"".join((before, _U32.pack(crc), after, key, value))


def encode_event(
    *,
    scn: int,
    source_id: int,
    op: Op,
    key: Key,
    value: bytes,
    timestamp_ns: int = 0,
    partition_id: int = 0,
    schema_fingerprint: int = 0,
    from_snapshot: bool = False,
) -> bytes:
    """Encode one data event (``value`` is already Avro-encoded)."""
    if source_id < 0:
        raise EventFormatError("data events need a source id >= 0", reason="bad field")
    if op is Op.CONTROL:
        raise EventFormatError("data events cannot have the control opcode", reason="bad field")
    kind, key_bytes, partition_key = encode_key(key)
    flags = int(kind) | (FLAG_FROM_SNAPSHOT if from_snapshot else 0)
    return _pack(
        op, flags, scn, timestamp_ns, partition_id, source_id, partition_key,
        schema_fingerprint, key_bytes, value,
    )


def encode_eow(
    *, scn: int, event_count: int, checksum: int, timestamp_ns: int = 0, partition_id: int = 0
) -> bytes:
    """Encode the end-of-window control event of window ``scn``."""
    value = _EOW_VALUE.pack(event_count, checksum)
    return _pack(
        Op.CONTROL, 0, scn, timestamp_ns, partition_id, EOW_SOURCE_ID, 0, 0, b"", value
    )


def encode_control(
    *, scn: int, source_id: int, payload: bytes = b"", timestamp_ns: int = 0, partition_id: int = 0
) -> bytes:
    """Encode a control event other than EOW (heartbeat, checkpoint, error)."""
    if source_id >= 0:
        raise EventFormatError("control events need a negative source id", reason="bad field")
    return _pack(Op.CONTROL, 0, scn, timestamp_ns, partition_id, source_id, 0, 0, b"", payload)


# How a table's dump ended (the end marker's "outcome"; absent means "done").
DUMP_OUTCOMES = ("done", "failed", "cancelled")


def encode_dump_marker(
    *, scn: int, kind: Literal["start", "end"], source: str, dump_id: str,
    rows: int | None = None, timestamp_ns: int = 0, partition_id: int = 0,
    outcome: str = "done",
) -> bytes:
    """A dump start or end marker of ``source`` in window ``scn``: a control event whose
    value is canonical JSON ``{"dump": id, "source": name}`` (end: plus ``"rows"``, and
    ``"outcome"`` when the table's dump failed or was cancelled; a completed table's end
    is written without it, as before outcomes existed)."""
    if kind == "start":
        if rows is not None or outcome != "done":
            raise EventFormatError("a dump start marker has no row count or outcome",
                                   reason="bad field")
        payload: dict[str, object] = {"dump": dump_id, "source": source}
        source_id = DUMP_START_SOURCE_ID
    elif kind == "end":
        if rows is None or rows < 0:
            raise EventFormatError("a dump end marker needs its row count", reason="bad field")
        if outcome not in DUMP_OUTCOMES:
            raise EventFormatError(f"unknown dump outcome {outcome!r}", reason="bad field")
        payload = {"dump": dump_id, "rows": rows, "source": source}
        if outcome != "done":
            payload["outcome"] = outcome
        source_id = DUMP_END_SOURCE_ID
    else:
        raise EventFormatError(f"unknown dump marker kind {kind!r}", reason="bad field")
    value = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return encode_control(scn=scn, source_id=source_id, payload=value,
                          timestamp_ns=timestamp_ns, partition_id=partition_id)


@dataclass(frozen=True, slots=True)
class DumpMarker:
    """A decoded dump marker (``encode_dump_marker``)."""

    kind: Literal["start", "end"]
    source: str
    dump_id: str
    rows: int | None
    scn: int
    outcome: str | None = None  # end markers: "done", "failed" or "cancelled"


def decode_dump_marker(header: EventHeader, payload: Buffer, offset: int = 0) -> DumpMarker:
    """The marker in ``payload`` (the value bytes of a -6/-7 control event), checked
    strictly: anything but the canonical JSON an encoder writes is an ``EventFormatError``."""
    from databus._json import loads_bounded

    if header.source_id == DUMP_START_SOURCE_ID:
        kind: Literal["start", "end"] = "start"
        fields = {"dump", "source"}
    elif header.source_id == DUMP_END_SOURCE_ID:
        kind = "end"
        fields = {"dump", "rows", "source"}
    else:
        raise EventFormatError("not a dump marker", offset=offset, reason="bad field")
    try:
        data = loads_bounded(bytes(payload), max_chars=4096, max_depth=2)
    except ValueError:
        raise EventFormatError("dump marker payload is not JSON", offset=offset,
                               reason="bad value") from None
    if not isinstance(data, dict) or (set(data) != fields and not (
            kind == "end" and set(data) == fields | {"outcome"})):
        raise EventFormatError("dump marker fields", offset=offset, reason="bad value")
    source, dump_id, rows = data["source"], data["dump"], data.get("rows")
    outcome = data.get("outcome", "done") if kind == "end" else None
    if not isinstance(source, str) or not isinstance(dump_id, str) or not source or (
            kind == "end" and (not isinstance(rows, int) or isinstance(rows, bool)
                               or not 0 <= rows <= _INT64_MAX)):
        raise EventFormatError("dump marker field types", offset=offset, reason="bad value")
    # "done" is never written (a completed table's end is the marker as it always was).
    if "outcome" in data and outcome not in DUMP_OUTCOMES[1:]:
        raise EventFormatError("dump marker outcome", offset=offset, reason="bad value")
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")
    if canonical != bytes(payload):
        raise EventFormatError("dump marker is not canonical JSON", offset=offset,
                               reason="bad value")
    return DumpMarker(kind, source, dump_id, rows if kind == "end" else None, header.scn,
                      outcome)


class WindowChecksum:
    """Accumulates the EOW checksum and count over a window's data events, in order."""

    __slots__ = ("count", "crc")

    def __init__(self) -> None:
        self.count = 0
        self.crc = 0

    def add(self, header_crc: int) -> None:
        self.count += 1
        self.crc = zlib.crc32(_U32.pack(header_crc), self.crc)

    def add_event(self, event: bytes | memoryview) -> None:
        self.add(_U32.unpack_from(event, _CRC_OFFSET)[0])


# -- decoding -----------------------------------------------------------------------


def decode_header(buf: Buffer, offset: int = 0) -> EventHeader:
    """Decode and verify the header at ``offset``: magic, version, header CRC, lengths.

    Does not read the body; ``verify_event`` checks the body CRC as well.
    """
    end = len(buf)
    if end - offset < HEADER_SIZE:
        raise EventFormatError(
            f"truncated header: {end - offset} of {HEADER_SIZE} bytes",
            offset=offset, reason="truncated",
        )
    (magic, version, op, flags, header_crc, body_crc, total, scn, ts, partition_id,
     source_id, partition_key, fingerprint, key_length) = HEADER.unpack_from(buf, offset)
    if magic != MAGIC:
        raise EventFormatError(f"bad magic 0x{magic:02x}", offset=offset, reason="bad magic")
    if version != VERSION:
        raise EventFormatError(
            f"unknown event version {version}", offset=offset, reason="unknown version"
        )
    crc = zlib.crc32(
        buf[offset + _AFTER_CRC : offset + HEADER_SIZE],
        zlib.crc32(buf[offset : offset + _CRC_OFFSET]),
    )
    if crc != header_crc:
        raise EventFormatError("header CRC mismatch", offset=offset, reason="header crc")
    if op > _MAX_OP or flags & ~_KNOWN_FLAGS:
        raise EventFormatError(
            f"unknown opcode {op} or flags 0x{flags:02x}", offset=offset, reason="bad field"
        )
    if total < HEADER_SIZE + key_length:
        raise EventFormatError(
            f"total length {total} shorter than header and key", offset=offset, reason="bad length"
        )
    if (source_id < 0) != (op == 0):
        raise EventFormatError(
            "opcode and source id disagree on control", offset=offset, reason="bad field"
        )
    return EventHeader(
        _OPS[op], flags, header_crc, body_crc, total, scn, ts, partition_id, source_id,
        partition_key, fingerprint, key_length,
    )


_SOURCE_ID = struct.Struct(">h")
_SOURCE_ID_OFFSET = 34


def restamp_source_id(event: Buffer, source_id: int) -> bytes:
    """``event`` (already verified) with its logical source id replaced and its header
    CRC recomputed. Source ids are per server, so the bootstrap service stores events
    under its own ids; the body and its CRC are untouched."""
    out = bytearray(event)
    _SOURCE_ID.pack_into(out, _SOURCE_ID_OFFSET, source_id)
    view = memoryview(out)
    crc = zlib.crc32(view[_AFTER_CRC:HEADER_SIZE], zlib.crc32(view[:_CRC_OFFSET]))
    _U32.pack_into(out, _CRC_OFFSET, crc)
    return bytes(out)


def _check_body(buf: Buffer, offset: int, header: EventHeader) -> None:
    end = offset + header.total_length
    if end > len(buf):
        raise EventFormatError(
            f"truncated event: {len(buf) - offset} of {header.total_length} bytes",
            offset=offset, reason="truncated",
        )
    if zlib.crc32(memoryview(buf)[offset + HEADER_SIZE : end]) != header.body_crc:
        raise EventFormatError("body CRC mismatch", offset=offset, reason="body crc")


def verify_event(buf: Buffer, offset: int = 0) -> EventHeader:
    """Verify header and body CRCs of the event at ``offset``; return its header."""
    header = decode_header(buf, offset)
    _check_body(buf, offset, header)
    return header


def decode_event(buf: Buffer, offset: int = 0) -> Event:
    """Verify and decode the event at ``offset``."""
    header = verify_event(buf, offset)
    start = offset + HEADER_SIZE
    key_end = start + header.key_length
    end = offset + header.total_length
    if isinstance(buf, bytes):  # slicing bytes copies once; a view would copy again
        return Event(header, buf[start:key_end], buf[key_end:end])
    view = memoryview(buf)
    return Event(header, bytes(view[start:key_end]), bytes(view[key_end:end]))


def decode_eow(event: Event) -> EndOfWindow:
    """The count and checksum an EOW event carries."""
    if not event.header.is_eow:
        raise EventFormatError("not an end-of-window event", reason="bad field")
    if len(event.value) != _EOW_VALUE.size:
        raise EventFormatError("EOW payload is not 8 bytes", reason="bad length")
    count, checksum = _EOW_VALUE.unpack(event.value)
    return EndOfWindow(event.scn, count, checksum)


def iter_events(
    buf: Buffer, *, verify_body: bool = True
) -> Iterator[tuple[int, EventHeader]]:
    """Yield (offset, header) for each event in ``buf``; raises on the first bad one.

    A buffer that ends mid-event is an error too: callers that may receive a partial
    tail (a stream reader) should hold back bytes until ``total_length`` is available.
    """
    view = memoryview(buf)
    offset = 0
    end = len(view)
    while offset < end:
        header = decode_header(view, offset)
        if verify_body:
            _check_body(view, offset, header)
        elif offset + header.total_length > end:
            raise EventFormatError("truncated event", offset=offset, reason="truncated")
        yield offset, header
        offset += header.total_length


def peek_total_length(buf: Buffer, offset: int = 0) -> int | None:
    """The total length of the event starting at ``offset`` once its header has arrived
    and checks out, else None (not enough bytes yet). For incremental stream readers."""
    if len(buf) - offset < HEADER_SIZE:
        return None
    return decode_header(buf, offset).total_length
