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
import enum
import json
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from databus.errors import SchemaError
from databus.replicator._model import Dialect

__all__ = [
    "MYSQL_KEY_CHARS",
    "MYSQL_SESSION_SQL",
    "Converter",
    "UnmappableTypeError",
    "column_type",
    "converter",
    "normalize",
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


class UnmappableTypeError(SchemaError):
    """A source column type no column of the target can hold (``unmappable``'s reason)."""

    code = "unmappable_type"


# -- classification: Avro type (+ hint) -> what the column holds ---------------------


class _Kind(enum.Enum):
    INT = "int"  # Avro int: any 32-bit signed integer
    LONG = "long"
    BOOL = "boolean"
    FLOAT = "float"  # single precision
    DOUBLE = "double"
    DECIMAL = "decimal"  # exact, with precision and scale
    NUMERIC_TEXT = "numeric text"  # an exact number of no fixed scale, sent as text
    DATE = "date"
    LOCAL_TIMESTAMP = "local timestamp"  # a wall-clock date and time, no zone
    TIMESTAMP = "timestamp"  # an instant (UTC)
    TIME = "time"  # a time of day
    DURATION = "duration"  # signed microseconds (MySQL TIME, with a hint)
    STRING = "string"
    JSON = "json"  # JSON text (with a hint)
    BYTES = "bytes"
    SET = "set"  # array of string: MySQL SET members
    MIXED = "mixed"  # a union of several value types (SQLite's dynamic columns)


_DATELIKE = (_Kind.DATE, _Kind.LOCAL_TIMESTAMP, _Kind.TIMESTAMP)


@dataclass(frozen=True, slots=True)
class _Col:
    kind: _Kind
    nullable: bool = False
    text_branch: bool = False  # [date-like, string]: zero and invalid dates as text
    precision: int = 0
    scale: int = 0
    length: int = 0  # a length hint (characters or bytes), 0 without one
    hint: str = ""  # json / jsonb
    mysql_type: str = ""  # a SET(...)/ENUM(...) hint, as the source spells it


_LOGICAL: dict[tuple[str, str], _Kind] = {
    ("int", "date"): _Kind.DATE,
    ("long", "local-timestamp-micros"): _Kind.LOCAL_TIMESTAMP,
    ("long", "local-timestamp-millis"): _Kind.LOCAL_TIMESTAMP,
    ("long", "timestamp-micros"): _Kind.TIMESTAMP,
    ("long", "timestamp-millis"): _Kind.TIMESTAMP,
    ("long", "time-micros"): _Kind.TIME,
    ("int", "time-millis"): _Kind.TIME,
}
_PRIMITIVE: dict[str, _Kind] = {
    "int": _Kind.INT,
    "long": _Kind.LONG,
    "boolean": _Kind.BOOL,
    "float": _Kind.FLOAT,
    "double": _Kind.DOUBLE,
    "string": _Kind.STRING,
    "bytes": _Kind.BYTES,
}
# The binlog fetcher names its decimals decimal_<p>_<s> (a second column of the same
# precision and scale refers to the first by that name), so the name is the type.
_DECIMAL_NAME = re.compile(r"(?:^|\.)decimal_(\d+)_(\d+)$")
_LENGTH = re.compile(r"\(\s*(\d+)\s*(?:byte|char)?\s*\)", re.IGNORECASE)
# SET('a','b') / ENUM(...): only quoted labels, since the hint goes into DDL as is.
_SET_OR_ENUM = re.compile(r"^(?:set|enum)\s*\(\s*'(?:[^'\\]|''|\\.)*'"
                          r"(?:\s*,\s*'(?:[^'\\]|''|\\.)*')*\s*\)$", re.DOTALL)
_TEXT_HINTS = ("char", "text", "clob", "string")
_BYTES_HINTS = ("binary", "raw")
_NUMERIC_HINTS = ("numeric", "decimal", "number", "float")


def _branch(avro: Any) -> tuple[_Kind, int, int]:
    """One non-null branch -> (kind, precision, scale)."""
    if isinstance(avro, dict):
        base, logical = avro.get("type"), avro.get("logicalType")
        if logical == "decimal" and base in ("bytes", "fixed"):
            return _Kind.DECIMAL, int(avro["precision"]), int(avro.get("scale", 0))
        if isinstance(base, str) and isinstance(logical, str) and (base, logical) in _LOGICAL:
            return _LOGICAL[base, logical], 0, 0
        if base == "array" and avro.get("items") == "string":
            return _Kind.SET, 0, 0
        if base == "enum":
            return _Kind.STRING, 0, 0
        if base == "fixed":
            return _Kind.BYTES, 0, 0
        if isinstance(base, str) and base in _PRIMITIVE:  # {"type": "string"}, unknown logical
            return _PRIMITIVE[base], 0, 0
        raise UnmappableTypeError(f"Avro type {json.dumps(avro)} has no column type "
                                  "(records, maps and arrays of non-strings are not replicated)")
    if isinstance(avro, str):
        if avro in _PRIMITIVE:
            return _PRIMITIVE[avro], 0, 0
        m = _DECIMAL_NAME.search(avro)
        if m:
            return _Kind.DECIMAL, int(m[1]), int(m[2])
        raise UnmappableTypeError(f"Avro type {avro!r} has no column type (a named type "
                                  "other than the fetchers' decimal_<p>_<s>, or null)")
    raise UnmappableTypeError(f"Avro type {avro!r} has no column type")


def _classify(avro_type: Any, sql_type: str | None) -> _Col:
    branches = list(avro_type) if isinstance(avro_type, list) else [avro_type]
    nullable = "null" in branches
    branches = [b for b in branches if b != "null"]
    if not branches:
        raise UnmappableTypeError("a column that is always null has no column type")
    parsed = [_branch(b) for b in branches]
    kind, precision, scale = parsed[0]
    text_branch = False
    if len(parsed) == 2 and kind in _DATELIKE and parsed[1][0] is _Kind.STRING:
        text_branch = True
    elif len(parsed) > 1:
        return _Col(_Kind.MIXED, nullable)
    hint = (sql_type or "").strip().lower()
    length = 0
    extra = mysql_type = ""
    if hint and not hint.endswith("[]"):  # an array's text: no hint about its elements
        m = _LENGTH.search(hint)
        base = hint.split("(")[0].strip()
        if kind is _Kind.STRING:
            if base in ("json", "jsonb"):
                kind, extra = _Kind.JSON, base
            elif base in ("set", "enum") and _SET_OR_ENUM.match(hint):
                mysql_type = (sql_type or "").strip()  # labels keep their case
            elif any(base.startswith(n) for n in _NUMERIC_HINTS):
                kind = _Kind.NUMERIC_TEXT
            elif m and any(t in base for t in _TEXT_HINTS):
                length = int(m[1])
        elif kind is _Kind.SET and base == "set" and _SET_OR_ENUM.match(hint):
            mysql_type = (sql_type or "").strip()
        elif kind is _Kind.BYTES and m and any(t in base for t in _BYTES_HINTS):
            length = int(m[1])
        elif kind is _Kind.LONG and base == "time":
            kind = _Kind.DURATION
    return _Col(kind, nullable, text_branch, precision, scale, length, extra, mysql_type)


def _decimal_bounds(col: _Col) -> tuple[int, int]:
    """Precision and scale of a column that holds every value of ``col``: Oracle allows
    a scale above the precision (NUMBER(2,5): 0.000dd) and a negative one (NUMBER(5,-2):
    ddddd00), which SQL DECIMAL does not."""
    p, s = col.precision, col.scale
    if s < 0:
        return p - s, 0
    return max(p, s), s


# -- column types ---------------------------------------------------------------------

_MYSQL_TEXT = "LONGTEXT CHARACTER SET utf8mb4"
# Keys compare byte for byte (utf8mb4_bin): under the default case-insensitive collation
# 'a' and 'A' would be one key and two source rows one target row.
_MYSQL_KEY_TEXT = "VARCHAR({n}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"

_FIXED: dict[_Kind, tuple[str, str, str]] = {
    # kind: (postgresql, mysql, sqlite)
    _Kind.INT: ("integer", "INT", "INTEGER"),
    _Kind.LONG: ("bigint", "BIGINT", "INTEGER"),
    _Kind.BOOL: ("boolean", "BOOLEAN", "INTEGER"),
    # MySQL: DOUBLE, not FLOAT: MariaDB sends FLOAT values as text rounded to 6 digits;
    # a single-precision value is exact in a DOUBLE.
    _Kind.FLOAT: ("real", "DOUBLE", "REAL"),
    _Kind.DOUBLE: ("double precision", "DOUBLE", "REAL"),
    _Kind.NUMERIC_TEXT: ("numeric", _MYSQL_TEXT, "TEXT"),
    _Kind.DATE: ("date", "DATE", "TEXT"),
    _Kind.LOCAL_TIMESTAMP: ("timestamp without time zone", "DATETIME(6)", "TEXT"),
    _Kind.TIMESTAMP: ("timestamp with time zone", "DATETIME(6)", "TEXT"),
    _Kind.TIME: ("time without time zone", "TIME(6)", "TEXT"),
    # MySQL's TIME is a duration already (-838:59:59 .. 838:59:59, the source's range).
    _Kind.DURATION: ("interval", "TIME(6)", "INTEGER"),
    _Kind.STRING: ("text", _MYSQL_TEXT, "TEXT"),
    _Kind.JSON: ("jsonb", "JSON", "TEXT"),
    _Kind.BYTES: ("bytea", "LONGBLOB", "BLOB"),
    # PostgreSQL keeps a SET as an array; MySQL and SQLite as MySQL's own text form of
    # a SET value, 'a,b' (members cannot contain commas).
    _Kind.SET: ("text[]", _MYSQL_TEXT, "TEXT"),
    # A column declared BLOB has BLOB affinity in SQLite: values keep their storage
    # class (integer, real, text, blob), as in the source. Elsewhere: their text.
    _Kind.MIXED: ("text", _MYSQL_TEXT, "BLOB"),
}
# What MySQL stores as LONGTEXT, and a key of which must be a VARCHAR.
_MYSQL_TEXT_KINDS = (_Kind.STRING, _Kind.JSON, _Kind.NUMERIC_TEXT, _Kind.SET, _Kind.MIXED)


def _reason(col: _Col, dialect: Dialect, key: bool) -> str | None:
    if col.kind is _Kind.DECIMAL:
        p, s = _decimal_bounds(col)
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
        if col.kind is _Kind.BYTES and col.length > _MYSQL_INDEX_BYTES:
            return (f"a key of {col.length} bytes: MySQL indexes at most "
                    f"{_MYSQL_INDEX_BYTES} bytes of a column")
        if col.kind is _Kind.STRING and col.length * 4 > _MYSQL_INDEX_BYTES:
            return (f"a key of {col.length} characters: MySQL indexes at most "
                    f"{_MYSQL_INDEX_BYTES} bytes, {_MYSQL_INDEX_BYTES // 4} utf8mb4 characters")
    return None


def _column_type(col: _Col, dialect: Dialect, key: bool) -> str:
    kind = col.kind
    if kind is _Kind.DECIMAL:
        p, s = _decimal_bounds(col)
        if dialect == "postgresql":
            return f"numeric({p},{s})"
        if dialect == "mysql":
            # BIGINT UNSIGNED arrives as decimal(20,0), as does a signed DECIMAL(20,0):
            # DECIMAL(20,0) holds both (BIGINT UNSIGNED would refuse the negatives).
            return f"DECIMAL({p},{s})"
        return "TEXT"  # exact text; SQLite's NUMERIC would round through REAL
    if dialect == "postgresql":
        if key and kind in _DATELIKE and col.text_branch:
            # A zero date cannot become NULL in a key: keep every key as its text.
            return "text"
        if kind is _Kind.JSON:
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
        if key and kind is _Kind.BYTES:
            return f"VARBINARY({col.length or MYSQL_KEY_CHARS})"
        if kind is _Kind.JSON:
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
    col = _classify(avro_type, sql_type)
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
        col = _classify(avro_type, sql_type)
    except UnmappableTypeError as exc:
        return exc.message
    return _reason(col, dialect, key)


def nullable(avro_type: Any, dialect: Dialect, *, key: bool = False) -> bool:
    """Whether the target column must allow NULL: the source's column is nullable, or
    (PostgreSQL, not a key) it may hold zero/invalid dates, which arrive there as NULL."""
    col = _classify(avro_type, None)
    if key:
        return False
    return col.nullable or (dialect == "postgresql" and col.text_branch)


# -- converters -----------------------------------------------------------------------


def _identity(value: Any) -> Any:
    return value


def _none_passes(convert: Converter) -> Converter:
    def conv(value: Any) -> Any:
        return None if value is None else convert(value)

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


def _mixed_text(value: Any) -> str:
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


_KEY_PARSE: dict[_Kind, Converter] = {
    _Kind.DECIMAL: _key_decimal,
    _Kind.DATE: _key_date,
    _Kind.LOCAL_TIMESTAMP: _key_datetime,
    _Kind.TIMESTAMP: _key_instant,
    _Kind.TIME: _key_time,
    _Kind.BYTES: _key_bytes,
    _Kind.FLOAT: _key_float,
    _Kind.DOUBLE: _key_float,
    _Kind.BOOL: _key_bool,
    _Kind.SET: _key_set,
}


def _value_converter(col: _Col, dialect: Dialect, key: bool) -> Converter:
    kind = col.kind
    if dialect == "postgresql":
        if col.text_branch:
            return _key_text if key else _pg_zero_date_null
        if kind in (_Kind.STRING, _Kind.NUMERIC_TEXT):
            return _pg_text
        if kind is _Kind.JSON and col.hint == "json" and key:
            return _pg_text
        if kind is _Kind.TIMESTAMP:
            return _aware
        if kind is _Kind.DURATION:
            return _to_interval
        if kind is _Kind.SET:
            return list  # psycopg2 adapts a list to an ARRAY ('{}' when empty)
        if kind is _Kind.MIXED:
            return _then(_mixed_text, _pg_text)
        return _identity
    if dialect == "mysql":
        if kind is _Kind.TIMESTAMP:
            return _to_utc_naive
        if kind is _Kind.DURATION:
            return _to_interval
        if kind in (_Kind.FLOAT, _Kind.DOUBLE):
            return _finite("MySQL DOUBLE")
        conv: Converter
        if kind is _Kind.SET:
            conv = _joined
        elif kind is _Kind.MIXED:
            conv = _mixed_text
        else:
            conv = _identity
        if key and (kind in _MYSQL_TEXT_KINDS or kind is _Kind.BYTES) and not col.mysql_type:
            limit = col.length or MYSQL_KEY_CHARS
            check = _max_length(limit, "bytes" if kind is _Kind.BYTES else "characters")
            conv = check if conv is _identity else _then(conv, check)
        return conv
    # SQLite
    if kind is _Kind.DECIMAL:
        return _sqlite_decimal
    if kind in (_Kind.FLOAT, _Kind.DOUBLE):
        return _sqlite_float
    if kind is _Kind.TIMESTAMP:
        return _sqlite_instant
    if kind in (_Kind.DATE, _Kind.LOCAL_TIMESTAMP):
        return _sqlite_local
    if kind is _Kind.TIME:
        return _sqlite_time
    if kind is _Kind.SET:
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
    col = _classify(avro_type, sql_type)
    conv = _value_converter(col, dialect, key)
    if key and col.kind in _KEY_PARSE:
        conv = _KEY_PARSE[col.kind] if conv is _identity else _then(_KEY_PARSE[col.kind], conv)
    return _none_passes(conv)


# -- normalisation (comparing a source row with a target row) -------------------------


def _float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _micros(value: dt.timedelta) -> int:
    return value // dt.timedelta(microseconds=1)


def _date_text(value: str) -> str:
    """A zero/invalid date's text without trailing fraction zeros: a DATETIME(0)
    source prints 0000-00-00 00:00:00, the DATETIME(6) target 0000-00-00 00:00:00.000000."""
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value


def _normalize(col: _Col, value: Any, dialect: Dialect | None, key: bool) -> Any:
    kind = col.kind
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if kind in (_Kind.INT, _Kind.LONG):
        return int(value)
    if kind is _Kind.BOOL:
        return bool(value)
    if kind in (_Kind.FLOAT, _Kind.DOUBLE):
        f = float(value)
        if math.isnan(f):
            return "NaN"  # NaN != NaN
        return _float32(f) if kind is _Kind.FLOAT else f
    if kind in (_Kind.DECIMAL, _Kind.NUMERIC_TEXT):
        d = value if isinstance(value, Decimal) else Decimal(str(value))
        return "NaN" if d.is_nan() else d.normalize()
    if kind in _DATELIKE:
        if isinstance(value, str):
            try:
                parsed: Any = (dt.date.fromisoformat(value) if kind is _Kind.DATE
                               else dt.datetime.fromisoformat(value))
            except ValueError:
                # A zero/invalid date: PostgreSQL holds it as NULL (a key: its text).
                return None if dialect == "postgresql" and not key else _date_text(value)
            value = parsed
        if kind is _Kind.DATE:
            return value.date() if isinstance(value, dt.datetime) else value
        if kind is _Kind.LOCAL_TIMESTAMP:
            return value.replace(tzinfo=None)
        if value.tzinfo is None:  # MySQL DATETIME(6) holds UTC
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
    if kind is _Kind.TIME:
        if isinstance(value, str):
            value = dt.time.fromisoformat(value)
        if isinstance(value, dt.timedelta):  # pymysql reads TIME as a timedelta
            return _micros(value)
        seconds = (value.hour * 60 + value.minute) * 60 + value.second
        return seconds * 10**6 + value.microsecond
    if kind is _Kind.DURATION:
        return _micros(value) if isinstance(value, dt.timedelta) else int(value)
    if kind is _Kind.JSON:
        if not isinstance(value, str | bytes):
            # psycopg2 parses json/jsonb itself, floats as float: back to text, whose
            # shortest float repr parses to the same Decimal as the source's digits.
            value = json.dumps(value)
        try:
            return json.loads(value, parse_float=Decimal)
        except ValueError:
            return value
    if kind is _Kind.STRING:
        return value.decode("utf-8") if isinstance(value, bytes) else value
    if kind is _Kind.SET:
        if isinstance(value, str):
            return tuple(sorted(value.split(","))) if value else ()
        return tuple(sorted(value))
    if kind is _Kind.MIXED:
        if dialect == "sqlite":
            return value
        try:
            return _mixed_text(value)
        except ValueError:
            return value
    return value  # BYTES


def normalize(value: Any, avro_type: Any, *, dialect: Dialect | None = None,
              key: bool = False, sql_type: str | None = None) -> Any:
    """A canonical form of a column value, for comparing a source row (as decoded) with
    a target row (as its driver reads it): equal values normalise equal.

    None -> None; integers -> int; booleans -> bool (0/1 too); floats -> float, a
    single-precision column rounded to single precision, NaN -> "NaN"; decimals ->
    ``Decimal.normalize()`` (exact, 1.10 == 1.1; text too); dates -> ``date``, wall-clock
    date-times -> naive ``datetime``, instants -> aware UTC ``datetime`` (a naive one is
    read as UTC, as MySQL's DATETIME holds them); zero/invalid dates -> their text without
    trailing fraction zeros, or None when ``dialect`` is PostgreSQL and not ``key`` (where
    they land as NULL); times of day and durations -> microseconds (int); JSON (with a hint) -> the
    parsed value, numbers as Decimal; strings -> str; bytes -> bytes; SET -> a sorted
    tuple of members (a list or MySQL's 'a,b'); a mixed (SQLite dynamic) column -> its
    text, or the value itself when the target is SQLite."""
    if value is None:
        return None
    return _normalize(_classify(avro_type, sql_type), value, dialect, key)
