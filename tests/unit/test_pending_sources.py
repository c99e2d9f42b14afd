"""A consumer started before its tables exist waits for them (issue 12, defect 13).

The relay lists every source its configuration names from the start (state
``pending``, id reserved and persisted, no schema fingerprint yet), serves a stream
naming one with no events (a long poll waits) instead of ``unknown_source``, and lists
it ``active`` once the table exists; the client and ``databus tail`` wait for it (one
log line, a state in the metrics). A source the configuration does not name at all is
still a fast, fatal ``unknown_source``. No server needed: SQLite TxLog sources, and a
synthetic fetcher standing in for a ``tables=db.*`` pattern.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from databus.client._tail import tail
from databus.errors import UnknownSourceError
from databus.fetchers._api import ConfiguredSources, Fetcher, FetcherContext, WindowSink
from databus.fetchers.synthetic import SyntheticFetcher
from databus.relay import _fetcher_host
from databus.relay._catalog import RelayCatalog
from tests.relay_harness import RunningRelay, relay_config, running_relay
from tests.unit.test_txlog_support import BUFFER, SqliteSource, cli, relay_windows
from tests.waiting import async_wait_until

ORDERS = "shop.orders"
ORDERS_DDL = "CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL)"
ITEMS_DDL = "CREATE TABLE items (id INTEGER PRIMARY KEY, sku TEXT)"


class Collect(Consumer):
    """Every data event as (source, key, value); stops the client after ``want``."""

    def __init__(self, want: int) -> None:
        self.want = want
        self.events: list[tuple[str, Any, Any]] = []
        self.client: DatabusClient | None = None

    def on_data_event(self, event: DataEvent) -> None:
        self.events.append((event.source, event.key, event.value))

    def on_end_data_event_sequence(self, scn: int) -> None:
        if len(self.events) >= self.want and self.client is not None:
            self.client.stop()


async def sources_doc(r: RunningRelay) -> dict[str, dict[str, Any]]:
    doc = await r.json("/v1/sources")
    return {e["name"]: e for e in doc["sources"]}


async def stream_status(r: RunningRelay, **params: str) -> tuple[int, bytes, Any]:
    async with await r.get("/v1/stream", **params) as resp:
        body = await resp.read()
        return resp.status, body, json.loads(body) if resp.status != 200 else None


def insert_orders(db: SqliteSource, ids: range) -> None:
    for i in ids:
        db.txn(f"INSERT INTO orders (id, tag) VALUES ({i}, 't{i}')")


def tail_args(url: str, count: int) -> argparse.Namespace:
    return argparse.Namespace(relay=[url], sources=ORDERS, from_scn=None, from_earliest=True,
                              filter=None, count=count, exit=False)


# -- SQLite TxLog ----------------------------------------------------------------------


def test_sqlite_consumer_started_before_the_table_gets_every_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Relay, client and tail start on a database without the table (nor the TxLog);
    then the migration creates it, installs capture and writes rows."""
    caplog.set_level(logging.INFO)
    db = SqliteSource(tmp_path / "shop.db")  # an empty database file
    uri = db.uri("orders")

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
            listed = await sources_doc(r)
            assert listed[ORDERS]["state"] == "pending"
            assert listed[ORDERS]["schema_fingerprint"] is None
            source_id = listed[ORDERS]["id"]
            assert isinstance(source_id, int) and source_id > 0
            # A configured source: 200 without events (the long poll waited), not 404.
            started = time.monotonic()
            status, body, _ = await stream_status(r, sources=ORDERS, wait_ms="300")
            assert (status, body) == (200, b"") and time.monotonic() - started >= 0.25
            filt = json.dumps({ORDERS: {"type": "mod", "n": 2, "buckets": "[0]"}})
            assert (await stream_status(r, sources=ORDERS, filter=filt))[0] == 200
            # One the configuration does not name: still unknown_source.
            for params in ({"sources": "shop.nope"},
                           {"filter": json.dumps({"shop.nope": {"type": "mod", "n": 2,
                                                                "buckets": "[0]"}})}):
                status, _, error = await stream_status(r, **params)
                assert (status, error["error"]) == (404, "unknown_source")

            collect = Collect(want=5)
            client = DatabusClient([r.url], sources=[ORDERS],
                                   checkpoint_store=MemoryCheckpointStore(), poll_wait_ms=200)
            collect.client = client
            client.register(collect)
            run = asyncio.create_task(client.run_async())
            out = io.StringIO()
            tailing = asyncio.create_task(tail(tail_args(r.url, 5), out))
            await async_wait_until(lambda: client.metrics.source_states == {ORDERS: "pending"},
                                   "the client waits for the pending source", 20)
            await asyncio.sleep(0.5)
            assert not run.done() and not tailing.done()  # waiting, not dead
            assert client.metrics.waiting_for_sources == [ORDERS]
            metrics = client.metrics.prometheus_text()
            assert (f'databus_client_source_state{{client="databus-client",source="{ORDERS}",'
                    'state="pending"} 1') in metrics

            # The migration: the table, its capture, then rows.
            db.run(ORDERS_DDL)
            assert cli("install", "--source", uri) == 0
            await async_wait_until(lambda: client.metrics.source_states == {ORDERS: "active"}
                                   or bool(collect.events), "source listed active", 20)
            listed = await sources_doc(r)
            assert listed[ORDERS]["state"] == "active" and listed[ORDERS]["id"] == source_id
            assert listed[ORDERS]["schema_fingerprint"] is not None
            await asyncio.to_thread(insert_orders, db, range(1, 6))
            await asyncio.wait_for(run, 30)
            await asyncio.wait_for(tailing, 30)
            assert [(s, k) for s, k, _ in collect.events] == [(ORDERS, i) for i in range(1, 6)]
            assert collect.events[0][2] == {"id": 1, "tag": "t1"}
            assert client.metrics.source_states == {ORDERS: "active"}
            lines = [json.loads(line) for line in out.getvalue().splitlines()]
            assert [(x["source"], x["key"]) for x in lines] == [(ORDERS, i) for i in range(1, 6)]

    asyncio.run(main())
    waiting = [r for r in caplog.records if r.name == "databus.client"
               and "does not exist yet; waiting" in r.getMessage()]
    assert len(waiting) == 2  # once per client (the DatabusClient and the tail)


def test_sqlite_pending_id_is_stable_across_restarts(tmp_path: Path) -> None:
    """The id reserved before the table exists is persisted and carried by its rows; a
    table that exists meanwhile is captured as usual."""
    db = SqliteSource(tmp_path / "shop.db", ITEMS_DDL)
    db.install("items")
    uri = db.uri("orders,items")

    async def first() -> int:
        async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
            listed = await sources_doc(r)
            assert listed[ORDERS]["state"] == "pending"
            # It exists, without rows: active once the fetcher looked.
            await async_wait_until(
                lambda: r.relay.catalog.source("shop.items").state == "active", "items active", 20)
            listed = await sources_doc(r)
            assert listed[ORDERS]["state"] == "pending"
            db.txn("INSERT INTO items (id, sku) VALUES (1, 'a')")
            await async_wait_until(lambda: r.relay.buffers[BUFFER].state().max_scn is not None,
                                   "the items row", 20)
            source_id: int = listed[ORDERS]["id"]
            return source_id

    source_id = asyncio.run(first())
    assert RelayCatalog(tmp_path / "relay" / "catalog.json").source(ORDERS).id == source_id

    async def second() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
            listed = await sources_doc(r)
            assert (listed[ORDERS]["id"], listed[ORDERS]["state"]) == (source_id, "pending")
            db.run(ORDERS_DDL)
            assert cli("install", "--source", db.uri("orders")) == 0
            await asyncio.to_thread(insert_orders, db, range(1, 3))
            await async_wait_until(lambda: r.relay.buffers[BUFFER].state().windows == 3,
                                   "the orders rows", 20)
            windows = await relay_windows(r)
            orders = [c for w in windows for c in w.changes if c.source == ORDERS]
            assert [c.key for c in orders] == [1, 2]
            assert r.relay.catalog.source(ORDERS).id == source_id

    asyncio.run(second())


def test_sqlite_table_created_without_capture_waits_for_install(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Between the migration's CREATE TABLE and its `databus txlog install` the source
    stays pending (logged once); rows written after the install arrive."""
    db = SqliteSource(tmp_path / "shop.db", ITEMS_DDL)
    db.install("items")
    uri = db.uri("orders,items")

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
            await async_wait_until(lambda: "table main.orders does not exist yet" in caplog.text,
                                   "the fetcher saw the table absent", 20)
            db.run(ORDERS_DDL)
            db.txn("INSERT INTO items (id, sku) VALUES (1, 'a')")  # a batch: a check
            await async_wait_until(lambda: "exists but is not set up for capture" in caplog.text,
                                   "the warning", 20)
            await asyncio.sleep(1.2)  # an idle check too
            assert (await sources_doc(r))[ORDERS]["state"] == "pending"
            status = (await r.json("/v1/status"))["buffers"][BUFFER]["fetcher"]
            assert status["state"] == "running"
            assert cli("install", "--source", db.uri("orders")) == 0
            await asyncio.to_thread(insert_orders, db, range(7, 8))
            await async_wait_until(lambda: r.relay.buffers[BUFFER].state().windows == 2, "rows",
                                   20)
            assert (await sources_doc(r))[ORDERS]["state"] == "active"
            windows = await relay_windows(r)
            assert [(c.source, c.key) for w in windows for c in w.changes] == [
                ("shop.items", 1), (ORDERS, 7)]

    asyncio.run(main())
    assert caplog.text.count("exists but is not set up for capture") == 1


# -- a source not configured at all ----------------------------------------------------

SYNTHETIC = "synthetic://?rate=0&keys=20&event_bytes=100&events_per_window=1&limit=5&seed=3"


def test_a_source_the_relay_does_not_name_fails_fast(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SYNTHETIC})) as r:
            client = DatabusClient([r.url], sources=["synthetic.events", "shop.nope"],
                                   checkpoint_store=MemoryCheckpointStore())
            client.register(Collect(want=1))
            started = time.monotonic()
            with pytest.raises(UnknownSourceError, match=r"shop\.nope"):
                await asyncio.wait_for(client.run_async(), 10)
            assert time.monotonic() - started < 5
            args = tail_args(r.url, 1)
            args.sources = "shop.nope"
            with pytest.raises(UnknownSourceError, match=r"shop\.nope"):
                await asyncio.wait_for(tail(args, io.StringIO()), 10)

    asyncio.run(main())


# -- a source named by a pattern (tables=shop.*) ---------------------------------------


class PatternFetcher(SyntheticFetcher):
    """Configured for every ``shop.*`` table; writes ``shop.late`` (allocating its id
    then) only once ``created`` is set, like a binlog fetcher seeing CREATE TABLE."""

    scheme: ClassVar[str] = "pattern"
    created: ClassVar[threading.Event] = threading.Event()

    def __init__(self, uri: str, context: FetcherContext) -> None:
        super().__init__(uri.replace("pattern://", "synthetic://", 1), context)

    def configured_sources(self) -> ConfiguredSources:
        return ConfiguredSources(databases=frozenset({"shop"}))

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        while not self.created.wait(0.05):
            if stop.is_set():
                return
        super().run(sink, start_after_scn, stop)


def test_a_source_named_by_a_pattern_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from databus.fetchers._api import fetcher_class as real

    def resolve(uri: str) -> type[Fetcher]:
        return PatternFetcher if uri.startswith("pattern://") else real(uri)

    monkeypatch.setattr(_fetcher_host, "fetcher_class", resolve)
    PatternFetcher.created.clear()
    uri = SYNTHETIC.replace("synthetic://", "pattern://") + "&source=shop.late"

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"shop": uri})) as r:
            assert await sources_doc(r) == {}  # no id before the table exists
            assert (await stream_status(r, sources="shop.late"))[0] == 200
            filt = json.dumps({"shop.late": {"type": "mod", "n": 1, "buckets": "[0]"}})
            assert (await stream_status(r, filter=filt))[0] == 200
            assert (await stream_status(r, sources="other.late"))[0] == 404
            collect = Collect(want=5)
            client = DatabusClient([r.url], sources=["shop.late"],
                                   checkpoint_store=MemoryCheckpointStore(), poll_wait_ms=2000,
                                   filter=filt)
            collect.client = client
            client.register(collect)
            run = asyncio.create_task(client.run_async())
            await async_wait_until(
                lambda: client.metrics.source_states == {"shop.late": "pending"}, "pending", 20)
            await asyncio.sleep(0.3)  # the client's long poll is waiting now
            PatternFetcher.created.set()
            await asyncio.wait_for(run, 30)
            assert [s for s, _, _ in collect.events] == ["shop.late"] * 5
            assert client.metrics.source_states == {"shop.late": "active"}

    try:
        asyncio.run(main())
    finally:
        PatternFetcher.created.set()
