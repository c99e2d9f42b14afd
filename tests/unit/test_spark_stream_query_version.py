"""Which schema version a reader of a running query decodes with
(``databus.spark_jobs.stream._source.query_version``): Spark makes a query's readers at
different times (the driver's, each micro-batch's read function's), and each must make
rows of the query's columns, the newest version having those, whatever came since."""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import LongType, StringType, StructField, StructType

from databus.spark_jobs.stream._source import _meta_fields, _value_fields, query_version

SOURCE = "shop.items"


def record(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "items", "namespace": "shop",
            "fields": [{"name": n, "type": t, **({"default": None} if isinstance(t, list)
                                                 else {})} for n, t in fields]}


V1 = record(("id", "long"), ("sku", ["null", "string"]))
V2 = record(("id", "long"), ("sku", ["null", "string"]), ("note", ["null", "string"]))
V3 = record(("id", ["null", "long"]), ("sku", ["null", "string"]),
            ("note", ["null", "string"]))  # id made nullable: the same Spark columns
V4 = record(("id", "long"), ("note", ["null", "string"]))  # sku removed


def query_schema(avro: dict[str, Any]) -> StructType:
    return StructType(_meta_fields() + _value_fields(avro, SOURCE))


def test_a_reader_takes_the_version_with_the_querys_columns_not_the_newest() -> None:
    versions = [V1, V2, V4]
    assert query_version(versions, query_schema(V1), SOURCE) is V1
    assert query_version(versions, query_schema(V2), SOURCE) is V2
    assert query_version(versions, query_schema(V4), SOURCE) is V4


def test_of_versions_with_the_same_columns_the_newest() -> None:
    assert query_version([V1, V2, V3], query_schema(V2), SOURCE) is V3


def test_columns_of_no_version_are_none() -> None:
    assert query_version([V2, V4], query_schema(V1), SOURCE) is None
    # The value columns alone, without the row's own: not a schema of this source.
    bare = StructType([StructField("id", LongType()), StructField("sku", StringType())])
    assert query_version([V1], bare, SOURCE) is None
