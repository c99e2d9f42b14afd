"""The HTTP side of quarantined sources (DESIGN 17, docs/relay.md "Quarantined
sources"): the stream's ``quarantine`` parameter (``quarantine_stop``) and the heal.

``POST /v1/admin/sources/{name}/heal`` (bearer token): take a quarantined source out
of quarantine and dump it.

200 with ``{"source", "buffer", "quarantined_scn", "healed": true, "fetcher_restarted",
"dump": <the heal's dump, as GET /v1/dumps/{id} shows it>}``; 401/403 without the
admin token; 404 ``unknown_source``; 409 ``not_quarantined`` (nothing to heal),
``dump_unsupported`` (the buffer's source cannot be dumped: heal at the relay that
reads the database), ``not_leader`` (a relay cluster member that does not lead the
buffer: heal at its leader) or ``conflict`` (a dump of the source is already active).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from databus._http import (
    BadRequest,
    admin_body,
    check_bearer,
    json_response,
    query_param,
    sources_param,
)
from databus.errors import ConfigError
from databus.relay._relay import Relay, RelayReader
from databus.relay.quarantine._read import QUARANTINE_MODES, including
from databus.relay.quarantine._record import Quarantine
from databus.security import Grant

__all__ = ["add_quarantine_routes", "quarantine_stop"]

_MAX_NAME = 200


def quarantine_stop(request: web.Request, relay: RelayReader, buffer: str,
                    grant: Grant | None = None) -> Callable[[], Quarantine | None]:
    """What a stream request stops at (relay/quarantine/_read.py): the first quarantine
    among the sources it includes, asked at each read; never with ``quarantine=pass``.
    ``grant``: the reader's (DESIGN 18); a request naming no source includes only the
    sources granted, so a quarantine of another source neither stops it nor is named
    to it."""
    mode = query_param(request, "quarantine") or "error"
    if mode not in QUARANTINE_MODES:
        raise BadRequest(f"quarantine must be one of {', '.join(QUARANTINE_MODES)}")
    if mode == "pass":
        return _no_quarantine
    names = sources_param(request)
    if grant is None or grant.everything:
        return lambda: including(relay.quarantines.active(buffer), names)
    return lambda: including({s: q for s, q in relay.quarantines.active(buffer).items()
                              if grant.allows(s)}, names)


def _no_quarantine() -> Quarantine | None:
    return None


def add_quarantine_routes(app: web.Application, relay_key: web.AppKey[Relay]) -> None:
    async def heal(request: web.Request) -> web.Response:
        relay = request.app[relay_key]
        check_bearer(request, relay.config.admin_token, "relay.admin_token")
        await admin_body(request)  # no fields; a body, if any, must be a JSON object
        name = request.match_info["name"]
        if not name or len(name) > _MAX_NAME or any(ord(c) < 0x20 for c in name):
            raise BadRequest("the source name must be database.table")
        try:
            doc = await asyncio.to_thread(relay.heal, name)
        except ConfigError as exc:  # a name several buffers' patterns match
            raise BadRequest(exc.message) from None
        return json_response(doc)

    app.router.add_post("/v1/admin/sources/{name}/heal", heal)
