"""How close the relay's fetcher lag in seconds is to the truth (DESIGN 17, issue 28's
acceptance: within 2 s on an idle and on a busy source, MariaDB and PostgreSQL).

For each source (a throwaway MariaDB and PostgreSQL 15, started as the test fixtures
start them) a relay runs in this process reading one table; a writer thread commits one
row per transaction with a growing id, recording the wall clock just before and just
after each commit. A sampler reads, every ``--every`` seconds and in one step, the
fetcher's ``lag_seconds`` (what ``/v1/status`` shows) and the id of the newest row in
the buffer. The truth at that moment is the age of the oldest committed row the buffer
does not have yet (the next id, if it was committed: somewhere between now minus its
"after" and now minus its "before"), or 0 when the buffer has every committed row. A
sample's error is its distance to that interval; "unknown" samples are counted apart
(there should be none: the source is up throughout).

Phases: ``busy`` (the writer at ``--rate`` transactions per second for ``--seconds``),
then ``idle`` (no write for ``--seconds``: heartbeats alone keep the figure true).

    .venv/bin/python benchmarks/lag_truth.py [--seconds 20] [--rate 200] [--every 0.2]
                                             [--sources mariadb,postgres]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402

from benchmarks._mariadb import connect, mariadb, source_uri  # noqa: E402
from benchmarks._pg import postgres  # noqa: E402
from databus.checkpoint import Checkpoint  # noqa: E402
from databus.cli import main as databus_main  # noqa: E402
from databus.event import decode_event, iter_events  # noqa: E402
from databus.relay._relay import Relay  # noqa: E402
from tests.relay_harness import relay_config  # noqa: E402

BUFFER = "lag"


class Writer:
    """Commits one row per transaction at ``rate`` per second while ``on`` is set;
    ``times[id] = (before, after)`` the commit, wall clock."""

    def __init__(self, insert: Callable[[int], None], rate: float) -> None:
        self.insert = insert
        self.rate = rate
        self.times: dict[int, tuple[float, float]] = {}
        self.next_id = 1
        self.on = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.on.wait(0.05):
                continue
            i = self.next_id
            before = time.time()
            self.insert(i)
            self.times[i] = (before, time.time())
            self.next_id = i + 1
            time.sleep(1 / self.rate)


def newest_id(relay: Relay) -> int:
    """The id of the newest row in the buffer (0: none)."""
    buffer = relay.buffers[BUFFER]
    top = buffer.state().max_scn
    if top is None:
        return 0
    data = buffer.read(Checkpoint(top - 1), max_bytes=1 << 20).data
    keys = [decode_event(data, off).key for off, header in iter_events(data)
            if not header.is_control]
    return max((k for k in keys if isinstance(k, int)), default=0)


def sample(relay: Relay, writer: Writer) -> tuple[float | None, float, float]:
    """(reported lag, truth low, truth high) at one moment."""
    have = newest_id(relay)
    reported = relay.fetchers.status()[BUFFER].lag_seconds
    now = time.time()
    pending = writer.times.get(have + 1)
    if pending is None:
        return reported, 0.0, 0.0
    before, after = pending
    return reported, max(0.0, now - after), max(0.0, now - before)


def run_phase(relay: Relay, writer: Writer, busy: bool, seconds: float, every: float
              ) -> dict[str, Any]:
    if busy:
        writer.on.set()
    errors: list[float] = []
    unknown = 0
    reported_max = 0.0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            reported, low, high = sample(relay, writer)
            if reported is None:
                unknown += 1
            else:
                reported_max = max(reported_max, reported)
                errors.append(max(0.0, low - reported, reported - high))
            time.sleep(every)
    finally:
        writer.on.clear()
    errors.sort()
    n = len(errors)
    return {"samples": n + unknown, "unknown": unknown,
            "max_error_s": round(errors[-1], 3) if n else None,
            "p99_error_s": round(errors[min(n - 1, int(n * 0.99))], 3) if n else None,
            "median_error_s": round(errors[n // 2], 3) if n else None,
            "max_reported_s": round(reported_max, 3)}


@contextmanager
def mariadb_source() -> Iterator[tuple[str, Callable[[int], None], float]]:
    with mariadb() as server:
        conn = connect(server)
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE IF NOT EXISTS lagb")
            cur.execute("CREATE TABLE lagb.t (id BIGINT PRIMARY KEY, v INT)")
        lock = threading.Lock()

        def insert(i: int) -> None:
            with lock, conn.cursor() as cur:
                cur.execute(f"INSERT INTO lagb.t VALUES ({i}, 1)")

        # The default heartbeat_ms (500).
        yield source_uri(server, "lagb.t", 7001), insert, 0.5
        conn.close()


@contextmanager
def postgres_source() -> Iterator[tuple[str, Callable[[int], None], float]]:
    with postgres() as server:
        conn = psycopg2.connect(**server.connect_kwargs(),
                                options="-c synchronous_commit=on")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id bigint PRIMARY KEY, v int)")
        uri = (f"{server.url()}?tables=public.t&slot=lagb&publication=lagb")
        assert databus_main(["pg", "setup", "--source", uri]) == 0

        def insert(i: int) -> None:
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO t VALUES ({i}, 1)")

        # The default heartbeat_s (1).
        yield uri, insert, 1.0
        conn.close()


def measure(name: str, source: Any, args: argparse.Namespace) -> dict[str, Any]:
    with source() as (uri, insert, heartbeat_s), tempfile.TemporaryDirectory() as tmp:
        relay = Relay(relay_config(Path(tmp), {BUFFER: uri}, capacity_mb=64))
        writer = Writer(insert, args.rate)
        relay.start()
        writer.thread.start()
        try:
            deadline = time.monotonic() + 60
            while relay.fetchers.status()[BUFFER].lag_seconds is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: the fetcher's lag never became known")
                time.sleep(0.1)
            busy = run_phase(relay, writer, True, args.seconds, args.every)
            idle = run_phase(relay, writer, False, args.seconds, args.every)
        finally:
            writer.stop.set()
            writer.thread.join(10)
            relay.close()
        return {"source": name, "heartbeat_s": heartbeat_s, "rows": writer.next_id - 1,
                "busy": busy, "idle": idle}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--sources", default="mariadb,postgres")
    args = parser.parse_args()
    sources = {"mariadb": mariadb_source, "postgres": postgres_source}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    worst = 0.0
    print("| source | phase | samples | unknown | median error | p99 error | max error "
          "| max reported |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in args.sources.split(","):
        result = measure(name, sources[name], args)
        for phase in ("busy", "idle"):
            r = result[phase]
            worst = max(worst, r["max_error_s"] or 0.0)
            print(f"| {name} (heartbeat {result['heartbeat_s']} s) | {phase} | {r['samples']} "
                  f"| {r['unknown']} | {r['median_error_s']} s | {r['p99_error_s']} s "
                  f"| {r['max_error_s']} s | {r['max_reported_s']} s |")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"worst error: {worst:.3f} s ({'within' if worst <= 2.0 else 'NOT within'} 2 s)")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
