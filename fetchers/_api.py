"""The fetcher plugin API (DESIGN section 8).

A fetcher pulls committed transactions out of one physical source and pushes each as
a window into a ``WindowSink`` (the relay's event buffer): ``start_window(scn)``,
``append(event)`` per row change, ``end_window()``; ``rollback()`` drops a window it
could not finish. It runs in its own thread, started by the relay's fetcher host with
the SCN to resume after, and returns when ``stop`` is set. An exception it raises is
logged by the host, which rolls back the open window and restarts a new instance, with
backoff, from the buffer's max SCN: a fetcher never needs its own retry loop for
crashes, only for the errors it can handle better itself. The exception is a
``DatabusError`` with ``retriable=False`` (a wrong config, a window larger than the
buffer): that fetcher is marked ``failed`` and not restarted, since retrying cannot help.

A fetcher also says which logical sources its configuration names
(``configured_sources``): the relay lists the ones named exactly in ``/v1/sources``
from the start, with a stable id and state ``pending``, before the table exists at the
source (a consumer deployed before the schema migration waits for them), and serves a
stream naming a configured source with no events rather than ``unknown_source``.

Fetchers are found by URI scheme through the ``databus.fetchers`` entry point group
(``synthetic = "databus.fetchers.synthetic:SyntheticFetcher"``), so a third party adds
one without touching the relay.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol
from urllib.parse import urlsplit

from databus.errors import ConfigError, SourceQuarantinedError
from databus.event import Key
from databus.schemas import Schema


class WindowSink(Protocol):
    """Where a fetcher writes windows (the relay's ``EventBuffer``).

    ``watermark(token)`` is called inside an open window, in log order among its
    ``append`` calls, for every row a fetcher reads from the source's dump watermark
    table (``databus_watermark``, DESIGN 8.1): those rows are never appended as events.
    A window holding only watermarks is ended like any other; the relay's dump engine
    decides whether it is stored.
    """

    def start_window(self, scn: int) -> None: ...

    def append(self, event: bytes) -> None: ...

    def watermark(self, token: str) -> None: ...

    def end_window(self, timestamp_ns: int | None = None) -> int: ...

    def rollback(self) -> None: ...


# -- dumps (DESIGN 8.1) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DumpRow:
    """One row of a dump chunk, encoded exactly as the fetcher encodes a logged row."""

    key: Key
    value: bytes  # Avro binary, the fetcher's writer schema
    fingerprint: int  # that schema's fingerprint


@dataclass(frozen=True, slots=True)
class DumpChunk:
    """Rows of one table in primary-key order, read after a cursor.

    ``cursor`` is the primary key of the last row read, as JSON-able values (what the
    next chunk passes back as ``after``); None when no row was read. ``done`` is True
    when the table has no row after this chunk (fewer rows than asked for).
    """

    source: str
    source_id: int
    rows: list[DumpRow]
    cursor: list[Any] | None
    done: bool


class DumpSource(Protocol):
    """What the dump engine needs from a source (one connection of its own).

    Every method may raise ``SourceError`` (retriable: the engine retries the chunk with
    backoff) or ``DumpSetupError`` (the watermark table or a grant is missing: the dump
    fails with that message). Implementations register schema versions with the relay's
    catalog before returning rows, so every fingerprint is known to the relay.
    """

    def setup(self, *, dry_run: bool = False) -> list[str]:
        """Create the watermark table (``databus dump setup``): returns the statements,
        run unless ``dry_run``. Idempotent."""
        ...

    def grant_statements(self, user: str) -> list[str]:
        """The GRANTs an administrator runs so that ``user`` (the relay's) may write
        watermarks (``databus dump setup`` prints them); none when access is not by
        grant (SQLite's file permissions)."""
        ...

    def check(self) -> None:
        """Raise ``DumpSetupError`` unless the watermark table exists and is writable."""
        ...

    def tables(self) -> list[str]:
        """The logical sources this fetcher captures that exist now (dumpable)."""
        ...

    def estimate_rows(self, source: str) -> int:
        """About how many rows ``source`` has (for progress), 0 when unknown."""
        ...

    def write_watermark(self, token: str) -> None:
        """Write ``token`` into the watermark table in a transaction of its own."""
        ...

    def read_chunk(self, source: str, after: list[Any] | None, limit: int) -> DumpChunk:
        """At most ``limit`` rows of ``source`` with a key after ``after`` (None: from the
        start), in key order. ``UnknownSourceError``-like ``DumpSetupError`` when the
        table is gone or has no primary key.

        A source that can cut a table into key ranges (read in parallel) also takes
        ``until=`` (a key: no row with a greater key; ``done`` then means the range has
        no more rows) and has ``split_points(source, count) -> list[cursor]``: up to
        ``count - 1`` increasing keys, as JSON-able values, that cut the table into
        ranges of about the same size (see ``MysqlDumpSource``). Without them a table is
        read as one range."""
        ...

    def read_keys(self, source: str, keys: list[Any]) -> DumpChunk:
        """The rows of ``source`` whose primary key is one of ``keys`` (each a scalar, or
        a list for a composite key, in key column order); missing keys are skipped."""
        ...

    def cleanup_watermarks(self, keep: frozenset[str]) -> None:
        """Delete watermark rows except ``keep`` (best effort)."""
        ...

    def close(self) -> None: ...


class SourceCatalog(Protocol):
    """The relay's catalog of logical sources: stable ids and schema versions."""

    def source_id(self, name: str) -> int:
        """The id of logical source ``name`` (``database.table``), allocated if new."""
        ...

    def register_schema(self, name: str, schema: Schema) -> Schema:
        """Record a (possibly new) schema version of ``name``; returns the stored one."""
        ...


@dataclass(frozen=True, slots=True)
class ConfiguredSources:
    """The logical sources a fetcher's configuration names, whether they exist yet or not.

    ``names`` are named exactly (``tables=shop.orders``): the relay gives each an id at
    start. ``databases`` are whole databases (``tables=shop.*``: every ``shop.<table>``),
    and ``everything`` means every ``db.table`` outside ``excluded_databases``: their
    tables are known only once they exist, so they get an id when the fetcher first
    sees them (``SourceCatalog.source_id``), and until then only ``matches`` answers.
    """

    names: frozenset[str] = frozenset()
    databases: frozenset[str] = frozenset()
    everything: bool = False
    excluded_databases: frozenset[str] = frozenset()

    def matches(self, name: str) -> bool:
        """True when ``name`` (``database.table``) is a source this configuration names."""
        if name in self.names:
            return True
        database, dot, table = name.rpartition(".")
        if not dot or not database or not table:
            return False
        if self.everything:
            return database not in self.excluded_databases
        return database in self.databases


@dataclass(frozen=True, slots=True)
class SourceFailure:
    """Why one logical source is quarantined (``FetcherContext.quarantine``).

    ``scn`` is the SCN of the window in which the failure was met: the source's events
    from that window on are not in the buffer. ``reason`` says what happened (it is
    shown to operators and consumers: never a secret, never a row's values), ``fix``
    what to do about it, ending with ``databus relay heal``.
    """

    source: str
    scn: int
    reason: str
    fix: str

    def error(self, *, retriable: bool = False) -> SourceQuarantinedError:
        return SourceQuarantinedError(
            f"source {self.source} quarantined at SCN {self.scn}: {self.reason}",
            source=self.source, scn=self.scn, reason=self.reason, fix=self.fix,
            retriable=retriable)


def _stop(failure: SourceFailure) -> None:
    raise failure.error(retriable=False)


@dataclass
class FetcherContext:
    """What the host gives a fetcher besides its URI."""

    buffer_name: str
    partition_id: int
    catalog: SourceCatalog
    # Set by the fetcher: the newest SCN the source has (for lag), and when it was read.
    report_source_scn: Callable[[int], None] = lambda scn: None
    # Lag in seconds (DESIGN 17). ``report_read_through(time_ns, next_within_s)``: the
    # fetcher has read, and written, everything the source committed up to ``time_ns``
    # (ns since the epoch, the source's clock where the source gives one): a heartbeat
    # that came back, a poll that found nothing newer, a transaction of no captured
    # table. It says so again, or writes a window, within ``next_within_s``; after that
    # much silence the host shows the lag as unknown (null), never 0. Each window the
    # fetcher writes counts as read-through its ``end_window`` timestamp (the source's
    # commit time), so a fetcher that never calls this still shows lag while busy, and
    # unknown while idle.
    report_read_through: Callable[[int, float], None] = lambda time_ns, next_within_s: None
    # Kept by the host across restarts of this buffer's fetcher (a new instance gets the
    # same dict): what a fetcher learnt that must outlive one run, e.g. which configured
    # tables it has seen absent (their later appearance is a migration in progress).
    memory: dict[str, Any] = field(default_factory=dict)
    # Set by the fetcher: details of its own for ``/v1/status`` (``fetcher.details``) and
    # ``/metrics`` (each number as ``databus_relay_fetcher_<name>{buffer}``), e.g. a
    # replication slot's retained WAL. Names are [a-z0-9_]; the last report wins.
    report_details: Callable[[dict[str, Any]], None] = lambda details: None
    # msync the buffer: what the fetcher wrote survives a machine crash once this
    # returns (a killed process loses nothing without it). For fetchers that confirm
    # their position to the source (a replication slot).
    flush_buffer: Callable[[], None] = lambda: None
    # Per-source failure isolation (DESIGN 17). A fetcher that meets a failure belonging
    # to one logical source (a row its schema cannot hold, a name the relay cannot
    # serve, a statement-format or undecodable event touching it, an unsupported DDL)
    # calls ``quarantine`` with a ``SourceFailure`` instead of raising, leaves that
    # source's rows out of the open window and of every later one, and goes on with the
    # other sources. The host records it (durably) and returns; under
    # ``on_source_error = "stop"`` (and with no host: this default) it raises
    # ``SourceQuarantinedError`` instead, non-retriable, which fails the fetcher.
    quarantine: Callable[[SourceFailure], None] = field(default=lambda failure: _stop(failure))
    # The sources in quarantine now (a fetcher reads it at start and may cache it for
    # its run: ``databus relay heal`` restarts the fetcher after lifting one).
    quarantined: Callable[[], frozenset[str]] = lambda: frozenset()
    # Set by the fetcher: the databases its configuration names whose tables the source
    # does not list to the relay's user (no privilege on them, or no such database), so
    # that a consumer waiting for a table there is told why (DESIGN 17: "not visible to
    # the relay's user" rather than "does not exist yet"). The last report wins.
    report_unlisted: Callable[[frozenset[str]], None] = lambda databases: None


class Fetcher(ABC):
    """A source adapter. Subclasses set ``scheme`` and implement ``run``."""

    scheme: ClassVar[str]

    def __init__(self, uri: str, context: FetcherContext) -> None:
        self.uri = uri
        self.context = context

    @abstractmethod
    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        """Push windows with SCN > ``start_after_scn`` (None: from the source's current
        position) until ``stop`` is set. Raise on errors; the host restarts retriable ones."""

    def initial_scn(self) -> int | None:
        """The SCN an empty buffer starts after when ``run`` gets None (the source's
        current position), or None if the fetcher starts from the source's beginning."""
        return None

    def configured_sources(self) -> ConfiguredSources | None:
        """The logical sources this fetcher's configuration names (see
        ``ConfiguredSources``), or None when it cannot say: then only the sources it
        has registered so far are known to the relay (a third-party fetcher's default)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, most fetchers have nothing to free
        """Release connections; called by the host after ``run`` returned or raised."""

    def open_dump_source(self) -> DumpSource | None:
        """A ``DumpSource`` on a connection of its own, or None when this kind of source
        cannot be dumped (the default). Called on an instance whose ``run`` never runs."""
        return None


def fetcher_class(uri: str) -> type[Fetcher]:
    """The fetcher registered for ``uri``'s scheme."""
    scheme = urlsplit(uri).scheme
    if not scheme:
        raise ConfigError("source URI has no scheme: expected e.g. synthetic:// or mysql://")
    found = [ep for ep in entry_points(group="databus.fetchers") if ep.name == scheme]
    if not found:
        known = sorted(ep.name for ep in entry_points(group="databus.fetchers"))
        raise ConfigError(f"no fetcher for scheme {scheme!r}; known: {', '.join(known)}")
    cls = found[0].load()
    if not (isinstance(cls, type) and issubclass(cls, Fetcher)):
        raise ConfigError(f"entry point for {scheme!r} is not a Fetcher subclass")
    return cls
