"""Streaming subscriptions (``GET /v1/stream?...&follow=true``, DESIGN section 6) and the
reads that consumers at the same position share.

One chunked response per consumer stays open. Its body is events in wire format
(databus.event), written in *writes*::

    write:      [whole events of the windows that landed since the last write,
                 EOWs included (a window's part when it alone exceeds the write size)]
                [CHECKPOINT control event: source id -3, SCN = the checkpoint's window
                 SCN, timestamp = the last window's commit time, value = the checkpoint
                 JSON after the write]
    idle:       [HEARTBEAT control event: source id -5, every heartbeat_ms with nothing
                 new; value = {"min_scn": .., "max_scn": ..} of the buffer]
    at the end: [ERROR control event: source id -4, value = the JSON error body, e.g.
                 {"error": "scn_not_found", "message": .., "min_scn": ..}]; then the
                 response ends. A relay that shuts down ends it without one.

A consumer's position after a checkpoint event is exactly what a polling response with
the same events would have put in ``X-Databus-Checkpoint``: both forms are served by the
same ``EventBuffer.read``. A request that cannot start (bad parameters, a checkpoint
already off the buffer) gets the usual JSON error with its HTTP status; errors met once
the response has started travel in-band.

Flow control is TCP's: each write goes out in ``WRITE_PIECE`` pieces, each awaiting the
transport (whose buffer ``databus._serving`` keeps at 64 KiB); a consumer that stops
reading stops being read for, and one that reads nothing for ``write_timeout_s`` is cut.
What a stream holds is bounded: one write's bytes (at most ``STREAM_FLOOR`` unless the
server-wide stream budget grants more, and given back after each write) plus its
transport's buffer.

``SharedReads``: consumers that wake at the same position with the same filter (the
common case: many consumers keeping up with one buffer) get one ring read and one
``bytes`` object between them, written to each of their sockets without a further copy.
The read copies the bytes out of the ring and checks the ring's head afterwards, as every
read does, so a shared result holds untorn bytes; serving it later is serving bytes the
ring held, under the same rules (an entry is used only while its position is still
servable, and one that reached the buffer's tail only until a newer window lands).
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from databus._serving import SERVING, WRITE_PIECE, reset
from databus.checkpoint import WHOLE_WINDOW, Checkpoint
from databus.errors import DatabusError, EventFormatError, ScnNotFoundError
from databus.event import (
    CHECKPOINT_SOURCE_ID,
    EOW_SOURCE_ID,
    ERROR_SOURCE_ID,
    HEARTBEAT_SOURCE_ID,
    decode_header,
    encode_control,
    encode_eow,
)
from databus.relay._buffer import BufferCorruptedError, EventBuffer, ReadResult

__all__ = [
    "Follow",
    "SharedRead",
    "SharedReads",
    "StreamEnd",
    "Wakeups",
    "checkpoint_event",
    "error_event",
    "heartbeat_event",
]

# Bytes a shared-read cache holds per buffer, and entries: enough for the positions of a
# few hundred consumers keeping up, small beside the ring.
SHARED_READ_BYTES = 16 << 20
SHARED_READ_ENTRIES = 256


def checkpoint_event(checkpoint: Checkpoint, *, timestamp_ns: int = 0,
                     partition_id: int = 0) -> bytes:
    return encode_control(scn=max(checkpoint.window_scn, 0), source_id=CHECKPOINT_SOURCE_ID,
                          payload=checkpoint.dumps().encode(), timestamp_ns=timestamp_ns,
                          partition_id=partition_id)


def heartbeat_event(*, min_scn: int | None, max_scn: int | None, partition_id: int = 0) -> bytes:
    payload = json.dumps({"min_scn": min_scn, "max_scn": max_scn}).encode()
    return encode_control(scn=max(max_scn or 0, 0), source_id=HEARTBEAT_SOURCE_ID,
                          payload=payload, timestamp_ns=time.time_ns(),
                          partition_id=partition_id)


def error_event(error: DatabusError, *, partition_id: int = 0) -> bytes:
    return encode_control(scn=0, source_id=ERROR_SOURCE_ID,
                          payload=json.dumps(error.to_json()).encode(),
                          partition_id=partition_id)


@dataclass(slots=True)
class SharedRead:
    """A read result as ``SharedReads`` keeps it: ``max_scn`` and ``reached_tail`` say
    what the buffer held when it was made (whether it ends at the newest window);
    ``cp_event`` is the checkpoint event a stream writes after it, encoded once for
    every stream it goes to."""

    result: ReadResult
    max_scn: int | None
    reached_tail: bool
    cp_event: bytes | None = None


def _reached(result: ReadResult, max_scn: int | None) -> bool:
    end = result.checkpoint
    return (end.window_offset == WHOLE_WINDOW and max_scn is not None
            and end.window_scn >= max_scn)


class SharedReads:
    """Recent read results of one buffer, by (filter, position, size limit).

    Reads are synchronous on the event loop, so there is no read in flight to wait for:
    the first consumer to ask reads, the ones after it in the same turn (or later, while
    the entry is valid) get its result."""

    def __init__(self, buffer: EventBuffer, *, max_bytes: int = SHARED_READ_BYTES,
                 max_entries: int = SHARED_READ_ENTRIES) -> None:
        self._buffer = buffer
        self._entries: collections.OrderedDict[tuple[object, ...], SharedRead] = (
            collections.OrderedDict())
        self._bytes = 0
        self._max_bytes = max_bytes
        self._max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def read(self, read: Callable[..., ReadResult], filter_key: object,
             checkpoint: Checkpoint, max_bytes: int) -> ReadResult:
        """``read(checkpoint, max_bytes=...)`` (a ``buffer.read`` with the request's
        filter bound), or its result for an earlier request with the same filter at the
        same position."""
        return self._read(read, filter_key, checkpoint, max_bytes).result

    def stream_read(self, read: Callable[..., ReadResult], filter_key: object,
                    checkpoint: Checkpoint, max_bytes: int) -> SharedRead:
        """As ``read``, with the checkpoint event that follows the result's events in a
        stream (when it has any)."""
        entry = self._read(read, filter_key, checkpoint, max_bytes)
        if entry.result.data and entry.cp_event is None:
            entry.cp_event = checkpoint_event(
                entry.result.checkpoint, timestamp_ns=_last_window_timestamp(entry.result),
                partition_id=self._buffer.partition_id)
        return entry

    def _read(self, read: Callable[..., ReadResult], filter_key: object,
              checkpoint: Checkpoint, max_bytes: int) -> SharedRead:
        state = self._buffer.state()
        if checkpoint.window_scn < 0:  # "latest" and "oldest" are relative: never shared
            result = read(checkpoint, max_bytes=max_bytes)
            return SharedRead(result, state.max_scn, _reached(result, state.max_scn))
        key = (filter_key, checkpoint.window_scn, checkpoint.window_offset, max_bytes)
        entry = self._entries.get(key)
        if entry is not None:
            servable = (checkpoint.window_scn >= state.prev_scn
                        if checkpoint.window_offset == WHOLE_WINDOW
                        else checkpoint.window_scn > state.prev_scn)
            if servable and (not entry.reached_tail or entry.max_scn == state.max_scn):
                self._entries.move_to_end(key)
                self.hits += 1
                return entry
            self._drop(key)
        self.misses += 1
        result = read(checkpoint, max_bytes=max_bytes)
        entry = SharedRead(result, state.max_scn, _reached(result, state.max_scn))
        if result.data:
            self._entries[key] = entry
            self._bytes += len(result.data)
            while self._entries and (self._bytes > self._max_bytes
                                     or len(self._entries) > self._max_entries):
                self._drop(next(iter(self._entries)))
        return entry

    def _drop(self, key: tuple[object, ...]) -> None:
        entry = self._entries.pop(key)
        self._bytes -= len(entry.result.data)


class Wakeups(Protocol):
    """When a buffer's next window lands (``relay._server.WindowNotifier``)."""

    @property
    def token(self) -> asyncio.Future[None]:
        """Done once a window lands after this call."""

    async def wait(self, timeout: float, token: asyncio.Future[None] | None = None) -> None:
        """Until ``token`` (default: the current one) is done, or ``timeout`` seconds."""


class StreamEnd(Exception):
    """Internal: the consumer went away or stopped reading; the stream ends."""


@dataclass(slots=True)
class Follow:
    """One streaming subscription: where it is and how it reads.

    ``read(position, max_bytes)`` reads the buffer with the request's filter (through
    ``SharedReads.stream_read``); ``on_write(checkpoint, events, nbytes)`` is told of
    each write; ``alive()`` says whether windows can still come (None) or why not: a
    stream with nothing to write then ends with that error in-band rather than wait
    and send heartbeats (relay/_liveness.py)."""

    request: web.Request
    response: web.StreamResponse
    buffer: EventBuffer
    read: Callable[[Checkpoint, int], SharedRead]
    position: Checkpoint
    max_bytes: int
    heartbeat_s: float
    on_write: Callable[[Checkpoint, int, int], None]
    alive: Callable[[], DatabusError | None] = lambda: None

    async def run(self, wakeups: Wakeups, closing: asyncio.Event) -> None:
        """Write until the consumer goes away, falls off the buffer or the server
        closes."""
        request, buffer = self.request, self.buffer
        serving = request.app.get(SERVING)
        budget = serving.budget if serving is not None else None
        timeout = serving.limits.write_timeout_s if serving is not None else 30.0
        partition = buffer.partition_id
        idle_since = time.monotonic()
        try:
            while not closing.is_set():
                # Taken before the read: a window that lands from here on wakes us even
                # if it lands while we write (we then do not read again to find out).
                token = wakeups.token
                # Beyond STREAM_FLOOR a write's bytes come from the server-wide stream
                # budget, taken for this write only: streams parked at the tail hold none.
                limit, reserved = (budget.acquire(self.max_bytes) if budget is not None
                                   else (self.max_bytes, 0))
                try:
                    try:
                        got = self.read(self.position, limit)
                        if got.result.pending_event_size is not None and not got.result.data:
                            # One event larger than the write size: that event alone.
                            got = self.read(self.position, got.result.pending_event_size)
                    except (ScnNotFoundError, BufferCorruptedError) as exc:
                        await self._write([error_event(exc, partition_id=partition)], timeout)
                        return
                    result = got.result
                    if result.data:
                        assert got.cp_event is not None
                        await self._write([result.data, got.cp_event], timeout)
                        self.position = result.checkpoint
                        self.on_write(result.checkpoint, result.events, len(result.data))
                        idle_since = time.monotonic()
                        if not got.reached_tail:
                            # A catch-up writes again at once: let others run first.
                            await asyncio.sleep(0)
                            continue
                finally:
                    if budget is not None:
                        budget.release(reserved)
                if not result.data and result.checkpoint != self.position \
                        and result.checkpoint.window_scn >= 0:
                    # A "latest" position made concrete: tell the consumer at once (a
                    # checkpoint event with no events before it), so that reconnecting
                    # it resumes here and misses nothing that lands meanwhile.
                    self.position = result.checkpoint
                    await self._write([checkpoint_event(self.position,
                                                        partition_id=partition)], timeout)
                    continue
                down = self.alive()
                if down is not None:
                    await self._write([error_event(down, partition_id=partition)], timeout)
                    return
                remaining = self.heartbeat_s - (time.monotonic() - idle_since)
                if remaining <= 0:
                    state = buffer.state()
                    await self._write([heartbeat_event(
                        min_scn=state.min_scn if state.min_scn is not None else state.prev_scn,
                        max_scn=state.max_scn if state.max_scn is not None else state.prev_scn,
                        partition_id=partition)], timeout)
                    idle_since = time.monotonic()
                    continue
                await wakeups.wait(remaining, token)
                transport = request.transport
                if transport is None or transport.is_closing():
                    return
        except StreamEnd:
            return

    async def _write(self, parts: list[bytes], timeout: float) -> None:
        """``parts`` as one HTTP chunk, handed to the transport in pieces of at most
        ``WRITE_PIECE``, each within ``timeout``.

        The chunk framing is written here rather than by aiohttp's writer, which joins
        each piece with its framing into a new ``bytes`` on Python < 3.12.9: so the
        pieces of a shared read go from the one ``bytes`` object to every socket, and
        the kernel takes them without a copy in our process unless the socket is full
        (then the transport keeps the rest of that piece, at most ``WRITE_PIECE``, and
        we wait for it to drain before the next)."""
        request = self.request
        writer = request.writer
        transport = request.transport
        if transport is None or transport.is_closing():
            raise StreamEnd
        send_headers = getattr(writer, "send_headers", None)
        if send_headers is not None:
            send_headers()  # aiohttp holds the headers back to send them with a body
        size = sum(len(p) for p in parts)
        try:
            if size <= WRITE_PIECE:
                # A small write (a stream keeping up: a window or a few) goes out in one
                # send; the join is cheaper than three more system calls.
                transport.write(b"".join((b"%x\r\n" % size, *parts, b"\r\n")))
                if transport.get_write_buffer_size():
                    async with asyncio.timeout(timeout):
                        await writer.drain()
                return
            transport.write(b"%x\r\n" % size)
            for part in parts:
                view = memoryview(part)
                for offset in range(0, len(part), WRITE_PIECE):
                    transport.write(view[offset:offset + WRITE_PIECE])
                    if transport.get_write_buffer_size():
                        async with asyncio.timeout(timeout):
                            await writer.drain()
                    if transport.is_closing():
                        raise StreamEnd
            transport.write(b"\r\n")
        except TimeoutError:
            serving = request.app.get(SERVING)
            if serving is not None:
                serving.rejects.note("write_timeout", request.remote or "?",
                                     f"streaming consumer read nothing for {timeout:g} s; "
                                     "connection cut")
            reset(transport)
            raise StreamEnd from None
        except (ConnectionError, RuntimeError):
            # RuntimeError: a transport closing under us.
            raise StreamEnd from None


_EOW_SIZE = len(encode_eow(scn=0, event_count=0, checksum=0))


def _last_window_timestamp(result: ReadResult) -> int:
    """The commit timestamp of a read's last window, from its EOW (a read of whole
    windows ends with one: markers after it are left for the next read); 0 for a read
    that ends inside a window."""
    data = result.data
    if result.checkpoint.window_offset != WHOLE_WINDOW or len(data) < _EOW_SIZE:
        return 0
    try:
        header = decode_header(data, len(data) - _EOW_SIZE)
    except EventFormatError:
        return 0
    return header.timestamp_ns if header.source_id == EOW_SOURCE_ID else 0
