"""A stand-in for ``_schema`` (Avro -> Spark columns) until that module is merged:
Avro primitives map to their Spark types, nullable unions to nullable columns, anything
else (logical types, records, arrays, maps, enums) to its JSON text. Same functions
and signatures as ``_schema``, which replaces it: ``spark_schema``, ``row_values``,
``check_evolution`` (here: every new field must be nullable or have a default).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

_PRIMITIVES = {"boolean": "BooleanType", "int": "IntegerType", "long": "LongType",
               "float": "FloatType", "double": "DoubleType", "string": "StringType",
               "bytes": "BinaryType"}


def _branch(avro_type: object) -> tuple[object, bool]:
    """The non-null type of a field, and whether it is nullable."""
    if isinstance(avro_type, list):
        rest = [t for t in avro_type if t != "null"]
        return (rest[0] if len(rest) == 1 else rest), len(rest) < len(avro_type)
    return avro_type, False


def _plain(avro_type: object) -> str | None:
    """The primitive name when the type is a plain primitive (no logical type)."""
    if isinstance(avro_type, str) and avro_type in _PRIMITIVES:
        return avro_type
    if (isinstance(avro_type, dict) and avro_type.get("type") in _PRIMITIVES
            and "logicalType" not in avro_type):
        return str(avro_type["type"])
    return None


def _spark_type(avro_type: object) -> DataType:
    from pyspark.sql import types

    name = _plain(avro_type)
    result: DataType = getattr(types, _PRIMITIVES[name] if name else "StringType")()
    return result


def spark_schema(avro_schema: dict[str, Any]) -> StructType:
    from pyspark.sql.types import StructField, StructType

    fields = []
    for field in avro_schema["fields"]:
        inner, _nullable = _branch(field["type"])
        fields.append(StructField(field["name"], _spark_type(inner), True))
    return StructType(fields)


def _column(avro_type: object, value: object) -> object:
    if value is None:
        return None
    if _plain(avro_type) is not None:
        return value
    from databus.spark_jobs.stream._rows import value_json

    return value_json({"v": value})[5:-1]  # type: ignore[index]


def row_values(avro_schema: dict[str, Any], value: dict[str, Any] | None) -> tuple[Any, ...]:
    fields = avro_schema["fields"]
    if value is None:
        return (None,) * len(fields)
    return tuple(_column(_branch(f["type"])[0], value.get(f["name"])) for f in fields)


def check_evolution(old_avro: dict[str, Any], new_avro: dict[str, Any]) -> None:
    old = {f["name"]: f for f in old_avro["fields"]}
    for field in new_avro["fields"]:
        before = old.get(field["name"])
        if before is None:
            if not (_branch(field["type"])[1] or "default" in field):
                raise ValueError(f"schema change adds column {field['name']!r}, which is "
                                 "neither nullable nor defaulted")
        elif json.dumps(_branch(before["type"])[0]) != json.dumps(_branch(field["type"])[0]):
            raise ValueError(f"schema change alters the type of column {field['name']!r}")
