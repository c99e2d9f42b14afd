"""Dumps of a PostgreSQL table through a real relay (issue 29, "Benchmarks"), for both
PostgreSQL source kinds, the logical decoding fetcher (``postgresql://...?slot=..&
publication=..&tables=..``) and the TxLog fetcher (``postgresql+txlog://...?tables=..``):
dump rows/s as a ratio of a raw ``COPY ... TO STDOUT`` of the same table, measured in the
same run, and the time of a dump by ``parallelism``.

    .venv/bin/python benchmarks/dump_pg.py [--quick] [--rows 1000000] [--repeat 2]
        [--kinds logical,txlog] [--chunk-rows 10000] [--parallelism 1,2,4]
        [--txlog-poll-ms N] [--synchronous-commit on|off] [--relay-dir DIR]
        [--plot benchmarks/dump_pg_parallelism.png]

Setup: a throwaway PostgreSQL 15 started as the test fixture starts it (``_pg.py``:
``wal_level = logical``; fsync and full_page_writes off, ``synchronous_commit = off``
server-wide). One database per source kind, each with the same table ``public.items`` of
``--rows`` rows with the 8 columns of ``dump.py``'s MariaDB table (bigint key, integer,
varchar(16), numeric(12,2), smallint, double precision, a varchar(100) that is NULL every
third row, timestamp(6)), loaded by ``INSERT ... SELECT generate_series`` *before* the
capture exists; then, as an operator would: ``databus pg setup`` (slot and publication)
or ``databus txlog install`` (the ``databus_txn`` column, triggers, the TxLog), then
``databus dump setup --source URI`` (the watermark table), then ``VACUUM ANALYZE``.
``--synchronous-commit on`` (the default) sets ``ALTER DATABASE ... SET
synchronous_commit = on`` on both databases, as on a production server: the relay's
watermark commits are then flushed at once; with ``off`` (the fixture's), logical
decoding sees each watermark only at the WAL writer's next round (up to
``wal_writer_delay``, 200 ms), twice per chunk.

Each dump runs on a fresh ``databus relay --config`` child process (``_dumps.AdminRelay``:
one buffer that holds the whole dump, an ``admin_token``, the source URI with
``start=latest``; the TxLog URI with ``poll_ms`` only if ``--txlog-poll-ms`` is given,
else the fetcher's default of 100 ms, which a chunk waits for twice: low and high
watermark), started and running before anything is timed.

Figures, per source kind:

1. **Dump rate / raw COPY** (goal >= 0.5). Dump rows/s = rows dumped / seconds from
   ``POST /v1/admin/dumps`` (``{"sources": ["public.items"], "chunk_rows": C}``) until
   ``GET /v1/dumps`` shows it ``done``: the rows are in the relay's buffer. Reference,
   same run, same database: ``COPY (SELECT <the table's columns> FROM public.items ORDER
   BY id) TO STDOUT`` through psycopg2's ``copy_expert`` into a sink that only counts
   bytes (the TxLog table's ``databus_txn`` column is left out, as the dump leaves it
   out; on the logical database the list is ``SELECT *``'s). Best of ``--repeat``,
   the reference and the dump alternating.
2. **Seconds to dump ``--rows`` rows by parallelism** (``--parallelism``, e.g. 1,2,4; sent
   as ``"parallelism": P`` in the POST body only when given: a relay before issue 29
   answers 400 to the field, reported as "not supported"). Plot (matplotlib, optional,
   ``make bench-deps``): ``--plot``.

Every dump is checked: state ``done``, rows dumped = rows in the table.

Time: about 3 minutes with the defaults on today's relay (1M rows: the loads ~15 s per
database, each dump 20-40 s); ``--quick``: 200,000 rows, one repeat, about a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
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
from _pg import PostgresServer, postgres
from _relay_proc import code_version, loadavg

from databus.cli import main as databus_main

HERE = Path(__file__).resolve().parent
TABLE = "items"
SOURCE = f"public.{TABLE}"
COLUMN_NAMES = "id, customer_id, status, amount, qty, price, note, created"
DDL = f"""CREATE TABLE {SOURCE} (
    id bigint NOT NULL PRIMARY KEY,
    customer_id integer NOT NULL,
    status varchar(16) NOT NULL,
    amount numeric(12,2) NOT NULL,
    qty smallint NOT NULL,
    price double precision NOT NULL,
    note varchar(100),
    created timestamp(6) NOT NULL
)"""
# The rows of dump.py's MariaDB table, from generate_series.
LOAD = (
    f"INSERT INTO {SOURCE} SELECT s, s % 9973, "
    "(ARRAY['NEW', 'PAID', 'SHIPPED', 'CANCELLED'])[s % 4 + 1], (s % 100000) / 100.0, "
    "s % 50, s * 0.37, CASE WHEN s % 3 = 0 THEN NULL ELSE 'note ' || (s % 1000) || "
    "' leave at the door' END, timestamp '2024-05-06 07:08:00' + "
    "make_interval(secs => (s % 86400000000) / 1e6) FROM generate_series({lo}, {hi}) s"
)
LOAD_TXN_ROWS = 200_000
KINDS = ("logical", "txlog")


# -- the databases ----------------------------------------------------------------------


@dataclass
class Db:
    server: PostgresServer
    kind: str  # "logical" or "txlog"
    poll_ms: int | None = None

    @property
    def name(self) -> str:
        return f"dump_{self.kind}"

    def connect(self) -> Any:
        conn = psycopg2.connect(**self.server.connect_kwargs(self.name))
        conn.autocommit = True
        return conn

    def uri(self) -> str:
        url = self.server.url(self.name)
        if self.kind == "logical":
            return f"{url}?slot=bench_dump&publication=bench_dump&tables={SOURCE}"
        url = url.replace("postgresql://", "postgresql+txlog://", 1)
        poll = f"&poll_ms={self.poll_ms}" if self.poll_ms is not None else ""
        return f"{url}?tables={TABLE}{poll}"

    def relay_uri(self) -> str:
        return self.uri() + "&start=latest"

    def run(self, *statements: str) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
        finally:
            conn.close()

    def count(self) -> int:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM {SOURCE}")
                return int(cur.fetchone()[0])
        finally:
            conn.close()


def _cli(*argv: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = databus_main(list(argv))
    if code:
        raise SystemExit(f"databus {' '.join(argv[:2])} failed: {out.getvalue()}"
                         f"{err.getvalue()}")


def prepare(server: PostgresServer, kind: str, rows: int, synchronous_commit: str,
            poll_ms: int | None) -> tuple[Db, float]:
    """The database of ``kind`` with its loaded table, capture and watermark table;
    returns it and the load's seconds."""
    db = Db(server, kind, poll_ms)
    admin = psycopg2.connect(**server.connect_kwargs("postgres"))
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{db.name}"')
            cur.execute(f'ALTER DATABASE "{db.name}" SET synchronous_commit = '
                        f"{'on' if synchronous_commit == 'on' else 'off'}")
    finally:
        admin.close()
    t0 = time.perf_counter()
    db.run(DDL, *(LOAD.format(lo=lo, hi=min(rows, lo + LOAD_TXN_ROWS) - 1)
                  for lo in range(0, rows, LOAD_TXN_ROWS)))
    seconds = time.perf_counter() - t0
    if kind == "logical":
        _cli("pg", "setup", "--source", db.uri())
    else:
        _cli("txlog", "install", "--source", db.uri())
    _cli("dump", "setup", "--source", db.uri())
    db.run(f"VACUUM ANALYZE {SOURCE}")
    return db, seconds


def postmaster_pid(server: PostgresServer) -> int:
    return int((server.datadir / "postmaster.pid").read_text().split("\n", 1)[0])


# -- the reference: COPY TO STDOUT ------------------------------------------------------


class Discard(io.RawIOBase):
    """A file that psycopg2's ``copy_expert`` writes to: counts the bytes, keeps none."""

    def __init__(self) -> None:
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = len(data)
        self.bytes += n
        return n


@dataclass
class Copy:
    rows: int
    seconds: float
    cpu: float
    bytes: int

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def raw_copy(db: Db, rows: int) -> Copy:
    """``COPY (SELECT cols FROM t ORDER BY id) TO STDOUT`` into a discarding sink, on a
    connection opened beforehand."""
    conn = db.connect()
    try:
        sink = Discard()
        c0, t0 = time.process_time(), time.perf_counter()
        with conn.cursor() as cur:
            cur.copy_expert(f"COPY (SELECT {COLUMN_NAMES} FROM {SOURCE} ORDER BY id) "
                            "TO STDOUT", sink)
        return Copy(rows, time.perf_counter() - t0, time.process_time() - c0, sink.bytes)
    finally:
        conn.close()


# -- the dumps --------------------------------------------------------------------------


def timed_dump(db: Db, chunk_rows: int, rows: int, pg_pid: int,
               parallelism: int | None = None) -> DumpRun:
    """One dump of the table on a fresh relay, POST to ``done``."""
    relay = AdminRelay(db.relay_uri(), relay_capacity_mb(rows))
    try:
        relay.start(timeout=60)  # a logical slot may still be held by the last relay
        time.sleep(0.3)
        run = run_dump(relay, SOURCE, chunk_rows, pg_pid, parallelism, db_tree=True)
    finally:
        relay.stop()
    if run.rows != rows:
        raise RuntimeError(f"{db.kind}: dumped {run.rows} rows, the table has {rows}")
    return run


def pg_line(d: DumpRun, copy_rate: float) -> str:
    return dump_line(d, copy_rate, db="postgres", ref_name="raw COPY")


# -- main -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of the reference and of the dump, alternating; best kept")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="source kinds: logical (postgresql://), txlog "
                             "(postgresql+txlog://)")
    parser.add_argument("--chunk-rows", type=int, default=10_000,
                        help="chunk_rows of every dump (the relay's default)")
    parser.add_argument("--parallelism", default="",
                        help="comma-separated parallelism values (e.g. 1,2,4): one dump "
                             "each per kind, \"parallelism\": P in the POST body (issue 29; "
                             "a relay without it answers 400: reported as not supported)")
    parser.add_argument("--plot", default=str(HERE / "dump_pg_parallelism.png"),
                        help="PNG of the parallelism series ('' for none)")
    parser.add_argument("--txlog-poll-ms", type=int, default=None,
                        help="poll_ms of the TxLog URI (default: not set, the fetcher's "
                             "100 ms)")
    parser.add_argument("--synchronous-commit", choices=("on", "off"), default="on",
                        help="synchronous_commit of the two databases (on: a production "
                             "server's default; off: the test fixture's)")
    parser.add_argument("--relay-dir", default=None,
                        help="parent of the relays' data dirs (default: the system's temp "
                             "dir)")
    parser.add_argument("--quick", action="store_true",
                        help="200,000 rows, one repeat (unless given)")
    args = parser.parse_args()
    if args.quick:
        for name, value in (("rows", 200_000), ("repeat", 1)):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    AdminRelay.parent_dir = args.relay_dir
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for kind in kinds:
        if kind not in KINDS:
            raise SystemExit(f"--kinds: unknown kind {kind!r} (logical, txlog)")
    parallelisms = parse_parallelism(args.parallelism)

    print(f"# PostgreSQL dumps: Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"{args.rows:,} rows, chunk_rows {args.chunk_rows}, best of {args.repeat}, "
          f"synchronous_commit {args.synchronous_commit}, TxLog poll_ms "
          f"{args.txlog_poll_ms if args.txlog_poll_ms is not None else 'default (100)'}; "
          f"{loadavg()}; {code_version()}", flush=True)
    with postgres() as server:
        pg_pid = postmaster_pid(server)
        dbs: dict[str, Db] = {}
        for kind in kinds:
            db, seconds = prepare(server, kind, args.rows, args.synchronous_commit,
                                  args.txlog_poll_ms)
            if db.count() != args.rows:
                raise RuntimeError(f"{kind}: the table holds {db.count()} rows")
            dbs[kind] = db
            print(f"{kind}: {args.rows:,} rows loaded in {seconds:.1f} s, capture and "
                  f"watermark table set up ({db.uri().split('?', 1)[1]})", flush=True)
        for db in dbs.values():
            raw_copy(db, args.rows)  # warm-up: the table's pages into shared buffers

        copies: dict[str, list[Copy]] = {k: [] for k in kinds}
        dumps: dict[str, list[DumpRun]] = {k: [] for k in kinds}
        for _ in range(args.repeat):
            for kind, db in dbs.items():
                copies[kind].append(raw_copy(db, args.rows))
                dumps[kind].append(timed_dump(db, args.chunk_rows, args.rows, pg_pid))
                c = copies[kind][-1]
                print(f"{kind:>7}: raw COPY {c.rate:,.0f} rows/s ({c.seconds:.2f} s, "
                      f"{c.bytes / 1e6:.0f} MB, cpu {c.cpu:.2f} s); "
                      f"{pg_line(dumps[kind][-1], c.rate)}", flush=True)
        best_copy = {k: min(v, key=lambda c: c.seconds) for k, v in copies.items()}
        best_dump = {k: min(v, key=lambda d: d.seconds) for k, v in dumps.items()}

        par_runs: dict[str, list[DumpRun]] = {k: [] for k in kinds}
        par_note = ""
        if parallelisms:
            print(f"\n## {args.rows:,} rows by parallelism (one dump each)", flush=True)
        for kind, db in dbs.items():
            for p in parallelisms:
                if par_note:
                    break
                try:
                    d = timed_dump(db, args.chunk_rows, args.rows, pg_pid, parallelism=p)
                except ParallelismUnsupported as exc:
                    par_note = f"not supported by this relay (400 to the field: {exc})"
                    print(f"{kind} parallelism {p}: {par_note}", flush=True)
                    break
                par_runs[kind].append(d)
                print(f"{kind:>7}: {pg_line(d, best_copy[kind].rate)}", flush=True)

        print("\n## summary")
        for kind in kinds:
            d, c = best_dump[kind], best_copy[kind]
            print(f"1. {kind}: dump rows/s / raw COPY rows/s (goal >= 0.5): "
                  f"{d.rate / c.rate:.3f} ({d.rate:,.0f} / {c.rate:,.0f}; dump POST to done "
                  f"{d.seconds:.2f} s, {d.chunks} chunks; COPY {c.seconds:.2f} s)")
        if parallelisms:
            for kind in kinds:
                if par_runs[kind]:
                    print(f"2. {kind}: seconds to dump {args.rows:,} rows by parallelism: "
                          + ", ".join(f"{d.parallelism}: {d.seconds:.2f} "
                                      f"({d.rate / best_copy[kind].rate:.2f} of COPY)"
                                      for d in par_runs[kind]))
            if par_note:
                print(f"2. parallelism: {par_note}")
        print(f"end: {loadavg()}", flush=True)
        if args.plot and any(par_runs.values()):
            print(plot_parallelism(
                {f"{k} dump, chunk_rows {args.chunk_rows}": v for k, v in par_runs.items()},
                {f"raw COPY TO STDOUT ({k})": best_copy[k].seconds for k in kinds},
                args.rows, Path(args.plot),
                "databus dump of a PostgreSQL table by parallelism (issue 29)"))
        for kind, db in dbs.items():
            if kind == "logical":  # the slot would keep WAL; the server goes anyway
                with contextlib.suppress(psycopg2.Error):
                    db.run("SELECT pg_drop_replication_slot('bench_dump')")


if __name__ == "__main__":
    sys.exit(main())
