"""The dump engine: runs the dumps of each buffer, one chunk at a time (DESIGN 8.1).

One worker thread per buffer that has dumps, started on demand; it runs that buffer's
dumps one after the other in the order they were asked for (a dump of a table that an
active dump already covers is refused: ``DumpConflictError``). The chunk loop is the
worker's (``_worker``).

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
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from databus.config import BufferConfig
from databus.errors import (
    DumpConflictError,
    DumpNotFoundError,
    UnknownSourceError,
)
from databus.relay.dumps._state import Dump, TableProgress, load_dumps, save_dumps
from databus.relay.dumps._worker import DumpPort, _Worker

__all__ = ["DumpManager", "DumpPort", "DumpRequest"]

log = logging.getLogger("databus.relay.dumps")

DEFAULT_CHUNK_ROWS = 10_000
MAX_CHUNK_ROWS = 1_000_000
MAX_DELAY_MS = 3_600_000
MAX_KEYS = 1_000_000
MAX_PARALLELISM = 64


def default_parallelism() -> int:
    """Chunk readers per dump when a request names none: the machine's cores."""
    return max(1, min(MAX_PARALLELISM, os.cpu_count() or 1))


def dump_parallelism(config: BufferConfig) -> int | None:
    """The readers of the relay's own dumps of a buffer (initial, gap, heal); None: the
    default (``DumpRequest.parallelism``)."""
    return config.dump_parallelism or None


@dataclass(frozen=True)
class DumpRequest:
    """A validated request to dump: ``sources`` empty means every table of ``buffer``."""

    buffer: str | None
    sources: tuple[str, ...]
    keys: tuple[Any, ...] | None = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    delay_ms: int = 0
    reason: str = "request"
    # None: the default, the relay's cores while the source is idle, giving way to its
    # writers (``_readers.Gate``); a number: exactly that many readers, no giving way.
    parallelism: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.chunk_rows <= MAX_CHUNK_ROWS:
            raise ValueError(f"chunk_rows must be in 1..{MAX_CHUNK_ROWS}")
        if not 0 <= self.delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"delay_ms must be in 0..{MAX_DELAY_MS}")
        if self.parallelism is not None and not 1 <= self.parallelism <= MAX_PARALLELISM:
            raise ValueError(f"parallelism must be in 1..{MAX_PARALLELISM}")
        if self.keys is not None:
            if len(self.sources) != 1:
                raise ValueError("keys need exactly one source")
            if not self.keys:
                raise ValueError("keys must not be empty")
            if len(self.keys) > MAX_KEYS:
                raise ValueError(f"at most {MAX_KEYS} keys")


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
                    dump.settle_tables("failed", dump.error)
            self._save()
            for dump in self._dumps:
                if dump.active:
                    log.info("dump %s on buffer %s resumes (%s)", dump.id, dump.buffer,
                             dump.state)
                    self._worker(dump.buffer)
                elif dump.owes_ends and dump.buffer in ports:
                    self._worker(dump.buffer)  # end markers a restart cut off

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
                parallelism=request.parallelism or default_parallelism(),
                gives_way=request.parallelism is None,
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

    def has_active_source(self, buffer: str, source: str) -> bool:
        """Is a dump of ``source`` (named, or every table of ``buffer``) queued or
        running?"""
        with self._lock:
            return any(d.buffer == buffer and d.active
                       and (not d.tables or any(t.source == source for t in d.tables))
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
                dump.settle_tables("cancelled")
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
        """Prometheus samples: per buffer, active dumps, rows dumped (finished
        dumps included) and failed dumps; per active dump and table, rows and percent."""
        with self._lock:
            samples: list[tuple[str, dict[str, str], float]] = []
            for buffer in self._ports:
                dumps = [d for d in self._dumps if d.buffer == buffer]
                samples.append(("databus_relay_dumps_active", {"buffer": buffer},
                                float(sum(d.active for d in dumps))))
                samples.append(("databus_relay_dump_rows_total", {"buffer": buffer},
                                float(sum(d.rows() for d in dumps))))
                # Dumps are kept (state file) and a failed one stays failed: a count
                # that only grows, for alerts on its increase.
                samples.append(("databus_relay_dumps_failed_total", {"buffer": buffer},
                                float(sum(d.state == "failed" for d in dumps))))
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

    def _owing(self, buffer: str) -> list[Dump]:
        """Finished dumps of ``buffer`` whose failed or cancelled tables still owe their
        consumers an end marker."""
        with self._lock:
            return [d for d in self._dumps
                    if d.buffer == buffer and not d.active and d.owes_ends]

    def _wait_for_work(self, buffer: str, timeout: float) -> None:
        with self._lock:
            if self._next(buffer) is None and not self._stop.is_set():
                self._changed.wait(timeout)
