"""Every metric name the shipped alert rules (deploy/prometheus) and the Grafana
dashboard (deploy/grafana/databus.json) use is on a real daemon's /metrics: a
``databus relay`` process on a SQLite source (with a consumer), a ``databus bootstrap``
process (producer, applier, server) and ``databus replicate`` into SQLite with its
status server. A name the daemons do not export fails the check."""

from __future__ import annotations

import sqlite3
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.bootstrap_support import BootstrapProcess
from tests.integration.test_replicator_failures import (
    ReplicatorProcess,
    _sqlite_target,
    new_source,
)
from tests.relay_harness import RelayProcess, free_port
from tests.unit.test_deploy_grafana import exported_names, unknown_names
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def page(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return resp.read().decode()  # type: ignore[no-any-return]


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for p in reversed(started):
        if isinstance(p, ReplicatorProcess):
            p.cleanup()
        elif p.proc is not None and p.proc.poll() is None:
            p.kill()


def test_rules_and_dashboard_name_only_what_the_daemons_export(
        tmp_path: Path, processes: list[Any]) -> None:
    src = new_source(tmp_path)
    relay = RelayProcess(tmp_path, {"src": src.uri("orders")}, workers=1)
    processes.append(relay)
    relay.start()
    boot = BootstrapProcess(tmp_path, f"sqlite:///{tmp_path / 'bootstrap.db'}", relay.url,
                            "producer,applier,server", applier={"poll_interval_ms": 20})
    processes.append(boot)
    boot.start()
    target = _sqlite_target(tmp_path)
    port = free_port()
    repl = ReplicatorProcess(tmp_path, relay.url, target.url, bootstrap=boot.url,
                             settings=[f"metrics_port = {port}"])
    processes.append(repl)
    repl.start()
    # The replicator applied the rows (it reads the relay: a consumer the relay lists).
    wait_until(lambda: len(target.rows()) == 10, "the replica has the source's rows", 60,
               ignore=(sqlite3.OperationalError,), diagnose=repl.log)
    repl_url = f"http://127.0.0.1:{port}"
    pages = {"relay": page(relay.url), "bootstrap": page(boot.url),
             "replicator": page(repl_url)}
    assert 'databus_relay_consumer_lag_seconds{' in pages["relay"]
    exported = exported_names(pages.values())
    for daemon, prefix in [("relay", "databus_relay_"), ("bootstrap", "databus_bootstrap_"),
                           ("replicator", "databus_replicator_")]:
        assert prefix in pages[daemon] and "databus_component_up" in pages[daemon]
    assert unknown_names(exported) == {}
    # Not vacuous: each of these is used, and missing from the pages it would fail.
    for name in ("databus_relay_consumer_eviction_headroom_bytes",
                 "databus_bootstrap_cluster_role", "databus_replicator_lag_seconds",
                 "databus_relay_dumps_failed_total"):
        assert unknown_names(exported - {name}) != {}, name
