"""A relay: its buffers, its source catalog and its fetchers, without the HTTP shell.

Files in ``data_dir``: ``<buffer>.buf`` (one mmap ring per buffer) and
``catalog.json`` (source ids and every schema version). Reopening the same data dir
serves everything the relay had, and the fetchers resume at each buffer's max SCN.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from databus.config import RelayConfig
from databus.errors import (
    ConnectionLostError,
    DatabusError,
    DumpConflictError,
    DumpSetupError,
    DumpUnsupportedError,
    NotLeaderError,
    UnknownSourceError,
)
from databus.fetchers._api import ConfiguredSources, Fetcher
from databus.relay._buffer import EventBuffer
from databus.relay._catalog import RelayCatalog, SourceEntry
from databus.relay._fetcher_host import FetcherHost
from databus.relay._liveness import SessionLostError, session_judge
from databus.relay.dumps import DumpManager, DumpRequest
from databus.relay.dumps._engine import dump_parallelism
from databus.relay.quarantine._record import (
    QUARANTINE_FILENAME,
    Quarantine,
    QuarantineMarker,
    QuarantineStore,
)
from databus.schemas import SchemaRegistry

if TYPE_CHECKING:
    from databus.relay.cluster import ClusterMember

log = logging.getLogger("databus.relay")


def buffer_path(data_dir: Path, name: str) -> Path:
    """The ring file of buffer ``name``."""
    return data_dir / f"{name}.buf"


class CatalogReader(Protocol):
    """The read side of a relay's catalog (``RelayCatalog``, ``FollowerCatalog``)."""

    @property
    def registry(self) -> SchemaRegistry: ...

    def sources(self) -> list[SourceEntry]: ...

    def source(self, name: str) -> SourceEntry: ...

    def by_id(self, source_id: int) -> SourceEntry: ...


class SourceLocator(Protocol):
    """Which buffer's configuration names a source (``FetcherHost``, or a worker's copy)."""

    def configured_buffer(self, source: str) -> str | None: ...

    def configured_sources(self) -> Mapping[str, ConfiguredSources | None]: ...

    def unlisted(self, buffer: str) -> frozenset[str]:
        """The databases of ``buffer``'s configuration that its source does not list to
        the relay's user (``FetcherContext.report_unlisted``)."""
        ...


class QuarantineReader(Protocol):
    """The quarantined sources (``QuarantineStore``, or a worker's ``QuarantineView``)."""

    def active(self, buffer: str) -> dict[str, Quarantine]: ...


class RelayReader(Protocol):
    """What the read endpoints (``/v1/stream``, ``/v1/sources``, ``/v1/schemas``) need
    of a relay: the main process's ``Relay``, or a worker process's read-only view of
    the same files (relay/_worker.py; docs/relay.md, "Workers")."""

    @property
    def config(self) -> RelayConfig: ...

    @property
    def buffers(self) -> Mapping[str, EventBuffer]: ...

    @property
    def catalog(self) -> CatalogReader: ...

    @property
    def fetchers(self) -> SourceLocator: ...

    @property
    def quarantines(self) -> QuarantineReader: ...


class Relay:
    def __init__(self, config: RelayConfig, *, backoff_initial: float = 0.1,
                 backoff_max: float = 5.0) -> None:
        self.config = config
        data_dir = config.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.catalog = RelayCatalog(data_dir / "catalog.json")
        self.buffers: dict[str, EventBuffer] = {}
        try:
            for partition_id, buffer_config in enumerate(config.buffers):
                self.buffers[buffer_config.name] = EventBuffer(
                    buffer_path(data_dir, buffer_config.name),
                    buffer_config.capacity_bytes,
                    index_every_bytes=buffer_config.index_every_bytes,
                    partition_id=partition_id,
                )
                self.catalog.check_buffer_events(
                    buffer_config.name, self.buffers[buffer_config.name].recovered_sources
                )
        except BaseException:
            for buffer in self.buffers.values():
                buffer.close()
            raise
        try:
            # Sources set aside (DESIGN 17): kept across restarts, read by workers too.
            self.quarantines = QuarantineStore(data_dir / QUARANTINE_FILENAME)
        except BaseException:
            for buffer in self.buffers.values():
                buffer.close()
            raise
        self.fetchers = FetcherHost(
            config, self.buffers, self.catalog,
            backoff_initial=backoff_initial, backoff_max=backoff_max,
            quarantines=self.quarantines,
        )
        try:
            self.dumps = DumpManager(data_dir / "dumps.json")
        except BaseException:
            for buffer in self.buffers.values():
                buffer.close()
            raise
        self._started = False
        self.cluster: ClusterMember | None = None
        if config.cluster is not None:
            from databus.relay.cluster import join_cluster

            self.cluster = join_cluster(self)
        # Set by the worker pool (relay/_workers.py) when other processes serve too:
        # their pid, state and restarts for /v1/status.
        self.workers_status: Callable[[], list[dict[str, Any]]] | None = None

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.fetchers.dump_after_gap = self._dump_after_gap
            self.fetchers.start()
            if self.cluster is not None:
                try:
                    self.cluster.start()  # a follower's fetcher waits until then
                except BaseException:
                    self.fetchers.stop()
                    self._started = False
                    raise
            self.dumps.start(self.fetchers.dump_ports())
            for buffer_config in self.config.buffers:
                if buffer_config.initial_dump and not self.dumps.has_dump(
                        buffer_config.name, "initial_dump"):
                    self.dumps.start_dump(
                        DumpRequest(buffer=buffer_config.name, sources=(),
                                    chunk_rows=buffer_config.dump_chunk_rows,
                                    delay_ms=buffer_config.dump_delay_ms,
                                    parallelism=dump_parallelism(buffer_config),
                                    reason="initial_dump"),
                        buffer_of=self.fetchers.configured_buffer)
            for record in self.quarantines.healing():
                # A heal that lifted the quarantine but did not finish: its dump not
                # recorded, or its marker not written yet.
                log.warning("buffer %s: finishing the heal of source %s", record.buffer,
                            record.source)
                if not record.heal_marked:
                    self.fetchers.queue_marker(record.buffer,
                                               QuarantineMarker(record.source, "healed"))
                if record.heal_dump is None:
                    self._heal_dump(record)

    # -- quarantine (DESIGN 17, relay/quarantine/_record.py) -----------------------------------

    def heal(self, source: str) -> dict[str, Any]:
        """``databus relay heal``: take ``source`` out of quarantine at the current log
        position, restart its buffer's fetcher (it reloads the table's schema) and dump
        the table (reason ``heal``), so that every consumer's copy converges.

        ``UnknownSourceError`` for a source this relay does not know,
        ``NotQuarantinedError`` when it is not in quarantine, ``NotLeaderError`` on a
        cluster member that does not lead its buffer, ``DumpUnsupportedError`` when its
        source cannot be dumped, ``DumpConflictError`` when a dump of it is
        active. Durable in this order: the record marked healing (the fetcher captures
        the source again from its next attempt), the dump recorded in ``dumps.json``;
        the record goes once that is done and the heal marker landed in a window; a
        relay restarted in between finishes the heal."""
        buffer = self._buffer_of(source)
        if buffer is None:
            raise UnknownSourceError(f"unknown source {source!r}: this relay does not "
                                     "capture it")
        record = self.quarantines.active(buffer).get(source)
        if record is None:
            from databus.errors import NotQuarantinedError

            raise NotQuarantinedError(f"source {source} is not quarantined; nothing to heal")
        if self.cluster is not None:
            seat = self.cluster.buffer_status(buffer)
            if seat.get("role") not in ("leader", "independent"):
                raise NotLeaderError(
                    f"this relay does not lead buffer {buffer} (it is {seat.get('role')}); "
                    f"heal at its leader ({seat.get('leader') or 'none elected yet'}): "
                    "its followers follow the heal")
        self._check_dumpable(buffer, source)
        if self.dumps.has_active_source(buffer, source):
            raise DumpConflictError(f"a dump of {source} is queued or running; cancel it "
                                    "or wait for it, then heal")
        record = self.quarantines.begin_heal(buffer, source)
        log.warning("buffer %s: healing source %s (quarantined at SCN %d): capturing it "
                    "again from the current position, then dumping it", buffer, source,
                    record.scn)
        self.fetchers.queue_marker(buffer, QuarantineMarker(source, "healed"))
        restarted = self.fetchers.restart(buffer)
        dump = self._heal_dump(record)
        return {"source": source, "buffer": buffer, "quarantined_scn": record.scn,
                "healed": True, "fetcher_restarted": restarted,
                "dump": None if dump is None else self.dumps.get(dump)}

    def _check_dumpable(self, buffer: str, source: str) -> None:
        """Before lifting anything: the heal's dump can run. ``DumpUnsupportedError``
        (no dump support: a chained relay), ``DumpSetupError`` (no watermark table, a
        missing grant: its message names the fix), ``ConnectionLostError`` (the source
        does not answer now)."""
        if self.fetchers.fetcher_class(buffer).open_dump_source is Fetcher.open_dump_source:
            raise DumpUnsupportedError(
                f"buffer {buffer}'s source cannot be dumped, so {source} cannot be healed "
                "here; heal it at the relay that reads the database (a chained relay "
                "follows that heal by itself)")
        fetcher = self.fetchers.new_fetcher(buffer)
        try:
            dump_source = fetcher.open_dump_source()
            if dump_source is None:
                raise DumpUnsupportedError(f"buffer {buffer}'s source cannot be dumped, "
                                           f"so {source} cannot be healed here")
            try:
                dump_source.check()
            finally:
                dump_source.close()
        except DumpSetupError:
            raise
        except (DatabusError, OSError) as exc:
            if isinstance(exc, DumpUnsupportedError):
                raise
            raise ConnectionLostError(
                f"cannot check the dump setup of buffer {buffer}'s source ({exc}); the "
                f"quarantine of {source} is kept: heal again once the source answers",
                retriable=True) from None
        finally:
            fetcher.close()

    def _heal_dump(self, record: Quarantine) -> str | None:
        """Record the heal's dump of ``record.source`` (unless one is active), then say
        so to the record (it goes once the heal marker landed too). Returns the dump id."""
        config = self.config.buffer(record.buffer)
        dump_id: str | None = None
        if config is not None and not self.dumps.has_active_source(record.buffer,
                                                                   record.source):
            dump_id = self.dumps.start_dump(
                DumpRequest(buffer=record.buffer, sources=(record.source,),
                            chunk_rows=config.dump_chunk_rows,
                            delay_ms=config.dump_delay_ms,
                            parallelism=dump_parallelism(config), reason="heal"),
                buffer_of=lambda name: record.buffer).id
        self.quarantines.heal_step(record.buffer, record.source, dump=dump_id or "")
        return dump_id

    def _buffer_of(self, source: str) -> str | None:
        try:
            return self.catalog.source(source).buffer
        except UnknownSourceError:
            return self.fetchers.configured_buffer(source)

    def session_down(self) -> SessionLostError | None:
        """None unless this relay is a cluster member out of its ZooKeeper session for
        longer than its session timeout (relay/_liveness.py)."""
        if self.cluster is None:
            return None
        return session_judge(self.cluster.disconnected_for(), self.cluster.session_timeout_s)

    def _dump_after_gap(self, buffer: str) -> None:
        """The fetcher of ``buffer`` skipped a source gap: dump every table (unless a
        dump of every table for the same reason is still active)."""
        config = next(b for b in self.config.buffers if b.name == buffer)
        if self.dumps.has_active(buffer, "source_gap"):
            return
        self.dumps.start_dump(
            DumpRequest(buffer=buffer, sources=(), chunk_rows=config.dump_chunk_rows,
                        delay_ms=config.dump_delay_ms, parallelism=dump_parallelism(config),
                        reason="source_gap"),
            buffer_of=self.fetchers.configured_buffer)

    def close(self) -> None:
        if self._started:
            self.dumps.close()
            self.fetchers.stop()
            if self.cluster is not None:
                self.cluster.close()  # after the fetchers: nothing is written any more
            self._started = False
        for buffer in self.buffers.values():
            buffer.close()
        self.buffers.clear()

    def window_time(self, buffer: str, scn: int) -> int | None:
        """The commit time (ns) of window ``scn`` of ``buffer``, None when not held
        (consumer lag in seconds, relay/_consumers.py)."""
        held = self.buffers.get(buffer)
        return None if held is None else held.window_timestamp_ns(scn)

    def status(self) -> dict[str, Any]:
        fetchers = self.fetchers.status()
        out: dict[str, Any] = {}
        for name, buffer in self.buffers.items():
            state = buffer.state()
            fetcher = fetchers.get(name)
            out[name] = {
                "partition_id": buffer.partition_id,
                "prev_scn": state.prev_scn,
                "min_scn": state.min_scn,
                "max_scn": state.max_scn,
                "used_bytes": state.used_bytes,
                "capacity_bytes": state.capacity,
                "events": state.events,
                "windows": state.windows,
                "input_bytes_per_second": round(buffer.input_rate(), 1),
                "fetcher": fetcher.to_json() if fetcher is not None else None,
                # Sources set aside (DESIGN 17): each {source, scn, reason, fix, since}.
                "quarantined": [q.to_json() for q in sorted(
                    self.quarantines.active(name).values(), key=lambda q: q.source)],
            }
            if self.cluster is not None:
                out[name]["cluster"] = self.cluster.buffer_status(name)
        dumps = self.dumps.status()
        for name, doc in out.items():
            doc["dumps"] = dumps.get(name, [])
        workers = self.workers_status() if self.workers_status is not None else []
        return {"buffers": out, "workers": workers}
