"""Consumers at the relay's serving tier: the registry's bookkeeping on a fake clock, and
``GET /v1/consumers`` and the per-consumer ``/metrics`` against a real relay."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from databus.checkpoint import Checkpoint
from databus.client import Consumer, DatabusClient, MemoryCheckpointStore
from databus.relay._consumers import ConsumerRegistry
from tests.relay_harness import RunningRelay, relay_config, running_relay, stream_all

LOAD = "synthetic://?rate=0&keys=1000&event_bytes=300&events_per_window=3&limit=40&seed=1"
EVENS = json.dumps({"synthetic.events": {"type": "mod", "n": 2, "buckets": "[0]"}})
ODDS = json.dumps({"synthetic.events": {"type": "mod", "n": 2, "buckets": "[1]"}})


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def registry(clock: Clock, **kw: Any) -> ConsumerRegistry:
    # The wall clock is the monotonic one plus an offset: first/last seen are checkable.
    return ConsumerRegistry(clock=clock, wall_clock=lambda: clock.now + 1e9, **kw)


def observe(reg: ConsumerRegistry, client_id: str, scn: int, offset: int = -1, *,
            buffer: str = "b", events: int = 0, nbytes: int = 0, **kw: Any) -> None:
    args: dict[str, Any] = dict(filter_json=None, sources=(), address="10.0.0.1:5555",
                                streaming=False)
    args.update(kw)
    reg.observe(client_id, buffer=buffer, checkpoint=Checkpoint(scn, offset), events=events,
                nbytes=nbytes, **args)


def by_id(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["client_id"]: d for d in docs}


# -- the registry ---------------------------------------------------------------------


def test_lag_in_scn_and_ms_runs_from_the_first_window_not_served() -> None:
    clock = Clock(100.0)
    reg = registry(clock)
    for scn in range(1, 6):  # window n lands at 100 + n - 1
        clock.now = 100.0 + scn - 1
        reg.window_landed("b", scn)
    clock.now = 105.0
    observe(reg, "behind", 2)
    observe(reg, "caught-up", 5)
    observe(reg, "mid-window", 4, 1)  # one event of window 4 served
    observe(reg, "mid-newest", 5, 0)
    clock.now = 110.0
    got = by_id(reg.snapshot({"b": 5}))
    assert (got["behind"]["lag_scn"], got["behind"]["lag_ms"]) == (3, 8000.0)  # window 3
    assert (got["caught-up"]["lag_scn"], got["caught-up"]["lag_ms"]) == (0, 0.0)
    # A partial window is not served yet: its own landing time counts.
    assert (got["mid-window"]["lag_scn"], got["mid-window"]["lag_ms"]) == (1, 7000.0)
    assert got["mid-window"]["window_offset"] == 1
    assert got["mid-window"]["checkpoint_scn"] == 4
    assert (got["mid-newest"]["lag_scn"], got["mid-newest"]["lag_ms"]) == (0, 6000.0)
    # An empty buffer (max None) or one the caller does not know: nothing to lag behind.
    assert {d["lag_scn"] for d in reg.snapshot({"b": None})} == {0}
    assert {d["lag_ms"] for d in reg.snapshot({})} == {0.0}


def test_windows_landing_together_share_a_record_and_in_flight_windows_lag_zero() -> None:
    clock = Clock(0.0)
    reg = registry(clock)
    reg.window_landed("b", 10)
    clock.now = 0.004  # within 10 ms: same record, landed "at 0"
    reg.window_landed("b", 11)
    clock.now = 0.5
    reg.window_landed("b", 12)
    observe(reg, "c", 10)
    clock.now = 2.0
    assert reg.snapshot({"b": 12})[0]["lag_ms"] == 2000.0
    observe(reg, "c", 11)
    assert reg.snapshot({"b": 12})[0]["lag_ms"] == 1500.0
    # Window 13 is published (the buffer says so) but its listener has not run yet.
    observe(reg, "c", 12)
    assert reg.snapshot({"b": 13})[0]["lag_scn"] == 1
    assert reg.snapshot({"b": 13})[0]["lag_ms"] == 0.0


def test_landing_records_are_bounded_and_lag_beyond_them_is_a_lower_bound() -> None:
    clock = Clock(0.0)
    reg = registry(clock, landing_records=4)
    # Windows the buffer held at start are recorded as landed then.
    reg.window_landed("b", 50)
    for i, scn in enumerate(range(51, 61), start=1):
        clock.now = float(i)
        reg.window_landed("b", scn)
    clock.now = 20.0
    observe(reg, "recent", 58)
    observe(reg, "old", 10)
    got = by_id(reg.snapshot({"b": 60}))
    assert got["recent"]["lag_ms"] == (20.0 - 9.0) * 1000  # window 59 landed at 9
    # Records kept: windows 57..60; 56 was the last dropped (landed at 6). Window 11
    # waited longer (since 0): lag_ms says at least 14 s.
    assert got["old"]["lag_ms"] == 14000.0
    assert got["old"]["lag_scn"] == 50
    # Many more windows: the records stay bounded.
    for scn in range(61, 5000):
        clock.now += 1
        reg.window_landed("b", scn)
    landings = reg._landings["b"]
    assert len(landings._last) - landings._head == 4 and len(landings._last) < 2100


def test_a_restart_holds_old_windows_as_landed_at_start() -> None:
    clock = Clock(0.0)
    reg = registry(clock)
    reg.window_landed("b", 50)  # what lifecycle does for a buffer holding windows
    clock.now = 3.0
    reg.window_landed("b", 51)
    observe(reg, "c", 10)
    clock.now = 5.0
    assert reg.snapshot({"b": 51})[0]["lag_ms"] == 5000.0


def test_rates_are_over_the_last_ten_seconds() -> None:
    clock = Clock(0.0)
    reg = registry(clock)
    for step in range(300):  # 10 events / 1,000 bytes every 0.1 s for 30 s
        clock.now = step / 10
        observe(reg, "c", step, events=10, nbytes=1000)
    clock.now = 30.0
    doc = reg.snapshot({"b": 299})[0]
    assert doc["events_per_second"] == pytest.approx(100, rel=0.05)
    assert doc["bytes_per_second"] == pytest.approx(10_000, rel=0.05)
    assert (doc["events_total"], doc["bytes_total"]) == (3000, 300_000)
    clock.now = 41.0  # idle for 11 s: nothing in the window
    doc = reg.snapshot({"b": 299})[0]
    assert (doc["events_per_second"], doc["bytes_per_second"]) == (0.0, 0.0)
    assert doc["idle_s"] == pytest.approx(11.1)
    # A new consumer: its rate is over the time since it was first seen, at least 1 s.
    observe(reg, "new", 1, events=50, nbytes=500)
    clock.now = 41.5
    assert by_id(reg.snapshot({}))["new"]["events_per_second"] == 50.0
    observe(reg, "new", 2, events=50, nbytes=500)
    clock.now = 43.0
    assert by_id(reg.snapshot({}))["new"]["events_per_second"] == 50.0  # 100 in 2 s


def test_entries_expire_after_inactivity() -> None:
    clock = Clock(0.0)
    reg = registry(clock, expiry_s=300)
    observe(reg, "a", 1)
    clock.now = 200.0
    observe(reg, "b", 1)
    clock.now = 300.0
    assert [d["client_id"] for d in reg.snapshot({})] == ["a", "b"]
    clock.now = 300.5
    assert [d["client_id"] for d in reg.snapshot({})] == ["b"]
    observe(reg, "b", 2)  # seen again: its idle time starts over
    clock.now = 600.0
    assert [d["client_id"] for d in reg.snapshot({})] == ["b"]
    clock.now = 601.0
    assert reg.snapshot({}) == [] and len(reg) == 0
    assert reg.evicted_total == 0  # expiry is not eviction


def test_the_least_recently_seen_is_evicted_at_the_bound() -> None:
    clock = Clock(0.0)
    reg = registry(clock, max_consumers=3)
    for i, name in enumerate(["a", "b", "c"]):
        clock.now = float(i)
        observe(reg, name, 1)
    clock.now = 3.0
    observe(reg, "a", 2)  # a is now the most recently seen; b the least
    clock.now = 4.0
    observe(reg, "d", 1)
    assert [d["client_id"] for d in reg.snapshot({})] == ["a", "c", "d"]
    assert reg.evicted_total == 1
    for i in range(100):
        observe(reg, f"flood-{i:03}", 1)
    assert len(reg) == 3 and reg.evicted_total == 101
    assert [d["client_id"] for d in reg.snapshot({})] == ["flood-097", "flood-098",
                                                         "flood-099"]
    off = registry(clock, max_consumers=0)  # tracking off
    observe(off, "a", 1)
    assert off.snapshot({}) == [] and off.evicted_total == 0


def test_an_entry_shows_what_was_served_and_to_whom() -> None:
    clock = Clock(50.0)
    reg = registry(clock)
    observe(reg, "c", 7, 2, events=3, nbytes=300, filter_json=EVENS,
            sources=("synthetic.events",), address="[::1]:4242", streaming=True)
    clock.now = 52.5
    observe(reg, "c", 9, events=1, nbytes=100, filter_json=EVENS,
            sources=("synthetic.events",), address="[::1]:4243", streaming=True)
    observe(reg, "c", 9, buffer="other")  # the same id on another buffer: its own entry
    clock.now = 53.0
    docs = reg.snapshot({"b": 9, "other": 9})
    assert [(d["client_id"], d["buffer"]) for d in docs] == [("c", "b"), ("c", "other")]
    doc = docs[0]
    assert doc == {
        "client_id": "c", "buffer": "b", "reader": "anonymous", "address": "[::1]:4243",
        "filter": json.loads(EVENS), "sources": ["synthetic.events"], "streaming": True,
        "checkpoint_scn": 9, "window_offset": -1, "lag_scn": 0, "lag_ms": 0.0,
        "lag_seconds": 0.0,
        "events_per_second": 1.333, "bytes_per_second": 133.333,  # over 3 s, rounded
        "events_total": 4, "bytes_total": 400,
        "first_seen": 50.0 + 1e9, "last_seen": 52.5 + 1e9, "idle_s": 0.5,
    }
    assert docs[1]["filter"] is None and docs[1]["events_total"] == 0


def test_the_registry_is_safe_from_several_threads() -> None:
    reg = ConsumerRegistry(max_consumers=50)
    errors: list[BaseException] = []

    def writer(buffer: str) -> None:
        try:
            for scn in range(1, 5000):
                reg.window_landed(buffer, scn)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader(n: int) -> None:
        try:
            for i in range(2000):
                observe(reg, f"c{n}-{i % 80}", i, buffer=f"b{i % 2}")
                if i % 50 == 0:
                    reg.snapshot({"b0": 4999, "b1": 4999})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"b{i}",)) for i in range(2)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(reg) == 50 and len(reg.snapshot({})) == 50


# -- over HTTP ------------------------------------------------------------------------


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def consumers(r: RunningRelay) -> dict[str, Any]:
    doc: dict[str, Any] = await r.json("/v1/consumers")
    return doc


async def metric_families(r: RunningRelay) -> dict[str, Any]:
    async with await r.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_consumers_lists_each_client_id_with_its_filter_and_lag(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            assert await consumers(r) == {"consumers": [], "tracked": 0, "max_tracked": 1000,
                                          "expiry_s": 300.0, "evicted_total": 0}
            evens, _ = await stream_all(r, client_id="indexer-1", filter=EVENS,
                                        sources="synthetic.events")
            odds, _ = await stream_all(r, client_id="cache", filter=ODDS)
            # A third consumer, 30 windows behind.
            async with await r.get("/v1/stream", client_id="slow",
                                   checkpoint=json.dumps({"window_scn": 5}),
                                   max_bytes=2000) as resp:
                assert resp.status == 200
                slow_cp = json.loads(resp.headers["X-Databus-Checkpoint"])
            doc = await consumers(r)
            assert doc["tracked"] == 3 and doc["evicted_total"] == 0
            got = by_id(doc["consumers"])
            assert [c["client_id"] for c in doc["consumers"]] == ["cache", "indexer-1", "slow"]
            one, cache, slow = got["indexer-1"], got["cache"], got["slow"]
            assert one["filter"] == json.loads(EVENS) and cache["filter"] == json.loads(ODDS)
            assert one["sources"] == ["synthetic.events"] and cache["sources"] == []
            for c in (one, cache):
                assert c["buffer"] == "load" and c["streaming"] is False
                assert (c["checkpoint_scn"], c["window_offset"]) == (40, -1)
                assert (c["lag_scn"], c["lag_ms"]) == (0, 0.0)
                assert c["address"].startswith("127.0.0.1:")
                assert c["first_seen"] <= c["last_seen"] and c["idle_s"] >= 0
            assert one["events_total"] == sum(len(w.events) for w in evens)
            assert cache["events_total"] == sum(len(w.events) for w in odds)
            assert one["events_total"] + cache["events_total"] == 120
            assert one["bytes_total"] > 0 and one["events_per_second"] > 0
            assert slow["checkpoint_scn"] == slow_cp["window_scn"] < 40
            assert slow["window_offset"] == slow_cp["window_offset"]
            assert slow["lag_scn"] == 40 - slow_cp["window_scn"] and slow["lag_ms"] > 0
            # A request without a client_id is tracked under its address.
            await stream_all(r)
            ids = [c["client_id"] for c in (await consumers(r))["consumers"]]
            assert "anonymous@127.0.0.1" in ids
            families = await metric_families(r)
            lag = {s.labels["client_id"]: s.value
                   for s in families["databus_relay_consumer_lag_scn"].samples}
            assert lag["slow"] == slow["lag_scn"] and lag["cache"] == 0
            assert {s.labels["buffer"] for s in
                    families["databus_relay_consumer_events_per_second"].samples} == {"load"}
            assert families["databus_relay_consumers_tracked"].samples[0].value == 4

    run(main())


HOSTILE_ID = 'a"b\\c\nd}{e="f",\u00e9\u2603\U0001f600\r\t\x00 # TYPE x gauge'


def test_a_hostile_client_id_cannot_break_the_metrics_page(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            await stream_all(r, client_id=HOSTILE_ID, checkpoint=json.dumps({"window_scn": 30}))
            listed = (await consumers(r))["consumers"]
            assert [c["client_id"] for c in listed] == [HOSTILE_ID]
            families = await metric_families(r)
            for name in ("lag_ms", "lag_scn", "events_per_second"):
                samples = families[f"databus_relay_consumer_{name}"].samples
                assert [s.labels for s in samples] == [{"client_id": HOSTILE_ID,
                                                        "buffer": "load",
                                                        "reader": "anonymous"}]
            # Nothing the id holds made a family or a sample of its own.
            assert "x" not in families
            assert families["databus_relay_buffer_max_scn"].samples[0].value == 40
            # The other families are all still there, under the names they always had.
            names = {s.name for f in families.values() for s in f.samples}
            assert {"databus_relay_http_requests_total", "databus_relay_stream_bytes_total",
                    "databus_relay_stream_events_total", "databus_relay_long_polls",
                    "databus_relay_fetcher_restarts_total", "databus_relay_dumps_active",
                    "databus_relay_consumers_tracked",
                    "databus_relay_consumers_evicted_total"} <= names

    run(main())


def test_client_id_is_bounded_and_given_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            for params in ({"client_id": "x" * 257}, {"client_id": "y" * 1000}):
                async with await r.get("/v1/stream", **params) as resp:
                    assert resp.status == 400
                    body = await resp.json()
                    assert body["error"] == "bad_request" and "client_id" in body["message"]
            async with r.session.get(r.url + "/v1/stream?client_id=a&client_id=b") as resp:
                assert resp.status == 400
                assert (await resp.json())["error"] == "bad_request"
            async with await r.get("/v1/stream", client_id="z" * 256) as resp:
                assert resp.status == 200
            assert [c["client_id"] for c in (await consumers(r))["consumers"]] == ["z" * 256]

    run(main())


def test_the_bound_and_evictions_show_in_consumers_and_metrics(tmp_path: Path) -> None:
    config = relay_config(tmp_path, {"load": LOAD}, max_tracked_consumers=2)
    assert config.consumer_expiry_s == 300.0

    async def main() -> None:
        async with running_relay(config) as r:
            await r.wait_for_scn("load", 40)
            for client_id in ("a", "b", "c"):
                await stream_all(r, client_id=client_id)
            doc = await consumers(r)
            assert [c["client_id"] for c in doc["consumers"]] == ["b", "c"]
            assert (doc["tracked"], doc["max_tracked"], doc["evicted_total"]) == (2, 2, 1)
            families = await metric_families(r)
            assert families["databus_relay_consumers_evicted"].samples[0].value == 1
            assert families["databus_relay_consumers_tracked"].samples[0].value == 2

    run(main())


def test_the_client_library_sends_its_client_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            for client_id in (None, "billing-indexer"):
                client = DatabusClient([r.url], sources=["synthetic.events"],
                                       checkpoint_store=MemoryCheckpointStore(),
                                       name="my-app", client_id=client_id,
                                       poll_wait_ms=50)
                client.register(Consumer())
                task = asyncio.create_task(client.run_async())
                deadline = time.monotonic() + 20
                while client.metrics.consumer_scn != 40 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                client.stop()
                await task
                assert client.metrics.consumer_scn == 40
            expected = f"my-app@{socket.gethostname()}"  # no pid: stable across restarts
            listed = by_id((await consumers(r))["consumers"])
            assert set(listed) == {expected, "billing-indexer"}
            assert listed["billing-indexer"]["checkpoint_scn"] == 40

    run(main())


def test_client_id_is_checked_by_the_client() -> None:
    with pytest.raises(ValueError, match="client_id"):
        DatabusClient(["http://127.0.0.1:1"], client_id="x" * 257)
    with pytest.raises(ValueError, match="client_id"):
        DatabusClient(["http://127.0.0.1:1"], client_id="")


# -- consumers that stop --------------------------------------------------------------


def test_a_streaming_consumer_is_dropped_when_its_last_stream_closes() -> None:
    clock = Clock(100.0)
    reg = registry(clock)
    reg.stream_opened("s", buffer="b")
    observe(reg, "s", 3, streaming=True)
    reg.stream_opened("s", buffer="b")  # a second stream under the same id
    observe(reg, "p", 3)  # a polling consumer: no stream to watch
    reg.stream_closed("s", buffer="b")
    assert set(by_id(reg.snapshot({"b": 5}))) == {"s", "p"}  # one stream still open
    reg.stream_closed("s", buffer="b")
    assert set(by_id(reg.snapshot({"b": 5}))) == {"p"}  # at once, not after expiry_s
    assert reg.evicted_total == 0 and reg.open_streams() == 0
    # The polling one still goes only after its idle timeout.
    clock.now += reg.expiry_s - 1
    assert set(by_id(reg.snapshot({"b": 5}))) == {"p"}
    clock.now += 2
    assert reg.snapshot({"b": 5}) == []


def test_an_open_stream_on_a_quiet_buffer_does_not_expire() -> None:
    clock = Clock(100.0)
    reg = registry(clock, expiry_s=10.0)
    reg.stream_opened("quiet", buffer="b")
    observe(reg, "quiet", 3, streaming=True)
    observe(reg, "poller", 3)
    clock.now += 60  # nothing served to either for a minute
    assert set(by_id(reg.snapshot({"b": 3}))) == {"quiet"}
    observe(reg, "late", 3)  # expiry runs again with the kept entry in front
    assert set(by_id(reg.snapshot({"b": 3}))) == {"quiet", "late"}
    reg.stream_closed("quiet", buffer="b")
    assert set(by_id(reg.snapshot({"b": 3}))) == {"late"}


def test_a_stream_of_another_reader_or_buffer_is_another_entry() -> None:
    reg = registry(Clock())
    for buffer in ("b", "c"):
        reg.stream_opened("s", buffer=buffer)
        observe(reg, "s", 3, buffer=buffer, streaming=True)
    reg.stream_closed("s", buffer="c")
    reg.stream_closed("s", buffer="b", reader="someone-else")  # not its stream
    assert [d["buffer"] for d in reg.snapshot({"b": 3, "c": 3})] == ["b"]


async def _stream_until_windows(r: RunningRelay, client_id: str) -> Any:
    """A streaming subscription of ``client_id`` that stays open: the open response,
    once the relay has recorded what it sent."""
    resp = await r.get("/v1/stream", client_id=client_id, follow="true",
                       checkpoint=json.dumps({"window_scn": 5}))
    assert resp.status == 200 and resp.headers["X-Databus-Streaming"] == "1"
    await resp.content.read(1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = by_id((await consumers(r))["consumers"])
        if client_id in listed and listed[client_id]["checkpoint_scn"] == 40:
            return resp
        await asyncio.sleep(0.02)
    raise AssertionError(f"{client_id} never listed at SCN 40")


async def _gone(r: RunningRelay, client_id: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if client_id not in by_id((await consumers(r))["consumers"]):
            return True
        await asyncio.sleep(0.02)
    return False


def test_a_streaming_consumer_that_disconnects_is_gone_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            # A consumer 30 windows behind (its lag would keep growing), and a poller.
            await stream_all(r, client_id="poller")
            stream = await _stream_until_windows(r, "streamer")
            families = await metric_families(r)
            assert "streamer" in {s.labels["client_id"] for s in
                                  families["databus_relay_consumer_lag_seconds"].samples}
            stream.close()  # the consumer goes away (its connection closes)
            # The relay sees the connection end within a heartbeat; expiry_s is 300 s.
            assert await _gone(r, "streamer", within=15)
            families = await metric_families(r)
            for name in ("lag_ms", "lag_scn", "lag_seconds", "events_per_second"):
                ids = {s.labels["client_id"] for s in
                       families[f"databus_relay_consumer_{name}"].samples}
                assert ids == {"poller"}, name  # the poller stays: no connection to watch
            assert families["databus_relay_consumers_tracked"].samples[0].value == 1

    run(main())


def test_a_restarted_client_with_the_same_id_is_one_row(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            for _ in range(2):  # the app, then the app again (another client object)
                client = DatabusClient([r.url], sources=["synthetic.events"],
                                       checkpoint_store=MemoryCheckpointStore(),
                                       name="my-app", poll_wait_ms=50)
                client.register(Consumer())
                task = asyncio.create_task(client.run_async())
                deadline = time.monotonic() + 20
                while client.metrics.consumer_scn != 40 and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                listed = (await consumers(r))["consumers"]
                assert [c["client_id"] for c in listed] == [client.client_id]
                assert listed[0]["streaming"] is True
                client.stop()
                await task
                # Stopped: its stream closed, so it is no longer listed.
                assert await _gone(r, client.client_id, within=15)

    run(main())


def test_a_restarted_app_keeps_its_one_row(tmp_path: Path) -> None:
    """Two runs of one app are two processes (two pids): with the default client id
    the relay lists them as one consumer, the same entry."""
    exe = Path(sys.executable).with_name("databus")

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            seen = []
            for _ in range(2):  # polling: no stream to close, its row stays and is reused
                proc = await asyncio.create_subprocess_exec(
                    str(exe), "tail", "--relay", r.url, "--sources", "synthetic.events",
                    "--from-earliest", "--exit", "--no-streaming",
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
                _, err = await asyncio.wait_for(proc.communicate(), 60)
                assert proc.returncode == 0, err.decode()
                listed = (await consumers(r))["consumers"]
                assert [c["client_id"] for c in listed] == \
                    [f"databus-tail@{socket.gethostname()}"]
                seen.append(listed[0])
            # The same entry: first seen at the first run, the events of both runs.
            assert seen[1]["first_seen"] == seen[0]["first_seen"]
            assert seen[1]["events_total"] == 2 * seen[0]["events_total"] == 240

    run(main())
