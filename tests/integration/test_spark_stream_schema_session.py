"""Rows from ``row_values`` through a real SparkSession: every fetcher type encoded with
fastavro, decoded, converted and given to ``createDataFrame`` with ``spark_schema``'s
StructType, then collected back unchanged (and written to Parquet and read back)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from databus.fetchers.mysql._types import Kind
from databus.spark_jobs.stream._schema import row_values, spark_schema
from tests.unit.test_spark_stream_schema import FETCHER_TYPES, mysql, record, round_trip

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def instant(value: Any, expected: Any) -> Any:
    """PySpark collects a ``timestamp`` as a naive datetime in the process's zone: where
    an aware datetime is expected, both sides as POSIX seconds."""
    if isinstance(expected, dt.datetime) and expected.tzinfo is not None:
        return value.timestamp()
    return value


def test_every_fetcher_type_round_trips_through_spark(spark: SparkSession,
                                                     tmp_path: Path) -> None:
    fields: list[tuple[str, Any]] = [(f"c{i}", avro) for i, (_, avro, *_rest)
                                     in enumerate(FETCHER_TYPES)]
    fields.append(("d", mysql(Kind.DATE, nullable=True)))
    schema = record(*fields)
    full = {f"c{i}": value for i, (_, _, _, value, _) in enumerate(FETCHER_TYPES)}
    expected = tuple(row[4] for row in FETCHER_TYPES)
    values = [
        {**full, "d": ("string", "0000-00-00")},
        {**full, "d": None},
    ]
    rows = [row_values(schema, round_trip(schema, v)) for v in values]
    rows.append(row_values(schema, None))  # a delete without a row
    df = spark.createDataFrame(rows, spark_schema(schema), verifySchema=True)
    out = tmp_path / "t"
    df.write.parquet(str(out))
    for frame in (df, spark.read.schema(spark_schema(schema)).parquet(str(out))):
        got = sorted((tuple(r) for r in frame.collect()), key=lambda r: r[0] is None)
        assert len(got) == 3
        for row, text in zip(got[:2], ("0000-00-00", None), strict=True):
            values_back = tuple(tuple(v) if hasattr(v, "__fields__") else v for v in row)
            assert tuple(map(instant, values_back[:len(expected)], expected)) == \
                tuple(map(instant, expected, expected))
            assert values_back[len(expected):] == (None, text)
        assert got[2] == (None,) * len(rows[0])
