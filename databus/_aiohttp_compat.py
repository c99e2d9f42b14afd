"""Every aiohttp internal databus relies on, in one place.

The relay and the bootstrap server run aiohttp's HTTP/1.1 protocol with limits aiohttp
has no options for (databus/_serving.py: a head timeout and size cap, a write timeout,
an over-capacity answer, JSON answers to protocol errors), and the relay writes its
streaming subscriptions' chunks straight to the transport (relay/_streaming.py). Both
need attributes and methods aiohttp does not document. Nothing else in databus touches
them: it goes through the names below, and tests/unit/test_aiohttp_compat.py fails when
an aiohttp release removes, renames or re-types one of them (``INTERNALS`` is its list).

``RequestHandler`` (aiohttp.web_protocol, the per-connection protocol), read by
``ProtocolBase``:

- ``_request_in_progress``: a handler is running. Bytes that arrive then are the
  request's body, not the next request's head, so they do not count toward the head
  size cap or restart the head timer.
- ``_messages``: parsed requests (``(message, payload)`` pairs) not handled yet: the
  same, and the newest one's payload is the body whose end says when a new head starts.
- ``_upgraded``: the connection was upgraded (a WebSocket); its bytes are never a head.
- ``_request_count``: requests parsed on the connection; a change during
  ``data_received`` means a head completed (or failed to parse and was answered).
- ``_force_close``, ``_close``: the connection is closing; nothing more to time or cap.
- ``_request_handler``: replaced to answer every request of a connection over
  ``max_connections`` with a JSON 503.
- ``_loop``: the loop the connection's timers run on.
- ``_paused`` (from ``BaseProtocol``): the transport's write buffer is over its limit;
  only then does a drain wait, and only then does the write timeout apply.
- ``_drain_helper()`` (``BaseProtocol``): overridden to put the write timeout on waits
  for a client that stopped reading.
- ``handle_error(request, status, exc, message)`` and ``log_exception(*args, **kw)``:
  overridden so protocol errors get a JSON answer and one rate-limited log line that
  never quotes the bytes received (they may hold an ``Authorization`` header).
- ``connection_made``, ``connection_lost``, ``data_received``, ``force_close``
  (asyncio's protocol methods, as aiohttp implements them): extended with the head
  timer, the peer's address and the head size count.

``Server`` (aiohttp.web_server, the protocol factory), by ``ServerBase``:

- ``_loop`` and ``_kwargs``: what aiohttp passes to each ``RequestHandler`` it makes;
  ``__call__`` is overridden to make ours with the same arguments.
- ``_connections``: the open connections (those whose handler still runs included),
  counted against ``max_connections``.
- ``connection_made(handler, transport)``: overridden to count and refuse connections;
  ``__call__()``: overridden to make our protocol.
- ``request_handler``, ``request_factory``, ``handler_cancellation``: copied from the
  server aiohttp builds into ours.

``web.AppRunner._make_server()``: overridden so the runner serves through our
``Server`` (``web.run_app`` and the public runner API have no hook for it).

The stream writer (aiohttp.http_writer.StreamWriter, ``request.writer``):

- ``output_size``: bytes of the response already written; a protocol error after the
  first byte cannot be answered any more.
- ``send_headers()`` (aiohttp >= 3.12 holds the headers back to send them with the
  first body bytes): called before the relay writes chunks to the transport itself.
  Absent on a writer that sends the headers at ``prepare()`` (then nothing to do).

Behaviour relied on, not an attribute: after ``prepare()`` of a response with chunked
encoding enabled (and ``send_headers()``), the relay writes whole chunks to the
transport itself and aiohttp's ``write_eof()`` only adds the last chunk. The streaming
tests (tests/unit/test_relay_stream_sends.py, test_relay_streaming.py) parse those
bodies byte for byte.

Public API with a version floor: ``web.RequestKey`` and ``web.ResponseKey`` (typed keys
of request and response storage) first appear in aiohttp 3.14.0, hence the
``aiohttp>=3.14`` in pyproject.toml.

Checked against aiohttp 3.14.0 to 3.14.3 (their source) and by the tests on 3.14.0 (the
floor) and 3.14.5. aiohttp's 4.0 development branch changes ``Server.__init__`` (no
``loop`` argument; the server takes the running loop): ``ServerBase.rebuild`` passes the
loop only where the constructor takes one.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
    TransferEncodingError,
)
from aiohttp.http_writer import StreamWriter
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

__all__ = [
    "INTERNALS",
    "AppRunnerBase",
    "BadHttpMethod",
    "BadStatusLine",
    "BaseRequest",
    "ContentLengthError",
    "HttpProcessingError",
    "Internal",
    "InvalidHeader",
    "InvalidURLError",
    "LineTooLong",
    "PayloadEncodingError",
    "ProtocolBase",
    "RequestHandler",
    "Server",
    "ServerBase",
    "StreamReader",
    "TransferEncodingError",
    "output_size",
    "send_pending_headers",
]

RequestHandlerFunc = Callable[[BaseRequest], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Internal:
    """One aiohttp internal: where it lives, what it is, and the parameters a method
    must take (names in order, ``self`` left out) for our overrides and calls to fit."""

    owner: type
    name: str
    kind: str  # "attribute" (set in __init__) or "method"
    params: tuple[str, ...] = ()


INTERNALS: tuple[Internal, ...] = (
    Internal(RequestHandler, "_request_in_progress", "attribute"),
    Internal(RequestHandler, "_messages", "attribute"),
    Internal(RequestHandler, "_upgraded", "attribute"),
    Internal(RequestHandler, "_request_count", "attribute"),
    Internal(RequestHandler, "_force_close", "attribute"),
    Internal(RequestHandler, "_close", "attribute"),
    Internal(RequestHandler, "_request_handler", "attribute"),
    Internal(RequestHandler, "_loop", "attribute"),
    Internal(RequestHandler, "_paused", "attribute"),
    Internal(RequestHandler, "_drain_helper", "method", ()),
    Internal(RequestHandler, "handle_error", "method", ("request", "status", "exc", "message")),
    Internal(RequestHandler, "log_exception", "method", ("args", "kw")),
    Internal(RequestHandler, "data_received", "method", ("data",)),
    Internal(RequestHandler, "force_close", "method", ()),
    Internal(RequestHandler, "connection_made", "method", ("transport",)),
    Internal(RequestHandler, "connection_lost", "method", ("exc",)),
    Internal(Server, "_loop", "attribute"),
    Internal(Server, "_kwargs", "attribute"),
    Internal(Server, "_connections", "attribute"),
    Internal(Server, "request_handler", "attribute"),
    Internal(Server, "request_factory", "attribute"),
    Internal(Server, "handler_cancellation", "attribute"),
    Internal(Server, "connection_made", "method", ("handler", "transport")),
    Internal(Server, "__call__", "method", ()),
    Internal(web.AppRunner, "_make_server", "method", ()),
    Internal(StreamWriter, "output_size", "attribute"),
    Internal(StreamWriter, "send_headers", "method", ()),
)


class ProtocolBase(RequestHandler):
    """aiohttp's per-connection protocol with its internal state behind names of ours.

    Subclasses override ``wait_writable`` (not ``_drain_helper``) to bound a drain."""

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = self._loop
        return loop

    @property
    def closing(self) -> bool:
        """The connection is closing (forced or after the current response)."""
        return bool(self._force_close or self._close)

    @property
    def force_closing(self) -> bool:
        return bool(self._force_close)

    @property
    def handling_request(self) -> bool:
        """A handler runs, or parsed requests wait for one."""
        return bool(self._request_in_progress or self._messages)

    @property
    def upgraded(self) -> bool:
        return bool(self._upgraded)

    @property
    def requests_parsed(self) -> int:
        """Request heads parsed on this connection so far (answered errors included)."""
        count: int = self._request_count
        return count

    @property
    def newest_payload(self) -> StreamReader | None:
        """The body of the newest parsed request not handled yet, or None."""
        if not self._messages:
            return None
        payload: StreamReader = self._messages[-1][1]
        return payload

    @property
    def writing_paused(self) -> bool:
        """The transport's write buffer is over its high-water mark."""
        return bool(self._paused)

    def replace_request_handler(self, handler: RequestHandlerFunc) -> None:
        """Answer every further request of this connection with ``handler``."""
        self._request_handler = handler

    async def _drain_helper(self) -> None:
        await self.wait_writable(super()._drain_helper)

    async def wait_writable(self, drain: Callable[[], Awaitable[None]]) -> None:
        """Wait until the transport takes writes again (``drain`` is aiohttp's wait)."""
        await drain()


_Handler = TypeVar("_Handler", bound=RequestHandler)


class ServerBase(Server):
    """aiohttp's protocol factory, with what databus reads of it behind names of ours."""

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = self._loop
        return loop

    @property
    def connection_count(self) -> int:
        """Open connections, those whose handler still runs included."""
        return len(self._connections)

    def make_protocol(self, cls: Callable[..., _Handler]) -> _Handler:
        """A protocol of class ``cls`` built with the arguments aiohttp would use."""
        return cls(self, loop=self._loop, **self._kwargs)

    @classmethod
    def rebuild(cls, plain: Server, **extra: Any) -> Any:
        """An instance of ``cls`` serving what ``plain`` (the server aiohttp built)
        serves, with the same options; ``extra`` goes to ``cls``'s constructor."""
        kwargs: dict[str, Any] = dict(plain._kwargs)
        if "loop" in inspect.signature(Server.__init__).parameters:
            kwargs["loop"] = plain._loop
        return cls(plain.request_handler, request_factory=plain.request_factory,
                   handler_cancellation=plain.handler_cancellation, **extra, **kwargs)


class AppRunnerBase(web.AppRunner):
    """``web.AppRunner`` whose server subclasses may replace (``wrap_server``)."""

    async def _make_server(self) -> Server:
        return self.wrap_server(await super()._make_server())

    def wrap_server(self, plain: Server) -> Server:
        """The server to serve with, given the one aiohttp built."""
        return plain


def output_size(request: BaseRequest) -> int:
    """Bytes of ``request``'s response already written (0 before the first)."""
    return request.writer.output_size


def send_pending_headers(writer: AbstractStreamWriter) -> None:
    """Send the response headers aiohttp holds back until the first body bytes, so that
    bytes written to the transport directly follow them."""
    send_headers = getattr(writer, "send_headers", None)
    if send_headers is not None:
        send_headers()
