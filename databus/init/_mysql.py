"""``databus init mysql``: a MariaDB/MySQL source as the binlog fetcher will read it.

The checks are the fetcher's and the dump's own: ``check_server`` (log_bin, ROW format,
FULL row image and metadata, no compression), the watermark table of ``databus dump
setup`` (``MysqlDumpSource.check``, statements from ``setup_statements``); added here
are what only a first look needs: the server's own ``server_id``, the grants of the
URI's user (REPLICATION SLAVE and BINLOG MONITOR/REPLICATION CLIENT from
``information_schema.USER_PRIVILEGES``, SELECT by reading each table) and each
table's primary key.
"""

from __future__ import annotations

from typing import Any

import pymysql

from databus.errors import DatabusError, SourceMisconfiguredError
from databus.fetchers._api import FetcherContext
from databus.fetchers.mysql._dump import MysqlDumpSource, setup_statements
from databus.fetchers.mysql._select import quote
from databus.fetchers.mysql._server import (
    binary_logs,
    check_server,
    connect,
    current_shapes,
    unlisted_databases,
)
from databus.fetchers.mysql._uri import BinlogSourceConfig
from databus.init._model import Inspection, buffer_name
from databus.relay.dumps._cli import _ScratchCatalog

__all__ = ["inspect_mysql"]

_REPLICATION = {"REPLICATION SLAVE", "REPLICATION REPLICA"}
_MONITOR = {"BINLOG MONITOR", "REPLICATION CLIENT"}


def _account(cur: Any) -> tuple[str, str]:
    cur.execute("SELECT CURRENT_USER()")
    user, _, host = str(cur.fetchone()[0]).rpartition("@")
    return user, host


def _privileges(cur: Any, user: str, host: str) -> set[str]:
    grantee = f"'{user}'@'{host}'"
    cur.execute("SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES "
                "WHERE GRANTEE = %s", (grantee,))
    return {str(r[0]).upper() for r in cur.fetchall()}


def _databases(config: BinlogSourceConfig) -> list[str]:
    return config.selector.schemas() or []


def inspect_mysql(uri: str) -> Inspection:
    config = BinlogSourceConfig.from_uri(uri)
    databases = _databases(config)
    found = Inspection("mysql", buffer=buffer_name(databases[0] if len(databases) == 1
                                                   else "mysql", "mysql"),
                       admin="root (sudo mariadb, or mysql -u root)")
    if not databases:
        found.error("tables", "the URI names no database: the configs need to know what "
                    "to capture", "name it: mysql://USER@HOST:3306/shop, or "
                    "?tables=shop.orders,shop.items")
        return found
    account = f"'{config.user}'@'%'"
    try:
        conn = connect(config, "logging in")
    except DatabusError as exc:
        if not isinstance(exc, SourceMisconfiguredError):  # not there: nothing to run
            found.error("login", str(exc), "start the server, or correct the URI's host "
                        "and port")
            return found
        found.error("login", str(exc), f"create the user, or correct the URI: CREATE "
                    f"USER {account} IDENTIFIED BY '...'")
        found.sql.append(f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY '<password>'")
        _grant_all(found, config, account, databases)
        return found
    try:
        with conn.cursor() as cur:
            user, host = _account(cur)
            account = f"'{user}'@'{host}'"
            cur.execute("SELECT @@version, @@global.server_id")
            version, server_id = cur.fetchone()
        found.ok("login", f"{config.address} logs in as {account} ({version})")
        try:
            check_server(conn, config)
            found.ok("binlog", "log_bin on, binlog_format = ROW, binlog_row_image = FULL, "
                     "binlog_row_metadata = FULL")
        except DatabusError as exc:
            found.error("binlog", str(exc), "set them in the server config ([mysqld] "
                        "log-bin, binlog-format = ROW, binlog-row-image = FULL, "
                        "binlog-row-metadata = FULL) and restart, or SET GLOBAL them")
            found.sql.append("-- the binlog settings above: in the server config, and now:")
            found.sql.extend(["SET GLOBAL binlog_format = 'ROW'",
                              "SET GLOBAL binlog_row_image = 'FULL'",
                              "SET GLOBAL binlog_row_metadata = 'FULL'"])
        if int(server_id) == 0:
            found.error("server_id", "the server's server_id is 0: it refuses replicas",
                        "server-id = 1 (any number the replicas do not use) in the "
                        "server config")
        elif int(server_id) == config.server_id:
            found.error("server_id", f"the URI's server_id={config.server_id} is the "
                        "server's own", "give the relay another server_id= in the URI")
        else:
            found.ok("server_id", f"server_id = {server_id}")
        with conn.cursor() as cur:
            _grants(found, cur, config, user, host, account)
        _tables(found, conn, config, account, databases)
    finally:
        conn.close()
    _watermark(found, config, uri, account)
    return found


def _grant_all(found: Inspection, config: BinlogSourceConfig, account: str,
               databases: list[str]) -> None:
    found.sql.append(f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO {account}"
                     "   -- MySQL: REPLICATION CLIENT instead of BINLOG MONITOR")
    found.sql.extend(f"GRANT SELECT ON {quote(db)}.* TO {account}" for db in databases)
    found.sql.extend(setup_statements(config))
    found.sql.append(_watermark_grant(config, account))


def _watermark_grant(config: BinlogSourceConfig, account: str) -> str:
    db, table = config.watermark_table
    return f"GRANT SELECT, INSERT, DELETE ON {quote(db)}.{quote(table)} TO {account}"


def _grants(found: Inspection, cur: Any, config: BinlogSourceConfig, user: str, host: str,
            account: str) -> None:
    have = _privileges(cur, user, host)
    missing = []
    if not have & _REPLICATION:
        missing.append("REPLICATION SLAVE")
    try:
        binary_logs(cur.connection, config)
    except DatabusError:
        missing.append("BINLOG MONITOR")
    if missing:
        found.error("grants", f"{account} lacks {' and '.join(missing)} (reading the "
                    "binlog)", f"GRANT {', '.join(missing)} ON *.* TO {account} "
                    "(MySQL: REPLICATION CLIENT for BINLOG MONITOR)")
        found.sql.append(f"GRANT {', '.join(missing)} ON *.* TO {account}"
                         + ("   -- MySQL: REPLICATION CLIENT" if "BINLOG MONITOR" in missing
                            else ""))
    else:
        found.ok("grants", f"{account} may read the binlog (REPLICATION SLAVE, "
                 "BINLOG MONITOR)")


def _tables(found: Inspection, conn: pymysql.Connection[Any], config: BinlogSourceConfig,
            account: str, databases: list[str]) -> None:
    hidden = sorted(unlisted_databases(conn, config, config.selector))
    for db in hidden:
        found.error("select", f"database {db} is not visible to {account}: it does not "
                    "exist, or the user has no privilege on it (dumps and the replica's "
                    "first copy read its rows)", f"GRANT SELECT ON {quote(db)}.* TO {account}")
        found.sql.append(f"GRANT SELECT ON {quote(db)}.* TO {account}")
    shapes = current_shapes(conn, config, config.selector)
    if not shapes and not hidden:
        found.error("tables", f"no table matches {config.selector.describe()}",
                    "create the tables, or correct the URI's database or tables=")
    listed = {(s.database, s.table) for s in shapes}
    for db, table in sorted(config.selector.tables - listed):
        if db not in hidden:
            found.error("tables", f"{db}.{table} does not exist, or {account} has no "
                        "privilege on it", f"create it, or GRANT SELECT ON {quote(db)}."
                        f"{quote(table)} TO {account}, or correct the URI's tables=")
    keyed = []
    for shape in shapes:
        name = shape.source_name
        if not shape.primary_key:
            found.error("primary_key", f"{name} has no primary key: its changes cannot be "
                        "keyed, dumped or replicated", f"ALTER TABLE {quote(shape.database)}."
                        f"{quote(shape.table)} ADD PRIMARY KEY (...), or leave it out of "
                        "the URI's tables=")
            continue
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT 1 FROM {quote(shape.database)}.{quote(shape.table)} "
                            "LIMIT 0")
        except pymysql.MySQLError:
            found.error("select", f"{account} cannot SELECT {name} (dumps read it)",
                        f"GRANT SELECT ON {quote(shape.database)}.* TO {account}")
            grant = f"GRANT SELECT ON {quote(shape.database)}.* TO {account}"
            if grant not in found.sql:
                found.sql.append(grant)
            continue
        keyed.append(name)
    if keyed:
        found.ok("tables", f"{len(keyed)} table(s) with a primary key: {', '.join(keyed)}")
    found.tables = keyed


def _watermark(found: Inspection, config: BinlogSourceConfig, uri: str,
               account: str) -> None:
    """The dump watermark table, checked as ``databus dump setup --check`` does."""
    source = MysqlDumpSource(config, FetcherContext("init", 0, _ScratchCatalog()))
    db, table = config.watermark_table
    try:
        source.check()
        found.ok("watermark", f"dump watermark table {db}.{table} exists and "
                 f"{account} can write it")
    except DatabusError as exc:
        found.error("watermark", str(exc))
        if "no watermark table" in str(exc):
            found.sql.extend(setup_statements(config))
        found.sql.append(_watermark_grant(config, account))
    finally:
        source.close()
