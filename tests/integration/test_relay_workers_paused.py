"""A relay with workers whose main process is stopped (SIGSTOP), on real processes
(issue 27, item 4; docs/relay.md, "When the main process stops answering").

The worker keeps running and would go on answering from the files: it must not look
healthy. Once the main process's liveness stamp is older than its bound (3 s outside a
cluster), the worker:

- ends its idle streams with an in-band ``unavailable`` error event (no more
  heartbeats), and a long poll that was waiting at the tail answers 503 before its
  ``wait_ms``, as does a new one;
- answers ``/readyz`` 503 with the ``main_process`` component, ``/healthz`` 503, and
  forwarded requests (``/v1/status``, ``/metrics``) 503 at once instead of waiting for
  the stopped process;
- is ready again once the main process resumes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from databus.checkpoint import Checkpoint
from databus.client._relay_stream import StreamFrame, StreamFramer
from databus.relay._liveness import STALE_S
from databus.relay._worker import REFRESH_S
from databus.relay._workers import WORKER_HEADER
from tests.integration.test_relay_workers import relay_with_workers, wait_for, workers_running
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

# A request that reached the stopped main process never gets an answer: given up after
# this, and asked again on a fresh connection (which the kernel may give the worker).
ATTEMPT_S = 1.0


async def on_worker(url: str, worker_pid: str, path: str,
                    **params: str) -> tuple[int, dict[str, Any]]:
    """``GET path`` answered by the worker: (status, JSON body)."""
    async def attempt() -> tuple[int, dict[str, Any]] | None:
        timeout = aiohttp.ClientTimeout(total=ATTEMPT_S)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, \
                    session.get(url + path, params=params) as resp:
                if resp.headers.get(WORKER_HEADER) != worker_pid:
                    return None
                return resp.status, json.loads(await resp.read() or b"{}")
        except (aiohttp.ClientError, TimeoutError):
            return None
    answer: tuple[int, dict[str, Any]] = await async_wait_until(
        attempt, f"the worker answering {path}", timeout=60, max_interval=0.05)
    return answer


async def worker_session(url: str, worker_pid: str) -> aiohttp.ClientSession:
    """A session whose one kept-alive connection the worker serves."""
    async def attempt() -> aiohttp.ClientSession | None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        async with session.get(f"{url}/v1/sources") as resp:
            await resp.read()
            if resp.headers.get(WORKER_HEADER) == worker_pid:
                return session
        await session.close()
        return None
    session: aiohttp.ClientSession = await async_wait_until(
        attempt, "a connection served by the worker", timeout=60, max_interval=0.05)
    return session


async def open_worker_stream(session: aiohttp.ClientSession, url: str, worker_pid: str,
                             checkpoint: Checkpoint) -> aiohttp.ClientResponse:
    async def attempt() -> aiohttp.ClientResponse | None:
        resp = await session.get(f"{url}/v1/stream", params={
            "follow": "true", "heartbeat_ms": "200", "checkpoint": checkpoint.dumps()})
        if resp.headers.get(WORKER_HEADER) == worker_pid:
            return resp
        resp.close()
        return None
    resp: aiohttp.ClientResponse = await async_wait_until(
        attempt, "a stream served by the worker", timeout=60, max_interval=0.05)
    assert resp.status == 200
    return resp


async def frames_until(resp: aiohttp.ClientResponse, framer: StreamFramer,
                       kind: str, seen: list[StreamFrame]) -> StreamFrame:
    """Read ``resp`` until a frame of ``kind``; every frame read goes to ``seen``."""
    while True:
        for frame in seen:
            if frame.kind == kind:
                seen.remove(frame)
                return frame
        chunk = await resp.content.readany()
        assert chunk, f"the stream ended before a {kind} frame"
        seen.extend(framer.feed(chunk))


def test_a_stopped_main_process_makes_its_worker_say_not_ready(tmp_path: Path) -> None:
    relay = relay_with_workers(tmp_path, workers=2)
    relay.start()
    assert relay.proc is not None
    main_pid = relay.proc.pid
    try:
        doc = wait_for(relay, workers_running(1))
        worker = str(doc["workers"][0]["pid"])
        top = doc["buffers"]["load"]["max_scn"]

        async def main() -> None:
            status, ready = await on_worker(relay.url, worker, "/readyz")
            assert status == 200 and ready["ready"] is True, ready
            async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=60)) as session:
                resp = await open_worker_stream(session, relay.url, worker, Checkpoint(top))
                framer, seen = StreamFramer(), []
                await frames_until(resp, framer, "write", seen)
                polling = await worker_session(relay.url, worker)
                os.kill(main_pid, signal.SIGSTOP)
                stopped = time.monotonic()
                try:
                    # A long poll at the tail while the main process is stopped, on a
                    # connection the worker serves: it waits (no window comes) until
                    # the stamp is stale, then 503.
                    # A window the writer published just before the stop reaches the
                    # worker by its own look at the files (REFRESH_S) when the stopped
                    # main process did not send the wake-up: let it, so that the tail
                    # the poll waits at is the last window there will be.
                    await asyncio.sleep(REFRESH_S + 0.2)
                    latest = Checkpoint.latest().dumps()
                    waiting = asyncio.create_task(polling.get(
                        f"{relay.url}/v1/stream",
                        params={"checkpoint": latest, "wait_ms": "50000"}))
                    # The stream: windows until the stop, then no heartbeat promising
                    # more, but the error, and the end.
                    async with asyncio.timeout(60):
                        error = await frames_until(resp, framer, "error", seen)
                    ended = time.monotonic() - stopped
                    assert error.error is not None and error.error["error"] == "unavailable"
                    assert f"pid {main_pid}" in str(error.error["message"])
                    assert await resp.content.read() == b""
                    assert ended > STALE_S - 0.5  # not before the bound (minus a stamp)
                    resp.close()
                    async with await waiting as answer:
                        assert answer.headers[WORKER_HEADER] == worker
                        body = await answer.json()
                        assert answer.status == 503 and body["error"] == "unavailable", body
                    assert time.monotonic() - stopped < 50  # answered, not timed out
                    await polling.close()
                    status, body = await on_worker(relay.url, worker, "/v1/stream",
                                                   checkpoint=latest, wait_ms="10000")
                    assert status == 503 and body["error"] == "unavailable"
                    status, ready = await on_worker(relay.url, worker, "/readyz")
                    assert status == 503 and ready["ready"] is False, ready
                    assert ready["error"] == "not_ready"
                    [component] = ready["components"]
                    assert component["component"] == "main_process"
                    assert component["state"] == "unresponsive"
                    assert component["error"] == "unavailable" and component["fix"]
                    for path in ("/healthz", "/v1/status", "/metrics", "/v1/consumers"):
                        status, body = await on_worker(relay.url, worker, path)
                        assert status == 503 and body["error"] == "unavailable", (path, body)
                finally:
                    os.kill(main_pid, signal.SIGCONT)
            # Resumed: ready again, through the worker too.
            await async_wait_until(
                lambda: _ready(relay.url, worker), "the worker ready again", timeout=30)

        asyncio.run(main())
    finally:
        relay.kill(signal.SIGTERM)


async def _ready(url: str, worker: str) -> bool:
    status, doc = await on_worker(url, worker, "/readyz")
    return status == 200 and doc["ready"] is True
