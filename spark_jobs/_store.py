"""The jobs' driver-side access to the PostgreSQL bootstrap store (psycopg2).

Spark reads and writes the bulk rows over JDBC; everything that must be exact or atomic
happens here, on the driver:

- ``job_lock``: one job per store at a time (a session advisory lock, freed by
  PostgreSQL if the job dies).
- ``ReadView``: a REPEATABLE READ transaction whose snapshot is exported
  (``pg_export_snapshot``) and imported by every JDBC read partition, so the plan (applied
  SCN, floor, log end) and all rows Spark reads come from one consistent point in time,
  even while the producer and the applier keep writing.
- staging tables ``dbus_snapshot_<id>_next``: written by Spark, indexed here.
- ``swap``: ONE transaction that replaces the snapshot tables by their staging tables
  and moves ``applied_scn`` (and, for a seed, the log floor and the producer checkpoint),
  after re-checking that the applier and retention did not invalidate the plan. A job
  killed at any earlier point leaves the old snapshot and state untouched.

Table and state names are the bootstrap store's (``databus.bootstrap``;
docs/bootstrap.md describes the layout).
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from databus.bootstrap import (
    APPLIED_SCN,
    APPLIER_NEW_KEYS,
    APPLIER_ROWS,
    KEY_HASH,
    LOG_FLOOR_SCN,
    PRODUCER_CHECKPOINT,
    log_table,
    snapshot_table,
)
from databus.checkpoint import Checkpoint
from databus.spark_jobs._common import JobRefused, SparkJobError
from databus.spark_jobs._jdbc import StoreLocation

log = logging.getLogger("databus.spark_jobs")

SWAP_LOCK_TIMEOUT = "5s"
SWAP_ATTEMPTS = 12
_LOCK_ERRORS = (psycopg2.errors.LockNotAvailable, psycopg2.errors.DeadlockDetected)


def staging_table(source_id: int) -> str:
    return f"{snapshot_table(source_id)}_next"


def _one(cur: Any) -> tuple[Any, ...]:
    """The single row a query returns (count, max, a function call)."""
    row = cur.fetchone()
    assert row is not None
    return tuple(row)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class StoreState:
    """The positions a plan is made from (all read in one transaction)."""

    applied_scn: int | None
    log_floor_scn: int | None
    newest_window_scn: int | None  # None: no window in the log
    producer_scn: int | None  # the producer's checkpoint (its position, even if log is empty)
    key_hash: bool
    sources: dict[str, int] = field(default_factory=dict)

    @property
    def log_end_scn(self) -> int | None:
        """Where the log ends: its newest window, or the producer's position if retention
        emptied it."""
        if self.newest_window_scn is not None:
            return self.newest_window_scn
        return self.producer_scn


@dataclass(frozen=True)
class SwapPlan:
    """What the swap does and the conditions under which it is still right.

    ``log_after`` is the lowest SCN after which the job read the log (None: all of it);
    retention must not have moved the floor past it. The applier must still be in
    [``applied_at_plan``, ``target_scn``]: behind the target (the new snapshot is newer
    than what it applied) and not moved backwards.
    """

    target_scn: int
    replace: dict[int, str]  # source id -> name of the snapshot tables to replace
    applied_at_plan: int | None
    reads_log: bool
    log_after: int | None
    floor_at_plan: int | None = None
    new_floor: int | None = None  # seed: the floor becomes at least the dump's SCN
    producer_start: int | None = None  # seed of an empty store: producer starts after it
    counters: tuple[str, int, int] | None = None  # ("add" | "set", rows, new keys)


class PgStore:
    """Driver-side connection factory and operations on one store (one schema)."""

    def __init__(self, location: StoreLocation, *, connect_timeout: int = 10) -> None:
        self.location = location
        self.schema = location.schema
        self._connect_timeout = connect_timeout

    @classmethod
    def for_url(cls, url: str) -> PgStore:
        """The store at a bootstrap storage URL (``postgresql://...?schema=name``)."""
        return cls(StoreLocation.parse(url))

    def connect(self) -> psycopg2.extensions.connection:
        try:
            conn = psycopg2.connect(
                self.location.dsn, connect_timeout=self._connect_timeout,
                application_name="databus-spark",
                options=f"-c search_path={self.schema}",
            )
        except psycopg2.Error as exc:
            raise SparkJobError(
                f"cannot connect to the bootstrap store {self.location.where}: "
                f"{_first_line(exc)}"
            ) from None
        return conn

    # -- one job at a time ------------------------------------------------------------

    @contextlib.contextmanager
    def job_lock(self, job: str) -> Iterator[None]:
        conn = self.connect()
        conn.autocommit = True
        key = zlib.crc32(f"databus.spark_jobs:{self.schema}".encode()) - (1 << 31)
        held = False
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
                held = bool(_one(cur)[0])
                if not held:
                    raise JobRefused(
                        f"another Spark job (compact or seed) is running on the store "
                        f"{self.location.where}; wait for it to finish"
                    )
            log.debug("%s holds the job lock of schema %s", job, self.schema)
            yield
        finally:
            # Released before the job returns: closing the connection alone frees the lock
            # only once the server has noticed, so a job started right after this one
            # could be refused (seen on a busy machine). A broken connection frees it as
            # its backend ends.
            if held:
                with contextlib.suppress(psycopg2.Error), conn.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
            conn.close()

    # -- the consistent read view -------------------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[ReadView]:
        conn = self.connect()
        try:
            conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
            with conn.cursor() as cur:
                cur.execute("SELECT pg_export_snapshot()")
                snapshot_id = str(_one(cur)[0])
            view = ReadView(self, conn, snapshot_id)
            view.state = view.read_state()
            yield view
        finally:
            with contextlib.suppress(psycopg2.Error):
                conn.rollback()
            conn.close()

    # -- staging ------------------------------------------------------------------------

    def create_staging(self, source_ids: Sequence[int]) -> None:
        """Fresh, index-less staging tables (indexes are built after the load: cheaper)."""
        conn = self.connect()
        try:
            with conn, conn.cursor() as cur:
                for source_id in source_ids:
                    table = staging_table(source_id)
                    cur.execute(f"DROP TABLE IF EXISTS {table}")
                    cur.execute(
                        f"CREATE TABLE {table} (key bytea NOT NULL, scn bigint NOT NULL,"
                        " op smallint NOT NULL, pkey bigint NOT NULL, key_hash bigint NOT NULL,"
                        " event bytea NOT NULL)"
                    )
        finally:
            conn.close()

    def drop_staging(self, source_ids: Sequence[int]) -> None:
        conn = self.connect()
        try:
            with conn, conn.cursor() as cur:
                for source_id in source_ids:
                    cur.execute(f"DROP TABLE IF EXISTS {staging_table(source_id)}")
        finally:
            conn.close()

    def leftover_staging(self) -> list[str]:
        """Staging tables a killed job left behind (dropped by the next job)."""
        conn = self.connect()
        try:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s"
                            " AND tablename LIKE 'dbus\\_snapshot\\_%%\\_next'", (self.schema,))
                return sorted(str(name) for (name,) in cur.fetchall())
        finally:
            conn.close()

    def index_staging(self, source_id: int) -> tuple[int, int]:
        """Primary key and SCN index on a loaded staging table (named so that they carry
        the snapshot's own index names after the swap); (rows, tombstones)."""
        table = staging_table(source_id)
        conn = self.connect()
        try:
            with conn, conn.cursor() as cur:
                try:
                    cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey"
                                " PRIMARY KEY (key)")
                except psycopg2.errors.UniqueViolation as exc:
                    raise SparkJobError(
                        f"the staged snapshot of source id {source_id} has a key twice "
                        f"({_first_line(exc)}); the old snapshot is untouched"
                    ) from None
                cur.execute(f"CREATE INDEX {table}_scn ON {table} (scn, key)")
                cur.execute(f"ANALYZE {table}")
                cur.execute(f"SELECT count(*), count(*) FILTER (WHERE op = 2) FROM {table}")
                rows, tombstones = _one(cur)
            return int(rows), int(tombstones)
        finally:
            conn.close()

    # -- the swap -------------------------------------------------------------------------

    def swap(self, plan: SwapPlan, *, before_commit: Callable[[], None] | None = None) -> None:
        """Replace the snapshot tables and move the state, in one transaction; retried
        while the locks it needs are held by readers (lock_timeout) or a deadlock with the
        applier is detected. ``before_commit`` is a test hook (a failure injected there
        must leave everything as it was)."""
        for attempt in range(1, SWAP_ATTEMPTS + 1):
            conn = self.connect()
            try:
                with conn, conn.cursor() as cur:
                    self._swap(cur, plan)
                    if before_commit is not None:
                        before_commit()
                return
            except _LOCK_ERRORS as exc:
                if attempt == SWAP_ATTEMPTS:
                    raise SparkJobError(
                        f"could not take the locks for the snapshot swap after {attempt} "
                        f"attempts ({_first_line(exc)}): long reads or the applier hold "
                        "them. The old snapshot is untouched; run the job again"
                    ) from None
                log.info("swap: %s; retrying", _first_line(exc))
                time.sleep(min(5.0, 0.2 * attempt))
            finally:
                conn.close()

    def _swap(self, cur: Any, plan: SwapPlan) -> None:
        cur.execute(f"SET LOCAL lock_timeout = '{SWAP_LOCK_TIMEOUT}'")
        # dbus_state first: an applier transaction reads it before touching any snapshot
        # table, so from here on none is in flight and the next one waits for our commit
        # and then reads the new applied SCN (it can never re-apply older windows on top
        # of the new snapshot).
        cur.execute("LOCK TABLE dbus_state IN ACCESS EXCLUSIVE MODE")
        ids = sorted(plan.replace)
        if ids:
            tables = ", ".join(snapshot_table(i) for i in ids)
            cur.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
        applied = _int_state(cur, APPLIED_SCN)
        floor = _int_state(cur, LOG_FLOOR_SCN)
        _check_still_valid(plan, applied, floor)
        for source_id in ids:
            live, staged = snapshot_table(source_id), staging_table(source_id)
            cur.execute(f"DROP TABLE {live}")
            cur.execute(f"ALTER TABLE {staged} RENAME TO {live}")
            cur.execute(f"ALTER INDEX {staged}_pkey RENAME TO {live}_pkey")
            cur.execute(f"ALTER INDEX {staged}_scn RENAME TO {live}_scn")
        if applied is None or plan.target_scn > applied:
            _set_state(cur, APPLIED_SCN, plan.target_scn)
        if plan.new_floor is not None and (floor is None or plan.new_floor > floor):
            _set_state(cur, LOG_FLOOR_SCN, plan.new_floor)
        if plan.producer_start is not None and _get_state(cur, PRODUCER_CHECKPOINT) is None:
            _set_state(cur, PRODUCER_CHECKPOINT, Checkpoint.after(plan.producer_start).dumps())
        if plan.counters is not None:
            mode, rows, new_keys = plan.counters
            if mode == "add":
                rows += _int_state(cur, APPLIER_ROWS) or 0
                new_keys += _int_state(cur, APPLIER_NEW_KEYS) or 0
            _set_state(cur, APPLIER_ROWS, rows)
            _set_state(cur, APPLIER_NEW_KEYS, new_keys)


def _check_still_valid(plan: SwapPlan, applied: int | None, floor: int | None) -> None:
    moved = "; the old snapshot is untouched"
    if applied is not None and applied > plan.target_scn:
        raise JobRefused(
            f"the applier moved to SCN {applied}, past the job's target {plan.target_scn}, "
            f"while the job ran{moved}. Stop the applier during the job, or run it again "
            "with a later target"
        )
    if plan.applied_at_plan is not None and (applied is None or applied < plan.applied_at_plan):
        raise JobRefused(f"the store's applied SCN went back from {plan.applied_at_plan} to "
                         f"{applied} while the job ran{moved}")
    cut = floor is not None and floor != plan.floor_at_plan and (
        plan.log_after is None or floor > plan.log_after)
    if plan.reads_log and cut:
        raise JobRefused(
            f"retention cut the log at SCN {floor} while the job read it from "
            f"{'its start' if plan.log_after is None else plan.log_after}{moved}"
        )


def _get_state(cur: Any, name: str) -> str | None:
    cur.execute("SELECT value FROM dbus_state WHERE name = %s", (name,))
    row = cur.fetchone()
    return None if row is None else str(row[0])


def _int_state(cur: Any, name: str) -> int | None:
    value = _get_state(cur, name)
    return None if value is None else int(value)


def _set_state(cur: Any, name: str, value: object) -> None:
    cur.execute("INSERT INTO dbus_state (name, value) VALUES (%s, %s)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, str(value)))


class ReadView:
    """Queries inside the exported snapshot; ``jdbc_properties`` makes Spark's reads join
    it. Valid until the ``PgStore.reading`` block ends."""

    state: StoreState

    def __init__(self, store: PgStore, conn: psycopg2.extensions.connection,
                 snapshot_id: str) -> None:
        self.store = store
        self._conn = conn
        self.snapshot_id = snapshot_id

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def read_state(self) -> StoreState:
        try:
            rows = dict(self._query("SELECT name, value FROM dbus_state"))
        except psycopg2.errors.UndefinedTable:
            raise SparkJobError(
                f"{self.store.location.where} holds no bootstrap store in schema "
                f"{self.store.schema!r} (no dbus_state table)"
            ) from None
        newest = self._query("SELECT max(scn) FROM dbus_windows")[0][0]
        sources = {str(n): int(i) for n, i in self._query(
            "SELECT name, source_id FROM dbus_sources ORDER BY source_id")}
        checkpoint = rows.get(PRODUCER_CHECKPOINT)
        producer = None if checkpoint is None else Checkpoint.loads(checkpoint).window_scn
        applied, floor = rows.get(APPLIED_SCN), rows.get(LOG_FLOOR_SCN)
        return StoreState(
            applied_scn=None if applied is None else int(applied),
            log_floor_scn=None if floor is None else int(floor),
            newest_window_scn=None if newest is None else int(newest),
            producer_scn=producer if producer is None or producer >= 0 else None,
            key_hash=rows.get(KEY_HASH, "1") == "1",
            sources=sources,
        )

    def log_rows(self, source_id: int, after: int | None, upto: int) -> int:
        return int(self._query(
            f"SELECT count(*) FROM {log_table(source_id)} WHERE scn > %s AND scn <= %s",
            (-(1 << 63) if after is None else after, upto))[0][0])

    def snapshot_rows(self, source_id: int) -> int:
        return int(self._query(f"SELECT count(*) FROM {snapshot_table(source_id)}")[0][0])

    def log_splits(self, after: int | None, upto: int, parts: int) -> list[int]:
        """SCN boundaries cutting (after, upto] into ``parts`` ranges of about equal event
        counts, from dbus_windows. Equal SCN strides would not do: a MySQL SCN jumps by
        2**32 at every binlog file, so most strides would be empty."""
        if parts <= 1:
            return []
        low = -(1 << 63) if after is None else after
        rows = self._query(
            "SELECT max(scn) FROM (SELECT scn, sum(events) OVER (ORDER BY scn) AS cum,"
            " sum(events) OVER () AS total FROM dbus_windows WHERE scn > %s AND scn <= %s) w"
            " GROUP BY ((cum - 1) * %s) / greatest(total, 1) ORDER BY 1",
            (low, upto, parts),
        )
        return [int(scn) for (scn,) in rows[:-1]]

    def key_splits(self, source_id: int, parts: int) -> list[bytes]:
        """Key boundaries cutting a snapshot table into ``parts`` ranges of about equal
        size, from a sample (a seeded snapshot has one SCN on every row, so its keys are
        the only thing to split on)."""
        if parts <= 1:
            return []
        table = snapshot_table(source_id)
        estimate = self._query(
            "SELECT reltuples FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relname = %s AND n.nspname = %s", (table, self.store.schema))
        rows = float(estimate[0][0]) if estimate else -1.0
        percent = 100.0 if rows <= 0 else min(100.0, max(0.01, 2_000_000.0 / rows))
        fractions = [i / parts for i in range(1, parts)]
        found = self._query(
            f"SELECT percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY key)"
            f" FROM {table} TABLESAMPLE SYSTEM (%s)", (fractions, percent))
        bounds = found[0][0] if found and found[0][0] else []
        return sorted({bytes(b) for b in bounds if b is not None})

    def schema_versions(self, source: str) -> list[str]:
        """The source's Avro schemas (JSON), oldest first."""
        return [str(s) for (s,) in self._query(
            "SELECT schema_json FROM dbus_schemas WHERE source = %s ORDER BY added_order",
            (source,))]

    def jdbc_properties(self, **extra: str) -> dict[str, str]:
        """Properties that make a JDBC read see exactly this view's snapshot."""
        return self.store.location.properties(
            sessionInitStatement=("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;"
                                  f" SET TRANSACTION SNAPSHOT '{self.snapshot_id}'"),
            **extra,
        )
