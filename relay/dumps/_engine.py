"""The dump engine: runs the dumps of each buffer, one chunk at a time (DESIGN 8.1).

One worker thread per buffer that has dumps, started on demand; it runs that buffer's
dumps one after the other in the order they were asked for (a dump of a table that an
active dump already covers is refused: ``DumpConflictError``). Per chunk::

    offer(chunk) -> write low watermark -> wait until the fetcher read it
      -> SELECT the chunk (own connection) -> set_rows -> write high watermark
      -> wait until the rows landed in the high watermark's window -> save progress

Waiting for the low watermark before the SELECT makes the read snapshot later than
everything the log orders before it, for every kind of source (a TxLog on PostgreSQL
numbers transactions when it assigns SCNs, which is after commit). A chunk whose
watermark does not come back within ``chunk_timeout_s`` (fetcher restarting, source
down) is abandoned and read again with new watermarks; a retriable source error backs
off 0.5 s doubling to 30 s; a ``DumpSetupError`` fails the table (dropped, no key) or
the dump (no watermark table, no grant), with the message in ``/v1/dumps``.

Pause takes effect between chunks; cancel abandons the chunk in flight (its rows are
never emitted, nothing half-done reaches the buffer). Progress is saved after every
completed chunk (``_state``), so a restarted relay resumes after the last one.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from databus._limited_log import limited
from databus._redact import redact
from databus.errors import (
    DatabusError,
    DumpConflictError,
    DumpNotFoundError,
    DumpSetupError,
    UnknownSourceError,
)
from databus.event import HEADER_SIZE
from databus.fetchers._api import DumpChunk, DumpSource, Fetcher
from databus.relay.dumps._sink import Chunk, DumpSink
from databus.relay.dumps._state import Dump, TableProgress, load_dumps, save_dumps

__all__ = ["DumpManager", "DumpPort", "DumpRequest"]

log = logging.getLogger("databus.relay.dumps")

DEFAULT_CHUNK_ROWS = 10_000
MAX_CHUNK_ROWS = 1_000_000
MAX_DELAY_MS = 3_600_000
MAX_KEYS = 1_000_000


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


@dataclass(frozen=True)
class DumpRequest:
    """A validated request to dump: ``sources`` empty means every table of ``buffer``."""

    buffer: str | None
    sources: tuple[str, ...]
    keys: tuple[Any, ...] | None = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    delay_ms: int = 0
    reason: str = "request"

    def __post_init__(self) -> None:
        if not 1 <= self.chunk_rows <= MAX_CHUNK_ROWS:
            raise ValueError(f"chunk_rows must be in 1..{MAX_CHUNK_ROWS}")
        if not 0 <= self.delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"delay_ms must be in 0..{MAX_DELAY_MS}")
        if self.keys is not None:
            if len(self.sources) != 1:
                raise ValueError("keys need exactly one source")
            if not self.keys:
                raise ValueError("keys must not be empty")
            if len(self.keys) > MAX_KEYS:
                raise ValueError(f"at most {MAX_KEYS} keys")


class _TooBig(Exception):
    """A chunk's rows would not fit a window of the buffer: read ``rows`` at a time."""

    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


class _Stopped(Exception):
    """The relay is stopping, or the dump was paused or cancelled: leave the chunk."""


class DumpManager:
    """Every dump of a relay: requests, state file, one worker per buffer."""

    def __init__(self, state_path: Path, *, chunk_timeout_s: float = 30.0) -> None:
        self._path = state_path
        self._ports: dict[str, DumpPort] = {}
        self._chunk_timeout = chunk_timeout_s
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._dumps: list[Dump] = load_dumps(state_path)
        self._workers: dict[str, _Worker] = {}
        self._started = False

    # -- lifecycle --------------------------------------------------------------------

    def start(self, ports: dict[str, DumpPort]) -> None:
        """Resume the recorded active dumps on the buffers' fetchers (``ports``)."""
        with self._lock:
            self._ports = dict(ports)
            self._started = True
            for dump in self._dumps:
                if dump.active and dump.buffer not in ports:
                    dump.state = "failed"
                    dump.error = f"buffer {dump.buffer!r} is no longer configured"
                    dump.finished_at = time.time()
            self._save()
            for dump in self._dumps:
                if dump.active:
                    log.info("dump %s on buffer %s resumes (%s)", dump.id, dump.buffer,
                             dump.state)
                    self._worker(dump.buffer)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            workers = list(self._workers.values())
            self._changed.notify_all()
        for worker in workers:
            worker.port.sink.wake()
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.thread.join(max(0.0, deadline - time.monotonic()))
        for worker in workers:
            # Each worker closes its source as it exits (loop()). One still running is in
            # a statement: its connection is not closed under it from here (a sqlite3
            # connection closed by another thread mid-statement crashes the process);
            # the worker closes it when that statement returns and it sees the stop.
            if worker.thread.is_alive():
                log.warning("dump worker of buffer %s did not stop within %.1f s; it "
                            "closes its connection when its statement returns",
                            worker.port.buffer, timeout)

    def _worker(self, buffer: str) -> None:
        worker = self._workers.get(buffer)
        if worker is None or not worker.thread.is_alive():
            worker = self._workers[buffer] = _Worker(self, self._ports[buffer])
            worker.thread.start()

    # -- requests ---------------------------------------------------------------------

    def start_dump(self, request: DumpRequest, *, buffer_of: Callable[[str], str | None]
                   ) -> Dump:
        """Queue a dump; ``UnknownSourceError`` / ``DumpConflictError`` when it cannot."""
        buffer = request.buffer
        for source in request.sources:
            owner = buffer_of(source)
            if owner is None:
                raise UnknownSourceError(f"no buffer of this relay captures {source!r}")
            if buffer is not None and owner != buffer:
                raise DumpConflictError(f"sources of one dump must share a buffer: {source!r} "
                                        f"is in {owner!r}, not {buffer!r}")
            buffer = owner
        if buffer is None:
            if len(self._ports) != 1:
                raise UnknownSourceError("name the sources (or the buffer) to dump")
            buffer = next(iter(self._ports))
        if self._started and buffer not in self._ports:
            raise UnknownSourceError(f"no buffer {buffer!r} on this relay")
        with self._lock:
            busy = {t.source for d in self._dumps if d.active and d.buffer == buffer
                    for t in d.tables}
            clash = sorted(busy & set(request.sources))
            if clash:
                raise DumpConflictError(
                    f"a dump of {', '.join(clash) or 'every table'} is already queued or "
                    "running; cancel it first or wait for it to finish")
            if not request.sources and any(d.active and d.buffer == buffer for d in self._dumps):
                raise DumpConflictError(f"buffer {buffer!r} has an active dump; a dump of "
                                        "every table must wait for it or cancel it")
            dump = Dump(
                id=uuid.uuid4().hex[:12], buffer=buffer,
                tables=[TableProgress(source) for source in request.sources],
                chunk_rows=request.chunk_rows, delay_ms=request.delay_ms,
                keys=None if request.keys is None else list(request.keys),
                reason=request.reason,
            )
            self._dumps.append(dump)
            self._save()
            log.info("dump %s queued on buffer %s: %s (%s)", dump.id, buffer,
                     ", ".join(request.sources) or "every table", request.reason)
            if self._started:
                self._worker(buffer)
            self._changed.notify_all()
            return dump

    def has_active(self, buffer: str, reason: str) -> bool:
        with self._lock:
            return any(d.buffer == buffer and d.reason == reason and d.active
                       for d in self._dumps)

    def has_dump(self, buffer: str, reason: str) -> bool:
        with self._lock:
            return any(d.buffer == buffer and d.reason == reason for d in self._dumps)

    def control(self, dump_id: str, action: str) -> Dump:
        """``pause``, ``resume`` or ``cancel`` a dump."""
        with self._lock:
            dump = self._find(dump_id)
            if action == "pause":
                if dump.state not in ("queued", "running"):
                    raise DumpConflictError(f"dump {dump_id} is {dump.state}: only a queued or "
                                            "running dump can be paused")
                dump.state = "paused"
            elif action == "resume":
                if dump.state != "paused":
                    raise DumpConflictError(f"dump {dump_id} is {dump.state}, not paused")
                dump.state = "running" if dump.started_at is not None else "queued"
            elif action == "cancel":
                if not dump.active:
                    raise DumpConflictError(f"dump {dump_id} is {dump.state} already")
                dump.state = "cancelled"
                dump.finished_at = time.time()
            else:
                raise ValueError(action)
            self._save()
            log.info("dump %s: %s", dump_id, action)
            self._changed.notify_all()
        port = self._ports.get(dump.buffer)
        if port is not None:
            port.sink.wake()
        return dump

    def _find(self, dump_id: str) -> Dump:
        for dump in self._dumps:
            if dump.id == dump_id:
                return dump
        raise DumpNotFoundError(f"no dump {dump_id!r} on this relay")

    def get(self, dump_id: str) -> dict[str, Any]:
        with self._lock:
            return self._json(self._find(dump_id))

    def list_dumps(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._json(d) for d in self._dumps]

    def _json(self, dump: Dump) -> dict[str, Any]:
        worker = self._workers.get(dump.buffer)
        running = worker.running_for(dump) if worker is not None else 0.0
        return dump.to_json(running)

    def status(self) -> dict[str, Any]:
        """For ``/v1/status``: active dumps by buffer, with their progress."""
        with self._lock:
            out: dict[str, Any] = {}
            for dump in self._dumps:
                if dump.active:
                    out.setdefault(dump.buffer, []).append(self._json(dump))
            return out

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        """Prometheus samples: per buffer, active dumps and rows dumped (finished
        dumps included); per active dump and table, rows and percent."""
        with self._lock:
            samples: list[tuple[str, dict[str, str], float]] = []
            for buffer in self._ports:
                dumps = [d for d in self._dumps if d.buffer == buffer]
                samples.append(("databus_relay_dumps_active", {"buffer": buffer},
                                float(sum(d.active for d in dumps))))
                samples.append(("databus_relay_dump_rows_total", {"buffer": buffer},
                                float(sum(d.rows() for d in dumps))))
            for dump in self._dumps:
                if not dump.active:
                    continue
                progress = self._json(dump)["progress"]
                labels = {"buffer": dump.buffer, "dump": dump.id}
                samples.append(("databus_relay_dump_rows", labels, float(progress["rows"])))
                samples.append(("databus_relay_dump_estimated_rows", labels,
                                float(progress["estimate"])))
                samples.append(("databus_relay_dump_rows_per_second", labels,
                                float(progress["rows_per_second"])))
            return samples

    def _save(self) -> None:
        save_dumps(self._path, self._dumps)

    # -- for the worker ---------------------------------------------------------------

    def _next(self, buffer: str) -> Dump | None:
        with self._lock:
            for dump in self._dumps:
                if dump.buffer == buffer and dump.state in ("queued", "running"):
                    return dump
            return None

    def _wait_for_work(self, buffer: str, timeout: float) -> None:
        with self._lock:
            if self._next(buffer) is None and not self._stop.is_set():
                self._changed.wait(timeout)


class _Worker:
    """Runs one buffer's dumps (its own thread and source connection)."""

    def __init__(self, manager: DumpManager, port: DumpPort) -> None:
        self.manager = manager
        self.port = port
        self.source: DumpSource | None = None
        self._run_started: float | None = None
        self._current: Dump | None = None
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
                dump = manager._next(self.port.buffer)
                if dump is None:
                    manager._wait_for_work(self.port.buffer, 1.0)
                    continue
                self.run(dump)
        finally:
            self.close_source()

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
        failed = [t.source for t in dump.tables if t.state == "failed"]
        if failed:
            self._finish(dump, "failed", f"tables failed: {', '.join(failed)}")
        else:
            self._finish(dump, "done")
        try:
            source.cleanup_watermarks(frozenset())
        except DatabusError as exc:
            log.debug("dump %s: cleaning up watermarks: %s", dump.id, exc)

    def _check_state(self, dump: Dump) -> None:
        """Raise ``_Stopped`` when the relay stops or the dump was paused or cancelled."""
        if self.manager._stop.is_set() or dump.state in ("paused", "cancelled"):
            raise _Stopped

    def _dump_table(self, dump: Dump, table: TableProgress, source: DumpSource) -> None:
        manager = self.manager
        if table.state == "pending":
            with manager._lock:
                table.state = "running"
                table.estimate = (len(dump.keys) if dump.keys is not None
                                  else source.estimate_rows(table.source))
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

    def _wait(self, dump: Dump, chunk: Chunk, phases: tuple[Any, ...]) -> None:
        """Wait for the fetcher to carry ``chunk`` to one of ``phases``."""
        sink = self.port.sink
        deadline = time.monotonic() + self.manager._chunk_timeout
        while True:
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
