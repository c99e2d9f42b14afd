"""The ``databus`` Spark streaming source into a no-op sink, as a ratio of one
``DatabusClient`` reading the same stream from the same relay, in the same run.

    .venv/bin/python benchmarks/spark_stream.py [--events 200000] [--event-bytes 256]
        [--events-per-window 20] [--repeat 3] [--partitions 1 2] [--master local[2]]
        [--sources 2]

The relay is a ``databus relay`` process prefilled by the synthetic fetcher (int keys;
``--sources 2``: two sources, so the rows carry ``value`` as JSON text; ``--sources 1``:
one, so the rows carry its typed columns; ``--events`` events in windows of
``--events-per-window``; room for all of them, so nothing is evicted). Then,
alternating in each round so that the machine's noise falls on both alike:

- the reference: ``DatabusClient`` (no filter, default options but 4 MiB requests),
  one ``on_window`` consumer that reads every event's value (decodes it, as the source
  must to make its typed columns), from the oldest window to the newest;
- the source: a streaming query ``spark.readStream.format("databus")`` with
  ``partitions`` P (each partition reads its mod bucket through the relay's filter),
  a fresh checkpoint, written to ``writeStream.format("noop")``, run until it has read
  everything (``processAllAvailable``); the rows counted from the query's progress
  must equal the events. One SparkSession (``--master``, default ``local[2]``) serves
  every round: its start is not timed, each query's planning is.

Two figures per P, each the median over the rounds of (source events/s ÷ client events/s
of the same round): "whole query", from ``start()`` until ``processAllAvailable``
returns (the query's start, its Python workers' start and planning included), and "in
batches", the events over the time Spark's progress gives to the batches that read them
(``triggerExecution``): what the source sustains once running. Goal: >= 1.0 with 2
partitions on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import client_throughput
from _relay_proc import RelayProcess, code_version, cpu_seconds, descendants, loadavg

# Two sources: the rows have the ``value`` JSON column; one: its typed columns (the
# synthetic schema's ``seq`` comes as ``value_seq``).
SOURCES = ("synthetic.a", "synthetic.b")


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants, with the children each of them
    has reaped (Spark's short-lived Python planners): utime + stime + cutime + cstime."""
    total = 0.0
    for one in (pid, *descendants(pid)):
        with contextlib.suppress(OSError):  # exited meanwhile
            total += cpu_seconds(one, reaped=True)
    return total


class Cpu:
    """CPU seconds spent by this process's tree and the relay's between two reads."""

    def __init__(self, relay_pid: int) -> None:
        self.relay_pid = relay_pid

    def now(self) -> float:
        return tree_cpu(os.getpid()) + tree_cpu(self.relay_pid)


def client_rate(url: str, windows: int, events: int,
                sources: tuple[str, ...] = SOURCES) -> float:
    """The reference: one DatabusClient, ``on_window``, every value decoded."""
    return client_throughput.client_rate(url, windows, events, "on_window", decode=True,
                                         sources=sources)


def spark_rate(spark: object, url: str, partitions: int, events: int, work: Path,
               sources: tuple[str, ...] = SOURCES) -> tuple[float, float]:
    """(events/s of the whole query, events/s in its batches)."""
    checkpoint = tempfile.mkdtemp(prefix="cp-", dir=work)
    reader = (spark.readStream.format("databus")  # type: ignore[attr-defined]
              .option("relays", url).option("sources", ",".join(sources))
              .option("partitions", str(partitions)))
    start = time.perf_counter()
    query = (reader.load().writeStream.format("noop")
             .option("checkpointLocation", checkpoint).start())
    try:
        query.processAllAvailable()
        elapsed = time.perf_counter() - start
        progress = query.recentProgress
        rows = sum(int(p["numInputRows"]) for p in progress)
        batches_ms = sum(int(p["durationMs"]["triggerExecution"]) for p in progress
                         if int(p["numInputRows"]))
    finally:
        query.stop()
    assert rows == events, f"the query read {rows} rows, the relay holds {events} events"
    return events / elapsed, events / (batches_ms / 1000)


def session(master: str, work: Path, extra: dict[str, str]) -> object:
    from databus.spark_jobs import register
    from databus.spark_jobs._common import spark_session

    spark, _ = spark_session(master=master, app="databus-bench-spark-stream", jars=[], config={
        "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1", "spark.sql.shuffle.partitions": "2",
        "spark.local.dir": str(work / "spark-local"),
        # One progress entry per batch is kept; a run is a handful of batches.
        "spark.sql.streaming.numRecentProgressUpdates": "1000", **extra})
    register(spark)
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--event-bytes", type=int, default=256)
    parser.add_argument("--events-per-window", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--sources", type=int, choices=(1, 2), default=2,
                        help="1: typed columns; 2: the value JSON column (default)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    args = parser.parse_args()
    sources = SOURCES[:args.sources]
    windows = args.events // args.events_per_window
    events = windows * args.events_per_window
    source = (f"synthetic://?rate=0&keys=100000&event_bytes={args.event_bytes}"
              f"&events_per_window={args.events_per_window}&limit={windows}&seed=33"
              f"&source={','.join(sources)}")
    capacity = max(64, events * 2 * (args.event_bytes + 200) // (1 << 20) + 16)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(f"# spark stream: {events} events of {args.event_bytes} bytes, "
          f"{args.events_per_window} per window, {len(sources)} source(s), "
          f"{args.repeat} rounds, {args.master}, "
          f"{' '.join(args.conf) or 'default settings'}, "
          f"{os.cpu_count()} cores; {code_version(('spark_jobs', 'client', 'relay'))}; "
          f"{loadavg()} at the start")
    with tempfile.TemporaryDirectory(prefix="databus-bench-spark-") as tmp:
        work = Path(tmp)
        extra = dict(item.split("=", 1) for item in args.conf)
        spark = session(args.master, work, extra)
        try:
            with RelayProcess(source, capacity) as relay:
                relay.wait_for_scn(windows)
                # A first, untimed pass of each: the JVM's and the relay's warm-up.
                client_rate(relay.url, windows, events, sources)
                spark_rate(spark, relay.url, max(args.partitions), events, work, sources)
                clients: list[float] = []
                ratios: dict[int, list[float]] = {p: [] for p in args.partitions}
                rates: dict[int, list[float]] = {p: [] for p in args.partitions}
                in_batches: dict[int, list[float]] = {p: [] for p in args.partitions}
                # CPU µs per event, the relay's included (0: the client).
                cpu_us: dict[int, list[float]] = {p: [] for p in (0, *args.partitions)}
                cpu = Cpu(relay.pid)
                for _ in range(args.repeat):
                    before = cpu.now()
                    reference = client_rate(relay.url, windows, events, sources)
                    cpu_us[0].append((cpu.now() - before) / events * 1e6)
                    clients.append(reference)
                    for p in args.partitions:
                        before = cpu.now()
                        whole, batches = spark_rate(spark, relay.url, p, events, work,
                                                    sources)
                        cpu_us[p].append((cpu.now() - before) / events * 1e6)
                        rates[p].append(whole)
                        ratios[p].append(whole / reference)
                        in_batches[p].append(batches / reference)
        finally:
            spark.stop()  # type: ignore[attr-defined]
    print(f"# {loadavg()} at the end")
    print("| partitions | whole query, events/s (median) | DatabusClient, events/s (median) "
          "| whole query ÷ DatabusClient | in batches ÷ DatabusClient | rounds (whole; in "
          "batches) |")
    print("|---:|---:|---:|---:|---:|---|")
    for p in args.partitions:
        print(f"| {p} | {statistics.median(rates[p]):,.0f} | {statistics.median(clients):,.0f}"
              f" | {statistics.median(ratios[p]):.2f} | {statistics.median(in_batches[p]):.2f}"
              " | " + ", ".join(f"{r:.2f}" for r in ratios[p]) + "; "
              + ", ".join(f"{r:.2f}" for r in in_batches[p]) + " |")
    print()
    print("CPU per event (µs, all processes: the relay, the client or the JVM and its "
          "Python workers; median): DatabusClient "
          f"{statistics.median(cpu_us[0]):.1f}; "
          + "; ".join(f"{p} partition(s) {statistics.median(cpu_us[p]):.1f}"
                      for p in args.partitions))


if __name__ == "__main__":
    main()
