"""Read-only looks at ZooKeeper for the status commands (``databus cluster status``,
``databus group status``): a session opened with a clear error when no server answers,
reads with a deadline each (kazoo's blocking calls have none), and the order of a kazoo
lock's contenders. Nothing here creates a node. The connect string may carry digest
credentials (``digest:user:password@hosts``): they are needed to read what only they
may read (consumer groups, checkpoints); messages show the connect string without the
password."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from databus.coordination._client import ZooKeeperNotAuthorized, kazoo_client, not_authorized
from databus.errors import DatabusError
from databus.security._zookeeper import ZooKeeperConnect, parse_zookeeper

__all__ = ["ReadOnlyZooKeeper", "ZooKeeperNotAuthorized", "ZooKeeperUnreachable",
           "lock_order", "read_only_session"]

# A kazoo Lock contender's node: ...__lock__<10-digit sequence> (or __rlock__).
_CONTENDER = re.compile(r"(?:__lock__|__rlock__)(-?\d{10})$")


class ZooKeeperUnreachable(DatabusError):
    """No ZooKeeper server of the connect string answered within the timeout."""

    code = "zookeeper_unreachable"


def lock_order(children: Iterable[str]) -> list[str]:
    """A kazoo lock's contender nodes in the order they hold it (sequence number)."""
    found = [(m.group(1), name) for name in children if (m := _CONTENDER.search(name))]
    return [name for _seq, name in sorted(found)]


class ReadOnlyZooKeeper:
    """Reads with a deadline each; a node gone (or never there) reads as empty."""

    def __init__(self, client: Any, timeout: float) -> None:
        self.client = client
        self.timeout = timeout

    def children(self, path: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return sorted(self.client.get_children_async(path).get(timeout=self.timeout))
        except NoNodeError:
            return []

    def data(self, path: str) -> bytes | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, _stat = self.client.get_async(path).get(timeout=self.timeout)
        except NoNodeError:
            return None
        return bytes(data or b"")

    def datas(self, parent: str, children: Sequence[str]) -> list[tuple[str, bytes]]:
        """The data of ``children`` of ``parent`` (the requests pipelined), skipping the
        nodes gone meanwhile (ephemeral ones come and go)."""
        from kazoo.exceptions import NoNodeError

        pending = [(child, self.client.get_async(f"{parent}/{child}")) for child in children]
        out = []
        for child, result in pending:
            try:
                data, _stat = result.get(timeout=self.timeout)
            except NoNodeError:
                continue
            out.append((child, bytes(data or b"")))
        return out


@contextlib.contextmanager
def read_only_session(connect: str | ZooKeeperConnect, timeout: float,
                      what: str) -> Iterator[ReadOnlyZooKeeper]:
    """A read-only session on ``connect``, closed on exit. ``ZooKeeperUnreachable`` when
    no server answers within ``timeout``; ``ZooKeeperNotAuthorized`` when an ACL refuses
    a read; any other failure of a read becomes a ``DatabusError`` naming ``what`` was
    being read (``DatabusError``s pass as they are)."""
    from kazoo.exceptions import NoAuthError
    from kazoo.handlers.threading import KazooTimeoutError

    parsed = parse_zookeeper(connect)
    hosts = parsed.display
    client = kazoo_client(parsed, timeout=timeout, read_only=True)
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError:
        client.close()
        raise ZooKeeperUnreachable(
            f"cannot reach ZooKeeper at {hosts} within {timeout:g} s: no server answered; "
            "check the hosts and ports") from None
    try:
        yield ReadOnlyZooKeeper(client, timeout)
    except DatabusError:
        raise
    except NoAuthError as exc:
        raise not_authorized(exc, f"read {what}", parsed) from None
    except Exception as exc:  # a timeout, a lost connection, no read permission
        raise DatabusError(f"cannot read {what} from ZooKeeper {hosts}: "
                           f"{type(exc).__name__}: {exc}") from None
    finally:
        client.stop()
        client.close()
