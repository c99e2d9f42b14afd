"""Who may read what from this relay (DESIGN 18; the core is ``databus.security``).

- ``guard_for(config)``: the ``Guard`` every app of the relay installs (the main
  process's and each worker's): ``[[relay.readers]]``, ``metrics_token``,
  ``admin_token``.
- ``narrowing``: how a stream request is cut down to its reader's grant (explicit
  names and filters of ungranted sources are 403 ``forbidden``; a request that names no
  source gets the granted sources of the buffer, tables created later included).
- ``strip_markers``: in-band markers (dump start/end, quarantine) of sources the
  reader may not read are taken out of what it is served; EOW events stay.
- Forwarded requests (relay/_worker.py): a worker authenticates the request (it holds
  the TLS connection and so the verified client certificate) and passes the verified
  certificate CN to the main process in ``FORWARDED_CN``; the main process believes that
  header only on its internal unix socket (``trust_forwarded_cn``), and ignores it on
  every TCP listener, so a client cannot claim a certificate it does not hold.
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from databus.batch import scan
from databus.config import RelayConfig
from databus.errors import EventFormatError
from databus.event import (
    DUMP_END_SOURCE_ID,
    DUMP_START_SOURCE_ID,
    HEADER_SIZE,
    QUARANTINE_SOURCE_ID,
    decode_dump_marker,
    decode_header,
)
from databus.fetchers._api import ConfiguredSources
from databus.relay._buffer import ReadResult
from databus.security import (
    CertificateReloader,
    Grant,
    Guard,
    Reader,
    Readers,
    bearer_token,
    check_readers,
    guard_of,
    server_context,
)
from databus.security._server import READER

__all__ = [
    "FORWARDED_CN",
    "check_anonymous",
    "guard_for",
    "may_hold",
    "strip_markers",
    "tls_for",
    "trust_forwarded_cn",
    "unrestricted",
]

# The verified client certificate CN of a request a worker forwards (internal only).
FORWARDED_CN = "X-Databus-Forwarded-Cn"

_MARKERS = (DUMP_START_SOURCE_ID, DUMP_END_SOURCE_ID, QUARANTINE_SOURCE_ID)
_MARKER_ID_MAX = max(_MARKERS)  # every other event's source id is above this


def tls_for(config: RelayConfig) -> tuple[ssl.SSLContext | None, CertificateReloader | None]:
    """``[relay.tls]``: the context every TCP listener of this process serves with, and
    its reloader (``check()`` every few seconds: databus._serving.run_app); (None, None)
    for plain HTTP. ``TLSFileError`` in one line for a missing or wrong file."""
    if config.tls is None:
        return None, None
    context = server_context(config.tls, "relay.tls")
    return context, CertificateReloader(config.tls, context, "relay.tls")


def check_anonymous(config: RelayConfig, host: str) -> None:
    """The configuration checks that no readers means loopback only (or
    ``allow_anonymous_readers``) for ``relay.host``; this checks a ``--host`` given on
    the command line the same way."""
    check_readers(host=host, tls=config.tls, readers=config.readers,
                  allow_anonymous_readers=config.allow_anonymous_readers,
                  metrics_token=config.metrics_token)


def guard_for(config: RelayConfig) -> Guard:
    """The relay's readers and the tokens of its operational and admin pages."""
    return Guard(readers=Readers(config.readers), metrics_token=config.metrics_token,
                 admin_token=config.admin_token)


def unrestricted(grant: Grant) -> bool:
    """Whether ``grant`` allows every source (anonymous on an open relay, or ``*``)."""
    return grant.everything or "*" in grant.patterns


def may_hold(grant: Grant, catalog_names: Iterable[str],
             configured: ConfiguredSources | None) -> bool:
    """Whether a buffer whose catalog holds ``catalog_names`` and whose fetcher's
    configuration is ``configured`` (None: unknown) holds, or may hold later, a source
    ``grant`` allows."""
    if unrestricted(grant) or any(grant.allows(n) for n in catalog_names):
        return True
    if configured is None:
        return False
    if any(grant.allows(n) for n in configured.names):
        return True
    for pattern in grant.patterns:
        if pattern == "*":
            if configured.names or configured.databases or configured.everything:
                return True
        elif pattern.endswith(".*"):
            database = pattern[:-2]
            if database in configured.databases or (
                    configured.everything and database not in configured.excluded_databases):
                return True
        elif configured.matches(pattern):
            return True
    return False


def _marker_source(data: bytes | memoryview, pos: int, source_id: int, total: int
                   ) -> str | None:
    header = decode_header(data, pos)
    payload = bytes(data[pos + HEADER_SIZE + header.key_length:pos + total])
    try:
        if source_id == QUARANTINE_SOURCE_ID:
            from databus.relay.quarantine._record import decode_quarantine_marker

            return decode_quarantine_marker(header, payload).source
        return decode_dump_marker(header, payload).source
    except EventFormatError:
        return None


def strip_markers(result: ReadResult, grant: Grant) -> ReadResult:
    """``result`` without the dump and quarantine markers of sources ``grant`` does not
    allow (a marker that does not decode is taken out too). Markers are control events
    counted by no EOW and no checkpoint, so what remains is served unchanged.

    The event core's ``scan`` finds the events' source ids in one compiled pass (the
    read that made ``result`` checked the events; bodies are not checked again); a
    body without markers (their ids are the lowest of all, -6 to -8) is served as it
    is, and only markers are decoded. A Python walk of every header cost a restricted
    reader half of the relay's time (benchmarks/relay_tls.py)."""
    data = result.data
    if unrestricted(grant) or not data:
        return result
    found = scan(data, verify_body=False)
    ids = found.source_id
    if not ids or min(ids) > _MARKER_ID_MAX:
        return result
    view = memoryview(data)
    offsets, lengths = found.offset, found.length
    keep: list[tuple[int, int]] = []
    start = 0
    for k, source_id in enumerate(ids):
        if source_id in _MARKERS:
            pos, total = offsets[k], lengths[k]
            source = _marker_source(view, pos, source_id, total)
            if source is None or not grant.allows(source):
                keep.append((start, pos))
                start = pos + total
    if not keep:
        return result
    keep.append((start, len(data)))
    return dataclasses.replace(result, data=b"".join(view[a:b] for a, b in keep if b > a))


def _on_unix_socket(request: web.BaseRequest) -> bool:
    transport = request.transport
    if transport is None:
        return False
    sock = transport.get_extra_info("socket")
    return sock is not None and getattr(sock, "family", None) == socket.AF_UNIX


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def trust_forwarded_cn(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The main process's side of a forwarded request: on the internal unix socket (a
    worker, or this user), the worker's verified certificate CN counts as the peer's;
    on any other listener the header is ignored."""
    cn = request.headers.get(FORWARDED_CN)
    if cn and _on_unix_socket(request):
        guard = guard_of(request.app)
        if not guard.readers.open:
            raw = [v for k, v in request.raw_headers if k.lower() == b"authorization"]
            found: Reader | None = guard.readers.identify(bearer_token(raw), cn)
            if found is not None:
                request[READER] = found
    return await handler(request)

