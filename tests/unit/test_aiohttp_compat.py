"""The aiohttp internals databus relies on (databus/_aiohttp_compat.py) exist on the
installed aiohttp, with the parameters our overrides and calls assume; and the names
the compat module gives them read what they should on a real connection.

When an aiohttp release removes or renames one, this fails here, naming it, rather than
a hostile-client test failing somewhere in the relay's limits."""

from __future__ import annotations

import asyncio
import inspect
import re
import tomllib
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.http_writer import StreamWriter

from databus import _aiohttp_compat as compat
from databus._serving import AppRunner, LimitedRequestHandler, LimitedServer

ROOT = Path(__file__).resolve().parents[2]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _live_objects() -> dict[type, object]:
    """A real Server, RequestHandler and StreamWriter, built as aiohttp builds them."""

    async def build() -> dict[type, object]:
        async def handler(request: web.BaseRequest) -> web.StreamResponse:
            return web.Response()

        server = compat.Server(handler)
        protocol = server()
        writer = StreamWriter(protocol, asyncio.get_running_loop())
        runner = web.AppRunner(web.Application())
        return {compat.Server: server, compat.RequestHandler: protocol,
                StreamWriter: writer, web.AppRunner: runner}

    return asyncio.run(build())


LIVE = _live_objects()


@pytest.mark.parametrize("internal", compat.INTERNALS,
                         ids=lambda i: f"{i.owner.__name__}.{i.name}")
def test_internal_exists(internal: compat.Internal) -> None:
    where = f"aiohttp {aiohttp.__version__}: {internal.owner.__name__}.{internal.name}"
    if internal.kind == "attribute":
        assert hasattr(LIVE[internal.owner], internal.name), f"{where} is gone"
        return
    method = getattr(internal.owner, internal.name, None)
    assert callable(method), f"{where} is no longer a method"
    params = [p.name for p in inspect.signature(method).parameters.values()][1:]
    assert tuple(params[:len(internal.params)]) == internal.params, (
        f"{where} takes {params}, databus expects {list(internal.params)}")
    # Parameters aiohttp added after ours must have defaults, or our calls break.
    extra = list(inspect.signature(method).parameters.values())[1 + len(internal.params):]
    assert all(p.default is not inspect.Parameter.empty
               or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in extra), where


def test_typed_storage_keys_and_floor() -> None:
    """``web.RequestKey``/``ResponseKey`` (aiohttp 3.14.0) are what sets the floor in
    pyproject.toml; the installed aiohttp meets it."""
    assert hasattr(web, "RequestKey") and hasattr(web, "ResponseKey")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floor = next(d for d in project["dependencies"] if d.startswith("aiohttp"))
    assert _version(floor) >= (3, 14), floor
    assert _version(aiohttp.__version__) >= _version(floor)


def test_accessors_read_a_real_connection() -> None:
    """Inside a handler on a real server: a request is in progress, one head parsed,
    the connection neither closing nor upgraded, one connection counted."""
    seen: dict[str, object] = {}

    async def run() -> None:
        async def handler(request: web.Request) -> web.Response:
            protocol = request.protocol
            assert isinstance(protocol, LimitedRequestHandler)
            seen.update(handling=protocol.handling_request, parsed=protocol.requests_parsed,
                        closing=protocol.closing, upgraded=protocol.upgraded,
                        paused=protocol.writing_paused,
                        sent=compat.output_size(request))
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/", handler)
        runner = AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            port = runner.addresses[0][1]
            server = runner.server
            assert isinstance(server, LimitedServer)
            async with aiohttp.ClientSession() as session, \
                    session.get(f"http://127.0.0.1:{port}/") as response:
                assert await response.text() == "ok"
                seen["connections"] = server.connection_count
        finally:
            await runner.cleanup()

    asyncio.run(run())
    assert seen == {"handling": True, "parsed": 1, "closing": False, "upgraded": False,
                    "paused": False, "sent": 0, "connections": 1}


def test_send_pending_headers_without_the_method() -> None:
    """A writer that sends its headers at prepare() has no send_headers: nothing to do."""

    class Plain:
        pass

    compat.send_pending_headers(Plain())  # type: ignore[arg-type]


def test_a_pipelined_request_is_seen_queued() -> None:
    """Two requests in one packet: while the first is handled, the second waits in
    aiohttp's queue, and ``newest_payload`` is its body (the ``(message, payload)``
    pairs of ``_messages``)."""
    seen: dict[str, object] = {}

    async def run() -> None:
        async def slow(request: web.Request) -> web.Response:
            protocol = request.protocol
            assert isinstance(protocol, LimitedRequestHandler)
            for _ in range(200):  # the second head is parsed once the bytes are read
                if protocol.newest_payload is not None:
                    break
                await asyncio.sleep(0.01)
            seen.update(handling=protocol.handling_request,
                        queued=isinstance(protocol.newest_payload, compat.StreamReader))
            return web.Response(text="slow")

        async def fast(request: web.Request) -> web.Response:
            return web.Response(text="fast")

        app = web.Application()
        app.router.add_get("/slow", slow)
        app.router.add_get("/fast", fast)
        runner = AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            port = runner.addresses[0][1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"GET /fast HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            body = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            seen["answers"] = (body.count(b"slow"), body.count(b"fast"))
        finally:
            await runner.cleanup()

    asyncio.run(run())
    assert seen == {"handling": True, "queued": True, "answers": (1, 1)}
