"""Who reads from the relay, and how far behind they are (DESIGN section 6, "Consumer
identity"; docs/relay.md, "Consumers").

``ConsumerRegistry`` is pure bookkeeping: no I/O, one lock (``observe`` runs on the event
loop, ``window_landed`` in each buffer's writer thread, ``snapshot`` for
``GET /v1/consumers`` and ``/metrics``), and injectable clocks so that the tests drive
time. The relay keeps no consumer state that serving depends on (the checkpoint travels
with every request): this is observation only, and losing it (a restart, an eviction)
changes nothing a consumer gets.

One entry per (client id, buffer): a consumer reading two buffers under one id has two
positions, and lag only means something against one buffer's newest window.

Lag in ms is the time the oldest window the consumer has not been served yet has been
waiting in the relay. Per buffer the registry keeps a bounded record of when windows
landed: windows landing within ``LANDING_RESOLUTION_S`` of a record's first window join
that record (so a busy buffer costs one record per 10 ms, not one per window), at most
``LANDING_RECORDS`` records (82 s of landings at any write rate; longer when windows are
rarer). A consumer behind the oldest record gets the age of the newest record dropped: a
lower bound ("at least"), which is what an alert on lag needs.

Lag in seconds (DESIGN 17, the figure to alert on) is now minus the source commit time
of the window at the consumer's checkpoint, 0 when it has the newest window whole. The
commit time is read from the buffer (the window's end-of-window event) through
``window_time``, cached per (buffer, SCN); a checkpoint older than every window held
gets the oldest window's commit time: again a lower bound. Lag in SCN stays, but for a
binlog source it is a byte distance across files (2^32 per file): never alert on it.

A streaming consumer holds a connection: the registry counts its open streams per entry
(``stream_opened``/``stream_closed``), and when the last one closes the entry is dropped
at once (with it its ``/metrics`` series): a consumer that stopped is not listed, and
its lag does not keep growing, for ``expiry_s``. A polling consumer has no connection to
watch: its entry is dropped after ``expiry_s`` without a request. A restarted consumer
with the same client id gets the same (reader, client id, buffer) key: one row.

The ``record_served``/``consumer_id`` glue at the bottom reads a request's identity for
the stream handlers (polling and streaming alike).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from databus._http import BadRequest, client_id_param, query_param, sources_param
from databus.checkpoint import LATEST_SCN, WHOLE_WINDOW, Checkpoint
from databus.security import ANONYMOUS
from databus.security._server import READER

DEFAULT_MAX_CONSUMERS = 1000
DEFAULT_EXPIRY_S = 300.0
# Rates are what was served in the last RATE_WINDOW_S, counted in 1-second buckets:
# bounded per consumer whatever its request (or streamed write) rate.
RATE_WINDOW_S = 10
LANDING_RESOLUTION_S = 0.01
LANDING_RECORDS = 8192
# Commit times looked up in the buffers, per (buffer, SCN): cleared when this full.
_TIME_CACHE = 4096

# (buffer name, window SCN) -> that window's commit time in ns, None when not held.
WindowTime = Callable[[str, int], int | None]


class _Rate:
    """Events and bytes served in the last ``RATE_WINDOW_S`` seconds, in 1-s buckets."""

    __slots__ = ("_bytes", "_events", "_secs")

    def __init__(self) -> None:
        self._secs = [-1] * RATE_WINDOW_S
        self._events = [0] * RATE_WINDOW_S
        self._bytes = [0] * RATE_WINDOW_S

    def add(self, now: float, events: int, nbytes: int) -> None:
        sec = math.floor(now)
        slot = sec % RATE_WINDOW_S
        if self._secs[slot] != sec:  # a bucket of an older lap: start it again
            self._secs[slot], self._events[slot], self._bytes[slot] = sec, 0, 0
        self._events[slot] += events
        self._bytes[slot] += nbytes

    def per_second(self, now: float, since: float) -> tuple[float, float]:
        """(events/s, bytes/s) over the buckets still in the window, divided by the time
        they span: from the oldest bucket's start, or from ``since`` (first seen) when
        that is later; at least 1 s, so one big first answer is not an absurd rate."""
        sec = math.floor(now)
        oldest = sec - RATE_WINDOW_S + 1
        events = nbytes = 0
        for slot in range(RATE_WINDOW_S):
            if oldest <= self._secs[slot] <= sec:
                events += self._events[slot]
                nbytes += self._bytes[slot]
        span = max(now - max(float(oldest), since), 1.0)
        return events / span, nbytes / span


class _Landings:
    """When one buffer's windows landed: records (first SCN, last SCN, monotonic time of
    the first), oldest first, in three parallel lists so that a lookup is a bisect.
    The lists are trimmed from the front in batches (``_head``), for amortized O(1)."""

    __slots__ = ("_dropped_at", "_first", "_head", "_last", "_times", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._first: list[int] = []
        self._last: list[int] = []
        self._times: list[float] = []
        self._head = 0
        # When the newest record dropped from the front landed (None: none dropped).
        self._dropped_at: float | None = None

    def add(self, scn: int, now: float) -> None:
        if len(self._last) > self._head:
            if scn <= self._last[-1]:
                # Not newer than what was recorded: SCNs only grow within a running
                # buffer; keep the first landing time (the one a lag is measured from).
                return
            if now - self._times[-1] < LANDING_RESOLUTION_S:
                self._last[-1] = scn
                return
        self._first.append(scn)
        self._last.append(scn)
        self._times.append(now)
        if len(self._last) - self._head > self.limit:
            self._dropped_at = self._times[self._head]
            self._head += 1
            if self._head >= 1024 and self._head * 2 >= len(self._last):
                del self._first[:self._head], self._last[:self._head]
                del self._times[:self._head]
                self._head = 0

    def landed(self, target: int) -> float | None:
        """When the first window with SCN >= ``target`` landed; None when no record has
        one (it is being published right now, or nothing newer exists)."""
        index = bisect.bisect_left(self._last, target, lo=self._head)
        if index == len(self._last):
            return None
        if index == self._head and self._first[index] > target and \
                self._dropped_at is not None:
            # Windows between target and the oldest record may have been in a record
            # dropped since: they landed no later than the newest dropped one.
            return self._dropped_at
        return self._times[index]


@dataclass(slots=True)
class _Consumer:
    client_id: str
    buffer: str
    first_seen: float  # wall clock, for people
    first_seen_at: float  # monotonic, for rates
    last_seen: float = 0.0
    last_seen_at: float = 0.0
    checkpoint_scn: int = 0
    window_offset: int = WHOLE_WINDOW
    events_total: int = 0
    bytes_total: int = 0
    filter_json: str | None = None
    filter_doc: Any = None
    sources: tuple[str, ...] = ()
    address: str | None = None
    streaming: bool = False
    reader: str = ANONYMOUS  # the configured reader it authenticated as (DESIGN 18)
    rate: _Rate = field(default_factory=_Rate)


class ConsumerRegistry:
    """Per (client id, buffer): position, lag, rates, totals; bounded and expiring.

    At most ``max_consumers`` entries (0: nothing is tracked); when full, the least
    recently seen one is evicted (counted in ``evicted_total``). An entry not seen for
    ``expiry_s`` is dropped (not counted as an eviction). ``clock`` is monotonic (idle
    time, rates, landing times), ``wall_clock`` gives first/last seen in unix seconds.
    """

    def __init__(self, max_consumers: int = DEFAULT_MAX_CONSUMERS,
                 expiry_s: float = DEFAULT_EXPIRY_S, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 landing_records: int = LANDING_RECORDS) -> None:
        if max_consumers < 0 or expiry_s <= 0 or landing_records < 1:
            raise ValueError("max_consumers >= 0, expiry_s > 0 and landing_records >= 1")
        self.max_consumers = max_consumers
        self.expiry_s = expiry_s
        self._clock = clock
        self._wall = wall_clock
        self._landing_records = landing_records
        self._lock = threading.Lock()
        # Least recently seen first: eviction and expiry both pop from the front.
        # Keyed by (reader, client id, buffer): a reader cannot move another's entry.
        self._consumers: OrderedDict[tuple[str, str, str], _Consumer] = OrderedDict()
        self._landings: dict[str, _Landings] = {}
        self._times: dict[tuple[str, int], int] = {}
        # Streams open per key (streaming consumers): the entry goes when the last closes.
        self._open: dict[tuple[str, str, str], int] = {}
        self.evicted_total = 0

    def observe(self, client_id: str, *, buffer: str, checkpoint: Checkpoint, events: int,
                nbytes: int, filter_json: str | None, sources: tuple[str, ...],
                address: str | None, streaming: bool, reader: str = ANONYMOUS) -> None:
        """A response (or one streamed write) served ``events`` data events in ``nbytes``
        to ``client_id`` (authenticated as ``reader``) from ``buffer``, ending at
        ``checkpoint``."""
        if self.max_consumers == 0:
            return
        now, wall = self._clock(), self._wall()
        key = (reader, client_id, buffer)
        with self._lock:
            self._expire(now)
            entry = self._consumers.get(key)
            if entry is None:
                while len(self._consumers) >= self.max_consumers:
                    self._consumers.popitem(last=False)
                    self.evicted_total += 1
                entry = _Consumer(client_id, buffer, first_seen=wall, first_seen_at=now,
                                  reader=reader)
                self._consumers[key] = entry
            else:
                self._consumers.move_to_end(key)
            entry.last_seen, entry.last_seen_at = wall, now
            entry.checkpoint_scn = checkpoint.window_scn
            entry.window_offset = checkpoint.window_offset
            entry.events_total += events
            entry.bytes_total += nbytes
            entry.rate.add(now, events, nbytes)
            if filter_json != entry.filter_json:
                entry.filter_json = filter_json
                # Parsed once per change, not per request (the server validated it with
                # the bounded parser; the request line bounds its size to 8 KiB).
                entry.filter_doc = _filter_doc(filter_json)
            entry.sources = sources
            entry.address = address
            entry.streaming = streaming

    def stream_opened(self, client_id: str, *, buffer: str, reader: str = ANONYMOUS
                      ) -> None:
        """A streaming subscription of ``client_id`` to ``buffer`` started."""
        if self.max_consumers == 0:
            return
        key = (reader, client_id, buffer)
        with self._lock:
            self._open[key] = self._open.get(key, 0) + 1

    def stream_closed(self, client_id: str, *, buffer: str, reader: str = ANONYMOUS
                      ) -> None:
        """That subscription ended (the consumer went, or the relay ends it): when it
        was the key's last open stream, the entry is dropped now (not counted as an
        eviction): a streaming consumer is listed while it is connected."""
        if self.max_consumers == 0:
            return
        key = (reader, client_id, buffer)
        with self._lock:
            left = self._open.get(key, 0) - 1
            if left > 0:
                self._open[key] = left
                return
            self._open.pop(key, None)
            self._consumers.pop(key, None)

    def open_streams(self) -> int:
        """Streaming subscriptions open, all consumers together."""
        with self._lock:
            return sum(self._open.values())

    def window_landed(self, buffer: str, scn: int) -> None:
        """Window ``scn`` was published in ``buffer`` (called from its writer thread)."""
        now = self._clock()
        with self._lock:
            landings = self._landings.get(buffer)
            if landings is None:
                landings = self._landings[buffer] = _Landings(self._landing_records)
            landings.add(scn, now)

    def snapshot(self, max_scns: Mapping[str, int | None],
                 window_time: WindowTime | None = None,
                 min_scns: Mapping[str, int | None] | None = None) -> list[dict[str, Any]]:
        """Every tracked consumer (expired ones dropped first), sorted by client id then
        buffer, with lag against ``max_scns`` (each buffer's newest window SCN, None
        when empty; a buffer missing from it counts as empty). ``window_time`` gives a
        window's commit time (``lag_seconds``; without it that is null for a consumer
        behind), ``min_scns`` each buffer's oldest window (for checkpoints older)."""
        now, wall = self._clock(), self._wall()
        with self._lock:
            self._expire(now)
            consumers = list(self._consumers.values())
        out = []
        for c in consumers:
            doc = self._entry_doc(c, max_scns.get(c.buffer), now, wall)
            doc["lag_seconds"] = self._lag_seconds(
                c, max_scns.get(c.buffer), (min_scns or {}).get(c.buffer), window_time)
            out.append(doc)
        out.sort(key=lambda d: (d["client_id"], d["buffer"], d["reader"]))
        return out

    def _lag_seconds(self, c: _Consumer, max_scn: int | None, min_scn: int | None,
                     window_time: WindowTime | None) -> float | None:
        """Now minus the commit time of the window at the checkpoint; 0 when caught up
        (as ``_lag``); None when no commit time can be found (no ``window_time``)."""
        scn, partial = c.checkpoint_scn, c.window_offset != WHOLE_WINDOW
        if max_scn is None or scn == LATEST_SCN or (scn >= max_scn and not partial):
            return 0.0
        if window_time is None:
            return None
        if min_scn is not None and scn < min_scn:
            scn = min_scn  # served nothing yet, or fell off: at least as old as the oldest
        key = (c.buffer, scn)
        with self._lock:
            ts = self._times.get(key)
        if ts is None:
            found = window_time(c.buffer, scn)
            if found is None:
                return None
            ts = found
            with self._lock:
                if len(self._times) >= _TIME_CACHE:
                    self._times.clear()
                self._times[key] = ts
        return round(max(0.0, self._wall() - ts / 1e9), 3)

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._consumers)

    def _expire(self, now: float) -> None:
        """Drop the entries not seen for ``expiry_s``, oldest first. An entry with a
        stream open is a live consumer on a quiet buffer (heartbeats are not served
        events): it stays, and goes when its stream closes."""
        consumers = self._consumers
        kept = []
        while consumers:
            key, oldest = next(iter(consumers.items()))
            if now - oldest.last_seen_at <= self.expiry_s:
                break
            consumers.popitem(last=False)
            if self._open.get(key):
                kept.append((key, oldest))
        for key, entry in reversed(kept):  # back at the front, least recent first
            consumers[key] = entry
            consumers.move_to_end(key, last=False)

    def _entry_doc(self, c: _Consumer, max_scn: int | None, now: float, wall: float
                   ) -> dict[str, Any]:
        lag_scn, lag_ms = self._lag(c, max_scn, now)
        events_rate, bytes_rate = c.rate.per_second(now, c.first_seen_at)
        return {
            "client_id": c.client_id,
            "buffer": c.buffer,
            "reader": c.reader,
            "address": c.address,
            "filter": c.filter_doc,
            "sources": list(c.sources),
            "streaming": c.streaming,
            "checkpoint_scn": c.checkpoint_scn,
            "window_offset": c.window_offset,
            "lag_scn": lag_scn,
            "lag_ms": round(lag_ms, 3),
            "lag_seconds": None,  # filled by snapshot()
            "events_per_second": round(events_rate, 3),
            "bytes_per_second": round(bytes_rate, 3),
            "events_total": c.events_total,
            "bytes_total": c.bytes_total,
            "first_seen": c.first_seen,
            "last_seen": c.last_seen,
            "idle_s": round(max(0.0, now - c.last_seen_at), 3),
        }

    def _lag(self, c: _Consumer, max_scn: int | None, now: float) -> tuple[int, float]:
        """(SCNs, ms) behind ``max_scn``. Caught up (0, 0.0): the newest window served
        whole, or an empty buffer. A partial window counts as not served: its lag in ms
        runs from when it landed (its lag in SCN may be 0 when it is the newest)."""
        scn, partial = c.checkpoint_scn, c.window_offset != WHOLE_WINDOW
        if max_scn is None or scn == LATEST_SCN:
            return 0, 0.0
        # -1 (from the oldest window held) has been served nothing yet.
        scn = max(scn, 0)
        if scn >= max_scn and not partial:
            return 0, 0.0
        lag_scn = max(0, max_scn - scn)
        landings = self._landings.get(c.buffer)
        landed = landings.landed(scn if partial else scn + 1) if landings else None
        # None: the window newer than the checkpoint is being published right now.
        lag_ms = 0.0 if landed is None else max(0.0, (now - landed) * 1000)
        return lag_scn, lag_ms


def _filter_doc(filter_json: str | None) -> Any:
    if not filter_json:
        return None
    try:
        return json.loads(filter_json)
    except ValueError:  # not from a validated request: show it as text, never fail
        return filter_json


# -- the request side (shared by the polling and the streaming stream handlers) --------

CONSUMERS = web.AppKey("consumers", ConsumerRegistry)


def consumer_id(request: web.Request) -> str:
    """The request's ``client_id``, or for a request without one ``anonymous@<ip>``
    (all consumers without an id on one host share that entry). A ``client_id`` over
    256 characters, or given twice, is a ``bad_request``: call this before serving."""
    given = client_id_param(request)
    if given is not None:
        return given
    return f"anonymous@{request.remote or 'unknown'}"


def peer_address(request: web.Request) -> str | None:
    """``ip:port`` of the connection (``[ip]:port`` for IPv6), or the IP alone once the
    connection is gone."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = str(peer[0]), peer[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return request.remote


def record_served(request: web.Request, *, buffer_name: str, checkpoint: Checkpoint,
                  events: int, nbytes: int, streaming: bool) -> None:
    """Tell the app's registry that ``request`` was served ``events``/``nbytes`` of
    ``buffer_name`` up to ``checkpoint`` (after each poll answer, or each streamed
    write). The client id, filter, sources and peer come from the request. Never
    raises for what the request holds: the handler validated it up front
    (``consumer_id``); a request that was not valid is just not recorded."""
    recorder = served_recorder(request, buffer_name=buffer_name, streaming=streaming)
    recorder(checkpoint, events, nbytes)


def served_recorder(request: web.Request, *, buffer_name: str, streaming: bool
                    ) -> Callable[[Checkpoint, int, int], None]:
    """``record_served`` for every write of one request, with what it takes from the
    request (client id, filter, sources, peer) read once: a stream writes once per
    window, and parsing the query again each time was a third of a write's cost."""
    registry = request.app.get(CONSUMERS)
    if registry is None:
        return _record_nothing
    try:
        client_id = consumer_id(request)
        filter_json = query_param(request, "filter") or None
        sources = tuple(sources_param(request))
    except BadRequest:
        return _record_nothing
    address = peer_address(request)
    who = request.get(READER)
    reader = who.name if who is not None else ANONYMOUS

    def record(checkpoint: Checkpoint, events: int, nbytes: int) -> None:
        registry.observe(client_id, buffer=buffer_name, checkpoint=checkpoint, events=events,
                         nbytes=nbytes, filter_json=filter_json, sources=sources,
                         address=address, streaming=streaming, reader=reader)

    return record


def _record_nothing(checkpoint: Checkpoint, events: int, nbytes: int) -> None:
    return None


@contextlib.contextmanager
def stream_presence(request: web.Request, *, buffer_name: str) -> Iterator[None]:
    """While a streaming subscription of ``request`` is open: its consumer's entry
    stays listed, and goes at once when the last of its streams closes."""
    registry = request.app.get(CONSUMERS)
    try:
        client_id = consumer_id(request)
    except BadRequest:
        registry = None
    if registry is None:
        yield
        return
    who = request.get(READER)
    reader = who.name if who is not None else ANONYMOUS
    registry.stream_opened(client_id, buffer=buffer_name, reader=reader)
    try:
        yield
    finally:
        registry.stream_closed(client_id, buffer=buffer_name, reader=reader)
