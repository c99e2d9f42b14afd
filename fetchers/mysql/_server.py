"""Talking to the server outside the replication stream: start-up checks, binlog
positions, information_schema, and turning driver errors into ``DatabusError``s.

Every message names the server as ``user@host:port`` and never contains the password
(the driver's own messages do not either; they are scrubbed all the same).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pymysql

from databus.errors import DatabusError, SourceError
from databus.fetchers.mysql import _dump_driver
from databus.fetchers.mysql._errors import ScnNotAvailableError, SourceMisconfiguredError
from databus.fetchers.mysql._schema import (
    INFORMATION_SCHEMA_COLUMNS,
    INFORMATION_SCHEMA_PRIMARY_KEYS,
    TableShape,
    shape_from_information_schema,
)
from databus.fetchers.mysql._scn import (
    FIRST_EVENT_POSITION,
    BinlogPosition,
    binlog_file_number,
    split_scn,
)
from databus.fetchers.mysql._uri import BinlogSourceConfig, TableSelector

__all__ = [
    "ServerInfo",
    "binary_logs",
    "check_server",
    "connect",
    "current_position",
    "current_shapes",
    "resolve_start",
    "source_error",
]

log = logging.getLogger("databus.fetchers.mysql")

# Driver error codes.
ER_DBACCESS_DENIED = 1044
ER_ACCESS_DENIED = 1045
ER_TABLEACCESS_DENIED = 1142
ER_SPECIFIC_ACCESS_DENIED = 1227
ER_MASTER_FATAL_READING_BINLOG = 1236
ER_UNKNOWN_SYSTEM_VARIABLE = 1193
ER_PARSE_ERROR = 1064
_LOST = {2003, 2006, 2013, 2055, 1053, 1927, 1040}  # unreachable, gone, shutting down, busy


def _scrub(text: str, config: BinlogSourceConfig) -> str:
    if len(config.password) >= 3:
        text = text.replace(config.password, "***")
    return text


def source_error(exc: BaseException, config: BinlogSourceConfig, action: str) -> DatabusError:
    """A ``DatabusError`` for a driver (or socket) error met while doing ``action``.

    Credentials, privileges and missing binlogs are not retriable; everything else (a
    server restarting, a network blip) is.
    """
    if isinstance(exc, DatabusError):
        return exc
    where = config.address
    driver = isinstance(exc, (pymysql.MySQLError, *_dump_driver.driver_errors()))
    code = exc.args[0] if driver and exc.args else None
    said = _scrub(str(exc.args[1] if driver and len(exc.args) > 1 else exc), config)
    if code == ER_ACCESS_DENIED:
        return SourceMisconfiguredError(
            f"{action}: access denied for {where}: check the user and password of the "
            f"source URI (server said: {said})"
        )
    if code in (ER_SPECIFIC_ACCESS_DENIED, ER_DBACCESS_DENIED, ER_TABLEACCESS_DENIED):
        return SourceMisconfiguredError(
            f"{action}: {where} lacks a privilege (server said: {said}). A binlog reader "
            "needs REPLICATION SLAVE (MariaDB >= 10.5 also calls it REPLICATION REPLICA) and "
            "BINLOG MONITOR (MySQL: REPLICATION CLIENT), e.g. GRANT REPLICATION SLAVE, "
            "BINLOG MONITOR ON *.* TO ..."
        )
    if code == ER_MASTER_FATAL_READING_BINLOG:
        return ScnNotAvailableError(
            f"{action}: {where} cannot send the binlog from the requested position "
            f"(server said: {said}). The relay cannot resume without a gap: seed its "
            "buffer at the server's current position (move the buffer file away) and let "
            "consumers with older checkpoints bootstrap"
        )
    if code in _LOST or isinstance(exc, (OSError, socket.timeout, pymysql.err.InterfaceError,
                                         *_dump_driver.interface_errors())):
        return SourceError(f"{action}: lost or no connection to {where}: {said}")
    return SourceError(f"{action}: {where}: {type(exc).__name__}: {said}")


def connect(config: BinlogSourceConfig, action: str = "connecting") -> pymysql.Connection[Any]:
    """A control connection (autocommit, plain cursors)."""
    try:
        return pymysql.connect(autocommit=True, **config.connect_kwargs())
    except Exception as exc:
        raise source_error(exc, config, action) from None


@contextmanager
def _cursor(conn: pymysql.Connection[Any], config: BinlogSourceConfig,
            action: str) -> Iterator[Any]:
    try:
        with conn.cursor() as cur:
            yield cur
    except DatabusError:
        raise
    except Exception as exc:
        raise source_error(exc, config, action) from None


# The public name (spark_jobs and the dump source use it).
source_cursor = _cursor


@dataclass(frozen=True, slots=True)
class ServerInfo:
    version: str
    mariadb: bool


def _variables(conn: pymysql.Connection[Any], config: BinlogSourceConfig,
               names: list[str]) -> dict[str, str]:
    with _cursor(conn, config, "reading server variables") as cur:
        cur.execute(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ("
            + ", ".join(["%s"] * len(names)) + ")",
            names,
        )
        return {str(k).lower(): str(v) for k, v in cur.fetchall()}


def check_server(conn: pymysql.Connection[Any], config: BinlogSourceConfig) -> ServerInfo:
    """Refuse to start on a server whose binlog cannot be captured faithfully.

    Raises ``SourceMisconfiguredError`` (not retriable) naming what to change.
    """
    names = ["log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata",
             "version", "log_bin_compress", "binlog_transaction_compression"]
    found = _variables(conn, config, names)
    version = found.get("version", "?")
    mariadb = "mariadb" in version.lower()
    where = config.address
    problems = []
    if found.get("log_bin", "OFF").upper() not in ("ON", "1"):
        problems.append("binary logging is off (start the server with --log-bin)")
    expected = {"binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
    for name, want in expected.items():
        have = found.get(name)
        if have is None:
            problems.append(
                f"the server has no {name} (needs MariaDB >= 10.5 or MySQL >= 8.0.14)"
            )
        elif have.upper() != want:
            problems.append(f"{name} is {have}, needs {want} (SET GLOBAL {name} = '{want}' "
                            "and in the server config)")
    for name in ("log_bin_compress", "binlog_transaction_compression"):
        if found.get(name, "OFF").upper() in ("ON", "1"):
            problems.append(f"{name} is ON: compressed row events cannot be read, turn it off")
    if problems:
        raise SourceMisconfiguredError(
            f"cannot capture {where} ({version}): " + "; ".join(problems)
            + ". Row images, all columns and their names are what the fetcher reads."
        )
    return ServerInfo(version, mariadb)


def binary_logs(conn: pymysql.Connection[Any], config: BinlogSourceConfig) -> list[tuple[str, int]]:
    """``SHOW BINARY LOGS``: (file name, size), oldest first."""
    with _cursor(conn, config, "listing binary logs (SHOW BINARY LOGS)") as cur:
        cur.execute("SHOW BINARY LOGS")
        return [(str(row[0]), int(row[1])) for row in cur.fetchall()]


def current_position(conn: pymysql.Connection[Any], config: BinlogSourceConfig) -> BinlogPosition:
    """Where the server's binlog ends now (``SHOW MASTER STATUS``)."""
    with _cursor(conn, config, "reading the binlog position (SHOW MASTER STATUS)") as cur:
        try:
            cur.execute("SHOW MASTER STATUS")
        except pymysql.err.ProgrammingError as exc:
            # MySQL 8.4 dropped the old name.
            if not exc.args or exc.args[0] != ER_PARSE_ERROR:
                raise
            cur.execute("SHOW BINARY LOG STATUS")
        row = cur.fetchone()
    if row is None:
        raise SourceMisconfiguredError(
            f"{config.address} has binary logging off (start the server with --log-bin)"
        )
    return BinlogPosition(str(row[0]), int(row[1]))


def resolve_start(conn: pymysql.Connection[Any], config: BinlogSourceConfig,
                  scn: int) -> BinlogPosition:
    """The binlog position just after SCN ``scn``; ``ScnNotAvailableError`` when the
    server no longer (or never) had it."""
    number, position = split_scn(scn)
    logs = binary_logs(conn, config)
    files = {}
    for name, size in logs:
        try:
            files[binlog_file_number(name)] = (name, size)
        except ValueError:
            continue
    where = config.address
    remedy = ("The relay cannot resume without a gap: seed its buffer at the server's "
              "current position (move the buffer file away) and let consumers with older "
              "checkpoints bootstrap")
    if not files:
        raise ScnNotAvailableError(f"{where} lists no binary logs. {remedy}")
    if number in files:
        name, size = files[number]
        if position > size:
            raise ScnNotAvailableError(
                f"SCN {scn} points at {name}:{position}, past the end of that file "
                f"({size} bytes) on {where}: the binlog was reset or this is another "
                f"server. {remedy}"
            )
        return BinlogPosition(name, max(position, FIRST_EVENT_POSITION))
    oldest, newest = min(files), max(files)
    if number < oldest:
        raise ScnNotAvailableError(
            f"SCN {scn} is in binlog file number {number}, which {where} has purged "
            f"(its oldest is {files[oldest][0]}). {remedy}"
        )
    if number > newest:
        raise ScnNotAvailableError(
            f"SCN {scn} is in binlog file number {number}, newer than anything {where} has "
            f"(newest: {files[newest][0]}): was the binlog reset (RESET MASTER), or is this "
            f"another server? {remedy}"
        )
    raise ScnNotAvailableError(f"binlog file number {number} of SCN {scn} is missing on "
                               f"{where}. {remedy}")


def unlisted_databases(conn: pymysql.Connection[Any], config: BinlogSourceConfig,
                       selector: TableSelector) -> frozenset[str]:
    """The databases ``selector`` names that information_schema does not list to this
    user: it has no privilege on them (a relay user with only the binlog grants sees
    none) or they do not exist. Their tables are captured from their first change all
    the same, but cannot be listed before it (docs/binlog-fetcher.md, "Privileges")."""
    schemas = selector.schemas()
    if not schemas:
        return frozenset()  # every database (nothing named to check) or none
    with _cursor(conn, config, "reading information_schema") as cur:
        cur.execute("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME IN ("
                    + ", ".join(["%s"] * len(schemas)) + ")", schemas)
        listed = {str(row[0]) for row in cur.fetchall()}
    return frozenset(schemas) - listed


def current_shapes(conn: pymysql.Connection[Any], config: BinlogSourceConfig,
                   selector: TableSelector) -> list[TableShape]:
    """Today's layout of every captured base table, from information_schema."""
    schemas = selector.schemas()
    where = ""
    params: list[str] = []
    if schemas is not None:
        if not schemas:
            return []
        where = " WHERE TABLE_SCHEMA IN (" + ", ".join(["%s"] * len(schemas)) + ")"
        params = list(schemas)
    with _cursor(conn, config, "reading information_schema") as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES"
            + (where + " AND" if where else " WHERE") + " TABLE_TYPE = 'BASE TABLE'",
            params,
        )
        # The dump watermark table is never a source, whatever the selector matches.
        tables = {(str(db), str(t)) for db, t in cur.fetchall()
                  if selector.matches(str(db), str(t))
                  and (str(db), str(t)) != config.watermark_table}
        if not tables:
            return []
        cur.execute(INFORMATION_SCHEMA_COLUMNS + where
                    + " ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION", params)
        columns: dict[tuple[str, str], list[Any]] = {}
        for row in cur.fetchall():
            key = (str(row[0]), str(row[1]))
            if key in tables:
                columns.setdefault(key, []).append(row[2:])
        cur.execute(INFORMATION_SCHEMA_PRIMARY_KEYS
                    + (where.replace(" WHERE", " AND") if where else "")
                    + " ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION", params)
        keys: dict[tuple[str, str], list[str]] = {}
        for db, table, column in cur.fetchall():
            keys.setdefault((str(db), str(table)), []).append(str(column))
    shapes = []
    for db, table in sorted(tables):
        shape = shape_from_information_schema(db, table, columns.get((db, table), []),
                                              keys.get((db, table), []))
        if shape is not None:
            shapes.append(shape)
        else:
            log.info("table %s.%s: a column type needs the binlog to be mapped; its schema "
                     "is registered when its first row arrives", db, table)
    return shapes
