"""The wire format, tested on bytes: round trips, every single-byte flip, truncation."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from databus._hashing import stable_key_hash
from databus.errors import EventFormatError
from databus.event import (
    EOW_SOURCE_ID,
    HEADER,
    HEADER_SIZE,
    HEARTBEAT_SOURCE_ID,
    KeyKind,
    Op,
    WindowChecksum,
    decode_eow,
    decode_event,
    decode_header,
    encode_control,
    encode_eow,
    encode_event,
    iter_events,
    peek_total_length,
    verify_event,
)

int64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
keys = st.one_of(
    int64,
    st.text(max_size=40),
    st.binary(max_size=40),
    st.tuples(st.integers(-1000, 1000), st.text(max_size=8)),
)


def sample(**overrides: object) -> bytes:
    fields: dict[str, object] = dict(
        scn=(3 << 32) | 1234, source_id=7, op=Op.UPSERT, key=42, value=b"\x02ab\x04",
        timestamp_ns=1_700_000_000_123_456_789, partition_id=3,
        schema_fingerprint=0xFEDCBA9876543210,
    )
    fields.update(overrides)
    return encode_event(**fields)  # type: ignore[arg-type]


@given(
    scn=int64, source_id=st.integers(0, 32767), op=st.sampled_from([Op.UPSERT, Op.DELETE]),
    key=keys, value=st.binary(max_size=300), ts=int64, partition_id=st.integers(-32768, 32767),
    fingerprint=st.integers(0, (1 << 64) - 1), from_snapshot=st.booleans(),
)
def test_round_trip(
    scn: int, source_id: int, op: Op, key: object, value: bytes, ts: int,
    partition_id: int, fingerprint: int, from_snapshot: bool,
) -> None:
    data = encode_event(
        scn=scn, source_id=source_id, op=op, key=key, value=value,  # type: ignore[arg-type]
        timestamp_ns=ts, partition_id=partition_id, schema_fingerprint=fingerprint,
        from_snapshot=from_snapshot,
    )
    event = decode_event(data)
    h = event.header
    assert (h.scn, h.source_id, h.op, h.timestamp_ns, h.partition_id) == (
        scn, source_id, op, ts, partition_id,
    )
    assert h.schema_fingerprint == fingerprint
    assert h.from_snapshot is from_snapshot
    assert h.total_length == len(data)
    assert event.value == value
    assert event.key == key
    if isinstance(key, int):
        assert h.partition_key == key and h.key_kind is KeyKind.INT
    else:
        assert h.partition_key == stable_key_hash(event.key_bytes)


@given(scn=int64, source_id=st.integers(0, 32767), key=keys, value=st.binary(max_size=64),
       fingerprint=st.integers(0, (1 << 64) - 1), from_snapshot=st.booleans())
def test_encoding_is_the_documented_header_with_its_crc(
    scn: int, source_id: int, key: object, value: bytes, fingerprint: int,
    from_snapshot: bool,
) -> None:
    """The encoder packs the header in two pieces around its CRC: byte for byte the
    one-struct layout of docs/wire-format.md, the CRC over every other header byte."""
    data = encode_event(scn=scn, source_id=source_id, op=Op.UPSERT, key=key,  # type: ignore[arg-type]
                        value=value, timestamp_ns=7, partition_id=3,
                        schema_fingerprint=fingerprint, from_snapshot=from_snapshot)
    event = decode_event(data)
    h, key_bytes = event.header, event.key_bytes
    fields = [0xDB, 1, int(Op.UPSERT), h.flags, 0, zlib.crc32(value, zlib.crc32(key_bytes)),
              len(data), scn, 7, 3, source_id, h.partition_key, fingerprint, len(key_bytes)]
    unsigned = bytearray(HEADER.pack(*fields))
    crc = zlib.crc32(bytes(unsigned[8:]), zlib.crc32(bytes(unsigned[:4])))
    struct.pack_into(">I", unsigned, 4, crc)
    assert data == bytes(unsigned) + key_bytes + value


def test_header_layout_is_documented_size_and_big_endian() -> None:
    data = sample()
    assert HEADER_SIZE == 56
    assert data[0] == 0xDB and data[1] == 1
    assert struct.unpack_from(">q", data, 16)[0] == (3 << 32) | 1234
    assert struct.unpack_from(">I", data, 12)[0] == len(data)
    assert struct.unpack_from(">I", data, 8)[0] == zlib.crc32(data[HEADER_SIZE:])


def test_every_single_byte_flip_is_detected() -> None:
    data = sample(key="order-17", value=bytes(range(200)))
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            corrupted = bytearray(data)
            corrupted[i] ^= mask
            with pytest.raises(EventFormatError) as info:
                decode_event(bytes(corrupted))
            assert info.value.offset == 0
            assert info.value.reason in {
                "bad magic", "unknown version", "header crc", "body crc",
            }, (i, info.value.reason)


def test_flip_in_second_event_names_its_offset() -> None:
    first, second = sample(scn=1), sample(scn=2)
    buf = bytearray(first + second)
    buf[len(first) + HEADER_SIZE + 3] ^= 0x10
    with pytest.raises(EventFormatError) as info:
        list(iter_events(bytes(buf)))
    assert info.value.offset == len(first)
    assert info.value.reason == "body crc"
    assert f"offset {len(first)}" in str(info.value)


@pytest.mark.parametrize("cut", [0, 1, 10, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 5, -1])
def test_truncated_event(cut: int) -> None:
    data = sample(value=b"x" * 50)
    with pytest.raises(EventFormatError) as info:
        decode_event(data[:cut] if cut >= 0 else data[:-1])
    assert info.value.reason == "truncated"


def test_unknown_version_is_rejected_even_with_valid_crc() -> None:
    data = bytearray(sample())
    data[1] = 2
    crc = zlib.crc32(bytes(data[8:HEADER_SIZE]), zlib.crc32(bytes(data[:4])))
    struct.pack_into(">I", data, 4, crc)
    with pytest.raises(EventFormatError, match="unknown event version 2"):
        decode_header(bytes(data))


def test_inconsistent_control_flag_is_rejected_even_with_valid_crc() -> None:
    data = bytearray(sample())
    struct.pack_into(">h", data, 34, -7)  # a data opcode with a control source id
    crc = zlib.crc32(bytes(data[8:HEADER_SIZE]), zlib.crc32(bytes(data[:4])))
    struct.pack_into(">I", data, 4, crc)
    with pytest.raises(EventFormatError) as info:
        decode_header(bytes(data))
    assert info.value.reason == "bad field"


def test_eow_carries_count_and_checksum() -> None:
    events = [sample(scn=9, key=k) for k in range(5)]
    acc = WindowChecksum()
    for e in events:
        acc.add_event(e)
    eow = encode_eow(scn=9, event_count=acc.count, checksum=acc.crc, timestamp_ns=5)
    decoded = decode_event(eow)
    assert decoded.header.is_eow and decoded.header.is_control
    assert decoded.header.source_id == EOW_SOURCE_ID
    payload = decode_eow(decoded)
    assert (payload.scn, payload.event_count) == (9, 5)
    # The checksum depends on every event and on their order.
    other = WindowChecksum()
    for e in reversed(events):
        other.add_event(e)
    assert other.crc != acc.crc
    altered = WindowChecksum()
    for e in [*events[:4], sample(scn=9, key=99)]:
        altered.add_event(e)
    assert altered.crc != acc.crc


def test_stream_of_events_iterates_with_offsets() -> None:
    blobs = [sample(scn=1, key=1), sample(scn=1, key=2), encode_eow(scn=1, event_count=2,
             checksum=0), encode_control(scn=1, source_id=HEARTBEAT_SOURCE_ID)]
    buf = b"".join(blobs)
    offsets = [off for off, _ in iter_events(buf)]
    expected, pos = [], 0
    for b in blobs:
        expected.append(pos)
        pos += len(b)
    assert offsets == expected
    assert peek_total_length(buf, offsets[1]) == len(blobs[1])
    assert peek_total_length(buf[:10]) is None
    assert verify_event(buf, offsets[2]).is_eow


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"source_id": -1}, "source id >= 0"),
        ({"op": Op.CONTROL}, "control opcode"),
        ({"key": 1 << 63}, "int64"),
        ({"key": True}, "bool"),
        ({"key": 1.5}, "unsupported key"),
        ({"partition_id": 1 << 20}, "out of range"),
    ],
)
def test_encode_rejects_bad_fields(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(EventFormatError, match=match):
        sample(**overrides)


def test_control_needs_negative_source() -> None:
    with pytest.raises(EventFormatError):
        encode_control(scn=1, source_id=3)


def test_keys_no_encoder_writes_are_event_format_errors() -> None:
    # A lone surrogate has no UTF-8 form: a bad key, not a UnicodeEncodeError.
    with pytest.raises(EventFormatError):
        encode_event(scn=1, source_id=0, op=Op.UPSERT, key="\ud800", value=b"")
    # Decoding insists on what encode_key writes (CRCs do not prove it: a relay may
    # recompute them).
    for kind, data in [(KeyKind.STRING, b"\xc3"), (KeyKind.COMPOSITE, b"[1, 2]"),
                       (KeyKind.COMPOSITE, b"{}"), (KeyKind.COMPOSITE, b"[" * 3000)]:
        with pytest.raises(EventFormatError):
            decode_event(forge_key(kind, data)).key  # noqa: B018


def forge_key(kind: KeyKind, data: bytes) -> bytes:
    from tests.event_forging import forge

    return forge(sample(), key=data, flags=int(kind), partition_key=stable_key_hash(data))
