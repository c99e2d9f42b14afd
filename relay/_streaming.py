"""Streaming subscriptions (``GET /v1/stream?...&follow=true``, DESIGN section 6) and the
reads that consumers at the same position share.

One chunked response per consumer stays open. Its body is events in wire format
(databus.event), written in *writes*::

    write:      [whole events of the windows that landed since the last write,
                 EOWs included (a window's part when it alone exceeds the write size)]
                [CHECKPOINT control event: source id -3, SCN = the checkpoint's window
                 SCN, timestamp = the last window's commit time, value = the checkpoint
                 JSON after the write]
    idle:       [HEARTBEAT control event: source id -5, at most heartbeat_ms apart with
                 nothing new; value = {"min_scn": .., "max_scn": ..} of the buffer]
    at the end: [ERROR control event: source id -4, value = the JSON error body, e.g.
                 {"error": "scn_not_found", "message": .., "min_scn": ..}]; then the
                 response ends. A relay that shuts down ends it without one.

A consumer's position after a checkpoint event is exactly what a polling response with
the same events would have put in ``X-Databus-Checkpoint``: both forms are served by the
same ``EventBuffer.read``. A request that cannot start (bad parameters, a checkpoint
already off the buffer) gets the usual JSON error with its HTTP status; errors met once
the response has started travel in-band.

Flow control is TCP's: a write's events are read in slices (``FIRST_SLICE``, then
``BULK_SLICE`` ones in the server's bulk lane), each written as it is read as one HTTP
chunk, in sends of up to ``STREAM_PIECE`` (the chunk's framing and the checkpoint event
in the sends beside the events: ``chunk_sends``), awaiting the transport whenever its
buffer is over its limit (64 KiB, ``databus._serving``); a consumer that stops reading
stops being read for, and one that reads nothing for ``write_timeout_s`` is cut. What a
stream holds is bounded: one slice (at most ``STREAM_FLOOR`` unless the server-wide
stream budget grants more, given back once the slice is written) plus its transport's
buffer (views of that slice on uvloop; on asyncio's loop before Python 3.12, a copy of
at most one ``WRITE_PIECE`` send beyond its limit).

What a stream with nothing to read costs (issue 27: 2,000 of them beside 50 normal
streams made a normal one's p99 13 times longer): a timer and a heartbeat per interval.
It reads the buffer only once its wake-up token says a window landed; its heartbeats
come after a random 3/4 to all of its interval, so that streams that went idle together
do not all write in the same loop turn; the heartbeat event is encoded once per buffer
(``SharedReads.heartbeat``). The notifier (``WindowNotifier``) wakes a window's waiters
in batches, other connections running between them.

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
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from databus._aiohttp_compat import send_pending_headers
from databus._serving import (
    SERVING,
    WRITE_BUFFER_HIGH,
    WRITE_PIECE,
    ServingState,
    StreamBudget,
    reset,
)
from databus.checkpoint import WHOLE_WINDOW, Checkpoint
from databus.errors import (
    DatabusError,
    EventFormatError,
    ScnNotFoundError,
    SourceQuarantinedError,
)
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
    "WAKE_BATCH",
    "Follow",
    "SharedRead",
    "SharedReads",
    "StreamEnd",
    "Wakeups",
    "WindowNotifier",
    "checkpoint_event",
    "error_event",
    "heartbeat_event",
]

# Bytes a shared-read cache holds per buffer, and entries: enough for the positions of a
# few hundred consumers keeping up, small beside the ring.
SHARED_READ_BYTES = 16 << 20
SHARED_READ_ENTRIES = 256
# A body (a poll's, or a stream's write) is read from the ring in slices: the first at
# once, the rest one slice per event-loop turn in the server's bulk lane
# (databus/_serving.py). One read of 8 MiB held the loop 5-8 ms; 20 clients asking for
# 8 MiB together stalled everyone 40-100 ms.
FIRST_SLICE = 64 * 1024
BULK_SLICE = 1024 * 1024
# While another big body is being built, a request stops once it holds this much: a
# storm of reconnecting 8 MiB clients costs a few MiB of copying each, not 8, and a
# consumer catching up beside others still gets big responses (64 KiB ones halved the
# 10-consumer throughput: benchmarks/README.md, relay_hostile).
SHORT_BODY = 1 << 20
# An idle stream's heartbeat comes after a random share of its interval between this
# and 1: streams that went idle together (2,000 of them woken by one window) would
# otherwise all write their heartbeats in the same loop turn, every interval.
HEARTBEAT_SPREAD = 0.75
# A heartbeat event is encoded once per buffer and reused for this long while the
# buffer's range is unchanged (thousands of idle streams, one encoding).
HEARTBEAT_REUSE_S = 0.05
# A big stream write is handed to the transport in sends of this many bytes of events,
# its framing and checkpoint event in the sends next to them (``chunk_sends``): a bulk
# slice in one send. Sends of 64 KiB, each with its own wait, were most of the relay's
# time per byte beside the kernel's copy (benchmarks/README.md, "After issue 30").
# The transport keeps what the kernel does not take: uvloop's keeps the buffers
# themselves (views of the slice the stream holds anyway), asyncio's copies the rest
# into its own buffer before Python 3.12: there sends stay ``WRITE_PIECE``, which keeps
# a connection's write buffer within the 128 KiB of docs/relay.md's memory bound.
STREAM_PIECE = 1 << 20
STREAM_PIECE_COPYING = WRITE_PIECE
# Parts at most this long (a checkpoint event) join a neighbouring send whole.
SMALL_PART = 4096
# What a stream's consumer must take per ``write_timeout_s`` while the relay waits on
# it, or be cut (``_drain``): from the transport's limit down to its low-water mark.
MIN_TAKEN = WRITE_BUFFER_HIGH - WRITE_BUFFER_HIGH // 4
# A write at most this long is joined with its framing into one ``bytes`` where the
# transport could send the buffers as they are (``_vectored``); ``WRITE_PIECE`` where it
# would join them anyway.
SMALL_JOIN = 16 * 1024

# What a stream's write did (Follow._write_new).
_NOTHING, _WROTE, _MORE, _ENDED = "nothing", "wrote", "more", "ended"


def heartbeat_delay(interval_s: float) -> float:
    """How long an idle stream waits before its next heartbeat: at most ``interval_s``
    (the promise), at least ``HEARTBEAT_SPREAD`` of it."""
    return interval_s * random.uniform(HEARTBEAT_SPREAD, 1.0)


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

    def checkpoint_event(self, partition_id: int) -> bytes:
        """The checkpoint event after this result's events, encoded on first use: a
        stream writes one only after the last slice of a write, so the slices before it
        never pay for the JSON."""
        event = self.cp_event
        if event is None:
            result = self.result
            event = self.cp_event = checkpoint_event(
                result.checkpoint, timestamp_ns=_last_window_timestamp(result),
                partition_id=partition_id)
        return event


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
        self._beat: tuple[float, int | None, int | None, bytes] | None = None

    def heartbeat(self) -> bytes:
        """The buffer's heartbeat event now: encoded once for all its idle streams, again
        when its range moved or after ``HEARTBEAT_REUSE_S``."""
        state = self._buffer.state()
        min_scn = state.min_scn if state.min_scn is not None else state.prev_scn
        max_scn = state.max_scn if state.max_scn is not None else state.prev_scn
        now = time.monotonic()
        beat = self._beat
        if beat is None or beat[1] != min_scn or beat[2] != max_scn \
                or now - beat[0] > HEARTBEAT_REUSE_S:
            beat = (now, min_scn, max_scn, heartbeat_event(
                min_scn=min_scn, max_scn=max_scn, partition_id=self._buffer.partition_id))
            self._beat = beat
        return beat[3]

    def read(self, read: Callable[..., ReadResult], filter_key: object,
             checkpoint: Checkpoint, max_bytes: int) -> ReadResult:
        """``read(checkpoint, max_bytes=...)`` (a ``buffer.read`` with the request's
        filter bound), or its result for an earlier request with the same filter at the
        same position."""
        return self._read(read, filter_key, checkpoint, max_bytes).result

    def stream_read(self, read: Callable[..., ReadResult], filter_key: object,
                    checkpoint: Checkpoint, max_bytes: int) -> SharedRead:
        """As ``read``, as the entry that also gives the checkpoint event that follows
        the result's events in a stream (``SharedRead.checkpoint_event``, encoded once
        for every stream it goes to)."""
        return self._read(read, filter_key, checkpoint, max_bytes)

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
    """When a buffer's next window lands (``WindowNotifier``)."""

    @property
    def token(self) -> asyncio.Future[None]:
        """Done once a window lands after this call."""

    async def wait(self, timeout: float, token: asyncio.Future[None] | None = None) -> None:
        """Until ``token`` (default: the current one) is done, or ``timeout`` seconds."""


# Waiters a notifier wakes per event-loop turn: 2,000 streams parked on one buffer, all
# woken by its window in one turn, held the loop for all of their writes (tens of ms)
# before anything else ran.
WAKE_BATCH = 64


class WindowNotifier:
    """Wakes long-polls and streams of one buffer when a window lands (called from the
    writer thread; coalesces so a fast writer schedules at most one wake-up per loop
    turn).

    Waiters wait on the current *token* (a future done once a window lands) but are
    kept apart from it, in a set of their own: a waiter that times out leaves in O(1)
    (removing a done-callback from a future is linear in its callbacks, and thousands
    of idle streams each left one per heartbeat), and the waiters of a window are woken
    ``WAKE_BATCH`` per loop turn, so that other connections run between the batches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[None] = loop.create_future()
        self._scheduled = False
        # Waiters on the current token, in arrival order (a dict as an ordered set).
        self._waiters: dict[asyncio.Future[None], None] = {}

    def on_window(self, scn: int) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._scheduled = False
        if not self._future.done():
            self._future.set_result(None)
        self._future = self._loop.create_future()
        self._release(list(self._waiters), 0)
        self._waiters = {}

    def _release(self, waiters: list[asyncio.Future[None]], start: int) -> None:
        end = start + WAKE_BATCH
        for waiter in waiters[start:end]:
            if not waiter.done():
                waiter.set_result(None)
        if end < len(waiters):
            self._loop.call_soon(self._release, waiters, end)

    @property
    def token(self) -> asyncio.Future[None]:
        """Done once a window lands after this call."""
        return self._future

    async def wait(self, timeout: float, token: asyncio.Future[None] | None = None) -> None:
        """Until ``token`` (default: the current one) is done (and this waiter's batch
        woken), or ``timeout`` seconds."""
        fut = self._future if token is None else token
        if fut.done():
            return
        # A token not done is the current one: only _wake replaces it, once done.
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters[waiter] = None
        timer = self._loop.call_later(timeout, _set_once, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.pop(waiter, None)

    def close(self) -> None:
        if not self._future.done():
            self._future.set_result(None)
        self._release(list(self._waiters), 0)
        self._waiters = {}


def _set_once(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class StreamEnd(Exception):
    """Internal: the consumer went away or stopped reading; the stream ends."""


@dataclass(slots=True)
class Follow:
    """One streaming subscription: where it is and how it reads.

    ``read(position, max_bytes)`` reads the buffer with the request's filter (through
    ``SharedReads.stream_read``); ``on_write(checkpoint, events, nbytes)`` is told of
    each write; ``heartbeat()`` is the heartbeat event to write now (shared by the
    buffer's streams, ``SharedReads.heartbeat``); ``alive()`` says whether windows can
    still come (None) or why not: a stream with nothing to write then ends with that
    error in-band rather than wait and send heartbeats (relay/_liveness.py)."""

    request: web.Request
    response: web.StreamResponse
    buffer: EventBuffer
    read: Callable[[Checkpoint, int], SharedRead]
    position: Checkpoint
    max_bytes: int
    heartbeat_s: float
    on_write: Callable[[Checkpoint, int, int], None]
    heartbeat: Callable[[], bytes]
    alive: Callable[[], DatabusError | None] = lambda: None

    async def run(self, wakeups: Wakeups, closing: asyncio.Event) -> None:
        """Write until the consumer goes away, falls off the buffer or the server
        closes.

        The buffer is read only when a window may have landed since the last read (the
        wake-up token says so): a stream parked at the tail costs a timer and a
        heartbeat per interval, no read."""
        serving = self.request.app.get(SERVING)
        timeout = serving.limits.write_timeout_s if serving is not None else 30.0
        lane = serving.bulk if serving is not None else asyncio.Lock()
        idle_since = time.monotonic()
        beat_after = heartbeat_delay(self.heartbeat_s)
        fresh = True  # read: a window may have landed since the last read
        try:
            while not closing.is_set():
                # Taken before the read: a window that lands from here on wakes us even
                # if it lands while we write (we then do not read again to find out).
                token = wakeups.token
                if fresh:
                    outcome = await self._write_new(serving, lane, timeout)
                    if outcome is _ENDED:
                        return
                    if outcome is not _NOTHING:
                        idle_since = time.monotonic()
                        beat_after = heartbeat_delay(self.heartbeat_s)
                    if outcome is _MORE:
                        # A catch-up writes again at once: let others run first.
                        await asyncio.sleep(0)
                        continue
                down = self.alive()
                if down is not None:
                    await self._write([error_event(down, partition_id=self.buffer.partition_id)],
                                      timeout)
                    return
                remaining = beat_after - (time.monotonic() - idle_since)
                if remaining <= 0:
                    await self._write([self.heartbeat()], timeout)
                    idle_since = time.monotonic()
                    beat_after = heartbeat_delay(self.heartbeat_s)
                    fresh = token.done()
                    continue
                await wakeups.wait(remaining, token)
                fresh = token.done()
                transport = self.request.transport
                if transport is None or transport.is_closing():
                    return
        except StreamEnd:
            return

    async def _write_new(self, serving: ServingState | None, lane: asyncio.Lock,
                         timeout: float) -> str:
        """One write of what landed after ``position``: its events read in slices and
        each slice written as it is read, then the checkpoint event. ``_MORE`` when it
        did not reach the buffer's newest window, ``_WROTE`` when it did, ``_NOTHING``
        when there was nothing new, ``_ENDED`` after an in-band error.

        The slices are those of a poll (``FIRST_SLICE`` at once, which is all a stream
        keeping up needs, then ``BULK_SLICE`` ones in the server's bulk lane, one per
        loop turn, each beyond ``STREAM_FLOOR`` with its share of the stream budget
        taken while it is written). So a write's events and checkpoint are what a poll
        with the same ``max_bytes`` would answer, a stream catching up (or asking for
        8 MiB and never reading) holds one slice at a time, never ``max_bytes``, and
        never holds the event loop for more than one slice's read."""
        budget = serving.budget if serving is not None else None
        partition = self.buffer.partition_id
        position = self.position
        written = events = 0
        last: SharedRead | None = None
        step = BULK_SLICE
        final = False
        while True:
            room = self.max_bytes - written
            reserved = 0
            try:
                try:
                    if last is None:
                        got = self.read(position, min(room, FIRST_SLICE))
                    elif room <= 0 or (written >= SHORT_BODY and lane.locked()):
                        break  # full, or another big write is being built: end here
                    else:
                        got, reserved = await self._bulk_read(position, min(step, room),
                                                               budget, lane)
                    pending = got.result.pending_event_size
                    if pending is not None and not got.result.data:
                        if last is not None and pending > room:
                            break  # that event starts the next write
                        # One event larger than the slice (or than the write size: that
                        # event alone, as a poll would answer it).
                        if budget is not None:
                            budget.release(reserved)
                            reserved = 0
                        got, reserved = await self._bulk_read(position, pending, budget,
                                                              lane, exact=True)
                except (ScnNotFoundError, BufferCorruptedError, SourceQuarantinedError) as exc:
                    # A quarantined source the subscription includes (relay/quarantine/_read.py)
                    # ends it like these: in-band, after the windows before its SCN.
                    if last is not None:
                        break  # end this write where it stands; the next one meets it
                    await self._write([error_event(exc, partition_id=partition)], timeout)
                    return _ENDED
                result = got.result
                if not result.data:
                    if last is None:
                        return await self._concrete(result.checkpoint, timeout)
                    break
                # The last slice of this write, known before it is sent: its chunk
                # carries the checkpoint event (no chunk and send of its own after it).
                # A slice that brings the write to SHORT_BODY while another big body
                # is being built ends it, as the check at the top would.
                final = (got.reached_tail or len(result.data) >= room
                         or (written + len(result.data) >= SHORT_BODY and lane.locked()))
                await self._write([result.data, got.checkpoint_event(partition)] if final
                                  else [result.data], timeout)
            finally:
                if budget is not None:
                    budget.release(reserved)
            # A slice that started and ended inside one window: the next one scans that
            # window from its start again, so grow the slice (linear, not quadratic).
            same_window = (position.window_offset != WHOLE_WINDOW
                           and result.checkpoint.window_scn == position.window_scn)
            step = min(2 * step, self.max_bytes) if same_window else BULK_SLICE
            written += len(result.data)
            events += result.events
            position, last = result.checkpoint, got
            if final:
                break
        if last is None:
            return _NOTHING
        if not final:
            await self._write([last.checkpoint_event(partition)], timeout)
        self.position = position
        self.on_write(position, events, written)
        return _WROTE if last.reached_tail else _MORE

    async def _bulk_read(self, position: Checkpoint, want: int, budget: StreamBudget | None,
                         lane: asyncio.Lock, *, exact: bool = False) -> tuple[SharedRead, int]:
        """A slice of up to ``want`` bytes beyond the first, in the bulk lane: (the read,
        the budget reserved for it, to give back once it is written). Short of budget,
        fewer bytes (at least ``STREAM_FLOOR``), unless ``exact`` (one event that must
        go whole)."""
        limit, reserved = (budget.acquire(want) if budget is not None else (want, 0))
        try:
            async with lane:
                got = self.read(position, want if exact else limit)
                # Hold the lane through one loop turn: one bulk slice per turn, server-wide.
                await asyncio.sleep(0)
        except BaseException:
            if budget is not None:
                budget.release(reserved)
            raise
        return got, reserved

    async def _concrete(self, end: Checkpoint, timeout: float) -> str:
        """Nothing new after ``position``. A "latest" position made concrete: tell the
        consumer at once (a checkpoint event with no events before it), so that
        reconnecting it resumes here and misses nothing that lands meanwhile."""
        if end == self.position or end.window_scn < 0:
            return _NOTHING
        self.position = end
        await self._write([checkpoint_event(end, partition_id=self.buffer.partition_id)],
                          timeout)
        return _WROTE

    async def _write(self, parts: list[bytes], timeout: float) -> None:
        """``parts`` as one HTTP chunk, handed to the transport in sends of at most
        about ``STREAM_PIECE`` bytes (``STREAM_PIECE_COPYING`` where the transport
        copies what the kernel does not take), waiting for the transport to drain
        whenever its buffer is over its limit (``_drain``: the consumer must take
        ``MIN_TAKEN`` bytes every ``timeout`` seconds).

        The chunk framing is written here rather than by aiohttp's writer, which joins
        each piece with its framing into a new ``bytes`` on Python < 3.12.9: so the
        pieces of a shared read go from the one ``bytes`` object to every socket, and
        the kernel takes them without a copy in our process unless the socket is full
        (then the transport keeps the rest: at most one send and its buffer limit
        beyond the slice the stream holds anyway). The framing and the checkpoint event
        ride in the same send as the events next to them (``chunk_sends``): one system
        call, one segment on the wire, where they were sends of their own."""
        request = self.request
        writer = request.writer
        transport = request.transport
        if transport is None or transport.is_closing():
            raise StreamEnd
        send_pending_headers(writer)  # aiohttp holds them back to send with a body
        size = 0
        for part in parts:
            size += len(part)
        try:
            vectored = _vectored(transport)
            if size <= (SMALL_JOIN if vectored else WRITE_PIECE):
                # A small write (a stream keeping up: a window or a few) goes out in one
                # send; the join is cheaper than more system calls (and, for a few KiB,
                # than a send of several buffers).
                transport.write(b"".join((b"%x\r\n" % size, *parts, b"\r\n")))
                if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
                    await _drain(writer, transport, timeout)
                return
            piece = STREAM_PIECE if vectored else STREAM_PIECE_COPYING
            for send in chunk_sends(parts, size, piece):
                if len(send) == 1:
                    transport.write(send[0])
                elif vectored:
                    transport.writelines(send)
                else:
                    # A join would copy the big piece: send it apart from the framing.
                    for buf in send:
                        transport.write(buf)
                if transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
                    await _drain(writer, transport, timeout)
                if transport.is_closing():
                    raise StreamEnd
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


async def _drain(writer: AbstractStreamWriter, transport: asyncio.Transport,
                 timeout: float) -> None:
    """Until the transport's buffer is back under its limit (the protocol resumed).
    ``TimeoutError`` once the consumer took less than ``MIN_TAKEN`` bytes in ``timeout``
    seconds: what a wait on one 64 KiB piece asked of it (from over the transport's
    limit to under its low-water mark, a quarter of it), whatever the size of the sends
    now. A send can be a whole slice, which a slow consumer that does read may take
    longer than ``timeout`` to take, and is not cut for; a trickle is, as before.

    The drain runs as a task of its own that a timeout does not cancel: aiohttp's
    protocol keeps one waiter for all drains, and a drain cancelled by a timeout leaves
    it cancelled (the next drain of the connection would raise ``CancelledError``)."""
    drained = asyncio.ensure_future(writer.drain())
    try:
        while True:
            before = transport.get_write_buffer_size()
            done, _ = await asyncio.wait((drained,), timeout=timeout)
            if done:
                drained.result()  # ConnectionError: the consumer went away
                return
            if transport.is_closing() or \
                    before - transport.get_write_buffer_size() < MIN_TAKEN:
                raise TimeoutError
    finally:
        if not drained.done():
            drained.cancel()


def chunk_sends(parts: list[bytes], size: int, piece: int) -> list[list[bytes | memoryview]]:
    """One HTTP chunk of ``parts`` (``size`` bytes in all) as the buffers of each send:
    the size line, the parts, the closing CRLF, cut into sends of ``piece`` bytes of
    the parts; the framing and parts shorter than ``SMALL_PART`` (a checkpoint event)
    join the send next to them instead of making one of their own. Nothing is copied:
    the buffers are the parts themselves or views of them. Concatenated, the sends are
    exactly ``b"%x\r\n" % size + b"".join(parts) + b"\r\n"``."""
    sends: list[list[bytes | memoryview]] = []
    send: list[bytes | memoryview] = [b"%x\r\n" % size]
    room = piece
    for part in parts:
        n = len(part)
        if n <= SMALL_PART:
            send.append(part)
            room -= n
            continue
        view = memoryview(part)
        offset = 0
        while offset < n:
            if room <= 0:
                sends.append(send)
                send = []
                room = piece
            take = min(room, n - offset)
            send.append(part if take == n else view[offset:offset + take])
            offset += take
            room -= take
    send.append(b"\r\n")
    sends.append(send)
    return sends


def _vectored(transport: asyncio.BaseTransport) -> bool:
    """Whether ``transport.writelines`` sends its buffers in one system call without
    joining them: uvloop's transports do (a writev); asyncio's join them into a new
    ``bytes`` before Python 3.12."""
    kind = type(transport)
    known = _VECTORED.get(kind)
    if known is None:
        known = _VECTORED[kind] = (kind.__module__.startswith("uvloop")
                                   or sys.version_info >= (3, 12))
    return known


_VECTORED: dict[type, bool] = {}


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
