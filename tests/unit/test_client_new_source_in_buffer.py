"""A source that appears in a buffer after the client decided to check window checksums.

A client subscribed to every source of a buffer checks each window's EOW count and
checksum (every event of the window reaches it). When the relay's configuration names
tables by a pattern (``tables=shop.*``), a table created later joins the buffer; the
relay filters its events out of this client's stream but the EOWs still count them.
Before the fix every such window failed its check, and the client asked for it again
forever. The client now decides again, on a fresh catalog, after a failed check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from databus.client import DatabusClient, MemoryCheckpointStore
from databus.fetchers._api import ConfiguredSources, Fetcher, FetcherContext, WindowSink
from databus.fetchers.synthetic import SyntheticFetcher
from databus.relay import _fetcher_host
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_pending_sources import Collect
from tests.waiting import async_wait_until

SYNTHETIC = "growing://?rate=400&events_per_window=4&event_bytes=200&keys=50&seed=3"


class _LastScn:
    """A sink that remembers the last window it published."""

    def __init__(self, sink: WindowSink) -> None:
        self.sink = sink
        self.last: int | None = None

    def start_window(self, scn: int) -> None:
        self.sink.start_window(scn)

    def append(self, event: bytes) -> None:
        self.sink.append(event)

    def end_window(self, timestamp_ns: int | None = None) -> int:
        self.last = self.sink.end_window(timestamp_ns)
        return self.last

    def rollback(self) -> None:
        self.sink.rollback()


class GrowingFetcher(SyntheticFetcher):
    """Configured for ``shop.*``: writes ``shop.a`` only, then, once ``created`` is set,
    windows that mix ``shop.a`` and the new ``shop.b`` (as a binlog fetcher would after
    a CREATE TABLE)."""

    scheme: ClassVar[str] = "growing"
    created: ClassVar[threading.Event] = threading.Event()
    switched_at: ClassVar[list[int]] = []

    def __init__(self, uri: str, context: FetcherContext) -> None:
        super().__init__(uri.replace("growing://", "synthetic://", 1) + "&source=shop.a",
                         context)

    def configured_sources(self) -> ConfiguredSources:
        return ConfiguredSources(databases=frozenset({"shop"}))

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        tracked = _LastScn(sink)
        first_phase = threading.Event()

        def until_created() -> None:
            while not (self.created.wait(0.02) or stop.is_set()):
                pass
            first_phase.set()

        watcher = threading.Thread(target=until_created, daemon=True)
        watcher.start()
        super().run(tracked, start_after_scn, first_phase)
        watcher.join()
        if stop.is_set():
            return
        last = tracked.last if tracked.last is not None else start_after_scn
        self.switched_at.append(last or 0)
        self.params = dataclasses.replace(self.params, sources=("shop.a", "shop.b"))
        super().run(sink, last, stop)


def test_client_keeps_going_when_a_new_source_joins_its_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from databus.fetchers._api import fetcher_class as real

    def resolve(uri: str) -> type[Fetcher]:
        return GrowingFetcher if uri.startswith("growing://") else real(uri)

    monkeypatch.setattr(_fetcher_host, "fetcher_class", resolve)
    GrowingFetcher.created.clear()
    GrowingFetcher.switched_at.clear()

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"shop": SYNTHETIC})) as r:
            collect = Collect(want=10**9)
            client = DatabusClient([r.url], sources=["shop.a"],
                                   checkpoint_store=MemoryCheckpointStore(), poll_wait_ms=500)
            collect.client = client
            client.register(collect)
            run = asyncio.create_task(client.run_async())
            # The client checks windows: shop.a is the only source of the buffer.
            await async_wait_until(lambda: len(collect.events) >= 20, "first-phase events", 20)
            GrowingFetcher.created.set()
            await async_wait_until(lambda: bool(GrowingFetcher.switched_at), "shop.b created", 20)
            switched = GrowingFetcher.switched_at[0]
            await r.wait_for_scn("shop", switched + 40)
            # Every shop.a event of the mixed windows arrives (before the fix the first
            # mixed window failed its check again and again).
            await async_wait_until(lambda: (client.metrics.committed_scn or 0) >= switched + 40,
                                   "windows after shop.b appeared", 20)
            client.stop()
            await asyncio.wait_for(run, 10)
            assert {s for s, _, _ in collect.events} == {"shop.a"}

    try:
        asyncio.run(main())
    finally:
        GrowingFetcher.created.set()
