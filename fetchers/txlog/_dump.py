"""The TxLog fetchers' ``DumpSource`` (SQLite, PostgreSQL): chunks of a captured table in
key order and watermark rows, on a session of its own (DESIGN 8.1, docs/dumps.md).

The watermark table ``databus_watermark`` lives beside the TxLog's own tables and has
the same capture as a captured table (``databus dump setup`` creates both): each
watermark ``INSERT`` is a TxLog transaction, and the fetcher reads its rows in the
window of its SCN and hands them to ``sink.watermark`` instead of emitting them. On
SQLite the watermark transaction seals itself, so it is a window of its own.

Rows are selected with the fetcher's own expressions (``SqlDialect.select_expr``) and
encoded with its ``TableCodec``, so a dumped row is byte-identical to the same row in a
TxLog window. A chunk is ``... WHERE (k1, k2) > (:k0, :k1) ORDER BY k1, k2 LIMIT n`` (a
row comparison: SQLite and PostgreSQL both use the primary key index for it), read in a
transaction of its own (PostgreSQL: REPEATABLE READ, READ ONLY), so it is one snapshot
and locks nothing writers wait for.

Why the order is right on PostgreSQL, where SCNs are numbered after commit in txid
order: the engine waits until the fetcher has read the low watermark before it
selects. The low watermark then has its SCN, and every transaction still running gets a
larger one when it commits, so a change the chunk's snapshot missed comes after the low
watermark in the stream: its key is dropped from the chunk, or its event follows the
chunk's rows.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from databus.errors import DumpSetupError
from databus.fetchers._api import DumpChunk, DumpRow, FetcherContext
from databus.fetchers._cursor import cursor_from_json, cursor_to_json
from databus.fetchers.txlog._dialects import SqliteDialect, dialect_for
from databus.fetchers.txlog._model import WATERMARK_READY, TableShape
from databus.fetchers.txlog._schema import TableCodec
from databus.fetchers.txlog._session import DbSession, check_table, missing_objects
from databus.fetchers.txlog._uri import TableSpec, TxlogSource

__all__ = ["TxlogDumpSource"]


class TxlogDumpSource:
    """See the module docstring."""

    def __init__(self, source: TxlogSource, context: FetcherContext,
                 new_session: Callable[[], DbSession]) -> None:
        self.source = source
        self.context = context
        self._new_session = new_session
        self._session: DbSession | None = None

    # -- the session ------------------------------------------------------------------

    @contextlib.contextmanager
    def _use(self) -> Iterator[DbSession]:
        """The session, driver errors translated; a session that failed is dropped."""
        if self._session is None:
            session = self._new_session()
            with session.guard():
                session.connect()
            self._session = session
        session = self._session
        try:
            with session.guard():
                yield session
        except DumpSetupError:
            raise
        except Exception as exc:
            if getattr(exc, "retriable", False):
                self.close()
            raise

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()

    def _hint(self) -> str:
        return f"run `databus dump setup --source '{self.source.redacted}'` once"

    # -- DumpSource -------------------------------------------------------------------

    def setup(self, *, dry_run: bool = False) -> list[str]:
        with self._use() as session:
            dialect = session.dialect
            shape = dialect.watermark_shape()
            with session.transaction("read"):
                info = session.describe(shape.ref)
            if info.shape is not None:
                shape = info.shape  # as it is: re-running the install changes nothing
            statements = [dialect.watermark_create_sql(), *dialect.install_sql([shape])]
            if not dry_run:
                session.prepare_install()
                session.run_script(statements)
        return statements

    def check(self) -> None:
        with self._use() as session:
            dialect = session.dialect
            ref = dialect.watermark_shape().ref
            with session.transaction("read"):
                info = session.describe(ref)
                # (PostgreSQL's privilege checks raise on tables that do not exist)
                missing = missing_objects(session, info) if info.shape is not None else []
                grants = (self._grants(session) if info.shape is not None and not missing
                          else [])
            if info.shape is None:
                raise DumpSetupError(f"no watermark table {ref} in {self.source.redacted}: "
                                     f"{self._hint()}")
            if missing:
                raise DumpSetupError(f"the watermark table {ref} lacks its capture "
                                     f"({'; '.join(missing)}): {self._hint()}")
            if grants:
                raise DumpSetupError(
                    f"the source user cannot write the watermark table {ref}: "
                    f"{'; '.join(grants)} (and SELECT on the dumped tables)")
        # Before the first watermark: the fetcher captures the table from its next batch
        # on (by itself it looks once a second, and would miss a watermark meanwhile).
        self.context.memory[WATERMARK_READY] = True

    def grant_statements(self, user: str) -> list[str]:
        """What an administrator grants ``user`` (the relay's) to write watermarks
        (none for SQLite: file permissions; PostgreSQL also the TxLog and the
        watermark table's delete log, which its capture triggers write as that user)."""
        dialect = dialect_for(self.source.dialect, self.source.txlog_schema)
        if isinstance(dialect, SqliteDialect):
            return []
        ref = dialect.watermark_shape().ref
        table = dialect.table(ref)
        grantee = '"' + user.replace('"', '""') + '"'
        out = [f"GRANT SELECT, INSERT, DELETE ON {table} TO {grantee}"]
        if self.source.dialect == "postgresql":
            out.append(f"GRANT INSERT ON {dialect.txlog}, "
                       f"{dialect.table(dialect.delete_log(ref))} TO {grantee}")
        return out

    def _grants(self, session: DbSession) -> list[str]:
        """The GRANTs the source user lacks to write watermarks (none: it may).

        On PostgreSQL the capture triggers run as the user who writes the watermark
        row, so the user also inserts into the TxLog (each watermark) and the watermark
        table's delete log (each cleanup)."""
        dialect = session.dialect
        ref = dialect.watermark_shape().ref
        table = dialect.table(ref)
        if isinstance(dialect, SqliteDialect):
            path = self.source.path
            writable = path is None or os.access(path, os.W_OK)
            return [] if writable else [f"GRANT SELECT, INSERT, DELETE ON {table} TO <user>"]
        delete_log = dialect.table(dialect.delete_log(ref))
        (select, insert, delete, txlog, deletes), = session.query(
            "SELECT has_table_privilege(current_user, %(t)s, 'SELECT'), "
            "has_table_privilege(current_user, %(t)s, 'INSERT'), "
            "has_table_privilege(current_user, %(t)s, 'DELETE'), "
            "has_table_privilege(current_user, %(txlog)s, 'INSERT'), "
            "has_table_privilege(current_user, %(log)s, 'INSERT')",
            {"t": table, "txlog": dialect.txlog, "log": delete_log})
        out = []
        if not (select and insert and delete):
            out.append(f"GRANT SELECT, INSERT, DELETE ON {table} TO <user>")
        if not (txlog and deletes):
            out.append(f"GRANT INSERT ON {dialect.txlog}, {delete_log} TO <user> (the capture "
                       "triggers of the watermark table write them as this user)")
        return out

    def _spec(self, name: str) -> TableSpec:
        for spec in self.source.tables:
            if self.source.source_name(spec.ref) == name:
                return spec
        raise DumpSetupError(f"{name} is not a table of {self.source.redacted} (tables=)")

    def tables(self) -> list[str]:
        names = []
        with self._use() as session, session.transaction("read"):
            for spec in self.source.tables:
                info = session.describe(spec.ref)
                if info.shape is not None and not missing_objects(session, info):
                    names.append(self.source.source_name(spec.ref))
        return names

    def _shape(self, session: DbSession, spec: TableSpec) -> TableShape:
        """Inside a read transaction: the table as the fetcher captures it now."""
        name = self.source.source_name(spec.ref)
        info = session.describe(spec.ref)
        if info.shape is None:
            raise DumpSetupError(f"table {name} does not exist (dropped, or not created yet)")
        if not info.shape.key:
            raise DumpSetupError(f"table {name} has no primary key: a dump reads in key "
                                 "order and matches log events by key, so it is refused")
        try:
            return check_table(session, spec, info, installed=True)
        except Exception as exc:
            raise DumpSetupError(f"table {name}: {exc}") from None

    def estimate_rows(self, source: str) -> int:
        spec = self._spec(source)
        with self._use() as session, session.transaction("read"):
            self._shape(session, spec)
            (count,), = session.query(f"SELECT count(*) FROM {session.dialect.table(spec.ref)}")
        return int(count)

    def write_watermark(self, token: str) -> None:
        with self._use() as session:
            dialect = session.dialect
            table = dialect.table(dialect.watermark_shape().ref)
            with session.transaction("write"):
                session.query(f"INSERT INTO {table} (id) VALUES ({dialect.param('id')})",
                              {"id": token})
                if isinstance(dialect, SqliteDialect):
                    session.query(dialect.SEAL_SQL)  # a window of its own

    def _chunk(self, name: str, shape: TableShape, rows: list[tuple[Any, ...]], *,
               done: bool) -> DumpChunk:
        codec = TableCodec(shape, self.source.dialect, name)
        catalog = self.context.catalog
        source_id = catalog.source_id(name)
        catalog.register_schema(name, codec.schema)
        fp = codec.fingerprint
        out = [DumpRow(codec.key(row), codec.encode(row), fp) for row in rows]
        cursor = None
        if rows:
            cursor = cursor_to_json([rows[-1][i] for i in codec.key_positions])
        return DumpChunk(name, source_id, out, cursor, done)

    @staticmethod
    def _key_params(source: str, shape: TableShape, cursor: list[Any], prefix: str
                    ) -> dict[str, Any]:
        values = cursor_from_json(cursor)
        if len(values) != len(shape.key):
            raise DumpSetupError(f"table {source}: its primary key changed during "
                                 "the dump; cancel it and dump the table again")
        return {f"{prefix}{i}": v for i, v in enumerate(values)}

    def read_chunk(self, source: str, after: list[Any] | None, limit: int, *,
                   until: list[Any] | None = None) -> DumpChunk:
        spec = self._spec(source)
        with self._use() as session, session.transaction("read"):
            shape = self._shape(session, spec)
            params: dict[str, Any] = {}
            if after is not None:
                params.update(self._key_params(source, shape, after, "k"))
            if until is not None:
                params.update(self._key_params(source, shape, until, "u"))
            sql = session.dialect.chunk_sql(shape, after=after is not None, limit=limit,
                                            until=until is not None)
            rows = session.query(sql, params or None)
        return self._chunk(source, shape, rows, done=len(rows) < limit)

    def split_points(self, source: str, count: int) -> list[list[Any]]:
        """Up to ``count - 1`` keys cutting ``source`` into ranges of about the same
        size: every n-th key of its primary key index."""
        if count < 2:
            return []
        every = max(1, self.estimate_rows(source) // count)
        spec = self._spec(source)
        points: list[list[Any]] = []
        with self._use() as session, session.transaction("read"):
            shape = self._shape(session, spec)
            for _ in range(count - 1):
                params = (self._key_params(source, shape, points[-1], "k") if points
                          else None)
                sql = session.dialect.split_sql(shape, after=bool(points), skip=every - 1)
                found = session.query(sql, params)
                if not found:
                    break
                points.append(cursor_to_json(list(found[0])))
        return points

    def read_keys(self, source: str, keys: list[Any]) -> DumpChunk:
        spec = self._spec(source)
        with self._use() as session, session.transaction("read"):
            shape = self._shape(session, spec)
            params: dict[str, Any] = {}
            for i, key in enumerate(keys):
                values = key if isinstance(key, list) else [key]
                if len(values) != len(shape.key):
                    raise DumpSetupError(f"table {source}: key {key!r} does not have the "
                                         f"{len(shape.key)} primary key column(s)")
                params.update({f"k{i}_{j}": v for j, v in enumerate(values)})
            rows = session.query(session.dialect.keys_sql(shape, len(keys)), params)
        return self._chunk(source, shape, rows, done=True)

    def cleanup_watermarks(self, keep: frozenset[str]) -> None:
        with self._use() as session:
            dialect = session.dialect
            table = dialect.table(dialect.watermark_shape().ref)
            with session.transaction("write"):
                session.query(f"DELETE FROM {table} WHERE {dialect.watermark_ttl_sql}")
                if isinstance(dialect, SqliteDialect):
                    session.query(dialect.SEAL_SQL)
