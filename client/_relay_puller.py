"""Pulling from relays: long-polls over persistent connections, failover, schemas.

One ``RelayPuller`` per client. Failover and backoff (``_failover.py``): it starts at a
random relay and, on a connection error, a 5xx or a body that fails its checks, moves to
the next relay round-robin. Checkpoints are portable across relays, and source ids are
not: the puller keeps each relay's own name <-> id map (from ``/v1/sources``) and hands
it out with every body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from databus._limited_log import limited
from databus.batch import Scan
from databus.checkpoint import Checkpoint
from databus.client._answers import check_relay_answer
from databus.client._failover import FailoverPuller
from databus.client._headers import bad_answer, header_int, parse_stream_headers, read_body
from databus.client._relay_stream import StreamFrame, StreamFramer
from databus.errors import ConnectionLostError, DatabusError, EventFormatError, ScnNotFoundError
from databus.security import is_pattern

log = logging.getLogger("databus.client")

# How often a streaming relay sends a heartbeat when idle, and how many may be missed
# before the client counts the relay as gone and fails over.
STREAM_HEARTBEAT_MS = 1000
STREAM_MISSED_HEARTBEATS = 5
# How long a relay that did not stream is long-polled before it is asked again.
POLL_FOR_S = 600.0


class FellOffRelay(DatabusError):
    """The consumer's checkpoint is older than anything the relays hold."""

    code = "fell_off_relay"

    def __init__(self, scn: int, min_scn: int | None) -> None:
        super().__init__(
            f"checkpoint SCN {scn} is no longer held by the relay (its oldest window is "
            f"{min_scn}): the changes in between are gone from the relay. Configure a "
            "bootstrap service (DatabusClient(bootstrap=[...])) to catch up from a "
            "snapshot, or, if losing those changes is acceptable, delete the checkpoint "
            "to start again from the relay's oldest window."
        )
        self.scn = scn
        self.min_scn = min_scn


class RelayError(DatabusError):
    """A relay answered with a JSON error the client cannot retry."""

    code = "relay_error"


class StreamStalledError(ConnectionLostError):
    """A streaming relay sent no whole frame (a write or a heartbeat) within the missed-
    heartbeat allowance: the connection is as good as dead, whatever bytes trickle."""

    code = "stream_stalled"


@dataclass(frozen=True, slots=True)
class Batch:
    """One stream response, checked (``databus.client._answers``): ``scan`` is its
    body's scan (None for an empty body), for the reader to use instead of its own."""

    body: bytes
    checkpoint: Checkpoint
    max_scn: int | None
    relay: str
    source_names: dict[int, str]
    pending_event_size: int | None
    scan: Scan | None = None


class RelayPuller(FailoverPuller):
    service = "relay"
    error_class = RelayError

    def __init__(
        self,
        relays: Sequence[str],
        sources: Sequence[str],
        session: aiohttp.ClientSession,
        *,
        filter_json: str | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        request_timeout: float = 30.0,
        rng: random.Random | None = None,
        streaming: bool = True,
        heartbeat_ms: int = STREAM_HEARTBEAT_MS,
        prefer_first: bool = False,
        allow_empty: bool = False,
    ) -> None:
        super().__init__(relays, sources, session, filter_json=filter_json,
                         backoff_initial=backoff_initial, backoff_max=backoff_max,
                         request_timeout=request_timeout, rng=rng, prefer_first=prefer_first,
                         allow_empty=allow_empty)
        self.buffer_sources: dict[str, set[str]] = {}
        self.restricted = False  # the relay hides sources from this reader (DESIGN 18)
        self.streaming = streaming
        self.heartbeat_ms = heartbeat_ms
        # Relay -> until when it is long-polled (monotonic): it answered a follow=true
        # request with a polling response (an older relay, which ignores the parameter)
        # or its stream delivered nothing. Asked to stream again after POLL_FOR_S: a
        # relay may have been upgraded, a proxy reconfigured.
        self.polling_relays: dict[str, float] = {}
        self._stream: _OpenStream | None = None

    @property
    def relay(self) -> str:
        return self.url

    def json_error(self, status: int, body: object) -> DatabusError:
        error = super().json_error(status, body)
        if status == 410 and not isinstance(error, ScnNotFoundError):
            return ScnNotFoundError(error.message)  # a relay's 410 is always a fall-off
        return error

    async def catalog(self) -> dict[int, str]:
        """The current relay's source id -> name map (fetched once per relay)."""
        return await self._retrying(self._catalog)

    async def sees_whole_windows(self, sources: Sequence[str]) -> bool:
        """Whether reading ``sources`` (all of them when empty) gets every event of each
        window, so that EOW counts and checksums can be checked: they must hold every
        source of a buffer they read from. Reads the current relay's catalog."""
        await self.catalog()
        if self.restricted:
            return False  # its grant hides sources: windows may lack their events
        if not sources:
            return True
        wanted = set(sources)
        return any(wanted >= names for names in self.buffer_sources.values()
                   if names & wanted)

    async def _catalog(self, relay: str) -> dict[int, str]:
        names = self._catalogs.get(relay)
        if names is None:
            names = await self._load_catalog(relay)
        return names

    async def _load_catalog(self, relay: str) -> dict[int, str]:
        doc = await self._get_json(f"{relay}/v1/sources")
        entries = doc["sources"] if isinstance(doc, dict) else []
        names = {int(e["id"]): str(e["name"]) for e in entries}
        by_buffer: dict[str, set[str]] = {}
        for e in entries:
            by_buffer.setdefault(str(e.get("buffer", "")), set()).add(str(e["name"]))
        self.buffer_sources = by_buffer
        # A reader not granted every source (DESIGN 18) gets windows without the
        # events it may not see: EOW counts and checksums cannot be checked.
        self.restricted = isinstance(doc, dict) and doc.get("restricted") is True
        # A relay lists a configured source before its table exists, as "pending"
        # (relays without the field list only existing ones).
        listed = {str(e["name"]): str(e.get("state", "active")) for e in entries}
        states = {}
        for name in self.sources:
            if is_pattern(name):
                continue  # db.* or *: whichever tables match, now or later
            if name not in listed:
                # Not listed: configured by a pattern (tables=db.*) and not created yet,
                # or not configured at all: the relay's stream answer tells which.
                await self._probe(relay, name)
            # "quarantined" (DESIGN 17): its stream stops at the quarantine SCN.
            state = listed.get(name)
            states[name] = state if state in ("active", "quarantined") else "pending"
        self.note_source_states(relay, states)
        self._catalogs[relay] = names
        return names

    async def _probe(self, relay: str, name: str) -> None:
        """An empty stream request for ``name``: 200 when the relay's configuration names
        it, ``UnknownSourceError`` (fatal) when it does not."""
        params = {"sources": name, "checkpoint": Checkpoint.latest().dumps(),
                  "max_bytes": "1", "wait_ms": "0"}
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with self.session.get(f"{relay}/v1/stream", params=params,
                                    timeout=timeout) as resp:
            await self._check(resp)
            await resp.read()
            # Why the relay waits for it (DESIGN 17): no such table yet (with a
            # did-you-mean), or not visible to the relay's user.
            note = resp.headers.get("X-Databus-Waiting", "")
            if note:
                self.waiting_notes[name] = note.partition(": ")[2] or note

    async def fetch(self, position: Checkpoint, *, max_bytes: int, wait_ms: int) -> Batch:
        """One stream request, retried across relays until one answers."""
        params = {**self.stream_params(position, max_bytes), "wait_ms": str(wait_ms)}
        timeout = aiohttp.ClientTimeout(total=self.request_timeout + wait_ms / 1000)

        async def attempt(relay: str) -> Batch:
            names = await self._catalog(relay)
            async with self.session.get(
                f"{relay}/v1/stream", params=params, timeout=timeout
            ) as resp:
                await self._check(resp)
                body = await read_body(resp, max_bytes, relay)
                headers = resp.headers
            if self.pending_sources:
                # Read after the body, so the names cover the ids of every event in it
                # (a table created meanwhile may have got its id just now).
                names = await self._load_catalog(relay)
            return _answer(position, body, headers, relay, names, max_bytes)

        try:
            return await self._retrying(attempt)
        except ScnNotFoundError as exc:
            raise FellOffRelay(position.window_scn, exc.min_scn) from None


    # -- streaming subscriptions ---------------------------------------------------------

    @property
    def streaming_now(self) -> bool:
        """Is the current position being followed through an open stream?"""
        return self._stream is not None

    async def next_batch(self, position: Checkpoint, *, max_bytes: int, wait_ms: int,
                         stream_bytes: int | None = None) -> Batch:
        """The next batch after ``position``: the next write of a streaming subscription
        to the current relay (opened, or opened again when ``position`` is not where
        the open one is), or one long poll when the relay does not stream.

        How the client knows a relay streams: it asks with ``follow=true`` and a relay
        that streams answers with ``X-Databus-Streaming: 1``; an older relay ignores
        the parameter and answers a poll (``wait_ms`` is sent too), which is used as
        such, and that relay is long-polled from then on.

        ``max_bytes`` bounds a poll; a stream's writes are bounded by ``stream_bytes``
        (default ``max_bytes``) for as long as it stays open: the caller reads the next
        write only when it has room, so a write may exceed what is free by one write."""
        while True:
            await self.wait_for_urls()  # an empty list (discovery): wait for a relay
            if not self.streaming or self._polled(self.url):
                await self.close_stream()
                return await self.fetch(position, max_bytes=max_bytes, wait_ms=wait_ms)
            stream = self._stream
            if stream is not None and (stream.position != position or stream.relay != self.url):
                await self.close_stream()
                stream = None
            try:
                if stream is None:
                    opened = await self._open_stream(position, stream_bytes or max_bytes,
                                                     wait_ms)
                    if isinstance(opened, Batch):
                        return opened  # a polling relay's answer
                    stream = self._stream = opened
                batch = await stream.next()
            except ScnNotFoundError as exc:
                await self.close_stream()
                raise FellOffRelay(position.window_scn, exc.min_scn) from None
            except DatabusError as exc:
                await self.close_stream()
                if not exc.retriable and not isinstance(exc, EventFormatError):
                    raise
                await self.failed(exc)
                continue
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                if isinstance(exc, TimeoutError) and (stream is None or not stream.frames_seen):
                    # A streaming relay sends a heartbeat within heartbeat_ms: nothing
                    # at all means something in between holds the response back (a
                    # proxy that buffers whole bodies). Long polls work through it.
                    limited(log).warning("relay %s: a streaming response delivered nothing in %.0f "
                                         "s (a buffering proxy?); long-polling it", self.url,
                                         self.heartbeat_ms * STREAM_MISSED_HEARTBEATS / 1000)
                    self._poll_for_a_while(self.url)
                await self.close_stream()
                await self.failed(exc)
                continue
            self.served()  # a relay's write or heartbeat: no quarantine stops it now
            stream.position = batch.checkpoint
            return batch

    def _poll_for_a_while(self, relay: str) -> None:
        self.polling_relays[relay] = time.monotonic() + POLL_FOR_S

    def _polled(self, relay: str) -> bool:
        until = self.polling_relays.get(relay)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self.polling_relays[relay]
        return False

    async def close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    async def _open_stream(self, position: Checkpoint, max_bytes: int,
                           wait_ms: int) -> _OpenStream | Batch:
        relay = self.url
        names = await self._catalog(relay)
        params = {**self.stream_params(position, max_bytes), "wait_ms": str(wait_ms),
                  "follow": "true", "heartbeat_ms": str(self.heartbeat_ms)}
        silence = self.heartbeat_ms * STREAM_MISSED_HEARTBEATS / 1000
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.request_timeout,
                                        sock_read=max(silence, wait_ms / 1000) + 1.0)
        resp = await self.session.get(f"{relay}/v1/stream", params=params, timeout=timeout)
        try:
            await self._check(resp)
            if resp.headers.get("X-Databus-Streaming") != "1":
                body = await read_body(resp, max_bytes, relay)
                if relay not in self.polling_relays:
                    log.info("relay %s does not offer streaming subscriptions; "
                             "long-polling it", relay)
                self._poll_for_a_while(relay)
                if self.pending_sources:
                    names = await self._load_catalog(relay)
                return _answer(position, body, resp.headers, relay, names, max_bytes)
        except BaseException:
            resp.release()
            raise
        try:  # where the buffer stood; informational (heartbeats bring it up to date)
            max_scn = header_int(resp.headers, "X-Databus-Max-Scn")
        except ValueError:
            max_scn = None
        return _OpenStream(self, relay, resp, position, names, max_scn, max_bytes, silence)


def _answer(position: Checkpoint, body: bytes, headers: Mapping[str, str], relay: str,
            names: dict[int, str], max_bytes: int) -> Batch:
    """A polling response as a checked ``Batch``."""
    checkpoint, max_scn, pending = parse_stream_headers(headers, relay)
    found = check_relay_answer(position, body, checkpoint, relay=relay, limit=max_bytes)
    return Batch(body, checkpoint, max_scn, relay, names, pending, found)


class _OpenStream:
    """One open streaming response and its framer."""

    def __init__(self, puller: RelayPuller, relay: str, resp: aiohttp.ClientResponse,
                 position: Checkpoint, names: dict[int, str], max_scn: int | None,
                 limit: int, silence: float) -> None:
        self.puller = puller
        self.relay = relay
        self.resp = resp
        self.position = position  # where the consumer is after the last batch handed out
        self.names = names
        self.max_scn = max_scn
        self.limit = limit
        self.framer = StreamFramer(limit)
        self.frames: list[StreamFrame] = []
        self.frames_seen = 0
        self.bytes_seen = 0
        # A whole frame (write, heartbeat) is due within ``silence`` of when the reader
        # began waiting for it: bytes that never make one do not keep the stream alive.
        self.silence = silence

    async def next(self) -> Batch:
        # Counted from now, not from the previous frame: a consumer that did not read for
        # a while (its buffer full) finds the relay's writes waiting, not a dead stream.
        due = time.monotonic() + self.silence
        while True:
            while self.frames:
                frame = self.frames.pop(0)
                if frame.kind == "error":
                    doc = frame.error or {}
                    status = 410 if doc.get("error") == "scn_not_found" else 503
                    error = self.puller.json_error(status, doc)
                    error.retriable = status != 410
                    raise error
                if frame.kind == "heartbeat":
                    if frame.max_scn is not None:
                        self.max_scn = frame.max_scn
                    if self.puller.pending_sources:
                        # Waiting for a table to be created: learn that it was from the
                        # catalog while idle, as each long poll does.
                        self.names = await self.puller._load_catalog(self.relay)
                    return Batch(b"", self.position, self.max_scn, self.relay, self.names, None)
                assert frame.checkpoint is not None
                found = check_relay_answer(self.position, frame.body, frame.checkpoint,
                                           relay=self.relay, limit=self.limit)
                if frame.checkpoint.window_scn > (self.max_scn or -1):
                    self.max_scn = frame.checkpoint.window_scn
                if self.puller.pending_sources:
                    # Read after the body, so the names cover the ids of every event in
                    # it (a table created meanwhile may have got its id just now).
                    self.names = await self.puller._load_catalog(self.relay)
                return Batch(frame.body, frame.checkpoint, self.max_scn, self.relay,
                             self.names, None, found)
            chunk = await self._read(due)
            if not chunk:
                if self.framer.pending_bytes:
                    raise bad_answer(f"relay {self.relay} ended the stream inside an event")
                raise ConnectionResetError(f"relay {self.relay} ended the stream")
            self.bytes_seen += len(chunk)
            frames = self.framer.feed(chunk)
            if frames:
                due = time.monotonic() + self.silence
            self.frames_seen += len(frames)
            self.frames.extend(frames)

    async def _read(self, due: float) -> bytes:
        """The next bytes, or ``StreamStalledError`` when the next whole frame is not
        complete by ``due`` (docs/client.md, "Streaming subscriptions")."""
        left = due - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            # Not asyncio.wait_for: on Python 3.11 it loses a cancellation that comes as
            # the read completes, and the pull task of a group member whose stream was
            # to end went on reading (a rebalance that never took effect).
            async with asyncio.timeout(left):
                return await self.resp.content.readany()
        except TimeoutError:
            if not self.bytes_seen:
                raise  # nothing at all: the caller's buffering-proxy rule decides
            raise StreamStalledError(
                f"relay {self.relay} sent no whole heartbeat or write in {self.silence:.1f} "
                f"s ({STREAM_MISSED_HEARTBEATS} missed heartbeats), "
                f"{self.framer.pending_bytes} bytes of an unfinished one: reconnecting"
            ) from None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.resp.close()
