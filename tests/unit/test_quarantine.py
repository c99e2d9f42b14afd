"""The pure parts of per-source quarantine (DESIGN 17): the record file, the marker,
the cut of a read at a quarantine SCN, and the sink step that writes markers and drops
a quarantined source's events (on a real EventBuffer)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.checkpoint import Checkpoint
from databus.errors import ConfigError, EventFormatError, NotQuarantinedError
from databus.event import (
    QUARANTINE_SOURCE_ID,
    Op,
    decode_event,
    decode_header,
    encode_control,
    encode_event,
    iter_events,
)
from databus.fetchers._api import SourceFailure
from databus.relay._buffer import EventBuffer
from databus.relay.dumps import DumpSink
from databus.relay.quarantine._read import cut_before, guard, including
from databus.relay.quarantine._record import (
    Quarantine,
    QuarantineMarker,
    QuarantineStore,
    QuarantineView,
    decode_quarantine_marker,
    encode_quarantine_marker,
)
from databus.relay.quarantine._sink import QuarantineSink

FAILURE = SourceFailure("shop.items", 7, "a row its schema cannot hold", "heal it")


# -- the store -------------------------------------------------------------------------


def test_the_store_keeps_quarantines_across_reopening(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    store = QuarantineStore(path)
    record = store.add("b", FAILURE)
    assert record is not None and record.marker_scn is None
    assert store.add("b", SourceFailure("shop.items", 9, "again", "x")) is None  # first stands
    assert store.unmarked("b") == [record]
    store.marked("b", "shop.items", 8)
    again = QuarantineStore(path)
    (kept,) = again.active("b").values()
    assert (kept.source, kept.scn, kept.reason, kept.fix, kept.marker_scn) == (
        "shop.items", 7, FAILURE.reason, FAILURE.fix, 8)
    assert again.active("other") == {} and again.unmarked("b") == []
    assert kept.to_json() == {"source": "shop.items", "scn": 7, "reason": FAILURE.reason,
                              "fix": "heal it", "since": kept.since}


def test_a_heal_is_durable_in_steps(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    store = QuarantineStore(path)
    with pytest.raises(NotQuarantinedError):
        store.begin_heal("b", "shop.items")
    store.add("b", FAILURE)
    store.begin_heal("b", "shop.items")
    assert store.active("b") == {}  # captured again from the next attempt
    with pytest.raises(NotQuarantinedError):
        store.begin_heal("b", "shop.items")
    # A crash here: the relay finishes the heal at start (its dump, its marker).
    (healing,) = QuarantineStore(path).healing()
    assert (healing.source, healing.heal_dump, healing.heal_marked) == ("shop.items", None,
                                                                        False)
    store.heal_step("b", "shop.items", marked=True)
    (healing,) = QuarantineStore(path).healing()
    assert (healing.heal_dump, healing.heal_marked) == (None, True)
    store.heal_step("b", "shop.items", dump="d1")  # both done: the record goes
    assert QuarantineStore(path).healing() == [] and store.healing() == []
    assert store.add("b", FAILURE) is not None  # may be quarantined again later
    store.heal_step("b", "shop.items", dump="d2")  # not healing: no effect
    assert list(store.active("b")) == ["shop.items"]


def test_a_new_failure_during_a_heal_stands(tmp_path: Path) -> None:
    store = QuarantineStore(tmp_path / "quarantine.json")
    store.add("b", FAILURE)
    store.begin_heal("b", "shop.items")
    again = store.add("b", SourceFailure("shop.items", 20, "still bad", "fix"))
    assert again is not None and again.scn == 20
    store.heal_step("b", "shop.items", dump="d1", marked=True)  # the old heal's steps
    assert store.active("b")["shop.items"].scn == 20


def test_a_damaged_file_is_refused_not_guessed(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    path.write_text('{"version": 1, "quarantined": [{"buffer": "b"}]}')
    with pytest.raises(ConfigError, match="damaged"):
        QuarantineStore(path)


def test_a_workers_view_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    view = QuarantineView(path)
    assert view.active("b") == {}
    store = QuarantineStore(path)
    store.add("b", FAILURE)
    view.refresh()
    assert list(view.active("b")) == ["shop.items"]
    store.begin_heal("b", "shop.items")
    view.refresh()
    assert view.active("b") == {}


def test_secrets_in_a_reason_are_not_kept(tmp_path: Path) -> None:
    from databus._redact import register_secret

    register_secret("hunter2-secret")
    store = QuarantineStore(tmp_path / "q.json")
    store.add("b", SourceFailure("s.t", 1, "login hunter2-secret failed", "fix"))
    assert "hunter2-secret" not in (tmp_path / "q.json").read_text()


# -- the marker ------------------------------------------------------------------------


@pytest.mark.parametrize("marker", [
    QuarantineMarker("shop.items", "quarantined", 7, "why", "fix"),
    QuarantineMarker("shop.items", "healed"),
])
def test_markers_round_trip(marker: QuarantineMarker) -> None:
    raw = encode_quarantine_marker(window_scn=9, marker=marker, partition_id=2)
    event = decode_event(raw)
    assert event.header.source_id == QUARANTINE_SOURCE_ID and event.header.scn == 9
    assert decode_quarantine_marker(event.header, event.value) == marker


@pytest.mark.parametrize("payload", [
    b'{"source":"a.b","state":"healed","x":1}',
    b'{"source":"a.b","state":"quarantined"}',
    b'{"state":"healed","source":"a.b"}',  # not canonical
    b'{"source":"","state":"healed"}',
    b'{"fix":"f","reason":"r","scn":"7","source":"a.b","state":"quarantined"}',
    b"[1]",
    b"not json",
])
def test_bad_markers_are_refused(payload: bytes) -> None:
    event = decode_event(encode_control(scn=1, source_id=QUARANTINE_SOURCE_ID,
                                        payload=payload))
    with pytest.raises(EventFormatError):
        decode_quarantine_marker(event.header, event.value)


# -- the cut at a quarantine SCN -------------------------------------------------------


@pytest.fixture
def buffer(tmp_path: Path) -> Iterator[EventBuffer]:
    buf = EventBuffer(tmp_path / "b.buf", 1 << 20)
    yield buf
    buf.close()


def _fill(buffer: EventBuffer, scns: list[int], per_window: int = 2) -> None:
    for scn in scns:
        buffer.append_window(scn, [encode_event(scn=scn, source_id=1, op=Op.UPSERT,
                                                key=scn * 10 + i, value=b"v")
                                   for i in range(per_window)])


def _eows(data: bytes) -> list[int]:
    return [h.scn for _, h in iter_events(data) if h.is_eow]


def test_a_read_is_cut_before_the_quarantine_scn(buffer: EventBuffer) -> None:
    _fill(buffer, [3, 5, 7, 9])
    whole = buffer.read(Checkpoint.flexible(), max_bytes=1 << 20)
    cut = cut_before(whole, 7)
    assert cut is not None and _eows(cut.data) == [3, 5]
    assert cut.checkpoint == Checkpoint(5) and (cut.events, cut.windows) == (4, 2)
    assert cut_before(whole, 10) is whole  # nothing at or after it
    assert cut_before(whole, 3) is None  # nothing before it: the error
    # A consumer past X, at the tail, waits for nothing: the error at once.
    tail = buffer.read(Checkpoint(9), max_bytes=1 << 20)
    assert tail.data == b"" and cut_before(tail, 7) is None
    assert cut_before(tail, 10) is tail  # the window X has not landed yet: wait
    # From inside a window before X, cut at X: that window's rest and nothing after.
    partial = buffer.read(Checkpoint(3), max_bytes=1 << 20)
    first = buffer.read(Checkpoint(3), max_bytes=len(partial.data) // 4)
    assert first.checkpoint.window_offset != -1 or first.checkpoint.window_scn == 5
    rest = cut_before(buffer.read(first.checkpoint, max_bytes=1 << 20), 7)
    assert rest is not None and _eows(rest.data)[-1] == 5


def test_a_guarded_read_raises_the_quarantine_error(buffer: EventBuffer) -> None:
    _fill(buffer, [3, 5])
    q = Quarantine("b", "shop.items", 5, "why", "fix", 0.0)
    read = guard(buffer.read, q)
    assert _eows(read(Checkpoint.flexible(), max_bytes=1 << 20).data) == [3]
    with pytest.raises(Exception) as caught:
        read(Checkpoint(3), max_bytes=1 << 20)
    error = caught.value
    assert getattr(error, "code", None) == "source_quarantined" and error.retriable  # type: ignore[attr-defined]
    assert error.to_json()["scn"] == 5 and error.to_json()["fix"] == "fix"  # type: ignore[attr-defined]
    assert guard(buffer.read, None) == buffer.read


def test_the_first_quarantine_a_subscription_includes() -> None:
    a = Quarantine("b", "s.a", 9, "", "", 0.0)
    c = Quarantine("b", "s.c", 4, "", "", 0.0)
    active = {"s.a": a, "s.c": c}
    assert including(active, []) is c  # every source of the buffer
    assert including(active, ["s.a", "s.b"]) is a
    assert including(active, ["s.b"]) is None
    assert including({}, []) is None


# -- the sink step ---------------------------------------------------------------------


class _Seen:
    def __init__(self) -> None:
        self.marked: list[tuple[str, int]] = []
        self.upstream: list[tuple[QuarantineMarker, int]] = []
        self.ids: frozenset[int] = frozenset()


def _sink(buffer: EventBuffer, seen: _Seen) -> QuarantineSink:
    return QuarantineSink(DumpSink(buffer, 0), 0, dropped_ids=lambda: seen.ids,
                          on_marked=lambda m, scn: seen.marked.append((m.source, scn)),
                          on_upstream=lambda m, scn: seen.upstream.append((m, scn)))


def _markers(buffer: EventBuffer) -> list[tuple[int, dict[str, object]]]:
    data = buffer.read(Checkpoint.flexible(), max_bytes=1 << 20).data
    return [(h.scn, json.loads(bytes(decode_event(data, off).value)))
            for off, h in iter_events(data) if h.source_id == QUARANTINE_SOURCE_ID]


def test_a_marker_lands_in_the_open_window_and_survives_only_when_published(
        buffer: EventBuffer) -> None:
    seen = _Seen()
    sink = _sink(buffer, seen)
    marker = QuarantineMarker("shop.items", "quarantined", 4, "why", "fix")
    sink.start_window(4)
    sink.mark_now(marker)
    sink.rollback()  # the fetcher died mid-window: the marker goes with the next one
    assert seen.marked == [] and _markers(buffer) == []
    sink.start_window(5)
    sink.append(encode_event(scn=5, source_id=1, op=Op.UPSERT, key=1, value=b"v"))
    sink.end_window()
    assert seen.marked == [("shop.items", 5)]
    assert _markers(buffer) == [(5, {"fix": "fix", "reason": "why", "scn": 4,
                                     "source": "shop.items", "state": "quarantined"})]
    sink.start_window(6)
    sink.append(encode_event(scn=6, source_id=1, op=Op.UPSERT, key=2, value=b"v"))
    sink.end_window()
    assert len(_markers(buffer)) == 1  # written once


def test_a_window_with_a_marker_and_watermarks_only_is_kept(buffer: EventBuffer) -> None:
    seen = _Seen()
    sink = _sink(buffer, seen)
    sink.queue(QuarantineMarker("shop.items", "healed"))
    sink.start_window(3)
    sink.watermark("token-of-no-chunk")
    sink.end_window()
    assert [m for _, m in _markers(buffer)] == [{"source": "shop.items", "state": "healed"}]


def test_events_of_a_quarantined_source_are_dropped(buffer: EventBuffer) -> None:
    seen = _Seen()
    seen.ids = frozenset({2})
    sink = _sink(buffer, seen)
    sink.start_window(3)
    for source in (1, 2, 1):
        sink.append(encode_event(scn=3, source_id=source, op=Op.UPSERT, key=source,
                                 value=b"v"))
    sink.end_window()
    data = buffer.read(Checkpoint.flexible(), max_bytes=1 << 20).data
    assert [h.source_id for _, h in iter_events(data) if not h.is_control] == [1, 1]
    assert sink.dropped == 1


def test_an_upstream_marker_is_stored_as_it_came_and_reported(buffer: EventBuffer) -> None:
    """A chained relay: the upstream's marker is reported to the host (which records
    it and may queue the same marker) and stored once, not twice."""
    seen = _Seen()
    sink = _sink(buffer, seen)
    marker = QuarantineMarker("shop.items", "quarantined", 3, "why", "fix")
    raw = encode_quarantine_marker(window_scn=4, marker=marker)
    sink.start_window(4)
    sink.queue(marker)
    sink.append_control(raw)
    sink.end_window()
    assert seen.upstream == [(marker, 4)]
    assert [scn for scn, _ in _markers(buffer)] == [4]
    assert decode_header(raw).source_id == QUARANTINE_SOURCE_ID
    sink.start_window(5)
    sink.end_window()
    assert [scn for scn, _ in _markers(buffer)] == [4]  # the queued one was that one


def test_a_failed_write_records_nothing_so_a_retry_records_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    import databus.relay.quarantine._record as module

    store = QuarantineStore(tmp_path / "quarantine.json")

    def full(path: Path, data: bytes, **_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module, "write_atomically", full)
    with pytest.raises(OSError):
        store.add("b", FAILURE)
    assert store.active("b") == {}
    monkeypatch.undo()
    assert store.add("b", FAILURE) is not None  # the fetcher's next attempt: recorded
    assert list(QuarantineStore(tmp_path / "quarantine.json").active("b")) == ["shop.items"]


def test_a_cluster_follower_writes_no_marker_of_its_own(buffer: EventBuffer) -> None:
    """Its windows stay byte-identical to its leader's (it copies the leader's markers);
    what it had queued is written once it leads."""
    seen = _Seen()
    sink = _sink(buffer, seen)
    sink.own_markers = False
    sink.queue(QuarantineMarker("shop.items", "quarantined", 2, "why", "fix"))
    sink.start_window(3)
    sink.end_window()
    assert _markers(buffer) == [] and seen.marked == []
    sink.own_markers = True
    sink.start_window(4)
    sink.end_window()
    assert [scn for scn, _ in _markers(buffer)] == [4] and seen.marked == [("shop.items", 4)]


def test_a_malformed_upstream_marker_is_a_retriable_bad_answer(buffer: EventBuffer) -> None:
    sink = _sink(buffer, _Seen())
    sink.start_window(3)
    with pytest.raises(EventFormatError) as caught:
        sink.append_control(encode_control(scn=3, source_id=QUARANTINE_SOURCE_ID,
                                           payload=b'{"source":"a.b"}'))
    assert caught.value.retriable
    sink.rollback()
