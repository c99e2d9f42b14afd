"""Binlog fetcher read rate (issue 4), as a ratio of raw mysql-replication on the same
binlog in the same run.

    .venv/bin/python benchmarks/fetcher_mysql.py [--quick] [--rows 200000] [--repeat 1]
        [--profile]

Setup: a throwaway MariaDB started as the test fixture starts it (ROW binlog, FULL row
image and row metadata). Two tables of the same 8 columns (BIGINT primary key, INT,
VARCHAR(16), DECIMAL(12,2), SMALLINT, DOUBLE, a VARCHAR(100) that is NULL every third
row, DATETIME(6); ~110 bytes per row image) get ``--rows`` rows each, in transactions of
100 rows: once as one 100-row ``INSERT ... VALUES (...), (...)`` per transaction
("multi"), once as 100 single-row INSERT statements between BEGIN and COMMIT
("single": one table map event and one rows event per row). The binlog positions
before and after each load delimit the range read.

Each range is then read, ``--repeat`` times alternating (best run kept), by:

- raw: ``BinLogStreamReader(is_mariadb=False, log_file/log_pos = the range start,
  resume_stream=True, blocking=False, only_events=[Write/Update/DeleteRowsEvent])``
  with the library's other defaults (``freeze_schema=False``), iterating every rows
  event and every value of every row, until the range end;
- raw-frozen (second reference): the same with ``freeze_schema=True``, the option the
  fetcher uses (table maps decoded once per table id);
- ours: ``databus.fetchers.mysql.BinlogFetcher`` through the plugin API
  (``FetcherContext`` with a ``RelayCatalog(...).for_buffer(name, 0)``) writing into a
  real ``relay._buffer.EventBuffer`` big enough for the whole range, ``run`` in a
  thread; timed until a buffer listener sees the window whose SCN (``(file number <<
  32) | end position``) is the range end. It includes the fetcher's start-up (server
  checks, information_schema, schema registration), as the raw time includes connecting.

Rows/s = rows / wall seconds of the best run; "cpu" is this process's CPU seconds over
that run (the reader is CPU-bound when it is close to the wall time), and rows per
CPU-second a second figure that other jobs in this VM do not lower (a throttled host
does: absolute rates here vary by 2x from one hour to the next, the ratios much less).
The ratio is ours / raw (goal >= 0.9). ``--profile`` adds one more run of ours per mode
under py-spy and prints the fetcher thread's top frames.

Time: about 2 minutes with the defaults on an unthrottled machine, half of it the raw
single-row read (table maps decoded for every row); each extra ``--repeat`` adds as
much again.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from _mariadb import (
    COLUMNS,
    MariaDBServer,
    connect,
    mariadb,
    master_position,
    source_uri,
)
from _relay_proc import code_version, loadavg, start_pyspy, summarize_pyspy
from pymysql.constants import CLIENT
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from databus.fetchers._api import FetcherContext
from databus.fetchers.mysql import BinlogFetcher
from databus.fetchers.mysql._scn import BinlogPosition
from databus.relay._buffer import EventBuffer
from databus.relay._catalog import RelayCatalog

DATABASE = "bench"
TXN_ROWS = 100
MIB = 1 << 20
_server_ids = iter(range(7001, 1 << 30))

STATUSES = ("NEW", "PAID", "SHIPPED", "CANCELLED")


@dataclass
class Range:
    mode: str
    table: str
    rows: int
    start: BinlogPosition
    end: BinlogPosition
    load_seconds: float


@dataclass
class Run:
    seconds: float
    cpu: float
    rows: int

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


# -- the load -------------------------------------------------------------------------


def _row_sql(i: int) -> str:
    note = "NULL" if i % 3 == 0 else f"'note {i % 1000} leave at the door'"
    return (f"({i},{i % 9973},'{STATUSES[i % 4]}',{(i % 100000) / 100:.2f},{i % 50},"
            f"{i * 0.37:.4f},{note},'2024-05-06 07:08:{i % 60:02d}.{i % 1000000:06d}')")


def load(server: MariaDBServer, mode: str, rows: int) -> Range:
    """Write ``rows`` rows into ``bench.t_<mode>`` in 100-row transactions."""
    table = f"t_{mode}"
    conn = connect(server, DATABASE, client_flag=CLIENT.MULTI_STATEMENTS)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {table} ({COLUMNS}) ENGINE=InnoDB")
        start = master_position(conn)
        t0 = time.perf_counter()
        with conn.cursor() as cur:
            for base in range(0, rows, TXN_ROWS):
                ids = range(base, min(base + TXN_ROWS, rows))
                if mode == "multi":
                    cur.execute(f"INSERT INTO {table} VALUES " + ",".join(map(_row_sql, ids)))
                else:
                    cur.execute("BEGIN;" + "".join(
                        f"INSERT INTO {table} VALUES {_row_sql(i)};" for i in ids) + "COMMIT")
                    while cur.nextset():
                        pass
        seconds = time.perf_counter() - t0
        end = master_position(conn)
    finally:
        conn.close()
    if end.file != start.file:
        raise RuntimeError(f"the load rotated the binlog ({start} .. {end}): use fewer rows")
    return Range(mode, table, rows, start, end, seconds)


# -- the readers ----------------------------------------------------------------------


def read_raw(server: MariaDBServer, r: Range, *, freeze_schema: bool = False) -> Run:
    """Raw mysql-replication over the range: every rows event, every value."""
    c0, t0 = time.process_time(), time.perf_counter()
    stream = BinLogStreamReader(
        connection_settings=server.replication_settings(),
        server_id=next(_server_ids),
        is_mariadb=False,
        log_file=r.start.file,
        log_pos=r.start.position,
        resume_stream=True,
        blocking=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        freeze_schema=freeze_schema,
    )
    rows = nulls = 0
    end = r.end.position
    try:
        for event in stream:
            if event.packet.log_pos >= end:  # past the range (rows end before its XID)
                break
            for row in event.rows:
                values = row["values"] if "values" in row else row["after_values"]
                for v in values.values():
                    if v is None:
                        nulls += 1
                rows += 1
    finally:
        stream.close()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if rows != r.rows:
        raise RuntimeError(f"raw reader saw {rows} rows, expected {r.rows}")
    return Run(seconds, cpu, rows)


def read_ours(server: MariaDBServer, r: Range, capacity: int, *,
              profile: Path | None = None) -> Run:
    """The BinlogFetcher into a fresh EventBuffer, until the window at the range end."""
    tmp = Path(tempfile.mkdtemp(prefix="databus-bench-fetcher-"))
    buffer = EventBuffer(tmp / "bench.buf", capacity)
    start_scn, end_scn = r.start.scn, r.end.scn
    buffer.start_after(start_scn)
    catalog = RelayCatalog(tmp / "catalog.json")
    context = FetcherContext("bench", 0, catalog.for_buffer("bench", 0))
    uri = source_uri(server, f"{DATABASE}.{r.table}", next(_server_ids), heartbeat_ms=100)
    fetcher = BinlogFetcher(uri, context)
    reached = threading.Event()
    t_end = [0.0]

    def on_window(scn: int) -> None:
        if scn >= end_scn and not reached.is_set():
            t_end[0] = time.perf_counter()
            reached.set()

    buffer.add_listener(on_window)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fetcher.run(buffer, start_scn, stop)
        except BaseException as exc:  # reported below, unless we stopped it
            if not stop.is_set():
                errors.append(exc)
                reached.set()

    spy = start_pyspy(os.getpid(), 600, profile) if profile is not None else None
    if spy is not None:
        time.sleep(0.5)
    c0, t0 = time.process_time(), time.perf_counter()
    thread = threading.Thread(target=run, name="fetcher", daemon=True)
    thread.start()
    try:
        if not reached.wait(600):
            raise TimeoutError(f"the fetcher did not reach SCN {end_scn}: {buffer.state()}")
        cpu = time.process_time() - c0
    finally:
        stop.set()
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it has on Ctrl-C
            spy.wait(30)
        fetcher.close()
        thread.join(30)
    if errors:
        raise errors[0]
    state = buffer.state()
    buffer.close()
    shutil.rmtree(tmp, ignore_errors=True)
    if state.prev_scn != start_scn:
        raise RuntimeError("the buffer evicted windows: it is too small")
    if state.events != r.rows or state.max_scn != end_scn:
        raise RuntimeError(f"buffer holds {state.events} events up to {state.max_scn}, "
                           f"expected {r.rows} up to {end_scn}")
    return Run(t_end[0] - t0, cpu, state.events)


# -- main -----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows per mode")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per reader and mode, alternating; best kept")
    parser.add_argument("--modes", default="multi,single", help="multi, single or both")
    parser.add_argument("--no-frozen", action="store_true",
                        help="skip the raw freeze_schema=True reference")
    parser.add_argument("--profile", action="store_true",
                        help="one more run of ours per mode under py-spy")
    parser.add_argument("--quick", action="store_true", help="20,000 rows")
    args = parser.parse_args()
    if args.quick:
        for name, value in (("rows", 20_000),):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    modes = [m for m in args.modes.split(",") if m]
    random.seed(1)

    print(f"# binlog fetcher: {platform.python_version()}, {os.cpu_count()} cores, "
          f"{args.rows:,} rows per mode in {TXN_ROWS}-row transactions, best of "
          f"{args.repeat}; {loadavg()}; {code_version()}", flush=True)
    with mariadb() as server:
        admin = connect(server)
        with admin.cursor() as cur:
            cur.execute("SELECT VERSION()")
            version = cur.fetchone()[0]  # type: ignore[index]
            cur.execute(f"CREATE DATABASE {DATABASE}")
        admin.close()
        print(f"MariaDB {version} on port {server.port}", flush=True)
        ranges = []
        for mode in modes:
            r = load(server, mode, args.rows)
            ranges.append(r)
            print(f"load {mode:6s}: {r.rows:,} rows in {r.load_seconds:.1f} s, binlog "
                  f"{r.start} .. {r.end} ({(r.end.position - r.start.position) / 1e6:.1f} MB)",
                  flush=True)

        results: dict[str, dict[str, Run]] = {}
        for r in ranges:
            capacity = max(16 * MIB, r.rows * 400)
            runs: dict[str, list[Run]] = {"raw": [], "raw-frozen": [], "ours": []}
            for _ in range(args.repeat):
                runs["raw"].append(read_raw(server, r))
                if not args.no_frozen:
                    runs["raw-frozen"].append(read_raw(server, r, freeze_schema=True))
                runs["ours"].append(read_ours(server, r, capacity))
            best = {k: min(v, key=lambda x: x.seconds) for k, v in runs.items() if v}
            results[r.mode] = best
            raw = best["raw"]
            for name, run in best.items():
                ratio = run.rate / raw.rate
                cpu_ratio = (run.rows / run.cpu) / (raw.rows / raw.cpu)
                all_runs = ", ".join(f"{x.rate:,.0f}" for x in runs[name])
                print(f"{r.mode:6s} {name:10s} {run.rate:10,.0f} rows/s  "
                      f"{run.seconds:6.2f} s  ratio {ratio:5.2f}  |  cpu {run.cpu:6.2f} s  "
                      f"{run.rows / run.cpu:10,.0f} rows/cpu-s  ratio {cpu_ratio:5.2f}  "
                      f"(runs: {all_runs})", flush=True)

        print("\nsummary: ours / raw mysql-replication (goal >= 0.9): " + "; ".join(
            f"{mode} {b['ours'].rate / b['raw'].rate:.2f}"
            + (f" (/ frozen raw {b['ours'].rate / b['raw-frozen'].rate:.2f})"
               if "raw-frozen" in b else "")
            for mode, b in results.items()))
        print(f"end: {loadavg()}")

        if args.profile:
            for r in ranges:
                out = Path(tempfile.mkdtemp(prefix="databus-prof-")) / f"fetcher-{r.mode}.txt"
                run = read_ours(server, r, max(16 * MIB, r.rows * 400), profile=out)
                print(f"\n## py-spy of this process, ours, {r.mode} ({out}; "
                      f"{run.rate:,.0f} rows/s under the profiler)")
                print(summarize_pyspy(out, seconds=run.seconds))


if __name__ == "__main__":
    main()
