"""The consumer-group coordinator on the 3-node ZooKeeper ensemble (issue 17): three
coordinators in one process, each with its own kazoo session, on a fresh chroot."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from databus.checkpoint import Checkpoint
from databus.client.group._coordinator import (
    GroupCoordinator,
    decode_assignment,
    partition_checkpoint_store,
)
from databus.errors import ConfigError
from tests.fixtures.servers import EnsembleChroot
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

P = 12
GROUP = "indexer"
ROOT = f"/databus/groups/{GROUP}"


class Member:
    """A coordinator whose consumer releases revoked partitions at once."""

    def __init__(self, chroot: EnsembleChroot, name: str, partitions: int = P,
                 refresh_s: float = 1.0) -> None:
        self.name = name
        self.assigned: list[tuple[int, ...]] = []
        self.revoked: list[tuple[int, ...]] = []
        self._lock = threading.Lock()
        self.coordinator = GroupCoordinator(
            chroot.hosts, GROUP, partitions, name, on_assigned=self._assigned,
            on_revoked=self._revoked, session_timeout_s=6.0, refresh_s=refresh_s,
            poll_s=0.2)

    def _assigned(self, parts: tuple[int, ...]) -> None:
        with self._lock:
            self.assigned.append(parts)

    def _revoked(self, parts: tuple[int, ...]) -> None:
        with self._lock:
            self.revoked.append(parts)
        self.coordinator.release(parts)

    def reset(self) -> None:
        """Forget the callbacks so far (the churn while the members joined one by one)."""
        with self._lock:
            self.assigned.clear()
            self.revoked.clear()

    def revoked_all(self) -> set[int]:
        with self._lock:
            return {p for parts in self.revoked for p in parts}


def owner_nodes(admin: Any) -> dict[int, str]:
    try:
        children = admin.get_children(f"{ROOT}/owners")
    except Exception:
        return {}
    owners: dict[int, str] = {}
    for child in children:
        try:
            raw, _ = admin.get(f"{ROOT}/owners/{child}")
        except Exception:
            continue
        owners[int(child)] = json.loads(raw)["member"]
    return owners


def balanced(admin: Any, members: list[Member]) -> dict[str, set[int]]:
    """Wait until settled, then forget the callbacks of the members' one-by-one joins."""
    shares: dict[str, set[int]] = wait_until(lambda: settled(admin, members), "balanced", 20)
    for m in members:
        m.reset()
    return shares


def settled(admin: Any, members: list[Member]) -> dict[str, set[int]] | None:
    """The owners once the group is balanced and each member runs what its owner nodes
    say (every partition owned exactly once), else None."""
    nodes = owner_nodes(admin)
    if sorted(nodes) != list(range(P)):
        return None
    raw, _ = admin.get(f"{ROOT}/assignment")
    assignment = decode_assignment(raw, "test")
    shares: dict[str, set[int]] = {}
    for m in members:
        owned = set(m.coordinator.owned)
        if owned != {p for p, who in nodes.items() if who == m.name}:
            return None
        if owned != set(assignment.owners.get(m.name, ())):
            return None
        shares[m.name] = owned
    if not shares:
        return None
    sizes = [len(s) for s in shares.values()]
    if max(sizes) - min(sizes) > 1 or sum(sizes) != P:
        return None
    return shares


@pytest.fixture
def admin(zookeeper_chroot: EnsembleChroot) -> Any:
    return zookeeper_chroot.client()


@pytest.fixture
def group(zookeeper_chroot: EnsembleChroot) -> Iterator[list[Member]]:
    members = [Member(zookeeper_chroot, f"m{i}") for i in range(3)]
    for m in members:
        m.coordinator.start()
    yield members
    for m in members:
        m.coordinator.close()


def test_three_members_balance_and_own_every_partition_once(
        admin: Any, group: list[Member]) -> None:
    shares = wait_until(lambda: settled(admin, group), "balanced", 20)
    assert sorted(len(s) for s in shares.values()) == [4, 4, 4]


def test_a_closed_member_moves_only_its_partitions(admin: Any, group: list[Member]) -> None:
    before = balanced(admin, group)
    gone, rest = group[0], group[1:]
    gone.coordinator.close()
    after = wait_until(lambda: settled(admin, rest), "rebalanced after a close", 20)
    for m in rest:
        assert before[m.name] <= after[m.name]  # nothing of theirs moved
        assert not m.revoked_all()
    assert after[rest[0].name] | after[rest[1].name] == set(range(P))
    assert gone.revoked_all() == before[gone.name]
    group.remove(gone)


def test_a_new_member_takes_only_its_share(
        zookeeper_chroot: EnsembleChroot, admin: Any, group: list[Member]) -> None:
    before = balanced(admin, group)
    new = Member(zookeeper_chroot, "m3")
    new.coordinator.start()
    group.append(new)
    after = wait_until(lambda: settled(admin, group), "rebalanced after a join", 20)
    assert len(after["m3"]) == 3
    moved = sum(len(before[m.name] - after[m.name]) for m in group[:3])
    assert moved == 3  # the least any balanced assignment allows
    for m in group[:3]:
        assert m.revoked_all() == before[m.name] - after[m.name]


def test_an_expired_member_loses_its_partitions_to_the_others(
        zookeeper_chroot: EnsembleChroot, admin: Any) -> None:
    # The expired member re-registers slowly (refresh_s) so that the others are seen
    # taking over before it is back.
    members = [Member(zookeeper_chroot, "m0", refresh_s=4.0),
               Member(zookeeper_chroot, "m1"), Member(zookeeper_chroot, "m2")]
    for m in members:
        m.coordinator.start()
    try:
        before = balanced(admin, members)
        victim = members[0]
        lost = before[victim.name]
        zookeeper_chroot.ensemble.expire_session(victim.coordinator.member.client)
        wait_until(lambda: all(owner_nodes(admin).get(p) in ("m1", "m2") for p in lost),
                   "the expired member's partitions taken by the others", 20)
        assert victim.revoked_all() >= lost
        assert victim.coordinator.owned == () or victim.coordinator.owned != tuple(lost)
        # It comes back with a new session and gets a share again.
        shares = wait_until(lambda: settled(admin, members), "balanced again", 20)
        assert sorted(len(s) for s in shares.values()) == [4, 4, 4]
    finally:
        for m in members:
            m.coordinator.close()


def test_a_changed_partition_count_is_refused(
        zookeeper_chroot: EnsembleChroot, admin: Any, group: list[Member]) -> None:
    wait_until(lambda: settled(admin, group), "balanced", 20)
    wrong = Member(zookeeper_chroot, "m9", partitions=P * 2)
    with pytest.raises(ConfigError, match=r"has 12 partitions .*partitions=24"):
        wrong.coordinator.start()
    members = admin.get_children(f"{ROOT}/members")
    assert len(members) == 3  # it never registered
    assert settled(admin, group)


def test_per_partition_checkpoints_in_the_group_znodes(
        zookeeper_chroot: EnsembleChroot, admin: Any) -> None:
    store = partition_checkpoint_store(zookeeper_chroot.hosts, GROUP, 5)
    try:
        assert store.load() is None
        checkpoint = Checkpoint.loads(
            '{"window_scn":1234,"window_offset":-1,"mode":"online"}')
        store.store(checkpoint)
        assert store.load() == checkpoint
    finally:
        store.close()
    raw, _ = admin.get(f"{ROOT}/checkpoints/5")
    assert json.loads(raw)["checkpoint"]["window_scn"] == 1234
