"""The MySQL -> Avro type mapping: row-image decoding (vectors captured from a real
MariaDB 10.11 binlog), Avro encoding checked by decoding with fastavro, and keys."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal
from typing import Any

import pytest
from pymysqlreplication.constants import FIELD_TYPE

from databus.event import decode_key, encode_key
from databus.fetchers.mysql._avro_writers import encode_row, row_writers
from databus.fetchers.mysql._binlog_values import RowDecoder, python_codec
from databus.fetchers.mysql._keys import key_value, row_key_function
from databus.fetchers.mysql._schema import TableShape
from databus.fetchers.mysql._types import ColumnSpec, Kind, decimal_fixed_size
from databus.schemas import AvroCodec

UTC = dt.UTC

# CREATE TABLE t (d DECIMAL(10,2), d2 DECIMAL(65,30), t3 TIME(3), t0 TIME,
#   dt6 DATETIME(6), ts2 TIMESTAMP(2) NULL, dte DATE, y YEAR, b BIT(9),
#   e ENUM('a','b'), s SET('x','y','z'))
PROBE = (
    ColumnSpec("d", Kind.DECIMAL, True, precision=10, scale=2, type_code=FIELD_TYPE.NEWDECIMAL),
    ColumnSpec("d2", Kind.DECIMAL, True, precision=65, scale=30,
               type_code=FIELD_TYPE.NEWDECIMAL),
    ColumnSpec("t3", Kind.TIME, True, precision=3, type_code=FIELD_TYPE.TIME2),
    ColumnSpec("t0", Kind.TIME, True, precision=0, type_code=FIELD_TYPE.TIME2),
    ColumnSpec("dt6", Kind.DATETIME, True, precision=6, type_code=FIELD_TYPE.DATETIME2),
    ColumnSpec("ts2", Kind.TIMESTAMP, True, precision=2, type_code=FIELD_TYPE.TIMESTAMP2),
    ColumnSpec("dte", Kind.DATE, True, type_code=FIELD_TYPE.DATE),
    ColumnSpec("y", Kind.YEAR, True, unsigned=True, type_code=FIELD_TYPE.YEAR),
    ColumnSpec("b", Kind.BITS, True, precision=9, type_code=FIELD_TYPE.BIT),
    ColumnSpec("e", Kind.ENUM, True, type_code=FIELD_TYPE.ENUM, length_size=1,
               labels=("", "a", "b")),
    ColumnSpec("s", Kind.SET, True, type_code=FIELD_TYPE.SET, length_size=1,
               labels=("x", "y", "z")),
)
# The bodies of two WRITE_ROWS events, one row each.
ROW1 = bytes.fromhex(
    "00f87ffffb2dc77ffffffffffffff3eb655bcaf204c72df8a432eaff439eb1ca484078fc857f5fffec784b91"
    "0599b34c720901e240663881d90c5dd00f7c01010205"
)
ROW2 = bytes.fromhex(
    "00f88000000001800000000000000000000000000000000000000000000000000000000001800000000a8000"
    "01800000000000000000000000000000000000000100"
)


def micros(moment: dt.datetime) -> int:
    delta = moment.replace(tzinfo=UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def test_decodes_real_row_images() -> None:
    decoder = RowDecoder(PROBE)
    (row1,), = decoder.read_rows(ROW1, 1)
    assert row1 == [
        -123456,
        -12345678901234567890123456789012345678901234567890,
        -(10 * 3600 * 1000 + 500) * 1000,
        -3020399 * 1_000_000,
        micros(dt.datetime(2024, 5, 6, 7, 8, 9, 123456)),
        micros(dt.datetime(2024, 5, 6, 7, 8, 9, 120000)),
        (dt.date(2024, 2, 29) - dt.date(1970, 1, 1)).days,
        2024,
        b"\x01\x01",
        "b",
        ["x", "z"],
    ]
    (row2,), = decoder.read_rows(ROW2, 1)
    assert row2 == [1, 1, 1000, 1_000_000, "0000-00-00 00:00:00.000000", 0, "0000-00-00", 0,
                    b"\x00\x00", "a", []]


def test_null_bitmap_and_truncation() -> None:
    decoder = RowDecoder(PROBE)
    all_null = b"\xff\x07"
    assert decoder.read_rows(all_null + all_null, 1) == [[[None] * 11], [[None] * 11]]
    with pytest.raises(Exception, match="truncated"):
        decoder.read_rows(ROW1[:-3], 1)


def test_update_rows_have_two_images() -> None:
    decoder = RowDecoder(PROBE)
    rows = decoder.read_rows(ROW1 + ROW2, 2)
    assert len(rows) == 1 and rows[0][1][7] == 0


def _avro(columns: tuple[ColumnSpec, ...], *rows: list[Any]) -> list[dict[str, Any]]:
    """Encode with our writers, decode with fastavro and the shape's schema."""
    shape = TableShape("db", "t", columns, ())
    schema = shape.avro_schema()
    writers = row_writers(columns)
    codec = AvroCodec()
    return [codec.decode(encode_row(writers, row), schema) for row in rows]


def _kinds(nullable: bool) -> tuple[ColumnSpec, ...]:
    return (
        ColumnSpec("i", Kind.INT, nullable),
        ColumnSpec("l", Kind.LONG, nullable),
        ColumnSpec("u", Kind.UINT64, nullable),
        ColumnSpec("d", Kind.DECIMAL, nullable, precision=65, scale=30),
        ColumnSpec("d_same", Kind.DECIMAL, nullable, precision=65, scale=30),
        ColumnSpec("f", Kind.FLOAT, nullable),
        ColumnSpec("g", Kind.DOUBLE, nullable),
        ColumnSpec("b", Kind.BOOL, nullable),
        ColumnSpec("bits", Kind.BITS, nullable, precision=12),
        ColumnSpec("y", Kind.YEAR, nullable),
        ColumnSpec("date", Kind.DATE, nullable),
        ColumnSpec("time", Kind.TIME, nullable),
        ColumnSpec("dtm", Kind.DATETIME, nullable),
        ColumnSpec("ts", Kind.TIMESTAMP, nullable),
        ColumnSpec("txt", Kind.TEXT, nullable),
        ColumnSpec("bin", Kind.BYTES, nullable),
        ColumnSpec("e", Kind.ENUM, nullable),
        ColumnSpec("s", Kind.SET, nullable),
        ColumnSpec("j", Kind.JSON, nullable),
        ColumnSpec("geo", Kind.GEOMETRY, nullable),
    )


REAL = [-(2**31), 2**63 - 1, 2**64 - 1, -(10**65 - 1), 10**35, 1.5, -2.5e300, True,
        b"\x0f\xff", 2155, -719162, -3020399000000, micros(dt.datetime(9999, 12, 31, 23, 59)),
        0, "😀 ü", b"\x00\xff", "", [], "{}", b"\x00" * 25]
EDGE = [0, -(2**63), 0, 0, 1, -0.0, 0.0, False, b"", 0, "0000-00-00", 1,
        "2020-00-00 00:00:00", 2147483647999999, "", b"", "ü", ["a", "b"], "null", b""]
DECODED_REAL = {
    "u": Decimal(2**64 - 1), "d": Decimal("-" + "9" * 35 + "." + "9" * 30),
    "d_same": Decimal("100000"), "date": dt.date(1, 1, 1),
    "dtm": dt.datetime(9999, 12, 31, 23, 59),
    "ts": dt.datetime(1970, 1, 1, tzinfo=UTC),
}


@pytest.mark.parametrize("nullable", [False, True], ids=["not_null", "nullable"])
def test_every_kind_encodes_to_what_fastavro_decodes(nullable: bool) -> None:
    columns = _kinds(nullable)
    rows = [REAL, EDGE] + ([[None] * len(columns)] if nullable else [])
    real, edge, *null = _avro(columns, *rows)
    for column, value in zip(columns, REAL, strict=True):
        expected = DECODED_REAL.get(column.name, value)
        assert real[column.name] == expected, column.name
    assert edge["u"] == Decimal(0) and edge["date"] == "0000-00-00"
    assert edge["dtm"] == "2020-00-00 00:00:00" and edge["s"] == ["a", "b"]
    assert edge["ts"] == dt.datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=UTC)
    assert edge["d_same"] == Decimal("1E-30")
    if nullable:
        assert all(v is None for v in null[0].values())


def test_decimals_are_named_fixed_types() -> None:
    shape = TableShape("db", "t", (ColumnSpec("a", Kind.DECIMAL, False, precision=10, scale=2),
                                   ColumnSpec("b", Kind.DECIMAL, True, precision=10, scale=2),
                                   ColumnSpec("c", Kind.DECIMAL, False, precision=10, scale=4)),
                       ())
    fields = shape.schema_json()["fields"]
    assert fields[0]["type"]["type"] == "fixed" and fields[0]["type"]["name"] == "decimal_10_2"
    assert fields[1]["type"] == ["null", "db.decimal_10_2"]  # defined once, then referenced
    assert fields[2]["type"]["name"] == "decimal_10_4"
    other_scale = TableShape("db", "t", (ColumnSpec("a", Kind.DECIMAL, False, precision=10,
                                                    scale=4),), ())
    same_scale = TableShape("db", "t", (ColumnSpec("a", Kind.DECIMAL, False, precision=10,
                                                   scale=2),), ())
    # The canonical form drops logicalType: the name is what keeps the scales apart.
    assert other_scale.avro_schema().fingerprint != same_scale.avro_schema().fingerprint


@pytest.mark.parametrize(("precision", "size"), [(1, 1), (2, 1), (3, 2), (18, 8), (19, 9),
                                                 (20, 9), (38, 16), (65, 28)])
def test_decimal_fixed_size(precision: int, size: int) -> None:
    assert decimal_fixed_size(precision) == size
    assert -(1 << (8 * size - 1)) <= -(10**precision - 1)


def test_keys() -> None:
    columns = (
        ColumnSpec("id", Kind.UINT64, False),
        ColumnSpec("name", Kind.TEXT, False),
        ColumnSpec("raw", Kind.BYTES, False),
        ColumnSpec("price", Kind.DECIMAL, False, precision=10, scale=2),
        ColumnSpec("day", Kind.DATE, False),
        ColumnSpec("at", Kind.TIMESTAMP, False),
        ColumnSpec("f", Kind.DOUBLE, False),
        ColumnSpec("on", Kind.BOOL, False),
    )
    values = [2**64 - 1, "ü", b"\x00\x01", -12345, 0, 1_500_000, 0.5, True]
    single = {c.name: row_key_function(columns, (i,))(values, b"") for i, c in enumerate(columns)}
    assert single == {"id": -1, "name": "ü", "raw": b"\x00\x01", "price": "-123.45",
                      "day": "1970-01-01", "at": "1970-01-01 00:00:01.500000Z", "f": "0.5",
                      "on": 1}
    composite = row_key_function(columns, (1, 0, 2, 6))(values, b"")
    assert composite == ("ü", -1, "0001", 0.5)
    kind, data, _ = encode_key(composite)
    assert decode_key(kind, data) == composite
    row_hash = row_key_function(columns, ())
    assert row_hash(values, b"abc") == row_hash([], b"abc") != row_hash(values, b"abd")
    assert len(row_hash(values, b"abc")) == 16  # type: ignore[arg-type]


def test_key_values_of_big_decimals_are_exact() -> None:
    column = ColumnSpec("d", Kind.DECIMAL, False, precision=65, scale=30)
    assert key_value(column, -(10**65 - 1)) == "-" + "9" * 35 + "." + "9" * 30


@pytest.mark.parametrize(
    ("charset", "data", "text"),
    [("utf8", "😀".encode(), "😀"), ("utf8mb4", b"a", "a"), ("cp1252", b"\x80\x81", "€\x81"),
     ("latin1", b"\xe9", "é"), ("ucs2", "é".encode("utf-16-be"), "é"),
     ("utf16", "😀".encode("utf-16-be"), "😀"), ("swe7", b"abc\xff", "abc\xff"),
     ("ujis", "日本".encode("euc_jp"), "日本"), (None, b"x", "x")],
)
def test_text_codecs(charset: str | None, data: bytes, text: str) -> None:
    column = ColumnSpec("t", Kind.TEXT, False, type_code=FIELD_TYPE.BLOB, length_size=2,
                        codec=python_codec(charset))
    (row,), = RowDecoder((column,)).read_rows(b"\x00" + struct.pack("<H", len(data)) + data, 1)
    assert row == [text]


def test_binary_is_padded_and_enum_bounds_checked() -> None:
    binary = ColumnSpec("b", Kind.BYTES, False, type_code=FIELD_TYPE.STRING, length_size=1,
                        fixed_length=4)
    assert RowDecoder((binary,)).read_rows(b"\x00\x02ab", 1) == [[[b"ab\x00\x00"]]]
    enum = ColumnSpec("e", Kind.ENUM, False, type_code=FIELD_TYPE.ENUM, length_size=1,
                      labels=("", "a"))
    with pytest.raises(Exception, match="ENUM index 5"):
        RowDecoder((enum,)).read_rows(b"\x00\x05", 1)


def test_integers_of_every_width_and_sign() -> None:
    codes = [(FIELD_TYPE.TINY, 1), (FIELD_TYPE.SHORT, 2), (FIELD_TYPE.INT24, 3),
             (FIELD_TYPE.LONG, 4), (FIELD_TYPE.LONGLONG, 8)]
    columns = []
    data = b""
    expected = []
    for code, size in codes:
        for unsigned in (False, True):
            kind = Kind.UINT64 if (size == 8 and unsigned) else Kind.LONG
            columns.append(ColumnSpec(f"c{code}{unsigned}", kind, False, unsigned=unsigned,
                                      type_code=code))
            data += b"\xff" * size
            expected.append((1 << (8 * size)) - 1 if unsigned else -1)
    decoder = RowDecoder(columns)
    assert decoder.read_rows(b"\x00\x00" + data, 1) == [[expected]]


def test_old_temporal_formats() -> None:
    columns = (
        ColumnSpec("t", Kind.TIME, False, type_code=FIELD_TYPE.TIME),
        ColumnSpec("d", Kind.DATETIME, False, type_code=FIELD_TYPE.DATETIME),
        ColumnSpec("s", Kind.TIMESTAMP, False, type_code=FIELD_TYPE.TIMESTAMP),
    )
    data = (b"\x00" + (-10203).to_bytes(3, "little", signed=True)
            + struct.pack("<Q", 20240506070809) + struct.pack("<I", 7))
    assert RowDecoder(columns).read_rows(data, 1) == [[[
        -(3600 + 2 * 60 + 3) * 1_000_000,
        micros(dt.datetime(2024, 5, 6, 7, 8, 9)),
        7_000_000,
    ]]]
