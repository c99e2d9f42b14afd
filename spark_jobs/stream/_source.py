"""The ``databus`` data source for PySpark 4's Python data source API (driver side).

``DatabusDataSource`` (name ``databus``) gives ``spark.readStream.format("databus")``
(``DatabusStreamReader``) and ``spark.read.format("databus")`` (``DatabusBatchReader``:
a one-off read of the bootstrap snapshot). Options: ``_options``; offsets: ``_offsets``;
rows: ``_rows``; one task's read: ``_partition_reader``.

Micro-batches: ``latestOffset`` asks a relay for its newest window N and moves every
partition to "after window N"; ``partitions`` gives one input partition per mod bucket
that has something to read; each reads its bucket up to and including window N through
the client library. Spark writes the end offset to its checkpoint before the batch runs
and reads it back after a restart, so a restarted query reads each partition again from
exactly where its last committed batch ended.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from databus.checkpoint import Checkpoint
from databus.errors import DatabusError, SchemaError
from databus.spark_jobs.stream import _offsets, _options, _relay_info
from databus.spark_jobs.stream import _schema as _typed
from databus.spark_jobs.stream._arrow_rows import RowBatches
from databus.spark_jobs.stream._partition_reader import PartitionRead, read_partition
from databus.spark_jobs.stream._rows import META_COLUMNS, VALUE_COLUMN, value_column_names

_TYPES = {"bigint": LongType, "string": StringType, "timestamp": TimestampType,
          "boolean": BooleanType, "int": IntegerType}


def _meta_fields() -> list[StructField]:
    return [StructField(n, _TYPES[t](), n not in ("scn", "source", "op", "key",
                                                   "from_snapshot", "partition", "seq"))
            for n, t in META_COLUMNS]


class DatabusPartition(InputPartition):
    def __init__(self, read: PartitionRead) -> None:
        super().__init__(read)
        self.read = read


def _value_fields(avro: dict[str, Any], source: str) -> list[StructField]:
    """The value columns of one source's Avro schema version, as the query has them."""
    typed = _typed.spark_schema(avro).fields
    names = value_column_names([f.name for f in typed], source=source)
    return [StructField(n, f.dataType, f.nullable, f.metadata)
            for n, f in zip(names, typed, strict=True)]


def query_version(versions: Sequence[dict[str, Any]], schema: StructType, source: str
                  ) -> dict[str, Any] | None:
    """The newest of a source's schema ``versions`` whose columns are the query's
    ``schema`` (the row's own columns, then the value's): the version the query was
    planned with, though newer ones came since. None when no version has them."""
    meta = [n for n, _ in META_COLUMNS]
    if [f.name for f in schema.fields[:len(meta)]] != meta:
        return None
    wanted = [(f.name, f.dataType) for f in schema.fields[len(meta):]]
    for version in reversed(versions):
        avro: dict[str, Any] = version
        try:
            fields = _value_fields(avro, source)
        except DatabusError:  # a version whose columns cannot be read (names clash)
            continue
        if [(f.name, f.dataType) for f in fields] == wanted:
            return avro
    return None


class _Planned:
    """What the driver works out once: the options and the single source's schema.

    Spark makes several readers of one query, at different times (the driver's, and
    each micro-batch's read function's): given the query's ``schema``, a reader takes
    the schema version that has those columns, not the newest one, so that every
    reader makes rows of the query's columns whatever changed since it was planned."""

    def __init__(self, raw: dict[str, str], streaming: bool,
                 schema: StructType | None = None) -> None:
        self.opts = _options.parse(raw, streaming=streaming)
        self.avro: dict[str, Any] | None = None
        if len(self.opts.sources) == 1:
            source = self.opts.sources[0]
            versions = _relay_info.schema_versions(self.opts, source,
                                                   self.opts.relay_timeout)
            self.avro = versions[-1]
            if schema is not None:
                found = query_version(versions, schema, source)
                if found is None:
                    raise SchemaError(
                        f"source {source}: the query's columns ({schema.simpleString()[:300]}"
                        f") are those of no schema version of {source} on the relays; the "
                        f"databus source's columns come from the source's schema (give no "
                        f".schema()): {_typed.JSON_MODE_HINT}")
                self.avro = found

    def schema(self) -> StructType:
        fields = _meta_fields()
        if self.avro is None:
            fields.append(StructField(VALUE_COLUMN[0], StringType(), True))
        else:
            fields += _value_fields(self.avro, self.opts.sources[0])
        return StructType(fields)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, DatabusPartition)
        batches = RowBatches(self.schema(), partition.read.partition, self.avro)
        return read_partition(self.opts, partition.read, batches, self.opts.relay_timeout)


class DatabusDataSource(DataSource):
    """``format("databus")``; see the module docstring and docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "databus"

    def _planned(self, streaming: bool, schema: StructType | None = None) -> _Planned:
        return _Planned(dict(self.options), streaming, schema)

    def schema(self) -> StructType:
        _options.parse(dict(self.options), streaming=None)  # a bad option fails here
        batch = "scn" in {k.lower() for k in self.options}
        return self._planned(streaming=not batch).schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DatabusStreamReader(self._planned(streaming=True, schema=schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        return DatabusBatchReader(self._planned(streaming=False, schema=schema))


class DatabusStreamReader(DataSourceStreamReader):
    def __init__(self, planned: _Planned) -> None:
        self.planned = planned
        self.opts = planned.opts
        self._latest: dict[str, Any] | None = None

    def _parse(self, offset: object) -> _offsets.Offset:
        return _offsets.parse(offset, partitions=self.opts.partitions,
                              sources=self.opts.sources)

    def initialOffset(self) -> dict[str, Any]:
        opts = self.opts
        if opts.starting_scn is not None:
            first = _offsets.starting(opts.partitions, opts.sources,
                                      Checkpoint(opts.starting_scn))
        elif opts.starting == "latest":
            newest = _relay_info.newest_scn(opts, opts.relay_timeout)
            first = _offsets.starting(opts.partitions, opts.sources,
                                      Checkpoint(max(newest or 0, 0)))
        else:
            first = _offsets.nothing_read(opts.partitions, opts.sources)
        return first.to_json()

    def latestOffset(self, start: dict[str, Any], limit: object = None) -> dict[str, Any]:
        begin = self._parse(start)
        planned = self.planned
        newest_scn = _relay_info.newest_scn(self.opts, self.opts.relay_timeout)
        if planned.avro is not None:
            # A schema change the query's columns cannot take fails it here, clearly.
            # Asked after the newest window: a fetcher registers a schema version
            # before it writes a window with it, so no window of the batch has a
            # version newer than this one.
            newest = _relay_info.newest_schema(self.opts, self.opts.sources[0],
                                               self.opts.relay_timeout)
            if newest != planned.avro:
                _typed.check_evolution(planned.avro, newest, source=self.opts.sources[0])
        latest = _offsets.advanced_to(begin, newest_scn).to_json()
        self._latest = latest
        return latest

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The relay's newest window as an offset (``latestOffset`` in the query's
        progress), as of the last plan; None before the first."""
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> Sequence[InputPartition]:
        begin, finish = self._parse(start), self._parse(end)
        reads = []
        for i in range(self.opts.partitions):
            since, until = begin.checkpoint(i), finish.checkpoint(i)
            stop = _offsets.position(until)
            if _offsets.position(since) < stop:
                reads.append(DatabusPartition(PartitionRead(
                    i, self.opts.partitions, since.to_json(), stop, self.planned.avro)))
        return reads

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.planned.read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: servers keep no consumer state (the offset is the state)."""


class DatabusBatchReader(DataSourceReader):
    """Each partition reads its bucket of the bootstrap snapshot (and its catch-up) to
    the snapshot's end, or on along the relay to window ``scn`` when that is newer."""

    def __init__(self, planned: _Planned) -> None:
        self.planned = planned
        self.opts = planned.opts

    def partitions(self) -> Sequence[InputPartition]:
        p = self.opts.partitions
        return [DatabusPartition(PartitionRead(i, p, Checkpoint.flexible().to_json(),
                                               self.opts.scn or 0, self.planned.avro))
                for i in range(p)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.planned.read(partition)
