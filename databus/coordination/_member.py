"""A process's ZooKeeper session and its ephemeral member node (kazoo).

Relays (``databus.relay.cluster``) and bootstrap services (``databus.bootstrap``) join
their clusters the same way, written once here:

- ``connect`` opens the session, or raises a clear error naming the setting when no
  server of the connect string answers (kazoo alone would retry for ever);
- the session id is tracked from kazoo's state listener: a new id after ``LOST`` is a
  new session, whose ephemeral nodes are gone, so the member registers again;
- the session authenticates with the digest credentials of the connect string, if
  any, and creates its nodes with the ACL of ``exposure`` (``_client.kazoo_client``);
- the member node (``<members_path>/member-<seq>``, ephemeral sequential) holds the
  JSON ``data()`` of the subclass, rewritten every ``refresh_s`` and at once after
  ``changed`` is set.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Any

from databus.coordination._client import kazoo_client, not_authorized
from databus.errors import DatabusError
from databus.security._zookeeper import PUBLIC, Exposure, parse_zookeeper

__all__ = ["ZooKeeperMember"]

log = logging.getLogger("databus.coordination")


class ZooKeeperMember:
    """See the module docstring. Subclasses give ``data()`` and may override
    ``before_refresh()`` (called in the refresher thread before each rewrite)."""

    def __init__(self, hosts: str, session_timeout_s: float, members_path: str,
                 setting: str, url: str, refresh_s: float = 1.0,
                 exposure: Exposure = PUBLIC) -> None:
        # The connect string may carry digest credentials: kept parsed, shown without
        # the password (``hosts`` is what messages print).
        self.connect_string = parse_zookeeper(hosts, setting)
        self.hosts = self.connect_string.display
        self.exposure = exposure  # the ACL of the nodes this session creates
        self.url = url.rstrip("/")  # where others reach this process; the Lock identifier
        self.session_timeout_s = session_timeout_s
        self.members_path = members_path
        self.setting = setting  # the config key of the connect string, for errors
        self.refresh_s = refresh_s
        self.client: Any = None
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.changed = threading.Event()  # rewrite the member node now
        # time.monotonic() when the connection was last lost (None while connected).
        self._disconnected_at: float | None = None
        self._session: int | None = None
        self._node: str | None = None
        self._register_needed = threading.Event()
        self._refresher: threading.Thread | None = None

    def data(self) -> dict[str, Any]:
        return {}

    def before_refresh(self) -> None:
        """Hook: refresh what ``data()`` shows (the refresher thread)."""

    def session_id(self) -> int | None:
        return self._session

    def disconnected_for(self, now: float | None = None) -> float:
        """Seconds since the connection to ZooKeeper was lost; 0 while connected."""
        since = self._disconnected_at
        if since is None or self.connected.is_set():
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - since)

    def connect(self) -> None:
        """Blocking: open the session and register the member node."""
        from kazoo.exceptions import NoAuthError
        from kazoo.handlers.threading import KazooTimeoutError

        self.client = kazoo_client(self.connect_string, self.exposure,
                                   timeout=self.session_timeout_s)
        self.client.add_listener(self._state_changed)
        try:
            self.client.start(timeout=max(5.0, self.session_timeout_s))
        except KazooTimeoutError:
            self.client.close()
            raise DatabusError(f"cannot reach ZooKeeper at {self.hosts} ({self.setting}): no "
                               "server answered; check the hosts and ports") from None
        client_id = self.client.client_id
        self._session = client_id[0] if client_id else None
        self.connected.set()
        # The listener saw this first CONNECTED before the session was noted: not a
        # new session to register again.
        self._register_needed.clear()
        self.before_refresh()
        try:
            self._register()
        except NoAuthError as exc:
            self.client.stop()
            self.client.close()
            raise not_authorized(exc, f"register under {self.members_path} "
                                      f"({self.setting})", self.connect_string) from None

    def start_refresher(self, name: str) -> None:
        self._refresher = threading.Thread(target=self._refresh, daemon=True, name=name)
        self._refresher.start()

    def stop_refresher(self) -> None:
        self.stopping.set()
        self.changed.set()
        if self._refresher is not None:
            self._refresher.join(5)

    def leave(self) -> None:
        """Delete the member node (if the session still has it) and close the session."""
        if self.client is None:
            return
        try:
            if self._node is not None and self.connected.is_set():
                self.client.delete(self._node)
        except Exception:
            log.debug("member node delete failed", exc_info=True)
        self.client.stop()
        self.client.close()

    def _state_changed(self, state: str) -> None:
        # kazoo's connection thread: no blocking calls here.
        from kazoo.client import KazooState

        if state == KazooState.CONNECTED:
            client_id = self.client.client_id
            session = client_id[0] if client_id else None
            if session != self._session:
                self._session = session
                self._register_needed.set()
            self._disconnected_at = None
            self.connected.set()
        else:
            if self._disconnected_at is None:
                self._disconnected_at = time.monotonic()
            self.connected.clear()
            if state == KazooState.LOST:
                self._session = None
                log.warning("ZooKeeper session lost")

    def _register(self) -> None:
        from kazoo.exceptions import NoNodeError

        self.client.ensure_path(self.members_path)
        if self._node is not None:
            with contextlib.suppress(NoNodeError):  # gone with the old session
                self.client.delete(self._node)
        self._node = self.client.create(f"{self.members_path}/member-", self._encoded(),
                                        ephemeral=True, sequence=True)

    def _encoded(self) -> bytes:
        return json.dumps(self.data()).encode()

    def _refresh(self) -> None:
        while not self.stopping.is_set():
            self.changed.wait(self.refresh_s)
            self.changed.clear()
            if self.stopping.is_set() or not self.connected.is_set():
                continue
            self.before_refresh()
            try:
                if self._register_needed.is_set():
                    self._register_needed.clear()
                    self._register()
                elif self._node is not None:
                    self.client.set(self._node, self._encoded())
            except Exception as exc:
                log.debug("member refresh failed: %s", exc)
                self._register_needed.set()
