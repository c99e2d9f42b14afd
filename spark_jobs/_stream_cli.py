"""``databus spark stream``: a streaming query from the ``databus`` source into a Parquet
table of the latest state per key (``apply_changes`` per micro-batch).

The arguments are checked before Spark starts (URLs, sources, partitions, trigger, the
table and checkpoint paths), so a mistake costs a second, not a JVM start-up.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from databus.errors import ConfigError
from databus.spark_jobs._apply import TableConflict, foreach_batch, local_path, read_commit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HELP = "stream sources into a Parquet table of the latest row per key, exactly once"


def add_stream(jobs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``stream`` under ``databus spark``."""
    parser = jobs.add_parser("stream", help=HELP, description=HELP)
    parser.add_argument("--relay", action="append", required=True, metavar="URL",
                        help="a relay to read from (repeatable: fail-over between them)")
    parser.add_argument("--sources", required=True, metavar="A,B",
                        help="the logical sources to read, comma-separated (one source: "
                             "typed columns; several: a JSON 'value' column)")
    parser.add_argument("--to", required=True, metavar="PATH",
                        help="the Parquet table to keep the latest state in")
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="Spark's checkpoint directory of the query (keep it to resume)")
    parser.add_argument("--bootstrap", action="append", default=[], metavar="URL",
                        help="a bootstrap service to catch up from (repeatable)")
    parser.add_argument("--partitions", type=int, default=1, metavar="P",
                        help="input partitions, each reading one mod bucket of the key "
                             "(default 1)")
    parser.add_argument("--trigger", type=float, metavar="SECONDS",
                        help="start a micro-batch every SECONDS (default: as soon as the "
                             "previous one ends)")
    parser.add_argument("--master", help="Spark master (default: the spark-submit one, "
                                         "else local[*])")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration (repeatable)")
    parser.set_defaults(handler=run_stream)


def _urls(values: list[str], flag: str) -> list[str]:
    urls = [u.strip() for v in values for u in v.split(",") if u.strip()]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{flag} wants http:// or https:// URLs, got {url!r}")
    return urls


def _inside(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def stream_options(args: argparse.Namespace) -> dict[str, str]:
    """The source's options from the arguments; ``ConfigError`` for a wrong one."""
    relays = _urls(args.relay, "--relay")
    if not relays:
        raise ConfigError("--relay wants at least one URL")
    sources = [s.strip() for s in args.sources.split(",")]
    if not all(sources):
        raise ConfigError(f"--sources wants names separated by commas, got {args.sources!r}")
    if len(set(sources)) != len(sources):
        raise ConfigError(f"--sources names a source twice: {args.sources!r}")
    if args.partitions < 1:
        raise ConfigError(f"--partitions must be at least 1, got {args.partitions}")
    if args.trigger is not None and not args.trigger > 0:
        raise ConfigError(f"--trigger must be a positive number of seconds, got "
                          f"{args.trigger}")
    options = {"relays": ",".join(relays), "sources": ",".join(sources),
               "partitions": str(args.partitions)}
    bootstrap = _urls(args.bootstrap, "--bootstrap")
    if bootstrap:
        options["bootstrap"] = ",".join(bootstrap)
    return options


def check_paths(table: str, checkpoint: str) -> None:
    """``--to`` and ``--checkpoint`` apart, and the table not another query's."""
    to = local_path(table).resolve()
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        return  # a checkpoint on HDFS and the like: Spark checks it
    cp = local_path(checkpoint).resolve()
    if _inside(cp, to) or _inside(to, cp):
        raise ConfigError(f"--checkpoint {checkpoint} and --to {table} must not contain "
                          f"one another")
    commit = read_commit(to)
    fresh = not (cp / "offsets").is_dir() or not any((cp / "offsets").iterdir())
    if commit is not None and fresh:
        raise TableConflict(
            f"the table at {table} was written up to batch {commit.batch_id} by a query "
            f"whose checkpoint is not {checkpoint}: resume that query with its checkpoint, "
            f"or write this one to a new table")


def start_query(spark: SparkSession, args: argparse.Namespace) -> Any:
    """The started streaming query (``StreamingQuery``) of the arguments."""
    reader = spark.readStream.format("databus")
    for key, value in stream_options(args).items():
        reader = reader.option(key, value)
    writer = (reader.load().writeStream.foreachBatch(foreach_batch(args.to))
              .option("checkpointLocation", args.checkpoint)
              .queryName("databus-stream"))
    if args.trigger is not None:
        writer = writer.trigger(processingTime=f"{args.trigger} seconds")
    return writer.start()


def run_stream(args: argparse.Namespace) -> int:
    from databus.spark_jobs._cli import _spark_conf
    from databus.spark_jobs._common import run_spark, spark_session

    stream_options(args)
    check_paths(args.to, args.checkpoint)
    conf = _spark_conf(args)
    os.makedirs(local_path(args.to), exist_ok=True)
    spark, owned = spark_session(master=args.master, app="databus-spark-stream", jars=[],
                                 config=conf)
    try:
        # The "databus" format is registered with the session by the source package.
        from databus.spark_jobs.stream import register

        register(spark)
        query = run_spark("starting the stream", start_query, spark, args)
        try:
            run_spark("the stream", query.awaitTermination)
        except KeyboardInterrupt:
            query.stop()
    finally:
        if owned:
            spark.stop()
    return 0


__all__ = ["add_stream", "check_paths", "run_stream", "start_query", "stream_options"]
