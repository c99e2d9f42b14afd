"""The replicator's run loop: a Databus client whose consumer folds whole windows into
batches and applies each batch to the target in one transaction with the position
reached (docs/replicator.md).

Exactly-once effect: the position lives in the target (``databus_replication_state``),
written in the same transaction as the rows. The client's checkpoint store reads it at
start (``TargetPosition``) and writes nothing: the client may count a window as
committed while it still sits in an unapplied batch, so a crash replays from the
target's last batch, never from a window the target does not have. Replaying windows
the target already has is harmless: they are re-applied in order from a consistent
point, each change setting a row to the state it had after its window.

Threads: the client runs the consumer's callbacks in its runner thread; a flusher
thread applies a batch that has waited ``batch_ms`` while no window arrives. Both take
the consumer's lock, and a batch is only ever applied between windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from databus._limited_log import limited
from databus.checkpoint import Checkpoint, Mode
from databus.client import (
    CallbackResult,
    CheckpointStore,
    Consumer,
    DatabusClient,
    DataEvent,
)
from databus.client._headers import read_json
from databus.config import ReplicateConfig
from databus.errors import DatabusError, ForbiddenError, UnauthorizedError
from databus.replicator._fold import Folder, TableFold
from databus.replicator._model import Batch, Dialect, TableMap
from databus.replicator._reconcile import SchemaChangeStopped
from databus.replicator._schema_sync import SchemaSync
from databus.replicator._status import ReplicationStats, estimate_copies
from databus.replicator.targets import Target
from databus.schemas import Schema
from databus.security import NO_CREDENTIALS, ClientCredentials, client_session

__all__ = ["ReplicationStopped", "Replicator", "TargetPosition"]

log = logging.getLogger("databus.replicator")

# A relay or bootstrap service refused the replicator's credential (DESIGN 18): what to
# change; the replicator stops (state "stopped" with this fix) rather than retrying.
CREDENTIAL_FIX = {
    "unauthorized": "give [replicate] the credential of a reader the relays and bootstrap "
                    "services know (token = \"${ENV}\", or cert_file/key_file under "
                    "mutual TLS; docs/security.md), then restart",
    "forbidden": "grant that reader the replicated tables' sources in [[relay.readers]] "
                 "(and [[bootstrap.readers]]), then restart",
}


class ReplicationStopped(DatabusError):
    """The replicator stopped on an error it cannot retry (a row the target refuses, a
    value no column can hold); the message names the table, the key and the SCN. A
    schema change it must not apply is ``SchemaChangeStopped`` (replicator/_reconcile.py)."""

    code = "replication_stopped"


class TargetPosition(CheckpointStore):
    """The client's checkpoint store: reads the position from the target; remembers
    (never writes) what the client commits, for batches applied during a bootstrap."""

    def __init__(self, load: Callable[[], Checkpoint | None]) -> None:
        self._load = load
        self.latest: Checkpoint | None = None
        self.loaded: Checkpoint | None = None  # what the client started from

    def load(self) -> Checkpoint | None:
        self.loaded = self._load()
        return self.loaded

    def store(self, checkpoint: Checkpoint) -> None:
        self.latest = checkpoint


def _checkpoint_of(detail: str | None, scn: int | None) -> Checkpoint | None:
    if detail:
        try:
            return Checkpoint.loads(detail)
        except DatabusError:
            log.warning("the target's recorded checkpoint is not one; resuming from SCN %s",
                        scn)
    return Checkpoint(scn) if scn is not None and scn >= 0 else None


class ApplyConsumer(Consumer):
    """Folds windows and applies batches (module docstring)."""

    def __init__(self, config: ReplicateConfig, target: Target,
                 maps: dict[str, TableMap], position: TargetPosition,
                 remap: Callable[[str, Schema], TableFold | None],
                 make_fold: Callable[[TableMap], TableFold],
                 stats: ReplicationStats | None = None) -> None:
        self.config = config
        self.target = target
        self.maps = maps
        self.position = position
        self._remap = remap
        self.folder = Folder({s: make_fold(m) for s, m in maps.items()})
        self._lock = threading.Lock()
        self._batch_since: float | None = None
        self._bootstrapping = False
        # Initial copies under way: source -> whether its rows go straight into its
        # table (None: not asked yet; docs/decisions.md, issue 30), and the copies that
        # ended in the batch in progress.
        self._straight: dict[str, bool | None] = {}
        self._straight_ended: set[str] = set()
        self.fatal: BaseException | None = None
        self.stats = stats if stats is not None else ReplicationStats(config.name)
        self._stop = threading.Event()
        # Called when the flusher meets a fatal error: no callback answers ERROR_FATAL
        # then (none may come while the source is idle), so the client must be told.
        self.on_fatal: Callable[[], None] | None = None
        # Whether a schema version of a source is older than another (SchemaSync).
        self.is_older: Callable[[str, int, int], bool] | None = None
        self._flusher = threading.Thread(target=self._flush_when_idle, daemon=True,
                                         name="databus-replicator-flush")

    def start(self) -> None:
        self._flusher.start()

    def close(self) -> None:
        self._stop.set()
        if self._flusher.is_alive():
            self._flusher.join(timeout=10)
        with self._lock:
            if self.fatal is None and not self.folder.in_window:
                self._flush_locked()

    # -- callbacks (the client's runner thread) ---------------------------------------

    def on_start_bootstrap(self) -> CallbackResult:
        self._bootstrapping = True
        if self.position.loaded is None:  # a copy from nothing, not a resumed one
            with self._lock:
                for source in self.maps:
                    self._straight.setdefault(source, None)
        # The copy's progress (replicator/_progress.py) says how it began: from nothing,
        # resumed, or a delta since the last checkpoint.
        self.stats.copy_started(list(self.maps), self.position.latest or self.position.loaded)
        return CallbackResult.SUCCESS

    def on_end_bootstrap(self) -> CallbackResult:
        self._bootstrapping = False
        with self._lock:
            # The copy's last rows go to the target now, so that its end (the progress
            # line, /v1/status) counts them all.
            if not self.folder.in_window and not self._flush_locked():
                return CallbackResult.ERROR_FATAL
            if self.folder.in_window:
                self._straight_ended.update(self._straight)  # after the batch in progress
            else:
                self._straight.clear()
                self._straight_ended.clear()
        self.stats.copy_done()
        return CallbackResult.SUCCESS

    def on_dump_start(self, source: str) -> CallbackResult:
        # A relay dump of the table begins (its start marker): its rows may go straight
        # into the table if the table is empty now (asked at the next flush).
        with self._lock:
            if source in self.maps:
                self._straight[source] = None
                self._straight_ended.discard(source)
        return CallbackResult.SUCCESS

    def on_dump_end(self, source: str, outcome: str = "done") -> CallbackResult:
        with self._lock:
            if source in self._straight:
                self._straight_ended.add(source)  # after the batch in progress
        return CallbackResult.SUCCESS

    def on_start_data_event_sequence(self, scn: int) -> CallbackResult:
        with self._lock:
            self.folder.start_window()
        return CallbackResult.SUCCESS

    def on_start_source(self, source: str, schema: Schema | None) -> CallbackResult:
        current = self.maps.get(source)
        if schema is None or current is None or schema.fingerprint == current.fingerprint:
            return CallbackResult.SUCCESS
        if self.is_older is not None and self.is_older(source, schema.fingerprint,
                                                       current.fingerprint):
            # A window of an older version, replayed after a restart: folded with the
            # current (newer) map; the target table never goes back to an older shape.
            return CallbackResult.SUCCESS
        with self._lock:
            # A new schema version: the batch so far was folded with the old map.
            if not self._flush_locked():
                return CallbackResult.ERROR_FATAL
            try:
                fold = self._remap(source, schema)
            except (ReplicationStopped, SchemaChangeStopped) as exc:
                self.fatal = exc
                return CallbackResult.ERROR_FATAL
            if fold is not None:
                self.maps[source] = fold.table
                self.folder.replace(source, fold)
        return CallbackResult.SUCCESS

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        with self._lock:
            try:
                # The key alone now; the value of the events that survive the fold
                # is decoded and converted when the batch is applied (_fold.py).
                self.folder.add(event)
            except DatabusError as exc:
                self.fatal = exc
                return CallbackResult.ERROR_FATAL
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        with self._lock:
            self.folder.end_window(scn)
            if self._batch_since is None:
                self._batch_since = time.monotonic()
            due = (self.folder.pending_rows >= self.config.batch_rows
                   or time.monotonic() - self._batch_since >= self.config.batch_ms / 1000)
            if due and not self._flush_locked():
                return CallbackResult.ERROR_FATAL
        return CallbackResult.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        with self._lock:
            self.folder.rollback()
        return CallbackResult.SUCCESS

    # -- applying ---------------------------------------------------------------------

    def _flush_when_idle(self) -> None:
        wait = max(self.config.batch_ms / 1000, 0.01)
        while not self._stop.wait(wait / 2):
            with self._lock:
                since = self._batch_since
                if (since is not None and not self.folder.in_window and self.fatal is None
                        and time.monotonic() - since >= wait and not self._flush_locked()):
                    if self.on_fatal is not None:
                        self.on_fatal()
                    return

    def _flush_locked(self) -> bool:
        """Apply the batch of whole windows folded so far (under the lock); False when
        the replicator must stop (``fatal`` says why)."""
        if self.fatal is not None:
            return False
        if self.folder.batch.windows == 0:
            return True
        try:
            batch = self.folder.materialize()
        except DatabusError as exc:
            self.fatal = exc
            log.error("replication %s stopped: %s", self.config.name, exc)
            return False
        batch.checkpoint = self._position(batch).dumps()
        batch.straight = self._straight_sources(batch)
        straight = set(batch.straight)
        delay = self.config.retry_initial_s
        while True:
            try:
                self.target.apply(self.config.name, self.maps, batch)
                break
            except DatabusError as exc:
                self.stats.failed(str(exc))
                if exc.retriable:
                    self.stats.state = "retrying"  # not applying: /readyz says so
                if not exc.retriable:
                    self.fatal = exc
                    log.error("replication %s stopped: %s", self.config.name, exc)
                    return False
                if self._stop.is_set() and self.fatal is None:
                    # Shutting down with the target away: the windows will be read again.
                    return True
                limited(log).warning("target unavailable (%s); retrying in %.1f s", exc, delay)
                time.sleep(delay * random.uniform(0.8, 1.0))
                delay = min(delay * 2, self.config.retry_max_s)
        self.folder.take()
        self._batch_since = None
        for source in straight - batch.straight:  # its table held a key: merge from now on
            self._straight[source] = False
        for source in self._straight_ended:
            self._straight.pop(source, None)
        self._straight_ended.clear()
        self.stats.applied({source: len(changes) for source, changes in batch.changes.items()},
                           batch.scn)
        return True

    def _straight_sources(self, batch: Batch) -> set[str]:
        """The sources of ``batch`` under an initial copy whose rows go straight into
        their tables: the table was empty when the copy began (asked at the first batch
        of the copy, before its rows are written) and no key of it was met since."""
        out = set()
        for source, ok in list(self._straight.items()):
            if ok is None and source in batch.changes and source in self.maps:
                try:
                    ok = self.target.accepts_straight_copy(self.maps[source])
                except DatabusError as exc:  # merged this time; asked again next batch
                    log.debug("straight copy of %s not asked: %s", source, exc)
                    continue
                self._straight[source] = ok
                log.info("initial copy of %s: %s", source,
                         "straight into its empty table (COPY)" if ok else
                         "merged (the table is not empty, or not keyed by the map's key)")
            if ok:
                out.add(source)
        return out

    def _position(self, batch: Batch) -> Checkpoint:
        """Where a restart resumes after ``batch``: its last window online; during a
        bootstrap, the last checkpoint the client committed (it may lag the batch: the
        windows in between are applied again, harmlessly)."""
        if self._bootstrapping:
            latest = self.position.latest
            if latest is not None and latest.mode is not Mode.ONLINE:
                return latest
        return Checkpoint(batch.scn)


class Replicator:
    """One ``[replicate]`` section, run until stopped or a fatal error."""

    def __init__(self, config: ReplicateConfig, target: Target | None = None) -> None:
        self.config = config
        if target is None:
            from databus.replicator.targets import open_target

            target = open_target(config.target)
        self.target = target
        self.sync = SchemaSync(config, target)
        self.stats = ReplicationStats(config.name)
        self.client: DatabusClient | None = None
        self.consumer: ApplyConsumer | None = None
        self._halt: asyncio.Event | None = None
        self._status_url = ""
        self._stopping = False

    def stop(self) -> None:
        """Stop (a signal handler's call, in the event loop's thread)."""
        self._stopping = True
        if self.client is not None:
            self.client.stop()
        if self._halt is not None:
            self._halt.set()

    def run(self) -> None:
        asyncio.run(self.run_async())

    async def run_async(self) -> None:
        """Run until stopped or an error it must not pass. Such a stop (an incompatible
        schema change, a row the target refuses) is logged in one line and, when the
        status server runs, kept in ``/v1/status`` (state "stopped", error, message,
        fix) until the process is asked to stop: it never looks healthy while stopped."""
        self._halt = asyncio.Event()
        # Safe start (DESIGN 17): the status port is bound before the target is opened
        # or anything is written, so a second replicator started by mistake on the same
        # port fails at once and touches nothing. It says "starting" while the tables
        # are reconciled, and "stopped" with the reason when that stops.
        serving = await self._serve_status()
        try:
            await self._run_target()
        except (ReplicationStopped, SchemaChangeStopped, UnauthorizedError,
                ForbiddenError) as exc:
            fix = (exc.fix if isinstance(exc, SchemaChangeStopped)
                   else CREDENTIAL_FIX.get(exc.code,
                                           "fix the cause the message names, then restart"))
            self.stats.stopped(exc.code, str(exc), fix)
            if serving is not None:
                log.error("replication %s stopped: %s; status stays on %s until the "
                          "process is stopped", self.config.name, exc, self._status_url)
                await self._halt.wait()
            raise
        finally:
            if self.stats.state != "stopped":
                self.stats.state = "exited"
            if serving is not None:
                await serving.cleanup()

    async def _run_target(self) -> None:
        # Then this replication's hold on the target, before anything is written: a
        # second replicator of it fails here in one line (AlreadyRunningError).
        held = await asyncio.to_thread(self.target.hold, self.config.name)
        if self._status_url:
            log.info("replication %s: status on %s", self.config.name, self._status_url)
        try:
            await self._run_held()
        finally:
            held.release()

    async def _run_held(self) -> None:
        cfg = self.config
        target = self.target
        await asyncio.to_thread(target.open)
        try:
            await asyncio.to_thread(target.ensure_state)
            relays = await relay_urls(cfg)
            schemas = await fetch_schemas(relays, [t.source for t in cfg.tables],
                                          versions=self.sync.versions,
                                          credentials=cfg.credentials)
            maps = await asyncio.to_thread(self._prepare_tables, schemas)
            position = TargetPosition(await self._first_position(relays))
            client = DatabusClient(
                list(cfg.relays), bootstrap=list(cfg.bootstrap),
                zookeeper=cfg.zookeeper or None, cluster=cfg.cluster or None,
                sources=[t.source for t in cfg.tables], checkpoint_store=position,
                max_request_bytes=cfg.max_request_bytes,
                # Retries of an unavailable target happen inside the callback.
                callback_timeout=7 * 86400.0, name=f"databus-replicate-{cfg.name}",
                # What it presents to relays and bootstrap services (DESIGN 18).
                ca_file=cfg.ca_file, cert_file=cfg.cert_file, key_file=cfg.key_file,
                token=cfg.token.reveal() if cfg.token is not None else None,
            )
            dialect = target.dialect
            consumer = ApplyConsumer(cfg, target, maps, position, self._remap,
                                     lambda table: make_fold(table, dialect), self.stats)
            client.register(consumer)
            self.client, self.consumer = client, consumer
            consumer.on_fatal = client.stop
            consumer.is_older = self.sync.is_older
            consumer.start()
            if self._stopping:
                client.stop()  # asked to stop while starting: before the first window
            self.stats.state = "running"
            # The copy's estimated size, from the bootstrap service (replicator/_status.py).
            estimating = (asyncio.create_task(estimate_copies(
                consumer.stats, cfg.bootstrap, credentials=cfg.credentials))
                if cfg.bootstrap else None)
            try:
                await client.run_async()
            except DatabusError:
                if consumer.fatal is not None:
                    raise _stop_of(consumer.fatal) from consumer.fatal
                raise
            finally:
                if estimating is not None:
                    estimating.cancel()
                await asyncio.to_thread(consumer.close)
            if consumer.fatal is not None:
                raise _stop_of(consumer.fatal) from consumer.fatal
        finally:
            await asyncio.to_thread(target.close)

    async def _serve_status(self) -> Any:
        """``/v1/status``, ``/metrics``, ``/healthz`` and ``/readyz`` on ``metrics_port``
        (None: off), from the start (state ``starting`` until the client runs). With
        ``[replicate.tls]`` over HTTPS (the certificate files looked at every few
        seconds, loaded again when they change); with ``metrics_token``, ``/v1/status``
        and ``/metrics`` need it (401), ``/healthz`` and ``/readyz`` stay open."""
        cfg = self.config
        if not cfg.metrics_port:
            return None
        from aiohttp import web

        from databus._http import STATS, HttpStats, json_errors, json_response
        from databus._readiness import readiness_response
        from databus._serving import ListenError
        from databus.config import redact_uri
        from databus.replicator._readiness import components_of
        from databus.replicator._status import metrics_page, status_document
        from databus.security import (
            CertificateReloader,
            Guard,
            check_operational,
            install,
            server_context,
        )

        stats = self.stats

        def document() -> dict[str, Any]:
            m = self.client.metrics if self.client is not None else None
            return status_document(stats, relay_max_scn=m.relay_max_scn if m else None,
                                   lag_ms=m.lag_ms if m else None, target=redact_uri(cfg.target),
                                   lag_seconds=m.lag_seconds if m else None)

        async def readyz(request: web.Request) -> web.Response:
            return readiness_response(components_of(document()))

        async def status(request: web.Request) -> web.Response:
            check_operational(request)
            return json_response(document())

        async def metrics(request: web.Request) -> web.Response:
            check_operational(request)
            return web.Response(body=metrics_page(document),
                                content_type="text/plain", charset="utf-8")

        async def healthz(request: web.Request) -> web.Response:
            return json_response({"status": stats.state})

        # A missing or wrong certificate file fails here, in one line, before anything.
        tls = server_context(cfg.tls, "replicate.tls") if cfg.tls is not None else None
        app = web.Application(middlewares=[json_errors])  # 401 as a JSON error
        app[STATS] = HttpStats()
        install(app, Guard(metrics_token=cfg.metrics_token))
        if tls is not None and cfg.tls is not None:
            reloader = CertificateReloader(cfg.tls, tls, "replicate.tls")

            async def watch_certificates(app: web.Application) -> AsyncIterator[None]:
                task = asyncio.create_task(_check_every(reloader, CERT_CHECK_S),
                                           name="databus-replicate-tls-reload")
                yield
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

            app.cleanup_ctx.append(watch_certificates)
        app.router.add_get("/v1/status", status)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, cfg.metrics_host, cfg.metrics_port,
                              ssl_context=tls).start()
        except OSError as exc:  # a port in use: one line, nothing opened yet
            await runner.cleanup()
            raise ListenError(f"cannot listen on {cfg.metrics_host}:{cfg.metrics_port} "
                              f"(replicate.metrics_port): {exc.strerror or exc}") from None
        except BaseException:
            await runner.cleanup()
            raise
        # Logged once this process holds the replication (``_run_target``): a second
        # one started by mistake says one line, its error.
        scheme = "https" if tls is not None else "http"
        self._status_url = f"{scheme}://{cfg.metrics_host}:{cfg.metrics_port}/v1/status"
        return runner

    async def _first_position(self, relays: tuple[str, ...]
                              ) -> Callable[[], Checkpoint | None]:
        """Where the client starts: the target's position; on a first start with
        ``initial_copy = "dump"``, after the SCN from which a relay dump is read."""
        if self.config.initial_copy != "dump":
            return self._load_position
        if await asyncio.to_thread(self._load_position) is not None:
            return self._load_position
        from databus.replicator._initial_copy import request_dump

        started = await asyncio.to_thread(request_dump, self.config, relays)

        def load() -> Checkpoint | None:
            return self._load_position() or started.start

        return load

    def _load_position(self) -> Checkpoint | None:
        return _checkpoint_of(self.target.load_checkpoint(self.config.name),
                              self.target.load_state(self.config.name))

    def _prepare_tables(self, schemas: Mapping[str, Schema]) -> dict[str, TableMap]:
        """The table maps for the current source schemas, each target table created or
        reconciled with its schema (replicator/_schema_sync.py)."""
        return {cfg.source: self.sync.first_map(cfg.source, schemas[cfg.source])
                for cfg in self.config.tables}

    def _remap(self, source: str, schema: Schema) -> TableFold | None:
        """A new source schema version in the stream: the new fold, after the target
        table was made to follow it (on_ddl)."""
        assert self.consumer is not None
        old = self.consumer.maps[source]
        new = self.sync.follow(source, schema, old.key)
        return make_fold(new, self.target.dialect)


# How often the status server's certificate files are looked at.
CERT_CHECK_S = 5.0


async def _check_every(reloader: Any, interval: float) -> None:
    """``reloader.check()`` every ``interval`` seconds (a ``CertificateReloader``)."""
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(reloader.check)


def _stop_of(fatal: BaseException) -> ReplicationStopped | SchemaChangeStopped:
    """The error a run stops with, for the consumer's fatal error."""
    if isinstance(fatal, SchemaChangeStopped):
        return SchemaChangeStopped(str(fatal), fatal.fix)
    return ReplicationStopped(str(fatal))


def make_fold(table: TableMap, dialect: Dialect) -> TableFold:
    """The fold of ``table``'s events for a ``dialect`` target: a converter per column."""
    from databus.replicator._types import converter

    return TableFold(table, [converter(c.avro_type, dialect, key=c.target in table.key,
                                       sql_type=c.sql_type) for c in table.columns])


async def relay_urls(config: ReplicateConfig, wait_s: float = 15.0) -> tuple[str, ...]:
    """The relays to ask for schemas and dumps: ``relays``, or the members of the relay
    cluster that ``zookeeper`` and ``cluster`` name, read now (waiting up to ``wait_s``
    for a first member: a cluster starting beside the replicator)."""
    if config.relays:
        return config.relays
    from databus.client import RelayDiscovery

    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        discovery = RelayDiscovery(config.zookeeper, config.cluster)
        try:
            urls = await asyncio.to_thread(discovery.start)
        finally:
            await asyncio.to_thread(discovery.close)
        if urls or loop.time() >= deadline:
            break
        await asyncio.sleep(0.5)
    if not urls:
        raise DatabusError(f"relay cluster {config.cluster!r} on ZooKeeper "
                           f"{config.zookeeper} has no member", retriable=True)
    return tuple(urls)


class _NoSchemaYet(DatabusError):
    """The relay answers but has not read a schema of the source yet."""


async def fetch_schemas(relays: tuple[str, ...], sources: list[str],
                        wait_s: float = 15.0, versions: dict[str, list[int]] | None = None,
                        credentials: ClientCredentials = NO_CREDENTIALS
                        ) -> dict[str, Schema]:
    """The newest schema of each source, from the first relay that answers; the
    fingerprints of every version, oldest first, into ``versions`` when given.

    A relay that has just started knows a source's schema only once its fetcher
    has read it: that answer is asked again for up to ``wait_s`` seconds before
    it counts as an error, so that a replicator started beside its relay does not
    fail on the race. ``credentials`` are presented to every relay; when no relay
    answers and the last refused them, that refusal (401/403) is raised as it is.
    """
    import aiohttp

    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    timeout = aiohttp.ClientTimeout(total=30)
    async with client_session(credentials, timeout=timeout) as session:
        while True:
            last: BaseException | None = None
            waiting = False
            for relay in relays:
                try:
                    return await _schemas_from(session, relay, sources, versions)
                except (aiohttp.ClientError, TimeoutError, OSError, KeyError,
                        DatabusError) as exc:
                    last = exc
                    waiting = waiting or isinstance(exc, _NoSchemaYet)
            if isinstance(last, UnauthorizedError | ForbiddenError):
                raise last
            if not waiting or loop.time() >= deadline:
                raise DatabusError(f"no relay gave the source schemas: {last}")
            await asyncio.sleep(0.2)


async def _schemas_from(session: Any, relay: str, sources: list[str],
                        versions: dict[str, list[int]] | None = None) -> dict[str, Schema]:
    out: dict[str, Schema] = {}
    for source in sources:
        async with session.get(f"{relay.rstrip('/')}/v1/schemas",
                               params={"source": source}) as resp:
            doc: Any = await read_json(resp, relay)
            if resp.status != 200:
                detail = doc.get("message") if isinstance(doc, dict) else doc
                if resp.status in (401, 403):
                    refused = UnauthorizedError if resp.status == 401 else ForbiddenError
                    raise refused(f"relay {relay} answered {resp.status} for the schemas "
                                  f"of {source}: {detail}")
                raise DatabusError(f"relay answered {resp.status} for {source}: {detail}")
        listed = doc["versions"]
        if not listed:
            raise _NoSchemaYet(f"relay has no schema for {source} yet")
        out[source] = Schema(listed[-1]["schema"])
        if versions is not None:
            versions[source] = [Schema(v["schema"]).fingerprint for v in listed]
    return out
