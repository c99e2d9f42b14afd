"""The logical fetcher's fast path (fetchers/postgres/_transcode.py), both twins: for
every value the type tests know (their CASES and GARBAGE), for generated values of every
fast type and for damaged messages, a twin gives exactly the general path's key and Avro
body or declines (None); the compiled twin must not decline ordinary values (else the
fast path would silently never run); and ``ChangeStream.feed_payload`` produces the same
sink calls as ``feed(decode(...))`` on a mixed stream."""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databus.errors import DatabusError
from databus.fetchers.postgres import _transcode
from databus.fetchers.postgres import _types as T
from databus.fetchers.postgres._changes import ChangeStream, TableCodec, TableInfo
from databus.fetchers.postgres._pgoutput import (
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    Relation,
    Update,
    decode,
)
from databus.fetchers.postgres._transcode import RowPlan, row_plan, twin
from databus.fetchers.postgres._types import column_mapping
from tests.unit.test_pg_changes import Catalog, Sink, wanted
from tests.unit.test_pg_logical_types import CASES, GARBAGE, NUM_2_5, NUM_10_2, TYPES
from tests.unit.test_pgoutput import encode

pytestmark = pytest.mark.twin("databus.fetchers.postgres._transcode")

TWINS = ["python"] + (["native"] if _transcode.IMPLEMENTATION == "native" else [])
OID_T = 16384
NUM_18_4 = (18 << 16 | 4) + 4
NUM_19_2 = (19 << 16 | 2) + 4

# The types with a fast code, and values of each that the compiled twin must take.
FAST: dict[tuple[int, int], list[str]] = {
    (T.INT2, -1): ["0", "-32768", "32767", "-0", "12"],
    (T.INT4, -1): ["0", "-2147483648", "2147483647", "7"],
    (T.INT8, -1): ["0", "-9223372036854775808", "9223372036854775807", "-1"],
    (T.OID, -1): ["0", "4294967295", "16384"],
    (T.FLOAT4, -1): ["0", "-0", "1.5", "3.4028235e+38", "1e-45", "0.1", "-123.456"],
    (T.FLOAT8, -1): ["0", "-0", "0.1", "1e+308", "2.2250738585072014e-308", "5e-324",
                     "0.14285714285714285", "1.2345678901234567e+20", "-7", ".5", "5."],
    (T.BOOL, -1): ["t", "f"],
    (T.TEXT, -1): ["", "abc", "é漢字🎉", "a\tb\nc", "x" * 3000],
    (T.NUMERIC, -1): ["0", "-1.50", "NaN", "Infinity", "-Infinity", "1" * 200],
    (T.NUMERIC, NUM_10_2): ["0.00", "12345678.99", "-12345678.99", "0.05", "-0.01", "7",
                            "1.5"],
    (T.NUMERIC, NUM_2_5): ["0.00012", "-0.00099", "0"],
    (T.NUMERIC, NUM_18_4): ["99999999999999.9999", "-99999999999999.9999", "0.0001"],
    (T.BYTEA, -1): ["\\x", "\\x00ff", "\\xDEADbeef"],
    (T.DATE, -1): ["2024-02-29", "0001-01-01", "9999-12-31", "1970-01-01", "1969-12-31"],
    (T.TIME, -1): ["00:00:00", "23:59:59.999999", "12:34:56.5", "01:02:03.000001"],
    (T.TIMESTAMP, -1): ["2024-01-02 03:04:05", "0001-01-01 00:00:00",
                        "9999-12-31 23:59:59.999999", "1969-12-31 23:59:59.5",
                        "2000-02-29 12:00:00.123"],
    (T.TIMESTAMPTZ, -1): ["2024-01-02 03:04:05+00", "2024-01-02 08:34:05.25+05:30",
                          "1901-12-13 20:45:52-00:01:15", "9999-12-31 18:00:00-05",
                          "0001-01-01 05:00:00+05"],
}


def codec_of(columns: Sequence[tuple[int, int]], nullable: bool = True,
             key_oid: int = T.INT4) -> TableCodec:
    """A table (id <key_oid> PRIMARY KEY, c1, c2, ...) of ``columns``."""
    cols = [Column(True, "id", key_oid, -1)] + [
        Column(False, f"c{i}", oid, typmod) for i, (oid, typmod) in enumerate(columns, 1)]
    rel = Relation(OID_T, "public", "t", "d", tuple(cols))
    names = [c.name for c in cols]
    not_null = frozenset(["id"] if nullable else names)
    info = TableInfo(("id",), not_null, tuple(column_mapping(c.type_oid, c.type_modifier,
                                                             TYPES) for c in cols))
    return TableCodec(rel, "public.t", info)


def reference(codec: TableCodec, values: Sequence[str | None]) -> tuple[Any, bytes] | None:
    """What the general path makes of an insert of ``values`` (None: it raises or takes
    its special case)."""
    try:
        row = codec.convert(values, None)
        if any(row[i] is None for i in codec.not_null_positions):
            return None
        return codec.key(row), codec.encode(row)
    except DatabusError:
        return None


def insert(values: Sequence[str | None]) -> bytes:
    return encode(Insert(OID_T, tuple(values)))


def check(codec: TableCodec, plan: RowPlan, values: Sequence[str | None],
          *, must_take: bool = False) -> None:
    want = reference(codec, values)
    payload = insert(values)
    for name in TWINS:
        got = twin(name).transcode_change(payload, plan)
        if name == "python":
            assert got == want, (values, got, want)
        else:
            assert got is None or got == want, (values, got, want)
            if must_take:
                assert got is not None and got == want, (values, got, want)
        update = encode(Update(OID_T, tuple(values), None, False))
        assert twin(name).transcode_change(update, plan) == got


# -- the plan ------------------------------------------------------------------------


def test_every_fast_type_has_a_plan_and_others_have_none() -> None:
    for column in FAST:
        assert row_plan(codec_of([column])) is not None, column
    for oid, typmod in [(T.INTERVAL, -1), (1007, -1), (T.NUMERIC, NUM_19_2)]:
        assert row_plan(codec_of([(oid, typmod)])) is None, (oid, typmod)
    assert row_plan(codec_of([(T.TEXT, -1)], key_oid=T.TEXT)) is not None
    # a key the fast path would have to convert: the general path
    assert row_plan(codec_of([(T.TEXT, -1)], key_oid=T.DATE)) is None


def test_flags_say_nullable_and_union() -> None:
    plan = row_plan(codec_of([(T.INT4, -1), (T.TIMESTAMP, -1)], nullable=True))
    assert plan is not None
    assert plan.codes == bytes([_transcode.INT4, _transcode.INT4 | _transcode.NULLABLE,
                                _transcode.TIMESTAMP | _transcode.NULLABLE])
    plan = row_plan(codec_of([(T.TIMESTAMP, -1)], nullable=False))
    assert plan is not None and plan.codes[1] == _transcode.TIMESTAMP | _transcode.UNION


# -- values: every one the general path knows, the compiled twin's coverage ------------


@pytest.mark.parametrize("nullable", [True, False])
def test_the_type_tests_cases_and_garbage(nullable: bool) -> None:
    for oid, typmod, text, _ in CASES:
        codec = codec_of([(oid, typmod)], nullable)
        plan = row_plan(codec)
        if plan is None:
            continue
        for value in [text, None, *GARBAGE]:
            check(codec, plan, ["1", value])


@pytest.mark.parametrize("column", list(FAST), ids=[str(c) for c in FAST])
@pytest.mark.parametrize("nullable", [True, False])
def test_ordinary_values_take_the_fast_path(column: tuple[int, int], nullable: bool) -> None:
    codec = codec_of([column, column], nullable)
    plan = row_plan(codec)
    assert plan is not None
    for text in FAST[column]:
        check(codec, plan, ["5", text, text], must_take=True)
    check(codec, plan, ["5", None, FAST[column][0]], must_take=nullable)


@pytest.mark.parametrize("column", list(FAST), ids=[str(c) for c in FAST])
def test_values_the_general_path_treats_specially_are_declined(
        column: tuple[int, int]) -> None:
    codec = codec_of([column])
    plan = row_plan(codec)
    assert plan is not None
    special = ["infinity", "-infinity", "0044-03-15 BC", "10000-01-01", "24:00:00",
               "10000-01-01 00:00:00", "0001-01-01 00:00:00+05", "NaN", "-NaN",
               "Infinity", "\\000", "abc", "1e999", "3.5e+38", "-0.00", "0000-01-01"]
    for text in special:
        check(codec, plan, ["1", text])


# -- generated values ----------------------------------------------------------------


def _pg_float(value: float) -> str:
    """float8out's shortest exact text is Python's repr but for these spellings."""
    text = repr(value)
    return {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}.get(text, text)


@st.composite
def values_of(draw: st.DrawFn, column: tuple[int, int]) -> str:
    oid = column[0]
    if oid in (T.INT2, T.INT4, T.INT8, T.OID):
        bits = {T.INT2: 15, T.INT4: 31, T.INT8: 63, T.OID: 32}[oid]
        low = 0 if oid == T.OID else -(2**bits)
        high = 2**32 - 1 if oid == T.OID else 2**bits - 1
        return str(draw(st.integers(low - 2, high + 2)))
    if oid == T.FLOAT8:
        return _pg_float(draw(st.floats(allow_nan=True)))
    if oid == T.FLOAT4:
        return _pg_float(draw(st.floats(width=32) | st.floats()))
    if oid == T.BOOL:
        return draw(st.sampled_from(["t", "f", "T", "true", ""]))
    if oid == T.TEXT:
        return draw(st.text(st.characters(exclude_categories=["Cs"])))
    if oid == T.NUMERIC:
        d = draw(st.decimals(allow_nan=False, allow_infinity=False, places=draw(
            st.integers(0, 6)), min_value=-(10**14), max_value=10**14))
        return f"{d:f}"
    if oid == T.BYTEA:
        return "\\x" + draw(st.binary(max_size=40)).hex()
    if oid == T.DATE:
        return draw(st.dates()).isoformat()
    if oid == T.TIME:
        return draw(st.times()).isoformat()
    if oid == T.TIMESTAMP:
        return draw(st.datetimes()).isoformat(sep=" ")
    if oid == T.TIMESTAMPTZ:
        stamp = draw(st.datetimes())
        minutes = draw(st.integers(-15 * 60, 15 * 60))
        zone = dt.timezone(dt.timedelta(minutes=minutes))
        text = stamp.replace(tzinfo=zone).isoformat(sep=" ")
        return text[:-3] if text.endswith(":00") and len(text) > 25 else text
    raise AssertionError(column)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_values_give_the_general_paths_bytes(data: st.DataObject) -> None:
    column = data.draw(st.sampled_from(list(FAST)))
    nullable = data.draw(st.booleans())
    codec = codec_of([column], nullable)
    plan = row_plan(codec)
    assert plan is not None
    text = data.draw(values_of(column))
    check(codec, plan, ["3", text])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(FAST)), st.text(max_size=30) | st.from_regex(
    r"[-+0-9:. eE\\xa-fA-F]{0,30}", fullmatch=True))
def test_any_text_gives_the_general_paths_bytes_or_is_declined(
        column: tuple[int, int], text: str) -> None:
    codec = codec_of([column])
    plan = row_plan(codec)
    assert plan is not None
    check(codec, plan, ["3", text])


def test_valid_generated_values_are_not_declined() -> None:
    """The fast path's coverage on ordinary data: dates, times and numbers within range
    are all taken (the hypothesis test above only checks equality)."""
    if "native" not in TWINS:
        pytest.skip("the compiled twin is not in use (DATABUS_PURE_PYTHON=1, or not built)")
    native = twin("native")
    cases = [((T.NUMERIC, NUM_10_2), [f"{Decimal(i) / 100:f}" for i in range(-999, 999, 7)]),
             ((T.TIMESTAMP, -1), [(dt.datetime(2000, 1, 1) + dt.timedelta(
                 seconds=i * 7919, microseconds=i)).isoformat(sep=" ") for i in range(200)]),
             ((T.FLOAT8, -1), [repr(i / 7) for i in range(-100, 100)])]
    for column, texts in cases:
        codec = codec_of([column])
        plan = row_plan(codec)
        assert plan is not None
        for text in texts:
            assert native.transcode_change(insert(["1", text]), plan) == reference(
                codec, ["1", text]), text


# -- messages ------------------------------------------------------------------------


def test_messages_other_than_plain_inserts_and_updates_are_declined() -> None:
    codec = codec_of([(T.TEXT, -1)])
    plan = row_plan(codec)
    assert plan is not None
    for message in [Update(OID_T, ("1", "b"), ("1", "a"), False),
                    Update(OID_T, ("2", "b"), ("1", None), True),
                    Delete(OID_T, ("1", None), True),
                    Insert(OID_T, ("1",)), Insert(OID_T, ("1", "a", "b")),
                    Insert(OID_T, ("1", b"binary")),
                    Begin(1, 2, 3), Commit(0, 1, 2, 3)]:
        for name in TWINS:
            assert twin(name).transcode_change(encode(message), plan) is None, message
    from databus.fetchers.postgres._pgoutput import UNCHANGED_TOAST
    toast = encode(Insert(OID_T, ("1", UNCHANGED_TOAST)))
    for name in TWINS:
        assert twin(name).transcode_change(toast, plan) is None
        assert twin(name).transcode_change(b"", plan) is None
        assert twin(name).transcode_change(bytearray(insert(["1", "a"])), plan) in (
            None, reference(codec, ["1", "a"]))


def test_every_truncation_and_a_trailing_byte_are_declined() -> None:
    codec = codec_of([(T.TEXT, -1), (T.INT8, -1), (T.NUMERIC, NUM_10_2)])
    plan = row_plan(codec)
    assert plan is not None
    payload = insert(["1", "héllo", "42", "3.14"])
    for name in TWINS:
        assert twin(name).transcode_change(payload, plan) == reference(
            codec, ["1", "héllo", "42", "3.14"])
        for cut in range(len(payload)):
            assert twin(name).transcode_change(payload[:cut], plan) is None, cut
        assert twin(name).transcode_change(payload + b"\0", plan) is None


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 7), st.binary(max_size=3))
def test_damaged_messages_match_the_reference_twin(where: int, bit: int,
                                                   extra: bytes) -> None:
    """A bit flipped anywhere (lengths, markers, UTF-8, digits) and bytes appended: the
    compiled twin declines or agrees with the reference twin, never crashes."""
    codec = codec_of([(T.TEXT, -1), (T.INT8, -1), (T.NUMERIC, NUM_10_2),
                      (T.TIMESTAMPTZ, -1), (T.BYTEA, -1)])
    plan = row_plan(codec)
    assert plan is not None
    data = bytearray(insert(["1", "héllo wörld", "-42", "3.14",
                             "2024-01-02 03:04:05.5+02", "\\x00ff"]))
    i = where % len(data)
    data[i] ^= 1 << bit
    payload = bytes(data) + extra
    want = twin("python").transcode_change(payload, plan)
    for name in TWINS:
        got = twin(name).transcode_change(payload, plan)
        assert got is None or got == want


# -- the stream: feed_payload == feed(decode(...)) -------------------------------------


def info_of(rel: Relation) -> TableInfo:
    key = ("id",)
    return TableInfo(key, frozenset({"id", "qty"}),
                     tuple(column_mapping(c.type_oid, c.type_modifier, TYPES)
                           for c in rel.columns))


def test_feed_payload_makes_the_same_windows_as_the_general_path() -> None:
    rel = Relation(OID_T, "public", "orders", "d", (
        Column(True, "id", T.INT8, -1), Column(False, "qty", T.INT4, -1),
        Column(False, "price", T.NUMERIC, NUM_10_2), Column(False, "at", T.TIMESTAMPTZ, -1),
        Column(False, "note", T.TEXT, -1)))
    messages = [
        rel, Begin(100, 5_000_000, 1),
        Insert(OID_T, ("1", "2", "9.99", "2024-01-02 03:04:05+00", "a")),
        Insert(OID_T, ("2", "3", None, "infinity", None)),  # declined: the string branch
        Update(OID_T, ("1", "4", "1.00", "2024-01-02 03:04:05+00", "b"), None, False),
        Update(OID_T, ("3", "4", "1.00", None, "c"), ("1", None, None, None, None), True),
        Insert(OID_T, ("4", None, "1.00", None, "NOT NULL qty is NULL")),  # a new version
        Insert(OID_T, ("5", "6", "2.00", None, "after the new version")),
        Delete(OID_T, ("2", None, None, None, None), True),
        Commit(0, 100, 101, 5_000_000),
        Begin(200, 6_000_000, 2), Insert(OID_T, ("6", "1", "0.01", None, "z")),
        Commit(0, 200, 201, 6_000_000),
    ]
    payloads = [encode(m) for m in messages]
    sinks = []
    for fast in (False, True):
        sink, catalog = Sink(), Catalog()
        stream = ChangeStream(sink, catalog, 0, wanted, info_of, None)
        for p in payloads:
            if fast:
                stream.feed_payload(p)
            else:
                stream.feed(decode(p))
        sinks.append((sink.calls, {k: [s.fingerprint for s in v]
                                   for k, v in catalog.versions.items()}, stream.events))
    assert sinks[0] == sinks[1]
    assert len([c for c in sinks[0][0] if c[0] == "event"]) == 9
    assert len(sinks[0][1]["public.orders"]) == 2  # the NULL qty made a second version


def test_skipped_transactions_are_skipped_by_the_fast_path_too() -> None:
    rel = Relation(OID_T, "public", "orders", "d", (
        Column(True, "id", T.INT8, -1), Column(False, "qty", T.INT4, -1)))
    sink = Sink()
    stream = ChangeStream(sink, Catalog(), 0, wanted, info_of, skip_through=100)
    for m in [rel, Begin(50, 1, 1), Insert(OID_T, ("1", "1")), Commit(0, 50, 51, 1),
              Begin(150, 1, 2), Insert(OID_T, ("2", "1")), Commit(0, 150, 151, 1),
              Begin(60, 1, 3), Insert(OID_T, ("3", "1")), Commit(0, 60, 61, 1)]:
        stream.feed_payload(encode(m))
    assert [c[3] for c in sink.events()] == [2]


def test_float_bytes_are_little_endian_ieee() -> None:
    """A spot check apart from fastavro: 1.5 as a double and as a real."""
    codec = codec_of([(T.FLOAT8, -1), (T.FLOAT4, -1)], nullable=False)
    plan = row_plan(codec)
    assert plan is not None
    for name in TWINS:
        got = twin(name).transcode_change(insert(["1", "1.5", "1.5"]), plan)
        assert got == (1, b"\x02" + struct.pack("<d", 1.5) + struct.pack("<f", 1.5))
