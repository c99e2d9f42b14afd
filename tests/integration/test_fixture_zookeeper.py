"""The zookeeper_server fixture: znodes work and ephemerals vanish with their session."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kazoo.client import KazooClient

from tests.fixtures.servers import ZooKeeperServer


@contextmanager
def _client(server: ZooKeeperServer) -> Iterator[KazooClient]:
    client = KazooClient(hosts=server.hosts, timeout=2.0)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()  # no-op if the test already stopped it
        client.close()


def test_ephemeral_znode_goes_away_with_its_session(zookeeper_server: ZooKeeperServer) -> None:
    assert zookeeper_server.four_letter_word("ruok") == "imok"
    with _client(zookeeper_server) as owner, _client(zookeeper_server) as observer:
        owner.ensure_path("/fixture")
        owner.create("/fixture/probe", b"hello", ephemeral=True)
        data, stat = owner.get("/fixture/probe")
        assert data == b"hello"
        assert stat.ephemeralOwner == owner.client_id[0]
        assert observer.exists("/fixture/probe") is not None

        # stop() closes the session, which deletes its ephemerals at once (no expiry wait).
        owner.stop()
        observer.sync("/fixture")
        assert observer.exists("/fixture/probe") is None


def test_restart_keeps_persistent_znodes(zookeeper_server: ZooKeeperServer) -> None:
    with _client(zookeeper_server) as client:
        client.create("/fixture-restart", b"kept", makepath=True)
    zookeeper_server.restart()
    with _client(zookeeper_server) as client:
        assert client.get("/fixture-restart")[0] == b"kept"
