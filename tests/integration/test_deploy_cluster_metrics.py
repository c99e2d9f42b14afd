"""What the "no leader" alert reads (deploy/prometheus: databus:relay_cluster_leaders:sum,
the sum of ``databus_relay_cluster_role{role="leader"}`` over a cluster's members), on
a real leader-follower cluster of two relay processes and the 3-node ZooKeeper
ensemble: one leader at a time, the follower says so, and after the leader is killed
the other member leads with a newer epoch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.servers import EnsembleChroot
from tests.integration.cluster_support import wait_for
from tests.integration.test_relay_cluster import DDL
from tests.relay_harness import RelayProcess, get_url
from tests.unit.test_txlog_support import SqliteSource

pytestmark = pytest.mark.integration


def roles(relay: RelayProcess) -> tuple[dict[str, float], float | None]:
    """This member's one-hot roles for buffer ``src``, and its epoch."""
    page = get_url(relay.url + "/metrics").decode()
    role: dict[str, float] = {}
    epoch = None
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == "databus_relay_cluster_role" and s.labels["buffer"] == "src":
                assert s.labels["cluster"] == "shop"
                role[s.labels["role"]] = s.value
            if s.name == "databus_relay_cluster_epoch" and s.labels["buffer"] == "src":
                epoch = s.value
    return role, epoch


@pytest.fixture
def source(tmp_path: Path) -> Iterator[SqliteSource]:
    src = SqliteSource(tmp_path / "shop.db", DDL)
    src.install("orders")
    src.txn("INSERT INTO orders (id, qty) VALUES (1, 1)")
    try:
        yield src
    finally:
        src.close()


def test_exactly_one_member_leads_and_a_failover_moves_the_lead(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot, source: SqliteSource) -> None:
    toml = ("[relay.cluster]\n" f'zookeeper = "{zookeeper_chroot.hosts}"\n'
            'name = "shop"\nmode = "leader-follower"\nsession_timeout_s = 4\n')
    relays = []
    for i in range(2):
        home = tmp_path / f"relay{i}"
        home.mkdir()
        relays.append(RelayProcess(home, {"src": source.uri("orders", poll_ms=10)},
                                   workers=1, extra_toml=toml))
    try:
        for relay in relays:
            relay.start()

        def settled() -> list[tuple[dict[str, float], float | None]] | None:
            seen = [roles(r) for r in relays
                    if r.proc is not None and r.proc.poll() is None]
            leaders = sum(role.get("leader", 0.0) for role, _ in seen)
            followers = sum(role.get("follower", 0.0) for role, _ in seen)
            return seen if (leaders, followers) == (1.0, len(seen) - 1.0) else None

        before = wait_for(settled, "one leader and the rest following", 60)
        for role, _ in before:
            assert set(role) == {"leader", "follower", "waiting"}
            assert sum(role.values()) == 1.0
        (old_epoch,) = {e for role, e in before if role["leader"] == 1.0}
        assert old_epoch is not None and old_epoch >= 1
        leader = next(r for r, (role, _) in zip(relays, before, strict=True)
                      if role["leader"] == 1.0)
        leader.kill()
        survivor = next(r for r in relays if r is not leader)
        role, epoch = wait_for(lambda: (lambda x: x if x[0]["leader"] == 1.0 else None)(
            roles(survivor)), "the survivor leading", 60)
        assert epoch is not None and epoch > old_epoch
        assert role["follower"] == role["waiting"] == 0.0
    finally:
        for relay in relays:
            if relay.proc is not None and relay.proc.poll() is None:
                relay.kill()
