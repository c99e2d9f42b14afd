"""Relay clusters on MariaDB (issue 16): three relays in leader-follower mode on one
server's binlog and the 3-node ZooKeeper ensemble.

The leader is killed with SIGKILL while a 10,000-row transaction streams through it:
the window arrives whole, once, at every member (from the new leader for those that
had not got it), and at no moment does the cluster hold more than one binlog
connection (``SHOW PROCESSLIST`` sampled every 20 ms from start to end).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from tests.fixtures.servers import EnsembleChroot, MariaDBServer
from tests.integration.binlog_support import Sql, fresh_database, source_uri
from tests.integration.cluster_support import cluster_toml, wait_for
from tests.integration.test_relay_cluster import cluster_of, leader_of, stream
from tests.relay_harness import RelayProcess, parse_windows

pytestmark = pytest.mark.integration

ROWS = 10_000
SOURCE = "rcl_big.big"


class BinlogConnections(threading.Thread):
    """The number of binlog dump connections to the server, sampled until stopped."""

    def __init__(self, server: MariaDBServer) -> None:
        super().__init__(daemon=True)
        self.conn = pymysql.connect(**server.connect_kwargs(database=None))
        self.halt = threading.Event()
        self.samples: list[int] = []

    def now(self) -> int:
        with self.conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                        "WHERE COMMAND LIKE 'Binlog Dump%'")
            return int(cur.fetchone()[0])

    def run(self) -> None:
        while not self.halt.wait(0.02):
            self.samples.append(self.now())

    def stop(self) -> list[int]:
        self.halt.set()
        self.join(5)
        self.conn.close()
        return self.samples


@pytest.fixture
def binlog_cluster(tmp_path: Path, mariadb_server: MariaDBServer,
                   zookeeper_chroot: EnsembleChroot) -> Iterator[tuple[Sql, list[RelayProcess]]]:
    db = "rcl_big"
    sql = fresh_database(mariadb_server, db)
    sql.run("CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(100))")
    relays = []
    for i in range(3):
        home = tmp_path / f"relay{i}"
        home.mkdir()
        # Each member its own server id here (the server would end an older connection
        # of the same id): the count stays at one by the election alone.
        relays.append(RelayProcess(home, {"src": source_uri(mariadb_server, f"{db}.big")},
                                   workers=1, capacity_mb=32,
                                   extra_toml=cluster_toml(zookeeper_chroot, "binlog")))
    try:
        yield sql, relays
    finally:
        for relay in relays:
            if relay.proc is not None and relay.proc.poll() is None:
                relay.kill()
        sql.close()


def big_windows(relay: RelayProcess) -> list[tuple[int, int]]:
    """(events, the EOW's count) of every window of ``relay`` with more than one row."""
    body = b""
    for attempt in range(3):
        try:
            body = stream(relay, sources=SOURCE)
            break
        except OSError:
            time.sleep(0.2 * (attempt + 1))
    windows = parse_windows(body)
    return [(len(w.events), w.eow_count) for w in windows if len(w.events) > 1]


def test_leader_killed_while_a_10000_row_transaction_streams(
        binlog_cluster: tuple[Sql, list[RelayProcess]], mariadb_server: MariaDBServer) -> None:
    sql, relays = binlog_cluster
    connections = BinlogConnections(mariadb_server)
    for relay in relays:
        relay.start()
    connections.start()
    try:
        leader = leader_of(relays)
        sql.run("INSERT INTO big VALUES (0, 'before')")
        scn = sql.position()
        wait_for(lambda: all((cluster_of(r)["max_scn"] or 0) >= scn for r in relays),
                 "the members at the first row")
        top = sql.txn(f"INSERT INTO big SELECT seq, REPEAT('x', 80) FROM seq_1_to_{ROWS}")
        leader.kill()  # while the window is read, stored and chained
        rest = [r for r in relays if r is not leader]
        new = leader_of(rest)
        assert cluster_of(new)["cluster"]["epoch"] == 2
        wait_for(lambda: all((cluster_of(r)["max_scn"] or 0) >= top for r in rest),
                 "the members past the big transaction", timeout=60)
        sql.run("INSERT INTO big VALUES (-1, 'after')")
        end = sql.position()
        leader.start()
        wait_for(lambda: cluster_of(leader)["cluster"]["role"] == "follower"
                 and (cluster_of(leader)["max_scn"] or 0) >= end, "the old leader follows")
        wait_for(lambda: all((cluster_of(r)["max_scn"] or 0) >= end for r in relays),
                 "every member at the last row")
    finally:
        samples = connections.stop()
    for relay in relays:
        # Once, whole: one window of 10,000 rows, its EOW counting them, at every member.
        assert big_windows(relay) == [(ROWS, ROWS)], relay.url
    bodies = [stream(r, sources=SOURCE) for r in relays]
    assert bodies[0] == bodies[1] == bodies[2]
    assert samples and max(samples) == 1, samples  # one binlog connection at most
