"""``databus spark compact|seed|export``: argument parsing, checks before Spark starts,
a live progress view and the summary at the end.

Each job is checked against the store (reachable, a valid plan) and the machine (Java,
JDBC jars) before a JVM is started, so mistakes cost a second, not a Spark start-up.
``standalone`` serves the jobs' own ``main`` (``spark-submit .../compact.py ...``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from databus.errors import ConfigError, DatabusError
from databus.spark_jobs._common import (
    POSTGRES_JAR,
    JobSummary,
    find_java,
    jdbc_jar,
    spark_session,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Handler = Callable[[argparse.Namespace], int]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    spark = subparsers.add_parser(
        "spark", help="PySpark jobs: compact, seed, export the bootstrap store; stream to Parquet",
        description="Spark jobs on the PostgreSQL bootstrap store, and a streaming query "
                    "into a Parquet table (docs/spark.md).")
    jobs = spark.add_subparsers(dest="job", metavar="JOB")
    for name, (add, _, text) in _JOBS.items():
        parser = jobs.add_parser(name, help=text, description=text)
        _common_arguments(parser)
        add(parser)
        parser.set_defaults(handler=_handler(name))
    from databus.spark_jobs._stream_cli import add_stream

    add_stream(jobs)

    def usage(args: argparse.Namespace) -> int:
        spark.print_help()
        return 2

    spark.set_defaults(handler=usage)


def standalone(job: str, argv: Sequence[str] | None) -> int:
    """A job's own ``main``: its arguments only, errors as one line on stderr."""
    add, run, text = _JOBS[job]
    parser = argparse.ArgumentParser(prog=f"databus-spark-{job}", description=text)
    _common_arguments(parser)
    add(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except DatabusError as exc:
        print(f"databus spark {job}: error: {exc}", file=sys.stderr)
        return 1


def _handler(job: str) -> Handler:
    return lambda args: _JOBS[job][1](args)


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, metavar="URL",
                        help="the bootstrap store, postgresql://user:pass@host:5432/db"
                             "?schema=name")
    parser.add_argument("--master", help="Spark master (default: the spark-submit one, "
                                         "else local[*])")
    parser.add_argument("--partitions", type=int, metavar="N",
                        help="JDBC read partitions (default: cores, or one per 1M rows)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress view")


def _spark_conf(args: argparse.Namespace) -> dict[str, str]:
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--conf wants KEY=VALUE, got {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def _start(args: argparse.Namespace, app: str, jars: Sequence[str]
           ) -> tuple[SparkSession, bool]:
    find_java()
    return spark_session(master=args.master, app=app, jars=[Path(j) for j in jars],
                         config=_spark_conf(args))


def _print_summary(summary: JobSummary) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"databus spark {summary.job}", show_header=True)
    for column in ("source", "rows in", "rows out", "tombstones"):
        table.add_column(column, justify="left" if column == "source" else "right")
    for name, figures in summary.sources.items():
        table.add_row(name, f"{figures.get('log_rows', figures.get('rows_in', 0)):,}",
                      f"{figures.get('rows_out', 0):,}", f"{figures.get('tombstones', 0):,}")
    if summary.sources:
        console.print(table)
    for note in summary.notes:
        console.print(f"note: {note}")
    scn = "-" if summary.scn is None else str(summary.scn)
    console.print(
        f"{summary.job}: rows in {summary.rows_in:,}, rows out {summary.rows_out:,}, "
        f"SCN {scn}, {summary.seconds:.1f} s ({summary.rows_per_second:,.0f} rows/s)"
    )


def _with_progress(args: argparse.Namespace, spark: SparkSession,
                   run: Callable[..., JobSummary]) -> JobSummary:
    from databus.spark_jobs._progress import Progress, RichProgress

    if args.quiet:
        return run(Progress())
    with RichProgress(spark) as progress:
        return run(progress)


# -- compact ----------------------------------------------------------------------------


def _add_compact(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target-scn", type=int, metavar="SCN",
                        help="compact the log up to this SCN (default: the log's end)")
    parser.add_argument("--source", action="append", metavar="NAME",
                        help="only these sources (repeatable; only valid when the others "
                             "have no log rows to apply)")
    parser.add_argument("--rebuild", action="store_true",
                        help="rebuild from the whole log, ignoring the current snapshot "
                             "(only while retention has not cut the log)")


def _run_compact(args: argparse.Namespace) -> int:
    from databus.spark_jobs._plan import plan_compaction
    from databus.spark_jobs._store import PgStore
    from databus.spark_jobs.compact import compact, required_jars

    # The plan is checked once before Spark starts, so a refusal costs no JVM.
    store = PgStore.for_url(args.store)
    with store.reading() as view:
        plan_compaction(view.state, view.log_rows, target_scn=args.target_scn,
                        sources=args.source, rebuild=args.rebuild)
    jars = required_jars()
    spark, owned = _start(args, "databus-spark-compact", jars)
    try:
        summary = _with_progress(args, spark, lambda progress: compact(
            spark, args.store, target_scn=args.target_scn, sources=args.source,
            rebuild=args.rebuild, partitions=args.partitions, progress=progress))
    finally:
        if owned:
            spark.stop()
    _print_summary(summary)
    return 0


# -- seed -------------------------------------------------------------------------------


def _add_seed(parser: argparse.ArgumentParser) -> None:
    origin = parser.add_mutually_exclusive_group(required=True)
    origin.add_argument("--from-mysql", metavar="URL",
                        help="read the table from MariaDB/MySQL over JDBC: "
                             "mysql://user:pass@host:3306/")
    origin.add_argument("--from-parquet", metavar="PATH",
                        help="read a Parquet dump (a file or a directory of files)")
    parser.add_argument("--table", metavar="DB.TABLE",
                        help="with --from-mysql: the table to dump")
    parser.add_argument("--source", metavar="NAME",
                        help="logical source name (default: DB.TABLE, or the dump's "
                             "databus.source metadata)")
    parser.add_argument("--scn", type=int,
                        help="the SCN the dump is consistent at (required unless the dump "
                             "carries it, or --lock takes it)")
    parser.add_argument("--lock", action="store_true",
                        help="with --from-mysql: hold LOCK TABLES ... READ while reading and "
                             "stamp the dump with the binlog position (writers wait)")
    parser.add_argument("--key", action="append", metavar="COLUMN",
                        help="with --from-parquet: the key column(s), in key order, when the "
                             "dump does not say (repeatable)")
    parser.add_argument("--schema", metavar="FILE",
                        help="with --from-parquet: the Avro schema (.avsc) to encode with")
    parser.add_argument("--partition-id", type=int, default=0,
                        help="physical partition id to put in the seeded events")


def _run_seed(args: argparse.Namespace) -> int:
    from databus.spark_jobs.seed import prepare_seed, seed

    prepared = prepare_seed(
        args.store, source=args.source, from_mysql=args.from_mysql, table=args.table,
        from_parquet=args.from_parquet, scn=args.scn, lock=args.lock, key=args.key,
        schema_file=args.schema,
    )
    spark, owned = _start(args, "databus-spark-seed", prepared.jars)
    try:
        summary = _with_progress(args, spark, lambda progress: seed(
            spark, prepared, partitions=args.partitions, partition_id=args.partition_id,
            progress=progress))
    finally:
        prepared.close()
        if owned:
            spark.stop()
    _print_summary(summary)
    return 0


# -- export -----------------------------------------------------------------------------


def _add_export(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", required=True, metavar="NAME",
                        help="the logical source whose snapshot to export")
    parser.add_argument("--out", required=True, metavar="PATH",
                        help="output directory (local, or any pyarrow filesystem URI)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the output directory if it exists")


def _run_export(args: argparse.Namespace) -> int:
    from databus.spark_jobs.export import export, prepare_export

    prepared = prepare_export(args.store, source=args.source, out=args.out,
                              overwrite=args.overwrite)
    spark, owned = _start(args, "databus-spark-export", [str(jdbc_jar(POSTGRES_JAR))])
    try:
        summary = _with_progress(args, spark, lambda progress: export(
            spark, prepared, partitions=args.partitions, progress=progress))
    finally:
        if owned:
            spark.stop()
    _print_summary(summary)
    return 0


_JOBS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Handler, str]] = {
    "compact": (_add_compact, _run_compact,
                "compact the bootstrap log into new snapshots, swapped in atomically"),
    "seed": (_add_seed, _run_seed,
             "build a source's snapshot from a table dump stamped with its SCN"),
    "export": (_add_export, _run_export,
               "export a snapshot to Parquet with decoded columns and its SCN"),
}

__all__ = ["register", "standalone"]
