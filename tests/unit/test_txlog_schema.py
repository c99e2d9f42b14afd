"""Column types -> Avro (every row of the mapping table), row values, keys (pure)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from databus.errors import SchemaError
from databus.fetchers.txlog._model import Column, TableRef, TableShape
from databus.fetchers.txlog._schema import TableCodec, field_mapping, normalize_key
from databus.schemas import AvroCodec, avro_names

pytestmark = pytest.mark.twin("databus.batch")

TS_LOCAL = {"type": "long", "logicalType": "local-timestamp-micros"}
TS_UTC = {"type": "long", "logicalType": "timestamp-micros"}


@pytest.mark.parametrize(("sql_type", "avro"), [
    ("INTEGER", "long"), ("BIGINT", "long"), ("tinyint", "long"),
    ("TEXT", "string"), ("VARCHAR(20)", "string"), ("CLOB", "string"),
    ("REAL", "double"), ("FLOAT", "double"), ("DOUBLE PRECISION", "double"),
    ("BLOB", ["bytes", "long", "double", "string"]), ("", ["bytes", "long", "double", "string"]),
    ("NUMERIC", ["long", "double", "string"]), ("DECIMAL(10,2)", ["long", "double", "string"]),
    ("BOOLEAN", ["long", "double", "string"]), ("DATETIME", ["long", "double", "string"]),
])
def test_sqlite_mapping(sql_type: str, avro: Any) -> None:
    assert field_mapping("sqlite", sql_type).avro == avro


@pytest.mark.parametrize(("sql_type", "avro", "as_text"), [
    ("smallint", "int", False), ("integer", "int", False),
    ("bigint", "long", False), ("oid", "long", False),
    ("real", "float", False), ("double precision", "double", False),
    ("boolean", "boolean", False),
    ("text", "string", False), ("character varying(10)", "string", False),
    ("character(3)", "string", False), ("name", "string", False),
    ("bytea", "bytes", False),
    ("numeric(10,2)", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
     False),
    ("numeric", "string", True),
    ("date", {"type": "int", "logicalType": "date"}, False),
    ("timestamp without time zone", TS_LOCAL, False),
    ("timestamp(3) without time zone", TS_LOCAL, False),
    ("timestamp with time zone", TS_UTC, False),
    ("time without time zone", {"type": "long", "logicalType": "time-micros"}, False),
    ("time with time zone", "string", True),
    ("uuid", "string", True), ("json", "string", True), ("jsonb", "string", True),
    ("interval", "string", True), ("integer[]", "string", True), ("inet", "string", True),
    ("money", "string", True), ("mood", "string", True),
])
def test_postgres_mapping(sql_type: str, avro: Any, as_text: bool) -> None:
    mapping = field_mapping("postgresql", sql_type)
    assert (mapping.avro, mapping.as_text) == (avro, as_text)


@pytest.mark.parametrize(("sql_type", "avro"), [
    ("INTEGER", "long"), ("NUMBER(10,0)", "long"), ("NUMBER(18,0)", "long"),
    ("NUMBER(19,0)", {"type": "bytes", "logicalType": "decimal", "precision": 19, "scale": 0}),
    ("NUMBER(12,2)", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}),
    ("NUMBER", "string"), ("FLOAT", "string"),
    ("BINARY_FLOAT", "float"), ("BINARY_DOUBLE", "double"),
    ("VARCHAR2", "string"), ("NVARCHAR2", "string"), ("CHAR", "string"), ("NCHAR", "string"),
    ("CLOB", "string"), ("NCLOB", "string"), ("RAW", "bytes"), ("BLOB", "bytes"),
    ("DATE", TS_LOCAL), ("TIMESTAMP(6)", TS_LOCAL),
    ("TIMESTAMP(6) WITH TIME ZONE", TS_UTC), ("TIMESTAMP(6) WITH LOCAL TIME ZONE", TS_UTC),
    ("XMLTYPE", "string"),
])
def test_oracle_mapping(sql_type: str, avro: Any) -> None:
    assert field_mapping("oracle", sql_type).avro == avro


def shape(*columns: Column, key: tuple[str, ...] = ("id",)) -> TableShape:
    return TableShape(TableRef("public", "t"), columns, key)


def test_codec_schema_nullability_and_round_trip() -> None:
    s = shape(Column("id", "bigint", False), Column("price", "numeric(8,2)"),
              Column("at", "timestamp with time zone"), Column("raw", "bytea"),
              Column("2nd col", "text"))
    codec = TableCodec(s, "postgresql", "public.t")
    schema = codec.schema
    assert schema.name == "public.t"
    fields = {f["name"]: f for f in schema.fields}
    assert fields["id"]["type"] == "long" and "default" not in fields["id"]
    assert fields["price"]["type"][0] == "null" and fields["price"]["default"] is None
    assert fields["_2nd_col"]["sql_name"] == "2nd col"
    at = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    row = (7, Decimal("12.50"), at, memoryview(b"\x01"), "x")
    value = AvroCodec(schemas=[schema]).decode(codec.encode(row), schema)
    assert value == {"id": 7, "price": Decimal("12.50"), "at": at, "raw": b"\x01",
                     "_2nd_col": "x"}
    assert codec.key(row) == 7


def test_sqlite_values_that_do_not_fit_are_a_clear_error() -> None:
    codec = TableCodec(shape(Column("id", "INTEGER", False), Column("qty", "INT"),
                             Column("any", "")), "sqlite", "shop.t")
    schema = codec.schema
    decoded = AvroCodec(schemas=[schema]).decode(codec.encode((1, 2.0, b"\x00")), schema)
    assert decoded == {"id": 1, "qty": 2, "any": b"\x00"}  # 2.0 is a whole number
    with pytest.raises(SchemaError, match=r"column 'qty' \(INT\) holds the str 'many'"):
        codec.encode((1, "many", None))


def test_keys() -> None:
    assert normalize_key([5]) == 5
    assert normalize_key(["a"]) == "a"
    assert normalize_key([memoryview(b"\x01")]) == b"\x01"
    assert normalize_key([True]) == 1
    assert normalize_key([Decimal("1.50")]) == "1.50"
    assert normalize_key([dt.date(2024, 1, 2)]) == "2024-01-02"
    assert normalize_key([1, "x", b"\xff", None, 1.5, dt.time(1, 2)]) == (
        1, "x", "ff", None, 1.5, "01:02:00")


def test_avro_names_are_valid_and_distinct() -> None:
    assert avro_names(["a b", "a_b", "1x", "", "ok"]) == ["a_b", "a_b_2", "_1x", "_", "ok"]
