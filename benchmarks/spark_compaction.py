"""Spark snapshot compaction against the applier's SQL path, on the same log.

For each size (log rows) and update ratio (the share of log rows that change a key
already seen), one PostgreSQL bootstrap store gets a log of that shape: windows of 10
events of ~216 bytes, int keys, 2 % of the updates deletes. Then:

1. the applier's SQL path builds the snapshot: ``storage.apply(max_rows=B)`` until
   caught up (B = 5,000, the applier's default batch), timed;
2. the Spark job rebuilds the same snapshot from the same log
   (``compact(..., rebuild=True)`` at the applied SCN: read the whole log over JDBC,
   latest per key, staging table, indexes, swap), timed, on ``local[2]``;
3. both snapshots are checked equal (a checksum over every row).

The reference is the applier, measured in the same run: the figure is the ratio of the
applier's time to Spark's (above 1: Spark is faster). Events are opaque bytes to both
paths (neither decodes them), so the log is generated inside PostgreSQL with
``generate_series`` rather than through the producer, which would take longer than
the measurements.

Usage: ``.venv/bin/python benchmarks/spark_compaction.py [--quick] [--sizes 1000000,...]
[--ratios 0.3,0.9] [--applier-batch 5000]``. ``--quick``: 100,000 and 300,000 rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pg import PostgresServer, fresh_schema, postgres, vacuum_analyze

from databus.bootstrap._storage import open_storage
from databus.checkpoint import Checkpoint
from databus.spark_jobs._common import POSTGRES_JAR, jdbc_jar, spark_session
from databus.spark_jobs.compact import compact

EVENTS_PER_WINDOW = 10
FIRST_SCN = 1_000_000


@dataclass
class Result:
    rows: int
    ratio: float
    keys: int
    applier_s: float
    spark_s: float
    generate_s: float

    @property
    def applier_rate(self) -> float:
        return self.rows / self.applier_s

    @property
    def spark_rate(self) -> float:
        return self.rows / self.spark_s


def _sql(server: PostgresServer, schema: str, *statements: str) -> list[tuple[object, ...]]:
    conn = psycopg2.connect(**server.connect_kwargs(), options=f"-c search_path={schema}")
    try:
        conn.autocommit = True
        rows: list[tuple[object, ...]] = []
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
                if cur.description:
                    rows = list(cur.fetchall())
        return rows
    finally:
        conn.close()


def generate_log(server: PostgresServer, schema: str, rows: int, ratio: float) -> int:
    """A log of ``rows`` rows where a share ``ratio`` updates an existing key (the first
    ``rows * (1 - ratio)`` rows insert the keys, the rest hit them in a scattered
    order); returns the number of distinct keys."""
    keys = max(1, round(rows * (1 - ratio)))
    windows = (rows + EVENTS_PER_WINDOW - 1) // EVENTS_PER_WINDOW
    end = FIRST_SCN + windows - 1
    storage = open_storage(f"{server.url()}?schema={schema}")
    storage.ensure_sources(["bench.items"])
    storage.close()
    _sql(server, schema,
         "CREATE TABLE dbus_log_1_p0 PARTITION OF dbus_log_1 FOR VALUES FROM (0) TO"
         " (4294967296)",
         f"INSERT INTO dbus_log_1 (scn, seq, op, pkey, key_hash, key, event)"
         f" SELECT {FIRST_SCN} + i / {EVENTS_PER_WINDOW}, i % {EVENTS_PER_WINDOW},"
         f" CASE WHEN i >= {keys} AND i % 50 = 0 THEN 2 ELSE 1 END, k, k # 6148914691236517205,"
         f" int8send(k), int8send(i) || decode(repeat(md5(i::text), 13), 'hex')"
         f" FROM (SELECT i, CASE WHEN i < {keys} THEN i::bigint"
         f" ELSE (i::bigint * 2654435761) % {keys} END AS k"
         f" FROM generate_series(0, {rows - 1}) AS i) s",
         f"INSERT INTO dbus_windows (scn, timestamp_ns, events, bytes)"
         f" SELECT {FIRST_SCN} + w, w, least({EVENTS_PER_WINDOW},"
         f" {rows} - w * {EVENTS_PER_WINDOW}), 0 FROM generate_series(0, {windows - 1}) AS w",
         "INSERT INTO dbus_state (name, value) VALUES ('producer_checkpoint',"
         f" '{Checkpoint.after(end).dumps()}')")
    vacuum_analyze(server, schema)
    return keys


def checksum(server: PostgresServer, schema: str) -> tuple[object, ...]:
    return _sql(server, schema,
                "SELECT count(*), count(*) FILTER (WHERE op = 2), sum(scn), sum(pkey % 1000003),"
                " sum(length(event)), sum(get_byte(event, 9)) FROM dbus_snapshot_1")[0]


def run_one(server: PostgresServer, spark: object, rows: int, ratio: float,
            applier_batch: int) -> Result:
    schema = f"spark_bench_{rows}_{round(ratio * 100)}"
    url = fresh_schema(server, schema)
    started = time.monotonic()
    keys = generate_log(server, schema, rows, ratio)
    generated = time.monotonic() - started

    storage = open_storage(url)
    started = time.monotonic()
    while storage.apply(max_rows=applier_batch) is not None:
        pass
    applier_s = time.monotonic() - started
    storage.close()
    expected = checksum(server, schema)
    vacuum_analyze(server, schema)

    started = time.monotonic()
    summary = compact(spark, url, rebuild=True)  # type: ignore[arg-type]
    spark_s = time.monotonic() - started
    got = checksum(server, schema)
    if got != expected:
        raise SystemExit(f"snapshots differ: applier {expected}, spark {got}")
    assert summary.rows_in == rows, summary
    fresh_schema(server, schema)  # drop it: 10M-row stores add up
    return Result(rows, ratio, keys, applier_s, spark_s, generated)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k and 300k rows")
    parser.add_argument("--sizes", help="comma-separated log sizes (rows)")
    parser.add_argument("--ratios", default="0.3,0.9", help="update ratios")
    parser.add_argument("--applier-batch", type=int, default=5_000,
                        help="rows per applier transaction (its default: 5000)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else [100_000, 300_000] if args.quick else [1_000_000, 10_000_000])
    ratios = [float(r) for r in args.ratios.split(",")]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = time.monotonic()
    spark, _ = spark_session(master=args.master, app="databus-bench", jars=[jdbc_jar(
        POSTGRES_JAR)], config={"spark.driver.memory": "6g", "spark.ui.enabled": "false",
                                "spark.driver.host": "127.0.0.1",
                                "spark.driver.bindAddress": "127.0.0.1"})
    print(f"SparkSession on {args.master}: {time.monotonic() - started:.1f} s (not timed)")
    print("| log rows | updates | keys | applier s | applier rows/s | spark s | spark rows/s |"
          " applier / spark |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    with postgres() as server:
        # A warm-up on a small log, so that JIT and class loading are not timed.
        run_one(server, spark, 20_000, 0.5, args.applier_batch)
        for rows in sizes:
            for ratio in ratios:
                r = run_one(server, spark, rows, ratio, args.applier_batch)
                print(f"| {rows:,} | {ratio:.0%} | {r.keys:,} | {r.applier_s:.1f} |"
                      f" {r.applier_rate:,.0f} | {r.spark_s:.1f} | {r.spark_rate:,.0f} |"
                      f" **{r.applier_s / r.spark_s:.2f}** |", flush=True)
    spark.stop()  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
