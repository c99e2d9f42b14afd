"""A paused leader with workers (issue 27, item 4): three relays with ``workers = 2`` in
leader-follower mode on one MariaDB binlog and the 3-node ZooKeeper ensemble, and a
streaming ``DatabusClient`` given every member.

The client's stream is made to be served by one of the leader's workers (a client
whose connection the kernel gave the main process is replaced by another: a stopped
main process sends nothing, and its consumers notice by the missed heartbeats, as with
one process). The leader's main process (not its workers) is then stopped with SIGSTOP
for 2.5 session timeouts while transactions go on. Its worker keeps running: before the
fix it kept sending heartbeats, and the client stayed on the paused relay receiving
nothing for the whole pause. Now:

- the client gets windows past everything the paused leader held (so from another
  member) within 2 session timeouts of the pause, while the leader is still stopped;
- it loses no window and gets none torn or twice: its windows are the source's
  transactions, in commit order, each with the rows it wrote;
- resumed (SIGCONT), the old leader follows the new one, catches up, and is ready.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from databus.client import CallbackResult, Consumer, DatabusClient, DataEvent
from tests.fixtures.servers import EnsembleChroot, MariaDBServer, paused
from tests.integration.binlog_support import Sql, fresh_database, source_uri
from tests.integration.cluster_support import get_json, wait_for
from tests.integration.test_relay_cluster import cluster_of, leader_of
from tests.relay_harness import RelayProcess

pytestmark = pytest.mark.integration

DB = "rcl_paused"
SESSION_S = 3.0


def cluster_toml(zk: EnsembleChroot) -> str:
    return ("[relay.cluster]\n"
            f'zookeeper = "{zk.hosts}"\n'
            'name = "paused"\n'
            'mode = "leader-follower"\n'
            f"session_timeout_s = {SESSION_S}\n")


class Writes(threading.Thread):
    """Transactions of 1 to 3 upserts with known values; each one's SCN and rows."""

    def __init__(self, server: MariaDBServer) -> None:
        super().__init__(daemon=True, name="writes")
        self.sql = Sql(server, DB)
        self.halt = threading.Event()
        self.txns: list[tuple[int, list[tuple[int, int]]]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(27)
        n = 0
        try:
            while not self.halt.is_set():
                n += 1
                rows = [(k, n) for k in sorted(rng.sample(range(1, 100), rng.randint(1, 3)))]
                scn = self.sql.txn(*[f"INSERT INTO t VALUES ({k}, {v}) "
                                     f"ON DUPLICATE KEY UPDATE v = {v}" for k, v in rows])
                self.txns.append((scn, rows))
                time.sleep(0.02)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        assert self.error is None, self.error
        self.sql.close()


class Windows(Consumer):
    """Every window the client delivers: (SCN, rows, when it arrived)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int]] = []
        self.windows: list[tuple[int, list[tuple[int, int]], float]] = []
        self.lock = threading.Lock()

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        assert event.value is not None
        self.rows.append((int(event.value["id"]), int(event.value["v"])))
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        with self.lock:
            if self.rows:
                self.windows.append((scn, self.rows, time.monotonic()))
            self.rows = []
        return CallbackResult.SUCCESS

    def newest(self) -> int:
        with self.lock:
            return self.windows[-1][0] if self.windows else -1


def _socket_inodes(pid: int) -> set[int]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            found.add(int(link[8:-1]))
    return found


def serving_pids(port: int, pids: list[int]) -> set[int]:
    """Which of ``pids`` serve this process's TCP connections to ``port`` (Linux)."""
    rows = []
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            if parts[3] == "01":  # established
                rows.append((int(parts[1].split(":")[1], 16), int(parts[2].split(":")[1], 16),
                             int(parts[9])))
    mine = _socket_inodes(os.getpid())
    ours = {local for local, remote, inode in rows if remote == port and inode in mine}
    theirs = {inode for local, remote, inode in rows if local == port and remote in ours}
    return {pid for pid in pids if _socket_inodes(pid) & theirs}


def ready(relay: RelayProcess) -> bool:
    doc: dict[str, Any] = get_json(f"{relay.url}/readyz")
    return bool(doc["ready"])


def test_a_paused_workers_2_leader_is_left_within_two_session_timeouts(
        tmp_path: Path, mariadb_server: MariaDBServer,
        zookeeper_chroot: EnsembleChroot) -> None:
    sql = fresh_database(mariadb_server, DB)
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)")
    # One server id for every member (docs/clusters.md): a new leader's binlog
    # connection makes the server end the paused leader's.
    uri = source_uri(mariadb_server, f"{DB}.t")
    relays = []
    for i in range(3):
        home = tmp_path / f"relay{i}"
        home.mkdir()
        relays.append(RelayProcess(home, {"src": uri}, workers=2, capacity_mb=16,
                                   extra_toml=cluster_toml(zookeeper_chroot)))
    writer = Writes(mariadb_server)
    windows = Windows()
    client: DatabusClient | None = None
    try:
        for relay in relays:
            relay.start()
        leader = leader_of(relays)
        others = [r for r in relays if r is not leader]
        opening = sql.txn("INSERT INTO t VALUES (0, 0)")
        for relay in relays:
            wait_for(lambda r=relay: ready(r) and (cluster_of(r)["max_scn"] or 0) >= opening,
                     f"{relay.url} ready, with the first transaction")
        assert leader.proc is not None
        main = leader.proc.pid
        workers = [w["pid"] for w in leader.status()["workers"]]
        # A client starts at a random member, and the kernel gives its connection to
        # any process of that member: try until one streams from the leader's worker.
        for _attempt in range(60):
            windows = Windows()
            client = DatabusClient([r.url for r in relays], sources=[f"{DB}.t"],
                                   backoff_max=0.5)
            client.register(windows)
            threading.Thread(target=client.run, daemon=True).start()
            wait_for(lambda w=windows: w.windows, "the client at the first transaction")
            serving = serving_pids(leader.port, [main, *workers])
            if serving and serving <= set(workers):
                break
            client.stop()
            client = None
        assert client is not None, "no client of 60 streamed from the leader's worker"
        writer.start()
        wait_for(lambda: len(windows.windows) >= 20, "the client streaming from the leader")
        with paused(leader.proc, seconds=SESSION_S * 2.5):
            stopped = time.monotonic()
            wait_for(lambda: [r for r in others if cluster_of(r)["cluster"]["role"] == "leader"],
                     "a follower promoted", timeout=SESSION_S * 4)
        # Resumed: it follows, catches up, and says it is ready.
        wait_for(lambda: cluster_of(leader)["cluster"]["role"] == "follower",
                 "the old leader follows", timeout=SESSION_S * 4)
        time.sleep(0.5)
        writer.stop()
        last = writer.txns[-1][0]
        wait_for(lambda: windows.newest() >= last, "the client at the last transaction",
                 timeout=60)
        wait_for(lambda: all((cluster_of(r)["max_scn"] or 0) >= last for r in relays),
                 "every member at the last transaction", timeout=60)
        wait_for(lambda: ready(leader), "the old leader ready", timeout=SESSION_S * 4)
        # What the paused leader held: its history's newest epoch (the new leader's)
        # starts at the window it had when it was stopped.
        history = cluster_of(leader)["cluster"]["epochs"]
    finally:
        if writer.is_alive():
            writer.halt.set()
        if client is not None:
            client.stop()
        for relay in relays:
            if relay.proc is not None and relay.proc.poll() is None:
                relay.kill()
    sql.close()
    held = history[-1][1]
    # Failover: the first window past what the paused leader held came from another
    # member within 2 session timeouts of the pause (the leader stayed stopped 2.5).
    after = [at for scn, _, at in windows.windows if scn > held]
    assert after, (held, windows.newest())
    assert after[0] - stopped <= 2 * SESSION_S, (after[0] - stopped, held)
    # Nothing lost, torn or repeated: the source's transactions, in order, with their rows.
    assert [(scn, rows) for scn, rows, _ in windows.windows] == [(opening, [(0, 0)]),
                                                                 *writer.txns]
