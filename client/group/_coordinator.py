"""Consumer groups on ZooKeeper: membership, the leader's assignment, partition
ownership and the member's lease (DESIGN section 15). ``DatabusClient(group=...)``
drives it through ``_member.GroupRun``.

Layout, under ``/databus/groups/<group>``::

    members/member-<seq>   ephemeral sequential, {"member": <member id>}
    leader/                a kazoo Lock: its holder is the group's leader
    assignment             {"generation": n, "partitions": P, "owners": {member: [p...]}}
    owners/<p>             ephemeral, {"member": <member id>, "generation": n}
    checkpoints/<p>        the checkpoint envelope of partition p (persistent)

Protocol
    * Every coordinator registers a member node (``ZooKeeperMember``) and queues in the
      leader Lock (``LockContender``).
    * The leader watches ``members/`` and, whenever the set of member nodes changes (and
      once when it becomes leader), writes ``assign(live members, P, previous owners)``
      with the next generation, by compare-and-set on the znode version: a deposed
      leader's late write fails instead of overwriting its successor's.
    * Every member watches ``assignment`` and compares what it is assigned with what it
      runs (``diff_partitions``, pure). Partitions it runs but is no longer assigned are
      revoked: ``on_revoked(parts)`` is called once, and the consumer, after finishing
      and checkpointing them, calls ``release(parts)``, which deletes their owner nodes.
      Partitions assigned but not run are taken: only by creating the ephemeral
      ``owners/<p>``; while the previous owner's node exists the member waits (an
      exists-watch wakes it). ``on_assigned(parts)`` gets the partitions it took.
    * A member whose session is lost has lost its owner nodes with it (ephemeral): it
      calls ``on_revoked`` for everything it ran and takes nothing more until an
      assignment newer than the one in force when it lost the session (its re-registered
      member node is a membership change, so one always comes).
    * Fencing: the member holds a ``Lease`` (``databus.coordination``) of half the
      session timeout, confirmed by a renewal thread from the *sending* time of each
      answered request (as the relay leader's). A new session gets a new lease and the
      old one is revoked for good. The client checks the lease before each window and
      before each commit, so a member paused past its session timeout (whose partitions
      the others may take once ZooKeeper expires the session) processes nothing when it
      runs again.
    * The partition count is fixed for the life of a group: a coordinator whose P differs
      from the stored assignment's is refused with ``ConfigError`` at ``start`` (and a
      member that finds it changed later stops taking partitions). Migrating the
      per-partition checkpoints to another P would need a resharding of the checkpoints,
      which no member can do alone; delete the group's znodes to start over with a new P.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from databus._limited_log import limited
from databus.client._checkpoint_zookeeper import ZooKeeperCheckpointStore, _znode_name
from databus.client.group._assignment import _check_partitions, assign
from databus.coordination import Lease, LockContender, ZooKeeperMember
from databus.errors import ConfigError
from databus.security._zookeeper import SENSITIVE

__all__ = [
    "GroupAssignment",
    "GroupCoordinator",
    "PartitionDiff",
    "decode_assignment",
    "diff_partitions",
    "encode_assignment",
    "group_root",
    "partition_checkpoint_store",
]

log = logging.getLogger("databus.client.group")

GROUPS_ROOT = "/databus/groups"


def group_root(group: str) -> str:
    return f"{GROUPS_ROOT}/{_group_name(group)}"


def _group_name(group: object) -> str:
    try:
        return _znode_name(group)
    except ConfigError:
        raise ConfigError(f"group name {group!r} must be a non-empty string without '/' or "
                          "control characters, and not '.' or '..' (it becomes a znode)"
                          ) from None


# -- the pure part ---------------------------------------------------------------------


@dataclass(frozen=True)
class GroupAssignment:
    generation: int
    partitions: int
    owners: Mapping[str, tuple[int, ...]]


def encode_assignment(assignment: GroupAssignment) -> bytes:
    body = {
        "generation": assignment.generation,
        "partitions": assignment.partitions,
        "owners": {m: list(ps) for m, ps in sorted(assignment.owners.items())},
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode_assignment(raw: bytes, where: str) -> GroupAssignment:
    """Parse and check the assignment znode's data; ``ConfigError`` if it is damaged."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    generation, partitions, owners = (body.get("generation"), body.get("partitions"),
                                      body.get("owners"))
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
        raise ConfigError(f"{where}: bad generation {generation!r}")
    try:
        count = _check_partitions(partitions)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not isinstance(owners, dict):
        raise ConfigError(f"{where}: owners must be an object")
    seen: set[int] = set()
    checked: dict[str, tuple[int, ...]] = {}
    for member, parts in owners.items():
        if not isinstance(parts, list):
            raise ConfigError(f"{where}: owners of {member!r} must be a list")
        for p in parts:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < count or p in seen:
                raise ConfigError(f"{where}: bad or repeated partition {p!r} of {member!r}")
            seen.add(p)
        checked[member] = tuple(sorted(parts))
    return GroupAssignment(generation, count, checked)


@dataclass(frozen=True)
class PartitionDiff:
    """What a member must do to go from what it runs to what it is assigned."""

    revoke: tuple[int, ...]  # run but no longer assigned: finish, checkpoint, release
    take: tuple[int, ...]  # assigned but not run: take once the owner node is free

    def __bool__(self) -> bool:
        return bool(self.revoke or self.take)


def diff_partitions(running: Iterable[int], assigned: Iterable[int]) -> PartitionDiff:
    """Pure: the partitions to revoke and to take, each ascending."""
    run, want = set(running), set(assigned)
    return PartitionDiff(tuple(sorted(run - want)), tuple(sorted(want - run)))


def partition_checkpoint_store(hosts: str, group: str, partition: int,
                               timeout: float = 10.0) -> ZooKeeperCheckpointStore:
    """The checkpoint store of one partition: ``<group root>/checkpoints/<p>``, the same
    envelope and store as a single consumer's checkpoint."""
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ConfigError(f"partition must be a non-negative integer, got {partition!r}")
    return ZooKeeperCheckpointStore(hosts, str(partition),
                                    root=f"{group_root(group)}/checkpoints", timeout=timeout)


# -- the coordinator -------------------------------------------------------------------


class _GroupMember(ZooKeeperMember):
    def __init__(self, coordinator: GroupCoordinator, hosts: str, session_timeout_s: float,
                 refresh_s: float) -> None:
        # Group state and checkpoints: readable by the group's credentials only.
        super().__init__(hosts, session_timeout_s, f"{coordinator.root}/members",
                         "zookeeper", coordinator.member_id, refresh_s, exposure=SENSITIVE)
        self._coordinator = coordinator
        self._checked = False

    def data(self) -> dict[str, Any]:
        extra = self._coordinator.extra_data
        body: dict[str, Any] = {}
        if extra is not None:
            try:
                body.update(extra())
            except Exception:
                log.debug("group member data failed", exc_info=True)
        body["member"] = self._coordinator.member_id
        return body

    def before_refresh(self) -> None:
        # Called by connect() before the member node is created: refuse a changed
        # partition count before this member is counted.
        if not self._checked:
            self._checked = True
            self._coordinator._check_partition_count()


class GroupCoordinator:
    """One member of a consumer group. See the module docstring.

    ``on_assigned(parts)`` / ``on_revoked(parts)`` are called from the coordinator's
    thread, never concurrently; after ``on_revoked`` the consumer finishes and
    checkpoints these partitions and calls ``release(parts)`` (it may do so inside the
    callback).
    """

    def __init__(self, zookeeper: str, group: str, partitions: int, member_id: str, *,
                 on_assigned: Callable[[tuple[int, ...]], None] | None = None,
                 on_revoked: Callable[[tuple[int, ...]], None] | None = None,
                 session_timeout_s: float = 10.0, refresh_s: float = 1.0,
                 poll_s: float = 0.5,
                 extra_data: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.root = group_root(group)
        self.group = group
        self.partitions = _check_partitions(partitions)
        if not isinstance(member_id, str) or not member_id or "/" in member_id:
            raise ConfigError(f"member id must be a non-empty string without '/', "
                              f"got {member_id!r}")
        self.member_id = member_id
        self.on_assigned = on_assigned or (lambda parts: None)
        self.on_revoked = on_revoked or (lambda parts: None)
        self.poll_s = poll_s
        # More fields for the member node (what ``databus group status`` shows).
        self.extra_data = extra_data
        self.lease = Lease(session_timeout_s / 2)
        self.assignment_path = f"{self.root}/assignment"
        self.owners_path = f"{self.root}/owners"
        self.member = _GroupMember(self, zookeeper, session_timeout_s, refresh_s)
        self.contender = LockContender(self.member, f"{self.root}/leader",
                                       f"group {group} leader", self._lead, lambda: None)
        self._lock = threading.Lock()
        self._running: set[int] = set()  # owner nodes we hold and announced
        self._revoking: set[int] = set()  # announced revoked, not yet released
        self._wake = threading.Event()
        self._members_changed = threading.Event()
        self._lost = threading.Event()
        self._lost_generation = 0  # take nothing from an assignment up to this one
        self._generation = 0  # of the assignment last acted on
        self._thread: threading.Thread | None = None
        self._renewer: threading.Thread | None = None
        self.error: ConfigError | None = None  # set when the group's P changed under us

    # -- public ------------------------------------------------------------------------

    @property
    def owned(self) -> tuple[int, ...]:
        """The partitions whose owner nodes this member holds (revoked ones included
        until they are released)."""
        with self._lock:
            return tuple(sorted(self._running))

    @property
    def active(self) -> tuple[int, ...]:
        """The partitions this member holds and should process: owned, not revoked."""
        with self._lock:
            return tuple(sorted(self._running - self._revoking))

    def start(self) -> None:
        """Join the group (blocking until the session is open and the member registered);
        raises ``ConfigError`` if the stored assignment has another partition count."""
        try:
            self.member.connect()
        except BaseException:
            self._shut_client()
            raise
        self.member.client.add_listener(self._state_changed)
        self.member.start_refresher(f"group-{self.group}-member")
        self.contender.start(f"group-{self.group}-leader")
        self._thread = threading.Thread(target=self._reconcile_loop, daemon=True,
                                        name=f"group-{self.group}-reconcile")
        self._thread.start()
        self._renewer = threading.Thread(target=self._renew_lease, daemon=True,
                                         name=f"group-{self.group}-lease")
        self._renewer.start()

    def release(self, partitions: Iterable[int]) -> None:
        """The consumer finished and checkpointed these revoked partitions: delete their
        owner nodes so that their new owners can take them."""
        from kazoo.exceptions import KazooException, NoNodeError

        parts = sorted(set(partitions))
        for p in parts:
            path = f"{self.owners_path}/{p}"
            try:
                data, stat = self.member.client.get(path)
                if _owner_of(data) == self.member_id:
                    self.member.client.delete(path, version=stat.version)
            except NoNodeError:
                pass
            except KazooException as exc:
                limited(log).warning("group %s: release of partition %d failed: %s",
                                     self.group, p, exc)
                continue
            with self._lock:
                self._running.discard(p)
                self._revoking.discard(p)
        self._wake.set()

    def close(self) -> None:
        """Leave the group: ``on_revoked`` for what is still run, then the session ends
        (its owner and member nodes go with it)."""
        self.member.stopping.set()
        self._wake.set()
        self._members_changed.set()
        self.contender.cancel()
        if self._thread is not None:
            self._thread.join(10)
        if self._renewer is not None:
            self._renewer.join(10)
        self.lease.revoke()
        self.contender.join(10)
        with self._lock:
            left = tuple(sorted(self._running - self._revoking))
        if left:
            self._call(self.on_revoked, left)
        if self.member.client is not None and self.member.connected.is_set():
            self.release(self.owned)
        self.member.stop_refresher()
        self.member.leave()

    # -- plumbing ----------------------------------------------------------------------

    def _shut_client(self) -> None:
        client = self.member.client
        if client is not None:
            try:
                client.stop()
                client.close()
            except Exception:
                log.debug("closing the ZooKeeper client failed", exc_info=True)

    def _check_partition_count(self) -> None:
        stored = self._read_assignment()
        if stored is not None and stored[0].partitions != self.partitions:
            raise ConfigError(
                f"group {self.group!r} has {stored[0].partitions} partitions (assignment "
                f"znode {self.assignment_path}, generation {stored[0].generation}); this "
                f"member was configured with partitions={self.partitions}. The partition "
                "count of a group cannot change: the per-partition checkpoints belong to "
                "it. Use the stored count, or a new group name.")

    def _read_assignment(self) -> tuple[GroupAssignment, int] | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self.member.client.get(self.assignment_path,
                                                watch=lambda event: self._wake.set())
        except NoNodeError:
            self.member.client.exists(self.assignment_path,
                                      watch=lambda event: self._wake.set())
            return None
        where = f"assignment znode {self.assignment_path}"
        return decode_assignment(bytes(data), where), stat.version

    def _state_changed(self, state: str) -> None:
        from kazoo.client import KazooState

        if state == KazooState.LOST:
            # At once, not in the reconcile thread: nothing more may be processed.
            self.lease.revoke()
            self._lost.set()
            self._wake.set()
            self._members_changed.set()

    @staticmethod
    def _call(callback: Callable[[tuple[int, ...]], None], parts: tuple[int, ...]) -> None:
        try:
            callback(parts)
        except Exception:
            log.exception("group callback failed for partitions %s", parts)

    def _renew_lease(self) -> None:
        """Confirm the lease every eighth of its length while the session lasts; a
        new session gets a new lease (the old one was revoked when it was lost)."""
        from kazoo.exceptions import KazooException

        member = self.member
        session = member.session_id()
        first = True
        # Often: a busy machine may hold a renewal up, and a lease that runs out stops
        # the member (safe, but a rollback and a restart of its stream).
        while first or not member.stopping.wait(self.lease.length_s / 8):
            first = False
            if not member.connected.is_set():
                continue  # suspended: the lease runs out unless the session comes back
            current = member.session_id()
            if current != session:
                old, self.lease = self.lease, Lease(self.lease.length_s)
                old.revoke()
                session = current
            lease = self.lease
            sent = lease.now()
            try:
                member.client.exists(self.root)
            except KazooException as exc:
                log.debug("group %s: lease renewal failed: %s", self.group, exc)
                continue
            if member.session_id() == session and session is not None:
                lease.confirm(sent)

    # -- member side -------------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        from kazoo.exceptions import KazooException

        while not self.member.stopping.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self.member.stopping.is_set():
                break
            if self._lost.is_set():
                self._fence()
            if not self.member.connected.is_set():
                continue
            try:
                self._reconcile()
            except ConfigError as exc:
                if self.error is None:
                    log.error("group %s: %s", self.group, exc)
                self.error = exc
            except KazooException as exc:
                limited(log).warning("group %s: %s", self.group, exc)

    def _fence(self) -> None:
        """The session is gone, and our owner nodes with it: stop everything."""
        self._lost.clear()
        with self._lock:
            self._lost_generation = max(self._lost_generation, self._generation)
            announce = tuple(sorted(self._running - self._revoking))
            self._running.clear()
            self._revoking.clear()
        log.warning("group %s: session lost, partitions %s revoked", self.group, announce)
        if announce:
            self._call(self.on_revoked, announce)

    def _reconcile(self) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        stored = self._read_assignment()
        if stored is None:
            return
        assignment = stored[0]
        if assignment.partitions != self.partitions:
            raise ConfigError(f"group {self.group!r}: the assignment now has "
                              f"{assignment.partitions} partitions, this member "
                              f"{self.partitions}; taking no partitions")
        self._generation = assignment.generation
        with self._lock:
            running = set(self._running)
            fresh_revoke = sorted(p for p in running
                                  if p not in assignment.owners.get(self.member_id, ())
                                  and p not in self._revoking)
            self._revoking.update(fresh_revoke)
            may_take = assignment.generation > self._lost_generation
        if fresh_revoke:
            self._call(self.on_revoked, tuple(fresh_revoke))
        if not may_take:
            return
        diff = diff_partitions(running, assignment.owners.get(self.member_id, ()))
        taken: list[int] = []
        client = self.member.client
        client.ensure_path(self.owners_path)
        data = json.dumps({"member": self.member_id,
                           "generation": assignment.generation}).encode()
        for p in diff.take:
            path = f"{self.owners_path}/{p}"
            try:
                client.create(path, data, ephemeral=True)
            except NodeExistsError:
                try:
                    raw, stat = client.get(path, watch=lambda event: self._wake.set())
                except NoNodeError:
                    self._wake.set()  # freed meanwhile: try again at once
                    continue
                if not (_owner_of(raw) == self.member_id
                        and stat.ephemeralOwner == self.member.session_id()):
                    continue  # still owned by another member (or our old session)
            taken.append(p)
        if taken:
            with self._lock:
                self._running.update(taken)
            self._call(self.on_assigned, tuple(taken))

    # -- leader side -------------------------------------------------------------------

    def _lead(self, session: int | None) -> None:
        from kazoo.exceptions import KazooException

        member = self.member
        log.info("group %s: %s is leader", self.group, self.member_id)
        last_nodes: frozenset[str] | None = None  # None: write once on becoming leader
        while not member.stopping.is_set() and member.session_id() == session:
            try:
                nodes = self._member_nodes()
                if nodes != last_nodes and self._write_assignment(nodes):
                    last_nodes = nodes
            except ConfigError as exc:
                log.error("group %s: leader writes no assignment: %s", self.group, exc)
            except KazooException as exc:
                limited(log).warning("group %s: leader: %s", self.group, exc)
                last_nodes = None
            self._members_changed.wait(self.poll_s)
            self._members_changed.clear()

    def _member_nodes(self) -> frozenset[str]:
        children = self.member.client.get_children(
            self.member.members_path, watch=lambda event: self._members_changed.set())
        return frozenset(children)

    def _live_members(self, nodes: Iterable[str]) -> list[str]:
        from kazoo.exceptions import NoNodeError

        names: set[str] = set()
        for node in nodes:
            try:
                raw, _stat = self.member.client.get(f"{self.member.members_path}/{node}")
            except NoNodeError:
                continue
            name = _owner_of(raw)
            if name:
                names.add(name)
        return sorted(names)

    def _write_assignment(self, nodes: frozenset[str]) -> bool:
        """Write the next generation; False if it must be tried again."""
        from kazoo.exceptions import BadVersionError, NodeExistsError

        members = self._live_members(nodes)
        if not members:
            return True
        stored = self._read_assignment()
        client = self.member.client
        if stored is None:
            new = GroupAssignment(1, self.partitions, assign(members, self.partitions))
            client.ensure_path(self.root)
            try:
                client.create(self.assignment_path, encode_assignment(new))
            except NodeExistsError:
                return False  # someone else wrote it: look again
            return True
        previous, version = stored
        if previous.partitions != self.partitions:
            raise ConfigError(f"stored assignment has {previous.partitions} partitions, "
                              f"the leader {self.partitions}")
        owners = assign(members, self.partitions, previous.owners)
        # Every change of the member nodes is a new generation, even with the same owners:
        # a member that lost its session waits for one newer than it saw.
        new = GroupAssignment(previous.generation + 1, self.partitions, owners)
        try:
            client.set(self.assignment_path, encode_assignment(new), version=version)
        except BadVersionError:
            return False
        log.info("group %s: generation %d: %s", self.group, new.generation, owners)
        return True


def _owner_of(raw: bytes | None) -> str | None:
    try:
        body = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    member = body.get("member") if isinstance(body, dict) else None
    return member if isinstance(member, str) else None

