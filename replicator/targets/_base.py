"""What the three targets share: the connection and its transactions, the error
classification, the state table, the catalog-backed DDL, and ``apply`` (one
transaction per batch: every table's deletes and upserts, then the state row).

A dialect supplies how to connect, which driver errors mean "try again later", its
catalog queries, and how it loads many rows at once (``_upsert``: COPY into a staging
table on PostgreSQL, multi-row INSERT on MySQL, executemany on SQLite).

Finding the refused row. A bulk statement that fails names no row (or a row number of
a staging table). The batch is rolled back whole, then, in a second transaction that
is rolled back as well, the tables before the failing one are applied again in bulk
and the failing table's changes one statement each: the first refused statement is
the change to name. No savepoint on the way of a batch that succeeds: each would be a
subtransaction on PostgreSQL (a cost paid per table per batch, and more than 64 of
them in one transaction slow every other session's snapshots).

Threads: the replicator calls a target from its runner, its flusher and
``asyncio.to_thread``; a lock makes the calls take turns (one connection).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from databus._ddl import serialized_ddl
from databus._limited_log import limited
from databus._redact import redact, register_uri
from databus.config import redact_uri
from databus.errors import AlreadyRunningError, DatabusError
from databus.replicator._model import Batch, Change, ColumnMap, Dialect, TableMap
from databus.replicator.targets._errors import (
    ReplicationApplyError,
    TargetError,
    TargetUnavailableError,
    show_key,
)
from databus.replicator.targets._sql import SCHEMA_TABLE, STATE_TABLE, SqlDialect

__all__ = ["Refused", "SqlTarget", "StraightRefused", "TableWork", "first_line"]

log = logging.getLogger("databus.replicator.targets")

# Raised by a driver (or its value adaptation) for a value it cannot send: a NUL in
# PostgreSQL text, a str with lone surrogates, an int beyond SQLite's 64 bits.
VALUE_ERRORS: tuple[type[BaseException], ...] = (ValueError, OverflowError)


def first_line(exc: BaseException) -> str:
    """The first line of a driver's message (PostgreSQL's DETAIL lines repeat the whole
    row), every configured secret cut out."""
    text = str(exc).strip()
    return redact(text.splitlines()[0]) if text else type(exc).__name__


@dataclass
class TableWork:
    """One table's part of a batch."""

    source: str
    table: TableMap
    qname: str  # the target table, quoted for a statement with parameters
    shown: str  # the target table for a message: schema.table
    deletes: list[Change]
    upserts: list[Change]
    straight: bool = False  # upserts straight into the table (Batch.straight)

    def scn_range(self) -> tuple[int, int]:
        scns = [c.scn for c in self.deletes] + [c.scn for c in self.upserts]
        return min(scns), max(scns)


class Refused(Exception):
    """A dialect found a change the target cannot take before sending it (a row larger
    than MySQL's max_allowed_packet)."""

    def __init__(self, work: TableWork, change: Change, reason: str) -> None:
        super().__init__(reason)
        self.work = work
        self.change = change
        self.reason = reason


class StraightRefused(Exception):
    """A straight copy into a table met a key the table holds already (the batch is
    rolled back and applied again with the merge)."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.source = source


class _TableFailed(Exception):
    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


class _Discard(Exception):
    """Ends a transaction that must not commit (the search for a refused row)."""


class Held(Protocol):
    """A replication held by this process (``SqlTarget.hold``)."""

    def release(self) -> None: ...


class TargetHold:
    """A session lock held on a connection of its own."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class SqlTarget(ABC):
    """A target database reached through one DB-API connection (module docstring)."""

    dialect: Dialect
    sql: ClassVar[SqlDialect]
    # Keys per DELETE ... IN statement (a statement stays small to plan and to send).
    delete_chunk: ClassVar[int] = 500

    def __init__(self, url: str) -> None:
        # The password is registered before anything can fail and quote it.
        register_uri(url)
        self.where = redact_uri(url)
        self.default_schema: str | None = None
        self._conn: Any = None
        self._lock = threading.RLock()

    # -- what a dialect provides ---------------------------------------------------------

    driver_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    @abstractmethod
    def _connect(self) -> Any:
        """A new connection, its session set up; driver errors propagate."""

    @abstractmethod
    def _retriable(self, exc: BaseException) -> bool:
        """Whether a driver error may pass (lost connection, server restarting, deadlock)."""

    def _connect_retriable(self, exc: BaseException) -> bool:
        """Whether a failed connection attempt may succeed later (down, starting) rather
        than never (bad password, no such database)."""
        return self._retriable(exc)

    def _describe(self, exc: BaseException) -> str:
        return first_line(exc)

    def _begin(self, cur: Any, *, write: bool) -> None:
        """Start a transaction (PostgreSQL and MySQL start one with the first statement)."""
        return None

    def _serialized_ddl(self, cur: Any) -> contextlib.AbstractContextManager[None]:
        """Schema changes take turns with other replicators writing to the same target
        (two started together on a fresh database both create the schema and the
        state table; ``databus/_ddl.py``)."""
        return serialized_ddl(cur, self.dialect, "replicator")

    def _after_rollback(self) -> None:
        """Forget what a rolled back transaction created (PostgreSQL's staging tables)."""
        return None

    def _after_ddl(self) -> None:
        """Forget what depends on a table's shape."""
        return None

    @abstractmethod
    def _table_exists(self, cur: Any, schema: str | None, table: str) -> bool: ...

    @abstractmethod
    def _table_columns(self, cur: Any, schema: str | None,
                       table: str) -> list[tuple[str, str, bool]]:
        """(name, type as the catalog spells it, NULL-able) of every column, in order."""

    @abstractmethod
    def _table_key(self, cur: Any, schema: str | None, table: str) -> tuple[str, ...]: ...

    def _ensure_schema(self, cur: Any, schema: str | None) -> None:
        """Create ``schema`` if it is missing (checked first: CREATE SCHEMA needs a
        privilege a replication user may lack for a schema that is already there)."""
        return None

    def _table_suffix(self, cur: Any) -> str:
        """What follows a CREATE TABLE's column list (MySQL: engine and collation)."""
        return ""

    def _schema_of(self, t: TableMap) -> str | None:
        return t.schema or self.default_schema

    @abstractmethod
    def _upsert(self, cur: Any, work: TableWork) -> None:
        """Write every row of ``work.upserts`` (insert, or update the row of that key)."""

    def _delete(self, cur: Any, work: TableWork) -> None:
        """Delete every key of ``work.deletes``, a chunk of keys per statement."""
        t, keys = work.table, [c.key for c in work.deletes]
        for start in range(0, len(keys), self.delete_chunk):
            chunk = keys[start:start + self.delete_chunk]
            cur.execute(self.sql.delete_many(work.qname, t, len(chunk)),
                        [v for key in chunk for v in key])

    # -- connection and transactions ----------------------------------------------------

    def _connection(self) -> Any:
        if self._conn is None:
            try:
                self._conn = self._connect()
            except self.driver_errors as exc:
                if self._connect_retriable(exc):
                    raise TargetUnavailableError(
                        f"cannot connect to the target {self.where}: {self._describe(exc)}"
                    ) from None
                raise TargetError(
                    f"the target {self.where} refused the connection: {self._describe(exc)}"
                ) from None
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self._after_rollback()
        self._after_ddl()

    def _rollback(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.rollback()
        except Exception:  # a connection that cannot roll back is done
            self._drop()
            return
        self._after_rollback()

    @contextlib.contextmanager
    def _tx(self, what: str, *, write: bool = False) -> Iterator[Any]:
        """A cursor in a transaction committed at the end; any error rolls it back. A
        driver error becomes ``TargetUnavailableError`` (retriable, the connection
        dropped) or ``TargetError`` naming ``what`` was being done."""
        conn = self._connection()
        try:
            cur = conn.cursor()
            try:
                self._begin(cur, write=write)
                yield cur
                conn.commit()
            finally:
                with contextlib.suppress(Exception):
                    cur.close()
        except self.driver_errors as exc:
            if self._retriable(exc):
                self._drop()
                raise TargetUnavailableError(
                    f"lost the target {self.where} while {what}: {self._describe(exc)}"
                ) from None
            self._rollback()
            raise TargetError(
                f"the target {self.where} failed {what}: {self._describe(exc)}") from exc
        except BaseException:
            self._rollback()
            raise

    # -- who runs a replication (safe start, DESIGN 17) ---------------------------------

    def hold(self, replication: str) -> Held:
        """Say that this process runs ``replication`` on this target, for as long as it
        lives (a session lock on a connection of its own: released however the process
        ends); ``AlreadyRunningError`` when another process does."""
        try:
            conn = self._connect()
        except self.driver_errors as exc:
            raise TargetUnavailableError(
                f"cannot connect to the target {self.where}: {self._describe(exc)}"
            ) from None
        try:
            held = self._try_lock(conn, f"databus-replicate:{replication}")
        except self.driver_errors as exc:
            with contextlib.suppress(Exception):
                conn.close()
            raise TargetUnavailableError(
                f"the target {self.where} failed taking the replication's lock: "
                f"{self._describe(exc)}") from None
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            raise
        if not held:
            with contextlib.suppress(Exception):
                conn.close()
            raise AlreadyRunningError(
                f"replication {replication} on target {self.where} is run by another "
                "process; stop that one first, or give this one another replicate.name")
        return TargetHold(conn)

    def _try_lock(self, conn: Any, name: str) -> bool:
        """Take the session lock ``name`` on ``conn`` without waiting; False if held."""
        raise NotImplementedError

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        """Connect now (every other method connects on first use too, and again after
        a lost connection); calling it on an open target does nothing."""
        with self._lock:
            self._connection()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def __enter__(self) -> SqlTarget:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- state ------------------------------------------------------------------------------

    @property
    def _state_qname(self) -> str:
        return self.sql.qualified(self.default_schema, STATE_TABLE)

    @property
    def _schema_qname(self) -> str:
        return self.sql.qualified(self.default_schema, SCHEMA_TABLE)

    def ensure_state(self) -> None:
        """Create ``databus_replication_state`` and ``databus_replication_schemas`` if
        they are missing (in the target's default schema: ``public`` or the URL's
        ``?schema=``, the URL's database, ``main``)."""
        with (self._lock, self._tx("creating the replication state table", write=True) as cur,
              self._serialized_ddl(cur)):
            self._ensure_schema(cur, self.default_schema)
            suffix = self._table_suffix(cur)
            cur.execute(self.sql.create_state_table(self._state_qname, suffix=suffix), ())
            cur.execute(self.sql.create_schema_table(self._schema_qname, suffix=suffix), ())

    def load_schema(self, replication: str, source: str) -> str | None:
        """The source schema (Avro JSON) ``replication`` last made ``source``'s target
        table follow (``save_schema``); None: none recorded (a table made before the
        record existed, or by hand)."""
        with self._lock, self._tx("reading the recorded source schema") as cur:
            if not self._table_exists(cur, self.default_schema, SCHEMA_TABLE):
                return None
            cur.execute(self.sql.load_schema(self._schema_qname), (replication, source))
            row = cur.fetchone()
        return None if row is None else str(row[0])

    def save_schema(self, replication: str, source: str, fingerprint: int,
                    schema_json: str) -> None:
        """Record that ``source``'s target table now follows that schema version."""
        signed = fingerprint - (1 << 64) if fingerprint >= 1 << 63 else fingerprint
        with self._lock, self._tx("recording the source schema", write=True) as cur:
            cur.execute(self.sql.save_schema(self._schema_qname),
                        (replication, source, signed, schema_json))

    def _read_state(self, replication: str) -> tuple[int, str | None] | None:
        with self._lock, self._tx("reading the replication state") as cur:
            if not self._table_exists(cur, self.default_schema, STATE_TABLE):
                return None
            cur.execute(self.sql.load_state(self._state_qname), (replication,))
            row = cur.fetchone()
        return None if row is None else (int(row[0]), row[1])

    def load_state(self, replication: str) -> int | None:
        """The SCN recorded with the last batch of ``replication``, or None (never
        applied, or no state table yet)."""
        state = self._read_state(replication)
        return None if state is None else state[0]

    def load_checkpoint(self, replication: str) -> str | None:
        """The client checkpoint recorded with that batch (``Batch.checkpoint``)."""
        state = self._read_state(replication)
        return None if state is None else state[1]

    # -- tables ------------------------------------------------------------------------------

    def qualified_name(self, t: TableMap) -> str:
        """``t``'s target table quoted for this dialect (for statements with parameters)."""
        return self.sql.qualified(self._schema_of(t), t.table)

    def _shown(self, t: TableMap) -> str:
        schema = self._schema_of(t)
        return f"{schema}.{t.table}" if schema else t.table

    def table_exists(self, t: TableMap) -> bool:
        with self._lock, self._tx(f"looking for table {self._shown(t)}") as cur:
            return self._table_exists(cur, self._schema_of(t), t.table)

    def table_columns(self, t: TableMap) -> dict[str, str]:
        """Column name -> type as the target's catalog spells it (``format_type`` on
        PostgreSQL, ``COLUMN_TYPE`` on MySQL, the declared type on SQLite), in table
        order; empty when the table does not exist."""
        with self._lock, self._tx(f"reading the columns of {self._shown(t)}") as cur:
            return {name: type_ for name, type_, _ in
                    self._table_columns(cur, self._schema_of(t), t.table)}

    def table_nullable(self, t: TableMap) -> dict[str, bool]:
        """Column name -> whether it allows NULL, from the catalog (empty: no table)."""
        with self._lock, self._tx(f"reading the columns of {self._shown(t)}") as cur:
            return {name: nullable for name, _, nullable in
                    self._table_columns(cur, self._schema_of(t), t.table)}

    def catalog(self, t: TableMap) -> list[tuple[str, str, bool]]:
        """(name, type as the catalog spells it, NULL-able) of every column of ``t``'s
        target table, in table order (empty: no table)."""
        with self._lock, self._tx(f"reading the columns of {self._shown(t)}") as cur:
            return self._table_columns(cur, self._schema_of(t), t.table)

    def shown(self, t: TableMap) -> str:
        """``t``'s target table as messages name it (``schema.table`` or ``table``)."""
        return self._shown(t)

    def table_key(self, t: TableMap) -> tuple[str, ...]:
        """The primary key columns of the target table, in key order (empty: none, or
        no table)."""
        with self._lock, self._tx(f"reading the key of {self._shown(t)}") as cur:
            return self._table_key(cur, self._schema_of(t), t.table)

    def create_table(self, t: TableMap) -> None:
        """The table with every column of ``t`` (its target type, NOT NULL where not
        nullable) and PRIMARY KEY (key); nothing if it exists already."""
        with (self._lock, self._tx(f"creating table {self._shown(t)}", write=True) as cur,
              self._serialized_ddl(cur)):
            schema = self._schema_of(t)
            self._ensure_schema(cur, schema)
            cur.execute(self.sql.create_table(self.qualified_name(t), t,
                                              suffix=self._table_suffix(cur)), ())
        self._after_ddl()

    def _alter(self, t: TableMap, what: str,
               statement: Callable[[Mapping[str, tuple[str, bool]]], str | None]) -> None:
        """Run the ALTER ``statement(columns)`` builds from the catalog's columns (name
        -> (type, NULL-able)), or nothing when it returns None (already done: the DDL of
        a schema version may be replayed after a crash)."""
        with self._lock:
            try:
                with (self._tx(f"{what} on {self._shown(t)}", write=True) as cur,
                      self._serialized_ddl(cur)):
                    columns = {name: (type_, nullable) for name, type_, nullable in
                               self._table_columns(cur, self._schema_of(t), t.table)}
                    sql = statement(columns)
                    if sql is not None:
                        cur.execute(sql, ())
                        log.info("target %s: %s on %s", self.where, what, self._shown(t))
            finally:
                self._after_ddl()

    def add_column(self, t: TableMap, column: ColumnMap) -> None:
        """ALTER TABLE ADD COLUMN, NULL-able whatever ``column.nullable`` says: the rows
        already in the table have no value for it."""
        def statement(columns: Mapping[str, tuple[str, bool]]) -> str | None:
            if column.target in columns:
                return None
            return self.sql.add_column(self.qualified_name(t), column)

        self._alter(t, f"adding column {column.target} {column.target_type}", statement)

    def drop_column(self, t: TableMap, name: str) -> None:
        def statement(columns: Mapping[str, tuple[str, bool]]) -> str | None:
            if name not in columns:
                return None
            return self.sql.drop_column(self.qualified_name(t), name)

        self._alter(t, f"dropping column {name}", statement)

    def widen_column(self, t: TableMap, column: ColumnMap) -> None:
        """Change the column's type to ``column.target_type`` (a type holding every value
        of the old one), keeping its NULL-ness."""
        def statement(columns: Mapping[str, tuple[str, bool]]) -> str | None:
            if column.target not in columns:
                raise TargetError(f"table {self._shown(t)} of the target {self.where} has "
                                  f"no column {column.target} to widen")
            _, nullable = columns[column.target]
            return self.sql.widen_column(self.qualified_name(t), column,
                                         not_null=not nullable)

        self._alter(t, f"widening column {column.target} to {column.target_type}",
                    statement)

    # -- batches -------------------------------------------------------------------------------

    def _plan(self, tables: Mapping[str, TableMap], batch: Batch) -> list[TableWork]:
        work = []
        for source, changes in batch.changes.items():
            if not changes:
                continue
            t = tables.get(source)
            if t is None:
                raise ReplicationApplyError(
                    f"the batch to SCN {batch.scn} has changes of source {source} and no "
                    "table map for it", source=source, last_scn=batch.scn)
            deletes: list[Change] = []
            upserts: list[Change] = []
            for change in changes.values():
                (deletes if change.row is None else upserts).append(change)
            work.append(TableWork(source, t, self.qualified_name(t), self._shown(t),
                                  deletes, upserts, straight=source in batch.straight))
        return work

    def _apply_table(self, cur: Any, work: TableWork) -> None:
        if work.deletes:
            self._delete(cur, work)
        if work.upserts:
            self._upsert(cur, work)

    def apply(self, replication: str, tables: Mapping[str, TableMap], batch: Batch) -> None:
        """Apply every change of ``batch`` and record ``batch.scn`` (and its checkpoint)
        as ``replication``'s state, in one transaction: all of it or nothing.

        ``ReplicationApplyError`` when the target refuses a change (naming the table,
        and the key and SCN of the change when one alone is refused);
        ``TargetUnavailableError`` when the target went away (the batch may have been
        committed if the answer to COMMIT was lost: applying it again is harmless).

        The upserts of a source in ``batch.straight`` go straight into its table; when
        the table holds one of their keys already, the batch is rolled back, the source
        leaves ``batch.straight`` and the batch is applied again with the merge."""
        while True:
            try:
                self._apply(replication, tables, batch)
                return
            except StraightRefused as refused:
                batch.straight.discard(refused.source)
                log.info("target %s: the straight copy of %s met a key the table holds; "
                         "merging from now on", self.where, refused.source)

    def accepts_straight_copy(self, t: TableMap) -> bool:
        """Whether an initial copy's rows may go straight into ``t``'s table: a dialect
        that can (``_straight``), the table empty, its primary key ``t.key``."""
        if not self.straight_copy:
            return False
        with self._lock, self._tx(f"looking at table {self._shown(t)}") as cur:
            schema = self._schema_of(t)
            if tuple(self._table_key(cur, schema, t.table)) != tuple(t.key):
                return False
            cur.execute(f"SELECT 1 FROM {self.qualified_name(t)} LIMIT 1", ())
            return cur.fetchone() is None

    # Whether the dialect writes Batch.straight upserts straight into the table.
    straight_copy: ClassVar[bool] = False

    def _apply(self, replication: str, tables: Mapping[str, TableMap], batch: Batch) -> None:
        work = self._plan(tables, batch)
        with self._lock:
            try:
                with self._tx(f"applying the batch to SCN {batch.scn}", write=True) as cur:
                    for index, item in enumerate(work):
                        try:
                            self._apply_table(cur, item)
                        except (*self.driver_errors, *VALUE_ERRORS) as exc:
                            if isinstance(exc, self.driver_errors) and self._retriable(exc):
                                raise
                            raise _TableFailed(index, exc) from exc
                    try:
                        cur.execute(self.sql.save_state(self._state_qname),
                                    (replication, batch.scn, batch.checkpoint))
                    except self.driver_errors as exc:
                        if self._retriable(exc):
                            raise
                        raise TargetError(
                            f"the target {self.where} refused to record SCN {batch.scn} in "
                            f"{STATE_TABLE} (did ensure_state run?): {self._describe(exc)}"
                        ) from exc
            except Refused as refused:
                raise self._refused_error(refused.work, refused.change,
                                          refused.reason) from None
            except _TableFailed as failed:
                raise self._diagnose(work, failed.index, failed.error) from failed.error
        log.debug("target %s: applied %d rows of %d tables to SCN %d", self.where,
                  batch.rows, len(work), batch.scn)

    def _refused_error(self, work: TableWork, change: Change,
                       reason: str) -> ReplicationApplyError:
        first, last = work.scn_range()
        return ReplicationApplyError(
            f"the target {self.where} refused the change of key {show_key(change.key)} "
            f"at SCN {change.scn} of source {work.source} to table {work.shown}: {reason}",
            table=work.shown, source=work.source, key=change.key, scn=change.scn,
            first_scn=first, last_scn=last)

    def _diagnose(self, work: Sequence[TableWork], index: int,
                  error: BaseException) -> DatabusError:
        """The error for a batch whose table ``work[index]`` failed with ``error`` (the
        batch already rolled back): the first change of that table the target refuses
        alone, found in a transaction that is rolled back too."""
        item = work[index]
        found: tuple[Change, BaseException] | None = None
        try:
            with self._tx(f"looking for the row {item.shown} refuses", write=True) as cur:
                for before in work[:index]:
                    self._apply_table(cur, before)
                found = self._first_refused(cur, item)
                raise _Discard
        except _Discard:
            pass
        except TargetUnavailableError as exc:
            return exc  # the batch is applied again once the target is back
        except (DatabusError, ValueError, OverflowError) as exc:
            # The tables before did not apply again (another writer?): say what the
            # batch met, without a key.
            limited(log).warning("target %s: could not replay the batch to find the refused "
                                 "row: %s", self.where, exc)
        if found is not None:
            change, refusal = found
            return self._refused_error(item, change, self._describe(refusal))
        first, last = item.scn_range()
        return ReplicationApplyError(
            f"the target {self.where} refused the changes of source {item.source} to table "
            f"{item.shown} (SCNs {first}..{last}; no change alone is refused): "
            f"{self._describe(error)}",
            table=item.shown, source=item.source, first_scn=first, last_scn=last)

    def _first_refused(self, cur: Any,
                       work: TableWork) -> tuple[Change, BaseException] | None:
        """Each change of ``work`` in a statement of its own; the first one refused."""
        delete = self.sql.delete_one(work.qname, work.table)
        upsert = self.sql.upsert(work.qname, work.table)
        statements = [(delete, c, c.key) for c in work.deletes] + \
                     [(upsert, c, c.row) for c in work.upserts]
        for sql, change, params in statements:
            try:
                cur.execute(sql, params)
            except (*self.driver_errors, *VALUE_ERRORS) as exc:
                if isinstance(exc, self.driver_errors) and self._retriable(exc):
                    raise
                return change, exc
        return None
