"""The type mapping against real targets: for each target (PostgreSQL, MariaDB, SQLite),
a table with ``column_type`` columns receives ``converter``-converted edge values of every
Avro type the fetchers produce; what the driver reads back normalises equal to the
original (``normalize``), as a value column and, where a type can be a key, as a
primary key column.

The MariaDB session that writes runs the mapping's session settings and then moves its
``time_zone`` to '+05:30', and the one that reads is at '-08:00': instants still land
and read back as the same UTC instants (the trap: pymysql drops a datetime's tzinfo and
MySQL's TIMESTAMP shifts by the session zone). The PostgreSQL sessions use
Asia/Kolkata and America/Los_Angeles for the same reason.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import pymysql
import pytest

from databus.fetchers.mysql._types import decimal_fixed_size
from databus.replicator import (
    MYSQL_SESSION_SQL,
    column_type,
    converter,
    normalize,
    nullable,
)
from databus.replicator._model import Dialect
from tests.fixtures.servers import MariaDBServer, PostgresServer

pytestmark = pytest.mark.integration

UTC = dt.UTC
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))
DB = "repl_types"


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _dec(p: int, s: int, fixed: bool = True) -> dict[str, Any]:
    if fixed:
        return {"type": "fixed", "name": f"decimal_{p}_{s}", "size": decimal_fixed_size(p),
                "logicalType": "decimal", "precision": p, "scale": s}
    return {"type": "bytes", "logicalType": "decimal", "precision": p, "scale": s}


DATE_OR_TEXT = [{"type": "int", "logicalType": "date"}, "string"]
DATETIME_OR_TEXT = [{"type": "long", "logicalType": "local-timestamp-micros"}, "string"]
INSTANT = {"type": "long", "logicalType": "timestamp-micros"}
LOCAL = {"type": "long", "logicalType": "local-timestamp-micros"}
TIME_OF_DAY = {"type": "long", "logicalType": "time-micros"}
SET = {"type": "array", "items": "string"}
MAX_TIME = ((838 * 60 + 59) * 60 + 59) * 10**6


@dataclass
class Case:
    name: str
    avro: Any
    values: list[Any]
    sql_type: str | None = None
    # Values only some targets can hold (e.g. non-UTF-8 bytes in a dynamic column).
    extra: dict[str, list[Any]] = field(default_factory=dict)
    key_values: list[Any] | None = None  # distinct values to use it as a key; None: no key


CASES = [
    Case("int", "int", [0, -(2**31), 2**31 - 1], key_values=[0, -(2**31), 2**31 - 1]),
    Case("bigint", "long", [0, -(2**63), 2**63 - 1], key_values=[-(2**63), 2**63 - 1]),
    Case("bit1", "boolean", [True, False], key_values=[True, False]),
    Case("float", "float", [_f32(0.1), _f32(3.4028234663852886e38), _f32(1.401298464324817e-45),
                            _f32(16777217.0), _f32(1.2345678), -_f32(2.5e-38)],
         key_values=[_f32(0.1), _f32(1.2345678)]),
    Case("double", "double", [0.1, 1.7976931348623157e308, 5e-324, float(2**53 + 2), -1.5e-300],
         extra={"postgresql": [float("inf"), float("-inf"), float("nan")],
                "sqlite": [float("inf"), float("-inf")]},
         key_values=[0.1, 5e-324]),
    Case("decimal_65_30", _dec(65, 30), [
        Decimal("99999999999999999999999999999999999.999999999999999999999999999999"),
        Decimal("-99999999999999999999999999999999999.999999999999999999999999999999"),
        Decimal("0E-30"), Decimal("0.000000000000000000000000000001")],
        key_values=[Decimal("0E-30"), Decimal("-0.000000000000000000000000000001")]),
    Case("bigint_unsigned", _dec(20, 0), [Decimal(2**64 - 1), Decimal(0), Decimal(2**63)],
         key_values=[Decimal(2**64 - 1), Decimal(0)]),
    Case("decimal_10_2", _dec(10, 2), [Decimal("-123.45"), Decimal("99999999.99")],
         key_values=[Decimal("-123.45"), Decimal("1.10")]),
    Case("pg_numeric", _dec(40, 10, fixed=False),
         [Decimal("123456789012345678901234567890.1234567891")]),
    Case("numeric_text", "string", ["123456789012345678901234567890.123456789", "-1E+5"],
         sql_type="numeric", extra={"postgresql": ["NaN"], "sqlite": ["NaN"]}),
    Case("date", DATE_OR_TEXT, [dt.date(1000, 1, 1), dt.date(9999, 12, 31), dt.date(2024, 2, 29),
                                "0000-00-00", "2020-00-15", "2021-02-31"],
         key_values=[dt.date(2024, 2, 29), "0000-00-00", "2021-02-31"]),
    Case("pg_date", {"type": "int", "logicalType": "date"},
         [dt.date(1000, 1, 1), dt.date(2024, 2, 29)], key_values=[dt.date(2024, 2, 29)]),
    Case("datetime6", DATETIME_OR_TEXT, [
        dt.datetime(2024, 5, 6, 7, 8, 9, 123456), dt.datetime(1000, 1, 1),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(2038, 1, 19, 3, 14, 8),
        "0000-00-00 00:00:00", "0000-00-00 00:00:00.000000", "2021-02-31 10:00:00.5"],
        key_values=[dt.datetime(2024, 5, 6, 7, 8, 9, 123456), "0000-00-00 00:00:00.000000"]),
    Case("timestamp", INSTANT, [
        dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),  # TIMESTAMP's first value
        dt.datetime(1970, 1, 1, tzinfo=UTC),  # the zero TIMESTAMP, as the binlog sends it
        dt.datetime(2038, 1, 19, 3, 14, 8, 1, tzinfo=UTC),  # past 32-bit TIMESTAMP
        dt.datetime(2106, 2, 7, 6, 28, 16, tzinfo=UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(2024, 3, 31, 5, 30, tzinfo=IST),  # not UTC: must land as 00:00 UTC
    ], key_values=[dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
                   dt.datetime(2038, 1, 19, 3, 14, 8, 1, tzinfo=UTC)]),
    Case("pg_timestamp", LOCAL, [dt.datetime(2024, 5, 6, 7, 8, 9, 1), dt.datetime(1000, 1, 1)],
         key_values=[dt.datetime(2024, 5, 6, 7, 8, 9, 1)]),
    Case("pg_time", TIME_OF_DAY, [dt.time(0), dt.time(23, 59, 59, 999999), dt.time(12, 0, 0, 1)],
         key_values=[dt.time(0), dt.time(23, 59, 59, 999999)]),
    Case("mysql_time", "long", [-MAX_TIME, MAX_TIME, 0, -1, 1], sql_type="time(6)",
         key_values=[-1, 0, MAX_TIME]),
    Case("text", "string", ["", "plain ascii", "3-byte: é€日本語", "4-byte: 😀𝄞🀄",
                            "quote ' backslash \\ tab \t nl \n", "x" * 100_000],
         extra={"mysql": ["NUL \x00 inside"], "sqlite": ["NUL \x00 inside"]},
         key_values=["a", "A", "é", "😀", ""]),
    Case("varchar_hint", "string", ["abc", "😀" * 40], sql_type="character varying(40)",
         key_values=["abc", "😀" * 40]),
    Case("enum", "string", ["", "small", "large"], key_values=["", "small"]),
    Case("enum_hint", "string", ["small", "large"], sql_type="enum('small','large')",
         key_values=["small", "large"]),
    Case("json_text", "string", ['{"a": [1, 2.50, null], "b": "😀"}', "[]"]),
    Case("jsonb", "string", ['{"a": [1, 2.50, null], "b": "😀"}', "[]", '"x"', "1e2"],
         sql_type="jsonb", key_values=['{"a": 1}', "[]"]),
    Case("json", "string", ['{"b": 1,  "a": [1, 2.50]}', "[]"], sql_type="json",
         key_values=['{"a": 1}', "[]"]),
    Case("blob", "bytes", [b"", b"\x00\xff" * 10, os.urandom(70_000)],
         key_values=[b"\x00", b"\x00\x00", b"\xff", b""]),
    Case("bit64", "bytes", [b"\xff" * 8, b"\x00" * 8]),
    Case("geometry", "bytes", [bytes.fromhex("00000000" "0101000000" "000000000000f03f"
                                             "0000000000000040")]),
    Case("set", SET, [[], ["a"], ["a", "b", "c"]], key_values=[[], ["a"], ["a", "c"]]),
    Case("set_hint", SET, [[], ["a", "c"], ["a", "b", "c"]], sql_type="set('a','b','c')",
         key_values=[[], ["b"]]),
    Case("sqlite_numeric", ["long", "double", "string"], [1, 1.5, "text", -(2**63)],
         key_values=[1, 1.5, "text"]),
    Case("sqlite_any", ["bytes", "long", "double", "string"], [1, 2.5, "t", b"abc"],
         extra={"sqlite": [b"\x00\x01\xff"]}, key_values=[1, "t"]),
]
for _case in CASES:  # every case also as a nullable column holding NULL
    _case.values.append(None)

DIALECTS: list[Dialect] = ["postgresql", "mysql", "sqlite"]


class Target:
    """One target database: statements with the driver's placeholders, rows back."""

    def __init__(self, dialect: Dialect, write: Any, read: Any) -> None:
        self.dialect = dialect
        self.write = write
        self.read = read
        self.mark = "?" if dialect == "sqlite" else "%s"

    def execute(self, sql: str, params: Any = ()) -> None:
        cur = self.write.cursor()
        cur.execute(sql, params)
        cur.close()
        if self.dialect == "sqlite":
            self.write.commit()

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        cur = self.write.cursor()
        cur.executemany(sql, rows)
        cur.close()
        if self.dialect == "sqlite":
            self.write.commit()

    def select(self, sql: str) -> list[tuple[Any, ...]]:
        cur = self.read.cursor()
        cur.execute(sql)
        rows = list(cur.fetchall())
        cur.close()
        return rows

    def close(self) -> None:
        self.write.close()
        self.read.close()


def _mysql_session(server: MariaDBServer, zone: str) -> Any:
    conn = pymysql.connect(**server.connect_kwargs(database=DB, charset="utf8mb4"))
    with conn.cursor() as cur:
        for statement in MYSQL_SESSION_SQL:
            cur.execute(statement)
        cur.execute(f"SET time_zone = '{zone}'")  # not UTC, on purpose
    return conn


def _postgres_session(server: PostgresServer, zone: str) -> Any:
    conn = psycopg2.connect(**server.connect_kwargs())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"SET TIME ZONE '{zone}'")
        cur.execute(f"SET search_path TO {DB}")
    return conn


@pytest.fixture(scope="module", params=DIALECTS)
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Target]:
    dialect: Dialect = request.param
    if dialect == "sqlite":
        path: Path = tmp_path_factory.mktemp("repl_types") / "target.db"
        t = Target(dialect, sqlite3.connect(path), sqlite3.connect(path))
    elif dialect == "mysql":
        server: MariaDBServer = request.getfixturevalue("mariadb_server")
        admin = pymysql.connect(**server.connect_kwargs(database=None))
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {DB}")
            cur.execute(f"CREATE DATABASE {DB}")
        admin.close()
        t = Target(dialect, _mysql_session(server, "+05:30"), _mysql_session(server, "-08:00"))
    else:
        pg: PostgresServer = request.getfixturevalue("postgres_server")
        admin = psycopg2.connect(**pg.connect_kwargs())
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"DROP SCHEMA IF EXISTS {DB} CASCADE")
            cur.execute(f"CREATE SCHEMA {DB}")
        admin.close()
        t = Target(dialect, _postgres_session(pg, "Asia/Kolkata"),
                   _postgres_session(pg, "America/Los_Angeles"))
    try:
        yield t
    finally:
        t.close()


def _nullable_type(avro: Any) -> Any:
    return ["null", *avro] if isinstance(avro, list) else ["null", avro]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_values_round_trip(target: Target, case: Case) -> None:
    dialect = target.dialect
    avro = _nullable_type(case.avro)
    ddl = column_type(avro, dialect, sql_type=case.sql_type)
    assert nullable(avro, dialect)
    table = f"v_{case.name}"
    target.execute(f"DROP TABLE IF EXISTS {table}")
    target.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, v {ddl} NULL)")
    convert = converter(avro, dialect, sql_type=case.sql_type)
    values = [*case.values, *case.extra.get(dialect, [])]
    m = target.mark
    target.executemany(f"INSERT INTO {table} (id, v) VALUES ({m}, {m})",
                       [(i, convert(v)) for i, v in enumerate(values)])
    rows = target.select(f"SELECT id, v FROM {table} ORDER BY id")
    assert [r[0] for r in rows] == list(range(len(values)))
    for (_, read), original in zip(rows, values, strict=True):
        want = normalize(original, avro, dialect=dialect, sql_type=case.sql_type)
        got = normalize(read, avro, dialect=dialect, sql_type=case.sql_type)
        assert got == want, f"{case.name} on {dialect} ({ddl}): wrote {original!r}, read {read!r}"


KEY_CASES = [c for c in CASES if c.key_values is not None]


@pytest.mark.parametrize("case", KEY_CASES, ids=[c.name for c in KEY_CASES])
def test_keys_round_trip_and_stay_distinct(target: Target, case: Case) -> None:
    dialect = target.dialect
    assert case.key_values is not None
    ddl = column_type(case.avro, dialect, key=True, sql_type=case.sql_type)
    table = f"k_{case.name}"
    target.execute(f"DROP TABLE IF EXISTS {table}")
    target.execute(f"CREATE TABLE {table} (k {ddl} NOT NULL PRIMARY KEY)")
    convert = converter(case.avro, dialect, key=True, sql_type=case.sql_type)
    m = target.mark
    # One statement per key: a duplicate (two source keys one target key) fails here.
    for value in case.key_values:
        target.execute(f"INSERT INTO {table} (k) VALUES ({m})", (convert(value),))
    rows = target.select(f"SELECT k FROM {table}")

    def norm(v: Any) -> Any:
        n = normalize(v, case.avro, dialect=dialect, key=True, sql_type=case.sql_type)
        return repr(n) if isinstance(n, dict | list) else n

    assert sorted(map(repr, (norm(r[0]) for r in rows))) == sorted(
        map(repr, (norm(v) for v in case.key_values))), f"{case.name} on {dialect} ({ddl})"


def test_instants_are_utc_in_the_target_whatever_the_session_zone(target: Target) -> None:
    """The stored text itself is the UTC instant: a reader that does not go through
    ``normalize`` (another tool, a SQL query) sees UTC, not the writer's zone."""
    ddl = column_type(INSTANT, target.dialect)
    target.execute("DROP TABLE IF EXISTS instant_text")
    target.execute(f"CREATE TABLE instant_text (id INTEGER PRIMARY KEY, v {ddl})")
    value = dt.datetime(2024, 3, 31, 5, 30, 0, 250000, tzinfo=IST)
    m = target.mark
    target.execute(f"INSERT INTO instant_text VALUES (1, {m})",
                   (converter(INSTANT, target.dialect)(value),))
    if target.dialect == "postgresql":
        (text,), = target.select("SELECT to_char(v AT TIME ZONE 'UTC', "
                                 "'YYYY-MM-DD HH24:MI:SS.US') FROM instant_text")
    elif target.dialect == "mysql":
        (text,), = target.select("SELECT CAST(v AS CHAR) FROM instant_text")
    else:
        (text,), = target.select("SELECT v FROM instant_text")
        assert text.endswith("+00:00")
        (text,), = target.select("SELECT strftime('%Y-%m-%d %H:%M:%f', v) FROM instant_text")
        text += "000"  # strftime's %f has milliseconds
    assert text == "2024-03-31 00:00:00.250000"



def test_why_not_timestamp_on_mysql(mariadb_server: MariaDBServer) -> None:
    """The trap the mapping avoids: the same naive UTC value written into a MySQL
    TIMESTAMP by a +05:30 session reads back 13.5 hours off in a -08:00 session (and a
    TIMESTAMP cannot hold 2038-01-19 03:14:08 at all), while DATETIME(6) keeps it."""
    writer = pymysql.connect(**mariadb_server.connect_kwargs())
    reader = pymysql.connect(**mariadb_server.connect_kwargs())
    try:
        with writer.cursor() as w, reader.cursor() as r:
            w.execute("SET time_zone = '+05:30'")
            r.execute("SET time_zone = '-08:00'")
            w.execute("DROP TABLE IF EXISTS repl_ts_trap")
            w.execute(f"CREATE TABLE repl_ts_trap (ts TIMESTAMP(6) NULL, "
                      f"dt {column_type(INSTANT, 'mysql')} NULL)")
            value = converter(INSTANT, "mysql")(dt.datetime(2024, 3, 31, tzinfo=UTC))
            w.execute("INSERT INTO repl_ts_trap VALUES (%s, %s)", (value, value))
            r.execute("SELECT ts, dt FROM repl_ts_trap")
            ts, kept = r.fetchone()
            assert kept == value
            assert ts == value - dt.timedelta(hours=13, minutes=30)
            w.execute("SET sql_mode = 'STRICT_ALL_TABLES'")
            w.execute("SET time_zone = '+00:00'")
            with pytest.raises(pymysql.err.MySQLError):
                w.execute("INSERT INTO repl_ts_trap (ts) VALUES ('2038-01-19 03:14:08')")
            w.execute("INSERT INTO repl_ts_trap (dt) VALUES ('2038-01-19 03:14:08')")
            w.execute("DROP TABLE repl_ts_trap")
    finally:
        writer.close()
        reader.close()
