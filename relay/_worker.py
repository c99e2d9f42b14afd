"""A relay worker process: serves the main process's buffers read-only (docs/relay.md,
"Workers"; the main process's side, and the channel between them: relay/_workers.py).

Started by the main process as ``databus relay --config FILE --worker SPEC`` with the
listening sockets and its end of the channel inherited. Its app is built on the same
``install_read_side`` as the main process's, over ``WorkerRelay``, a read-only view of
the same files: ``/v1/stream`` (polling and ``follow=true``), ``/v1/sources``,
``/v1/schemas`` and ``/healthz`` are served here by the very handlers the main process
runs; any other request is forwarded to the main process over its unix socket, so every
connection gets every endpoint whichever process accepted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from databus._event_loop import choose as choose_event_loop
from databus._http import STATS, HttpStats, json_errors, read_body
from databus._limited_log import limited
from databus._serving import run_app
from databus.checkpoint import Checkpoint
from databus.config import RelayConfig
from databus.errors import ConfigError, DatabusError
from databus.fetchers._api import ConfiguredSources
from databus.relay._access import FORWARDED_CN, tls_for
from databus.relay._catalog import CATALOG_FILENAME, FollowerCatalog
from databus.relay._consumers import CONSUMERS, ConsumerRegistry
from databus.relay._fetcher_host import configured_buffer
from databus.relay._follower import FollowerBuffer
from databus.relay._liveness import MainUnavailable, StampReader, judge, stale_after_s
from databus.relay._readiness import readiness_response
from databus.relay._relay import buffer_path
from databus.relay._server import LIVENESS, NOTIFIERS, WindowNotifier, install_read_side
from databus.relay._workers import (
    CHANNEL_LINE_LIMIT,
    REPORT_CONSUMERS,
    REPORT_INTERVAL_S,
    configured_from_json,
    worker_header,
    worker_sockets,
)
from databus.relay.quarantine._record import QUARANTINE_FILENAME, QuarantineView
from databus.security import ANONYMOUS, peer_cn, watch_certificates

__all__ = ["MainUnavailable", "WorkerRelay", "WorkerSpec", "create_worker_app", "run_worker"]

log = logging.getLogger("databus.relay.worker")

# Headers that describe one connection, not the message: never forwarded as they are.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade", "content-length",
})
_FORWARDED_CN = FORWARDED_CN.lower()
# A forwarded request (status, metrics, consumers, admin, dumps) gets this long.
FORWARD_TIMEOUT_S = 30.0
# The worker looks at the files this often even without a wake-up (a lost one costs
# at most this much latency; none is lost by design).
REFRESH_S = 1.0
# How long a worker reuses its verdict on the main process's liveness stamp.
VERDICT_NS = 20_000_000


@dataclass(frozen=True)
class WorkerSpec:
    """What the main process passes on the command line (``--worker JSON``)."""

    main_pid: int
    index: int
    channel_fd: int
    main_socket: str
    listen: dict[str, Any]  # Listeners.spec(): addresses to bind, or sockets inherited

    @classmethod
    def loads(cls, text: str) -> WorkerSpec:
        doc = json.loads(text)
        return cls(int(doc["main_pid"]), int(doc["index"]), int(doc["channel_fd"]),
                   str(doc["main_socket"]),
                   {k: doc[k] for k in ("listen", "listen_fds") if k in doc})


class ConfiguredBuffers:
    """``configured_buffer`` over the sources each buffer's configuration names, as the
    main process's fetchers reported them (``FetcherHost.configured_buffer``)."""

    def __init__(self, configured: Mapping[str, ConfiguredSources | None]) -> None:
        self._configured = dict(configured)

    def configured_buffer(self, source: str) -> str | None:
        return configured_buffer(self._configured, source)

    def configured_sources(self) -> Mapping[str, ConfiguredSources | None]:
        return self._configured

    def unlisted(self, buffer: str) -> frozenset[str]:
        return frozenset()  # known to the main process only (docs/relay.md)


class WorkerRelay:
    """A read-only view of a relay's files for a worker process (``RelayReader``)."""

    def __init__(self, config: RelayConfig, hello: Mapping[str, Any]) -> None:
        self.config = config
        self.main_pid = int(hello["main_pid"])
        self.stamps = StampReader(config.data_dir)
        self.stale_after_s = stale_after_s(
            config.cluster.session_timeout_s if config.cluster is not None else None)
        self._verdict: DatabusError | None = None
        self._judged_at = -VERDICT_NS
        described = hello["buffers"]
        mine = {b.name: (b.capacity_bytes, i) for i, b in enumerate(config.buffers)}
        theirs = {n: (d["capacity"], d["partition_id"]) for n, d in described.items()}
        if mine != theirs:
            # The config file changed since the main process read it.
            raise ConfigError("the relay's config file no longer describes the buffers the "
                              "running relay has; restart the relay to apply it")
        self.fetchers = ConfiguredBuffers(
            {n: configured_from_json(d["configured"]) for n, d in described.items()})
        self.catalog = FollowerCatalog(config.data_dir / CATALOG_FILENAME)
        self.quarantines = QuarantineView(config.data_dir / QUARANTINE_FILENAME)
        self.buffers: dict[str, FollowerBuffer] = {}
        try:
            for i, b in enumerate(config.buffers):
                self.buffers[b.name] = FollowerBuffer(
                    buffer_path(config.data_dir, b.name), b.capacity_bytes,
                    index_every_bytes=b.index_every_bytes, partition_id=i)
        except BaseException:
            self.close()
            raise

    def main_down(self) -> DatabusError | None:
        """None while the main process answers (its liveness stamp is fresh,
        relay/_liveness.py) and is in its ZooKeeper session; else the error to answer
        with. Judged at most every 20 ms (``VERDICT_NS``): thousands of idle streams
        woken by one window ask together."""
        now = time.monotonic_ns()
        if now - self._judged_at >= VERDICT_NS:
            self._verdict = judge(self.stamps.read(), now_ns=now, main_pid=self.main_pid,
                                  stale_after_s=self.stale_after_s)
            self._judged_at = now
        return self._verdict

    def refresh(self) -> None:
        """Catch up with the main process: the catalog if it changed, each buffer's
        index (its listeners wake the long polls and streams waiting on it)."""
        self.catalog.refresh()
        self.quarantines.refresh()
        for buffer in self.buffers.values():
            buffer.catch_up()

    def close(self) -> None:
        for buffer in self.buffers.values():
            buffer.close()
        self.buffers.clear()
        self.stamps.close()


class ForwardingConsumers(ConsumerRegistry):
    """The worker's consumer registry: what it served goes to the main process's
    registry (``GET /v1/consumers`` is served there), summed per consumer and buffer
    over ``REPORT_INTERVAL_S``; nothing is kept here."""

    def __init__(self) -> None:
        super().__init__(max_consumers=0)
        self._pending: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._streams: dict[tuple[str, str, str], dict[str, Any]] = {}

    def observe(self, client_id: str, *, buffer: str, checkpoint: Checkpoint, events: int,
                nbytes: int, filter_json: str | None, sources: tuple[str, ...],
                address: str | None, streaming: bool, reader: str = ANONYMOUS) -> None:
        seen = self._pending.get((reader, client_id, buffer))
        if seen is not None:
            events += seen["events"]
            nbytes += seen["nbytes"]
        self._pending[(reader, client_id, buffer)] = {
            "client_id": client_id, "buffer": buffer, "checkpoint": checkpoint.dumps(),
            "events": events, "nbytes": nbytes, "filter_json": filter_json,
            "sources": list(sources), "address": address, "streaming": streaming,
            "reader": reader}

    def stream_opened(self, client_id: str, *, buffer: str, reader: str = ANONYMOUS
                      ) -> None:
        self._stream_change(client_id, buffer, reader, "opened")

    def stream_closed(self, client_id: str, *, buffer: str, reader: str = ANONYMOUS
                      ) -> None:
        self._stream_change(client_id, buffer, reader, "closed")

    def _stream_change(self, client_id: str, buffer: str, reader: str, what: str) -> None:
        """Streams opened and closed since the last report, per consumer: the main
        process applies the openings, then what was served, then the closings (a stream
        that opened and closed within one report leaves no entry)."""
        change = self._streams.setdefault(
            (reader, client_id, buffer), {"client_id": client_id, "buffer": buffer,
                                          "reader": reader, "opened": 0, "closed": 0})
        change[what] += 1

    def window_landed(self, buffer: str, scn: int) -> None:
        """Landing times are the main process's (lag is computed there)."""

    def take(self) -> list[dict[str, Any]]:
        taken, self._pending = list(self._pending.values()), {}
        return taken

    def take_streams(self) -> list[dict[str, Any]]:
        taken, self._streams = list(self._streams.values()), {}
        return taken


class _Reporter:
    """Sums what this worker served since its last report (``HttpStats`` deltas).
    Forwarded requests are left out: the main process counts them itself."""

    def __init__(self, stats: HttpStats, forwarded_route: str) -> None:
        self.stats = stats
        self.forwarded_route = forwarded_route
        self._requests: dict[tuple[str, int], int] = {}
        self._bytes = self._events = 0

    def stats_delta(self) -> dict[str, Any]:
        s = self.stats
        requests = [[route, status, count - self._requests.get((route, status), 0)]
                    for (route, status), count in s.requests.items()
                    if count != self._requests.get((route, status), 0)
                    and route != self.forwarded_route]
        doc = {"requests": requests, "bytes_served": s.bytes_served - self._bytes,
               "events_served": s.events_served - self._events,
               "long_polls": s.long_polls, "streams": s.streams}
        self._requests = dict(s.requests)
        self._bytes, self._events = s.bytes_served, s.events_served
        return doc


MAIN = web.AppKey("main_session", aiohttp.ClientSession)
CHANNEL = web.AppKey("channel", asyncio.StreamWriter)


async def forward(request: web.Request) -> web.StreamResponse:
    """Any request this worker does not serve itself: sent to the main process as it
    came (its bearer token, body and query), answered with what the main process said."""
    down = request.app[LIVENESS]()
    if isinstance(down, MainUnavailable):
        # It would not answer (within FORWARD_TIMEOUT_S): say so now.
        raise down
    session = request.app[MAIN]
    headers = CIMultiDict((k, v) for k, v in request.headers.items()
                          if k.lower() not in _HOP_BY_HOP and k.lower() != _FORWARDED_CN)
    if request.remote:
        headers["X-Forwarded-For"] = request.remote
    # The bearer token goes as it came; the client certificate, which only this process
    # saw verified, as its CN (believed by the main process on this unix socket only:
    # relay/_access.py).
    cn = peer_cn(request)
    if cn:
        headers[FORWARDED_CN] = cn
    # Bounded as the main process bounds it (every forwarded body is an admin one).
    body = await read_body(request) if request.body_exists else None
    try:
        async with session.request(request.method, URL("http://relay" + request.raw_path,
                                                       encoded=True),
                                   headers=headers, data=body,
                                   allow_redirects=False) as answer:
            data = await answer.read()
            out = web.Response(status=answer.status, reason=answer.reason, body=data)
            for key, value in answer.headers.items():
                if key.lower() not in _HOP_BY_HOP:
                    out.headers.add(key, value)
            return out
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise MainUnavailable(
            f"this relay's main process did not answer ({type(exc).__name__}); retry") from None


async def readyz(request: web.Request) -> web.StreamResponse:
    """``GET /readyz``: not ready when the main process stopped answering (told here,
    at once); otherwise what the main process says."""
    down = request.app[LIVENESS]()
    if isinstance(down, MainUnavailable):
        return readiness_response([{
            "component": "main_process", "ready": False, "state": "unresponsive",
            "error": down.code, "message": down.message,
            "fix": "resume or restart the relay's main process (pid "
                   f"{request.app[WORKER_VIEW].main_pid}); its consumers fail over to "
                   "other relays meanwhile"}])
    return await forward(request)


WORKER_VIEW = web.AppKey("worker_view", WorkerRelay)


def create_worker_app(view: WorkerRelay, channel: socket.socket,
                      main_socket: str) -> web.Application:
    """The worker's app: the read side of the main process's app over ``view``, the
    rest forwarded; woken by, and reporting to, the main process over ``channel``."""
    app = web.Application(middlewares=[json_errors])
    install_read_side(app, view)
    app[LIVENESS] = view.main_down
    app[WORKER_VIEW] = view
    app.router.add_get("/readyz", readyz)
    registry = ForwardingConsumers()
    app[CONSUMERS] = registry
    app.on_response_prepare.append(worker_header)
    # Last: a request no route above takes (another endpoint, or a method the read
    # routes do not take) goes to the main process, which answers it or says 404/405.
    forwarded = app.router.add_route("*", "/{path:.*}", forward).resource
    assert forwarded is not None

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        for name, buffer in view.buffers.items():
            notifier = WindowNotifier(loop)
            app[NOTIFIERS][name] = notifier
            buffer.add_listener(notifier.on_window)
        app[MAIN] = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=main_socket), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S))
        reader, writer = await asyncio.open_unix_connection(sock=channel,
                                                            limit=CHANNEL_LINE_LIMIT)
        app[CHANNEL] = writer
        tasks = [asyncio.create_task(_follow_main(view, reader)),
                 asyncio.create_task(_report(_Reporter(app[STATS], forwarded.canonical),
                                             registry, writer))]
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writer.close()
        await app[MAIN].close()
        for notifier in app[NOTIFIERS].values():
            notifier.close()
        view.close()

    app.cleanup_ctx.append(lifecycle)
    return app


async def _follow_main(view: WorkerRelay, reader: asyncio.StreamReader) -> None:
    """Catch up whenever the main process says windows landed (and every
    ``REFRESH_S``); stop the worker when the channel ends: the main process is gone,
    and a worker must never serve without it (a restarted relay would share its port
    with orphans)."""
    while True:
        try:
            async with asyncio.timeout(REFRESH_S):  # not wait_for: it can lose a cancel
                data = await reader.read(4096)
        except TimeoutError:
            data = None
        except ConnectionError:
            data = b""
        if data == b"":
            log.warning("relay worker %d: the main process is gone; stopping", os.getpid())
            os.kill(os.getpid(), signal.SIGTERM)
            return
        try:
            view.refresh()
        except Exception as exc:  # keep following (reads report damage to their clients)
            limited(log).error("relay worker %d: cannot catch up with the buffers",
                               os.getpid(), exc_info=exc)


async def _report(reporter: _Reporter, registry: ForwardingConsumers,
                  writer: asyncio.StreamWriter) -> None:
    """Every ``REPORT_INTERVAL_S``: what this worker served, for the main process."""
    while True:
        await asyncio.sleep(REPORT_INTERVAL_S)
        if writer.is_closing():
            return
        lines: list[dict[str, Any]] = [{"stats": reporter.stats_delta()}]
        seen = registry.take()
        for i in range(0, len(seen), REPORT_CONSUMERS):
            lines.append({"consumers": seen[i:i + REPORT_CONSUMERS]})
        streams = registry.take_streams()  # after what they served (see _stream_change)
        for i in range(0, len(streams), REPORT_CONSUMERS):
            lines.append({"streams": streams[i:i + REPORT_CONSUMERS]})
        writer.write(b"".join(json.dumps(doc).encode() + b"\n" for doc in lines))
        with contextlib.suppress(ConnectionError):
            await writer.drain()


def _die_with_main(main_pid: int) -> None:
    """Never outlive the main process: on Linux the kernel sends SIGKILL when it dies
    (PR_SET_PDEATHSIG); everywhere the channel's EOF stops the worker too."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != main_pid:  # it died before we asked
        os._exit(1)


def _read_hello(channel: socket.socket) -> dict[str, Any]:
    """The hello line; bytes after it are wake-ups, which the first catch-up covers."""
    data = b""
    while b"\n" not in data:
        chunk = channel.recv(1 << 16)
        if not chunk:
            raise ConfigError("the main process closed the channel before its hello")
        data += chunk
    doc: dict[str, Any] = json.loads(data.split(b"\n", 1)[0])
    return doc


def run_worker(config: RelayConfig, spec_text: str) -> int:
    """``databus relay --worker SPEC``: serve until SIGTERM or the main process ends."""
    spec = WorkerSpec.loads(spec_text)
    _die_with_main(spec.main_pid)
    channel = socket.socket(fileno=spec.channel_fd)
    channel.setblocking(True)
    hello = _read_hello(channel)
    channel.setblocking(False)
    view = WorkerRelay(config, hello)
    loop = choose_event_loop(config.event_loop, "relay.event_loop")
    app = create_worker_app(view, channel, spec.main_socket)

    def ready(host: str, port: int) -> None:
        log.info("relay worker %d (pid %d) serving on %s:%d", spec.index, os.getpid(),
                 host, port)
        app[CHANNEL].write(json.dumps({"ready": os.getpid()}).encode() + b"\n")

    # Bound now, when it is about to serve: the kernel hashes connections to these
    # sockets from here on (relay/_workers.py, Listeners).
    listeners = worker_sockets(spec.listen)
    ssl_context, reloader = tls_for(config)
    if reloader is not None:
        watch_certificates(app, reloader)  # each process reloads its own context
    run_app(app, host=config.host, port=config.port, loop_factory=loop.factory,
            sockets=listeners, on_listen=ready, ssl_context=ssl_context)
    return 0
