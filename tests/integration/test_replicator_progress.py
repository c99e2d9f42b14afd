"""The progress of the initial copy (issue 19), on real processes: a SQLite source
captured by triggers, a ``databus relay`` process holding 1 MB, a ``databus bootstrap``
process (producer, applier, server) and ``databus replicate --config FILE`` into a
SQLite target, started once the source holds more than the relay does.

The copy goes through the bootstrap service. While it runs (held for a few seconds by a
write lock the test takes on the target file, so that "during" is not a race), the
replicator's stderr gets plain progress lines (stderr is a file here, not a terminal)
and its ``/v1/status`` says ``running`` with the rows of the bootstrap's estimate; at
the end one final line, ``done`` with every row, and the Prometheus gauges. ``assess``
reports the same estimate per table.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.bootstrap_support import BootstrapProcess
from tests.integration.test_replicator_failures import (
    ReplicatorProcess,
    Target,
    _sqlite_target,
    assert_equal,
    caught_up,
    new_source,
    relay_settled,
    wait_until,
)
from tests.relay_harness import RelayProcess, free_port

pytestmark = pytest.mark.integration

STEPS = 12
TXNS_PER_STEP = 25
ROWS_PER_TXN = 10
HOLD_SECONDS = 3.0


class ProgressReplicator(ReplicatorProcess):
    """The replicator with its stderr in a file of its own (the progress goes there) and
    a plain line every half second."""

    def __init__(self, tmp_path: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(tmp_path, *args, **kwargs)
        self.err_path = tmp_path / "replicate.err"

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as out, open(self.err_path, "ab") as err:
            self.proc = subprocess.Popen(
                [*self._args("--progress-interval", "0.5")], stdout=out, stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace") if self.err_path.exists() else ""

    def log(self) -> str:
        return f"{super().log()}\n--- stderr\n{self.stderr()}"


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    """The relay, the bootstrap service and the replicator, killed at the end."""
    started: list[Any] = []
    yield started
    for p in reversed(started):
        if isinstance(p, ReplicatorProcess):
            p.cleanup()
        elif p.proc is not None and p.proc.poll() is None:
            p.kill()


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode()  # type: ignore[no-any-return]


def copy_status(port: int) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(get(port, "/v1/status"))["initial_copy"]
    return doc


def copy_state(port: int) -> str | None:
    """The copy's state; None too while the status page is not served yet."""
    try:
        return copy_status(port)["state"]  # type: ignore[no-any-return]
    except (urllib.error.URLError, ConnectionError):
        return None


def table_exists(path: Path) -> bool:
    if not path.exists():
        return False
    conn = sqlite3.connect(path, timeout=10)
    try:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'orders'").fetchone() \
            is not None
    finally:
        conn.close()


def test_initial_copy_shows_its_progress_on_stderr_and_in_the_status(
        tmp_path: Path, processes: list[Any]) -> None:
    sqlite_target: Target = _sqlite_target(tmp_path)
    src = new_source(tmp_path)
    relay = RelayProcess(tmp_path, {"src": src.uri("orders")}, capacity_mb=1, workers=1)
    processes.append(relay)
    relay.start()
    boot = BootstrapProcess(tmp_path, f"sqlite:///{tmp_path / 'bootstrap.db'}", relay.url,
                            "producer,applier,server", applier={"poll_interval_ms": 20})
    processes.append(boot)
    boot.start()

    def boot_caught_up() -> int:
        top = relay_settled(relay)
        wait_until(lambda: (boot.status().get("applied_scn") or -1) >= top,
                   f"bootstrap applied SCN {top}")
        return top

    first = boot_caught_up()
    # More than the relay holds (1 MB), in steps the bootstrap's producer keeps up with;
    # every row a key of its own, so that the copy has many rows.
    key = 1000
    for _ in range(STEPS):
        for _ in range(TXNS_PER_STEP):
            statements = []
            for _ in range(ROWS_PER_TXN):
                key += 1
                statements.append(f"INSERT INTO orders (id, tag, qty, note) VALUES "
                                  f"({key}, 'p', {key % 97}, '{'x' * 1000}{key}')")
            src.txn(*statements)
        boot_caught_up()
    oldest = relay.status()["buffers"]["src"]["prev_scn"]
    assert oldest is not None and int(oldest) > first, "the relay still holds the start"
    rows = len(src.rows("orders"))
    assert rows == 10 + STEPS * TXNS_PER_STEP * ROWS_PER_TXN
    assert boot.status()["snapshot_rows"] == {"shop.orders": rows}

    port = free_port()
    repl = ProgressReplicator(
        tmp_path, relay.url, sqlite_target.url, bootstrap=boot.url,
        settings=[f"metrics_port = {port}", "max_request_bytes = 16384"])
    processes.append(repl)

    # assess: the bootstrap's count per table, as text and as JSON.
    result = repl.assess()
    assert result.returncode == 0, result
    assert f"about {rows:,} rows" in result.stdout, result
    as_json = subprocess.run(repl._args("assess", "--json"), capture_output=True, text=True,
                             timeout=60, check=False)
    assert json.loads(as_json.stdout)["tables"][0]["estimated_rows"] == rows, as_json

    repl.start()
    target_db = Path(sqlite_target.url.removeprefix("sqlite:///"))
    # The replicator creates the table, then copies: a write lock taken now holds the
    # copy at its first batches (the target waits for it, busy_timeout).
    wait_until(lambda: table_exists(target_db), "the target table created", repl=repl)
    lock = sqlite3.connect(target_db, timeout=30, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        wait_until(lambda: copy_state(port) is not None, "the copy began", repl=repl)
        wait_until(lambda: copy_status(port)["estimated_rows"] == rows,
                   "the copy's estimate", repl=repl)
        during = copy_status(port)
        time.sleep(HOLD_SECONDS)
        later = copy_status(port)
        page = get(port, "/metrics")
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    for doc in (during, later):
        assert doc["state"] == "running" and doc["start"] == "empty", doc
        assert doc["rows"] < rows and doc["estimated_rows"] == rows, doc
        assert doc["tables"] == {"shop.orders": {"rows": doc["rows"], "estimated_rows": rows}}
    assert later["elapsed_s"] > during["elapsed_s"] and later["rows"] == during["rows"]
    assert later["eta_s"] is None or later["eta_s"] > 0
    samples = {(s.name, s.labels.get("table")): s.value
               for f in text_string_to_metric_families(page) for s in f.samples}
    assert samples[("databus_replicator_initial_copy_running", None)] == 1
    assert samples[("databus_replicator_initial_copy_estimated_rows", "shop.orders")] == rows

    wait_until(lambda: copy_status(port)["state"] == "done", "the copy done", repl=repl)
    done = copy_status(port)
    assert done["rows"] == rows == done["estimated_rows"], done
    assert done["tables"] == {"shop.orders": {"rows": rows, "estimated_rows": rows}}
    assert done["eta_s"] is None and done["rows_per_second"] > 0
    samples = {(s.name, s.labels.get("table")): s.value
               for f in text_string_to_metric_families(get(port, "/metrics"))
               for s in f.samples}
    assert samples[("databus_replicator_initial_copy_running", None)] == 0
    assert samples[("databus_replicator_initial_copy_rows", "shop.orders")] == rows

    top = caught_up(relay, repl, sqlite_target)
    assert_equal(src, sqlite_target, top)
    # The final line is written at the next tick after the copy ended.
    wait_until(lambda: "initial copy done" in repl.stderr(), "the final line", repl=repl)
    assert repl.stop() == 0, repl.log()

    err = repl.stderr()
    assert "\r" not in err, "a terminal's redrawn line in a file"
    progress = [text for text in err.splitlines() if text.startswith("initial copy: ")]
    finals = [text for text in err.splitlines() if text.startswith("initial copy done")]
    shape = re.compile(r"initial copy: shop\.orders (?P<rows>[\d,]+)"
                       rf"(?P<of> of ~{rows:,} rows \(\d+%\)| rows); [\d,]+ rows/s; "
                       r"(\d+ s|\d+m\d\ds) elapsed(, ETA .+)?")
    matches = [shape.fullmatch(text) for text in progress]
    assert progress and all(matches), err
    # Held for HOLD_SECONDS, a line every half second: several, and none more often.
    assert 3 <= len(progress) <= done["elapsed_s"] / 0.5 + 1, err
    assert any(m is not None and m["of"] != " rows" for m in matches), err
    counts = [int(m["rows"].replace(",", "")) for m in matches if m is not None]
    assert counts == sorted(counts) and counts[-1] <= rows, err
    assert len(finals) == 1, err
    assert re.fullmatch(rf"initial copy done in (\d+ s|\d+m\d\ds): shop\.orders {rows:,} rows; "
                        r"[\d,]+ rows/s", finals[0]), err
    assert "initial copy" not in Path(repl.log_path).read_text(), "progress on stdout"
