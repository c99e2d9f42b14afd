"""ZooKeeper digest credentials and ACLs on the real 3-node ensemble (DESIGN 18,
docs/clusters.md "ZooKeeper credentials and ACLs").

With ``digest:user:password@hosts/chroot``:

- a relay cluster (two ``databus relay`` processes, leader-follower) elects a leader;
  every node under its tree carries the digest identity (all rights) and ``world:anyone``
  READ: a session without the digest, or with a wrong password, can read (discovery and
  ``cluster status`` work without it) but neither create, set nor delete anything;
- a consumer group (two coordinators) balances and rebalances; every node of the group
  carries the digest identity only: the other sessions cannot even read them, and
  ``group status`` without the credentials is a clear ``ZooKeeperNotAuthorized``;
- a ZooKeeper checkpoint store's znode and parents likewise; a store with a wrong
  password is refused with a clear ``CheckpointError``;
- bootstrap HA's locks (the same member and Lock recipe) hand over, and nobody without
  the digest can delete the holder's lock node;
- a member with a wrong password is a clear error at start;
- ``python -m databus.coordination secure`` gives a tree made without credentials the
  ACLs, and rotates the password (old one kept, members roll, old one removed);
- the password never appears in the relays' logs, in the status commands' output, in
  log records or in exceptions.
"""

from __future__ import annotations

import io
import json
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import READ_ACL_UNSAFE, make_digest_acl

from databus.checkpoint import Checkpoint
from databus.client._checkpoint_zookeeper import ZooKeeperCheckpointStore
from databus.client._discovery import RelayDiscovery
from databus.client.group._cli import status as group_status
from databus.client.group._coordinator import GroupCoordinator, partition_checkpoint_store
from databus.config._bootstrap import BootstrapClusterConfig
from databus.coordination import LockContender, ZooKeeperMember, ZooKeeperNotAuthorized
from databus.coordination.__main__ import main as coordination_main
from databus.errors import CheckpointError
from databus.relay.cluster._cli import status as cluster_status
from tests.fixtures.servers import EnsembleChroot
from tests.integration.cluster_support import SESSION_S, wait_for
from tests.relay_harness import RelayProcess
from tests.unit.test_txlog_support import SqliteSource
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

USER = "databus"
PW = "zk-acl:test@pw"  # ':' and '@' in it on purpose
OWNER = make_digest_acl(USER, PW, all=True)
PUBLIC_ACL = [OWNER, *READ_ACL_UNSAFE]
SENSITIVE_ACL = [OWNER]


@dataclass
class Secured:
    """The test's chroot, its digest connect string and three sessions on it."""

    zk: EnsembleChroot
    connect: str  # digest:databus:<PW>@hosts/chroot
    owner: Any  # authenticated with the digest
    anonymous: Any  # no credentials
    wrong: Any  # the right user, a wrong password

    def nodes(self, path: str) -> list[str]:
        """``path`` and every node under it (read with the digest)."""
        out = [path]
        for child in sorted(self.owner.get_children(path)):
            out += self.nodes(f"{path.rstrip('/')}/{child}")
        return out

    def acls_of(self, path: str) -> dict[str, list[Any]]:
        return {node: self.owner.get_acls(node)[0] for node in self.nodes(path)}


@pytest.fixture
def secured(zookeeper_chroot: EnsembleChroot) -> Iterator[Secured]:
    zk = zookeeper_chroot
    owner = zk.client(auth_data=[("digest", f"{USER}:{PW}")])
    yield Secured(zk, f"digest:{USER}:{PW}@{zk.hosts}", owner, zk.client(),
                  zk.client(auth_data=[("digest", f"{USER}:wrong-password")]))
    # The fixture's cleanup has no credentials: remove the protected nodes first.
    for child in owner.get_children("/"):
        owner.delete(f"/{child}", recursive=True)


def refuses_changes(client: Any, node: str) -> None:
    """``client`` may neither change, delete nor create under ``node``."""
    with pytest.raises(NoAuthError):
        client.set(node, b"forged")
    with pytest.raises(NoAuthError):
        client.create(f"{node}/intruder", b"x")
    if node.count("/") > 1:  # deleting needs the parent's DELETE right
        with pytest.raises(NoAuthError):
            client.delete(node, recursive=False)


def refuses_reads(client: Any, node: str) -> None:
    with pytest.raises(NoAuthError):
        client.get(node)
    with pytest.raises(NoAuthError):
        client.get_children(node)


# -- relay cluster ----------------------------------------------------------------------


def test_a_relay_cluster_with_credentials_elects_and_its_nodes_are_read_only_to_others(
        tmp_path: Path, secured: Secured, monkeypatch: pytest.MonkeyPatch) -> None:
    # The config takes the password from the environment, as an operator would.
    monkeypatch.setenv("DATABUS_TEST_ZK_PW", PW)
    section = ("[relay.cluster]\n"
               f'zookeeper = "digest:{USER}:${{DATABUS_TEST_ZK_PW}}@{secured.zk.hosts}"\n'
               'name = "shop"\nmode = "leader-follower"\n'
               f"session_timeout_s = {SESSION_S}\n")
    src = SqliteSource(tmp_path / "shop.db", "CREATE TABLE orders (id INTEGER PRIMARY KEY, "
                                             "qty INTEGER)")
    src.install("orders")
    src.txn("INSERT INTO orders (id, qty) VALUES (1, 1)")
    relays = []
    for i in range(2):
        home = tmp_path / f"relay{i}"
        home.mkdir()
        relays.append(RelayProcess(home, {"src": src.uri("orders", poll_ms=10)}, workers=1,
                                   extra_toml=section))
    try:
        for relay in relays:
            relay.start()

        def roles() -> list[str] | None:
            found = sorted(str(r.status()["buffers"]["src"]["cluster"]["role"])
                           for r in relays)
            return found if found == ["follower", "leader"] else None

        wait_for(roles, "one leader and one follower")
        tree = "/databus/relays/shop"
        acls = secured.acls_of(tree)
        assert len(acls) >= 5  # the cluster, members, two members, the election...
        wrong = {node: acl for node, acl in acls.items() if acl != PUBLIC_ACL}
        assert not wrong, wrong
        assert secured.owner.get_acls("/databus")[0] == PUBLIC_ACL  # parents too
        members = secured.owner.get_children(f"{tree}/members")
        assert len(members) == 2
        for client in (secured.anonymous, secured.wrong):
            # Anyone may read: discovery and monitoring need no password.
            data, _ = client.get(f"{tree}/members/{members[0]}")
            assert json.loads(data)["url"] in {r.url for r in relays}
            for node in acls:
                refuses_changes(client, node)
        # Discovery without credentials follows the members.
        discovery = RelayDiscovery(secured.zk.hosts, "shop", timeout=10.0)
        try:
            assert sorted(discovery.start()) == sorted(r.url for r in relays)
        finally:
            discovery.close()
        # cluster status with the credentials: the password is not shown.
        out = io.StringIO()
        assert cluster_status(secured.connect, "shop", as_json=True, out=out) == 0
        doc = json.loads(out.getvalue())
        assert doc["zookeeper"] == f"digest:{USER}:***@{secured.zk.hosts}"
        assert sorted(m["url"] for m in doc["clusters"][0]["members"]) == sorted(
            r.url for r in relays)
        assert PW not in out.getvalue()
    finally:
        for relay in relays:
            if relay.proc is not None and relay.proc.poll() is None:
                relay.kill(signal.SIGTERM)
    for relay in relays:
        log = relay.log_path.read_text()
        assert PW not in log and "zk-acl" not in log, log


def test_a_member_with_a_wrong_password_is_a_clear_error_at_start(
        secured: Secured, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    first = ZooKeeperMember(secured.connect, 4.0, "/databus/relays/shop/members",
                            "relay.cluster.zookeeper", "http://r1")
    first.connect()
    try:
        intruder = ZooKeeperMember(secured.connect.replace(PW, "not-the-password"), 4.0,
                                   "/databus/relays/shop/members", "relay.cluster.zookeeper",
                                   "http://r2")
        with pytest.raises(ZooKeeperNotAuthorized) as caught:
            intruder.connect()
        message = str(caught.value)
        assert "refused to let ZooKeeper user 'databus' register under " \
               "/databus/relays/shop/members (relay.cluster.zookeeper)" in message
        assert "not-the-password" not in message and PW not in message
        assert len(secured.owner.get_children("/databus/relays/shop/members")) == 1
    finally:
        first.leave()
    assert PW not in caplog.text and "not-the-password" not in caplog.text


# -- consumer group ---------------------------------------------------------------------

GROUP = "billing"
P = 4


def test_a_consumer_group_with_credentials_rebalances_and_others_cannot_even_read_it(
        secured: Secured, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    members: list[GroupCoordinator] = []
    for name in ("m0", "m1"):

        def revoked(parts: tuple[int, ...], name: str = name) -> None:
            next(m for m in members if m.member_id == name).release(parts)

        members.append(GroupCoordinator(secured.connect, GROUP, P, name, on_revoked=revoked,
                                        session_timeout_s=6.0, poll_s=0.2))
    try:
        for m in members:
            m.start()

        def shares() -> list[tuple[int, ...]] | None:
            owned = [m.owned for m in members]
            spread = sorted(p for parts in owned for p in parts)
            return owned if spread == list(range(P)) and all(owned) else None

        wait_until(shares, "both members hold partitions", 20)
        # A partition checkpoint, written as a member's store writes it.
        with partition_checkpoint_store(secured.connect, GROUP, 0, timeout=5.0) as store:
            store.store(Checkpoint(42))
        root = f"/databus/groups/{GROUP}"
        acls = secured.acls_of(root)
        assert {f"{root}/members", f"{root}/owners", f"{root}/assignment",
                f"{root}/leader", f"{root}/checkpoints/0"} <= set(acls)
        wrong = {node: acl for node, acl in acls.items() if acl != SENSITIVE_ACL}
        assert not wrong, wrong
        for client in (secured.anonymous, secured.wrong):
            for node in acls:
                refuses_reads(client, node)
                refuses_changes(client, node)
        # group status: with the credentials it reads the group ...
        out = io.StringIO()
        assert group_status(secured.connect, GROUP, as_json=True, out=out) == 0
        doc = json.loads(out.getvalue())
        assert doc["coordinator"] == f"digest:{USER}:***@{secured.zk.hosts}"
        assert "m0" in out.getvalue() and "m1" in out.getvalue()
        assert PW not in out.getvalue()
        # ... without them, a clear refusal.
        for connect in (secured.zk.hosts, secured.connect.replace(PW, "not-the-password")):
            with pytest.raises(ZooKeeperNotAuthorized, match="refused to let") as caught:
                group_status(connect, GROUP, out=io.StringIO())
            assert "not-the-password" not in str(caught.value)
        # A member leaves: the other takes every partition, through the protected nodes.
        members[0].close()
        wait_until(lambda: members[1].owned == tuple(range(P)), "m1 holds all", 20)
        assert secured.acls_of(f"{root}/owners") == {
            node: SENSITIVE_ACL for node in secured.nodes(f"{root}/owners")}
    finally:
        for m in members:
            m.close()
    # kazoo logs its auth packet at DEBUG: the password is cut out of it.
    assert f"auth='{USER}:***'" in caplog.text
    assert PW not in caplog.text


# -- checkpoint store -------------------------------------------------------------------


def test_a_checkpoint_store_with_credentials_keeps_its_znode_to_itself(
        secured: Secured, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with ZooKeeperCheckpointStore(secured.connect, "orders-indexer", timeout=5.0) as store:
        store.store(Checkpoint(7))
        assert store.load() == Checkpoint(7)
        assert PW not in repr(store)
    path = "/databus/checkpoints/orders-indexer"
    assert secured.acls_of("/databus") == {
        node: SENSITIVE_ACL for node in ("/databus", "/databus/checkpoints", path)}
    for client in (secured.anonymous, secured.wrong):
        refuses_reads(client, path)
        refuses_changes(client, path)
        refuses_changes(client, "/databus/checkpoints")
    for connect in (secured.zk.hosts, secured.connect.replace(PW, "not-the-password")):
        with ZooKeeperCheckpointStore(connect, "orders-indexer", timeout=5.0) as other:
            with pytest.raises(CheckpointError, match="ZooKeeper refused it") as caught:
                other.load()
            assert "not-the-password" not in str(caught.value)
            with pytest.raises(CheckpointError, match="ZooKeeper refused it"):
                other.store(Checkpoint(8))
    with ZooKeeperCheckpointStore(secured.connect, "orders-indexer", timeout=5.0) as store:
        assert store.load() == Checkpoint(7)  # untouched
    with pytest.raises(NoNodeError):
        secured.owner.get(f"{path}/intruder")
    assert PW not in caplog.text


# -- securing an existing tree, rotating the password -----------------------------------

NEW_PW = "rotated-zk-password"
NEW_OWNER = make_digest_acl(USER, NEW_PW, all=True)


def plain_tree(client: Any) -> None:
    """Nodes as a deployment without credentials left them (open to anyone)."""
    client.create("/databus/relays/shop/members/member-0000000000", b"{}", makepath=True)
    client.create("/databus/relays/shop/buffers/src/epoch", b"3", makepath=True)
    client.create("/databus/groups/billing/assignment", b"{}", makepath=True)
    client.create("/databus/checkpoints/orders-indexer", b"{}", makepath=True)


def test_secure_gives_an_open_tree_the_acls_and_rotates_the_password(
        secured: Secured, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    plain_tree(secured.anonymous)
    monkeypatch.setenv("DATABUS_TEST_ZK_PW", PW)
    connect = f"digest:{USER}:${{DATABUS_TEST_ZK_PW}}@{secured.zk.hosts}"
    assert coordination_main(["secure", "--zookeeper", connect]) == 0
    assert "set the ACL of 13 node(s); 0 already had it" in capsys.readouterr().out
    public = secured.acls_of("/databus/relays")
    assert public == {node: PUBLIC_ACL for node in public}
    for subtree in ("/databus/groups", "/databus/checkpoints"):
        closed = secured.acls_of(subtree)
        assert closed == {node: SENSITIVE_ACL for node in closed}
    refuses_changes(secured.anonymous, "/databus/relays/shop/buffers/src/epoch")
    refuses_reads(secured.anonymous, "/databus/checkpoints/orders-indexer")
    assert coordination_main(["secure", "--zookeeper", connect]) == 0
    assert "set the ACL of 0 node(s); 13 already had it" in capsys.readouterr().out

    # Rotation, step 1: the new password, the old one kept in every ACL.
    monkeypatch.setenv("DATABUS_TEST_ZK_PW", NEW_PW)
    monkeypatch.setenv("DATABUS_TEST_ZK_OLD", f"{USER}:{PW}")
    assert coordination_main(["secure", "--zookeeper", connect, "--previous-env",
                              "DATABUS_TEST_ZK_OLD", "--keep-previous"]) == 0
    capsys.readouterr()
    assert secured.owner.get_acls("/databus/checkpoints/orders-indexer")[0] == [
        NEW_OWNER, OWNER]
    # Step 2, the rolling restart: members with either password work meanwhile.
    old_connect = secured.connect
    new_connect = f"digest:{USER}:{NEW_PW}@{secured.zk.hosts}"
    for each in (old_connect, new_connect):
        with ZooKeeperCheckpointStore(each, "orders-indexer", timeout=5.0) as store:
            store.store(Checkpoint(11))
            assert store.load() == Checkpoint(11)
    # Step 3: the old password leaves every ACL.
    assert coordination_main(["secure", "--zookeeper", connect]) == 0
    out, err = capsys.readouterr()
    assert "set the ACL of 13 node(s)" in out
    rotated = secured.zk.client(auth_data=[("digest", f"{USER}:{NEW_PW}")])
    assert rotated.get_acls("/databus/relays/shop")[0] == [NEW_OWNER, *READ_ACL_UNSAFE]
    assert rotated.get_acls("/databus/checkpoints/orders-indexer")[0] == [NEW_OWNER]
    with ZooKeeperCheckpointStore(old_connect, "orders-indexer", timeout=5.0) as store, \
            pytest.raises(CheckpointError, match="ZooKeeper refused it"):
        store.load()
    # The old credentials can no longer change anything: securing with them is refused.
    monkeypatch.setenv("DATABUS_TEST_ZK_PW", PW)
    assert coordination_main(["secure", "--zookeeper", connect]) == 1
    out, err = capsys.readouterr()
    assert "could not be read or set with these credentials" in err
    assert PW not in out + err and NEW_PW not in out + err
    # The fixture cleans up with the first password: hand the tree back to it.
    monkeypatch.setenv("DATABUS_TEST_ZK_PW", PW)
    monkeypatch.setenv("DATABUS_TEST_ZK_OLD", f"{USER}:{NEW_PW}")
    assert coordination_main(["secure", "--zookeeper", connect, "--previous-env",
                              "DATABUS_TEST_ZK_OLD"]) == 0


# -- bootstrap HA: the same member and Lock the bootstrap services use --------------------


def test_bootstrap_locks_with_credentials_hand_over_and_cannot_be_stolen(
        secured: Secured) -> None:
    """Two ``ZooKeeperMember``s contending in a ``LockContender`` for a bootstrap
    component, as ``bootstrap/_cluster.py`` lays them out, with the connect string of a
    ``[bootstrap.cluster]``: one holds; nobody without the digest can delete its lock
    node (which would hand the producer to another service); when it leaves, the other
    takes over."""
    config = BootstrapClusterConfig(zookeeper=secured.connect, name="shop-bootstrap")
    root = "/databus/bootstrap/shop-bootstrap"
    lock_path = f"{root}/stores/s1/producer"
    holding: dict[str, threading.Event] = {}
    released = threading.Event()
    members, contenders = [], []
    for url in ("http://b1", "http://b2"):
        member = ZooKeeperMember(config.zookeeper, 4.0, f"{root}/members",
                                 "bootstrap.cluster.zookeeper", url)
        holding[url] = threading.Event()

        def hold(_session: int | None, url: str = url) -> None:
            holding[url].set()
            released.wait()  # the test ends the term

        member.connect()
        contender = LockContender(member, lock_path, f"producer {url}", hold, lambda: None)
        members.append(member)
        contenders.append(contender)
    try:
        contenders[0].start("test-b1")
        wait_until(holding["http://b1"].is_set, "b1 holds the producer lock", 20)
        contenders[1].start("test-b2")
        wait_until(lambda: len(secured.owner.get_children(lock_path)) == 2,
                   "b2 waits in the lock", 20)
        acls = secured.acls_of(root)
        assert len(acls) >= 7  # root, members (2), stores, s1, producer, two contenders
        assert all(acl == PUBLIC_ACL for acl in acls.values()), acls
        for client in (secured.anonymous, secured.wrong):
            for node in acls:
                refuses_changes(client, node)
        assert not holding["http://b2"].is_set()
        # b1 leaves: b2 takes the producer.
        members[0].stopping.set()
        released.set()
        contenders[0].cancel()
        contenders[0].join(5)
        members[0].leave()
        wait_until(holding["http://b2"].is_set, "b2 took over", 20)
    finally:
        released.set()
        for member, contender in zip(members, contenders, strict=True):
            member.stopping.set()
            contender.cancel()
            contender.join(5)
            member.leave()
