"""The client's fast path over a relay response: a whole body to delivered items in one
call (the reference twin of ``_windows.pxi``, compiled into ``databus.batch._native``).

It does what ``databus.client._decode.ResponseDecoder`` does for a relay body in the
common case (data events and EOWs, heartbeats skipped; window counts and checksums
checked against each EOW) and gives up, answering None, on anything else: a dump
marker, a torn window, a failed window check, an unknown source, a key it does not read
at once, a value whose check is not GOOD. The caller then decodes the same body by the
reference path, which gives the items or the exact error; so the fast path never has
to build an error, and cannot accept what the reference refuses.

The scan (``scan``) has already checked every CRC and length.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from databus._hashing import stable_key_hash
from databus.batch._check_python import check_value
from databus.batch._scan import Scan
from databus.event import _OPS, EOW_SOURCE_ID, HEADER_SIZE, KeyKind
from databus.schemas._program import GOOD

_U32 = struct.Struct(">I")
_EOW = struct.Struct(">II")
_I64 = struct.Struct(">q")
_EOW_VALUE = 8
# What the fast path answers: (items, index of the first held item, EOWs seen, the open
# window (None: between windows), its count and checksum, whether its start was seen,
# bytes of the held data events).
Decoded = tuple[list[Any], int, int, int | None, int, int, bool, int]


class EventBase:
    """The fields of the client's ``DataEvent`` (which subclasses this class of the
    event core in use): the compiled twin stores them in C, so the fast path fills an
    event without a Python call."""

    __slots__ = (
        "_decode",
        "_raw",
        "_value",
        "from_bootstrap",
        "from_dump",
        "key",
        "op",
        "partition_key",
        "schema",
        "scn",
        "source",
        "timestamp_ns",
    )

    scn: int
    source: str
    op: Any
    key: Any
    _value: Any
    _raw: bytes | None
    _decode: Callable[[bytes], Any] | None
    timestamp_ns: int
    schema: Any
    partition_key: int
    from_bootstrap: bool
    from_dump: bool


_UNDECODED: list[Any] = []  # [marker], set by set_undecoded


def set_undecoded(marker: Any) -> None:
    """The marker ``DataEvent`` keeps in ``_value`` until the value is decoded."""
    _UNDECODED[:] = [marker]


def fill_event(cls: type[EventBase], scn: int, source: str, op: Any, key: Any, raw: bytes,
               decode: Callable[[bytes], Any], ts: int, schema: Any, pkey: int,
               from_dump: bool) -> EventBase:
    """A lazy event of class ``cls`` (``EventBase``'s fields), filled field by field."""
    event = cls.__new__(cls)
    event.scn, event.source, event.op, event.key = scn, source, op, key
    event._value, event._raw, event._decode = _UNDECODED[0], raw, decode
    event.timestamp_ns, event.schema, event.partition_key = ts, schema, pkey
    event.from_bootstrap, event.from_dump = False, from_dump
    return event


def decode_relay_body(
    buf: bytes, s: Scan, names: Mapping[int, str],
    value_decoder: Callable[[int, int], tuple[Callable[[bytes], Any], Any, Any]],
    make_event: Callable[..., Any], make_lazy: Callable[..., Any],
    make_eow: Callable[[int, int, int], Any],
    window: int | None, count: int, crc: int, whole: bool, verify: bool,
    make_window: Callable[..., Any] | None = None,
) -> Decoded | None:
    """The items of relay body ``buf`` (scan ``s``) or None (see the module docstring).

    ``make_lazy`` is a callable, or a class with ``EventBase``'s fields (``DataEvent``)
    whose events the core fills itself, ``_value`` set to the ``set_undecoded`` marker.

    Items are data events (``make_lazy`` for a value checked GOOD, ``make_event`` for
    an event without a value) and ``make_eow(scn, timestamp_ns, event_count)`` at each
    window end; the items from the returned index on belong to the window still open
    at the end of the body (held by the caller until its EOW). With ``make_window``, a
    window that begins and ends in the body is one item, ``make_window(scn,
    timestamp_ns, events, [], False)``, before its EOW (the batch API's ``Window``)."""
    items: list[Any] = []
    held_from = 0
    eows = 0
    held_bytes = 0
    begun = -1  # where the items of a window that began in this body start
    last: tuple[int, int] | None = None
    decode: Any = None
    schema: Any = None
    program: Any = None
    pack = _U32.pack
    direct = isinstance(make_lazy, type) and bool(_UNDECODED)
    for i in range(s.count):
        scn = s.scn[i]
        sid = s.source_id[i]
        offset = s.offset[i]
        if scn != window:
            if window is not None and count:
                return None  # torn: a new window before the open one's EOW
            # A window that begins in this body (not one carried over into it).
            begun = len(items) if i > 0 or window is None else -1
            window, count, crc = scn, 0, 0
        if sid >= 0:
            source = names.get(sid)
            if source is None:
                return None
            key = _plain_key(buf, s, i)
            if key is None:
                return None
            count += 1
            crc = zlib.crc32(pack(s.header_crc[i]), crc)
            fp = s.fingerprint[i]
            if last != (sid, fp):
                last = (sid, fp)
                decode, schema, program = value_decoder(sid, fp)
            start, end = s.value_span(i)
            from_dump = bool(s.flags[i] & 4)
            if end > start:
                raw = buf[start:end]
                if program is None or not len(program) or check_value(program, raw) != GOOD:
                    return None
                if direct:
                    items.append(fill_event(make_lazy, scn, source, _OPS[s.op[i]], key,  # type: ignore[arg-type]
                                       raw, decode, s.timestamp[i], schema,
                                       s.partition_key[i], from_dump))
                else:
                    items.append(make_lazy(scn, source, _OPS[s.op[i]], key, raw, decode,
                                           s.timestamp[i], schema, s.partition_key[i],
                                           False, from_dump))
            else:
                items.append(make_event(scn, source, _OPS[s.op[i]], key, None,
                                        s.timestamp[i], schema, s.partition_key[i], False,
                                        from_dump))
            held_bytes += s.length[i]
            continue
        # A control event: no key, flags, partition key or schema (check_control_fields).
        if (s.flags[i] or s.key_length[i] or s.partition_key[i] or s.fingerprint[i]):
            return None
        if sid != EOW_SOURCE_ID:
            if sid == -5:  # a heartbeat
                continue
            return None  # dump markers and the rest: the reference path
        if s.length[i] - HEADER_SIZE != _EOW_VALUE:
            return None
        said_count, said_crc = _EOW.unpack_from(buf, offset + HEADER_SIZE)
        if verify and whole and (said_count != count or said_crc != crc):
            return None
        if make_window is not None and begun >= 0 and len(items) > begun:
            events = items[begun:]
            del items[begun:]
            # The EOW's commit time, or the first event's when the EOW has none.
            items.append(make_window(scn, s.timestamp[i] or events[0].timestamp_ns, events,
                                     [], False))
        items.append(make_eow(scn, s.timestamp[i], said_count))
        eows += 1
        held_from = len(items)
        held_bytes = 0
        window, count, crc, whole = None, 0, 0, True
    return items, held_from, eows, window, count, crc, whole, held_bytes


def _plain_key(buf: bytes, s: Scan, i: int) -> Any:
    """An int, string or bytes key whose partition key checks out; None otherwise
    (composite keys, bad keys: the reference path reads those)."""
    kind = s.flags[i] & 3
    start, end = s.key_span(i)
    pkey = s.partition_key[i]
    if kind == KeyKind.INT:
        if end - start == 8:
            value = _I64.unpack_from(buf, start)[0]
            if value == pkey:
                return value
        return None
    if stable_key_hash(buf[start:end]) != pkey:
        return None
    if kind == KeyKind.STRING:
        try:
            return buf[start:end].decode("utf-8")
        except UnicodeDecodeError:
            return None
    if kind == KeyKind.BYTES:
        return buf[start:end]
    return None


def eow_order(s: Scan, eows: Any) -> tuple[int, int | None, int]:
    """Check that a body's windows run in order (``databus.client._answers``): each
    EOW's SCN above the previous one's, and each window's first event of the EOW's SCN.
    Returns (the position in ``eows`` of the first EOW that breaks a rule, or -1; the
    SCN of the last EOW before it, or None; the index of the first event after it)."""
    scns = s.scn
    previous: int | None = None
    start = 0
    for k, eow in enumerate(eows):
        scn = scns[eow]
        if (previous is not None and scn <= previous) or scns[start] != scn:
            return k, previous, start
        previous = scn
        start = eow + 1
    return -1, previous, start
