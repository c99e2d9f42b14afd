"""Every kazoo client of the project is built here, from a connect string (DESIGN 18,
docs/clusters.md "ZooKeeper credentials and ACLs").

``kazoo_client(connect, exposure)`` takes a plain connect string or one with digest
credentials (``digest:user:password@hosts/chroot``, ``databus.security._zookeeper``)
and gives a ``KazooClient`` (not started) that authenticates with them and creates every
node with the ACL of its ``exposure``: ``PUBLIC`` (relay and bootstrap clusters: anyone
may read, only the credentials may change) or ``SENSITIVE`` (consumer groups and
checkpoints: only the credentials may read or change). kazoo applies ``default_acl`` to
every node it creates without an explicit ACL: ``create`` (and the parents of
``makepath``), ``ensure_path``, transactions, and the Lock and Election recipes.

``not_authorized(exc, what, connect)`` turns kazoo's ``NoAuthError`` into
``ZooKeeperNotAuthorized``, which says what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from databus.errors import DatabusError
from databus.security._zookeeper import PUBLIC, Exposure, ZooKeeperConnect, parse_zookeeper

__all__ = ["ZooKeeperNotAuthorized", "kazoo_client", "not_authorized"]


class ZooKeeperNotAuthorized(DatabusError):
    """ZooKeeper refused an operation: the node's ACL does not grant it to this
    session's credentials (none, or another user or password)."""

    code = "zookeeper_not_authorized"


def kazoo_client(connect: str | ZooKeeperConnect, exposure: Exposure = PUBLIC, *,
                 field: str = "zookeeper", extra_auth: Sequence[tuple[str, str]] = (),
                 **kwargs: Any) -> Any:
    """A ``KazooClient`` (not started) on ``connect``, with its credentials and the ACL
    of ``exposure`` for the nodes it creates. ``extra_auth``: more ``(scheme,
    credential)`` the session authenticates with (earlier credentials, ``_acl``).
    ``kwargs`` go to ``KazooClient`` (timeout, read_only, connection_retry...).
    ``ConfigFieldError`` naming ``field`` for a bad connect string."""
    from kazoo.client import KazooClient

    parsed = parse_zookeeper(connect, field)
    options = parsed.kazoo_kwargs(exposure)
    if extra_auth:
        options["auth_data"] = [*options.get("auth_data", []), *extra_auth]
    return KazooClient(**options, **kwargs)


def not_authorized(exc: BaseException, what: str,
                   connect: str | ZooKeeperConnect) -> ZooKeeperNotAuthorized:
    """The error for kazoo's ``NoAuthError`` while doing ``what``."""
    parsed = parse_zookeeper(connect)
    whose = (f"ZooKeeper user {parsed.user!r}" if parsed.secured
             else "a session without credentials")
    return ZooKeeperNotAuthorized(
        f"ZooKeeper {parsed.display} refused to let {whose} {what} ({type(exc).__name__}): "
        "the node's ACL belongs to other credentials; give the digest credentials the "
        "nodes were created with (digest:user:password@host:port/chroot, "
        "docs/clusters.md)")
