"""Dump markers (control events -6/-7, docs/dumps.md) and dumped rows on the consumer
side: the wire encoding, strict decoding of hostile payloads, the client's decoder
(markers held with their window, not counted by its EOW, dropped for other sources),
the dispatcher's callbacks and ``databus tail``'s lines."""

from __future__ import annotations

import io
import json

import pytest

from databus.client import CallbackResult
from databus.client._decode import ResponseDecoder
from databus.client._dispatcher import CallKind, Dispatcher
from databus.client._events import DataEvent, DumpMarker, EndOfWindow
from databus.client._tail import _Printer
from databus.errors import EventFormatError
from databus.event import (
    DUMP_END_SOURCE_ID,
    DUMP_START_SOURCE_ID,
    Op,
    decode_dump_marker,
    decode_header,
    encode_control,
    encode_dump_marker,
    encode_event,
    iter_events,
)
from tests.unit.test_client_decode_hostile import CODEC, NAMES, SCHEMA, row, window


def dumped(i: int, scn: int = 10) -> bytes:
    return encode_event(scn=scn, source_id=3, op=Op.UPSERT, key=i,
                        value=CODEC.encode(row(i), SCHEMA), schema_fingerprint=SCHEMA.fingerprint,
                        from_snapshot=True)


def logged(i: int, scn: int = 10) -> bytes:
    return encode_event(scn=scn, source_id=3, op=Op.UPSERT, key=i,
                        value=CODEC.encode(row(i), SCHEMA), schema_fingerprint=SCHEMA.fingerprint)


def start(source: str = "shop.orders", scn: int = 10) -> bytes:
    return encode_dump_marker(scn=scn, kind="start", source=source, dump_id="d1")


def end(rows: int, source: str = "shop.orders", scn: int = 10) -> bytes:
    return encode_dump_marker(scn=scn, kind="end", source=source, dump_id="d1", rows=rows)


def decode(body: bytes) -> list[object]:
    decoder = ResponseDecoder(CODEC)
    decoder.reset()
    return list(decoder.decode(body, NAMES, None))


def test_markers_round_trip() -> None:
    for event, kind, rows in ((start(), "start", None), (end(7), "end", 7)):
        header = decode_header(event)
        assert header.is_control and header.source_id in (DUMP_START_SOURCE_ID,
                                                          DUMP_END_SOURCE_ID)
        marker = decode_dump_marker(header, event[56:])
        assert (marker.kind, marker.source, marker.dump_id, marker.rows, marker.scn) == (
            kind, "shop.orders", "d1", rows, 10)


def test_marker_encoding_refuses_impossible_markers() -> None:
    with pytest.raises(EventFormatError):
        encode_dump_marker(scn=1, kind="start", source="a.b", dump_id="d", rows=3)
    with pytest.raises(EventFormatError):
        encode_dump_marker(scn=1, kind="end", source="a.b", dump_id="d")
    with pytest.raises(EventFormatError):
        encode_dump_marker(scn=1, kind="middle", source="a.b", dump_id="d")  # type: ignore[arg-type]


@pytest.mark.parametrize("payload", [
    b"", b"{", b"[]", b"null", b'{"dump":"d","source":"a.b","x":1}', b'{"dump":"d"}',
    b'{"dump":1,"source":"a.b"}', b'{"dump":"d","source":""}', b"\xff\xfe",
    b'{"source":"a.b","dump":"d"}',  # not canonical (key order)
    b'{"dump": "d", "source": "a.b"}',  # not canonical (spaces)
    b'{"dump":"d","source":"a.b","dump":"e"}',  # duplicate key
])
def test_hostile_start_payloads_are_event_format_errors(payload: bytes) -> None:
    event = encode_control(scn=5, source_id=DUMP_START_SOURCE_ID, payload=payload)
    with pytest.raises(EventFormatError):
        decode_dump_marker(decode_header(event), event[56:])
    with pytest.raises(EventFormatError):
        decode(window([event], scn=5))


@pytest.mark.parametrize("rows", [b'-1', b'true', b'1.5', b'"3"', b'99999999999999999999'])
def test_hostile_end_row_counts_are_event_format_errors(rows: bytes) -> None:
    payload = b'{"dump":"d","rows":' + rows + b',"source":"a.b"}'
    event = encode_control(scn=5, source_id=DUMP_END_SOURCE_ID, payload=payload)
    with pytest.raises(EventFormatError):
        decode_dump_marker(decode_header(event), event[56:])


def test_the_decoder_keeps_markers_in_order_outside_the_window_count() -> None:
    body = window([logged(9), start(), dumped(1), dumped(2), end(2)])
    items = decode(body)
    kinds = [(type(i).__name__, getattr(i, "key", None), getattr(i, "start", None))
             for i in items]
    assert kinds == [("DataEvent", 9, None), ("DumpMarker", None, True),
                     ("DataEvent", 1, None), ("DataEvent", 2, None),
                     ("DumpMarker", None, False), ("EndOfWindow", None, None)]
    events = [i for i in items if isinstance(i, DataEvent)]
    assert [e.from_dump for e in events] == [False, True, True]
    assert not any(e.from_bootstrap for e in events)
    eow = items[-1]
    assert isinstance(eow, EndOfWindow) and eow.event_count == 3  # markers not counted
    marker = items[-2]
    assert isinstance(marker, DumpMarker) and marker.rows == 2 and marker.dump_id == "d1"
    # The EOW checksum covers the data events only: the relay's framing.
    assert sum(1 for _, h in iter_events(body) if h.is_control) == 3


def test_markers_of_other_sources_are_dropped() -> None:
    items = decode(window([start("shop.other"), logged(1), end(0, "shop.other")]))
    assert [type(i).__name__ for i in items] == ["DataEvent", "EndOfWindow"]


def test_the_dispatcher_calls_on_dump_start_and_end_in_stream_order() -> None:
    items = decode(window([start(scn=12), dumped(1, 12), end(1, scn=12)], scn=12))
    dispatcher = Dispatcher()
    kinds = []
    for item in items:
        for call in dispatcher.feed(item):  # type: ignore[arg-type]
            kinds.append((call.kind, call.source))
            _step, follow = dispatcher.result(call, CallbackResult.SUCCESS)
            kinds += [(f.kind, f.source) for f in follow]
    assert kinds == [
        (CallKind.START_WINDOW, None), (CallKind.DUMP_START, "shop.orders"),
        (CallKind.START_SOURCE, "shop.orders"), (CallKind.DATA, "shop.orders"),
        (CallKind.DUMP_END, "shop.orders"), (CallKind.END_SOURCE, "shop.orders"),
        (CallKind.END_WINDOW, None), (CallKind.CHECKPOINT, None),
    ]


def test_a_window_of_markers_only_opens_and_closes() -> None:
    items = decode(window([start(scn=13), end(0, scn=13)], scn=13))
    dispatcher = Dispatcher()
    kinds = [call.kind for item in items for call in dispatcher.feed(item)]  # type: ignore[arg-type]
    assert kinds == [CallKind.START_WINDOW, CallKind.DUMP_START, CallKind.DUMP_END,
                     CallKind.END_WINDOW]


def test_tail_prints_markers_and_the_dump_flag() -> None:
    out = io.StringIO()
    printer = _Printer(out, 0)
    items = decode(window([start(scn=21), dumped(4, 21), end(1, scn=21)], scn=21))
    printer.on_start_data_event_sequence(21)
    for item in items:
        if isinstance(item, DumpMarker):
            (printer.on_dump_start if item.start else printer.on_dump_end)(item.source)
        elif isinstance(item, DataEvent):
            printer.on_data_event(item)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0] == {"marker": "dump_start", "source": "shop.orders", "scn": 21}
    assert lines[1]["key"] == 4 and lines[1]["from_dump"] is True
    assert lines[2] == {"marker": "dump_end", "source": "shop.orders", "scn": 21,
                        "outcome": "done"}


# -- outcomes (issue 27 item 8) ------------------------------------------------------------


def test_an_end_carries_the_outcome_only_when_not_done() -> None:
    done = encode_dump_marker(scn=4, kind="end", source="a.b", dump_id="d", rows=2)
    # A completed table's end is byte for byte what it was before outcomes.
    assert done.endswith(b'{"dump":"d","rows":2,"source":"a.b"}')
    assert decode_dump_marker(decode_header(done), done[56:]).outcome == "done"
    for outcome in ("failed", "cancelled"):
        event = encode_dump_marker(scn=4, kind="end", source="a.b", dump_id="d", rows=2,
                                   outcome=outcome)
        assert event.endswith(b'{"dump":"d","outcome":"' + outcome.encode()
                              + b'","rows":2,"source":"a.b"}')
        marker = decode_dump_marker(decode_header(event), event[56:])
        assert (marker.kind, marker.rows, marker.outcome) == ("end", 2, outcome)
    with pytest.raises(EventFormatError):
        encode_dump_marker(scn=4, kind="end", source="a.b", dump_id="d", rows=2,
                           outcome="maybe")
    with pytest.raises(EventFormatError):
        encode_dump_marker(scn=4, kind="start", source="a.b", dump_id="d", outcome="failed")


@pytest.mark.parametrize("payload", [
    b'{"dump":"d","outcome":"done","rows":1,"source":"a.b"}',  # done is never written
    b'{"dump":"d","outcome":"maybe","rows":1,"source":"a.b"}',
    b'{"dump":"d","outcome":1,"rows":1,"source":"a.b"}',
])
def test_hostile_outcomes_are_event_format_errors(payload: bytes) -> None:
    event = encode_control(scn=5, source_id=DUMP_END_SOURCE_ID, payload=payload)
    with pytest.raises(EventFormatError):
        decode_dump_marker(decode_header(event), event[56:])
    start_with_outcome = encode_control(
        scn=5, source_id=DUMP_START_SOURCE_ID,
        payload=b'{"dump":"d","outcome":"failed","source":"a.b"}')
    with pytest.raises(EventFormatError):
        decode_dump_marker(decode_header(start_with_outcome), start_with_outcome[56:])


def test_the_dispatcher_passes_the_outcome_and_old_consumers_still_get_their_call() -> None:
    from databus.client import Consumer
    from databus.client._runner import _args, _with_outcome

    failed = encode_dump_marker(scn=10, kind="end", source="shop.orders", dump_id="d1",
                                rows=1, outcome="failed")
    items = decode(window([start(), dumped(1), failed], scn=10))
    dispatcher = Dispatcher()
    calls = [call for item in items for call in dispatcher.feed(item)]  # type: ignore[arg-type]
    (end_call,) = [c for c in calls if c.kind is CallKind.DUMP_END]
    assert _args(end_call) == ("shop.orders", "failed")

    seen: list[tuple[str, ...]] = []

    class New(Consumer):
        def on_dump_end(self, source: str, outcome: str = "done") -> None:
            seen.append((source, outcome))

    class Old(Consumer):
        def on_dump_end(self, source: str) -> None:  # type: ignore[override]
            seen.append((source,))

    class Loose(Consumer):
        def on_dump_end(self, *args: str) -> None:  # type: ignore[override]
            seen.append(args)

    for consumer in (New(), Old(), Loose()):
        _with_outcome(consumer.on_dump_end)(*_args(end_call))
    assert seen == [("shop.orders", "failed"), ("shop.orders",), ("shop.orders", "failed")]
