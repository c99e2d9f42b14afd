"""Consumer groups, the acceptance run of issue 17: four members, 64 partitions, a
stream of 200,000 events (at full size) over 10,000 keys (the synthetic source, every
event numbered); during the run two members are killed with SIGKILL and one joins.

Checked: the union of what the members applied covers the stream (every event at least
once); each member applied each key's events in SCN order and only events of partitions
it held; duplicates only in windows the killed members had applied and not yet
checkpointed: whole windows, the tail of a holding replayed from its last written checkpoint
by the partition's next holder (however many the machine's speed left unacknowledged);
after the last rebalance every member holds within one partition of the mean.

``DATABUS_GROUP_ACCEPTANCE_EVENTS`` sets the stream's size (``make test``: 40,000, the
smoke size; ``make test-full``: the issue's 200,000).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.fixtures.servers import EnsembleChroot
from tests.integration.group_support import (
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
from tests.tiers import count
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

P = 64
PER_WINDOW = 10
SESSION_S = 4.0
EVENTS = count("DATABUS_GROUP_ACCEPTANCE_EVENTS", smoke=40_000, full=200_000)


def _owner_counts(zk: EnsembleChroot) -> dict[str, int]:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk.hosts)
    client.start(timeout=15)
    try:
        holders: dict[str, int] = {}
        root = "/databus/groups/indexer/owners"
        for child in client.get_children(root):
            raw, _ = client.get(f"{root}/{child}")
            member = json.loads(raw)["member"]
            holders[member] = holders.get(member, 0) + 1
        return holders
    finally:
        client.stop()
        client.close()


def test_four_members_two_killed_one_joins(tmp_path: Path,
                                           zookeeper_chroot: EnsembleChroot) -> None:
    # The relay's stream goes on past the EVENTS checked (three times as many), so that
    # the member joining at half-way joins under load however slowly a busy machine
    # starts it; the members' work is checked on the first EVENTS events.
    windows = 3 * EVENTS // PER_WINDOW
    relay = start_relay(tmp_path / "relay", synthetic_uri(
        windows, events_per_window=PER_WINDOW, keys=10_000, rate=8000), capacity_mb=96)
    members = {name: MemberProcess(tmp_path, name, relay.url, zookeeper_chroot.hosts, P,
                                   session_timeout=SESSION_S).start()
               for name in ("m1", "m2", "m3", "m4")}
    killed: list[MemberProcess] = []
    try:
        def progress() -> int:
            return sum(len(m.log().events) for m in members.values()) + sum(
                len(m.log().events) for m in killed)

        def at(share: float) -> None:
            wait_until(lambda: progress() >= EVENTS * share, f"{share:.0%} of the events "
                       "applied", 120, interval=0.1)

        at(0.2)
        victim = members.pop("m2")
        victim.kill(signal.SIGKILL)
        killed.append(victim)
        at(0.4)
        victim = members.pop("m3")
        victim.kill(signal.SIGKILL)
        killed.append(victim)
        at(0.5)
        members["m5"] = MemberProcess(tmp_path, "m5", relay.url, zookeeper_chroot.hosts, P,
                                      session_timeout=SESSION_S).start()
        live = list(members.values())
        wait_until(lambda: members["m5"].log().events, "the member that joined applying", 120)
        wait_until_complete(live, EVENTS, 300, extra_logs=[m.log() for m in killed])

        # The last rebalance: the live members hold P/3 +- 1 each, as assigned.
        deadline = time.monotonic() + 60
        while True:
            doc = read_assignment(zookeeper_chroot.hosts)
            held = _owner_counts(zookeeper_chroot)
            sizes = {m: len(ps) for m, ps in doc.get("owners", {}).items()}
            if set(sizes) == set(members) and held == sizes:
                break
            assert time.monotonic() < deadline, (doc, held)
            time.sleep(0.2)
        mean = P / len(members)
        assert all(abs(n - mean) < 1 for n in sizes.values()), sizes

        for m in live:  # stopped cleanly first: their logs then end with whole windows
            m.stop()
        logs = {m.name: m.log() for m in [*live, *killed]}
        counts = applied_seqs(list(logs.values()))
        assert set(counts) >= set(range(EVENTS))
        for log in logs.values():
            check_member_order(log)
            check_partitions_owned(log)
        assert logs["m5"].events, "the member that joined applied nothing"
        replayed = check_duplicates_are_replays(logs, killed=frozenset(m.name for m in killed))
        dups = {seq for seq, n in counts.items() if n > 1}
        print(f"events {EVENTS}, applied {sum(counts.values())}, duplicated events "
              f"{len(dups)}; window slices replayed after a holding ended by {replayed}")
    finally:
        for m in [*members.values()]:
            m.stop()
        relay.kill(signal.SIGTERM)
