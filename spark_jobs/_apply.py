"""Apply a stream's micro-batches to a Parquet table as the latest state per key,
exactly once per batch id (``apply_changes``, ``foreach_batch``, ``read_table``).

The rows of a batch are the stream's: ``scn``, ``source``, ``op`` (``upsert`` or
``delete``), ``key``, ``timestamp``, ``from_snapshot``, ``partition``, ``seq`` (the
event's position in its window) and the value's columns or ``value`` (JSON text). The
table holds one row per key (``key_columns``, default ``source`` and ``key``): the
newest change by ``(scn, seq)`` among the table and the batch, without ``op``; a key
whose newest change is a delete has no row.

Layout on disk (``path``, a directory on the driver's file system, which executors must
see too: local for ``local[*]``, a shared mount on a cluster)::

    path/_databus/commit.json   {"format": 1, "version": 7, "dir": "v0000000007-b41",
                                 "batch_id": 41, "rows": 1234, "schema": <Spark JSON>,
                                 "query_id": "...", "committed_at": "..."}
    path/v0000000007-b41/       the published version: Parquet files, one row per key
    path/v0000000006-b40/       the previous version, kept for readers that resolved
                                it just before the last publish; removed by the next

Each batch writes the whole new state into a new version directory and then publishes
it by renaming a new ``commit.json`` over the old one (atomic on a POSIX file system).
A crash before the rename leaves the previous version published and a stray directory,
removed by the next apply; a crash after it leaves the batch applied. A batch id at or
below the published one is skipped, so Spark re-running the last batch after a driver
crash is a no-op. One query writes one table: a ``query_id`` (Spark's id of the
streaming query, kept across restarts from its checkpoint) recorded in the commit makes
another query writing to the same table fail instead of skipping its batches.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from databus.spark_jobs._common import SparkJobError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "Commit",
    "TableConflict",
    "apply_changes",
    "foreach_batch",
    "read_commit",
    "read_table",
]

COMMIT_DIR = "_databus"
COMMIT_FILE = "commit.json"
FORMAT = 1
ORDER_COLUMNS = ("scn", "seq")
_VERSION_DIR = re.compile(r"v(\d{10})-b(-?\d+)\Z")
_QUERY_ID_PROPERTY = "sql.streaming.queryId"


class TableConflict(SparkJobError):
    """The table at ``path`` was written by another streaming query (or is not a table
    of this format): applying would skip or mix batches."""

    code = "table_conflict"


@dataclass(frozen=True)
class Commit:
    """The published state of a table (``_databus/commit.json``)."""

    version: int
    dir: str
    batch_id: int
    rows: int
    schema: str | None  # Spark's StructType JSON
    query_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": self.version, "dir": self.dir,
                "batch_id": self.batch_id, "rows": self.rows, "schema": self.schema,
                "query_id": self.query_id,
                "committed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}


@dataclass(frozen=True)
class ApplyResult:
    """What ``apply_changes`` did with one batch."""

    batch_id: int
    applied: bool  # False: the batch id was already applied (or older), nothing written
    version: int
    rows: int


def local_path(path: str | os.PathLike[str]) -> Path:
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif "://" in text:
        raise SparkJobError(
            f"apply_changes writes to a file system path (local or a shared mount), "
            f"not {text.split('://', 1)[0]}://: its atomic publish is a rename")
    return Path(text)


def read_commit(path: str | os.PathLike[str]) -> Commit | None:
    """The published commit of the table at ``path``, None when nothing is published."""
    file = local_path(path) / COMMIT_DIR / COMMIT_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TableConflict(f"{file} is not a readable commit: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TableConflict(f"{file} is not a databus table commit of format {FORMAT}")
    return Commit(version=int(data["version"]), dir=str(data["dir"]),
                  batch_id=int(data["batch_id"]), rows=int(data["rows"]),
                  schema=data.get("schema"), query_id=data.get("query_id"))


def read_table(spark: SparkSession, path: str | os.PathLike[str]) -> DataFrame:
    """The published state of the table at ``path`` (no rows, no columns before the
    first batch)."""
    from pyspark.sql import types as T

    commit = read_commit(path)
    if commit is None:
        return spark.createDataFrame([], T.StructType([]))
    return _read_version(spark, local_path(path), commit)


def _read_version(spark: SparkSession, root: Path, commit: Commit) -> DataFrame:
    from pyspark.sql import types as T

    reader = spark.read
    if commit.schema:
        reader = reader.schema(T.StructType.fromJson(json.loads(commit.schema)))
    return reader.parquet(str(root / commit.dir))


def _batch_query_id(spark: SparkSession) -> str | None:
    with contextlib.suppress(Exception):
        value = spark.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
        return str(value) if value else None
    return None


def _latest(df: DataFrame, keys: Sequence[str]) -> DataFrame:
    """One row per key: the newest by (scn, seq, _from_batch)."""
    from pyspark.sql import functions as F

    columns = df.columns
    order = F.struct(*(F.col(c) for c in (*ORDER_COLUMNS, "_from_batch")))
    return (df.groupBy(*keys)
            .agg(F.max_by(F.struct(*(F.col(c) for c in columns)), order).alias("_row"))
            .select(*(F.col("_row").getField(c).alias(c) for c in columns)))


def merge_state(state: DataFrame | None, batch: DataFrame, keys: Sequence[str]
                ) -> DataFrame:
    """The new state (pure DataFrame function): ``state`` (no ``op``) and ``batch``
    folded to the newest change per key, deletes dropped."""
    from pyspark.sql import functions as F

    missing = [c for c in (*keys, *ORDER_COLUMNS, "op") if c not in batch.columns]
    if missing:
        raise SparkJobError(f"a batch to apply lacks the column(s) {', '.join(missing)}")
    changes = batch.withColumn("_from_batch", F.lit(1))
    if state is not None:
        old = (state.withColumn("op", F.lit("upsert"))
               .withColumn("_from_batch", F.lit(0)))
        changes = changes.unionByName(old, allowMissingColumns=True)
    latest = _latest(changes, keys)
    return (latest.where(F.col("op") != F.lit("delete"))
            .drop("op", "_from_batch")
            .select(*(c for c in batch.columns if c != "op"),
                    *(c for c in latest.columns
                      if c not in batch.columns and c != "_from_batch")))


def apply_changes(batch_df: DataFrame, batch_id: int, path: str | os.PathLike[str], *,
                  key_columns: Sequence[str] = ("source", "key"),
                  before_publish: Callable[[Path], None] | None = None) -> ApplyResult:
    """Apply one micro-batch to the table at ``path`` as the latest state per key (see
    the module docstring), exactly once per ``batch_id``. ``before_publish`` is called
    with the written version's directory before it is published (tests crash there)."""
    root = local_path(path)
    commit = read_commit(root)
    query_id = _batch_query_id(batch_df.sparkSession)
    if commit is not None:
        if query_id and commit.query_id and query_id != commit.query_id:
            raise TableConflict(
                f"the table at {root} is written by streaming query {commit.query_id}, "
                f"not by this one ({query_id}): give each query its own table (a query "
                f"restarted from a new checkpoint is a new query)")
        if batch_id <= commit.batch_id:
            return ApplyResult(batch_id, False, commit.version, commit.rows)
    _remove_unpublished(root, commit)
    version = 1 if commit is None else commit.version + 1
    name = f"v{version:010d}-b{batch_id}"
    target = root / name
    spark = batch_df.sparkSession
    batch_df.persist()  # read once: a batch of the databus source is read from a relay
    try:
        if commit is not None and batch_df.isEmpty():
            # Nothing changes: the same version, now standing for this batch id too.
            _publish(root, Commit(version=commit.version, dir=commit.dir,
                                  batch_id=batch_id, rows=commit.rows, schema=commit.schema,
                                  query_id=query_id or commit.query_id))
            return ApplyResult(batch_id, True, commit.version, commit.rows)
        state = None if commit is None else _read_version(spark, root, commit)
        new_state = merge_state(state, batch_df, list(key_columns))
        new_state.write.mode("overwrite").parquet(str(target))
        schema = new_state.schema.json()
        rows = spark.read.schema(new_state.schema).parquet(str(target)).count()
    finally:
        batch_df.unpersist()
    if before_publish is not None:
        before_publish(target)
    published = Commit(version=version, dir=name, batch_id=batch_id, rows=rows,
                       schema=schema, query_id=query_id or (commit.query_id if commit
                                                            else None))
    _publish(root, published)
    _remove_old(root, keep={name} | ({commit.dir} if commit else set()))
    return ApplyResult(batch_id, True, version, rows)


def _publish(root: Path, commit: Commit) -> None:
    """Write ``commit.json`` next to the old one and rename it over it (atomic)."""
    directory = root / COMMIT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{COMMIT_FILE}.{uuid.uuid4().hex}.tmp"
    with tmp.open("w", encoding="utf-8") as out:
        json.dump(commit.to_json(), out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, directory / COMMIT_FILE)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _version_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.is_dir() and _VERSION_DIR.match(p.name)]


def _remove_unpublished(root: Path, commit: Commit | None) -> None:
    """Directories of versions newer than the published one: a crash between writing
    and publishing left them."""
    published = 0 if commit is None else commit.version
    for directory in _version_dirs(root):
        match = _VERSION_DIR.match(directory.name)
        if match and int(match.group(1)) > published:
            shutil.rmtree(directory, ignore_errors=True)


def _remove_old(root: Path, keep: set[str]) -> None:
    for directory in _version_dirs(root):
        if directory.name not in keep:
            shutil.rmtree(directory, ignore_errors=True)
    for stray in (root / COMMIT_DIR).glob(f".{COMMIT_FILE}.*.tmp"):
        with contextlib.suppress(OSError):
            stray.unlink()


def foreach_batch(path: str | os.PathLike[str], *,
                  key_columns: Sequence[str] = ("source", "key")
                  ) -> Callable[[DataFrame, int], None]:
    """The function for ``writeStream.foreachBatch``: ``apply_changes`` to ``path``."""
    local_path(path)  # a wrong path fails when the query is set up, not at its first batch

    def apply(batch_df: DataFrame, batch_id: int) -> None:
        apply_changes(batch_df, batch_id, path, key_columns=key_columns)

    return apply
