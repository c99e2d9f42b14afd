"""PostgreSQL logical decoding fetcher (``postgresql://``, issue 18): throughput against a
raw replication read of the same slot range, the writers' cost of capture (logical vs
triggers vs none), and commit -> ``on_data_event`` latency, as ratios measured in one run.

    .venv/bin/python benchmarks/fetcher_pg_logical.py [--quick] [--rows 200000]
        [--txn-rows 100] [--repeat 2] [--pgbench-seconds 20] [--rounds 2] [--clients 4]
        [--scale 1] [--rate 1000] [--latency-seconds 20] [--skip-throughput]
        [--skip-writers] [--skip-latency]

``--quick`` (under a minute): 20,000 rows, one round of 4 s pgbench runs, 5 s of latency.

Setup: a throwaway PostgreSQL 15 started as the test fixture starts it (``_pg.py``:
``wal_level = logical``; fsync, synchronous_commit and full_page_writes off), each part
in a database of its own, made ready by ``databus pg setup``.

1. **Fetcher throughput.** Table ``items`` (bigint key, int, varchar, numeric(12,2),
   smallint, double, nullable varchar, timestamp: rows of about 90 bytes of text);
   ``--rows`` rows inserted after the slot was created, in transactions of
   ``--txn-rows`` rows (one ``INSERT ... SELECT generate_series`` each). Then the slot is
   copied (``pg_copy_logical_replication_slot``) once per reader and round, so every
   reader reads the very same range from the same start. Readers, each timed from its
   connect to the last transaction's Commit, alternating their order in each round:

   - ``raw`` (reference): psycopg2 ``LogicalReplicationConnection``,
     ``start_replication(decode=False)`` with the fetcher's options (pgoutput protocol
     1, the publication, messages on), ``read_message`` until it has seen as many
     Commit messages as transactions were written; bytes consumed, nothing decoded
     (it looks at the first byte of each message only);
   - ``fetcher``: ``LogicalFetcher.run`` in this process (preflight, catalog look-ups,
     the pgoutput decoder, the row conversion, Avro and the event encoding) into a sink
     that only counts ``append`` and ``end_window`` and stops it at the last window;
   - ``fetcher+buffer`` (context): the same into a real relay ``EventBuffer``.

   Every reader must end at the same commit LSN (checked), the fetchers with one window
   per transaction and one event per row. Figure: fetcher rows/s / raw rows/s (goal
   >= 0.5), best round of each.

2. **Writers' cost.** Three databases made alike by ``pgbench -i -s SCALE`` (plus
   ``hid bigserial PRIMARY KEY`` on ``pgbench_history``, which has no key): ``none``,
   ``logical`` (``databus pg setup``; a ``databus relay`` process reading the slot runs
   during its pgbench runs) and ``trigger`` (``databus txlog install``; a relay reading
   ``postgresql+txlog://`` runs during its runs). ``pgbench -n -c CLIENTS -j 2 -T S``
   (TPC-B-like, simple protocol, the server's asynchronous commit) on each in turn,
   ``--rounds`` rounds, the order reversed every other round. Relays start from
   ``start=latest`` and each run begins once its relay has caught up; after the run the
   time the relay took to capture the last transaction is noted (a capture that keeps
   up only by slowing the writers shows there). Figures: tps logical / tps none,
   tps trigger / tps none, tps logical / tps trigger (the mean over rounds; each
   round's own ratios are printed).

3. **Latency.** Table ``lat(id bigserial, sent_us bigint, pad text)``, a relay reading
   it and a ``DatabusClient`` in this process (``start_from="latest"``, defaults
   otherwise). ``pgbench -R RATE -c 2 -j 2 -f lat.sql`` writes single-row
   transactions at a fixed rate with ``synchronous_commit = on`` (the server's default
   here is off, whose WAL reaches logical decoding only at the WAL writer's next round,
   up to 200 ms later), each row stamped with ``clock_timestamp()`` in microseconds
   just before it is written; ``on_data_event`` notes the wall time first thing. Same
   machine, same clock. The first 2 s are left out. Reported: p50, p90, p99, max,
   missing rows (must be 0).

Quietness: load averages (``os.getloadavg()``) before and after, the top CPU users by
``ps`` at the end, and per phase the cores used by this process (with its children:
pgbench, relays), by PostgreSQL and by everything else ("other"; steal apart).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the scripts run as benchmarks/x.py: make ``tests`` importable
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg2  # noqa: E402
import psycopg2.extras  # noqa: E402
from _pg import PostgresServer, postgres  # noqa: E402
from _relay_proc import CLK_TCK, RelayProcess, code_version, machine_cpu  # noqa: E402

from databus.cli import main as databus_main  # noqa: E402
from databus.client import CallbackResult, Consumer, DatabusClient, DataEvent  # noqa: E402
from databus.fetchers._api import FetcherContext  # noqa: E402
from databus.fetchers.postgres import LogicalFetcher  # noqa: E402
from databus.fetchers.postgres._pgoutput import format_lsn, parse_lsn  # noqa: E402
from databus.relay._buffer import EventBuffer  # noqa: E402
from databus.relay._catalog import RelayCatalog  # noqa: E402

CODE = ("fetchers", "relay", "databus", "client")
PG_BIN = Path(os.environ.get("DATABUS_PG_BIN", "/usr/lib/postgresql/15/bin"))
PGBENCH_TABLES = ("public.pgbench_accounts", "public.pgbench_branches",
                  "public.pgbench_tellers", "public.pgbench_history")


# -- the machine --------------------------------------------------------------------


def proc_cpu(pid: int, *, reaped: bool = True) -> float:
    """utime + stime of ``pid`` (and cutime + cstime: its children it has waited for)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLK_TCK


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            ppid = int(text[text.rindex(")") + 2:].split()[1])
            out.setdefault(ppid, []).append(int(entry))
    return out


def tree_cpu(pid: int, kids: dict[int, list[int]]) -> float:
    """CPU seconds of ``pid`` and its live descendants, plus the children each has
    reaped (pgbench and relays after they exit; PostgreSQL's closed backends)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += proc_cpu(p)
        todo += kids.get(p, [])
    return total


def postmaster_pid(server: PostgresServer) -> int:
    return int((server.datadir / "postmaster.pid").read_text().split("\n", 1)[0])


@dataclass
class Cores:
    """Cores used over a phase: this process and its children, PostgreSQL, the rest."""

    pg_pid: int
    start: tuple[float, ...] = ()
    cores: dict[str, float] = field(default_factory=dict)

    def _sample(self) -> tuple[float, ...]:
        kids = children_map()
        busy, steal, _ = machine_cpu()
        return (time.perf_counter(), tree_cpu(os.getpid(), kids),
                tree_cpu(self.pg_pid, kids), busy, steal)

    def __enter__(self) -> Cores:
        self.start = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        d = [b - a for a, b in zip(self.start, self._sample(), strict=True)]
        span = d[0]
        self.cores = {"bench+children": d[1] / span, "postgres": d[2] / span}
        self.cores["other"] = max(0.0, d[3] / span - sum(self.cores.values()))
        self.cores["steal"] = d[4] / span

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in self.cores.items()) + " cores"


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def top_cpu(n: int = 8) -> str:
    """The top CPU users by ps (%CPU is over each process's life)."""
    done = subprocess.run(["ps", "-eo", "pid,pcpu,etime,comm", "--sort=-pcpu"],
                          capture_output=True, text=True, check=False)
    return "\n".join("    " + line for line in done.stdout.splitlines()[: n + 1])


# -- PostgreSQL -------------------------------------------------------------------------


class Db:
    def __init__(self, server: PostgresServer, name: str) -> None:
        self.server = server
        self.name = name
        admin = psycopg2.connect(**server.connect_kwargs("postgres"))
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{name}"')
        admin.close()
        self.conn = self.connect()

    def connect(self) -> Any:
        # The benchmark's own statements commit synchronously: a marker transaction
        # reaches logical decoding at once, not at the WAL writer's next round.
        conn = psycopg2.connect(**self.server.connect_kwargs(self.name),
                                options="-c synchronous_commit=on")
        conn.autocommit = True
        return conn

    def run(self, sql: str, params: Any = None) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)

    def rows(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def one(self, sql: str, params: Any = None) -> Any:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
        return row[0] if row else None

    def url(self) -> str:
        return self.server.url(self.name)

    def logical_uri(self, tables: str, slot: str, publication: str | None = None,
                    **params: Any) -> str:
        extra = "".join(f"&{k}={v}" for k, v in params.items())
        return (f"{self.url()}?tables={tables}&slot={slot}&publication="
                f"{publication or slot}{extra}")

    def pg_setup(self, tables: str, slot: str) -> None:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = databus_main(["pg", "setup", "--source", self.logical_uri(tables, slot)])
        if code != 0:
            raise SystemExit(f"databus pg setup failed: {out.getvalue()}")

    def drop_slot(self, slot: str) -> None:
        """Drop a slot once the walsender of the connection just closed has exited."""
        deadline = time.monotonic() + 10
        while self.one("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                       (slot,)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.run("SELECT pg_drop_replication_slot(%s)", (slot,))

    def wait_flushed(self) -> str:
        """The WAL inserted so far, once flushed (logical decoding reads flushed WAL)."""
        end = self.one("SELECT pg_current_wal_insert_lsn()::text")
        while self.one("SELECT pg_current_wal_flush_lsn() < %s::pg_lsn", (end,)):
            time.sleep(0.02)
        return str(end)


def pgbench(db: Db, *args: str, env: dict[str, str] | None = None,
            timeout: float = 600) -> str:
    s = db.server
    cmd = [str(PG_BIN / "pgbench"), "-h", s.host, "-p", str(s.port), "-U", s.user, *args,
           db.name]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def tps_of(out: str) -> float:
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if found is None:
        raise SystemExit(f"no tps in pgbench's output:\n{out}")
    return float(found.group(1))


# -- 1. fetcher throughput ----------------------------------------------------------------

ITEMS = ("CREATE TABLE items (id bigint PRIMARY KEY, qty int NOT NULL, name varchar(40), "
         "price numeric(12,2), flag smallint, score double precision, note varchar(60), "
         "at timestamp(6))")
INSERT = ("INSERT INTO items SELECT g, g %% 1000, 'name-' || g, (g %% 100000) / 100.0, "
          "(g %% 100)::smallint, g / 7.0, CASE WHEN g %% 3 = 0 THEN NULL ELSE 'note ' || g "
          "END, timestamp '2026-01-01' + g * interval '1 second' "
          "FROM generate_series(%s, %s) g")


@dataclass
class Read:
    seconds: float
    cpu: float
    rows: int
    windows: int
    last_commit: int
    nbytes: int = 0


def raw_read(db: Db, slot: str, txns: int) -> Read:
    """The reference: the slot's pgoutput messages consumed, not decoded."""
    t0, c0 = time.perf_counter(), time.process_time()
    conn = psycopg2.connect(**db.server.connect_kwargs(db.name),
                            connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    cur.start_replication(slot_name=slot, decode=False, options={
        "proto_version": "1", "publication_names": "bench", "messages": "true"})
    commits = nbytes = 0
    payload = b""
    while commits < txns:
        msg = cur.read_message()
        if msg is None:
            select.select([conn], [], [], 0.5)
            continue
        payload = msg.payload
        nbytes += len(payload)
        if payload[0] == 0x43:  # 'C'
            commits += 1
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    conn.close()
    # Commit: 'C', flags (int8), commit LSN (int64), end LSN, timestamp.
    return Read(seconds, cpu, 0, commits, int.from_bytes(payload[2:10], "big"), nbytes)


class CountingSink:
    """A WindowSink that counts, and stops the fetcher at the ``windows``-th window."""

    def __init__(self, windows: int, stop: threading.Event,
                 buffer: EventBuffer | None = None) -> None:
        self.wanted = windows
        self.stop = stop
        self.buffer = buffer
        self.events = self.windows = 0
        self.scn = 0

    def start_window(self, scn: int) -> None:
        self.scn = scn
        if self.buffer is not None:
            self.buffer.start_window(scn)

    def append(self, event: bytes) -> None:
        self.events += 1
        if self.buffer is not None:
            self.buffer.append(event)

    def watermark(self, token: str) -> None:
        pass

    def end_window(self, timestamp_ns: int | None = None) -> int:
        self.windows += 1
        if self.windows >= self.wanted:
            self.stop.set()
        if self.buffer is not None:
            return self.buffer.end_window(timestamp_ns)
        return 0

    def rollback(self) -> None:
        if self.buffer is not None:
            self.buffer.rollback()


def fetcher_read(db: Db, slot: str, txns: int, tmp: Path, *, buffer: bool) -> Read:
    with tempfile.TemporaryDirectory(dir=tmp) as work:
        catalog = RelayCatalog(Path(work) / "catalog.json")
        event_buffer = EventBuffer(Path(work) / "bench.buf", 1 << 30) if buffer else None
        context = FetcherContext("bench", 0, catalog.for_buffer("bench", 0))
        if event_buffer is not None:  # msynced before each confirmation, as in a relay
            context = FetcherContext("bench", 0, catalog.for_buffer("bench", 0),
                                     flush_buffer=event_buffer.flush)
        stop = threading.Event()
        sink = CountingSink(txns, stop, event_buffer)
        uri = db.logical_uri("public.items", slot, "bench", heartbeat="off")
        t0, c0 = time.perf_counter(), time.process_time()
        fetcher = LogicalFetcher(uri, context)
        try:
            fetcher.run(sink, None, stop)
        finally:
            fetcher.close()
            if event_buffer is not None:
                event_buffer.close()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Read(seconds, cpu, sink.events, sink.windows, sink.scn)


def throughput(server: PostgresServer, args: argparse.Namespace, tmp: Path) -> None:
    print(f"\n== 1. fetcher throughput: {args.rows:,} rows in transactions of "
          f"{args.txn_rows}, best of {args.repeat} ==")
    db = Db(server, "bench_throughput")
    db.run(ITEMS)
    db.pg_setup("public.items", "bench")
    t0 = time.perf_counter()
    txns = 0
    for lo in range(1, args.rows + 1, args.txn_rows):
        db.run(INSERT, (lo, min(lo + args.txn_rows, args.rows + 1) - 1))
        txns += 1
    db.wait_flushed()
    wal = db.one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM "
                 "pg_replication_slots WHERE slot_name = 'bench'")
    print(f"  wrote {args.rows:,} rows in {txns:,} transactions in "
          f"{time.perf_counter() - t0:.1f} s; the slot holds {wal / 1e6:.1f} MB of WAL")
    readers = ["raw", "fetcher", "fetcher+buffer"]
    for r in range(args.repeat):
        for reader in readers:
            slot = f"{reader}_{r}".replace("+", "_")
            db.run("SELECT pg_copy_logical_replication_slot('bench', %s)", (slot,))
    results: dict[str, list[Read]] = {name: [] for name in readers}
    with Cores(postmaster_pid(server)) as cores:
        for r in range(args.repeat):
            order = readers if r % 2 == 0 else readers[::-1]
            for reader in order:
                slot = f"{reader}_{r}".replace("+", "_")
                if reader == "raw":
                    read = raw_read(db, slot, txns)
                else:
                    read = fetcher_read(db, slot, txns, tmp, buffer=reader != "fetcher")
                    if read.rows != args.rows or read.windows != txns:
                        raise SystemExit(f"{reader}: {read.rows} events in {read.windows} "
                                         f"windows, expected {args.rows} in {txns}")
                results[reader].append(read)
                db.drop_slot(slot)
                extra = f", {read.nbytes / 1e6:.1f} MB of pgoutput" if read.nbytes else ""
                print(f"  round {r + 1} {reader:<15} {args.rows / read.seconds:>10,.0f} "
                      f"rows/s  {read.seconds:6.2f} s  cpu {read.cpu:6.2f} s  last commit "
                      f"{format_lsn(read.last_commit)}{extra}")
    ends = {read.last_commit for reads in results.values() for read in reads}
    if len(ends) != 1:
        raise SystemExit(f"the readers did not end at the same commit: {ends}")
    print(f"  phase: {cores}")
    best = {name: max(args.rows / r.seconds for r in reads) for name, reads in results.items()}
    per_cpu = {name: max(args.rows / max(r.cpu, 1e-9) for r in reads)
               for name, reads in results.items()}
    print()
    print("  | reader | rows/s (best) | ratio to raw | rows per CPU-second of this process |")
    print("  |---|---:|---:|---:|")
    for name in readers:
        print(f"  | {name} | {best[name]:,.0f} | {best[name] / best['raw']:.2f} | "
              f"{per_cpu[name]:,.0f} |")
    ratio = best["fetcher"] / best["raw"]
    # Rates over the same rows: the ratio of rates is the inverse ratio of times.
    rounds = ", ".join(f"{raw.seconds / ours.seconds:.2f}"
                       for raw, ours in zip(results["raw"], results["fetcher"], strict=True))
    print(f"\n  fetcher / raw = {ratio:.2f} (rounds: {rounds}); goal >= 0.5: "
          f"{'met' if ratio >= 0.5 else 'missed'}")


# -- 2. writers' cost ---------------------------------------------------------------------


class CaptureRelay:
    """A ``databus relay`` process capturing one mode's database while its pgbench runs."""

    def __init__(self, db: Db, mode: str) -> None:
        self.db = db
        self.mode = mode
        tables = ",".join(PGBENCH_TABLES)
        if mode == "logical":
            uri = db.logical_uri(tables, "pgb", start="latest", heartbeat_s=1)
        else:
            uri = db.url().replace("postgresql://", "postgresql+txlog://", 1) + \
                f"?tables={tables}&start=latest"
        self.relay = RelayProcess(uri, capacity_mb=512)

    def __enter__(self) -> CaptureRelay:
        self.relay.start()
        # Caught up with what was written before (other databases' WAL, for the slot).
        self.wait_caught_up(timeout=60)
        return self

    def wait_caught_up(self, timeout: float = 300) -> float:
        """Seconds until the relay holds every transaction committed so far: a marker
        transaction is committed (a no-op update of a captured row) and awaited; windows
        come in commit order, so everything before it is in the buffer then."""
        t0 = time.perf_counter()
        before = parse_lsn(self.db.one("SELECT pg_current_wal_insert_lsn()::text"))
        self.db.run("UPDATE pgbench_branches SET filler = filler WHERE bid = 1")
        while True:
            status = self.relay.buffer_status()
            max_scn = status["max_scn"]
            if self.mode == "logical":
                done = max_scn is not None and max_scn >= before
            else:
                pending = self.db.one("SELECT count(*) FROM databus_txlog WHERE scn IS NULL")
                top = self.db.one("SELECT max(scn) FROM databus_txlog")
                done = pending == 0 and max_scn is not None and max_scn >= top
            if done:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"the {self.mode} relay did not catch up: {status}; log: "
                                 f"{self.relay.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.relay.stop()


def writers(server: PostgresServer, args: argparse.Namespace) -> None:
    print(f"\n== 2. writers: pgbench -c {args.clients} -j 2 -T {args.pgbench_seconds:g} "
          f"(scale {args.scale}), {args.rounds} round(s) ==")
    modes = ["none", "logical", "trigger"]
    dbs: dict[str, Db] = {}
    tables = ",".join(PGBENCH_TABLES)
    for mode in modes:
        db = dbs[mode] = Db(server, f"bench_pgbench_{mode}")
        pgbench(db, "-i", "-q", "-s", str(args.scale))
        db.run("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
    dbs["logical"].pg_setup(tables, "pgb")
    with contextlib.redirect_stdout(io.StringIO()):
        code = databus_main(["txlog", "install", "--source", dbs["trigger"].url().replace(
            "postgresql://", "postgresql+txlog://", 1) + f"?tables={tables}"])
    if code != 0:
        raise SystemExit("databus txlog install failed")
    for db in dbs.values():
        db.run("VACUUM ANALYZE")
    tps: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        order = modes if r % 2 == 0 else modes[::-1]
        for mode in order:
            db = dbs[mode]
            capture: contextlib.AbstractContextManager[Any] = (
                CaptureRelay(db, mode) if mode != "none" else contextlib.nullcontext())
            with capture as relay, Cores(postmaster_pid(server)) as cores:
                relay_cpu = relay.relay.cpu_seconds() if relay is not None else 0.0
                t0 = time.perf_counter()
                out = pgbench(db, "-n", "-c", str(args.clients), "-j", "2", "-T",
                              str(args.pgbench_seconds))
                behind = relay.wait_caught_up() if relay is not None else 0.0
                if relay is not None:
                    relay_cpu = ((relay.relay.cpu_seconds() - relay_cpu)
                                 / (time.perf_counter() - t0))
            tps[mode].append(tps_of(out))
            extra = (f"; of which the relay {relay_cpu:.2f}; it caught up {behind:.1f} s "
                     "after the run" if relay else "")
            print(f"  round {r + 1} {mode:<8} {tps[mode][-1]:>9,.0f} tps ({cores}{extra})")
        t = {m: tps[m][-1] for m in modes}
        print(f"  round {r + 1} ratios: logical/none {t['logical'] / t['none']:.2f}, "
              f"trigger/none {t['trigger'] / t['none']:.2f}, logical/trigger "
              f"{t['logical'] / t['trigger']:.2f}")
    mean = {m: sum(v) / len(v) for m, v in tps.items()}
    print()
    print("  | capture | tps (mean) | / none | / trigger |")
    print("  |---|---:|---:|---:|")
    for mode in modes:
        print(f"  | {mode} | {mean[mode]:,.0f} | {mean[mode] / mean['none']:.2f} | "
              f"{mean[mode] / mean['trigger']:.2f} |")
    for db in dbs.values():
        db.conn.close()


# -- 3. latency ---------------------------------------------------------------------------


class Recorder(Consumer):
    def __init__(self) -> None:
        self.samples: list[tuple[int, int, int]] = []  # (received us, sent us, id)

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        received = time.time_ns() // 1000
        assert event.value is not None
        self.samples.append((received, event.value["sent_us"], event.value["id"]))
        return CallbackResult.SUCCESS


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(server: PostgresServer, args: argparse.Namespace, tmp: Path) -> None:
    warmup = 2.0
    print(f"\n== 3. latency: {args.rate:,} single-row transactions/s for "
          f"{args.latency_seconds:g} s (+{warmup:g} s warm-up), commit -> on_data_event ==")
    db = Db(server, "bench_latency")
    db.run("CREATE TABLE lat (id bigserial PRIMARY KEY, sent_us bigint NOT NULL, "
           "pad text)")
    db.pg_setup("public.lat", "lat")
    script = tmp / "lat.sql"
    script.write_text("INSERT INTO lat (sent_us, pad) VALUES ((extract(epoch FROM "
                      "clock_timestamp()) * 1000000)::bigint, repeat('x', 100));\n")
    recorder = Recorder()
    with RelayProcess(db.logical_uri("public.lat", "lat"), capacity_mb=256) as relay:
        # A first row, so that the relay knows the table before the client starts (a
        # client waiting for a table to appear would start at the latest window then,
        # after the first rows of the run).
        db.run("INSERT INTO lat (sent_us, pad) VALUES (0, 'seed')")
        while relay.buffer_status()["max_scn"] is None:
            time.sleep(0.05)
        client = DatabusClient([relay.url], sources=["public.lat"], start_from="latest")
        client.register(recorder)
        thread = threading.Thread(target=client.run, name="client", daemon=True)
        thread.start()
        time.sleep(1.5)  # connected and long-polling
        start_us = time.time_ns() // 1000
        relay_cpu = relay.cpu_seconds()
        t0 = time.perf_counter()
        with Cores(postmaster_pid(server)) as cores:
            out = pgbench(db, "-n", "-R", str(args.rate), "-c", "2", "-j", "2", "-T",
                          str(round(args.latency_seconds + warmup)), "-f", str(script),
                          env={"PGOPTIONS": "-c synchronous_commit=on"})
            written = {int(i) for (i,) in db.rows(
                "SELECT id FROM lat WHERE sent_us >= %s", (start_us,))}
            deadline = time.monotonic() + 30
            while (sum(1 for _r, s, _i in recorder.samples if s >= start_us) < len(written)
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            relay_cpu = (relay.cpu_seconds() - relay_cpu) / (time.perf_counter() - t0)
        client.stop()
        thread.join(30)
    cut = start_us + int(warmup * 1e6)
    lat_ms = [(r - s) / 1000 for r, s, _i in recorder.samples if s >= cut]
    seen = {i for _r, s, i in recorder.samples if s >= start_us}
    missing = sorted(written - seen)
    print(f"  pgbench: {tps_of(out):,.0f} tx/s written; {len(written):,} rows, "
          f"{len(seen):,} seen, missing {len(missing)}"
          + (f" (ids {missing[:10]})" if missing else ""))
    print(f"  phase: {cores}, of which the relay {relay_cpu:.2f}")
    print()
    print("  | figure | p50 | p90 | p99 | max | samples |")
    print("  |---|---:|---:|---:|---:|---:|")
    print(f"  | commit -> on_data_event, ms | {percentile(lat_ms, 0.5):.1f} | "
          f"{percentile(lat_ms, 0.9):.1f} | {percentile(lat_ms, 0.99):.1f} | "
          f"{max(lat_ms):.1f} | {len(lat_ms):,} |")
    db.conn.close()


# -- main ---------------------------------------------------------------------------------


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="databus-bench-pglogical-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="20,000 rows, one round of 4 s pgbench runs, 5 s of latency")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--txn-rows", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--pgbench-seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--latency-seconds", type=float, default=20)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-writers", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeat, args.rounds = 20_000, 1, 1
        args.pgbench_seconds, args.latency_seconds = 4, 5
    args.pgbench_seconds = round(args.pgbench_seconds)
    print(f"Python {platform.python_version()}; {code_version(CODE)}; {os.cpu_count()} "
          f"cores; before: {load()}")
    print(top_cpu())
    t0 = time.perf_counter()
    with workdir() as tmp, postgres() as server:
        if not args.skip_throughput:
            throughput(server, args, tmp)
        if not args.skip_writers:
            writers(server, args)
        if not args.skip_latency:
            latency(server, args, tmp)
    print(f"\nafter {time.perf_counter() - t0:.0f} s: {load()}")
    print(top_cpu())


if __name__ == "__main__":
    main()
