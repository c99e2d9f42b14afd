"""Who may read what (docs/security.md): TLS contexts for listeners and
clients, readers with per-source grants, and what clients present.

- ``_tls``: ``server_context``/``CertificateReloader`` (listeners), ``client_context``.
- ``_grants``: ``Grant``, pure matching of source names against ``db.table``,
  ``db.*`` and ``*``.
- ``_readers``: ``Readers.identify`` (token or certificate CN to a ``Reader``),
  constant-time.
- ``_server``: the aiohttp glue (``reader``, ``require``, ``check_operational``).
- ``_credentials``: ``ClientCredentials`` (CA file, client certificate, token).
- ``_zookeeper``: digest credentials and ACLs for ZooKeeper connect strings.
"""

from __future__ import annotations

from databus.config._security import ReaderConfig, TLSConfig, check_readers, is_loopback
from databus.security._credentials import (
    NO_CREDENTIALS,
    URI_PARAMS,
    ClientCredentials,
    client_session,
)
from databus.security._grants import Grant, is_pattern, overlaps, pattern_matches
from databus.security._readers import ANONYMOUS, ANYONE, Reader, Readers, bearer_token
from databus.security._server import (
    GUARD,
    Guard,
    check_operational,
    guard_of,
    install,
    peer_cn,
    reader,
    require,
    watch_certificates,
)
from databus.security._tls import (
    CertificateReloader,
    TLSFileError,
    client_context,
    server_context,
)
from databus.security._zookeeper import (
    PUBLIC,
    SENSITIVE,
    ZooKeeperConnect,
    parse_zookeeper,
)

__all__ = [
    "ANONYMOUS",
    "ANYONE",
    "GUARD",
    "NO_CREDENTIALS",
    "PUBLIC",
    "SENSITIVE",
    "URI_PARAMS",
    "CertificateReloader",
    "ClientCredentials",
    "Grant",
    "Guard",
    "Reader",
    "ReaderConfig",
    "Readers",
    "TLSConfig",
    "TLSFileError",
    "ZooKeeperConnect",
    "bearer_token",
    "check_operational",
    "check_readers",
    "client_context",
    "client_session",
    "guard_of",
    "install",
    "is_loopback",
    "is_pattern",
    "overlaps",
    "parse_zookeeper",
    "pattern_matches",
    "peer_cn",
    "reader",
    "require",
    "server_context",
    "watch_certificates",
]
