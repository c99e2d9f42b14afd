"""Shared helpers of the MariaDB benchmarks: a throwaway server started exactly as the
test fixture starts it (``tests/fixtures/_mariadb.py``: ROW binlog, FULL row image and
row metadata, ``sync_binlog=0``), a source URI for it, and its binlog position. Not a
benchmark by itself.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pymysql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the scripts run as benchmarks/x.py: make ``tests`` importable
    sys.path.insert(0, str(ROOT))

from databus.fetchers.mysql._scn import BinlogPosition  # noqa: E402
from tests.fixtures._mariadb import MariaDBServer, launch  # noqa: E402
from tests.fixtures._procs import shutdown  # noqa: E402

__all__ = ["COLUMNS", "MariaDBServer", "connect", "mariadb", "master_position", "source_uri"]


# The items table of the MariaDB benchmarks (fetcher_mysql.py, dump.py): 8 columns of
# the common types, the same row shape in both.
COLUMNS = """
    id BIGINT NOT NULL PRIMARY KEY,
    customer_id INT NOT NULL,
    status VARCHAR(16) NOT NULL,
    amount DECIMAL(12,2) NOT NULL,
    qty SMALLINT NOT NULL,
    price DOUBLE NOT NULL,
    note VARCHAR(100) NULL,
    created DATETIME(6) NOT NULL
"""


@contextmanager
def mariadb() -> Iterator[MariaDBServer]:
    """A fresh MariaDB (new datadir, free port), removed on exit."""
    control = launch()
    try:
        yield MariaDBServer.from_control(control)
    finally:
        shutdown(control)


def connect(server: MariaDBServer, database: str | None = None,
            **overrides: Any) -> pymysql.Connection[Any]:
    """A TCP connection as the replication user (autocommit)."""
    return pymysql.connect(**server.connect_kwargs(database=database, **overrides))


def master_position(conn: pymysql.Connection[Any]) -> BinlogPosition:
    """The server's current binlog end (``SHOW MASTER STATUS``)."""
    with conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        row = cur.fetchone()
    assert row is not None, "the server has no binlog"
    return BinlogPosition(str(row[0]), int(row[1]))


def source_uri(server: MariaDBServer, tables: str, server_id: int, **params: Any) -> str:
    """A ``mysql://`` source URI for ``tables`` (as ``tests/integration/binlog_support``)."""
    query = {"tables": tables, "server_id": server_id, **params}
    return server.url() + "?" + "&".join(f"{k}={v}" for k, v in query.items())
