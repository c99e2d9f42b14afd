"""SQL of the TxLog scheme, per dialect: install, uninstall, prune and the pull queries.

Pure text generation, no I/O: the fetcher (``_fetcher``) and ``databus txlog`` (``_cli``)
run these statements through a ``DbSession``; the unit tests check them as text (and
run the SQLite ones). The scheme is the same in every dialect (``_model`` names the
objects, ``docs/txlog-fetcher.md`` explains why it is correct):

1. a trigger on each captured table stamps every inserted or updated row with its
   transaction's id (``databus_txn``), records a deleted row's key (and the old key of a
   row whose key changed) in the table's delete log, and makes sure the transaction has
   a row in ``databus_txlog``;
2. **assignment**: a transaction gets its SCN once it is known to be committed. SQLite:
   ``scn = txn`` when sealed (single writer); PostgreSQL: the next numbers of a counter,
   in txid order, for every TxLog row the assigner's snapshot sees (a row is visible
   exactly when its transaction has committed), under a row lock that serialises
   assigners; Oracle: ``scn = ora_rowscn`` (the paper's periodic update);
3. **pull**: the transactions with ``scn > :last`` (a batch, in SCN order), then per
   table the current rows stamped by them and the keys they deleted, except deletes
   undone by a row that exists now with an SCN not after the delete (a delete and
   re-insert in one transaction, or in an order the batch does not show).

Parameters are named ``last``, ``upto``, ``limit`` and ``before``, in the driver's
paramstyle (SQLite and Oracle ``:name``, psycopg2 ``%(name)s``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from databus._ddl import pg_xact_lock_sql
from databus.fetchers.txlog._model import (
    STATE_TABLE,
    TXLOG_TABLE,
    TXN_COLUMN,
    WATERMARK_TABLE,
    Column,
    TableRef,
    TableShape,
    object_name,
)
from databus.fetchers.txlog._schema import field_mapping
from databus.fetchers.txlog._uri import Dialect

__all__ = [
    "ORACLE_INFINITY",
    "AssignPlan",
    "OracleDialect",
    "PostgresDialect",
    "SqlDialect",
    "SqliteDialect",
    "dialect_for",
]

# The paper's "infinity": the SCN of a TxLog row the periodic update has not reached.
ORACLE_INFINITY = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class AssignPlan:
    """How SCNs are assigned: in one write transaction, ``lock`` (if any) is run first and
    its single value is passed as ``last`` to each of ``statements``."""

    statements: tuple[str, ...]
    lock: str | None = None


class SqlDialect(ABC):
    """The statements of one SQL dialect (see the module docstring)."""

    name: Dialect
    max_identifier: int = 63

    def __init__(self, txlog_schema: str = "") -> None:
        self.txlog_schema = txlog_schema

    # -- names ---------------------------------------------------------------------

    def q(self, ident: str) -> str:
        """A quoted identifier."""
        return '"' + ident.replace('"', '""') + '"'

    def ident(self, name: str) -> str:
        """A generated object name as this dialect spells it."""
        return name

    def table(self, ref: TableRef) -> str:
        return f"{self.q(ref.schema)}.{self.q(ref.name)}"

    def in_schema(self, schema: str, name: str) -> str:
        """``name`` (made an identifier of this dialect) in ``schema``; unqualified
        without a schema (the connection's default)."""
        if not schema:
            return self.q(self.ident(name))
        return f"{self.q(schema)}.{self.q(self.ident(name))}"

    def generated(self, kind: str, ref: TableRef, suffix: str = "") -> str:
        return self.ident(object_name(kind, ref.name, self.max_identifier, suffix))

    @property
    def txlog(self) -> str:
        return self.in_schema(self.txlog_schema, TXLOG_TABLE)

    @property
    def state(self) -> str:
        return self.in_schema(self.txlog_schema, STATE_TABLE)

    @property
    def txn_column(self) -> str:
        return self.q(self.ident(TXN_COLUMN))

    def delete_log(self, ref: TableRef) -> TableRef:
        """The table holding the keys deleted from ``ref``."""
        return TableRef(ref.schema, self.generated("deleted", ref))

    def txn_index(self, ref: TableRef) -> str:
        return self.generated("txn", ref)

    @abstractmethod
    def triggers(self, ref: TableRef) -> tuple[str, ...]:
        """The names of the capture triggers ``ref`` must have (enabled)."""

    @abstractmethod
    def param(self, name: str) -> str:
        """A named placeholder."""

    # -- dumps (docs/dumps.md) -----------------------------------------------------

    #: The watermark table's columns, in this dialect's types; None: no dump support.
    watermark_columns: tuple[Column, ...] | None = None
    default_schema = "main"
    watermark_ttl_sql = ""  # ``created_at`` older than an hour
    now_default = "CURRENT_TIMESTAMP"

    def watermark_shape(self) -> TableShape:
        """The watermark table, as the install statements see it before it exists."""
        assert self.watermark_columns is not None
        ref = TableRef(self.txlog_schema or self.default_schema, WATERMARK_TABLE)
        return TableShape(ref, self.watermark_columns, ("id",))

    def ddl_lock_sql(self) -> list[str]:
        """What a transaction that installs or removes capture objects runs first, so
        that two installs at once take turns (none where the database serializes DDL)."""
        return []

    def watermark_create_sql(self) -> str:
        shape = self.watermark_shape()
        id_type, ts_type = (c.sql_type for c in shape.columns)
        return (f"CREATE TABLE IF NOT EXISTS {self.table(shape.ref)} (id {id_type} NOT NULL "
                f"PRIMARY KEY, created_at {ts_type} NOT NULL DEFAULT {self.now_default})")

    def chunk_sql(self, shape: TableShape, *, after: bool, limit: int,
                  until: bool = False) -> str:
        """A dump chunk: the table's columns as ``rows_sql`` selects them, in key order,
        after the key ``k0, k1, ...`` (row comparison) when ``after``, up to the key
        ``u0, u1, ...`` (a key range's end, inclusive) when ``until``."""
        sql, keys = self._dump_select(shape)
        terms = []
        if after:
            params = ", ".join(self.param(f"k{i}") for i in range(len(keys)))
            terms.append(f"({', '.join(keys)}) > ({params})")
        if until:
            params = ", ".join(self.param(f"u{i}") for i in range(len(keys)))
            terms.append(f"({', '.join(keys)}) <= ({params})")
        if terms:
            sql += " WHERE " + " AND ".join(terms)
        return sql + f" ORDER BY {', '.join(keys)} LIMIT {int(limit)}"

    def split_sql(self, shape: TableShape, *, after: bool, skip: int) -> str:
        """The key ``skip`` rows after the key ``k0, k1, ...`` (or the table's start): a
        split point of a dump's key ranges, read from the primary key index."""
        keys = [f"t.{self.q(k)}" for k in shape.key]
        sql = f"SELECT {', '.join(keys)} FROM {self.table(shape.ref)} t"
        if after:
            params = ", ".join(self.param(f"k{i}") for i in range(len(keys)))
            sql += f" WHERE ({', '.join(keys)}) > ({params})"
        return sql + f" ORDER BY {', '.join(keys)} LIMIT 1 OFFSET {int(skip)}"

    def keys_sql(self, shape: TableShape, count: int) -> str:
        """The rows whose key is one of ``count`` keys (parameters ``k<i>_<j>``)."""
        sql, keys = self._dump_select(shape)
        terms = [" AND ".join(f"{k} = {self.param(f'k{i}_{j}')}" for j, k in enumerate(keys))
                 for i in range(count)]
        return (sql + " WHERE " + " OR ".join(f"({t})" for t in terms)
                + f" ORDER BY {', '.join(keys)}")

    def _dump_select(self, shape: TableShape) -> tuple[str, list[str]]:
        """``SELECT`` of the table's columns as ``rows_sql`` selects them (alias ``t``),
        and its key columns, qualified."""
        columns = ", ".join(self.select_expr("t", c) for c in shape.columns)
        return (f"SELECT {columns} FROM {self.table(shape.ref)} t",
                [f"t.{self.q(k)}" for k in shape.key])

    # -- shared pieces -------------------------------------------------------------

    def select_expr(self, alias: str, column: Column) -> str:
        """How a column is selected (PostgreSQL casts the types it carries as text)."""
        expr = f"{alias}.{self.q(column.name)}"
        if field_mapping(self.name, column.sql_type).as_text:
            expr += "::text"
        return expr

    def key_match(self, left: str, right: str, shape: TableShape) -> str:
        """``left.key = right.key`` for every key column (null-safe where keys may be
        NULL)."""
        return " AND ".join(
            f"{left}.{self.q(k)} {self.key_equals} {right}.{self.q(k)}" for k in shape.key
        )

    key_equals = "="

    def scn_expr(self, alias: str) -> str:
        """A TxLog row's SCN in the pull queries."""
        return f"{alias}.scn"

    def window_filter(self, alias: str) -> str:
        """The TxLog rows of the batch (``last``, ``upto``]."""
        scn = self.scn_expr(alias)
        return f"{scn} > {self.param('last')} AND {scn} <= {self.param('upto')}"

    def rows_sql(self, shape: TableShape) -> str:
        """``(scn, column...)`` of the current rows stamped by the batch's transactions."""
        columns = ", ".join(self.select_expr("t", c) for c in shape.columns)
        order = ", ".join(f"t.{self.q(k)}" for k in shape.key)
        return (
            f"SELECT {self.scn_expr('tl')}, {columns} "
            f"FROM {self.txlog} tl JOIN {self.table(shape.ref)} t "
            f"ON t.{self.txn_column} = tl.txn "
            f"WHERE {self.window_filter('tl')} ORDER BY 1, {order}"
        )

    def deletes_sql(self, shape: TableShape) -> str:
        """``(scn, key column...)`` of the keys the batch's transactions deleted, except
        those a row now holds with an SCN not after the delete."""
        keys = ", ".join(self.select_expr("d", c) for c in shape.key_columns)
        return (
            f"SELECT DISTINCT {self.scn_expr('tl')}, {keys} "
            f"FROM {self.txlog} tl JOIN {self.table(self.delete_log(shape.ref))} d "
            f"ON d.{self.txn_column} = tl.txn "
            f"WHERE {self.window_filter('tl')} AND NOT EXISTS ("
            f"SELECT 1 FROM {self.table(shape.ref)} t JOIN {self.txlog} tl2 "
            f"ON tl2.txn = t.{self.txn_column} "
            f"WHERE {self.key_match('t', 'd', shape)} "
            f"AND {self.scn_expr('tl2')} <= {self.scn_expr('tl')}) "
            f"ORDER BY {self.positions(shape)}"
        )

    def positions(self, shape: TableShape) -> str:
        """``1, 2, ...``: the SCN and key columns of a deletes query, to order by."""
        return ", ".join(str(i) for i in range(1, len(shape.key) + 2))

    def batch_sql(self) -> str:
        """``(scn, ts_ns)`` of the next ``limit`` transactions after ``last``."""
        return (
            f"SELECT tl.scn, {self.ts_ns_expr('tl')} FROM {self.txlog} tl "
            f"WHERE tl.scn > {self.param('last')} ORDER BY tl.scn LIMIT {self.param('limit')}"
        )

    def ts_ns_expr(self, alias: str) -> str:
        """A TxLog row's time (its transaction's first captured change), ns since 1970."""
        return f"{alias}.ts_ns"

    def pending_sql(self) -> str:
        """A row when some transaction waits for its SCN."""
        return f"SELECT 1 FROM {self.txlog} WHERE scn IS NULL LIMIT 1"

    def position_sql(self) -> str:
        """``(newest assigned SCN or NULL, pruned_before)``."""
        return (
            f"SELECT (SELECT max(scn) FROM {self.txlog}), pruned_before "
            f"FROM {self.state} WHERE id = 1"
        )

    def prune_sql(self, delete_logs: Sequence[TableRef]) -> list[str]:
        """Forget the transactions with SCN < ``before`` (delete logs first)."""
        before = self.param("before")
        return [
            *(
                f"DELETE FROM {self.table(log)} WHERE {self.txn_column} IN "
                f"(SELECT txn FROM {self.txlog} WHERE scn < {before})"
                for log in delete_logs
            ),
            f"DELETE FROM {self.txlog} WHERE scn < {before}",
            f"UPDATE {self.state} SET pruned_before = {self.greatest}(pruned_before, {before}) "
            "WHERE id = 1",
        ]

    greatest = "GREATEST"

    @abstractmethod
    def assign_plan(self) -> AssignPlan:
        """How committed transactions get their SCNs."""

    @abstractmethod
    def install_sql(self, shapes: Sequence[TableShape]) -> list[str]:
        """The TxLog, then per table its column, index, delete log and triggers.

        Re-running it on an installed database changes nothing but the triggers (they
        are replaced, so a changed key is picked up)."""

    @abstractmethod
    def uninstall_sql(self, shapes: Sequence[TableShape], *, drop_txlog: bool) -> list[str]:
        """Drop the tables' triggers, delete logs, indexes and ``databus_txn`` columns;
        with ``drop_txlog`` also the shared TxLog objects."""


# -- SQLite -------------------------------------------------------------------------


class SqliteDialect(SqlDialect):
    """SQLite: one writer at a time, so the open TxLog row belongs to the writer.

    SQLite has no transaction id a trigger could read, so the triggers use the TxLog row
    with ``scn IS NULL`` ("open"), creating it when there is none. Sealing it
    (``scn = txn``) closes the transaction: the fetcher seals under the write lock, when
    no write transaction is in progress, so every open row it seals belongs to
    committed transactions only; a writer that seals just before its COMMIT
    (``SEAL_SQL``) gets exactly one window per transaction, otherwise the transactions
    committed between two polls share one window. Names are unqualified: triggers of
    ``main`` can only name objects of ``main``.
    """

    name: Dialect = "sqlite"
    max_identifier = 1000
    key_equals = "IS"  # keys of rowid tables may be NULL in SQLite
    greatest = "max"

    OPEN_TXN = f"(SELECT txn FROM {TXLOG_TABLE} WHERE scn IS NULL)"
    watermark_columns = (Column("id", "TEXT", False), Column("created_at", "TEXT", False))
    now_default = "(strftime('%Y-%m-%d %H:%M:%f', 'now'))"
    watermark_ttl_sql = "created_at < strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 hour')"
    SEAL_SQL = f"UPDATE {TXLOG_TABLE} SET scn = txn WHERE scn IS NULL"
    # Unix time in ns at millisecond precision (julianday('now') is what SQLite has).
    NOW_NS = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) * 1000000"

    def param(self, name: str) -> str:
        return f":{name}"

    def table(self, ref: TableRef) -> str:
        return self.q(ref.name)

    def in_schema(self, schema: str, name: str) -> str:
        return self.q(name)

    def triggers(self, ref: TableRef) -> tuple[str, ...]:
        return tuple(self.generated(kind, ref) for kind in ("ins", "upd", "del"))

    def assign_plan(self) -> AssignPlan:
        return AssignPlan((self.SEAL_SQL,))

    def install_sql(self, shapes: Sequence[TableShape]) -> list[str]:
        out = [
            f"CREATE TABLE IF NOT EXISTS {self.txlog} ("
            "txn INTEGER PRIMARY KEY AUTOINCREMENT, scn INTEGER UNIQUE, ts_ns INTEGER NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.state} ("
            "id INTEGER PRIMARY KEY CHECK (id = 1), pruned_before INTEGER NOT NULL DEFAULT 0)",
            f"INSERT OR IGNORE INTO {self.state} (id) VALUES (1)",
        ]
        for shape in shapes:
            out += self._install_table(shape)
        return out

    def _install_table(self, shape: TableShape) -> list[str]:
        ref = shape.ref
        t = self.table(ref)
        log = self.table(self.delete_log(ref))
        ins, upd, dele = self.triggers(ref)
        key_cols = ", ".join(self.q(k) for k in shape.key)
        new_match = " AND ".join(f"{self.q(k)} IS NEW.{self.q(k)}" for k in shape.key)
        changed = " OR ".join(f"OLD.{self.q(k)} IS NOT NEW.{self.q(k)}" for k in shape.key)
        old_keys = ", ".join(f"OLD.{self.q(k)}" for k in shape.key)
        ensure_open = (
            f"INSERT INTO {self.txlog} (ts_ns) SELECT {self.NOW_NS} "
            f"WHERE NOT EXISTS (SELECT 1 FROM {self.txlog} WHERE scn IS NULL);"
        )
        stamp = f"UPDATE {t} SET {self.txn_column} = {self.OPEN_TXN} WHERE {new_match};"
        log_cols = ", ".join(
            f"{self.q(c.name)} {c.sql_type}".rstrip() for c in shape.key_columns
        )
        out = []
        if not shape.has_txn_column:
            out.append(f"ALTER TABLE {t} ADD COLUMN {self.txn_column} INTEGER")
        out += [
            f"CREATE INDEX IF NOT EXISTS {self.q(self.txn_index(ref))} ON {t} ({self.txn_column})",
            f"CREATE TABLE IF NOT EXISTS {log} ({self.txn_column} INTEGER NOT NULL, {log_cols})",
            f"CREATE INDEX IF NOT EXISTS {self.q(self.generated('deleted', ref, '_txn'))} "
            f"ON {log} ({self.txn_column})",
            f"DROP TRIGGER IF EXISTS {self.q(ins)}",
            f"DROP TRIGGER IF EXISTS {self.q(upd)}",
            f"DROP TRIGGER IF EXISTS {self.q(dele)}",
            f"CREATE TRIGGER {self.q(ins)} AFTER INSERT ON {t} FOR EACH ROW BEGIN "
            f"{ensure_open} {stamp} END",
            # WHEN skips rows already stamped by this transaction, and stops the stamping
            # UPDATE from firing this trigger again when recursive_triggers is on. A row
            # never stamped (it existed before the install) is NULL, and so is the open
            # transaction before this statement opens it: ``NULL IS NOT NULL`` is false,
            # so such a row's first update must be let through explicitly.
            f"CREATE TRIGGER {self.q(upd)} AFTER UPDATE ON {t} FOR EACH ROW "
            f"WHEN NEW.{self.txn_column} IS NULL OR NEW.{self.txn_column} IS NOT "
            f"{self.OPEN_TXN} OR {changed} BEGIN "
            f"{ensure_open} "
            f"INSERT INTO {log} ({self.txn_column}, {key_cols}) "
            f"SELECT {self.OPEN_TXN}, {old_keys} WHERE {changed}; "
            f"{stamp} END",
            f"CREATE TRIGGER {self.q(dele)} AFTER DELETE ON {t} FOR EACH ROW BEGIN "
            f"{ensure_open} "
            f"INSERT INTO {log} ({self.txn_column}, {key_cols}) "
            f"VALUES ({self.OPEN_TXN}, {old_keys}); END",
        ]
        return out

    def uninstall_sql(self, shapes: Sequence[TableShape], *, drop_txlog: bool) -> list[str]:
        out = []
        for shape in shapes:
            ref = shape.ref
            out += [f"DROP TRIGGER IF EXISTS {self.q(name)}" for name in self.triggers(ref)]
            out += [
                f"DROP TABLE IF EXISTS {self.table(self.delete_log(ref))}",
                f"DROP INDEX IF EXISTS {self.q(self.txn_index(ref))}",
            ]
            if shape.has_txn_column:
                out.append(f"ALTER TABLE {self.table(ref)} DROP COLUMN {self.txn_column}")
        if drop_txlog:
            out += [f"DROP TABLE IF EXISTS {self.txlog}", f"DROP TABLE IF EXISTS {self.state}"]
        return out


# -- PostgreSQL ---------------------------------------------------------------------


class PostgresDialect(SqlDialect):
    """PostgreSQL: ``txid_current()`` identifies the transaction, MVCC tells committed.

    The TxLog row is inserted once per transaction (a transaction-local setting,
    ``databus.txlog_txn``, remembers it; a rollback to a savepoint undoes both). The
    assigner locks the state row, then numbers every TxLog row its snapshot sees without
    an SCN, in txid order: a row is visible to it exactly when its transaction has
    committed, so a long-running transaction (paper Figure 8) is simply not seen until
    it commits and then gets a later SCN than everything assigned before.
    """

    name: Dialect = "postgresql"
    max_identifier = 63

    def __init__(self, txlog_schema: str = "public") -> None:
        super().__init__(txlog_schema)
    TRIGGERS = ("databus_stamp", "databus_deleted", "databus_rekeyed")
    TXN_SETTING = "databus.txlog_txn"
    watermark_columns = (Column("id", "text", False),
                         Column("created_at", "timestamp with time zone", False))
    default_schema = "public"
    now_default = "now()"
    watermark_ttl_sql = "created_at < now() - interval '1 hour'"

    def param(self, name: str) -> str:
        return f"%({name})s"

    def triggers(self, ref: TableRef) -> tuple[str, ...]:
        return self.TRIGGERS

    @property
    def txn_function(self) -> str:
        return self.in_schema(self.txlog_schema, "databus_txlog_txn")

    def capture_function(self, ref: TableRef) -> str:
        return self.in_schema(ref.schema, self.generated("capture", ref))

    def ts_ns_expr(self, alias: str) -> str:
        return f"(extract(epoch FROM {alias}.ts) * 1000000000)::bigint"

    def position_sql(self) -> str:
        return f"SELECT last_scn, pruned_before FROM {self.state} WHERE id = 1"

    def assign_plan(self) -> AssignPlan:
        last = self.param("last")
        return AssignPlan(
            lock=f"SELECT last_scn FROM {self.state} WHERE id = 1 FOR UPDATE",
            statements=(
                # A new statement, so a new snapshot: it sees every assigner that held the
                # lock before. `scn IS NULL` is checked again on the row it updates.
                f"WITH todo AS (SELECT txn, row_number() OVER (ORDER BY txn) AS n "
                f"FROM {self.txlog} WHERE scn IS NULL), "
                f"assigned AS (UPDATE {self.txlog} AS tl SET scn = {last} + todo.n "
                f"FROM todo WHERE tl.txn = todo.txn AND tl.scn IS NULL RETURNING tl.scn) "
                f"UPDATE {self.state} SET last_scn = "
                f"GREATEST(last_scn, (SELECT max(scn) FROM assigned)) WHERE id = 1",
            ),
        )

    def prune_sql(self, delete_logs: Sequence[TableRef]) -> list[str]:
        before = self.param("before")
        return [
            *(
                f"DELETE FROM {self.table(log)} AS d USING {self.txlog} AS tl "
                f"WHERE d.{self.txn_column} = tl.txn AND tl.scn < {before}"
                for log in delete_logs
            ),
            f"DELETE FROM {self.txlog} WHERE scn < {before}",
            f"UPDATE {self.state} SET pruned_before = GREATEST(pruned_before, {before}) "
            "WHERE id = 1",
        ]

    def ddl_lock_sql(self) -> list[str]:
        # CREATE ... IF NOT EXISTS and CREATE OR REPLACE FUNCTION/TRIGGER fail when
        # another transaction creates the same object at the same time.
        return [pg_xact_lock_sql(f"txlog:{self.txlog}")]

    def install_sql(self, shapes: Sequence[TableShape]) -> list[str]:
        setting = self.TXN_SETTING
        out = [
            f"CREATE TABLE IF NOT EXISTS {self.txlog} (txn bigint PRIMARY KEY, "
            "scn bigint UNIQUE, ts timestamptz NOT NULL DEFAULT clock_timestamp())",
            f"CREATE INDEX IF NOT EXISTS {self.q('databus_txlog_unassigned')} "
            f"ON {self.txlog} (txn) WHERE scn IS NULL",
            f"CREATE TABLE IF NOT EXISTS {self.state} (id int PRIMARY KEY CHECK (id = 1), "
            "last_scn bigint NOT NULL DEFAULT 0, pruned_before bigint NOT NULL DEFAULT 0)",
            f"INSERT INTO {self.state} (id) VALUES (1) ON CONFLICT (id) DO NOTHING",
            f"CREATE OR REPLACE FUNCTION {self.txn_function}() RETURNS bigint "
            "LANGUAGE plpgsql AS $databus$\n"
            "DECLARE\n"
            "  current_txn bigint := txid_current();\n"
            "BEGIN\n"
            "  -- once per transaction: a transaction-local setting remembers the row\n"
            f"  IF current_setting('{setting}', true) IS DISTINCT FROM current_txn::text THEN\n"
            f"    INSERT INTO {self.txlog} (txn) VALUES (current_txn) "
            "ON CONFLICT (txn) DO NOTHING;\n"
            f"    PERFORM set_config('{setting}', current_txn::text, true);\n"
            "  END IF;\n"
            "  RETURN current_txn;\n"
            "END\n$databus$",
        ]
        for shape in shapes:
            out += self._install_table(shape)
        return out

    def _install_table(self, shape: TableShape) -> list[str]:
        ref = shape.ref
        t = self.table(ref)
        log = self.table(self.delete_log(ref))
        fn = self.capture_function(ref)
        key_cols = ", ".join(self.q(k) for k in shape.key)
        old_keys = ", ".join(f"OLD.{self.q(k)}" for k in shape.key)
        new_keys = ", ".join(f"NEW.{self.q(k)}" for k in shape.key)
        log_cols = ", ".join(f"{self.q(c.name)} {c.sql_type} NOT NULL" for c in shape.key_columns)
        stamp, deleted, rekeyed = self.TRIGGERS
        return [
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {self.txn_column} bigint",
            f"CREATE INDEX IF NOT EXISTS {self.q(self.txn_index(ref))} ON {t} ({self.txn_column})",
            f"CREATE TABLE IF NOT EXISTS {log} ({self.txn_column} bigint NOT NULL, {log_cols})",
            f"CREATE INDEX IF NOT EXISTS {self.q(self.generated('deleted', ref, '_txn'))} "
            f"ON {log} ({self.txn_column})",
            f"CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $databus$\n"
            "BEGIN\n"
            "  IF TG_WHEN = 'AFTER' THEN  -- a deleted row, or the old key of a re-keyed one\n"
            f"    INSERT INTO {log} ({self.txn_column}, {key_cols}) "
            f"VALUES ({self.txn_function}(), {old_keys});\n"
            "    RETURN NULL;\n"
            "  END IF;\n"
            f"  NEW.{self.txn_column} := {self.txn_function}();\n"
            "  RETURN NEW;\n"
            "END\n$databus$",
            f"CREATE OR REPLACE TRIGGER {self.q(stamp)} BEFORE INSERT OR UPDATE ON {t} "
            f"FOR EACH ROW EXECUTE FUNCTION {fn}()",
            f"CREATE OR REPLACE TRIGGER {self.q(deleted)} AFTER DELETE ON {t} "
            f"FOR EACH ROW EXECUTE FUNCTION {fn}()",
            f"CREATE OR REPLACE TRIGGER {self.q(rekeyed)} AFTER UPDATE ON {t} FOR EACH ROW "
            f"WHEN (({old_keys}) IS DISTINCT FROM ({new_keys})) EXECUTE FUNCTION {fn}()",
        ]

    def uninstall_sql(self, shapes: Sequence[TableShape], *, drop_txlog: bool) -> list[str]:
        out = []
        for shape in shapes:
            ref = shape.ref
            t = self.table(ref)
            out += [f"DROP TRIGGER IF EXISTS {self.q(name)} ON {t}" for name in self.TRIGGERS]
            out += [
                f"DROP FUNCTION IF EXISTS {self.capture_function(ref)}()",
                f"DROP TABLE IF EXISTS {self.table(self.delete_log(ref))}",
                f"DROP INDEX IF EXISTS {self.in_schema(ref.schema, self.txn_index(ref))}",
                f"ALTER TABLE {t} DROP COLUMN IF EXISTS {self.txn_column}",
            ]
        if drop_txlog:
            out += [
                f"DROP FUNCTION IF EXISTS {self.txn_function}()",
                f"DROP TABLE IF EXISTS {self.txlog}",
                f"DROP TABLE IF EXISTS {self.state}",
            ]
        return out

    # catalog queries (the session runs them)

    def columns_sql(self) -> str:
        """``(name, format_type, not null, key position or 0)`` of ``schema``.``table``."""
        return (
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "coalesce((SELECT k.n FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) "
            "WHERE k.attnum = a.attnum), 0) "
            "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
            "WHERE n.nspname = %(schema)s AND c.relname = %(table)s "
            "AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum"
        )

    def triggers_sql(self) -> str:
        """Names of the enabled (not ``DISABLE``d) user triggers of ``rel``."""
        return (
            "SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass(%(rel)s) "
            "AND NOT tgisinternal AND tgenabled <> 'D'"
        )

    def ddl_token_sql(self) -> str:
        """One text that changes whenever a captured table's columns or triggers do."""
        return (
            "SELECT (SELECT string_agg(concat_ws('.', a.attrelid, a.attnum, a.attname, "
            "a.atttypid, a.atttypmod, a.attnotnull), ',' ORDER BY a.attrelid, a.attnum) "
            "FROM pg_attribute a WHERE a.attrelid = ANY(%(rels)s::regclass[]) "
            "AND a.attnum > 0 AND NOT a.attisdropped), "
            "(SELECT string_agg(concat_ws('.', g.tgrelid, g.tgname, g.tgenabled), ',' "
            "ORDER BY g.tgrelid, g.tgname) FROM pg_trigger g "
            "WHERE g.tgrelid = ANY(%(rels)s::regclass[]) AND NOT g.tgisinternal)"
        )

    def delete_logs_sql(self) -> str:
        """``(schema, name)`` of every delete log in the database."""
        return (
            "SELECT n.nspname, c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND starts_with(c.relname, 'databus_deleted_') ORDER BY 1, 2"
        )

    def captured_tables_sql(self) -> str:
        """``(schema, name)`` of every table with a databus capture trigger."""
        return (
            "SELECT DISTINCT n.nspname, c.relname FROM pg_trigger g "
            "JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE g.tgname = '{self.TRIGGERS[0]}' ORDER BY 1, 2"
        )


# -- Oracle -------------------------------------------------------------------------


class OracleDialect(SqlDialect):
    """Oracle: the paper's scheme (section 4.1), generated and tested as text only.

    A trigger "allocates txn from a sequence and adds an entry to the TxLog table": a
    package keeps the txn of the current transaction, recognised by
    ``DBMS_TRANSACTION.LOCAL_TRANSACTION_ID``. The TxLog is created with
    ``ROWDEPENDENCIES`` so that ``ORA_ROWSCN`` is the commit SCN of each row, and its
    ``scn`` column starts at "infinity"; the assignment is the paper's periodic
    ``update ... set scn = ora_rowscn where scn = infinity``; the pull joins the TxLog
    with ``scn > :last AND ora_rowscn > :last``. A row's SCN is
    ``LEAST(scn, ORA_ROWSCN)``: the commit SCN before the update reaches it, ``scn``
    after (the update itself gives the row a newer ``ORA_ROWSCN``). Generated names are
    upper case, as Oracle folds unquoted names; table names are used as written.
    """

    name: Dialect = "oracle"
    max_identifier = 128
    SEQUENCE = "DATABUS_TXN_SEQ"
    PACKAGE = "DATABUS_TXLOG_PKG"

    def param(self, name: str) -> str:
        return f":{name}"

    def ident(self, name: str) -> str:
        return name.upper()

    def triggers(self, ref: TableRef) -> tuple[str, ...]:
        return (self.generated("capture", ref),)

    def scn_expr(self, alias: str) -> str:
        return f"LEAST({alias}.SCN, {alias}.ORA_ROWSCN)"

    def window_filter(self, alias: str) -> str:
        last = self.param("last")
        return (
            f"{alias}.SCN > {last} AND {alias}.ORA_ROWSCN > {last} "
            f"AND {self.scn_expr(alias)} <= {self.param('upto')}"
        )

    def ts_ns_expr(self, alias: str) -> str:
        return f"(CAST(SYS_EXTRACT_UTC({alias}.TS) AS DATE) - DATE '1970-01-01') * 86400000000000"

    def batch_sql(self) -> str:
        last = self.param("last")
        return (
            f"SELECT scn, ts_ns FROM (SELECT {self.scn_expr('tl')} AS scn, "
            f"{self.ts_ns_expr('tl')} AS ts_ns FROM {self.txlog} tl "
            f"WHERE tl.SCN > {last} AND tl.ORA_ROWSCN > {last} ORDER BY 1) "
            f"WHERE ROWNUM <= {self.param('limit')}"
        )

    def rows_sql(self, shape: TableShape) -> str:
        # The paper's `select src.* from T src, TxLog where scn > lastScn AND ora_rowscn >
        # lastScn AND src.txn = TxLog.txn`, with the columns listed (src.* would put
        # DATABUS_TXN among them) and the batch's upper bound.
        columns = ", ".join(self.select_expr("src", c) for c in shape.columns)
        return (
            f"SELECT {self.scn_expr('tl')} AS DATABUS_SCN, {columns} "
            f"FROM {self.table(shape.ref)} src, {self.txlog} tl "
            f"WHERE {self.window_filter('tl')} AND src.{self.txn_column} = tl.TXN "
            f"ORDER BY 1, {', '.join(f'src.{self.q(k)}' for k in shape.key)}"
        )

    def deletes_sql(self, shape: TableShape) -> str:
        keys = ", ".join(self.select_expr("d", c) for c in shape.key_columns)
        return (
            f"SELECT DISTINCT {self.scn_expr('tl')} AS DATABUS_SCN, {keys} "
            f"FROM {self.table(self.delete_log(shape.ref))} d, {self.txlog} tl "
            f"WHERE {self.window_filter('tl')} AND d.{self.txn_column} = tl.TXN "
            f"AND NOT EXISTS (SELECT 1 FROM {self.table(shape.ref)} src, {self.txlog} tl2 "
            f"WHERE tl2.TXN = src.{self.txn_column} AND {self.key_match('src', 'd', shape)} "
            f"AND {self.scn_expr('tl2')} <= {self.scn_expr('tl')}) "
            f"ORDER BY {self.positions(shape)}"
        )

    def pending_sql(self) -> str:
        return f"SELECT 1 FROM {self.txlog} WHERE SCN = {ORACLE_INFINITY} AND ROWNUM = 1"

    def position_sql(self) -> str:
        return (
            f"SELECT (SELECT MAX({self.scn_expr('tl')}) FROM {self.txlog} tl), PRUNED_BEFORE "
            f"FROM {self.state} WHERE ID = 1"
        )

    def assign_plan(self) -> AssignPlan:
        return AssignPlan(
            (f"UPDATE {self.txlog} SET SCN = ORA_ROWSCN WHERE SCN = {ORACLE_INFINITY}",)
        )

    def install_sql(self, shapes: Sequence[TableShape]) -> list[str]:
        owner = self.txlog_schema
        seq = self.in_schema(owner, self.SEQUENCE)
        pkg = self.in_schema(owner, self.PACKAGE)
        out = [
            f"CREATE SEQUENCE {seq} CACHE 1000",
            f"CREATE TABLE {self.txlog} (TXN NUMBER(19) NOT NULL PRIMARY KEY, "
            f"SCN NUMBER(19) DEFAULT {ORACLE_INFINITY} NOT NULL, "
            "TS TIMESTAMP WITH TIME ZONE DEFAULT SYSTIMESTAMP NOT NULL) ROWDEPENDENCIES",
            f"CREATE INDEX {self.in_schema(owner, 'DATABUS_TXLOG_SCN')} ON {self.txlog} (SCN)",
            f"CREATE TABLE {self.state} (ID NUMBER(1) PRIMARY KEY CHECK (ID = 1), "
            "PRUNED_BEFORE NUMBER(19) DEFAULT 0 NOT NULL)",
            f"INSERT INTO {self.state} (ID) VALUES (1)",
            f"CREATE OR REPLACE PACKAGE {pkg} AS\n"
            "  FUNCTION current_txn RETURN NUMBER;\n"
            f"END {self.PACKAGE};",
            f"CREATE OR REPLACE PACKAGE BODY {pkg} AS\n"
            "  g_local_id VARCHAR2(64);\n"
            "  g_txn NUMBER;\n"
            "  FUNCTION current_txn RETURN NUMBER IS\n"
            "    l_local_id VARCHAR2(64) := DBMS_TRANSACTION.LOCAL_TRANSACTION_ID(TRUE);\n"
            "    l_found NUMBER;\n"
            "  BEGIN\n"
            "    IF g_local_id IS NULL OR g_local_id <> l_local_id THEN\n"
            f"      g_txn := {seq}.NEXTVAL;\n"
            f"      INSERT INTO {self.txlog} (TXN) VALUES (g_txn);\n"
            "      g_local_id := l_local_id;\n"
            "    ELSE\n"
            "      -- a rollback to a savepoint may have removed the TxLog row\n"
            f"      SELECT COUNT(*) INTO l_found FROM {self.txlog} WHERE TXN = g_txn;\n"
            "      IF l_found = 0 THEN\n"
            f"        INSERT INTO {self.txlog} (TXN) VALUES (g_txn);\n"
            "      END IF;\n"
            "    END IF;\n"
            "    RETURN g_txn;\n"
            "  END current_txn;\n"
            f"END {self.PACKAGE};",
        ]
        for shape in shapes:
            out += self._install_table(shape, pkg)
        return out

    def _install_table(self, shape: TableShape, pkg: str) -> list[str]:
        ref = shape.ref
        t = self.table(ref)
        log = self.table(self.delete_log(ref))
        txn = self.txn_column
        key_cols = ", ".join(self.q(k) for k in shape.key)
        old_keys = ", ".join(f":OLD.{self.q(k)}" for k in shape.key)
        changed = " OR ".join(f":OLD.{self.q(k)} <> :NEW.{self.q(k)}" for k in shape.key)
        (trigger,) = self.triggers(ref)
        out = []
        if not shape.has_txn_column:
            out.append(f"ALTER TABLE {t} ADD ({txn} NUMBER(19))")
        out += [
            f"CREATE INDEX {self.in_schema(ref.schema, self.txn_index(ref))} ON {t} ({txn})",
            # Key columns with their exact types, whatever they are.
            f"CREATE TABLE {log} AS SELECT CAST(NULL AS NUMBER(19)) AS {txn}, {key_cols} "
            f"FROM {t} WHERE 1 = 0",
            f"CREATE INDEX {self.in_schema(ref.schema, self.generated('deleted', ref, '_TXN'))} "
            f"ON {log} ({txn})",
            f"CREATE OR REPLACE TRIGGER {self.in_schema(ref.schema, trigger)}\n"
            f"  BEFORE INSERT OR UPDATE OR DELETE ON {t} FOR EACH ROW\n"
            "BEGIN\n"
            "  IF DELETING THEN\n"
            f"    INSERT INTO {log} ({txn}, {key_cols}) VALUES ({pkg}.current_txn, {old_keys});\n"
            "  ELSE\n"
            f"    IF UPDATING AND ({changed}) THEN\n"
            f"      INSERT INTO {log} ({txn}, {key_cols}) "
            f"VALUES ({pkg}.current_txn, {old_keys});\n"
            "    END IF;\n"
            f"    :NEW.{txn} := {pkg}.current_txn;\n"
            "  END IF;\n"
            "END;",
        ]
        return out

    def uninstall_sql(self, shapes: Sequence[TableShape], *, drop_txlog: bool) -> list[str]:
        owner = self.txlog_schema
        out = []
        for shape in shapes:
            ref = shape.ref
            (trigger,) = self.triggers(ref)
            out += [
                f"DROP TRIGGER {self.in_schema(ref.schema, trigger)}",
                f"DROP TABLE {self.table(self.delete_log(ref))} PURGE",
                f"DROP INDEX {self.in_schema(ref.schema, self.txn_index(ref))}",
                f"ALTER TABLE {self.table(ref)} DROP ({self.txn_column})",
            ]
        if drop_txlog:
            out += [
                f"DROP PACKAGE {self.in_schema(owner, self.PACKAGE)}",
                f"DROP TABLE {self.txlog} PURGE",
                f"DROP TABLE {self.state} PURGE",
                f"DROP SEQUENCE {self.in_schema(owner, self.SEQUENCE)}",
            ]
        return out

    # catalog queries (the session runs them)

    def columns_sql(self) -> str:
        """``(name, type, nullable Y/N, key position or 0)`` of ``:owner``.``:table``."""
        return (
            "SELECT c.COLUMN_NAME, c.DATA_TYPE || CASE WHEN c.DATA_PRECISION IS NOT NULL "
            "THEN '(' || c.DATA_PRECISION || ',' || NVL(c.DATA_SCALE, 0) || ')' END, "
            "c.NULLABLE, NVL(k.POSITION, 0) FROM ALL_TAB_COLUMNS c "
            "LEFT JOIN (SELECT cc.COLUMN_NAME, cc.POSITION FROM ALL_CONSTRAINTS ac "
            "JOIN ALL_CONS_COLUMNS cc ON cc.OWNER = ac.OWNER "
            "AND cc.CONSTRAINT_NAME = ac.CONSTRAINT_NAME "
            "WHERE ac.OWNER = :owner AND ac.TABLE_NAME = :table AND ac.CONSTRAINT_TYPE = 'P') k "
            "ON k.COLUMN_NAME = c.COLUMN_NAME "
            "WHERE c.OWNER = :owner AND c.TABLE_NAME = :table ORDER BY c.COLUMN_ID"
        )

    def triggers_sql(self) -> str:
        return (
            "SELECT TRIGGER_NAME FROM ALL_TRIGGERS WHERE TABLE_OWNER = :owner "
            "AND TABLE_NAME = :table AND STATUS = 'ENABLED'"
        )

    def ddl_token_sql(self, count: int) -> str:
        """The newest DDL time among the captured tables (``:owner0, :table0, ...``)."""
        tables = " OR ".join(
            f"(OWNER = :owner{i} AND OBJECT_NAME = :table{i})" for i in range(count)
        )
        return (
            "SELECT MAX(LAST_DDL_TIME) FROM ALL_OBJECTS WHERE OBJECT_TYPE = 'TABLE' "
            f"AND ({tables or '1 = 0'})"
        )


def dialect_for(dialect: Dialect, txlog_schema: str = "") -> SqlDialect:
    """The statement generator of ``dialect``."""
    if dialect == "sqlite":
        return SqliteDialect()
    if dialect == "postgresql":
        return PostgresDialect(txlog_schema or "public")
    return OracleDialect(txlog_schema)
