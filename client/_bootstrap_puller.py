"""Pulling from the bootstrap service (docs/bootstrap.md, "HTTP API").

The conversation is stateless on the server: the client sends a checkpoint, gets one
batch of windows and the checkpoint to send next (``X-Databus-Checkpoint``), until the
phase (``X-Databus-Bootstrap-Phase``) is ``done``. Any replica can answer any request,
so failover, backoff and JSON errors are the relay puller's (``_failover.py``); a 503
``storage_unavailable`` (the server's database is down) is retried like a lost
connection, with the same checkpoint.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import aiohttp

from databus.checkpoint import Checkpoint, Mode
from databus.client._failover import FailoverPuller
from databus.client._headers import bad_answer, parse_stream_headers
from databus.errors import DatabusError, UnknownSourceError

Phase = Literal["snapshot", "catchup", "done"]
_PHASES: tuple[Phase, ...] = ("snapshot", "catchup", "done")


class BootstrapError(DatabusError):
    """The bootstrap service answered with an error the client cannot retry."""

    code = "bootstrap_error"


class BootstrapTooOld(BootstrapError):
    """The consumer's checkpoint is older than the bootstrap service's log."""

    code = "bootstrap_too_old"

    def __init__(self, scn: int | None, log_floor_scn: int | None, detail: str = "") -> None:
        super().__init__(
            f"checkpoint SCN {scn} is older than the bootstrap log, which starts after SCN "
            f"{log_floor_scn}: the changes right after the checkpoint are gone from the "
            "relays and from the bootstrap service, so this consumer's state cannot be "
            "brought up to date. Clear the consumer's state (the data it built) and delete "
            "its checkpoint: the client then starts again from a full snapshot."
            + (f" (server: {detail})" if detail else "")
        )
        self.scn = scn
        self.log_floor_scn = log_floor_scn
        self.detail = detail


@dataclass(frozen=True, slots=True)
class BootstrapBatch:
    """One bootstrap stream response."""

    body: bytes
    checkpoint: Checkpoint  # the one to send next; online at the target when done
    phase: Phase
    target_scn: int | None
    server: str
    source_names: dict[int, str]
    pending_event_size: int | None
    # Why the server served nothing yet: the store is behind this bootstrap (it lost
    # commits, or the checkpoint names an SCN the store has not reached).
    waiting: str | None = None


class BootstrapPuller(FailoverPuller):
    service = "bootstrap service"
    error_class = BootstrapError
    schemas_path = "/v1/bootstrap/schemas"

    def __init__(
        self,
        urls: Sequence[str],
        sources: Sequence[str],
        session: aiohttp.ClientSession,
        *,
        filter_json: str | None = None,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        request_timeout: float = 60.0,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(urls, sources, session, filter_json=filter_json,
                         backoff_initial=backoff_initial, backoff_max=backoff_max,
                         request_timeout=request_timeout, rng=rng)

    def json_error(self, status: int, body: object) -> DatabusError:
        doc = body if isinstance(body, dict) else {}
        if doc.get("error") == "bootstrap_too_old":
            floor = doc.get("log_floor_scn")
            return BootstrapTooOld(None, int(floor) if floor is not None else None,
                                   str(doc.get("message", "")))
        error = super().json_error(status, body)
        if isinstance(error, UnknownSourceError):
            error.retriable = True  # see _catalog
        return error

    async def _catalog(self, url: str) -> dict[int, str]:
        names = self._catalogs.get(url)
        if names is None:
            doc = await self._get_json(f"{url}/v1/bootstrap/sources")
            entries = doc["sources"] if isinstance(doc, dict) else doc
            if not isinstance(entries, list):
                raise ValueError(f"{url}/v1/bootstrap/sources is not a list")
            names = {int(e["id"]): str(e["name"]) for e in entries}
            # A source the relays have (the client checks there first) and the store
            # not yet: its log writer has not written it. That passes; wait for it.
            self._check_sources(url, self.sources, names, retriable=True,
                                hint=" yet (waiting for its log writer)")
            self._catalogs[url] = names
        return names

    async def fetch(self, position: Checkpoint, *, max_bytes: int) -> BootstrapBatch:
        """One stream request, retried across servers until one answers."""
        params = self.stream_params(position, max_bytes)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)

        async def attempt(url: str) -> BootstrapBatch:
            names = await self._catalog(url)
            async with self.session.get(
                f"{url}/v1/bootstrap/stream", params=params, timeout=timeout
            ) as resp:
                await self._check(resp)
                body = await resp.read()
                headers = resp.headers
            phase = headers.get("X-Databus-Bootstrap-Phase")
            if phase not in _PHASES:
                raise bad_answer(f"{url} sent an unknown bootstrap phase {phase!r}")
            checkpoint, target, pending = parse_stream_headers(
                {"X-Databus-Checkpoint": headers.get("X-Databus-Checkpoint", ""),
                 "X-Databus-Max-Scn": headers.get("X-Databus-Target-Scn", ""),
                 "X-Databus-Pending-Event-Size":
                     headers.get("X-Databus-Pending-Event-Size", "")}, url)
            if phase == "done" and checkpoint.mode is not Mode.ONLINE:
                raise bad_answer(
                    f"bootstrap service {url} ended the bootstrap with a "
                    f"{checkpoint.mode.value} checkpoint instead of an online one"
                )
            return BootstrapBatch(
                body=body,
                checkpoint=checkpoint,
                phase=phase,
                target_scn=target,
                server=url,
                source_names=names,
                pending_event_size=pending,
                waiting=headers.get("X-Databus-Bootstrap-Waiting"),
            )

        try:
            return await self._retrying(attempt)
        except BootstrapTooOld as exc:
            # The answer does not say which SCN was asked for; the request does.
            raise BootstrapTooOld(position.window_scn, exc.log_floor_scn, exc.detail) from None
