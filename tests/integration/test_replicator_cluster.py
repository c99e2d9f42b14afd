"""The replicator on a relay cluster (issues 19 and 16): ``zookeeper`` and ``cluster``
instead of relay URLs. Three relays in leader-follower mode over a SQLite source
(tests/integration/test_relay_cluster.py), a writer, the leader killed with SIGKILL
while the replicator copies into SQLite: the target ends equal to the source, its
recorded SCN the cluster's newest.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.servers import EnsembleChroot
from tests.integration.cluster_support import OrdersWriter, wait_for
from tests.integration.test_relay_cluster import (
    cluster,
    converged,
    leader_of,
)
from tests.relay_harness import RelayProcess
from tests.unit.test_txlog_support import SqliteSource

pytestmark = pytest.mark.integration

__all__ = ["cluster"]  # the fixture, used by name


def test_the_replicator_follows_a_relay_cluster_through_a_leader_kill(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot,
        cluster: tuple[SqliteSource, list[RelayProcess]]) -> None:
    src, relays = cluster
    target = tmp_path / "replica.db"
    config = tmp_path / "replicate.toml"
    config.write_text(
        "[replicate]\n" 'name = "copy"\n' f'zookeeper = "{zookeeper_chroot.hosts}"\n'
        'cluster = "shop"\n' f'target = "sqlite:///{target}"\n' "batch_ms = 50\n"
        "[[replicate.tables]]\n" 'source = "shop.orders"\n')
    with open(tmp_path / "replicate.log", "wb") as log:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("databus")),
                                 "replicate", "--config", str(config)],
                                stdout=log, stderr=log)

    def recorded() -> int:
        try:
            with sqlite3.connect(target) as conn:
                row = conn.execute("SELECT scn FROM databus_replication_state").fetchone()
        except sqlite3.Error:
            return -1
        return int(row[0]) if row else -1

    writer = OrdersWriter(src.path)
    try:
        leader = leader_of(relays)
        writer.start()
        wait_for(lambda: recorded() > 0, "the replicator applies")
        leader.kill()
        leader_of([r for r in relays if r is not leader])
        time.sleep(1.0)
        writer.stop()
        live = [r for r in relays if r is not leader]
        top = converged(live, src)
        wait_for(lambda: recorded() == top, f"the target at SCN {top}", timeout=60)
        assert proc.poll() is None, (tmp_path / "replicate.log").read_text()
        with sqlite3.connect(target) as conn:
            got = sorted(conn.execute("SELECT id, qty FROM orders").fetchall())
        assert got == sorted((r["id"], r["qty"]) for r in src.rows("orders")) != []
    finally:
        if writer.is_alive():
            writer.halt.set()
        proc.terminate()
        proc.wait(30)
