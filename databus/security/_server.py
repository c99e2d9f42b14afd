"""The aiohttp side of reader authentication, shared by the relay, its worker
processes and the bootstrap server (DESIGN 18).

``install(app, readers=..., metrics_token=..., admin_token=...)`` keeps the
listener's readers on the app. Handlers of read endpoints call ``reader(request)``
(401 ``unauthorized`` without a valid credential) and ``require(reader, names)``
(403 ``forbidden`` for a source the reader is not granted); operational pages
(``/metrics``) call ``check_operational``: open unless a ``metrics_token`` is set,
then it, the admin token or any reader's credential. ``/healthz`` and ``/readyz``
never ask.

A client certificate counts only when the TLS layer verified it against the
listener's client CA; its subject's common name is matched against the readers'
``client_cert_cn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
from collections.abc import AsyncIterator, Iterable

from aiohttp import web

from databus._http import Forbidden, Unauthorized, authorization_values
from databus.config._secrets import Secret
from databus.security._readers import ANYONE, Reader, Readers, bearer_token
from databus.security._tls import CertificateReloader

log = logging.getLogger("databus.security")

# How often a TLS listener looks at its certificate files.
RELOAD_INTERVAL_S = 2.0


@dataclasses.dataclass(frozen=True)
class Guard:
    """One listener's readers and the tokens of its operational and admin pages."""

    readers: Readers = dataclasses.field(default_factory=Readers)
    metrics_token: Secret | None = None
    admin_token: Secret | None = None


GUARD = web.AppKey("security_guard", Guard)
READER = web.RequestKey("reader", Reader)


def install(app: web.Application, guard: Guard) -> None:
    """Keep ``guard`` on ``app`` for ``reader``/``check_operational``."""
    app[GUARD] = guard


def guard_of(app: web.Application) -> Guard:
    got = app.get(GUARD)
    return got if got is not None else _OPEN


_OPEN = Guard()


def peer_cn(request: web.BaseRequest) -> str | None:
    """The common name of the client certificate the TLS layer verified, if any."""
    transport = request.transport
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def reader(request: web.Request) -> Reader:
    """Who ``request`` is (memoised on it); 401 ``unauthorized`` when the listener
    has readers and the request proves none of them."""
    known: Reader | None = request.get(READER)
    if known is not None:
        return known
    readers = guard_of(request.app).readers
    found = ANYONE
    if not readers.open:
        token = bearer_token(authorization_values(request))
        identified = readers.identify(token, peer_cn(request))
        if identified is None:
            if token is None and peer_cn(request) is None:
                raise Unauthorized("this endpoint needs a reader's credential: "
                                   "'Authorization: Bearer <token>' or a client "
                                   "certificate (docs/security.md)")
            raise Unauthorized("the credential given matches no reader of this server "
                               "(a wrong or revoked token, or an unknown certificate)")
        found = identified
    request[READER] = found
    return found


def require(who: Reader, sources: Iterable[str]) -> None:
    """403 ``forbidden`` when ``who`` may not read one of ``sources``."""
    refused = who.grant.refused(sources)
    if refused:
        raise Forbidden(f"reader {who.name!r} is not granted {', '.join(refused)}")


def check_operational(request: web.Request) -> None:
    """``/metrics``: open without a ``metrics_token``; with one, it needs that token,
    the admin token or a reader's credential (401 ``unauthorized``)."""
    guard = guard_of(request.app)
    if guard.metrics_token is None:
        return
    token = bearer_token(authorization_values(request)) or b""
    matched = False
    for secret in (guard.metrics_token, guard.admin_token):
        if secret is not None and hmac.compare_digest(
                token, secret.reveal().encode("utf-8", "surrogateescape")) and token:
            matched = True
    if matched:
        return
    if not guard.readers.open:
        try:
            reader(request)
            return
        except Unauthorized:
            pass
    raise Unauthorized("/metrics needs 'Authorization: Bearer <metrics_token>' "
                       "(or the admin token, or a reader's credential)")


def watch_certificates(app: web.Application, reloader: CertificateReloader,
                       interval: float = RELOAD_INTERVAL_S) -> None:
    """While ``app`` runs, look at its listener's certificate files every ``interval``
    seconds (``CertificateReloader.check``: a renewed certificate is served to new
    connections without a restart). One task per app: the relay's main process, each
    of its workers and the bootstrap server each watch their own context."""

    async def watch() -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(reloader.check)
            except Exception as exc:  # keep serving the certificate loaded before
                log.error("TLS: cannot check the certificate files (%s)",
                          type(exc).__name__)

    async def watching(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(watch(), name="databus-tls-reload")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(watching)
