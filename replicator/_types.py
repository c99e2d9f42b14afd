"""The type mapping: a source column's Avro type -> the target column type, and a decoded
value -> the parameter the target's driver takes (pure, no I/O).

``docs/replicator.md`` ("Type mapping") has the table, one row per source column type of
both fetchers, with the traps. The decisions in short:

- **Nothing is lost silently.** Every type maps to a column that holds every value the
  source can send, exactly, or the type is *unmappable* (``unmappable`` says why, and
  ``assess`` reports it) or the one value that does not fit makes its converter raise
  ``ValueError`` (the replicator stops naming the key and SCN). The one documented loss:
  PostgreSQL has no zero or invalid dates, so MySQL's ``0000-00-00``/``2021-02-31``
  become NULL there (``nullable`` then says the target column must allow NULL).
- **Time zones never depend on a session.** An instant (``timestamp-micros``) goes to
  PostgreSQL as an aware ``datetime`` into ``timestamp with time zone``; to MySQL as a
  naive UTC ``datetime`` into ``DATETIME(6)``, never ``TIMESTAMP`` (whose values the
  session ``time_zone`` shifts, whose range ends in 2038, and whose first column may get
  an implicit ``ON UPDATE CURRENT_TIMESTAMP``); to SQLite as ISO text with ``+00:00``.
- **Exact numbers.** ``decimal(p, s)`` -> ``numeric(p,s)`` / ``DECIMAL(p,s)`` / TEXT
  (SQLite's NUMERIC affinity would turn ``1.10`` into the REAL 1.1).
- **Hints.** The Avro type alone cannot tell MySQL's TIME (a ``long`` of microseconds)
  from a BIGINT, nor JSON from text. A field's ``sql_type`` attribute (the TxLog fetcher
  writes one; pass ``field.get("sql_type")``) refines the mapping: ``json``/``jsonb``,
  ``numeric``/``NUMBER``/``FLOAT`` carried as text, ``time`` on a ``long`` (a duration),
  ``set(...)``/``enum(...)`` (kept as such on a MySQL target), and a length
  (``varchar(40)``) used where MySQL needs one: key columns.

PostgreSQL types are spelled as ``format_type()`` prints them (``numeric(10,2)``,
``timestamp with time zone``), so a table the replicator created can be compared with
the catalog as is.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from databus.replicator._classify import (
    DATELIKE,
    Col,
    Kind,
    UnmappableTypeError,
    classify,
    decimal_bounds,
)
from databus.replicator._model import Dialect

__all__ = [
    "MYSQL_KEY_CHARS",
    "MYSQL_SESSION_SQL",
    "Converter",
    "UnmappableTypeError",
    "column_type",
    "converter",
    "is_identity",
    "nullable",
    "unmappable",
]

Converter = Callable[[Any], Any]

UTC = dt.UTC

# A MySQL key column cannot be TEXT/BLOB (no index without a prefix length): string and
# bytes keys become VARCHAR/VARBINARY of this length unless the source says otherwise.
MYSQL_KEY_CHARS = 255
# InnoDB indexes at most 3072 bytes per column: 768 utf8mb4 characters.
_MYSQL_INDEX_BYTES = 3072
_MYSQL_MAX_PRECISION = 65
_MYSQL_MAX_SCALE = 30  # MySQL's limit; MariaDB allows 38, the portable bound is 30
_PG_MAX_PRECISION = 1000

MYSQL_SESSION_SQL: tuple[str, ...] = (
    # Every text value is sent and read as utf8mb4 (4-byte characters included).
    "SET NAMES utf8mb4",
    # DATETIME ignores the session zone, but NOW(), TIMESTAMP columns of tables the
    # replicator did not create, and anyone reading the state table do not: UTC always.
    "SET time_zone = '+00:00'",
    # Strict: a value that does not fit is an error, never a silent truncation or a
    # zero. No NO_ZERO_DATE/NO_ZERO_IN_DATE and ALLOW_INVALID_DATES: MySQL sources send
    # 0000-00-00 and 2021-02-31, and a MySQL target keeps them as they were.
    # NO_AUTO_VALUE_ON_ZERO: a key 0 into an existing AUTO_INCREMENT column stays 0.
    # Not NO_BACKSLASH_ESCAPES: pymysql escapes with backslashes.
    "SET sql_mode = 'STRICT_ALL_TABLES,ALLOW_INVALID_DATES,NO_AUTO_VALUE_ON_ZERO,"
    "NO_ENGINE_SUBSTITUTION'",
)
"""Statements a MySQL/MariaDB target session runs first: the mapping relies on them."""




# -- column types ---------------------------------------------------------------------

_MYSQL_TEXT = "LONGTEXT CHARACTER SET utf8mb4"
# Keys compare byte for byte (utf8mb4_bin): under the default case-insensitive collation
# 'a' and 'A' would be one key and two source rows one target row.
_MYSQL_KEY_TEXT = "VARCHAR({n}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"

_FIXED: dict[Kind, tuple[str, str, str]] = {
    # kind: (postgresql, mysql, sqlite)
    Kind.INT: ("integer", "INT", "INTEGER"),
    Kind.LONG: ("bigint", "BIGINT", "INTEGER"),
    Kind.BOOL: ("boolean", "BOOLEAN", "INTEGER"),
    # MySQL: DOUBLE, not FLOAT: MariaDB sends FLOAT values as text rounded to 6 digits;
    # a single-precision value is exact in a DOUBLE.
    Kind.FLOAT: ("real", "DOUBLE", "REAL"),
    Kind.DOUBLE: ("double precision", "DOUBLE", "REAL"),
    Kind.NUMERIC_TEXT: ("numeric", _MYSQL_TEXT, "TEXT"),
    Kind.DATE: ("date", "DATE", "TEXT"),
    Kind.LOCAL_TIMESTAMP: ("timestamp without time zone", "DATETIME(6)", "TEXT"),
    Kind.TIMESTAMP: ("timestamp with time zone", "DATETIME(6)", "TEXT"),
    Kind.TIME: ("time without time zone", "TIME(6)", "TEXT"),
    # MySQL's TIME is a duration already (-838:59:59 .. 838:59:59, the source's range).
    Kind.DURATION: ("interval", "TIME(6)", "INTEGER"),
    Kind.STRING: ("text", _MYSQL_TEXT, "TEXT"),
    Kind.JSON: ("jsonb", "JSON", "TEXT"),
    Kind.BYTES: ("bytea", "LONGBLOB", "BLOB"),
    # PostgreSQL keeps a SET as an array; MySQL and SQLite as MySQL's own text form of
    # a SET value, 'a,b' (members cannot contain commas).
    Kind.SET: ("text[]", _MYSQL_TEXT, "TEXT"),
    # A column declared BLOB has BLOB affinity in SQLite: values keep their storage
    # class (integer, real, text, blob), as in the source. Elsewhere: their text.
    Kind.MIXED: ("text", _MYSQL_TEXT, "BLOB"),
}
# What MySQL stores as LONGTEXT, and a key of which must be a VARCHAR.
_MYSQL_TEXT_KINDS = (Kind.STRING, Kind.JSON, Kind.NUMERIC_TEXT, Kind.SET, Kind.MIXED)


def _reason(col: Col, dialect: Dialect, key: bool) -> str | None:
    if col.kind is Kind.DECIMAL:
        p, s = decimal_bounds(col)
        if dialect == "mysql" and p > _MYSQL_MAX_PRECISION:
            return (f"decimal({col.precision},{col.scale}): MySQL/MariaDB DECIMAL holds at "
                    f"most {_MYSQL_MAX_PRECISION} digits")
        if dialect == "mysql" and s > _MYSQL_MAX_SCALE:
            return (f"decimal({col.precision},{col.scale}): MySQL DECIMAL holds at most "
                    f"{_MYSQL_MAX_SCALE} digits after the point")
        if dialect == "postgresql" and p > _PG_MAX_PRECISION:
            return (f"decimal({col.precision},{col.scale}): PostgreSQL numeric holds at "
                    f"most {_PG_MAX_PRECISION} digits of precision")
    if key and dialect == "mysql" and col.length:
        if col.kind is Kind.BYTES and col.length > _MYSQL_INDEX_BYTES:
            return (f"a key of {col.length} bytes: MySQL indexes at most "
                    f"{_MYSQL_INDEX_BYTES} bytes of a column")
        if col.kind is Kind.STRING and col.length * 4 > _MYSQL_INDEX_BYTES:
            return (f"a key of {col.length} characters: MySQL indexes at most "
                    f"{_MYSQL_INDEX_BYTES} bytes, {_MYSQL_INDEX_BYTES // 4} utf8mb4 characters")
    return None


def _column_type(col: Col, dialect: Dialect, key: bool) -> str:
    kind = col.kind
    if kind is Kind.DECIMAL:
        p, s = decimal_bounds(col)
        if dialect == "postgresql":
            return f"numeric({p},{s})"
        if dialect == "mysql":
            # BIGINT UNSIGNED arrives as decimal(20,0), as does a signed DECIMAL(20,0):
            # DECIMAL(20,0) holds both (BIGINT UNSIGNED would refuse the negatives).
            return f"DECIMAL({p},{s})"
        return "TEXT"  # exact text; SQLite's NUMERIC would round through REAL
    if dialect == "postgresql":
        if key and kind in DATELIKE and col.text_branch:
            # A zero date cannot become NULL in a key: keep every key as its text.
            return "text"
        if kind is Kind.JSON:
            # json keeps the source's text as is; jsonb (as in a jsonb source) has
            # equality, json has none and cannot be a key.
            return "text" if key and col.hint == "json" else col.hint
        return _FIXED[kind][0]
    if dialect == "mysql":
        if col.mysql_type:
            # The source's own SET(...)/ENUM(...), members in its order; indexable.
            return col.mysql_type
        if key and kind in _MYSQL_TEXT_KINDS:
            return _MYSQL_KEY_TEXT.format(n=col.length or MYSQL_KEY_CHARS)
        if key and kind is Kind.BYTES:
            return f"VARBINARY({col.length or MYSQL_KEY_CHARS})"
        if kind is Kind.JSON:
            return "JSON"
        return _FIXED[kind][1]
    return _FIXED[kind][2]


def column_type(avro_type: Any, dialect: Dialect, *, key: bool = False,
                sql_type: str | None = None) -> str:
    """The target column type (DDL, without NULL/NOT NULL) of a source field of Avro type
    ``avro_type`` (``["null", T]`` when nullable) on a ``dialect`` target.

    ``key``: the column is part of the target's primary key (MySQL cannot index TEXT or
    BLOB; PostgreSQL cannot make a key of zero dates turned NULL). ``sql_type``: the
    field's ``sql_type`` attribute, if any (module docstring, "Hints").

    Raises ``UnmappableTypeError`` (with ``unmappable``'s reason) when no column of the
    target holds the type."""
    col = classify(avro_type, sql_type)
    reason = _reason(col, dialect, key)
    if reason:
        raise UnmappableTypeError(reason)
    return _column_type(col, dialect, key)


def unmappable(avro_type: Any, dialect: Dialect, *, key: bool = False,
               sql_type: str | None = None) -> str | None:
    """Why no column of a ``dialect`` target can hold the type, or None when one can
    (``databus replicate assess``): an Avro type the replicator does not map (records,
    maps, named types it cannot resolve), a DECIMAL beyond MySQL's 65 digits (scale 30)
    or PostgreSQL's 1000, a MySQL key column longer than an index can hold."""
    try:
        col = classify(avro_type, sql_type)
    except UnmappableTypeError as exc:
        return exc.message
    return _reason(col, dialect, key)


def nullable(avro_type: Any, dialect: Dialect, *, key: bool = False) -> bool:
    """Whether the target column must allow NULL: the source's column is nullable, or
    (PostgreSQL, not a key) it may hold zero/invalid dates, which arrive there as NULL."""
    col = classify(avro_type, None)
    if key:
        return False
    return col.nullable or (dialect == "postgresql" and col.text_branch)


# -- converters -----------------------------------------------------------------------


def _identity(value: Any) -> Any:
    return value


def is_identity(conv: Converter) -> bool:
    """Whether ``conv`` (from ``converter``) gives every value back as it is."""
    return conv is _identity


def _none_passes(convert: Converter) -> Converter:
    if convert is _identity:
        return _identity  # None passes through it already
    def conv(value: Any) -> Any:
        return None if value is None else convert(value)

    # The fold calls ``convert`` itself after its own None test (one call, not two).
    conv.__wrapped__ = convert  # type: ignore[attr-defined]
    return conv


def _sqlite_decimal(value: Any) -> Any:
    # 'f': never exponent notation (Decimal('0E-30') would print as 0E-30).
    return format(value if isinstance(value, Decimal) else Decimal(str(value)), "f")


def _finite(what: str) -> Converter:
    def conv(value: Any) -> Any:
        if math.isfinite(value):
            return value
        raise ValueError(f"{value!r}: {what} holds no NaN or infinity")

    return conv


def _sqlite_float(value: Any) -> Any:
    if math.isnan(value):  # SQLite stores a NaN as NULL
        raise ValueError("NaN: SQLite stores a NaN as NULL")
    return value


def _aware(value: Any) -> Any:
    """An instant for timestamp with time zone: a naive one (not from fastavro, which
    decodes to aware UTC) is UTC, never the session's TimeZone."""
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _to_utc_naive(value: Any) -> Any:
    """An instant -> naive UTC, for DATETIME: pymysql prints a datetime's fields and drops
    its tzinfo, so a +05:30 value would land 5.5 hours off."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def _sqlite_instant(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:  # not from fastavro, which decodes to aware UTC
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat(" ", "microseconds")
    return value  # a zero/invalid date's text


def _sqlite_local(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat(" ", "microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _sqlite_time(value: Any) -> Any:
    return value.isoformat("microseconds") if isinstance(value, dt.time) else value


def _to_interval(value: Any) -> Any:
    return dt.timedelta(microseconds=value) if isinstance(value, int) else value


def _pg_text(value: Any) -> Any:
    if "\x00" in value:
        raise ValueError("a string with a NUL character: PostgreSQL text cannot hold it")
    return value


def _pg_zero_date_null(value: Any) -> Any:
    # PostgreSQL has no 0000-00-00 nor 2021-02-31: MySQL's "no date" becomes NULL.
    return None if isinstance(value, str) else value


def _key_text(value: Any) -> Any:
    """A date-like key with a text branch, as text (PostgreSQL keys)."""
    if isinstance(value, dt.datetime):
        return value.isoformat(" ", "microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def mixed_text(value: Any) -> str:
    """A value of a dynamic (SQLite) column as text: numbers as Python prints them
    (repr of a float is exact), bytes as UTF-8."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("bytes that are not UTF-8 text cannot go to a text "
                             "column") from None
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _joined(value: Any) -> Any:
    if isinstance(value, str):
        return value
    for member in value:
        if "," in member:
            raise ValueError(f"a SET member with a comma ({member!r}) cannot be joined")
    return ",".join(value)


def _max_length(limit: int, what: str) -> Converter:
    def conv(value: Any) -> Any:
        if len(value) > limit:
            raise ValueError(f"a key of {len(value)} {what}: the target key column "
                             f"holds {limit}")
        return value

    return conv


def _then(first: Converter, second: Converter) -> Converter:
    def conv(value: Any) -> Any:
        return second(first(value))

    return conv


# Event keys: a delete without its old row (TxLog) carries only the event key, in which
# a DECIMAL, date or datetime is its canonical text and a part of a composite binary key
# is hex (docs/binlog-fetcher.md and docs/txlog-fetcher.md, "Keys"). Key converters
# turn those back into values first.


def _key_decimal(value: Any) -> Any:
    if isinstance(value, Decimal):
        return value
    return Decimal(str(value))


def _key_date(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            return value  # a zero date's text
    return value


def _key_datetime(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            return value
    return value


def _key_instant(value: Any) -> Any:
    value = _key_datetime(value)
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _key_time(value: Any) -> Any:
    return dt.time.fromisoformat(value) if isinstance(value, str) else value


def _key_bytes(value: Any) -> Any:
    return bytes.fromhex(value) if isinstance(value, str) else value


def _key_float(value: Any) -> Any:
    return float(value) if isinstance(value, str) else value


def _key_bool(value: Any) -> Any:
    return bool(int(value)) if not isinstance(value, bool) else value


def _key_set(value: Any) -> Any:
    if isinstance(value, str):
        return value.split(",") if value else []
    return value


_KEY_PARSE: dict[Kind, Converter] = {
    Kind.DECIMAL: _key_decimal,
    Kind.DATE: _key_date,
    Kind.LOCAL_TIMESTAMP: _key_datetime,
    Kind.TIMESTAMP: _key_instant,
    Kind.TIME: _key_time,
    Kind.BYTES: _key_bytes,
    Kind.FLOAT: _key_float,
    Kind.DOUBLE: _key_float,
    Kind.BOOL: _key_bool,
    Kind.SET: _key_set,
}


def _value_converter(col: Col, dialect: Dialect, key: bool) -> Converter:
    kind = col.kind
    if dialect == "postgresql":
        if col.text_branch:
            return _key_text if key else _pg_zero_date_null
        if kind in (Kind.STRING, Kind.NUMERIC_TEXT):
            return _pg_text
        if kind is Kind.JSON and col.hint == "json" and key:
            return _pg_text
        if kind is Kind.TIMESTAMP:
            return _aware
        if kind is Kind.DURATION:
            return _to_interval
        if kind is Kind.SET:
            return list  # psycopg2 adapts a list to an ARRAY ('{}' when empty)
        if kind is Kind.MIXED:
            return _then(mixed_text, _pg_text)
        return _identity
    if dialect == "mysql":
        if kind is Kind.TIMESTAMP:
            return _to_utc_naive
        if kind is Kind.DURATION:
            return _to_interval
        if kind in (Kind.FLOAT, Kind.DOUBLE):
            return _finite("MySQL DOUBLE")
        conv: Converter
        if kind is Kind.SET:
            conv = _joined
        elif kind is Kind.MIXED:
            conv = mixed_text
        else:
            conv = _identity
        if key and (kind in _MYSQL_TEXT_KINDS or kind is Kind.BYTES) and not col.mysql_type:
            limit = col.length or MYSQL_KEY_CHARS
            check = _max_length(limit, "bytes" if kind is Kind.BYTES else "characters")
            conv = check if conv is _identity else _then(conv, check)
        return conv
    # SQLite
    if kind is Kind.DECIMAL:
        return _sqlite_decimal
    if kind in (Kind.FLOAT, Kind.DOUBLE):
        return _sqlite_float
    if kind is Kind.TIMESTAMP:
        return _sqlite_instant
    if kind in (Kind.DATE, Kind.LOCAL_TIMESTAMP):
        return _sqlite_local
    if kind is Kind.TIME:
        return _sqlite_time
    if kind is Kind.SET:
        return _joined
    return _identity


def converter(avro_type: Any, dialect: Dialect, *, key: bool = False,
              sql_type: str | None = None) -> Converter:
    """A function from a value as fastavro decodes it (``Decimal``, aware UTC
    ``datetime``, ``list`` for a SET, ...) to the parameter the ``dialect`` target's
    driver takes (psycopg2, pymysql, sqlite3) for the column ``column_type`` gives.
    Built once per column; None passes through.

    It raises ``ValueError`` for a value the column cannot hold (a NUL character for
    PostgreSQL text, NaN for MySQL, a MySQL key longer than its column). With ``key``,
    it also takes the text forms event keys carry (a delete without its old row)."""
    col = classify(avro_type, sql_type)
    conv = _value_converter(col, dialect, key)
    if key and col.kind in _KEY_PARSE:
        conv = _KEY_PARSE[col.kind] if conv is _identity else _then(_KEY_PARSE[col.kind], conv)
    return _none_passes(conv)
