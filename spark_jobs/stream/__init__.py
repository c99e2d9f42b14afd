"""The Spark Structured Streaming source ``databus`` (docs/spark.md).

``_schema``: Avro record schemas as Spark ``StructType``, decoded values as rows, and the
schema evolution a running query accepts.
"""
