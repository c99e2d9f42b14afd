"""Dumps (issue 13, DBLog watermarks, DESIGN 8.1; issue 29) of a MariaDB table through a
real relay: the dump rate as a ratio of a raw ``SELECT`` of the same table and of
``mydumper`` in the same run, what a running dump costs a writer of that table, and how
the time of a dump scales with ``chunk_rows`` and with ``parallelism``.

    .venv/bin/python benchmarks/dump.py [--quick] [--rows 1000000] [--repeat 2]
        [--chunk-rows 500,1000,2000,5000,10000,20000] [--default-chunk 10000]
        [--writer-seconds 15] [--writer-rates 0,300,1000] [--no-writer]
        [--buffer-pool-mb 512] [--mydumper-threads 1,2] [--mydumper-rows 100000]
        [--parallelism 1,2,4] [--parallelism-plot benchmarks/dump_parallelism.png]
        [--plot benchmarks/dump_chunk_rows.png] [--profile]

Setup: a throwaway MariaDB started as the test fixture starts it (ROW binlog, FULL row
image and row metadata, ``sync_binlog=0``, ``innodb_flush_log_at_trx_commit=2``), its
InnoDB buffer pool then resized online to ``--buffer-pool-mb`` (default 512 MB, so the
table and its writes stay in memory as on a production server; with 0 it keeps the
fixture's 64 MB, which a 1M-row table of ~120 MB does not fit: every full read then
evicts the pages the writer needs, and the writer waits for page reads and flushes,
whoever reads). One table ``bench.items`` of
``--rows`` rows with the 8 columns of ``fetcher_mysql.py`` (BIGINT key, INT,
VARCHAR(16), DECIMAL(12,2), SMALLINT, DOUBLE, a VARCHAR(100) that is NULL every third
row, DATETIME(6)), loaded with ``INSERT ... SELECT`` from MariaDB's sequence engine in
100,000-row transactions before any relay runs. ``databus dump setup --source URI``
creates the watermark table, as an operator would. Each dump runs on a fresh
``databus relay --config`` child process (``_relay_proc.RelayProcess``: one buffer big
enough for the whole dump, ``mysql://...?tables=bench.items&heartbeat_ms=100``, an
``admin_token``), started and caught up with the binlog before anything is timed.

Figures:

1. **Dump rate / raw SELECT.** Dump rows/s = rows dumped / seconds from ``POST
   /v1/admin/dumps`` (``{"sources": ["bench.items"], "chunk_rows": C}``) until ``GET
   /v1/dumps`` shows the dump ``done`` (polled every 50 ms; the relay's own
   ``finished_at - created_at`` is printed beside it). Reference, same run, same driver
   (pymysql, which the dump source uses), the connection opened beforehand: ``SELECT *
   FROM bench.items ORDER BY id`` streamed with an unbuffered cursor (``SSCursor``,
   ``fetchmany(10000)``), every value of every row touched. A second reference is the
   dump's own read without the dump: keyset pages of the same ``chunk_rows``
   (``WHERE id > last ORDER BY id LIMIT C``, buffered cursor, ``fetchall``). Each is
   the best of ``--repeat`` runs, the reference and the dump alternating, at
   ``--default-chunk`` (the relay's default, 10,000). Goal >= 0.5 (issue 13), >= 1.0
   (issue 29). The outside reference (issue 29), in the same alternation:
   ``mydumper --threads N`` (``--mydumper-threads``, default 1 and 2; the Debian package,
   ``make bench-deps``) of ``bench.items`` over TCP as the same user, ``--no-schemas
   --trx-consistency-only``, no compression, ``--rows`` ``--mydumper-rows`` (100,000: the
   table in chunks its threads share; without it one thread dumps a table), into a temp
   dir (under ``--relay-dir`` if given) removed afterwards, timed as a process from
   start to exit. Figure: dump rows/s / mydumper ``--threads 2`` rows/s (stretch goal
   >= 0.25); ``--threads 1`` beside it.
2. **Writer throughput during a dump / without** (goal >= 0.9) and 3. **writer p95
   (issue 29, at 300 txn/s) and p99 (issue 13) commit latency during a dump / without**
   (goal <= 2). A writer *process* (one pymysql connection) runs small transactions on
   ``bench.items``, a random key each: 50 % ``UPDATE`` of one row, 25 % ``DELETE`` of
   one row, 25 % ``INSERT ... ON DUPLICATE KEY UPDATE`` of a key an earlier delete
   removed (so the table keeps its size), each its own transaction (statement,
   ``COMMIT``). Three writers, ``--writer-rates``: 0 = as fast as it can (closed loop:
   one transaction after the other; this is the throughput figure), and fixed offered
   rates of 300 (issue 29's figure) and 1,000 transactions/s (open loop: each
   transaction has a scheduled start and its latency is counted from it, so a writer
   held up is charged for the transactions it could not start; its throughput is 1.0
   unless it falls behind: these are the latency figures, which say whether writers are
   ever held up). Per writer, four periods of ``--writer-seconds`` (after one second of
   warm-up each): without a dump, with a dump, without again, and a control, with a
   plain reader instead of the dump; "without" is the two periods without a dump pooled
   (drift on a shared machine cancels out). During the "with" period a dump of
   ``bench.items`` at ``--default-chunk`` runs all the time: started before the period
   and, if it ends, started again at once (cancelled after it). The control is a second
   process reading the table in keyset pages of the same size over and over
   (``raw_pages``: a dump without watermarks and without a relay): what any reader of
   the table costs the writer on this machine. The relay runs in every period, its
   fetcher carrying the writer's changes. Printed per period: CPU of the relay, MariaDB,
   the writer (and the reader) and everything else, in cores (this is a 2-core machine
   that also runs the source, so a dump competes with the writer for CPU even though it
   takes no lock); the increase of the server's lock wait counters
   (``Innodb_row_lock_waits``, ``Innodb_row_lock_time``, ``Table_locks_waited``): a
   writer that waited for a lock shows there; the fetcher's lag when the writer stopped
   and how long the relay took to hold everything the writer wrote.
4. **Time of a dump of ``--rows`` rows by ``chunk_rows``** (``--chunk-rows``), one
   dump each, beside the keyset-page reference at the same size; a least-squares fit
   ``seconds = chunks x a + rows x b`` over the sizes splits the time into a cost per
   chunk (watermark round trips through the binlog, the chunk's ``SELECT`` and layout
   query, state file and buffer flush) and a cost per row. Plot (matplotlib, optional:
   ``make bench-deps``): ``--plot``, default ``benchmarks/dump_chunk_rows.png``.
5. **Time to dump ``--rows`` rows by parallelism** (issue 29; ``--parallelism``, e.g.
   1,2,4; none by default): one dump each at ``--default-chunk`` on a fresh relay, with
   ``"parallelism": P`` in the POST body. The field is sent only when this option is
   given: a relay before issue 29 answers 400 to it, and the series is then reported as
   "not supported" (the rest of the run goes on). Plot: ``--parallelism-plot``, default
   ``benchmarks/dump_parallelism.png``, with the raw ``SELECT`` and mydumper as lines.

Every dump is checked: state ``done``, rows dumped = rows in the table (no writer).

``--profile`` adds one more dump at ``--default-chunk`` with py-spy sampling the relay
and prints its top frames per thread (dump worker, fetcher, HTTP).

Time: about 7 minutes with the defaults on the relay before issue 29 (the 1M-row load
~2 s, a 1M-row dump 15-25 s, mydumper under a second, the writer phase ~3.5 minutes),
plus one dump per ``--parallelism`` value; ``--quick``: 50,000 rows, chunk sizes
500,2000,10000, 5 s writer periods, one repeat, about two minutes.
"""

from __future__ import annotations

import argparse
import array
import collections
import math
import multiprocessing as mp
import os
import platform
import queue
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
import pymysql.cursors
from _dumps import (
    AdminRelay,
    DumpRun,
    ParallelismUnsupported,
    dump_line,
    parse_parallelism,
    plot_parallelism,
    relay_capacity_mb,
    run_dump,
)
from _mariadb import (
    COLUMNS,
    MariaDBServer,
    connect,
    mariadb,
    master_position,
    source_uri,
)
from _relay_proc import (
    code_version,
    cpu_seconds,
    loadavg,
    machine_cpu,
    start_pyspy,
    summarize_pyspy,
)

CTX = mp.get_context("fork")
HERE = Path(__file__).resolve().parent
DATABASE = "bench"
TABLE = "items"
SOURCE = f"{DATABASE}.{TABLE}"
LOAD_TXN_ROWS = 100_000
_server_ids = iter(range(9001, 1 << 30))

SELECT_FROM_SEQ = (
    "SELECT seq, seq % 9973, ELT(seq % 4 + 1, 'NEW', 'PAID', 'SHIPPED', 'CANCELLED'), "
    "(seq % 100000) / 100, seq % 50, seq * 0.37, "
    "IF(seq % 3 = 0, NULL, CONCAT('note ', seq % 1000, ' leave at the door')), "
    "TIMESTAMP'2024-05-06 07:08:00' + INTERVAL (seq % 86400000000) MICROSECOND "
    "FROM seq_{lo}_to_{hi}"
)


# -- the table ------------------------------------------------------------------------


def load(server: MariaDBServer, rows: int) -> float:
    """Create ``bench.items`` with ``rows`` rows (ids 0 .. rows-1); returns seconds."""
    conn = connect(server)
    t0 = time.perf_counter()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {DATABASE}")
            cur.execute(f"USE {DATABASE}")  # the sequence tables live in the current one
            cur.execute(f"CREATE TABLE {SOURCE} ({COLUMNS}) ENGINE=InnoDB")
            for lo in range(0, rows, LOAD_TXN_ROWS):
                hi = min(rows, lo + LOAD_TXN_ROWS) - 1
                cur.execute(f"INSERT INTO {SOURCE} " + SELECT_FROM_SEQ.format(lo=lo, hi=hi))
            cur.execute(f"ANALYZE TABLE {SOURCE}")
            cur.fetchall()
    finally:
        conn.close()
    return time.perf_counter() - t0


def set_buffer_pool(server: MariaDBServer, mb: int) -> int:
    """Resize InnoDB's buffer pool online (MariaDB resizes it in the background); returns
    the size in MB once the server reports it done."""
    conn = connect(server)
    try:
        with conn.cursor() as cur:
            if mb:
                cur.execute(f"SET GLOBAL innodb_buffer_pool_size = {int(mb) << 20}")
            deadline = time.monotonic() + 60
            while True:
                cur.execute("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_resize_status'")
                row = cur.fetchone()
                status = str(row[1]) if row else ""
                if not status or "ompleted" in status or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            cur.execute("SELECT @@innodb_buffer_pool_size")
            return int(cur.fetchone()[0]) >> 20  # type: ignore[index]
    finally:
        conn.close()


def table_rows(server: MariaDBServer) -> int:
    conn = connect(server, DATABASE)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {TABLE}")
            return int(cur.fetchone()[0])  # type: ignore[index]
    finally:
        conn.close()


def dump_setup(uri: str) -> None:
    """``databus dump setup --source URI``: the watermark table, as an operator runs it."""
    exe = Path(sys.executable).with_name("databus")
    done = subprocess.run([str(exe), "dump", "setup", "--source", uri],
                          capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise RuntimeError(f"databus dump setup failed: {done.stdout}{done.stderr}")


# -- the references: raw reads on the same driver -------------------------------------


@dataclass
class Read:
    rows: int
    seconds: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def _touch(rows: Any) -> int:
    nulls = 0
    for row in rows:
        for v in row:
            if v is None:
                nulls += 1
    return nulls


def raw_scan(server: MariaDBServer) -> Read:
    """The whole table, one ``SELECT`` streamed with an unbuffered cursor."""
    conn = connect(server, DATABASE, cursorclass=pymysql.cursors.SSCursor)
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        n = 0
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {TABLE} ORDER BY id")
            while True:
                rows = cur.fetchmany(10_000)
                if not rows:
                    break
                _touch(rows)
                n += len(rows)
        return Read(n, time.perf_counter() - t0, time.process_time() - c0)
    finally:
        conn.close()


def raw_pages(server: MariaDBServer, chunk_rows: int) -> Read:
    """The whole table in keyset pages of ``chunk_rows``, as the dump reads it."""
    conn = connect(server, DATABASE)
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        n = 0
        last = -1
        with conn.cursor() as cur:
            while True:
                cur.execute(f"SELECT * FROM {TABLE} WHERE id > %s ORDER BY id LIMIT "
                            f"{int(chunk_rows)}", (last,))
                rows = cur.fetchall()
                _touch(rows)
                n += len(rows)
                if len(rows) < chunk_rows:
                    break
                last = rows[-1][0]
        return Read(n, time.perf_counter() - t0, time.process_time() - c0)
    finally:
        conn.close()


# -- the relay and its dumps ----------------------------------------------------------


class DumpRelay(AdminRelay):
    """``AdminRelay`` reading the MariaDB table (``tables=bench.items``)."""

    def __init__(self, server: MariaDBServer, capacity_mb: int) -> None:
        super().__init__(source_uri(server, SOURCE, next(_server_ids), heartbeat_ms=100),
                         capacity_mb)


def mariadb_pid(server: MariaDBServer) -> int | None:
    process = getattr(server._control, "process", None)
    return getattr(process, "pid", None)


def timed_dump(server: MariaDBServer, chunk_rows: int, rows: int,
               profile: Path | None = None, parallelism: int | None = None) -> DumpRun:
    """One dump of the whole table on a fresh relay, POST to ``done``; with ``profile``,
    py-spy samples the relay meanwhile (raw stacks written there); ``parallelism`` is
    sent in the POST body only when given (``ParallelismUnsupported`` from a relay
    before issue 29)."""
    relay = DumpRelay(server, relay_capacity_mb(rows))
    relay.start()
    spy = None
    try:
        if profile is not None:
            spy = start_pyspy(relay.pid, 600, profile)
            if spy is None:
                print("py-spy not found: pip install py-spy into the venv")
            time.sleep(1.0)
        time.sleep(0.3)
        run = run_dump(relay, SOURCE, chunk_rows, mariadb_pid(server), parallelism)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it has on Ctrl-C
            spy.wait(60)
        return run
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        relay.stop()


# -- mydumper, the outside reference --------------------------------------------------


def mydumper_exe() -> str | None:
    return shutil.which("mydumper")


def mydumper_run(server: MariaDBServer, rows: int, threads: int, split_rows: int) -> Read:
    """``mydumper --threads N`` of ``bench.items`` (no schema, no compression, into a temp
    dir removed afterwards, ``--rows`` ``split_rows`` so that several threads can share
    the table), timed as a process from start to exit; cpu: the process's own."""
    exe = mydumper_exe()
    assert exe is not None
    kw = server.connect_kwargs(database=None)
    out = Path(tempfile.mkdtemp(prefix="databus-bench-mydumper-", dir=DumpRelay.parent_dir))
    try:
        cmd = [exe, "--host", str(kw["host"]), "--port", str(kw["port"]), "--user",
               str(kw["user"]), "--password", str(kw["password"]), "--database", DATABASE,
               "--tables-list", TABLE, "--outputdir", str(out), "--threads", str(threads),
               "--no-schemas", "--trx-consistency-only", "--verbose", "1"]
        if split_rows:
            cmd += ["--rows", str(split_rows)]
        t0 = time.perf_counter()
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        seconds = time.perf_counter() - t0
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode:
            raise RuntimeError(f"mydumper failed ({done.returncode}): {done.stdout}"
                               f"{done.stderr}")
        files = [f for f in out.iterdir() if f.name.startswith(f"{SOURCE}.")
                 and f.name.endswith(".sql") and "-schema" not in f.name]
        if not files:
            raise RuntimeError(f"mydumper wrote no data file: {sorted(os.listdir(out))}")
        cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
        return Read(rows, seconds, cpu)
    finally:
        shutil.rmtree(out, ignore_errors=True)


# -- the writer -----------------------------------------------------------------------


def _writer(kwargs: dict[str, Any], rows: int, rate: float, warmup: float, seconds: float,
            seed: int, ready: Any, go: Any, out: Any) -> None:
    """Child process: small transactions on random keys; latencies of the measured ones."""
    conn = pymysql.connect(**{**kwargs, "autocommit": False})
    rng = random.Random(seed)
    cur = conn.cursor()
    statuses = ("NEW", "PAID", "SHIPPED", "CANCELLED")
    ready.release()
    go.wait()
    t_begin = time.perf_counter()
    t_measure = t_begin + warmup
    t_end = t_measure + seconds
    latencies = array.array("d")
    last_done = t_measure
    deleted: collections.deque[int] = collections.deque()
    i = 0
    while True:
        if rate > 0:  # open loop: a scheduled start; latency from it
            start = t_begin + i / rate
            i += 1
            now = time.perf_counter()
            if start > now:
                time.sleep(start - now)
        else:
            start = time.perf_counter()
        if start >= t_end:
            break
        r = rng.random()
        key = rng.randrange(rows)
        if r < 0.5:
            cur.execute(f"UPDATE {TABLE} SET qty = qty + 1, status = %s WHERE id = %s",
                        (statuses[key % 4], key))
        elif r < 0.75:
            cur.execute(f"DELETE FROM {TABLE} WHERE id = %s", (key,))
            deleted.append(key)
        else:  # a key deleted earlier comes back: the table keeps its size
            key = deleted.popleft() if deleted else key
            cur.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, 'NEW', 1.25, 1, 0.5, 'w', "
                        "NOW(6)) ON DUPLICATE KEY UPDATE qty = 0", (key, key % 9973))
        conn.commit()
        done = time.perf_counter()
        if start >= t_measure:
            latencies.append(done - start)
            last_done = done
    conn.close()
    out.put((latencies.tobytes(), last_done - t_measure))


@dataclass
class WriterRun:
    label: str
    latencies: list[float]
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)  # cores
    lock_waits: dict[str, int] = field(default_factory=dict)  # server counters' increase
    lag_bytes: int = 0  # the fetcher's lag (binlog bytes) when the writer stopped
    catch_up: float = 0.0  # seconds until the fetcher had caught up after that
    dumps: int = 0
    dumped_rows: int = 0
    overtaken: int = 0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]


LOCK_COUNTERS = ("Innodb_row_lock_waits", "Innodb_row_lock_time", "Table_locks_waited")


def lock_counters(server: MariaDBServer) -> dict[str, int]:
    """The server's lock wait counters (a writer that waited for a lock shows here)."""
    conn = connect(server)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ("
                        + ", ".join(f"'{n}'" for n in LOCK_COUNTERS) + ")")
            return {str(k): int(v) for k, v in cur.fetchall()}
    finally:
        conn.close()


def _reader(server: MariaDBServer, chunk_rows: int, stop: Any) -> None:
    """Child process: the table in keyset pages, over and over (a dump without a relay)."""
    while not stop.is_set():
        raw_pages(server, chunk_rows)


def writer_period(server: MariaDBServer, relay: DumpRelay, rows: int, rate: float,
                  seconds: float, load: str, chunk_rows: int, seed: int,
                  delay_ms: int = 0) -> WriterRun:
    """One measured period of the writer; ``load``: "none", "dump" or "reader";
    ``delay_ms``: the dump's pause between chunks (its throttle)."""
    ready, go, out = CTX.Semaphore(0), CTX.Event(), CTX.Queue()
    warmup = 1.0
    proc = CTX.Process(target=_writer, args=(
        server.connect_kwargs(database=DATABASE), rows, rate, warmup, seconds, seed,
        ready, go, out), daemon=True)
    proc.start()
    if not ready.acquire(timeout=30):
        raise TimeoutError("the writer did not connect")
    dumps: list[str] = []
    reader_stop = CTX.Event()
    reader = None
    if load == "dump":  # a dump in flight before the writer starts
        dumps.append(relay.start_dump(SOURCE, chunk_rows, delay_ms))
        deadline = time.monotonic() + 30
        while relay.dump(dumps[-1])["state"] == "queued":
            if time.monotonic() > deadline:
                raise TimeoutError(f"dump did not start: {relay.dump(dumps[-1])}")
            time.sleep(0.02)
    elif load == "reader":
        reader = CTX.Process(target=_reader, args=(server, chunk_rows, reader_stop),
                             daemon=True)
        reader.start()
    go.set()
    time.sleep(warmup)
    pids = {"relay": relay.pid, "writer": proc.pid, "mariadb": mariadb_pid(server)}
    if reader is not None:
        pids["reader"] = reader.pid
    cpu0 = {k: cpu_seconds(p) for k, p in pids.items() if p}
    busy0, steal0, tot0 = machine_cpu()
    locks0 = lock_counters(server)
    rows0 = relay.dump(dumps[-1])["progress"]["rows"] if dumps else 0
    result = None
    while result is None:
        try:
            result = out.get(timeout=0.2)
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError("the writer died") from None
            if dumps and relay.dump(dumps[-1])["state"] != "running":
                doc = relay.dump(dumps[-1])
                if doc["state"] != "done":
                    raise RuntimeError(f"dump {doc['state']}: {doc.get('error')}") from None
                dumps.append(relay.start_dump(SOURCE, chunk_rows, delay_ms))  # keep one running
    cpu1 = {k: cpu_seconds(p) for k, p in pids.items() if p}
    busy1, steal1, tot1 = machine_cpu()
    locks1 = lock_counters(server)
    lag = int((relay.buffer_status().get("fetcher") or {}).get("lag_scn") or 0)
    proc.join(30)
    raw, elapsed = result
    lat = array.array("d")
    lat.frombytes(raw)
    labels = {"none": "without", "dump": "with dump", "reader": "raw reader"}
    label = labels[load] + (f" (delay_ms {delay_ms})" if delay_ms else "")
    run = WriterRun(label, list(lat), elapsed)
    wall = max(tot1 - tot0, 1e-9) / (os.cpu_count() or 1)
    run.cpu = {k: (cpu1[k] - cpu0[k]) / wall for k in cpu0}
    run.cpu["other"] = max(0.0, (busy1 - busy0) / wall - sum(run.cpu.values()))
    run.cpu["steal"] = (steal1 - steal0) / wall
    run.lock_waits = {k: locks1.get(k, 0) - locks0.get(k, 0) for k in LOCK_COUNTERS}
    run.lag_bytes = lag
    if reader is not None:
        reader_stop.set()
        reader.join(60)
    if dumps:
        docs = [relay.dump(d) for d in dumps]
        run.dumps = len(dumps)
        run.dumped_rows = sum(d["progress"]["rows"] for d in docs) - rows0
        run.overtaken = sum(t["overtaken"] for d in docs for t in d["tables"])
        if docs[-1]["state"] in ("queued", "running"):
            try:
                relay.post(f"/v1/admin/dumps/{docs[-1]['id']}/cancel")
            except urllib.error.HTTPError as exc:
                if exc.code != 409:  # 409: it ended on its own meanwhile
                    raise
        deadline = time.monotonic() + 60
        while relay.dump(dumps[-1])["state"] in ("queued", "running"):
            if time.monotonic() > deadline:
                raise TimeoutError("the dump did not stop")
            time.sleep(0.05)
    # The fetcher catches up with what the writer wrote: a change of our own after the
    # writer's last, and the time until the buffer holds it. (Not lag_scn = 0: after a
    # cancelled dump it stays at the abandoned chunk's watermark until the next change.)
    t0 = time.monotonic()
    scn = marker_scn(server)
    while (relay.buffer_status()["max_scn"] or 0) < scn:
        if time.monotonic() - t0 > 300:
            raise TimeoutError(f"the relay did not catch up: {relay.buffer_status()}")
        time.sleep(0.02)
    run.catch_up = time.monotonic() - t0
    return run


def marker_scn(server: MariaDBServer) -> int:
    """Change one row of the table; the SCN of that transaction (the binlog end)."""
    conn = connect(server, DATABASE)
    try:
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {TABLE} SET qty = qty + 1 ORDER BY id LIMIT 1")
        return master_position(conn).scn
    finally:
        conn.close()


def writer_line(w: WriterRun) -> str:
    cpu = ", ".join(f"{k} {v:.2f}" for k, v in w.cpu.items())
    locks = (f"row lock waits {w.lock_waits.get('Innodb_row_lock_waits', 0)} "
             f"({w.lock_waits.get('Innodb_row_lock_time', 0)} ms), table lock waits "
             f"{w.lock_waits.get('Table_locks_waited', 0)}")
    extra = (f"  |  {w.dumps} dump(s), {w.dumped_rows:,} rows dumped in the period, "
             f"{w.overtaken} overtaken" if w.dumps else "")
    return (f"{w.label:>10}: {len(w.latencies):7,} txn in {w.seconds:5.2f} s = "
            f"{w.rate:7,.0f} txn/s, latency p50 {percentile(w.latencies, 0.5) * 1e3:6.2f} "
            f"p95 {percentile(w.latencies, 0.95) * 1e3:6.2f} "
            f"p99 {percentile(w.latencies, 0.99) * 1e3:6.2f} max "
            f"{max(w.latencies, default=float('nan')) * 1e3:7.1f} ms  |  cpu (cores): {cpu}"
            f"  |  {locks}  |  fetcher lag at the end {w.lag_bytes / 1e3:,.0f} kB, caught "
            f"up {w.catch_up:.1f} s later" + extra)


def pooled(a: WriterRun, b: WriterRun) -> WriterRun:
    return WriterRun("without", a.latencies + b.latencies, a.seconds + b.seconds)


# -- fit and plot ---------------------------------------------------------------------


def fit_chunk_row(points: list[tuple[int, int, float]]) -> tuple[float, float] | None:
    """Least squares ``seconds = chunks * a + rows * b`` (no intercept): (a, b)."""
    if len(points) < 2:
        return None
    scc = sum(c * c for c, _, _ in points)
    srr = sum(r * r for _, r, _ in points)
    scr = sum(c * r for c, r, _ in points)
    sct = sum(c * t for c, _, t in points)
    srt = sum(r * t for _, r, t in points)
    det = scc * srr - scr * scr
    if abs(det) < 1e-12:
        return None
    return (sct * srr - srt * scr) / det, (srt * scc - sct * scr) / det


def plot(dumps: list[DumpRun], pages: dict[int, Read], scan: Read, rows: int,
         path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot (make bench-deps)"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    xs = [d.chunk_rows for d in dumps]
    ax1.plot(xs, [d.seconds for d in dumps], "o-", label="dump (POST to done)")
    ax1.plot(xs, [pages[x].seconds for x in xs], "s--",
             label="raw keyset pages of chunk_rows (pymysql)")
    ax1.axhline(scan.seconds, color="grey", linestyle=":",
                label=f"raw SELECT, streamed ({scan.seconds:.1f} s)")
    ax1.set_xscale("log")
    ax1.set_ylim(bottom=0)
    ax1.set_xlabel("chunk_rows")
    ax1.set_ylabel(f"seconds to read {rows:,} rows")
    ax1.set_title("Dump time by chunk size")
    ax1.legend(fontsize=8)
    ax1.grid(True, which="both", alpha=0.3)
    ax2.plot(xs, [d.rate / scan.rate for d in dumps], "o-", label="dump / raw SELECT")
    ax2.plot(xs, [pages[x].rate / scan.rate for x in xs], "s--",
             label="raw keyset pages / raw SELECT")
    ax2.axhline(0.5, color="red", linestyle=":", alpha=0.6, label="goal 0.5")
    ax2.set_xscale("log")
    ax2.set_ylim(0, 1.2)
    ax2.set_xlabel("chunk_rows")
    ax2.set_ylabel("rows/s as a share of the raw SELECT")
    ax2.set_title("Dump rate / raw SELECT (same driver, same run)")
    ax2.legend(fontsize=8)
    ax2.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"databus dump of a MariaDB table (issue 13), {rows:,} rows of 8 columns, "
                 f"{os.cpu_count()} cores, Python {platform.python_version()}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot saved to {path}"


# -- main -----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of the reference and of the dump at --default-chunk, "
                             "alternating; best kept")
    parser.add_argument("--chunk-rows", default="500,1000,2000,5000,10000,20000",
                        help="chunk sizes of the scaling series (empty: skip it)")
    parser.add_argument("--default-chunk", type=int, default=10_000,
                        help="chunk_rows of figures 1-3 (the relay's default)")
    parser.add_argument("--writer-seconds", type=float, default=15.0,
                        help="measured seconds per writer period")
    parser.add_argument("--writer-rates", default="0,300,1000",
                        help="writer transactions/s, 0 = as fast as it can (issue 29's "
                             "p95 figure is at 300)")
    parser.add_argument("--no-writer", action="store_true", help="skip figures 2 and 3")
    parser.add_argument("--dump-delays", default="",
                        help="comma-separated delay_ms values: one more writer period per "
                        "rate with a dump throttled by each (the knob for the writer's tail)")
    parser.add_argument("--buffer-pool-mb", type=int, default=512,
                        help="InnoDB buffer pool, resized online after start (0: keep the "
                             "test fixture's 64 MB, smaller than a 1M-row table)")
    parser.add_argument("--plot", default=str(HERE / "dump_chunk_rows.png"),
                        help="PNG of the chunk_rows series ('' for none)")
    parser.add_argument("--relay-dir", default=None,
                        help="parent of the relays' data dirs (default: the system's temp "
                             "dir; /dev/shm takes the relay's flushes off the disk)")
    parser.add_argument("--parallelism", default="",
                        help="comma-separated parallelism values (e.g. 1,2,4): one dump of "
                             "--rows rows each at --default-chunk, with \"parallelism\": P "
                             "in the POST body (issue 29; a relay without it answers 400: "
                             "reported as not supported); empty: none sent")
    parser.add_argument("--parallelism-plot", default=str(HERE / "dump_parallelism.png"),
                        help="PNG of the parallelism series ('' for none)")
    parser.add_argument("--mydumper-threads", default="1,2",
                        help="mydumper --threads values of the outside reference (empty: "
                             "skip it; needs the Debian package, make bench-deps)")
    parser.add_argument("--mydumper-rows", type=int, default=100_000,
                        help="mydumper --rows: chunks of the table its threads share "
                             "(0: one chunk, one thread per table)")
    parser.add_argument("--profile", action="store_true",
                        help="one more dump at --default-chunk with py-spy on the relay")
    parser.add_argument("--quick", action="store_true",
                        help="50,000 rows, chunk sizes 500,2000,10000, 5 s writer periods, "
                             "one repeat (unless given)")
    args = parser.parse_args()
    if args.quick:  # shorter defaults; flags given explicitly still win
        for name, value in (("rows", 50_000), ("chunk_rows", "500,2000,10000"),
                            ("writer_seconds", 5.0), ("repeat", 1)):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    AdminRelay.parent_dir = args.relay_dir
    sizes = [int(c) for c in args.chunk_rows.split(",") if c.strip()]
    rates = [float(r) for r in args.writer_rates.split(",") if r.strip()]
    delays = [int(d) for d in args.dump_delays.split(",") if d.strip()]
    parallelisms = parse_parallelism(args.parallelism)
    my_threads = [int(t) for t in args.mydumper_threads.split(",") if t.strip()]
    if my_threads and mydumper_exe() is None:
        print("mydumper not found (make bench-deps installs the Debian package): no "
              "mydumper reference", flush=True)
        my_threads = []

    print(f"# dumps: Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"{args.rows:,} rows, default chunk_rows {args.default_chunk}, best of "
          f"{args.repeat}; {loadavg()}; {code_version()}", flush=True)
    with mariadb() as server:
        conn = connect(server)
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            version = cur.fetchone()[0]  # type: ignore[index]
        conn.close()
        pool_mb = set_buffer_pool(server, args.buffer_pool_mb)
        seconds = load(server, args.rows)
        dump_setup(source_uri(server, SOURCE, next(_server_ids)))
        print(f"MariaDB {version} on port {server.port}, buffer pool {pool_mb} MB: "
              f"{args.rows:,} rows loaded in {seconds:.1f} s; databus dump setup done",
              flush=True)
        raw_scan(server)  # warm-up: the table's pages into the OS page cache

        # 1. the dump rate at the default chunk size, against the raw reads
        scans: list[Read] = []
        page_runs: list[Read] = []
        dump_runs: list[DumpRun] = []
        my_runs: dict[int, list[Read]] = {t: [] for t in my_threads}
        for _ in range(args.repeat):
            scans.append(raw_scan(server))
            page_runs.append(raw_pages(server, args.default_chunk))
            for t in my_threads:
                my_runs[t].append(mydumper_run(server, args.rows, t, args.mydumper_rows))
            dump_runs.append(timed_dump(server, args.default_chunk, args.rows))
            mine = "".join(f"mydumper --threads {t} {runs[-1].rate:,.0f} rows/s "
                           f"({runs[-1].seconds:.2f} s, cpu {runs[-1].cpu:.2f} s); "
                           for t, runs in my_runs.items())
            print(f"raw scan {scans[-1].rate:,.0f} rows/s ({scans[-1].seconds:.2f} s, cpu "
                  f"{scans[-1].cpu:.2f} s); raw pages of {args.default_chunk} "
                  f"{page_runs[-1].rate:,.0f} rows/s; {mine}{dump_line(dump_runs[-1])}",
                  flush=True)
        scan = min(scans, key=lambda r: r.seconds)
        best = min(dump_runs, key=lambda d: d.seconds)
        pages = {args.default_chunk: min(page_runs, key=lambda r: r.seconds)}
        mydumper = {t: min(runs, key=lambda r: r.seconds) for t, runs in my_runs.items()}
        for d in dump_runs:
            if d.rows != args.rows:
                raise RuntimeError(f"dumped {d.rows} rows, the table has {args.rows}")

        # 5. parallelism series (issue 29): sent only when asked for
        par_runs: list[DumpRun] = []
        par_note = ""
        if parallelisms:
            print(f"\n## {args.rows:,} rows by parallelism (one dump each, chunk_rows "
                  f"{args.default_chunk})", flush=True)
        for p in parallelisms:
            try:
                d = timed_dump(server, args.default_chunk, args.rows, parallelism=p)
            except ParallelismUnsupported as exc:
                par_note = f"not supported by this relay (400 to the field: {exc})"
                print(f"parallelism {p}: {par_note}", flush=True)
                break
            if d.rows != args.rows:
                raise RuntimeError(f"dumped {d.rows} rows, the table has {args.rows}")
            par_runs.append(d)
            print(f"{dump_line(d, scan.rate)}", flush=True)

        # 4. chunk_rows series
        series: list[DumpRun] = []
        if sizes:
            print(f"\n## {args.rows:,} rows by chunk_rows (one dump each; the default size "
                  "is the best run above)", flush=True)
        for size in sizes:
            if size not in pages:
                pages[size] = raw_pages(server, size)
            d = best if size == args.default_chunk else timed_dump(server, size, args.rows)
            if d.rows != args.rows:
                raise RuntimeError(f"dumped {d.rows} rows, the table has {args.rows}")
            series.append(d)
            print(f"{dump_line(d, scan.rate)}; raw pages {pages[size].seconds:.2f} s", flush=True)

        # 2, 3. the writer without and with a dump
        writer_results: list[tuple[float, WriterRun, WriterRun, WriterRun]] = []
        throttled: list[tuple[float, int, WriterRun]] = []  # rate, delay_ms, run
        if not args.no_writer:
            print(f"\n## writer, {args.writer_seconds:g} s per period (+1 s warm-up), "
                  f"dumps at chunk_rows={args.default_chunk}", flush=True)
            relay = DumpRelay(server, relay_capacity_mb(args.rows) * 2)
            relay.start()
            try:
                for k, rate in enumerate(rates):
                    name = "as fast as it can" if rate <= 0 else f"offered {rate:g} txn/s"
                    print(f"writer {name}:", flush=True)
                    runs = []
                    for j, load_kind in enumerate(("none", "dump", "none", "reader")):
                        w = writer_period(server, relay, args.rows, rate, args.writer_seconds,
                                          load_kind, args.default_chunk, seed=100 * k + j)
                        print("  " + writer_line(w), flush=True)
                        runs.append(w)
                    writer_results.append((rate, pooled(runs[0], runs[2]), runs[1], runs[3]))
                    for i, delay in enumerate(delays):
                        w = writer_period(server, relay, args.rows, rate, args.writer_seconds,
                                          "dump", args.default_chunk, seed=100 * k + 10 + i,
                                          delay_ms=delay)
                        print("  " + writer_line(w), flush=True)
                        throttled.append((rate, delay, w))
            finally:
                relay.stop()

        print("\n## summary")
        print(f"1. dump rows/s / raw SELECT rows/s (goal >= 1.0, issue 29; issue 13's was "
              f">= 0.5): {best.rate / scan.rate:.3f} "
              f"({best.rate:,.0f} / {scan.rate:,.0f}, chunk_rows {args.default_chunk}, "
              f"POST to done {best.seconds:.2f} s for {best.rows:,} rows); against keyset "
              f"pages of the same size {best.rate / pages[args.default_chunk].rate:.3f} "
              f"({pages[args.default_chunk].rate:,.0f} rows/s)")
        for t, ref in mydumper.items():
            goal = " (stretch goal >= 0.25)" if t == 2 else ""
            print(f"   dump rows/s / mydumper --threads {t} rows/s{goal}: "
                  f"{best.rate / ref.rate:.3f} ({ref.rate:,.0f} rows/s, {ref.seconds:.2f} s, "
                  f"--rows {args.mydumper_rows}, cpu {ref.cpu:.2f} s)")
        for rate, without, during, reader in writer_results:
            name = "as fast as it can" if rate <= 0 else f"offered {rate:g} txn/s"
            p99w, p99d = percentile(without.latencies, 0.99), percentile(during.latencies, 0.99)
            print(f"2. writer ({name}) throughput during / without (goal >= 0.9): "
                  f"{during.rate / without.rate:.3f} ({during.rate:,.0f} / "
                  f"{without.rate:,.0f} txn/s)")
            p95w, p95d = percentile(without.latencies, 0.95), percentile(during.latencies, 0.95)
            goal = " (issue 29's goal <= 2 is at 300 txn/s)" if rate == 300 else ""
            print(f"3. writer ({name}) p95 latency during / without{goal}: "
                  f"{p95d / p95w:.2f} ({p95d * 1e3:.2f} / {p95w * 1e3:.2f} ms)")
            print(f"   writer ({name}) p99 latency during / without (issue 13's goal <= 2): "
                  f"{p99d / p99w:.2f} ({p99d * 1e3:.2f} / {p99w * 1e3:.2f} ms; max "
                  f"{max(during.latencies) * 1e3:.1f} / {max(without.latencies) * 1e3:.1f} ms)")
            p95r = percentile(reader.latencies, 0.95)
            p99r = percentile(reader.latencies, 0.99)
            print(f"   control, a raw keyset reader of the table instead of the dump: "
                  f"throughput {reader.rate / without.rate:.3f}, p95 {p95r / p95w:.2f} "
                  f"({p95r * 1e3:.2f} ms), p99 {p99r / p99w:.2f} ({p99r * 1e3:.2f} ms)")
            for rate_t, delay, w in throttled:
                if rate_t != rate:
                    continue
                p95t = percentile(w.latencies, 0.95)
                p99t = percentile(w.latencies, 0.99)
                print(f"   throttled, delay_ms {delay}: throughput {w.rate / without.rate:.3f}, "
                      f"p95 {p95t / p95w:.2f} ({p95t * 1e3:.2f} ms), "
                      f"p99 {p99t / p99w:.2f} ({p99t * 1e3:.2f} ms), dump "
                      f"{w.dumped_rows / w.seconds:,.0f} rows/s")
        if series:
            print(f"4. seconds to dump {args.rows:,} rows by chunk_rows: " + ", ".join(
                f"{d.chunk_rows}: {d.seconds:.1f}" for d in series)
                + f" (raw SELECT {scan.seconds:.1f} s)")
            fit = fit_chunk_row([(d.chunks, d.rows, d.seconds) for d in series])
            pfit = fit_chunk_row([(math.ceil((args.rows + 1) / s), args.rows,
                                   pages[s].seconds) for s in sizes])
            if fit is not None and pfit is not None:
                print(f"   fit seconds = chunks x a + rows x b: dump a = {fit[0] * 1e3:.2f} ms "
                      f"per chunk, b = {fit[1] * 1e6:.2f} us per row; raw keyset pages a = "
                      f"{pfit[0] * 1e3:.2f} ms, b = {pfit[1] * 1e6:.2f} us; raw SELECT "
                      f"{scan.seconds / scan.rows * 1e6:.2f} us per row")
        if parallelisms:
            if par_runs:
                print(f"5. seconds to dump {args.rows:,} rows by parallelism: " + ", ".join(
                    f"{d.parallelism}: {d.seconds:.2f} ({d.rate / scan.rate:.2f} of the raw "
                    "SELECT)" for d in par_runs) + (f"; then {par_note}" if par_note else ""))
            else:
                print(f"5. parallelism: {par_note}")
        print(f"end: {loadavg()}", flush=True)
        if series and args.plot:
            print(plot(series, pages, scan, args.rows, Path(args.plot)))
        if par_runs and args.parallelism_plot:
            refs = {"raw SELECT, pymysql SSCursor": scan.seconds}
            refs.update({f"mydumper --threads {t}": r.seconds for t, r in mydumper.items()})
            print(plot_parallelism(
                {f"MariaDB dump, chunk_rows {args.default_chunk}": par_runs}, refs,
                args.rows, Path(args.parallelism_plot),
                "databus dump of a MariaDB table by parallelism (issue 29)"))
        if args.profile:
            out = Path(tempfile.mkdtemp(prefix="databus-prof-")) / "dump.txt"
            d = timed_dump(server, args.default_chunk, args.rows, profile=out)
            print(f"\n## py-spy of the relay, one dump at chunk_rows={args.default_chunk} "
                  f"({out}; {d.rate:,.0f} rows/s under the profiler)")
            print(summarize_pyspy(out, seconds=d.seconds))
        remaining = table_rows(server)
        print(f"(table holds {remaining:,} rows after the writer)")


if __name__ == "__main__":
    main()
