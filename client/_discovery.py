"""Discovery: the relays of a cluster, read from ZooKeeper (DESIGN 15, docs/clusters.md).

``DatabusClient(zookeeper="zk1:2181,zk2:2181/chroot", cluster="shop")`` and ``databus
tail --zookeeper ... --cluster ...`` take their relay list from the members of a relay
cluster instead of a fixed list. Every member of a cluster registers an ephemeral node
(``relay/cluster/_member.py``)::

    /databus/relays/<cluster>/members/member-<seq>   {"url", "mode", "buffers", ...}

Two parts:

- pure: ``relay_urls(datas)`` turns the members' node data into the URL list (skipping
  what cannot be read, and members that say they are not ``connected``);
- ``RelayDiscovery``: a kazoo client (imported lazily) that reads the members at start
  (a clear error, after ``timeout`` seconds, when no ZooKeeper server answers) and then
  follows them from a thread: a one-shot children watch wakes it at once when a member
  joins or leaves, and it reads again every ``refresh_s`` anyway (node data changes, a
  watch lost with a session, a members node created later). A member found missing is
  dropped only if a second read ``CONFIRM_S`` later still misses it (a relay that
  registers again deletes its node before creating the next). Each new list goes to the
  listeners; the client hands it to its ``RelayPuller`` (``FailoverPuller.set_urls``).

When ZooKeeper cannot be reached after the start, the last list is kept: the relays are
most likely still there, and their sessions outlive a client's trouble.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from databus._redact import register_uri
from databus.config._checks import check_name
from databus.config._cluster import check_zookeeper_hosts
from databus.coordination import ZooKeeperUnreachable, kazoo_client
from databus.errors import ConfigError
from databus.security._zookeeper import parse_zookeeper

__all__ = ["RelayDiscovery", "ZooKeeperUnreachable", "members_path", "relay_urls",
           "validate_discovery"]

log = logging.getLogger("databus.client.discovery")

REFRESH_S = 2.0  # how often the members are read even without a watch firing
CONFIRM_S = 0.5  # a member missing is dropped only when still missing this much later


def members_path(cluster: str) -> str:
    return f"/databus/relays/{cluster}/members"


def validate_discovery(zookeeper: str, cluster: str, timeout: float) -> None:
    """A clear ``ConfigError`` for a bad connect string, cluster name or timeout."""
    if not isinstance(zookeeper, str):
        raise ConfigError(f"zookeeper must be a connect string, got {zookeeper!r}")
    if not isinstance(cluster, str):
        raise ConfigError(f"cluster must be a cluster name, got {cluster!r}")
    try:
        check_zookeeper_hosts(zookeeper)
        check_name(cluster, "cluster")
    except ConfigError as exc:
        raise ConfigError(f"relay discovery: {exc}") from None
    if not isinstance(timeout, int | float) or not 0 < timeout <= 600:
        raise ConfigError(f"zookeeper_timeout must be between 0 and 600 s, got {timeout!r}")


def parse_member(data: bytes | str | None) -> dict[str, Any] | None:
    """A member node's JSON document, or None when it is not one (empty, cut short)."""
    if not data:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def member_url(doc: dict[str, Any]) -> str | None:
    """The URL a member serves at, when it is a usable one (``http(s)://...``)."""
    url = doc.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return None
    return url.rstrip("/")


def relay_urls(datas: Iterable[bytes | str | None]) -> list[str]:
    """The relay URLs of a cluster's members, from their nodes' data, in node order
    (the caller passes them sorted by node name: oldest member first), each once.

    Skipped: data that is not a member's JSON document or has no ``http(s)://`` URL,
    and a member whose document says ``"connected": false`` (at the top, or for every
    one of its buffers): it cannot currently talk to ZooKeeper, so it may be a
    leader about to be replaced. Any member may serve otherwise, followers included
    (they hold the same windows as the leader), so no role is preferred: the puller's
    random start and round-robin failover spread consumers."""
    urls: list[str] = []
    for data in datas:
        doc = parse_member(data)
        if doc is None:
            continue
        url = member_url(doc)
        if url is None or url in urls or not _connected(doc):
            continue
        urls.append(url)
    return urls


def _connected(doc: dict[str, Any]) -> bool:
    if doc.get("connected") is False:
        return False
    buffers = doc.get("buffers")
    if isinstance(buffers, dict) and buffers:
        flags = [b.get("connected") for b in buffers.values() if isinstance(b, dict)]
        if flags and all(flag is False for flag in flags):
            return False
    return True


class RelayDiscovery:
    """Follows the members of one relay cluster (module docstring)."""

    def __init__(self, zookeeper: str, cluster: str, *, timeout: float = 10.0,
                 refresh_s: float = REFRESH_S) -> None:
        validate_discovery(zookeeper, cluster, timeout)
        # Plain or digest:user:password@hosts; ``zookeeper`` is what messages show.
        self.connect_string = parse_zookeeper(zookeeper)
        self.zookeeper = self.connect_string.display
        self.cluster = cluster
        self.timeout = float(timeout)
        self.refresh_s = refresh_s
        self.path = members_path(cluster)
        self.urls: list[str] = []
        self._listeners: list[Callable[[list[str]], None]] = []
        self._client: Any = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_empty = False

    def __repr__(self) -> str:
        return f"RelayDiscovery({self.zookeeper!r}, cluster={self.cluster!r})"

    @property
    def where(self) -> str:
        return f"relay cluster {self.cluster!r} ({self.path} on ZooKeeper {self.zookeeper})"

    def subscribe(self, listener: Callable[[list[str]], None]) -> None:
        """Call ``listener(urls)`` from the discovery thread on every change."""
        self._listeners.append(listener)

    def start(self) -> list[str]:
        """Connect, read the members once, and follow them from a thread. Raises
        ``ZooKeeperUnreachable`` when no server answers within ``timeout`` seconds."""
        from kazoo.handlers.threading import KazooTimeoutError
        from kazoo.retry import KazooRetry

        client = kazoo_client(
            self.connect_string, timeout=self.timeout, read_only=True,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2,
                                        max_delay=min(2.0, self.timeout / 4)))
        try:
            client.start(timeout=self.timeout)
        except KazooTimeoutError:  # start() stopped the client already
            client.close()
            raise ZooKeeperUnreachable(
                f"cannot reach ZooKeeper at {self.zookeeper} within {self.timeout:g} s "
                f"(relay discovery of cluster {self.cluster!r}): no server answered; check "
                "the hosts and ports") from None
        except BaseException:
            _shut(client)
            raise
        self._client = client
        try:
            self.urls = self._read()
        except Exception as exc:  # connected, yet the first read failed: say it once
            _shut(client)
            self._client = None
            raise ZooKeeperUnreachable(f"cannot read the members of the {self.where}: "
                                       f"{type(exc).__name__}: {exc}") from None
        self._log_list(self.urls, first=True)
        self._thread = threading.Thread(target=self._follow, daemon=True,
                                        name=f"databus-discovery-{self.cluster}")
        self._thread.start()
        return list(self.urls)

    def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1)
        client, self._client = self._client, None
        if client is not None:
            _shut(client)

    # -- the thread ---------------------------------------------------------------------

    def _poke(self, _event: Any = None) -> None:
        self._wake.set()  # kazoo's event thread: nothing blocking here

    def _read(self) -> list[str]:
        """The members' URLs now; a watch is left on the members node (its children, or
        its creation) that wakes the thread on the next change."""
        from kazoo.exceptions import NoNodeError

        client = self._client
        wait = self.timeout
        try:
            children = client.get_children_async(self.path, watch=self._poke).get(
                timeout=wait)
        except NoNodeError:
            client.exists_async(self.path, watch=self._poke).get(timeout=wait)
            return []
        pending = [(name, client.get_async(f"{self.path}/{name}")) for name in sorted(children)]
        datas: list[bytes | None] = []
        for _name, result in pending:
            try:
                data, _stat = result.get(timeout=wait)
            except NoNodeError:  # gone between the listing and the read
                continue
            datas.append(data)
        return relay_urls(datas)

    def _follow(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.refresh_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            if not self._client.connected:
                continue  # kazoo reconnects by itself; keep the list we have
            try:
                urls = self._read()
                if set(self.urls) - set(urls) and not self._stopping.wait(CONFIRM_S):
                    # A member gone: read again before dropping it (a member that
                    # registers again deletes its node before creating the next one).
                    urls = self._read()
            except Exception as exc:
                log.debug("reading the members of the %s failed: %r", self.where, exc)
                time.sleep(0.2)
                continue
            if urls != self.urls:
                self._log_list(urls, first=False)
                self.urls = urls
                for listener in list(self._listeners):
                    try:
                        listener(list(urls))
                    except Exception:  # a closed loop at shutdown, say
                        log.debug("discovery listener failed", exc_info=True)

    def _log_list(self, urls: Sequence[str], *, first: bool) -> None:
        for url in urls:
            register_uri(url)
        if urls:
            self._warned_empty = False
            log.info("%s: relays %s", self.where, ", ".join(urls))
        elif first or not self._warned_empty:
            self._warned_empty = True
            log.warning("%s has no members: waiting for a relay to join", self.where)


def _shut(client: Any) -> None:
    try:
        client.stop()
        client.close()
    except Exception as exc:  # best effort: the session expires on the server anyway
        log.debug("stopping the ZooKeeper client: %r", exc)
