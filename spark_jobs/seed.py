"""Snapshot seeding: a source's snapshot built from a dump of its table, stamped with the
SCN the dump is consistent at, so that the bootstrap log only has to hold the changes
after it (docs/spark.md, "Seeding").

Dumps come from MariaDB/MySQL over JDBC (read so that every value encodes exactly as
the binlog fetcher encodes it: same Avro schema, same bytes, same keys) or from Parquet
(an export of this package, with its Avro schema and keys in it, encoded with fastavro;
or a plain table dump whose columns are typed like the MariaDB table's). Rows become
events inside Spark (``mapInArrow``), flagged as coming from a snapshot, with the dump's
SCN; then they go through the compaction path (merged with the log after the SCN,
staged, swapped in with one transaction) so the store's applied SCN and log floor move
with the snapshot. A dump without an SCN stamp is refused.

``encode_mysql_dump`` and ``encode_parquet_dump`` are the pure DataFrame -> DataFrame
parts; ``prepare_seed`` checks everything that can be checked before Spark starts;
``seed`` runs the job; ``main`` is the command line.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from databus.bootstrap import open_storage, stored_event
from databus.errors import ConfigError, DatabusError
from databus.event import KeyKind, Op, decode_key, encode_event
from databus.fetchers.mysql import (
    EPOCH_ORDINAL,
    ColumnSpec,
    DumpColumn,
    Kind,
    TableShape,
    encode_row,
    partition_column,
    row_key_function,
    row_writers,
    select_sql,
)
from databus.schemas import Schema
from databus.spark_jobs._arrow_avro import Column, from_row, record_columns
from databus.spark_jobs._common import (
    MARIADB_JAR,
    POSTGRES_JAR,
    JobRefused,
    JobSummary,
    SparkJobError,
    jdbc_jar,
    run_spark,
    timed,
)
from databus.spark_jobs._jdbc import StoreLocation, mysql_jdbc
from databus.spark_jobs._plan import plan_seed
from databus.spark_jobs._progress import Progress
from databus.spark_jobs._store import PgStore
from databus.spark_jobs.compact import FETCH_ROWS, build_staging, swap_in

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MICROSECOND = datetime.timedelta(microseconds=1)
SNAPSHOT_SCHEMA = "key binary, scn long, op short, pkey long, key_hash long, event binary"
# Parquet metadata keys (written by the export, read by the seed).
META_SCN = "databus.scn"
META_SOURCE = "databus.source"
META_SCHEMA = "databus.avro_schema"
META_KEY = "databus.key"
META_TIMESTAMP = "databus.timestamp_ns"
SCN_MARKER = "_databus_scn"
KEY_COLUMN = "_databus_key"
KEY_KIND_COLUMN = "_databus_key_kind"
ROW_SCN_COLUMN = "_databus_row_scn"


@dataclass(frozen=True)
class EventStamp:
    """What every seeded event carries besides its row."""

    source_id: int
    scn: int
    timestamp_ns: int
    partition_id: int
    fingerprint: int
    key_hash: bool


def _snapshot_batch(keys: list[Any], values: list[bytes], stamp: EventStamp) -> pa.RecordBatch:
    """Snapshot rows (key, scn, op, pkey, key_hash, event) of upsert events."""
    import pyarrow as pa

    out_key, out_pkey, out_hash, out_event = [], [], [], []
    for key, value in zip(keys, values, strict=True):
        event = encode_event(scn=stamp.scn, source_id=stamp.source_id, op=Op.UPSERT, key=key,
                             value=value, timestamp_ns=stamp.timestamp_ns,
                             partition_id=stamp.partition_id,
                             schema_fingerprint=stamp.fingerprint, from_snapshot=True)
        row = stored_event("", event, key_hash=stamp.key_hash)
        out_key.append(row.key)
        out_pkey.append(row.pkey)
        out_hash.append(row.key_hash)
        out_event.append(event)
    n = len(out_key)
    return pa.RecordBatch.from_arrays(
        [pa.array(out_key, pa.binary()), pa.array([stamp.scn] * n, pa.int64()),
         pa.array([int(Op.UPSERT)] * n, pa.int16()), pa.array(out_pkey, pa.int64()),
         pa.array(out_hash, pa.int64()), pa.array(out_event, pa.binary())],
        names=["key", "scn", "op", "pkey", "key_hash", "event"])


# -- MariaDB / MySQL ---------------------------------------------------------------------


@dataclass(frozen=True)
class MysqlDump:
    """A table read over JDBC, column by column as ``_mysql_dump`` says."""

    shape: TableShape
    columns: tuple[DumpColumn, ...]
    jdbc_url: str
    properties: dict[str, str] = field(repr=False)
    partition: tuple[str, int, int] | None  # (column, min, max) for range reads
    rows_estimate: int
    config: Any = field(default=None, repr=False)  # the source's BinlogSourceConfig

    @property
    def schema(self) -> Schema:
        return self.shape.avro_schema()


def _encode_shaped_batches(batches: Iterator[pa.RecordBatch], columns: Sequence[int | str],
                           *, shape: TableShape, converters: Sequence[Callable[[Any], Any]],
                           stamp: EventStamp, counter: Any) -> Iterator[pa.RecordBatch]:
    """Arrow batches whose ``columns`` (by position or name) follow ``shape`` -> snapshot
    rows, encoded with the binlog fetcher's own writers and key function."""
    writers = row_writers(shape.columns)
    key_of = row_key_function(shape.columns, shape.primary_key)
    for batch in batches:
        values_by_column = [batch.column(c).to_pylist() for c in columns]
        keys, values = [], []
        for raw in zip(*values_by_column, strict=True):
            native = [None if v is None else convert(v)
                      for convert, v in zip(converters, raw, strict=True)]
            value = encode_row(writers, native)
            keys.append(key_of(native, value))
            values.append(value)
        if counter is not None:
            counter.add(len(keys))
        yield _snapshot_batch(keys, values, stamp)


def _encode_mysql_batches(batches: Iterator[pa.RecordBatch], *, shape: TableShape,
                          converters: Sequence[Callable[[Any], Any]], stamp: EventStamp,
                          counter: Any) -> Iterator[pa.RecordBatch]:
    yield from _encode_shaped_batches(batches, range(len(converters)), shape=shape,
                                      converters=converters, stamp=stamp, counter=counter)


def encode_mysql_dump(dump_frame: DataFrame, dump: MysqlDump, stamp: EventStamp, *,
                      counter: Any = None) -> DataFrame:
    """Rows read with ``read_mysql_dump`` -> snapshot rows (one upsert event each)."""
    from pyspark.sql import functions as F

    frame = dump_frame.select(*[F.col(f"c{i}") for i in range(len(dump.columns))])
    return frame.mapInArrow(
        partial(_encode_mysql_batches, shape=dump.shape,
                converters=[c.convert for c in dump.columns], stamp=stamp, counter=counter),
        SNAPSHOT_SCHEMA)


def read_mysql_dump(spark: SparkSession, dump: MysqlDump, *, parts: int) -> DataFrame:
    column = dump.partition[0] if dump.partition else None
    table = select_sql(dump.shape, dump.columns, column)
    props = {**dump.properties, "fetchsize": FETCH_ROWS}
    if dump.partition is None or parts <= 1 or dump.partition[1] >= dump.partition[2]:
        return spark.read.jdbc(dump.jdbc_url, table, properties=props)
    _, low, high = dump.partition
    return spark.read.jdbc(dump.jdbc_url, table, column="__part", lowerBound=low,
                           upperBound=high + 1, numPartitions=parts, properties=props)


def _mysql_table(config: Any, table: str | None) -> tuple[str, str]:
    if table:
        database, sep, name = table.partition(".")
        if not sep or not database or not name:
            raise ConfigError(f"--table wants DB.TABLE, got {table!r}")
        return database, name
    chosen: list[tuple[str, str]] = sorted(config.selector.tables)
    if len(chosen) == 1 and not config.selector.databases:
        return chosen[0]
    raise ConfigError("name the table to dump: --table DB.TABLE (or ?tables=db.table in the "
                      "mysql:// URL)")


def _mysql_shape(conn: Any, config: Any, database: str, table: str
                 ) -> tuple[TableShape, tuple[DumpColumn, ...], int]:
    """The fetcher's layout of the table (its own information_schema mapping), the dump
    columns, and the estimated row count."""
    from databus.fetchers.mysql import UnmappableTableError, source_cursor, table_layout

    try:
        with source_cursor(conn, config, "reading information_schema") as cur:
            layout = table_layout(cur, database, table)
    except UnmappableTableError as exc:
        raise SparkJobError(str(exc)) from None
    if layout is None:
        raise ConfigError(f"table {database}.{table} not found at {config.address}")
    return layout.shape, layout.columns, layout.rows_estimate


# -- Parquet ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParquetDump:
    """Parquet files and how to turn their rows into Avro values and keys.

    ``mode`` "avro": an Avro schema is known (the export's metadata, or --schema); values
    are written with fastavro. ``mode`` "table": columns are typed like a MariaDB table's
    and the fetcher's schema, writers and keys are used, as for a JDBC dump."""

    path: str
    mode: Literal["avro", "table"]
    schema: Schema
    key_columns: tuple[str, ...]  # empty: keys come from _databus_key(_kind)
    avro_columns: tuple[Column, ...] = ()
    shape: TableShape | None = None


def _avro_batches(batches: Iterator[pa.RecordBatch], *, dump: ParquetDump,
                  stamp: EventStamp, counter: Any) -> Iterator[pa.RecordBatch]:
    from io import BytesIO

    from fastavro import schemaless_writer

    parsed = dump.schema.parsed
    columns = list(dump.avro_columns)
    for batch in batches:
        rows = batch.to_pylist()
        keys, values = [], []
        for row in rows:
            buf = BytesIO()
            schemaless_writer(buf, parsed, from_row(row, columns))
            values.append(buf.getvalue())
            keys.append(_row_key(row, dump.key_columns))
        if counter is not None:
            counter.add(len(keys))
        yield _snapshot_batch(keys, values, stamp)


def _key_part(value: Any, composite: bool) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | str) or (isinstance(value, bytes) and not composite):
        return value
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _row_key(row: dict[str, Any], key_columns: Sequence[str]) -> Any:
    if not key_columns:
        return decode_key(KeyKind(row[KEY_KIND_COLUMN]), row[KEY_COLUMN])
    if len(key_columns) == 1:
        return _key_part(row[key_columns[0]], False)
    return tuple(_key_part(row[c], True) for c in key_columns)


def _native(spec: ColumnSpec) -> Callable[[Any], Any]:
    """A Python value from an Arrow column -> the fetcher's Avro-native value."""
    kind = spec.kind
    if kind is Kind.DATE:
        return lambda v: v if isinstance(v, str) else v.toordinal() - EPOCH_ORDINAL
    if kind in (Kind.DATETIME, Kind.TIMESTAMP):
        def micros(v: Any) -> Any:
            if isinstance(v, str | int):
                return v
            if v.tzinfo is not None:
                return (v - _EPOCH_UTC) // _MICROSECOND
            days = v.toordinal() - EPOCH_ORDINAL
            return (days * 86_400 + v.hour * 3600 + v.minute * 60 + v.second) * 1_000_000 \
                + v.microsecond

        return micros
    if kind is Kind.DECIMAL:
        scale = spec.scale
        return lambda v: int(Decimal(v).scaleb(scale))
    if kind in (Kind.UINT64, Kind.INT, Kind.LONG, Kind.YEAR, Kind.TIME):
        return int
    if kind in (Kind.FLOAT, Kind.DOUBLE):
        return float
    if kind is Kind.BOOL:
        return bool
    if kind is Kind.SET:
        return list
    return lambda v: v


def _table_batches(batches: Iterator[pa.RecordBatch], *, dump: ParquetDump,
                   stamp: EventStamp, counter: Any) -> Iterator[pa.RecordBatch]:
    assert dump.shape is not None
    shape = dump.shape
    yield from _encode_shaped_batches(
        batches, [c.name for c in shape.columns], shape=shape,
        converters=[_native(c) for c in shape.columns], stamp=stamp, counter=counter)


def encode_parquet_dump(frame: DataFrame, dump: ParquetDump, stamp: EventStamp, *,
                        counter: Any = None) -> DataFrame:
    """Rows of a Parquet dump -> snapshot rows (one upsert event each)."""
    encode = _avro_batches if dump.mode == "avro" else _table_batches
    return frame.mapInArrow(partial(encode, dump=dump, stamp=stamp, counter=counter),
                            SNAPSHOT_SCHEMA)


def _arrow_kind(field: pa.Field) -> ColumnSpec:
    import pyarrow as pa
    import pyarrow.types as t

    typ = field.type
    spec = partial(ColumnSpec, name=field.name, nullable=field.nullable)
    if t.is_int8(typ) or t.is_int16(typ) or t.is_int32(typ) or t.is_uint8(typ) \
            or t.is_uint16(typ):
        return spec(kind=Kind.INT)
    if t.is_uint32(typ) or t.is_int64(typ):
        return spec(kind=Kind.LONG)
    if t.is_uint64(typ):
        return spec(kind=Kind.UINT64)
    if t.is_float16(typ) or t.is_float32(typ):
        return spec(kind=Kind.FLOAT)
    if t.is_float64(typ):
        return spec(kind=Kind.DOUBLE)
    if t.is_boolean(typ):
        return spec(kind=Kind.BOOL)
    if t.is_decimal(typ):
        return spec(kind=Kind.DECIMAL, precision=typ.precision, scale=typ.scale)
    if t.is_date(typ):
        return spec(kind=Kind.DATE)
    if t.is_timestamp(typ):
        return spec(kind=Kind.TIMESTAMP if typ.tz else Kind.DATETIME, precision=6)
    if t.is_string(typ) or t.is_large_string(typ):
        return spec(kind=Kind.TEXT)
    if t.is_binary(typ) or t.is_large_binary(typ) or t.is_fixed_size_binary(typ):
        return spec(kind=Kind.BYTES)
    if (t.is_list(typ) or t.is_large_list(typ)) and typ.value_type == pa.string():
        return spec(kind=Kind.SET)
    raise JobRefused(f"Parquet column {field.name!r} has type {typ}, which has no MariaDB "
                     "counterpart; give the Avro schema with --schema")


def _parquet_files(path: str) -> tuple[Any, list[str], str]:
    """(filesystem, data files, directory) of a Parquet file or directory."""
    from pyarrow import fs

    filesystem, root = fs.FileSystem.from_uri(path if "://" in path
                                              else str(Path(path).resolve()))
    info = filesystem.get_file_info(root)
    if info.type == fs.FileType.NotFound:
        raise ConfigError(f"no Parquet dump at {path}")
    if info.type == fs.FileType.File:
        return filesystem, [root], root.rsplit("/", 1)[0]
    selector = fs.FileSelector(root, recursive=True)
    files = sorted(i.path for i in filesystem.get_file_info(selector)
                   if i.type == fs.FileType.File and i.path.endswith(".parquet")
                   and not any(p.startswith(("_", ".")) for p in
                               i.path[len(root):].split("/") if p))
    if not files:
        raise ConfigError(f"no .parquet files under {path}")
    return filesystem, files, root


def read_parquet_stamp(path: str, scn: int | None) -> tuple[int, dict[str, str], pa.Schema]:
    """The dump's SCN (its metadata, its ``_databus_scn`` marker, or ``scn``), its
    databus metadata and its Arrow schema. Refuses a dump without an SCN and files that
    disagree on it."""
    import pyarrow.parquet as pq
    from pyarrow import fs

    filesystem, files, root = _parquet_files(path)
    metas: list[dict[str, str]] = []
    schema = None
    for name in files:
        with filesystem.open_input_file(name) as handle:
            file_schema = pq.read_schema(handle)
        schema = schema or file_schema
        raw = file_schema.metadata or {}
        metas.append({k.decode(): v.decode() for k, v in raw.items()
                      if k.decode().startswith("databus.")})
    assert schema is not None
    marker = None
    marker_path = f"{root}/{SCN_MARKER}"
    if filesystem.get_file_info(marker_path).type == fs.FileType.File:
        with filesystem.open_input_stream(marker_path) as handle:
            marker = handle.read().decode().strip()
    stamps = {m[META_SCN] for m in metas if META_SCN in m} | ({marker} if marker else set())
    if len(stamps) > 1:
        raise JobRefused(f"the files of the dump at {path} carry different SCNs "
                         f"({', '.join(sorted(stamps))}): not one consistent dump")
    if stamps and marker is None and any(META_SCN not in m for m in metas):
        raise JobRefused(f"some files of the dump at {path} carry no SCN: not one dump")
    stamped = int(stamps.pop()) if stamps else None
    if stamped is None and scn is None:
        raise JobRefused(
            f"the dump at {path} carries no SCN stamp (Parquet metadata {META_SCN!r} or a "
            f"{SCN_MARKER} file) and no --scn was given: without the SCN it was taken at, "
            "the log cannot continue it exactly"
        )
    if stamped is not None and scn is not None and stamped != scn:
        raise JobRefused(f"--scn {scn} contradicts the dump's own SCN {stamped}")
    meta = metas[0] if metas else {}
    final = stamped if stamped is not None else scn
    assert final is not None
    return final, meta, schema


def _parquet_dump(path: str, meta: dict[str, str], arrow: pa.Schema, source: str,
                  key: Sequence[str] | None, schema_file: str | None) -> ParquetDump:
    names = set(arrow.names)
    key_columns: tuple[str, ...]
    if key:
        key_columns = tuple(k.strip() for part in key for k in part.split(",") if k.strip())
    elif META_KEY in meta:
        key_columns = tuple(json.loads(meta[META_KEY]))
    elif {KEY_COLUMN, KEY_KIND_COLUMN} <= names:
        key_columns = ()
    else:
        raise JobRefused(f"the dump at {path} does not say which columns are the key: "
                         "give --key COLUMN (repeat it for a composite key)")
    missing = [k for k in key_columns if k not in names]
    if missing:
        raise JobRefused(f"key column(s) {', '.join(missing)} not in the dump at {path}")
    text = Path(schema_file).read_text() if schema_file else meta.get(META_SCHEMA)
    if text is not None:
        schema = Schema(text)
        columns = tuple(record_columns(schema.schema))  # type: ignore[arg-type]
        absent = sorted(c.name for c in columns if c.name not in names and not c.nullable)
        if absent:
            raise JobRefused(f"the dump at {path} lacks the column(s) {', '.join(absent)} "
                             "of its Avro schema")
        return ParquetDump(path, "avro", schema, key_columns, columns)
    database, sep, table = source.partition(".")
    if not sep:
        raise ConfigError(f"source names are database.table, got {source!r}")
    data = [f for f in arrow if not f.name.startswith("_databus_")]
    specs = tuple(_arrow_kind(f) for f in data)
    index = {c.name: i for i, c in enumerate(specs)}
    if not key_columns:
        raise JobRefused("a dump without an Avro schema needs --key (the primary key "
                         "columns), so rows are keyed as the binlog fetcher keys them")
    shape = TableShape(database, table, specs, tuple(index[k] for k in key_columns))
    return ParquetDump(path, "table", shape.avro_schema(), key_columns, shape=shape)


# -- preparing and running ------------------------------------------------------------


@dataclass
class PreparedSeed:
    """Everything checked and decided before Spark starts; ``close`` releases the source
    table lock (``--lock``) if the job did not already."""

    store_url: str
    source: str
    scn: int
    timestamp_ns: int
    schema: Schema
    jars: list[str]
    mysql: MysqlDump | None = None
    parquet: ParquetDump | None = None
    lock: Any = None  # --lock: the pymysql connection that takes LOCK TABLES ... READ
    stamp_pending: bool = False  # --lock: ``scn`` is provisional until ``take_stamp``
    notes: list[str] = field(default_factory=list)

    def take_stamp(self) -> None:
        """``--lock``: lock the table for reading and stamp the dump with the binlog
        position. Done by ``seed`` right before the table is read, not when preparing,
        so that writers do not also wait for Spark to start."""
        if not self.stamp_pending:
            return
        from databus.fetchers.mysql import current_position, source_cursor

        assert self.mysql is not None and self.lock is not None
        shape, config = self.mysql.shape, self.mysql.config
        with source_cursor(self.lock, config, "locking the table") as cur:
            cur.execute(f"LOCK TABLES `{shape.database}`.`{shape.table}` READ")
        self.scn = current_position(self.lock, config).scn
        self.timestamp_ns = time.time_ns()
        self.stamp_pending = False

    def release(self) -> None:
        lock, self.lock = self.lock, None
        if lock is not None:
            try:
                with lock.cursor() as cur:
                    cur.execute("UNLOCK TABLES")
            finally:
                lock.close()

    close = release


def prepare_seed(
    store_url: str,
    *,
    source: str | None = None,
    from_mysql: str | None = None,
    table: str | None = None,
    from_parquet: str | None = None,
    scn: int | None = None,
    lock: bool = False,
    key: Sequence[str] | None = None,
    schema_file: str | None = None,
) -> PreparedSeed:
    """Check the dump and the store, register the source and its schema, and check the
    plan; nothing here needs Spark. With ``lock`` the stamp is provisional (the current
    binlog position) until ``seed`` locks the table."""
    location = StoreLocation.parse(store_url)
    if (from_mysql is None) == (from_parquet is None):
        raise ConfigError("seed from exactly one dump: --from-mysql URL or --from-parquet PATH")
    prepared: PreparedSeed
    if from_mysql is not None:
        prepared = _prepare_mysql(store_url, from_mysql, table, source, scn, lock)
    else:
        assert from_parquet is not None
        if lock:
            raise ConfigError("--lock only applies to --from-mysql")
        stamp, meta, arrow = read_parquet_stamp(from_parquet, scn)
        name = source or meta.get(META_SOURCE)
        if not name:
            raise ConfigError("name the source: --source DB.TABLE (the dump does not say)")
        dump = _parquet_dump(from_parquet, meta, arrow, name, key, schema_file)
        prepared = PreparedSeed(store_url, name, stamp, int(meta.get(META_TIMESTAMP, 0)),
                                dump.schema, [str(jdbc_jar(POSTGRES_JAR))], parquet=dump)
    try:
        with open_storage(store_url) as storage:
            storage.ensure_sources([prepared.source])
            storage.add_schema(prepared.schema.fingerprint, prepared.source,
                               prepared.schema.to_json())
        store = PgStore(location)
        with store.reading() as view:
            plan = plan_seed(view.state, view.log_rows, source=prepared.source,
                             dump_scn=prepared.scn)
        prepared.notes.extend(plan.notes)
    except DatabusError:
        prepared.release()
        raise
    return prepared


def _prepare_mysql(store_url: str, url: str, table: str | None, source: str | None,
                   scn: int | None, lock: bool) -> PreparedSeed:
    from databus.fetchers.mysql import (
        BinlogSourceConfig,
        connect_source,
        current_position,
        source_cursor,
    )

    if lock and scn is not None:
        raise ConfigError("give either --lock (the job stamps the dump) or --scn, not both")
    if not lock and scn is None:
        raise JobRefused(
            "a JDBC dump needs an SCN stamp: --lock (hold a read lock on the table while it "
            "is read and stamp it with the binlog position; writers wait) or --scn N (the "
            "table has not changed since SCN N, e.g. on a stopped replica)"
        )
    config = BinlogSourceConfig.from_uri(url)
    database, name = _mysql_table(config, table)
    jars = [str(jdbc_jar(POSTGRES_JAR)), str(jdbc_jar(MARIADB_JAR))]
    conn = connect_source(config, "seeding")
    try:
        shape, columns, estimate = _mysql_shape(conn, config, database, name)
        partition = None
        column = partition_column(shape)
        # Range bounds only set the stride: Spark's first and last ranges are open, so
        # rows written before the lock is taken are read all the same.
        with source_cursor(conn, config, "reading the key range") as cur:
            if column is not None:
                q = f"`{column.replace('`', '``')}`"
                cur.execute(f"SELECT MIN({q}), MAX({q}) FROM `{database}`.`{name}`")
                low, high = cur.fetchone()
                if low is not None:
                    partition = (column, int(low), int(high))
        if lock:  # provisional, for the checks; the stamp is taken just before reading
            scn = current_position(conn, config).scn
        else:
            conn.close()
    except BaseException:
        conn.close()
        raise
    jdbc_url, props = mysql_jdbc(config.host, config.port, config.user, config.password)
    dump = MysqlDump(shape, columns, jdbc_url, props, partition, estimate, config)
    assert scn is not None
    return PreparedSeed(store_url, source or shape.source_name, scn, 0, dump.schema, jars,
                        mysql=dump, lock=conn if lock else None, stamp_pending=lock)


def seed(
    spark: SparkSession,
    prepared: PreparedSeed,
    *,
    partitions: int | None = None,
    partition_id: int = 0,
    progress: Progress | None = None,
    before_commit: Callable[[], None] | None = None,
) -> JobSummary:
    """Build the source's snapshot from the prepared dump and swap it in."""
    progress = progress or Progress()
    store = PgStore.for_url(prepared.store_url)
    summary = JobSummary("seed")
    counter = spark.sparkContext.accumulator(0)
    parallelism = spark.sparkContext.defaultParallelism
    parts = partitions or parallelism
    with timed(summary), store.job_lock("seed"):
        try:
            prepared.take_stamp()
            with store.reading() as view:
                plan = plan_seed(view.state, view.log_rows, source=prepared.source,
                                 dump_scn=prepared.scn)
                for note in (*prepared.notes, *plan.notes):
                    if note not in summary.notes:
                        summary.notes.append(note)
                        progress.note(note)
                stamp = EventStamp(view.state.sources[prepared.source], prepared.scn,
                                   prepared.timestamp_ns, partition_id,
                                   prepared.schema.fingerprint, view.state.key_hash)
                dump = _dump_frame(spark, prepared, stamp, counter, parts)
                swap = build_staging(spark, store, view, plan, summary,
                                     dumps={prepared.source: dump}, partitions=partitions,
                                     progress=progress)
        finally:
            prepared.release()  # the dump has been read (or the job failed)
        swap_in(store, plan, swap, summary, progress=progress, before_commit=before_commit)
    figures = summary.sources.setdefault(prepared.source, {})
    figures["dump_rows"] = int(counter.value)
    summary.rows_in += int(counter.value)
    return summary


def _dump_frame(spark: SparkSession, prepared: PreparedSeed, stamp: EventStamp, counter: Any,
                parts: int) -> DataFrame:
    if prepared.mysql is not None:
        frame = run_spark("reading the MariaDB table", read_mysql_dump, spark, prepared.mysql,
                          parts=parts)
        return encode_mysql_dump(frame, prepared.mysql, stamp, counter=counter)
    assert prepared.parquet is not None
    frame = run_spark("reading the Parquet dump", spark.read.parquet, prepared.parquet.path)
    return encode_parquet_dump(frame, prepared.parquet, stamp, counter=counter)


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit seed.py --store URL --from-mysql URL --table db.t --lock``."""
    from databus.spark_jobs._cli import standalone

    return standalone("seed", argv)


if __name__ == "__main__":
    sys.exit(main())
