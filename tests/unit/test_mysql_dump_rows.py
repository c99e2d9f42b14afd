"""A MySQL/MariaDB dump chunk's rows to event keys and Avro bodies (fetchers/mysql/_rows):
the active twin (compiled in ``make test``, the reference in ``make twins``) gives
exactly what the reference gives, on rows as mysqlclient returns them (numbers and
temporals as ASCII text, text casts as str), every column kind of the mapping, edge
values, values the compiled twin declines and values no conversion accepts."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from pymysql.constants import FIELD_TYPE

from databus.fetchers._api import DumpRow
from databus.fetchers.mysql import _dump_driver, _rows, _rows_python
from databus.fetchers.mysql._select import TableLayout, table_layout

pytestmark = pytest.mark.twin("databus.fetchers.mysql._rows")

# information_schema.COLUMNS rows (COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE,
# NUMERIC_PRECISION, NUMERIC_SCALE, CHARACTER_SET_NAME), and the field type of each
# column's dump expression in the result (CAST AS SIGNED: LONGLONG, CAST AS CHAR and
# HEX: VAR_STRING, a DOUBLE: DOUBLE, binary: BLOB).
COLUMNS: list[tuple[tuple[Any, ...], int]] = [
    (("id", "bigint", "bigint(20)", "NO", 19, 0, None), FIELD_TYPE.LONGLONG),
    (("a", "tinyint", "tinyint(4)", "YES", 3, 0, None), FIELD_TYPE.LONGLONG),
    (("b", "int", "int(10) unsigned", "NO", 10, 0, None), FIELD_TYPE.LONGLONG),
    (("e", "decimal", "decimal(12,2)", "YES", 12, 2, None), FIELD_TYPE.VAR_STRING),
    (("e2", "decimal", "decimal(30,6)", "NO", 30, 6, None), FIELD_TYPE.VAR_STRING),
    (("e3", "decimal", "decimal(2,0)", "YES", 2, 0, None), FIELD_TYPE.VAR_STRING),
    (("u", "bigint", "bigint(20) unsigned", "YES", 20, 0, None), FIELD_TYPE.VAR_STRING),
    (("f", "float", "float", "YES", 12, None, None), FIELD_TYPE.DOUBLE),
    (("g", "double", "double", "NO", 22, None, None), FIELD_TYPE.DOUBLE),
    (("h", "bit", "bit(1)", "YES", 1, None, None), FIELD_TYPE.LONGLONG),
    (("i", "bit", "bit(12)", "YES", 12, None, None), FIELD_TYPE.VAR_STRING),
    (("j", "year", "year(4)", "YES", None, None, None), FIELD_TYPE.LONGLONG),
    (("k", "date", "date", "YES", None, None, None), FIELD_TYPE.VAR_STRING),
    (("kn", "date", "date", "NO", None, None, None), FIELD_TYPE.VAR_STRING),
    (("l", "time", "time(3)", "YES", None, None, None), FIELD_TYPE.VAR_STRING),
    (("m", "datetime", "datetime(6)", "YES", None, None, None), FIELD_TYPE.VAR_STRING),
    (("mn", "datetime", "datetime", "NO", None, None, None), FIELD_TYPE.VAR_STRING),
    (("n", "timestamp", "timestamp(2)", "YES", None, None, None), FIELD_TYPE.VAR_STRING),
    (("p", "varchar", "varchar(30)", "YES", None, None, "utf8mb4"), FIELD_TYPE.VAR_STRING),
    (("s", "varbinary", "varbinary(10)", "YES", None, None, None), FIELD_TYPE.BLOB),
    (("v", "enum", "enum('x','y')", "NO", None, None, "utf8mb4"), FIELD_TYPE.VAR_STRING),
    (("w", "set", "set('p','q')", "YES", None, None, "utf8mb4"), FIELD_TYPE.VAR_STRING),
]

INTS = [b"0", b"-1", b"127", b"-128", b"9223372036854775807", b"-9223372036854775808",
        b"9223372036854775808", b"12a", b"", b"-", b"007", "42"]
DECIMALS = ["0.00", "-0.50", "12.5", "1.234", "9999999999.99", "-9999999999.99",
            "999999999999999999999999.999999", "1e5", "", ".5", "5.", "-", "00.10",
            "123456789012345678"]
UINTS = ["0", "18446744073709551615", "18446744073709551616", "9223372036854775808", "-1"]
FLOATS = [b"0", b"-0", b"1.5", b"-2.25e100", b"3.4028234663852886e38", b"3.5e38",
          b"1e-45", b"1.7976931348623157e308", b"nan", b"inf", b" 1", b"0x10", b"1e",
          b"5e-324"]
DATES = ["2024-02-29", "2023-02-29", "0000-00-00", "9999-12-31", "0001-01-01",
         "2024-13-01", "2024-1-01", "24-01-01", "2024-04-31"]
TIMES = ["00:00:00", "-838:59:59.000", "838:59:59.999", "12:34:56.5", "-00:00:00.001",
         "1:2:3", "12:34", "12:34:56.1234567"]
DATETIMES = ["2024-01-02 03:04:05.123456", "0000-00-00 00:00:00", "2024-02-30 00:00:00",
             "9999-12-31 23:59:59.999999", "2024-01-02 03:04:05", "2024-01-02T03:04:05",
             "2024-01-02 03:04:05.", "1970-01-01 00:00:00.1"]
STAMPS = ["0", "0.000000", "1700000000.25", "2147483647.999999", "1.1234567", "-1", "abc"]
TEXTS = ["", "héllo", "😀", "tab\there", "x" * 300]
BYTES = [b"", b"\x00\xff", b"abc"]
POOLS: dict[str, list[Any]] = {
    "id": INTS[:6], "a": INTS, "b": INTS, "e": DECIMALS, "e2": DECIMALS, "e3": DECIMALS,
    "u": UINTS, "f": FLOATS, "g": FLOATS, "h": [b"0", b"1", b"2"],
    "i": ["0", "ABC", "FFF", "G"], "j": [b"1901", b"2155", b"0"], "k": DATES,
    "kn": DATES, "l": TIMES, "m": DATETIMES, "mn": DATETIMES, "n": STAMPS, "p": TEXTS,
    "s": BYTES, "v": ["x", "y", ""], "w": ["", "p", "p,q"],
}


class _Catalog:
    """A DB-API cursor answering table_layout's three information_schema queries."""

    def __init__(self) -> None:
        self._answers: list[list[tuple[Any, ...]]] = [
            [("db", "t", *row) for row, _ in COLUMNS], [("db", "t", "id")], [(1000,)]]
        self._last: list[tuple[Any, ...]] = []

    def execute(self, sql: str, params: Any = None) -> None:
        self._last = self._answers.pop(0)

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._last

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._last[0] if self._last else None


def _layout() -> TableLayout:
    layout = table_layout(_Catalog(), "db", "t")
    assert layout is not None
    return layout


def _types() -> list[int]:
    return [t for _, t in COLUMNS] + [FIELD_TYPE.LONGLONG]  # the raw key column


def _row(rng: random.Random, i: int, *, nulls: bool) -> tuple[Any, ...]:
    values: list[Any] = []
    for (name, _, _, nullable, *_), _ in COLUMNS:
        if name == "id":
            values.append(str(i).encode())
        elif nulls and nullable == "YES" and rng.random() < 0.15:
            values.append(None)
        else:
            values.append(rng.choice(POOLS[name]))
    return (*values, values[0])


def _outcome(rows: list[tuple[Any, ...]], plan: _rows.RowPlan, encode: Any) -> Any:
    try:
        return encode(rows, plan)
    except Exception as exc:  # the same rows must fail the same way in both twins
        return type(exc).__name__


def test_every_row_encodes_as_the_reference_encodes_it() -> None:
    layout = _layout()
    plan = _rows.row_plan(layout).with_types(_types())
    rng = random.Random(29)
    agreed = failed = 0
    for i in range(3000):
        rows = [_row(rng, i, nulls=True)]
        active = _outcome(rows, plan, _rows.encode_rows)
        reference = _outcome(rows, plan, _rows_python.encode_rows)
        assert active == reference, rows
        if isinstance(reference, str):
            failed += 1
        else:
            agreed += 1
    assert agreed > 50 and failed > 200  # both kinds of row were tried


def test_a_chunk_of_good_rows_in_one_call() -> None:
    """Rows every twin accepts, many at once (the compiled twin's buffer grows), and
    the DumpRows built from them."""
    layout = _layout()
    plan = _rows.row_plan(layout).with_types(_types())
    good = {"a": INTS[:6], "b": [b"0", b"42"], "e": ["0.00", "-0.50", "12.5", "99.99"],
            "e2": DECIMALS[:6], "e3": ["0", "-9", "99"], "u": [UINTS[0], UINTS[1], UINTS[3]],
            "f": [*FLOATS[:3], FLOATS[4]], "g": FLOATS[:8], "j": [b"1901", b"2155"],
            "k": ["2024-02-29", "9999-12-31", "0001-01-01"], "kn": ["2024-02-29"],
            "l": TIMES[:5], "m": [DATETIMES[i] for i in (0, 3, 4, 7)],
            "mn": [DATETIMES[4]], "n": STAMPS[:4], "i": ["0", "FFF"]}
    rng = random.Random(3)
    rows = []
    for i in range(500):
        row = list(_row(rng, i, nulls=False))
        for j, ((name, *_), _) in enumerate(COLUMNS):
            if name in good:
                row[j] = rng.choice(good[name])
        rows.append(tuple(row))
    keys, values = _rows.encode_rows(rows, plan)
    assert (keys, values) == _rows_python.encode_rows(rows, plan)
    assert keys == list(range(500))
    if _rows.IMPLEMENTATION == "native":  # not one of them declined: all compiled
        native_keys, native_values = _rows.twin("native").encode_rows(rows, plan.native)
        assert (native_keys, native_values) == (keys, values)
    made = _rows.make_rows(keys, values, 77)
    assert made == [DumpRow(k, v, 77) for k, v in zip(keys, values, strict=True)]
    assert all(type(r) is DumpRow for r in made)


def test_typed_rows_from_pymysql_take_the_reference() -> None:
    """Without mysqlclient the rows are pymysql's typed values: the plan has no field
    types, and the reference encodes them (the compiled twin would decline them all)."""
    layout = _layout()
    plan = _rows.row_plan(layout)
    typed = tuple([1, 5, 7, "1.50", "0.000001", None, "18446744073709551615", 1.5, -2.0,
                   1, "ABC", 2024, "2024-02-29", "2024-02-29", "12:00:00", None,
                   "2024-01-02 03:04:05", None, "héllo", b"\x00", "x", "p,q", 1])
    keys, values = _rows.encode_rows([typed], plan)
    raw = tuple(str(v).encode() if isinstance(v, int) and not isinstance(v, bool) else
                repr(v).encode() if isinstance(v, float) else v for v in typed)
    assert (keys, values) == _rows.encode_rows([raw], plan.with_types(_types()))


def test_the_compiled_twin_and_the_c_driver_are_there_unless_forced() -> None:
    """``make test`` must run the compiled path: a missing build or driver fails here
    (``make twins`` runs the reference)."""
    if os.environ.get("DATABUS_PURE_PYTHON", "") not in ("", "0"):
        assert _rows.IMPLEMENTATION == "python"
        return
    assert _rows.IMPLEMENTATION == "native", _rows.WHY_PURE
    assert _dump_driver.available(), _dump_driver.WHY_NOT
