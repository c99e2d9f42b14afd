"""A bootstrap service process: the store, and the producer, applier and server that
``bootstrap.run`` names, all on one event loop. Each component owns one background
task; the aiohttp app's ``cleanup_ctx`` starts them and closes them in reverse."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from databus._http import BadRequest
from databus._serving import ServingLimits, install
from databus.bootstrap._applier import LogApplier
from databus.bootstrap._component import BackgroundComponent
from databus.bootstrap._producer import LogProducer
from databus.bootstrap._serve import Bootstrapper, ServePolicy
from databus.bootstrap._server import DEFAULT_MAX_BYTES, ServiceInfo, create_app
from databus.bootstrap._storage import BootstrapStorage, open_storage
from databus.config import BootstrapConfig
from databus.security import (
    CertificateReloader,
    Guard,
    Readers,
    server_context,
    watch_certificates,
)
from databus.security import install as install_guard

log = logging.getLogger("databus.bootstrap")

# How often the listener's certificate files are looked at (a renewal is served to new
# connections within this time, without a restart).
CERT_CHECK_S = 5.0


def listener_tls(config: BootstrapConfig) -> ssl.SSLContext | None:
    """The listener's TLS context from ``[bootstrap.tls]`` (None: plain HTTP);
    ``TLSFileError`` in one line when a file is missing or wrong (before anything is
    bound or opened)."""
    if config.tls is None:
        return None
    return server_context(config.tls, "bootstrap.tls")


def advertised_url(config: BootstrapConfig) -> str:
    """Where clients reach this service: ``cluster.advertise_url``, else
    ``http(s)://host:port`` (https with ``[bootstrap.tls]``)."""
    if config.cluster is not None and config.cluster.advertise_url:
        return config.cluster.advertise_url
    scheme = "https" if config.tls is not None else "http"
    return f"{scheme}://{config.host}:{config.port}"


def open_configured_storage(config: BootstrapConfig) -> BootstrapStorage:
    options: dict[str, object] = {"key_hash": config.key_hash}
    if config.log_partition_span is not None and config.storage.startswith("postgres"):
        options["log_partition_span"] = config.log_partition_span
    return open_storage(config.storage, **options)


def build_app(config: BootstrapConfig, storage: BootstrapStorage,
              tls: ssl.SSLContext | None = None, *,
              cert_check_s: float = CERT_CHECK_S) -> web.Application:
    """The service as an aiohttp app; without "server" in ``run`` it still answers
    /v1/status, /metrics and /healthz so the process can be watched. ``tls``: the
    context the listener serves with (``listener_tls``), whose files are looked at
    every ``cert_check_s`` seconds and loaded again when they change."""
    srv = config.server
    bootstrapper = Bootstrapper(storage, ServePolicy(
        strategy=srv.strategy, breakeven_ratio=srv.breakeven_ratio,
        ratio_sample_rows=srv.ratio_sample_rows, batch_rows=srv.batch_rows))
    info = ServiceInfo(admin_token=config.admin_token, max_bytes_cap=srv.max_bytes_cap)
    app = create_app(bootstrapper, info, serve_streams="server" in config.run)
    # Who may read what (DESIGN 18): readers, and the token of /metrics and /v1/status.
    install_guard(app, Guard(readers=Readers(config.readers),
                             metrics_token=config.metrics_token,
                             admin_token=config.admin_token))
    if tls is not None and config.tls is not None:
        watch_certificates(app, CertificateReloader(config.tls, tls, "bootstrap.tls"),
                           cert_check_s)
    # Connection limits and the stream memory budget (databus/_serving.py).
    install(app, ServingLimits.of(srv), stream_paths=("/v1/bootstrap/stream",),
            default_max_bytes=DEFAULT_MAX_BYTES, max_bytes_cap=srv.max_bytes_cap)
    producer = applier = None
    if "producer" in config.run:
        p = config.producer
        producer = LogProducer(storage, p.relays, sources=p.sources, start_scn=p.start_scn,
                               max_bytes=p.max_bytes, poll_wait_ms=p.poll_wait_ms,
                               credentials=p.credentials)
        info.components["producer"] = producer.status.to_json
    if "applier" in config.run:
        a, r = config.applier, config.retention
        applier = LogApplier(
            storage, batch_rows=a.batch_rows, poll_interval=a.poll_interval_ms / 1000,
            retention_hours=r.hours,
            retention_max_log_bytes=r.max_log_mb << 20 if r.max_log_mb else None,
            retention_interval=r.interval_s)
        info.components["applier"] = applier.status.to_json
        info.retain = applier.retain

    if config.cluster is not None:
        return _clustered(app, config, storage, info, producer, applier)

    async def components(app: web.Application) -> AsyncIterator[None]:
        for component in (producer, applier):
            if component is not None:
                component.start()
        yield
        for component in (applier, producer):
            if component is not None:
                await component.close()
        storage.close()

    app.cleanup_ctx.append(components)
    return app


def _clustered(app: web.Application, config: BootstrapConfig, storage: BootstrapStorage,
               info: ServiceInfo, producer: LogProducer | None, applier: LogApplier | None
               ) -> web.Application:
    """``[bootstrap.cluster]``: the producer and the applier run while this service
    holds their locks (bootstrap/_cluster.py); the server always."""
    from databus.bootstrap._cluster import BootstrapMember

    cluster = config.cluster
    assert cluster is not None
    url = advertised_url(config)
    components: dict[str, BackgroundComponent] = {}
    if producer is not None:
        components["producer"] = producer
    if applier is not None:
        components["applier"] = applier
    member = BootstrapMember(cluster, url, storage, components,
                             sources=config.producer.sources)
    info.cluster = member.status
    if applier is not None:
        def retain() -> dict[str, object]:
            seat = member.seats.get("applier")
            if seat is None or not seat.holding:
                raise BadRequest(f"cluster {cluster.name}: another service runs the "
                                 "applier now (see /v1/status): ask that one")
            return applier.retain()
        info.retain = retain

    async def membership(app: web.Application) -> AsyncIterator[None]:
        try:
            await member.start()
        except BaseException:
            storage.close()
            raise
        yield
        await member.close()
        storage.close()

    app.cleanup_ctx.append(membership)
    return app
