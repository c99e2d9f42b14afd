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
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.servers import EnsembleChroot, paused
from tests.integration.group_support import (
    MemberLog,
    MemberProcess,
    applied_seqs,
    check_duplicates_are_replays,
    check_member_order,
    check_partitions_owned,
    read_assignment,
    start_relay,
    synthetic_uri,
    wait_until_complete,
)
from tests.waiting import wait_until

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
    def balanced() -> dict | None:
        doc = read_assignment(zk.hosts)
        owners = doc.get("owners", {})
        sizes = [len(v) for v in owners.values()]
        return doc if set(owners) == names and max(sizes) - min(sizes) <= 1 else None

    return wait_until(balanced, f"the assignment balanced over {sorted(names)}", timeout,
                      max_interval=0.2)


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
        wait_until(lambda: victim.log().events, "the victim applying events")
        before = victim.log()
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
        _check_replays(members, logs, killed={"m2"})
    finally:
        _stop_all(members)
        relay.kill(signal.SIGTERM)


def _check_replays(members: list[MemberProcess], logs: list[MemberLog],
                   killed: set[str] | frozenset[str] = frozenset()) -> dict[str, int]:
    """Duplicates only as whole windows replayed from a checkpoint (group_support)."""
    replayed = check_duplicates_are_replays({m.name: log for m, log in zip(members, logs,
                                                                         strict=True)},
                                            killed=frozenset(killed))
    print(f"window slices replayed, by how the earlier holding ended: {replayed}")
    return replayed


def test_a_member_joining_under_load_takes_partitions_without_loss(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot) -> None:
    windows, per_window = 3000, 5
    # The stream goes on (ten times what is checked) until the new member has applied
    # something: however long a busy machine takes to start it, it joins under load.
    relay = start_relay(tmp_path / "relay", synthetic_uri(windows * 10, rate=2500,
                                                           events_per_window=per_window))
    members = _members(tmp_path, relay.url, zookeeper_chroot, ["m1", "m2"])
    try:
        _wait_balanced(zookeeper_chroot, {"m1", "m2"})
        time.sleep(1.5)
        members += _members(tmp_path, relay.url, zookeeper_chroot, ["m3"])
        doc = _wait_balanced(zookeeper_chroot, {"m1", "m2", "m3"})
        assert sorted(len(v) for v in doc["owners"].values()) == [5, 5, 6]
        wait_until(lambda: members[2].log().events, "the new member applying events", 60)
        wait_until_complete(members, windows * per_window, 90)
        _stop_all(members)  # cleanly: their logs then end with whole windows
        counts = applied_seqs(logs := [m.log() for m in members])
        _check_all(logs)
        # A graceful move: the old owners finished and checkpointed their window in
        # flight before releasing, so nothing is applied twice.
        replayed = _check_replays(members, logs)
        assert not counts or max(counts.values()) == 1, replayed
    finally:
        _stop_all(members)
        relay.kill(signal.SIGTERM)


def test_a_member_paused_past_its_session_processes_nothing_it_lost(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot) -> None:
    windows, per_window = 4000, 5
    relay = start_relay(tmp_path / "relay", synthetic_uri(windows, rate=2500,
                                                           events_per_window=per_window))
    members = _members(tmp_path, relay.url, zookeeper_chroot, ["m1", "m2", "m3"])
    try:
        _wait_balanced(zookeeper_chroot, {"m1", "m2", "m3"})
        time.sleep(1.0)
        victim = members[1]
        assert victim.proc is not None
        with paused(victim.proc):
            at_pause = len(victim.log().lines)
            held = victim.log().held()
            assert held
            # Its session expires; the others take its partitions and go on.
            _wait_balanced(zookeeper_chroot, {"m1", "m3"}, timeout=SESSION_S * 5)
            time.sleep(2.0)
        # Resumed: it must revoke everything before applying anything more, and apply
        # only what it is assigned again.
        time.sleep(SESSION_S)
        after = victim.log().lines[at_pause:]
        # The log is written at each window's end: a pause between that write and its
        # flush shows a window applied before the pause after ``at_pause``. Events that
        # a later R rolls back (their SCN after its SCN) were never applied (the
        # rollback contract), so they are not held against the member.
        kept: list[tuple[str, Any]] = []
        for kind, payload in after:
            if kind == "R":
                kept = [(k, v) for k, v in kept if not (k == "E" and v[0] > payload)]
            kept.append((kind, payload))
        first = next((kind for kind, _ in kept if kind != "R"), None)
        assert first in (None, "V"), f"applied {after[:3]} after its session had ended"
        wait_until_complete([members[0], members[2]], windows * per_window, 90,
                            extra_logs=[victim.log()])
        logs = [m.log() for m in members]
        _check_all(logs)
        _check_replays(members, logs)
    finally:
        _stop_all(members)
        relay.kill(signal.SIGTERM)


def test_every_member_restarted_at_once_resumes_from_the_partition_checkpoints(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot) -> None:
    windows, per_window = 3000, 5
    relay = start_relay(tmp_path / "relay", synthetic_uri(windows, rate=2500,
                                                           events_per_window=per_window))
    first = _members(tmp_path, relay.url, zookeeper_chroot, ["m1", "m2", "m3"])
    second: list[MemberProcess] = []
    try:
        _wait_balanced(zookeeper_chroot, {"m1", "m2", "m3"})
        time.sleep(2.0)
        wait_until(lambda: sum(len(m.log().events) for m in first) > 1000,
                   "the first members applying 1,000 events")
        for m in first:
            m.kill(signal.SIGKILL)
        second = _members(tmp_path, relay.url, zookeeper_chroot, ["n1", "n2", "n3"])
        wait_until_complete(second, windows * per_window, 90,
                            extra_logs=[m.log() for m in first])
        logs = [m.log() for m in first + second]
        _check_all(logs)
        # Resumed from the checkpoints, not from the start: only the windows in flight
        # at the kill (and not yet checkpointed) came twice.
        _check_replays(first + second, logs, killed={"m1", "m2", "m3"})
    finally:
        _stop_all(first + second)
        relay.kill(signal.SIGTERM)


def test_a_changed_partition_count_is_refused(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot) -> None:
    relay = start_relay(tmp_path / "relay", synthetic_uri(200, rate=1000))
    members = _members(tmp_path, relay.url, zookeeper_chroot, ["m1"])
    try:
        _wait_balanced(zookeeper_chroot, {"m1"})
        odd = MemberProcess(tmp_path, "m2", relay.url, zookeeper_chroot.hosts, P // 2,
                            session_timeout=SESSION_S).start()
        assert odd.proc is not None
        assert odd.proc.wait(timeout=60) != 0
        err = odd.err.read_text()
        assert f"has {P} partitions" in err and f"partitions={P // 2}" in err, err[-2000:]
        assert "cannot change" in err
        assert not odd.log().lines, "the refused member applied something"
        # The group goes on untouched.
        assert set(read_assignment(zookeeper_chroot.hosts)["owners"]) == {"m1"}
    finally:
        _stop_all(members)
        relay.kill(signal.SIGTERM)


def test_quorum_lost_during_a_rebalance(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot) -> None:
    windows, per_window = 4000, 5
    relay = start_relay(tmp_path / "relay", synthetic_uri(windows, rate=2500,
                                                           events_per_window=per_window))
    members = _members(tmp_path, relay.url, zookeeper_chroot, ["m1", "m2"])
    try:
        _wait_balanced(zookeeper_chroot, {"m1", "m2"})
        generation = read_assignment(zookeeper_chroot.hosts)["generation"]
        time.sleep(1.0)
        members += _members(tmp_path, relay.url, zookeeper_chroot, ["m3"])

        def rebalancing() -> bool:
            return read_assignment(zookeeper_chroot.hosts)["generation"] > generation

        deadline = time.monotonic() + 30
        while not rebalancing():
            assert time.monotonic() < deadline, "no rebalance started"
            time.sleep(0.02)
        # The rebalance is under way: lose quorum for longer than the leases.
        with zookeeper_chroot.ensemble.lose_quorum():
            time.sleep(SESSION_S)
        _wait_balanced(zookeeper_chroot, {"m1", "m2", "m3"}, timeout=60)
        wait_until_complete(members, windows * per_window, 120)
        logs = [m.log() for m in members]
        _check_all(logs)
        _check_replays(members, logs)
    finally:
        _stop_all(members)
        relay.kill(signal.SIGTERM)


def test_partition_checkpoints_in_postgresql(
        tmp_path: Path, zookeeper_chroot: EnsembleChroot, postgres_server: Any) -> None:
    """``checkpoint_store=PostgresCheckpointStore(dsn, consumer)``: the partitions'
    checkpoints are the rows ``<consumer>#<p>``; a killed member's partitions resume
    from them on the others."""
    import psycopg2

    group = f"pg{uuid.uuid4().hex[:8]}"
    windows, per_window = 2000, 5
    relay = start_relay(tmp_path / "relay", synthetic_uri(windows, rate=2500,
                                                           events_per_window=per_window))
    members = [MemberProcess(tmp_path, name, relay.url, zookeeper_chroot.hosts, P,
                             session_timeout=SESSION_S, group=group,
                             checkpoint_dsn=postgres_server.dsn).start()
               for name in ("m1", "m2")]
    try:
        time.sleep(3.0)
        members[1].kill(signal.SIGKILL)
        wait_until_complete([members[0]], windows * per_window, 90,
                            extra_logs=[members[1].log()])
        logs = [m.log() for m in members]
        _check_all(logs)
        _check_replays(members, logs, killed={"m2"})
        conn = psycopg2.connect(postgres_server.dsn)
        try:
            with conn.cursor() as cur:
                deadline = time.monotonic() + 30
                while True:
                    cur.execute("SELECT consumer, checkpoint::jsonb -> 'checkpoint' ->> "
                                "'window_scn' FROM databus_checkpoints WHERE consumer "
                                "LIKE %s", (f"{group}#%",))
                    rows = dict(cur.fetchall())
                    conn.commit()
                    if rows and all(int(v) == windows for v in rows.values()):
                        break
                    assert time.monotonic() < deadline, rows
                    time.sleep(0.2)
        finally:
            conn.close()
        assert set(rows) == {f"{group}#{p}" for p in range(P)}
    finally:
        _stop_all(members)
        relay.kill(signal.SIGTERM)
