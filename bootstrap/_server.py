"""The bootstrap service's HTTP API (docs/bootstrap.md), a thin aiohttp shell.

- ``GET /v1/bootstrap/sources``, ``GET /v1/bootstrap/schemas/{fingerprint}``
- ``GET /v1/bootstrap/stream?checkpoint=JSON&sources=a,b&filter=JSON&max_bytes=N``
- ``GET /v1/status``, ``GET /metrics``, ``GET /healthz``, ``GET /readyz``
- ``POST /v1/admin/retain`` (bearer token): run retention now

Who may read what (DESIGN 18, docs/bootstrap.md "Security"): with ``[[bootstrap.readers]]``
every read (``stream``, ``sources``, ``schemas``) needs a reader's credential (401), and
reads only the sources it is granted (403): a stream naming a source not granted, or a
filter naming one, is refused; a stream naming no source is narrowed to the granted
ones (refused when that is none); ``sources`` lists the granted ones; a schema of no
granted source is refused. Whether a source the reader is not granted exists is never
said. ``/v1/status`` and ``/metrics`` take ``check_operational`` (the metrics token, the
admin token or a reader's credential when a metrics token is set); ``/healthz`` and
``/readyz`` are open; admin keeps the admin token.

Store calls block, so each runs in a worker thread; the store gives every thread its
own connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from databus._event_loop import running_loop_name
from databus._http import (
    STATS,
    BadRequest,
    Forbidden,
    HttpStats,
    NotFound,
    admin_body,
    check_bearer,
    checkpoint_param,
    client_id_param,
    filter_param,
    fp_text,
    http_requests_family,
    int_param,
    json_errors,
    json_response,
    metrics_response,
    parse_fingerprint,
    sources_param,
)
from databus._readiness import not_ready, readiness_response
from databus.bootstrap._readiness import component_families, components_of
from databus.bootstrap._serve import Bootstrapper
from databus.config import Secret
from databus.schemas import Schema
from databus.security import Reader, check_operational, reader, require

EVENTS_CONTENT_TYPE = "application/x-databus-events"
DEFAULT_MAX_BYTES = 1 << 20

T = TypeVar("T")


class ServiceInfo:
    """What the status and metrics endpoints report beyond the store: the in-process
    producer and applier, when this process runs them (set by ``_service.py``)."""

    def __init__(self, admin_token: Secret | None = None, max_bytes_cap: int = 8 << 20
                 ) -> None:
        self.admin_token = admin_token
        self.max_bytes_cap = max_bytes_cap
        self.components: dict[str, Callable[[], dict[str, Any]]] = {}
        self.retain: Callable[[], dict[str, Any]] | None = None
        # [bootstrap.cluster]: the cluster, and which components this member runs now.
        self.cluster: Callable[[], dict[str, Any]] | None = None


BOOTSTRAPPER = web.AppKey("bootstrapper", Bootstrapper)
INFO = web.AppKey("info", ServiceInfo)


async def _blocking(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


async def _granted_sources(who: Reader, boot: Bootstrapper, names: list[str],
                           filtered: list[str]) -> list[str]:
    """The sources a stream request of ``who`` reads: those it names, each granted
    (else 403, before the store is asked whether they exist); when it names none, the
    store's sources it is granted, in the order the store would serve them all."""
    require(who, names)
    require(who, filtered)  # a filter never widens: it may only name granted sources
    if names or who.grant.everything:
        return names
    known = await _blocking(boot.storage.source_ids)
    granted = who.grant.narrow(sorted(known, key=known.__getitem__))
    if not granted:
        raise Forbidden(f"reader {who.name!r} is granted no source of this bootstrap "
                        "service")
    return granted


async def stream(request: web.Request) -> web.StreamResponse:
    boot = request.app[BOOTSTRAPPER]
    info = request.app[INFO]
    who = reader(request)  # 401 before anything else is looked at
    checkpoint = checkpoint_param(request)
    names = sources_param(request)
    spec = filter_param(request)
    names = await _granted_sources(who, boot, names, list(spec.filters))
    # Clients send their client_id here too; the bootstrap service does not track
    # consumers, but holds the parameter to the relay's rules (400 when over-long).
    client_id_param(request)
    max_bytes = min(int_param(request, "max_bytes", DEFAULT_MAX_BYTES, 1, 1 << 31),
                    info.max_bytes_cap)
    served = await _blocking(boot.serve, checkpoint, names, spec, max_bytes)
    headers = {
        "X-Databus-Checkpoint": served.checkpoint.dumps(),
        "X-Databus-Bootstrap-Phase": served.phase,
    }
    target = served.checkpoint.bootstrap_target_scn
    if served.done:
        target = served.checkpoint.window_scn
    if target is not None:
        headers["X-Databus-Target-Scn"] = str(target)
    if served.started_as is not None:
        headers["X-Databus-Bootstrap-Strategy"] = served.started_as
    if served.waiting is not None:
        headers["X-Databus-Bootstrap-Waiting"] = served.waiting
    stats = request.app[STATS]
    stats.bytes_served += len(served.body)
    stats.events_served += served.events
    return web.Response(body=bytes(served.body), headers=headers,
                        content_type=EVENTS_CONTENT_TYPE)


async def sources(request: web.Request) -> web.Response:
    """The sources of the store the reader is granted (all of them without readers)."""
    who = reader(request)
    storage = request.app[BOOTSTRAPPER].storage
    ids, schemas = await asyncio.gather(_blocking(storage.source_ids),
                                        _blocking(storage.schemas))
    latest: dict[str, int] = {}
    for fingerprint, source, _ in schemas:  # oldest first: the last one wins
        latest[source] = fingerprint
    out = [{"name": name, "id": sid, "schema_fingerprint": fp_text(latest.get(name))}
           for name, sid in sorted(ids.items(), key=lambda item: item[1])
           if who.grant.allows(name)]
    return json_response({"sources": out})


async def schema_by_fingerprint(request: web.Request) -> web.Response:
    who = reader(request)
    fingerprint = parse_fingerprint(request.match_info["fingerprint"])
    storage = request.app[BOOTSTRAPPER].storage
    text = await _blocking(storage.schema, fingerprint)
    if text is None:
        raise NotFound(f"no schema with fingerprint {fp_text(fingerprint)}")
    if not who.grant.everything:
        # A schema is a source's: readable by a reader granted a source that has it.
        owners = {source for fp, source, _ in await _blocking(storage.schemas)
                  if fp == fingerprint}
        if not who.grant.narrow(owners):
            raise Forbidden(f"reader {who.name!r} is not granted the source of schema "
                            f"{fp_text(fingerprint)}")
    schema = Schema(text)
    return json_response({"fingerprint": fp_text(fingerprint), "name": schema.name,
                              "schema": json.loads(schema.to_json())})


def applier_lag_seconds(producer: int | None, applied: int | None,
                        applied_timestamp_ns: int | None, now: float) -> float | None:
    """The applier's lag in seconds (pure): 0 when the snapshot has the log's newest
    window (or the log is empty), else now minus the commit time of the window it is
    at; None when that time is not in the log."""
    if producer is None or (applied is not None and applied >= producer):
        return 0.0
    if applied_timestamp_ns is None:
        return None
    return round(max(0.0, now - applied_timestamp_ns / 1e9), 3)


async def status_doc(app: web.Application) -> dict[str, Any]:
    boot = app[BOOTSTRAPPER]
    state = await _blocking(boot.storage.state)
    producer, applied = state.producer_scn, state.applied_scn
    doc: dict[str, Any] = {
        "storage": boot.storage.where,
        "producer_scn": producer,
        "applied_scn": applied,
        "applier_lag_scn": (producer - applied) if producer is not None and applied is not None
        else None,
        # DESIGN 17, the figure to alert on: now minus the commit time of the window the
        # snapshot is at, 0 when it has the log's newest; None when unknown.
        "applier_lag_seconds": applier_lag_seconds(producer, applied,
                                                   state.applied_timestamp_ns, time.time()),

        "log_floor_scn": state.log_floor_scn,
        "log_windows": state.log_windows,
        "log_bytes": state.log_bytes,
        "snapshot_rows": state.snapshot_rows,
        "update_ratio": state.update_ratio,
        "components": (components := {name: report()
                                      for name, report in app[INFO].components.items()}),
        # The producer's lag behind the relay in seconds (None: not running here, or not
        # known yet).
        "producer_lag_seconds": (components.get("producer") or {}).get("lag_seconds"),
        "cluster": cluster() if (cluster := app[INFO].cluster) is not None else None,
        # The loop this process actually runs on (bootstrap.event_loop, DATABUS_EVENT_LOOP).
        "event_loop": running_loop_name(),
    }
    # What is not ready and why: the entries of /readyz (bootstrap/_readiness.py).
    down = not_ready(components_of(doc))
    doc["ready"] = not down
    doc["not_ready"] = down
    return doc


def _components(app: web.Application) -> dict[str, Any]:
    """Just the parts of the status /readyz reads: no store query (a store that does not
    answer must not make /readyz hang)."""
    info = app[INFO]
    return {"components": {name: report() for name, report in info.components.items()},
            "cluster": info.cluster() if info.cluster is not None else None}


async def status(request: web.Request) -> web.Response:
    check_operational(request)
    return json_response(await status_doc(request.app))


async def healthz(request: web.Request) -> web.Response:
    """Liveness: 200 while the process runs (/readyz says whether it does its job)."""
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness (bootstrap/_readiness.py): 200 when the producer and the applier this
    process runs hold their tokens or stand by, else 503 with what and why."""
    return readiness_response(components_of(_components(request.app)))


class BootstrapCollector(Collector):
    """The service's metrics over the live counters and the last status document.

    The store's state is read with a blocking call (in a worker thread), which a
    collector cannot await: the ``/metrics`` handler reads it first into ``status`` and
    generates the page right after, with no await in between, so two scrapes never mix.
    """

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.status: dict[str, Any] | None = None

    def collect(self) -> Iterator[Metric]:
        doc = self.status
        if doc is None:
            return
        yield from component_families(components_of(doc))
        p = "databus_bootstrap_"
        for field, text in [
            ("producer_scn", "Newest window in the log"),
            ("applied_scn", "Newest window applied to the snapshot"),
            ("applier_lag_scn", "Producer SCN minus applied SCN (a position distance: "
             "alert on applier_lag_seconds)"),
            ("log_floor_scn", "Every window after this SCN is in the log"),
            ("log_windows", "Windows in the log"),
            ("log_bytes", "Event bytes in the log"),
        ]:
            yield GaugeMetricFamily(p + field, text, value=float(doc[field] or 0))
        # DESIGN 17: the figures to alert on, with no sample while unknown (never 0).
        for field, text in [
            ("applier_lag_seconds", "Seconds between now and the commit time of the window "
             "the snapshot is at, 0 at the log's newest (absent while unknown)"),
            ("producer_lag_seconds", "Seconds between now and the commit time of the last "
             "window the producer logged, 0 when it has the relay's newest (absent while "
             "unknown)"),
        ]:
            family = GaugeMetricFamily(p + field, text, labels=[])
            if doc.get(field) is not None:
                family.add_metric([], float(doc[field]))
            yield family
        rows = GaugeMetricFamily(p + "snapshot_rows", "Live rows in the snapshot",
                                 labels=["source"])
        for source, count in doc["snapshot_rows"].items():
            rows.add_metric([source], float(count))
        yield rows
        yield GaugeMetricFamily(p + "update_ratio",
                                "Applied rows that updated an existing key",
                                value=float(doc["update_ratio"] or 0))
        yield _cluster_role(doc.get("cluster"))
        s = self.app[BOOTSTRAPPER].stats
        starts = CounterMetricFamily(p + "bootstraps_total", "Bootstraps started",
                                     labels=["strategy"])
        starts.add_metric(["snapshot"], float(s.snapshot_starts))
        starts.add_metric(["log"], float(s.replay_starts))
        yield starts
        served = CounterMetricFamily(p + "rows_served_total", "Rows served",
                                     labels=["phase"])
        served.add_metric(["snapshot"], float(s.snapshot_rows_served))
        served.add_metric(["catchup"], float(s.log_rows_served))
        yield served
        stats = self.app[STATS]
        yield CounterMetricFamily(p + "stream_bytes_total", "Event bytes served",
                                  value=float(stats.bytes_served))
        yield http_requests_family("databus_bootstrap", stats)


def _cluster_role(cluster: dict[str, Any] | None) -> Metric:
    """``databus_bootstrap_cluster_role{cluster,component,role}``, one-hot over holder
    and standby, per component this service contends for in a cluster (none outside
    one): "no service of the cluster holds the producer" is a sum, 0."""
    family = GaugeMetricFamily("databus_bootstrap_cluster_role", "This service's role for "
                               "a component in its cluster (one-hot: holder, standby)",
                               labels=["cluster", "component", "role"])
    if cluster:
        for component, seat in sorted((cluster.get("components") or {}).items()):
            for role in ("holder", "standby"):
                family.add_metric([str(cluster.get("name", "")), component, role],
                                  float(seat.get("role") == role))
    return family


async def metrics(request: web.Request) -> web.Response:
    check_operational(request)
    collector = request.app[COLLECTOR]
    collector.status = await status_doc(request.app)
    # No await from here on: the page is the document just read.
    return metrics_response(request.app[METRICS])


async def admin_retain(request: web.Request) -> web.Response:
    info = request.app[INFO]
    check_bearer(request, info.admin_token, "bootstrap.admin_token")
    await admin_body(request)  # no fields; a body, if any, must be a JSON object
    if info.retain is None:
        raise BadRequest("retention runs with the applier, which this process does not run")
    return json_response(await _blocking(info.retain))


COLLECTOR = web.AppKey("collector", BootstrapCollector)
METRICS = web.AppKey("metrics", CollectorRegistry)


def create_app(bootstrapper: Bootstrapper, info: ServiceInfo | None = None, *,
               serve_streams: bool = True) -> web.Application:
    app = web.Application(middlewares=[json_errors])
    app[BOOTSTRAPPER] = bootstrapper
    app[INFO] = info or ServiceInfo()
    app[STATS] = HttpStats()
    # The app's own Prometheus registry, never the process-global one.
    app[COLLECTOR] = BootstrapCollector(app)
    app[METRICS] = CollectorRegistry(auto_describe=False)
    app[METRICS].register(app[COLLECTOR])
    if serve_streams:
        app.router.add_get("/v1/bootstrap/stream", stream)
        app.router.add_get("/v1/bootstrap/sources", sources)
        app.router.add_get("/v1/bootstrap/schemas/{fingerprint}", schema_by_fingerprint)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_post("/v1/admin/retain", admin_retain)
    return app
