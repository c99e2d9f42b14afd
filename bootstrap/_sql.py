"""The SQL both bootstrap backends share, written once.

Statements are written with ``%s`` placeholders; a backend with another paramstyle
rewrites them (``_q``) before its filter fragments, which ``FilterSpec.to_sql`` already
produces in the backend's own style, are spliced in. Backends supply connections and
transactions, table DDL, the bulk insert into the log, and how retention drops log
rows (whole partitions on PostgreSQL).
"""

from __future__ import annotations

import contextlib
import uuid
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

from databus.batch import LogCopy
from databus.bootstrap._storage import (
    COMPONENTS,
    ApplyResult,
    BootstrapStorage,
    Fence,
    FencedError,
    LogBatch,
    LogRow,
    LogRows,
    LogWindow,
    RetentionResult,
    SnapshotRow,
    StorageState,
    StoredEvent,
)
from databus.checkpoint import Checkpoint
from databus.errors import FilterError, FilterNotPushableError, UnknownSourceError
from databus.event import Op
from databus.filters import FilterSpec

TOMBSTONE = int(Op.DELETE)
LIVE = int(Op.UPSERT)

# dbus_state names
PRODUCER_CHECKPOINT = "producer_checkpoint"
APPLIED_SCN = "applied_scn"
LOG_FLOOR_SCN = "log_floor_scn"
APPLIER_ROWS = "applier_rows"
APPLIER_NEW_KEYS = "applier_new_keys"
KEY_HASH = "key_hash"  # "1" if the key_hash column is filled (hash filters can be pushed)
STORE_ID = "store_id"  # made once: the identity cluster members find the store's locks by


def fence_state(component: str) -> str:
    """The dbus_state name of a component's fencing token ("producer_fence", ...)."""
    if component not in COMPONENTS:
        raise ValueError(f"no fence for {component!r}")
    return f"{component}_fence"


_SNAPSHOT_COLUMNS = "key, scn, op, pkey, key_hash, event"


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def executemany(self, sql: str, params: Any) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


def log_table(source_id: int) -> str:
    return f"dbus_log_{source_id}"


def snapshot_table(source_id: int) -> str:
    return f"dbus_snapshot_{source_id}"


def _order(scns: Sequence[int]) -> tuple[int | None, tuple[int, int] | None]:
    """The first of ``scns`` (None: empty), and (SCN, previous) of the first one not
    above the one before it (None: strictly increasing)."""
    for k in range(1, len(scns)):
        if scns[k] <= scns[k - 1]:
            return scns[0], (scns[k], scns[k - 1])
    return (scns[0] if scns else None), None


def _check_order(end: object, first_scn: int | None, unordered: tuple[int, int] | None
                 ) -> None:
    """An append's windows must come after the log's ``end`` (its newest window, None:
    empty) in increasing SCN order."""
    if end is not None and first_scn is not None and first_scn <= int(str(end)):
        raise ValueError(f"window {first_scn} does not come after the log's end {end}")
    if unordered is not None:
        raise ValueError(f"window {unordered[0]} does not come after the log's end "
                         f"{unordered[1]}")


def _signed64(value: int) -> int:
    """Schema fingerprints are unsigned 64-bit; SQL bigints are signed."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _unsigned64(value: int) -> int:
    return value + (1 << 64) if value < 0 else value


class SqlStorage(BootstrapStorage):
    """``BootstrapStorage`` over a DB-API connection; see the module docstring."""

    paramstyle = "format"
    blob_type = "bytea"
    # Appended to the read of a fencing token inside a write: PostgreSQL locks the row
    # (a takeover's new token waits for the write to end, and the write sees a token
    # committed before it); SQLite's writers are serialized by BEGIN IMMEDIATE already.
    for_update = " FOR UPDATE"
    # Whether key_hash is computed and stored; fixed when the store is created.
    key_hash: bool = True
    # Source name -> id, as last read or made by this process (``_ids_of``).
    _known_sources: Mapping[str, int] = MappingProxyType({})

    # -- what a backend provides ------------------------------------------------------

    @abstractmethod
    def _transaction(self, *, write: bool) -> contextlib.AbstractContextManager[Cursor]:
        """A cursor inside one transaction, committed on success, rolled back on error;
        driver connection errors come out as ``StorageUnavailableError``."""

    @abstractmethod
    def _create_log_table(self, cur: Cursor, source_id: int) -> None: ...

    @abstractmethod
    def _insert_log(self, cur: Cursor, source_id: int,
                    rows: LogRows | list[tuple[int, int, StoredEvent]]) -> None:
        """Bulk insert (scn, seq, event) rows into the source's log table."""

    def _append_copy(self, copy: LogCopy, checkpoint: Checkpoint, *, first_scn: int | None,
                     unordered: tuple[int, int] | None, log_floor_scn: int | None,
                     fence: Fence | None) -> None:
        """``append`` of a producer's batch given as binary COPY streams, in one
        transaction with the checkpoint (``copies_log``)."""
        raise NotImplementedError(f"{type(self).__name__} does not load COPY streams")

    def _insert_windows(self, cur: Cursor, rows: list[tuple[int, int, int, int]]) -> None:
        """Bulk insert (scn, timestamp_ns, events, bytes) rows into ``dbus_windows``."""
        cur.executemany(
            self._q("INSERT INTO dbus_windows (scn, timestamp_ns, events, bytes)"
                    " VALUES (%s, %s, %s, %s)"),
            rows,
        )

    def _lock_ddl(self, cur: Cursor) -> None:
        """Serialize schema changes with other processes sharing the store, as the
        first statement of a write transaction (PostgreSQL: ``databus/_ddl.py``; SQLite
        serializes writers itself)."""

    def _prepare_append(self, rows: dict[int, list[int]]) -> None:
        """Before the append transaction: ``rows`` maps source ids to the SCNs coming
        (PostgreSQL creates partitions here, each DDL in its own short transaction, so
        the append never holds a lock a reader waits on)."""

    def _log_cut(self, cut_scn: int) -> int:
        """The SCN retention can cut the log at, at most ``cut_scn``."""
        return cut_scn

    @abstractmethod
    def _drop_log(self, source_ids: Sequence[int], cut_scn: int) -> None:
        """Remove log rows with SCN <= ``_log_cut(cut)``, in transactions of its own
        (after the floor has moved, so a crash in between only leaves rows behind)."""

    def _q(self, sql: str) -> str:
        return sql

    def _blob(self, value: Any) -> bytes:
        return bytes(value)

    # -- schema ---------------------------------------------------------------------

    def _create_base_tables(self, cur: Cursor) -> None:
        for ddl in (
            "CREATE TABLE IF NOT EXISTS dbus_sources ("
            " source_id integer PRIMARY KEY, name text NOT NULL UNIQUE)",
            "CREATE TABLE IF NOT EXISTS dbus_schemas ("
            " fingerprint bigint PRIMARY KEY, source text NOT NULL, schema_json text NOT NULL,"
            " added_order bigint NOT NULL)",
            "CREATE TABLE IF NOT EXISTS dbus_state (name text PRIMARY KEY, value text NOT NULL)",
            "CREATE TABLE IF NOT EXISTS dbus_windows ("
            " scn bigint PRIMARY KEY, timestamp_ns bigint NOT NULL, events integer NOT NULL,"
            " bytes bigint NOT NULL)",
        ):
            cur.execute(ddl)
        stored = self._get_state(cur, KEY_HASH)
        if stored is None:
            self._set_state(cur, KEY_HASH, int(self.key_hash))
        else:
            self.key_hash = stored == "1"

    def _create_source_tables(self, cur: Cursor, source_id: int) -> None:
        self._create_log_table(cur, source_id)
        table = snapshot_table(source_id)
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (key {self.blob_type} PRIMARY KEY,"
            " scn bigint NOT NULL, op smallint NOT NULL, pkey bigint NOT NULL,"
            f" key_hash bigint NOT NULL, event {self.blob_type} NOT NULL)"
        )
        # The delta query (rows changed after T, read in (scn, key) order) and tombstone
        # purging go by SCN.
        cur.execute(f"CREATE INDEX IF NOT EXISTS {table}_scn ON {table} (scn, key)")

    # -- state helpers ----------------------------------------------------------------

    def _get_state(self, cur: Cursor, name: str) -> str | None:
        cur.execute(self._q("SELECT value FROM dbus_state WHERE name = %s"), (name,))
        row = cur.fetchone()
        return None if row is None else str(row[0])

    def _set_state(self, cur: Cursor, name: str, value: object) -> None:
        cur.execute(
            self._q("INSERT INTO dbus_state (name, value) VALUES (%s, %s) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"),
            (name, str(value)),
        )

    def _int_state(self, cur: Cursor, name: str) -> int | None:
        value = self._get_state(cur, name)
        return None if value is None else int(value)

    # -- catalog --------------------------------------------------------------------

    def source_ids(self) -> dict[str, int]:
        with self._transaction(write=False) as cur:
            return self._source_ids(cur)

    def _source_ids(self, cur: Cursor) -> dict[str, int]:
        cur.execute("SELECT name, source_id FROM dbus_sources")
        return {str(name): int(sid) for name, sid in cur.fetchall()}

    def ensure_sources(self, names: Sequence[str]) -> dict[str, int]:
        known = self.source_ids()
        missing = [n for n in dict.fromkeys(names) if n not in known]
        if not missing:
            return known
        with self._transaction(write=True) as cur:
            # Two services adding the same source: each would pick the same id and
            # create the same tables; the second one waits here and finds them.
            self._lock_ddl(cur)
            known = self._source_ids(cur)
            for name in missing:
                if name in known:
                    continue
                source_id = max(known.values(), default=0) + 1
                cur.execute(
                    self._q("INSERT INTO dbus_sources (source_id, name) VALUES (%s, %s)"),
                    (source_id, name),
                )
                self._create_source_tables(cur, source_id)
                known[name] = source_id
        return known

    def add_schema(self, fingerprint: int, source: str, schema_json: str) -> None:
        with self._transaction(write=True) as cur:
            cur.execute(
                self._q("INSERT INTO dbus_schemas (fingerprint, source, schema_json, added_order)"
                        " SELECT %s, %s, %s, COALESCE(max(added_order), 0) + 1 FROM dbus_schemas"
                        " WHERE true"  # SQLite: without WHERE, ON CONFLICT parses as a join
                        " ON CONFLICT (fingerprint) DO NOTHING"),
                (_signed64(fingerprint), source, schema_json),
            )

    def schema(self, fingerprint: int) -> str | None:
        with self._transaction(write=False) as cur:
            cur.execute(self._q("SELECT schema_json FROM dbus_schemas WHERE fingerprint = %s"),
                        (_signed64(fingerprint),))
            row = cur.fetchone()
        return None if row is None else str(row[0])

    def schemas(self) -> list[tuple[int, str, str]]:
        with self._transaction(write=False) as cur:
            cur.execute("SELECT fingerprint, source, schema_json FROM dbus_schemas"
                        " ORDER BY added_order")
            return [(_unsigned64(int(fp)), str(src), str(js)) for fp, src, js in cur.fetchall()]

    # -- fencing --------------------------------------------------------------------

    def store_id(self) -> str:
        with self._transaction(write=True) as cur:
            cur.execute(self._q("INSERT INTO dbus_state (name, value) VALUES (%s, %s)"
                                " ON CONFLICT (name) DO NOTHING"), (STORE_ID, uuid.uuid4().hex))
            value = self._get_state(cur, STORE_ID)
        assert value is not None
        return value

    def take_fence(self, component: str) -> int:
        name = fence_state(component)
        with self._transaction(write=True) as cur:
            # One statement: two takers never get the same token, and on PostgreSQL it
            # waits for the row lock a write of the older holder has (_check_fence).
            cur.execute(self._q(
                "INSERT INTO dbus_state (name, value) VALUES (%s, '1') ON CONFLICT (name)"
                " DO UPDATE SET value = CAST(CAST(dbus_state.value AS bigint) + 1 AS text)"
                " RETURNING value"), (name,))
            return int(cur.fetchone()[0])

    def fence_tokens(self) -> dict[str, int]:
        with self._transaction(write=False) as cur:
            out = {}
            for component in COMPONENTS:
                value = self._get_state(cur, fence_state(component))
                if value is not None:
                    out[component] = int(value)
            return out

    def _check_fence(self, cur: Cursor, fence: Fence | None) -> None:
        """First thing in a fenced write's transaction: the writer's token must still
        be the store's (PostgreSQL: the row stays locked until the commit)."""
        if fence is None:
            return
        cur.execute(self._q("SELECT value FROM dbus_state WHERE name = %s")
                    + self.for_update, (fence_state(fence.component),))
        row = cur.fetchone()
        self._check_token(fence, None if row is None else row[0])

    @staticmethod
    def _check_token(fence: Fence, stored: object) -> None:
        """``FencedError`` unless ``stored`` (the store's token, None: none) is the
        fence's token."""
        current = None if stored is None else int(str(stored))
        if current != fence.token:
            raise FencedError(
                f"the {fence.component}'s fencing token {fence.token} is no longer the "
                f"store's ({current}): another service took the {fence.component} over; "
                "this write was not made")

    @staticmethod
    def _before_commit(fence: Fence | None) -> None:
        if fence is not None and fence.guard is not None:
            fence.guard()

    # -- producer -------------------------------------------------------------------

    def producer_checkpoint(self) -> Checkpoint | None:
        with self._transaction(write=False) as cur:
            text = self._get_state(cur, PRODUCER_CHECKPOINT)
        return None if text is None else Checkpoint.loads(text)

    def append(
        self,
        windows: Sequence[LogWindow] | LogBatch,
        checkpoint: Checkpoint,
        *,
        log_floor_scn: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        by_source: dict[int, LogRows | list[tuple[int, int, StoredEvent]]] = {}
        window_rows: list[tuple[int, int, int, int]] = []
        copy: LogCopy | None = None
        if isinstance(windows, LogBatch):
            names = windows.source_names()
            ids = self._ids_of(names) if names else {}
            if self.copies_log:
                # Every row of the response, both tables, in one call (C).
                copy = windows.log_copy(ids)
                coming = {source_id: [first, last]
                          for source_id, (first, last) in copy.spans.items()}
                first_scn = copy.first_scn if copy.stored else None
                unordered = copy.unordered
            else:
                split, window_rows = windows.split(ids)
                by_source.update(split)
                # SCNs come sorted: the first and last say which partitions are needed.
                coming = {source_id: [rows.scns[0], rows.scns[-1]]
                          for source_id, rows in split.items()}
                first_scn, unordered = _order([scn for scn, _, _, _ in window_rows])
        else:
            names = {e.source for w in windows for e in w.events}
            ids = self.ensure_sources(sorted(names)) if names else {}
            coming = {}
            for w in windows:
                for e in w.events:
                    coming.setdefault(ids[e.source], []).append(w.scn)
            for window in windows:
                size = 0
                for seq, event in enumerate(window.events):
                    rows = by_source.setdefault(ids[event.source], [])
                    assert isinstance(rows, list)
                    rows.append((window.scn, seq, event))
                    size += len(event.event)
                window_rows.append((window.scn, window.timestamp_ns, len(window.events), size))
            first_scn, unordered = _order([w.scn for w in windows])
        self._prepare_append(coming)
        if copy is not None:
            self._append_copy(copy, checkpoint, first_scn=first_scn, unordered=unordered,
                              log_floor_scn=log_floor_scn, fence=fence)
            return
        with self._transaction(write=True) as cur:
            self._check_fence(cur, fence)
            cur.execute("SELECT max(scn) FROM dbus_windows")
            row = cur.fetchone()
            _check_order(None if row is None else row[0], first_scn, unordered)
            for source_id, rows in by_source.items():
                self._insert_log(cur, source_id, rows)
            self._insert_windows(cur, window_rows)
            self._set_state(cur, PRODUCER_CHECKPOINT, checkpoint.dumps())
            if log_floor_scn is not None and self._get_state(cur, LOG_FLOOR_SCN) is None:
                self._set_state(cur, LOG_FLOOR_SCN, log_floor_scn)
            self._before_commit(fence)

    def _ids_of(self, names: set[str]) -> Mapping[str, int]:
        """The store's ids of ``names``, made when missing (a source's id never changes:
        the ones seen are remembered, and an append of known sources reads nothing)."""
        if not names <= self._known_sources.keys():
            self._known_sources = self.ensure_sources(sorted(names))
        return self._known_sources

    # -- applier --------------------------------------------------------------------

    def apply(self, *, max_rows: int, fence: Fence | None = None) -> ApplyResult | None:
        with self._transaction(write=True) as cur:
            self._check_fence(cur, fence)
            applied = self._int_state(cur, APPLIED_SCN)
            after = applied if applied is not None else -1
            cur.execute(
                self._q("SELECT scn, events FROM dbus_windows WHERE scn > %s"
                        " ORDER BY scn LIMIT %s"),
                (after, max(1, max_rows)),
            )
            windows = cur.fetchall()
            if not windows:
                return None
            rows = 0
            upto = after
            count = 0
            for scn, events in windows:
                # Whole windows only: the batch ends at the window that reaches max_rows.
                rows += int(events)
                upto = int(scn)
                count += 1
                if rows >= max_rows:
                    break
            new_keys = 0
            for source_id in self._source_ids(cur).values():
                log, snap = log_table(source_id), snapshot_table(source_id)
                cur.execute(
                    self._q(f"SELECT count(DISTINCT key) FROM {log} l WHERE scn > %s"
                            f" AND scn <= %s AND NOT EXISTS (SELECT 1 FROM {snap} s"
                            " WHERE s.key = l.key)"),
                    (after, upto),
                )
                new_keys += int(cur.fetchone()[0])
                # Newest row per key wins; a delete stays as a tombstone with its SCN.
                cur.execute(
                    self._q(
                        f"INSERT INTO {snap} ({_SNAPSHOT_COLUMNS})"
                        f" SELECT {_SNAPSHOT_COLUMNS} FROM ("
                        f" SELECT {_SNAPSHOT_COLUMNS}, row_number() OVER"
                        " (PARTITION BY key ORDER BY scn DESC, seq DESC) AS rn"
                        f" FROM {log} WHERE scn > %s AND scn <= %s) latest WHERE rn = 1"
                        " ON CONFLICT (key) DO UPDATE SET scn = excluded.scn,"
                        " op = excluded.op, pkey = excluded.pkey,"
                        " key_hash = excluded.key_hash, event = excluded.event"
                    ),
                    (after, upto),
                )
            self._set_state(cur, APPLIED_SCN, upto)
            self._set_state(cur, APPLIER_ROWS, (self._int_state(cur, APPLIER_ROWS) or 0) + rows)
            self._set_state(cur, APPLIER_NEW_KEYS,
                            (self._int_state(cur, APPLIER_NEW_KEYS) or 0) + new_keys)
            self._before_commit(fence)
        return ApplyResult(after, upto, count, rows, new_keys)

    # -- reads ----------------------------------------------------------------------

    def state(self) -> StorageState:
        with self._transaction(write=False) as cur:
            applied_scn, producer_scn, log_floor_scn = self._positions(cur)
            cur.execute("SELECT count(*), COALESCE(sum(bytes), 0) FROM dbus_windows")
            windows, size = cur.fetchone()
            snapshot_rows = {}
            for name, source_id in sorted(self._source_ids(cur).items()):
                cur.execute(self._q(f"SELECT count(*) FROM {snapshot_table(source_id)}"
                                    " WHERE op = %s"), (LIVE,))
                snapshot_rows[name] = int(cur.fetchone()[0])
            return StorageState(
                producer_scn=producer_scn,
                applied_scn=applied_scn,
                log_floor_scn=log_floor_scn,
                log_windows=int(windows),
                log_bytes=int(size),
                snapshot_rows=snapshot_rows,
                applier_rows=self._int_state(cur, APPLIER_ROWS) or 0,
                applier_new_keys=self._int_state(cur, APPLIER_NEW_KEYS) or 0,
                applied_timestamp_ns=self._applied_timestamp(cur, applied_scn),
            )

    def _applied_timestamp(self, cur: Cursor, applied_scn: int | None) -> int | None:
        """The commit time of the window at ``applied_scn`` (None: from the oldest
        window), else of the first one after it (a lower bound of the lag)."""
        cur.execute(self._q("SELECT timestamp_ns FROM dbus_windows WHERE scn >= %s "
                            "ORDER BY scn LIMIT 1"),
                    (applied_scn if applied_scn is not None else -(1 << 62),))
        row = cur.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def positions(self) -> tuple[int | None, int | None, int | None]:
        with self._transaction(write=False) as cur:
            return self._positions(cur)

    def _positions(self, cur: Cursor) -> tuple[int | None, int | None, int | None]:
        cur.execute("SELECT max(scn) FROM dbus_windows")
        producer_scn = cur.fetchone()[0]
        if producer_scn is None:
            # Retention may have emptied the log: the producer's position remains.
            checkpoint = self._get_state(cur, PRODUCER_CHECKPOINT)
            if checkpoint is not None:
                producer_scn = Checkpoint.loads(checkpoint).window_scn
        return (self._int_state(cur, APPLIED_SCN),
                None if producer_scn is None else int(producer_scn),
                self._int_state(cur, LOG_FLOOR_SCN))

    def _source_id(self, cur: Cursor, source: str) -> int:
        ids = self._source_ids(cur)
        if source not in ids:
            raise UnknownSourceError(f"the bootstrap store has no source {source!r}")
        return ids[source]

    def _filter_sql(self, spec: FilterSpec, source: str) -> tuple[str, list[object]]:
        try:
            return spec.to_sql(source, "pkey", "key_hash" if self.key_hash else None,
                               paramstyle=self.paramstyle)  # type: ignore[arg-type]
        except FilterError as exc:
            raise FilterNotPushableError(exc.message) from None

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
        fragment, fparams = self._filter_sql(filter, source)
        with self._transaction(write=False) as cur:
            table = snapshot_table(self._source_id(cur, source))
            where: list[str] = []
            params: list[object] = []
            if since_scn is None:
                where.append(self._q("op = %s"))
                params.append(LIVE)
                if after_key is not None:
                    where.append(self._q("key > %s"))
                    params.append(after_key)
                order = "key"
            else:
                where.append(self._q("scn > %s"))
                params.append(since_scn)
                if after_key is not None:
                    if after_scn is None:
                        raise ValueError("a delta resumes after an (scn, key) pair")
                    where.append(self._q("(scn, key) > (%s, %s)"))
                    params += [after_scn, after_key]
                order = "scn, key"
            where.append(fragment)
            params.extend(fparams)
            cur.execute(
                f"SELECT key, scn, op, event FROM {table} WHERE {' AND '.join(where)}"
                + self._q(f" ORDER BY {order} LIMIT %s"),
                (*params, limit),
            )
            return [SnapshotRow(self._blob(k), int(s), int(o), self._blob(e))
                    for k, s, o, e in cur.fetchall()]

    def _log_query(self, cur: Cursor, sources: Sequence[str], filter: FilterSpec,
                   after_scn: int, upto_scn: int, limit: int | None) -> list[LogRow]:
        parts, params = [], []
        for source in sources:
            fragment, fparams = self._filter_sql(filter, source)
            parts.append(self._q(f"SELECT scn, seq, event FROM "
                                 f"{log_table(self._source_id(cur, source))}"
                                 " WHERE scn > %s AND scn <= %s AND ") + fragment)
            params += [after_scn, upto_scn, *fparams]
        sql = " UNION ALL ".join(parts) + " ORDER BY scn, seq"
        if limit is not None:
            sql += self._q(" LIMIT %s")
            params.append(limit)
        cur.execute(sql, params)
        return [LogRow(int(s), int(q), self._blob(e)) for s, q, e in cur.fetchall()]

    def log_batch(
        self,
        sources: Sequence[str],
        *,
        after_scn: int,
        upto_scn: int,
        limit: int,
        filter: FilterSpec,
    ) -> list[LogRow]:
        if not sources:
            return []
        with self._transaction(write=False) as cur:
            rows = self._log_query(cur, sources, filter, after_scn, upto_scn, limit + 1)
            if len(rows) <= limit:
                return rows
            # The last window may be cut short: serve only windows seen whole...
            boundary = rows[-1].scn
            whole = [r for r in rows if r.scn < boundary]
            if whole:
                return whole
            # ...unless a single window is larger than the limit: then all of it.
            return self._log_query(cur, sources, filter, after_scn, boundary, None)

    def log_key_stats(self, sources: Sequence[str], *, after_scn: int, sample: int
                      ) -> tuple[int, int]:
        total = distinct = 0
        with self._transaction(write=False) as cur:
            for source in sources:
                table = log_table(self._source_id(cur, source))
                cur.execute(
                    self._q(f"SELECT count(*), count(DISTINCT key) FROM (SELECT key FROM {table}"
                            " WHERE scn > %s ORDER BY scn, seq LIMIT %s) sample"),
                    (after_scn, sample),
                )
                rows, keys = cur.fetchone()
                total += int(rows)
                distinct += int(keys)
        return total, distinct

    # -- retention --------------------------------------------------------------------

    def retention_cut(self, *, older_than_ns: int | None, max_log_bytes: int | None
                      ) -> int | None:
        cuts: list[int] = []
        with self._transaction(write=False) as cur:
            if older_than_ns is not None:
                cur.execute(self._q("SELECT max(scn) FROM dbus_windows WHERE timestamp_ns < %s"),
                            (older_than_ns,))
                row = cur.fetchone()
                if row[0] is not None:
                    cuts.append(int(row[0]))
            if max_log_bytes is not None:
                # Windows whose newer-or-equal suffix exceeds the budget must go.
                cur.execute(
                    self._q("SELECT max(scn) FROM (SELECT scn, sum(bytes) OVER"
                            " (ORDER BY scn DESC) AS newer FROM dbus_windows) suffix"
                            " WHERE newer > %s"),
                    (max_log_bytes,),
                )
                row = cur.fetchone()
                if row[0] is not None:
                    cuts.append(int(row[0]))
        return max(cuts) if cuts else None

    def retain(self, *, cut_scn: int, fence: Fence | None = None) -> RetentionResult:
        with self._transaction(write=True) as cur:
            self._check_fence(cur, fence)
            applied = self._int_state(cur, APPLIED_SCN)
            floor = self._int_state(cur, LOG_FLOOR_SCN)
            if applied is None:
                return RetentionResult(floor, 0, 0)
            cut = self._log_cut(min(cut_scn, applied))
            ids = list(self._source_ids(cur).values())
            cur.execute(self._q("SELECT max(scn), count(*) FROM dbus_windows WHERE scn <= %s"),
                        (cut,))
            newest_dropped, dropped = cur.fetchone()
            purged = 0
            if dropped:
                # The floor moves first: from here on no reader relies on those rows.
                cur.execute(self._q("DELETE FROM dbus_windows WHERE scn <= %s"), (cut,))
                floor = max(int(newest_dropped), floor if floor is not None else -1)
                self._set_state(cur, LOG_FLOOR_SCN, floor)
                for source_id in ids:
                    # A delta since T >= floor never needs a tombstone at or below it.
                    cur.execute(
                        self._q(f"DELETE FROM {snapshot_table(source_id)}"
                                " WHERE op = %s AND scn <= %s"),
                        (TOMBSTONE, floor),
                    )
                    purged += max(0, int(getattr(cur, "rowcount", 0) or 0))
            self._before_commit(fence)
        if cut >= 0:
            self._drop_log(ids, cut)
        return RetentionResult(floor, int(dropped), purged)
