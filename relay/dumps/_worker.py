"""One buffer's dump worker: its thread runs the buffer's dumps chunk by chunk (DESIGN
8.1; the manager, ``_engine``, owns the dumps, the lock and the state file). Per chunk::

    offer(chunk) -> write low watermark -> wait until the fetcher read it
      -> SELECT the chunk (own connection) -> set_rows -> write high watermark
      -> wait until the rows landed in the high watermark's window -> save progress

A table that failed or was cancelled after its start marker reached the buffer gets
its end marker (with that outcome) the same way, as an empty last chunk.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from databus._limited_log import limited
from databus._redact import redact
from databus.errors import DatabusError, DumpSetupError
from databus.event import HEADER_SIZE
from databus.fetchers._api import DumpChunk, DumpSource, Fetcher
from databus.relay.dumps._sink import Chunk, DumpSink
from databus.relay.dumps._state import Dump, TableProgress

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


class _TooBig(Exception):
    """A chunk's rows would not fit a window of the buffer: read ``rows`` at a time."""

    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


class _Stopped(Exception):
    """The relay is stopping, or the dump was paused or cancelled: leave the chunk."""


class _Worker:
    """Runs one buffer's dumps (its own thread and source connection)."""

    def __init__(self, manager: DumpManager, port: DumpPort) -> None:
        self.manager = manager
        self.port = port
        self.source: DumpSource | None = None
        self._run_started: float | None = None
        self._current: Dump | None = None
        self._ends_retry_at = 0.0
        self._ends_backoff = 0.5
        self.thread = threading.Thread(target=self.loop, name=f"databus-dump-{port.buffer}",
                                       daemon=True)

    def running_for(self, dump: Dump) -> float:
        started = self._run_started
        if dump is self._current and started is not None:
            return time.monotonic() - started
        return 0.0

    def close_source(self) -> None:
        source, self.source = self.source, None
        if source is not None:
            try:
                source.close()
            except Exception as exc:
                log.debug("closing a dump source: %s", exc)

    def _source(self) -> DumpSource:
        if self.source is None:
            fetcher = self.port.new_fetcher()
            source = fetcher.open_dump_source()
            if source is None:
                raise DumpSetupError(
                    f"the source of buffer {self.port.buffer!r} cannot be dumped "
                    f"({type(fetcher).__name__} has no dump support)")
            self.source = source
        return self.source

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
            self.close_source()

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
        except _Stopped:
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
        chunk = Chunk(dump_id=dump.id, source=table.source, source_id=-1,
                      low=uuid.uuid4().hex, high=uuid.uuid4().hex, first=False,
                      rows_before=table.rows, outcome=outcome)
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
            except _Stopped:
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
        for table in dump.tables:
            if table.state in ("done", "failed"):
                continue
            try:
                self._dump_table(dump, table, source)
            except DumpSetupError as exc:
                with manager._lock:
                    table.state = "failed"
                    table.error = str(exc)
                    manager._save()
                log.error("dump %s: table %s failed: %s", dump.id, table.source, exc)
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
        """Raise ``_Stopped`` when the relay stops or the dump was paused or cancelled."""
        if self.manager._stop.is_set() or dump.state in ("paused", "cancelled"):
            raise _Stopped

    def _dump_table(self, dump: Dump, table: TableProgress, source: DumpSource) -> None:
        manager = self.manager
        if table.state == "pending":
            with manager._lock:
                table.state = "running"
                manager._save()
        limit = dump.chunk_rows
        while True:
            with manager._lock:
                self._check_state(dump)
            try:
                chunk, result = self._one_chunk(dump, table, source, limit)
                self.port.flush()
            except _TooBig as big:
                limit = big.rows
                limited(log).warning("dump %s: chunks of %s are too big for buffer %s; reading "
                                     "%d rows at a time", dump.id, table.source,
                                     self.port.buffer, limit, kind=dump.id)
                continue
            with manager._lock:
                table.chunks += 1
                table.rows += chunk.emitted_rows
                table.overtaken += chunk.dropped_rows
                table.started = True
                table.last_scn = chunk.emitted_scn
                dump.error = None  # a retry's error (run) is over
                if dump.keys is not None:
                    table.key_index = min(len(dump.keys), table.key_index + limit)
                elif result.cursor is not None:
                    table.cursor = result.cursor
                if chunk.last:
                    table.state = "done"
                    table.ended = True
                self._fold_clock(dump)
                manager._save()
            if chunk.last:
                log.info("dump %s: %s done, %d rows in %d chunks (%d overtaken by the log)",
                         dump.id, table.source, table.rows, table.chunks, table.overtaken)
                return
            if dump.delay_ms and manager._stop.wait(dump.delay_ms / 1000):
                raise _Stopped

    def _one_chunk(self, dump: Dump, table: TableProgress, source: DumpSource, limit: int
                   ) -> tuple[Chunk, DumpChunk]:
        sink = self.port.sink
        chunk = Chunk(dump_id=dump.id, source=table.source, source_id=-1,
                      low=uuid.uuid4().hex, high=uuid.uuid4().hex, first=not table.started,
                      rows_before=table.rows)
        sink.offer(chunk)
        try:
            source.write_watermark(chunk.low)
            self._wait(dump, chunk, ("open",))
            result = self._read(dump, table, source, limit)
            # The rows travel in one window, which must fit in the buffer with room to
            # spare: a chunk over a quarter of it is read again, smaller (a window larger
            # than the buffer would stop the fetcher for good).
            size = sum(HEADER_SIZE + 64 + len(row.value) for row in result.rows)
            budget = self.port.capacity_bytes // 4
            if size > budget and len(result.rows) > 1:
                raise _TooBig(max(1, len(result.rows) * budget // size))
            chunk.source_id = result.source_id
            sink.set_rows(chunk, result.rows, last=result.done)
            source.write_watermark(chunk.high)
            self._wait(dump, chunk, ("emitted",))
        except BaseException as exc:
            sink.withdraw(chunk)  # waits for rows being written into the buffer
            if chunk.phase != "emitted" or not isinstance(exc, Exception):
                raise
            # Its rows landed as the engine gave up on it (paused, cancelled): they are in
            # the buffer, so the chunk counts (a resumed dump must not read it again).
        return chunk, result

    def _read(self, dump: Dump, table: TableProgress, source: DumpSource, limit: int
              ) -> DumpChunk:
        if dump.keys is None:
            return source.read_chunk(table.source, table.cursor, limit)
        batch = dump.keys[table.key_index:table.key_index + limit]
        result = source.read_keys(table.source, batch)
        done = table.key_index + limit >= len(dump.keys)
        return DumpChunk(result.source, result.source_id, result.rows, None, done)

    def _wait(self, dump: Dump | None, chunk: Chunk, phases: tuple[Any, ...]) -> None:
        """Wait for the fetcher to carry ``chunk`` to one of ``phases`` (``dump`` None:
        an end marker of a finished dump, which only the relay's stop interrupts)."""
        sink = self.port.sink
        deadline = time.monotonic() + self.manager._chunk_timeout
        while True:
            if dump is None:
                if self.manager._stop.is_set():
                    raise _Stopped
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
