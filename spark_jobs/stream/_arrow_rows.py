"""Rows of the ``databus`` source as Arrow record batches (pure: decoded events in,
``pyarrow.RecordBatch`` out): the fast twin of ``_rows.window_rows``.

A partition's ``read`` yields these batches to Spark instead of tuples. Spark's Python
data source converts tuples to Arrow value by value in Python (a converter call per
value, ~25 µs a row here); these are built a column at a time, so Python pays one list
item per value and Arrow's C code converts the lists:

    events of several windows (kept as they came, with each one's seq)
        |  one pass per column
        v
    scn int64 | source string | op string | key string | timestamp timestamp[us, UTC]
    | from_snapshot bool | partition int32 | seq int32 | value string   (several sources)
                                                      | typed columns  (one source)

The typed columns are the Parquet export's (``_arrow_avro.to_arrays``), cast where
Spark's Arrow type of the column differs. ``RowBatches.schema`` is the Arrow schema
Spark derives from the source's ``StructType`` (``to_arrow_schema``, UTC), which a batch
must equal: Spark refuses any other. ``tests/unit/test_spark_stream_arrow_rows.py``
checks that a batch equals what Spark makes of ``window_rows``' tuples, for every
fetcher type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from databus.client._events import DataEvent
from databus.event import Op
from databus.spark_jobs._arrow_avro import Column, record_columns, to_arrays
from databus.spark_jobs.stream._rows import key_json, value_json

__all__ = ["BATCH_ROWS", "RowBatches"]

BATCH_ROWS = 8192
"""Rows per batch handed to Spark (its own default for Arrow batches is 10,000)."""

_NO_VALUE: dict[str, Any] = {}


class RowBatches:
    """Collects the events of whole windows and makes them one ``RecordBatch``.

    ``schema`` is the source's Spark ``StructType``; ``avro`` its one source's Avro
    record schema (typed columns), or None for the ``value`` JSON column."""

    def __init__(self, schema: Any, partition: int, avro: dict[str, Any] | None) -> None:
        self.schema: pa.Schema = to_arrow_schema(schema, timezone="UTC")
        self.partition = partition
        self.columns: list[Column] | None = record_columns(avro) if avro is not None else None
        self._events: list[DataEvent] = []
        self._seqs: list[int] = []

    def __len__(self) -> int:
        return len(self._events)

    def add(self, events: Sequence[DataEvent]) -> None:
        """One window's events of this partition (``seq`` is the position among them)."""
        self._events.extend(events)
        self._seqs.extend(range(len(events)))

    def take(self) -> pa.RecordBatch | None:
        """The rows added since the last ``take`` as one batch (None if there are none)."""
        events, seqs = self._events, self._seqs
        if not events:
            return None
        self._events, self._seqs = [], []
        n = len(events)
        delete = Op.DELETE
        arrays: list[pa.Array] = [
            pa.array([e.scn for e in events], pa.int64()),
            pa.array([e.source for e in events], pa.string()),
            pa.array(["delete" if e.op == delete else "upsert" for e in events], pa.string()),
            pa.array([key_json(e.key) for e in events], pa.string()),
            pa.array([e.timestamp_ns // 1000 if e.timestamp_ns > 0 else None
                      for e in events], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array([e.from_bootstrap or e.from_dump for e in events], pa.bool_()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(seqs, pa.int32()),
        ]
        if self.columns is None:
            arrays.append(pa.array([value_json(e.value) for e in events], pa.string()))
        else:
            values = [e.value for e in events]
            typed = to_arrays([_NO_VALUE if v is None else v for v in values], self.columns)
            arrays.extend(typed)
        fields = self.schema
        arrays = [a if a.type == fields.field(i).type else a.cast(fields.field(i).type)
                  for i, a in enumerate(arrays)]
        return pa.RecordBatch.from_arrays(arrays, schema=fields)
