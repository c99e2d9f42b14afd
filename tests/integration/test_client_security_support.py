"""A TLS gate for the client-side security tests (DESIGN 18): HTTPS with a reader
token in front of a real, plain relay, with revocations and refusals at chosen moments.

``TLSGate(upstream, pki, tokens=...)`` listens on 127.0.0.1 with a certificate of the
test PKI (``pki.server`` by default, or ``pki.wrong_host``), refuses a request whose
``Authorization: Bearer`` token is not one of ``tokens`` with the relay's own JSON 401
(``tokens=None``: every request passes), and forwards the others to ``upstream``,
streaming responses as they come (a relay's streaming subscription goes through).
A token in ``forbidden`` is known but granted nothing: the relay's JSON 403.
``revoke(token)`` drops a token and cuts every open response (as an upstream restarted
without it would); ``grant(token)`` gives it back. ``authorizations`` records the
header of every request, to check what the clients sent.

No test in this module: it is the tests' helper (``test_client_security*``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import aiohttp
from aiohttp import web

from databus.security import TLSConfig, server_context
from tests.fixtures._certs import PKI, CertFiles

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"}


class TLSGate:
    """HTTPS and a token check in front of a plain relay (module docstring)."""

    def __init__(self, upstream: str, pki: PKI, *, tokens: Iterable[str] | None = (),
                 cert: CertFiles | None = None, tls: bool = True,
                 forbidden: Iterable[str] = ()) -> None:
        self.upstream = upstream.rstrip("/")
        self.pki = pki
        self.tokens: set[str] | None = None if tokens is None else set(tokens)
        self.cert = cert or pki.server
        self.tls = tls
        self.forbidden = set(forbidden)
        self.authorizations: list[str | None] = []
        self.refused = 0
        self._open: set[web.StreamResponse] = set()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def __aenter__(self) -> TLSGate:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        context = (server_context(TLSConfig(self.cert.cert, self.cert.key))
                   if self.tls else None)
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.cut()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def revoke(self, token: str) -> None:
        assert self.tokens is not None
        self.tokens.discard(token)
        self.cut()

    def grant(self, token: str) -> None:
        assert self.tokens is not None
        self.tokens.add(token)

    def cut(self) -> None:
        """Close every response being sent (their connections)."""
        for resp in list(self._open):
            task = getattr(resp, "_gate_transport", None)
            if task is not None:
                task.close()
        self._open.clear()

    def _allowed(self, header: str | None) -> bool:
        if self.tokens is None:
            return True
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and token.strip() in self.tokens

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        self.authorizations.append(header)
        if header is not None and header.partition(" ")[2].strip() in self.forbidden:
            self.refused += 1
            return web.Response(status=403, content_type="application/json",
                                text=json.dumps({"error": "forbidden", "message":
                                                 "reader 'chain' is not granted shop.items"}))
        if not self._allowed(header):
            self.refused += 1
            message = ("this endpoint needs a reader's credential" if header is None
                       else "the credential given matches no reader of this server")
            return web.Response(status=401, content_type="application/json",
                                text=json.dumps({"error": "unauthorized",
                                                 "message": message}))
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("accept", "accept-encoding", "content-type")}
        async with self._session.request(
                request.method, self.upstream + request.path, params=request.query,
                data=body or None, headers=headers, allow_redirects=False) as up:
            resp = web.StreamResponse(status=up.status)
            for key, value in up.headers.items():
                if key.lower() not in _HOP:
                    resp.headers[key] = value
            resp._gate_transport = request.transport  # type: ignore[attr-defined]
            self._open.add(resp)
            try:
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass
            finally:
                self._open.discard(resp)
            return resp
