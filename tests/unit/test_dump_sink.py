"""The watermark step of a dump (relay.dumps.DumpSink) on a real EventBuffer: which chunk
rows land, where, and what the log keeps (DESIGN 8.1, DBLog)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from databus.checkpoint import Checkpoint
from databus.event import (
    DUMP_END_SOURCE_ID,
    DUMP_START_SOURCE_ID,
    Op,
    decode_event,
    encode_event,
    iter_events,
)
from databus.fetchers._api import DumpRow
from databus.relay._buffer import EventBuffer
from databus.relay.dumps import Chunk, DumpSink
from databus.relay.dumps._sink import TableRun

pytestmark = pytest.mark.twin("databus.batch")

SRC = 7


def _event(scn: int, key: int, value: bytes = b"v", op: Op = Op.UPSERT) -> bytes:
    return encode_event(scn=scn, source_id=SRC, op=op, key=key, value=value)


def _rows(*keys: int) -> list[DumpRow]:
    return [DumpRow(key, f"dump{key}".encode(), 0) for key in keys]


@pytest.fixture
def buffer(tmp_path: Path) -> EventBuffer:
    buf = EventBuffer(tmp_path / "b.buf", 1 << 20)
    yield buf
    buf.close()


def _served(buffer: EventBuffer) -> list[tuple[int, int, object, int, bool]]:
    """(scn, source id, key or None, op, from dump) of every event served, EOWs excluded."""
    result = buffer.read(Checkpoint.flexible(), max_bytes=1 << 20)
    out = []
    for offset, header in iter_events(result.data):
        if header.is_eow:
            continue
        event = decode_event(result.data, offset)
        key = None if header.is_control else event.key
        out.append((header.scn, header.source_id, key, int(header.op), header.from_snapshot))
    return out


def _window(sink: DumpSink, scn: int, *events: bytes, watermark: str | None = None) -> None:
    sink.start_window(scn)
    if watermark is not None:
        sink.watermark(watermark)
    for event in events:
        sink.append(event)
    sink.end_window()


def _chunk(first: bool = True, *, low: str = "L", high: str = "H",
           run: TableRun | None = None) -> Chunk:
    if run is None:
        run = TableRun("d1", "db.t", started=not first)
    return Chunk(table=run, source_id=SRC, low=low, high=high)


def test_rows_land_in_the_high_watermark_window_minus_touched_keys(buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    chunk = _chunk()
    sink.offer(chunk)
    _window(sink, 10, _event(10, 1))  # before L: does not touch
    _window(sink, 11, watermark="L")  # watermark only: not stored
    assert chunk.phase == "open"
    sink.set_rows(chunk, _rows(1, 2, 3, 4), last=True)
    _window(sink, 12, _event(12, 2, op=Op.DELETE))  # between: key 2 is the log's
    _window(sink, 13, _event(13, 3))  # between: key 3 is the log's
    _window(sink, 14, watermark="H")
    assert chunk.phase == "emitted" and chunk.emitted_scn == 14
    assert (chunk.emitted_rows, chunk.dropped_rows) == (2, 2)
    served = _served(buffer)
    assert served == [
        (10, SRC, 1, 1, False),
        (12, SRC, 2, 2, False),
        (13, SRC, 3, 1, False),
        (14, DUMP_START_SOURCE_ID, None, 0, False),
        (14, SRC, 1, 1, True),
        (14, SRC, 4, 1, True),
        (14, DUMP_END_SOURCE_ID, None, 0, False),
    ]
    assert 11 not in {s[0] for s in served}  # the low watermark's window was dropped


def test_a_key_updated_then_deleted_between_watermarks_is_never_resurrected(
        buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    chunk = _chunk()
    sink.offer(chunk)
    _window(sink, 20, watermark="L")
    sink.set_rows(chunk, _rows(5), last=False)
    _window(sink, 21, _event(21, 5, b"new"))
    _window(sink, 22, _event(22, 5, op=Op.DELETE))
    _window(sink, 23, watermark="H")
    served = _served(buffer)
    assert [s for s in served if s[2] == 5] == [(21, SRC, 5, 1, False), (22, SRC, 5, 2, False)]
    # Not the table's last chunk: no end marker; its first: a start marker.
    assert [s[1] for s in served if s[0] == 23] == [DUMP_START_SOURCE_ID]


def test_events_of_the_high_watermark_window_come_before_the_rows(buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    chunk = _chunk(first=False)
    sink.offer(chunk)
    _window(sink, 30, watermark="L")
    sink.set_rows(chunk, _rows(8, 9), last=False)
    # A transaction sharing the high watermark's window (never written by the engine,
    # but the order must hold): its own event first, then the rows.
    _window(sink, 31, _event(31, 9), watermark="H")
    served = _served(buffer)
    assert served == [(31, SRC, 9, 1, False), (31, SRC, 8, 1, True)]


def test_foreign_and_stale_watermarks_are_ignored(buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    _window(sink, 40, watermark="someone-else")  # no chunk at all
    chunk = _chunk()
    sink.offer(chunk)
    _window(sink, 41, watermark="H")  # high before low: not this chunk's turn
    assert chunk.phase == "awaiting_low"
    _window(sink, 42, _event(42, 1), watermark="other-relay")
    assert _served(buffer) == [(42, SRC, 1, 1, False)]


def test_a_failed_end_window_is_retried_when_the_fetcher_reads_high_again(
        buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    chunk = _chunk()
    sink.offer(chunk)
    _window(sink, 50, watermark="L")
    sink.set_rows(chunk, _rows(1), last=True)
    sink.start_window(51)
    sink.watermark("H")
    buffer.rollback()  # the fetcher died here; the host rolled back
    assert chunk.phase == "open"
    _window(sink, 51, watermark="H")  # the restarted fetcher reads it again
    assert chunk.phase == "emitted"
    assert [s[2] for s in _served(buffer) if s[1] == SRC] == [1]


def test_a_withdrawn_chunk_never_lands(buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    old = _chunk()
    sink.offer(old)
    _window(sink, 60, watermark="L")
    sink.withdraw(old)
    assert old.phase == "abandoned"
    sink.set_rows(old, _rows(1), last=True)
    _window(sink, 61, watermark="H")  # the old chunk's high: ignored
    assert _served(buffer) == []
    assert old.phase == "abandoned"
    assert sink.append == buffer.append


def test_wait_returns_when_the_fetcher_thread_emits(buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    chunk = _chunk()
    sink.offer(chunk)

    def fetcher() -> None:
        _window(sink, 70, watermark="L")
        sink.set_rows(chunk, _rows(1), last=True)
        _window(sink, 71, watermark="H")

    thread = threading.Thread(target=fetcher)
    thread.start()
    assert sink.wait(chunk, ("emitted",), 5.0)
    thread.join()
    assert chunk.emitted_scn == 71


def test_no_open_chunk_costs_nothing_per_event(buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    assert sink.append == buffer.append  # the buffer's own bound method
    chunk = _chunk()
    sink.offer(chunk)
    _window(sink, 80, watermark="L")
    assert sink.append != buffer.append
    sink.set_rows(chunk, [], last=True)
    _window(sink, 81, watermark="H")
    assert sink.append == buffer.append
    # An empty last chunk still marks the table: start and end, no rows.
    assert [s[1] for s in _served(buffer)] == [DUMP_START_SOURCE_ID, DUMP_END_SOURCE_ID]


def test_chunks_of_two_ranges_in_flight_each_drop_only_keys_touched_after_their_low(
        buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    run = TableRun("d1", "db.t", ranges_left=2)
    a = _chunk(low="La", high="Ha", run=run)  # range (.., 10]
    b = _chunk(low="Lb", high="Hb", run=run)  # range (10, ..]
    sink.offer(a)
    sink.offer(b)
    _window(sink, 10, watermark="La")
    _window(sink, 11, _event(11, 12))  # touches 12 before b's low: b keeps its row
    _window(sink, 12, watermark="Lb")
    _window(sink, 13, _event(13, 3), _event(13, 14))  # after both lows
    sink.set_rows(a, _rows(1, 3), last=True)
    sink.set_rows(b, _rows(12, 14, 15), last=False)
    _window(sink, 14, watermark="Hb")
    assert (b.phase, b.emitted_rows, b.dropped_rows) == ("emitted", 2, 1)
    assert (run.started, run.ranges_left, run.rows, run.ended) == (True, 2, 2, False)
    _window(sink, 15, watermark="Ha")
    assert (a.emitted_rows, a.dropped_rows) == (1, 1)
    assert (run.ranges_left, run.ended) == (1, False)  # b's range still has rows
    last = _chunk(low="Lc", high="Hc", run=run)
    sink.offer(last)
    _window(sink, 16, watermark="Lc")
    sink.set_rows(last, [], last=True)
    _window(sink, 17, watermark="Hc")
    assert (run.ranges_left, run.rows, run.ended) == (0, 3, True)
    served = _served(buffer)
    dumped = [(s[0], s[2]) for s in served if s[4]]
    assert dumped == [(14, 12), (14, 15), (15, 1)]
    starts = [s[0] for s in served if s[1] == DUMP_START_SOURCE_ID]
    ends = [s[0] for s in served if s[1] == DUMP_END_SOURCE_ID]
    assert (starts, ends) == ([14], [17])  # one start before any row, one end after all
    assert sink.append == buffer.append  # nothing in flight: no cost per event


def test_a_window_that_fails_leaves_the_table_counts_as_they_were(buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    run = TableRun("d1", "db.t")
    chunk = _chunk(run=run)
    sink.offer(chunk)
    _window(sink, 50, watermark="L")
    sink.set_rows(chunk, _rows(1, 2), last=True)
    sink.start_window(51)
    sink.watermark("H")
    sink.rollback()  # the window never landed (the fetcher died)
    assert (run.started, run.rows, run.ranges_left, run.ended) == (False, 0, 1, False)
    _window(sink, 51, watermark="H")
    assert (run.started, run.rows, run.ranges_left, run.ended) == (True, 2, 0, True)
    assert [s[1] for s in _served(buffer)] == [DUMP_START_SOURCE_ID, SRC, SRC,
                                               DUMP_END_SOURCE_ID]


def test_composite_and_string_keys_are_matched_exactly(buffer: EventBuffer) -> None:
    sink = DumpSink(buffer, 0)
    chunk = _chunk(first=False)
    sink.offer(chunk)
    _window(sink, 60, watermark="L")
    _window(sink, 61, encode_event(scn=61, source_id=SRC, op=Op.UPSERT, key=("a", 1),
                                   value=b"v"),
            encode_event(scn=61, source_id=SRC, op=Op.UPSERT, key="x", value=b"v"),
            encode_event(scn=61, source_id=SRC + 1, op=Op.UPSERT, key=("a", 2), value=b"v"))
    rows = [DumpRow(("a", 1), b"r", 0), DumpRow(("a", 2), b"r", 0), DumpRow("x", b"r", 0),
            DumpRow(b"x", b"r", 0), DumpRow(("a", 1.5), b"r", 0)]
    sink.set_rows(chunk, rows, last=False)
    _window(sink, 62, watermark="H")
    # ("a", 2) was touched in another source; bytes b"x" is not the string "x".
    assert [s[2] for s in _served(buffer) if s[4]] == [("a", 2), b"x", ("a", 1.5)]
