"""The MariaDB/MySQL target (pymysql): ``mysql://user:pw@host:port/db`` (or
``mariadb://``), with optional ``?unix_socket=``, ``connect_timeout_s=``,
``read_timeout_s=``.

The database in the path is required: the state table lives there, and a table map
without a schema goes there. Session settings at every connect (the type mapping
relies on them, ``databus.replicator._types.MYSQL_SESSION_SQL``): utf8mb4; ``time_zone
= '+00:00'`` (a TIMESTAMP column of a table the replicator did not create would
otherwise shift every value by the server's offset); a strict ``sql_mode`` (a value
that does not fit is an error, never a truncation), with ``ALLOW_INVALID_DATES``
(MySQL sources send zero dates) and ``NO_AUTO_VALUE_ON_ZERO`` (a key 0 into an
AUTO_INCREMENT column stays 0).

Tables are created InnoDB, utf8mb4 with a binary, no-pad collation where the server
has one: a case-insensitive (or trailing-space-blind) key would merge two source rows
whose keys differ only in case into one target row.

Upserts: multi-row ``INSERT ... ON DUPLICATE KEY UPDATE``, the rows escaped by the
driver and packed into statements of at most ``max_statement_bytes`` (and never more
than the server's ``max_allowed_packet``: a row larger than that is refused with its
key rather than sent, since the server answers an oversized packet by closing the
connection, which would look like an outage and be retried forever).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlsplit

import pymysql
import pymysql.converters

from databus._ddl import mysql_lock_name
from databus._redact import split_password
from databus.errors import ConfigError
from databus.replicator._model import Dialect
from databus.replicator._types import MYSQL_SESSION_SQL
from databus.replicator.targets._base import Refused, SqlTarget, TableWork, first_line
from databus.replicator.targets._sql import SqlDialect, dialect_sql

__all__ = ["SESSION_SQL", "MysqlTarget"]

# The session the type mapping's values rely on (one definition, in _types).
SESSION_SQL: tuple[str, ...] = MYSQL_SESSION_SQL

# Server error codes after which the same statement may succeed: the connection went
# (2002/2003 cannot connect, 2006 gone away, 2013 lost, 2055, 1927 killed, 4031 idle
# timeout), the server is stopping or full of connections (1053, 1040), the transaction
# lost a lock race (1205 lock wait timeout, 1213 deadlock), the disk is full (1021).
_RETRIABLE_CODES = frozenset({1021, 1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013,
                              2055, 4031})
# At connect: bad credentials, no such database, no access: no retry will fix them.
_CONNECT_REFUSALS = frozenset({1044, 1045, 1049, 1698})
# Binary, no-pad collations first (MariaDB, MySQL 8), then the binary pad-space one.
_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin")
# Room for the packet header and the statement around the rows.
_PACKET_MARGIN = 1024


def _escape_datetime(value: dt.datetime, mapping: Any = None) -> str:
    """A datetime literal; an aware one as its UTC wall time (the session's zone), never
    with an offset MySQL would reject or ignore."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return str(pymysql.converters.escape_datetime(value, mapping))


class MysqlTarget(SqlTarget):
    dialect: Dialect = "mysql"
    sql: ClassVar[SqlDialect] = dialect_sql("mysql")
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (pymysql.err.MySQLError,)

    def __init__(self, url: str, *, max_statement_bytes: int = 4 << 20) -> None:
        super().__init__(url)
        url_without_password, password = split_password(url)
        try:
            parts = urlsplit(url_without_password)
            port = parts.port or 3306
        except ValueError:
            raise ConfigError(f"malformed MySQL target URL {self.where} (a bad port, or a "
                              "password holding an unencoded / ? or #)") from None
        database = unquote(parts.path).strip("/")
        if not database:
            raise ConfigError(f"MySQL target {self.where}: name the database in the path "
                              "(mysql://user:pw@host:3306/db): the state table lives there")
        params = dict(parse_qsl(parts.query))
        try:
            connect_timeout = int(params.pop("connect_timeout_s", "10"))
            # A statement is answered or the connection is deemed lost after this long
            # (a merge of a batch takes seconds; an ALTER TABLE on a big table longer).
            read_timeout = int(params.pop("read_timeout_s", "3600"))
        except ValueError:
            raise ConfigError(f"MySQL target {self.where}: timeouts are whole seconds") \
                from None
        unix_socket = params.pop("unix_socket", None)
        if params:
            raise ConfigError(f"MySQL target {self.where}: unknown parameters "
                              f"{', '.join(sorted(params))}")
        self.default_schema = database
        self._connect_kwargs: dict[str, Any] = {
            "host": parts.hostname or "127.0.0.1", "port": port,
            "user": unquote(parts.username or ""), "password": password or "",
            "database": database, "charset": "utf8mb4", "autocommit": False,
            "connect_timeout": connect_timeout, "read_timeout": read_timeout,
            "write_timeout": read_timeout, "local_infile": False,
        }
        if unix_socket:
            self._connect_kwargs["unix_socket"] = unix_socket
        self.max_statement_bytes = max_statement_bytes
        self._max_packet = 0
        self._collation: str | None = None

    def _connect(self) -> Any:
        conn = pymysql.connect(**self._connect_kwargs)
        try:
            # The connection's own copy: no other pymysql user of the process sees it.
            conn.encoders = dict(conn.encoders)
            conn.encoders[dt.datetime] = _escape_datetime
            with conn.cursor() as cur:
                for statement in SESSION_SQL:
                    cur.execute(statement)
                cur.execute("SELECT @@max_allowed_packet")
                self._max_packet = int(cur.fetchone()[0])
            conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    def _retriable(self, exc: BaseException) -> bool:
        if isinstance(exc, pymysql.err.InterfaceError):
            return True  # the connection is closed
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        return code in _RETRIABLE_CODES

    def _try_lock(self, conn: Any, name: str) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (mysql_lock_name(name),))
            row = cur.fetchone()
        return row is not None and row[0] == 1

    def _connect_retriable(self, exc: BaseException) -> bool:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        return code not in _CONNECT_REFUSALS

    def _describe(self, exc: BaseException) -> str:
        # pymysql's str() is the tuple "(1406, \"Data too long ...\")".
        if len(exc.args) == 2 and isinstance(exc.args[0], int):
            return first_line(Exception(f"{exc.args[1]} (error {exc.args[0]})"))
        return first_line(exc)

    # -- catalog ---------------------------------------------------------------------------

    def _table_exists(self, cur: Any, schema: str | None, table: str) -> bool:
        cur.execute("SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s"
                    " AND TABLE_NAME = %s AND TABLE_TYPE = 'BASE TABLE'", (schema, table))
        return cur.fetchone() is not None

    def _table_columns(self, cur: Any, schema: str | None,
                       table: str) -> list[tuple[str, str, bool]]:
        cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM "
                    "information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
                    " ORDER BY ORDINAL_POSITION", (schema, table))
        return [(_text(name), _text(type_), _text(nullable) == "YES")
                for name, type_, nullable in cur.fetchall()]

    def _table_key(self, cur: Any, schema: str | None, table: str) -> tuple[str, ...]:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE"
                    " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
                    " AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
                    (schema, table))
        return tuple(_text(name) for (name,) in cur.fetchall())

    def _ensure_schema(self, cur: Any, schema: str | None) -> None:
        if not schema or schema == self.default_schema:
            return
        cur.execute("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
                    (schema,))
        if cur.fetchone() is None:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {self.sql.ident(schema)}", ())

    def _table_suffix(self, cur: Any) -> str:
        if self._collation is None:
            cur.execute("SELECT COLLATION_NAME FROM information_schema.COLLATIONS"
                        " WHERE COLLATION_NAME IN (%s, %s, %s)", _COLLATIONS)
            have = {_text(name) for (name,) in cur.fetchall()}
            self._collation = next((c for c in _COLLATIONS if c in have), "utf8mb4_bin")
        return f" ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={self._collation}"

    # -- rows --------------------------------------------------------------------------------

    def _upsert(self, cur: Any, work: TableWork) -> None:
        t = work.table
        raw_name = self.sql.qualified(self._schema_of(t), t.table, raw=True)
        names = self.sql.columns([c.target for c in t.columns], raw=True)
        # Sent without parameters (the rows are literals already): raw identifiers.
        head = f"INSERT INTO {raw_name} ({names}) VALUES ".encode()
        tail = self.sql.upsert_tail(t, raw=True).encode()
        packet = self._max_packet - _PACKET_MARGIN - len(head) - len(tail)
        limit = min(self.max_statement_bytes, packet)
        # The driver's own escaping, per value (bytes as X'..', aware datetimes through
        # _escape_datetime), and its encoding of a query: strict UTF-8, so a str with
        # a lone surrogate fails here as it would in the driver.
        escape = self._conn.escape
        chunk: list[bytes] = []
        size = 0
        for change in work.upserts:
            assert change.row is not None
            row = ("(" + ",".join([escape(v) for v in change.row]) + ")").encode("utf-8")
            if len(row) > packet:
                raise Refused(work, change, f"a row of {len(row)} bytes: the target's "
                              f"max_allowed_packet is {self._max_packet}")
            if chunk and size + len(row) + 1 > limit:
                cur.execute(head + b",".join(chunk) + tail)
                chunk, size = [], 0
            chunk.append(row)
            size += len(row) + 1
        if chunk:
            cur.execute(head + b",".join(chunk) + tail)


def _text(value: Any) -> str:
    # information_schema columns come back as str, or bytes on some server versions.
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)
