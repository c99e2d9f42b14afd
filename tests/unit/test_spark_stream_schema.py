"""Avro record schemas -> Spark types and rows (``databus.spark_jobs.stream._schema``):
every type the fetchers produce, values through a fastavro round trip, and the schema
evolution a running query accepts. No SparkSession: ``tests/integration/
test_spark_stream_schema_session.py`` feeds the rows to ``createDataFrame``."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T
from pyspark.sql.types import _make_type_verifier

from databus.errors import DatabusError, SchemaError
from databus.fetchers.mysql._types import ColumnSpec, Kind, avro_field_type
from databus.fetchers.postgres._types import PgType, column_mapping, share_named_types
from databus.fetchers.txlog._schema import field_mapping
from databus.schemas import Schema
from databus.spark_jobs.stream._rows import value_json as json_text
from databus.spark_jobs.stream._schema import (
    IncompatibleSchemaChange,
    check_evolution,
    row_converter,
    row_values,
    spark_schema,
)

UTC = dt.UTC


def record(*fields: tuple[str, Any], name: str = "t", namespace: str = "db") -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for field_name, avro in fields:
        field: dict[str, Any] = {"name": field_name, "type": avro}
        if isinstance(avro, list) and avro[0] == "null":
            field["default"] = None
        out.append(field)
    return {"type": "record", "name": name, "namespace": namespace, "fields": out}


def round_trip(schema: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    """``value`` encoded and decoded by fastavro, as the stream's codec decodes it."""
    parsed = parse_schema(schema)
    buf = io.BytesIO()
    schemaless_writer(buf, parsed, value)
    decoded = schemaless_reader(io.BytesIO(buf.getvalue()), parsed, None)
    assert isinstance(decoded, dict)
    return decoded


def verify(schema: dict[str, Any], row: tuple[Any, ...]) -> None:
    """Spark's own check of a row against the StructType (createDataFrame's)."""
    _make_type_verifier(spark_schema(schema))(row)


# -- the fetchers' types --------------------------------------------------------------


def mysql(kind: Kind, nullable: bool = False, precision: int = 0, scale: int = 0) -> Any:
    return avro_field_type(ColumnSpec("c", kind, nullable, precision=precision, scale=scale),
                           "db", set())


INT4_ARRAY = PgType(oid=1007, name="_int4", namespace="pg_catalog", kind="b",
                    element_oid=23, base_oid=0, category="A")

# (Avro type from a fetcher, Spark type, a value fastavro writes, the row value Spark gets)
FETCHER_TYPES: list[tuple[str, Any, str, Any, Any]] = [
    ("mysql int", mysql(Kind.INT), "int", 7, 7),
    ("mysql bigint", mysql(Kind.LONG), "bigint", -(2**63), -(2**63)),
    ("mysql bigint unsigned", mysql(Kind.UINT64), "decimal(20,0)",
     Decimal(2**64 - 1), Decimal(2**64 - 1)),
    ("mysql decimal", mysql(Kind.DECIMAL, precision=10, scale=2), "decimal(10,2)",
     Decimal("-12345678.90"), Decimal("-12345678.90")),
    ("mysql decimal 65", mysql(Kind.DECIMAL, precision=65, scale=30), "string",
     Decimal("1." + "0" * 29 + "1"), "1." + "0" * 29 + "1"),
    ("mysql float", mysql(Kind.FLOAT), "float", 1.5, 1.5),
    ("mysql double", mysql(Kind.DOUBLE, nullable=True), "double", 2.25, 2.25),
    ("mysql bit(1)", mysql(Kind.BOOL), "boolean", True, True),
    ("mysql bit(12)", mysql(Kind.BITS), "binary", b"\x0f\xff", b"\x0f\xff"),
    ("mysql year", mysql(Kind.YEAR), "int", 2024, 2024),
    ("mysql time", mysql(Kind.TIME), "bigint", -3_000_000, -3_000_000),
    ("mysql timestamp", mysql(Kind.TIMESTAMP), "timestamp",
     dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
     dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)),
    ("mysql text", mysql(Kind.TEXT, nullable=True), "string", "héllo", "héllo"),
    ("mysql blob", mysql(Kind.BYTES), "binary", b"\x00\x01", b"\x00\x01"),
    ("mysql enum", mysql(Kind.ENUM), "string", "red", "red"),
    ("mysql set", mysql(Kind.SET), "array<string>", ["a", "c"], ["a", "c"]),
    ("mysql json", mysql(Kind.JSON), "string", '{"a": 1}', '{"a": 1}'),
    ("pg smallint", column_mapping(21, -1, {}).avro, "int", 3, 3),
    ("pg numeric(12,3)", column_mapping(1700, ((12 << 16) | 3) + 4, {}).avro,
     "decimal(12,3)", Decimal("1.234"), Decimal("1.234")),
    ("pg numeric", column_mapping(1700, -1, {}).avro, "string", "NaN", "NaN"),
    ("pg bytea", column_mapping(17, -1, {}).avro, "binary", b"\xff", b"\xff"),
    ("pg int[]", column_mapping(1007, -1, {1007: INT4_ARRAY}).avro, "array<string>",
     [1, None, [2, 3]], ["1", None, "[2, 3]"]),
    ("txlog sqlite integer", field_mapping("sqlite", "INTEGER").avro, "bigint", 1, 1),
    ("txlog sqlite real", field_mapping("sqlite", "REAL").avro, "double", 0.5, 0.5),
    ("txlog sqlite numeric", field_mapping("sqlite", "NUMERIC").avro, "string",
     2.5, "2.5"),
    ("txlog pg numeric(8,2)", field_mapping("postgresql", "numeric(8,2)").avro,
     "decimal(8,2)", Decimal("3.10"), Decimal("3.10")),
    ("txlog pg date", field_mapping("postgresql", "date").avro, "date",
     dt.date(2020, 2, 29), dt.date(2020, 2, 29)),
    ("txlog pg timestamp", field_mapping("postgresql", "timestamp").avro, "timestamp_ntz",
     dt.datetime(2020, 1, 2, 3, 4, 5, 6), dt.datetime(2020, 1, 2, 3, 4, 5, 6)),
    ("txlog pg time", field_mapping("postgresql", "time").avro, "bigint",
     dt.time(1, 2, 3, 4), 3_723_000_004),
    ("uuid", {"type": "string", "logicalType": "uuid"}, "string",
     "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"),
    ("timestamp-millis", {"type": "long", "logicalType": "timestamp-millis"}, "timestamp",
     dt.datetime(2001, 1, 1, 0, 0, 0, 5000, tzinfo=UTC),
     dt.datetime(2001, 1, 1, 0, 0, 0, 5000, tzinfo=UTC)),
    ("avro enum", {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}, "string",
     "GREEN", "GREEN"),
    ("avro fixed", {"type": "fixed", "name": "f4", "size": 4}, "binary", b"abcd", b"abcd"),
    ("avro map", {"type": "map", "values": ["null", "long"]}, "map<string,bigint>",
     {"a": 1, "b": None}, {"a": 1, "b": None}),
    ("avro record", {"type": "record", "name": "Dims", "fields": [
        {"name": "w", "type": "float"}, {"name": "d", "type": {"type": "int",
                                                               "logicalType": "date"}}]},
     "struct<w:float,d:date>", {"w": 1.5, "d": dt.date(1999, 12, 31)},
     (1.5, dt.date(1999, 12, 31))),
]


@pytest.mark.parametrize(("label", "avro", "spark", "value", "expected"), FETCHER_TYPES,
                         ids=[row[0] for row in FETCHER_TYPES])
def test_fetcher_type_maps_and_round_trips(label: str, avro: Any, spark: str, value: Any,
                                           expected: Any) -> None:
    schema = record(("id", "long"), ("c", avro))
    struct = spark_schema(schema)
    assert [f.name for f in struct.fields] == ["id", "c"]
    assert struct["c"].dataType.simpleString() == spark
    assert all(f.nullable for f in struct.fields)  # a delete has no row
    row = row_values(schema, round_trip(schema, {"id": 1, "c": value}))
    assert row == (1, expected)
    verify(schema, row)


@pytest.mark.parametrize("avro", [
    mysql(Kind.DATE), mysql(Kind.DATE, nullable=True), mysql(Kind.DATETIME),
    column_mapping(1082, -1, {}).avro, column_mapping(1184, -1, {}).avro,
], ids=["mysql date", "mysql date null", "mysql datetime", "pg date", "pg timestamptz"])
def test_a_type_with_a_text_branch_gets_a_text_column(avro: Any) -> None:
    """[T, "string"]: the typed column, and ``c__str`` when the value is text (zero
    dates, infinity), exactly one of them set (both null for a null)."""
    branches = avro if isinstance(avro, list) else [avro]
    typed = next(b for b in branches if isinstance(b, dict))
    schema = record(("c", avro))
    struct = spark_schema(schema)
    assert [f.name for f in struct.fields] == ["c", "c__str"]
    assert struct["c__str"].dataType == T.StringType()
    text = round_trip(schema, {"c": ("string", "0000-00-00")})
    assert row_values(schema, text) == (None, "0000-00-00")
    when = (dt.date(2021, 3, 4) if typed["logicalType"] == "date"
            else dt.datetime(2021, 3, 4, 5, 6, 7, tzinfo=UTC)
            if typed["logicalType"] == "timestamp-micros" else dt.datetime(2021, 3, 4, 5, 6, 7))
    row = row_values(schema, round_trip(schema, {"c": when}))
    assert row == (when, None)
    verify(schema, row)
    if "null" in branches:
        assert row_values(schema, round_trip(schema, {"c": None})) == (None, None)


def test_named_decimals_shared_between_columns() -> None:
    """The fetchers define ``decimal_P_S`` once and refer to it by name after."""
    defined: set[str] = set()
    a = avro_field_type(ColumnSpec("a", Kind.DECIMAL, False, precision=9, scale=2), "db",
                        defined)
    b = avro_field_type(ColumnSpec("b", Kind.DECIMAL, True, precision=9, scale=2), "db",
                        defined)
    assert b == ["null", "db.decimal_9_2"]
    schema = record(("a", a), ("b", b))
    struct = spark_schema(schema)
    assert struct["b"].dataType == T.DecimalType(9, 2)
    shared = share_named_types([column_mapping(1700, ((5 << 16) | 1) + 4, {}).avro] * 2)
    assert spark_schema(record(("x", shared[0]), ("y", shared[1])))["y"].dataType == \
        T.DecimalType(5, 1)
    assert row_values(schema, round_trip(schema, {"a": Decimal("1.00"), "b": None})) == \
        (Decimal("1.00"), None)


def test_sqlite_blob_union_is_json_text() -> None:
    schema = record(("c", ["null", *field_mapping("sqlite", "BLOB").avro]))
    assert spark_schema(schema)["c"].dataType == T.StringType()
    assert row_values(schema, round_trip(schema, {"c": "x"})) == ('"x"',)
    assert row_values(schema, round_trip(schema, {"c": 5})) == ("5",)
    assert row_values(schema, round_trip(schema, {"c": None})) == (None,)


def test_a_delete_without_a_row_is_all_nulls() -> None:
    schema = record(("a", "long"), ("b", mysql(Kind.DATE)))
    assert row_values(schema, None) == (None, None, None)
    assert row_converter(schema)(None) == (None, None, None)


def test_not_a_record_is_refused() -> None:
    with pytest.raises(SchemaError):
        spark_schema({"type": "array", "items": "long"})


def test_json_text() -> None:
    assert json_text(None) is None
    assert json.loads(json_text({"a": b"\x01\xff", "d": Decimal("1.5"),
                                 "t": dt.date(2020, 1, 2), "u": uuid.UUID(int=1)}) or "") == {
        "a": "01ff", "d": "1.5", "t": "2020-01-02",
        "u": "00000000-0000-0000-0000-000000000001"}


# -- random schemas and values --------------------------------------------------------

# (Avro type, strategy of values fastavro writes for it)
SCALARS: list[tuple[Any, st.SearchStrategy[Any]]] = [
    ("int", st.integers(-(2**31), 2**31 - 1)),
    ("long", st.integers(-(2**63), 2**63 - 1)),
    ("double", st.floats(allow_nan=False)),
    ("float", st.floats(width=32, allow_nan=False)),
    ("boolean", st.booleans()),
    ("string", st.text(max_size=8)),
    ("bytes", st.binary(max_size=8)),
    ({"type": "int", "logicalType": "date"}, st.dates()),
    ({"type": "long", "logicalType": "timestamp-micros"},
     st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1),
                  timezones=st.just(UTC))),
    ({"type": "long", "logicalType": "local-timestamp-micros"},
     st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))),
    ({"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 4},
     st.decimals(min_value=-(10**13), max_value=10**13, places=4)),
    ({"type": "array", "items": "long"}, st.lists(st.integers(-5, 5), max_size=3)),
    ({"type": "map", "values": "string"},
     st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=3)),
]


@st.composite
def schemas_and_values(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    picks = draw(st.lists(st.tuples(st.sampled_from(range(len(SCALARS))), st.booleans()),
                          min_size=1, max_size=6))
    fields = []
    for i, (which, nullable) in enumerate(picks):
        avro = SCALARS[which][0]
        fields.append((f"f{i}", ["null", avro] if nullable else avro))
    schema = record(*fields)
    values = []
    for _ in range(draw(st.integers(1, 3))):
        value = {}
        for i, (which, nullable) in enumerate(picks):
            strategy = SCALARS[which][1]
            value[f"f{i}"] = draw(st.none() | strategy if nullable else strategy)
        values.append(value)
    return schema, values


@settings(max_examples=60)
@given(schemas_and_values())
def test_random_rows_fit_their_struct(case: tuple[dict[str, Any], list[dict[str, Any]]]
                                      ) -> None:
    schema, values = case
    struct = spark_schema(schema)
    for value in values:
        row = row_values(schema, round_trip(schema, value))
        assert len(row) == len(struct.fields)
        verify(schema, row)
        for field, got in zip(struct.fields, row, strict=True):
            sent = value[field.name]
            if isinstance(field.dataType, T.MapType):
                assert got == sent
            elif isinstance(field.dataType, T.FloatType) and sent is not None:
                assert got == pytest.approx(sent, rel=1e-6)
            else:
                assert got == sent


@settings(max_examples=40)
@given(schemas_and_values(), st.lists(st.tuples(st.sampled_from(range(len(SCALARS))),
                                                st.booleans()), max_size=3))
def test_added_nullable_columns_read_older_rows_as_nulls(
        case: tuple[dict[str, Any], list[dict[str, Any]]],
        added: list[tuple[int, bool]]) -> None:
    old, values = case
    new = {**old, "fields": [*old["fields"], *record(
        *((f"new{i}", ["null", SCALARS[w][0]]) for i, (w, _) in enumerate(added)))["fields"]]}
    check_evolution(old, new)
    for value in values:
        row = row_values(new, round_trip(old, value))  # decoded with the writer schema
        assert row[len(old["fields"]):] == (None,) * len(added)
        verify(new, row)


# -- evolution ------------------------------------------------------------------------

BASE = record(("id", "long"), ("n", "int"), ("x", ["null", "float"]),
              ("price", mysql(Kind.DECIMAL, precision=10, scale=2)),
              ("d", mysql(Kind.DATE)), name="orders", namespace="shop")


def changed(name: str, avro: Any) -> dict[str, Any]:
    return {**BASE, "fields": [dict(f, type=avro) if f["name"] == name else f
                               for f in BASE["fields"]]}


@pytest.mark.parametrize("new", [
    BASE,
    changed("n", "long"),
    changed("x", ["null", "double"]),
    changed("n", ["null", "int"]),  # made nullable
    changed("price", mysql(Kind.DECIMAL, precision=12, scale=2)),
    changed("price", mysql(Kind.DECIMAL, precision=13, scale=3)),
    {**BASE, "fields": [*BASE["fields"], {"name": "note", "type": ["null", "string"],
                                          "default": None}]},
], ids=["same", "int->long", "float->double", "nullable", "decimal wider",
        "decimal more scale", "added nullable"])
def test_compatible_changes_pass(new: dict[str, Any]) -> None:
    check_evolution(BASE, new)


@pytest.mark.parametrize(("new", "column", "reason"), [
    ({**BASE, "fields": BASE["fields"][1:]}, "id", "was removed"),
    (changed("n", "string"), "n", "changed type from int to string"),
    (changed("id", "int"), "id", "changed type from bigint to int"),
    (changed("x", "float"), "x", "was made non-null"),
    (changed("price", mysql(Kind.DECIMAL, precision=10, scale=4)), "price",
     "decimal(10,2) to decimal(10,4)"),
    (changed("d", {"type": "int", "logicalType": "date"}), "d", "lost its text branch"),
    ({**BASE, "fields": [*BASE["fields"], {"name": "must", "type": "long"}]}, "must",
     "added as non-null"),
], ids=["removed", "int->string", "long->int", "non-null", "decimal scale", "text branch",
        "added non-null"])
def test_incompatible_changes_raise_one_clear_error(new: dict[str, Any], column: str,
                                                    reason: str) -> None:
    with pytest.raises(IncompatibleSchemaChange) as caught:
        check_evolution(BASE, new)
    error = caught.value
    assert issubclass(IncompatibleSchemaChange, DatabusError)
    assert error.code == "incompatible_schema_change"
    assert error.source == "shop.orders"
    assert error.column == column
    assert reason in str(error)
    assert "new checkpoint" in str(error) and "JSON 'value' column" in str(error)
    assert "0x" in str(error)  # the two schema fingerprints


def test_source_name_can_be_given() -> None:
    with pytest.raises(IncompatibleSchemaChange, match=r"source db1\.orders:"):
        check_evolution(BASE, changed("n", "string"), source="db1.orders")


def test_a_schema_object_is_taken_as_its_json() -> None:
    schema = Schema(record(("a", "long"), ("b", ["null", "string"])))
    assert spark_schema(schema) == spark_schema(schema.schema)
    assert row_values(schema, {"a": 1}) == (1, None)  # written before b was added
    with pytest.raises(IncompatibleSchemaChange, match=r"'a' was removed"):
        check_evolution(schema, Schema(record(("b", ["null", "string"]))))


def test_fields_a_newer_writer_added_are_left_out() -> None:
    """A query keeps the columns it started with: a value of a newer version (an added
    column) converts to those columns; it gets the new one once re-planned."""
    old = record(("a", "long"))
    new = record(("a", "long"), ("b", ["null", "string"]))
    check_evolution(old, new)
    assert spark_schema(old) != spark_schema(new)  # what tells a source to re-plan
    assert row_values(old, round_trip(new, {"a": 1, "b": "x"})) == (1,)


def test_json_text_of_times_is_iso() -> None:
    when = dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert json_text({"t": when, "h": dt.time(1, 2)}) == \
        '{"t":"2020-01-02T03:04:05+00:00","h":"01:02:00"}'
