"""The dashboard's web server: one page, its static assets, and the JSON it polls.

Routes (all GET)::

    /                       static/index.html
    /static/<name>          the page's assets (databus/dashboard/static/, nothing else)
    /v1/status              the newest status document: exactly what
                            ``databus status --json`` prints for the same flags
    /v1/dashboard?after=T&since=S
                            {"status": <the newest document>, "history": <points after
                            S: _history.History.since>, "interval_s": ...}; with
                            ``after``, the answer waits (up to 2 intervals) for a
                            document newer than ``generated_at`` T, so a page that asks
                            again at once gets each sample as soon as it is taken
    /healthz                200 {"ok": true, "sample_age_s"} while samples keep coming,
                            503 when the newest is older than 3 intervals + the timeout

``Sampler`` takes a document every ``interval_s`` with ``databus._status_view.collect``
(the very function ``databus status`` uses, so the page and the command never disagree)
and adds it to the ``History``. One sampler serves every browser: opening more pages
asks the services nothing more. The page gets no secret: the documents show URLs with
their password masked and errors through ``databus._redact``; the credentials the
sampler presents (TLS files, the reader token) stay in this process.

Every answer carries a strict Content-Security-Policy (scripts, styles and images from
this server only, no inline script), ``X-Content-Type-Options: nosniff``,
``X-Frame-Options: DENY`` and ``Referrer-Policy: no-referrer``; the JSON answers are
``Cache-Control: no-store``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web

from databus._json import dumps as dumps_json
from databus.dashboard._history import History

__all__ = ["SAMPLER", "Sampler", "make_app"]

log = logging.getLogger("databus.dashboard")

Collect = Callable[[], Awaitable[dict[str, Any]]]
SAMPLER: web.AppKey[Sampler] = web.AppKey("sampler")

_TYPES = {".html": "text/html", ".css": "text/css", ".js": "text/javascript",
          ".svg": "image/svg+xml", ".png": "image/png", ".ico": "image/x-icon"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


class Sampler:
    """The newest status document and the history, refreshed every ``interval_s``."""

    def __init__(self, collect: Collect, *, interval_s: float = 1.0, timeout_s: float = 2.0,
                 history: History | None = None) -> None:
        self.collect = collect
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.history = history or History()
        self.latest: dict[str, Any] | None = None
        self.latest_at: float | None = None  # time.monotonic() of the newest sample
        self._changed = asyncio.Condition()

    async def sample(self) -> dict[str, Any]:
        """Take one document now, keep it, add it to the history, wake the waiters."""
        document = await self.collect()
        self.history.add(document)
        async with self._changed:
            self.latest, self.latest_at = document, time.monotonic()
            self._changed.notify_all()
        return document

    async def run(self) -> None:
        """Sample every ``interval_s`` until cancelled; a failure is logged, never the
        end (the next sample tries again)."""
        while True:
            started = time.monotonic()
            try:
                await self.sample()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                from databus._redact import redact

                log.warning("dashboard: sampling failed: %s", redact(f"{type(exc).__name__}: "
                                                                     f"{exc}"))
            await asyncio.sleep(max(0.05, self.interval_s - (time.monotonic() - started)))

    async def newer_than(self, after: float, wait_s: float) -> dict[str, Any] | None:
        """The newest document once it is newer than ``after`` (``generated_at``), or
        the newest there is after ``wait_s``."""
        def newer() -> bool:
            return self.latest is not None and self.latest["generated_at"] > after

        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._changed.wait_for(newer)
            return self.latest

    def healthy(self) -> tuple[bool, float | None]:
        """(samples keep coming, the newest one's age in seconds)."""
        if self.latest_at is None:
            return False, None
        age = time.monotonic() - self.latest_at
        return age <= 3 * self.interval_s + self.timeout_s, round(age, 3)


def _number(request: web.Request, name: str) -> float | None:
    text = request.query.get(name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be a number",
                                 headers=_HEADERS) from None
    if not math.isfinite(value):
        raise web.HTTPBadRequest(text=f"{name} must be a number", headers=_HEADERS)
    return value


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(text=dumps_json(doc), status=status, content_type="application/json",
                        headers={**_HEADERS, "Cache-Control": "no-store"})


def _starting() -> web.Response:
    response = _json({"error": "starting", "message": "no status sample taken yet"}, 503)
    response.headers["Retry-After"] = "1"
    return response


async def _status(request: web.Request) -> web.Response:
    sampler = request.app[SAMPLER]
    if sampler.latest is None:
        return _starting()
    return _json(sampler.latest)


async def _dashboard(request: web.Request) -> web.Response:
    sampler = request.app[SAMPLER]
    after = _number(request, "after")
    since = _number(request, "since") or 0.0
    document = sampler.latest
    if after is not None:
        document = await sampler.newer_than(after, 2 * sampler.interval_s)
    if document is None:
        return _starting()
    return _json({"status": document, "history": sampler.history.since(since),
                  "interval_s": sampler.interval_s})


async def _healthz(request: web.Request) -> web.Response:
    ok, age = request.app[SAMPLER].healthy()
    return _json({"ok": ok, "sample_age_s": age}, 200 if ok else 503)


def _asset(name: str) -> tuple[bytes, str] | None:
    """A file of static/ by its plain name (no path), with its content type."""
    suffix = "." + name.rsplit(".", 1)[-1] if "." in name else ""
    if "/" in name or "\\" in name or name.startswith(".") or suffix not in _TYPES:
        return None
    node = resources.files("databus.dashboard").joinpath("static", name)
    if not node.is_file():
        return None
    return node.read_bytes(), _TYPES[suffix]


async def _static(request: web.Request) -> web.Response:
    found = _asset(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound(headers=_HEADERS)
    body, content_type = found
    return web.Response(body=body, content_type=content_type,
                        headers={**_HEADERS, "Cache-Control": "no-cache"})


async def _index(request: web.Request) -> web.Response:
    found = _asset("index.html")
    if found is None:  # a package built without its data files
        log.error("dashboard: databus/dashboard/static/index.html is not installed")
        return web.Response(status=500, text="the dashboard's page is not installed "
                            "(databus/dashboard/static/ is missing from the package)",
                            headers=_HEADERS)
    return web.Response(body=found[0], content_type="text/html", charset="utf-8",
                        headers={**_HEADERS, "Cache-Control": "no-cache"})


def make_app(sampler: Sampler, *, run_sampler: bool = True) -> web.Application:
    """The app; with ``run_sampler`` it runs ``sampler.run`` while it serves."""
    app = web.Application()
    app[SAMPLER] = sampler
    app.router.add_get("/", _index)
    app.router.add_get("/static/{name}", _static)
    app.router.add_get("/v1/status", _status)
    app.router.add_get("/v1/dashboard", _dashboard)
    app.router.add_get("/healthz", _healthz)
    if run_sampler:
        async def sampling(app: web.Application) -> Any:
            task = asyncio.create_task(sampler.run(), name="dashboard-sampler")
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app.cleanup_ctx.append(sampling)
    return app
