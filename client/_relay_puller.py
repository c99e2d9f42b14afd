"""Pulling from relays: long-polls over persistent connections, failover, schemas.

One ``RelayPuller`` per client. Failover and backoff (``_failover.py``): it starts at a
random relay and, on a connection error, a 5xx or a body that fails its checks, moves to
the next relay round-robin. Checkpoints are portable across relays, and source ids are
not: the puller keeps each relay's own name <-> id map (from ``/v1/sources``) and hands
it out with every body.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from databus.checkpoint import Checkpoint
from databus.client._failover import FailoverPuller
from databus.client._headers import parse_stream_headers
from databus.errors import DatabusError, ScnNotFoundError


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


class RelayPuller(FailoverPuller):
    service = "relay"
    error_class = RelayError

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
        super().__init__(relays, sources, session, filter_json=filter_json,
                         backoff_initial=backoff_initial, backoff_max=backoff_max,
                         request_timeout=request_timeout, rng=rng)
        self.buffer_sources: dict[str, set[str]] = {}

    @property
    def relay(self) -> str:
        return self.url

    def json_error(self, status: int, body: object) -> DatabusError:
        error = super().json_error(status, body)
        if status == 410 and not isinstance(error, ScnNotFoundError):
            return ScnNotFoundError(error.message)  # a relay's 410 is always a fall-off
        return error

    async def catalog(self) -> dict[int, str]:
        """The current relay's source id -> name map (fetched once per relay)."""
        return await self._retrying(self._catalog)

    async def _catalog(self, relay: str) -> dict[int, str]:
        names = self._catalogs.get(relay)
        if names is None:
            names = await self._load_catalog(relay)
        return names

    async def _load_catalog(self, relay: str) -> dict[int, str]:
        doc = await self._get_json(f"{relay}/v1/sources")
        entries = doc["sources"] if isinstance(doc, dict) else []
        names = {int(e["id"]): str(e["name"]) for e in entries}
        by_buffer: dict[str, set[str]] = {}
        for e in entries:
            by_buffer.setdefault(str(e.get("buffer", "")), set()).add(str(e["name"]))
        self.buffer_sources = by_buffer
        # A relay lists a configured source before its table exists, as "pending"
        # (relays without the field list only existing ones).
        listed = {str(e["name"]): str(e.get("state", "active")) for e in entries}
        states = {}
        for name in self.sources:
            if name not in listed:
                # Not listed: configured by a pattern (tables=db.*) and not created yet,
                # or not configured at all: the relay's stream answer tells which.
                await self._probe(relay, name)
            states[name] = "active" if listed.get(name) == "active" else "pending"
        self.note_source_states(relay, states)
        self._catalogs[relay] = names
        return names

    async def _probe(self, relay: str, name: str) -> None:
        """An empty stream request for ``name``: 200 when the relay's configuration names
        it, ``UnknownSourceError`` (fatal) when it does not."""
        params = {"sources": name, "checkpoint": Checkpoint.latest().dumps(),
                  "max_bytes": "1", "wait_ms": "0"}
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with self.session.get(f"{relay}/v1/stream", params=params,
                                    timeout=timeout) as resp:
            await self._check(resp)
            await resp.read()

    async def fetch(self, position: Checkpoint, *, max_bytes: int, wait_ms: int) -> Batch:
        """One stream request, retried across relays until one answers."""
        params = {**self.stream_params(position, max_bytes), "wait_ms": str(wait_ms)}
        timeout = aiohttp.ClientTimeout(total=self.request_timeout + wait_ms / 1000)

        async def attempt(relay: str) -> Batch:
            names = await self._catalog(relay)
            async with self.session.get(
                f"{relay}/v1/stream", params=params, timeout=timeout
            ) as resp:
                await self._check(resp)
                body = await resp.read()
                headers = resp.headers
            if self.pending_sources:
                # Read after the body, so the names cover the ids of every event in it
                # (a table created meanwhile may have got its id just now).
                names = await self._load_catalog(relay)
            checkpoint, max_scn, pending = parse_stream_headers(headers, relay)
            return Batch(
                body=body,
                checkpoint=checkpoint,
                max_scn=max_scn,
                relay=relay,
                source_names=names,
                pending_event_size=pending,
            )

        try:
            return await self._retrying(attempt)
        except ScnNotFoundError as exc:
            raise FellOffRelay(position.window_scn, exc.min_scn) from None

