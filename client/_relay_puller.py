"""Pulling from relays: long-polls over persistent connections, failover, schemas.

One ``RelayPuller`` per client. It starts at a random relay and, on a connection error,
a 5xx or a body that fails its checks, moves to the next relay round-robin, sleeping
with exponential backoff once every relay has failed in a row. Checkpoints are portable
across relays, and source ids are not: the puller keeps each relay's own name <-> id map
(from ``/v1/sources``) and hands it out with every body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

from databus.checkpoint import Checkpoint
from databus.errors import (
    ConnectionLostError,
    DatabusError,
    ScnNotFoundError,
    UnknownSchemaError,
    UnknownSourceError,
)
from databus.schemas import Schema

log = logging.getLogger("databus.client")
T = TypeVar("T")


class FellOffRelay(DatabusError):
    """The consumer's checkpoint is older than anything the relays hold."""

    code = "fell_off_relay"

    def __init__(self, scn: int, min_scn: int | None) -> None:
        super().__init__(
            f"checkpoint SCN {scn} is no longer held by the relay (its oldest window is "
            f"{min_scn}): the changes in between are gone from the relay. Configure a "
            "bootstrap service (DatabusClient(bootstrap=[...])) to catch up from a "
            "snapshot, or, if losing those changes is acceptable, delete the checkpoint "
            "to start again from the relay's oldest window."
        )
        self.scn = scn
        self.min_scn = min_scn


class RelayError(DatabusError):
    """A relay answered with a JSON error the client cannot retry."""

    code = "relay_error"


@dataclass(frozen=True, slots=True)
class Batch:
    """One stream response."""

    body: bytes
    checkpoint: Checkpoint
    max_scn: int | None
    relay: str
    source_names: dict[int, str]
    pending_event_size: int | None


class RelayPuller:
    def __init__(
        self,
        relays: Sequence[str],
        sources: Sequence[str],
        session: aiohttp.ClientSession,
        *,
        filter_json: str | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        request_timeout: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        if not relays:
            raise ValueError("at least one relay URL is needed")
        self.relays = [r.rstrip("/") for r in relays]
        self.sources = list(sources)
        self.session = session
        self.filter_json = filter_json
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.request_timeout = request_timeout
        self._index = (rng or random.Random()).randrange(len(self.relays))
        self._failures = 0
        self._catalogs: dict[str, dict[int, str]] = {}
        self.buffer_sources: dict[str, set[str]] = {}
        self.failovers = 0
        self.last_error: BaseException | None = None

    @property
    def relay(self) -> str:
        return self.relays[self._index]

    # -- failover ------------------------------------------------------------------

    async def failed(self, error: BaseException) -> None:
        """The current relay failed: move on, and back off after a full round."""
        self.last_error = error
        self._failures += 1
        log.warning("relay %s failed (%s); trying the next one", self.relay, error)
        self._catalogs.pop(self.relay, None)
        self._index = (self._index + 1) % len(self.relays)
        self.failovers += 1
        rounds = self._failures // len(self.relays)
        if rounds:
            delay = min(self.backoff_max, self.backoff_initial * 2 ** (rounds - 1))
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    # -- requests ------------------------------------------------------------------

    async def _get_json(self, url: str) -> object:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with self.session.get(url, timeout=timeout) as resp:
            if resp.status >= 500:
                raise ConnectionLostError(f"{url}: HTTP {resp.status}")
            body = await resp.json(content_type=None)
            if resp.status != 200:
                raise _json_error(resp.status, body)
            return body

    async def _retrying(self, attempt: Callable[[str], Awaitable[T]]) -> T:
        """Run ``attempt(relay_url)`` until one relay answers; retriable failures move
        on to the next relay (with backoff after a full round), others are raised."""
        while True:
            try:
                result = await attempt(self.relay)
            except ScnNotFoundError:
                raise
            except (aiohttp.ClientError, TimeoutError, OSError, ConnectionLostError,
                    KeyError, ValueError) as exc:
                if isinstance(exc, DatabusError) and not exc.retriable:
                    raise
                await self.failed(exc)
                continue
            self._failures = 0
            return result

    async def catalog(self) -> dict[int, str]:
        """The current relay's source id -> name map (fetched once per relay)."""
        return await self._retrying(self._catalog)

    async def _catalog(self, relay: str) -> dict[int, str]:
        names = self._catalogs.get(relay)
        if names is None:
            doc = await self._get_json(f"{relay}/v1/sources")
            entries = doc["sources"] if isinstance(doc, dict) else []
            names = {int(e["id"]): str(e["name"]) for e in entries}
            by_buffer: dict[str, set[str]] = {}
            for e in entries:
                by_buffer.setdefault(str(e.get("buffer", "")), set()).add(str(e["name"]))
            self.buffer_sources = by_buffer
            unknown = sorted(set(self.sources) - set(names.values()))
            if unknown:
                raise UnknownSourceError(f"relay {relay} has no source(s) {', '.join(unknown)}")
            self._catalogs[relay] = names
        return names

    async def fetch(self, position: Checkpoint, *, max_bytes: int, wait_ms: int) -> Batch:
        """One stream request, retried across relays until one answers."""
        params = {
            "checkpoint": position.dumps(),
            "max_bytes": str(max_bytes),
            "wait_ms": str(wait_ms),
        }
        if self.sources:
            params["sources"] = ",".join(self.sources)
        if self.filter_json:
            params["filter"] = self.filter_json
        timeout = aiohttp.ClientTimeout(total=self.request_timeout + wait_ms / 1000)

        async def attempt(relay: str) -> Batch:
            names = await self._catalog(relay)
            async with self.session.get(
                f"{relay}/v1/stream", params=params, timeout=timeout
            ) as resp:
                if resp.status >= 500:
                    raise ConnectionLostError(f"relay {relay}: HTTP {resp.status}")
                if resp.status != 200:
                    raise _json_error(resp.status, await resp.json(content_type=None))
                body = await resp.read()
                headers = resp.headers
            pending = headers.get("X-Databus-Pending-Event-Size")
            max_scn = headers.get("X-Databus-Max-Scn")
            return Batch(
                body=body,
                checkpoint=Checkpoint.loads(headers["X-Databus-Checkpoint"]),
                max_scn=int(max_scn) if max_scn is not None else None,
                relay=relay,
                source_names=names,
                pending_event_size=int(pending) if pending else None,
            )

        try:
            return await self._retrying(attempt)
        except ScnNotFoundError as exc:
            raise FellOffRelay(position.window_scn, exc.min_scn) from None

    async def schema(self, fingerprint: int) -> Schema:
        """A writer schema by fingerprint, from whichever relay answers."""

        async def attempt(relay: str) -> Schema:
            doc = await self._get_json(f"{relay}/v1/schemas/{fingerprint:016x}")
            assert isinstance(doc, dict)
            return Schema(doc["schema"])

        return await self._retrying(attempt)


def _json_error(status: int, body: object) -> DatabusError:
    doc = body if isinstance(body, dict) else {}
    code = str(doc.get("error", "http_error"))
    message = str(doc.get("message", json.dumps(body)[:200]))
    if code == "scn_not_found" or status == 410:
        min_scn = doc.get("min_scn")
        return ScnNotFoundError(message, min_scn=int(min_scn) if min_scn is not None else None)
    if code == "unknown_source":
        return UnknownSourceError(message)
    if code == "unknown_schema":
        return UnknownSchemaError(message)
    return RelayError(f"relay answered {status} {code}: {message}")
