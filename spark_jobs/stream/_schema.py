"""Avro record schemas -> Spark ``StructType``, decoded values -> Spark rows, and the
schema evolution a running query accepts (pure: importing it needs no SparkSession).

The mapping is the Parquet export's (``databus.spark_jobs._arrow_avro``), so a table
written from the stream and a snapshot exported to Parquet have the same columns:

==========================================  ==============================================
Avro                                        Spark
==========================================  ==============================================
boolean, int, long, float, double           boolean, int, bigint, float, double
string, enum, uuid                          string
bytes, fixed                                binary
int date                                    date
long timestamp-millis / -micros             timestamp (UTC instant)
long local-timestamp-millis / -micros       timestamp_ntz
int time-millis / long time-micros          int milliseconds / bigint microseconds
decimal(p, s), p <= 38                      decimal(p, s)
decimal(p, s), p > 38                       string (the exact decimal text)
record, array, map                          struct, array, map<string, _>
["null", T]                                 T
[T, "string"] (top level)                   T, plus a ``<field>__str`` string column set
                                            when the value took the string branch (the
                                            fetchers' zero dates, ``infinity``, BC dates)
any other union                             string: the value as JSON text
==========================================  ==============================================

Every top-level column is nullable in Spark, whatever the Avro type: a delete carries no
row (``row_values(schema, None)`` is all nulls), and rows written before a column was
added have none.

Schema evolution (``check_evolution``): a query reads every version of a source's schema
with the newest one. That is sound when the newer version only adds nullable columns,
widens ``int`` -> ``long``, ``float`` -> ``double``, or a decimal without losing digits
(the scale and the integer digits do not shrink), or makes a non-null column nullable.
Values written with an older version are decoded with their own (writer) schema and
converted by ``row_values`` with the newest one: a missing field is a null, an ``int``
fits a ``long``. Anything else raises ``IncompatibleSchemaChange``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from databus.errors import SchemaError
from databus.schemas import Schema, fingerprint
from databus.spark_jobs._arrow_avro import Column, record_columns
from databus.spark_jobs._arrow_avro import _same as _export_same

__all__ = [
    "IncompatibleSchemaChange",
    "RowConverter",
    "check_evolution",
    "row_converter",
    "row_values",
    "spark_schema",
]

Convert = Callable[[Any], Any]

JSON_MODE_HINT = ("restart the query from a new checkpoint (and write to a new table), "
                  "or read the source as a JSON 'value' column")


class IncompatibleSchemaChange(SchemaError):
    """A source's new schema version cannot be read by a running query with its newest
    schema: a column removed, a type changed to one that does not hold the old values, a
    column made non-null, a non-null column added. The message names the source, the
    column and what to do."""

    code = "incompatible_schema_change"

    def __init__(self, source: str, column: str, reason: str, *, old: int | None = None,
                 new: int | None = None) -> None:
        versions = ""
        if old is not None and new is not None:
            versions = f" (schema 0x{old:016x} -> 0x{new:016x})"
        super().__init__(
            f"source {source}: column {column!r} {reason}{versions}; a running query reads "
            f"every schema version with the newest, which only adds nullable columns or "
            f"widens types: {JSON_MODE_HINT}")
        self.source = source
        self.column = column
        self.reason = reason


# -- types ----------------------------------------------------------------------------


def _spark_type(arrow: pa.DataType) -> Any:
    """The Spark type of an Arrow type of the export mapping."""
    simple = _SIMPLE.get(str(arrow))
    if simple is not None:
        return simple()
    if pa.types.is_decimal(arrow):
        return T.DecimalType(arrow.precision, arrow.scale)
    if pa.types.is_timestamp(arrow):
        return T.TimestampType() if arrow.tz is not None else T.TimestampNTZType()
    if pa.types.is_struct(arrow):
        return T.StructType([T.StructField(f.name, _spark_type(f.type), True) for f in arrow])
    if pa.types.is_list(arrow):
        return T.ArrayType(_spark_type(arrow.value_type), True)
    if pa.types.is_map(arrow):
        return T.MapType(T.StringType(), _spark_type(arrow.item_type), True)
    raise SchemaError(f"no Spark type for Arrow type {arrow}")  # pragma: no cover


_SIMPLE: dict[str, Callable[[], Any]] = {
    "null": T.NullType, "bool": T.BooleanType, "int32": T.IntegerType, "int64": T.LongType,
    "float": T.FloatType, "double": T.DoubleType, "string": T.StringType,
    "binary": T.BinaryType, "date32[day]": T.DateType,
}


def _same(value: Any) -> Any:
    return value


def _spark_value(arrow: pa.DataType) -> Convert | None:
    """What turns the export's Python value of ``arrow`` into Spark's, None when it is
    already Spark's (structs become tuples, maps dicts)."""
    if pa.types.is_struct(arrow):
        fields = [(f.name, _spark_value(f.type) or _same) for f in arrow]

        def struct(value: Any) -> Any:
            if value is None:
                return None
            return tuple(convert(value.get(name)) for name, convert in fields)

        return struct
    if pa.types.is_list(arrow):
        item = _spark_value(arrow.value_type)
        if item is None:
            return None
        return lambda v: None if v is None else [item(x) for x in v]
    if pa.types.is_map(arrow):
        inner = _spark_value(arrow.item_type) or _same
        return lambda v: None if v is None else {k: inner(x) for k, x in v}
    return None


@dataclass(frozen=True)
class _Plan:
    """One Avro record schema, compiled: its columns and their Spark types."""

    columns: list[Column]
    struct: Any  # pyspark StructType
    convert: Callable[[Mapping[str, Any] | None], tuple[Any, ...]]


def _plan(avro_schema: Mapping[str, Any]) -> _Plan:
    columns = record_columns(avro_schema)
    fields: list[Any] = []
    steps: list[tuple[str, Convert | None, bool]] = []
    for column in columns:
        arrow = column.mapped.type
        fields.append(T.StructField(column.name, _spark_type(arrow), True))
        if column.text_sibling:
            fields.append(T.StructField(column.text_name, T.StringType(), True))
        to_arrow = column.mapped.to_arrow
        to_spark = _spark_value(arrow)
        convert: Convert | None
        if to_spark is not None:
            convert = (lambda a, s: lambda v: s(a(v)))(to_arrow, to_spark)
        elif to_arrow is _export_same:
            convert = None
        else:
            convert = to_arrow
        steps.append((column.name, convert, column.text_sibling))
    width = len(fields)

    def row(value: Mapping[str, Any] | None) -> tuple[Any, ...]:
        if value is None:
            return (None,) * width
        out: list[Any] = []
        for name, convert, sibling in steps:
            v = value.get(name)
            if sibling:
                if isinstance(v, str):
                    out.append(None)
                    out.append(v)
                    continue
                out.append(v if convert is None or v is None else convert(v))
                out.append(None)
            else:
                out.append(v if convert is None or v is None else convert(v))
        return tuple(out)

    return _Plan(columns, T.StructType(fields), row)


# Compiled plans by schema object: the stream converts many values of few schemas. The
# schema itself is kept with its plan, so an id reused by a new dict never matches.
_PLANS: dict[int, tuple[Mapping[str, Any], _Plan]] = {}
_MAX_PLANS = 256


AvroRecord = Mapping[str, Any] | Schema
"""A record schema as parsed JSON, or a ``Schema`` (its ``schema``)."""


def _json(avro_schema: AvroRecord) -> Mapping[str, Any]:
    if isinstance(avro_schema, Schema):
        raw = avro_schema.schema
        if not isinstance(raw, Mapping):
            raise SchemaError(f"schema {avro_schema.name} is not a record")
        return raw
    return avro_schema


def _cached_plan(avro_schema: AvroRecord) -> _Plan:
    avro_schema = _json(avro_schema)
    entry = _PLANS.get(id(avro_schema))
    if entry is not None and entry[0] is avro_schema:
        return entry[1]
    plan = _plan(avro_schema)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[id(avro_schema)] = (avro_schema, plan)
    return plan


def spark_schema(avro_schema: AvroRecord) -> Any:
    """The ``StructType`` of the value columns of an Avro record schema (see the module
    docstring); every field nullable."""
    return _cached_plan(avro_schema).struct


RowConverter = Callable[[Mapping[str, Any] | None], tuple[Any, ...]]


def row_converter(avro_schema: AvroRecord) -> RowConverter:
    """``row_values`` of one schema as a function of the value (the hot path)."""
    return _cached_plan(avro_schema).convert


def row_values(avro_schema: AvroRecord, value: Mapping[str, Any] | None
               ) -> tuple[Any, ...]:
    """A decoded Avro record (fastavro's dict; None for a delete without a row) as the
    tuple of Python values Spark takes for ``spark_schema(avro_schema)``. ``value`` may
    have been written with an older schema version that ``check_evolution`` accepted:
    its missing fields are nulls."""
    return _cached_plan(avro_schema).convert(value)


# -- evolution ------------------------------------------------------------------------


def _widens(old: Any, new: Any) -> bool:
    """Whether every value of Spark type ``old`` is one of ``new``."""
    if old == new:
        return True
    if isinstance(old, T.IntegerType) and isinstance(new, T.LongType):
        return True
    if isinstance(old, T.FloatType) and isinstance(new, T.DoubleType):
        return True
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return (new.scale >= old.scale
                and new.precision - new.scale >= old.precision - old.scale)
    if isinstance(old, T.StructType) and isinstance(new, T.StructType):
        fields = {f.name: f.dataType for f in new.fields}
        return all(f.name in fields and _widens(f.dataType, fields[f.name])
                   for f in old.fields)
    if isinstance(old, T.ArrayType) and isinstance(new, T.ArrayType):
        return _widens(old.elementType, new.elementType)
    if isinstance(old, T.MapType) and isinstance(new, T.MapType):
        return _widens(old.valueType, new.valueType)
    return False


def _source_name(avro_schema: Mapping[str, Any]) -> str:
    name = str(avro_schema.get("name", "?"))
    namespace = avro_schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def check_evolution(old_avro: AvroRecord, new_avro: AvroRecord, *,
                    source: str | None = None) -> None:
    """Raise ``IncompatibleSchemaChange`` unless values of ``old_avro`` can be read as
    rows of ``spark_schema(new_avro)`` (the module docstring says what passes).
    ``source`` names the source in the message (default: the record's full name)."""
    old_avro, new_avro = _json(old_avro), _json(new_avro)
    source = source or _source_name(new_avro)
    try:
        prints: tuple[int | None, int | None] = (fingerprint(dict(old_avro)),
                                                 fingerprint(dict(new_avro)))
    except Exception:  # an invalid schema still gets its columns checked below
        prints = (None, None)
    old_plan, new_plan = _cached_plan(old_avro), _cached_plan(new_avro)

    def refuse(column: str, reason: str) -> IncompatibleSchemaChange:
        return IncompatibleSchemaChange(source, column, reason, old=prints[0], new=prints[1])

    new_columns = {c.name: c for c in new_plan.columns}
    new_types = {f.name: f.dataType for f in new_plan.struct.fields}
    old_types = {f.name: f.dataType for f in old_plan.struct.fields}
    for column in old_plan.columns:
        now = new_columns.get(column.name)
        if now is None:
            raise refuse(column.name, "was removed")
        if column.text_sibling and not now.text_sibling:
            raise refuse(column.name, "lost its text branch (its values that are not a "
                                      f"{old_types[column.name].simpleString()} have no column)")
        before, after = old_types[column.name], new_types[column.name]
        if not _widens(before, after):
            raise refuse(column.name, f"changed type from {before.simpleString()} to "
                                      f"{after.simpleString()}, which does not hold every "
                                      f"old value")
        if column.nullable and not now.nullable:
            raise refuse(column.name, "was made non-null")
    old_names = {c.name for c in old_plan.columns}
    for column in new_plan.columns:
        if column.name not in old_names and not column.nullable:
            raise refuse(column.name, "was added as non-null (older rows have no value "
                                      "for it)")
