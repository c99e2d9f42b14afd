"""The zookeeper_ensemble fixture: three real nodes and the faults it injects, seen by kazoo.

Each test gets a fresh chroot (``zookeeper_chroot``), and all three nodes are up again
before the next test whatever this one killed or paused.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from tests.fixtures.servers import EnsembleChroot, paused
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


class StateLog:
    """The connection states a kazoo client went through, in order."""

    def __init__(self, client: KazooClient) -> None:
        self.seen: list[str] = []
        self._changed = threading.Condition()
        client.add_listener(self._record)

    def _record(self, state: str) -> None:
        with self._changed:
            self.seen.append(state)
            self._changed.notify_all()

    def _contains(self, sequence: tuple[str, ...]) -> bool:
        rest = iter(self.seen)
        return all(any(state == wanted for state in rest) for wanted in sequence)

    def wait_for(self, *sequence: str, timeout: float = 30.0) -> None:
        """Wait until ``sequence`` occurred in that order (other states may come between)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._contains(sequence), timeout):
                pytest.fail(f"states {list(sequence)} not seen in {timeout}s: {self.seen}")


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> float:
    """:func:`tests.waiting.wait_until`, polled finely (the tests time what they wait for);
    returns the seconds it took."""
    started = time.monotonic()
    wait_until(predicate, what, timeout, max_interval=0.05)
    return time.monotonic() - started


def test_one_leader_and_every_node_serves_the_same_data(zookeeper_chroot: EnsembleChroot) -> None:
    ensemble = zookeeper_chroot.ensemble
    leader = ensemble.leader()
    assert leader is not None
    assert sorted([leader, *ensemble.followers()]) == [0, 1, 2]
    writer = zookeeper_chroot.client(hosts=ensemble.node_hosts(leader))
    writer.create("/shared", b"written on the leader")
    for i in range(3):
        reader = zookeeper_chroot.client(hosts=ensemble.node_hosts(i))
        reader.sync("/shared")
        assert reader.get("/shared")[0] == b"written on the leader"


def test_writes_survive_a_leader_kill_and_the_client_moves_to_another_node(
    zookeeper_chroot: EnsembleChroot,
) -> None:
    ensemble = zookeeper_chroot.ensemble
    leader = ensemble.leader()
    assert leader is not None
    # The leader first in the list, so that the client's session lives on the node killed.
    order = [leader, *(i for i in range(3) if i != leader)]
    hosts = ",".join(ensemble.node_hosts(i) for i in order)
    client = zookeeper_chroot.client(hosts=hosts, randomize_hosts=False, timeout=6.0)
    session_id = client.client_id[0]
    assert ensemble.node_of_session(session_id) == leader
    states = StateLog(client)
    for n in range(50):
        client.create(f"/rows/{n:03}", str(n).encode(), makepath=True)

    ensemble.kill(leader)
    states.wait_for(KazooState.SUSPENDED, KazooState.CONNECTED)
    _wait(lambda: ensemble.leader() not in (None, leader), "a new leader")
    assert KazooState.LOST not in states.seen
    assert client.client_id[0] == session_id  # the session outlived its node
    assert ensemble.node_of_session(session_id) not in (None, leader)
    assert sorted(client.get_children("/rows")) == [f"{n:03}" for n in range(50)]
    assert client.get("/rows/049")[0] == b"49"
    client.create("/after-kill", b"ok")

    ensemble.start(leader)  # back as a follower, synced from the new leader
    assert ensemble.mode(leader) == "follower"
    rejoined = zookeeper_chroot.client(hosts=ensemble.node_hosts(leader))
    rejoined.sync("/")
    assert len(rejoined.get_children("/rows")) == 50
    assert rejoined.get("/after-kill")[0] == b"ok"


def test_without_quorum_a_write_fails_and_succeeds_once_quorum_returns(
    zookeeper_chroot: EnsembleChroot,
) -> None:
    ensemble = zookeeper_chroot.ensemble
    client = zookeeper_chroot.client(timeout=10.0)
    session_id = client.client_id[0]
    states = StateLog(client)
    client.create("/before", b"1")

    with ensemble.lose_quorum() as down:
        assert len(down) == 2
        (survivor,) = {0, 1, 2} - set(down)
        assert ensemble.is_running(survivor)
        assert ensemble.mode(survivor) is None  # up, but serving no request
        states.wait_for(KazooState.SUSPENDED)
        assert client.state == KazooState.SUSPENDED
        pending = client.create_async("/during", b"2")
        with pytest.raises(KazooTimeoutError):
            pending.get(timeout=1.0)
        # The surviving node does not even accept a new session.
        with pytest.raises(KazooTimeoutError):
            KazooClient(hosts=ensemble.node_hosts(survivor)).start(timeout=1.0)

    # Quorum is back (the context manager waited for it): the queued write goes through
    # on the same session, and new writes work.
    assert pending.get(timeout=30.0) == "/during"
    states.wait_for(KazooState.SUSPENDED, KazooState.CONNECTED)
    assert client.client_id[0] == session_id
    client.create("/after", b"3")
    assert [client.get(p)[0] for p in ("/before", "/during", "/after")] == [b"1", b"2", b"3"]


def test_expired_session_loses_its_ephemeral_node_and_the_client_gets_a_new_session(
    zookeeper_chroot: EnsembleChroot,
) -> None:
    ensemble = zookeeper_chroot.ensemble
    owner = zookeeper_chroot.client(timeout=6.0)
    observer = zookeeper_chroot.client()
    states = StateLog(owner)
    old_session = owner.client_id[0]
    owner.create("/member", b"me", ephemeral=True)
    observer.sync("/")
    assert observer.exists("/member").ephemeralOwner == old_session

    ensemble.expire_session(owner)

    states.wait_for(KazooState.LOST, KazooState.CONNECTED)
    observer.sync("/")
    assert observer.exists("/member") is None
    new_session = owner.client_id[0]
    assert new_session != old_session
    owner.create("/member", b"me again", ephemeral=True)
    observer.sync("/")  # the observer's node may not have applied the create yet
    assert observer.exists("/member").ephemeralOwner == new_session


_MEMBER = """
import queue, sys
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

hosts, path, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
changes = queue.Queue()
client = KazooClient(hosts=hosts, timeout=timeout)
client.add_listener(changes.put)
client.start(timeout=30)

def register():
    client.create(path, b"member", ephemeral=True)
    print(f"registered {client.client_id[0]}", flush=True)

register()
while True:
    state = changes.get()
    print(f"state {state}", flush=True)
    if state == KazooState.CONNECTED and client.exists(path) is None:
        register()
"""


@pytest.fixture
def member_lines() -> Iterator[tuple[list[subprocess.Popen[str]], queue.Queue[str]]]:
    """Started members (child processes) and the lines they print; all ended afterwards."""
    procs: list[subprocess.Popen[str]] = []
    lines: queue.Queue[str] = queue.Queue()
    yield procs, lines
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def _next_line(lines: queue.Queue[str], prefix: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"the member printed no {prefix!r} line within {timeout}s")
        if line.startswith(prefix):
            return line


def test_paused_member_process_loses_its_ephemeral_node_and_registers_again_on_resume(
    zookeeper_chroot: EnsembleChroot,
    member_lines: tuple[list[subprocess.Popen[str]], queue.Queue[str]],
) -> None:
    procs, lines = member_lines
    session_timeout = 2.0
    proc = subprocess.Popen(
        [sys.executable, "-c", _MEMBER, zookeeper_chroot.hosts, "/member", str(session_timeout)],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    stdout = proc.stdout
    assert stdout is not None

    def read() -> None:
        for line in stdout:
            lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()
    old_session = int(_next_line(lines, "registered ").split()[1])
    observer = zookeeper_chroot.client()
    observer.sync("/")
    assert observer.exists("/member").ephemeralOwner == old_session

    with paused(proc):
        gone_after = _wait(lambda: observer.exists("/member") is None, "the member's node gone")
        assert proc.poll() is None  # frozen, not dead: only its session ended
    # Not at once (that would be a closed session): only once the session timed out (how
    # late after that depends on how busy the machine keeps the ensemble's JVMs).
    assert gone_after > 1.0

    # Resumed, it learns its session expired, gets a new one and registers again.
    _next_line(lines, "state LOST")
    new_session = int(_next_line(lines, "registered ").split()[1])
    assert new_session != old_session
    observer.sync("/")
    assert observer.exists("/member").ephemeralOwner == new_session


def test_paused_leader_node_is_replaced_and_rejoins_as_a_follower(
    zookeeper_chroot: EnsembleChroot,
) -> None:
    ensemble = zookeeper_chroot.ensemble
    leader = ensemble.leader()
    assert leader is not None
    others = [i for i in range(3) if i != leader]
    client = zookeeper_chroot.client(hosts=",".join(ensemble.node_hosts(i) for i in others))

    ensemble.pause(leader)
    try:
        ensemble.wait_until(lambda: ensemble.leader() in others, "a leader among the others", 30)
        assert ensemble.is_running(leader)  # the old leader still holds its ports
        client.retry(client.ensure_path, "/while-paused")
        client.retry(client.set, "/while-paused", b"written without the old leader")
    finally:
        ensemble.resume(leader)
    ensemble.wait_quorum()
    assert ensemble.mode(leader) == "follower"
    rejoined = zookeeper_chroot.client(hosts=ensemble.node_hosts(leader))
    rejoined.sync("/while-paused")
    assert rejoined.get("/while-paused")[0] == b"written without the old leader"


def test_ensure_running_heals_killed_stopped_and_paused_nodes(
    zookeeper_chroot: EnsembleChroot,
) -> None:
    ensemble = zookeeper_chroot.ensemble
    ensemble.kill(0)
    ensemble.pause(1)
    assert not ensemble.running
    ensemble.ensure_running()  # what zookeeper_chroot does after every test
    assert ensemble.running
    assert ensemble.has_quorum()
    assert sorted(ensemble.mode(i) or "" for i in range(3)) == ["follower", "follower", "leader"]
    ensemble.stop(2)
    ensemble.ensure_running()
    assert ensemble.has_quorum()
