"""Snapshot export: a source's snapshot as Parquet with decoded columns, stamped with
the SCN it is consistent at, so an offline job can process it and then tap into the
stream (relay or bootstrap) from exactly that SCN (docs/spark.md, "Export").

- Columns: one per field of the source's newest Avro schema (every event is decoded
  with fastavro, older schema versions resolved to the newest), mapped as
  ``_arrow_avro`` says; plus ``_databus_key`` and ``_databus_key_kind`` (the event key
  exactly, so the export can seed a store again) and ``_databus_row_scn`` (the SCN of
  the row's last change). Live rows only: tombstones are not part of a state.
- The SCN: in every file's Parquet metadata (``databus.scn``, with ``databus.source``
  and ``databus.avro_schema``) and in a ``_databus_scn`` marker file in the output
  directory, written last: its presence means the export is complete.

The snapshot is read inside one exported PostgreSQL snapshot, so it is exactly the
applier's state at the applied SCN even while the applier runs. Files are written by
the tasks themselves with pyarrow (Spark's Parquet writer cannot put our metadata in
the footer) into ``_temporary/<job>/`` and moved into place by the driver once every
task has succeeded; files of failed task attempts are never moved.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from databus.errors import ConfigError, SchemaError
from databus.event import decode_event
from databus.schemas import AvroCodec, Schema
from databus.spark_jobs._arrow_avro import Column, record_columns, to_arrays
from databus.spark_jobs._common import JobRefused, JobSummary, run_spark, timed
from databus.spark_jobs._progress import Progress
from databus.spark_jobs._store import PgStore
from databus.spark_jobs.compact import _read_parts, read_snapshot
from databus.spark_jobs.seed import (
    KEY_COLUMN,
    KEY_KIND_COLUMN,
    META_SCHEMA,
    META_SCN,
    META_SOURCE,
    ROW_SCN_COLUMN,
    SCN_MARKER,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

META_FINGERPRINT = "databus.fingerprint"


@dataclass(frozen=True)
class Decoder:
    """How snapshot rows of one source become Arrow columns (picklable: schemas travel
    as JSON text)."""

    writers: tuple[str, ...]  # every schema version of the source, JSON
    reader: str  # the newest version: what every row is decoded to

    def columns(self) -> list[Column]:
        return record_columns(Schema(self.reader).schema)  # type: ignore[arg-type]

    def arrow_schema(self, metadata: dict[str, str] | None = None) -> pa.Schema:
        import pyarrow as pa

        fields = [f for c in self.columns() for f in c.arrow_fields()]
        fields += [pa.field(KEY_COLUMN, pa.binary(), nullable=False),
                   pa.field(KEY_KIND_COLUMN, pa.int8(), nullable=False),
                   pa.field(ROW_SCN_COLUMN, pa.int64(), nullable=False)]
        return pa.schema(fields, metadata=metadata)

    def batches(self, rows: Iterator[pa.RecordBatch], metadata: dict[str, str] | None = None
                ) -> Iterator[pa.RecordBatch]:
        """Snapshot rows (at least ``event``) -> decoded record batches."""
        import pyarrow as pa

        codec = AvroCodec(schemas=[Schema(s) for s in self.writers])
        reader = Schema(self.reader)
        columns = self.columns()
        schema = self.arrow_schema(metadata)
        for batch in rows:
            records, keys, kinds, scns = [], [], [], []
            for data in batch.column("event").to_pylist():
                event = decode_event(data)
                header = event.header
                records.append(codec.decode(event.value, header.schema_fingerprint, reader))
                keys.append(event.key_bytes)
                kinds.append(int(header.key_kind))
                scns.append(header.scn)
            arrays = to_arrays(records, columns)
            arrays += [pa.array(keys, pa.binary()), pa.array(kinds, pa.int8()),
                       pa.array(scns, pa.int64())]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def decode_snapshot(snapshot: DataFrame, decoder: Decoder) -> DataFrame:
    """Snapshot rows -> decoded rows (pure DataFrame -> DataFrame, for Spark jobs that
    want the columns without going through files). Tombstones are dropped."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    live = snapshot.where(F.col("op") == 1).select("event")
    return live.mapInArrow(decoder.batches, from_arrow_schema(decoder.arrow_schema()))


def _write_parts(rows: Iterator[pa.RecordBatch], *, decoder: Decoder, directory: str,
                 metadata: dict[str, str]) -> Iterator[pa.RecordBatch]:
    """Task side: decode and write this partition's rows to one Parquet file; yield its
    name and row count (nothing for an empty partition)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs

    filesystem, base = fs.FileSystem.from_uri(directory)
    writer = None
    name = f"part-{uuid.uuid4().hex}.parquet"
    count = 0
    try:
        for batch in decoder.batches(rows, metadata):
            if batch.num_rows == 0:
                continue
            if writer is None:
                filesystem.create_dir(base, recursive=True)
                writer = pq.ParquetWriter(f"{base}/{name}", batch.schema,
                                          filesystem=filesystem, compression="zstd")
            writer.write_batch(batch)
            count += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    if count:
        yield pa.RecordBatch.from_arrays([pa.array([name]), pa.array([count], pa.int64())],
                                         names=["file", "rows"])


@dataclass
class PreparedExport:
    store_url: str
    source: str
    source_id: int
    out: str
    overwrite: bool
    decoder: Decoder
    notes: list[str] = field(default_factory=list)


def _uri(path: str) -> str:
    return path if "://" in path else str(Path(path).resolve())


def prepare_export(store_url: str, *, source: str, out: str, overwrite: bool = False
                   ) -> PreparedExport:
    """Check the store, the source, its schemas and the output before Spark starts."""
    from pyarrow import fs

    store = PgStore.for_url(store_url)
    with store.reading() as view:
        if source not in view.state.sources:
            raise JobRefused(f"the store has no source {source!r} "
                             f"(it has: {', '.join(view.state.sources) or 'none'})")
        if view.state.applied_scn is None:
            raise JobRefused("the store's snapshot has not been built yet (no applied SCN)")
        versions = view.schema_versions(source)
    if not versions:
        raise JobRefused(f"no Avro schema is registered for {source!r}: nothing to decode "
                         "its values with")
    decoder = Decoder(tuple(versions), versions[-1])
    try:
        decoder.columns()
    except SchemaError as exc:
        raise JobRefused(f"the schema of {source!r} cannot be exported: {exc}") from None
    filesystem, base = fs.FileSystem.from_uri(_uri(out))
    info = filesystem.get_file_info(base)
    if info.type == fs.FileType.File:
        raise ConfigError(f"--out {out} is a file, not a directory")
    if info.type == fs.FileType.Directory and not overwrite and filesystem.get_file_info(
            fs.FileSelector(base)):
        raise ConfigError(f"--out {out} exists and is not empty (use --overwrite)")
    return PreparedExport(store_url, source, view.state.sources[source], out, overwrite,
                          decoder)


def export(
    spark: SparkSession,
    prepared: PreparedExport,
    *,
    partitions: int | None = None,
    progress: Progress | None = None,
) -> JobSummary:
    """Export the source's snapshot; the summary's SCN is the one it is consistent at."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs

    progress = progress or Progress()
    store = PgStore.for_url(prepared.store_url)
    summary = JobSummary("export")
    filesystem, base = fs.FileSystem.from_uri(_uri(prepared.out))
    job_dir = f"{base}/_temporary/{uuid.uuid4().hex}"
    with timed(summary):
        with store.reading() as view:
            scn = view.state.applied_scn
            if scn is None:
                raise JobRefused("the store's snapshot has not been built yet")
            metadata = {META_SCN: str(scn), META_SOURCE: prepared.source,
                        META_SCHEMA: prepared.decoder.reader,
                        META_FINGERPRINT: f"{Schema(prepared.decoder.reader).fingerprint:016x}"}
            rows = view.snapshot_rows(prepared.source_id)
            parts = _read_parts(rows, spark.sparkContext.defaultParallelism, partitions)
            snapshot = read_snapshot(spark, view, prepared.source_id, parts=parts)
            live = snapshot.where("op = 1").select("event")
            written = live.mapInArrow(
                partial(_write_parts, decoder=prepared.decoder,
                        directory=_directory_uri(prepared.out, job_dir), metadata=metadata),
                "file string, rows long")
            with progress.phase(f"{prepared.source}: decoding and writing Parquet"):
                files: list[Any] = run_spark("exporting", written.collect)
        with progress.phase("committing the export"):
            if prepared.overwrite:
                _clear(filesystem, base)
            filesystem.create_dir(base, recursive=True)
            for row in files:
                filesystem.move(f"{job_dir}/{row['file']}", f"{base}/{row['file']}")
            if not files:  # an empty snapshot still has its columns
                table = pa.Table.from_batches([], prepared.decoder.arrow_schema(metadata))
                with filesystem.open_output_stream(f"{base}/part-empty.parquet") as handle:
                    pq.write_table(table, handle)
            filesystem.delete_dir(f"{base}/_temporary")
            with filesystem.open_output_stream(f"{base}/{SCN_MARKER}") as handle:
                handle.write(f"{scn}\n".encode())
    summary.scn = scn
    summary.rows_in = rows
    summary.rows_out = sum(int(r["rows"]) for r in files)
    summary.sources[prepared.source] = {"rows_in": rows, "rows_out": summary.rows_out,
                                        "files": len(files)}
    return summary


def _directory_uri(out: str, job_dir: str) -> str:
    """The job directory as a URI the tasks can open (a local path becomes file://)."""
    return job_dir if "://" in out else "file://" + job_dir


def _clear(filesystem: Any, base: str) -> None:
    from pyarrow import fs

    for info in filesystem.get_file_info(fs.FileSelector(base)):
        if info.base_name == "_temporary":
            continue
        if info.type == fs.FileType.Directory:
            filesystem.delete_dir(info.path)
        else:
            filesystem.delete_file(info.path)


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit export.py --store URL --source db.t --out /path``."""
    from databus.spark_jobs._cli import standalone

    return standalone("export", argv)


if __name__ == "__main__":
    sys.exit(main())
