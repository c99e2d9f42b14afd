"""What relay and bootstrap pullers share: failover among replicas, backoff, JSON errors.

Both services are stateless towards the consumer (the checkpoint travels with every
request), so any replica can answer the next request. A puller starts at a random URL
and, on a connection error, a 5xx or a bad answer, moves to the next one round-robin,
sleeping with exponential backoff once every URL has failed in a row. Source ids are per
server: each server's own id -> name map is kept, and dropped when that server fails.

The list may change while the puller runs (relay discovery, ``client/_discovery.py``):
``set_urls`` keeps the current server current while it is in the new list, and one that
left it stays current until it fails (an open stream keeps going); the next server is
then picked from the new list. With an empty list (a cluster with no members yet) the
puller waits for one, as it waits when every server is down.

TLS (DESIGN 18): a server whose certificate does not verify, or whose TLS handshake
fails, is failed over like any other; but when every server of the list refused so
(and an ``http://`` server that closed the connection without ever answering counts
too when a TLS handshake with it succeeds: a TLS port asked in plain HTTP), retrying
cannot help: ``failed`` raises ``TLSVerifyError`` naming each server and why
(databus.security._client_tools).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar, TypeVar

import aiohttp

from databus._limited_log import limited
from databus.checkpoint import Checkpoint
from databus.client._headers import read_json
from databus.errors import (
    ConnectionLostError,
    DatabusError,
    ForbiddenError,
    ScnNotFoundError,
    SourceQuarantinedError,
    TLSVerifyError,
    UnauthorizedError,
    UnknownSchemaError,
    UnknownSourceError,
)
from databus.schemas import Schema
from databus.security._client_tools import connection_problem, speaks_tls

log = logging.getLogger("databus.client")
T = TypeVar("T")


def describe_failure(error: BaseException, request_timeout: float) -> str:
    """What failed, for the log line: an exception's message, or what its type means
    when it has none (aiohttp's timeouts and resets carry no message)."""
    text = str(error).strip()
    if isinstance(error, TimeoutError):
        return text or f"no answer within the request timeout ({request_timeout:g} s)"
    if text:
        return text if isinstance(error, DatabusError) else f"{type(error).__name__}: {text}"
    return f"{type(error).__name__} (no message)"


class FailoverPuller:
    """Round-robin failover with backoff among the URLs of one service."""

    # How messages name the service, and the error for answers the client cannot retry.
    service: ClassVar[str] = "server"
    error_class: ClassVar[type[DatabusError]] = DatabusError
    # Where the service answers GET <schemas_path>/<16 hex digits>.
    schemas_path: ClassVar[str] = "/v1/schemas"

    def __init__(
        self,
        urls: Sequence[str],
        sources: Sequence[str],
        session: aiohttp.ClientSession,
        *,
        filter_json: str | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        request_timeout: float = 30.0,
        rng: random.Random | None = None,
        prefer_first: bool = False,
        allow_empty: bool = False,
    ) -> None:
        if not urls and not allow_empty:
            raise ValueError(f"at least one {self.service} URL is needed")
        self.urls = list(dict.fromkeys(u.rstrip("/") for u in urls))
        self.sources = list(sources)
        self.filter_json = filter_json
        self.session = session
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.request_timeout = request_timeout
        # A random start spreads consumers over replicas; ``prefer_first`` starts at the
        # first URL instead (a list in order of preference: a chained relay's upstreams).
        self._rng = rng or random.Random()
        self._index = 0 if prefer_first or not self.urls else self._rng.randrange(len(self.urls))
        # A server dropped from the list by ``set_urls`` while current: used until it fails.
        self._leaving: str | None = None
        self._urls_changed = asyncio.Event()
        # Why the list may be empty, for the log line while waiting (set by the owner).
        self.empty_reason = f"no {self.service} URL"
        self._failures = 0
        self._catalogs: dict[str, dict[int, str]] = {}
        # Per wanted source: "active", or "pending" while the server is configured for
        # it but its table does not exist yet (the client waits; see note_source_states).
        self.source_states: dict[str, str] = {}
        self._logged_pending: set[str] = set()
        # Per pending source, why the relay waits for it (its X-Databus-Waiting note).
        self.waiting_notes: dict[str, str] = {}
        self.failovers = 0
        self.last_error: BaseException | None = None
        # Servers whose TLS refused the connection since the last answer (why, per
        # URL), and the servers that answered at least once (module docstring, "TLS").
        self._tls_refused: dict[str, str] = {}
        self._answered: set[str] = set()
        # Sent as client_id with every stream request, so that relays can show this
        # consumer's lag (GET /v1/consumers); set by the owner (DatabusClient).
        self.client_id: str | None = None
        # Sent as quarantine=pass when set (a chained relay, the bootstrap producer):
        # every window is served, a quarantined source's marker with them, rather than
        # the source_quarantined error at its SCN (docs/relay.md, "Quarantined sources").
        self.pass_quarantine = False
        # Per wanted source the server says is quarantined (DESIGN 17): its
        # source_quarantined error as JSON (source, scn, reason, fix). The client keeps
        # asking, with backoff, delivering nothing after that SCN; cleared once served.
        self.quarantined: dict[str, dict[str, object]] = {}

    def stream_params(self, position: Checkpoint, max_bytes: int) -> dict[str, str]:
        """The query of a stream request: checkpoint, size, sources, filter, client id."""
        params = {"checkpoint": position.dumps(), "max_bytes": str(max_bytes)}
        if self.sources:
            params["sources"] = ",".join(self.sources)
        if self.filter_json:
            params["filter"] = self.filter_json
        if self.client_id:
            params["client_id"] = self.client_id
        if self.pass_quarantine:
            params["quarantine"] = "pass"
        return params

    async def schema(self, fingerprint: int) -> Schema:
        """A writer schema by fingerprint, from whichever server answers."""

        async def attempt(url: str) -> Schema:
            doc = await self._get_json(f"{url}{self.schemas_path}/{fingerprint:016x}")
            # {"fingerprint", "name", "schema"} as relays and bootstrap services answer.
            if isinstance(doc, dict) and "schema" in doc:
                doc = doc["schema"]
            if not isinstance(doc, dict | str | list):
                raise ValueError(f"schema {fingerprint:016x} from {url} is not a schema")
            try:
                schema = Schema(doc)
            except DatabusError as exc:  # not an Avro schema: a bad answer, try another
                raise ValueError(f"schema {fingerprint:016x} from {url}: {exc}") from None
            if schema.fingerprint != fingerprint:
                # Decoding with it would read the bytes with the wrong schema.
                raise ValueError(f"{url} answered schema {schema.fingerprint:016x} when "
                                 f"asked for {fingerprint:016x}")
            return schema

        return await self._retrying(attempt)

    @property
    def url(self) -> str:
        """The current server (call ``wait_for_urls`` first when the list may be empty)."""
        if self._leaving is not None:
            return self._leaving
        if not self.urls:
            raise LookupError(f"{self.empty_reason}: no {self.service} to ask")
        return self.urls[self._index]

    def set_urls(self, urls: Sequence[str]) -> None:
        """Replace the list (discovery; must run in the puller's event loop): the current
        server stays current while listed; one no longer listed is used until it fails,
        and failover then picks from the new list."""
        new = list(dict.fromkeys(u.rstrip("/") for u in urls))
        if new == self.urls:
            return
        current = self._leaving or (self.urls[self._index] if self.urls else None)
        self.urls = new
        self._leaving = None
        if current is not None and current in new:
            self._index = new.index(current)
        else:
            self._index = self._rng.randrange(len(new)) if new else 0
            self._leaving = current
        self._failures = 0
        log.info("%s list: %s", self.service, ", ".join(new) or "(empty)")
        self._urls_changed.set()

    async def wait_for_urls(self) -> None:
        """Return once there is a server to ask; with an empty list, wait (and say so in
        the log, again every minute) until ``set_urls`` brings one."""
        if self._leaving is not None or self.urls:
            return
        log.warning("%s; waiting for a %s", self.empty_reason, self.service)
        started = time.monotonic()
        next_log = started + 60
        while not self.urls and self._leaving is None:
            self._urls_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):  # not wait_for: it can lose a cancel
                    await self._urls_changed.wait()
            if time.monotonic() >= next_log and not self.urls:
                next_log += 60
                log.warning("%s (for %.0f s); still waiting for a %s", self.empty_reason,
                            time.monotonic() - started, self.service)
        log.info("%s to ask after %.1f s of waiting: %s", self.service,
                 time.monotonic() - started, self.url)

    async def failed(self, error: BaseException) -> None:
        """The current server failed: move on, and back off after a full round."""
        self.last_error = error
        self._failures += 1
        failed_url = self.url
        problem = await self._tls_problem(failed_url, error)
        if problem is not None:
            self._tls_refused[failed_url] = problem
            if self.urls and set(self.urls) <= set(self._tls_refused):
                refused = "; ".join(self._tls_refused[u] for u in self.urls)
                raise TLSVerifyError(f"no {self.service} could be reached over TLS: "
                                     f"{refused}")
        if isinstance(error, SourceQuarantinedError):
            # Not the relay's failure: asked again (maybe of another relay, which may
            # not have it quarantined) with backoff, but not counted as a failover.
            self._note_quarantine(error)
        else:
            limited(log).warning("%s %s failed (%s); trying the next one", self.service,
                                 failed_url, problem or describe_failure(
                                     error, self.request_timeout), kind=failed_url)
            self.failovers += 1
        self._catalogs.pop(failed_url, None)
        if self._leaving is not None:
            # It had left the list already: the next one is the one set_urls picked.
            self._leaving = None
            return
        self._index = (self._index + 1) % len(self.urls)
        rounds = self._failures // len(self.urls)
        if rounds:
            delay = min(self.backoff_max, self.backoff_initial * 2 ** (rounds - 1))
            # A new list (discovery: a relay joined, or came back) cuts it short: the
            # failures counted were the old list's.
            self._urls_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay * random.uniform(0.5, 1.0)):
                    await self._urls_changed.wait()

    def _note_quarantine(self, error: SourceQuarantinedError) -> None:
        """A source of the subscription is quarantined at the relay: one line (rate
        limited per source), its state ``quarantined``; the caller retries with
        backoff (the quarantine ends with ``databus relay heal``)."""
        source = error.source or "?"
        self.quarantined[source] = error.to_json()
        self.source_states[source] = "quarantined"
        limited(log).error(
            "source %s is quarantined at the %s (SCN %s): %s; nothing after that SCN is "
            "delivered until it is healed, and nothing is skipped: retrying with backoff. "
            "Fix: %s", source, self.service, error.scn, error.reason or error.message,
            error.fix or "see the relay's status", kind=f"quarantined {source}")

    async def _tls_problem(self, url: str, error: BaseException) -> str | None:
        """Why ``url`` refused at the TLS level (module docstring), or None."""
        if isinstance(error, aiohttp.ClientSSLError):
            return connection_problem(url, error) or f"{url}: {error}"
        if (isinstance(error, aiohttp.ServerDisconnectedError) and url not in self._answered
                and url.lower().startswith("http://") and await speaks_tls(url)):
            return connection_problem(url, error)
        return None

    def served(self) -> None:
        """An answer without a quarantine error: the quarantine of the wanted sources,
        if any, is over."""
        self._failures = 0
        self._tls_refused.clear()
        if self._leaving is not None or self.urls:
            self._answered.add(self.url)
        if self.quarantined:
            for source in self.quarantined:
                if self.source_states.get(source) == "quarantined":
                    self.source_states[source] = "active"
                log.info("source %s: served again (healed at the relay)", source)
            self.quarantined.clear()

    async def _retrying(self, attempt: Callable[[str], Awaitable[T]]) -> T:
        """Run ``attempt(url)`` until one server answers; retriable failures move on to
        the next server (with backoff after a full round), others are raised."""
        while True:
            await self.wait_for_urls()
            try:
                result = await attempt(self.url)
            except DatabusError as exc:
                if not exc.retriable:
                    raise
                await self.failed(exc)
                continue
            except (aiohttp.ClientError, TimeoutError, OSError, KeyError, ValueError,
                    TypeError, RecursionError) as exc:
                await self.failed(exc)  # connection trouble, or an answer not as expected
                continue
            self.served()
            return result

    async def _get_json(self, url: str) -> object:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with self.session.get(url, timeout=timeout) as resp:
            await self._check(resp)
            return await read_json(resp, url)

    async def _check(self, resp: aiohttp.ClientResponse) -> None:
        """Raise for anything but 200: 5xx is retriable (a server restarting, its
        database down), any other status is the JSON error the server sent."""
        if resp.status >= 500:
            raise ConnectionLostError(f"{self.service} {resp.url.origin()}: HTTP {resp.status}")
        if resp.status != 200:
            text = await resp.text()
            try:
                body: object = json.loads(text)
            except ValueError:
                body = text
            raise self.json_error(resp.status, body)

    def json_error(self, status: int, body: object) -> DatabusError:
        """The error for a non-2xx JSON answer ``{"error": code, "message": ...}``."""
        doc = body if isinstance(body, dict) else {}
        code = str(doc.get("error", "http_error"))
        if "message" in doc:
            message = str(doc["message"])
        else:  # not our JSON error (a proxy's page, say): show its start
            message = (body if isinstance(body, str) else json.dumps(body))[:200]
        if code == "scn_not_found":
            min_scn = doc.get("min_scn")
            return ScnNotFoundError(message, min_scn=int(min_scn) if min_scn is not None
                                    else None)
        if code == "unknown_source":
            return UnknownSourceError(message)
        if code == "unknown_schema":
            return UnknownSchemaError(message)
        if code in ("unauthorized", "forbidden"):
            # The server asked is the current one: named, as one line must say who.
            try:
                where = f"{self.service} {self.url}"
            except LookupError:
                where = self.service
            if code == "unauthorized":
                return UnauthorizedError(f"{where} answered 401 unauthorized: {message}")
            return ForbiddenError(f"{where} answered 403 forbidden: {message}")
        if code == "source_quarantined":
            scn = doc.get("scn")
            return SourceQuarantinedError(
                message, source=str(doc.get("source", "")),
                scn=scn if isinstance(scn, int) and not isinstance(scn, bool) else None,
                reason=str(doc.get("reason", "")), fix=str(doc.get("fix", "")),
                retriable=True)
        return self.error_class(f"{self.service} answered {status} {code}: {message}")

    @property
    def pending_sources(self) -> list[str]:
        """The wanted sources the current server does not have yet but waits for."""
        return sorted(n for n, state in self.source_states.items() if state == "pending")

    def note_source_states(self, url: str, states: dict[str, str]) -> None:
        """Record what ``url`` says of each wanted source: a source configured there but
        not yet existing (a consumer deployed before the schema migration) is waited
        for, logged once; the change to active is logged too. A source the server is
        not configured for at all never gets here: that stays a fatal
        ``UnknownSourceError``."""
        for name, state in states.items():
            before = self.source_states.get(name)
            if state == "pending" and name not in self._logged_pending:
                self._logged_pending.add(name)
                note = self.waiting_notes.get(name)
                if note:
                    log.warning("source %s: %s %s is configured for it (by a pattern) but "
                                "does not have it: %s; waiting for it", name, self.service,
                                url, note)
                else:
                    log.warning("source %s: %s %s is configured for it but its table does "
                                "not exist yet; waiting for it", name, self.service, url)
            elif state == "active" and before == "pending":
                log.info("source %s: its table exists now (%s %s)", name, self.service, url)
            self.source_states[name] = state

    def _check_sources(self, url: str, wanted: Sequence[str], names: dict[int, str],
                       *, retriable: bool = False, hint: str = "") -> None:
        unknown = sorted(set(wanted) - set(names.values()))
        if unknown:
            raise UnknownSourceError(f"{self.service} {url} has no source(s) "
                                     f"{', '.join(unknown)}{hint}", retriable=retriable)
