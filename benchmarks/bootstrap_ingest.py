"""Bootstrap producer ingest rate as a ratio of a raw COPY, and whether the applier keeps up.

    .venv/bin/python benchmarks/bootstrap_ingest.py [--quick] [--windows 100000]
        [--events-per-window 1] [--event-bytes 500] [--update-ratio 0.5] [--repeat 3]

Setup: a ``databus relay`` child process whose synthetic fetcher
(``synthetic://?rate=0&limit=W...``) fills its buffer with W windows of
``--events-per-window`` events of ``--event-bytes`` bytes (keys drawn as the synthetic
fetcher does, ``--update-ratio`` of them updates) before anything is timed; a throwaway
PostgreSQL 15 started as the test fixture starts it (fsync and synchronous_commit off).
In this process, on one event loop as ``databus bootstrap`` runs them, with the
defaults of ``[bootstrap.producer]`` and ``[bootstrap.applier]``:

- **producer alone**: a ``LogProducer`` writes into a fresh schema; timed from its
  ``start()`` to its SCN reaching W (HTTP pulls from the relay, verification, binary
  COPY into the log, one transaction per relay response). Then a ``LogApplier`` starts
  on the full log and is timed until its applied SCN reaches W: the applier's own rate.
- **producer + applier**: both start together on another fresh schema; when the producer
  reaches W, the applier's lag (SCNs and rows) is noted, then the time it needs to reach
  W as well.
- **reference, raw COPY**: the same rows (read back from the producer's log) copied into
  the identical log table of a fresh schema with ``copy_into`` (the producer's own binary
  COPY encoder, ``bootstrap/_postgres.py``), in one ``COPY`` and one transaction, timed
  from the start of the encoding to the commit.

Figures (each the best of ``--repeat`` runs; the reference is measured between the
producer runs): producer rows/s / raw COPY rows/s (goal >= 0.6, issue 30), with and
without the applier running; applier rows/s alone / producer rows/s (>= 1: it keeps
up); and the applier's lag when the producer is done. Each round's line also gives
its own producer / raw COPY (the two measured one after the other: on a busy machine
the pairs say more than the bests, which may come from different moments).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import platform
import time
from dataclasses import dataclass

import psycopg2
from _pg import PostgresServer, fresh_schema, postgres
from _relay_proc import RelayProcess, code_version, cpu_seconds, machine_cpu

from databus.bootstrap._applier import LogApplier
from databus.bootstrap._postgres import PostgresStorage, copy_into
from databus.bootstrap._producer import LogProducer
from databus.bootstrap._sql import log_table
from databus.bootstrap._storage import StoredEvent
from databus.config import ApplierConfig, ProducerConfig

SOURCE = "bench.rows"
CODE = ("bootstrap", "databus")  # the code measured (uncommitted changes are listed)


@dataclass
class ProducerRun:
    rows: int
    producer_s: float
    applier_lag_scn: int | None = None  # when the producer reached the end
    applier_lag_rows: int | None = None
    applier_s: float = math.nan  # from start (with the producer) or alone
    batches: int = 0
    cpu_cores: float = 0.0  # this process (producer, applier) over the producer's time
    relay_cores: float = 0.0
    machine_other_cores: float = 0.0

    @property
    def producer_rate(self) -> float:
        return self.rows / self.producer_s

    @property
    def applier_rate(self) -> float:
        return self.rows / self.applier_s


async def _wait(predicate: object, timeout: float, what: str) -> float:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():  # type: ignore[operator]
        if loop.time() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.005)
    return time.perf_counter()


async def run_producer(url: str, relay: RelayProcess, last_scn: int, rows: int, *,
                       with_applier: bool, timeout: float) -> ProducerRun:
    p, a = ProducerConfig(), ApplierConfig()
    storage = PostgresStorage(url)
    producer = LogProducer(storage, [relay.url], sources=[SOURCE], max_bytes=p.max_bytes,
                           poll_wait_ms=p.poll_wait_ms)
    applier = LogApplier(storage, batch_rows=a.batch_rows,
                         poll_interval=a.poll_interval_ms / 1000)
    try:
        cpu0, relay0, (busy0, _, _) = (time.process_time(), cpu_seconds(relay.pid),
                                        machine_cpu())
        began = time.perf_counter()
        producer.start()
        if with_applier:
            applier.start()
        done = await _wait(lambda: (producer.status.scn or 0) >= last_scn
                           or producer.status.state == "failed", timeout, "producer")
        if producer.status.state == "failed":
            raise RuntimeError(f"producer failed: {producer.status.last_error}")
        cpu1, relay1, (busy1, _, _) = (time.process_time(), cpu_seconds(relay.pid),
                                        machine_cpu())
        run = ProducerRun(rows, done - began, batches=producer.status.batches)
        span = run.producer_s
        run.cpu_cores = (cpu1 - cpu0) / span
        run.relay_cores = (relay1 - relay0) / span
        run.machine_other_cores = max(0.0, (busy1 - busy0) / span - run.cpu_cores
                                      - run.relay_cores)
        await producer.close()
        if with_applier:
            state = await asyncio.to_thread(storage.state)
            applied = state.applied_scn or 0
            run.applier_lag_scn = last_scn - applied
            run.applier_lag_rows = rows - applier.status.rows
            applier_from = began
        else:
            applier_from = time.perf_counter()
            applier.status.started_at = time.monotonic()
            applier.start()
        finished = await _wait(lambda: (applier.status.applied_scn or 0) >= last_scn
                               or applier.status.state == "failed", timeout, "applier")
        if applier.status.state == "failed":
            raise RuntimeError(f"applier failed: {applier.status.last_error}")
        run.applier_s = finished - applier_from
        return run
    finally:
        await producer.close()
        await applier.close()
        storage.close()


def read_rows(server: PostgresServer, schema: str) -> list[tuple[int, int, StoredEvent]]:
    conn = psycopg2.connect(**server.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT scn, seq, op, pkey, key_hash, key, event FROM "
                        f"{schema}.{log_table(1)} ORDER BY scn, seq")
            return [(scn, seq, StoredEvent(SOURCE, op, pkey, kh, bytes(key), bytes(event)))
                    for scn, seq, op, pkey, kh, key, event in cur.fetchall()]
    finally:
        conn.close()


def raw_copy(server: PostgresServer, schema: str,
             rows: list[tuple[int, int, StoredEvent]]) -> float:
    """Seconds to COPY ``rows`` into the log table of a fresh store (partitions made
    first, as the producer makes them outside its append)."""
    storage = PostgresStorage(fresh_schema(server, schema))
    try:
        ids = storage.ensure_sources([SOURCE])
        storage._prepare_append({ids[SOURCE]: [rows[0][0], rows[-1][0]]})
    finally:
        storage.close()
    conn = psycopg2.connect(**server.connect_kwargs(),  # the store's session settings
                            options=f"-c search_path={schema} -c synchronous_commit=on")
    try:
        began = time.perf_counter()
        with conn, conn.cursor() as cur:
            copy_into(cur, log_table(ids[SOURCE]), rows)
        return time.perf_counter() - began
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 windows, 1 repeat")
    parser.add_argument("--windows", type=int, default=100_000)
    parser.add_argument("--events-per-window", type=int, default=1)
    parser.add_argument("--event-bytes", type=int, default=500)
    parser.add_argument("--update-ratio", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    if args.quick:
        args.windows, args.repeat = 20_000, 1
    rows = args.windows * args.events_per_window
    keys = max(1, math.ceil(rows * (1 - args.update_ratio)))
    uri = (f"synthetic://?rate=0&limit={args.windows}&keys={keys}"
           f"&event_bytes={args.event_bytes}&events_per_window={args.events_per_window}"
           f"&update_ratio={args.update_ratio}&source={SOURCE}")
    capacity_mb = math.ceil(rows * (args.event_bytes + 64) * 1.2 / (1 << 20)) + 16
    print(f"Python {platform.python_version()}; {code_version(CODE)}; {args.windows:,} windows "
          f"of {args.events_per_window} events of {args.event_bytes} bytes ({rows:,} rows), "
          f"update ratio {args.update_ratio}; best of {args.repeat}")
    alone: list[ProducerRun] = []
    together: list[ProducerRun] = []
    copies: list[float] = []
    with postgres() as server, RelayProcess(uri, capacity_mb) as relay:
        fill = relay.wait_for_scn(args.windows, timeout=args.timeout)
        print(f"relay filled in {fill:.1f} s")
        rows_back: list[tuple[int, int, StoredEvent]] = []
        for i in range(args.repeat):
            run = asyncio.run(run_producer(fresh_schema(server, "bench_ingest_a"), relay,
                                           args.windows, rows, with_applier=False,
                                           timeout=args.timeout))
            alone.append(run)
            if not rows_back:
                rows_back = read_rows(server, "bench_ingest_a")
                if len(rows_back) != rows:
                    raise AssertionError(f"the log holds {len(rows_back)} rows, not {rows}")
            copies.append(raw_copy(server, "bench_ingest_ref", rows_back))
            run2 = asyncio.run(run_producer(fresh_schema(server, "bench_ingest_b"), relay,
                                            args.windows, rows, with_applier=True,
                                            timeout=args.timeout))
            together.append(run2)
            print(f"  round {i + 1}: producer alone {run.producer_rate:,.0f} rows/s "
                  f"({run.batches} batches; this process {run.cpu_cores:.2f} cores, relay "
                  f"{run.relay_cores:.2f}, other {run.machine_other_cores:.2f}), applier "
                  f"alone {run.applier_rate:,.0f} rows/s; raw COPY "
                  f"{rows / copies[-1]:,.0f} rows/s (producer / raw COPY "
                  f"{run.producer_rate * copies[-1] / rows:.2f}); producer with applier "
                  f"{run2.producer_rate:,.0f} rows/s, applier lag then "
                  f"{run2.applier_lag_scn} SCNs / {run2.applier_lag_rows} rows, caught up "
                  f"{run2.applier_s - run2.producer_s:.2f} s later", flush=True)
    best_alone = min(alone, key=lambda r: r.producer_s)
    best_together = min(together, key=lambda r: r.producer_s)
    best_applier = min(alone, key=lambda r: r.applier_s)
    copy_rate = rows / min(copies)
    print()
    print("| figure | rows/s | ratio |")
    print("|---|---:|---:|")
    print(f"| raw COPY, one statement (reference) | {copy_rate:,.0f} | 1.00 |")
    print(f"| producer alone, start to SCN {args.windows:,} | "
          f"{best_alone.producer_rate:,.0f} | **{best_alone.producer_rate / copy_rate:.2f}** "
          "(goal >= 0.6) |")
    print(f"| producer with the applier running | {best_together.producer_rate:,.0f} | "
          f"{best_together.producer_rate / copy_rate:.2f} |")
    print(f"| applier alone over the full log | {best_applier.applier_rate:,.0f} | "
          f"{best_applier.applier_rate / best_alone.producer_rate:.2f} of the producer |")
    print(f"| applier with the producer (start to SCN {args.windows:,}) | "
          f"{best_together.applier_rate:,.0f} | "
          f"{best_together.applier_rate / best_together.producer_rate:.2f} of the producer |")
    print()
    print(f"applier lag when the producer reached SCN {args.windows:,} (best producer run): "
          f"{best_together.applier_lag_scn:,} SCNs, {best_together.applier_lag_rows:,} rows; "
          f"caught up {best_together.applier_s - best_together.producer_s:.2f} s later")


if __name__ == "__main__":
    main()
