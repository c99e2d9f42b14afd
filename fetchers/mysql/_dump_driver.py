"""The dump's chunk reads through mysqlclient (``MySQLdb``, MariaDB Connector/C) without
conversions: numbers and temporals arrive as their ASCII text and ``CAST(.. AS CHAR)``
columns as str, which ``_rows`` encodes straight to Avro. Measured against pymysql on
the same keyset chunks (benchmarks/README.md, "Dump chunk driver"): about 7x the rows per
second, which is why the dump reads with it; the binlog stays on mysql-replication
(pymysql).

mysqlclient is built from source against libmariadb (``make deps`` installs
``libmariadb-dev``); where it is not installed the dump reads with pymysql as before
(``available()`` says why), with the same rows and bytes.
"""

from __future__ import annotations

import importlib
from typing import Any

from databus.fetchers.mysql._uri import BinlogSourceConfig

__all__ = ["WHY_NOT", "available", "connect_raw", "driver_errors", "interface_errors",
           "select_raw"]


def _load() -> tuple[Any, str | None]:
    try:
        return importlib.import_module("MySQLdb"), None
    except ImportError as exc:
        return None, f"mysqlclient is not installed ({exc}); chunks are read with pymysql"


_MYSQLDB, WHY_NOT = _load()


def available() -> bool:
    return _MYSQLDB is not None


def interface_errors() -> tuple[type[BaseException], ...]:
    """The driver's errors of a connection that is gone (closed, never opened)."""
    return (_MYSQLDB.InterfaceError,) if _MYSQLDB is not None else ()


def driver_errors() -> tuple[type[BaseException], ...]:
    """The driver's error classes (their args are (code, message), as pymysql's)."""
    return (_MYSQLDB.MySQLError,) if _MYSQLDB is not None else ()


def _encoders() -> dict[Any, Any]:
    """mysqlclient's ``conv`` with its Python-to-SQL encoders only: no result value is
    converted (the field-type keys are the decoders)."""
    conversions = importlib.import_module("MySQLdb.converters").conversions
    return {k: v for k, v in conversions.items() if not isinstance(k, int)}


def connect_raw(config: BinlogSourceConfig) -> Any:
    """A connection (autocommit) whose results are not converted."""
    kwargs = config.connect_kwargs()
    return _MYSQLDB.connect(
        host=kwargs["host"], port=kwargs["port"], user=kwargs["user"],
        password=kwargs["password"], connect_timeout=int(config.connect_timeout_s),
        read_timeout=int(config.read_timeout_s), write_timeout=int(config.read_timeout_s),
        charset="utf8mb4", autocommit=True, conv=_encoders())


def select_raw(conn: Any, sql: str, params: Any) -> tuple[list[tuple[Any, ...]], list[int]]:
    """The rows of ``sql`` and each result column's field type."""
    cur = conn.cursor()
    try:
        cur.execute(sql, params or None)
        rows = list(cur.fetchall())
        types = [d[1] for d in cur.description or ()]
    finally:
        cur.close()
    return rows, types
