"""Request bodies over 64 KiB (issue 27, item 10): every server answers them with one
documented error, 413 ``body_too_large``, whoever reads them (the admin handler, a
relay worker forwarding to its main process, a handler that does not read bodies at
all), whether the length is declared or the body is chunked; nothing is logged as an
unhandled error, and the connection serves its next request.

Before: the bytes of the body that arrived after the handler had answered were counted
as the next request's head (431 "request head over 65536 bytes"), the relay worker read
up to aiohttp's 1 MiB and answered 413 ``http_error`` above it, and aiohttp's read of
the rest of the body ended in "unhandled error ... RuntimeError: Connection closed.".
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from databus._http import MAX_BODY_BYTES
from databus.bootstrap._service import build_app
from databus.bootstrap._storage import open_storage
from databus.config import BootstrapConfig, Secret
from databus.relay._relay import Relay
from databus.relay._server import create_app
from databus.relay._workers import WORKER_HEADER
from tests.relay_harness import ADMIN_TOKEN, RelayProcess, relay_config
from tests.unit.test_relay_limits import SMALL, serving
from tests.waiting import wait_until

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# Just over the limit, and well over aiohttp's own 1 MiB (client_max_size).
SIZES = (MAX_BODY_BYTES + 1, 2 << 20)


def _body(size: int) -> bytes:
    head = b'{"sources": ["'
    return head + b"x" * (size - len(head) - 3) + b'"]}'


async def _chunked(data: bytes) -> AsyncIterator[bytes]:
    for offset in range(0, len(data), 16384):
        yield data[offset:offset + 16384]


async def _refused(session: aiohttp.ClientSession, url: str, size: int,
                   chunked: bool) -> str | None:
    """POST a body of ``size`` bytes; assert the documented answer; the process's pid
    (relay.workers) when it says."""
    data = _body(size)
    async with session.post(url, data=_chunked(data) if chunked else data,
                            headers=AUTH) as answer:
        text = await answer.text()
        assert answer.status == 413, (size, chunked, answer.status, text)
        doc = json.loads(text)
        assert doc["error"] == "body_too_large", doc
        assert str(MAX_BODY_BYTES) in doc["message"], doc
        return answer.headers.get(WORKER_HEADER)


async def _every_way(base: str, paths: list[str]) -> set[str | None]:
    """Each size, declared and chunked, on new connections and then on one kept-alive
    connection that must still answer a request afterwards."""
    served_by: set[str | None] = set()
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True)) as fresh:
        for path in paths:
            for size in SIZES:
                for chunked in (False, True):
                    served_by.add(await _refused(fresh, base + path, size, chunked))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as kept:
        for size in SIZES:
            served_by.add(await _refused(kept, base + paths[0], size, chunked=False))
            async with kept.get(base + "/healthz") as answer:
                assert answer.status == 200, await answer.text()
    return served_by


def _no_unhandled(records: list[logging.LogRecord]) -> None:
    bad = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert not bad, bad


def test_single_process_relay_refuses_big_bodies_in_one_code(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        config = relay_config(tmp_path, {"load": SMALL})
        async with serving(create_app(Relay(config))) as served:
            base = f"http://127.0.0.1:{served.port}"
            await _every_way(base, ["/v1/admin/dumps", "/v1/admin/flush"])
            # A route that reads no body answers as it would without one, and the rest
            # of the body is read and dropped (not taken for the next request's head).
            async with aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=1)) as kept:
                for size in SIZES:
                    async with kept.post(base + "/v1/sources", data=_body(size)) as answer:
                        assert answer.status == 405, await answer.text()
                        assert (await answer.json())["error"] == "method_not_allowed"
                    async with kept.get(base + "/healthz") as answer:
                        assert answer.status == 200, await answer.text()

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    _no_unhandled(caplog.records)


def test_bootstrap_server_refuses_big_bodies_in_one_code(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        config = BootstrapConfig(storage=f"sqlite:///{tmp_path / 'boot.db'}",
                                 run=("server",), admin_token=Secret(ADMIN_TOKEN))
        storage = open_storage(config.storage, key_hash=config.key_hash)
        async with serving(build_app(config, storage)) as served:
            await _every_way(f"http://127.0.0.1:{served.port}", ["/v1/admin/retain"])

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    _no_unhandled(caplog.records)


def test_relay_with_workers_refuses_big_bodies_in_one_code(tmp_path: Path) -> None:
    relay = RelayProcess(tmp_path, {"load": SMALL}, workers=2, admin_token=ADMIN_TOKEN)
    relay.start()
    try:
        wait_until(lambda: [w for w in relay.status()["workers"] if w["state"] == "running"],
                   "the relay's worker running", 30, ignore=(OSError,))

        async def main() -> set[str | None]:
            base = relay.url
            seen: set[str | None] = set()
            # Connections are spread over the two processes by the kernel: go on until
            # both refused bodies (each round is 10 requests on new connections).
            for _ in range(20):
                seen |= await _every_way(base, ["/v1/admin/dumps"])
                if len(seen) >= 2:
                    break
            return seen

        seen = asyncio.run(main())
    finally:
        relay.kill()
    assert len(seen) == 2, f"one process answered every request: {seen}"
    log = relay.log_path.read_text()
    for bad in ("Traceback", "unhandled", "internal_error", "request head"):
        assert bad not in log, log[-4000:]
