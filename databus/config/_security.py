"""Security settings shared by the daemons (DESIGN 18, docs/security.md).

``[relay.tls]`` / ``[bootstrap.tls]`` / ``[replicate.tls]`` are a ``TLSConfig``;
``[[relay.readers]]`` / ``[[bootstrap.readers]]`` are ``ReaderConfig``s;
``check_readers`` validates them together with the listener they protect. What a
client presents (CA file, client certificate, token) is ``ClientCredentials``
(``databus.security``), built from flat ``ca_file``/``cert_file``/``key_file``/``token``
fields wherever a daemon is itself a client.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from databus.config._checks import ConfigFieldError
from databus.config._secrets import Secret

if TYPE_CHECKING:
    from databus.security import ClientCredentials

# A grant: "db.table", "db.*" (every table of db) or "*" (every source).
_GRANT_RE = re.compile(r"\*|[^\s.*]+\.(\*|[^\s*]+)")
# A reader's name: shown in the consumer registry and as a Prometheus label.
_READER_NAME_RE = re.compile(r"[A-Za-z0-9_.@-]{1,64}")


@dataclasses.dataclass(frozen=True)
class TLSConfig:
    """One listener's TLS: its certificate chain and key (PEM), the CA that signs
    client certificates (mutual TLS; without it no client certificate is asked for),
    whether a client certificate is required (else a client may present one or a
    token), and the lowest protocol version accepted."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    require_client_cert: bool = False
    min_version: Literal["1.2", "1.3"] = "1.2"

    def __post_init__(self) -> None:
        if not str(self.cert_file) or not str(self.key_file):
            raise ConfigFieldError("tls.cert_file", "cert_file and key_file must be paths")
        if self.require_client_cert and self.client_ca_file is None:
            raise ConfigFieldError("tls.require_client_cert",
                                   "needs client_ca_file (the CA client certificates "
                                   "are checked against)")


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    """``[[relay.readers]]``: who may read which sources. A reader proves who it is by
    a bearer token (``token``, or several in ``tokens`` while one is rotated) or, under
    mutual TLS, by its certificate's common name; ``sources`` are names
    (``db.table``), whole databases (``db.*``) or ``*``."""

    name: str
    sources: tuple[str, ...]
    token: Secret | None = None
    tokens: tuple[Secret, ...] = ()
    client_cert_cn: str = ""

    def __post_init__(self) -> None:
        if not _READER_NAME_RE.fullmatch(self.name):
            raise ConfigFieldError("readers.name", "1 to 64 characters of letters, digits "
                                   "and _ . @ -")
        if not self.sources:
            raise ConfigFieldError(f"readers[{self.name}].sources",
                                   "grant at least one source (db.table, db.* or *)")
        for grant in self.sources:
            if not _GRANT_RE.fullmatch(grant):
                raise ConfigFieldError(f"readers[{self.name}].sources",
                                       f"{grant!r} is not db.table, db.* or *")
        if any(not t for t in self.all_tokens):
            raise ConfigFieldError(f"readers[{self.name}].token", "must not be empty")
        if not self.all_tokens and not self.client_cert_cn:
            raise ConfigFieldError(f"readers[{self.name}]", "needs a credential: token, "
                                   "tokens or client_cert_cn")

    @property
    def all_tokens(self) -> tuple[Secret, ...]:
        """Every token that identifies this reader (``token`` and ``tokens``)."""
        return ((self.token,) if self.token is not None else ()) + self.tokens


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listener's configured address) is reachable from this
    machine only: ``localhost`` or a loopback address. Names are not resolved."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_readers(*, host: str, tls: TLSConfig | None, readers: tuple[ReaderConfig, ...],
                  allow_anonymous_readers: bool, metrics_token: Secret | None) -> None:
    """The readers of one listener, checked together: unique names and tokens, a
    certificate CN only where client certificates are verified, and no anonymous
    reading beyond loopback unless ``allow_anonymous_readers`` says so."""
    names: set[str] = set()
    tokens: list[Secret] = []
    cns: set[str] = set()
    for reader in readers:
        if reader.name in names:
            raise ConfigFieldError("readers", f"two readers are called {reader.name!r}")
        names.add(reader.name)
        for token in reader.all_tokens:
            if any(token == seen for seen in tokens):
                raise ConfigFieldError(f"readers[{reader.name}].token",
                                       "the same token is given to two readers (or twice)")
            tokens.append(token)
        if reader.client_cert_cn:
            if tls is None or tls.client_ca_file is None:
                raise ConfigFieldError(f"readers[{reader.name}].client_cert_cn",
                                       "needs tls.client_ca_file (mutual TLS)")
            if reader.client_cert_cn in cns:
                raise ConfigFieldError(f"readers[{reader.name}].client_cert_cn",
                                       "two readers have the same certificate CN")
            cns.add(reader.client_cert_cn)
    if metrics_token is not None and not metrics_token:
        raise ConfigFieldError("metrics_token", "must not be empty (omit it to leave "
                               "/metrics open)")
    if not readers and not allow_anonymous_readers and not is_loopback(host):
        raise ConfigFieldError(
            "readers", f"listening on {host} (beyond this machine) with no [[readers]]: "
            "anyone who reaches the port would read every change. Configure readers "
            "(docs/security.md), or set allow_anonymous_readers = true to serve anyone")


def client_credentials(config: object) -> ClientCredentials:
    """The ``ClientCredentials`` of a config section that is a client of relays or
    bootstrap services (``ca_file``, ``cert_file``, ``key_file``, ``token`` fields)."""
    from databus.security import ClientCredentials

    return ClientCredentials(ca_file=getattr(config, "ca_file", None),
                             cert_file=getattr(config, "cert_file", None),
                             key_file=getattr(config, "key_file", None),
                             token=getattr(config, "token", None))


def check_client_files(config: object) -> None:
    """A client section's ``key_file`` needs its ``cert_file``; tokens not empty."""
    if getattr(config, "key_file", None) is not None and getattr(config, "cert_file",
                                                                  None) is None:
        raise ConfigFieldError("key_file", "given without cert_file")
    token = getattr(config, "token", None)
    if token is not None and not token:
        raise ConfigFieldError("token", "must not be empty (omit it to send none)")
