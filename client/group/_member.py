"""What ``DatabusClient(group=..., coordinator=..., partitions=P)`` runs: one member of a
consumer group (DESIGN section 15, docs/client.md "Consumer groups").

The member runs a sequence of *streams* (``Segment``), each the client's ordinary pull
loop with a filter naming the partitions it runs, a checkpoint store that writes each
of them (``GroupCheckpointStore``) and a fence (the coordinator's lease). A rebalance
ends the current stream and starts the next:

1. the coordinator reports a change (partitions revoked or taken, or its session
   lost): the stream ends; the window in progress finishes and its checkpoint is
   written first (``Runner.stop``), unless the lease has run out (then it is rolled
   back: ``on_rollback``, nothing committed);
2. partitions no longer assigned: ``on_partitions_revoked(parts)``, then their owner
   nodes are deleted (``GroupCoordinator.release``), which lets their new owners start;
3. partitions taken: ``on_partitions_assigned(parts)``; the next stream reads every
   run partition's checkpoint and starts from the earliest (``plan_start``).

Consumer callbacks run in the client's threads, never concurrently with a window.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from databus._limited_log import limited
from databus.client._checkpoint_postgres import PostgresCheckpointStore
from databus.client._checkpoint_store import CheckpointStore
from databus.client._events import EndOfWindow, Item
from databus.client.group._assignment import _check_partitions, member_filter
from databus.client.group._checkpoints import (
    GroupCheckpointStore,
    PartitionCheckpoints,
    PostgresPartitions,
    StartPlan,
    ZooKeeperPartitions,
    plan_start,
    skip_items,
)
from databus.client.group._coordinator import GroupCoordinator, group_root
from databus.errors import ConfigError, ConnectionLostError
from databus.filters import FilterSpec
from databus.security._zookeeper import parse_zookeeper

if TYPE_CHECKING:
    from databus.client._client import DatabusClient
    from databus.client._discovery import RelayDiscovery

__all__ = ["GroupRun", "Segment", "ZooKeeperCoordinator"]

log = logging.getLogger("databus.client.group")


@dataclass(frozen=True)
class ZooKeeperCoordinator:
    """Where a consumer group is coordinated: a ZooKeeper connect string
    (``host:port[,host:port...][/chroot]``, or the same after ``zookeeper://``; with
    ``digest:user:password@`` in front, the group's nodes are readable and writable by
    these credentials only, docs/clusters.md) and the session timeout in seconds. A
    member whose session ends stops processing within half of it (its lease) and its
    partitions move after it."""

    hosts: str
    session_timeout: float = 10.0

    def __repr__(self) -> str:  # never the password
        return (f"ZooKeeperCoordinator({parse_zookeeper(self.hosts).display!r}, "
                f"session_timeout={self.session_timeout!r})")

    def __post_init__(self) -> None:
        hosts = self.hosts
        if not isinstance(hosts, str) or not hosts.strip():
            raise ConfigError("ZooKeeperCoordinator needs a connect string "
                              "(host:port[,host:port...][/chroot])")
        if hosts.startswith("zookeeper://"):
            object.__setattr__(self, "hosts", hosts[len("zookeeper://"):])
        # A bad connect string fails here; a digest password is registered for redaction.
        parse_zookeeper(self.hosts, "coordinator")
        timeout = self.session_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
                0 < timeout <= 600):
            raise ConfigError(f"session_timeout must be a number of seconds in (0, 600], "
                              f"got {timeout!r}")


@dataclass
class Segment:
    """One stream of a member: the partitions it runs and how."""

    partitions: tuple[int, ...]
    count: int  # the group's partition count P
    spec: FilterSpec
    store: GroupCheckpointStore
    fence: Callable[[], bool]
    skip: dict[int, int]
    over: threading.Event  # set: end this stream (a change, or stop)
    fenced: bool = False
    _skip_until: int = field(default=-1, init=False)

    def __post_init__(self) -> None:
        self._skip_until = max(self.skip.values(), default=-1)

    def skip_items(self, items: list[Item]) -> list[Item]:
        """Drop the events of partitions that already have their window; once past
        the last such window the table is dropped (and this costs nothing more)."""
        kept = skip_items(items, self.skip, self.count)
        ends = [i.scn for i in items if type(i) is EndOfWindow]
        if ends and ends[-1] >= self._skip_until:
            self.skip = {}
        return kept


class GroupRun:
    """The member's rebalance loop; see the module docstring."""

    def __init__(self, client: DatabusClient,
                 start_segment: Callable[[asyncio.AbstractEventLoop, RelayDiscovery | None,
                                          Segment], Awaitable[None]]) -> None:
        assert client.group is not None and client.coordinator is not None
        assert client.partitions is not None
        self.client = client
        self._start_segment = start_segment
        self.partitions = client.partitions
        self.changed = threading.Event()  # the coordinator reported a change
        self.running: tuple[int, ...] = ()  # what the consumers were told they have
        self.rebalances = 0
        self._change_pending = False  # a change not yet followed by a new stream
        self.coordinator = GroupCoordinator(
            client.coordinator.hosts, client.group, client.partitions, client.client_id,
            on_assigned=self._on_change, on_revoked=self._on_change,
            session_timeout_s=client.coordinator.session_timeout,
            extra_data=self._member_data)

    @staticmethod
    def validate(client: DatabusClient, checkpoint_store: CheckpointStore | None) -> None:
        """``DatabusClient`` arguments of a group member, checked at construction."""
        if client.group is None or client.coordinator is None or client.partitions is None:
            raise ConfigError("a consumer group member needs group=, coordinator="
                              "ZooKeeperCoordinator(...) and partitions= together")
        if not isinstance(client.coordinator, ZooKeeperCoordinator):
            raise ConfigError("coordinator must be a ZooKeeperCoordinator, got "
                              f"{type(client.coordinator).__name__}")
        group_root(client.group)  # a clear ConfigError for a bad name
        _check_partitions(client.partitions)
        if not client.sources:
            raise ConfigError("a consumer group member needs sources=[...]: each source "
                              "is split into the group's partitions")
        if not client.filter.is_empty:
            raise ConfigError("a consumer group member cannot take filter=: the group's "
                              "partition filter is its filter")
        if checkpoint_store is not None and not isinstance(checkpoint_store,
                                                           PostgresCheckpointStore):
            raise ConfigError("a consumer group member keeps one checkpoint per partition: "
                              "in the coordinator's ZooKeeper (no checkpoint_store=), or "
                              "in a PostgresCheckpointStore's table (rows <consumer>#<p>); "
                              f"not in a {type(checkpoint_store).__name__}")
        if "/" in client.client_id:
            raise ConfigError("a group member's client_id names its ZooKeeper nodes: "
                              "it cannot contain '/'")

    # -- coordinator side (its thread) ------------------------------------------------

    def _on_change(self, parts: tuple[int, ...]) -> None:
        self._change_pending = True
        self.changed.set()
        self.client.end_segment()

    def _member_data(self) -> dict[str, Any]:
        m = self.client.metrics
        return {"client_id": self.client.client_id, "partitions": list(self.running),
                "relay_max_scn": m.relay_max_scn, "consumer_scn": m.committed_scn,
                "lag_ms": m.lag_ms, "lag_seconds": m.lag_seconds}

    # -- the loop ---------------------------------------------------------------------

    async def run(self, loop: asyncio.AbstractEventLoop,
                  discovery: RelayDiscovery | None) -> None:
        from databus.client._metrics import ClientMetrics

        coordinator = self.coordinator
        # One set of metrics across the member's streams.
        self.client.metrics = ClientMetrics(started_at=time.monotonic())
        await asyncio.to_thread(coordinator.start)
        try:
            await self._loop(loop, discovery)
        finally:
            await self._revoke(self.running)
            await asyncio.to_thread(coordinator.close)

    async def _loop(self, loop: asyncio.AbstractEventLoop,
                    discovery: RelayDiscovery | None) -> None:
        from kazoo.exceptions import KazooException  # here: kazoo is slow to import

        client, coordinator = self.client, self.coordinator
        while not client._stop_requested.is_set():
            if coordinator.error is not None:
                raise coordinator.error
            self.changed.clear()  # a change from here on ends the next stream
            active = coordinator.active
            revoked = tuple(p for p in self.running if p not in active)
            await self._revoke(revoked)
            # Revoked before they were ever run here: release them too.
            stale = [p for p in coordinator.owned if p not in active]
            if stale:
                await asyncio.to_thread(coordinator.release, stale)
            lease = coordinator.lease
            if not active or not lease.valid():
                await self._wait_for_change()
                continue
            taken = tuple(p for p in active if p not in self.running)
            if taken:
                self.running = tuple(sorted(set(self.running) | set(taken)))
                await asyncio.to_thread(self._call, "on_partitions_assigned", taken)
            try:
                segment = await self._segment(active, lease)
            except (KazooException, ConnectionLostError) as exc:
                # ZooKeeper (or the PostgreSQL store) unreachable for now (quorum lost,
                # connection loss): the session may well survive it; try again.
                limited(log).warning("group %s: cannot read the partition checkpoints (%s); "
                                     "retrying", client.group, exc)
                await asyncio.sleep(0.5)
                continue
            if self._change_pending:
                self._change_pending = False
                self.rebalances += 1
            client.metrics.group_partitions = active
            client.metrics.rebalances = self.rebalances
            log.info("group %s: streaming partitions %s", client.group, list(active))
            await self._start_segment(loop, discovery, segment)
            if segment.fenced:
                log.warning("group %s: lease ran out; partitions %s stopped", client.group,
                            list(active))
                await self._wait_for_change()

    async def _segment(self, active: tuple[int, ...], lease: Any) -> Segment:
        coordinator = self.coordinator
        session = coordinator.member.session_id()
        backend: PartitionCheckpoints
        if isinstance(self.client.checkpoint_store, PostgresCheckpointStore):
            backend = PostgresPartitions(self.client.checkpoint_store)
        else:
            backend = ZooKeeperPartitions(coordinator.member.client,
                                          f"{coordinator.root}/checkpoints")
        stored = await asyncio.to_thread(backend.load, list(active))
        plan: StartPlan = plan_start(stored, self.client.start_from)
        spec = member_filter(self.client.sources, active, self.partitions)

        def session_ended() -> bool:
            return coordinator.member.session_id() != session

        store = GroupCheckpointStore(backend, active, plan, session_ended,
                                     self.client.end_segment)
        return Segment(active, self.partitions, spec, store, lease.valid, dict(plan.skip),
                       self.changed)

    async def _wait_for_change(self) -> None:
        """Until the coordinator reports a change, the lease is valid again, or stop."""
        client, coordinator = self.client, self.coordinator
        while not client._stop_requested.is_set() and not self.changed.is_set():
            if coordinator.error is not None:
                return
            if coordinator.active and coordinator.lease.valid():
                return
            await asyncio.sleep(0.05)

    async def _revoke(self, parts: Iterable[int]) -> None:
        parts = tuple(sorted(parts))
        if not parts:
            return
        self.running = tuple(p for p in self.running if p not in parts)
        self.client.metrics.group_partitions = self.running
        await asyncio.to_thread(self._call, "on_partitions_revoked", parts)
        await asyncio.to_thread(self.coordinator.release, parts)

    def _call(self, method: str, parts: tuple[int, ...]) -> None:
        for consumer in self.client._consumers:
            try:
                getattr(consumer, method)(parts)
            except Exception:
                log.exception("%s(%s) raised", method, list(parts))
