"""The PostgreSQL target (psycopg2): ``postgresql://user:pw@host:port/db[?schema=s]``.

``?schema=`` names the default schema (``public`` otherwise): where the state table
lives and where a table map without a schema goes. Other query parameters go to libpq
as they are (``sslmode``, ...). The session runs in UTC (``TimeZone``), so a value for
a ``timestamp`` column never depends on the server's zone.

Upserts of a table: a temporary staging table with the replicated columns of the
target table (their exact types: ``CREATE TEMP TABLE ... AS SELECT ... WITH NO DATA``),
loaded with ``COPY`` (binary format, ``_pgcopy.py``: encoders chosen by the staging
table's column types; text format when a column type or a value has no binary
encoder), then merged with ``INSERT ... SELECT ... ON CONFLICT (key)
DO UPDATE``. A staging table lives as long as the session (``ON COMMIT DELETE ROWS``
empties it) rather than one per batch: creating and dropping tables at every batch
churns the system catalogs. It is made again after a rollback (which may have undone
its creation), a reconnect or DDL on its table.

COPY's text format is written here for the types the type mapping produces (None,
bool, int, float, Decimal, str, bytes, date/time/datetime, timedelta, UUID); a table
whose rows hold any other Python type (a list for an array, a psycopg2 ``Json``) is
loaded into its staging table with ``execute_values`` instead, which adapts any value
psycopg2 can send. Deletes: ``DELETE ... WHERE key IN (...)`` in chunks.
"""

from __future__ import annotations

import datetime as dt
import io
import math
import re
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from databus._ddl import ddl_lock_key
from databus._redact import split_password
from databus.errors import ConfigError
from databus.replicator._model import Dialect
from databus.replicator.targets._base import SqlTarget, StraightRefused, TableWork
from databus.replicator.targets._pgcopy import Encoders, binary_encoders, copy_binary
from databus.replicator.targets._sql import SqlDialect, dialect_sql

__all__ = ["PostgresTarget", "copy_text"]

# libpq's own failures at connect that no retry will fix.
_CONNECT_REFUSALS = ("password authentication failed", "no pg_hba.conf entry",
                     "does not exist", "permission denied", "authentication failed",
                     "invalid dsn", "invalid connection option", "invalid sslmode")

# -- COPY text format ------------------------------------------------------------------------

_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NEEDS_ESCAPE = re.compile(r"[\\\t\n\r]")


def _copy_str(value: str) -> str:
    # The search first: most text has nothing to escape, and translate() walks every
    # character through a dict.
    return value.translate(_ESCAPES) if _NEEDS_ESCAPE.search(value) else value


def _copy_float(value: float) -> str:
    if math.isfinite(value):
        return repr(value)  # repr is exact (shortest round-trip) for a float8
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _copy_bytes(value: bytes | bytearray | memoryview) -> str:
    # bytea's hex input "\x..."; the backslash itself escaped for COPY's text format.
    return "\\\\x" + bytes(value).hex()


def _copy_datetime(value: dt.datetime) -> str:
    # An aware value in UTC, as psycopg2 would send it into a session in UTC: into a
    # timestamptz the same instant; into a timestamp (which drops an offset as it
    # reads one) the UTC wall time, as psycopg2's timestamptz -> timestamp cast gives.
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    return value.isoformat(" ")


def _copy_timedelta(value: dt.timedelta) -> str:
    return f"{value.days} days {value.seconds}.{value.microseconds:06d} seconds"


_COPY_FORMAT: dict[type, Callable[[Any], str]] = {
    str: _copy_str,
    int: int.__repr__,
    bool: lambda v: "t" if v else "f",
    float: _copy_float,
    Decimal: str,
    bytes: _copy_bytes,
    bytearray: _copy_bytes,
    memoryview: _copy_bytes,
    dt.datetime: _copy_datetime,
    dt.date: dt.date.isoformat,
    dt.time: dt.time.isoformat,
    dt.timedelta: _copy_timedelta,
    uuid.UUID: str,
}


def copy_text(rows: Sequence[Sequence[Any]]) -> str | None:
    """``rows`` in COPY's text format (tab-separated, ``\\N`` for NULL, one line a row),
    or None when a value's type is not one written here (by exact type: an ``IntEnum``
    or a ``str`` subclass goes through the driver's adaptation instead)."""
    fmt = _COPY_FORMAT
    try:
        lines = ["\t".join(["\\N" if v is None else fmt[type(v)](v) for v in row])
                 for row in rows]
    except KeyError:
        return None
    lines.append("")
    return "\n".join(lines)


class PostgresTarget(SqlTarget):
    dialect: Dialect = "postgresql"
    sql: ClassVar[SqlDialect] = dialect_sql("postgresql")
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (psycopg2.Error,)
    delete_chunk: ClassVar[int] = 1000
    straight_copy: ClassVar[bool] = True

    def __init__(self, url: str, *, connect_timeout: float = 10.0) -> None:
        super().__init__(url)
        # libpq gets the password as its own argument, never inside the URL: a parser
        # that chokes on an unencoded '%' or '@' in it would quote it in its error.
        url_without_password, self._password = split_password(url)
        try:
            parts = urlsplit(url_without_password)
            query = dict(parse_qsl(parts.query))
        except ValueError:
            raise ConfigError(f"malformed PostgreSQL target URL {self.where}") from None
        self.default_schema = query.pop("schema", "public") or "public"
        self._dsn = urlunsplit(parts._replace(query=urlencode(query)))
        self._connect_timeout = max(1, round(connect_timeout))
        # source name -> (staging table, what it was made for: target and columns,
        # the binary COPY encoders of its columns or None: text format).
        self._staging: dict[str, tuple[str, tuple[Any, ...], Encoders | None]] = {}
        self._stage_ids: dict[str, int] = {}
        # source name -> (what it was made for, the binary COPY encoders of the target
        # table's columns): for straight copies (Batch.straight).
        self._direct: dict[str, tuple[tuple[Any, ...], Encoders | None]] = {}

    def _connect(self) -> Any:
        kwargs: dict[str, Any] = {} if self._password is None else {"password": self._password}
        conn = psycopg2.connect(
            self._dsn, connect_timeout=self._connect_timeout,
            application_name="databus-replicator",
            options="-c TimeZone=UTC -c client_encoding=UTF8",
            keepalives=1, keepalives_idle=10, keepalives_interval=3, keepalives_count=3,
            **kwargs)
        conn.autocommit = False
        return conn

    def _retriable(self, exc: BaseException) -> bool:
        # OperationalError covers a lost connection and the server's "try later"
        # classes: 08 connection, 40 deadlock/serialization, 53 out of disk or
        # connections, 55P03 lock timeout, 57 shutdown or cancel, 58 I/O.
        if isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError):
            return True
        return self._conn is not None and bool(self._conn.closed)

    def _try_lock(self, conn: Any, name: str) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", (ddl_lock_key(name),))
            held = bool(cur.fetchone()[0])
        conn.commit()  # a session lock: it outlives the transaction
        return held

    def _connect_retriable(self, exc: BaseException) -> bool:
        text = str(exc).lower()
        return not any(refusal in text for refusal in _CONNECT_REFUSALS)

    def _after_rollback(self) -> None:
        self._staging.clear()

    def _after_ddl(self) -> None:
        self._staging.clear()
        self._direct.clear()

    # -- catalog ---------------------------------------------------------------------------

    def _table_exists(self, cur: Any, schema: str | None, table: str) -> bool:
        cur.execute(
            "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (schema, table))
        return cur.fetchone() is not None

    def _table_columns(self, cur: Any, schema: str | None,
                       table: str) -> list[tuple[str, str, bool]]:
        cur.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')"
            " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (schema, table))
        return [(str(name), str(type_), bool(nullable))
                for name, type_, nullable in cur.fetchall()]

    def _table_key(self, cur: Any, schema: str | None, table: str) -> tuple[str, ...]:
        cur.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY (i.indkey)"
            " WHERE n.nspname = %s AND c.relname = %s AND i.indisprimary"
            " ORDER BY array_position(i.indkey::int2[], a.attnum)",
            (schema, table))
        return tuple(str(name) for (name,) in cur.fetchall())

    def _ensure_schema(self, cur: Any, schema: str | None) -> None:
        if not schema:
            return
        cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        if cur.fetchone() is None:
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {self.sql.ident(schema)}", ())

    # -- rows --------------------------------------------------------------------------------

    def _stage(self, cur: Any, work: TableWork) -> tuple[str, Encoders | None]:
        """The staging table of ``work``'s source (unquoted name, in pg_temp), made
        now if there is none for this target table and these columns, and the binary
        COPY encoders of its columns (None: a type without one, text format)."""
        t = work.table
        made_for = (work.qname, tuple((c.target, c.target_type) for c in t.columns))
        known = self._staging.get(work.source)
        if known is not None and known[1] == made_for:
            return known[0], known[2]
        # One per source, not per target table: two sources into one table each stage
        # their own rows.
        name = f"databus_stage_{self._stage_ids.setdefault(work.source, len(self._stage_ids))}"
        cols = self.sql.columns([c.target for c in t.columns])
        cur.execute(f"DROP TABLE IF EXISTS pg_temp.{name}", ())
        cur.execute(f"CREATE TEMP TABLE {name} ON COMMIT DELETE ROWS AS "
                    f"SELECT {cols} FROM {work.qname} WITH NO DATA", ())
        # Its columns' own types (those of the target table: binary input must match).
        cur.execute("SELECT t.typname FROM pg_attribute a JOIN pg_type t"
                    " ON t.oid = a.atttypid WHERE a.attrelid = %s::regclass"
                    " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                    (f"pg_temp.{name}",))
        encoders = binary_encoders([str(typname) for (typname,) in cur.fetchall()])
        self._staging[work.source] = (name, made_for, encoders)
        return name, encoders

    def _copy_rows(self, cur: Any, table: str, names: list[str],
                   rows: list[tuple[Any, ...]], encoders: Encoders | None) -> bool:
        """COPY ``rows`` into ``table`` (quoted): binary when every value has an
        encoder, else text; False when neither format can carry them (the caller
        inserts them with the driver's adaptation)."""
        columns = self.sql.columns(names, raw=True)
        data = copy_binary(rows, encoders) if encoders is not None else None
        if data is not None:
            cur.copy_expert(f"COPY {table} ({columns}) FROM STDIN (FORMAT binary)",
                            io.BytesIO(data), size=1 << 18)
            return True
        text = copy_text(rows)
        if text is None:
            return False
        cur.copy_expert(f"COPY {table} ({columns}) FROM STDIN",
                        io.BytesIO(text.encode("utf-8")), size=1 << 18)
        return True

    def _table_encoders(self, cur: Any, work: TableWork) -> Encoders | None:
        """The binary COPY encoders of the target table's columns of ``work``."""
        t = work.table
        made_for = (work.qname, tuple((c.target, c.target_type) for c in t.columns))
        known = self._direct.get(work.source)
        if known is not None and known[0] == made_for:
            return known[1]
        cur.execute("SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t"
                    " ON t.oid = a.atttypid WHERE a.attrelid = %s::regclass"
                    " AND a.attnum > 0 AND NOT a.attisdropped",
                    (self.sql.qualified(self._schema_of(t), t.table, raw=True),))
        types = {str(name): str(typname) for name, typname in cur.fetchall()}
        encoders = (binary_encoders([types[c.target] for c in t.columns])
                    if all(c.target in types for c in t.columns) else None)
        self._direct[work.source] = (made_for, encoders)
        return encoders

    def _upsert(self, cur: Any, work: TableWork) -> None:
        t = work.table
        names = [c.target for c in t.columns]
        rows = [c.row for c in work.upserts if c.row is not None]
        if work.straight:
            # An initial copy into a table that was empty when it began: straight in.
            # A key the table holds already fails the COPY (its primary key), and the
            # batch is applied again with the merge (SqlTarget.apply).
            table = self.sql.qualified(self._schema_of(t), t.table, raw=True)
            try:
                if self._copy_rows(cur, table, names, rows, self._table_encoders(cur, work)):
                    return
            except psycopg2.errors.UniqueViolation:
                raise StraightRefused(work.source) from None
        stage, encoders = self._stage(cur, work)
        if not self._copy_rows(cur, f"pg_temp.{stage}", names, rows, encoders):
            psycopg2.extras.execute_values(
                cur, f"INSERT INTO pg_temp.{stage} ({self.sql.columns(names)}) VALUES %s",
                rows, page_size=1000)
        cols = self.sql.columns(names)
        cur.execute(f"INSERT INTO {work.qname} ({cols}) SELECT {cols} FROM pg_temp.{stage}"
                    + self.sql.upsert_tail(t), ())
