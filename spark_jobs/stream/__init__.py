"""The ``databus`` source for Spark Structured Streaming (docs/spark.md):
``spark.readStream.format("databus")`` and, for a one-off read of the bootstrap
snapshot, ``spark.read.format("databus")``.

    from databus.spark_jobs.stream import register
    register(spark)
    df = (spark.readStream.format("databus").option("relays", "http://127.0.0.1:11190")
          .option("sources", "shop.orders").option("partitions", "4").load())

Modules, one concern each: ``_options`` (the options, checked), ``_offsets`` (offsets:
one checkpoint per partition), ``_rows`` (events -> rows), ``_relay_info`` (the driver's
questions to relays), ``_partition_reader`` (one task's read through ``DatabusClient``),
``_source`` (the PySpark classes), ``_schema`` (Avro record schemas as Spark
``StructType``, decoded values as rows, and the schema evolution a running query
accepts). PySpark is imported only when a session is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make ``format("databus")`` known to ``spark`` (once per session is enough)."""
    from databus.spark_jobs.stream._source import DatabusDataSource

    spark.dataSource.register(DatabusDataSource)


__all__ = ["register"]
