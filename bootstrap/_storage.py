"""The bootstrap store's interface: what the producer, the applier and the server need.

Two backends implement it (``_postgres.py``, ``_sqlite.py``) on one shared SQL core
(``_sql.py``), and one contract suite runs against both. Methods are blocking (DB-API
drivers); the asyncio parts call them through ``asyncio.to_thread``. The table layout is
documented in docs/bootstrap.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from databus._hashing import stable_key_hash
from databus.batch import (
    LogCopy,
    Scan,
    WindowFrames,
    copy_rows,
    group_rows,
    key_hashes,
    log_copy,
    restamp,
)
from databus.checkpoint import Checkpoint
from databus.errors import ConfigError, DatabusError
from databus.event import HEADER_SIZE, decode_header
from databus.filters import FilterSpec

COMPONENTS = ("producer", "applier")  # the writers of a store, one of each at a time


class FencedError(DatabusError):
    """A newer holder of the component's fence took over the store: this holder's write
    was refused, in the transaction that would have made it (bootstrap/_cluster.py)."""

    code = "fenced"
    retriable = False


@dataclass(frozen=True, slots=True)
class Fence:
    """What a writer (producer or applier) presents with each write: its ``token``,
    taken with ``BootstrapStorage.take_fence`` when it started, compared with the
    store's inside the write's transaction (a newer token there: ``FencedError``, no
    write). ``guard``, when set, runs just before the commit and raises when the writer
    may no longer write (a cluster member whose lease ran out)."""

    component: str
    token: int
    guard: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One data event as the log keeps it: the wire bytes plus the columns filters and
    the applier need (from the event header, so nothing is decoded twice)."""

    source: str
    op: int
    pkey: int
    key_hash: int
    key: bytes
    event: bytes


def stored_event(source: str, event: bytes, *, key_hash: bool = True) -> StoredEvent:
    """The log row of one verified data event (its header gives every column)."""
    header = decode_header(event)
    key = event[HEADER_SIZE:HEADER_SIZE + header.key_length]
    return StoredEvent(source, int(header.op), header.partition_key,
                       stable_key_hash(key) if key_hash else 0, key, event)


@dataclass(frozen=True, slots=True)
class LogWindow:
    """One whole window (source transaction) as the producer appends it."""

    scn: int
    timestamp_ns: int
    events: Sequence[StoredEvent]


@dataclass(slots=True)
class LogRows:
    """The log rows of one source in an append, columnar: events ``indexes`` of the
    scan of ``body``, stored at (``scns``, ``seqs``). ``copy_data`` gives them as binary
    COPY rows, ``tuples`` as (scn, seq, op, pkey, key_hash, key, event) tuples."""

    body: bytes
    scan: Scan
    key_hashes: array[int] | None
    source_id: int
    indexes: array[int] = field(default_factory=lambda: array("q"))
    scns: array[int] = field(default_factory=lambda: array("q"))
    seqs: array[int] = field(default_factory=lambda: array("q"))

    def copy_data(self) -> bytes:
        return copy_rows(self.body, self.scan, self.indexes, self.scns, self.seqs,
                         self.key_hashes, self.source_id)

    def tuples(self) -> list[tuple[int, int, int, int, int, bytes, bytes]]:
        s, body, own = self.scan, self.body, self.source_id
        out = []
        for k, i in enumerate(self.indexes):
            offset, total = s.offset[i], s.length[i]
            key_start, key_end = s.key_span(i)
            event = (body[offset:offset + total] if s.source_id[i] == own
                     else restamp(body, offset, total, own))
            out.append((self.scns[k], self.seqs[k], s.op[i], s.partition_key[i],
                        self.key_hashes[i] if self.key_hashes is not None else 0,
                        body[key_start:key_end], event))
        return out

    def __len__(self) -> int:
        return len(self.indexes)


@dataclass(slots=True)
class LogBatch:
    """Whole windows of one relay response, as the producer appends them, without an
    object per event: the body, its scan and its framing (``frames.eows``: each window
    runs from the previous EOW, or the scan's start, to its EOW; control events in it
    are not stored). ``names`` maps the relay's source ids to names.

    ``log_copy`` gives the rows as binary COPY streams in one call (PostgreSQL);
    ``split`` gives them per source, for stores that insert rows (SQLite)."""

    body: bytes
    scan: Scan
    frames: WindowFrames
    names: Mapping[int, str]
    key_hash: bool
    events: int = 0  # data events in the windows
    # The last ``log_copy``'s source map and result (the producer makes it while the
    # previous append runs; the store's append then finds it made).
    copied: tuple[dict[int, int], LogCopy] | None = None

    @property
    def eows(self) -> array[int]:
        return self.frames.eows

    @property
    def last_scn(self) -> int:
        return self.scan.scn[self.frames.eows[-1]]

    @property
    def last_timestamp_ns(self) -> int:
        return self.scan.timestamp[self.frames.eows[-1]]

    @property
    def scns(self) -> array[int]:
        """Each window's SCN (its EOW's)."""
        scns = self.scan.scn
        return array("q", [scns[e] for e in self.frames.eows])

    @property
    def timestamps(self) -> array[int]:
        ts = self.scan.timestamp
        return array("q", [ts[e] for e in self.frames.eows])

    def __len__(self) -> int:
        return len(self.frames.eows)

    def source_names(self) -> set[str]:
        # The windows cover the scan from its start to the last EOW: the ids are those
        # of that slice (set() of an array slice, in C).
        if not len(self.frames.eows):
            return set()
        ids = set(self.scan.source_id[:self.frames.eows[-1]])
        return {self.names[i] for i in ids if i >= 0}

    def owner(self, ids: Mapping[str, int]) -> dict[int, int]:
        """The relay's source ids -> the store's (``ids``: names to the store's ids)."""
        return {sid: ids[name] for sid, name in self.names.items() if name in ids}

    def log_copy(self, ids: Mapping[str, int]) -> LogCopy:
        """Every row of the windows as binary COPY streams, per store source id and for
        ``dbus_windows`` (``databus.batch.log_copy``), made once per source map."""
        owner = self.owner(ids)
        if self.copied is None or self.copied[0] != owner:
            self.copied = owner, log_copy(self.body, self.scan, self.frames, owner,
                                          self.key_hash)
        return self.copied[1]

    def split(self, ids: Mapping[str, int]
              ) -> tuple[dict[int, LogRows], list[tuple[int, int, int, int]]]:
        """The rows per store source id (``ids``: names to the store's ids) and the
        ``dbus_windows`` rows (scn, timestamp_ns, events, bytes)."""
        s = self.scan
        hashes = key_hashes(self.body, s) if self.key_hash else None
        eows = self.frames.eows
        firsts = array("q", [0, *[e + 1 for e in eows[:-1]]]) if len(eows) else array("q")
        scns, timestamps = self.scns, self.timestamps
        groups, counted = group_rows(s, firsts, eows, scns, self.owner(ids))
        by_source = {target: LogRows(self.body, s, hashes, target, *columns)
                     for target, columns in groups.items()}
        # A window with no data event (only markers) stores nothing.
        windows = [(scns[k], timestamps[k], count, size) for k, count, size in counted]
        return by_source, windows


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """One applier batch: windows (``from_scn``, ``to_scn``] moved into the snapshot."""

    from_scn: int
    to_scn: int
    windows: int
    rows: int
    new_keys: int


@dataclass(frozen=True, slots=True)
class RetentionResult:
    log_floor_scn: int | None
    windows_dropped: int
    tombstones_purged: int


@dataclass(frozen=True, slots=True)
class StorageState:
    """What the store holds; the server's planning and ``/v1/status`` read this."""

    producer_scn: int | None  # newest window in the log
    applied_scn: int | None  # newest window applied to the snapshot
    log_floor_scn: int | None  # every window after it is in the log (None: nothing yet)
    log_windows: int
    log_bytes: int
    snapshot_rows: dict[str, int] = field(default_factory=dict)
    applier_rows: int = 0
    applier_new_keys: int = 0
    # The commit time (ns) of the window at ``applied_scn`` in the log, or of the
    # oldest window after it when that one is gone (lag in seconds, DESIGN 17); None
    # when the log holds neither.
    applied_timestamp_ns: int | None = None

    @property
    def update_ratio(self) -> float | None:
        """Applied rows that changed a key already present, over all applied rows."""
        if not self.applier_rows:
            return None
        return 1.0 - self.applier_new_keys / self.applier_rows


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    key: bytes
    scn: int
    op: int
    event: bytes


@dataclass(frozen=True, slots=True)
class LogRow:
    scn: int
    seq: int
    event: bytes


class StoreHold(Protocol):
    """A component of a store held by this process (``BootstrapStorage.hold``)."""

    def release(self) -> None: ...


class BootstrapStorage(ABC):
    """A bootstrap database: log, snapshot, schemas, producer and applier state."""

    paramstyle: str  # of the filter fragments this backend executes
    key_hash: bool  # whether hash filters can be pushed down (fixed at creation)
    where: str  # the store's location, password removed, for messages
    # Whether a producer's batch is loaded as binary COPY streams (``LogBatch.log_copy``)
    # rather than inserted row by row (PostgreSQL).
    copies_log: bool = False

    def hold(self, component: str) -> StoreHold:
        """Say that this process runs ``component`` ("producer", "applier") on this
        store, for as long as it lives, before it takes the component's fencing token:
        ``AlreadyRunningError`` when another process does (a second service started by
        mistake), which then fences nobody (DESIGN 17, "Safe start"). A cluster's
        services share a store and take its ZooKeeper locks instead."""
        raise NotImplementedError(f"{type(self).__name__} cannot hold a component")

    # -- catalog --------------------------------------------------------------------

    @abstractmethod
    def source_ids(self) -> dict[str, int]:
        """Logical source name -> this store's source id."""

    @abstractmethod
    def ensure_sources(self, names: Sequence[str]) -> dict[str, int]:
        """Create what ``names`` need (ids, log and snapshot tables); the full map."""

    @abstractmethod
    def add_schema(self, fingerprint: int, source: str, schema_json: str) -> None: ...

    @abstractmethod
    def schema(self, fingerprint: int) -> str | None: ...

    @abstractmethod
    def schemas(self) -> list[tuple[int, str, str]]:
        """Every (fingerprint, source, schema JSON), oldest first."""

    # -- producer -------------------------------------------------------------------

    @abstractmethod
    def producer_checkpoint(self) -> Checkpoint | None: ...

    # -- fencing (one writer per component) --------------------------------------------

    @abstractmethod
    def store_id(self) -> str:
        """This store's identity, made once when first asked and kept in the store
        (cluster members on one store find each other's locks by it)."""

    @abstractmethod
    def take_fence(self, component: str) -> int:
        """A new fencing token for ``component`` ("producer" or "applier"), above
        every token taken before: from its commit on, writes presenting an older token
        are refused. It waits for a write of an older holder in progress to end."""

    @abstractmethod
    def fence_tokens(self) -> dict[str, int]:
        """The current token of each component that has one."""

    @abstractmethod
    def append(
        self,
        windows: Sequence[LogWindow] | LogBatch,
        checkpoint: Checkpoint,
        *,
        log_floor_scn: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        """Append whole windows and the producer's checkpoint in one transaction
        (``LogWindow`` objects, or a producer's ``LogBatch``).

        ``log_floor_scn`` is given on the very first append: the SCN after which the
        log is complete. Windows must come in increasing SCN order, after the log's end.
        With ``fence``, nothing is written unless it is still the producer's current
        token (``FencedError``).
        """

    # -- applier --------------------------------------------------------------------

    @abstractmethod
    def apply(self, *, max_rows: int, fence: Fence | None = None) -> ApplyResult | None:
        """Move the next windows (about ``max_rows`` rows, whole windows) into the
        snapshot and advance the applied SCN, in one transaction; None if caught up.
        ``fence``: the applier's, as ``append``'s."""

    # -- reads ----------------------------------------------------------------------

    @abstractmethod
    def state(self) -> StorageState: ...

    @abstractmethod
    def positions(self) -> tuple[int | None, int | None, int | None]:
        """(applied SCN, producer SCN, log floor SCN) as ``state`` reports them, without
        its counts, which scan the snapshot (the server needs the positions on every
        bootstrap; the counts are for /v1/status)."""

    @abstractmethod
    def snapshot_batch(
        self,
        source: str,
        *,
        after_key: bytes | None,
        since_scn: int | None,
        limit: int,
        filter: FilterSpec,
        after_scn: int | None = None,
    ) -> list[SnapshotRow]:
        """Snapshot rows of ``source``. Without ``since_scn``: live rows only (a full
        snapshot), by key after ``after_key``. With it: rows and tombstones changed
        after ``since_scn`` (a consolidated delta), by (scn, key) after (``after_scn``,
        ``after_key``): a sparse delta then reads the SCN index instead of walking every
        key, and nothing is skipped because the applier only moves a key's SCN up."""

    @abstractmethod
    def log_batch(
        self,
        sources: Sequence[str],
        *,
        after_scn: int,
        upto_scn: int,
        limit: int,
        filter: FilterSpec,
    ) -> list[LogRow]:
        """Log rows of ``sources`` in windows (after_scn, upto_scn], in commit order;
        at most ``limit`` rows, cut at a window boundary unless one window alone is
        larger (then that whole window)."""

    @abstractmethod
    def log_key_stats(self, sources: Sequence[str], *, after_scn: int, sample: int
                      ) -> tuple[int, int]:
        """(rows, distinct keys) over the first ``sample`` log rows after ``after_scn``:
        the measured ratio of updates to existing keys of that range."""

    # -- retention --------------------------------------------------------------------

    @abstractmethod
    def retain(self, *, cut_scn: int, fence: Fence | None = None) -> RetentionResult:
        """Drop log windows with SCN <= ``cut_scn`` (never past the applied SCN; the
        PostgreSQL backend rounds down to whole partitions) and purge tombstones the
        log no longer covers."""

    @abstractmethod
    def retention_cut(self, *, older_than_ns: int | None, max_log_bytes: int | None
                      ) -> int | None:
        """The SCN that time- and size-based retention would cut at, or None."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> BootstrapStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_storage(url: str, **options: object) -> BootstrapStorage:
    """``postgresql://...?schema=name`` or ``sqlite:///path.db`` (``sqlite://:memory:``
    is refused: the producer, applier and server share the store through the file)."""
    scheme = urlsplit(url).scheme
    if scheme in ("postgresql", "postgres"):
        from databus.bootstrap._postgres import PostgresStorage

        return PostgresStorage(url, **options)  # type: ignore[arg-type]
    if scheme == "sqlite":
        from databus.bootstrap._sqlite import SqliteStorage

        return SqliteStorage(url, **options)  # type: ignore[arg-type]
    raise ConfigError(
        f"bootstrap storage URL must start with postgresql:// or sqlite:///, got {scheme!r}"
    )
