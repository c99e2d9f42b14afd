"""Safe start and clean shutdown of every daemon (DESIGN 17; docs/operations.md, "Safe
start", "Runbook: not ready / second instance"), on real processes.

One pipeline for the module: a SQLite source with triggers, a ``databus relay``, a
``databus bootstrap`` (SQLite store, producer and applier) and a ``databus replicate``
(SQLite target, status server). A second instance of each, started by mistake on the
used port or on the held data dir or store, fails with one line on stderr and a
non-zero status, and changes nothing of the first: it stays ready (``/readyz`` 200), its
fencing tokens are unchanged, and new rows still flow through all three. At the end
each daemon is stopped by SIGTERM or SIGINT: status 0, one "stopped" line, no traceback.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from databus.bootstrap._storage import open_storage
from tests.integration.bootstrap_support import BootstrapProcess
from tests.relay_harness import RelayProcess, free_port, start_databus
from tests.unit.test_txlog_support import SqliteSource
from tests.waiting import wait_until

# One worker, in order: the module's pipeline is shared, and its last test stops it.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("safe_start")]

DDL = "CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL)"
DATABUS = str(Path(sys.executable).with_name("databus"))


def get(url: str) -> tuple[int, Any]:
    """Status and JSON body, whatever the status."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def ready(url: str) -> bool:
    status, doc = get(f"{url}/readyz")
    return status == 200 and doc["ready"] is True


def second(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``databus ARGS`` started by mistake: it must end by itself."""
    return subprocess.run([DATABUS, *args], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, check=False)


def assert_one_line_failure(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode != 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def assert_clean_stop(proc: subprocess.Popen[bytes], log: Path, sig: int, stopped: str) -> None:
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert stopped in text, text


@dataclass
class Pipeline:
    tmp: Path
    source: SqliteSource
    relay: RelayProcess
    bootstrap: BootstrapProcess
    replicate_config: Path
    replicate_port: int
    replicate_log: Path
    replicator: subprocess.Popen[bytes]
    target: Path
    rows: int = 0

    @property
    def replicate_url(self) -> str:
        return f"http://127.0.0.1:{self.replicate_port}"

    def write(self) -> int:
        """A new row at the source; its id."""
        self.rows += 1
        self.source.txn(f"INSERT INTO orders (id, tag) VALUES ({self.rows}, 't{self.rows}')")
        return self.rows

    def flows(self) -> None:
        """A row written now reaches the relay, the bootstrap log and the target."""
        before_relay = self.relay.status()["buffers"]["src"]["max_scn"] or 0
        key = self.write()
        wait_until(lambda: (self.relay.status()["buffers"]["src"]["max_scn"] or 0)
                   > before_relay, "the relay reads the new row", 20)
        scn = self.relay.status()["buffers"]["src"]["max_scn"]
        wait_until(lambda: (self.bootstrap.status()["applied_scn"] or 0) >= scn,
                   "the bootstrap service logs and applies it", 30)
        wait_until(lambda: self.target_has(key), "the replicator applies it", 30)

    def target_has(self, key: int) -> bool:
        conn = sqlite3.connect(self.target)
        try:
            return bool(conn.execute("SELECT count(*) FROM orders WHERE id = ?",
                                     (key,)).fetchone()[0])
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()

    def all_ready(self) -> None:
        for url in (self.relay.url, self.bootstrap.url, self.replicate_url):
            wait_until(lambda u=url: ready(u), f"{url}/readyz 200", 30)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("safe_start")
    source = SqliteSource(tmp / "shop.db", DDL)
    source.install("orders")
    relay = RelayProcess(tmp, {"src": source.uri("orders")}, workers=2)
    relay.start()
    bootstrap = BootstrapProcess(tmp, f"sqlite:///{tmp / 'bootstrap.db'}", relay.url,
                                 "producer,applier,server")
    bootstrap.start()
    port = free_port()
    config = tmp / "replicate.toml"
    config.write_text("\n".join([
        "[replicate]", 'name = "copy"', f'relays = ["{relay.url}"]',
        f'target = "sqlite:///{tmp / "target.db"}"', "batch_ms = 50",
        f"metrics_port = {port}", "[[replicate.tables]]", 'source = "shop.orders"']) + "\n")
    log = tmp / "replicate.log"
    pipe = Pipeline(tmp, source, relay, bootstrap, config, port, log,
                    start_databus(["replicate", "--config", str(config), "--no-progress"],
                                  port, log),
                    tmp / "target.db")
    try:
        pipe.flows()
        pipe.all_ready()
        yield pipe
    finally:
        for proc in (pipe.replicator, bootstrap.proc, relay.proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=20)
        source.close()


def test_a_second_relay_changes_nothing_of_the_first(pipeline: Pipeline) -> None:
    p = pipeline
    # The same config: the port is in use.
    done = second(["relay", "--config", str(p.relay.config_path)], p.tmp)
    assert_one_line_failure(done, "databus relay: error:", "cannot listen", str(p.relay.port))
    # Another port, the same data dir: held by the first.
    other = p.tmp / "relay-other-port.toml"
    other.write_text(p.relay.config_path.read_text().replace(
        f"port = {p.relay.port}", f"port = {free_port()}"))
    done = second(["relay", "--config", str(other)], p.tmp)
    assert_one_line_failure(done, "databus relay: error:", "relay data dir", "is held by "
                            f"process {p.relay.proc.pid if p.relay.proc else ''}")
    assert ready(p.relay.url)
    p.flows()


def test_a_second_bootstrap_changes_nothing_of_the_first(pipeline: Pipeline) -> None:
    """The issue's case: a second ``databus bootstrap`` on a used port took the store's
    fencing tokens first, fencing the live service's producer and applier for good."""
    p = pipeline
    store = open_storage(f"sqlite:///{p.tmp / 'bootstrap.db'}")
    try:
        tokens = store.fence_tokens()
        assert set(tokens) == {"producer", "applier"}
        args = ["bootstrap", "--config", str(p.bootstrap.config_path), "--run",
                "producer,applier,server"]
        done = second(args, p.tmp)
        assert_one_line_failure(done, "databus bootstrap: error:", "cannot listen",
                                str(p.bootstrap.port))
        # Another port, the same store: its producer and applier are held.
        done = second([*args, "--port", str(free_port())], p.tmp)
        assert_one_line_failure(done, "databus bootstrap: error:", "the producer of bootstrap "
                                "store", "is held by process")
        assert store.fence_tokens() == tokens  # nobody was fenced
    finally:
        store.close()
    status = p.bootstrap.status()
    assert status["ready"] is True and status["not_ready"] == []
    assert {c["state"] for c in status["components"].values()} == {"running"}
    assert ready(p.bootstrap.url)
    p.flows()


def test_a_second_replicator_changes_nothing_of_the_first(pipeline: Pipeline) -> None:
    p = pipeline
    done = second(["replicate", "--config", str(p.replicate_config), "--no-progress"], p.tmp)
    assert_one_line_failure(done, "databus replicate: error:", "cannot listen",
                            str(p.replicate_port))
    # Another status port (or none), the same replication on the same target: held.
    other = p.tmp / "replicate-other-port.toml"
    other.write_text(p.replicate_config.read_text().replace(
        f"metrics_port = {p.replicate_port}", f"metrics_port = {free_port()}"))
    done = second(["replicate", "--config", str(other), "--no-progress"], p.tmp)
    assert_one_line_failure(done, "databus replicate: error:", "replication copy on target",
                            "is held by process")
    assert ready(p.replicate_url)
    p.flows()


def test_component_metrics_of_bootstrap_and_replicator(pipeline: Pipeline) -> None:
    p = pipeline
    with urllib.request.urlopen(f"{p.bootstrap.url}/metrics", timeout=5) as resp:
        page = resp.read().decode()
    assert ('databus_component_up{buffer="",component="producer",daemon="bootstrap"} 1.0'
            in page)
    assert ('databus_component_state{buffer="",component="applier",daemon="bootstrap",'
            'state="fenced"} 0.0' in page)
    with urllib.request.urlopen(f"{p.replicate_url}/metrics", timeout=5) as resp:
        page = resp.read().decode()
    assert ('databus_component_up{buffer="",component="replicator",daemon="replicator"} 1.0'
            in page)
    assert ('databus_component_state{buffer="",component="replicator",daemon="replicator",'
            'state="running"} 1.0' in page)


def test_a_fenced_producer_and_applier_are_not_ready(pipeline: Pipeline) -> None:
    """Never "healthy while not": a service whose producer and applier were fenced (a
    newer token taken on its store) answers /readyz 503, names them, and says why."""
    p = pipeline
    tmp = p.tmp / "fenced"
    tmp.mkdir()
    url = f"sqlite:///{tmp / 'bootstrap.db'}"
    service = BootstrapProcess(tmp, url, p.relay.url, "producer,applier,server")
    service.start()
    try:
        wait_until(lambda: ready(service.url), "the second store's service ready", 30)
        store = open_storage(url)
        try:
            store.take_fence("producer")  # what a second service used to do at start
            store.take_fence("applier")
        finally:
            store.close()
        p.write()  # the next writes find their tokens gone
        wait_until(lambda: get(f"{service.url}/readyz")[0] == 503, "/readyz 503", 30)
        wait_until(lambda: {c["component"] for c in
                            get(f"{service.url}/readyz")[1]["components"]
                            if c["state"] == "fenced"} == {"producer", "applier"},
                   "producer and applier fenced", 30,
                   diagnose=lambda: json.dumps([service.status(), p.relay.status()]))
        status, doc = get(f"{service.url}/readyz")
        assert status == 503 and doc["error"] == "not_ready"
        [producer] = [c for c in doc["components"] if c["component"] == "producer"]
        assert producer["error"] == "producer_fenced"
        assert "fencing token" in producer["fix"]
        assert producer["message"]
        assert get(f"{service.url}/healthz")[0] == 200  # alive, not ready
        assert service.status()["not_ready"][0]["error"].endswith("_fenced")
    finally:
        service.kill()


@pytest.mark.parametrize("daemon", ["replicator", "bootstrap", "relay"])
def test_signals_end_each_daemon_with_status_0(pipeline: Pipeline, daemon: str) -> None:
    """Last in the module: each daemon of the pipeline stopped by a signal; the relay,
    which runs a worker process, by SIGINT."""
    p = pipeline
    if daemon == "replicator":
        assert_clean_stop(p.replicator, p.replicate_log, signal.SIGTERM,
                          "replication copy: stopping (SIGTERM)")
    elif daemon == "bootstrap":
        assert p.bootstrap.proc is not None
        assert_clean_stop(p.bootstrap.proc, p.bootstrap.log_path, signal.SIGTERM,
                          "bootstrap service stopped (SIGTERM)")
    else:
        assert p.relay.proc is not None
        proc = p.relay.proc
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0, p.relay.log_path.read_text()
        text = p.relay.log_path.read_text()
        assert "Traceback" not in text and "relay stopped (SIGINT)" in text, text
