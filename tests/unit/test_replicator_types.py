"""The replicator's type mapping (pure): every Avro type the fetchers produce -> a
target column type on each dialect, converters and their edge values, ``unmappable``
and ``normalize``. ``tests/integration/test_replicator_types.py`` writes the same
values into real targets."""

from __future__ import annotations

import datetime as dt
import math
import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from databus.fetchers.mysql._types import ColumnSpec, Kind, avro_field_type
from databus.fetchers.txlog._schema import field_mapping
from databus.replicator import (
    MYSQL_SESSION_SQL,
    UnmappableTypeError,
    column_type,
    converter,
    normalize,
    nullable,
    unmappable,
)
from databus.replicator._model import Dialect

UTC = dt.UTC
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))
DIALECTS: list[Dialect] = ["postgresql", "mysql", "sqlite"]

DATE = {"type": "int", "logicalType": "date"}
DATE_OR_TEXT = [DATE, "string"]
LOCAL = {"type": "long", "logicalType": "local-timestamp-micros"}
DATETIME_OR_TEXT = [LOCAL, "string"]
INSTANT = {"type": "long", "logicalType": "timestamp-micros"}
TIME_OF_DAY = {"type": "long", "logicalType": "time-micros"}
SET = {"type": "array", "items": "string"}
SQLITE_NUMERIC = ["long", "double", "string"]
SQLITE_ANY = ["bytes", "long", "double", "string"]
MYSQL_TEXT = "LONGTEXT CHARACTER SET utf8mb4"
MYSQL_KEY_TEXT = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"


def dec(p: int, s: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": p, "scale": s}


def fixed_dec(p: int, s: int, size: int = 28) -> dict[str, Any]:
    return {"type": "fixed", "name": f"decimal_{p}_{s}", "size": size,
            "logicalType": "decimal", "precision": p, "scale": s}


def f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


# -- column types: the table of docs/replicator.md ------------------------------------

# (name, Avro type, sql_type hint, (postgresql, mysql, sqlite))
TYPES: list[tuple[str, Any, str | None, tuple[str, str, str]]] = [
    ("int", "int", None, ("integer", "INT", "INTEGER")),
    ("long", "long", None, ("bigint", "BIGINT", "INTEGER")),
    ("boolean", "boolean", None, ("boolean", "BOOLEAN", "INTEGER")),
    ("float", "float", None, ("real", "DOUBLE", "REAL")),
    ("double", "double", None, ("double precision", "DOUBLE", "REAL")),
    ("decimal(65,30)", fixed_dec(65, 30), None, ("numeric(65,30)", "DECIMAL(65,30)", "TEXT")),
    ("bigint unsigned", fixed_dec(20, 0, 9), None, ("numeric(20,0)", "DECIMAL(20,0)", "TEXT")),
    ("decimal by name", "shop.decimal_10_2", None, ("numeric(10,2)", "DECIMAL(10,2)", "TEXT")),
    ("bytes decimal", dec(12, 4), None, ("numeric(12,4)", "DECIMAL(12,4)", "TEXT")),
    ("oracle NUMBER(2,5)", dec(2, 5), None, ("numeric(5,5)", "DECIMAL(5,5)", "TEXT")),
    ("oracle NUMBER(5,-2)", dec(5, -2), None, ("numeric(7,0)", "DECIMAL(7,0)", "TEXT")),
    ("numeric as text", "string", "numeric", ("numeric", MYSQL_TEXT, "TEXT")),
    ("oracle NUMBER as text", "string", "NUMBER", ("numeric", MYSQL_TEXT, "TEXT")),
    ("date", DATE, None, ("date", "DATE", "TEXT")),
    ("date or zero date", DATE_OR_TEXT, None, ("date", "DATE", "TEXT")),
    ("local timestamp", LOCAL, None, ("timestamp without time zone", "DATETIME(6)", "TEXT")),
    ("datetime or zero", DATETIME_OR_TEXT, None,
     ("timestamp without time zone", "DATETIME(6)", "TEXT")),
    ("instant", INSTANT, None, ("timestamp with time zone", "DATETIME(6)", "TEXT")),
    ("instant millis", {"type": "long", "logicalType": "timestamp-millis"}, None,
     ("timestamp with time zone", "DATETIME(6)", "TEXT")),
    ("time of day", TIME_OF_DAY, None, ("time without time zone", "TIME(6)", "TEXT")),
    ("mysql TIME (hint)", "long", "time(3)", ("interval", "TIME(6)", "INTEGER")),
    ("mysql TIME (no hint)", "long", None, ("bigint", "BIGINT", "INTEGER")),
    ("string", "string", None, ("text", MYSQL_TEXT, "TEXT")),
    ("varchar hint", "string", "character varying(40)", ("text", MYSQL_TEXT, "TEXT")),
    ("enum symbols", {"type": "enum", "name": "e", "symbols": ["a"]}, None,
     ("text", MYSQL_TEXT, "TEXT")),
    ("enum hint", "string", "enum('S','L')", ("text", "enum('S','L')", "TEXT")),
    ("json no hint", "string", None, ("text", MYSQL_TEXT, "TEXT")),
    ("json hint", "string", "json", ("json", "JSON", "TEXT")),
    ("jsonb hint", "string", "jsonb", ("jsonb", "JSON", "TEXT")),
    ("pg array as text", "string", "integer[]", ("text", MYSQL_TEXT, "TEXT")),
    ("bytes", "bytes", None, ("bytea", "LONGBLOB", "BLOB")),
    ("plain fixed", {"type": "fixed", "name": "f", "size": 16}, None,
     ("bytea", "LONGBLOB", "BLOB")),
    ("set", SET, None, ("text[]", MYSQL_TEXT, "TEXT")),
    ("set hint", SET, "SET('a','b')", ("text[]", "SET('a','b')", "TEXT")),
    ("sqlite numeric affinity", SQLITE_NUMERIC, None, ("text", MYSQL_TEXT, "BLOB")),
    ("sqlite no type", SQLITE_ANY, None, ("text", MYSQL_TEXT, "BLOB")),
]


@pytest.mark.parametrize(("avro", "sql_type", "expected"), [t[1:] for t in TYPES],
                         ids=[t[0] for t in TYPES])
def test_column_type(avro: Any, sql_type: str | None, expected: tuple[str, str, str]) -> None:
    got = tuple(column_type(avro, d, sql_type=sql_type) for d in DIALECTS)
    assert got == expected
    # Nullable: the same type (NULL/NOT NULL is the table builder's).
    nullable_avro = ["null", *avro] if isinstance(avro, list) else ["null", avro]
    assert tuple(column_type(nullable_avro, d, sql_type=sql_type) for d in DIALECTS) == expected


# (name, Avro type, sql_type, key column types (postgresql, mysql, sqlite))
KEY_TYPES: list[tuple[str, Any, str | None, tuple[str, str, str]]] = [
    ("string", "string", None, ("text", MYSQL_KEY_TEXT, "TEXT")),
    ("string with length", "string", "VARCHAR2(40)",
     ("text", "VARCHAR(40) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", "TEXT")),
    ("bytes", "bytes", None, ("bytea", "VARBINARY(255)", "BLOB")),
    ("RAW(16)", "bytes", "RAW(16)", ("bytea", "VARBINARY(16)", "BLOB")),
    ("set", SET, None, ("text[]", MYSQL_KEY_TEXT, "TEXT")),
    ("json", "string", "json", ("text", MYSQL_KEY_TEXT, "TEXT")),
    ("jsonb", "string", "jsonb", ("jsonb", MYSQL_KEY_TEXT, "TEXT")),
    ("enum hint", "string", "ENUM('a','b')", ("text", "ENUM('a','b')", "TEXT")),
    ("mixed", SQLITE_NUMERIC, None, ("text", MYSQL_KEY_TEXT, "BLOB")),
    # A zero date cannot be a NULL key on PostgreSQL: the key keeps its text.
    ("date or zero", DATE_OR_TEXT, None, ("text", "DATE", "TEXT")),
    ("datetime or zero", DATETIME_OR_TEXT, None, ("text", "DATETIME(6)", "TEXT")),
    ("date", DATE, None, ("date", "DATE", "TEXT")),
    ("int", "int", None, ("integer", "INT", "INTEGER")),
    ("decimal", fixed_dec(20, 0, 9), None, ("numeric(20,0)", "DECIMAL(20,0)", "TEXT")),
]


@pytest.mark.parametrize(("avro", "sql_type", "expected"), [t[1:] for t in KEY_TYPES],
                         ids=[t[0] for t in KEY_TYPES])
def test_key_column_type(avro: Any, sql_type: str | None,
                         expected: tuple[str, str, str]) -> None:
    assert tuple(column_type(avro, d, key=True, sql_type=sql_type) for d in DIALECTS) == expected


# Every Avro type the fetchers produce maps on every target.

def _binlog_types() -> list[tuple[str, Any]]:
    out = []
    for kind in Kind:
        spec = ColumnSpec("c", kind, nullable=True, precision=65 if kind is Kind.DECIMAL else 6,
                          scale=30 if kind is Kind.DECIMAL else 0)
        out.append((kind.value, avro_field_type(spec, "db", set())))
    return out


TXLOG_SQL_TYPES = {
    "sqlite": ["INTEGER", "TEXT", "REAL", "BLOB", "", "NUMERIC", "DATE", "VARCHAR(20)"],
    "postgresql": ["smallint", "integer", "bigint", "real", "double precision", "boolean",
                   "text", "character varying(20)", "bytea", "numeric(10,2)", "numeric",
                   "date", "timestamp without time zone", "timestamp with time zone",
                   "time without time zone", "uuid", "json", "jsonb", "interval", "text[]"],
    "oracle": ["NUMBER(10)", "NUMBER(12,2)", "NUMBER", "FLOAT", "BINARY_FLOAT",
               "BINARY_DOUBLE", "VARCHAR2(20)", "CLOB", "RAW(16)", "BLOB", "DATE",
               "TIMESTAMP(6)", "TIMESTAMP(6) WITH TIME ZONE"],
}


def _txlog_types() -> list[tuple[str, Any, str]]:
    return [(f"{d}:{t}", field_mapping(d, t).avro, t)  # type: ignore[arg-type]
            for d, types in TXLOG_SQL_TYPES.items() for t in types]


@pytest.mark.parametrize(("name", "avro"), _binlog_types())
def test_every_binlog_type_maps_on_every_target(name: str, avro: Any) -> None:
    for d in DIALECTS:
        for key in (False, True):
            assert unmappable(avro, d, key=key) is None, (name, d)
            assert column_type(avro, d, key=key)
            converter(avro, d, key=key)


@pytest.mark.parametrize(("name", "avro", "sql_type"), _txlog_types())
def test_every_txlog_type_maps_on_every_target(name: str, avro: Any, sql_type: str) -> None:
    for d in DIALECTS:
        for key in (False, True):
            assert unmappable(avro, d, key=key, sql_type=sql_type) is None, (name, d)
            assert column_type(avro, d, key=key, sql_type=sql_type)


def test_binlog_types_are_what_this_mapping_expects() -> None:
    """The binlog fetcher's Avro types, as the table above assumes them."""
    got = dict(_binlog_types())
    assert got["uint64"] == ["null", fixed_dec(20, 0, 9) | {"name": "decimal_20_0"}]
    assert got["date"] == ["null", DATE, "string"]
    assert got["datetime"] == ["null", LOCAL, "string"]
    assert got["timestamp"] == ["null", INSTANT]
    assert got["set"] == ["null", SET]
    assert got["time"] == ["null", "long"]
    assert column_type(got["uint64"], "mysql") == "DECIMAL(20,0)"


# -- unmappable -----------------------------------------------------------------------


@pytest.mark.parametrize(("avro", "dialect", "key", "sql_type", "fragment"), [
    (fixed_dec(66, 0), "mysql", False, None, "at most 65 digits"),
    (dec(65, 31), "mysql", False, None, "at most 30 digits after the point"),
    (dec(1001, 0), "postgresql", False, None, "at most 1000 digits"),
    ({"type": "record", "name": "r", "fields": []}, "sqlite", False, None, "no column type"),
    ({"type": "map", "values": "string"}, "postgresql", False, None, "no column type"),
    ({"type": "array", "items": "long"}, "postgresql", False, None, "no column type"),
    ("null", "mysql", False, None, "always null"),
    ("shop.point", "mysql", False, None, "named type"),
    ("string", "mysql", True, "varchar(1000)", "768 utf8mb4 characters"),
    ("bytes", "mysql", True, "RAW(4000)", "3072 bytes"),
])
def test_unmappable(avro: Any, dialect: Dialect, key: bool, sql_type: str | None,
                    fragment: str) -> None:
    reason = unmappable(avro, dialect, key=key, sql_type=sql_type)
    assert reason is not None and fragment in reason
    with pytest.raises(UnmappableTypeError, match=fragment):
        column_type(avro, dialect, key=key, sql_type=sql_type)


def test_mappable_where_another_target_is_not() -> None:
    assert unmappable(fixed_dec(66, 0), "postgresql") is None
    assert unmappable(fixed_dec(66, 0), "sqlite") is None
    assert unmappable(dec(65, 30), "mysql") is None
    assert unmappable("string", "mysql", key=True, sql_type="varchar(768)") is None
    assert unmappable("string", "mysql", sql_type="varchar(1000)") is None  # not a key
    assert unmappable("string", "postgresql", key=True, sql_type="varchar(5000)") is None


def test_nullable() -> None:
    assert not nullable("long", "postgresql")
    assert nullable(["null", "long"], "mysql")
    # PostgreSQL holds zero dates as NULL: its column must allow NULL.
    assert nullable(DATE_OR_TEXT, "postgresql")
    assert nullable(DATETIME_OR_TEXT, "postgresql")
    assert not nullable(DATE_OR_TEXT, "mysql")
    assert not nullable(DATE_OR_TEXT, "sqlite")
    assert not nullable(DATE_OR_TEXT, "postgresql", key=True)
    assert not nullable(["null", "long"], "postgresql", key=True)


def test_mysql_session_settings() -> None:
    sql = " ".join(MYSQL_SESSION_SQL)
    assert "time_zone = '+00:00'" in sql
    assert "utf8mb4" in sql
    assert "STRICT_ALL_TABLES" in sql and "ALLOW_INVALID_DATES" in sql
    assert "NO_ZERO_DATE" not in sql and "NO_BACKSLASH_ESCAPES" not in sql


# -- converters -----------------------------------------------------------------------

D65 = Decimal("-99999999999999999999999999999999999.999999999999999999999999999999")
U64 = Decimal(2**64 - 1)


@pytest.mark.parametrize(("avro", "dialect", "value", "expected"), [
    # None passes through every converter.
    (INSTANT, "mysql", None, None),
    (SET, "postgresql", None, None),
    (fixed_dec(65, 30), "sqlite", None, None),
    # Decimals: exact; text on SQLite, never exponent notation.
    (fixed_dec(65, 30), "postgresql", D65, D65),
    (fixed_dec(65, 30), "mysql", D65, D65),
    (fixed_dec(65, 30), "sqlite", D65, str(D65)),
    (fixed_dec(65, 30), "sqlite", Decimal("0E-30"), "0." + "0" * 30),
    (fixed_dec(20, 0, 9), "sqlite", U64, "18446744073709551615"),
    (fixed_dec(20, 0, 9), "mysql", U64, U64),
    # Instants: aware for PostgreSQL, naive UTC for MySQL DATETIME, ISO UTC for SQLite.
    (INSTANT, "postgresql", dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
     dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)),
    (INSTANT, "postgresql", dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, tzinfo=UTC)),
    (INSTANT, "mysql", dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
     dt.datetime(1970, 1, 1, 0, 0, 1)),
    (INSTANT, "mysql", dt.datetime(2038, 1, 19, 3, 14, 8, 1, tzinfo=UTC),
     dt.datetime(2038, 1, 19, 3, 14, 8, 1)),
    (INSTANT, "mysql", dt.datetime(2024, 3, 31, 5, 30, tzinfo=IST), dt.datetime(2024, 3, 31)),
    (INSTANT, "sqlite", dt.datetime(2106, 2, 7, 6, 28, 16, tzinfo=UTC),
     "2106-02-07 06:28:16.000000+00:00"),
    (INSTANT, "sqlite", dt.datetime(2024, 3, 31, 5, 30, tzinfo=IST),
     "2024-03-31 00:00:00.000000+00:00"),
    # Wall-clock date-times and dates: as they are; text on SQLite, fraction kept.
    (DATETIME_OR_TEXT, "mysql", dt.datetime(2024, 5, 6, 7, 8, 9, 123456),
     dt.datetime(2024, 5, 6, 7, 8, 9, 123456)),
    (DATETIME_OR_TEXT, "sqlite", dt.datetime(2024, 5, 6, 7, 8, 9, 120000),
     "2024-05-06 07:08:09.120000"),
    (DATE_OR_TEXT, "sqlite", dt.date(2024, 2, 29), "2024-02-29"),
    # Zero and invalid dates: MySQL and SQLite keep the text, PostgreSQL gets NULL.
    (DATE_OR_TEXT, "mysql", "0000-00-00", "0000-00-00"),
    (DATE_OR_TEXT, "mysql", "2021-02-31", "2021-02-31"),
    (DATE_OR_TEXT, "sqlite", "2020-00-15", "2020-00-15"),
    (DATE_OR_TEXT, "postgresql", "0000-00-00", None),
    (DATE_OR_TEXT, "postgresql", dt.date(2024, 2, 29), dt.date(2024, 2, 29)),
    (DATETIME_OR_TEXT, "postgresql", "0000-00-00 00:00:00.000000", None),
    (DATETIME_OR_TEXT, "mysql", "0000-00-00 00:00:00.000000", "0000-00-00 00:00:00.000000"),
    # Time of day, durations.
    (TIME_OF_DAY, "sqlite", dt.time(23, 59, 59, 999999), "23:59:59.999999"),
    (TIME_OF_DAY, "mysql", dt.time(1, 2, 3), dt.time(1, 2, 3)),
    # SET: an array on PostgreSQL, MySQL's 'a,b' elsewhere; the empty set too.
    (SET, "postgresql", [], []),
    (SET, "postgresql", ["a", "b", "c"], ["a", "b", "c"]),
    (SET, "mysql", [], ""),
    (SET, "mysql", ["a", "b", "c"], "a,b,c"),
    (SET, "sqlite", ["x"], "x"),
    # Text: 3- and 4-byte UTF-8 as is, JSON text as is.
    ("string", "postgresql", "é€日本語😀𝄞", "é€日本語😀𝄞"),
    ("string", "mysql", "😀𝄞", "😀𝄞"),
    ("string", "mysql", "NUL \x00", "NUL \x00"),
    ("string", "sqlite", "", ""),
    ("string", "postgresql", '{"a": [1, 2.5]}', '{"a": [1, 2.5]}'),
    # Bytes, the empty ones too; booleans; big integers.
    ("bytes", "postgresql", b"", b""),
    ("bytes", "mysql", b"\x00\xff", b"\x00\xff"),
    ("bytes", "sqlite", b"", b""),
    ("boolean", "sqlite", True, True),
    ("long", "mysql", -(2**63), -(2**63)),
    # Floats: as they are (single precision is exact in a double).
    ("float", "mysql", f32(0.1), f32(0.1)),
    ("double", "postgresql", math.inf, math.inf),
    ("double", "sqlite", -math.inf, -math.inf),
    # Dynamic SQLite values: their text on PostgreSQL/MySQL, as they are on SQLite.
    (SQLITE_ANY, "postgresql", 1.5, "1.5"),
    (SQLITE_ANY, "mysql", 7, "7"),
    (SQLITE_ANY, "postgresql", b"abc", "abc"),
    (SQLITE_ANY, "sqlite", b"\xff", b"\xff"),
    (SQLITE_NUMERIC, "sqlite", 2.5, 2.5),
])
def test_converter(avro: Any, dialect: Dialect, value: Any, expected: Any) -> None:
    got = converter(avro, dialect)(value)
    assert got == expected
    assert type(got) is type(expected)
    if isinstance(got, dt.datetime) and isinstance(expected, dt.datetime):
        assert got.tzinfo == expected.tzinfo


def test_duration_hint_converters() -> None:
    us = -((838 * 60 + 59) * 60 + 59) * 10**6
    assert converter("long", "postgresql", sql_type="time")(us) == dt.timedelta(microseconds=us)
    assert converter("long", "mysql", sql_type="time(6)")(-1) == dt.timedelta(microseconds=-1)
    assert converter("long", "sqlite", sql_type="time")(us) == us
    assert converter("long", "mysql")(us) == us  # without the hint: a number


@pytest.mark.parametrize(("avro", "dialect", "key", "sql_type", "value", "fragment"), [
    ("string", "postgresql", False, None, "a\x00b", "NUL"),
    (SQLITE_NUMERIC, "postgresql", False, None, "a\x00b", "NUL"),
    ("double", "mysql", False, None, math.nan, "NaN"),
    ("double", "mysql", False, None, math.inf, "NaN or infinity"),
    ("float", "sqlite", False, None, math.nan, "NaN"),
    ("string", "mysql", True, None, "x" * 256, "holds 255"),
    ("string", "mysql", True, "varchar(4)", "😀😀😀😀😀", "holds 4"),
    ("bytes", "mysql", True, None, b"\x00" * 256, "256 bytes"),
    (SET, "mysql", False, None, ["a,b"], "comma"),
    (SQLITE_ANY, "mysql", False, None, b"\xff", "not UTF-8"),
])
def test_converter_refuses_what_the_column_cannot_hold(
        avro: Any, dialect: Dialect, key: bool, sql_type: str | None, value: Any,
        fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        converter(avro, dialect, key=key, sql_type=sql_type)(value)


def test_key_limits_are_characters_not_bytes() -> None:
    conv = converter("string", "mysql", key=True)
    assert conv("😀" * 255) == "😀" * 255  # 1020 bytes, 255 characters: fits
    assert converter("string", "mysql")("x" * 100_000) == "x" * 100_000  # not a key


@pytest.mark.parametrize(("avro", "dialect", "text", "expected"), [
    # A delete without its old row carries the event key's text forms.
    (fixed_dec(10, 2), "postgresql", "-123.45", Decimal("-123.45")),
    (fixed_dec(10, 2), "sqlite", "-123.45", "-123.45"),
    (DATE_OR_TEXT, "mysql", "2024-02-29", dt.date(2024, 2, 29)),
    (DATE_OR_TEXT, "mysql", "0000-00-00", "0000-00-00"),
    (DATE_OR_TEXT, "postgresql", "0000-00-00", "0000-00-00"),
    (DATE_OR_TEXT, "postgresql", dt.date(2024, 2, 29), "2024-02-29"),
    (DATETIME_OR_TEXT, "mysql", "2024-05-06 07:08:09.123456",
     dt.datetime(2024, 5, 6, 7, 8, 9, 123456)),
    (INSTANT, "mysql", "2024-05-06 07:08:09.123456Z", dt.datetime(2024, 5, 6, 7, 8, 9, 123456)),
    (INSTANT, "postgresql", "2024-05-06 07:08:09Z", dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)),
    ("bytes", "postgresql", "00ff", b"\x00\xff"),
    ("bytes", "mysql", b"\x01", b"\x01"),
    ("boolean", "postgresql", 1, True),
    (SET, "postgresql", "a,b", ["a", "b"]),
    (SET, "postgresql", "", []),
    ("double", "mysql", "1.5", 1.5),
    (TIME_OF_DAY, "postgresql", "10:11:12", dt.time(10, 11, 12)),
])
def test_key_converters_take_event_key_text(avro: Any, dialect: Dialect, text: Any,
                                            expected: Any) -> None:
    got = converter(avro, dialect, key=True)(text)
    assert got == expected and type(got) is type(expected)


# -- normalize ------------------------------------------------------------------------


@pytest.mark.parametrize(("avro", "a", "b", "dialect"), [
    # Each pair: a source value and what a target driver reads back; equal after normalize.
    (fixed_dec(65, 30), D65, str(D65), "sqlite"),
    (fixed_dec(65, 30), Decimal("0E-30"), Decimal("0"), "mysql"),
    (fixed_dec(10, 2), Decimal("1.10"), Decimal("1.1"), "postgresql"),
    (fixed_dec(20, 0, 9), U64, "18446744073709551615", "sqlite"),
    ("float", f32(0.1), 0.1, "postgresql"),  # PostgreSQL prints the shortest float4 text
    ("double", math.nan, math.nan, "postgresql"),
    ("boolean", True, 1, "mysql"),
    (INSTANT, dt.datetime(2024, 3, 31, 5, 30, tzinfo=IST), dt.datetime(2024, 3, 31), "mysql"),
    (INSTANT, dt.datetime(2024, 3, 31, tzinfo=UTC),
     dt.datetime(2024, 3, 30, 17, tzinfo=dt.timezone(dt.timedelta(hours=-7))), "postgresql"),
    (INSTANT, dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), "1970-01-01 00:00:01.000000+00:00",
     "sqlite"),
    (DATETIME_OR_TEXT, dt.datetime(2024, 5, 6, 7, 8, 9, 500000), "2024-05-06 07:08:09.500000",
     "sqlite"),
    (DATETIME_OR_TEXT, "0000-00-00 00:00:00", "0000-00-00 00:00:00.000000", "mysql"),
    (DATETIME_OR_TEXT, "2021-02-31 10:00:00.5", "2021-02-31 10:00:00.500000", "mysql"),
    (DATETIME_OR_TEXT, "0000-00-00 00:00:00", None, "postgresql"),
    (DATE_OR_TEXT, "2021-02-31", None, "postgresql"),
    (DATE_OR_TEXT, dt.date(2024, 2, 29), "2024-02-29", "sqlite"),
    (TIME_OF_DAY, dt.time(12, 0, 0, 1), dt.timedelta(hours=12, microseconds=1), "mysql"),
    (TIME_OF_DAY, dt.time(12, 0, 0, 1), "12:00:00.000001", "sqlite"),
    (SET, ["b", "a"], "a,b", "mysql"),
    (SET, [], "", "sqlite"),
    (SET, ["a", "b", "c"], ["c", "b", "a"], "postgresql"),
    ("bytes", b"", memoryview(b""), "postgresql"),
    ("string", "😀", "😀", "mysql"),
    (SQLITE_ANY, 5, "5", "postgresql"),
    (SQLITE_ANY, 2.5, "2.5", "mysql"),
])
def test_normalize_makes_equal_values_equal(avro: Any, a: Any, b: Any, dialect: Dialect) -> None:
    assert normalize(a, avro, dialect=dialect) == normalize(b, avro, dialect=dialect)


def test_normalize_keeps_different_values_different() -> None:
    assert normalize(Decimal("1.1"), dec(10, 2)) != normalize(Decimal("1.2"), dec(10, 2))
    assert normalize(dt.datetime(2024, 1, 1, tzinfo=UTC), INSTANT) != normalize(
        dt.datetime(2024, 1, 1, tzinfo=IST), INSTANT)
    assert normalize("0000-00-00", DATE_OR_TEXT, dialect="mysql") != normalize(
        None, DATE_OR_TEXT, dialect="mysql")
    assert normalize(["a"], SET) != normalize([], SET)
    assert normalize(1, SQLITE_ANY, dialect="sqlite") != normalize("1", SQLITE_ANY,
                                                                   dialect="sqlite")
    assert normalize("0000-00-00", DATE_OR_TEXT, dialect="postgresql", key=True) == "0000-00-00"


def test_normalize_json_with_a_hint() -> None:
    src = '{"b": 1, "a": [1, 2.50, null]}'
    assert normalize(src, "string", sql_type="jsonb") == normalize(
        '{"a": [1, 2.5, null], "b": 1}', "string", sql_type="jsonb")
    # psycopg2 reads json/jsonb as Python values.
    assert normalize({"a": [1, 2.5, None], "b": 1}, "string", sql_type="jsonb") == normalize(
        src, "string", sql_type="jsonb")
    assert normalize(src, "string") != normalize('{"a": [1, 2.5, null], "b": 1}', "string")


def test_normalize_time_hint_and_numeric_text() -> None:
    assert normalize(dt.timedelta(microseconds=-1), "long", sql_type="time") == -1
    assert normalize("NaN", "string", sql_type="numeric") == normalize(
        Decimal("NaN"), "string", sql_type="numeric")
    assert normalize("1E+5", "string", sql_type="numeric") == Decimal("100000")


# -- property: what SQLite stores (the converted value itself) normalises back -------

_instants = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30),
                         timezones=st.just(UTC))
_decimals = st.decimals(min_value=Decimal("-1e35"), max_value=Decimal("1e35"), places=30,
                        allow_nan=False, allow_infinity=False)


@given(
    instant=_instants,
    local=st.datetimes(),
    day=st.dates(),
    decimal=_decimals,
    members=st.lists(st.sampled_from(["a", "b", "c", "d"]), unique=True),
    text=st.text(),
    blob=st.binary(),
    number=st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text()),
)
def test_sqlite_values_normalise_back(instant: dt.datetime, local: dt.datetime, day: dt.date,
                                      decimal: Decimal, members: list[str], text: str,
                                      blob: bytes, number: Any) -> None:
    for avro, value in [(INSTANT, instant), (DATETIME_OR_TEXT, local), (DATE_OR_TEXT, day),
                        (fixed_dec(65, 30), decimal), (SET, members), ("string", text),
                        ("bytes", blob), (SQLITE_NUMERIC, number)]:
        stored = converter(avro, "sqlite")(value)
        assert normalize(stored, avro, dialect="sqlite") == normalize(value, avro,
                                                                      dialect="sqlite")


@given(st.datetimes(min_value=dt.datetime(1000, 1, 2), max_value=dt.datetime(9999, 12, 30),
                    timezones=st.sampled_from([UTC, IST, dt.timezone(dt.timedelta(hours=-8))])))
def test_mysql_instants_are_utc_whatever_their_zone(value: dt.datetime) -> None:
    stored = converter(INSTANT, "mysql")(value)
    assert stored.tzinfo is None
    assert stored.replace(tzinfo=UTC) == value
    assert normalize(stored, INSTANT, dialect="mysql") == normalize(value, INSTANT)


def test_hints_that_are_not_used() -> None:
    # A SET/ENUM hint goes into DDL as is: only quoted labels are taken.
    assert column_type("string", "mysql", sql_type="enum('a'); DROP TABLE t; --") == MYSQL_TEXT
    assert column_type("string", "mysql", sql_type="enum('it''s','b\\'c')") == (
        "enum('it''s','b\\'c')")
    # An array's text says nothing about its length or type.
    assert column_type("string", "mysql", key=True,
                       sql_type="character varying(20)[]") == MYSQL_KEY_TEXT
    assert column_type("string", "postgresql", sql_type="numeric[]") == "text"
    # A SET/ENUM hint means nothing to PostgreSQL and SQLite.
    assert column_type(SET, "postgresql", sql_type="set('a')") == "text[]"
