"""ZooKeeper digest credentials, and the ACLs of the nodes the project creates (DESIGN 18,
docs/clusters.md "ZooKeeper credentials and ACLs").

A connect string is plain, ``host:port[,host:port...][/chroot]`` (no credentials, nodes
open to anyone as before), or carries digest credentials::

    digest:user:password@host:port[,host:port...][/chroot]

- the user has no ``:`` or ``@``; the password runs from the second ``:`` to the LAST
  ``@``, so it may hold ``:``, ``@`` and ``/``;
- a password written exactly ``${NAME}`` is read from the environment variable NAME (for
  command lines: ``--zookeeper 'digest:ops:${ZK_PASSWORD}@zk1:2181/databus'`` keeps it
  out of the process list); config files expand ``${NAME}`` themselves;
- the password is registered with ``databus._redact`` as soon as it is parsed: no log
  line, error message, status document or metric shows it; ``display`` is the connect
  string as it may be printed (``digest:user:***@hosts``).

With credentials, the session authenticates with them (kazoo ``auth_data``) and every
node it creates (``create``, ``ensure_path``, ``makepath``, transactions and the Lock
and Election recipes, all through kazoo's ``default_acl``) carries one of two ACLs:

- ``PUBLIC``: the digest identity may do everything, anyone else may only read. Relay
  and bootstrap cluster membership, elections, epochs and locks: member URLs and
  leaders are no secret (relays guard their own reads), and discovery, monitoring and
  ``databus cluster status`` keep working without the password;
- ``SENSITIVE``: the digest identity only, nobody else may even read. Consumer groups
  (members, assignment, owners, leader lock, per-partition checkpoints) and the
  ZooKeeper checkpoint store: a checkpoint holds the position of a consumer and, during
  a bootstrap snapshot, the primary key of the last row it read.

Digest authentication never fails on its own: a wrong password authenticates as another
identity, which the ACLs refuse (kazoo ``NoAuthError``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Literal

from databus._redact import MASK, MIN_SECRET, register_secret, register_uri
from databus.config._checks import ConfigFieldError
from databus.config._secrets import Secret

__all__ = ["PUBLIC", "SENSITIVE", "ZooKeeperConnect", "parse_zookeeper"]

Exposure = Literal["public", "sensitive"]
PUBLIC: Exposure = "public"
SENSITIVE: Exposure = "sensitive"

_SCHEME = "digest:"
# host:port[,host:port...][/chroot]: kazoo would take a bad one and retry forever.
_HOST = r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?"
_CONNECT = re.compile(rf"{_HOST}(?:,{_HOST})*(?:/[^\s/@]+(?:/[^\s/@]+)*)?")
_USER = re.compile(r"[^\s:@/]+")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclasses.dataclass(frozen=True)
class ZooKeeperConnect:
    """A parsed connect string: the kazoo ``hosts`` (without credentials) and, with
    digest credentials, the ``user`` and the ``password`` (a ``Secret``). Prints as
    ``display``."""

    hosts: str
    user: str | None = None
    password: Secret | None = None

    @property
    def secured(self) -> bool:
        return self.user is not None and self.password is not None

    @property
    def display(self) -> str:
        """The connect string as it may be shown: the password is ``***``."""
        return f"{_SCHEME}{self.user}:***@{self.hosts}" if self.secured else self.hosts

    def __repr__(self) -> str:
        return f"ZooKeeperConnect({self.display!r})"

    def __str__(self) -> str:
        return self.display

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """kazoo's ``auth_data``: ``[("digest", "user:password")]``, or ``[]``."""
        if not self.secured:
            return []
        assert self.password is not None
        return [("digest", f"{self.user}:{self.password.reveal()}")]

    def acl(self, exposure: Exposure) -> list[Any] | None:
        """The ACL of the nodes a session creates (module docstring), or None without
        credentials (kazoo's default, open to anyone)."""
        if not self.secured:
            return None
        from kazoo.security import READ_ACL_UNSAFE, make_digest_acl

        assert self.user is not None and self.password is not None
        owner = make_digest_acl(self.user, self.password.reveal(), all=True)
        if exposure == SENSITIVE:
            return [owner]
        if exposure == PUBLIC:
            return [owner, *READ_ACL_UNSAFE]
        raise ValueError(f"exposure must be {PUBLIC!r} or {SENSITIVE!r}, got {exposure!r}")

    def kazoo_kwargs(self, exposure: Exposure) -> dict[str, Any]:
        """``hosts``, ``auth_data`` and ``default_acl`` for ``KazooClient``."""
        kwargs: dict[str, Any] = {"hosts": self.hosts}
        if self.secured:
            kwargs["auth_data"] = self.auth_data
            kwargs["default_acl"] = self.acl(exposure)
        return kwargs


def _check_hosts(hosts: str, field: str) -> None:
    if not _CONNECT.fullmatch(hosts):
        raise ConfigFieldError(field, f"expected host:port[,host:port...][/chroot], got "
                                      f"{hosts!r}")
    for part in hosts.split("/", 1)[0].split(","):
        port = part.rsplit(":", 1)[1] if ":" in part and not part.endswith("]") else "2181"
        if not 0 < int(port) < 65536:
            raise ConfigFieldError(field, f"port {port} out of range in {hosts!r}")


def parse_zookeeper(connect: str | ZooKeeperConnect,
                    field: str = "zookeeper") -> ZooKeeperConnect:
    """``connect`` (module docstring) parsed, its password registered for redaction;
    ``ConfigFieldError`` naming ``field`` for anything else (never showing the
    password). A ``ZooKeeperConnect`` comes back as it is."""
    if isinstance(connect, ZooKeeperConnect):
        return connect
    if not isinstance(connect, str):
        raise ConfigFieldError(field, f"expected a connect string, got "
                                      f"{type(connect).__name__}")
    if "@" not in connect:
        _check_hosts(connect, field)
        return ZooKeeperConnect(connect)
    credentials, hosts = connect.rsplit("@", 1)
    if not credentials.startswith(_SCHEME):
        # user:password@ (or a bare token@): never print what may be a password.
        if ":" in credentials:
            register_uri(f"zookeeper://{connect}")
        else:
            register_secret(credentials, fragments=True)
        raise ConfigFieldError(field, "credentials do not go in the connect string but as "
                                      "digest:user:password@host:port[,...][/chroot] "
                                      "(the value is not shown)")
    user, sep, password = credentials[len(_SCHEME):].partition(":")
    if password:
        register_secret(password, fragments=True)
    if not sep or not _USER.fullmatch(user):
        raise ConfigFieldError(field, "expected digest:user:password@host:port[,...]"
                                      "[/chroot]: the user name is missing or holds "
                                      "':', '@', '/' or spaces")
    env = _ENV.fullmatch(password)
    if env is not None:
        value = os.environ.get(env.group(1))
        if not value:
            raise ConfigFieldError(field, f"the password of ZooKeeper user {user!r} names "
                                          f"the environment variable {env.group(1)}, "
                                          "which is not set")
        password = value
        register_secret(password, fragments=True)
    if password == MASK:
        raise ConfigFieldError(field, f"the password of ZooKeeper user {user!r} is the mask "
                                      f"{MASK} of a connect string as logs and status show "
                                      "it: give the real password")
    if len(password) < MIN_SECRET:
        raise ConfigFieldError(field, f"the password of ZooKeeper user {user!r} must have "
                                      f"at least {MIN_SECRET} characters")
    _check_hosts(hosts, field)
    return ZooKeeperConnect(hosts, user, Secret(password))
