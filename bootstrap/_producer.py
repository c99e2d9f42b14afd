"""The log writer: a Databus client of the relays that appends every window to the log.

It uses the client's ``RelayPuller`` (failover, backoff, schemas) but not its decoding:
the log keeps events as bytes, so values are never decoded. Each relay response becomes
one store transaction holding its whole windows and the producer's checkpoint, so a
response that carries many windows (a producer that is behind) is one batch. A window
cut by the response size is held back until its EOW arrives; the stored checkpoint is
always the last whole window, so a crash re-pulls exactly what was not committed.

The first start on an empty store begins right after the relay's ``prev_scn`` (read
from ``/v1/status``), which becomes the log floor: everything after it is in the log.

It presents ``[bootstrap.producer]``'s credentials to the relays (DESIGN 18): their CA
for ``https://``, a client certificate, a reader token. A relay that refuses them (401:
no or a wrong or revoked credential; 403: a source the reader is not granted) puts the
producer in state ``unauthorized`` or ``forbidden``, with the relay's answer and the fix
in its status, ``/readyz`` and one log line; it asks again every ``auth_retry_s``
seconds (30), not in a loop, so a fix on the relay's side is picked up without a
restart.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from databus._limited_log import limited
from databus._redact import redact
from databus.batch import WindowFrames, check_windows, frame_windows, restamp, scan
from databus.bootstrap._component import BackgroundComponent, ComponentStatus
from databus.bootstrap._storage import BootstrapStorage, FencedError, LogBatch
from databus.checkpoint import Checkpoint
from databus.client import FellOffRelay, RelayPuller
from databus.client._headers import read_json
from databus.config import redact_uri
from databus.errors import (
    DatabusError,
    EventFormatError,
    ForbiddenError,
    SourceError,
    UnauthorizedError,
)
from databus.event import EOW_SOURCE_ID
from databus.security import NO_CREDENTIALS, ClientCredentials, client_session

log = logging.getLogger("databus.bootstrap.producer")

# Seconds between two attempts while the relays refuse the producer's credential.
AUTH_RETRY_S = 30.0

_AUTH_FIX = {
    "unauthorized": "give [bootstrap.producer] the credential of a reader the relay knows "
                    "(token = \"${ENV}\", or cert_file/key_file under mutual TLS; see "
                    "[[relay.readers]] and docs/security.md)",
    "forbidden": "grant that reader the producer's sources in the relay's [[relay.readers]] "
                 "sources (every source of the buffer when bootstrap.producer.sources is "
                 "empty), or narrow bootstrap.producer.sources",
}


@dataclass
class ProducerStatus(ComponentStatus):
    scn: int | None = None
    windows: int = 0
    events: int = 0
    batches: int = 0
    # Lag in seconds (DESIGN 17): the commit time of the last window logged, and whether
    # the relay had nothing newer at the last fetch (everything fetched logged).
    last_timestamp_ns: int | None = None
    caught_up: bool = False

    @property
    def lag_seconds(self) -> float | None:
        """0 when the producer has logged the relay's newest window; else now minus the
        commit time of the last window it logged; None when unknown (not running, or
        nothing logged yet while behind)."""
        if self.state != "running":
            return None
        if self.caught_up:
            return 0.0
        if self.last_timestamp_ns is None:
            return None
        return round(max(0.0, time.time() - self.last_timestamp_ns / 1e9), 3)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "scn": self.scn, "windows": self.windows,
                "events": self.events, "batches": self.batches,
                "events_per_second": round(self.events / self.elapsed, 1),
                "lag_seconds": self.lag_seconds}


class _Assembler:
    """Splits response bodies into whole windows (``LogBatch``: no object per event),
    keeping the bytes of a window cut by the response size for the next body.

    Every event's CRCs are checked (``scan``), every window must end with its EOW, and
    with ``verify_windows`` (every source of the buffer pulled, unfiltered) each EOW's
    count and checksum must be those of its window's events (``check_windows``): a
    body failing any check raises ``EventFormatError`` and nothing of it is kept."""

    def __init__(self, key_hash: bool, verify_windows: bool = False) -> None:
        self.key_hash = key_hash
        self.verify_windows = verify_windows
        self._held = b""  # the events of a window whose EOW has not arrived yet
        self._held_names: dict[int, str] = {}  # the source ids they were sent with
        # Schema fingerprint -> source name of the data events of the last ``feed``.
        self.fingerprints: dict[int, str] = {}

    def feed(self, body: bytes, names: dict[int, str]) -> LogBatch:
        """The whole windows of ``body`` (after the held part of a cut window)."""
        renumbered = False
        if self._held:
            if self._held_names != names:
                self._held = _renumbered(self._held, self._held_names, names)
                renumbered = True
            body = self._held + body
        s = scan(body).check()  # header and body CRCs of every event
        frames = frame_windows(s)
        sids, scns = s.source_id, s.scn
        if frames.broken >= 0:
            b = frames.broken
            open_scn = scns[b - 1]
            if sids[b] == EOW_SOURCE_ID:
                raise EventFormatError(f"EOW of {scns[b]} inside window {open_scn}",
                                       offset=s.offset[b], reason="torn window")
            raise EventFormatError(f"window {open_scn} ended without its EOW",
                                   offset=s.offset[b], reason="missing eow")
        eows = frames.eows
        if self.verify_windows and len(eows):
            # Held events renumbered for another relay's source ids have new header
            # CRCs, which their window's EOW checksum does not cover: that one window
            # is taken on its events' own CRCs.
            checked = frames if not renumbered else WindowFrames(
                frames.controls, eows[1:], frames.counts[1:], frames.crcs[1:], -1, None,
                0, 0)
            check_windows(body, s, checked)
        first = eows[-1] + 1 if len(eows) else 0
        out = LogBatch(body, s, frames, names, self.key_hash,
                       first - bisect.bisect_left(frames.controls, first))
        self._held = body[s.offset[first]:] if first < s.count else b""
        self._held_names = names
        self.fingerprints = fingerprints = {}
        for sid, fp in set(zip(sids, s.fingerprint, strict=True)):
            if sid < 0:
                continue
            name = names.get(sid)
            if name is None:
                i = list(sids).index(sid)
                raise EventFormatError(f"unknown source id {sid}", offset=s.offset[i],
                                       reason="unknown source")
            if fp:
                fingerprints[fp] = name
        return out


def _renumbered(events: bytes, old: dict[int, str], new: dict[int, str]) -> bytes:
    """Held events sent with ``old``'s source ids, given ``new``'s ids for the same
    names (source ids are per relay: the rest of a window may come from another one
    after a failover)."""
    ids = {name: source_id for source_id, name in new.items()}
    s = scan(events).check()
    out = []
    for i in range(s.count):
        offset, total, sid = s.offset[i], s.length[i], s.source_id[i]
        if sid < 0:
            out.append(events[offset:offset + total])
            continue
        name = old.get(sid)
        if name is None or name not in ids:
            raise EventFormatError(f"source id {sid} of a held window has no name now",
                                   offset=offset, reason="unknown source")
        out.append(restamp(events, offset, total, ids[name]))
    return b"".join(out)


class LogProducer(BackgroundComponent):
    """Owns one background task (``start``/``close``) that pulls and appends."""

    task_name = "databus-bootstrap-producer"
    component = "producer"
    log = log
    status: ProducerStatus

    def __init__(
        self,
        storage: BootstrapStorage,
        relays: Sequence[str],
        *,
        sources: Sequence[str] = (),
        start_scn: int | None = None,
        max_bytes: int = 4 << 20,
        poll_wait_ms: int = 1000,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        credentials: ClientCredentials = NO_CREDENTIALS,
        auth_retry_s: float = AUTH_RETRY_S,
    ) -> None:
        self.storage = storage
        self.credentials = credentials
        self.auth_retry_s = auth_retry_s
        self.relays = list(relays)
        self.sources = list(sources)
        self.start_scn = start_scn
        self.max_bytes = max_bytes
        self.poll_wait_ms = poll_wait_ms
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        super().__init__()
        self.status = ProducerStatus()
        self._known_fingerprints: set[int] = set()

    async def _run(self) -> None:
        delay = self.backoff_initial
        while True:
            try:
                await self.take_fence()  # before the checkpoint is read
                # The credentials on every request: TLS context and reader token.
                async with client_session(self.credentials) as session:
                    await self._pull(session)
            except asyncio.CancelledError:
                raise
            except (UnauthorizedError, ForbiddenError) as exc:
                self._refused(exc)
                await asyncio.sleep(self.auth_retry_s)
                delay = self.backoff_initial
                continue
            except DatabusError as exc:
                if not exc.retriable:
                    self._gave_up(exc)
                    raise
                self._retrying(exc)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self._retrying(exc)
            else:
                return
            await asyncio.sleep(delay)
            delay = min(self.backoff_max, delay * 2)

    def _refused(self, exc: UnauthorizedError | ForbiddenError) -> None:
        """A relay refused the credential: the state says which refusal, the message
        the relay's answer and the fix; one log line (rate-limited)."""
        state = "unauthorized" if isinstance(exc, UnauthorizedError) else "forbidden"
        self.status.errors += 1
        self.status.state = state
        relays = ", ".join(redact_uri(r) for r in self.relays)
        self.status.last_error = redact(f"{relays}: {exc.message}. Fix: {_AUTH_FIX[state]}")
        limited(self.log).error("%s: the relay refused the producer's credential (%s); "
                                "asking again in %g s", self.task_name,
                                self.status.last_error, self.auth_retry_s,
                                kind=f"{self.task_name} {state}")

    async def _pull(self, session: aiohttp.ClientSession) -> None:
        storage = self.storage
        puller = RelayPuller(self.relays, self.sources, session,
                             backoff_initial=self.backoff_initial,
                             backoff_max=self.backoff_max)
        # Relays list the producer among their consumers under this id (with its lag).
        puller.client_id = f"databus-bootstrap-producer@{socket.gethostname()}:{os.getpid()}"
        # Every window: a quarantined source stops no one here (its events after the
        # quarantine SCN are not in the relay; the heal's dump brings its state back).
        puller.pass_quarantine = True
        self._known_fingerprints = {fp for fp, _, _ in
                                    await asyncio.to_thread(storage.schemas)}
        stored = await asyncio.to_thread(storage.producer_checkpoint)
        floor: int | None = None
        if stored is not None:
            position = stored
        elif self.start_scn is not None:
            position = floor_cp = Checkpoint.after(self.start_scn)
            floor = floor_cp.window_scn
        else:
            floor = await self._relay_prev_scn(puller)
            position = Checkpoint.after(floor)
        assembler = _Assembler(storage.key_hash, await self._can_verify_windows(puller))
        ids = await asyncio.to_thread(storage.source_ids)
        self.status.state = "running"
        self.status.scn = position.window_scn if position.window_scn >= 0 else None
        # One append may run (in a thread, mostly waiting on the database) while the
        # next response is fetched and split; appends still happen one after the other.
        appending: asyncio.Task[None] | None = None
        try:
            while True:
                try:
                    batch = await puller.fetch(position, max_bytes=self.max_bytes,
                                               wait_ms=self.poll_wait_ms)
                except FellOffRelay as exc:
                    raise SourceError(
                        f"the relay no longer holds SCN {position.window_scn} (its oldest "
                        f"window is {exc.min_scn}): the bootstrap log would have a gap. Seed "
                        "the snapshot again (databus spark seed) and restart with "
                        "producer.start_scn", retriable=False,
                    ) from None
                if batch.pending_event_size is not None:
                    position = batch.checkpoint
                    self.max_bytes = max(self.max_bytes, batch.pending_event_size)
                    continue
                if not batch.body:
                    position = batch.checkpoint
                    # Nothing newer at the relay: caught up once the append in flight
                    # (if any) is done.
                    self.status.caught_up = appending is None or appending.done()
                    continue
                self.status.caught_up = False
                names = batch.source_names
                wanted = set(names.values())
                if not wanted <= ids.keys():
                    ids = await asyncio.to_thread(storage.ensure_sources, sorted(wanted))
                windows = assembler.feed(batch.body, names)
                await self._store_schemas(puller, assembler.fingerprints)
                position = batch.checkpoint
                if not len(windows):
                    continue
                if storage.copies_log:
                    # The COPY streams, made here while the previous append runs in
                    # PostgreSQL rather than in that append's transaction after it.
                    windows.log_copy(ids)
                if appending is not None:
                    await appending  # raises what the previous append raised
                appending = asyncio.create_task(self._append(windows, floor))
                floor = None
                # Let the append reach its thread before the next fetch runs: PostgreSQL
                # is the bottleneck, and it would otherwise wait for the fetch's first
                # await (milliseconds per response).
                await asyncio.sleep(0)
        finally:
            if appending is not None and not appending.done():
                # A thread cannot be cancelled: let the append finish (or fail) first.
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(appending)

    async def _append(self, windows: LogBatch, floor: int | None) -> None:
        committed = Checkpoint.after(windows.last_scn)
        try:
            await asyncio.to_thread(self.storage.append, windows, committed,
                                    log_floor_scn=floor, fence=self.fence)
        except FencedError as exc:
            # Said at once: the loop learns it only with the next batch, which may be
            # long in coming on an idle source, and /readyz must not say "running".
            self.status.state = "fenced"
            self.status.last_error = redact(str(exc))
            raise
        self.status.scn = committed.window_scn
        if len(windows):
            self.status.last_timestamp_ns = windows.last_timestamp_ns
        self.status.windows += len(windows)
        self.status.events += windows.events
        self.status.batches += 1

    async def _store_schemas(self, puller: RelayPuller, fingerprints: dict[int, str]
                             ) -> None:
        """Store the schemas of a batch's data events not stored yet (before the
        batch's append, so the log never holds an event whose schema is missing)."""
        for fp, name in fingerprints.items():
            if fp in self._known_fingerprints:
                continue
            schema = await puller.schema(fp)
            await asyncio.to_thread(self.storage.add_schema, fp, name, schema.to_json())
            self._known_fingerprints.add(fp)

    async def _can_verify_windows(self, puller: RelayPuller) -> bool:
        """EOW counts and checksums cover every event of a window: they can be checked
        when the producer pulls every source of the buffer. Asked again on each start
        (a retry too): a buffer that gained a source the producer does not pull fails
        one check, and the retry's fresh catalog turns the checks off."""
        return await puller.sees_whole_windows(self.sources)

    async def _relay_prev_scn(self, puller: RelayPuller) -> int:
        """The relay buffer's prev_scn: the log floor of a store started from scratch."""
        names = await puller.catalog()
        wanted = set(self.sources) or set(names.values())
        buffers = {b for b, members in puller.buffer_sources.items() if members & wanted}
        if len(buffers) != 1:
            raise SourceError(
                f"the bootstrap sources must come from one relay buffer, found {sorted(buffers)}",
                retriable=False)
        (buffer,) = buffers
        timeout = aiohttp.ClientTimeout(total=30)
        async with puller.session.get(f"{puller.relay}/v1/status", timeout=timeout) as resp:
            doc: Any = await read_json(resp, puller.relay)
        prev = doc["buffers"][buffer]["prev_scn"]
        return int(prev) if prev is not None and int(prev) >= 0 else 0
