"""HTTP pieces the relay and the bootstrap server share: JSON errors, parameter
parsing, request counters and the admin bearer-token check."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web

from databus.checkpoint import Checkpoint
from databus.config import Secret
from databus.errors import DatabusError

log = logging.getLogger("databus.http")


class BadRequest(DatabusError):
    code = "bad_request"
    http_status = 400


class NotFound(DatabusError):
    code = "not_found"
    http_status = 404


class Unauthorized(DatabusError):
    code = "unauthorized"
    http_status = 401


class Forbidden(DatabusError):
    code = "forbidden"
    http_status = 403


class HttpStats:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.bytes_served = 0
        self.events_served = 0
        self.long_polls = 0


STATS = web.AppKey("stats", HttpStats)


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, got {raw[:40]!r}") from None
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def checkpoint_param(request: web.Request) -> Checkpoint:
    raw = request.query.get("checkpoint")
    if raw is None or raw == "":
        return Checkpoint.flexible()
    return Checkpoint.loads(raw)


def fp_text(fp: int | None) -> str | None:
    return None if fp is None else f"{fp:016x}"


def parse_fingerprint(text: str) -> int:
    """16 hex digits (as /v1/sources gives them), ``0x``-prefixed hex, or decimal."""
    try:
        if text.lower().startswith("0x"):
            value = int(text[2:], 16)
        elif len(text) == 16:
            value = int(text, 16)
        else:
            value = int(text)
    except ValueError:
        raise BadRequest(f"not a schema fingerprint: {text[:40]!r}") from None
    if not 0 <= value < 1 << 64:
        raise BadRequest("a fingerprint is an unsigned 64-bit number")
    return value


class PrometheusText:
    """Builds a /metrics page: ``metric()`` per family, ``response()`` at the end."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str,
               samples: list[tuple[str, float]]) -> None:
        full = f"{self.prefix}_{name}"
        self.lines.append(f"# HELP {full} {help_text}")
        self.lines.append(f"# TYPE {full} {kind}")
        self.lines.extend(f"{full}{labels} {value}" for labels, value in samples)

    def response(self) -> web.Response:
        return web.Response(text="\n".join(self.lines) + "\n", content_type="text/plain")


def check_bearer(request: web.Request, token: Secret | None, setting: str) -> None:
    """Admin endpoints: 403 when no token is configured, 401 without the right one."""
    if token is None:
        raise Forbidden(f"admin endpoints are disabled: set {setting}")
    auth = request.headers.get("Authorization", "")
    scheme, _, given = auth.partition(" ")
    if scheme.lower() != "bearer" or not given or token != Secret(given.strip()):
        raise Unauthorized("admin endpoints need 'Authorization: Bearer <admin_token>'")


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    stats = request.app[STATS]
    route = request.match_info.route.resource
    route_name = route.canonical if route is not None else "unmatched"
    try:
        response = await handler(request)
    except DatabusError as exc:
        response = web.json_response(exc.to_json(), status=exc.http_status)
    except web.HTTPException as exc:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        response = web.json_response(
            {"error": code, "message": exc.reason}, status=exc.status
        )
    except Exception:
        log.exception("unhandled error serving %s", request.path)
        response = web.json_response(
            {"error": "internal_error", "message": "internal error; see the server log"},
            status=500,
        )
    stats.requests[(route_name, response.status)] += 1
    return response
