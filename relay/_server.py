"""The relay's HTTP API (DESIGN section 6), a thin aiohttp shell over the buffers.

Endpoints (all JSON except ``/v1/stream`` and ``/metrics``; errors are always
``{"error": code, "message": ...}``):

- ``GET /v1/sources``; ``GET /v1/schemas/{fingerprint}``; ``GET /v1/schemas?source=NAME``
- ``GET /v1/stream?checkpoint=JSON&sources=a,b&filter=JSON&max_bytes=N&wait_ms=M``
  (``quarantine=pass``: no stop at a quarantined source, relay/quarantine/_read.py)
- ``GET /v1/status``, ``GET /v1/consumers``, ``GET /metrics``, ``GET /healthz``,
  ``GET /readyz``
- ``POST /v1/admin/flush`` (bearer token)
- ``POST /v1/admin/sources/{name}/heal`` (bearer token; relay/quarantine/_api.py)

A stream response carries whole events in wire format and these headers:
``X-Databus-Checkpoint`` (the checkpoint after consuming the body, JSON),
``X-Databus-Min-Scn``/``X-Databus-Max-Scn`` (the buffer's range), and
``X-Databus-Pending-Event-Size`` when the first event did not fit in ``max_bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from databus._event_loop import running_loop_name
from databus._http import (
    STATS,
    BadRequest,
    Forbidden,
    HttpStats,
    admin_body,
    bool_param,
    check_bearer,
    checkpoint_param,
    fp_text,
    int_param,
    json_errors,
    json_response,
    metrics_response,
    parse_fingerprint,
    source_param,
)
from databus._serving import (
    BODY_PIECES,
    SERVING,
    STREAM_GRANT,
    Overloaded,
    ServingLimits,
    install,
)
from databus.batch import CompiledFilter
from databus.checkpoint import WHOLE_WINDOW, Checkpoint, Mode, decide
from databus.errors import (
    DatabusError,
    ScnNotFoundError,
    SourceQuarantinedError,
)
from databus.relay._access import (
    guard_for,
    strip_markers,
    trust_forwarded_cn,
    unrestricted,
)
from databus.relay._buffer import BufferCorruptedError, EventBuffer, ReadResult
from databus.relay._consumers import (
    CONSUMERS,
    ConsumerRegistry,
    consumer_id,
    record_served,
    served_recorder,
    stream_presence,
)
from databus.relay._dump_api import add_dump_routes
from databus.relay._liveness import MainUnavailable
from databus.relay._metrics import relay_metrics
from databus.relay._readiness import components_of, readiness_response
from databus.relay._relay import Relay, RelayReader
from databus.relay._streaming import (
    BULK_SLICE,
    FIRST_SLICE,
    SHORT_BODY,
    Follow,
    SharedRead,
    SharedReads,
)
from databus.relay._streaming import WindowNotifier as WindowNotifier  # relay/_worker.py
from databus.relay._subscription import subscription, waiting_note
from databus.relay.quarantine._api import add_quarantine_routes, quarantine_stop
from databus.relay.quarantine._read import guard
from databus.relay.quarantine._record import Quarantine
from databus.schemas import Schema
from databus.security import (
    CertificateReloader,
    Reader,
    check_operational,
    reader,
    require,
)
from databus.security import install as install_guard

log = logging.getLogger("databus.relay.http")

EVENTS_CONTENT_TYPE = "application/x-databus-events"
DEFAULT_MAX_BYTES = 1 << 20
ABSURD_MAX_BYTES = 1 << 31
DEFAULT_WAIT_MS = 0

# Set on every stream response to a reader not granted every source (DESIGN 18): its
# windows may lack events of sources it may not see (a request naming none is narrowed
# to its grant, and /v1/sources lists only granted ones), so EOW counts and checksums,
# which cover every event of a window, must not be checked against what it gets.
RESTRICTED_HEADER = "X-Databus-Restricted"

RELAY = web.AppKey("relay", Relay)
# The main process's certificate reloader (``[relay.tls]``), shown in /v1/status.
TLS_RELOADER = web.AppKey("tls_reloader", CertificateReloader)
# What the read endpoints use: the relay itself, or a worker process's read-only view
# of its files (relay/_worker.py), which builds its app with ``install_read_side`` too.
READER = web.AppKey("reader", RelayReader)
NOTIFIERS = web.AppKey("notifiers", dict[str, WindowNotifier])
# The app's own Prometheus registry (relay/_metrics.py), never the process-global one.
METRICS = web.AppKey("metrics", CollectorRegistry)
SHARED_READS = web.AppKey("shared_reads", dict[str, SharedReads])
# Set when the server shuts down: streams end (cleanly, at a write boundary) and long
# polls answer, so that shutdown does not wait for them.
CLOSING = web.AppKey("closing", asyncio.Event)
# Can windows still come? None, or why not (a worker whose main process stopped
# answering, a cluster member out of its session: relay/_liveness.py). Asked before
# telling a consumer that nothing is new.
Liveness = Callable[[], DatabusError | None]
LIVENESS: web.AppKey[Liveness] = web.AppKey("liveness")
# A long poll waiting at the tail asks again this often.
IDLE_CHECK_S = 1.0
MIN_HEARTBEAT_MS = 50
MAX_HEARTBEAT_MS = 60_000


# -- handlers -----------------------------------------------------------------------


async def stream(request: web.Request) -> web.StreamResponse:
    who = reader(request)  # 401 before anything else
    relay = request.app[READER]
    cfg = relay.config
    checkpoint = checkpoint_param(request)
    if checkpoint.mode is not Mode.ONLINE:
        # A bootstrap checkpoint's window_scn is where the consumer's bootstrap began,
        # not what it has consumed: serving from it would skip the rest of the bootstrap.
        raise BadRequest(
            f"a {checkpoint.mode.value} checkpoint is for the bootstrap service; "
            "the relay takes online checkpoints"
        )
    max_bytes = min(
        int_param(request, "max_bytes", DEFAULT_MAX_BYTES, 1, ABSURD_MAX_BYTES),
        cfg.max_bytes_cap,
    )
    wait_ms = int_param(request, "wait_ms", DEFAULT_WAIT_MS, 0, cfg.max_wait_ms)
    consumer_id(request)  # a bad client_id is a 400 before any work, for both forms
    follow = bool_param(request, "follow")
    # Clamped like max_bytes, not refused: an interval below the floor would let one
    # client make the relay write hundreds of heartbeats a second.
    heartbeat_ms = min(max(int_param(request, "heartbeat_ms", cfg.stream_heartbeat_ms, 0,
                                     3_600_000), MIN_HEARTBEAT_MS), MAX_HEARTBEAT_MS)
    buffer_name, select, late, _ = subscription(relay, request, who)
    buffer = relay.buffers[buffer_name]
    waiting = waiting_note(relay, buffer_name, late) if late else ""
    # Shared reads are per reader when grants differ: what one may see is not another's.
    filter_key = (request.query.get("sources", ""), request.query.get("filter", ""),
                  "" if unrestricted(who.grant) else who.name)
    quarantine = quarantine_stop(request, relay, buffer_name, who.grant)
    bound = _granted_read(buffer, select, who)
    if follow:
        return await _follow(request, buffer_name, buffer, bound, filter_key, checkpoint,
                             max_bytes, heartbeat_ms, quarantine,
                             restricted=not unrestricted(who.grant))
    notifier = request.app[NOTIFIERS][buffer_name]
    stats = request.app[STATS]
    shared = request.app[SHARED_READS][buffer_name]
    deadline = time.monotonic() + wait_ms / 1000

    def read(position: Checkpoint, *, max_bytes: int) -> ReadResult:
        stop = quarantine()  # asked at each read: a heal lifts it, a failure sets it
        return shared.read(guard(bound, stop), (*filter_key, stop and stop.scn), position,
                           max_bytes)

    closing = request.app[CLOSING]
    alive = request.app[LIVENESS]
    # The first slice at once (all a consumer that keeps up needs); the rest of a big
    # body in the bulk lane, one slice per loop turn (_read_rest).
    first = min(max_bytes, FIRST_SLICE)
    result = read(checkpoint, max_bytes=first)
    if result.wait_after_scn is not None and wait_ms > 0:
        stats.long_polls += 1
        try:
            while result.wait_after_scn is not None:
                # An empty answer after the wait would say "nothing new yet": not when
                # nothing new can come (503 instead: the consumer fails over).
                down = alive()
                if down is not None:
                    raise down
                remaining = deadline - time.monotonic()
                if remaining <= 0 or closing.is_set():
                    break
                token = notifier.token  # taken with no await since the read: no miss
                await notifier.wait(min(remaining, IDLE_CHECK_S), token)
                if not token.done():
                    continue  # no window landed: nothing to read again
                # An empty result's checkpoint is the concrete point to wait after
                # (a "latest" checkpoint is fixed at the first read).
                result = read(result.checkpoint, max_bytes=first)
        finally:
            stats.long_polls -= 1
    pieces, end, events, pending = await _read_rest(read, result, max_bytes, request, buffer)
    state = buffer.state()
    headers = {
        "Content-Type": EVENTS_CONTENT_TYPE,
        "X-Databus-Checkpoint": end.dumps(),
        "X-Databus-Min-Scn": str(state.min_scn if state.min_scn is not None else state.prev_scn),
        "X-Databus-Max-Scn": str(state.max_scn if state.max_scn is not None else state.prev_scn),
        "X-Databus-Buffer": buffer_name,
    }
    if pending is not None:
        headers["X-Databus-Pending-Event-Size"] = str(pending)
    if waiting:
        headers["X-Databus-Waiting"] = waiting
    if not unrestricted(who.grant):
        headers[RESTRICTED_HEADER] = "1"
    size = sum(len(p) for p in pieces)
    stats.bytes_served += size
    stats.events_served += events
    record_served(request, buffer_name=buffer_name, checkpoint=end, events=events,
                  nbytes=size, streaming=False)
    if SERVING not in request.app or len(pieces) <= 1:
        return web.Response(body=b"".join(pieces), headers=headers)
    response = web.Response(headers=headers)
    response[BODY_PIECES] = pieces  # written in order by databus._serving, never joined
    return response


def _granted_read(buffer: EventBuffer, select: CompiledFilter | None,
                  who: Reader) -> Callable[..., ReadResult]:
    """``buffer.read`` with the request's filter, without the in-band markers of
    sources ``who`` may not read (relay/_access.py)."""
    bound = functools.partial(buffer.read, select=select)
    if unrestricted(who.grant):
        return bound
    grant = who.grant

    def read(checkpoint: Checkpoint, *, max_bytes: int) -> ReadResult:
        return strip_markers(bound(checkpoint, max_bytes=max_bytes), grant)

    return read


async def _follow(
    request: web.Request, buffer_name: str, buffer: EventBuffer,
    bound: Callable[..., ReadResult], filter_key: tuple[str, ...], checkpoint: Checkpoint,
    max_bytes: int, heartbeat_ms: int, quarantine: Callable[[], Quarantine | None],
    *, restricted: bool = False,
) -> web.StreamResponse:
    """A streaming subscription (relay/_streaming.py): one chunked response that stays
    open. A checkpoint already off the buffer is refused before the response starts,
    with the 410 a poll would get; later errors travel in-band."""
    state = buffer.state()
    decide(checkpoint, prev_scn=state.prev_scn, min_scn=state.min_scn,
           max_scn=state.max_scn)  # ScnNotFoundError: a JSON 410, as for a poll
    app = request.app
    shared = app[SHARED_READS][buffer_name]
    stats = app[STATS]
    notifier = app[NOTIFIERS][buffer_name]

    def read(position: Checkpoint, limit: int) -> SharedRead:
        stop = quarantine()
        return shared.stream_read(guard(bound, stop), (*filter_key, stop and stop.scn),
                                  position, limit)

    record = served_recorder(request, buffer_name=buffer_name, streaming=True)

    def on_write(end: Checkpoint, events: int, nbytes: int) -> None:
        stats.bytes_served += nbytes
        stats.events_served += events
        record(end, events, nbytes)

    response = web.StreamResponse(headers={
        "Content-Type": EVENTS_CONTENT_TYPE,
        "X-Databus-Buffer": buffer_name,
        "X-Databus-Streaming": "1",
        "X-Databus-Heartbeat-Ms": str(heartbeat_ms),
        "X-Databus-Min-Scn": str(state.min_scn if state.min_scn is not None
                                 else state.prev_scn),
        "X-Databus-Max-Scn": str(state.max_scn if state.max_scn is not None
                                 else state.prev_scn),
        **({RESTRICTED_HEADER: "1"} if restricted else {}),
    })
    response.enable_chunked_encoding()
    serving = app.get(SERVING)
    timeout = serving.limits.write_timeout_s if serving is not None else 30.0
    try:
        async with asyncio.timeout(timeout):
            await response.prepare(request)
    except (TimeoutError, ConnectionError):
        return response
    stats.streams += 1
    try:
        # Listed while connected; gone from /v1/consumers when it closes.
        with stream_presence(request, buffer_name=buffer_name):
            await Follow(request, response, buffer, read, checkpoint, max_bytes,
                         heartbeat_ms / 1000, on_write, shared.heartbeat,
                         app[LIVENESS]).run(notifier, app[CLOSING])
    finally:
        stats.streams -= 1
    with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
        async with asyncio.timeout(timeout):
            await response.write_eof()
    return response


async def _read_rest(
    read: Callable[..., ReadResult], first: ReadResult, max_bytes: int,
    request: web.Request, buffer: EventBuffer,
) -> tuple[list[bytes], Checkpoint, int, int | None]:
    """The body after ``first`` (a read of at most ``FIRST_SLICE``): further reads of at
    most ``BULK_SLICE`` each, from where the last one ended, until ``max_bytes`` or
    nothing more; each in the server's bulk lane, one per loop turn. While another
    request holds the lane, a request that holds ``SHORT_BODY`` already stops there.
    Returns
    (slices, the checkpoint after them, data events, the pending event size when
    nothing fit).

    Beyond ``FIRST_SLICE`` the body needs a share of the stream memory budget
    (databus/_serving.py): taken here, only when there is more to serve; short of
    budget, fewer bytes (whole events), or ``overloaded`` when not even the first event
    fits in what is free but would fit in what the client asked for.

    Same bytes as one read of ``max_bytes``: each read is whole events from where the
    previous one stopped, and checks by itself that the writer did not overwrite what it
    copied. If the ring evicts the rest between two reads (``scn_not_found``) or a read
    finds damage, the slices already read are served; the consumer's next request, from
    their checkpoint, gets that answer."""
    pieces = [first.data] if first.data else []
    size, events = len(first.data), first.events
    checkpoint, pending = first.checkpoint, first.pending_event_size
    if pending is None and (not first.data or _at_tail(buffer, checkpoint)):
        return pieces, checkpoint, events, None  # all there is (a consumer keeping up)
    if pending is not None and pending > max_bytes:
        return pieces, checkpoint, events, pending
    serving = request.app.get(SERVING)
    grant = request.get(STREAM_GRANT)
    lane = serving.bulk if serving is not None else asyncio.Lock()
    wanted = max_bytes
    if grant is not None:
        max_bytes = grant.allow(max_bytes)
        if pending is not None and max_bytes < pending <= wanted:
            # A pending-size answer would make the client ask again at once, in a loop,
            # while others hold the budget.
            raise Overloaded("the server's stream memory (max_stream_memory_mb) is in "
                             "use by other responses; retry shortly")
    step = BULK_SLICE
    while True:
        room = max_bytes - size
        if pending is not None:
            if pending > room:
                break
            limit = max(pending, min(step, room))
        else:
            limit = min(step, room)
            if limit <= 0:
                break
        if size >= SHORT_BODY and lane.locked():
            # Another big body is being built: serve what we have (whole events, a valid
            # answer; the consumer asks again).
            break
        async with lane:
            try:
                more = read(checkpoint, max_bytes=limit)
            except (ScnNotFoundError, BufferCorruptedError, SourceQuarantinedError):
                if not pieces:
                    raise
                break
            # Hold the lane through one loop turn: one bulk slice per turn, server-wide.
            await asyncio.sleep(0)
        if more.data:
            pieces.append(more.data)
            size += len(more.data)
            events += more.events
            # A read that started and ended inside one window: the next one scans that
            # window from its start again, so grow the slice (a huge window is read in
            # linear, not quadratic, time).
            same_window = (checkpoint.window_offset != WHOLE_WINDOW
                           and more.checkpoint.window_scn == checkpoint.window_scn)
            step = min(2 * step, max_bytes) if same_window else BULK_SLICE
            checkpoint, pending = more.checkpoint, None
        elif more.pending_event_size is not None and pending is None:
            pending = more.pending_event_size
        else:
            break  # nothing newer (or the pending event did not come: stop, no loop)
    return pieces, checkpoint, events, pending if size == 0 else None


def _at_tail(buffer: EventBuffer, checkpoint: Checkpoint) -> bool:
    """Has ``checkpoint`` consumed the newest window the buffer holds?"""
    newest = buffer.state().max_scn
    return (checkpoint.window_offset == WHOLE_WINDOW and newest is not None
            and checkpoint.window_scn >= newest)


async def sources(request: web.Request) -> web.Response:
    grant = reader(request).grant
    relay = request.app[READER]
    quarantined = {(b, s) for b in relay.buffers for s in relay.quarantines.active(b)}
    out = [
        {
            "name": e.name,
            "id": e.id,
            "buffer": e.buffer,
            "partition_id": e.partition_id,
            "schema_fingerprint": fp_text(e.fingerprint),
            # Additive: "pending" = configured, its table not seen at the source yet;
            # "quarantined" = set aside after a failure of its own (DESIGN 17).
            "state": "quarantined" if (e.buffer, e.name) in quarantined else e.state,
        }
        for e in relay.catalog.sources()
        if grant.allows(e.name)
    ]
    # Additive: true when the reader is not granted every source (DESIGN 18): its
    # windows may lack events of sources it cannot see, so a client must not check
    # EOW counts and checksums (they cover every event of a window).
    return json_response({"sources": out, "restricted": not unrestricted(grant)})


def _schema_json(schema: Schema) -> dict[str, Any]:
    return {
        "fingerprint": fp_text(schema.fingerprint),
        "name": schema.name,
        "schema": json.loads(schema.to_json()),
    }





async def schema_by_fingerprint(request: web.Request) -> web.Response:
    who = reader(request)
    relay = request.app[READER]
    registry = relay.catalog.registry
    fingerprint = parse_fingerprint(request.match_info["fingerprint"])
    if not unrestricted(who.grant) and not any(
            s.fingerprint == fingerprint
            for e in relay.catalog.sources() if who.grant.allows(e.name)
            for s in registry.versions(e.name)):
        # Whether it exists elsewhere is not said either.
        raise Forbidden(f"reader {who.name!r} is granted no source with schema "
                        f"{fp_text(fingerprint)}")
    schema = registry.get(fingerprint)
    return json_response(_schema_json(schema))


async def schemas_of_source(request: web.Request) -> web.Response:
    who = reader(request)
    relay = request.app[READER]
    name = source_param(request)
    if name is None:
        raise BadRequest("give ?source=NAME, or GET /v1/schemas/{fingerprint}")
    require(who, [name])
    relay.catalog.source(name)  # 404 for an unknown source
    versions = relay.catalog.registry.versions(name)
    return json_response(
        {"source": name, "versions": [_schema_json(s) for s in versions]}
    )


async def status(request: web.Request) -> web.Response:
    check_operational(request)
    doc = request.app[RELAY].status()
    # The loop this server actually runs on (relay.event_loop, DATABUS_EVENT_LOOP).
    doc["event_loop"] = running_loop_name()
    # What is not ready and why: /readyz's entries (relay/_readiness.py).
    down = [c for c in components_of(doc) if not c["ready"]]
    doc["ready"] = not down
    doc["not_ready"] = down
    reloader = request.app.get(TLS_RELOADER)
    if reloader is not None:
        # The main process's view; each worker reloads the same files on its own.
        doc["tls"] = {"reloads": reloader.reloads, "error": reloader.error}
    return json_response(doc)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: 200 while the relay runs. A worker whose main process stopped
    answering says 503: the relay on this port is not running, whichever process took
    the connection. (Out of its ZooKeeper session, a relay still runs: /readyz says.)"""
    down = request.app[LIVENESS]()
    if isinstance(down, MainUnavailable):
        return json_response({"status": "unavailable", **down.to_json()},
                                 status=down.http_status)
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness (relay/_readiness.py): 200 when every component does its job."""
    return readiness_response(components_of(request.app[RELAY].status()))


async def metrics(request: web.Request) -> web.Response:
    check_operational(request)
    return metrics_response(request.app[METRICS])


async def consumers(request: web.Request) -> web.Response:
    """``GET /v1/consumers``: every consumer seen on /v1/stream lately, with its lag
    (relay/_consumers.py; docs/relay.md, "Consumers")."""
    who = reader(request)
    relay, registry = request.app[RELAY], request.app[CONSUMERS]
    states = {name: b.state() for name, b in relay.buffers.items()}
    listed = registry.snapshot({n: st.max_scn for n, st in states.items()},
                               relay.window_time,
                               {n: st.min_scn for n, st in states.items()})
    if not unrestricted(who.grant):
        listed = [c for c in listed if c["reader"] == who.name]  # its own only
    return json_response({
        "consumers": listed,
        "tracked": len(listed),
        "max_tracked": registry.max_consumers,
        "expiry_s": registry.expiry_s,
        "evicted_total": registry.evicted_total,
    })


async def admin_flush(request: web.Request) -> web.Response:
    check_bearer(request, request.app[RELAY].config.admin_token, "relay.admin_token")
    await admin_body(request)  # no fields; a body, if any, must be a JSON object
    relay = request.app[RELAY]
    for buffer in relay.buffers.values():
        await asyncio.to_thread(buffer.flush)
    return json_response({"flushed": sorted(relay.buffers)})


# -- app ----------------------------------------------------------------------------


def install_read_side(app: web.Application, reader: RelayReader) -> None:
    """What the read endpoints need: limits, per-app state and the routes of
    ``/v1/stream``, ``/v1/sources``, ``/v1/schemas`` and ``/healthz``. The main
    process's app (``create_app``) and a worker's (relay/_worker.py) are both built on
    it, so a key these handlers read belongs here. ``NOTIFIERS`` is filled by the app's
    lifecycle: how an app learns that a window landed differs."""
    cfg = reader.config
    install_guard(app, guard_for(cfg))
    # Connection limits and the stream memory budget (databus/_serving.py); they take
    # full effect when served through databus._serving's runner, as ``databus relay`` is.
    install(app, ServingLimits.of(cfg), stream_paths=("/v1/stream",),
            default_max_bytes=DEFAULT_MAX_BYTES, max_bytes_cap=cfg.max_bytes_cap,
            grant_paths=("/v1/stream",))
    app[READER] = reader
    app[STATS] = HttpStats()
    app[NOTIFIERS] = {}
    app[SHARED_READS] = {name: SharedReads(b) for name, b in reader.buffers.items()}
    app[CLOSING] = asyncio.Event()
    app[LIVENESS] = _always_alive

    async def end_streams(app: web.Application) -> None:
        app[CLOSING].set()
        for notifier in app[NOTIFIERS].values():
            notifier.close()

    app.on_shutdown.append(end_streams)
    app.router.add_get("/v1/stream", stream)
    app.router.add_get("/v1/sources", sources)
    app.router.add_get("/v1/schemas", schemas_of_source)
    app.router.add_get("/v1/schemas/{fingerprint}", schema_by_fingerprint)
    app.router.add_get("/healthz", healthz)


def _always_alive() -> DatabusError | None:
    return None


def create_app(relay: Relay) -> web.Application:
    """The relay's aiohttp application. Starting it starts the relay's fetchers."""
    app = web.Application(middlewares=[json_errors, trust_forwarded_cn])
    cfg = relay.config
    install_read_side(app, relay)
    app[RELAY] = relay
    app[LIVENESS] = relay.session_down
    app[CONSUMERS] = ConsumerRegistry(cfg.max_tracked_consumers, cfg.consumer_expiry_s)
    app[METRICS] = relay_metrics(relay, app[STATS], app[CONSUMERS])

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        for name, buffer in relay.buffers.items():
            notifier = WindowNotifier(loop)
            app[NOTIFIERS][name] = notifier
            buffer.add_listener(notifier.on_window)
            # Lag in ms (relay/_consumers.py) needs when each window landed; windows
            # the buffer already holds count as landed now, at start.
            held = buffer.state().max_scn
            if held is not None:
                app[CONSUMERS].window_landed(name, held)
            buffer.add_listener(functools.partial(app[CONSUMERS].window_landed, name))
        relay.start()
        yield
        for notifier in app[NOTIFIERS].values():
            notifier.close()
        await asyncio.to_thread(relay.close)

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/consumers", consumers)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/admin/flush", admin_flush)
    add_dump_routes(app, RELAY)
    add_quarantine_routes(app, RELAY)
    return app

