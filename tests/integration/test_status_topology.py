"""``databus status --zookeeper`` (databus/_status_topology.py) on the 3-node ZooKeeper
ensemble: a relay process in a leader-follower cluster and a consumer group of two
real ``GroupCoordinator`` members; the command run as a subprocess (console script)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.client.group._coordinator import GroupCoordinator
from tests.fixtures.servers import EnsembleChroot
from tests.integration.cluster_support import cluster_toml, wait_for
from tests.integration.test_group_status import GROUP, ROOT, member, settled
from tests.relay_harness import RelayProcess
from tests.unit.test_txlog_support import SqliteSource

pytestmark = pytest.mark.integration

DATABUS = str(Path(sys.executable).with_name("databus"))
DDL = "CREATE TABLE orders (id INTEGER PRIMARY KEY, qty INTEGER)"


def status(*args: str) -> tuple[int, str, str]:
    done = subprocess.run([DATABUS, "status", "--timeout", "5", *args], capture_output=True,
                          text=True, timeout=60, check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def group(zookeeper_chroot: EnsembleChroot) -> Iterator[list[GroupCoordinator]]:
    admin = zookeeper_chroot.client()
    members = [member(zookeeper_chroot, "m0"), member(zookeeper_chroot, "m1")]
    try:
        members[0].start()
        wait_for(lambda: admin.exists(f"{ROOT}/assignment"), "m0's first assignment")
        members[1].start()
        wait_for(lambda: settled(admin, members), "every partition held")
        yield members
    finally:
        for m in members:
            m.close()


def test_status_shows_the_relay_cluster_and_the_groups_from_zookeeper(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot,
        group: list[GroupCoordinator]) -> None:
    src = SqliteSource(tmp_path / "shop.db", DDL)
    src.install("orders")
    home = tmp_path / "relay0"
    home.mkdir()
    relay = RelayProcess(home, {"src": src.uri("orders", poll_ms=10)}, workers=1,
                         extra_toml=cluster_toml(zookeeper_chroot))
    hosts = zookeeper_chroot.hosts
    relay.start()
    try:
        wait_for(lambda: relay.status()["buffers"]["src"]["cluster"]["role"] == "leader",
                 "the relay leads")

        def document() -> dict[str, Any] | None:
            code, out, _err = status("--relay", relay.url, "--zookeeper", hosts, "--json")
            doc: dict[str, Any] = json.loads(out)
            clusters = doc["clusters"].get("clusters") or []
            # The member node says "leader" once the relay has written its role there.
            if code == 0 and clusters and [(b["leader"], [r["role"] for r in b["members"]])
                                           for b in clusters[0]["buffers"]] == [
                    (relay.url, ["leader"])]:
                return doc
            return None
        doc = wait_for(document, "status with the cluster (its member leading) and the "
                       "group, exit 0")
        # The services' part is what it always was.
        assert [r["url"] for r in doc["relays"]] == [relay.url] and doc["ready"] is True
        assert doc["clusters"]["zookeeper"] == hosts and doc["clusters"]["ok"] is True
        [cluster] = doc["clusters"]["clusters"]
        assert (cluster["name"], cluster["mode"]) == ("shop", "leader-follower")
        assert [m["url"] for m in cluster["members"]] == [relay.url]
        [buffer] = cluster["buffers"]
        assert buffer["name"] == "src" and buffer["leader"] == relay.url
        assert buffer["epoch"] is not None and buffer["epoch"] >= 1
        [row] = buffer["members"]
        assert (row["url"], row["role"]) == (relay.url, "leader")
        [g] = doc["groups"]
        assert (g["group"], g["coordinator"], g["ok"]) == (GROUP, hosts, True)
        assert g["leader"] == "m0" and [m["member"] for m in g["members"]] == ["m0", "m1"]
        assert {p["state"] for p in g["partitions"]} == {"held"}

        # The terminal: the services' tables, then the clusters and the groups.
        code, out, err = status("--relay", relay.url, "--zookeeper", hosts)
        assert code == 0, err
        assert "relay cluster shop (leader-follower), 1 member" in out
        assert f"buffer src: leader {relay.url}, epoch {buffer['epoch']}" in out
        assert "Consumer groups (1)" in out and f"group {GROUP}: generation" in out
    finally:
        relay.kill()
        src.close()

    # The relay killed: its member node and its place in the election go with its
    # session; --zookeeper alone (no service named) says the buffer has no leader: 1.
    def leaderless() -> dict[str, Any] | None:
        code, out, _err = status("--zookeeper", hosts, "--json")
        doc: dict[str, Any] = json.loads(out)
        return doc if code == 1 and doc["clusters"]["ok"] is False else None
    doc = wait_for(leaderless, "the cluster without leader", timeout=30)
    assert doc["relays"] == [] and doc["ok"] is True  # no service named, none down
    assert "buffer src has no leader" in doc["clusters"]["clusters"][0]["problems"]
    assert doc["groups"][0]["ok"] is True  # the group still holds every partition


def test_status_says_when_zookeeper_does_not_answer(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, out, err = status("--zookeeper", f"127.0.0.1:{port}", "--json", "--timeout", "1")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["clusters"]["zookeeper"] == f"127.0.0.1:{port}"
    assert "cannot reach ZooKeeper" in doc["clusters"]["error"]
    assert doc["groups"] == [] and "Traceback" not in err
