"""SQL text per dialect: identifier quoting and the statements every target builds
(pure: no connection, so the spelling of each statement can be tested alone).

Identifiers are always quoted (``"name"``, or ``name`` in backticks on MySQL): a
target column keeps the case and spelling of the source's, and a column named
``order`` or ``key`` needs no special care. Types (``ColumnMap.target_type``) come
from the type mapping already spelled for the dialect and are written as they are.

With the ``%s`` parameter style (psycopg2, pymysql) a ``%`` inside an identifier must be
written ``%%`` in a statement run with parameters; the targets run every statement
with a parameter tuple (empty for DDL), so ``ident`` doubles it, and ``raw=True`` (no
doubling) is for statements the driver never formats: a ``COPY``, and MySQL's
multi-row INSERTs whose rows are literals already.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from databus.errors import ConfigError
from databus.replicator._model import ColumnMap, Dialect, TableMap

__all__ = ["SCHEMA_TABLE", "STATE_TABLE", "SqlDialect", "dialect_sql"]

STATE_TABLE = "databus_replication_state"
# The source schema each target table was last made to follow, per replication and
# source (replicator/_reconcile.py compares it with the schema about to be applied).
SCHEMA_TABLE = "databus_replication_schemas"


@dataclass(frozen=True)
class SqlDialect:
    """How one dialect spells things; every statement builder of the targets."""

    dialect: Dialect
    param: str  # the driver's placeholder: "%s" or "?"
    quote_char: str
    # The state table's columns, and the SQL for "now" (UTC) in its updated_at.
    state_columns: str
    now: str

    # -- names --------------------------------------------------------------------------

    def raw_ident(self, name: str) -> str:
        if not name or "\x00" in name:
            raise ConfigError(f"not a usable {self.dialect} identifier: {name!r}")
        q = self.quote_char
        return q + name.replace(q, q + q) + q

    def ident(self, name: str, *, raw: bool = False) -> str:
        quoted = self.raw_ident(name)
        return quoted.replace("%", "%%") if self.param == "%s" and not raw else quoted

    def qualified(self, schema: str | None, table: str, *, raw: bool = False) -> str:
        if schema:
            return f"{self.ident(schema, raw=raw)}.{self.ident(table, raw=raw)}"
        return self.ident(table, raw=raw)

    def columns(self, names: Sequence[str], *, raw: bool = False) -> str:
        return ", ".join(self.ident(n, raw=raw) for n in names)

    def placeholders(self, n: int) -> str:
        return "(" + ", ".join([self.param] * n) + ")"

    # -- DDL ------------------------------------------------------------------------------

    def column_definition(self, column: ColumnMap, *, not_null: bool) -> str:
        return f"{self.ident(column.target)} {column.target_type}" + (
            " NOT NULL" if not_null else "")

    def create_table(self, qname: str, t: TableMap, *, suffix: str = "") -> str:
        """Every column with its target type, NOT NULL where the map says so (and on
        the key: SQLite would otherwise accept NULL in a composite primary key)."""
        if not t.key:
            raise ConfigError(f"table {t.table} has no key: the target needs a primary key "
                              "to apply updates and deletes")
        defs = [self.column_definition(c, not_null=not c.nullable or c.target in t.key)
                for c in t.columns]
        defs.append(f"PRIMARY KEY ({self.columns(t.key)})")
        return f"CREATE TABLE IF NOT EXISTS {qname} ({', '.join(defs)}){suffix}"

    def create_state_table(self, qname: str, *, suffix: str = "") -> str:
        return f"CREATE TABLE IF NOT EXISTS {qname} ({self.state_columns}){suffix}"

    def add_column(self, qname: str, column: ColumnMap) -> str:
        # Always NULL-able: the rows already there have no value for the new column (a
        # NOT NULL column fails on a non-empty table in PostgreSQL and SQLite, and makes
        # MySQL invent the type's zero value for every existing row).
        return f"ALTER TABLE {qname} ADD COLUMN {self.column_definition(column, not_null=False)}"

    def drop_column(self, qname: str, name: str) -> str:
        return f"ALTER TABLE {qname} DROP COLUMN {self.ident(name)}"

    def widen_column(self, qname: str, column: ColumnMap, *, not_null: bool) -> str:
        if self.dialect == "mysql":
            # MODIFY restates the whole column: its current NULL-ness is kept (the
            # caller reads it from the catalog), or the column would turn NULL-able.
            return (f"ALTER TABLE {qname} MODIFY COLUMN "
                    f"{self.column_definition(column, not_null=not_null)}")
        return (f"ALTER TABLE {qname} ALTER COLUMN {self.ident(column.target)} "
                f"TYPE {column.target_type}")

    # -- rows -----------------------------------------------------------------------------

    def upsert(self, qname: str, t: TableMap) -> str:
        """INSERT of one row that updates every non-key column of the row whose key is
        already there (a key-only table has nothing to update)."""
        names = [c.target for c in t.columns]
        head = f"INSERT INTO {qname} ({self.columns(names)}) VALUES "
        return head + self.placeholders(len(names)) + self.upsert_tail(t)

    def upsert_tail(self, t: TableMap, *, raw: bool = False) -> str:
        """What follows the VALUES (or SELECT) of an upsert into ``t``; ``raw``: for a
        statement sent without parameters (no ``%`` doubling)."""
        def q(name: str) -> str:
            return self.ident(name, raw=raw)

        others = [c.target for c in t.columns if c.target not in t.key]
        if self.dialect == "mysql":
            # VALUES(col): MariaDB has no "AS new" row alias; MySQL 8 still takes it.
            # ON DUPLICATE KEY fires on any unique key, not only the primary one: a
            # target table with another unique index merges rows that collide on it.
            sets = others or list(t.key)
            return " ON DUPLICATE KEY UPDATE " + ", ".join(
                f"{q(n)} = VALUES({q(n)})" for n in sets)
        conflict = f" ON CONFLICT ({self.columns(t.key, raw=raw)}) DO "
        if not others:
            return conflict + "NOTHING"
        return conflict + "UPDATE SET " + ", ".join(f"{q(n)} = EXCLUDED.{q(n)}" for n in others)

    def delete_one(self, qname: str, t: TableMap) -> str:
        where = " AND ".join(f"{self.ident(k)} = {self.param}" for k in t.key)
        return f"DELETE FROM {qname} WHERE {where}"

    def delete_many(self, qname: str, t: TableMap, n: int) -> str:
        """DELETE of ``n`` keys. The values are untyped literals compared with the key
        columns (never a VALUES list, whose literals PostgreSQL would type as text), so
        each is read as its column's type and the primary key index serves the lookup."""
        if len(t.key) == 1:
            return (f"DELETE FROM {qname} WHERE {self.ident(t.key[0])} IN "
                    + self.placeholders(n))
        one = self.placeholders(len(t.key))
        return (f"DELETE FROM {qname} WHERE ({self.columns(t.key)}) IN ("
                + ", ".join([one] * n) + ")")

    # -- state ----------------------------------------------------------------------------

    def create_schema_table(self, qname: str, *, suffix: str = "") -> str:
        text = "MEDIUMTEXT" if self.dialect == "mysql" else "TEXT"
        name = "VARCHAR(255)" if self.dialect == "mysql" else "TEXT"
        return (f"CREATE TABLE IF NOT EXISTS {qname} (replication {name} NOT NULL, "
                f"source {name} NOT NULL, fingerprint BIGINT NOT NULL, "
                f"schema_json {text} NOT NULL, PRIMARY KEY (replication, source)){suffix}")

    def load_schema(self, qname: str) -> str:
        p = self.param
        return f"SELECT schema_json FROM {qname} WHERE replication = {p} AND source = {p}"

    def save_schema(self, qname: str) -> str:
        p = self.param
        head = (f"INSERT INTO {qname} (replication, source, fingerprint, schema_json) "
                f"VALUES ({p}, {p}, {p}, {p})")
        if self.dialect == "mysql":
            return head + (" ON DUPLICATE KEY UPDATE fingerprint = VALUES(fingerprint), "
                           "schema_json = VALUES(schema_json)")
        return head + (" ON CONFLICT (replication, source) DO UPDATE SET "
                       "fingerprint = EXCLUDED.fingerprint, schema_json = EXCLUDED.schema_json")

    def load_state(self, qname: str) -> str:
        return f"SELECT scn, detail FROM {qname} WHERE replication = {self.param}"

    def save_state(self, qname: str) -> str:
        p = self.param
        head = (f"INSERT INTO {qname} (replication, scn, window_offset, updated_at, detail) "
                f"VALUES ({p}, {p}, NULL, {self.now}, {p})")
        others = ("scn", "window_offset", "updated_at", "detail")
        if self.dialect == "mysql":
            return head + " ON DUPLICATE KEY UPDATE " + ", ".join(
                f"{c} = VALUES({c})" for c in others)
        return head + " ON CONFLICT (replication) DO UPDATE SET " + ", ".join(
            f"{c} = EXCLUDED.{c}" for c in others)


_POSTGRES = SqlDialect(
    dialect="postgresql", param="%s", quote_char='"',
    state_columns=("replication text PRIMARY KEY, scn bigint NOT NULL, "
                   "window_offset integer, "
                   "updated_at timestamp with time zone NOT NULL DEFAULT now(), "
                   "detail text"),
    now="now()",
)
_MYSQL = SqlDialect(
    dialect="mysql", param="%s", quote_char="`",
    # DATETIME in UTC (the session's time_zone is +00:00): a TIMESTAMP would end in 2038.
    # MEDIUMTEXT: the detail holds the client's checkpoint (JSON); a TEXT would put an
    # arbitrary 64 KiB limit on it.
    state_columns=("replication VARCHAR(255) NOT NULL PRIMARY KEY, scn BIGINT NOT NULL, "
                   "window_offset INT NULL, updated_at DATETIME(6) NOT NULL, "
                   "detail MEDIUMTEXT NULL"),
    now="UTC_TIMESTAMP(6)",
)
_SQLITE = SqlDialect(
    dialect="sqlite", param="?", quote_char='"',
    state_columns=("replication TEXT NOT NULL PRIMARY KEY, scn BIGINT NOT NULL, "
                   "window_offset INTEGER, updated_at TEXT NOT NULL, detail TEXT"),
    now="strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
)

_BY_DIALECT: dict[str, SqlDialect] = {d.dialect: d for d in (_POSTGRES, _MYSQL, _SQLITE)}


def dialect_sql(dialect: Dialect) -> SqlDialect:
    return _BY_DIALECT[dialect]
