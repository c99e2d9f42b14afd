"""The ZooKeeper checkpoint store (one znode per consumer). See ``_checkpoint_store``."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from databus.checkpoint import Checkpoint
from databus.client._checkpoint_envelope import decode_envelope, encode_envelope
from databus.client._checkpoint_store import CheckpointStore, _require_checkpoint
from databus.coordination._client import kazoo_client
from databus.errors import CheckpointError, ConfigError, ConnectionLostError
from databus.security._zookeeper import SENSITIVE, parse_zookeeper

log = logging.getLogger("databus.client.checkpoint")

_T = TypeVar("_T")

# --------------------------------------------------------------------------------------
# ZooKeeper
# --------------------------------------------------------------------------------------

_ZNODE_PART_RE = re.compile(r"[^/\x00-\x1f\x7f]+")


def _znode_root(root: str) -> str:
    if not isinstance(root, str) or not root.startswith("/"):
        raise ConfigError(f"ZooKeeper root {root!r} must be an absolute path such as "
                          "/databus/checkpoints")
    stripped = root.rstrip("/")
    for part in stripped.split("/")[1:]:
        if part in (".", "..") or not _ZNODE_PART_RE.fullmatch(part):
            raise ConfigError(f"ZooKeeper root {root!r} has an invalid component {part!r}")
    return stripped  # "" for "/"


def _znode_name(consumer: object) -> str:
    if (not isinstance(consumer, str) or consumer in (".", "..")
            or not _ZNODE_PART_RE.fullmatch(consumer)):
        raise ConfigError(f"consumer name {consumer!r} must be a non-empty string without '/' "
                          "or control characters, and not '.' or '..' (it becomes a znode)")
    return consumer


class ZooKeeperCheckpointStore(CheckpointStore):
    """The checkpoint in the persistent znode ``<root>/<consumer>``, as the JSON envelope.

    The parents are created with ``ensure_path``. The znode itself is created together
    with its data, never empty. An empty znode can therefore only be damage, and it is
    reported rather than read as "no checkpoint". ``store`` sets the data, and ZooKeeper
    acknowledges a write only once it is logged on a quorum. ``load`` first calls
    ``sync``, so a new session connected to a lagging follower still reads the latest
    write.

    ``hosts`` may carry digest credentials (``digest:user:password@hosts/chroot``):
    the znode and its parents are then created readable and writable by these
    credentials only (``databus.security._zookeeper``, SENSITIVE).

    The session is opened on first use and reconnects by itself. Every operation goes
    through a ``KazooRetry`` that waits out connection loss with backoff for at most
    ``timeout`` seconds. Past that, it raises ``ConnectionLostError`` (retriable).
    ``timeout`` is also the session timeout asked for. ``close`` stops and closes the
    client.
    """

    def __init__(self, hosts: str, consumer: str, root: str = "/databus/checkpoints",
                 timeout: float = 10.0) -> None:
        # Imported here: kazoo takes ~40 ms to import, and most consumers never use it.
        from kazoo.hosts import collect_hosts
        from kazoo.retry import KazooRetry

        self.consumer = _znode_name(consumer)
        self.root = _znode_root(root)
        self.path = f"{self.root}/{self.consumer}"
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigError(f"ZooKeeper timeout must be a positive number, got {timeout!r}")
        # Plain, or digest:user:password@hosts (its password registered for redaction).
        self.connect_string = parse_zookeeper(hosts, "ZooKeeper hosts")
        try:
            collect_hosts(self.connect_string.hosts)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"invalid ZooKeeper hosts {self.connect_string.display!r}: "
                              f"{exc}") from None
        self.hosts = self.connect_string.display  # what messages show
        self.timeout = float(timeout)
        self._retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0,
                                 deadline=self.timeout, ignore_expire=True)
        self._lock = threading.Lock()
        self._client: Any = None  # a started KazooClient, or None

    def __repr__(self) -> str:
        return f"ZooKeeperCheckpointStore({self.hosts!r}, path={self.path!r})"

    @property
    def _where(self) -> str:
        return f"checkpoint znode {self.path} on ZooKeeper {self.hosts}"

    def load(self) -> Checkpoint | None:
        from kazoo.exceptions import NoNodeError

        def read(client: Any, deadline: float) -> bytes | None:
            self._wait(client.sync_async(self.path), deadline)
            try:
                data, _stat = self._wait(client.get_async(self.path), deadline)
            except NoNodeError:
                return None
            return bytes(data or b"")

        raw = self._run("read", read)
        if raw is None:
            return None
        recovery = (
            f"Restore the znode's data, or delete the znode to deliberately start without a "
            f"checkpoint (zkCli.sh delete {self.path}). The consumer will not start over on "
            "its own."
        )
        return decode_envelope(raw, where=self._where, recovery=recovery)

    def store(self, checkpoint: Checkpoint) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        _require_checkpoint(checkpoint)
        data = encode_envelope(checkpoint)

        def write(client: Any, deadline: float) -> None:
            # Try set first: after the first store the znode exists, so one round trip.
            try:
                self._wait(client.set_async(self.path, data), deadline)
                return
            except NoNodeError:
                pass
            if self.root:
                self._wait(client.ensure_path_async(self.root), deadline)
            try:
                self._wait(client.create_async(self.path, data), deadline)
            except NodeExistsError:
                # Created meanwhile, or by our own earlier attempt whose answer was lost.
                self._wait(client.set_async(self.path, data), deadline)

        self._run("write", write)

    def close(self) -> None:
        with self._lock:
            super().close()
            client, self._client = self._client, None
        if client is not None:
            self._shut(client)

    # -- plumbing ---------------------------------------------------------------------

    @staticmethod
    def _shut(client: Any) -> None:
        try:
            client.stop()
            client.close()
        except Exception as exc:  # best effort: the session expires on the server anyway
            log.debug("stopping the ZooKeeper client: %r", exc)

    def _wait(self, async_result: Any, deadline: float) -> Any:
        """The result of a kazoo async call, waiting no longer than ``deadline``.

        kazoo's blocking calls wait without a timeout. While the client is reconnecting,
        requests are queued and would wait for as long as the server is down.
        """
        from kazoo.exceptions import OperationTimeoutError
        from kazoo.handlers.threading import KazooTimeoutError

        timeout = max(deadline - time.monotonic(), 0.01)
        try:
            return async_result.get(timeout=timeout)
        except KazooTimeoutError as exc:
            raise OperationTimeoutError(f"no answer within {timeout:.1f} s") from exc

    def _started_client(self) -> Any:
        from kazoo.handlers.threading import KazooTimeoutError
        from kazoo.retry import KazooRetry

        if self._client is not None:
            return self._client
        # Retries are unlimited because the operations have their own deadline. The delay
        # between reconnect attempts is capped well below that deadline. Otherwise, after a
        # long outage, the next attempt could come after an operation already gave up on a
        # server that is back.
        max_delay = min(2.0, self.timeout / 4)
        client = kazoo_client(
            self.connect_string, SENSITIVE,
            timeout=self.timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2,
                                        max_delay=max_delay),
        )
        try:
            client.start(timeout=self.timeout)
        except KazooTimeoutError:
            # start() has already stopped and closed the client.
            raise ConnectionLostError(
                f"cannot connect to ZooKeeper {self.hosts} within {self.timeout:g} s"
            ) from None
        except BaseException:
            self._shut(client)
            raise
        self._client = client
        return client

    def _run(self, what: str, op: Callable[[Any, float], _T]) -> _T:
        from kazoo.exceptions import (
            ConnectionClosedError,
            ConnectionLoss,
            KazooException,
            NoAuthError,
            OperationTimeoutError,
            SessionExpiredError,
        )
        from kazoo.retry import RetryFailedError

        with self._lock:
            self._check_open()
            client = self._started_client()
            deadline = time.monotonic() + self.timeout

            def attempt() -> _T:
                # A request queued while disconnected waits for the reconnect. Failing fast
                # lets KazooRetry do the waiting, with backoff and up to its deadline.
                if not client.connected:
                    raise ConnectionLoss("not connected")
                return op(client, deadline)

            try:
                result: _T = self._retry.copy()(attempt)  # copy: KazooRetry has per-call state
                return result
            except (RetryFailedError, ConnectionLoss, OperationTimeoutError,
                    SessionExpiredError, ConnectionClosedError) as exc:
                raise ConnectionLostError(
                    f"cannot {what} the {self._where}: no working connection within "
                    f"{self.timeout:g} s ({type(exc).__name__}: {exc})"
                ) from None
            except NoAuthError as exc:
                raise CheckpointError(
                    f"cannot {what} the {self._where}: ZooKeeper refused it "
                    f"({type(exc).__name__}): the znode's ACL belongs to other credentials; "
                    "give the digest credentials it was created with "
                    "(digest:user:password@host:port/chroot, docs/clusters.md)"
                ) from None
            except KazooException as exc:
                # Bad arguments...: retrying does not help.
                raise CheckpointError(
                    f"cannot {what} the {self._where}: {type(exc).__name__}: {exc}"
                ) from None

