"""What a client presents to a relay or a bootstrap service (DESIGN 18): the CA
that signs the server's certificate, an optional client certificate and key (mutual
TLS) and an optional reader token. Every client of the project takes these
(``DatabusClient``, ``databus tail``/``status``/``dump``, chained relays, the
bootstrap producer, the replicator, the Spark jobs) and uses them through
``ClientCredentials``: ``ssl_context()``/``ssl_for(url)`` for aiohttp and urllib,
``headers()`` for the token, ``client_session()`` for both at once.
"""

from __future__ import annotations

import dataclasses
import functools
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from databus.config._secrets import Secret
from databus.security._tls import client_context

# Query parameters of a relay+https:// URI (chained relays) that carry credentials.
URI_PARAMS = ("ca_file", "cert_file", "key_file", "token")


@dataclasses.dataclass(frozen=True)
class ClientCredentials:
    """A client's TLS trust, client certificate and reader token; every field is
    optional, and ``ClientCredentials()`` is a plain client (system CAs for
    ``https://``, no token)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token: Secret | None = None

    @classmethod
    def of(cls, *, ca_file: str | Path | None = None, cert_file: str | Path | None = None,
           key_file: str | Path | None = None,
           token: str | Secret | None = None) -> ClientCredentials:
        """From keyword arguments as users give them (paths as text, a plain token)."""
        if isinstance(token, str):
            token = Secret(token) if token else None
        return cls(ca_file=Path(ca_file) if ca_file else None,
                   cert_file=Path(cert_file) if cert_file else None,
                   key_file=Path(key_file) if key_file else None,
                   token=token)

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> ClientCredentials:
        """From a URI's query (``?ca_file=...&token=...``), as chained relays take it."""
        return cls.of(**{k: query[k] for k in URI_PARAMS if query.get(k)})

    def __post_init__(self) -> None:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file is given without cert_file")

    @property
    def empty(self) -> bool:
        return self == ClientCredentials()

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for ``https://`` URLs (built once, then shared)."""
        return _context(self.ca_file, self.cert_file, self.key_file)

    def ssl_for(self, url: str) -> ssl.SSLContext | None:
        """The TLS context for ``url``: None for plain ``http://``."""
        secure = url.lower().startswith(("https://", "relay+https://"))
        return self.ssl_context() if secure else None

    def headers(self) -> dict[str, str]:
        """The request headers that carry the token (none without one)."""
        if self.token is None:
            return {}
        return {"Authorization": f"Bearer {self.token.reveal()}"}

    def __repr__(self) -> str:
        return (f"ClientCredentials(ca_file={self.ca_file!r}, cert_file={self.cert_file!r}, "
                f"key_file={self.key_file!r}, token={'***' if self.token else None})")


@functools.lru_cache(maxsize=32)
def _context(ca_file: Path | None, cert_file: Path | None,
             key_file: Path | None) -> ssl.SSLContext:
    return client_context(ca_file, cert_file, key_file)


NO_CREDENTIALS = ClientCredentials()


def client_session(credentials: ClientCredentials = NO_CREDENTIALS, *, limit: int = 100,
                   **kwargs: Any) -> aiohttp.ClientSession:
    """An aiohttp session that presents ``credentials`` to every server: their TLS
    context for ``https://`` URLs (plain ``http://`` is unaffected) and the token."""
    tls: ssl.SSLContext | bool = True if credentials.empty else credentials.ssl_context()
    connector = aiohttp.TCPConnector(limit=limit, ssl=tls)
    headers = {**credentials.headers(), **kwargs.pop("headers", {})}
    return aiohttp.ClientSession(connector=connector, headers=headers, **kwargs)
