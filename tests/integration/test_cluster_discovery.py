"""Relay discovery and ``databus cluster status`` (issue 16 items 3 and 5,
docs/clusters.md) on real processes: ``databus relay`` processes in a leader-follower
cluster over one SQLite source (captured by triggers) and the 3-node ZooKeeper ensemble.

- a client built with ``zookeeper=``/``cluster=`` starts on an empty cluster and waits,
  consumes once relays join, uses a relay added after it started, drops relays that
  were killed, and its windows are the source's transactions with no gap and no repeat;
- ``databus tail --zookeeper --cluster`` prints the events; ``databus cluster status``
  (tables and ``--json``) shows the leader, epochs and max SCNs of a live cluster, and
  exits 1 once the buffer has no leader;
- an unreachable ZooKeeper and a wrong connect string are clear errors at start.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from databus.checkpoint import Checkpoint
from databus.client import (
    CallbackResult,
    Consumer,
    DatabusClient,
    DataEvent,
    ZooKeeperUnreachable,
)
from databus.relay.cluster._cli import status as cluster_status
from tests.fixtures.servers import EnsembleChroot
from tests.integration.cluster_support import SESSION_S, OrdersWriter, cluster_toml, wait_for
from tests.relay_harness import RelayProcess, parse_windows
from tests.unit.test_txlog_support import SqliteSource

pytestmark = pytest.mark.integration

DDL = "CREATE TABLE orders (id INTEGER PRIMARY KEY, qty INTEGER)"
DATABUS = str(Path(sys.executable).with_name("databus"))


def relays_of(tmp_path: Path, src: SqliteSource, zk: EnsembleChroot, n: int
              ) -> list[RelayProcess]:
    out = []
    for i in range(n):
        home = tmp_path / f"relay{i}"
        home.mkdir()
        out.append(RelayProcess(home, {"src": src.uri("orders", poll_ms=10)}, workers=1,
                                extra_toml=cluster_toml(zk)))
    return out


def role_of(relay: RelayProcess) -> str:
    return str(relay.status()["buffers"]["src"]["cluster"]["role"])


def max_scn_of(relay: RelayProcess) -> int | None:
    scn = relay.status()["buffers"]["src"]["max_scn"]
    return None if scn is None else int(scn)


def held_events(relay: RelayProcess) -> list[tuple[int, Any]]:
    """(SCN, key) of every event ``relay`` holds, in order."""
    out: list[tuple[int, Any]] = []
    checkpoint: Checkpoint | None = None
    while True:
        query = {"sources": "shop.orders", "max_bytes": "1048576"}
        if checkpoint is not None:
            query["checkpoint"] = checkpoint.dumps()
        url = f"{relay.url}/v1/stream?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            windows = parse_windows(resp.read())
        if not windows:
            return out
        out += [(w.scn, key) for w in windows for _source, key, _value in w.events]
        checkpoint = Checkpoint(windows[-1].scn)


class Replica(Consumer):
    """Keeps the table as the events say, every window's SCN and every (SCN, key)."""

    def __init__(self) -> None:
        self.rows: dict[Any, dict[str, Any]] = {}
        self.windows: list[int] = []
        self.events: list[tuple[int, Any]] = []

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        self.events.append((event.scn, event.key))
        if event.op.name.lower() == "delete":
            self.rows.pop(event.key, None)
        else:
            assert event.value is not None
            self.rows[event.key] = {"id": event.value["id"], "qty": event.value["qty"]}
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        self.windows.append(scn)
        return CallbackResult.SUCCESS


def kill_all(relays: list[RelayProcess]) -> None:
    for relay in relays:
        if relay.proc is not None and relay.proc.poll() is None:
            relay.kill()


def test_a_client_follows_the_cluster_with_no_gap_and_no_repeat(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="databus")
    src = SqliteSource(tmp_path / "shop.db", DDL)
    src.install("orders")
    src.txn("INSERT INTO orders (id, qty) VALUES (1, 1)")
    relays = relays_of(tmp_path, src, zookeeper_chroot, 3)
    replica = Replica()
    client = DatabusClient(zookeeper=zookeeper_chroot.hosts, cluster="shop",
                           sources=["shop.orders"], backoff_initial=0.05, backoff_max=0.5,
                           client_id="discovery-test")
    client.register(replica)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            client.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    writer = OrdersWriter(src.path, pause_s=0.01)
    try:
        # An empty cluster: the client waits (and says so), it does not fail.
        thread.start()
        wait_for(lambda: "has no members" in caplog.text, "the client says it waits")
        time.sleep(0.5)
        assert thread.is_alive() and not errors and client.relays == []
        relays[0].start()
        relays[1].start()
        writer.start()
        wait_for(lambda: sorted(client.relays) == sorted(r.url for r in relays[:2]),
                 "the client sees the first two relays")
        wait_for(lambda: len(replica.windows) > 5, "the client consumes")
        # A relay added while the client runs is seen ...
        relays[2].start()
        wait_for(lambda: relays[2].url in client.relays, "the added relay discovered")
        # ... and the killed ones are dropped; the client goes on from the added one.
        for gone in relays[:2]:
            gone.kill()
            wait_for(lambda g=gone: g.url not in client.relays, "a killed relay dropped",
                     timeout=SESSION_S * 5)
        assert client.relays == [relays[2].url]
        wait_for(lambda: role_of(relays[2]) == "leader", "the added relay leads")
        at_kills = replica.windows[-1]
        wait_for(lambda: replica.windows[-1] > at_kills + 10,
                 "the client consumes from the added relay")
        writer.stop()
        top = wait_for(lambda: (scn := max_scn_of(relays[2])) and replica.windows
                       and replica.windows[-1] == scn and scn, "the client caught up")
        time.sleep(0.5)  # nothing more arrives
        assert max_scn_of(relays[2]) == top
        held = held_events(relays[2])
        assert not errors, errors
    finally:
        client.stop()
        thread.join(20)
        if writer.is_alive():
            writer.stop()
        kill_all(relays)
    # No gap, no repeat. Windows in SCN order, each once, up to the source's newest
    # transaction, and the rows the source has. A new leader reads the source again
    # from its own max SCN, and a trigger-captured source gives the rows as they are
    # now (grouped by one poll): around a leader change a member's windows may differ
    # from the ones the client took from the old leader, covering the same SCNs. From
    # the moment only the added relay was left, the client's events are exactly the
    # ones it holds.
    assert replica.windows == sorted(set(replica.windows))
    assert len(replica.windows) > 20
    (newest,) = src.conn.execute("SELECT max(scn) FROM databus_txlog").fetchone()
    assert top == newest
    assert [e for e in replica.events if e[0] > at_kills] == [
        e for e in held if e[0] > at_kills]
    source_rows = {row["id"]: row for row in src.rows("orders")}
    assert replica.rows == source_rows
    src.close()


def test_tail_and_cluster_status_on_a_live_cluster(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot) -> None:
    src = SqliteSource(tmp_path / "shop.db", DDL)
    src.install("orders")
    for i in range(1, 6):
        src.txn(f"INSERT INTO orders (id, qty) VALUES ({i}, {i * 10})")
    relays = relays_of(tmp_path, src, zookeeper_chroot, 3)
    hosts = zookeeper_chroot.hosts
    try:
        members_started = time.time()  # wall clock, as the members' updated_at
        for relay in relays:
            relay.start()
        leader = wait_for(lambda: [r for r in relays if role_of(r) == "leader"],
                          "a leader")[0]
        top = wait_for(lambda: (tops := {max_scn_of(r) for r in relays}) and len(tops) == 1
                       and tops.pop(), "the members at one max SCN")
        # databus tail through ZooKeeper
        done = subprocess.run(
            [DATABUS, "tail", "--zookeeper", hosts, "--cluster", "shop", "--sources",
             "shop.orders", "--from-earliest", "--exit"],
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert [(e["key"], e["value"]["qty"]) for e in lines] == [
            (i, i * 10) for i in range(1, 6)]
        # databus cluster status: wait until every member's node shows the newest SCN
        # (members rewrite their node every second) ...
        def current() -> dict[str, Any] | None:
            out = io.StringIO()
            assert cluster_status(hosts, "shop", as_json=True, out=out) == 0
            doc: dict[str, Any] = json.loads(out.getvalue())
            rows = doc["clusters"][0]["buffers"][0]["members"]
            return doc if len(rows) == 3 and all(r["max_scn"] == top for r in rows) else None
        wait_for(current, "the members' nodes up to date")
        # A bootstrap cluster's nodes, as bootstrap/_cluster.py lays them out (its
        # services are not started here: the status reads ZooKeeper only).
        zk = zookeeper_chroot.client()
        boot = "/databus/bootstrap/shop-bootstrap"
        zk.create(f"{boot}/members/member-", json.dumps({
            "url": "http://b1", "runs": {"producer": ["shop.orders"], "applier": []},
            "updated_at": time.time()}).encode(), ephemeral=True, sequence=True,
            makepath=True)
        assert zk.Lock(f"{boot}/stores/s1/producer", identifier="http://b1").acquire(
            timeout=10)
        zk.ensure_path(f"{boot}/stores/s1/applier")  # nobody runs it
        # ... then as a command, JSON and tables.
        done = subprocess.run([DATABUS, "cluster", "status", "--zookeeper", hosts,
                               "--cluster", "shop", "--cluster", "shop-bootstrap", "--json"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        [cluster] = doc["clusters"]
        assert cluster["name"] == "shop" and cluster["mode"] == "leader-follower"
        assert sorted(m["url"] for m in cluster["members"]) == sorted(r.url for r in relays)
        # How long ago each member rewrote its node: that they do (every second) is shown
        # above, by their nodes reaching the newest SCN; a busy machine may delay a
        # rewrite, but no node is older than its member (0.1: age_s is rounded).
        lived = time.time() - members_started
        assert all(0 <= m["age_s"] <= lived + 0.1 for m in cluster["members"]), (
            [m["age_s"] for m in cluster["members"]], lived)
        [buffer] = cluster["buffers"]
        epoch = leader.status()["buffers"]["src"]["cluster"]["epoch"]
        assert buffer["name"] == "src" and buffer["leader"] == leader.url
        assert buffer["epoch"] == epoch
        roles = {r["url"]: (r["role"], r["epoch"], r["max_scn"]) for r in buffer["members"]}
        assert roles == {r.url: ("leader" if r is leader else "follower", epoch, top)
                         for r in relays}
        assert cluster["problems"] == [] and doc["ok"] is True
        [bootstrap] = doc["bootstrap"]
        assert [(lk["store"], lk["component"], lk["holder"]) for lk in bootstrap["locks"]] \
            == [("s1", "applier", None), ("s1", "producer", "http://b1")]
        assert [m["url"] for m in bootstrap["members"]] == ["http://b1"]
        done = subprocess.run([DATABUS, "cluster", "status", "--zookeeper", hosts],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert "relay cluster shop (leader-follower), 3 members" in done.stdout
        assert f"buffer src: leader {leader.url}, epoch {epoch}" in done.stdout
        assert "bootstrap cluster shop-bootstrap, 1 member" in done.stdout
        for relay in relays:
            assert relay.url in done.stdout
        done = subprocess.run([DATABUS, "cluster", "status", "--zookeeper", hosts,
                               "--cluster", "nosuch"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 1
        assert "no relay cluster 'nosuch'" in done.stderr and "Traceback" not in done.stderr
        # Every member gone: the buffer has no leader, and the status says so (exit 1).
        kill_all(relays)

        def leaderless() -> str | None:
            out = io.StringIO()
            code = cluster_status(hosts, "shop", out=out)
            return out.getvalue() if code == 1 else None
        text = wait_for(leaderless, "no leader", timeout=SESSION_S * 5)
        assert "leader NONE" in text and "problem: buffer src has no leader" in text
    finally:
        kill_all(relays)
        src.close()


def test_an_unreachable_zookeeper_or_a_wrong_connect_string_is_a_clear_error() -> None:
    client = DatabusClient(zookeeper="127.0.0.1:1", cluster="shop", zookeeper_timeout=1.0)
    client.register(Replica())
    started = time.monotonic()
    with pytest.raises(ZooKeeperUnreachable, match=r"cannot reach ZooKeeper at 127\.0\.0\.1:1 "
                       r"within 1 s"):
        client.run()
    assert time.monotonic() - started < 10  # the 1 s of trying, ten times over
    # The interpreter's start and the command's imports, timed on their own: what a busy
    # machine stretches most, and no part of any timeout.
    started = time.monotonic()
    subprocess.run([DATABUS, "tail", "--help"], capture_output=True, timeout=60, check=True)
    startup = time.monotonic() - started
    for args, expect in (
        (["tail", "--zookeeper", "127.0.0.1:1", "--cluster", "shop",
          "--zookeeper-timeout", "1"], "databus tail: error: cannot reach ZooKeeper"),
        (["tail", "--zookeeper", "zk1:2181;zk2", "--cluster", "shop"],
         "expected host:port"),
        (["tail", "--zookeeper", "127.0.0.1:1"], "--zookeeper needs --cluster"),
        (["cluster", "status", "--zookeeper", "127.0.0.1:1", "--timeout", "1"],
         "databus cluster: error: cannot reach ZooKeeper"),
        (["cluster", "status", "--zookeeper", "zk1:2181;zk2"], "expected host:port"),
    ):
        started = time.monotonic()
        done = subprocess.run([DATABUS, *args], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 1, (args, done.stderr)
        assert expect in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
        # At most the 1 s of trying (none for a bad argument) after the start as
        # measured, five times over as slack for a busy machine.
        assert time.monotonic() - started < startup + 5, startup
