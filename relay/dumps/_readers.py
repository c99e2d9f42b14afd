"""The chunk readers of one dump run: key ranges taken by ``parallelism`` readers, each
on its own connection, each one chunk ahead of the buffer (see ``_worker``'s docstring
for the whole loop; DESIGN 8.1 for the watermarks).

    worker thread ──┐
    reader 2 ───────┼─> take (table, range) -> chunk, chunk, ... -> next range
    reader P ───────┘          each chunk: L, SELECT, H; its rows land in H's window

``plan_ranges`` fixes a table's key ranges when it starts (persisted with the dump);
``DumpRun`` hands ranges out and collects what ends a reader (a table failed, the dump
stopped, an error that fails the dump); ``read_range`` is one reader's loop over one
range, ``write_chunk`` one chunk up to its high watermark.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from databus._limited_log import limited
from databus._redact import redact
from databus.errors import DatabusError, DumpSetupError
from databus.event import HEADER_SIZE
from databus.fetchers._api import DumpChunk, DumpSource
from databus.relay.dumps._sink import Chunk, TableRun
from databus.relay.dumps._state import Dump, KeyRange, TableProgress

if TYPE_CHECKING:
    from databus.relay.dumps._worker import _Worker

__all__ = ["DumpRun", "Gate", "Stopped", "TooBig", "plan_ranges", "read_range"]

log = logging.getLogger("databus.relay.dumps")

RANGES_PER_READER = 4  # ranges of a large table per reader: readers finish together
_BACKOFF_MAX = 30.0


class Stopped(Exception):
    """The relay is stopping, or the dump was paused or cancelled: leave the chunk."""


class TooBig(Exception):
    """A chunk's rows would not fit a window of the buffer: read ``rows`` at a time."""

    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


class _TableFailed(Exception):
    """Another reader failed this range's table: leave the range."""


def plan_ranges(dump: Dump, table: TableProgress, source: DumpSource) -> list[KeyRange]:
    """The key ranges of ``table``: one, or (parallel dump of a table of more than two
    chunks, a source that can split) up to ``RANGES_PER_READER`` per reader, cut at the
    split points the source reads from the table's key index. A table resumed from a
    state file of an earlier version keeps its one cursor."""
    whole = [KeyRange(cursor=table.cursor)]
    split = getattr(source, "split_points", None)
    if (dump.keys is not None or dump.parallelism <= 1 or table.cursor is not None
            or split is None or table.estimate < 2 * dump.chunk_rows):
        return whole
    count = min(RANGES_PER_READER * dump.parallelism, table.estimate // dump.chunk_rows)
    points: list[list[Any]] = split(table.source, count)
    if not points:
        return whole
    bounds: list[list[Any] | None] = [None, *points, None]
    return [KeyRange(lo=bounds[i], hi=bounds[i + 1]) for i in range(len(bounds) - 1)]


class Gate:
    """How a run's readers share the source with its writers (``Dump.gives_way``).

    Off (the operator chose ``parallelism``): nothing. On (the default): while the log
    has carried a write within the last second, the dump gives way: one chunk of at
    most ``ROWS`` rows at a time, read and landed whole (no reader ahead), then a pause
    ``PAUSE`` times as long as it took, so that the dump keeps the source and the relay
    busy a quarter of the time at most, in bursts of a few milliseconds; on a source
    without writes every reader goes, one chunk ahead.
    """

    WRITES_WITHIN_S = 1.0
    # Rows of a chunk while giving way: short bursts (a writer's transaction that meets
    # one waits for a few milliseconds at most), each followed by its pause.
    ROWS = 1_000
    # The pause after a turn, in turns' lengths: the dump works a quarter of the time.
    PAUSE = 3.0

    def __init__(self, on: bool, log_events: Callable[[], int], stop: threading.Event
                 ) -> None:
        self.on = on
        self._log_events = log_events
        self._stop = stop
        self._lock = threading.Lock()
        self._seen = log_events()
        self._busy_until = 0.0
        self.turns_given_way = 0

    def writers_active(self) -> bool:
        now = time.monotonic()
        events = self._log_events()
        if events != self._seen:
            self._seen = events
            self._busy_until = now + self.WRITES_WITHIN_S
        return now < self._busy_until

    @contextmanager
    def turn(self) -> Iterator[bool]:
        """One chunk's turn: True when the dump gives way (exclusive, paced)."""
        if not self.on or not self.writers_active():
            yield False
            return
        with self._lock:
            started = time.monotonic()
            yield True
            self.turns_given_way += 1
            self._stop.wait(self.PAUSE * (time.monotonic() - started))


@dataclass
class DumpRun:
    """The ranges still to read and what ended readers (shared by them, one lock)."""

    work: deque[tuple[TableProgress, KeyRange]]
    runs: dict[str, TableRun]
    gate: Gate
    lock: threading.Lock = field(default_factory=threading.Lock)
    fatal: BaseException | None = None
    stopped: bool = False
    reading: dict[str, int] = field(default_factory=dict)  # readers in each table

    def take(self) -> tuple[TableProgress, KeyRange] | None:
        with self.lock:
            if self.fatal is not None or self.stopped:
                return None
            while self.work:
                table, key_range = self.work.popleft()
                if table.state != "failed":
                    self.reading[table.source] = self.reading.get(table.source, 0) + 1
                    return table, key_range
            return None

    def leave(self, table: TableProgress) -> bool:
        """A reader is done with a range of ``table``: True when it was the last one
        reading it (a failed table's end marker may go now: no chunk of it is in
        flight any more)."""
        with self.lock:
            self.reading[table.source] -= 1
            return self.reading[table.source] == 0

    def give_back(self, table: TableProgress, key_range: KeyRange) -> None:
        """A range a reader could not finish (retriable error): first in line again."""
        with self.lock:
            self.work.appendleft((table, key_range))

    def end(self, exc: BaseException) -> None:
        with self.lock:
            if isinstance(exc, Stopped):
                self.stopped = True
            elif self.fatal is None:
                self.fatal = exc


def reader_loop(worker: _Worker, dump: Dump, run: DumpRun,
                source: Callable[[], DumpSource], close: Callable[[], None]) -> None:
    """One reader: ranges from ``run`` until none is left or the run ends. Retriable
    errors retry the range after a backoff (0.5 s doubling to 30 s, reset when a range
    is read to its end), on a new connection."""
    manager = worker.manager
    backoff = 0.5
    while True:
        item = run.take()
        if item is None:
            return
        table, key_range = item
        try:
            read_range(worker, dump, table, key_range, run.runs[table.source], source(),
                       run.gate)
            backoff = 0.5
        except _TableFailed:
            pass
        except Stopped as exc:
            run.end(exc)
            return
        except DumpSetupError as exc:
            fail_table(worker, dump, table, exc)
        except DatabusError as exc:
            if not exc.retriable:
                run.end(exc)
                return
            log.warning("dump %s: %s: %s; trying again in %.1f s", dump.id, table.source,
                        exc, backoff)
            with manager._lock:  # visible in /v1/dumps until a chunk completes
                dump.error = redact(f"{exc}; trying again in {backoff:.1f} s")
            close()
            run.leave(table)
            run.give_back(table, key_range)
            if manager._stop.wait(backoff):
                run.end(Stopped())
                return
            backoff = min(backoff * 2, _BACKOFF_MAX)
            continue
        except BaseException as exc:
            run.end(exc)
            return
        if run.leave(table) and table.owes_end:
            # The table failed and no reader has a chunk of it in flight: its end
            # marker (outcome failed) goes before the next tables' rows.
            try:
                worker._write_end(dump, table, source())
            except Stopped as exc:
                run.end(exc)
                return
            except Exception as exc:  # the run's end writes it again
                log.warning("dump %s: the end marker of %s: %s", dump.id, table.source,
                            redact(str(exc)))


def fail_table(worker: _Worker, dump: Dump, table: TableProgress, exc: Exception) -> None:
    with worker.manager._lock:
        if table.state == "failed":
            return
        table.state = "failed"
        table.error = str(exc)
        worker.manager._save()
    log.error("dump %s: table %s failed: %s", dump.id, table.source, exc)


def read_range(worker: _Worker, dump: Dump, table: TableProgress, key_range: KeyRange,
               run: TableRun, source: DumpSource, gate: Gate) -> None:
    """Read ``key_range`` to its end, one chunk ahead of the buffer (see the module
    docstring); progress saved per chunk whose rows landed, in order."""
    manager = worker.manager
    with manager._lock:
        if table.state == "pending":
            table.state = "running"
            manager._save()
    limit = dump.chunk_rows
    after = key_range.after
    index = table.key_index  # listed keys: how many are read
    # Chunks whose high watermark is written, oldest first (at most two: one chunk ahead).
    inflight: list[tuple[Chunk, DumpChunk, int]] = []
    try:
        while True:
            with manager._lock:
                worker._check_state(dump)
                if table.state == "failed":
                    raise _TableFailed
            with gate.turn() as giving_way:
                size = min(limit, Gate.ROWS) if giving_way else limit
                try:
                    chunk, result = write_chunk(worker, dump, source, run, table,
                                                key_range, after, index, size)
                except TooBig as big:
                    limit = big.rows
                    limited(log).warning("dump %s: chunks of %s are too big for buffer %s; "
                                         "reading %d rows at a time", dump.id, table.source,
                                         worker.port.buffer, limit, kind=dump.id)
                    continue
                index = min(len(dump.keys), index + size) if dump.keys is not None else 0
                inflight.append((chunk, result, index))
                if result.cursor is not None:
                    after = result.cursor
                # Land the chunk before this one; this one too when the range is done
                # or the dump gives way (no reader ahead).
                keep = 0 if result.done or giving_way else 1
                while len(inflight) > keep:
                    land(worker, dump, table, key_range, *inflight[0])
                    inflight.pop(0)
                if result.done:
                    return
            if dump.delay_ms and manager._stop.wait(dump.delay_ms / 1000):
                raise Stopped
    except BaseException:
        give_up(worker, dump, table, key_range, inflight)
        raise


def give_up(worker: _Worker, dump: Dump, table: TableProgress, key_range: KeyRange,
            inflight: list[tuple[Chunk, DumpChunk, int]]) -> None:
    """Withdraw a reader's chunks in flight (waiting for rows being written), newest
    first, then record those that landed meanwhile, in order. Chunks land in the order
    of their high watermarks, so withdrawing the newest first leaves the landed ones a
    prefix: a recorded cursor never passes rows that are not in the buffer."""
    sink = worker.port.sink
    for chunk, _, _ in reversed(inflight):
        sink.withdraw(chunk)
    for chunk, result, index in inflight:
        if chunk.phase != "emitted":
            break
        record(worker, dump, table, key_range, chunk, result, index)


def write_chunk(worker: _Worker, dump: Dump, source: DumpSource, run: TableRun,
                table: TableProgress, key_range: KeyRange, after: list[Any] | None,
                index: int, limit: int) -> tuple[Chunk, DumpChunk]:
    """One chunk up to its high watermark: offered, L written and read back, the rows
    selected and handed to the sink, H written (its rows land when the fetcher reads
    H). Withdrawn on any error."""
    sink = worker.port.sink
    chunk = Chunk(table=run, source_id=-1, low=uuid.uuid4().hex, high=uuid.uuid4().hex)
    sink.offer(chunk)
    try:
        source.write_watermark(chunk.low)
        worker._wait(dump, chunk, ("open",))
        if dump.keys is not None:
            batch = dump.keys[index:index + limit]
            keyed = source.read_keys(table.source, batch)
            result = DumpChunk(keyed.source, keyed.source_id, keyed.rows, None,
                               index + limit >= len(dump.keys))
        elif key_range.hi is not None:
            result = source.read_chunk(table.source, after, limit,  # type: ignore[call-arg]
                                       until=key_range.hi)
        else:
            result = source.read_chunk(table.source, after, limit)
        # The rows travel in one window, which must fit in the buffer with room to
        # spare: a chunk over a quarter of it is read again, smaller (a window larger
        # than the buffer would stop the fetcher for good).
        size = sum(HEADER_SIZE + 64 + len(row.value) for row in result.rows)
        budget = worker.port.capacity_bytes // 4
        if size > budget and len(result.rows) > 1:
            raise TooBig(max(1, len(result.rows) * budget // size))
        chunk.source_id = result.source_id
        sink.set_rows(chunk, result.rows, last=result.done)
        source.write_watermark(chunk.high)
    except BaseException:
        sink.withdraw(chunk)
        raise
    return chunk, result


def land(worker: _Worker, dump: Dump, table: TableProgress, key_range: KeyRange,
         chunk: Chunk, result: DumpChunk, index: int) -> None:
    """Wait until ``chunk``'s rows are in the buffer (and on disk), then save."""
    worker._wait(dump, chunk, ("emitted",))
    record(worker, dump, table, key_range, chunk, result, index)


def record(worker: _Worker, dump: Dump, table: TableProgress, key_range: KeyRange,
           chunk: Chunk, result: DumpChunk, index: int) -> None:
    worker.port.flush()
    manager = worker.manager
    with manager._lock:
        table.chunks += 1
        table.rows += chunk.emitted_rows
        table.overtaken += chunk.dropped_rows
        table.started = True
        if chunk.emitted_scn is not None:
            table.last_scn = max(table.last_scn or 0, chunk.emitted_scn)
        dump.error = None  # a retry's error is over
        if dump.keys is not None:
            table.key_index = max(table.key_index, index)
        elif result.cursor is not None:
            key_range.cursor = result.cursor
            if table.ranges is not None and len(table.ranges) == 1:
                table.cursor = result.cursor
        if chunk.last:
            key_range.done = True
        finished = chunk.table.ended and table.state != "done"
        if finished:
            table.state = "done"
            table.ended = True
        worker._fold_clock(dump)
        manager._save()
    if finished:
        log.info("dump %s: %s done, %d rows in %d chunks (%d overtaken by the log)",
                 dump.id, table.source, table.rows, table.chunks, table.overtaken)


def run_readers(worker: _Worker, dump: Dump, run: DumpRun) -> None:
    """``dump.parallelism`` readers over ``run`` (the calling thread is the first, on
    the worker's own source); returns when all are done, raises what ended the run."""
    count = max(1, min(dump.parallelism, len(run.work)))
    threads = []
    for i in range(1, count):
        slot = worker.reader_slot(i)
        thread = threading.Thread(
            target=reader_loop, args=(worker, dump, run, slot.source, slot.close),
            name=f"databus-dump-{worker.port.buffer}-{i}", daemon=True)
        thread.start()
        threads.append(thread)
    reader_loop(worker, dump, run, worker._source, worker.close_source)
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
            if worker.manager._stop.is_set():
                worker.port.sink.wake()
    if run.fatal is not None:
        raise run.fatal
    if run.stopped:
        raise Stopped


@dataclass
class ReaderSlot:
    """A reader's connection, opened on first use and kept for the worker's next dumps."""

    open_source: Callable[[], DumpSource]
    current: DumpSource | None = None

    def source(self) -> DumpSource:
        if self.current is None:
            self.current = self.open_source()
        return self.current

    def close(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            try:
                current.close()
            except Exception as exc:
                log.debug("closing a dump reader's source: %s", exc)
