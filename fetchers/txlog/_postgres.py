"""The PostgreSQL session (psycopg2): ``postgresql+txlog://user:pw@host:port/db?tables=...``.

The connection runs in autocommit mode and opens its transactions explicitly, so that
the read of a poll is one REPEATABLE READ snapshot and the assignment a short READ
COMMITTED transaction. The session time zone is UTC: ``timestamptz`` values arrive as
aware UTC datetimes. TCP keepalives make a vanished server show up as an error within
seconds rather than a hang.

Errors: a lost or refused connection, a cancelled statement, a serialisation failure
or deadlock, and a column that vanished between the catalog read and the query (a DDL
race) are retriable; anything else (missing privileges, a dropped table, a bug in a
generated statement) is not, and its message says what PostgreSQL said.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from databus.errors import DatabusError, SourceError
from databus.fetchers.txlog._dialects import PostgresDialect
from databus.fetchers.txlog._model import TXN_COLUMN, Column, TableRef, TableShape
from databus.fetchers.txlog._session import DbSession, Installed, Mode, Params, TableInfo

__all__ = ["PostgresSession"]

_RETRIABLE: tuple[type[BaseException], ...] = (
    psycopg2.OperationalError,  # connection refused/lost, admin shutdown, query cancelled
    psycopg2.InterfaceError,  # "connection already closed"
    psycopg2.errors.TransactionRollbackError,  # serialization failure, deadlock
    psycopg2.errors.UndefinedColumn,  # a column dropped between catalog read and query
)


class PostgresSession(DbSession):
    errors: tuple[type[BaseException], ...] = (psycopg2.Error,)

    conn: psycopg2.extensions.connection | None = None

    @property
    def pg(self) -> PostgresDialect:
        assert isinstance(self.dialect, PostgresDialect)
        return self.dialect

    def connect(self) -> None:
        s = self.source
        kwargs: dict[str, Any] = {
            "host": s.host, "port": s.port, "user": s.user, "dbname": s.dbname,
            "connect_timeout": max(1, round(s.connect_timeout_s)),
            "application_name": "databus-txlog",
            "options": "-c timezone=UTC",
            "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
            "keepalives_count": 3,
        }
        if s.password is not None:
            kwargs["password"] = s.password
        if s.sslmode is not None:
            kwargs["sslmode"] = s.sslmode
        try:
            conn = psycopg2.connect(**kwargs)
        except psycopg2.Error as exc:
            raise self.translate(exc) from exc
        conn.autocommit = True
        self.conn = conn

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    @property
    def _conn(self) -> psycopg2.extensions.connection:
        if self.conn is None:
            raise SourceError("the PostgreSQL session is closed", retriable=True)
        return self.conn

    def begin(self, mode: Mode) -> None:
        self.query("BEGIN" if mode == "write" else
                   "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def commit(self) -> None:
        self.query("COMMIT")

    def rollback(self) -> None:
        if self.conn is not None and not self.conn.closed:
            self.query("ROLLBACK")

    def query(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        with self._conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description is not None else []

    def _exists(self, qualified: str) -> bool:
        (found,), = self.query("SELECT to_regclass(%(rel)s) IS NOT NULL", {"rel": qualified})
        return bool(found)

    def describe(self, ref: TableRef) -> TableInfo:
        d = self.pg
        rows = self.query(d.columns_sql(), {"schema": ref.schema, "table": ref.name})
        triggers = self.query(d.triggers_sql(), {"rel": d.table(ref)}) if rows else []
        installed = Installed(
            txlog=self._exists(d.txlog),
            delete_log=self._exists(d.table(d.delete_log(ref))),
            triggers=frozenset(name for (name,) in triggers),
        )
        if not rows:
            return TableInfo(None, installed)
        key = tuple(name for name, *_ in sorted((r for r in rows if r[3]), key=lambda r: r[3]))
        columns = tuple(
            Column(name, sql_type, nullable=not notnull)
            for name, sql_type, notnull, _pk in rows if name != TXN_COLUMN
        )
        has_txn = any(r[0] == TXN_COLUMN for r in rows)
        return TableInfo(TableShape(ref, columns, key, has_txn), installed)

    def ddl_token(self, refs: Sequence[TableRef]) -> object:
        rels = [self.pg.table(ref) for ref in refs]
        return tuple(self.query(self.pg.ddl_token_sql(), {"rels": rels})[0])

    def delete_logs(self) -> list[TableRef]:
        return [TableRef(schema, name) for schema, name in self.query(self.pg.delete_logs_sql())]

    def captured_tables(self) -> list[TableRef]:
        rows = self.query(self.pg.captured_tables_sql())
        return [TableRef(schema, name) for schema, name in rows]

    def translate(self, exc: BaseException) -> DatabusError:
        s = self.source
        where = f"PostgreSQL {s.host}:{s.port}/{s.dbname}"
        detail = str(exc).strip() or type(exc).__name__
        if s.password:
            detail = detail.replace(s.password, "***")
        return SourceError(f"{where}: {type(exc).__name__}: {detail}",
                           retriable=isinstance(exc, _RETRIABLE))
