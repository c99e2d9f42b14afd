"""Telling readers apart: the bearer token or the client certificate of a request,
matched against ``[[readers]]`` (DESIGN 18). Pure: the aiohttp glue
(``databus.security._server``) hands in the raw header and the verified peer CN.

Tokens are compared in constant time with ``hmac.compare_digest``, and every token of
every reader is compared (no early exit), so the time taken says nothing about which
token came close. A request that sends a token is judged by the token alone: a wrong
token is refused even when its certificate names a reader.
"""

from __future__ import annotations

import dataclasses
import hmac
from collections.abc import Sequence

from databus._http import bearer_token
from databus.config._security import ReaderConfig
from databus.security._grants import Grant

__all__ = ["ANONYMOUS", "ANYONE", "Reader", "Readers", "bearer_token"]

ANONYMOUS = "anonymous"


@dataclasses.dataclass(frozen=True)
class Reader:
    """Who a request is: a configured reader's name and grant, or ``anonymous``
    (with every source) when no readers are configured."""

    name: str
    grant: Grant

    @property
    def anonymous(self) -> bool:
        return self.name == ANONYMOUS and self.grant.everything


ANYONE = Reader(ANONYMOUS, Grant.all())


class Readers:
    """The readers of one listener. ``open`` when none are configured: every request
    is ``ANYONE``."""

    def __init__(self, configs: Sequence[ReaderConfig] = ()) -> None:
        self._readers = [Reader(c.name, Grant(tuple(c.sources))) for c in configs]
        # surrogateescape: a token read from the environment may hold undecodable
        # bytes, which are exactly the bytes a client must send.
        self._tokens = [(t.reveal().encode("utf-8", "surrogateescape"), r)
                        for c, r in zip(configs, self._readers, strict=True)
                        for t in c.all_tokens]
        self._cns = {c.client_cert_cn: r for c, r in zip(configs, self._readers, strict=True)
                     if c.client_cert_cn}

    @property
    def open(self) -> bool:
        return not self._readers

    @property
    def names(self) -> list[str]:
        return [r.name for r in self._readers]

    def identify(self, token: bytes | None, peer_cn: str | None) -> Reader | None:
        """The reader a request with bearer ``token`` (None: no Authorization header)
        and verified certificate CN ``peer_cn`` is; None when it is none of them."""
        if self.open:
            return ANYONE
        if token is not None:
            found: Reader | None = None
            for expected, reader in self._tokens:
                if hmac.compare_digest(token, expected) and token:
                    found = reader
            return found
        if peer_cn:
            return self._cns.get(peer_cn)
        return None
