"""The spark fixture: one working local SparkSession with the JDBC drivers on its classpath."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.fixtures._spark import JDBC_DRIVERS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_count_and_group_by(spark: SparkSession) -> None:
    # Imported here, not at module level: without pyspark, collection must still succeed so
    # that the fixture can skip (or fail under CI=true) with a clear message.
    from pyspark.sql import functions as F

    assert spark.range(1000).count() == 1000

    df = spark.createDataFrame([("a", 1), ("b", 2), ("a", 3), ("c", 4)], ["key", "value"])
    grouped = df.groupBy("key").agg(F.sum("value").alias("total"), F.count("*").alias("n"))
    totals = {row["key"]: (row["total"], row["n"]) for row in grouped.collect()}
    assert totals == {"a": (4, 2), "b": (2, 1), "c": (4, 1)}
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


def test_jdbc_drivers_are_loadable(spark: SparkSession) -> None:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    for driver in JDBC_DRIVERS:
        assert jvm.java.lang.Class.forName(driver, True, loader).getName() == driver
