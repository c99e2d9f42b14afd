"""The bootstrap service end to end over HTTP, on both stores: a synthetic relay, the
producer and applier writing, and raw stream requests read back into a replica.

The replica is compared with the state the relay's own stream gives at the target SCN,
so a lost, repeated-out-of-order or half-applied transaction shows as a difference.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from databus.bootstrap._service import build_app, open_configured_storage
from databus.bootstrap._storage import BootstrapStorage
from databus.config import BootstrapConfig, from_mapping
from databus.event import Op, decode_event, iter_events
from databus.filters import FilterSpec
from tests.integration.bootstrap_support import BACKENDS, drop_schema, storage_url
from tests.relay_harness import RunningRelay, relay_config, running_relay
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

SOURCES = "shop.a,shop.b"

State = dict[tuple[str, object], bytes]


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body on a fresh event loop (pytest sees the same signature)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))
    return wrapper


@dataclass
class Service:
    url: str
    storage: BootstrapStorage
    session: aiohttp.ClientSession

    async def status(self) -> dict[str, Any]:
        async with self.session.get(self.url + "/v1/status") as resp:
            return dict(await resp.json())

    async def wait_applied(self, scn: int, timeout: float = 60) -> None:
        async def reached() -> bool:
            applied = (await self.status())["applied_scn"]
            return applied is not None and applied >= scn

        await async_wait_until(reached, f"the applier at SCN {scn}", timeout,
                               max_interval=0.1)


@asynccontextmanager
async def bootstrap_service(url: str, relay: RunningRelay, **extra: Any
                            ) -> AsyncIterator[Service]:
    data: dict[str, Any] = {"storage": url, "port": 0,
                            "producer": {"relays": [relay.url], "poll_wait_ms": 100,
                                         "max_bytes": 64 * 1024},
                            "applier": {"batch_rows": 97, "poll_interval_ms": 20},
                            "server": {"batch_rows": 50}}
    for key, value in extra.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    config = from_mapping(BootstrapConfig, data)
    storage = open_configured_storage(config)
    runner = web.AppRunner(build_app(config, storage))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Service(f"http://127.0.0.1:{port}", storage, relay.session)
    finally:
        await runner.cleanup()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = storage_url(request.param, tmp_path, request, span=100)
    yield url
    if request.param == "postgresql":
        drop_schema(request.getfixturevalue("postgres_server"), url)


def apply_body(state: State, body: bytes, names: dict[int, str],
               spec: FilterSpec | None = None) -> int:
    """Apply a stream body's data events to ``state``; returns how many."""
    n = 0
    for offset, header in iter_events(body):
        if header.is_control:
            continue
        event = decode_event(body, offset)
        name = names[header.source_id]
        if spec is not None:
            assert spec.passes(name, header.partition_key, event.key_bytes)
        if header.op is Op.DELETE:
            state.pop((name, event.key), None)
        else:
            state[(name, event.key)] = event.value
        n += 1
    return n


async def relay_state(relay: RunningRelay, upto: int, *, since: int = 0, start: State | None = None
                      ) -> State:
    """The source state after window ``upto``, from the relay's stream."""
    state: State = dict(start or {})
    names = {s["id"]: s["name"] for s in (await relay.json("/v1/sources"))["sources"]}
    cp = json.dumps({"window_scn": since})
    while True:
        async with await relay.get("/v1/stream", checkpoint=cp, max_bytes=1 << 20) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.read()
            cp = resp.headers["X-Databus-Checkpoint"]
        if not body:
            return state
        keep = bytearray()
        for offset, header in iter_events(body):
            if header.scn <= upto:
                keep += body[offset:offset + header.total_length]
        apply_body(state, bytes(keep), names)
        if json.loads(cp)["window_scn"] >= upto:
            return state


async def bootstrap_into(service: Service, state: State, checkpoint: dict[str, Any], *,
                         sources: str = SOURCES, filter: FilterSpec | None = None,
                         max_bytes: int = 20_000) -> tuple[dict[str, Any], list[str], str]:
    """Run a bootstrap conversation to the end; returns the final checkpoint, the phases
    seen and the strategy the server chose."""
    async with service.session.get(service.url + "/v1/bootstrap/sources") as resp:
        names = {s["id"]: s["name"] for s in (await resp.json())["sources"]}
    cp = json.dumps(checkpoint)
    phases: list[str] = []
    strategy = ""
    for _ in range(10_000):
        params = {"checkpoint": cp, "max_bytes": str(max_bytes)}
        if sources:
            params["sources"] = sources
        if filter is not None:
            params["filter"] = filter.to_json_text()
        async with service.session.get(service.url + "/v1/bootstrap/stream",
                                       params=params) as resp:
            if resp.status == 503:  # retriable, as a client does: same checkpoint
                await asyncio.sleep(0.1)
                continue
            assert resp.status == 200, await resp.text()
            body = await resp.read()
            cp = resp.headers["X-Databus-Checkpoint"]
            phase = resp.headers["X-Databus-Bootstrap-Phase"]
            strategy = resp.headers.get("X-Databus-Bootstrap-Strategy", strategy)
        apply_body(state, body, names, filter)
        phases.append(phase)
        if phase == "done":
            return json.loads(cp), phases, strategy
    raise AssertionError("the bootstrap never finished")


def synthetic(limit: int, rate: int = 0, **params: Any) -> str:
    query = {"rate": rate, "keys": 300, "event_bytes": 120, "events_per_window": 3,
             "update_ratio": 0.6, "delete_ratio": 0.1, "limit": limit, "source": SOURCES,
             **params}
    return "synthetic://?" + "&".join(f"{k}={v}" for k, v in query.items())


@sync
async def test_full_snapshot_and_both_delta_strategies_give_the_source_state(
        store_url: str, tmp_path: Path) -> None:
    async with running_relay(relay_config(tmp_path, {"shop": synthetic(400)})) as relay:
        await relay.wait_for_scn("shop", 400)
        async with bootstrap_service(store_url, relay) as service:
            await service.wait_applied(400)
            expected = await relay_state(relay, 400)
            assert len(expected) > 100

            state: State = {}
            final, phases, strategy = await bootstrap_into(service, state, {"window_scn": -1})
            assert final == {"mode": "online", "window_scn": 400, "window_offset": -1}
            assert strategy == "snapshot" and phases[0] == "snapshot" and len(phases) >= 3
            assert state == expected

            at_150 = await relay_state(relay, 150)
            for forced in ("snapshot", "log"):
                service_state = dict(at_150)
                boot = service_state
                async with bootstrap_service(store_url, relay, run=["server"],
                                             server={"strategy": forced}) as reader:
                    final, _, strategy = await bootstrap_into(reader, boot,
                                                              {"window_scn": 150})
                assert strategy == forced
                assert final["window_scn"] == 400
                assert boot == expected, forced


@sync
async def test_a_bootstrap_during_writes_ends_consistent_at_its_target(
        store_url: str, tmp_path: Path) -> None:
    async with running_relay(relay_config(tmp_path, {"shop": synthetic(3000, rate=1500)})
                             ) as relay, bootstrap_service(store_url, relay) as service:
        await service.wait_applied(300)
        state: State = {}
        # Small responses: the bootstrap takes many requests while writes go on.
        final, _phases, _ = await bootstrap_into(service, state, {"window_scn": -1},
                                                max_bytes=3000)
        target = final["window_scn"]
        assert target > 300
        await relay.wait_for_scn("shop", target)
        assert state == await relay_state(relay, target)
        # A consumer with state, later: delta since that target.
        await service.wait_applied(3000)
        final, _, _ = await bootstrap_into(service, state, {"window_scn": target})
        assert final["window_scn"] == 3000
        assert state == await relay_state(relay, 3000)


@sync
async def test_pushed_down_filters_select_what_the_relay_filter_selects(
        store_url: str, tmp_path: Path) -> None:
    spec = FilterSpec.parse({"shop.a": {"type": "mod", "n": 3, "buckets": [1]},
                             "shop.b": {"type": "hash", "n": 4, "buckets": [0, 3]}})
    async with running_relay(relay_config(tmp_path, {"shop": synthetic(300)})) as relay:
        await relay.wait_for_scn("shop", 300)
        async with bootstrap_service(store_url, relay) as service:
            await service.wait_applied(300)
            state: State = {}
            await bootstrap_into(service, state, {"window_scn": -1}, filter=spec)
            # The relay's filtered stream, applied from the start, gives the same rows.
            names = {s["id"]: s["name"] for s in (await relay.json("/v1/sources"))["sources"]}
            relay_filtered: State = {}
            cp = json.dumps({"window_scn": 0})
            while True:
                async with await relay.get("/v1/stream", checkpoint=cp,
                                           filter=spec.to_json_text()) as resp:
                    body = await resp.read()
                    cp = resp.headers["X-Databus-Checkpoint"]
                if not body:
                    break
                apply_body(relay_filtered, body, names, spec)
            assert state == relay_filtered and len(state) > 0
            full: State = {}
            await bootstrap_into(service, full, {"window_scn": -1})
            assert len(state) < len(full)


@sync
async def test_errors_are_json_with_their_codes(store_url: str, tmp_path: Path) -> None:
    async with running_relay(relay_config(tmp_path, {"shop": synthetic(200)})) as relay:
        await relay.wait_for_scn("shop", 200)
        async with bootstrap_service(store_url, relay) as service:
            await service.wait_applied(200)
            get = service.session.get
            stream = service.url + "/v1/bootstrap/stream"

            async def error(params: dict[str, str]) -> tuple[int, dict[str, Any]]:
                async with get(stream, params=params) as resp:
                    return resp.status, await resp.json()

            status, body = await error({"checkpoint": "{nope", "sources": SOURCES})
            assert (status, body["error"]) == (400, "bad_request")
            status, body = await error({"checkpoint": '{"window_scn": -1}',
                                        "sources": "shop.zzz"})
            assert (status, body["error"]) == (404, "unknown_source")
            status, body = await error({"checkpoint": '{"window_scn": -1}',
                                        "filter": '{"shop.a": {"type": "mod"}}'})
            assert (status, body["error"]) == (400, "bad_request")
            # Issue 12, defect 4: numbers beyond int64 never reach SQL (OverflowError on
            # SQLite, DataError on PostgreSQL), and bad_event is not an answer here.
            snapshot = {"mode": "bootstrap_snapshot", "window_scn": 3, "bootstrap_start_scn": 5,
                        "bootstrap_source_index": 0, "bootstrap_since_scn": 3}
            catchup = {"mode": "bootstrap_catchup", "window_scn": 5, "bootstrap_start_scn": 5,
                       "bootstrap_target_scn": 10, "bootstrap_source_index": 0}
            for cp in ({"window_scn": 2**63}, {"window_scn": 10**30},
                       {**snapshot, "bootstrap_since_scn": 2**64},
                       {**catchup, "bootstrap_target_scn": 2**64},
                       {**snapshot, "bootstrap_last_key": f"{2**70}:00"},
                       {**snapshot, "bootstrap_start_scn": 2**64}):
                status, body = await error({"checkpoint": json.dumps(cp), "sources": SOURCES})
                assert (status, body["error"]) == (400, "bad_request"), cp
            # Defect 5: a filter on a source the store does not have, as on the relay.
            status, body = await error({"checkpoint": '{"window_scn": -1}', "sources": SOURCES,
                                        "filter": '{"shop.zzz": {"type": "mod", "n": 2, '
                                                  '"buckets": "[0]"}}'})
            assert (status, body["error"]) == (404, "unknown_source")
            # Retention moves the floor to 99 (PostgreSQL: whole partitions of 100 SCNs)
            # or 150 (SQLite): a consumer at 50 is too old.
            result = await asyncio.to_thread(service.storage.retain, cut_scn=150)
            floor = result.log_floor_scn
            assert floor in (99, 150)
            status, body = await error({"checkpoint": '{"window_scn": 50}'})
            assert (status, body["error"]) == (410, "bootstrap_too_old")
            assert body["log_floor_scn"] == floor and "full snapshot" in body["message"]
            async with get(service.url + "/v1/bootstrap/schemas/0000000000000001") as resp:
                assert resp.status == 404
            async with get(service.url + "/metrics") as resp:
                text = await resp.text()
            assert "databus_bootstrap_applied_scn 200" in text
            doc = await service.status()
            assert doc["producer_scn"] == 200 and doc["applier_lag_scn"] == 0
            # Lag in seconds (DESIGN 17): the snapshot has the log's newest window.
            assert doc["applier_lag_seconds"] == 0.0
            assert "databus_bootstrap_applier_lag_seconds 0.0" in text
            assert set(doc["components"]) == {"producer", "applier"}
            async with service.session.post(service.url + "/v1/admin/retain") as resp:
                assert resp.status == 403


@sync
async def test_a_hash_filter_on_a_store_without_key_hashes_is_not_a_full_scan(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nohash.db'}"
    async with running_relay(relay_config(tmp_path, {"shop": synthetic(50)})) as relay:
        await relay.wait_for_scn("shop", 50)
        async with bootstrap_service(url, relay, key_hash=False) as service:
            await service.wait_applied(50)
            params = {"checkpoint": '{"window_scn": -1}',
                      "filter": '{"shop.a": {"type": "hash", "n": 2, "buckets": [0]}}'}
            async with service.session.get(service.url + "/v1/bootstrap/stream",
                                           params=params) as resp:
                assert resp.status == 400
                body = await resp.json()
            assert body["error"] == "filter_not_pushable"
            assert "key_hash" in body["message"] or "hash" in body["message"]


@sync
async def test_postgres_restarted_mid_snapshot_then_the_same_checkpoint_resumes(
        postgres_server: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = storage_url("postgresql", tmp_path, request, span=100)
    try:
        async with running_relay(relay_config(tmp_path, {"shop": synthetic(300)})) as relay:
            await relay.wait_for_scn("shop", 300)
            async with bootstrap_service(url, relay) as service:
                await service.wait_applied(300)
                expected = await relay_state(relay, 300)
                async with service.session.get(service.url + "/v1/bootstrap/sources") as resp:
                    names = {s["id"]: s["name"] for s in (await resp.json())["sources"]}
                stream = service.url + "/v1/bootstrap/stream"
                state: State = {}
                params = {"checkpoint": '{"window_scn": -1}', "max_bytes": "2000"}
                async with service.session.get(stream, params=params) as resp:
                    assert resp.status == 200
                    apply_body(state, await resp.read(), names)
                    cp = resp.headers["X-Databus-Checkpoint"]
                assert json.loads(cp)["bootstrap_last_key"]
                await asyncio.to_thread(postgres_server.kill)
                try:
                    async with service.session.get(stream, params={**params, "checkpoint": cp}
                                                   ) as resp:
                        assert resp.status == 503
                        body = await resp.json()
                    assert body["error"] == "storage_unavailable"
                finally:
                    await asyncio.to_thread(postgres_server.start)
                # The same checkpoint, once the database is back: the read goes on from
                # the last key served, and ends with the source state.
                final, _, _ = await bootstrap_into(
                    service, state, json.loads(cp), sources="")
                assert final["window_scn"] == 300
                assert state == expected
    finally:
        drop_schema(postgres_server, url)


@sync
async def test_a_client_reading_a_snapshot_survives_a_postgres_restart_and_resumes_by_key(
        postgres_server: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore

    url = storage_url("postgresql", tmp_path, request, span=100)

    class Keeper(Consumer):
        def __init__(self) -> None:
            self.state: State = {}
            self.snapshot_deliveries: dict[tuple[str, object], int] = {}
            self.restarted = False
            self.bootstrap_windows = 0
            self.bootstrap_ended = False

        def on_end_bootstrap(self) -> None:
            self.bootstrap_ended = True

        def on_data_event(self, event: DataEvent) -> None:
            key = (event.source, event.key)
            if event.from_bootstrap:
                self.snapshot_deliveries[key] = self.snapshot_deliveries.get(key, 0) + 1
            if event.is_delete:
                self.state.pop(key, None)
            else:
                assert event.value is not None
                self.state[key] = event.value["payload"]

        def on_end_data_event_sequence(self, scn: int) -> None:
            self.bootstrap_windows += 1
            if not self.restarted and self.bootstrap_windows == 2:
                # Mid-snapshot: the database goes away under the service and comes back.
                self.restarted = True
                postgres_server.restart(crash=True)

    try:
        async with running_relay(relay_config(tmp_path, {"shop": synthetic(300)})) as relay:
            await relay.wait_for_scn("shop", 300)
            async with bootstrap_service(url, relay) as service:
                await service.wait_applied(300)
                keeper = Keeper()
                client = DatabusClient([relay.url], bootstrap=[service.url],
                                       sources=SOURCES.split(","),
                                       checkpoint_store=MemoryCheckpointStore(),
                                       max_request_bytes=3000, poll_wait_ms=100,
                                       backoff_initial=0.05, backoff_max=0.5)
                client.register(keeper)
                task = asyncio.create_task(client.run_async())
                deadline = asyncio.get_running_loop().time() + 60
                # Done when the consumer got the end of the bootstrap and window 300: the
                # metrics say "not bootstrapping" once the last answer is fetched, which
                # may be before its rows reach the consumer (a loaded machine).
                while (client.metrics.consumer_scn != 300 or client.metrics.bootstrapping
                       or not keeper.bootstrap_ended):
                    assert asyncio.get_running_loop().time() < deadline, client.metrics
                    if task.done():
                        task.result()
                    await asyncio.sleep(0.05)
                client.stop()
                await asyncio.wait_for(task, 30)
                assert keeper.restarted
                # The replica holds the payloads; compare with the relay's state.
                expected = await relay_state(relay, 300)
                decoded = {k: v for k, v in keeper.state.items()}
                assert set(decoded) == set(expected)
                # Resumed by key: at most the rows of one batch were delivered twice,
                # never the snapshot from its start.
                repeats = sum(n - 1 for n in keeper.snapshot_deliveries.values())
                assert repeats < 40, repeats
    finally:
        drop_schema(postgres_server, url)
