"""The logical dump's chunk reader (fetchers/postgres/_transcode.py, ``transcode_copy_rows``),
both twins: ``COPY ... TO STDOUT`` text-format bytes of rows of every type the type tests
know (their CASES and GARBAGE), of every fast type's ordinary values, of escaped text
(tabs, newlines, backslashes, ``\\N`` as text), of tables without a fast plan and of
generated rows give exactly the general path's keys and Avro bodies (what the dump
made of a SELECT's text values) and its cursor (the last row's key columns as text), or
the same error; damaged bytes give the same result or error in both twins."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databus.fetchers.postgres import _transcode
from databus.fetchers.postgres import _types as T
from databus.fetchers.postgres._changes import TableCodec, TableInfo
from databus.fetchers.postgres._pgoutput import Column, Relation
from databus.fetchers.postgres._transcode import row_plan, twin
from databus.fetchers.postgres._types import column_mapping
from tests.unit.test_pg_logical_types import CASES, GARBAGE, NUM_10_2, TYPES
from tests.unit.test_pg_transcode import FAST, codec_of, values_of

pytestmark = pytest.mark.twin("databus.fetchers.postgres._transcode")

TWINS = ["python"] + (["native"] if _transcode.IMPLEMENTATION == "native" else [])

_COPY_ESCAPES = {"\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                 "\t": "\\t", "\v": "\\v"}


def copy_field(value: str | None) -> str:
    """A value as COPY TO writes it in text format (CopyAttributeOutText)."""
    if value is None:
        return "\\N"
    return re.sub(r"[\\\b\f\n\r\t\v]", lambda m: _COPY_ESCAPES[m.group()], value)


def copy_data(rows: Sequence[Sequence[str | None]]) -> bytes:
    return "".join("\t".join(copy_field(v) for v in row) + "\n" for row in rows).encode()


def reference(codec: TableCodec, rows: Sequence[Sequence[str | None]]) -> Any:
    """What the dump made of these rows' text values before COPY (its ``_chunk``): each
    row's key and body and the last row's key texts, or the exception's type."""
    try:
        out = []
        for values in rows:
            row = codec.convert(values, None)
            out.append((codec.key(row), codec.encode(row)))
    except Exception as exc:  # the twins must raise the same
        return type(exc)
    return out, ([rows[-1][i] for i in codec.key_positions] if rows else None)


def run(name: str, data: bytes, codec: TableCodec) -> Any:
    try:
        return twin(name).transcode_copy_rows(data, codec)
    except Exception as exc:
        return type(exc)


def check(codec: TableCodec, rows: Sequence[Sequence[str | None]]) -> None:
    want = reference(codec, rows)
    data = copy_data(rows)
    for name in TWINS:
        got = run(name, data, codec)
        assert got == want, (name, rows, got, want)


# -- values ------------------------------------------------------------------------


@pytest.mark.parametrize("nullable", [True, False])
def test_the_type_tests_cases_and_garbage(nullable: bool) -> None:
    """Every mapped type (arrays, json, intervals, ... with no plan; the fast types with
    one), each value alone and after an ordinary row."""
    for oid, typmod, text, _ in CASES:
        codec = codec_of([(oid, typmod)], nullable)
        for value in [text, None, *GARBAGE]:
            check(codec, [["1", value]])
        check(codec, [["1", text], ["2", None], ["3", text]])


@pytest.mark.parametrize("column", list(FAST), ids=[str(c) for c in FAST])
@pytest.mark.parametrize("nullable", [True, False])
def test_ordinary_values_take_the_fast_path(column: tuple[int, int], nullable: bool) -> None:
    codec = codec_of([column, column], nullable)
    plan = row_plan(codec)
    assert plan is not None
    rows = [[str(i), text, text] for i, text in enumerate(FAST[column])]
    check(codec, rows)
    if "native" in TWINS:
        # Nothing declined: the reference path is never asked (it would raise here).
        broken = codec_of([column, column], nullable)
        broken.encode = None  # type: ignore[assignment,method-assign]
        keyed, _ = twin("native").transcode_copy_rows(copy_data(rows), broken)
        assert keyed == reference(codec, rows)[0]


def test_declined_values_take_the_reference_path_row_by_row() -> None:
    codec = codec_of([(T.TIMESTAMP, -1), (T.NUMERIC, NUM_10_2), (T.FLOAT8, -1),
                      (T.DATE, -1)])
    rows = [["1", "2024-01-02 03:04:05", "1.50", "0.5", "2024-02-29"],
            ["2", "infinity", "1.50", "NaN", "-infinity"],
            ["3", "0044-03-15 12:00:00 BC", "-0.00", "Infinity", "10000-01-01"],
            ["4", None, None, None, None],
            ["5", "2024-01-02 03:04:05.5", "99999999.99", "-1e-300", "0001-01-01"]]
    check(codec, rows)


def test_escaped_text_and_bytea() -> None:
    codec = codec_of([(T.TEXT, -1), (T.VARCHAR, -1), (T.BYTEA, -1), (T.JSONB, -1)])
    texts = ["tab\there", "nl\nand cr\r", "back\\slash", "\\N", "\\", "\\\\N", "",
             "\b\f\v", "é漢字🎉", "trailing\\", "x\t\\t\n", "\x01\x1f"]
    rows = [[str(i), t, t[::-1], "\\x" + t.encode().hex(), '{"k": "' + str(i) + '"}']
            for i, t in enumerate(texts)]
    rows.append(["99", None, None, None, None])
    check(codec, rows)


def test_text_keys_and_composite_keys_give_the_cursor_as_text() -> None:
    cols = (Column(True, "a", T.TEXT, -1), Column(True, "b", T.INT8, -1),
            Column(False, "v", T.TEXT, -1))
    rel = Relation(16384, "public", "t", "d", cols)
    info = TableInfo(("a", "b"), frozenset({"a", "b"}),
                     tuple(column_mapping(c.type_oid, c.type_modifier, TYPES) for c in cols))
    codec = TableCodec(rel, "public.t", info)
    rows = [["a\tb", "1", "x"], ["c\\d\n", "-9223372036854775808", None]]
    check(codec, rows)
    for name in TWINS:
        _, cursor = twin(name).transcode_copy_rows(copy_data(rows), codec)
        assert cursor == ["c\\d\n", "-9223372036854775808"]
        assert twin(name).transcode_copy_rows(b"", codec) == ([], None)


def test_copy_from_escapes_the_server_does_not_write() -> None:
    """Octal and hex escapes, an escaped tab, any other escaped byte: as COPY FROM reads
    them, in both twins."""
    codec = codec_of([(T.TEXT, -1), (T.TEXT, -1)])
    line = b"1\t\\101\\x42\\x4\\xg\\q\\\tz\t\\N\n"
    for name in TWINS:
        got = twin(name).transcode_copy_rows(line, codec)
        assert got == (reference(codec, [["1", "AB\x04xgq\tz", None]])[0], ["1"]), name
    # \777 is byte 0xFF: not UTF-8, the same error in both
    bad = b"2\t\\777\t\\N\n"
    assert len({run(name, bad, codec) for name in TWINS}) == 1
    assert run("python", bad, codec) is UnicodeDecodeError


@pytest.mark.parametrize("data", [b"1\tx", b"1\tx\ty\n", b"1\n", b"1\tx\\\n",
                                  b"1\tx\n2\n", b"\n", b"1\tx\n\n"])
def test_malformed_rows_are_the_same_error_in_both(data: bytes) -> None:
    codec = codec_of([(T.TEXT, -1)])
    assert {run(name, data, codec) for name in TWINS} == {ValueError}


def test_a_table_without_a_plan_takes_the_reference_path() -> None:
    codec = codec_of([(T.INTERVAL, -1), (1007, -1), (T.TEXT, -1)])
    assert row_plan(codec) is None
    check(codec, [["1", "P1D", "{1,NULL,3}", "a\tb"], ["2", None, None, None]])


# -- generated rows and damaged bytes ------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_rows_give_the_general_paths_bytes(data: st.DataObject) -> None:
    columns = data.draw(st.lists(st.sampled_from(list(FAST)), min_size=1, max_size=4))
    nullable = data.draw(st.booleans())
    codec = codec_of(columns, nullable)
    count = data.draw(st.integers(1, 4))
    rows = []
    for i in range(count):
        rows.append([str(i)] + [data.draw(st.none() | values_of(c)) if nullable
                                else data.draw(values_of(c)) for c in columns])
    check(codec, rows)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 7), st.binary(max_size=3))
def test_damaged_bytes_give_the_same_in_both_twins(where: int, bit: int,
                                                   extra: bytes) -> None:
    codec = codec_of([(T.TEXT, -1), (T.INT8, -1), (T.NUMERIC, NUM_10_2),
                      (T.TIMESTAMPTZ, -1), (T.BYTEA, -1)])
    data = bytearray(copy_data([
        ["1", "héllo\twörld", "-42", "3.14", "2024-01-02 03:04:05.5+02", "\\x00ff"],
        ["2", None, "7", None, None, "\\x"]]))
    data[where % len(data)] ^= 1 << bit
    damaged = bytes(data) + extra
    results = {name: run(name, damaged, codec) for name in TWINS}
    assert len({repr(r) for r in results.values()}) == 1, results


def test_rows_made_as_dump_rows() -> None:
    """``row_type=DumpRow``: each row ``DumpRow(key, body, codec.fingerprint)``, equal
    to one made the ordinary way and as frozen; a class of other slots is refused."""
    import dataclasses
    import gc

    from databus.fetchers._api import DumpRow

    codec = codec_of([(T.TEXT, -1), (T.INTERVAL, -1)])
    fast = codec_of([(T.TEXT, -1), (T.TIMESTAMP, -1)])
    for c, rows in [(codec, [["1", "a\tb", "P1D"], ["2", None, None]]),
                    (fast, [["1", "a\tb", "2024-01-02 03:04:05"], ["2", None, None],
                            ["3", "x", "infinity"]])]:
        pairs, cursor = reference(c, rows)
        want = [DumpRow(k, v, c.fingerprint) for k, v in pairs]
        for name in TWINS:
            got, got_cursor = twin(name).transcode_copy_rows(copy_data(rows), c, DumpRow)
            assert got == want and got_cursor == cursor
            assert [type(r) for r in got] == [DumpRow] * len(rows)
            assert [hash(r) for r in got] == [hash(r) for r in want]
            if name == "native":  # untracked: rows of atoms, no cycle through them
                assert not any(gc.is_tracked(r) for r in got)
            with pytest.raises(dataclasses.FrozenInstanceError):
                got[0].key = 9  # type: ignore[misc]
            with pytest.raises(TypeError):
                twin(name).transcode_copy_rows(copy_data(rows), c, tuple)


@settings(max_examples=1500, deadline=None)
@given(st.booleans(), st.text("0123456789", min_size=1, max_size=18),
       st.text("0123456789", max_size=18), st.none() | st.integers(-30, 30))
def test_float_texts_near_the_exact_path_give_the_general_paths_bytes(
        negative: bool, whole: str, fraction: str, exponent: int | None) -> None:
    """Doubles and reals of up to 18 digits each side of the point and exponents within
    +-30: the compiled twin's exact path (digits <= 2**53, 10**+-22) and its strtod path agree
    with float() bit for bit; the compiled twin takes every one."""
    text = ("-" if negative else "") + whole + ("." + fraction if fraction else "") + (
        "" if exponent is None else f"e{exponent:+d}")
    codec = codec_of([(T.FLOAT8, -1), (T.FLOAT4, -1)], nullable=False)
    rows = [["1", text, text]]
    check(codec, rows)
    if "native" in TWINS and abs(float(text)) < 3.4e38:
        broken = codec_of([(T.FLOAT8, -1), (T.FLOAT4, -1)], nullable=False)
        broken.encode = None  # type: ignore[assignment,method-assign]
        assert twin("native").transcode_copy_rows(copy_data(rows), broken)[0] == (
            reference(codec, rows)[0])


def test_float_texts_at_the_exact_paths_edges() -> None:
    codec = codec_of([(T.FLOAT8, -1)], nullable=False)
    texts = ["0", "-0", "0.0", "-0.000", "0e5", "-0e-5", "1e22", "1e23", "1e-22", "1e-23",
             "123456789012345", "1234567890123456", "0.123456789012345",
             "9007199254740993", "900719925474099.3", "9007199254740992", "9.007199254740992",
             "9007199254740991e-22", "9999999999999999", "1.000000000000001", "4.35",
             "-4.35e-3", "2.5e-22",
             "0.000000000000000000001", "1e0003", "1e-0003", "5e-324", "1.7976931348623157e308",
             "142.85714285714286", "0.1", "0.2", "0.30000000000000004", ".5", "5.", "-.5e+1"]
    check(codec, [[str(i), t] for i, t in enumerate(texts)])
