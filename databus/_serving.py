"""How the relay and the bootstrap server run their aiohttp apps: connection limits,
timeouts, bounded response memory, and JSON answers to protocol errors.

aiohttp answers a request it cannot parse (request line over 8,190 bytes, a bad header
character, a bad method, bad chunking...) itself, before any middleware runs, with a
text/plain 400 and one ERROR traceback per request; its message quotes the offending
bytes, which may be an ``Authorization`` header. Hostile clients also hold connections
(slowloris), or ask for 8 MiB and never read, pinning the body in memory. So:

- ``LimitedRequestHandler`` (the per-connection protocol) answers protocol errors with a
  JSON ``bad_request`` and one rate-limited log line naming the kind of error and the
  peer, never a header value; it closes a connection whose request head (line and
  headers) is not complete ``header_timeout_s`` after its first byte (408
  ``request_timeout``) or grows over 64 KiB (431 ``bad_request``); it cuts a connection
  whose writes make no progress for ``write_timeout_s`` (abort, so the buffered bytes are
  freed at once); it answers connections beyond ``max_connections`` with a JSON 503
  ``overloaded`` and closes them, and beyond an overflow allowance on top of that closes
  them at accept.
- ``install()`` adds a middleware that bounds stream response bodies: each request gets
  64 KiB on its own and more only from a shared ``max_stream_memory_mb`` budget; the
  body is written in 64 KiB pieces so the transport never holds a second copy.
- Paths in ``grant_paths`` (the relay's stream) take their budget share only when the
  handler has more than 64 KiB to serve (``StreamGrant``), not for the whole request: a
  long poll parked on an idle buffer holds no budget (200 of them, each reserving its
  1 MiB default while waiting, used to hold all of the 128 MiB, so that every other
  client got 64 KiB bodies).
- ``ServingState.bulk`` is the one lane big stream bodies are built in: a handler reads
  the first 64 KiB at once and every further slice under this lock, one slice per turn
  of the event loop; a request that holds ``SHORT_BODY`` (relay/_streaming.py) already
  stops when another holds it.
  Building an 8 MiB body in one go takes 5-8 ms of the loop (the ring scan and the
  copies, about half of it the final join); 20 clients that reconnect together stalled
  every other connection 40-100 ms. A handler may hand the body over as its slices
  (``BODY_PIECES``) so that it is never joined into one more copy.
- ``AppRunner``/``run_app`` build the server from these (``web.run_app`` cannot).

Memory bound (docs/relay.md, "Limits"): stream bodies take at most
``max_stream_memory_mb`` plus 64 KiB per connection; each connection adds at most its
request head (64 KiB), its transport's write buffer (64 KiB plus one piece) and a few
KiB of objects; connections are at most ``max_connections`` plus the overflow allowance.
In the kernel, each connection queues at most ``KERNEL_UNSENT`` bytes not sent yet.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from aiohttp import web

from databus._aiohttp_compat import (
    AppRunnerBase,
    BadHttpMethod,
    BadStatusLine,
    BaseRequest,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
    ProtocolBase,
    RequestHandler,
    Server,
    ServerBase,
    StreamReader,
    TransferEncodingError,
    output_size,
)
from databus.config import ServingLimitsConfig
from databus.errors import DatabusError

log = logging.getLogger("databus.http")

# Bytes of a stream body every request may hold without touching the shared budget:
# small responses (the normal case for a consumer that keeps up) are never delayed or
# refused because hostile clients hold the budget.
STREAM_FLOOR = 64 * 1024
# Bodies are written in pieces this large; with the transport's write buffer limit
# (below) the kernel-side backlog of a client that stops reading stays this small in
# our process, instead of a copy of the whole body.
WRITE_PIECE = 64 * 1024
WRITE_BUFFER_HIGH = 64 * 1024
# Bytes a connection's kernel socket may hold that were not sent yet (_limit_unsent).
KERNEL_UNSENT = 128 * 1024
# A request line plus headers beyond this is refused (aiohttp alone would accept 128
# headers of 8 KiB each, about 1 MiB per connection).
MAX_HEAD_BYTES = 64 * 1024
# At most one log line per interval for client misbehaviour, one for internal errors.
LOG_INTERVAL_S = 10.0
# Highest max_bytes the stream endpoints accept (their own validation).
_MAX_BYTES_HI = 1 << 31
# A stream body handed over as slices (not joined: an 8 MiB join alone takes several ms
# of the event loop). The middleware writes them in order; ``Response.body`` stays empty.
BODY_PIECES = web.ResponseKey("body_pieces", Sequence[bytes])


class Overloaded(DatabusError):
    """The server is at a configured limit; the client should retry shortly (or fail
    over to another server, as the client library does on any 503)."""

    code = "overloaded"
    http_status = 503
    retriable = True


class ListenError(DatabusError):
    """The configured address cannot be listened on (it does not resolve, is in use)."""

    code = "cannot_listen"


@dataclasses.dataclass(frozen=True)
class ServingLimits:
    """The connection limits of one server (``[relay]`` or ``[bootstrap.server]``)."""

    max_connections: int = 1000
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    write_timeout_s: float = 30.0
    max_stream_memory_mb: int = 128

    @classmethod
    def of(cls, config: ServingLimitsConfig) -> ServingLimits:
        return cls(
            max_connections=config.max_connections,
            header_timeout_s=config.header_timeout_s,
            idle_timeout_s=config.idle_timeout_s,
            write_timeout_s=config.write_timeout_s,
            max_stream_memory_mb=config.max_stream_memory_mb,
        )

    @property
    def overflow_connections(self) -> int:
        """Connections past ``max_connections`` still answered with a 503 (so a client
        learns why); past these, new connections are closed at once."""
        return max(16, self.max_connections // 8)


class RateLimitedLog:
    """One line per ``interval`` seconds at most; the next line counts what was left out.

    Lines name a kind, the peer's address and a fixed description, never bytes the
    client sent (a header value may hold a bearer token)."""

    def __init__(self, logger: logging.Logger, level: int, interval: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._level = level
        self._interval = interval
        self._clock = clock
        self._next = float("-inf")
        self._suppressed: collections.Counter[str] = collections.Counter()
        self.total: collections.Counter[str] = collections.Counter()

    def note(self, kind: str, peer: str, detail: str,
             exc_info: BaseException | None = None) -> bool:
        """Count one event; log it unless a line went out less than ``interval`` ago."""
        self.total[kind] += 1
        now = self._clock()
        if now < self._next:
            self._suppressed[kind] += 1
            return False
        extra = ""
        if self._suppressed:
            counts = ", ".join(f"{k} {n}" for k, n in sorted(self._suppressed.items()))
            extra = (f" ({sum(self._suppressed.values())} more since the last such line, "
                     f"not logged: {counts})")
            self._suppressed.clear()
        self._next = now + self._interval
        self._logger.log(self._level, "%s from %s: %s%s", kind, peer, detail, extra,
                         exc_info=exc_info)
        return True


class StreamBudget:
    """Bytes of stream response bodies held at once, beyond ``STREAM_FLOOR`` each."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.peak = 0

    def acquire(self, want: int) -> tuple[int, int]:
        """(the body limit granted, the bytes reserved for it). The limit is ``want``
        when the budget allows, else ``STREAM_FLOOR`` plus what is free."""
        extra = max(0, want - STREAM_FLOOR)
        take = min(extra, self.total - self.used)
        self.used += take
        self.peak = max(self.peak, self.used)
        return min(want, STREAM_FLOOR + take), take

    def release(self, reserved: int) -> None:
        self.used -= reserved


class StreamGrant:
    """One request's share of the stream budget, taken by its handler when it has more
    than ``STREAM_FLOOR`` bytes to serve; the middleware keeps it while the body is
    written and gives it back."""

    def __init__(self, budget: StreamBudget) -> None:
        self._budget = budget
        self.reserved = 0

    def allow(self, want: int) -> int:
        """The body limit for a request that wants ``want`` bytes: ``want`` when the
        budget allows, else ``STREAM_FLOOR`` plus what is free. Call once."""
        limit, take = self._budget.acquire(want)
        self.reserved += take
        return limit


STREAM_GRANT = web.RequestKey("stream_grant", StreamGrant)


class ServingState:
    """Per app: its limits, its stream budget and its rate-limited logs."""

    def __init__(self, limits: ServingLimits, stream_paths: Iterable[str] = (),
                 default_max_bytes: int = 1 << 20, max_bytes_cap: int = 8 << 20,
                 grant_paths: Iterable[str] = ()) -> None:
        self.limits = limits
        self.stream_paths = frozenset(stream_paths)
        self.grant_paths = frozenset(grant_paths)
        self.default_max_bytes = default_max_bytes
        self.max_bytes_cap = max_bytes_cap
        self.budget = StreamBudget(limits.max_stream_memory_mb << 20)
        self.rejects = RateLimitedLog(log, logging.WARNING)
        self.errors = RateLimitedLog(log, logging.ERROR)
        self.active_connections = 0
        # Held while a slice of a big stream body is read from a ring (module docstring).
        self.bulk = asyncio.Lock()


SERVING = web.AppKey("serving", ServingState)


def install(app: web.Application, limits: ServingLimits, *, stream_paths: Iterable[str] = (),
            default_max_bytes: int = 1 << 20, max_bytes_cap: int = 8 << 20,
            grant_paths: Iterable[str] = ()) -> ServingState:
    """Give ``app`` its limits and the middleware bounding the bodies of
    ``stream_paths`` (add it after the app's JSON-error middleware, so an ``Overloaded``
    raised here becomes a JSON 503). The handlers of ``grant_paths`` (a subset) take
    their budget themselves through ``request[STREAM_GRANT]`` before serving more than
    ``STREAM_FLOOR`` bytes; the others get it reserved for the whole request. Call
    before the app starts."""
    state = ServingState(limits, stream_paths, default_max_bytes, max_bytes_cap, grant_paths)
    app[SERVING] = state
    app.middlewares.append(_bounded_bodies)
    return state


# -- the stream body middleware -----------------------------------------------------------


def _requested_max_bytes(request: web.Request, state: ServingState) -> int | None:
    """The body limit the handler will use; None when ``max_bytes`` is not valid (the
    handler answers that 400 itself)."""
    raw = request.query.get("max_bytes")
    if raw is None or raw == "":
        value = state.default_max_bytes
    elif raw.isascii() and raw.isdigit() and len(raw) <= 12:
        value = int(raw)
        if not 1 <= value <= _MAX_BYTES_HI:
            return None
    else:
        return None
    return min(value, state.max_bytes_cap)


@web.middleware
async def _bounded_bodies(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    state = request.app[SERVING]
    if request.path not in state.stream_paths:
        return await handler(request)
    if request.path in state.grant_paths:
        return await _granted_body(request, handler, state)
    want = _requested_max_bytes(request, state)
    if want is None:
        return await handler(request)
    limit, reserved = state.budget.acquire(want)
    try:
        if limit < want:
            request = request.clone(rel_url=request.rel_url.update_query(max_bytes=str(limit)))
        handled = await handler(request)
        body = _body_pieces(handled)
        if body is None:
            return handled
        response, pieces, size = body
        pending = response.headers.get("X-Databus-Pending-Event-Size")
        if limit < want and pending is not None and pending.isdigit() and int(pending) <= want:
            # The event would have fit in what the client asked for: a pending-size
            # answer would make it ask again at once, in a loop, while the budget is used.
            raise Overloaded(
                "the server's stream memory (max_stream_memory_mb) is in use by other "
                "responses; retry shortly")
        keep = max(0, size - STREAM_FLOOR)
        state.budget.release(reserved - keep)
        reserved = keep
        return await _write_body(request, response, pieces, size, state)
    finally:
        state.budget.release(reserved)


def _body_pieces(
    response: web.StreamResponse,
) -> tuple[web.Response, Sequence[bytes], int] | None:
    """A response with its body as the pieces to write and their total size, or None
    for a response this module leaves to aiohttp (streamed, or a body not in bytes)."""
    if not isinstance(response, web.Response):
        return None
    pieces = response.get(BODY_PIECES)
    if pieces is None:
        if not isinstance(response.body, bytes):
            return None
        pieces = (response.body,)
    return response, pieces, sum(len(p) for p in pieces)


async def _granted_body(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    state: ServingState,
) -> web.StreamResponse:
    grant = StreamGrant(state.budget)
    request[STREAM_GRANT] = grant
    try:
        handled = await handler(request)
        body = _body_pieces(handled)
        if body is None:
            return handled
        response, pieces, size = body
        keep = min(grant.reserved, max(0, size - STREAM_FLOOR))
        state.budget.release(grant.reserved - keep)
        grant.reserved = keep
        return await _write_body(request, response, pieces, size, state)
    finally:
        state.budget.release(grant.reserved)
        grant.reserved = 0


async def _write_body(request: web.Request, response: web.Response,
                      pieces: Sequence[bytes], size: int,
                      state: ServingState) -> web.StreamResponse:
    """Send the body (``pieces`` in order, ``size`` bytes) in pieces of at most
    ``WRITE_PIECE``, each within ``write_timeout_s``; a client that stops reading is cut
    (abort: its buffered bytes are dropped, not flushed)."""
    out = web.StreamResponse(status=response.status, reason=response.reason,
                             headers=response.headers)
    out.content_length = size
    timeout = state.limits.write_timeout_s
    try:
        async with asyncio.timeout(timeout):
            await out.prepare(request)
        for body in pieces:
            view = memoryview(body)
            for offset in range(0, len(body), WRITE_PIECE):
                async with asyncio.timeout(timeout):
                    await out.write(view[offset:offset + WRITE_PIECE])
                # write() returns without yielding while the kernel takes the bytes:
                # let other connections run between pieces of a big body.
                await asyncio.sleep(0)
        async with asyncio.timeout(timeout):
            await out.write_eof()
    except TimeoutError:
        state.rejects.note("write_timeout", request.remote or "?",
                           f"client read nothing for {timeout:g} s; connection cut")
        _abort(request)
    except ConnectionError:
        _abort(request)  # the client went away; nothing to answer, nothing to log
    return out


def _abort(request: web.Request) -> None:
    reset(request.transport)


_LINGER_NONE = struct.pack("ii", 1, 0)


def _limit_unsent(transport: asyncio.BaseTransport) -> None:
    """Let the kernel queue at most ``KERNEL_UNSENT`` bytes the client has not been sent
    yet (``TCP_NOTSENT_LOWAT``; bytes in flight are still bounded only by the window,
    so a fast client's throughput is unchanged). Without it, a client that never reads
    took up to ``tcp_wmem``'s 4 MiB per connection of kernel memory, and copying them in
    was most of what 20 such clients reconnecting together cost the event loop."""
    sock = transport.get_extra_info("socket")
    lowat = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    if sock is None or lowat is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, lowat, KERNEL_UNSENT)


def reset(transport: asyncio.Transport | None) -> None:
    """Drop a connection and everything queued for it: our buffer (``abort``, where
    ``close`` would wait to flush it) and the kernel's send buffer (linger 0 sends a
    reset; a plain close leaves an orphan socket holding up to a few MiB while it keeps
    probing a client that reads nothing)."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_NONE)
    transport.abort()


# -- the per-connection protocol ----------------------------------------------------------


def _describe(exc: BaseException | None) -> str:
    """A fixed description of a protocol error: aiohttp's own message quotes the bytes
    received, which may be a header holding a secret."""
    kinds: list[tuple[type[BaseException], str]] = [
        (LineTooLong, "request line or header too long"),
        (InvalidHeader, "invalid header"),
        (BadHttpMethod, "invalid HTTP method"),
        (BadStatusLine, "malformed request line"),
        (InvalidURLError, "invalid URL"),
        (TransferEncodingError, "bad chunked transfer encoding"),
        (ContentLengthError, "bad Content-Length"),
        (PayloadEncodingError, "bad body encoding"),
    ]
    for cls, text in kinds:
        if isinstance(exc, cls):
            return text
    return "unparseable request line or headers"


def _peer(transport: asyncio.BaseTransport | None) -> str:
    if transport is None:
        return "?"
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer) if peer else "?"


def _raw_json_response(status: int, reason: str, code: str, message: str) -> bytes:
    body = json.dumps({"error": code, "message": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\n"
            "Content-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


class LimitedRequestHandler(ProtocolBase):
    """aiohttp's protocol with the head timeout and size cap, the write timeout, the
    over-capacity answer and JSON protocol errors (module docstring)."""

    def __init__(self, manager: LimitedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._state = manager.state
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._peer = "?"
        # The body of the request handled last: until it is read to its end (by the
        # handler, or by aiohttp's lingering read after an answer that did not read
        # it), the bytes that arrive are that body, never the next request's head.
        self._payload: StreamReader | None = None

    # connection lifecycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._peer = _peer(transport)
        super().connection_made(transport)  # the server counts it, maybe refuses it
        if transport.is_closing():
            return
        # Duck-typed: uvloop's TCPTransport has the method but is no asyncio.WriteTransport
        # (an isinstance test skipped the limit under uvloop).
        set_limits = getattr(transport, "set_write_buffer_limits", None)
        if set_limits is not None:
            set_limits(high=WRITE_BUFFER_HIGH)
        _limit_unsent(transport)
        # The first request head must arrive in time, even if no byte ever comes.
        self._head_timer = self.event_loop.call_later(
            self._state.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._end_head()
        super().connection_lost(exc)

    def answer_overloaded(self) -> None:
        """Answer every request on this connection with a 503 and close it."""
        self.replace_request_handler(self._overloaded)

    async def _overloaded(self, request: BaseRequest) -> web.StreamResponse:
        limit = self._state.limits.max_connections
        response = web.json_response(
            {"error": Overloaded.code,
             "message": f"too many connections (max_connections = {limit}); retry shortly"},
            status=503, headers={"Retry-After": "1"})
        response.force_close()
        return response

    # request heads

    def data_received(self, data: bytes) -> None:
        if not data or self.closing:
            super().data_received(data)
            return
        # Bytes that arrive while a request is being handled, or after an answer that
        # left its body unread (a body refused as too large), are that body.
        busy = (self.handling_request or self.upgraded
                or (self._payload is not None and not self._payload.is_eof()))
        count = self.requests_parsed
        super().data_received(data)
        newest = self.newest_payload
        if newest is not None:
            self._payload = newest  # the newest request's body
        if self.requests_parsed != count:
            self._end_head()  # a head completed (or failed to parse: answered as 400)
        elif not busy and not self.force_closing:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse_head(431, "Request Header Fields Too Large", "bad_request",
                                  f"request head over {MAX_HEAD_BYTES} bytes",
                                  "request head too large")
            elif self._head_timer is None:
                self._head_timer = self.event_loop.call_later(
                    self._state.limits.header_timeout_s, self._head_timed_out)

    def _end_head(self) -> None:
        self._head_bytes = 0
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.force_closing or self.transport is None:
            return
        if self.handling_request:
            self._head_bytes = 0  # a request got going meanwhile
            return
        timeout = self._state.limits.header_timeout_s
        if self._head_bytes == 0:
            # Nothing sent at all: close quietly (a pre-opened connection, a scanner).
            self._state.rejects.note("idle_connection", self._peer,
                                     f"no request within {timeout:g} s; closed")
            self.force_close()
            return
        self._refuse_head(408, "Request Timeout", "request_timeout",
                          f"request head not complete within {timeout:g} s",
                          f"request head not complete within {timeout:g} s (slow client)")

    def _refuse_head(self, status: int, reason: str, code: str, message: str,
                     detail: str) -> None:
        self._state.rejects.note(code, self._peer, detail)
        transport = self.transport
        if transport is not None:
            transport.write(_raw_json_response(status, reason, code, message))
        self._end_head()
        self.force_close()  # closes after the answer is flushed

    # writes

    async def wait_writable(self, drain: Callable[[], Awaitable[None]]) -> None:
        if self.transport is None or not self.writing_paused:
            await drain()
            return
        timeout = self._state.limits.write_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await drain()
        except TimeoutError:
            self._state.rejects.note("write_timeout", self._peer,
                                     f"client read nothing for {timeout:g} s; connection cut")
            reset(self.transport)
            raise ConnectionResetError("write timeout: the client stopped reading") from None

    # errors

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if isinstance(exc, ConnectionError) or output_size(request) > 0:
            # As aiohttp: part of a response is out, no error answer can follow.
            raise ConnectionError("response already started; cannot send an error")
        if status < 500 or isinstance(exc, HttpProcessingError):
            what = _describe(exc)
            self._state.rejects.note("bad_request", self._peer, what)
            body = {"error": "bad_request", "message": f"malformed HTTP request ({what})"}
            status = status if 400 <= status < 500 else 400
        else:
            self._state.errors.note("internal_error", self._peer,
                                    "unhandled error serving a request", exc_info=exc)
            body = {"error": "internal_error", "message": "internal error; see the server log"}
        response = web.json_response(body, status=status)
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        detail = str(args[0]) if args else "error"
        self._state.errors.note("internal_error", self._peer, detail,
                                exc_info=exc if isinstance(exc, BaseException) else None)


class LimitedServer(ServerBase):
    """aiohttp's connection factory, making ``LimitedRequestHandler``s and counting them."""

    def __init__(self, handler: Any, *, state: ServingState, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.state = state

    def __call__(self) -> RequestHandler:
        return self.make_protocol(LimitedRequestHandler)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        state = self.state
        # Connections whose handler still runs count until it ends (aiohttp drops them
        # then): a request's work is what costs memory, not the socket.
        state.active_connections = active = self.connection_count
        limits = state.limits
        if active > limits.max_connections + limits.overflow_connections:
            state.rejects.note("over_capacity", _peer(transport),
                               "connection closed at accept (max_connections and the "
                               "overflow allowance in use)")
            transport.abort()
        elif active > limits.max_connections:
            state.rejects.note("over_capacity", _peer(transport),
                               "answered 503 (max_connections in use)")
            assert isinstance(handler, LimitedRequestHandler)
            handler.answer_overloaded()


class AppRunner(AppRunnerBase):
    """``web.AppRunner`` serving through ``LimitedServer`` with the app's limits
    (``install()``; defaults if the app has none)."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        state = app.get(SERVING)
        if state is None:
            state = install(app, ServingLimits())
        self.state = state
        kwargs.setdefault("keepalive_timeout", state.limits.idle_timeout_s)
        kwargs.setdefault("access_log", None)
        # A client that hangs up ends its request (a long poll stops waiting) instead of
        # leaving the work running, uncounted, until it times out.
        kwargs.setdefault("handler_cancellation", True)
        super().__init__(app, **kwargs)

    def wrap_server(self, plain: Server) -> Server:
        server: LimitedServer = LimitedServer.rebuild(plain, state=self.state)
        return server


def run_app(app: web.Application, *, host: str, port: int,
            on_listen: Callable[[str, int], None],
            loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
            sockets: Sequence[socket.socket] = (), unix_path: str | None = None,
            ssl_context: ssl.SSLContext | None = None) -> str:
    """Serve ``app`` until SIGINT or SIGTERM (what ``web.run_app`` does, with limits),
    on the loop ``loop_factory`` makes (uvloop's, databus._event_loop; None: asyncio's).
    ``sockets``: listen on these bound sockets instead of ``host:port``; ``unix_path``:
    also on a unix socket there (always plain HTTP: it is this user's only).
    ``ssl_context``: serve TLS on the TCP sockets (databus.security.server_context; a
    renewed certificate is loaded into it by ``databus.security.watch_certificates``).
    Returns the name of the signal that ended it."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_serve(app, host, port, on_listen, sockets=sockets,
                                 unix_path=unix_path, ssl_context=ssl_context))


def listen_sockets(host: str, port: int, backlog: int = 128) -> list[socket.socket]:
    """Listening sockets on ``host:port`` (every address it resolves to, all or none),
    as aiohttp's ``TCPSite`` would bind them; ``ListenError`` in one line when the host
    does not resolve or the port is in use. A daemon binds first, before it opens its
    files or takes any lock, token, slot or lease (DESIGN 17, "Safe start")."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sockets: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sockets


async def _serve(app: web.Application, host: str, port: int,
                 on_listen: Callable[[str, int], None], *,
                 sockets: Sequence[socket.socket] = (), unix_path: str | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> str:
    # Bound before the app starts (runner.setup() runs its startup: fetchers, fencing
    # tokens, leases): a port in use fails here, having started nothing.
    if not sockets:
        sockets = listen_sockets(host, port)
    runner = AppRunner(app)
    await runner.setup()
    try:
        for sock in sockets:
            await web.SockSite(runner, sock, ssl_context=ssl_context).start()
        if unix_path is not None:
            await web.UnixSite(runner, unix_path).start()
            # The same API as the TCP port, for this user only (admin still needs its token).
            os.chmod(unix_path, 0o600)
        on_listen(host, runner.addresses[0][1] if runner.addresses else port)
        stop = asyncio.Event()
        got: list[str] = []
        loop = asyncio.get_running_loop()

        def signalled(sig: signal.Signals) -> None:
            got.append(sig.name)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, signalled, sig)
        await stop.wait()
        return got[0]
    finally:
        await runner.cleanup()
