"""Bootstrap failover (DESIGN 15 "Bootstrap HA", docs/clusters.md "Bootstrap failover").

Several bootstrap services share one store; with ``[bootstrap.cluster]`` each of them
is a member of a cluster on ZooKeeper. Layout, under the connect string's chroot::

    /databus/bootstrap/<cluster>/members/member-<seq>          ephemeral: this service
    /databus/bootstrap/<cluster>/stores/<store id>/producer    kazoo Lock: the producer
    /databus/bootstrap/<cluster>/stores/<store id>/applier     kazoo Lock: the applier

A member node holds ``{"url", "runs": {"producer": [sources], "applier": [sources]},
"updated_at", "store", "cluster"}`` (refreshed every second); ``runs`` lists the
store's sources under each component this service runs now, nothing under the others.
The store id is made once and kept in the store (``BootstrapStorage.store_id``), so
every service on one store finds the same locks whatever URL it reaches the store by.

The unit of a lock is the store and the component, not each source: a store's log is
one sequence of windows over all its sources with one producer checkpoint, and its
applier moves one applied SCN; the sources of the store are what the holder runs.

Per component this service runs (``bootstrap.run``), a ``Seat``: a contender thread
waits in the component's Lock. Holding it, it confirms a lease (``databus.relay.cluster.
Lease``: half the session timeout from the sending of the last read ZooKeeper answered
showing our lock node) and starts the component, which first takes a new fencing token
from the store (``take_fence``) and only then reads the stored checkpoint. Every write
of the component (log append, applier batch, retention) checks, inside its transaction,
that its token is still the store's (PostgreSQL locks the token's row until the commit,
so a takeover's new token waits for a write in progress and then refuses every older
write), and its lease just before the commit. A holder whose session ended (killed, or
paused past the session timeout) loses the lock; a standby acquires it, takes the next
token and continues from the stored checkpoint: the log's primary keys and the
checkpoint committed with each append make the re-pull start right after the last
committed window, so no log row is written twice. The old holder, resumed, finds its
lease run out and its token outdated: it writes nothing, stops the component when it
sees its session lost, registers again and waits in the Lock as a standby.

Every member serves HTTP reads all the time: reads need no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from databus.bootstrap._component import BackgroundComponent
from databus.bootstrap._storage import BootstrapStorage
from databus.config._bootstrap import BootstrapClusterConfig
from databus.coordination import Lease, LockContender, ZooKeeperMember
from databus.errors import DatabusError

__all__ = ["BootstrapMember", "LeaseExpiredError", "root_path"]

log = logging.getLogger("databus.bootstrap.cluster")

_REFRESH_S = 1.0  # how often the member node's data is rewritten
_STOP_TIMEOUT_S = 30.0  # a component's close (an append in a thread finishes first)


class LeaseExpiredError(DatabusError):
    """The holder has not heard from ZooKeeper for half its session: no commit now."""

    code = "lease_expired"
    retriable = True


def root_path(cluster: str) -> str:
    return f"/databus/bootstrap/{cluster}"


class Seat:
    """One component's place in its store's Lock (module docstring)."""

    def __init__(self, member: BootstrapMember, name: str,
                 component: BackgroundComponent) -> None:
        self.member = member
        self.name = name
        self.component = component
        self.lock_path = f"{root_path(member.config.name)}/stores/{member.store}/{name}"
        self.holding = False
        self.lease: Lease | None = None
        self.terms = 0
        self.contender = LockContender(member, self.lock_path, name, hold=self._hold,
                                       on_end=self._stop_component)
        component.status.state = "standby"

    def start(self) -> None:
        self.contender.start(f"databus-bootstrap-{self.name}-lock")

    def cancel(self) -> None:
        self.contender.cancel()

    def join(self) -> None:
        self.contender.join(_STOP_TIMEOUT_S + 5)

    def guard(self) -> None:
        """Before each commit of the component: the lease must still run."""
        lease = self.lease
        if lease is None or not lease.valid():
            raise LeaseExpiredError(f"the {self.name}'s ZooKeeper lease ran out: no "
                                    "write until the session is confirmed again")

    def _confirm(self, lease: Lease, node: str) -> bool:
        """A read of our lock node answered: the session and the lock were ours when it
        was sent (the lease runs from then)."""
        sent = lease.now()
        if self.member.client.exists(node) is None:
            return False
        lease.confirm(sent)
        return True

    def _hold(self, session: int | None) -> None:
        member = self.member
        node = self.contender.holding_node
        if node is None:
            return
        lease = Lease(member.session_timeout_s / 2)
        if not self._confirm(lease, node):
            return
        self.lease = lease
        self.component.guard = self.guard
        self.terms += 1
        self.holding = True
        self._on_loop(self._start_component())
        log.info("%s: this service runs it now (cluster %s, store %s)", self.name,
                 member.config.name, member.store)
        member.changed.set()
        renew_every = lease.length_s / 4
        while not member.stopping.wait(renew_every):
            if member.session_id() != session:
                log.warning("%s: ZooKeeper session lost; stopping it", self.name)
                return
            if self.component.status.state == "fenced":
                log.warning("%s: fenced by a newer holder; stopping it", self.name)
                time.sleep(member.config.session_timeout_s)  # let the other one run
                return
            if not member.connected.is_set():
                continue  # suspended: the lease runs out unless the session comes back
            try:
                if not self._confirm(lease, node):
                    log.warning("%s: our lock node is gone; stopping it", self.name)
                    return
            except Exception as exc:  # a timeout, a lost connection: no confirmation
                log.debug("lease renewal of %s failed: %s", self.name, exc)

    async def _start_component(self) -> None:
        self.component.start()

    def _stop_component(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.revoke()  # no commit from here on, whatever happens next
        if not self.holding:
            return
        self.holding = False
        self.member.changed.set()
        try:
            self._on_loop(self._close_component())
        except Exception as exc:
            log.warning("%s: stopping it failed: %s", self.name, exc)

    async def _close_component(self) -> None:
        fenced = self.component.status.state == "fenced"
        with contextlib.suppress(Exception):  # close re-raises how the task ended
            await self.component.close()
        self.component.status.state = "fenced" if fenced else "standby"
        log.info("%s: stopped here; standing by", self.name)

    def _on_loop(self, coro: Any) -> None:
        loop = self.member.loop
        assert loop is not None
        asyncio.run_coroutine_threadsafe(coro, loop).result(_STOP_TIMEOUT_S)


class BootstrapMember(ZooKeeperMember):
    """This service's ZooKeeper session, member node and seats (module docstring)."""

    def __init__(self, config: BootstrapClusterConfig, url: str, storage: BootstrapStorage,
                 components: Mapping[str, BackgroundComponent],
                 sources: tuple[str, ...] = ()) -> None:
        super().__init__(config.zookeeper, config.session_timeout_s,
                         f"{root_path(config.name)}/members", "bootstrap.cluster.zookeeper",
                         url)
        self.config = config
        self.storage = storage
        self.components = dict(components)
        self.configured_sources = sources
        self.loop: asyncio.AbstractEventLoop | None = None
        self.store = ""
        self.seats: dict[str, Seat] = {}
        self.sources: list[str] = list(sources)

    def connect(self) -> None:
        """Blocking: the store's id, then ZooKeeper (a clear error when no server of
        the connect string answers)."""
        self.store = self.storage.store_id()
        super().connect()

    async def start(self) -> None:
        """Connect (in a thread), register and contend for this service's components."""
        self.loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.connect)
        for name, component in self.components.items():
            self.seats[name] = Seat(self, name, component)
        self.start_refresher("databus-bootstrap-member")
        for seat in self.seats.values():
            seat.start()

    async def close(self) -> None:
        """Stop contending, stop what runs here, leave the cluster (the loop stays free
        meanwhile: the seats' threads stop their components on it)."""
        self.stopping.set()
        for seat in self.seats.values():
            seat.cancel()
        await asyncio.to_thread(self._join)
        await asyncio.to_thread(self.leave)

    def _join(self) -> None:
        for seat in self.seats.values():
            seat.join()
        self.stop_refresher()

    def runs(self) -> dict[str, list[str]]:
        """Per component, the sources this service runs it for now (empty: standby)."""
        return {name: list(self.sources) if name in self.seats and self.seats[name].holding
                else [] for name in ("producer", "applier")}

    def data(self) -> dict[str, Any]:
        return {"url": self.url, "runs": self.runs(), "updated_at": time.time(),
                "store": self.store, "cluster": self.config.name}

    def before_refresh(self) -> None:
        if self.configured_sources:
            return
        with contextlib.suppress(DatabusError, OSError):
            self.sources = sorted(self.storage.source_ids())

    def status(self) -> dict[str, Any]:
        """``/v1/status``'s ``cluster``: the cluster, this member, what it runs."""
        return {
            "name": self.config.name,
            "url": self.url,
            "store": self.store,
            "connected": self.connected.is_set(),
            "session_timeout_s": self.config.session_timeout_s,
            "runs": self.runs(),
            "components": {
                name: {"role": "holder" if seat.holding else "standby",
                       "terms": seat.terms,
                       "fencing_token": (seat.component.fence.token
                                         if seat.holding and seat.component.fence
                                         else None)}
                for name, seat in self.seats.items()},
        }

