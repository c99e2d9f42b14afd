"""Relay workers, the main process's side: more processes serving the same buffers
(``[relay] workers``; docs/relay.md, "Workers").

Why: one relay process serves HTTP on one core. Everything a request costs in Python
(aiohttp's parsing, the handler, the response) holds the GIL, so a relay whose readers
want more than a core's worth of requests queues them however many cores the machine
has. Worker processes each bring their own interpreter and GIL; the buffers are files
mapped by every process, so serving from N processes reads the same bytes N ways with no
copy between them, and the one writer per buffer stays where it was.

The main process (``databus relay``) keeps the fetchers, the writers, the dump engine
and the catalog's writes. ``WorkerPool`` starts ``workers - 1`` worker processes
(``databus relay --worker``, relay/_worker.py), which:

- accept on the relay's port, each on its own ``SO_REUSEPORT`` socket (``Listeners``:
  why, and how a second relay is kept off the port);
- map every buffer file read-only (``FollowerBuffer``) and read ``catalog.json``
  (``FollowerCatalog``);
- serve ``/v1/stream`` (polling and ``follow=true``), ``/v1/sources``, ``/v1/schemas``
  and ``/healthz`` themselves and forward every other request to the main process,
  which serves its app on a unix socket too (``main_socket_path``).

Each worker has a channel to the main process, a socketpair, carrying lines:

- main -> worker: a JSON hello (its pid, each buffer's geometry and configured sources),
  then bytes ``w``: "windows landed", sent when a buffer publishes windows, at most one
  per loop turn and never while one is still unread (the worker then reads every
  buffer's live record, catches its index up and wakes its long polls and streams);
- worker -> main: JSON reports: ``ready`` once it listens, then every
  ``REPORT_INTERVAL_S`` what it served (request counts, bytes, events, its long polls and
  streams now) and the consumers it served (for ``/v1/consumers``), which the main
  process adds to its own, so ``/metrics`` and ``/v1/consumers`` count every process.

Supervision: a worker whose channel ends (it exited, or was killed) is reaped and
started again after a backoff (0.25 s doubling to 30 s, back to 0.25 s after a run of a
minute), with a log line each time; its consumers reconnect (the client library fails
over and retries) and resume from their checkpoints. At shutdown the workers get
SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``. A worker never outlives the main
process: it asks the kernel for SIGKILL when its parent dies (Linux), and exits when its
channel reaches EOF.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from databus._http import STATS, HttpStats
from databus._serving import ListenError
from databus.checkpoint import Checkpoint
from databus.config._relay import x86_64
from databus.errors import DatabusError
from databus.fetchers._api import ConfiguredSources
from databus.relay._consumers import CONSUMERS, ConsumerRegistry
from databus.relay._fetcher_host import Backoff
from databus.relay._liveness import (
    SESSION_LOST,
    STAMP_INTERVAL_S,
    StampWriter,
    stale_after_s,
)
from databus.relay._relay import Relay
from databus.security import ANONYMOUS

__all__ = [
    "CHANNEL_LINE_LIMIT",
    "REPORT_CONSUMERS",
    "REPORT_INTERVAL_S",
    "WORKER_HEADER",
    "Listeners",
    "WorkerPool",
    "configured_from_json",
    "configured_to_json",
    "enable_workers",
    "main_socket_path",
    "worker_header",
    "worker_sockets",
]

log = logging.getLogger("databus.relay.workers")

# Every response of a relay with workers names the process that served its connection.
WORKER_HEADER = "X-Databus-Worker"
# How long a killed relay's workers may take to let go of the port (they die with it).
BIND_RETRY_S = 5.0
STOP_TIMEOUT_S = 10.0
REPORT_INTERVAL_S = 0.25
BACKOFF_INITIAL_S = 0.25
BACKOFF_MAX_S = 30.0
BACKOFF_HEALTHY_S = 60.0
# A unix socket path is at most 107 bytes on Linux (sun_path), fewer on others.
_MAX_SOCKET_PATH = 100
_WAKE = b"w"
# The longest line either side may send (a report names at most REPORT_CONSUMERS).
CHANNEL_LINE_LIMIT = 4 << 20
REPORT_CONSUMERS = 200

WorkerState = Literal["starting", "running", "restarting", "stopped"]


# -- sockets ------------------------------------------------------------------------


class Listeners:
    """The listening sockets of a relay's serving processes, all on one port.

    On Linux every process has its own sockets, bound with ``SO_REUSEPORT``: the kernel
    hashes each new connection to one of them, so connections spread evenly however
    they arrive. (One socket shared by every process spreads them badly: the process
    that wakes first accepts every connection queued, uvloop's and asyncio's loops
    both drain the queue; 8 clients connecting together all landed on one process.) A
    worker binds its own when it is ready to serve, so no connection waits for a worker
    that is starting, and its sockets close with it: connections then go to the
    others. ``SO_REUSEPORT`` lets any process of the same user share the port, so the
    main process first binds a probe *without* it: if anyone listens on the port, the
    probe fails, and the relay does not start, as with one process. The probe holds
    the port (bound, not listening) until the main process's own sockets listen.

    Elsewhere (no ``SO_REUSEPORT`` with load balancing) the workers inherit the main
    process's sockets and whichever process is free accepts.

    ``EADDRINUSE`` is retried for ``retry_s``: a killed relay's workers die with it, a
    moment later, and may hold the port meanwhile.
    """

    def __init__(self, host: str, port: int, *, backlog: int = 1024,
                 retry_s: float = BIND_RETRY_S) -> None:
        self.reuse_port = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
        self.backlog = backlog
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except OSError as exc:
            raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        seen: set[tuple[int, Any]] = set()
        self._infos: list[tuple[int, int, int, Any]] = []
        for family, kind, proto, _, address in infos:
            if (family, address) not in seen:
                seen.add((family, address))
                self._infos.append((int(family), int(kind), proto, address))
        # (family, kind, proto, address) with the port bound (port 0: the one it got).
        self.addresses: list[tuple[int, int, int, Any]] = []
        deadline = time.monotonic() + retry_s
        logged = False
        while True:
            try:
                self.main = self._bind_main()
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                    raise ListenError(f"cannot listen on {host}:{port}: "
                                      f"{exc.strerror or exc}") from None
                if not logged:
                    log.debug("%s:%d is in use; retrying for %.0f s (the workers of a "
                                "relay that just died may still hold it)", host, port, retry_s)
                    logged = True
                time.sleep(0.1)

    def _bind_main(self) -> list[socket.socket]:
        probes: list[socket.socket] = []
        try:
            addresses: list[tuple[int, int, int, Any]] = []
            for family, kind, proto, address in self._infos:
                probe = _socket(family, kind, proto, reuse_port=False)
                probes.append(probe)
                if address[1] == 0 and addresses:
                    # Port 0: every address on the port the first one got.
                    address = (address[0], addresses[0][3][1], *address[2:])
                probe.bind(address)
                addresses.append((family, kind, proto, probe.getsockname()))
            self.addresses = addresses
            return self.bind()
        finally:
            for probe in probes:
                probe.close()

    def bind(self) -> list[socket.socket]:
        """Listening sockets, one per address, on the bound port (a worker's, or the
        main process's)."""
        return _listen(self.addresses, reuse_port=self.reuse_port, backlog=self.backlog)

    def spec(self) -> dict[str, Any]:
        """How a worker gets its sockets (``WorkerSpec``): addresses to bind, or the
        main process's sockets to inherit."""
        if self.reuse_port:
            return {"listen": [[f, k, p, list(a)] for f, k, p, a in self.addresses]}
        return {"listen_fds": [s.fileno() for s in self.main]}

    def inherited(self) -> list[int]:
        return [] if self.reuse_port else [s.fileno() for s in self.main]


def _socket(family: int, kind: int, proto: int, *, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
            # As asyncio: a v6 socket beside a v4 one must not claim v4 too.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def _listen(addresses: Iterable[Sequence[Any]], *, reuse_port: bool,
            backlog: int) -> list[socket.socket]:
    """A listening socket on each ``(family, kind, proto, address)``, all or none."""
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, address in addresses:
            sock = _socket(family, kind, proto, reuse_port=reuse_port)
            sockets.append(sock)
            sock.bind(tuple(address))
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def worker_sockets(spec: Mapping[str, Any], backlog: int = 1024) -> list[socket.socket]:
    """A worker's listening sockets from its ``Listeners.spec()``."""
    if "listen_fds" in spec:
        return [socket.socket(fileno=int(fd)) for fd in spec["listen_fds"]]
    return _listen(spec["listen"], reuse_port=True, backlog=backlog)


def main_socket_path(data_dir: Path) -> tuple[str, Path | None]:
    """Where the main process serves its app for its workers' forwarded requests:
    ``data_dir/relay.sock``, or, when that path is too long for a unix socket, one in a
    private temporary directory (returned second, to remove at exit). A socket file
    left by a relay that was killed is removed first."""
    path = data_dir / "relay.sock"
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        tmp = Path(tempfile.mkdtemp(prefix="databus-relay-"))
        return str(tmp / "relay.sock"), tmp
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return str(path), None


# -- the hello's configured sources ----------------------------------------------------


def configured_to_json(configured: ConfiguredSources | None) -> dict[str, Any] | None:
    if configured is None:
        return None
    return {"names": sorted(configured.names), "databases": sorted(configured.databases),
            "everything": configured.everything,
            "excluded_databases": sorted(configured.excluded_databases)}


def configured_from_json(doc: Any) -> ConfiguredSources | None:
    if doc is None:
        return None
    return ConfiguredSources(
        names=frozenset(doc["names"]), databases=frozenset(doc["databases"]),
        everything=bool(doc["everything"]),
        excluded_databases=frozenset(doc["excluded_databases"]))


async def worker_header(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the pid of the process serving this connection."""
    response.headers[WORKER_HEADER] = str(os.getpid())


# -- the pool -----------------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    index: int
    backoff: Backoff
    proc: subprocess.Popen[bytes] | None = None
    writer: asyncio.StreamWriter | None = None
    state: WorkerState = "starting"
    restarts: int = 0
    started: float = 0.0
    # Its last report of what it has open now (subtracted again when it goes away).
    gauges: dict[str, int] = field(default_factory=dict)
    # Streams it holds open, per consumer key: closed for it when it goes.
    streams: dict[tuple[str, str, str], int] = field(default_factory=dict)


class WorkerPool:
    """``count`` worker processes serving ``relay``'s buffers beside the main process
    (module docstring). Start and stop it on the event loop; ``on_window`` may be
    called from any thread (the buffers' writers)."""

    def __init__(self, relay: Relay, *, count: int, config_path: str,
                 listeners: Listeners, main_socket: str, log_level: str,
                 stats: HttpStats, app: web.Application) -> None:
        self.relay = relay
        self.count = count
        self.config_path = config_path
        self.listeners = listeners
        self.main_socket = main_socket
        self.log_level = log_level
        self.stats = stats
        self.app = app
        self._workers = [
            _Worker(i, Backoff(BACKOFF_INITIAL_S, BACKOFF_MAX_S, BACKOFF_HEALTHY_S))
            for i in range(count)
        ]
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_pending = False
        self._stopping = False

    # -- life ------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for worker in self._workers:
            await self._spawn(worker)

    def terminate(self) -> None:
        """SIGTERM to every worker (they stop accepting and finish their requests)."""
        self._stopping = True
        for worker in self._workers:
            if worker.proc is not None and worker.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(signal.SIGTERM)

    async def stop(self) -> None:
        """Stop every worker: SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``."""
        self.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for worker in self._workers:
            proc = worker.proc
            if proc is None:
                continue
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                log.warning("relay worker %d (pid %d) did not stop within %.0f s; killing it",
                            worker.index, proc.pid, STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()
            worker.state = "stopped"
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _spawn(self, worker: _Worker) -> None:
        ours, theirs = socket.socketpair()
        try:
            fds = self.listeners.inherited()
            spec = {"main_pid": os.getpid(), "index": worker.index,
                    "channel_fd": theirs.fileno(), "main_socket": self.main_socket,
                    **self.listeners.spec()}
            # Forked from the loop's thread, which lives as long as the process: the
            # worker's parent-death signal is tied to the thread that forked it.
            worker.proc = subprocess.Popen(
                [sys.executable, "-m", "databus.cli", "--log-level", self.log_level,
                 "relay", "--config", self.config_path, "--worker", json.dumps(spec)],
                pass_fds=(*fds, theirs.fileno()), stdin=subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl-C reaches the main process only,
                # which then stops the workers in order.
                start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        worker.state = "starting"
        worker.started = time.monotonic()
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=CHANNEL_LINE_LIMIT)
        worker.writer = writer
        writer.write(json.dumps(self._hello()).encode() + b"\n")
        log.info("relay worker %d started (pid %d)", worker.index, worker.proc.pid)
        task = asyncio.create_task(self._watch(worker, reader))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _hello(self) -> dict[str, Any]:
        configured = self.relay.fetchers.configured_sources()
        return {
            "main_pid": os.getpid(),
            "buffers": {name: {"capacity": b.capacity, "partition_id": b.partition_id,
                               "configured": configured_to_json(configured.get(name))}
                        for name, b in self.relay.buffers.items()},
        }

    async def _watch(self, worker: _Worker, reader: asyncio.StreamReader) -> None:
        """Read the worker's reports until its channel ends, then reap it and start
        another (unless the pool is stopping), after a backoff; a start that fails is
        tried again after the next one."""
        with contextlib.suppress(ConnectionError, ValueError):  # ValueError: a line too long
            while line := await reader.readline():
                try:
                    self._report(worker, json.loads(line))
                except (ValueError, KeyError, TypeError, DatabusError) as exc:
                    log.error("relay worker %d: bad report (%s)", worker.index, exc)  # a bug
        if worker.writer is not None:
            worker.writer.close()
            worker.writer = None
        self._drop_gauges(worker)
        self._close_streams(worker)
        proc = worker.proc
        assert proc is not None
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while proc.poll() is None:
            if time.monotonic() >= deadline:  # its channel closed, yet it lives: end it
                proc.kill()
            await asyncio.sleep(0.02)
        what = f"exited with {_exit_text(proc.returncode)}"
        while not self._stopping:
            ran = time.monotonic() - worker.started
            delay = worker.backoff.failed(ran)
            worker.state = "restarting"
            log.warning("relay worker %d (pid %d) %s after %.1f s; starting it again in "
                        "%.2f s", worker.index, proc.pid, what, ran, delay)
            await asyncio.sleep(delay)
            if self._stopping:
                break
            worker.restarts += 1
            try:
                await self._spawn(worker)  # its own watcher takes over
                return
            except Exception as exc:  # e.g. out of processes or fds: try again later
                worker.started = time.monotonic()
                what = f"could not be started ({type(exc).__name__}: {exc})"
        worker.state = "stopped"

    # -- reports ---------------------------------------------------------------------

    def _report(self, worker: _Worker, doc: dict[str, Any]) -> None:
        if "ready" in doc:
            worker.state = "running"
        stats = doc.get("stats")
        if stats is not None:
            self._add_stats(worker, stats)
        consumers = self.app.get(CONSUMERS)
        for seen in doc.get("consumers", ()):
            if consumers is not None:
                consumers.observe(
                    seen["client_id"], buffer=seen["buffer"],
                    checkpoint=Checkpoint.loads(seen["checkpoint"]), events=seen["events"],
                    nbytes=seen["nbytes"], filter_json=seen["filter_json"],
                    sources=tuple(seen["sources"]), address=seen["address"],
                    streaming=seen["streaming"], reader=str(seen.get("reader", ANONYMOUS)))
        for change in doc.get("streams", ()):
            if consumers is not None:
                self._streams_changed(worker, consumers, change)

    @staticmethod
    def _streams_changed(worker: _Worker, consumers: ConsumerRegistry,
                         change: dict[str, Any]) -> None:
        client_id, buffer = str(change["client_id"]), str(change["buffer"])
        reader = str(change.get("reader", ANONYMOUS))
        key = (reader, client_id, buffer)
        opened, closed = int(change.get("opened", 0)), int(change.get("closed", 0))
        for _ in range(opened):
            consumers.stream_opened(client_id, buffer=buffer, reader=reader)
        for _ in range(closed):
            consumers.stream_closed(client_id, buffer=buffer, reader=reader)
        left = worker.streams.get(key, 0) + opened - closed
        if left > 0:
            worker.streams[key] = left
        else:
            worker.streams.pop(key, None)

    def _close_streams(self, worker: _Worker) -> None:
        """A worker that ended closed its streams: their consumers are gone."""
        consumers = self.app.get(CONSUMERS)
        streams, worker.streams = worker.streams, {}
        if consumers is None:
            return
        for (reader, client_id, buffer), count in streams.items():
            for _ in range(count):
                consumers.stream_closed(client_id, buffer=buffer, reader=reader)

    def _add_stats(self, worker: _Worker, stats: dict[str, Any]) -> None:
        own = self.stats
        for route, status, count in stats["requests"]:
            own.requests[(route, status)] += count
        own.bytes_served += stats["bytes_served"]
        own.events_served += stats["events_served"]
        for name in ("long_polls", "streams"):
            now = int(stats[name])
            setattr(own, name, getattr(own, name) + now - worker.gauges.get(name, 0))
            worker.gauges[name] = now

    def _drop_gauges(self, worker: _Worker) -> None:
        for name, value in worker.gauges.items():
            setattr(self.stats, name, getattr(self.stats, name) - value)
        worker.gauges.clear()

    # -- wake-ups --------------------------------------------------------------------

    def on_window(self, scn: int) -> None:
        """A buffer published a window (its writer thread): wake the workers once."""
        if not self._wake_pending and self._loop is not None and not self._loop.is_closed():
            self._wake_pending = True
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._wake_pending = False
        for worker in self._workers:
            writer = worker.writer
            # A byte still unread (or the hello, at start) wakes it just as well: never
            # queue more for a worker that is behind.
            if writer is not None and not writer.is_closing() \
                    and writer.transport.get_write_buffer_size() == 0:
                writer.write(_WAKE)

    # -- status ----------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """For ``/v1/status``: each worker's pid, state and restarts."""
        return [
            {"pid": w.proc.pid if w.proc is not None else None, "state": w.state,
             "restarts": w.restarts}
            for w in self._workers
        ]


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


POOL = web.AppKey("worker_pool", WorkerPool)


def enable_workers(app: web.Application, relay: Relay, *, count: int, config_path: str,
                   host: str, port: int, log_level: str,
                   listeners: Listeners | None = None) -> tuple[list[socket.socket], str]:
    """Set ``app`` (``create_app(relay)``) up to run with ``count`` worker processes:
    binds the listening sockets and chooses the main process's unix socket, and returns
    both for ``databus._serving.run_app(sockets=..., unix_path=...)``. The workers start
    with the app (after the relay: they need its configured sources) and stop with it."""
    if not x86_64():
        log.warning("relay.workers = %d on %s: worker processes read the rings relying on "
                    "x86-64's store order; a torn read there is caught by the events' CRCs "
                    "only (docs/relay.md, \"Workers\")", count + 1, platform.machine())
    if listeners is None:  # bound by the caller first (relay/_cli.py: safe start)
        listeners = Listeners(host, port)
    unix_path, tmp_dir = main_socket_path(relay.config.data_dir)
    cluster = relay.config.cluster
    stamps = StampWriter(relay.config.data_dir, stale_after_s(
        cluster.session_timeout_s if cluster is not None else None))
    pool = WorkerPool(relay, count=count, config_path=config_path, listeners=listeners,
                      main_socket=unix_path, log_level=log_level, stats=app[STATS], app=app)
    app[POOL] = pool
    relay.workers_status = pool.status
    for buffer in relay.buffers.values():
        buffer.add_listener(pool.on_window)
    app.on_response_prepare.append(worker_header)

    async def stamp() -> None:
        # From this loop: a main process that stops (or whose loop stops) stops
        # stamping, and its workers stop promising windows (relay/_liveness.py).
        while True:
            stamps.stamp(SESSION_LOST if relay.session_down() is not None else 0)
            await asyncio.sleep(STAMP_INTERVAL_S)

    async def workers(app: web.Application) -> AsyncIterator[None]:
        stamping = asyncio.create_task(stamp())
        await pool.start()
        yield
        await pool.stop()
        stamping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stamping
        stamps.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(unix_path)
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    async def terminate(app: web.Application) -> None:
        # Early in shutdown (the sockets are closed, requests still finishing): the
        # workers finish theirs meanwhile.
        pool.terminate()

    app.cleanup_ctx.append(workers)
    app.on_shutdown.append(terminate)
    return listeners.main, unix_path
