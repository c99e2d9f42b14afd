"""The client's decoder against CRC-valid bytes that no encoder wrote (issue 12, defect 10).

A buggy or hostile relay can recompute CRCs over anything. Every such body must fail
with ``EventFormatError`` (handled like a CRC failure: fail over, ask again), never
with UnicodeDecodeError, TypeError, JSONDecodeError, EOFError, IndexError, ... from deep
inside the decode path, and never be accepted as something it is not.
"""

from __future__ import annotations

import json

import pytest

from databus._hashing import stable_key_hash
from databus.client._decode import MISSING_EOW, WINDOW_CHECK, ResponseDecoder
from databus.client._events import DataEvent, EndOfWindow
from databus.client._headers import parse_stream_headers
from databus.errors import EventFormatError
from databus.event import (
    HEARTBEAT_SOURCE_ID,
    KeyKind,
    Op,
    decode_key,
    encode_control,
    encode_eow,
    encode_event,
)
from databus.schemas import AvroCodec, Schema
from tests.event_forging import fix_windows, forge

pytestmark = pytest.mark.twin("databus.batch")

SCHEMA = Schema({
    "type": "record", "name": "orders", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": "string"},
        {"name": "state", "type": {"type": "enum", "name": "State",
                                   "symbols": ["NEW", "PAID"]}},
        {"name": "total", "type": ["null", "double"]},
    ],
})
CODEC = AvroCodec(schemas=[SCHEMA])
NAMES = {3: "shop.orders"}


def row(i: int) -> dict[str, object]:
    return {"id": i, "note": f"n{i}", "state": "PAID" if i % 2 else "NEW", "total": i * 1.5}


def data_event(i: int, *, scn: int = 10, key: object = None) -> bytes:
    return encode_event(scn=scn, source_id=3, op=Op.UPSERT,
                        key=i if key is None else key,  # type: ignore[arg-type]
                        value=CODEC.encode(row(i), SCHEMA), timestamp_ns=1000 + i,
                        schema_fingerprint=SCHEMA.fingerprint)


def window(events: list[bytes], scn: int = 10) -> bytes:
    """``events`` and their EOW, with count and checksum made to match."""
    return b"".join(fix_windows([*events, encode_eow(scn=scn, event_count=0, checksum=0)]))


def decoder() -> ResponseDecoder:
    out = ResponseDecoder(CODEC)
    out.reset()  # at a window start, as the client's pull loop begins
    return out


def decode(body: bytes) -> list[object]:
    return list(decoder().decode(body, NAMES))


def test_valid_window_decodes() -> None:
    items = decode(window([data_event(1), data_event(2, key="k2"),
                           data_event(3, key=(1, "a", None))]))
    assert [i.key for i in items if isinstance(i, DataEvent)] == [1, "k2", (1, "a", None)]
    assert isinstance(items[-1], EndOfWindow) and items[-1].event_count == 3


# Each forgery keeps both CRCs and the window checksum right; only the content is bad.
STRING = KeyKind.STRING
COMPOSITE = KeyKind.COMPOSITE


def key_forgery(kind: KeyKind, key: bytes) -> bytes:
    return forge(data_event(1), key=key, flags=int(kind), partition_key=stable_key_hash(key))


FORGERIES = {
    "string key not UTF-8": key_forgery(STRING, b"ab\xff\xfe"),
    "string key lone surrogate": key_forgery(STRING, b"\xed\xa0\x80"),
    "composite key an object": key_forgery(COMPOSITE, b'{"a":1}'),
    "composite key a number": key_forgery(COMPOSITE, b"5"),
    "composite key a string": key_forgery(COMPOSITE, b'"ab"'),
    "composite key not JSON": key_forgery(COMPOSITE, b"[1,"),
    "composite key not UTF-8": key_forgery(COMPOSITE, b'["\xff"]'),
    "composite key not canonical": key_forgery(COMPOSITE, b"[1, 2]"),
    "composite key deep": key_forgery(COMPOSITE, b"[" * 5000 + b"]" * 5000),
    "composite key huge int": key_forgery(COMPOSITE, b"[" + b"9" * 5000 + b"]"),
    "int key of 4 bytes": forge(data_event(1), key=b"\0\0\0\1"),
    "int key and partition key differ": forge(data_event(1), partition_key=2),
    "string key with a wrong hash": forge(data_event(1, key="abc"), partition_key=7),
    "value truncated": forge(data_event(1), value=CODEC.encode(row(1), SCHEMA)[:-3]),
    "value with trailing bytes": forge(data_event(1), value=CODEC.encode(row(1), SCHEMA) + b"\0"),
    "value enum index out of range": forge(
        data_event(1), value=b"\x02\x02ab\x08\x00"),  # id 1, "ab", enum 4, null
    "value union index out of range": forge(data_event(1), value=b"\x02\x02ab\x02\x06"),
    "value string not UTF-8": forge(data_event(1), value=b"\x02\x04\xff\xfe\x00\x00"),
    "value string length beyond the event": forge(data_event(1), value=b"\x02\xfe\x0f"),
    "value negative length": forge(data_event(1), value=b"\x02\x03"),
    "unknown fingerprint": forge(data_event(1), schema_fingerprint=0x1234),
    "value without a fingerprint": forge(data_event(1), schema_fingerprint=0),
    "unknown source id": forge(data_event(1), source_id=9),
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forged_data_event_is_an_event_format_error(name: str) -> None:
    body = window([data_event(0), FORGERIES[name], data_event(2)])
    with pytest.raises(EventFormatError):
        decode(body)


def test_key_decoding_raises_only_event_format_error() -> None:
    for kind, data in [(KeyKind.STRING, b"\xff"), (KeyKind.COMPOSITE, b"{}"),
                       (KeyKind.COMPOSITE, b"[1e2]"), (KeyKind.INT, b"123")]:
        with pytest.raises(EventFormatError):
            decode_key(kind, data)
    assert decode_key(KeyKind.COMPOSITE, json.dumps([1, "é"], ensure_ascii=False,
                                                    separators=(",", ":")).encode()) == (1, "é")


CONTROL_FORGERIES = {
    "EOW of 4 bytes": forge(encode_eow(scn=10, event_count=1, checksum=0), value=b"\0\0\0\1"),
    "EOW with a key": forge(encode_eow(scn=10, event_count=0, checksum=0), key=b"k"),
    "EOW with flags": forge(encode_eow(scn=10, event_count=0, checksum=0), flags=4),
    "heartbeat with a partition key": forge(
        encode_control(scn=10, source_id=HEARTBEAT_SOURCE_ID), partition_key=5),
    "heartbeat with a schema": forge(
        encode_control(scn=10, source_id=HEARTBEAT_SOURCE_ID), schema_fingerprint=5),
}


@pytest.mark.parametrize("name", sorted(CONTROL_FORGERIES))
def test_forged_control_event_is_an_event_format_error(name: str) -> None:
    body = data_event(1) + CONTROL_FORGERIES[name]
    with pytest.raises(EventFormatError):
        decode(body)


def test_impossible_lengths_are_event_format_errors() -> None:
    event = data_event(1)
    for changes in ({"total_length": 10}, {"key_length": 10_000},
                    {"total_length": 1 << 31}, {"key_length": 0xFFFFFFFF}):
        with pytest.raises(EventFormatError):
            decode(forge(event, **changes) + event)


def test_window_checksum_failure_says_so_and_leaves_state_unchanged() -> None:
    decoder_ = decoder()
    first = data_event(1)
    # A later event's timestamp changed: a valid event, but not the window's.
    good = [first, data_event(2), encode_eow(scn=10, event_count=0, checksum=0)]
    fixed = fix_windows(good)
    bad = [first, forge(data_event(2), timestamp_ns=5), fixed[2]]
    assert decoder_.decode(b"".join(bad[:1]), NAMES) == []  # held until the EOW
    assert decoder_.in_window and decoder_.held_bytes == len(first)
    with pytest.raises(EventFormatError) as info:
        decoder_.decode(b"".join(bad[1:]), NAMES)
    assert info.value.reason == WINDOW_CHECK
    assert decoder_.in_window and decoder_.held_bytes == len(first)  # as before the body
    items = decoder_.decode(b"".join(fixed[1:]), NAMES)
    assert [i.key for i in items if isinstance(i, DataEvent)] == [1, 2]


def test_a_new_window_before_the_eow_is_a_window_failure() -> None:
    with pytest.raises(EventFormatError) as info:
        decode(data_event(1, scn=10) + data_event(2, scn=11))
    assert info.value.reason == MISSING_EOW


@pytest.mark.parametrize("headers", [
    {},
    {"X-Databus-Checkpoint": "not json"},
    {"X-Databus-Checkpoint": "[" * 3000},
    {"X-Databus-Checkpoint": '{"window_scn": "x"}'},
    {"X-Databus-Checkpoint": '{"window_scn": 1e400}'},
    {"X-Databus-Checkpoint": '{"window_scn": 1}', "X-Databus-Max-Scn": "9" * 5000},
    {"X-Databus-Checkpoint": '{"window_scn": 1}', "X-Databus-Max-Scn": "abc"},
    {"X-Databus-Checkpoint": '{"window_scn": 1}', "X-Databus-Pending-Event-Size": "-5"},
    {"X-Databus-Checkpoint": '{"window_scn": 1}', "X-Databus-Pending-Event-Size": "1.5"},
])
def test_garbage_stream_headers_are_retriable_event_format_errors(
        headers: dict[str, str]) -> None:
    with pytest.raises(EventFormatError) as info:
        parse_stream_headers(headers, "http://relay")
    assert info.value.retriable


def test_forgeries_really_are_crc_valid() -> None:
    """The forgeries above fail for their content, not for a CRC (else the tests would
    prove nothing about the deep decode path)."""
    from databus.event import verify_event

    for event in [*FORGERIES.values(), *CONTROL_FORGERIES.values()]:
        verify_event(event)


# -- lazy values (issue 30): checked when the body arrives, decoded on first access ------


def _valued(i: int, value: bytes) -> bytes:
    return encode_event(scn=10, source_id=3, op=Op.UPSERT, key=i, value=value,
                        timestamp_ns=1000 + i, schema_fingerprint=SCHEMA.fingerprint)


@pytest.mark.parametrize("name,value", [
    ("truncated", CODEC.encode(row(1), SCHEMA)[:-3]),
    ("trailing byte", CODEC.encode(row(1), SCHEMA) + b"\x00"),
    ("bad utf-8", b"\x02\x04\xc3\x28\x02\x00"),
    ("enum index out of range", b"\x02\x02x\x04\x00"),
    ("union index out of range", b"\x02\x02x\x02\x04"),
])
def test_a_bad_value_is_refused_when_the_body_arrives(name: str, value: bytes) -> None:
    d = decoder()
    body = window([data_event(1), _valued(2, value)])
    with pytest.raises(EventFormatError) as err:
        d.decode(body, NAMES)
    assert err.value.reason == "bad value", name
    # Nothing of the body was accepted: the good body after it decodes from scratch.
    items = d.decode(window([data_event(1), data_event(2)]), NAMES)
    assert [i.value for i in items if isinstance(i, DataEvent)] == [row(1), row(2)]


def test_values_are_decoded_on_first_access_and_stay_whole() -> None:
    body = window([data_event(i) for i in range(5)])
    events = [i for i in decoder().decode(body, NAMES) if isinstance(i, DataEvent)]
    assert not any(e.decoded for e in events)
    assert events[2].value == row(2) and events[2].decoded and not events[3].decoded
    assert events[2].value is events[2].value  # decoded once
    assert events[4].value_bytes == CODEC.encode(row(4), SCHEMA)
    del body  # the events own their bytes: nothing points into a buffer that goes away
    assert [e.value for e in events] == [row(i) for i in range(5)]


def test_lazy_and_eager_decoding_give_equal_events() -> None:
    body = window([data_event(1), data_event(2, key="k"), data_event(3, key=(1, "a"))])
    eager = ResponseDecoder(CODEC, lazy=False)
    eager.reset()
    got_eager = eager.decode(body, NAMES)
    got_lazy = decoder().decode(body, NAMES)
    assert all(e.decoded for e in got_eager if isinstance(e, DataEvent))
    assert got_lazy == got_eager
