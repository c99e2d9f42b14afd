"""The Oracle session (python-oracledb, thin mode): UNTESTED against a live Oracle.

No Oracle server or driver exists where this project is built and tested. The SQL this
session runs comes from ``OracleDialect`` and is tested as text; this shell is written
to the python-oracledb API but has never run. Without ``oracledb`` installed, creating
a session raises ``DriverMissingError`` (not retriable), which is what
``OracleTxlogFetcher.run`` reports.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from databus.errors import DatabusError, SourceError
from databus.fetchers.txlog._dialects import OracleDialect
from databus.fetchers.txlog._errors import DriverMissingError
from databus.fetchers.txlog._model import TXN_COLUMN, Column, TableRef, TableShape
from databus.fetchers.txlog._session import DbSession, Installed, Mode, Params, TableInfo
from databus.fetchers.txlog._uri import TxlogSource

__all__ = ["OracleSession", "load_driver"]


def load_driver() -> Any:
    """The ``oracledb`` module, or ``DriverMissingError`` saying how to get it."""
    try:
        return importlib.import_module("oracledb")
    except ImportError:
        raise DriverMissingError(
            "the Oracle TxLog fetcher needs the Oracle driver python-oracledb "
            "(pip install oracledb), which is not installed. Note: the Oracle dialect's SQL "
            "is generated and tested as text only; it has never run against a live Oracle "
            "database (see docs/txlog-fetcher.md)"
        ) from None


class OracleSession(DbSession):
    def __init__(self, source: TxlogSource) -> None:
        super().__init__(source)
        self.driver = load_driver()
        self.errors = (self.driver.Error,)
        self.conn: Any = None

    @property
    def ora(self) -> OracleDialect:
        assert isinstance(self.dialect, OracleDialect)
        return self.dialect

    def connect(self) -> None:
        s = self.source
        try:
            self.conn = self.driver.connect(
                user=s.user, password=s.password, dsn=f"{s.host}:{s.port}/{s.dbname}",
                tcp_connect_timeout=s.connect_timeout_s,
            )
        except self.driver.Error as exc:
            raise self.translate(exc) from exc

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def begin(self, mode: Mode) -> None:
        # Oracle starts transactions implicitly; a read-only one reads one snapshot.
        if mode == "read":
            self.query("SET TRANSACTION READ ONLY")

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        if self.conn is not None:
            self.conn.rollback()

    def query(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, dict(params or {}))
            return list(cur.fetchall()) if cur.description is not None else []

    def describe(self, ref: TableRef) -> TableInfo:
        d = self.ora
        names = {"owner": ref.schema, "table": ref.name}
        rows = self.query(d.columns_sql(), names)
        triggers = self.query(d.triggers_sql(), names)
        tables = {
            (owner, name) for owner, name in self.query(
                "SELECT OWNER, TABLE_NAME FROM ALL_TABLES WHERE TABLE_NAME IN (:a, :b)",
                {"a": d.ident("databus_txlog"), "b": d.delete_log(ref).name})
        }
        installed = Installed(
            txlog=(d.txlog_schema, d.ident("databus_txlog")) in tables,
            delete_log=(ref.schema, d.delete_log(ref).name) in tables,
            triggers=frozenset(name for (name,) in triggers),
        )
        if not rows:
            return TableInfo(None, installed)
        txn = d.ident(TXN_COLUMN)
        key = tuple(name for name, *_ in sorted((r for r in rows if r[3]), key=lambda r: r[3]))
        columns = tuple(
            Column(name, sql_type, nullable=nullable == "Y")
            for name, sql_type, nullable, _pk in rows if name != txn
        )
        return TableInfo(
            TableShape(ref, columns, key, any(r[0] == txn for r in rows)), installed
        )

    def ddl_token(self, refs: Sequence[TableRef]) -> object:
        params: dict[str, Any] = {}
        for i, ref in enumerate(refs):
            params[f"owner{i}"] = ref.schema
            params[f"table{i}"] = ref.name
        return self.query(self.ora.ddl_token_sql(len(refs)), params)[0][0]

    def delete_logs(self) -> list[TableRef]:
        rows = self.query(
            "SELECT OWNER, TABLE_NAME FROM ALL_TABLES "
            "WHERE TABLE_NAME LIKE 'DATABUS\\_DELETED\\_%' ESCAPE '\\'"
        )
        return [TableRef(owner, name) for owner, name in rows]

    def captured_tables(self) -> list[TableRef]:
        rows = self.query(
            "SELECT TABLE_OWNER, TABLE_NAME FROM ALL_TRIGGERS "
            "WHERE TRIGGER_NAME LIKE 'DATABUS\\_CAPTURE\\_%' ESCAPE '\\'"
        )
        return [TableRef(owner, name) for owner, name in rows]

    def translate(self, exc: BaseException) -> DatabusError:
        retriable = isinstance(exc, self.driver.OperationalError | self.driver.InterfaceError)
        s = self.source
        return SourceError(f"Oracle {s.host}:{s.port}/{s.dbname}: {type(exc).__name__}: {exc}",
                           retriable=retriable)
