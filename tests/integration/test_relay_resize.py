"""A window larger than the buffer, then ``databus relay resize`` (issue 28 item 4,
DESIGN 17), on real processes and a SQLite source with triggers.

A transaction of about 2.5 MiB into a 1 MiB buffer: the fetcher fails and says the
capacity it needs (``/v1/status`` last error, ``/readyz`` 503); ``databus relay resize``
refuses in one line while the relay runs; the relay stopped, resize to the capacity
named keeps every window already there; the relay started again with that capacity
reads the big transaction as one window, and a client gets it whole after the windows
the buffer still held.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from tests.relay_harness import RelayProcess
from tests.unit.test_txlog_support import SqliteSource
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

DATABUS = str(Path(sys.executable).with_name("databus"))
BIG_ROWS = 250  # of 10 KB: about 2.5 MiB in one transaction


class Collect(Consumer):
    def __init__(self) -> None:
        self.windows: list[tuple[int, int]] = []  # (SCN, rows)
        self.rows = 0

    def on_data_event(self, event: DataEvent) -> None:
        self.rows += 1

    def on_end_data_event_sequence(self, scn: int) -> None:
        done = self.rows - sum(n for _, n in self.windows)
        self.windows.append((scn, done))


def _readyz(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_window_too_large_then_resize_keeps_every_window_and_lands_it(
        tmp_path: Path) -> None:
    source = SqliteSource(tmp_path / "shop.db",
                          "CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL)")
    source.install("orders")
    relay = RelayProcess(tmp_path, {"src": source.uri("orders")}, capacity_mb=1, workers=1)
    relay.start()
    try:
        for i in range(1, 6):
            source.txn(f"INSERT INTO orders (id, tag) VALUES ({i}, 'small')")
        wait_until(lambda: relay.status()["buffers"]["src"]["windows"] == 5, "5 windows", 30)
        big = ", ".join(f"({100 + i}, '{'x' * 10_000}')" for i in range(BIG_ROWS))
        source.txn(f"INSERT INTO orders (id, tag) VALUES {big}")
        wait_until(lambda: relay.status()["buffers"]["src"]["fetcher"]["state"] == "failed",
                   "the fetcher failed on the big window", 60)
        error = relay.status()["buffers"]["src"]["fetcher"]["last_error"]
        match = re.search(r"capacity_mb >= (\d+)", error)
        assert match and "databus relay resize" in error, error
        needed = int(match.group(1))
        assert needed >= 3
        assert _readyz(relay.url) == 503
        [fetcher] = [c for c in relay.status()["not_ready"] if c["component"] == "fetcher"]
        assert "databus relay resize" in fetcher["fix"], fetcher
        # Offline only: refused in one line while the relay runs.
        args = [DATABUS, "relay", "resize", "--config", str(relay.config_path),
                "--buffer", "src", "--capacity-mb", str(needed)]
        running = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert running.returncode != 0
        assert len(running.stderr.strip().splitlines()) == 1, running.stderr
        assert "is held by" in running.stderr and "stop it first" in running.stderr
        assert relay.proc is not None
        relay.proc.send_signal(signal.SIGTERM)
        assert relay.proc.wait(timeout=30) == 0
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        # What the buffer held is kept (the big window evicted the small ones while it
        # grew: a ring makes room for the window it writes) and so is its prev SCN.
        kept = int(re.search(r"([\d,]+) windows kept", done.stdout).group(1))  # type: ignore[union-attr]
        relay.config_path.write_text(relay.config_path.read_text().replace(
            "capacity_mb = 1", f"capacity_mb = {needed}"))
        relay.start()
        wait_until(lambda: relay.status()["buffers"]["src"]["max_scn"] is not None
                   and relay.status()["buffers"]["src"]["fetcher"]["state"] == "running"
                   and relay.status()["buffers"]["src"]["windows"] >= 1,
                   "the big window landed", 60)
        collect = Collect()
        client = DatabusClient([relay.url], sources=["shop.orders"],
                               checkpoint_store=MemoryCheckpointStore())

        class Stop(Consumer):
            def on_end_data_event_sequence(self, scn: int) -> None:
                if collect.rows >= kept + BIG_ROWS:
                    client.stop()

        client.register(collect)
        client.register(Stop())
        client.run()
        # The windows kept by the resize, then the big transaction as one window, whole.
        assert [n for _, n in collect.windows] == [1] * kept + [BIG_ROWS]
    finally:
        if relay.proc is not None and relay.proc.poll() is None:
            relay.kill()
        source.close()
