"""The relay's dump endpoints (DESIGN 6 and 8.1; docs/dumps.md).

- ``POST /v1/admin/dumps`` (bearer token): start a dump. Body, all fields optional::

      {"sources": ["shop.orders"] | "shop.orders,shop.items",  # default: every table
       "buffer": "shop",          # with no sources: which buffer (needed if several)
       "keys": [1, 2, [3, "x"]],  # listed keys of ONE source (composite: arrays)
       "chunk_rows": 10000, "delay_ms": 0,
       "parallelism": 2}          # chunk readers at once; default: the relay's cores,
                                  # giving way to the source's writers

  201 with the dump; 400 ``bad_request``; 404 ``unknown_source``; 409 ``conflict``
  (a dump of one of these tables is already queued or running).
- ``GET /v1/dumps``: every dump with its progress; ``GET /v1/dumps/{id}``: one.
- ``POST /v1/admin/dumps/{id}/pause|resume|cancel`` (bearer token): 200 with the dump,
  404 ``not_found``, 409 ``conflict`` when the dump's state does not allow it.
"""

from __future__ import annotations

import asyncio
import functools
import re
from typing import Any

from aiohttp import web

from databus._http import BadRequest, admin_body, check_bearer, json_response
from databus.errors import ConfigError, UnknownSourceError
from databus.relay._relay import Relay
from databus.relay.dumps import DumpRequest
from databus.relay.dumps._engine import MAX_CHUNK_ROWS, MAX_DELAY_MS, MAX_PARALLELISM
from databus.security import check_operational

__all__ = ["add_dump_routes"]

_FIELDS = frozenset({"sources", "buffer", "keys", "chunk_rows", "delay_ms", "parallelism"})
_ID = re.compile(r"[0-9a-f]{1,32}", re.ASCII)
_SOURCE = re.compile(r"[^\x00-\x20,]{1,200}")


def _int_field(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer")
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must be in {lo}..{hi}")
    return value


def parse_dump_request(body: dict[str, Any]) -> DumpRequest:
    """A ``DumpRequest`` from a request body (``BadRequest`` naming the bad field)."""
    raw = body.get("sources")
    if raw is None:
        sources: list[str] = []
    elif isinstance(raw, str):
        sources = [s.strip() for s in raw.split(",") if s.strip()]
    elif isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        sources = [s.strip() for s in raw]
    else:
        raise BadRequest("sources must be a list of source names or a comma-separated string")
    for source in sources:
        if not _SOURCE.fullmatch(source) or "." not in source:
            raise BadRequest("sources must be database.table names")
    if len(set(sources)) != len(sources):
        raise BadRequest("a source is named twice in sources")
    buffer = body.get("buffer")
    if buffer is not None and (not isinstance(buffer, str) or not buffer):
        raise BadRequest("buffer must be a buffer name")
    keys = body.get("keys")
    if keys is not None:
        if not isinstance(keys, list) or not keys:
            raise BadRequest("keys must be a non-empty array of keys")
        for key in keys:
            parts = key if isinstance(key, list) else [key]
            if not parts or not all(
                    isinstance(p, (str, int)) and not isinstance(p, bool) for p in parts):
                raise BadRequest("each key must be a string, an integer, or an array of "
                                 "them (a composite key, in key column order)")
        if len(sources) != 1:
            raise BadRequest("keys need exactly one source in sources")
    chunk_rows = _int_field(body, "chunk_rows", 10_000, 1, MAX_CHUNK_ROWS)
    delay_ms = _int_field(body, "delay_ms", 0, 0, MAX_DELAY_MS)
    parallelism = (None if body.get("parallelism") is None
                   else _int_field(body, "parallelism", 1, 1, MAX_PARALLELISM))
    return DumpRequest(buffer=buffer, sources=tuple(sources),
                       keys=None if keys is None else tuple(keys),
                       chunk_rows=chunk_rows, delay_ms=delay_ms, parallelism=parallelism)


def buffer_of(relay: Relay, source: str) -> str | None:
    """The buffer that captures ``source``: the catalog's, else the configuration's
    (a name matching several buffers' patterns is a 400, not a server error)."""
    try:
        return relay.catalog.source(source).buffer
    except UnknownSourceError:
        pass
    try:
        return relay.fetchers.configured_buffer(source)
    except ConfigError as exc:
        raise BadRequest(exc.message) from None


def add_dump_routes(app: web.Application, relay_key: web.AppKey[Relay]) -> None:
    """Register the dump endpoints on the relay's app."""

    def relay_of(request: web.Request) -> Relay:
        return request.app[relay_key]

    def dump_id(request: web.Request) -> str:
        value = request.match_info["id"]
        if not _ID.fullmatch(value):
            raise BadRequest("a dump id is up to 32 hexadecimal digits")
        return value

    async def start(request: web.Request) -> web.Response:
        relay = relay_of(request)
        check_bearer(request, relay.config.admin_token, "relay.admin_token")
        body = await admin_body(request, _FIELDS)
        dump_request = parse_dump_request(body)
        dump = await asyncio.to_thread(relay.dumps.start_dump, dump_request,
                                       buffer_of=functools.partial(buffer_of, relay))
        return json_response(relay.dumps.get(dump.id), status=201)

    async def listing(request: web.Request) -> web.Response:
        check_operational(request)  # an operational page, like /metrics (no row data)
        return json_response({"dumps": relay_of(request).dumps.list_dumps()})

    async def one(request: web.Request) -> web.Response:
        check_operational(request)
        return json_response(relay_of(request).dumps.get(dump_id(request)))

    def control(action: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            relay = relay_of(request)
            check_bearer(request, relay.config.admin_token, "relay.admin_token")
            await admin_body(request)
            ident = dump_id(request)
            await asyncio.to_thread(relay.dumps.control, ident, action)
            return json_response(relay.dumps.get(ident))
        return handler

    app.router.add_post("/v1/admin/dumps", start)
    app.router.add_get("/v1/dumps", listing)
    app.router.add_get("/v1/dumps/{id}", one)
    for action in ("pause", "resume", "cancel"):
        app.router.add_post(f"/v1/admin/dumps/{{id}}/{action}", control(action))
