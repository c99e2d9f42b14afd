"""DatabusClient against real relays fed by the deterministic synthetic fetcher.

Two relays with the same synthetic URI serve identical streams (the generator is a
pure function of SCN), which makes failover testable without a database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from databus.checkpoint import Checkpoint
from databus.client import (
    CallbackResult,
    CallbackTimeout,
    Consumer,
    DatabusClient,
    DataEvent,
    FellOffRelay,
    FileCheckpointStore,
    MemoryCheckpointStore,
    RetryBudgetExhausted,
)
from databus.errors import CheckpointError
from databus.schemas import Schema
from tests.relay_harness import free_port, relay_config, running_relay, stream_all

pytestmark = pytest.mark.twin("databus.batch")

LIMIT = 30
SOURCE = f"synthetic://?rate=0&keys=50&event_bytes=200&events_per_window=3&limit={LIMIT}&seed=5"


class Recorder(Consumer):
    """Keeps the callback trace and a replica (key -> seq); stops the client at the end."""

    def __init__(self, stop_at: int = LIMIT) -> None:
        self.client: DatabusClient | None = None
        self.stop_at = stop_at
        self.trace: list[tuple[str, Any]] = []
        self.windows: dict[int, list[object]] = {}
        self.replica: dict[object, int] = {}
        self.current: list[object] = []
        self.errors: list[BaseException] = []
        self.hook: Callable[[str, Any], CallbackResult | None] = lambda name, arg: None

    def _call(self, name: str, arg: Any) -> CallbackResult | None:
        self.trace.append((name, arg))
        return self.hook(name, arg)

    def on_start_data_event_sequence(self, scn: int) -> CallbackResult | None:
        self.current = []
        return self._call("start", scn)

    def on_data_event(self, event: DataEvent) -> CallbackResult | None:
        result = self._call("data", event)
        self.current.append(event.key)
        assert event.value is not None
        self.replica[event.key] = event.value["seq"]
        return result

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult | None:
        result = self._call("end", scn)
        self.windows[scn] = list(self.current)
        if scn >= self.stop_at and self.client is not None:
            self.client.stop()
        return result

    def on_rollback(self, scn: int) -> CallbackResult | None:
        return self._call("rollback", scn)

    def on_error(self, error: BaseException) -> CallbackResult | None:
        self.errors.append(error)
        return None


def client_for(urls: list[str], recorder: Recorder, **kw: Any) -> DatabusClient:
    kw.setdefault("callback_timeout", 5.0)
    kw.setdefault("backoff_initial", 0.02)
    kw.setdefault("backoff_max", 0.2)
    client = DatabusClient(urls, sources=["synthetic.events"], **kw)
    recorder.client = client
    client.register(recorder)
    return client


async def expected_windows(relay: Any) -> dict[int, list[object]]:
    await relay.wait_for_scn("load", LIMIT)
    windows, _ = await stream_all(relay)
    return {w.scn: [k for _, k, _ in w.events] for w in windows}


async def run_client(client: DatabusClient, timeout: float = 30) -> None:
    await asyncio.wait_for(client.run_async(), timeout)


def test_consumes_every_window_in_order_and_checkpoints(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            store = MemoryCheckpointStore()
            rec = Recorder()
            client = client_for([r.url], rec, checkpoint_store=store)
            await run_client(client)
            assert rec.windows == expected
            starts = [arg for name, arg in rec.trace if name == "start"]
            assert starts == sorted(starts) == list(range(1, LIMIT + 1))
            assert store.load() == Checkpoint(LIMIT)
            assert client.metrics.windows == LIMIT and client.metrics.events == 3 * LIMIT
            assert client.metrics.lag_scn == 0 and client.metrics.lag_ms == 0
            assert "databus_client_events_total" in client.metrics.prometheus_text()
            # A second run resumes after the checkpoint: nothing is delivered again.
            rec2 = Recorder(stop_at=LIMIT + 1)
            client2 = client_for([r.url], rec2, checkpoint_store=store, poll_wait_ms=100)
            with pytest.raises(TimeoutError):
                await run_client(client2, timeout=1.0)
            assert rec2.windows == {}

    asyncio.run(main())


def test_exception_mid_window_rolls_back_and_replays(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            rec = Recorder()
            seen: list[int] = []

            def hook(name: str, arg: Any) -> None:
                if name == "data" and arg.scn == 12 and 12 not in seen:
                    seen.append(12)
                    if len([e for n, e in rec.trace if n == "data" and e.scn == 12]) == 2:
                        raise RuntimeError("consumer bug")
                    seen.remove(12)

            rec.hook = hook  # type: ignore[assignment]
            client = client_for([r.url], rec, checkpoint_store=MemoryCheckpointStore())
            await run_client(client)
            assert rec.windows == expected
            assert ("rollback", 11) in rec.trace
            assert client.metrics.rollbacks == 1
            # Duplicates only inside the replayed window.
            data_scns = [e.scn for n, e in rec.trace if n == "data"]
            assert data_scns.count(12) == 3 + 2
            assert all(data_scns.count(s) == 3 for s in range(1, LIMIT + 1) if s != 12)

    asyncio.run(main())


def test_callback_past_its_budget_counts_as_error(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            rec = Recorder()
            slept: list[int] = []

            def hook(name: str, arg: Any) -> None:
                if name == "data" and arg.scn == 7 and not slept:
                    slept.append(7)
                    time.sleep(1.0)  # far past the 0.3 s budget: abandoned by the watchdog

            rec.hook = hook  # type: ignore[assignment]
            client = client_for([r.url], rec, callback_timeout=0.3)
            await run_client(client)
            assert rec.windows == expected
            assert ("rollback", 6) in rec.trace
            assert client.metrics.rollbacks >= 1

    asyncio.run(main())


def test_error_fatal_stops_and_calls_on_error(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            await r.wait_for_scn("load", LIMIT)
            rec = Recorder()
            rec.hook = lambda name, arg: (CallbackResult.ERROR_FATAL  # type: ignore[assignment]
                                          if name == "end" and arg == 4 else None)
            store = MemoryCheckpointStore()
            client = client_for([r.url], rec, checkpoint_store=store)
            with pytest.raises(Exception, match="ERROR_FATAL"):
                await run_client(client)
            assert len(rec.errors) == 1 and store.load() == Checkpoint(3)

    asyncio.run(main())


def test_retry_budget_exhausted(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            await r.wait_for_scn("load", LIMIT)
            rec = Recorder()
            rec.hook = lambda name, arg: (CallbackResult.ERROR  # type: ignore[assignment]
                                          if name == "end" and arg == 5 else None)
            store = MemoryCheckpointStore()
            client = client_for([r.url], rec, checkpoint_store=store, retry_budget=2)
            with pytest.raises(RetryBudgetExhausted):
                await run_client(client)
            assert client.metrics.rollbacks == 3
            assert store.load() == Checkpoint(4)
            assert isinstance(rec.errors[0], RetryBudgetExhausted)

    asyncio.run(main())


def test_failover_when_the_relay_dies(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path / "a", {"load": SOURCE})) as a, \
                running_relay(relay_config(tmp_path / "b", {"load": SOURCE})) as b:
            expected = await expected_windows(a)
            assert await expected_windows(b) == expected
            rec = Recorder()
            urls = {a.url: a, b.url: b}
            killed: list[str] = []

            async def kill_used_relay() -> None:
                while client.metrics.windows < 10:
                    await asyncio.sleep(0.005)
                # Whichever relay the client was using goes away.
                for url, relay in urls.items():
                    if relay.relay.buffers:
                        relay.relay.close()
                        killed.append(url)
                        return

            rec.hook = lambda name, arg: (time.sleep(0.01) if name == "end" else None)  # type: ignore[assignment,func-returns-value]
            client = client_for(list(urls), rec, max_request_bytes=2000)
            await asyncio.gather(run_client(client), kill_used_relay())
            assert rec.windows == expected
            assert killed

    asyncio.run(main())


class FlakyProxy:
    """Forwards to a relay, but breaks some stream responses: garbage bytes, then a 500."""

    def __init__(self, target: str, faults: list[str]) -> None:
        self.target = target
        self.faults = list(faults)
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        import aiohttp

        async with aiohttp.ClientSession() as session, session.get(
            self.target + request.path_qs
        ) as resp:
            body = await resp.read()
            headers = {k: v for k, v in resp.headers.items() if k.startswith("X-Databus")}
            status = resp.status
        if request.path == "/v1/stream" and body and self.faults:
            fault = self.faults.pop(0)
            if fault == "500":
                return web.json_response({"error": "internal_error", "message": "x"},
                                         status=500)
            corrupted = bytearray(body)
            corrupted[len(corrupted) // 2] ^= 0x40
            body = bytes(corrupted)
        return web.Response(body=body, status=status, headers=headers,
                            content_type="application/x-databus-events"
                            if request.path == "/v1/stream" else "application/json")


def test_garbage_bytes_and_500_from_the_relay(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            proxy = FlakyProxy(r.url, ["crc", "500", "crc"])
            app = web.Application()
            app.router.add_route("GET", "/{tail:.*}", proxy.handle)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            try:
                rec = Recorder()
                # The proxy reads whole responses: long polls (the streaming form of
                # this test is in test_relay_streaming.py).
                client = client_for([url], rec, max_request_bytes=3000, streaming=False)
                await run_client(client)
            finally:
                await runner.cleanup()
            assert rec.windows == expected
            assert not proxy.faults
            data = [e for n, e in rec.trace if n == "data"]
            assert len(data) == 3 * LIMIT  # bad bodies were never delivered

    asyncio.run(main())


def test_relay_unreachable_at_start(tmp_path: Path) -> None:
    async def main() -> None:
        port = free_port()
        config = relay_config(tmp_path, {"load": SOURCE})
        rec = Recorder()
        client = client_for([f"http://127.0.0.1:{port}"], rec)
        task = asyncio.create_task(run_client(client))
        await asyncio.sleep(0.5)  # the client keeps retrying, it does not crash
        assert not task.done()
        from dataclasses import replace

        from databus.relay._relay import Relay
        from databus.relay._server import create_app

        runner = web.AppRunner(create_app(Relay(replace(config, port=port))))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            await task
        finally:
            await runner.cleanup()
        assert sorted(rec.windows) == list(range(1, LIMIT + 1))

    asyncio.run(main())


def test_fell_off_the_relay(tmp_path: Path) -> None:
    source = "synthetic://?rate=0&event_bytes=2500&events_per_window=4&limit=400&seed=2"

    async def main() -> None:
        config = relay_config(tmp_path, {"load": source}, capacity_mb=1)
        async with running_relay(config) as r:
            await r.wait_for_scn("load", 400)
            store = MemoryCheckpointStore()
            store.store(Checkpoint(1))
            rec = Recorder()
            client = client_for([r.url], rec, checkpoint_store=store)
            with pytest.raises(FellOffRelay, match="bootstrap"):
                await run_client(client)
            assert isinstance(rec.errors[0], FellOffRelay)

    asyncio.run(main())


def test_corrupted_checkpoint_file_is_a_clear_error(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            store = FileCheckpointStore(tmp_path / "cp")
            store.store(Checkpoint(5))
            path = next((tmp_path / "cp").glob("*.json"))
            path.write_text(path.read_text()[:-7])
            rec = Recorder()
            client = client_for([r.url], rec, checkpoint_store=store)
            with pytest.raises(CheckpointError):
                await run_client(client)
            assert rec.windows == {}  # never a silent restart from zero

    asyncio.run(main())


def test_windows_iterator(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            store = MemoryCheckpointStore()
            client = DatabusClient([r.url], sources=["synthetic.events"],
                                   checkpoint_store=store)
            got: dict[int, list[object]] = {}
            async with contextlib.aclosing(client.windows()) as windows:
                async for window in windows:
                    got[window.scn] = [e.key for e in window.events]
                    if window.scn == 20:
                        break
            assert got == {s: expected[s] for s in range(1, 21)}
            assert store.load() in (Checkpoint(19), Checkpoint(20))

    asyncio.run(main())


def test_reader_schema_and_parallel_workers(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            writer = (await r.json("/v1/schemas", source="synthetic.events"))["versions"][0]
            fields = [f for f in writer["schema"]["fields"] if f["name"] in ("id", "seq")]
            reader = Schema({**writer["schema"], "fields": fields})
            rec = Recorder()
            client = client_for([r.url], rec, reader_schemas={"synthetic.events": reader},
                                parallelism=4)
            await run_client(client)
            assert {k: sorted(v) for k, v in rec.windows.items()} == {  # type: ignore[type-var]
                k: sorted(v) for k, v in expected.items()  # type: ignore[type-var]
            }
            values = [e.value for n, e in rec.trace if n == "data"]
            assert all(set(v) == {"id", "seq"} for v in values)
            assert all(e.schema == reader for n, e in rec.trace if n == "data")

    asyncio.run(main())


def test_timeout_error_type_is_retriable() -> None:
    assert CallbackTimeout("x").retriable
    assert json.loads(Checkpoint(3).dumps())["window_scn"] == 3
