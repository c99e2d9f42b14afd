"""``RelayChainFetcher``: a relay's buffer fed by another relay (DESIGN 15, relay chaining).

The fetcher is a Databus client of its upstream relays: the client library's
``RelayPuller`` does the requests (streaming subscriptions when the upstream offers
them, long polls otherwise; failover among the upstreams with backoff; the upstream's
own source id -> name map with every body), ``WindowAssembler`` cuts the bodies into
whole windows and the windows go into this relay's buffer as the upstream served them:
same SCNs, same event bytes but the source id (remapped by name, header CRC redone),
same dump markers, the EOW written by the buffer with the upstream EOW's timestamp.
Schemas are copied from the upstream (``/v1/schemas?source=NAME``, every version in
order, then the upstream's current one) before the first event that uses them is
stored. docs/relay-chaining.md is the user's page.

Positions. The read starts after the SCN the fetcher host passes (this buffer's max
SCN); an empty buffer starts after the upstream buffer's ``prev_scn`` (``initial_scn``:
the host makes it this buffer's ``prev_scn`` too, so a checkpoint older than that gets
``scn_not_found`` here as it would upstream). The position asked for next is the
checkpoint the upstream returned (it may be inside a window: a body is cut by size),
so an open stream stays open; but when the stream was cut and reopened while a window
was open (a failover, an upstream restart), the window is dropped and read again from
its start, after the last window stored: a window is never stored in pieces from two
connections, and never ended here before the upstream ended it.

Lag in seconds (DESIGN 17). The windows carry the source's commit times, so a busy
chain shows its true lag by itself. Between windows, about once a second, the fetcher
reads the upstream's ``/v1/status``: once this buffer holds the upstream buffer's max
SCN as that status document gives it, it has everything the upstream had read through
(the upstream fetcher's ``read_through``), and reports that
(``FetcherContext.report_read_through``): a chained relay, and a cluster follower, are
as fresh as their upstream, and unknown when it is unknown or cannot be asked.

Credentials (DESIGN 18): ``relay+https://`` reads the upstreams over TLS and every
request presents the URI's credentials (``ChainURI.credentials``: the aiohttp session
of the run and the blocking ``initial_scn`` requests alike). An upstream that refuses
them (401: a wrong or revoked token; 403: a source not granted to this relay's reader;
a certificate that does not verify) is failed over like a dead one; when every
upstream refused, the run ends with ``UpstreamRefusedError``, which says which and how
to fix it. It is a ``SourceMisconfiguredError`` that the host retries: the fetcher is
``failed`` (not ready, the message in ``last_error``), tried again at the backoff's
pace, and ``running`` again once an upstream accepts the credential; it then resumes
after this buffer's newest window, as after any restart, with nothing skipped.

Failures: connection trouble, a 5xx, a bad body go to the next upstream (``RelayPuller``),
with backoff after each full round. ``scn_not_found`` from one upstream tries the
others; when every upstream answered it, ``UpstreamFellOffError`` (not retriable: the
host marks the fetcher ``failed``) names the SCN this buffer needs and the upstream's
oldest. An upstream that does not know the sources (``unknown_source``) or refuses the
filter (400) is a config error, not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any, ClassVar

import aiohttp

from databus._limited_log import limited
from databus.checkpoint import Checkpoint
from databus.client import FellOffRelay, RelayPuller
from databus.client._headers import MAX_JSON_BYTES, read_json
from databus.errors import (
    ConfigError,
    ConnectionLostError,
    DatabusError,
    ForbiddenError,
    SchemaError,
    SourceMisconfiguredError,
    TLSVerifyError,
    UnauthorizedError,
    UnknownSourceError,
)
from databus.event import HEADER
from databus.fetchers._api import ConfiguredSources, Fetcher, FetcherContext, WindowSink
from databus.fetchers.relay._uri import ChainURI
from databus.fetchers.relay._windows import (
    SourceIdMap,
    UpstreamWindow,
    WindowAssembler,
    bad_answer,
    remap_event,
)
from databus.schemas import Schema
from databus.security import NO_CREDENTIALS, ClientCredentials, client_session
from databus.security._client_tools import tls_error

__all__ = ["RelayChainFetcher", "UpstreamFellOffError", "UpstreamRefusedError"]

log = logging.getLogger("databus.fetchers.relay")

# Where a data event's schema fingerprint is (databus.event's header layout).
_FINGERPRINT = HEADER.size - 12
_STATUS_TIMEOUT_S = 5.0
# How often the upstream's status is read for the lag in seconds between windows.
_UPSTREAM_LAG_EVERY_S = 1.0
# What the fetcher remembers across its restarts in one relay process
# (FetcherContext.memory): per source, the fingerprints it registered, in order.
_MEMORY_SCHEMAS = "relay_chain_schemas"


class UpstreamFellOffError(DatabusError):
    """No upstream holds the windows after this buffer's newest one any more."""

    code = "fell_off_upstream"
    retriable = False

    def __init__(self, buffer: str, after_scn: int | None, min_scn: int | None,
                 upstreams: Iterable[str]) -> None:
        needed = "its first window" if after_scn is None else f"the windows after SCN {after_scn}"
        oldest = "unknown" if min_scn is None else f"SCN {min_scn}"
        super().__init__(
            f"buffer {buffer} fell off its upstream relays ({', '.join(upstreams)}): it "
            f"needs {needed}, and every upstream answered scn_not_found (the oldest window "
            f"held upstream is {oldest}). The windows in between are gone upstream; chain "
            "this buffer from a relay that still holds them, or start it anew (its buffer "
            "file removed) and let consumers bootstrap."
        )
        self.after_scn = after_scn
        self.min_scn = min_scn


# What refuses this relay's credential at an upstream (module docstring, "Credentials").
_REFUSALS = (UnauthorizedError, ForbiddenError, TLSVerifyError)


class UpstreamRefusedError(SourceMisconfiguredError):
    """Every upstream relay refused this relay's credential: a wrong or revoked token
    (401), sources not granted to its reader (403), or a certificate that does not
    verify (module docstring, "Credentials"). A misconfiguration the host keeps
    retrying with backoff, the fetcher ``failed`` meanwhile; ``retriable`` only when
    the run that met it had stored windows (a credential revoked while reading): the
    host then tries once more as after any failure, and the next refusal is this
    error's ordinary kind."""

    code = "upstream_refused"

    def __init__(self, buffer: str, refusals: dict[str, DatabusError],
                 credentials: ClientCredentials, sources: Iterable[str], *,
                 retriable: bool = False) -> None:
        parts = [exc.message if url in exc.message else f"{url}: {exc.message}"
                 for url, exc in refusals.items()]
        kinds = {type(exc) for exc in refusals.values()}
        if kinds == {UnauthorizedError} and credentials.token is None:
            fix = ("the upstream relay wants a reader's credential and this relay presents "
                   "none: add token=${TOKEN} to this buffer's source URI (a token granted "
                   "by a [[relay.readers]] entry of the upstream)")
        elif UnauthorizedError in kinds:
            fix = ("the upstream relay refused this relay's token: it is wrong, or it was "
                   "revoked there. Grant it again at the upstream ([[relay.readers]]) or "
                   "put a granted one in this buffer's source URI (token=)")
        elif ForbiddenError in kinds:
            fix = (f"grant this relay's reader the sources {', '.join(sources)} at the "
                   "upstream (its [[relay.readers]] sources)")
        else:
            fix = ("give the CA that signs the upstream's certificate as ca_file= in this "
                   "buffer's source URI, and name the upstream as its certificate does")
        super().__init__(
            f"buffer {buffer}: the upstream relay refused this relay "
            f"({'; '.join(parts)}). Fix: {fix}. Retrying with backoff; once an upstream "
            "accepts, reading resumes after this buffer's newest window",
            retriable=retriable)
        self.refusals = refusals


class RelayChainFetcher(Fetcher):
    """``relay+http(s)://host:port[,host:port...]/?sources=...&filter=...`` (module
    docstring)."""

    scheme: ClassVar[str] = "relay+http"

    def __init__(self, uri: str, context: FetcherContext) -> None:
        super().__init__(uri, context)
        self.chain = ChainURI.parse(uri)
        if self.chain.secure:
            # A missing or wrong ca_file/cert_file: the relay does not start (one line).
            self.chain.credentials.ssl_context()

    def configured_sources(self) -> ConfiguredSources:
        return ConfiguredSources(names=frozenset(self.chain.sources))

    # -- where an empty buffer starts --------------------------------------------------

    def initial_scn(self) -> int | None:
        """The upstream buffer's ``prev_scn`` (None when it never started): an empty
        buffer here starts where the upstream's history starts."""
        errors: list[str] = []
        refusals: dict[str, DatabusError] = {}
        credentials = self.chain.credentials
        for upstream in self.chain.upstreams:
            try:
                sources = _get_json(f"{upstream}/v1/sources", credentials)
                status = _get_json(f"{upstream}/v1/status", credentials)
            except _REFUSALS as exc:
                refusals[upstream] = exc
                errors.append(f"{upstream}: {exc}")
                continue
            except (OSError, ValueError) as exc:
                errors.append(f"{upstream}: {exc}")
                continue
            buffer = self._upstream_buffer(upstream, sources)
            try:
                prev = int(status["buffers"][buffer]["prev_scn"])
            except (KeyError, TypeError, ValueError) as exc:
                errors.append(f"{upstream}: /v1/status has no prev_scn of buffer "
                              f"{buffer!r} ({exc})")
                continue
            return prev if prev >= 0 else None
        if len(refusals) == len(self.chain.upstreams):
            raise UpstreamRefusedError(self.context.buffer_name, refusals, credentials,
                                       self.chain.sources)
        raise ConnectionLostError("no upstream relay answered /v1/sources and /v1/status: "
                                  + "; ".join(errors))

    def _upstream_buffer(self, upstream: str, doc: Any) -> str:
        """The upstream buffer that holds every source of ``sources=``."""
        try:
            listed = {str(e["name"]): str(e["buffer"]) for e in doc["sources"]}
        except (KeyError, TypeError) as exc:
            raise ConnectionLostError(f"{upstream}: /v1/sources is not a source list "
                                      f"({exc})") from None
        missing = [n for n in self.chain.sources if n not in listed]
        if missing:
            raise UnknownSourceError(f"upstream relay {upstream} has no source(s) "
                                     f"{', '.join(missing)}")
        buffers = sorted({listed[n] for n in self.chain.sources})
        if len(buffers) > 1:
            raise ConfigError(f"sources= of a relay+http:// buffer must come from one "
                              f"upstream buffer (one SCN sequence); upstream {upstream} "
                              f"holds them in buffers {', '.join(buffers)}")
        return buffers[0]

    # -- the run ---------------------------------------------------------------------

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        asyncio.run(self._main(sink, start_after_scn, stop))

    async def _main(self, sink: WindowSink, after: int | None, stop: threading.Event) -> None:
        pull = asyncio.create_task(_Chain(self, sink, after).run())
        try:
            while not stop.is_set():
                done, _ = await asyncio.wait({pull}, timeout=0.05)
                if done:
                    break
        finally:
            if not pull.done():
                pull.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pull
        if pull.done() and not pull.cancelled():
            pull.result()  # its error, if any, for the host


class _Chain:
    """One run of the fetcher: the pull loop and what it holds."""

    def __init__(self, fetcher: RelayChainFetcher, sink: WindowSink, after: int | None) -> None:
        self.fetcher = fetcher
        self.chain = fetcher.chain
        self.context = fetcher.context
        self.sink = sink
        self.append_control = getattr(sink, "append_control", None)
        self.committed = after  # the newest window stored (None: none yet, not started)
        self.position = self._committed_position()
        self.assembler = WindowAssembler()
        self.ids = SourceIdMap(self.context.catalog.source_id, frozenset(self.chain.sources))
        self.max_bytes = self.chain.max_bytes
        self.fell_off: set[str] = set()
        self.fell_off_min: int | None = None
        registered: dict[str, list[int]] = self.context.memory.setdefault(_MEMORY_SCHEMAS, {})
        self.registered = registered
        self.known_fps = {fp for fps in registered.values() for fp in fps}
        self.synced: set[str] = set()  # upstreams whose schemas were copied this run
        self.markers_dropped = False
        # Upstreams that refused this relay's credential since the last answer, and
        # whether this run stored a window (UpstreamRefusedError.retriable).
        self.refusals: dict[str, DatabusError] = {}
        self.stored = False

    def _committed_position(self) -> Checkpoint:
        return Checkpoint.flexible() if self.committed is None else Checkpoint.after(self.committed)

    def restart_window(self) -> None:
        """Drop the open window: the next read starts after the last window stored."""
        self.assembler.reset()
        self.position = self._committed_position()

    def refused(self, exc: DatabusError) -> UpstreamRefusedError:
        return UpstreamRefusedError(self.context.buffer_name, {**self.refusals} or
                                    {"upstream": exc}, self.chain.credentials,
                                    self.chain.sources, retriable=self.stored)

    async def run(self) -> None:
        try:
            await self._run()
        except TLSVerifyError as exc:  # the puller: every upstream refused TLS
            raise UpstreamRefusedError(self.context.buffer_name,
                                       {", ".join(self.chain.upstreams): exc},
                                       self.chain.credentials, self.chain.sources,
                                       retriable=self.stored) from None

    async def _run(self) -> None:
        # The URI's credentials: the TLS context for https:// upstreams, the token.
        async with client_session(self.chain.credentials, limit=4) as session:
            puller = RelayPuller(
                list(self.chain.upstreams), list(self.chain.sources), session,
                filter_json=self.chain.filter_json, backoff_initial=0.1,
                backoff_max=self.chain.backoff_max_s, streaming=self.chain.follow,
                heartbeat_ms=self.chain.heartbeat_ms, prefer_first=True,
            )
            puller.client_id = (f"relay-chain:{self.context.buffer_name}@"
                                f"{socket.gethostname()}")
            # Every window, the quarantine markers with them: this relay records an
            # upstream's quarantine itself (relay/quarantine/_sink.py) rather than stop.
            puller.pass_quarantine = True
            watch = asyncio.create_task(self._watch_upstream(puller, session))
            try:
                await self._loop(puller, session)
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
                await puller.close_stream()

    async def _watch_upstream(self, puller: RelayPuller, session: aiohttp.ClientSession
                              ) -> None:
        """Lag in seconds between windows (see the module docstring): never raises."""
        buffers: dict[str, str] = {}  # upstream URL -> the buffer holding our sources
        while True:
            await asyncio.sleep(_UPSTREAM_LAG_EVERY_S)
            upstream = puller.url
            try:
                if upstream not in buffers:
                    buffers[upstream] = self.fetcher._upstream_buffer(
                        upstream, await _get_json_async(session, f"{upstream}/v1/sources"))
                status = await _get_json_async(session, f"{upstream}/v1/status")
                doc = status["buffers"][buffers[upstream]]
                through = upstream_read_through(doc, self.committed)
            except (DatabusError, aiohttp.ClientError, OSError, TimeoutError, ValueError,
                    KeyError, TypeError) as exc:
                log.debug("buffer %s: upstream %s status: %s", self.context.buffer_name,
                          upstream, exc)
                continue
            if through is not None:
                self.context.report_read_through(through, 2 * _UPSTREAM_LAG_EVERY_S + 1.0)

    async def _loop(self, puller: RelayPuller, session: aiohttp.ClientSession) -> None:
        while True:
            before = puller.failovers
            try:
                batch = await puller.next_batch(self.position, max_bytes=self.max_bytes,
                                                wait_ms=self.chain.wait_ms)
            except FellOffRelay as exc:
                await self._fell_off(puller, exc)
                continue
            except _REFUSALS as exc:
                await self._refused(puller, exc)
                continue
            self.refusals.clear()
            if puller.failovers != before and self.assembler.open_scn is not None:
                # Reconnected inside a window: read that window again from its start.
                log.info("buffer %s: upstream connection cut inside window %s; reading it "
                         "again from its start", self.context.buffer_name,
                         self.assembler.open_scn)
                await puller.close_stream()
                self.restart_window()
                continue
            try:
                await self._take(batch, session)
            except _REFUSALS as exc:  # copying the schemas
                await self._refused(puller, exc)
            except (DatabusError, aiohttp.ClientError, OSError, TimeoutError, ValueError,
                    KeyError, TypeError) as exc:
                if isinstance(exc, DatabusError) and not exc.retriable:
                    raise
                await puller.close_stream()
                self.restart_window()
                await puller.failed(exc)

    async def _refused(self, puller: RelayPuller, exc: DatabusError) -> None:
        """``puller.url`` refused this relay's credential: the next upstream is tried
        (with the puller's backoff); when every one refused, the run ends."""
        self.refusals[puller.url] = exc
        if set(self.refusals) >= set(puller.urls):
            raise self.refused(exc)
        limited(log).warning("buffer %s: upstream %s refused this relay (%s); trying "
                             "another upstream", self.context.buffer_name, puller.url, exc)
        await puller.close_stream()
        self.restart_window()
        await puller.failed(exc)

    async def _fell_off(self, puller: RelayPuller, exc: FellOffRelay) -> None:
        self.fell_off.add(puller.url)
        if exc.min_scn is not None:
            self.fell_off_min = exc.min_scn
        if self.fell_off >= set(puller.urls):
            raise UpstreamFellOffError(self.context.buffer_name, self.committed,
                                       self.fell_off_min, puller.urls)
        limited(log).warning("buffer %s: upstream %s no longer holds the windows after SCN %s (its "
                             "oldest is %s); trying another upstream", self.context.buffer_name,
                             puller.url, self.committed, exc.min_scn)
        await puller.close_stream()
        self.restart_window()
        await puller.failed(exc)

    async def _take(self, batch: Any, session: aiohttp.ClientSession) -> None:
        """Store the windows ``batch`` ends; move the position past it."""
        if batch.max_scn is not None:
            self.context.report_source_scn(batch.max_scn)
        checkpoint: Checkpoint = batch.checkpoint
        if batch.pending_event_size is not None and not batch.body:
            # The next event is larger than a response: ask for more next time.
            self.max_bytes = max(self.max_bytes, int(batch.pending_event_size))
        # The puller checked the answer (databus.client._answers): its windows go
        # forward from the position, and its checkpoint stands where its body ends.
        windows = self.assembler.feed(batch.body, batch.scan)
        if windows:
            await self._ensure_schemas(batch.relay, session, windows, batch.source_names)
        for window in windows:
            self._store(window, batch.relay, batch.source_names)
        self.position = checkpoint
        self.fell_off.clear()

    def _store(self, window: UpstreamWindow, upstream: str, names: dict[int, str]) -> None:
        if self.committed is not None and window.scn <= self.committed:
            # Never skipped: storing nothing here and moving on could leave a gap.
            raise bad_answer(f"upstream {upstream} served window {window.scn}, not after "
                             f"the newest window stored ({self.committed}); refused")
        if (self.chain.filter_json is None and window.complete
                and window.checksum != window.eow_checksum):
            raise bad_answer(f"upstream {upstream}: window {window.scn} does not match its "
                             "EOW checksum")
        events: list[tuple[bool, bytes]] = []
        for sid, raw in window.events:
            if sid >= 0:
                events.append((True, remap_event(raw, sid, self.ids.local(upstream, names, sid))))
            else:
                events.append((False, raw))
        sink = self.sink
        sink.start_window(window.scn)
        try:
            for data, raw in events:
                if data:
                    sink.append(raw)
                elif self.append_control is not None:
                    self.append_control(raw)
                elif not self.markers_dropped:
                    self.markers_dropped = True
                    log.warning("buffer %s: this sink cannot store dump markers; the "
                                "upstream's are left out", self.context.buffer_name)
            sink.end_window(window.timestamp_ns)
        except BaseException:
            sink.rollback()
            raise
        self.committed = window.scn
        self.stored = True

    # -- schemas ---------------------------------------------------------------------

    async def _ensure_schemas(self, upstream: str, session: aiohttp.ClientSession,
                              windows: list[UpstreamWindow], names: dict[int, str]) -> None:
        """Every fingerprint the windows' data events carry is registered here."""
        missing: dict[int, str] = {}
        for window in windows:
            for sid, raw in window.events:
                if sid < 0:
                    continue
                fp = int.from_bytes(raw[_FINGERPRINT:_FINGERPRINT + 8], "big")
                if fp and fp not in self.known_fps:
                    missing.setdefault(fp, names.get(sid, f"#{sid}"))
        if not missing and upstream in self.synced:
            return
        # Everything of the upstream's sources, once per upstream and run, and again
        # when an event carries a fingerprint not seen yet (a DDL upstream).
        await self._copy_schemas(upstream, session)
        still = sorted(fp for fp in missing if fp not in self.known_fps)
        if still:
            raise bad_answer(f"upstream {upstream} served events with schema(s) "
                             f"{', '.join(f'{fp:016x}' for fp in still)} that its /v1/schemas "
                             "does not list")

    async def _copy_schemas(self, upstream: str, session: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=30)
        async with session.get(f"{upstream}/v1/sources", timeout=timeout) as resp:
            await _raise_refusal(resp, upstream)
            resp.raise_for_status()
            doc: Any = await read_json(resp, upstream)
        current = {str(e["name"]): e.get("schema_fingerprint") for e in doc["sources"]}
        for name in self.chain.sources:
            async with session.get(f"{upstream}/v1/schemas", params={"source": name},
                                   timeout=timeout) as resp:
                if resp.status == 404:
                    continue  # not there yet (the puller reports unknown sources)
                await _raise_refusal(resp, upstream)
                resp.raise_for_status()
                versions = (await read_json(resp, upstream))["versions"]  # type: ignore[index]
            schemas: list[Schema] = []
            for item in versions:
                schemas.append(_schema(upstream, item))
            latest = current.get(name)
            self._register(name, schemas, None if latest is None else int(str(latest), 16))
        self.synced.add(upstream)

    def _register(self, name: str, versions: list[Schema], latest: int | None) -> None:
        """Register ``versions`` (oldest first) not registered yet, then make ``latest``
        the current one if it is not the last registered."""
        done = self.registered.setdefault(name, [])
        by_fp = {s.fingerprint: s for s in versions}
        catalog = self.context.catalog
        for schema in versions:
            if schema.fingerprint not in done:
                catalog.register_schema(name, schema)
                done.append(schema.fingerprint)
                self.known_fps.add(schema.fingerprint)
        if latest is not None and latest in by_fp and done and done[-1] != latest:
            catalog.register_schema(name, by_fp[latest])
            done.remove(latest)
            done.append(latest)


def _schema(upstream: str, item: Any) -> Schema:
    try:
        schema = Schema(item["schema"])
        fp = int(str(item["fingerprint"]), 16)
    except (KeyError, TypeError, ValueError, SchemaError) as exc:
        raise bad_answer(f"upstream {upstream}: a bad schema in /v1/schemas ({exc})") from None
    if schema.fingerprint != fp:
        raise bad_answer(f"upstream {upstream}: schema {fp:016x} has fingerprint "
                         f"{schema.fingerprint:016x} here")
    return schema


def upstream_read_through(buffer_doc: Any, committed: int | None) -> int | None:
    """What this buffer has read through (ns), from the upstream buffer's ``/v1/status``
    entry (pure): the upstream fetcher's ``read_through`` once ``committed`` (this
    buffer's newest window) is at the upstream's ``max_scn``; None when the upstream
    does not know its own, or this buffer is behind it."""
    fetcher = buffer_doc.get("fetcher") or {}
    through, lag, top = fetcher.get("read_through"), fetcher.get("lag_seconds"), \
        buffer_doc.get("max_scn")
    if not isinstance(through, int | float) or isinstance(through, bool) or lag is None:
        return None
    if top is not None and (committed is None or committed < int(top)):
        return None
    return int(through * 1e9)


def _refusal(status: int, body: bytes, upstream: str) -> DatabusError | None:
    """401 and 403 as the errors the client rebuilds (``databus.errors``)."""
    if status not in (401, 403):
        return None
    try:
        doc = json.loads(body)
        message = str(doc.get("message", "")) if isinstance(doc, dict) else ""
    except ValueError:
        message = ""
    if status == 401:
        return UnauthorizedError(f"{upstream} answered 401 unauthorized: {message}")
    return ForbiddenError(f"{upstream} answered 403 forbidden: {message}")


async def _raise_refusal(resp: aiohttp.ClientResponse, upstream: str) -> None:
    if resp.status in (401, 403):
        refusal = _refusal(resp.status, await resp.content.read(MAX_JSON_BYTES), upstream)
        if refusal is not None:
            raise refusal


async def _get_json_async(session: aiohttp.ClientSession, url: str) -> Any:
    timeout = aiohttp.ClientTimeout(total=_STATUS_TIMEOUT_S)
    async with session.get(url, timeout=timeout,
                           headers={"Accept": "application/json"}) as resp:
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}")
        return await read_json(resp, url)


def _get_json(url: str, credentials: ClientCredentials = NO_CREDENTIALS) -> Any:
    """GET ``url`` as JSON, presenting ``credentials``; 401/403 and TLS refusals as
    their errors, anything else wrong as ``OSError``/``ValueError``."""
    request = urllib.request.Request(url, headers={"Accept": "application/json",
                                                   **credentials.headers()})
    base = url.split("/v1/", 1)[0]
    try:
        with urllib.request.urlopen(request, timeout=_STATUS_TIMEOUT_S,
                                    context=credentials.ssl_for(url)) as resp:
            return json.loads(resp.read(MAX_JSON_BYTES + 1))
    except urllib.error.HTTPError as exc:
        refusal = _refusal(exc.code, exc.read(MAX_JSON_BYTES), base)
        if refusal is not None:
            raise refusal from None
        raise OSError(f"HTTP {exc.code}") from None
    except OSError as exc:
        refused = tls_error(base, exc)
        if refused is not None:
            raise refused from None
        raise
