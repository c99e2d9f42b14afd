"""HTTP pieces the relay and the bootstrap server share: JSON errors, parameter
parsing, request counters, the /metrics answer and the admin bearer-token check."""

from __future__ import annotations

import hmac
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from databus._json import dumps, loads_bounded
from databus._limited_log import limited
from databus.checkpoint import Checkpoint
from databus.config import Secret
from databus.errors import DatabusError, ForbiddenError, UnauthorizedError
from databus.filters import FilterSpec

log = logging.getLogger("databus.http")


class BadRequest(DatabusError):
    code = "bad_request"
    http_status = 400


class NotFound(DatabusError):
    code = "not_found"
    http_status = 404


# One class per condition, shared with the clients that rebuild them (databus.errors).
Unauthorized = UnauthorizedError
Forbidden = ForbiddenError


class BodyTooLarge(DatabusError):
    """A request body over ``MAX_BODY_BYTES`` (every body the servers take is a small
    JSON object of an admin endpoint)."""

    code = "body_too_large"
    http_status = 413


class HttpStats:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.bytes_served = 0
        self.events_served = 0
        self.long_polls = 0
        self.streams = 0  # streaming subscriptions open now


STATS = web.AppKey("stats", HttpStats)


# -- request parameters ---------------------------------------------------------------
#
# Every query parameter a handler reads goes through one of these, so the same rules hold
# on every endpoint of relay and bootstrap: a parameter given twice is a 400 (which one
# was meant?), integers are plain ASCII decimal within int64, JSON is parsed with a size,
# nesting and number-length limit (databus._json), and a client can cause a 4xx at worst.
# Parameters a handler does not know are ignored, as HTTP APIs usually do (a newer client
# may send more).

# int() also takes full-width digits, "1_000", " 12 " and 5,000-digit strings.
_INT_RE = re.compile(r"-?[0-9]{1,19}", re.ASCII)
# Logical source names are database.table; identifiers are at most 64 characters.
MAX_SOURCE_NAME = 256
MAX_SOURCES = 1024


def query_param(request: web.Request, name: str) -> str | None:
    """The single value of query parameter ``name``, or None when absent."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise BadRequest(f"query parameter {name!r} is given {len(values)} times; give it once")
    return values[0] if values else None


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = query_param(request, name)
    if raw is None or raw == "":
        return default
    if not _INT_RE.fullmatch(raw):
        raise BadRequest(f"{name} must be a decimal integer, got {_short(raw)}")
    value = int(raw)
    if not lo <= value <= hi:
        raise BadRequest(f"{name} must be between {lo} and {hi}, got {value}")
    return value


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no", ""})


def bool_param(request: web.Request, name: str, default: bool = False) -> bool:
    """``name=true|false`` (also 1/0, yes/no; absent: ``default``)."""
    raw = query_param(request, name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadRequest(f"{name} must be true or false, got {_short(raw)}")


def checkpoint_param(request: web.Request) -> Checkpoint:
    """``checkpoint=JSON`` (absent or empty: from the oldest window held). Malformed,
    too large, too deeply nested, out of the int64 range: ``bad_request``."""
    raw = query_param(request, "checkpoint")
    if raw is None or raw == "":
        return Checkpoint.flexible()
    return Checkpoint.loads(raw)  # bounded JSON; CheckpointError is a 400


def filter_param(request: web.Request) -> FilterSpec:
    """``filter=JSON`` (absent or empty: no filter), with the same JSON limits."""
    raw = query_param(request, "filter")
    return FilterSpec.parse(raw or None)  # bounded JSON; FilterError is a 400


def sources_param(request: web.Request, name: str = "sources") -> list[str]:
    """``sources=a,b``: names in the order given, blanks and repeats dropped."""
    raw = query_param(request, name) or ""
    names = list(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    if len(names) > MAX_SOURCES:
        raise BadRequest(f"{name}: more than {MAX_SOURCES} sources")
    for source in names:
        _check_source_name(name, source)
    return names


# A consumer's self-chosen name (``client_id``): any text, bounded so that what the relay
# keeps per consumer (and exports as a Prometheus label) stays small.
MAX_CLIENT_ID = 256


def client_id_param(request: web.Request) -> str | None:
    """``client_id=ANY TEXT`` of at most 256 characters; None when absent or empty.
    Untrusted: quotes, newlines and the like are kept as given, and escaped wherever
    the id is shown (JSON, Prometheus labels)."""
    raw = query_param(request, "client_id")
    if not raw:
        return None
    if len(raw) > MAX_CLIENT_ID:
        raise BadRequest(f"client_id is over {MAX_CLIENT_ID} characters ({len(raw)})")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate cannot be written out again
        raise BadRequest("client_id is not valid Unicode text") from None
    return raw


def source_param(request: web.Request, name: str = "source") -> str | None:
    """One logical source name (``source=db.table``), or None when absent or empty."""
    raw = (query_param(request, name) or "").strip()
    if not raw:
        return None
    _check_source_name(name, raw)
    return raw


def _check_source_name(param: str, source: str) -> None:
    if len(source) > MAX_SOURCE_NAME or not source.isprintable():
        raise BadRequest(f"{param}: not a source name: {_short(source)}")


def _short(text: str) -> str:
    """``repr`` for a message, cut short: parameters come from anyone."""
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


# Admin bodies are small JSON objects (or nothing); the limit is checked while reading.
MAX_BODY_BYTES = 64 * 1024


async def read_body(request: web.Request) -> bytes:
    """The request's body, at most ``MAX_BODY_BYTES`` (else ``BodyTooLarge``, 413),
    checked on the declared length first and while reading."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise BodyTooLarge(f"request body over {MAX_BODY_BYTES} bytes "
                           f"({request.content_length})")
    data = bytearray()
    async for chunk in request.content.iter_any():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            raise BodyTooLarge(f"request body over {MAX_BODY_BYTES} bytes")
    return bytes(data)


async def admin_body(request: web.Request, fields: frozenset[str] = frozenset()
                     ) -> dict[str, object]:
    """The JSON object body of an admin request: empty means ``{}``; anything else
    must be a JSON object (bounded as above) with only ``fields``; else 400 (413 when
    over ``MAX_BODY_BYTES``)."""
    data = await read_body(request)
    if not data.strip():
        return {}
    try:
        body = loads_bounded(data, max_chars=MAX_BODY_BYTES)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise BadRequest(f"unknown field(s) in request body: {_short(', '.join(unknown))}")
    return body


def json_response(data: object, *, status: int = 200,
                  headers: Mapping[str, str] | None = None) -> web.Response:
    """``web.json_response`` writing valid JSON only (floats that are not finite as
    ``"NaN"``/``"Infinity"``/``"-Infinity"``, databus._json.dumps)."""
    return web.json_response(data, status=status, headers=headers, dumps=dumps)


def fp_text(fp: int | None) -> str | None:
    return None if fp is None else f"{fp:016x}"


_FP_HEX16 = re.compile(r"[0-9a-fA-F]{16}", re.ASCII)
_FP_0X = re.compile(r"0[xX]([0-9a-fA-F]{1,16})", re.ASCII)
_FP_DECIMAL = re.compile(r"[0-9]{1,20}", re.ASCII)


def parse_fingerprint(text: str) -> int:
    """16 hex digits (as /v1/sources gives them), ``0x``-prefixed hex, or decimal."""
    if _FP_HEX16.fullmatch(text):
        value = int(text, 16)
    elif match := _FP_0X.fullmatch(text):
        value = int(match.group(1), 16)
    elif _FP_DECIMAL.fullmatch(text):
        value = int(text)
    else:
        raise BadRequest(f"not a schema fingerprint: {_short(text)}")
    if not 0 <= value < 1 << 64:
        raise BadRequest("a fingerprint is an unsigned 64-bit number")
    return value


def http_requests_family(prefix: str, stats: HttpStats) -> CounterMetricFamily:
    """``<prefix>_http_requests_total{route,status}``, for a /metrics collector."""
    family = CounterMetricFamily(f"{prefix}_http_requests_total",
                                 "HTTP requests by route and status",
                                 labels=["route", "status"])
    # A copy first: the middleware counts requests while a scrape reads.
    for (route, status), count in sorted(dict(stats.requests).items()):
        family.add_metric([route, str(status)], float(count))
    return family


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """A /metrics answer: ``registry`` (the app's own, never prometheus-client's global
    one) in the Prometheus text format 0.0.4, label values escaped by the library."""
    return web.Response(body=generate_latest(registry),
                        headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})


def authorization_values(request: web.BaseRequest) -> list[bytes]:
    """Every ``Authorization`` header of ``request``, as raw bytes: aiohttp decodes
    header values as UTF-8 with surrogate escapes, and such a string cannot be encoded
    again (a 500 before)."""
    return [v for k, v in request.raw_headers if k.lower() == b"authorization"]


def bearer_token(authorization: Sequence[bytes]) -> bytes | None:
    """The token of the ``Authorization`` header values given (raw bytes, as sent):
    None when there is no header; ``b""`` when it is not exactly one ``Bearer``
    header with a token (then it matches nothing)."""
    if not authorization:
        return None
    if len(authorization) != 1:
        return b""
    scheme, _, rest = authorization[0].strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return b""
    return rest.strip()


def check_bearer(request: web.Request, token: Secret | None, setting: str) -> None:
    """Admin endpoints: 403 when no token is configured, 401 without the right one.

    Compared as bytes, from the raw header: aiohttp decodes header values as UTF-8 with
    surrogate escapes, and such a string cannot be encoded again (a 500 before). The
    comparison is constant-time over whatever the client sent, and a missing, repeated
    or non-bearer header is compared too (against nothing), so timing tells nothing.
    """
    if token is None:
        raise Forbidden(f"admin endpoints are disabled: set {setting}")
    given = bearer_token(authorization_values(request)) or b""
    # surrogateescape: a token read from the environment may hold undecodable bytes,
    # which are exactly the bytes a client must send.
    expected = token.reveal().encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(given, expected) or not given:
        raise Unauthorized("admin endpoints need 'Authorization: Bearer <admin_token>'")


_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed",
               413: BodyTooLarge.code}


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
        response = json_response(exc.to_json(), status=exc.http_status)
    except web.HTTPException as exc:
        # aiohttp's own refusals, each under a documented code (docs/relay.md).
        code = _HTTP_CODES.get(exc.status) or (
            "bad_request" if exc.status < 500 else "internal_error")
        response = json_response(
            {"error": code, "message": exc.reason}, status=exc.status
        )
    except Exception as exc:
        # One line with its traceback per route and interval: a bug hit by every
        # request must not flood the log (databus._limited_log).
        limited(log).error("unhandled error serving %s", request.path, exc_info=exc,
                           kind=route_name)
        response = json_response(
            {"error": "internal_error", "message": "internal error; see the server log"},
            status=500,
        )
    stats.requests[(route_name, response.status)] += 1
    return response
