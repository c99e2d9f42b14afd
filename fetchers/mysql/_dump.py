"""The binlog fetcher's ``DumpSource``: chunks of a MySQL/MariaDB table by primary key, and
watermark rows, on a connection of its own (DESIGN 8.1, docs/dumps.md).

Rows are selected through ``_select``'s expressions and encoded with the fetcher's own
writers and key function, so a dumped row's value and key are byte-identical to what the
binlog fetcher writes for the same row (same schema version, same types). The table's
layout is read again for every chunk, so a column added during a dump gives the next
chunk the new schema version (which the fetcher registers too when the ALTER reaches
the binlog).

A chunk is ``SELECT ... WHERE key > cursor ORDER BY key LIMIT n``, the comparison
written out column by column for composite keys (``a > ? OR (a = ? AND b > ?)``), which
both MySQL and MariaDB turn into an index range scan. The read runs in autocommit:
InnoDB reads it from one consistent snapshot without locking a row.

Watermarks are ``INSERT``s of a new id into the watermark table (``databus dump setup``
creates it): each travels through the binlog in a transaction of its own.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pymysql

from databus._ddl import serialized_ddl
from databus.errors import DatabusError, DumpSetupError, SourceError
from databus.fetchers._api import DumpChunk, FetcherContext
from databus.fetchers._cursor import cursor_from_json, cursor_to_json
from databus.fetchers.mysql import _dump_driver
from databus.fetchers.mysql._rows import encode_rows, make_rows, row_plan
from databus.fetchers.mysql._select import (
    TableLayout,
    UnmappableTableError,
    quote,
    table_layout,
)
from databus.fetchers.mysql._server import connect, current_shapes, source_cursor, source_error
from databus.fetchers.mysql._uri import BinlogSourceConfig

__all__ = ["MysqlDumpSource", "setup_statements"]

log = logging.getLogger("databus.fetchers.mysql.dump")

# An integer key spanning more than this many times the table's rows is cut by its index,
# not by arithmetic (a few outlying ids would leave every row in one range).
SPARSE = 4
# A chunk as read: its rows, and each result column's field type when they are raw.
_Read = tuple[list[tuple[Any, ...]], list[int] | None]
_ER_NO_SUCH_TABLE = 1146
_ER_BAD_DB = 1049
_ER_DENIED = (1142, 1143, 1044, 1227)


def setup_statements(config: BinlogSourceConfig) -> list[str]:
    """What ``databus dump setup`` runs: the watermark database and table."""
    db, table = config.watermark_table
    return [
        f"CREATE DATABASE IF NOT EXISTS {quote(db)}",
        f"CREATE TABLE IF NOT EXISTS {quote(db)}.{quote(table)} ("
        "id VARCHAR(64) NOT NULL PRIMARY KEY, "
        "created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB",
    ]


def grant_hint(config: BinlogSourceConfig) -> str:
    db, table = config.watermark_table
    return (f"GRANT SELECT, INSERT, DELETE ON {quote(db)}.{quote(table)} TO "
            f"'{config.user}'@'<host>' (and SELECT on the dumped tables)")


def _key_after(columns: list[str], count: int) -> str:
    """``a > %s OR (a = %s AND b > %s) ...`` for the first ``count`` key columns."""
    terms = []
    for i in range(count):
        parts = [f"{columns[j]} = %s" for j in range(i)] + [f"{columns[i]} > %s"]
        terms.append("(" + " AND ".join(parts) + ")")
    return " OR ".join(terms)


def _key_after_params(values: list[Any]) -> list[Any]:
    params: list[Any] = []
    for i in range(len(values)):
        params.extend(values[:i])
        params.append(values[i])
    return params


class MysqlDumpSource:
    """See the module docstring."""

    def __init__(self, config: BinlogSourceConfig, context: FetcherContext) -> None:
        self.config = config
        self.context = context
        self._conn: pymysql.Connection[Any] | None = None
        self._raw: Any = None  # the chunk reads' mysqlclient connection (_dump_driver)

    def _connection(self) -> pymysql.Connection[Any]:
        if self._conn is None:
            self._conn = connect(self.config, f"connecting to {self.config.address} for a dump")
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        raw, self._raw = self._raw, None
        for each in (conn, raw):
            if each is not None:
                try:
                    each.close()
                except Exception as exc:
                    log.debug("closing the dump connection: %s", exc)

    def _run(self, action: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self._run_all(action, [sql], params)

    def _run_all(self, action: str, statements: list[str], params: Any = None, *,
                 ddl: bool = False) -> list[tuple[Any, ...]]:
        """``statements`` on one cursor (``ddl``: under the schema-setup lock, so that
        two setups at once take turns: ``databus/_ddl.py``); the last one's rows."""
        conn = self._connection()
        try:
            with conn.cursor() as cur, (serialized_ddl(cur, "mysql", "dump-setup") if ddl
                                        else contextlib.nullcontext()):
                rows: list[tuple[Any, ...]] = []
                for sql in statements:
                    cur.execute(sql, params)
                    rows = list(cur.fetchall())
                return rows
        except pymysql.MySQLError as exc:
            raise self._error(action, exc) from None

    def _error(self, action: str, exc: BaseException) -> DatabusError:
        """A driver error of ``action`` as the dump reports it (its connections closed
        when it is retriable)."""
        code = exc.args[0] if exc.args else None
        if code in _ER_DENIED:
            return DumpSetupError(
                f"{action}: {self.config.address} lacks a privilege ({exc.args[-1]}); "
                f"{grant_hint(self.config)}")
        error = source_error(exc, self.config, action)
        if error.retriable:
            self.close()
        return error

    # -- DumpSource ------------------------------------------------------------------

    def setup(self, *, dry_run: bool = False) -> list[str]:
        statements = setup_statements(self.config)
        if not dry_run:
            self._run_all("setting up dumps", statements, ddl=True)
        return statements

    def grant_statements(self, user: str) -> list[str]:
        """What an administrator grants ``user`` (the relay's) to write watermarks."""
        db, table = self.config.watermark_table
        name = user.replace("\\", "\\\\").replace("'", "\\'")
        return [f"GRANT SELECT, INSERT, DELETE ON {quote(db)}.{quote(table)} TO "
                f"'{name}'@'%'"]

    def check(self) -> None:
        db, table = self.config.watermark_table
        found = self._run("looking for the watermark table",
                          "SELECT COUNT(*) FROM information_schema.TABLES WHERE "
                          "TABLE_SCHEMA = %s AND TABLE_NAME = %s", (db, table))
        if not found or not found[0][0]:
            raise DumpSetupError(
                f"no watermark table {db}.{table} at {self.config.address}: run `databus "
                f"dump setup --source URI` once (it creates it), then {grant_hint(self.config)}")
        # A write that is rolled back never reaches the binlog, but needs the grant.
        conn = self._connection()
        try:
            with conn.cursor() as cur:
                cur.execute("START TRANSACTION")
                cur.execute(f"INSERT INTO {quote(db)}.{quote(table)} (id) VALUES (%s)",
                            ("databus-grant-check",))
                cur.execute(f"DELETE FROM {quote(db)}.{quote(table)} WHERE id = %s",
                            ("databus-grant-check",))
                cur.execute("ROLLBACK")
        except pymysql.MySQLError as exc:
            try:
                conn.rollback()
            except pymysql.MySQLError:
                self.close()
            code = exc.args[0] if exc.args else None
            if code in _ER_DENIED:
                raise DumpSetupError(
                    f"the source user cannot write the watermark table {db}.{table} "
                    f"({exc.args[-1]}): {grant_hint(self.config)}") from None
            raise source_error(exc, self.config, "checking the watermark table") from None

    def tables(self) -> list[str]:
        shapes = current_shapes(self._connection(), self.config, self.config.selector)
        watermark = self.config.watermark_table
        return [s.source_name for s in shapes if (s.database, s.table) != watermark]

    def _layout(self, source: str) -> TableLayout:
        db, _, table = source.partition(".")
        conn = self._connection()
        try:
            with source_cursor(conn, self.config, f"reading the layout of {source}") as cur:
                layout = table_layout(cur, db, table)
        except UnmappableTableError as exc:
            raise DumpSetupError(str(exc)) from None
        if layout is None:
            raise DumpSetupError(f"table {source} does not exist at {self.config.address} "
                                 "(dropped, or not created yet)")
        if not layout.shape.primary_key:
            raise DumpSetupError(f"table {source} has no primary key: a dump reads in key "
                                 "order and matches log events by key, so it is refused")
        return layout

    def estimate_rows(self, source: str) -> int:
        return self._layout(source).rows_estimate

    def write_watermark(self, token: str) -> None:
        db, table = self.config.watermark_table
        self._run("writing a watermark",
                  f"INSERT INTO {quote(db)}.{quote(table)} (id) VALUES (%s)", (token,))

    def _select(self, layout: TableLayout) -> tuple[str, list[str]]:
        shape = layout.shape
        key_columns = [quote(shape.columns[i].name) for i in shape.primary_key]
        exprs = [c.expression for c in layout.columns] + key_columns
        table = f"{quote(shape.database)}.{quote(shape.table)}"
        return f"SELECT {', '.join(exprs)} FROM {table}", key_columns

    def _chunk(self, source: str, layout: TableLayout, read: _Read, done: bool) -> DumpChunk:
        """The rows of a chunk as ``DumpRow``s (``_rows``: the compiled twin for
        mysqlclient's raw rows, the reference for pymysql's typed ones), and its cursor:
        the last row's raw key columns, typed as pymysql types them."""
        rows, types = read
        shape = layout.shape
        catalog = self.context.catalog
        schema = catalog.register_schema(source, shape.avro_schema())
        source_id = catalog.source_id(source)
        plan = row_plan(layout)
        if types is not None:
            plan = plan.with_types(types)
        keys, values = encode_rows(rows, plan)
        out = make_rows(keys, values, schema.fingerprint)
        cursor = None
        if rows:
            n = len(layout.columns)
            cursor = cursor_to_json(plan.typed(rows[-1][n:], n))
        return DumpChunk(source, source_id, out, cursor, done)

    def read_chunk(self, source: str, after: list[Any] | None, limit: int, *,
                   until: list[Any] | None = None) -> DumpChunk:
        layout = self._layout(source)
        select, key_columns = self._select(layout)
        params: list[Any] = []
        terms: list[str] = []
        if after is not None:
            terms.append("(" + _key_after(key_columns, len(key_columns)) + ")")
            params += _key_after_params(self._key_values(source, after, key_columns))
        if until is not None:  # a key range's end, inclusive: NOT (key > until)
            terms.append("NOT (" + _key_after(key_columns, len(key_columns)) + ")")
            params += _key_after_params(self._key_values(source, until, key_columns))
        if terms:
            select += " WHERE " + " AND ".join(terms)
        select += f" ORDER BY {', '.join(key_columns)} LIMIT {int(limit)}"
        read = self._read(source, select, params)
        return self._chunk(source, layout, read, done=len(read[0]) < limit)

    @staticmethod
    def _key_values(source: str, cursor: list[Any], key_columns: list[str]) -> list[Any]:
        values = cursor_from_json(cursor)
        if len(values) != len(key_columns):
            raise DumpSetupError(f"table {source}: its primary key changed during the "
                                 "dump; cancel it and dump the table again")
        return values

    def split_points(self, source: str, count: int) -> list[list[Any]]:
        """Up to ``count - 1`` keys cutting ``source`` into ``count`` ranges of about
        the same number of rows: for a single integer key whose values are dense (their
        span at most ``SPARSE`` times the row estimate), evenly between its least and
        greatest value (two index lookups); otherwise every n-th key of the primary key
        index (one pass over the index, no row read), which holds for any key."""
        layout = self._layout(source)
        _, key_columns = self._select(layout)
        shape = layout.shape
        table = f"{quote(shape.database)}.{quote(shape.table)}"
        keys = ", ".join(key_columns)
        action = f"splitting {source} into key ranges"
        if count < 2:
            return []
        if len(key_columns) == 1:
            found = self._run(action, f"SELECT MIN({keys}), MAX({keys}) FROM {table}")
            low, high = found[0] if found else (None, None)
            if (isinstance(low, int) and isinstance(high, int)
                    and high - low <= SPARSE * max(1, layout.rows_estimate)):
                step = (high - low) / count
                points = sorted({low + int(step * i) for i in range(1, count)})
                return [cursor_to_json([p]) for p in points if low <= p < high]
        estimate = max(1, layout.rows_estimate)
        every = max(1, estimate // count)
        points_out: list[list[Any]] = []
        after: list[Any] | None = None
        for _ in range(count - 1):
            sql = f"SELECT {keys} FROM {table}"
            params: list[Any] = []
            if after is not None:
                sql += " WHERE " + _key_after(key_columns, len(key_columns))
                params = _key_after_params(after)
            sql += f" ORDER BY {keys} LIMIT 1 OFFSET {every - 1}"
            found = self._run(action, sql, params)
            if not found:
                break
            after = list(found[0])
            points_out.append(cursor_to_json(after))
        return points_out

    def read_keys(self, source: str, keys: list[Any]) -> DumpChunk:
        layout = self._layout(source)
        select, key_columns = self._select(layout)
        terms: list[str] = []
        params: list[Any] = []
        for key in keys:
            values = key if isinstance(key, list) else [key]
            if len(values) != len(key_columns):
                raise DumpSetupError(f"table {source}: key {key!r} does not have the "
                                     f"{len(key_columns)} primary key column(s)")
            terms.append("(" + " AND ".join(f"{c} = %s" for c in key_columns) + ")")
            params.extend(values)
        select += " WHERE " + " OR ".join(terms) + f" ORDER BY {', '.join(key_columns)}"
        return self._chunk(source, layout, self._read(source, select, params), done=True)

    def _read(self, source: str, sql: str, params: list[Any]) -> _Read:
        """The chunk's rows: raw through mysqlclient (with each column's field type)
        when it is installed, else typed through pymysql (types None)."""
        action = f"reading a chunk of {source}"
        try:
            if not _dump_driver.available():
                return self._run(action, sql, params), None
            try:
                if self._raw is None:
                    self._raw = _dump_driver.connect_raw(self.config)
                return _dump_driver.select_raw(self._raw, sql, params)
            except _dump_driver.driver_errors() as exc:
                raise self._error(action, exc) from None
        except SourceError as exc:
            if "1146" in str(exc) or "doesn't exist" in str(exc):
                raise DumpSetupError(f"table {source} was dropped during the dump") from None
            raise

    def cleanup_watermarks(self, keep: frozenset[str]) -> None:
        db, table = self.config.watermark_table
        self._run("cleaning up watermarks",
                  f"DELETE FROM {quote(db)}.{quote(table)} WHERE created_at < "
                  "NOW(6) - INTERVAL 1 HOUR")
