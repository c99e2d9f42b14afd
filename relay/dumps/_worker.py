"""One buffer's dump worker: its thread runs the buffer's dumps (DESIGN 8.1; the
manager, ``_engine``, owns the dumps, the lock and the state file).

A dump's tables are cut into key ranges when they start (``_plan``: one range, or, for a
table of more than two chunks with ``parallelism`` > 1, up to four ranges per reader at
split points the source reads from its index). ``parallelism`` readers, each on its own
connection (the worker's thread is the first), take the ranges in table order. Per
range, each chunk is::

    offer(chunk) -> write low watermark -> wait until the fetcher read it
      -> SELECT the chunk (keys after the range's cursor, up to its end)
      -> set_rows -> write high watermark
      -> [the previous chunk of this range: wait until its rows landed, save progress]

so a reader reads chunk k+1 while the fetcher thread writes chunk k into the buffer.
Progress is saved per range, in order, only for chunks whose rows landed: a restart
resumes every range after its own last completed chunk. A retriable error (source
down, a watermark that did not come back) retries that range after a backoff; a
``DumpSetupError`` fails its table (the other readers leave its ranges); anything else
fails the dump.

A table that failed or was cancelled after its start marker reached the buffer gets
its end marker (with that outcome) the same way, as an empty last chunk.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from databus._redact import redact
from databus.errors import DatabusError, DumpSetupError
from databus.fetchers._api import DumpSource, Fetcher
from databus.relay.dumps._readers import (
    DumpRun,
    Gate,
    ReaderSlot,
    Stopped,
    fail_table,
    plan_ranges,
    run_readers,
)
from databus.relay.dumps._sink import Chunk, DumpSink, TableRun
from databus.relay.dumps._state import Dump, KeyRange, TableProgress

if TYPE_CHECKING:
    from databus.relay.dumps._engine import DumpManager

__all__ = ["DumpPort"]

log = logging.getLogger("databus.relay.dumps")


@dataclass(frozen=True)
class DumpPort:
    """What the engine needs of one buffer's fetcher runner (``FetcherHost.dump_port``)."""

    buffer: str
    sink: DumpSink
    new_fetcher: Callable[[], Fetcher]
    fetcher_state: Callable[[], str]
    capacity_bytes: int
    # msync the buffer: a completed chunk is recorded only once its rows are on disk
    # (they are nowhere in the source's log to be fetched again after a machine crash).
    flush: Callable[[], None] = lambda: None
    # Events the fetcher wrote into the buffer from the log (dump rows excluded): a
    # dump that gives way to writers watches it (``_readers.Gate``).
    log_events: Callable[[], int] = lambda: 0


class _Worker:
    """Runs one buffer's dumps (its own thread and source connection)."""

    def __init__(self, manager: DumpManager, port: DumpPort) -> None:
        self.manager = manager
        self.port = port
        self._run_started: float | None = None
        self._current: Dump | None = None
        self._ends_retry_at = 0.0
        self._ends_backoff = 0.5
        self._slots: dict[int, ReaderSlot] = {}  # each reader's connection (0: this thread)
        self.thread = threading.Thread(target=self.loop, name=f"databus-dump-{port.buffer}",
                                       daemon=True)

    def running_for(self, dump: Dump) -> float:
        started = self._run_started
        if dump is self._current and started is not None:
            return time.monotonic() - started
        return 0.0

    def close_source(self) -> None:
        """Close this thread's own connection (reopened on next use)."""
        self.reader_slot(0).close()

    def close_readers(self) -> None:
        for slot in self._slots.values():
            slot.close()
        self._slots.clear()

    def reader_slot(self, i: int) -> ReaderSlot:
        """Reader ``i``'s connection (0: this thread's own, for the first reader, the
        watermarks of end markers and the checks), kept for the next dumps."""
        slot = self._slots.get(i)
        if slot is None:
            slot = self._slots[i] = ReaderSlot(self._open_source)
        return slot

    def _open_source(self) -> DumpSource:
        fetcher = self.port.new_fetcher()
        source = fetcher.open_dump_source()
        if source is None:
            raise DumpSetupError(
                f"the source of buffer {self.port.buffer!r} cannot be dumped "
                f"({type(fetcher).__name__} has no dump support)")
        return source

    def _source(self) -> DumpSource:
        return self.reader_slot(0).source()

    def loop(self) -> None:
        manager = self.manager
        stop = manager._stop
        try:
            while not stop.is_set():
                # Owed end markers first: a table cancelled and dumped again must end
                # (cancelled) before its new start.
                owing = manager._owing(self.port.buffer)
                if owing and time.monotonic() >= self._ends_retry_at:
                    self._write_owed_ends(owing)
                    continue
                dump = manager._next(self.port.buffer)
                if dump is None:
                    manager._wait_for_work(self.port.buffer, 1.0)
                    continue
                self.run(dump)
        finally:
            self.close_readers()

    def _write_owed_ends(self, dumps: list[Dump]) -> None:
        """Write the end marker (outcome failed or cancelled) of every table of
        ``dumps`` whose start marker consumers saw; on an error, again after a backoff
        (the source or the fetcher down: the markers travel through the log)."""
        try:
            source = self._source()
            for dump in dumps:
                for table in dump.tables:
                    if table.owes_end:
                        self._write_end(dump, table, source)
            self._ends_backoff = 0.5
        except Stopped:
            return
        except Exception as exc:
            log.warning("dump end markers on buffer %s: %s; trying again in %.1f s",
                        self.port.buffer, redact(str(exc)), self._ends_backoff)
            self.close_source()
            self._ends_retry_at = time.monotonic() + self._ends_backoff
            self._ends_backoff = min(self._ends_backoff * 2, 30.0)

    def _write_end(self, dump: Dump, table: TableProgress, source: DumpSource) -> None:
        """An empty last chunk: its window carries only ``table``'s end marker, with the
        outcome the table ended with."""
        outcome = "failed" if table.state == "failed" else "cancelled"
        sink = self.port.sink
        run = TableRun(dump.id, table.source, started=True, ranges_left=1, rows=table.rows)
        chunk = Chunk(table=run, source_id=-1, low=uuid.uuid4().hex, high=uuid.uuid4().hex,
                      outcome=outcome)
        sink.offer(chunk)
        try:
            source.write_watermark(chunk.low)
            self._wait(None, chunk, ("open",))
            sink.set_rows(chunk, [], last=True)
            source.write_watermark(chunk.high)
            self._wait(None, chunk, ("emitted",))
        except BaseException:
            sink.withdraw(chunk)
            if chunk.phase != "emitted":
                raise
        self.port.flush()
        with self.manager._lock:
            table.ended = True
            self.manager._save()
        log.info("dump %s: %s ended %s after %d rows", dump.id, table.source, outcome,
                 table.rows)

    # -- one dump ---------------------------------------------------------------------

    def run(self, dump: Dump) -> None:
        manager = self.manager
        backoff = 0.5
        while not manager._stop.is_set():
            try:
                self._run(dump)
                return
            except Stopped:
                return
            except DumpSetupError as exc:
                self._finish(dump, "failed", str(exc))
                return
            except DatabusError as exc:
                if not exc.retriable:
                    self._finish(dump, "failed", str(exc))
                    return
                log.warning("dump %s: %s; trying again in %.1f s", dump.id, exc, backoff)
                with manager._lock:  # visible in /v1/dumps until a chunk completes
                    dump.error = redact(f"{exc}; trying again in {backoff:.1f} s")
                self.close_source()
            except Exception as exc:
                message = redact(f"{type(exc).__name__}: {exc}")
                log.exception("dump %s failed: %s", dump.id, message)
                self._finish(dump, "failed", message)
                return
            finally:
                self._stop_clock(dump)
            if manager._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 30.0)

    def _fold_clock(self, dump: Dump) -> None:
        """Add the running time so far to ``dump.run_seconds`` (under the manager's
        lock, before a save): what the file records is rows and the time they took, so
        that a restarted relay's rate is over the whole running time."""
        if self._run_started is not None and self._current is dump:
            now = time.monotonic()
            dump.run_seconds += now - self._run_started
            self._run_started = now

    def _stop_clock(self, dump: Dump) -> None:
        with self.manager._lock:
            if self._run_started is not None and self._current is dump:
                dump.run_seconds += time.monotonic() - self._run_started
            self._run_started = None
            self._current = None

    def _finish(self, dump: Dump, state: str, error: str | None = None) -> None:
        with self.manager._lock:
            if dump.state == "cancelled":
                return
            dump.state = state  # type: ignore[assignment]
            dump.error = error
            dump.finished_at = time.time()
            if state == "failed":
                dump.settle_tables("failed", error)
            self.manager._save()
        if error:
            log.error("dump %s %s: %s", dump.id, state, error)
        else:
            log.info("dump %s %s: %d rows", dump.id, state, dump.rows())

    def _run(self, dump: Dump) -> None:
        manager = self.manager
        source = self._source()
        source.check()
        with manager._lock:
            self._check_state(dump)
            if not dump.tables:  # every table of the buffer, fixed at the start
                dump.tables = [TableProgress(s) for s in source.tables()]
        self._estimate(dump, source)
        with manager._lock:
            self._check_state(dump)
            if dump.started_at is None:
                dump.started_at = time.time()
            dump.state = "running"
            manager._save()
            self._current = dump
            self._run_started = time.monotonic()
        self._read_tables(dump, source)
        for table in dump.tables:
            if table.owes_end:
                self._write_end(dump, table, source)
        failed = [t.source for t in dump.tables if t.state == "failed"]
        if failed:
            self._finish(dump, "failed", f"tables failed: {', '.join(failed)}")
        else:
            self._finish(dump, "done")
        try:
            source.cleanup_watermarks(frozenset())
        except DatabusError as exc:
            log.debug("dump %s: cleaning up watermarks: %s", dump.id, exc)

    def _estimate(self, dump: Dump, source: DumpSource) -> None:
        """Every table's row estimate, read from the source's catalog when the dump
        starts (and, after a restart, for tables that have none yet): percent and ETA
        then cover the whole dump from its first poll."""
        for table in dump.tables:
            if table.estimated or table.state != "pending":
                continue
            with self.manager._lock:
                self._check_state(dump)
            try:
                estimate = (len(dump.keys) if dump.keys is not None
                            else source.estimate_rows(table.source))
            except DumpSetupError as exc:
                # The table fails when its turn comes (dropped, no key): it adds nothing.
                log.debug("dump %s: no estimate for %s: %s", dump.id, table.source, exc)
                estimate = 0
            with self.manager._lock:
                table.estimate = estimate
                table.estimated = True
        with self.manager._lock:
            self.manager._save()

    def _check_state(self, dump: Dump) -> None:
        """Raise ``Stopped`` when the relay stops or the dump was paused or cancelled."""
        if self.manager._stop.is_set() or dump.state in ("paused", "cancelled"):
            raise Stopped

    def _read_tables(self, dump: Dump, source: DumpSource) -> None:
        """Fix each table's key ranges (saved), then read them all (``_readers``)."""
        manager = self.manager
        work: deque[tuple[TableProgress, KeyRange]] = deque()
        runs: dict[str, TableRun] = {}
        for table in dump.tables:
            if table.state in ("done", "failed"):
                continue
            if table.ranges is None:
                with manager._lock:
                    self._check_state(dump)
                try:
                    ranges = plan_ranges(dump, table, source)
                except DumpSetupError as exc:
                    fail_table(self, dump, table, exc)
                    continue
                with manager._lock:
                    table.ranges = ranges
                    manager._save()
                if len(ranges) > 1:
                    log.info("dump %s: %s is read in %d key ranges", dump.id, table.source,
                             len(ranges))
            left = [r for r in table.ranges or () if not r.done]
            runs[table.source] = TableRun(dump.id, table.source, started=table.started,
                                          ranges_left=max(1, len(left)), rows=table.rows)
            if not left:  # every range read, the end marker not: an empty last chunk
                last = (table.ranges or [KeyRange(cursor=table.cursor)])[-1]
                left = [KeyRange(lo=last.lo, hi=last.hi, cursor=last.cursor)]
            work.extend((table, r) for r in left)
        gate = Gate(dump.gives_way, self.port.log_events, self.manager._stop)
        run_readers(self, dump, DumpRun(work, runs, gate))
        if gate.turns_given_way:
            log.info("dump %s gave way to the source's writers for %d chunks", dump.id,
                     gate.turns_given_way)

    def _wait(self, dump: Dump | None, chunk: Chunk, phases: tuple[Any, ...]) -> None:
        """Wait for the fetcher to carry ``chunk`` to one of ``phases`` (``dump`` None:
        an end marker of a finished dump, which only the relay's stop interrupts)."""
        sink = self.port.sink
        deadline = time.monotonic() + self.manager._chunk_timeout
        while True:
            if dump is None:
                if self.manager._stop.is_set():
                    raise Stopped
            else:
                with self.manager._lock:
                    self._check_state(dump)
            if sink.wait(chunk, phases, 0.2):
                return
            if chunk.phase == "abandoned":
                raise _Retry()
            state = self.port.fetcher_state()
            if state == "failed":
                raise DumpSetupError(f"the fetcher of buffer {self.port.buffer!r} failed; "
                                     "a dump needs it running (see /v1/status)")
            if time.monotonic() >= deadline:
                raise _Retry()


class _Retry(DatabusError):
    """The chunk's watermark did not come back in time: read it again, new watermarks."""

    retriable = True

    def __init__(self) -> None:
        super().__init__("a watermark did not come back through the log in time "
                         "(fetcher restarting?); reading the chunk again", retriable=True)
