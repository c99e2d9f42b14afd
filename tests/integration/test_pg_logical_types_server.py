"""The logical fetcher's type mapping against a real PostgreSQL 15: a table with a column
of every mapped type (arrays, an enum, domains among them) gets rows of real values,
edge values and NULLs in one transaction; pgoutput itself (a logical slot peeked with
``pg_logical_slot_peek_binary_changes``, so the text is exactly what the fetcher will
receive, produced by the output functions under this session's settings) gives each
column's type OID and modifier (Relation) and each value's text (Insert).
``load_types`` + ``column_mapping`` + ``convert`` must give what psycopg2 returns for
the same column, normalised (UTC instants, bytes, lists), or the documented text form
(PostgreSQL's own text at TimeZone UTC and IntervalStyle iso_8601) where psycopg2 is
lossy or cannot read the value (infinity, BC, 24:00:00, intervals, json).

Session settings the converters do not depend on (TimeZone, bytea_output,
IntervalStyle) change pgoutput's text but not the converted values; a DateStyle
other than ISO is refused with a PgValueError that says so."""

from __future__ import annotations

import datetime as dt
import io
import itertools
import json
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databus.fetchers.postgres._types import (
    ColumnMapping,
    PgValueError,
    column_mapping,
    load_types,
    parse_array,
    share_named_types,
)
from tests.fixtures.servers import PostgresServer

pytestmark = pytest.mark.integration

UTC = dt.UTC
DB = "pg_logical_types"
SLOT = "types_slot"
PUBLICATION = "types_pub"

SETUP = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN price AS numeric(10,2) CHECK (VALUE >= 0)",
    "CREATE DOMAIN doc AS jsonb",
]

# column, type, SQL literals of rows 1, 2, ... (a missing or None literal: NULL). The
# last row is NULL everywhere.
COLUMNS: list[tuple[str, str, list[str | None]]] = [
    ("c_int2", "smallint", ["1", "-32768", "32767"]),
    ("c_int4", "integer", ["42", "-2147483648", "2147483647"]),
    ("c_int8", "bigint", ["42", "-9223372036854775808", "9223372036854775807"]),
    ("c_num", "numeric(10,2)", ["19.99", "-99999999.99", "99999999.99", "0"]),
    ("c_num_neg", "numeric(5,-2)", ["12345", "-9999900", "0"]),
    ("c_num_small", "numeric(2,5)", ["0.00012", "-0.00099"]),
    ("c_numeric", "numeric", ["3.14159265358979323846264338327950288419716939937510",
                              "'NaN'", "'Infinity'", "'-Infinity'", "-0.000001",
                              "1e100"]),
    ("c_real", "real", ["0.1", "'NaN'", "'Infinity'", "'-Infinity'", "'-0'",
                        "3.4028235e38", "1e-45", "1.17549435e-38"]),
    ("c_double", "double precision", ["0.1", "'NaN'", "'Infinity'", "'-Infinity'", "'-0'",
                                      "1.7976931348623157e308", "5e-324"]),
    ("c_bool", "boolean", ["true", "false"]),
    ("c_text", "text", ["'héllo'", "''", "E'tab\\t nl\\n quote'' dq\" bs\\\\ 😀'",
                        "repeat('x', 3000)"]),
    ("c_varchar", "varchar(5)", ["'abcde'", "''", "' a '"]),
    ("c_char", "char(5)", ["'ab'", "''", "'abcde'"]),
    ("c_bytea", "bytea", ["'\\x0001ff5c27'", "''", "'abc'", "decode(repeat('ff', 2000), 'hex')"]),
    ("c_date", "date", ["'2024-02-29'", "'infinity'", "'-infinity'", "'0044-03-15 BC'",
                        "'10000-01-01'", "'0001-01-01'", "'9999-12-31'", "'4713-01-01 BC'",
                        "'5874897-12-31'"]),
    ("c_time", "time", ["'03:04:05.123456'", "'24:00:00'", "'00:00:00'",
                        "'23:59:59.999999'"]),
    ("c_time3", "time(3)", ["'03:04:05.123456'"]),
    ("c_timetz", "timetz", ["'03:04:05.123+05:30'", "'24:00:00-15:59'",
                            "'00:00:00+00'"]),
    ("c_ts", "timestamp", ["'2024-01-02 03:04:05.123456'", "'infinity'", "'-infinity'",
                           "'4713-01-01 00:00:00 BC'", "'294276-12-31 23:59:59.999999'",
                           "'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'",
                           "'0044-03-15 12:00:00 BC'"]),
    ("c_ts0", "timestamp(0)", ["'2024-01-02 03:04:05.6'"]),
    ("c_tstz", "timestamptz", ["'2024-01-02 03:04:05.123456+00'", "'infinity'",
                               "'-infinity'", "'1900-01-01 00:00:00 Europe/Amsterdam'",
                               "'0001-01-01 00:00:00+00'", "'9999-12-31 23:59:59.999999+00'",
                               "'10000-01-01 00:00:00+00'", "'0044-03-15 12:00:00+00 BC'",
                               "'2024-06-30 23:59:59.5-08'"]),
    ("c_interval", "interval", ["'1 year 2 months -3 days 04:05:06.789'", "'0'",
                                "'-1 mon'", "'1 day -1 sec'", "'-178000000 years'",
                                "'0.000001 sec'", "'-2147483648 days'",
                                "'2562047788:00:54.775807'",
                                "interval '-2562047788:00:54.775807' - interval '1 microsecond'"]),
    ("c_interval_ym", "interval year to month", ["'1 year 5 months'"]),
    ("c_uuid", "uuid", ["'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
                        "'00000000-0000-0000-0000-000000000000'"]),
    ("c_json", "json", ["'{\"b\": [1, 2.50, null], \"a\": \"x\"}'", "'[]'", "'\"s\"'",
                        "'  1  '"]),
    ("c_jsonb", "jsonb", ["'{\"b\": [1, 2.50, null], \"a\": \"x\"}'", "'null'",
                          "'{\"deep\": {\"k\": \"é\\\\u0001\"}}'"]),
    ("c_mood", "mood", ["'happy'", "'sad'"]),
    ("c_inet", "inet", ["'192.168.0.1/24'", "'::1'", "'10.0.0.1'"]),
    ("c_cidr", "cidr", ["'10.0.0.0/8'", "'2001:db8::/32'"]),
    ("c_money", "money", ["'1234.56'", "'-92233720368547758.08'",
                          "'92233720368547758.07'"]),
    ("c_price", "price", ["'19.99'", "'0'"]),
    ("c_doc", "doc", ["'{\"a\": 1}'"]),
    ("c_oid", "oid", ["4294967295", "0"]),
    ("c_point", "point", ["'(1.5,2)'"]),
    ("c_range", "int4range", ["'[1,10)'", "'empty'"]),
    ("c_int_arr", "integer[]", ["'{1,NULL,-3}'", "'{{1,2},{3,4}}'", "'{}'",
                                "'[0:1]={7,8}'", "'{{{1}},{{NULL}}}'",
                                "'{{{{{{6}}}}}}'"]),
    ("c_text_arr", "text[]", ["ARRAY['a', 'b,c', 'q\"x', 'b\\s', '', ' s ', NULL, 'NULL',"
                              " '{}', 'é', 'x;y']", "'{}'", "ARRAY[ARRAY['a b','c'],"
                              " ARRAY[NULL,'d']]"]),
    ("c_num_arr", "numeric(6,2)[]", ["'{1.5,NULL,-2}'", "'{{1},{2}}'"]),
    ("c_date_arr", "date[]", ["'{2024-02-29,NULL,0001-01-01}'"]),
    ("c_date_edge_arr", "date[]", ["'{infinity,\"0044-03-15 BC\",10000-01-01}'"]),
    ("c_tstz_arr", "timestamptz[]", ["ARRAY['2024-01-02 03:04:05+05:30', "
                                     "'0001-01-01 00:00:00+00', NULL]::timestamptz[]"]),
    ("c_bool_arr", "boolean[]", ["'{{t,f},{NULL,t}}'"]),
    ("c_bytea_arr", "bytea[]", ["ARRAY['\\x00ff'::bytea, NULL, '']"]),
    ("c_mood_arr", "mood[]", ["'{sad,happy,NULL}'"]),
    ("c_price_arr", "price[]", ["'{1.00,2.50}'"]),
    ("c_char_arr", "char(3)[]", ["'{a,abc}'"]),
    ("c_box_arr", "box[]", ["'{\"(1,2),(3,4)\";\"(0,0),(1,1)\"}'"]),
    ("c_interval_arr", "interval[]", ["'{\"1 day\",\"-1 sec\"}'"]),
]
ROWS = max(len(v) for _, _, v in COLUMNS) + 1

# Columns whose expected values come from PostgreSQL's own text (at TimeZone UTC,
# DateStyle ISO, IntervalStyle iso_8601) instead of psycopg2, which reads intervals as
# timedeltas (30-day months), timetz as time objects, ranges as Range objects, numeric
# NaN as Decimal, and arrays of enums, domains and boxes as unparsed text.
SPECIAL: dict[str, Callable[[str], Any]] = {
    "c_numeric": str, "c_interval": str, "c_interval_ym": str, "c_timetz": str,
    "c_range": str, "c_interval_arr": parse_array,
    "c_date_edge_arr": parse_array,  # infinity, BC, 10000-01-01: each element's text
    "c_box_arr": lambda t: parse_array(t, delimiter=";"),
    "c_mood_arr": parse_array, "c_price_arr": lambda t: parse_array(t, Decimal),
}
UTC_ISO_SESSION = ["SET TimeZone = 'UTC'", "SET DateStyle = ISO",
                   "SET IntervalStyle = iso_8601"]


@dataclass
class Captured:
    """What pgoutput sent: (name, type oid, typmod) per column; text values per row."""

    columns: list[tuple[str, int, int]]
    rows: list[list[str | None]]


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(b"\0", pos)
    return data[pos:end].decode(), end + 1


def decode_pgoutput(messages: list[bytes]) -> Captured:
    """The Relation and Insert messages (protocol version 1) of one table."""
    columns: list[tuple[str, int, int]] = []
    rows: list[list[str | None]] = []
    for msg in messages:
        if msg[:1] == b"R":
            pos = 5
            _, pos = _cstring(msg, pos)  # namespace
            _, pos = _cstring(msg, pos)  # relation name
            pos += 1  # replica identity
            (natts,) = struct.unpack_from(">h", msg, pos)
            pos += 2
            columns = []
            for _ in range(natts):
                pos += 1  # flags
                name, pos = _cstring(msg, pos)
                oid, typmod = struct.unpack_from(">Ii", msg, pos)
                pos += 8
                columns.append((name, oid, typmod))
        elif msg[:1] == b"I":
            assert msg[5:6] == b"N"
            (ncols,) = struct.unpack_from(">h", msg, 6)
            pos = 8
            row: list[str | None] = []
            for _ in range(ncols):
                kind = msg[pos:pos + 1]
                pos += 1
                if kind == b"n":
                    row.append(None)
                elif kind == b"t":
                    (length,) = struct.unpack_from(">i", msg, pos)
                    pos += 4
                    row.append(msg[pos:pos + length].decode("utf-8"))
                    pos += length
                else:
                    raise AssertionError(f"unexpected tuple kind {kind!r}")
            rows.append(row)
    return Captured(columns, rows)


class Db:
    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.conn = self.connect()

    def connect(self) -> Any:
        conn = psycopg2.connect(**self.server.connect_kwargs(DB))
        conn.autocommit = True
        return conn

    def peek(self, *session: str) -> Captured:
        """pgoutput's messages for the slot, decoded in a session with ``session``
        settings (the output functions run in this backend, with its settings)."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for statement in session:
                    cur.execute(statement)
                cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, "
                            "NULL, 'proto_version', '1', 'publication_names', %s)",
                            (SLOT, PUBLICATION))
                return decode_pgoutput([bytes(r[0]) for r in cur.fetchall()])
        finally:
            conn.close()

    def query(self, sql: str, *session: str) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for statement in session:
                    cur.execute(statement)
                cur.execute(sql)
                rows: list[tuple[Any, ...]] = cur.fetchall()
                return rows
        finally:
            conn.close()


@pytest.fixture(scope="module")
def db(postgres_server: PostgresServer) -> Iterator[Db]:
    admin = psycopg2.connect(**postgres_server.connect_kwargs("postgres"))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s", (SLOT,))
        cur.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{DB}"')
    database = Db(postgres_server)
    with database.conn.cursor() as cur:
        for statement in SETUP:
            cur.execute(statement)
        cur.execute("CREATE TABLE t (id int PRIMARY KEY, "
                    + ", ".join(f"{name} {sql_type}" for name, sql_type, _ in COLUMNS) + ")")
        cur.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    database.conn.autocommit = False
    with database.conn.cursor() as cur:
        # The fixture's server commits asynchronously; logical decoding reads only WAL
        # that is flushed: this commit waits for its flush.
        cur.execute("SET LOCAL synchronous_commit = on")
        for i in range(ROWS):
            literals = [(v[i] if i < len(v) else None) or "NULL" for _, _, v in COLUMNS]
            cur.execute(f"INSERT INTO t VALUES ({i + 1}, {', '.join(literals)})")
    database.conn.commit()
    database.conn.autocommit = True
    yield database
    database.conn.close()
    with admin.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        cur.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    admin.close()


def mappings(db: Db, captured: Captured) -> list[ColumnMapping]:
    with db.conn.cursor() as cur:
        types = load_types(cur, {oid for _, oid, _ in captured.columns})
    return [column_mapping(oid, typmod, types) for _, oid, typmod in captured.columns]


def converted(db: Db, *session: str) -> tuple[Captured, list[ColumnMapping], list[list[Any]]]:
    captured = db.peek(*session)
    maps = mappings(db, captured)
    values = [[mp.convert(text) if text is not None else None
               for mp, text in zip(maps, row, strict=True)] for row in captured.rows]
    return captured, maps, values


# -- comparison -----------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        assert value[0] == "string" and len(value) == 2
        return value[1]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _normal(value: Any) -> Any:
    """psycopg2's value, as the mapping gives it."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    return value


def _equal(got: Any, want: Any) -> bool:
    if isinstance(want, float):
        return isinstance(got, float) and (
            (math.isnan(got) and math.isnan(want))
            or (got == want and math.copysign(1, got) == math.copysign(1, want)))
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(
            _equal(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dt.datetime) and want.tzinfo is not None:
        return isinstance(got, dt.datetime) and got.tzinfo is UTC and got == want
    return type(got) is type(want) and got == want


def _has_text_branch(value: Any) -> bool:
    if isinstance(value, tuple):
        return True
    return isinstance(value, list) and any(_has_text_branch(v) for v in value)


def _lenient(base: Any) -> Any:
    """psycopg2's date/time typecaster, giving the text of what it cannot read (BC,
    years after 9999) instead of failing the whole query."""
    def cast(value: Any, cur: Any) -> Any:
        try:
            return base(value, cur)
        except (ValueError, OverflowError, psycopg2.DataError):
            return value

    return psycopg2.extensions.new_type(base.values, f"{base.name}_LENIENT", cast)


def test_every_type_against_psycopg2(db: Db) -> None:
    captured, maps, values = converted(db)
    names = [name for name, _, _ in COLUMNS]
    assert [c[0] for c in captured.columns] == ["id", *names]
    assert len(captured.rows) == ROWS
    conn = db.connect()
    for base in (psycopg2.extensions.DATE, psycopg2.extensions.PYDATETIME,
                 psycopg2.extensions.PYDATETIMETZ, psycopg2.extensions.TIME):
        psycopg2.extensions.register_type(_lenient(base), conn)
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, {', '.join(n for n in names if n not in SPECIAL)} FROM t")
        by_driver = {r[0]: r[1:] for r in cur.fetchall()}
    conn.close()
    texts = {r[0]: r[1:] for r in db.query(
        "SELECT id, " + ", ".join(f"{n}::text" for n in names) + " FROM t", *UTC_ISO_SESSION)}
    checked = 0
    for row in values:
        row_id = row[0]
        assert isinstance(row_id, int)
        driver = iter(by_driver[row_id])
        for name, mapping, value, text in zip(names, maps[1:], row[1:], texts[row_id],
                                              strict=True):
            want = None if name in SPECIAL else _normal(next(driver))
            what = f"row {row_id} {name} ({mapping.sql_type}): {value!r}"
            if text is None:
                assert value is None and want is None, what
                continue
            if name in SPECIAL:
                assert _plain(value) == SPECIAL[name](text), what
            elif _has_text_branch(value):
                # infinity, BC, year 10000+, 24:00:00: PostgreSQL's text at UTC
                assert not isinstance(value, list) and _plain(value) == text, what
            elif name in ("c_json", "c_jsonb", "c_doc"):
                assert isinstance(value, str) and json.loads(value) == want, what
                assert value == text, what
            else:
                assert _equal(value, want), f"{what} != {want!r}"
            checked += 1
    assert checked > 140

def test_sql_types_are_format_type(db: Db) -> None:
    """sql_type is format_type() of the column with an empty search_path (user types
    schema-qualified), a domain its base type's."""
    _, maps, _ = converted(db)
    rows = db.query(
        "SELECT a.attname, format_type(COALESCE(NULLIF(t.typbasetype, 0), a.atttypid), "
        "CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END), "
        "CASE WHEN e.typtype = 'd' THEN format_type(e.typbasetype, e.typtypmod) END "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A' "
        "WHERE a.attrelid = 'public.t'::regclass AND a.attnum > 0 ORDER BY a.attnum",
        "SET search_path = ''")
    for (name, want, element_base), mapping in zip(rows, maps, strict=True):
        if element_base is not None:  # an array of a domain: its base's array
            want = f"{element_base}[]"
        assert mapping.sql_type == want, name


def test_values_write_and_read_back_with_fastavro(db: Db) -> None:
    """One record of all columns (two named decimals shared), every row written with
    fastavro and read back equal (real values through single precision)."""
    captured, maps, values = converted(db)
    fields = share_named_types([mp.avro for mp in maps])
    schema = parse_schema({"type": "record", "name": "t", "namespace": "public", "fields": [
        {"name": name, "type": ["null", *(a if isinstance(a, list) else [a])],
         "default": None} for (name, _, _), a in zip(captured.columns, fields, strict=True)]})
    for row in values:
        record = {name: value for (name, _, _), value in zip(captured.columns, row,
                                                             strict=True)}
        buf = io.BytesIO()
        schemaless_writer(buf, schema, record)
        buf.seek(0)
        back: Any = schemaless_reader(buf, schema, schema)
        for name, value in record.items():
            want = _plain(value)
            if name == "c_real" and isinstance(value, float):
                want = struct.unpack("<f", struct.pack("<f", value))[0]
            assert _equal(back[name], want) or (want != want and back[name] != back[name]), \
                (name, back[name], want)


@pytest.mark.parametrize("session", [
    ["SET TimeZone = 'Asia/Kolkata'"],
    ["SET TimeZone = 'America/St_Johns'"],  # -03:30 / -02:30
    ["SET TimeZone = 'Pacific/Kiritimati'"],  # +14
    ["SET bytea_output = 'escape'"],
    ["SET IntervalStyle = 'iso_8601'"],
    ["SET extra_float_digits = 3"],
    ["SET DateStyle = 'ISO, DMY'"],
], ids=lambda s: s[0].split("SET ")[1])
def test_session_settings_do_not_change_values(db: Db, session: list[str]) -> None:
    base_captured, _, base = converted(db, *UTC_ISO_SESSION[:1])
    captured, _, values = converted(db, *session)
    if "TimeZone" in session[0] or "bytea" in session[0] or "Interval" in session[0]:
        assert captured.rows != base_captured.rows  # the setting changed pgoutput's text
    for base_row, row in zip(base, values, strict=True):
        for (name, _, _), a, b in zip(captured.columns, base_row, row, strict=True):
            assert _equal(b, a) or _plain(a) == _plain(b) or (a != a and b != b), (name, a, b)


def test_timestamptz_in_another_zone_is_the_same_instant(db: Db) -> None:
    captured, _, values = converted(db, "SET TimeZone = 'Asia/Kolkata'")
    col = [c[0] for c in captured.columns].index("c_tstz")
    assert captured.rows[0][col] == "2024-01-02 08:34:05.123456+05:30"
    assert values[0][col] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    amsterdam = next(r[col] for r in values if r[0] == 4)
    assert amsterdam == dt.datetime(1899, 12, 31, 23, 40, 28, tzinfo=UTC)  # LMT +00:19:32


def test_bytea_escape_and_hex_give_the_same_bytes(db: Db) -> None:
    hex_rows = db.peek("SET bytea_output = 'hex'")
    escape_rows = db.peek("SET bytea_output = 'escape'")
    col = [c[0] for c in hex_rows.columns].index("c_bytea")
    assert hex_rows.rows[0][col] == "\\x0001ff5c27"
    assert escape_rows.rows[0][col] == "\\000\\001\\377\\\\'"
    mapping = mappings(db, hex_rows)[col]
    for a, b in zip(hex_rows.rows, escape_rows.rows, strict=True):
        if a[col] is not None:
            assert mapping.convert(a[col]) == mapping.convert(b[col])  # type: ignore[arg-type]


def test_non_iso_datestyle_is_refused_clearly(db: Db) -> None:
    captured, maps, _ = converted(db)
    sql_rows = db.peek("SET DateStyle = 'SQL, DMY'")
    col = [c[0] for c in captured.columns].index("c_date")
    assert sql_rows.rows[0][col] == "29/02/2024"
    with pytest.raises(PgValueError, match="DateStyle"):
        maps[col].convert(sql_rows.rows[0][col])  # type: ignore[arg-type]


# -- arrays: array_out's quoting of arbitrary text, parsed back --------------------

TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
               max_size=6)
ELEMENT = st.none() | TEXT | st.sampled_from(["NULL", "null", "", " ", "a,b", 'q"', "\\",
                                              "{}", "\u00a0", "é ê"])


@st.composite
def text_arrays(draw: st.DrawFn) -> list[Any]:
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))

    def fill(dims: list[int]) -> list[Any]:
        if len(dims) == 1:
            return [draw(ELEMENT) for _ in range(dims[0])]
        return [fill(dims[1:]) for _ in range(dims[0])]

    return fill(shape)


def test_text_arrays_from_postgres_parse_back(db: Db) -> None:
    cur = db.conn.cursor()

    @settings(max_examples=120, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(text_arrays())
    def check(value: list[Any]) -> None:
        cur.execute("SELECT %s::text[]::text, %s::text[]", (value, value))
        text, back = cur.fetchone()
        assert back == value  # what went in
        assert parse_array(text) == value

    check()
    cur.close()


def test_numeric_nan_in_a_constrained_column_is_refused(db: Db) -> None:
    with db.conn.cursor() as cur:
        cur.execute("SELECT 'NaN'::numeric(10,2)::text")
        (text,) = cur.fetchone()
    mapping = column_mapping(1700, (10 << 16 | 2) + 4, {})
    with pytest.raises(PgValueError, match="declare the column numeric"):
        mapping.convert(text)
    assert column_mapping(1700, -1, {}).convert(text) == "NaN"
    assert Decimal(str(mapping.convert("1.50"))) == Decimal("1.50")


# -- the compiled fast path on real values -------------------------------------------


@pytest.mark.parametrize("session", [
    [], ["SET TimeZone = 'America/St_Johns'"], ["SET TimeZone = 'Pacific/Kiritimati'"],
    ["SET bytea_output = 'escape'"], ["SET extra_float_digits = 0"],
], ids=lambda s: s[0].split("SET ")[1] if s else "default")
def test_the_fast_path_gives_the_general_paths_bytes(db: Db, session: list[str]) -> None:
    """Every value pgoutput sent of every column with a fast code, as a row of its own
    (id, value) in each twin of ``_transcode``: the general path's key and Avro body, or
    declined; the compiled twin takes the ordinary values (all but the edges the general
    path writes as text: infinity, BC, years past 9999, 24:00:00, NaN, escape bytea)."""
    from databus.fetchers.postgres import _transcode
    from databus.fetchers.postgres._changes import TableCodec, TableInfo
    from databus.fetchers.postgres._pgoutput import Column, Relation
    from tests.unit.test_pg_transcode import OID_T, check, insert

    captured = db.peek(*session)
    maps = mappings(db, captured)
    taken = declined = 0
    for index, ((name, oid, typmod), mapping) in enumerate(
            zip(captured.columns, maps, strict=True)):
        if index == 0 or mapping.fast_code == 0:
            continue
        rel = Relation(OID_T, "public", "t", "d", (Column(True, "id", 23, -1),
                                                   Column(False, name, oid, typmod)))
        info = TableInfo(("id",), frozenset({"id"}), (maps[0], mapping))
        codec = TableCodec(rel, "public.t", info)
        plan = _transcode.row_plan(codec)
        if plan is None:
            continue  # numeric(p > 18): the general path
        for row in captured.rows:
            values = [row[0], row[index]]
            check(codec, plan, values)
            if _transcode.IMPLEMENTATION == "native":
                payload = insert(values)
                if _transcode.twin("native").transcode_change(payload, plan) is None:
                    declined += 1
                else:
                    taken += 1
    if _transcode.IMPLEMENTATION == "native":
        assert taken > 60 and declined < taken / 2, (taken, declined)


# -- the dump: every type read by COPY, byte for byte what the slot gives -------------

FAST_SLOT = "types_fast_slot"
FAST_PUBLICATION = "types_fast_pub"


@pytest.fixture(scope="module")
def fast_table(db: Db) -> Iterator[str]:
    """``t_fast``: the rows of ``t`` with only the columns the fast path encodes (so a
    dump of it goes through the compiled encoder row by row), in a publication and a
    slot of its own created before its rows."""
    from databus.fetchers.postgres import _transcode
    from databus.fetchers.postgres._changes import TableCodec, TableInfo
    from databus.fetchers.postgres._pgoutput import Column, Relation

    captured = db.peek()
    maps = mappings(db, captured)
    fast = []
    for (name, oid, typmod), mapping in zip(captured.columns[1:], maps[1:], strict=True):
        rel = Relation(1, "public", "x", "d", (Column(True, "id", 23, -1),
                                               Column(False, name, oid, typmod)))
        codec = TableCodec(rel, "public.x", TableInfo(("id",), frozenset({"id"}),
                                                      (maps[0], mapping)))
        if _transcode.row_plan(codec) is not None:
            fast.append(name)
    assert len(fast) > 15, fast
    with db.conn.cursor() as cur:
        cur.execute("CREATE TABLE t_fast (LIKE t)")
        for name in [c for c, _, _ in COLUMNS if c not in fast]:
            cur.execute(f"ALTER TABLE t_fast DROP COLUMN {name}")
        cur.execute("ALTER TABLE t_fast ADD PRIMARY KEY (id)")
        cur.execute(f"CREATE PUBLICATION {FAST_PUBLICATION} FOR TABLE t_fast")
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                    (FAST_SLOT,))
        cur.execute("BEGIN")
        cur.execute("SET LOCAL synchronous_commit = on")
        cur.execute(f"INSERT INTO t_fast SELECT id, {', '.join(fast)} FROM t")
        cur.execute("COMMIT")
    yield "t_fast"
    with db.conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (FAST_SLOT,))
        cur.execute(f"DROP PUBLICATION {FAST_PUBLICATION}")
        cur.execute("DROP TABLE t_fast")


@pytest.mark.twin("databus.fetchers.postgres._transcode")
@pytest.mark.parametrize("path", ["fast", "reference", "select"])
@pytest.mark.parametrize("table", ["t", "t_fast"])
def test_a_dump_gives_the_slots_events_byte_for_byte(
        db: Db, fast_table: str, table: str, path: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row of the table of every mapped type (``t``: no fast plan, every row
    converted by the general path from COPY's text; ``t_fast``: the columns with a fast
    code, encoded by the compiled twin but for the edge values it declines), dumped by
    ``LogicalDumpSource`` in chunks of 3 (``read_chunk``) and by key (``read_keys``),
    equals the event the logical fetcher makes of the same row's Insert from the slot
    (``ChangeStream``): key, Avro body and schema fingerprint. ``fast``: what the dump
    does (COPY and the compiled twin; with DATABUS_PURE_PYTHON=1 the SELECT);
    ``reference``: COPY and the reference twin; ``select``: the SELECT of a session not
    in UTF-8 (as before COPY). The cursor is the last key as text."""
    from databus.fetchers._api import FetcherContext
    from databus.fetchers.postgres import _dump_copy, _transcode
    from databus.fetchers.postgres._catalog import read_table_info
    from databus.fetchers.postgres._changes import ChangeStream
    from databus.fetchers.postgres._dump import LogicalDumpSource
    from databus.fetchers.postgres._uri import parse_logical_source
    from tests.unit.test_pg_changes import Catalog, Sink

    slot_name, publication = ((SLOT, PUBLICATION) if table == "t"
                              else (FAST_SLOT, FAST_PUBLICATION))
    if path == "reference":
        monkeypatch.setattr(_dump_copy, "transcode_copy_rows",
                            _transcode.twin("python").transcode_copy_rows)
        monkeypatch.setattr(_dump_copy, "COPY_READS", True)
    elif path == "select":
        monkeypatch.setattr(_dump_copy, "_UTF8", frozenset())
    else:
        assert (_transcode.IMPLEMENTATION == "native") == _dump_copy.COPY_READS
    # What the fetcher writes: the slot's messages through its ChangeStream.
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, "
                        "NULL, 'proto_version', '1', 'publication_names', %s)",
                        (slot_name, publication))
            payloads = [bytes(r[0]) for r in cur.fetchall()]
            sink = Sink()
            stream = ChangeStream(sink, Catalog(), 0, lambda s, t: True,
                                  lambda rel: read_table_info(cur, rel), None)
            for payload in payloads:
                stream.feed_payload(payload)
    finally:
        conn.close()
    slot = [(e[3], e[4], e[5]) for e in sink.events()]
    assert len(slot) == ROWS

    source = parse_logical_source(db.server.url(DB) + f"?tables=public.{table}"
                                  f"&slot={slot_name}&publication={publication}")
    dump = LogicalDumpSource(source, FetcherContext("pg", 0, Catalog()), db.connect)
    try:
        with dump._cursor() as cur:
            codec, _, _ = dump._table(cur, f"public.{table}")
        assert (codec.plan is not None) == (table == "t_fast")
        dumped: list[tuple[Any, bytes, int]] = []
        after = None
        while True:
            chunk = dump.read_chunk(f"public.{table}", after, 3)
            dumped += [(r.key, r.value, r.fingerprint) for r in chunk.rows]
            if chunk.rows:
                assert chunk.cursor == [str(chunk.rows[-1].key)]
            after = chunk.cursor
            if chunk.done:
                break
        by_key = dump.read_keys(f"public.{table}", [ROWS, 2, 1])
        # Cut into key ranges (a parallel dump): every row once, in key order.
        points = dump.split_points(f"public.{table}", 3)
        assert points and points == sorted(points, key=lambda p: int(p[0]))
        ranged: list[tuple[Any, bytes, int]] = []
        for lo, hi in itertools.pairwise([None, *points, None]):
            after = lo
            while True:
                chunk = dump.read_chunk(f"public.{table}", after, 3, until=hi)
                ranged += [(r.key, r.value, r.fingerprint) for r in chunk.rows]
                after = chunk.cursor if chunk.cursor is not None else after
                if chunk.done:
                    break
    finally:
        dump.close()
    assert dumped == slot and ranged == slot
    assert [(r.key, r.value, r.fingerprint) for r in by_key.rows] == [
        slot[0], slot[1], slot[ROWS - 1]]
