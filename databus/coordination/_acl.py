"""Putting the project's ACLs on an existing tree: when digest credentials are introduced
on a tree created without them, and to rotate the password (docs/clusters.md
"ZooKeeper credentials and ACLs").

``secure_tree(connect, ...)`` walks ``/databus`` (under the chroot of ``connect``) and
gives every node the ACL its place calls for (``databus.security._zookeeper``):
SENSITIVE under ``/databus/groups`` and ``/databus/checkpoints`` (and any other
``sensitive`` roots, e.g. a checkpoint store's own ``root``), PUBLIC elsewhere. Nodes
that already have it are left alone. ``previous`` names earlier credentials
(``user:password``): the session authenticates with them too, so that it may change the
ACL of nodes they own, and with ``keep_previous`` they stay in every ACL (the first
step of a rotation). A node whose ACL this session may not change is counted, not
fatal: ``ZooKeeperNotAuthorized`` at the end lists them.

Also ``python -m databus.coordination secure --zookeeper CONNECT [--previous-env VAR]
[--keep-previous] [--sensitive PATH ...]`` (``__main__``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from databus._redact import register_secret
from databus.coordination._client import ZooKeeperNotAuthorized, kazoo_client
from databus.coordination._readonly import ZooKeeperUnreachable
from databus.errors import ConfigError
from databus.security._zookeeper import PUBLIC, SENSITIVE, Exposure, parse_zookeeper

__all__ = ["DEFAULT_SENSITIVE", "ROOT", "SecuredTree", "exposure_of", "secure_tree"]

ROOT = "/databus"
DEFAULT_SENSITIVE = ("/databus/groups", "/databus/checkpoints")


@dataclasses.dataclass
class SecuredTree:
    """What ``secure_tree`` did: nodes whose ACL it set, and those already right."""

    changed: list[str] = dataclasses.field(default_factory=list)
    unchanged: int = 0


def exposure_of(path: str, sensitive: Sequence[str] = DEFAULT_SENSITIVE) -> Exposure:
    """SENSITIVE for ``path`` at or under one of ``sensitive``, else PUBLIC (pure)."""
    for root in sensitive:
        root = root.rstrip("/")
        if path == root or path.startswith(root + "/"):
            return SENSITIVE
    return PUBLIC


def _acl_key(acl: Sequence[Any]) -> set[tuple[int, str, str]]:
    return {(a.perms, a.id.scheme, a.id.id) for a in acl}


def secure_tree(connect: str, *, previous: Sequence[str] = (), keep_previous: bool = False,
                sensitive: Sequence[str] = DEFAULT_SENSITIVE, root: str = ROOT,
                timeout: float = 10.0) -> SecuredTree:
    """See the module docstring. ``previous``: ``user:password`` of earlier credentials."""
    from kazoo.exceptions import NoAuthError, NoNodeError
    from kazoo.handlers.threading import KazooTimeoutError
    from kazoo.security import make_digest_acl

    parsed = parse_zookeeper(connect)
    if not parsed.secured:
        raise ConfigError("secure_tree needs digest credentials in the connect string "
                          "(digest:user:password@host:port/chroot)")
    olds: list[tuple[str, str]] = []
    for credentials in previous:
        user, sep, password = credentials.partition(":")
        register_secret(password, fragments=True)
        if not sep or not user or not password:
            raise ConfigError("previous credentials must be user:password")
        olds.append((user, password))
    extra = [make_digest_acl(u, p, all=True) for u, p in olds] if keep_previous else []
    wanted = {exposure: [*(parsed.acl(exposure) or []), *extra]
              for exposure in (PUBLIC, SENSITIVE)}
    client = kazoo_client(parsed, timeout=timeout,
                          extra_auth=[("digest", f"{u}:{p}") for u, p in olds])
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError:
        client.close()
        raise ZooKeeperUnreachable(f"cannot reach ZooKeeper at {parsed.display} within "
                                   f"{timeout:g} s: no server answered") from None
    done = SecuredTree()
    refused: list[str] = []
    try:
        pending = [root.rstrip("/") or "/"]
        while pending:
            path = pending.pop()
            try:
                acl, _stat = client.get_acls(path)
                children = client.get_children(path)
            except NoNodeError:
                continue  # gone meanwhile (ephemeral)
            except NoAuthError:
                refused.append(path)
                continue
            pending += [f"{path.rstrip('/')}/{child}" for child in children]
            target = wanted[exposure_of(path, sensitive)]
            if _acl_key(acl) == _acl_key(target):
                done.unchanged += 1
                continue
            try:
                client.set_acls(path, target)
            except NoNodeError:
                continue
            except NoAuthError:
                refused.append(path)
                continue
            done.changed.append(path)
    finally:
        client.stop()
        client.close()
    if refused:
        shown = ", ".join(sorted(refused)[:5]) + (" ..." if len(refused) > 5 else "")
        raise ZooKeeperNotAuthorized(
            f"ZooKeeper {parsed.display}: the ACL of {len(refused)} node(s) could not be "
            f"read or set with these credentials ({shown}); give the credentials that own "
            f"them as previous ones ({len(done.changed)} node(s) were set)")
    return done
