"""A relay as a member of a cluster on ZooKeeper (DESIGN 15, docs/clusters.md).

ZooKeeper layout, under the connect string's chroot::

    /databus/relays/<cluster>/members/member-<seq>      ephemeral: this relay's JSON
    /databus/relays/<cluster>/buffers/<buffer>/lock     kazoo Lock: the election
    /databus/relays/<cluster>/buffers/<buffer>/epoch    the newest epoch, as text

Every member registers an ephemeral sequential node with its URL, mode, and per buffer
its role, epoch and max SCN (refreshed every second): discovery and ``databus cluster
status`` read those. In leader-follower mode each buffer has a ``Seat``:

- a contender thread waits in the buffer's kazoo Lock. Holding it, it takes the next
  epoch (compare-and-set on the epoch node), records it in the buffer's epoch history
  and starts the term: the fetcher reads the source from the buffer's own max SCN,
  behind a fence (``FencedSink``) that refuses a commit once the lease (``_lease``) is
  gone. A renewal thread confirms the lease: a read of the epoch node that still says
  this term's epoch, on a connected session that still holds the lock;
- otherwise the member follows: the fetcher chains (``relay+http://``) from the
  leader, the first contender of the lock, after taking the leader's epoch history
  whole (``EpochHistory.follow``); the watcher takes it again every ``_WATCH_S`` while
  it follows, so windows that reached it with a stale epoch end with the leader's. A
  new leader makes it chain from that one (the fetcher host ends the attempt, or the
  retry delay it waits out, at once).

The session lost (expired: a pause, a partition) ends the term for good; kazoo opens a
new session, the member registers again and contends again. With the connection only
suspended, the lease runs out, commits stop, and they go on if the same session comes
back in time. ZooKeeper out of quorum: members keep serving what they hold, a leader
stops appending once its lease ends, and no one else can win meanwhile, so there is no
split brain when quorum returns.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from databus.config import RelayClusterConfig
from databus.coordination import Lease, LockContender, ZooKeeperMember
from databus.errors import ConnectionLostError, DatabusError
from databus.fetchers._api import WindowSink
from databus.relay._buffer import EventBuffer
from databus.relay.cluster._epochs import EpochEntry, EpochHistory
from databus.security import URI_PARAMS, ClientCredentials

__all__ = ["Assignment", "ClusterMember", "FencedError", "FencedSink", "epochs_path"]

log = logging.getLogger("databus.relay.cluster")

_REFRESH_S = 1.0  # how often the member node's data is rewritten
_WATCH_S = 0.25  # how often a follower looks for another leader


class FencedError(DatabusError):
    """The leader's lease ran out before a window's commit: the window is dropped."""

    code = "fenced"
    retriable = True


@dataclass(frozen=True)
class Assignment:
    """What a buffer's fetcher does now: read ``uri`` (the source, or the leader through
    ``relay+http://``), its sink wrapped by ``wrap``, after ``prepare`` ran."""

    role: str  # "leader" | "follower"
    uri: str
    epoch: int
    wrap: Callable[[WindowSink], WindowSink] = lambda sink: sink
    prepare: Callable[[], None] = lambda: None
    # Errors that end an attempt in this role's normal life, not failures: a leader
    # fenced after a pause; a follower whose leader is gone (until the cluster elects).
    expected: tuple[type[BaseException], ...] = ()


class FencedSink:
    """A leader's sink: every window's start and commit check the lease first."""

    def __init__(self, inner: WindowSink, lease: Lease, epoch: int) -> None:
        self.inner = inner
        self.lease = lease
        self.epoch = epoch

    def _check(self) -> None:
        if not self.lease.valid():
            raise FencedError(f"the lease of epoch {self.epoch} ran out: not writing")

    def start_window(self, scn: int) -> None:
        self._check()
        self.inner.start_window(scn)

    def append(self, event: bytes) -> None:
        self.inner.append(event)

    def watermark(self, token: str) -> None:
        self.inner.watermark(token)

    def end_window(self, timestamp_ns: int | None = None) -> int:
        try:
            self._check()
        except FencedError:
            self.inner.rollback()
            raise
        return self.inner.end_window(timestamp_ns)

    def rollback(self) -> None:
        self.inner.rollback()


def chain_uri(leader: str, sources: Sequence[str], credentials: ClientCredentials) -> str:
    """The ``relay+http://`` (``relay+https://`` for an ``https://`` leader) source URI
    a follower chains from ``leader`` with, carrying the cluster's credentials as
    ``ca_file``, ``cert_file``, ``key_file`` and ``token`` (``ClientCredentials.from_query``).
    Holds the token: log it through ``redact_uri`` only."""
    query = [("sources", ",".join(sources))]
    for name in URI_PARAMS:
        value = getattr(credentials, name)
        if value is not None:
            query.append((name, value.reveal() if name == "token" else str(value)))
    encoded = "&".join(f"{k}={quote(v, safe=',/')}" for k, v in query)
    return f"relay+{leader.rstrip('/')}/?{encoded}"


def epochs_path(data_dir: Path, buffer: str) -> Path:
    return data_dir / f"{buffer}.epochs.json"


def _root(config: RelayClusterConfig) -> str:
    return f"/databus/relays/{config.name}"


class Seat:
    """One buffer's place in the election (module docstring)."""

    def __init__(self, member: ClusterMember, buffer: str, source_uri: str,
                 event_buffer: EventBuffer, history: EpochHistory,
                 chain_sources: Callable[[], list[str]]) -> None:
        self.member = member
        self.buffer = buffer
        self.source_uri = source_uri
        self.event_buffer = event_buffer
        self.history = history
        self.chain_sources = chain_sources
        base = f"{_root(member.config)}/buffers/{buffer}"
        self.lock_path = f"{base}/lock"
        self.epoch_path = f"{base}/epoch"
        self.lock_guard = threading.Lock()
        self.term: tuple[int, Lease] | None = None  # (epoch, lease) while leading
        self.leader_url: str | None = None  # the first contender, when not us
        self.on_change: Callable[[], None] = lambda: None  # the runner's reassign
        self.contender = LockContender(member, self.lock_path, f"buffer {buffer}",
                                       hold=self._lead,
                                       on_end=lambda: self._end_term("term over"))
        self._watcher: threading.Thread | None = None

    # -- what the runner asks -----------------------------------------------------------

    def assignment(self) -> Assignment | None:
        with self.lock_guard:
            term, leader = self.term, self.leader_url
        if term is not None:
            epoch, lease = term
            if not lease.valid():
                return None  # suspended or ending: wait, commit nothing
            return Assignment("leader", self.source_uri, epoch,
                              wrap=lambda sink: FencedSink(sink, lease, epoch),
                              expected=(FencedError,))
        if leader is None:
            return None
        sources = self.chain_sources()
        if not sources:
            return None
        uri = chain_uri(leader, sources, self.member.config.credentials)
        return Assignment("follower", uri, self.history.current,
                          prepare=lambda: self._adopt(leader),
                          expected=(OSError, ConnectionLostError))

    def _adopt(self, leader: str) -> None:
        """Take the leader's epoch history, whole (``EpochHistory.follow``): before
        each chaining attempt, and again every ``_WATCH_S`` while following (the
        watcher), so that windows copied through a member that was not the leader (an
        old leader restarted at the same URL, copying from the new one) end with the
        epoch of the leader that wrote them."""
        try:
            doc = self.member.http_json(f"{leader.rstrip('/')}/v1/status")
            entries = doc["buffers"][self.buffer].get("cluster", {}).get("epochs", [])
            upstream = [EpochEntry(int(e), None if a is None else int(a))
                        for e, a in entries]
            held = self.event_buffer.state().max_scn
            moved = self.history.follow(upstream, held)
        except (KeyError, TypeError, ValueError, AttributeError, DatabusError) as exc:
            raise ConnectionLostError(f"buffer {self.buffer}: the epoch history of "
                                      f"{leader} cannot be read: {exc}") from None
        if moved is not None:
            log.warning("buffer %s: the windows after SCN %s up to %d were written again "
                        "by the leader %s in a newer term; their epochs are now its own "
                        "(epochs %s)", self.buffer, moved[0], moved[1], leader,
                        self.history.to_json())

    def _agree(self, leader: str) -> None:
        """A follower's history, checked against its leader's (``_adopt``); a leader
        out of reach is the fetcher's business, not the watcher's."""
        try:
            self._adopt(leader)
        except (OSError, ConnectionLostError) as exc:
            log.debug("buffer %s: the epochs of %s: %s", self.buffer, leader, exc)

    def role(self) -> str:
        with self.lock_guard:
            if self.term is not None:
                return "leader"
            return "follower" if self.leader_url else "waiting"

    # -- threads -----------------------------------------------------------------------

    def start(self) -> None:
        self.contender.start(f"databus-cluster-contend-{self.buffer}")
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name=f"databus-cluster-watch-{self.buffer}")
        self._watcher.start()

    def stop(self) -> None:
        self._end_term("relay stopping")
        self.contender.cancel()
        self.contender.join(5)
        if self._watcher is not None:
            self._watcher.join(5)

    def _next_epoch(self) -> tuple[int, float]:
        from kazoo.exceptions import BadVersionError

        client = self.member.client
        client.ensure_path(self.epoch_path)
        while True:
            sent = self.lease_clock()
            data, stat = client.get(self.epoch_path)
            current = int(data or b"0")
            # Never below what the buffer has seen (an epoch node lost with a wiped
            # ensemble must not restart the numbering under the buffers' histories).
            epoch = max(current, self.history.current) + 1
            try:
                client.set(self.epoch_path, str(epoch).encode(), version=stat.version)
                return epoch, sent
            except BadVersionError:
                continue

    def lease_clock(self) -> float:
        return time.monotonic()

    def _lead(self, session: int | None) -> None:
        member = self.member
        epoch, sent = self._next_epoch()
        lease = Lease(member.session_timeout_s / 2)
        lease.confirm(sent)
        self.history.append(epoch, self.event_buffer.state().max_scn)
        with self.lock_guard:
            self.term = (epoch, lease)
            self.leader_url = None
        log.info("buffer %s: leader, epoch %d, reading the source after SCN %s",
                 self.buffer, epoch, self.event_buffer.state().max_scn)
        self.on_change()
        renew_every = lease.length_s / 4
        while not member.stopping.is_set():
            time.sleep(renew_every)
            if member.session_id() != session or not member.connected.is_set():
                if member.session_id() != session:
                    log.warning("buffer %s: session lost, epoch %d over", self.buffer, epoch)
                    return
                continue  # suspended: the lease runs out unless the session comes back
            sent = lease.now()
            try:
                # Bounded: a request lost with a connection must not stall the renewals.
                data, _ = member.client.get_async(self.epoch_path).get(timeout=renew_every)
            except Exception as exc:  # a timeout, a lost connection: no confirmation
                log.debug("lease renewal of %s failed: %s", self.buffer, exc)
                continue
            if int(data or b"0") != epoch or self.contender.holding_node is None:
                log.warning("buffer %s: epoch moved on to %s, epoch %d over", self.buffer,
                            data, epoch)
                return
            lease.confirm(sent)

    def _end_term(self, why: str) -> None:
        with self.lock_guard:
            term, self.term = self.term, None
        if term is not None:
            term[1].revoke()
            log.info("buffer %s: epoch %d ends (%s)", self.buffer, term[0], why)
            self.on_change()

    def _watch(self) -> None:
        member = self.member
        while not member.stopping.wait(_WATCH_S):
            if self.term is None and self.leader_url is not None:
                self._agree(self.leader_url)
            if self.term is not None or not member.connected.is_set():
                continue
            try:
                lock = member.client.Lock(self.lock_path)
                contenders = lock.contenders()
            except Exception as exc:
                log.debug("contenders of %s: %s", self.buffer, exc)
                continue
            leader = contenders[0] if contenders else None
            if leader == member.url:
                continue  # the contender thread is about to lead
            with self.lock_guard:
                changed = leader != self.leader_url and self.term is None
                if changed:
                    self.leader_url = leader
            if changed:
                log.info("buffer %s: following %s", self.buffer, leader)
                self.on_change()


class ClusterMember(ZooKeeperMember):
    """This relay's session, registration and seats (module docstring)."""

    def __init__(self, config: RelayClusterConfig, url: str) -> None:
        super().__init__(config.zookeeper, config.session_timeout_s,
                         f"{_root(config)}/members", "relay.cluster.zookeeper", url)
        self.config = config
        self.seats: dict[str, Seat] = {}
        self.status_of: Callable[[], dict[str, Any]] = dict
        self.histories: dict[str, EpochHistory] = {}  # per buffer (leader-follower)

    def add_seat(self, seat: Seat) -> None:
        self.seats[seat.buffer] = seat

    def data(self) -> dict[str, Any]:
        return {"url": self.url, "mode": self.config.mode, "buffers": self.status_of(),
                "updated_at": time.time()}

    def start(self) -> None:
        """Connect (a clear error when ZooKeeper cannot be reached), register, contend."""
        self.connect()
        self.start_refresher("databus-cluster-member")
        for seat in self.seats.values():
            seat.start()

    def buffer_status(self, buffer: str) -> dict[str, Any]:
        """``/v1/status``'s ``cluster`` of a buffer: the cluster, mode, this member's
        role and session state, the epoch history and, for a follower, its leader."""
        seat = self.seats.get(buffer)
        history = self.histories.get(buffer)
        return {
            "name": self.config.name,
            "mode": self.config.mode,
            "url": self.url,
            "connected": self.connected.is_set(),
            "role": seat.role() if seat is not None else "independent",
            "leader": (self.url if seat is not None and seat.role() == "leader"
                       else seat.leader_url if seat is not None else None),
            "epoch": history.current if history is not None else None,
            "epochs": history.to_json() if history is not None else [],
        }

    def http_json(self, url: str) -> Any:
        """GET ``url`` (another member's ``/v1/status`` or ``/v1/sources``) with this
        cluster's credentials (``[relay.cluster]`` ca_file, cert_file, key_file, token)."""
        import urllib.request

        credentials = self.config.credentials
        request = urllib.request.Request(url, headers=credentials.headers())
        with urllib.request.urlopen(request, timeout=5,
                                    context=credentials.ssl_for(url)) as resp:
            return json.loads(resp.read())

    def close(self) -> None:
        self.stopping.set()
        for seat in self.seats.values():
            seat.stop()
        self.stop_refresher()
        self.leave()
