"""PySpark jobs on the PostgreSQL bootstrap store: snapshot compaction, snapshot seeding
from a table dump, and export of a snapshot to Parquet (docs/spark.md).

One module per job (``compact``, ``seed``, ``export``), each with pure DataFrame ->
DataFrame functions (``latest_per_key``, ``encode_mysql_dump``, ``encode_parquet_dump``,
``decode_snapshot``), a runner that does the I/O around them (``compact.compact``,
``seed.seed``, ``export.export``) and a ``main(argv)`` for ``spark-submit``;
``databus spark compact|seed|export`` is the command line. ``apply_changes`` (and
``foreach_batch``, ``read_table``) keep a Parquet table of the latest state per key from
a streaming query's micro-batches (``databus spark stream``). The runners are not
re-exported here, where their names would hide their modules. PySpark is imported
lazily: importing this package does not need it.

``register(spark)`` makes the ``databus`` streaming source (``stream``) known to a
session: ``spark.readStream.format("databus")``.
"""

from typing import TYPE_CHECKING

from databus.spark_jobs._apply import apply_changes, foreach_batch, read_table
from databus.spark_jobs._common import JobRefused, JobSummary, SparkJobError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: "SparkSession") -> None:
    """Register the ``databus`` data source (``databus.spark_jobs.stream``)."""
    from databus.spark_jobs.stream import register as register_stream

    register_stream(spark)


__all__ = ["JobRefused", "JobSummary", "SparkJobError", "apply_changes", "foreach_batch",
           "read_table", "register"]
