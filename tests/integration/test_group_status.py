"""``databus group status`` (client/group/_cli.py) on the 3-node ZooKeeper ensemble: two
real ``GroupCoordinator`` members in this process, the command run as a subprocess (the
console script) and, for the polling, in-process (``status``)."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.checkpoint import Checkpoint
from databus.client.group._cli import status
from databus.client.group._coordinator import (
    GroupCoordinator,
    decode_assignment,
    partition_checkpoint_store,
)
from tests.fixtures.servers import EnsembleChroot
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

DATABUS = str(Path(sys.executable).with_name("databus"))
P = 6
GROUP = "g"
ROOT = f"/databus/groups/{GROUP}"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DATABUS, "group", "status", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def member(chroot: EnsembleChroot, name: str) -> GroupCoordinator:
    coordinator: GroupCoordinator

    def revoked(parts: tuple[int, ...]) -> None:  # checkpointed at once: release
        coordinator.release(parts)

    coordinator = GroupCoordinator(chroot.hosts, GROUP, P, name, on_revoked=revoked,
                                   session_timeout_s=6.0, refresh_s=1.0, poll_s=0.2)
    return coordinator


def holders(admin: Any) -> dict[int, str]:
    from kazoo.exceptions import NoNodeError

    out = {}
    for child in admin.get_children(f"{ROOT}/owners"):
        try:
            raw, _ = admin.get(f"{ROOT}/owners/{child}")
        except NoNodeError:  # released meanwhile
            continue
        out[int(child)] = json.loads(raw)["member"]
    return out


def settled(admin: Any, members: list[GroupCoordinator]) -> bool:
    """Every partition held, by the member the assignment names, and each member runs
    exactly what it holds."""
    if admin.exists(f"{ROOT}/owners") is None or admin.exists(f"{ROOT}/assignment") is None:
        return False
    assignment = decode_assignment(admin.get(f"{ROOT}/assignment")[0], "test")
    held = holders(admin)
    if sorted(held) != list(range(P)):
        return False
    return all(set(m.owned) == {p for p, who in held.items() if who == m.member_id}
               == set(assignment.owners.get(m.member_id, ())) for m in members)


def current(hosts: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = status(hosts, GROUP, as_json=True, out=out)
    return code, json.loads(out.getvalue())


@pytest.fixture
def admin(zookeeper_chroot: EnsembleChroot) -> Any:
    return zookeeper_chroot.client()


@pytest.fixture
def group(zookeeper_chroot: EnsembleChroot, admin: Any) -> Iterator[list[GroupCoordinator]]:
    """m0, then (once m0 has written the first assignment, so m0 leads) m1."""
    members = [member(zookeeper_chroot, "m0"), member(zookeeper_chroot, "m1")]
    try:
        members[0].start()
        wait_until(lambda: admin.exists(f"{ROOT}/assignment"), "m0's first assignment")
        members[1].start()
        wait_until(lambda: settled(admin, members), "every partition held")
        yield members
    finally:
        for m in members:
            m.close()


def test_status_of_a_live_group(zookeeper_chroot: EnsembleChroot, admin: Any,
                                group: list[GroupCoordinator]) -> None:
    hosts = zookeeper_chroot.hosts
    for p in range(P):
        store = partition_checkpoint_store(hosts, GROUP, p)
        try:
            store.store(Checkpoint(1000 + p))
        finally:
            store.close()
    assignment = decode_assignment(admin.get(f"{ROOT}/assignment")[0], "test")
    owned = {m.member_id: list(m.owned) for m in group}
    assert sorted(len(parts) for parts in owned.values()) == [3, 3]

    done = run("--coordinator", hosts, "--group", GROUP, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["coordinator"] == hosts and doc["group"] == GROUP
    assert doc["generation"] == assignment.generation and doc["partition_count"] == P
    assert doc["leader"] == "m0" and doc["leader_waiting"] == ["m1"]
    assert [(m["member"], m["assigned"], m["held"]) for m in doc["members"]] == [
        (name, owned[name], owned[name]) for name in ("m0", "m1")]
    # the coordinator's member node has only "member": the rest is unknown
    assert all((m["client_id"], m["running"], m["relay_max_scn"], m["lag_ms"])
               == (None, None, None, None) for m in doc["members"])
    who = {p: name for name, parts in owned.items() for p in parts}
    assert [(r["partition"], r["assigned"], r["holder"], r["holder_generation"] is not None,
             r["state"], r["checkpoint_scn"], r["checkpoint_mode"], r["lag_scn"])
            for r in doc["partitions"]] == [
        (p, who[p], who[p], True, "held", 1000 + p, "online", None) for p in range(P)]
    assert doc["problems"] == [] and doc["ok"] is True

    # the tables, with the zookeeper:// form of the connect string
    done = run("--coordinator", f"zookeeper://{hosts}", "--group", GROUP)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (f"group {GROUP}: generation {assignment.generation}, {P} partitions, "
                        "leader m0")
    assert lines[1] == "members (2):"
    rows = {line.split()[0]: line.split() for line in lines[3:5]}
    assert set(rows) == {"m0", "m1"}
    for p in range(P):
        assert [f"{p}", who[p], who[p], "held", f"{1000 + p}", "-"] in [
            line.split() for line in lines]
    assert "problem:" not in done.stdout

    # A member that registers and never takes what it is assigned (a member node written
    # by hand, with a relay max SCN): the leader gives it 2 partitions, m0 and m1
    # release them, and nobody holds them: exit 1, "moving".
    ghost = admin.create(f"{ROOT}/members/member-", json.dumps(
        {"member": "ghost", "client_id": "ghost-1", "relay_max_scn": 2000}).encode(),
        ephemeral=True, sequence=True)

    def stuck() -> dict[str, Any] | None:
        code, doc = current(hosts)
        rows = [r for r in doc["partitions"] if r["assigned"] == "ghost"]
        if code == 1 and len(rows) == 2 and all(r["holder"] is None for r in rows):
            return doc
        return None
    doc = wait_until(stuck, "the ghost's partitions released")
    ghost_parts = sorted(r["partition"] for r in doc["partitions"] if r["assigned"] == "ghost")
    assert [r["state"] for r in doc["partitions"] if r["partition"] in ghost_parts] == [
        "moving", "moving"]
    assert doc["problems"] == [f"partition {p} has no holder (moving to ghost)"
                               for p in ghost_parts]
    assert doc["relay_max_scn"] == 2000
    assert [r["lag_scn"] for r in doc["partitions"]] == [2000 - (1000 + p) for p in range(P)]
    [row] = [m for m in doc["members"] if m["member"] == "ghost"]
    assert (row["client_id"], row["assigned"], row["held"], row["relay_max_scn"]) == (
        "ghost-1", ghost_parts, [], 2000)
    done = run("--coordinator", hosts, "--group", GROUP)
    assert done.returncode == 1, done.stderr
    assert f"problem: partition {ghost_parts[0]} has no holder (moving to ghost)" \
        in done.stdout
    assert "Traceback" not in done.stderr

    # The ghost leaves: its partitions go back, every one is held again, exit 0.
    admin.delete(ghost)
    doc = wait_until(lambda: (r := current(hosts))[0] == 0 and r[1], "held again")
    assert {r["state"] for r in doc["partitions"]} == {"held"}
    assert [m["member"] for m in doc["members"]] == ["m0", "m1"]


def test_an_unknown_group_is_a_clear_error_and_creates_nothing(
        zookeeper_chroot: EnsembleChroot, admin: Any, group: list[GroupCoordinator]) -> None:
    done = run("--coordinator", zookeeper_chroot.hosts, "--group", "nosuch", "--timeout", "5")
    assert done.returncode == 1
    assert "databus group: error: no consumer group 'nosuch'" in done.stderr
    assert "(no node /databus/groups/nosuch; groups: g)" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert admin.get_children("/databus/groups") == [GROUP]


def test_an_unreachable_zookeeper_is_a_clear_error_within_the_timeout() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # The interpreter's start and the command's imports, timed on their own: what a busy
    # machine stretches most, and no part of the timeout.
    started = time.monotonic()
    assert run("--help").returncode == 0
    startup = time.monotonic() - started
    started = time.monotonic()
    done = run("--coordinator", f"127.0.0.1:{port}/chroot", "--group", GROUP,
               "--timeout", "2")
    took = time.monotonic() - started
    assert done.returncode == 1
    assert (f"databus group: error: cannot reach ZooKeeper at 127.0.0.1:{port}/chroot "
            "within 2 s") in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    # Given up after the 2 s of trying (not some longer default, nor never): the start as
    # measured, plus the timeout thrice over as slack for a busy machine.
    assert took < startup + 3 * 2, (took, startup)
