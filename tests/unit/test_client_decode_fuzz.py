"""Event-body mutation fuzzer over the client's decoder (issue 12, "Also").

A valid relay body (windows of data events with int, string, bytes and composite keys
and a many-typed Avro value, each window ended by its EOW) is mutated: bit flips,
truncations, insertions, and field overwrites with the CRCs recomputed (and the EOW
checksums too), so the mutations reach the key, value and window checks rather than
stopping at a CRC. Properties:

- no exception but ``EventFormatError`` leaves ``ResponseDecoder.decode``;
- nothing forged is accepted: every event the decoder returns is what ``encode_event``
  writes for that decoded content (header fields and key bytes exactly; the Avro value
  may differ only in bytes that decode to the same value, as Avro allows).

Bounded for ``make test`` (deterministic, a few seconds); set DATABUS_FUZZ_EXAMPLES to
run more examples per test.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable, Iterable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databus.client._decode import ResponseDecoder
from databus.client._events import DataEvent
from databus.errors import EventFormatError
from databus.event import (
    HEADER_SIZE,
    Op,
    decode_event,
    encode_control,
    encode_eow,
    encode_event,
    iter_events,
)
from databus.schemas import AvroCodec, Schema
from tests.event_forging import fields, fix_windows, reseal

pytestmark = pytest.mark.twin("databus.batch")

EXAMPLES = int(os.environ.get("DATABUS_FUZZ_EXAMPLES", "400"))
FUZZ = settings(deadline=None, max_examples=EXAMPLES, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

SCHEMA = Schema({
    "type": "record", "name": "orders", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "note", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "paid", "type": "boolean"},
        {"name": "state", "type": {"type": "enum", "name": "State",
                                   "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "total", "type": ["null", "double", "string"]},
        {"name": "tags", "type": {"type": "array", "items": "int"}},
        {"name": "attrs", "type": {"type": "map", "values": "string"}},
        {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 3}},
        {"name": "ratio", "type": "float"},
    ],
})
CODEC = AvroCodec(schemas=[SCHEMA])
NAMES = {3: "shop.orders", 4: "shop.items"}
KEYS: list[object] = [7, -(1 << 63), "clé", "", b"\x00\xff", (1, "a", None), (2.5, True)]


def row(i: int) -> dict[str, object]:
    return {
        "id": i * 1_000_003, "qty": -i, "note": "é" * (i % 4), "blob": bytes(range(i % 5)),
        "paid": bool(i % 2), "state": ("NEW", "PAID", "SHIPPED")[i % 3],
        "total": (None, i * 0.25, f"{i}")[i % 3], "tags": list(range(i % 4)),
        "attrs": {f"k{j}": "v" * j for j in range(i % 3)}, "code": b"abc", "ratio": 0.5,
    }


def build_events(keys: Sequence[object] = KEYS, scns: Iterable[int] = (100, 101),
                 heartbeat: Callable[[int], bool] = lambda scn: True) -> list[bytes]:
    """Windows ``scns`` of one event per key (the fourth a delete, the sixth a dump
    row), with a heartbeat in the windows ``heartbeat`` picks, each ended by its EOW."""
    events: list[bytes] = []
    for scn in scns:
        for i, key in enumerate(keys):
            n = scn * 10 + i
            op = Op.DELETE if i == 3 else Op.UPSERT
            value = b"" if op is Op.DELETE else CODEC.encode(row(n), SCHEMA)
            events.append(encode_event(
                scn=scn, source_id=3 + i % 2, op=op, key=key,  # type: ignore[arg-type]
                value=value, timestamp_ns=n, partition_id=i,
                schema_fingerprint=SCHEMA.fingerprint if value else 0,
                from_snapshot=i == 5))
        if heartbeat(scn):
            events.append(encode_control(scn=scn, source_id=-5))
        events.append(encode_eow(scn=scn, event_count=0, checksum=0))
    return fix_windows(events)


EVENTS = build_events()
BODY = b"".join(EVENTS)


def decode(body: bytes) -> list[object]:
    decoder = ResponseDecoder(CODEC)
    decoder.reset()
    try:
        return list(decoder.decode(body, NAMES))
    except EventFormatError:
        return []
    # Anything else propagates and fails the test.


def reencode(event: DataEvent, raw: bytes) -> bytes:
    f = fields(raw)
    value = b"" if event.value is None else CODEC.encode(event.value, SCHEMA)
    return encode_event(scn=event.scn, source_id=f["source_id"], op=event.op,
                        key=event.key, value=value, timestamp_ns=event.timestamp_ns,
                        partition_id=f["partition_id"],
                        schema_fingerprint=f["schema_fingerprint"],
                        from_snapshot=event.from_dump)


def assert_no_garbage(body: bytes, items: list[object]) -> None:
    """Every delivered event is exactly what an encoder writes for its content."""
    data = [i for i in items if isinstance(i, DataEvent)]
    if not data:
        return
    raws = [body[off:off + h.total_length] for off, h in iter_events(body) if h.source_id >= 0]
    assert len(raws) >= len(data)
    for event, raw in zip(data, raws, strict=False):
        assert NAMES[fields(raw)["source_id"]] == event.source
        canonical = reencode(event, raw)
        if canonical == raw:
            continue
        # Only a non-canonical (but valid) Avro encoding of the same value may differ.
        got, want = decode_event(raw), decode_event(canonical)
        assert got.key_bytes == want.key_bytes
        assert got.header._replace(header_crc=0, body_crc=0, total_length=0) == \
            want.header._replace(header_crc=0, body_crc=0, total_length=0)
        assert repr(CODEC.decode(got.value, SCHEMA)) == repr(event.value)


def test_the_unmutated_body_decodes_and_round_trips() -> None:
    items = decode(BODY)
    assert sum(isinstance(i, DataEvent) for i in items) == 2 * len(KEYS)
    for event in items:
        if isinstance(event, DataEvent):
            assert event.key in KEYS
    assert_no_garbage(BODY, items)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(BODY) - 1), st.integers(0, 7)),
                min_size=1, max_size=4))
def test_bit_flips(flips: list[tuple[int, int]]) -> None:
    body = bytearray(BODY)
    for pos, bit in flips:
        body[pos] ^= 1 << bit
    assert_no_garbage(bytes(body), decode(bytes(body)))


@FUZZ
@given(st.integers(0, len(BODY)), st.binary(max_size=16), st.integers(0, len(BODY)))
def test_truncations_and_insertions(cut: int, insert: bytes, at: int) -> None:
    for body in (BODY[:cut], BODY[:at] + insert + BODY[at:]):
        assert_no_garbage(body, decode(body))


def mutate(raw: bytes, start: int, patch: bytes, mode: str) -> bytes:
    """``raw`` with ``patch`` overwritten, inserted or deleted (``mode``) near ``start``,
    its CRCs recomputed, as a hostile relay would send it."""
    event = bytearray(raw)
    # Mostly past the CRC fields, so the mutation is not undone by the reseal.
    pos = 12 + start % max(1, len(event) - 12)
    if mode == "overwrite":
        event[pos:pos + len(patch)] = patch
    elif mode == "insert":
        event[pos:pos] = patch
    else:
        del event[pos:pos + len(patch)]
    if mode != "overwrite" and pos >= 16 and len(event) >= HEADER_SIZE:
        # Keep total_length right so the event stays framed and the deeper checks
        # (key_length, key, value) are the ones that must catch the change.
        event[12:16] = len(event).to_bytes(4, "big")
    return reseal(event)


@FUZZ
@given(
    which=st.integers(0, len(EVENTS) - 1),
    start=st.integers(0, 400),
    patch=st.binary(min_size=1, max_size=8),
    mode=st.sampled_from(["overwrite", "insert", "delete"]),
    fix_eow=st.booleans(),
)
def test_crc_recomputed_mutations(which: int, start: int, patch: bytes, mode: str,
                                  fix_eow: bool) -> None:
    """The mutated event gets valid CRCs (a hostile relay): the key, value, control
    and window checks must catch it, or it must be a valid encoding."""
    events = list(EVENTS)
    events[which] = mutate(events[which], start, patch, mode)
    if fix_eow:
        # A forged event too short for a header cannot be parsed to fix the window.
        with contextlib.suppress(struct.error):
            events = fix_windows(events)
    body = b"".join(events)
    assert_no_garbage(body, decode(body))
