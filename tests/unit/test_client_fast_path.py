"""The client's one-call fast path over relay bodies (``batch.decode_relay_body``,
issue 30) against the reference path of ``ResponseDecoder``, on valid, split and
mutated bodies (CRCs recomputed, as a hostile relay would):

- the two paths deliver equal items, hold the same bytes, and refuse the same bodies;
- the twins of ``decode_relay_body`` give the same answer, None included.
"""

from __future__ import annotations

import contextlib
import os
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databus import batch
from databus.client._decode import ResponseDecoder
from databus.client._events import DataEvent, EndOfWindow, Window, lazy_event
from databus.errors import EventFormatError, SchemaError, UnknownSchemaError
from databus.event import Op, encode_dump_marker, encode_eow, encode_event
from tests.event_forging import fix_windows
from tests.unit.test_client_decode_fuzz import (
    CODEC,
    NAMES,
    SCHEMA,
    build_events,
    mutate,
    row,
)

pytestmark = pytest.mark.twin("databus.batch")

EXAMPLES = int(os.environ.get("DATABUS_FUZZ_EXAMPLES", "300"))
FUZZ = settings(deadline=None, max_examples=EXAMPLES, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
KEYS: list[object] = [7, -(1 << 63), "clé", "", b"\x00\xff", 12]


EVENTS = build_events(KEYS, range(100, 104), heartbeat=lambda scn: scn % 2 == 1)


def _decoders() -> tuple[ResponseDecoder, ResponseDecoder]:
    fast, slow = ResponseDecoder(CODEC), ResponseDecoder(CODEC)
    slow.fast = False
    fast.reset()
    slow.reset()
    return fast, slow


def _run(decoder: ResponseDecoder, bodies: list[bytes]) -> list[Any]:
    """What each body gives (items, or the error's reason), and the held bytes."""
    out: list[Any] = []
    for body in bodies:
        try:
            out.append(decoder.decode(body, NAMES))
        except EventFormatError as exc:
            out.append(("refused", exc.reason))
        out.append((decoder.held_bytes, decoder.in_window, decoder.window_scn))
    return out


def test_a_valid_body_takes_the_fast_path_and_equals_the_reference() -> None:
    body = b"".join(EVENTS)
    fast, slow = _decoders()
    s = batch.scan(body)
    found = batch.decode_relay_body(body, s, NAMES, fast._value_decoder(NAMES), DataEvent,
                                    lazy_event, EndOfWindow, None, 0, 0, True, True)
    assert found is not None and found[2] == 4  # the fast path took it: four EOWs
    got, want = _run(fast, [body]), _run(slow, [body])
    events = [i for i in got[0] if isinstance(i, DataEvent)]
    assert len(events) == 4 * len(KEYS)
    assert not any(e.decoded for e in events if e.value_bytes is not None)
    assert [e.value for e in events[:2]] == [row(1000), row(1001)]
    assert got == want


@pytest.mark.parametrize("cut", [1, 3, 7, 8, 13, 20])
def test_bodies_split_between_events_hold_the_open_window_alike(cut: int) -> None:
    bodies = [b"".join(EVENTS[:cut]), b"".join(EVENTS[cut:cut + 5]),
              b"".join(EVENTS[cut + 5:])]
    fast, slow = _decoders()
    assert _run(fast, bodies) == _run(slow, bodies)


def test_a_dump_marker_goes_by_the_reference_path_with_the_same_result() -> None:
    marker = encode_dump_marker(scn=101, kind="start", source="shop.orders", dump_id="d1")
    events = list(EVENTS)
    events.insert(len(KEYS) + 2, marker)
    body = b"".join(fix_windows(events))
    fast, slow = _decoders()
    assert _run(fast, [body]) == _run(slow, [body])


def _twin_answers(body: bytes, make_lazy: Any, make_window: Any = None) -> list[Any]:
    """``decode_relay_body`` of each twin on ``body`` (an exception from the value
    decoder as its type): the tests hold them equal."""
    s = batch.scan(body)
    if s.error is not None:
        return []
    value_decoder = ResponseDecoder(CODEC)._value_decoder(NAMES)
    answers: list[Any] = []
    for name in ("python", "native"):
        try:
            core = batch.twin(name)
        except ImportError:
            if os.environ.get("CI"):
                raise
            continue
        try:
            answers.append(core.decode_relay_body(
                body, s, NAMES, value_decoder, DataEvent, make_lazy, EndOfWindow, None, 0,
                0, True, True, make_window))
        except (SchemaError, UnknownSchemaError) as exc:  # from value_decoder
            answers.append(type(exc))
    return answers


@FUZZ
@given(which=st.integers(0, len(EVENTS) - 1), start=st.integers(0, 400),
       patch=st.binary(min_size=1, max_size=8),
       mode=st.sampled_from(["overwrite", "insert", "delete"]), fix_eow=st.booleans(),
       cut=st.integers(0, len(EVENTS)))
def test_mutated_bodies_agree(which: int, start: int, patch: bytes, mode: str,
                              fix_eow: bool, cut: int) -> None:
    events = list(EVENTS)
    events[which] = mutate(events[which], start, patch, mode)
    if fix_eow:
        with contextlib.suppress(struct.error):
            events = fix_windows(events)
    bodies = [b"".join(events[:cut]), b"".join(events[cut:])]
    fast, slow = _decoders()
    assert _run(fast, bodies) == _run(slow, bodies)
    # The twins answer alike on the whole body.
    answers = _twin_answers(b"".join(events), lazy_event)
    assert all(a == answers[0] for a in answers)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=30))
def test_eow_order_twins_agree(spec: list[tuple[int, bool]]) -> None:
    """Windows given as (SCN step, end here): any order, torn or not, both twins point
    at the same first EOW out of order."""
    events: list[bytes] = []
    scn = 10
    for step, end in spec:
        scn += step - 1  # steps of -1..4: SCNs may go back or repeat
        events.append(encode_event(scn=scn, source_id=3, op=Op.UPSERT, key=1,
                                   value=CODEC.encode(row(1), SCHEMA),
                                   schema_fingerprint=SCHEMA.fingerprint))
        if end:
            events.append(encode_eow(scn=scn + (step == 5), event_count=1, checksum=0))
    body = b"".join(events)
    s = batch.scan(body)
    frames = batch.frame_windows(s)
    answers = []
    for name in ("python", "native"):
        try:
            answers.append(batch.twin(name).eow_order(s, frames.eows))
        except ImportError:
            if os.environ.get("CI"):
                raise
    assert all(a == answers[0] for a in answers)


def _flatten(got: list[Any]) -> list[Any]:
    """Whole-window items (``Window``) back into their events, for comparing."""
    out: list[Any] = []
    for entry in got:
        if isinstance(entry, list):
            flat: list[Any] = []
            for item in entry:
                if isinstance(item, Window):
                    assert not item.markers
                    assert item.timestamp_ns == item.events[0].timestamp_ns  # EOW has 0
                    flat.extend(item.events)
                else:
                    flat.append(item)
            out.append(flat)
        else:
            out.append(entry)
    return out


@pytest.mark.parametrize(("cut", "whole"), [
    (0, [[], [100, 101, 102, 103]]), (1, [[], [101, 102, 103]]),
    (7, [[100], [101, 102, 103]]), (13, [[100], [102, 103]]), (20, [[100, 101], [103]]),
])
def test_whole_windows_hold_the_same_events(cut: int, whole: list[list[int]]) -> None:
    bodies = [b"".join(EVENTS[:cut]), b"".join(EVENTS[cut:])]
    fast, slow = _decoders()
    fast.whole_windows = True
    got = _run(fast, bodies)
    # Every window that began and ended in one body came whole (a window carried over
    # from the body before comes event by event, as before).
    assert [[i.scn for i in entry if isinstance(i, Window)]
            for entry in got if isinstance(entry, list)] == whole
    assert _flatten(got) == _run(slow, bodies)


@FUZZ
@given(which=st.integers(0, len(EVENTS) - 1), patch=st.binary(min_size=1, max_size=4),
       start=st.integers(0, 300))
def test_whole_window_twins_agree_on_mutated_bodies(which: int, patch: bytes,
                                                    start: int) -> None:
    events = list(EVENTS)
    events[which] = mutate(events[which], start, patch, "overwrite")
    answers = _twin_answers(b"".join(fix_windows(events)), DataEvent, Window)
    assert all(a == answers[0] for a in answers)
