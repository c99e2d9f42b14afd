"""Replicator throughput as a ratio of a raw COPY, and apply lag at 1,000 source
transactions/s (issue 19, "Benchmarks").

    .venv/bin/python benchmarks/replicate.py [--quick] [--rows 200000] [--keys 20000]
        [--events-per-window 10] [--event-bytes 500] [--batch-rows 1000,5000,20000]
        [--repeat 2] [--lag-seconds 20] [--lag-batch-ms 500,100] [--skip-lag]
        [--skip-throughput] [--skip-copy] [--copy-rows 1000000] [--copy-batch-rows 20000]
        [--copy-merge-too]

Setup: a throwaway PostgreSQL 15 started as the test fixture starts it (``_pg.py``:
fsync, synchronous_commit and full_page_writes off) and a ``databus relay`` child
process with a synthetic fetcher (``_relay_proc.py``). The replicator runs in this
process (``Replicator.run_async``, as ``databus replicate`` runs it, with the default
``max_request_bytes``), the table ``bench.rows`` keyed by ``key = ["id"]`` in its table
config (the synthetic schema carries no key hint), into a fresh target schema per run.

**Throughput.** The relay's buffer is filled before anything is timed:
``synthetic://?rate=0&limit=W&keys=K&events_per_window=E&event_bytes=B`` with
``update_ratio = 1 - K/N`` (N = W * E events, every key inserted once, the rest updates
of keys already issued; no deletes). A replicator starts on an empty schema and is
timed from its start (connect, schemas, CREATE TABLE included) to the commit of the
batch that records SCN W in ``databus_replication_state``. Figures: source events/s
(N / time: what it consumed) and rows applied/s (the rows of its batches after
latest-per-key folding within a batch: fewer than N, more than K).

Reference, in the same run, between the replicator runs: the same N rows (id, seq,
op_note, payload: decoded once from the relay with ``DatabusClient``) with psycopg2's
``copy_expert``, once in text format (written by the target's own ``copy_text``) and
once in binary format (the target's ``copy_binary``, issue 30), the faster of the two
being the reference; one COPY and one transaction, timed from the encoding to the
commit, into a fresh table of the same columns and types as the replicator's (``CREATE
TABLE ... (LIKE ...)``) with a non-unique btree index on ``id`` in place of the primary
key (N rows over K keys cannot go under a unique key). Second reference, for context:
the K rows of the final state into a table exactly like the replicator's (``INCLUDING
ALL``: the primary key).
The ratio reported against the goal (>= 0.5) is replicator events/s / COPY rows/s.

**Apply lag.** A relay fed at ``rate=1000`` one-event windows per second (1,000 source
transactions/s, 100,000 keys, half updates, ``--event-bytes``); a replicator applying
into a fresh schema. Lag of a window = wall time right after the target's COMMIT of
the batch that holds it returned - the window's source timestamp (the synthetic
fetcher stamps it with ``time.time_ns()`` as it generates it, in the relay process on
this machine: one clock). Windows whose source time is within ``--lag-warmup`` seconds
of the replicator's start are left out (its catch-up), then ``--lag-seconds`` of
windows are measured: p50, p90, p99, max. One run per ``--lag-batch-ms`` setting.

**Initial copy** (issue 30). A source database (``dump_pg.prepare``: ``public.items``,
``--copy-rows`` rows of 8 columns: bigint key, integer, varchar(16), numeric(12,2),
smallint, double precision, a varchar(100) NULL every third row, timestamp(6)) captured
by the PostgreSQL logical fetcher of a ``databus relay`` child process with an admin
token; the relay dumps the table into its buffer first (timed on its own, for context:
``POST /v1/admin/dumps`` until done). Then a replicator starts on an empty target
schema with no position, so it reads the buffer from its start: the dump's start
marker, its rows, its end marker. Timed from the replicator's start (connect, schemas,
CREATE TABLE included) to the commit of the batch that records the buffer's max SCN;
the target table is then checked against the source (count and an aggregate of every
column). Reference, same run: the same rows, read once from the source (``COPY (SELECT
...) TO STDOUT``, text and binary), each loaded with one ``COPY ... FROM STDIN`` into a
fresh empty table exactly like the replicator's (``INCLUDING ALL``: its primary key),
timed from the COPY to its commit; the faster of the two formats is the reference.
Goal: replicator time <= 1.5 x the reference's. ``--copy-merge-too`` also times each
round with the straight copy turned off (staging table and ``INSERT ... ON CONFLICT``
for every batch, as before issue 30), for comparison.

Each figure is printed with the machine's load average and the CPU (cores) of this
process (the replicator), the relay, PostgreSQL (postmaster and backends) and the rest
of the machine, and steal, over the measured interval.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import os
import platform
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg2
from _pg import PostgresServer, fresh_schema, postgres
from _relay_proc import (
    RelayProcess,
    code_version,
    cpu_seconds,
    loadavg,
    machine_cpu,
    tree_cpu_seconds,
)

import databus.replicator._replicator as replicator_module
from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from databus.config import ReplicateConfig, ReplicatedTableConfig
from databus.replicator._replicator import Replicator
from databus.replicator.targets._pgcopy import binary_encoders, copy_binary
from databus.replicator.targets._postgres import PostgresTarget, copy_text

SOURCE = "bench.rows"
TABLE = "rows"
COLUMNS = ("id", "seq", "op_note", "payload")
CODE = ("replicator", "client", "databus")  # the code measured (uncommitted changes listed)


# -- what the replicator did, seen from inside ---------------------------------------------


class _Probe:
    """Shared with ``TimedApplyConsumer``: the SCN that ends a throughput run, the
    commit times of batches, and (for the lag run) the source time of every window."""

    def __init__(self, end_scn: int | None = None, record_windows: bool = False) -> None:
        self.end_scn = end_scn
        self.record_windows = record_windows
        self.done = threading.Event()
        self.done_at: float | None = None  # perf_counter at the commit reaching end_scn
        self.batches = 0
        # Time inside _flush_locked: since issue 30 the survivors' values are decoded and
        # converted there (Folder.materialize), then target.apply (COPY, merge, COMMIT).
        self.apply_s = 0.0
        self.rows = 0
        self.events = 0
        self.window_ts: dict[int, int] = {}  # scn -> source timestamp_ns
        self.lags: list[tuple[int, float]] = []  # (source ts ns, lag ms) per window


PROBE = _Probe()


class TimedApplyConsumer(replicator_module.ApplyConsumer):
    """The replicator's own consumer, noting each window's source time and each batch's
    commit time (right after ``target.apply`` returned: the COMMIT is done)."""

    def on_data_event(self, event: DataEvent) -> Any:
        if PROBE.record_windows and event.scn not in PROBE.window_ts:
            PROBE.window_ts[event.scn] = event.timestamp_ns
        return super().on_data_event(event)

    def _flush_locked(self) -> bool:
        before = self.stats.batches
        batch = self.folder.batch
        t0 = time.perf_counter()
        ok = super()._flush_locked()
        if self.stats.batches == before:
            return ok
        now_ns, now = time.time_ns(), time.perf_counter()
        PROBE.apply_s += now - t0
        PROBE.batches += 1
        PROBE.rows += batch.rows
        PROBE.events += batch.events
        if PROBE.record_windows:
            applied = [scn for scn in PROBE.window_ts if scn <= batch.scn]
            for scn in applied:
                ts = PROBE.window_ts.pop(scn)
                PROBE.lags.append((ts, (now_ns - ts) / 1e6))
        if PROBE.end_scn is not None and batch.scn >= PROBE.end_scn and not PROBE.done.is_set():
            PROBE.done_at = now
            PROBE.done.set()
        return ok


# The replicator builds its consumer by this module-level name (Replicator.run_async).
replicator_module.ApplyConsumer = TimedApplyConsumer  # type: ignore[misc]


# -- CPU over an interval -------------------------------------------------------------------


def postmaster_pid(server: PostgresServer) -> int:
    return int((server.datadir / "postmaster.pid").read_text().split("\n", 1)[0])


@dataclass
class Cpu:
    """Cores used over an interval: this process, the relay, PostgreSQL, the rest."""

    relay_pid: int
    pg_pid: int
    start: tuple[float, ...] = ()
    cores: dict[str, float] = field(default_factory=dict)

    def _sample(self) -> tuple[float, ...]:
        busy, steal, _ = machine_cpu()
        return (time.perf_counter(), time.process_time(), cpu_seconds(self.relay_pid),
                tree_cpu_seconds(self.pg_pid), busy, steal)

    def begin(self) -> None:
        self.start = self._sample()

    def end(self) -> None:
        now = self._sample()
        d = [b - a for a, b in zip(self.start, now, strict=True)]
        span = d[0]
        self.cores = {"this process": d[1] / span, "relay": d[2] / span,
                      "postgres": d[3] / span}
        self.cores["other"] = max(0.0, d[4] / span - sum(self.cores.values()))
        self.cores["steal"] = d[5] / span

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in self.cores.items()) + " cores"


# -- the replicator ------------------------------------------------------------------------


def replicate_config(server: PostgresServer, relay: RelayProcess, schema: str, *,
                     batch_rows: int, batch_ms: int) -> ReplicateConfig:
    return ReplicateConfig(
        name="bench", relays=(relay.url,), target=f"{server.url()}?schema={schema}",
        target_schema=schema, batch_rows=batch_rows, batch_ms=batch_ms,
        tables=(ReplicatedTableConfig(source=SOURCE, target=TABLE, key=("id",)),))


def run_replicator(config: ReplicateConfig, until: threading.Event, timeout: float,
                   on_done: Any = None) -> Replicator:
    """Run a replicator in this thread until ``until`` is set (or ``timeout``);
    ``on_done()`` runs first, while the replicator and its target session still live."""
    rep = Replicator(config)
    failed: list[BaseException] = []

    def watch() -> None:
        if not until.wait(timeout):
            failed.append(TimeoutError(f"replicator did not finish in {timeout} s"))
        elif on_done is not None:
            on_done()
        rep.stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        asyncio.run(rep.run_async())
    finally:
        until.set()
        watcher.join()
    if failed:
        raise failed[0]
    return rep


@dataclass
class ThroughputRun:
    batch_rows: int
    seconds: float
    events: int
    rows: int
    batches: int
    apply_s: float
    cpu: str
    load: str


def replicator_throughput(server: PostgresServer, relay: RelayProcess, end_scn: int,
                          events: int, batch_rows: int, batch_ms: int,
                          timeout: float) -> ThroughputRun:
    global PROBE
    schema = "bench_repl"
    fresh_schema(server, schema)
    config = replicate_config(server, relay, schema, batch_rows=batch_rows,
                              batch_ms=batch_ms)
    PROBE = _Probe(end_scn=end_scn)
    cpu = Cpu(relay.pid, postmaster_pid(server))
    cpu.begin()
    began = time.perf_counter()
    # CPU sampled as the end is seen, before the replicator (and its PostgreSQL
    # backend, whose CPU would leave the count with it) stops.
    run_replicator(config, PROBE.done, timeout, on_done=cpu.end)
    if PROBE.done_at is None:
        raise RuntimeError("the replicator stopped before reaching the relay's max SCN")
    seconds = PROBE.done_at - began
    recorded = target_state(server, schema)
    if recorded != end_scn:
        raise AssertionError(f"the target recorded SCN {recorded}, not {end_scn}")
    if PROBE.events != events:
        raise AssertionError(f"the replicator folded {PROBE.events} events, not {events}")
    return ThroughputRun(batch_rows, seconds, events, PROBE.rows, PROBE.batches,
                         PROBE.apply_s, str(cpu), loadavg())


def target_state(server: PostgresServer, schema: str) -> int | None:
    conn = psycopg2.connect(**server.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT scn FROM {schema}.databus_replication_state"
                        " WHERE replication = 'bench'")
            row = cur.fetchone()
            return None if row is None else int(row[0])
    finally:
        conn.close()


# -- the reference: raw COPY ---------------------------------------------------------------


class Collector(Consumer):
    """Decodes the relay's events once: (id, seq, op_note, payload) per event."""

    def __init__(self, end_scn: int) -> None:
        self.end_scn = end_scn
        self.rows: list[tuple[Any, ...]] = []
        self.client: DatabusClient | None = None

    def on_data_event(self, event: DataEvent) -> None:
        v = event.value
        assert v is not None
        self.rows.append((v["id"], v["seq"], v["op_note"], v["payload"]))

    def on_end_data_event_sequence(self, scn: int) -> None:
        if scn >= self.end_scn and self.client is not None:
            self.client.stop()


def source_rows(relay: RelayProcess, end_scn: int) -> list[tuple[Any, ...]]:
    collector = Collector(end_scn)
    client = DatabusClient([relay.url], sources=[SOURCE],
                           checkpoint_store=MemoryCheckpointStore(),
                           max_request_bytes=4 << 20)
    collector.client = client
    client.register(collector)
    asyncio.run(client.run_async())
    return collector.rows


def raw_copy(server: PostgresServer, relay: RelayProcess, rows: list[tuple[Any, ...]], *,
             keyed: bool, fmt: str = "text") -> tuple[float, str, str]:
    """Seconds to COPY ``rows`` into a fresh table shaped like the replicator's (which
    must exist in ``bench_repl``): ``keyed``, exactly like it (primary key); else the
    same columns with a non-unique index on id. Returns (seconds, cpu, load)."""
    schema = "bench_ref"
    fresh_schema(server, schema)
    conn = psycopg2.connect(**server.connect_kwargs(), options="-c TimeZone=UTC")
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"CREATE SCHEMA {schema}")
            if keyed:
                cur.execute(f"CREATE TABLE {schema}.{TABLE} (LIKE bench_repl.{TABLE}"
                            " INCLUDING ALL)")
            else:
                cur.execute(f"CREATE TABLE {schema}.{TABLE} (LIKE bench_repl.{TABLE})")
                cur.execute(f"CREATE INDEX ON {schema}.{TABLE} (id)")
        cpu = Cpu(relay.pid, postmaster_pid(server))
        cpu.begin()
        began = time.perf_counter()
        with conn, conn.cursor() as cur:
            if fmt == "binary":  # the replicator's own binary rows (_pgcopy.py)
                cur.execute("SELECT t.typname FROM pg_attribute a JOIN pg_type t ON t.oid ="
                            " a.atttypid WHERE a.attrelid = %s::regclass AND a.attnum > 0"
                            " AND NOT a.attisdropped ORDER BY a.attnum",
                            (f"{schema}.{TABLE}",))
                encoders = binary_encoders([r[0] for r in cur.fetchall()])
                assert encoders is not None
                data = copy_binary(rows, encoders)
                assert data is not None
                cur.copy_expert(f"COPY {schema}.{TABLE} ({', '.join(COLUMNS)}) FROM STDIN"
                                " (FORMAT binary)", io.BytesIO(data), size=1 << 18)
            else:
                text = copy_text(rows)
                assert text is not None
                cur.copy_expert(f"COPY {schema}.{TABLE} ({', '.join(COLUMNS)}) FROM STDIN",
                                io.BytesIO(text.encode("utf-8")), size=1 << 18)
        seconds = time.perf_counter() - began
        cpu.end()
        return seconds, str(cpu), loadavg()
    finally:
        conn.close()


def final_rows(server: PostgresServer) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(**server.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {', '.join(COLUMNS)} FROM bench_repl.{TABLE} ORDER BY id")
            return [(i, s, n, bytes(p)) for i, s, n, p in cur.fetchall()]
    finally:
        conn.close()


def check_equal(server: PostgresServer, rows: list[tuple[Any, ...]]) -> None:
    """The replicated table holds the latest row of every key: the run counts."""
    latest: dict[int, tuple[Any, ...]] = {}
    for row in rows:
        latest[row[0]] = row
    got = final_rows(server)
    want = [latest[k] for k in sorted(latest)]
    if got != want:
        raise AssertionError(f"the replicated table differs from the source's latest rows "
                             f"({len(got)} rows, {len(want)} expected)")


def throughput(server: PostgresServer, args: argparse.Namespace) -> None:
    windows = args.rows // args.events_per_window
    events = windows * args.events_per_window
    update_ratio = 1 - args.keys / events
    uri = (f"synthetic://?rate=0&limit={windows}&keys={args.keys}"
           f"&event_bytes={args.event_bytes}&events_per_window={args.events_per_window}"
           f"&update_ratio={update_ratio}&source={SOURCE}")
    capacity_mb = math.ceil(events * (args.event_bytes + 64) * 1.2 / (1 << 20)) + 16
    print(f"## Throughput: {windows:,} windows of {args.events_per_window} events of "
          f"{args.event_bytes} bytes ({events:,} events over {args.keys:,} keys, update "
          f"ratio {update_ratio:.3f}); batch_ms {args.batch_ms}; best of {args.repeat}")
    copies: list[float] = []
    by_format: dict[str, list[float]] = {"text": [], "binary": []}
    keyed_copies: list[float] = []
    runs: dict[int, list[ThroughputRun]] = {b: [] for b in args.batch_rows}
    with RelayProcess(uri, capacity_mb) as relay:
        fill = relay.wait_for_scn(windows, timeout=args.timeout)
        print(f"relay filled in {fill:.1f} s; {loadavg()}")
        t0 = time.perf_counter()
        rows = source_rows(relay, windows)
        print(f"decoded {len(rows):,} events from the relay with DatabusClient in "
              f"{time.perf_counter() - t0:.1f} s (for the reference)", flush=True)
        if len(rows) != events:
            raise AssertionError(f"{len(rows)} events read, {events} expected")
        for i in range(args.repeat):
            for batch_rows in args.batch_rows:
                run = replicator_throughput(server, relay, windows, events, batch_rows,
                                            args.batch_ms, args.timeout)
                runs[batch_rows].append(run)
                print(f"  round {i + 1}: replicator batch_rows={batch_rows}: "
                      f"{run.seconds:.2f} s, {events / run.seconds:,.0f} events/s, "
                      f"{run.rows / run.seconds:,.0f} rows applied/s ({run.rows:,} rows in "
                      f"{run.batches} batches, {run.apply_s / run.seconds:.0%} of the time in "
                      f"the flush: decode of survivors + target.apply); {run.cpu}; "
                      f"{run.load}", flush=True)
            check_equal(server, rows)  # the last run's table, against the source
            best_copy = math.inf
            for fmt in ("text", "binary"):
                seconds, cpu, load = raw_copy(server, relay, rows, keyed=False, fmt=fmt)
                best_copy = min(best_copy, seconds)
                by_format[fmt].append(seconds)
                print(f"  round {i + 1}: raw COPY ({fmt}) of {events:,} rows: {seconds:.2f} "
                      f"s, {events / seconds:,.0f} rows/s; {cpu}; {load}", flush=True)
            copies.append(best_copy)  # the faster format is the reference
            latest = {r[0]: r for r in rows}
            seconds, cpu, load = raw_copy(server, relay, list(latest.values()), keyed=True)
            keyed_copies.append(seconds)
            print(f"  round {i + 1}: raw COPY of the {len(latest):,} final rows (primary "
                  f"key): {seconds:.2f} s, {len(latest) / seconds:,.0f} rows/s; {cpu}; "
                  f"{load}", flush=True)
    copy_rate = events / min(copies)
    keyed_rate = args.keys / min(keyed_copies)
    print()
    text_rate = events / min(by_format["text"])
    print("| figure | events/s | rows applied/s | events/s ÷ COPY rows/s | ÷ text COPY "
          "(issue 19's reference) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| raw COPY, text format | {text_rate:,.0f} | - | {text_rate / copy_rate:.2f} | "
          "1.00 |")
    print(f"| raw COPY of the {events:,} rows, one statement, faster of text and binary "
          "(reference) | "
          f"{copy_rate:,.0f} | - | 1.00 | {copy_rate / text_rate:.2f} |")
    print(f"| raw COPY of the {args.keys:,} final rows into the keyed table (context) | "
          f"{keyed_rate:,.0f} | - | {keyed_rate / copy_rate:.2f} | "
          f"{keyed_rate / text_rate:.2f} |")
    for batch_rows, rs in runs.items():
        best = min(rs, key=lambda r: r.seconds)
        ratios = sorted(events / r.seconds / (events / c) for r, c in zip(rs, copies,
                                                                           strict=True))
        spread = (f" (per round {ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1
                  else "")
        print(f"| replicator, batch_rows={batch_rows} | {events / best.seconds:,.0f} | "
              f"{best.rows / best.seconds:,.0f} | **{events / best.seconds / copy_rate:.2f}**"
              f"{spread} (goal >= 0.5) | {events / best.seconds / text_rate:.2f} |")
    print()


# -- initial copy (issue 30) ------------------------------------------------------------


def copy_reference(server: PostgresServer, relay_pid: int, source_db: Any, columns: str,
                   rows: int, fmt: str) -> tuple[float, str, str]:
    """Seconds to COPY the source table's rows (read into memory first, in ``fmt``)
    into a fresh table exactly like the replicator's ``bench_copy.items``."""
    # The source's columns cast to the replicator's column types (a smallint source
    # column is an integer there: binary input must match the type).
    conn = psycopg2.connect(**server.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM"
                        " pg_attribute a WHERE a.attrelid = 'bench_copy.items'::regclass"
                        " AND a.attnum > 0 AND NOT a.attisdropped")
            types = dict(cur.fetchall())
    finally:
        conn.close()
    select = ", ".join(f"{c}::{types[c]}" for c in columns.split(", "))
    conn = source_db.connect()
    buf = io.BytesIO()
    try:
        with conn.cursor() as cur:
            option = " (FORMAT binary)" if fmt == "binary" else ""
            cur.copy_expert(f"COPY (SELECT {select} FROM public.items) TO STDOUT{option}",
                            buf)
    finally:
        conn.close()
    schema = "bench_copy_ref"
    fresh_schema(server, schema)
    conn = psycopg2.connect(**server.connect_kwargs(), options="-c TimeZone=UTC")
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"CREATE SCHEMA {schema}")
            cur.execute(f"CREATE TABLE {schema}.items (LIKE bench_copy.items INCLUDING ALL)")
        cpu = Cpu(relay_pid, postmaster_pid(server))
        cpu.begin()
        began = time.perf_counter()
        buf.seek(0)
        with conn, conn.cursor() as cur:
            option = " (FORMAT binary)" if fmt == "binary" else ""
            cur.copy_expert(f"COPY {schema}.items ({columns}) FROM STDIN{option}", buf,
                            size=1 << 18)
            cur.execute(f"SELECT count(*) FROM {schema}.items")
            assert cur.fetchone()[0] == rows
        seconds = time.perf_counter() - began
        cpu.end()
        return seconds, str(cpu), loadavg()
    finally:
        conn.close()


def table_digest(conn: Any, table: str, columns: str) -> tuple[Any, ...]:
    """Count and an aggregate of every column: equal tables give equal digests."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT count(*), md5(string_agg(t::text, '|' ORDER BY id)) FROM "
                    f"(SELECT {columns} FROM {table}) t")
        return tuple(cur.fetchone())


def initial_copy(server: PostgresServer, args: argparse.Namespace) -> None:
    global PROBE
    from _dumps import AdminRelay, relay_capacity_mb, run_dump
    from dump_pg import COLUMN_NAMES, prepare
    from dump_pg import SOURCE as ITEMS

    rows = args.copy_rows
    print(f"## Initial copy: {rows:,} rows of {ITEMS} dumped by the relay, then "
          f"replicated into an empty table; batch_rows {args.copy_batch_rows}; "
          f"best of {args.repeat}")
    db, load_s = prepare(server, "logical", rows, "off", None)
    print(f"source loaded in {load_s:.1f} s; {loadavg()}", flush=True)
    with AdminRelay(db.relay_uri(), relay_capacity_mb(rows)) as relay:
        dump = run_dump(relay, ITEMS, 20_000, postmaster_pid(server), db_tree=True)
        end_scn = int(relay.buffer_status()["max_scn"])
        print(f"relay dump of {dump.rows:,} rows: {dump.seconds:.1f} s "
              f"({dump.rate:,.0f} rows/s; not part of the figure); buffer max SCN "
              f"{end_scn}; {loadavg()}", flush=True)
        source = db.connect()
        try:
            want = table_digest(source, ITEMS, COLUMN_NAMES)
        finally:
            source.close()
        runs: list[float] = []
        merged: list[float] = []
        refs: dict[str, list[float]] = {"text": [], "binary": []}
        modes = ["straight", "merge"] if args.copy_merge_too else ["straight"]
        for i, mode in ((i, m) for i in range(args.repeat) for m in modes):
            # "merge": the straight copy turned off (staging table + INSERT ... ON
            # CONFLICT for every batch, as before issue 30), for comparison.
            PostgresTarget.straight_copy = mode == "straight"
            schema = "bench_copy"
            fresh_schema(server, schema)
            config = ReplicateConfig(
                name="bench", relays=(relay.url,), target=f"{server.url()}?schema={schema}",
                target_schema=schema, batch_rows=args.copy_batch_rows,
                batch_ms=args.batch_ms,
                tables=(ReplicatedTableConfig(source=ITEMS, target="items", key=("id",)),))
            PROBE = _Probe(end_scn=end_scn)
            cpu = Cpu(relay.pid, postmaster_pid(server))
            cpu.begin()
            began = time.perf_counter()
            run_replicator(config, PROBE.done, args.timeout, on_done=cpu.end)
            if PROBE.done_at is None:
                raise RuntimeError("the replicator stopped before the dump's end")
            seconds = PROBE.done_at - began
            (runs if mode == "straight" else merged).append(seconds)
            conn = psycopg2.connect(**server.connect_kwargs())
            try:
                got = table_digest(conn, f"{schema}.items", COLUMN_NAMES)
            finally:
                conn.close()
            if got != want:
                raise AssertionError(f"the replicated table differs from the source: "
                                     f"{got} != {want}")
            print(f"  round {i + 1}: replicator ({mode}): {seconds:.2f} s, {rows / seconds:,.0f} "
                  f"rows/s ({PROBE.batches} batches, {PROBE.apply_s / seconds:.0%} of the "
                  f"time in the flush: decode + apply); {cpu}; {loadavg()}", flush=True)
            if mode != "straight":
                continue
            for fmt in ("text", "binary"):
                ref, ref_cpu, load = copy_reference(server, relay.pid, db, COLUMN_NAMES,
                                                    rows, fmt)
                refs[fmt].append(ref)
                print(f"  round {i + 1}: raw COPY ({fmt}) of the {rows:,} rows into the "
                      f"keyed table: {ref:.2f} s, {rows / ref:,.0f} rows/s; {ref_cpu}; "
                      f"{load}", flush=True)
    best = min(runs)
    ref = min(min(refs["text"]), min(refs["binary"]))
    print()
    print("| figure | seconds | rows/s | ÷ raw COPY time |")
    print("|---|---:|---:|---:|")
    for fmt in ("text", "binary"):
        r = min(refs[fmt])
        print(f"| raw COPY ({fmt}) of the {rows:,} rows, keyed table | {r:.2f} | "
              f"{rows / r:,.0f} | {r / ref:.2f} |")
    ratios = sorted(r / min(a, b) for r, a, b in zip(runs, refs["text"], refs["binary"],
                                                     strict=True))
    spread = f" (per round {ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
    print(f"| replicator, initial copy by dump | {best:.2f} | {rows / best:,.0f} | "
          f"**{best / ref:.2f}**{spread} (goal <= 1.5) |")
    if merged:
        m = min(merged)
        print(f"| replicator, the straight copy off (staging + merge) | {m:.2f} | "
              f"{rows / m:,.0f} | {m / ref:.2f} |")
    PostgresTarget.straight_copy = True
    print()


# -- apply lag -----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def apply_lag(server: PostgresServer, args: argparse.Namespace) -> None:
    global PROBE
    uri = (f"synthetic://?rate=1000&keys=100000&event_bytes={args.event_bytes}"
           f"&events_per_window=1&update_ratio=0.5&source={SOURCE}")
    span = args.lag_warmup + args.lag_seconds
    capacity_mb = math.ceil(1000 * (span + 30) * (args.event_bytes + 64) / (1 << 20)) + 16
    print(f"## Apply lag: 1,000 one-event windows/s of {args.event_bytes} bytes, 100,000 "
          f"keys; {args.lag_warmup:g} s warm-up then {args.lag_seconds:g} s measured per "
          "setting")
    print()
    results = []
    for batch_ms in args.lag_batch_ms:
        # A fresh relay per setting: the replicator starts from the buffer's oldest
        # window (no checkpoint yet), so its catch-up stays one second of windows.
        with RelayProcess(uri, capacity_mb) as relay:
            relay.wait_for_scn(1000, timeout=args.timeout)
            schema = "bench_lag"
            fresh_schema(server, schema)
            config = replicate_config(server, relay, schema, batch_rows=args.lag_batch_rows,
                                      batch_ms=batch_ms)
            PROBE = _Probe(record_windows=True)
            stop = threading.Event()
            cpu = Cpu(relay.pid, postmaster_pid(server))
            start_ns = time.time_ns()
            scn0 = relay.buffer_status()["max_scn"]

            def measure(cpu: Cpu = cpu, stop: threading.Event = stop) -> None:
                time.sleep(args.lag_warmup)
                cpu.begin()
                time.sleep(args.lag_seconds)
                cpu.end()
                time.sleep(1.0)  # the last measured windows' batches commit
                stop.set()

            timer = threading.Thread(target=measure, daemon=True)
            timer.start()
            run_replicator(config, stop, span + 60)
            timer.join()
            scn1 = relay.buffer_status()["max_scn"]
            lo = start_ns + int(args.lag_warmup * 1e9)
            hi = lo + int(args.lag_seconds * 1e9)
            lags = [lag for ts, lag in PROBE.lags if lo <= ts < hi]
            if not lags:
                raise RuntimeError("no window applied in the measured interval")
            source_rate = (scn1 - scn0) / ((time.time_ns() - start_ns) / 1e9)
            row = (batch_ms, len(lags), statistics.median(lags), percentile(lags, 0.9),
                   percentile(lags, 0.99), max(lags), PROBE.batches, source_rate, str(cpu),
                   loadavg())
            results.append(row)
            print(f"  batch_ms={batch_ms}: {len(lags):,} windows, p50 {row[2]:.0f} ms, p90 "
                  f"{row[3]:.0f} ms, p99 {row[4]:.0f} ms, max {row[5]:.0f} ms; "
                  f"{PROBE.batches} batches in the run; source {source_rate:,.0f} "
                  f"windows/s; {cpu}; {row[9]}", flush=True)
    print()
    print("| batch_ms | windows | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch_ms, n, p50, p90, p99, top, *_ in results:
        print(f"| {batch_ms} | {n:,} | {p50:.0f} | {p90:.0f} | **{p99:.0f}** | {top:.0f} |")
    print()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="50,000 events over 5,000 keys, 1 repeat, 8 s of lag")
    parser.add_argument("--rows", type=int, default=200_000, help="source events")
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--events-per-window", type=int, default=10)
    parser.add_argument("--event-bytes", type=int, default=500)
    parser.add_argument("--batch-rows", type=_ints, default=[1000, 5000, 20000])
    parser.add_argument("--batch-ms", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--lag-seconds", type=float, default=20)
    parser.add_argument("--lag-warmup", type=float, default=3)
    parser.add_argument("--lag-batch-ms", type=_ints, default=[500, 100])
    parser.add_argument("--lag-batch-rows", type=int, default=5000)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-lag", action="store_true")
    parser.add_argument("--skip-copy", action="store_true")
    parser.add_argument("--copy-rows", type=int, default=1_000_000)
    parser.add_argument("--copy-batch-rows", type=int, default=20_000)
    parser.add_argument("--copy-merge-too", action="store_true",
                        help="also time the initial copy with the straight copy off")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.keys, args.repeat, args.lag_seconds = 50_000, 5_000, 1, 8
        args.copy_rows = 200_000
    print(f"Python {platform.python_version()}; {code_version(CODE)}; {os.cpu_count()} "
          f"cores; {loadavg()}")
    with postgres() as server:
        if not args.skip_throughput:
            throughput(server, args)
        if not args.skip_copy:
            initial_copy(server, args)
        if not args.skip_lag:
            apply_lag(server, args)


if __name__ == "__main__":
    main()
