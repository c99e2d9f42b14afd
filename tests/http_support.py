"""Shared by the HTTP parameter tests: a real bootstrap server on a small store (no
relay needed), hostile values, and the documented error codes of both servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from databus.bootstrap._applier import LogApplier
from databus.bootstrap._serve import Bootstrapper, ServePolicy
from databus.bootstrap._server import ServiceInfo, create_app
from databus.bootstrap._storage import BootstrapStorage, LogWindow, stored_event
from databus.checkpoint import Checkpoint
from databus.config import Secret
from databus.event import Op, encode_event

BOOT_TOKEN = "boot-admin-token"
BOOT_SOURCES = ("shop.a", "shop.b")
BOOT_WINDOWS = 30

# docs/relay.md and docs/bootstrap.md, "Errors": every error a client can cause is one
# of these, with this status. Anything else (or any 5xx) is a defect.
RELAY_ERRORS = {
    "bad_request": 400, "unauthorized": 401, "forbidden": 403, "not_found": 404,
    "unknown_source": 404, "unknown_schema": 404, "method_not_allowed": 405,
    "conflict": 409, "scn_not_found": 410, "request_timeout": 408, "overloaded": 503,
    "body_too_large": 413,
}
BOOTSTRAP_ERRORS = {
    "bad_request": 400, "filter_not_pushable": 400, "unauthorized": 401, "forbidden": 403,
    "not_found": 404, "unknown_source": 404, "method_not_allowed": 405,
    "bootstrap_too_old": 410, "request_timeout": 408, "overloaded": 503,
    "storage_unavailable": 503, "body_too_large": 413,
}


def fill_store(storage: BootstrapStorage, windows: int = BOOT_WINDOWS) -> None:
    """Windows 1..``windows``, each an upsert in shop.a and one in shop.b (a delete in
    shop.b every 7th); the first two thirds applied to the snapshot, so that a bootstrap
    has a catch-up phase after its snapshot."""
    ids = storage.ensure_sources(list(BOOT_SOURCES))
    batch = []
    for scn in range(1, windows + 1):
        events = []
        for name in BOOT_SOURCES:
            op = Op.DELETE if name == "shop.b" and scn % 7 == 0 else Op.UPSERT
            key: int | str = scn % 11 if name == "shop.a" else f"k{scn % 5}"
            events.append(stored_event(name, encode_event(
                scn=scn, source_id=ids[name], op=op, key=key, value=b"v%d" % scn,
                timestamp_ns=scn * 1000)))
        batch.append(LogWindow(scn, scn * 1000, events))
    applied = max(1, windows * 2 // 3)
    storage.append(batch[:applied], Checkpoint(applied), log_floor_scn=0)
    while storage.apply(max_rows=1000) is not None:
        pass
    if batch[applied:]:
        storage.append(batch[applied:], Checkpoint(windows))


@dataclass
class RunningBootstrap:
    url: str
    storage: BootstrapStorage
    session: aiohttp.ClientSession

    async def get(self, path: str, **params: Any) -> aiohttp.ClientResponse:
        return await self.session.get(self.url + path, params=params)


@asynccontextmanager
async def running_bootstrap(storage: BootstrapStorage, *, batch_rows: int = 7
                            ) -> AsyncIterator[RunningBootstrap]:
    """The real bootstrap HTTP server over ``storage``, with an admin token and the
    applier's retention behind POST /v1/admin/retain."""
    info = ServiceInfo(admin_token=Secret(BOOT_TOKEN))
    applier = LogApplier(storage, batch_rows=100, poll_interval=1.0, retention_hours=None,
                         retention_max_log_bytes=None, retention_interval=3600.0)
    info.retain = applier.retain
    app = create_app(Bootstrapper(storage, ServePolicy(batch_rows=batch_rows)), info)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            yield RunningBootstrap(f"http://127.0.0.1:{port}", storage, session)
    finally:
        await runner.cleanup()


async def raw_request(url: str, method: str, target: bytes, headers: bytes = b"",
                      body: bytes = b"") -> tuple[int, bytes, bytes]:
    """One HTTP/1.1 request written byte for byte (header values that are not UTF-8,
    targets a client library would re-encode); (status, head, body)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(method.encode() + b" " + target + b" HTTP/1.1\r\nHost: x\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n" + headers + b"\r\n" + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, payload
