"""``[relay.cluster]``: a relay as a member of a cluster on ZooKeeper (DESIGN 15,
docs/clusters.md).

```toml
[relay.cluster]
zookeeper = "zk1:2181,zk2:2181,zk3:2181/databus"  # connect string, optional chroot
# or "digest:databus:${ZK_PASSWORD}@zk1:2181,.../databus": nodes get ACLs (DESIGN 18)
name = "shop"                                     # relays of one name form one cluster
mode = "leader-follower"                          # or "independent"
session_timeout_s = 10.0
advertise_url = "http://relay-1.example:11190"    # default: http://host:port
```
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from databus.config._checks import ConfigFieldError, check_name
from databus.config._secrets import Secret
from databus.config._security import check_client_files, client_credentials

if TYPE_CHECKING:
    from databus.security import ClientCredentials

__all__ = ["RelayClusterConfig", "check_zookeeper_hosts"]

def check_zookeeper_hosts(value: str, field: str = "zookeeper") -> None:
    """A ZooKeeper connect string, ``host:port,host:port/chroot`` or
    ``digest:user:password@host:port,.../chroot``, or a clear error (never showing the
    password, which is registered for redaction: ``databus.security.parse_zookeeper``)."""
    from databus.security._zookeeper import parse_zookeeper

    parse_zookeeper(value, field)


@dataclasses.dataclass(frozen=True)
class RelayClusterConfig:
    """``[relay.cluster]``. ``mode``: "independent" (every member reads its source and
    registers itself for discovery) or "leader-follower" (per buffer one member, the
    leader, reads the source; the others chain from it). ``session_timeout_s``: the
    ZooKeeper session; a leader stops appending half of it after it last heard from
    ZooKeeper (the fencing lease, docs/clusters.md). ``advertise_url``: the URL other
    members and clients reach this relay at."""

    zookeeper: str
    name: str
    mode: Literal["independent", "leader-follower"] = "independent"
    session_timeout_s: float = 10.0
    advertise_url: str = ""
    # How members read each other (a follower chains from its leader, members read
    # each other's status) when they have [[relay.readers]] or TLS (docs/security.md):
    # the CA of their certificates, a client certificate and a reader token granted
    # every source of the cluster.
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token: Secret | None = None

    def __post_init__(self) -> None:
        check_zookeeper_hosts(self.zookeeper)
        check_name(self.name, "name")
        if self.mode not in ("independent", "leader-follower"):
            raise ConfigFieldError("mode", 'must be "independent" or "leader-follower"')
        if not 0.4 <= self.session_timeout_s <= 600:
            raise ConfigFieldError("session_timeout_s", "must be between 0.4 and 600")
        if self.advertise_url and not re.fullmatch(r"https?://[^\s/?#]+/?",
                                                   self.advertise_url):
            raise ConfigFieldError("advertise_url", "expected http://host:port")
        check_client_files(self)

    @property
    def credentials(self) -> ClientCredentials:
        """What this member presents to the other members."""
        return client_credentials(self)
