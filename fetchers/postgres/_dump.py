"""The logical fetcher's ``DumpSource`` (DESIGN 8.1, docs/dumps.md): chunks of a captured
table in key order and watermark rows, on a connection of its own.

The watermark table ``databus_watermark`` (``id text PRIMARY KEY, created_at``) must be
in the slot's publication: its inserts come through the slot in log order, and
``ChangeStream`` hands their ids to ``sink.watermark`` instead of emitting them.

A chunk is read in a REPEATABLE READ, READ ONLY transaction (one snapshot, no lock a
writer waits for) as the columns' *text output*, exactly what pgoutput sends for them
(every column's type is read as a string: no driver conversion; by ``COPY (SELECT
...) TO STDOUT`` and the compiled fast path, ``_dump_copy``), and converted and
encoded by the fetcher's own ``TableCodec`` built from the catalog as a Relation message
would describe the table, so a dumped row is byte-identical to the same row in a window.
The cursor is the last row's key columns as text; the next chunk is
``WHERE (k1, k2) > (%s::type1, %s::type2) ORDER BY k1, k2 LIMIT n``, which the primary
key index serves.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import psycopg2.extensions
from psycopg2 import sql

from databus._ddl import serialized_ddl
from databus._redact import redact
from databus.errors import DumpSetupError, SourceError
from databus.fetchers._api import DumpChunk, FetcherContext
from databus.fetchers._cursor import cursor_from_json, cursor_to_json
from databus.fetchers.postgres._catalog import read_table_info
from databus.fetchers.postgres._changes import (
    HEARTBEAT_TABLE,
    WATERMARK_TABLE,
    TableCodec,
)
from databus.fetchers.postgres._dump_copy import EncodedRows, read_encoded
from databus.fetchers.postgres._pgoutput import Column, Relation
from databus.fetchers.postgres._uri import LogicalSource

__all__ = ["LogicalDumpSource"]

SPARSE = 4  # see databus.fetchers.mysql._dump.SPARSE

_COLUMNS_SQL = (
    "SELECT c.oid, n.nspname, c.relname, c.relreplident, a.attname, a.atttypid, "
    "a.atttypmod, format_type(a.atttypid, a.atttypmod) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid "
    "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped "
    "AND a.attgenerated = '' ORDER BY a.attnum")


class LogicalDumpSource:
    """See the module docstring. ``connect()`` opens a plain (autocommit) connection."""

    def __init__(self, source: LogicalSource, context: FetcherContext,
                 connect: Callable[[], Any]) -> None:
        self.source = source
        self.context = context
        self._connect = connect
        self._conn: Any = None

    # -- the connection -----------------------------------------------------------------

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        try:
            with self._conn.cursor() as cur:
                yield cur
        except DumpSetupError:
            raise
        except psycopg2.Error as exc:
            if self._conn.closed:
                self._conn = None
            raise SourceError(f"PostgreSQL {self.source.redacted}: "
                              f"{redact(' '.join(str(exc).split()))}") from None

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    def _hint(self) -> str:
        return f"run `databus dump setup --source '{self.source.redacted}'` once"

    # -- DumpSource ---------------------------------------------------------------------

    def setup(self, *, dry_run: bool = False) -> list[str]:
        pub = sql.Identifier(self.source.publication)
        statements = [
            f"CREATE TABLE IF NOT EXISTS public.{WATERMARK_TABLE} (id text PRIMARY KEY, "
            "created_at timestamptz NOT NULL DEFAULT now())",
        ]
        with self._cursor() as cur, (
                contextlib.nullcontext() if dry_run
                # Two setups at once: both would find the table missing from the
                # publication and the second one's ADD TABLE would fail (databus/_ddl.py).
                else serialized_ddl(cur, "postgresql", f"dump-setup:{WATERMARK_TABLE}")):
            cur.execute("SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND "
                        "schemaname = 'public' AND tablename = %s",
                        (self.source.publication, WATERMARK_TABLE))
            if cur.fetchone() is None:
                statements.append(sql.SQL("ALTER PUBLICATION {} ADD TABLE public.{}").format(
                    pub, sql.Identifier(WATERMARK_TABLE)).as_string(cur))
            if not dry_run:
                for statement in statements:
                    cur.execute(statement)
        return statements

    def grant_statements(self, user: str) -> list[str]:
        """What an administrator grants ``user`` (the relay's) to write watermarks."""
        grantee = '"' + user.replace('"', '""') + '"'
        return [f"GRANT SELECT, INSERT, DELETE ON public.{WATERMARK_TABLE} TO {grantee}"]

    def check(self) -> None:
        with self._cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f"public.{WATERMARK_TABLE}",))
            if cur.fetchone()[0] is None:
                raise DumpSetupError(f"no watermark table public.{WATERMARK_TABLE} in "
                                     f"{self.source.redacted}: {self._hint()}")
            cur.execute("SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND "
                        "schemaname = 'public' AND tablename = %s",
                        (self.source.publication, WATERMARK_TABLE))
            if cur.fetchone() is None:
                raise DumpSetupError(
                    f"the watermark table public.{WATERMARK_TABLE} is not in publication "
                    f"{self.source.publication!r}, so its watermarks never reach the "
                    f"relay: {self._hint()}")
            cur.execute("SELECT has_table_privilege(current_user, %s, 'INSERT') AND "
                        "has_table_privilege(current_user, %s, 'DELETE')",
                        (f"public.{WATERMARK_TABLE}",) * 2)
            if not cur.fetchone()[0]:
                raise DumpSetupError(
                    f"the source user cannot write public.{WATERMARK_TABLE}: GRANT INSERT, "
                    f"DELETE, SELECT ON public.{WATERMARK_TABLE} TO <user>")

    def tables(self) -> list[str]:
        with self._cursor() as cur:
            cur.execute("SELECT schemaname, tablename FROM pg_publication_tables "
                        "WHERE pubname = %s", (self.source.publication,))
            rows = cur.fetchall()
        # The watermark and heartbeat tables are published but never captured.
        return sorted(f"{s}.{t}" for s, t in rows
                      if t not in (WATERMARK_TABLE, HEARTBEAT_TABLE)
                      and self.source.matches(s, t))

    def _table(self, cur: Any, name: str) -> tuple[TableCodec, list[str], list[str]]:
        """The codec of ``name`` as the log's Relation message would describe it now, its
        key columns and their SQL types."""
        schema, _, table = name.partition(".")
        if not self.source.matches(schema, table):
            raise DumpSetupError(f"{name} is not a table of {self.source.redacted} (tables=)")
        cur.execute(_COLUMNS_SQL, (schema, table))
        rows = cur.fetchall()
        if not rows:
            raise DumpSetupError(f"table {name} does not exist (dropped, or not created yet)")
        oid, _ns, _rel, ident = rows[0][:4]
        columns = tuple(Column(False, r[4], r[5], r[6]) for r in rows)
        info = read_table_info(cur, Relation(oid, schema, table, str(ident), columns))
        key = list(info.primary_key)
        if not key:
            raise DumpSetupError(f"table {name} has no primary key: a dump reads in key "
                                 "order and matches log events by key, so it is refused")
        columns = tuple(Column(c.name in key, c.name, c.type_oid, c.type_modifier)
                        for c in columns)
        codec = TableCodec(Relation(oid, schema, table, str(ident), columns), name, info)
        sql_types = {r[4]: r[7] for r in rows}
        self._as_text(cur, {c.type_oid for c in columns})
        return codec, key, [sql_types[k] for k in key]

    @staticmethod
    def _as_text(cur: Any, oids: set[int]) -> None:
        """Make the driver return these types' text output as it is (what pgoutput
        sends), not its own conversion: on this cursor only, which reads the chunk. (On
        the connection, the next chunk's catalog queries would get their own int and
        bool columns as text too.)"""
        caster = psycopg2.extensions.new_type(tuple(oids), "DATABUS_TEXT",
                                              lambda value, _cur: value)
        psycopg2.extensions.register_type(caster, cur)

    def estimate_rows(self, source: str) -> int:
        schema, _, table = source.partition(".")
        with self._cursor() as cur:
            # reltuples is -1 until the table was first vacuumed or analyzed (a table
            # loaded just before the dump). Then the larger of the statistics' live row
            # count (flushed by backends about once a second, so it can still be 0) and
            # the planner's estimate, which reads the table's current size in pages.
            cur.execute("SELECT c.reltuples::bigint, coalesce(s.n_live_tup, 0) FROM "
                        "pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace LEFT "
                        "JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE n.nspname = %s "
                        "AND c.relname = %s", (schema, table))
            row = cur.fetchone()
            if row is None:
                return 0
            if int(row[0]) >= 0:
                return int(row[0])
            cur.execute(sql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {}.{}").format(
                sql.Identifier(schema), sql.Identifier(table)))
            plan = cur.fetchone()
        doc = plan[0] if plan else None
        if isinstance(doc, str):
            doc = json.loads(doc)
        try:
            planned = int(doc[0]["Plan"]["Plan Rows"])  # type: ignore[index]
        except (TypeError, KeyError, IndexError, ValueError):
            planned = 0
        return max(int(row[1]), planned)

    def write_watermark(self, token: str) -> None:
        with self._cursor() as cur:
            cur.execute(sql.SQL("INSERT INTO public.{} (id) VALUES (%s)").format(
                sql.Identifier(WATERMARK_TABLE)), (token,))

    def _select(self, codec: TableCodec, key: list[str]) -> sql.Composed:
        relation = codec.relation
        return sql.SQL("SELECT {} FROM {}.{}").format(
            sql.SQL(", ").join(sql.Identifier(c.name) for c in relation.columns),
            sql.Identifier(relation.namespace), sql.Identifier(relation.name))

    def _chunk(self, name: str, codec: TableCodec, encoded: EncodedRows, *,
               done: bool) -> DumpChunk:
        catalog = self.context.catalog
        source_id = catalog.source_id(name)
        catalog.register_schema(name, codec.schema)
        out, last = encoded
        cursor = None if last is None else cursor_to_json(last)
        return DumpChunk(name, source_id, out, cursor, done)

    @staticmethod
    def _bound(source: str, key: list[str], types: list[str], cursor: list[Any], op: str
               ) -> tuple[sql.Composed, list[str]]:
        """``(k1, k2) op (%s::type1, %s::type2)`` and its parameters (the key as text)."""
        values = cursor_from_json(cursor)
        if len(values) != len(key):
            raise DumpSetupError(f"table {source}: its primary key changed "
                                 "during the dump; cancel it and dump again")
        term = sql.SQL("({}) " + op + " ({})").format(
            sql.SQL(", ").join(sql.Identifier(k) for k in key),
            sql.SQL(", ").join(sql.SQL("%s::" + t) for t in types))
        return term, [str(v) for v in values]

    def split_points(self, source: str, count: int) -> list[list[Any]]:
        """Up to ``count - 1`` keys cutting ``source`` into ranges of about the same
        size: for a single integer key whose values are dense (as ``MysqlDumpSource``
        judges it), evenly between its least and greatest value; otherwise every n-th
        key of the primary key index (an index-only pass)."""
        if count < 2:
            return []
        estimate = max(1, self.estimate_rows(source))
        with self._cursor() as cur:
            codec, key, types = self._table(cur, source)
            relation = codec.relation
            table = sql.SQL("{}.{}").format(sql.Identifier(relation.namespace),
                                            sql.Identifier(relation.name))
            keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
            if len(key) == 1 and types[0] in ("smallint", "integer", "bigint"):
                cur.execute(sql.SQL("SELECT min({0})::bigint, max({0})::bigint FROM {1}")
                            .format(keys, table))
                low, high = cur.fetchone() or (None, None)
                if low is None or high is None:
                    return []
                low, high = int(low), int(high)
                if high - low <= SPARSE * estimate:
                    step = (high - low) / count
                    points = sorted({low + int(step * i) for i in range(1, count)})
                    return [cursor_to_json([str(p)]) for p in points if low <= p < high]
            every = max(1, estimate // count)
            out: list[list[Any]] = []
            after: list[Any] | None = None
            text = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k))
                                      for k in key)
            for _ in range(count - 1):
                query = sql.SQL("SELECT {} FROM {}").format(text, table)
                params: list[Any] = []
                if after is not None:
                    term, params = self._bound(source, key, types, after, ">")
                    query = sql.SQL("{} WHERE {}").format(query, term)
                query = sql.SQL("{} ORDER BY {} LIMIT 1 OFFSET %s").format(query, keys)
                cur.execute(query, [*params, every - 1])
                found = cur.fetchone()
                if found is None:
                    break
                after = cursor_to_json(list(found))
                out.append(after)
            return out

    def read_chunk(self, source: str, after: list[Any] | None, limit: int, *,
                   until: list[Any] | None = None) -> DumpChunk:
        with self._cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                codec, key, types = self._table(cur, source)
                query = self._select(codec, key)
                params: list[Any] = []
                terms: list[sql.Composable] = []
                if after is not None:
                    term, values = self._bound(source, key, types, after, ">")
                    terms.append(term)
                    params += values
                if until is not None:  # a key range's end, inclusive
                    term, values = self._bound(source, key, types, until, "<=")
                    terms.append(term)
                    params += values
                if terms:
                    query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(terms))
                query = sql.SQL("{} ORDER BY {} LIMIT %s").format(
                    query, sql.SQL(", ").join(sql.Identifier(k) for k in key))
                encoded = read_encoded(cur, query, [*params, limit], codec)
            finally:
                cur.execute("COMMIT")
        return self._chunk(source, codec, encoded, done=len(encoded[0]) < limit)

    def read_keys(self, source: str, keys: list[Any]) -> DumpChunk:
        with self._cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                codec, key, types = self._table(cur, source)
                wanted = []
                for k in keys:
                    values = k if isinstance(k, list) else [k]
                    if len(values) != len(key):
                        raise DumpSetupError(f"table {source}: key {k!r} does not have the "
                                             f"{len(key)} primary key column(s)")
                    wanted.append(values)
                encoded: EncodedRows = ([], None)
                if wanted:
                    row_sql = sql.SQL("({})").format(
                        sql.SQL(", ").join(sql.SQL("%s::" + t) for t in types))
                    query = sql.SQL("{} WHERE ({}) IN ({}) ORDER BY {}").format(
                        self._select(codec, key),
                        sql.SQL(", ").join(sql.Identifier(k) for k in key),
                        sql.SQL(", ").join([row_sql] * len(wanted)),
                        sql.SQL(", ").join(sql.Identifier(k) for k in key))
                    encoded = read_encoded(
                        cur, query, [str(v) for values in wanted for v in values], codec)
            finally:
                cur.execute("COMMIT")
        return self._chunk(source, codec, encoded, done=True)

    def cleanup_watermarks(self, keep: frozenset[str]) -> None:
        with self._cursor() as cur:
            cur.execute(sql.SQL("DELETE FROM public.{} WHERE NOT (id = ANY(%s)) AND "
                                "created_at < now() - interval '1 minute'").format(
                sql.Identifier(WATERMARK_TABLE)), (sorted(keep),))
