"""A hostile relay for the readers' tests (issue 27): an aiohttp server in front of an
honest relay that serves its answers with one attack for the first ``times`` answers the
attack applies to, then honestly.

It answers ``/v1/stream`` itself, polling the honest relay (``wait_ms`` kept short):
for a poll with one answer, for ``follow=true`` with a stream it writes in the relay's
streaming format (writes, each followed by its CHECKPOINT event; HEARTBEATs when idle).
Every other path is passed through. Attacks:

- ``reorder``: two windows of an answer swapped (checkpoint honest).
- ``ahead``: the checkpoint 1,000 SCNs past the body's last window.
- ``behind``: the checkpoint 50 SCNs before the body's last window (a flood of them).
- ``dribble``: (streaming) after the first write, the next one a byte at a time every
  ``dribble_s``, with no heartbeat, for as long as the reader stays.
- ``oversend``: 64 MiB more than asked for: a poll's body goes on with zeros; a stream's
  write goes on with copies of its first event and no CHECKPOINT event.

``attacks`` counts the answers attacked; ``oversent`` the bytes of attack payload the
server managed to hand to its socket before the reader hung up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from databus.checkpoint import Checkpoint
from databus.event import (
    CHECKPOINT_SOURCE_ID,
    HEARTBEAT_SOURCE_ID,
    encode_control,
    iter_events,
)

ATTACKS = ("reorder", "ahead", "behind", "dribble", "oversend")
OVERSEND_BYTES = 64 << 20


def windows(body: bytes) -> list[bytes]:
    """``body`` cut after each EOW (a tail without one is the last piece)."""
    pieces, start = [], 0
    for offset, header in iter_events(body):
        if header.is_eow:
            end = offset + header.total_length
            pieces.append(body[start:end])
            start = end
    if start < len(body):
        pieces.append(body[start:])
    return pieces


def control(source_id: int, payload: bytes, scn: int = 0) -> bytes:
    return encode_control(scn=scn, source_id=source_id, payload=payload)


@dataclass
class HostileUpstream:
    upstream: str
    session: aiohttp.ClientSession
    attack: str
    times: int = 3
    dribble_s: float = 0.1
    heartbeat_s: float = 0.2
    url: str = ""
    attacks: int = 0
    oversent: int = 0

    def _attacking(self) -> bool:
        return self.attacks < self.times

    async def _poll(self, params: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        query = {k: v for k, v in params.items() if k not in ("follow", "heartbeat_ms")}
        query["wait_ms"] = str(min(int(query.get("wait_ms", "200")), 200))
        async with self.session.get(self.upstream + "/v1/stream", params=query) as resp:
            body = await resp.read()
            headers = {k: v for k, v in resp.headers.items()
                       if k.lower().startswith("x-databus-")}
            return resp.status, body, headers

    def _mangle(self, body: bytes, checkpoint: Checkpoint) -> tuple[bytes, Checkpoint]:
        """The attack on one answer, if it applies to it (else the answer as it is)."""
        if not body or not self._attacking():
            return body, checkpoint
        if self.attack == "reorder":
            pieces = windows(body)
            if len(pieces) >= 3 or (len(pieces) == 2 and checkpoint.window_offset < 0):
                self.attacks += 1
                pieces[0], pieces[1] = pieces[1], pieces[0]
                return b"".join(pieces), checkpoint
        elif self.attack == "ahead" and checkpoint.window_offset < 0:
            self.attacks += 1
            return body, Checkpoint(checkpoint.window_scn + 1000)
        elif self.attack == "behind" and checkpoint.window_offset < 0:
            self.attacks += 1
            return body, Checkpoint(max(checkpoint.window_scn - 50, 0))
        return body, checkpoint

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        if params.get("follow") == "true":
            return await self._follow(request, params)
        status, body, headers = await self._poll(params)
        if status != 200:
            return web.Response(status=status, body=body, headers=headers)
        checkpoint = Checkpoint.loads(headers["X-Databus-Checkpoint"])
        asked = int(params.get("max_bytes", "0"))
        if self.attack == "oversend" and body and self._attacking():
            self.attacks += 1
            return await self._oversend_poll(request, body, headers)
        body, checkpoint = self._mangle(body, checkpoint)
        headers["X-Databus-Checkpoint"] = checkpoint.dumps()
        assert asked <= 0 or len(body) <= asked or self.attack == "oversend"
        return web.Response(body=body, headers=headers)

    async def _oversend_poll(self, request: web.Request, body: bytes,
                             headers: dict[str, str]) -> web.StreamResponse:
        out = web.StreamResponse(headers=headers)  # chunked: no length announced
        await out.prepare(request)
        await out.write(body)
        zeros = bytes(1 << 20)
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):
            for _ in range(OVERSEND_BYTES >> 20):
                await out.write(zeros)
                self.oversent += len(zeros)
        return out

    async def _follow(self, request: web.Request, params: dict[str, str]
                      ) -> web.StreamResponse:
        position = Checkpoint.loads(params["checkpoint"])
        status, body, headers = await self._poll({**params, "wait_ms": "0"})
        if status != 200:
            return web.Response(status=status, body=body, headers=headers)
        headers["X-Databus-Streaming"] = "1"
        headers.pop("X-Databus-Checkpoint", None)
        out = web.StreamResponse(headers=headers)
        await out.prepare(request)
        writes = 0
        with contextlib.suppress(ConnectionError, aiohttp.ClientError, asyncio.CancelledError):
            while True:
                status, body, got = await self._poll({**params,
                                                      "checkpoint": position.dumps()})
                if status != 200:
                    return out
                checkpoint = Checkpoint.loads(got["X-Databus-Checkpoint"])
                if not body:
                    await out.write(control(HEARTBEAT_SOURCE_ID, b'{"min_scn": null, '
                                                                 b'"max_scn": null}'))
                    await asyncio.sleep(self.heartbeat_s)
                    continue
                if writes and self._attacking() and self.attack in ("dribble", "oversend"):
                    self.attacks += 1
                    await self._dribble_or_flood(out, body)
                    return out
                sent, sent_cp = self._mangle(body, checkpoint)
                await out.write(sent + control(CHECKPOINT_SOURCE_ID,
                                               sent_cp.dumps().encode(),
                                               sent_cp.window_scn))
                writes += 1
                position = checkpoint
        return out

    async def _dribble_or_flood(self, out: web.StreamResponse, body: bytes) -> None:
        if self.attack == "dribble":
            for i in range(len(body)):
                await out.write(body[i:i + 1])
                await asyncio.sleep(self.dribble_s)
            return
        first = next(iter_events(body))[1].total_length
        event = body[:first]
        piece = event * max(1, (1 << 20) // len(event))
        while self.oversent < OVERSEND_BYTES:
            await out.write(piece)
            self.oversent += len(piece)

    async def _passthrough(self, request: web.Request) -> web.Response:
        async with self.session.get(self.upstream + request.path,
                                    params=request.query) as resp:
            body = await resp.read()
            return web.Response(status=resp.status, body=body,
                                content_type=resp.content_type)


@asynccontextmanager
async def hostile_upstream(upstream: str, session: aiohttp.ClientSession, attack: str, *,
                           times: int = 3, dribble_s: float = 0.1,
                           heartbeat_s: float = 0.2) -> AsyncIterator[HostileUpstream]:
    assert attack in ATTACKS
    hostile = HostileUpstream(upstream, session, attack, times, dribble_s, heartbeat_s)
    app = web.Application()
    app.router.add_get("/v1/stream", hostile._stream)
    app.router.add_get("/{tail:.*}", hostile._passthrough)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    hostile.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield hostile
    finally:
        await runner.cleanup()
