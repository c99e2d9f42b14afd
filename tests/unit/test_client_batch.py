"""The batch API (issue 30): ``on_window``, ``on_events`` and ``client.windows()``
against a real relay fed by the synthetic fetcher.

Promises: every window whole, once, in order (duplicates only as replays after a
rollback, from the last committed window); one checkpoint report per batch, the store
at the last window; kept windows stay intact; a consumer of the paper's callbacks
registered beside a batch consumer changes nothing for either.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from databus.checkpoint import Checkpoint
from databus.client import (
    CallbackResult,
    Consumer,
    DatabusClient,
    DataEvent,
    MemoryCheckpointStore,
    Window,
)
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_client import LIMIT, SOURCE, Recorder, expected_windows, run_client

pytestmark = pytest.mark.twin("databus.batch")


class Windows(Consumer):
    """Keeps every window it is given (the objects themselves) and stops at LIMIT."""

    def __init__(self) -> None:
        self.client: DatabusClient | None = None
        self.got: list[Window] = []
        self.rollbacks: list[int] = []
        self.checkpoints: list[int] = []
        self.fail_once_at: int | None = None

    def on_window(self, window: Window) -> CallbackResult | None:
        if window.scn == self.fail_once_at:
            self.fail_once_at = None
            return CallbackResult.ERROR
        self.got.append(window)
        if window.scn >= LIMIT and self.client is not None:
            self.client.stop()
        return None

    def on_rollback(self, scn: int) -> CallbackResult | None:
        self.rollbacks.append(scn)
        return None

    def on_checkpoint(self, scn: int) -> CallbackResult | None:
        self.checkpoints.append(scn)
        return None


class Events(Consumer):
    def __init__(self) -> None:
        self.client: DatabusClient | None = None
        self.calls: list[list[DataEvent]] = []
        self.fail_once_at: int | None = None
        self.rollbacks: list[int] = []

    def on_events(self, events: list[DataEvent]) -> CallbackResult | None:
        if self.fail_once_at is not None and any(e.scn == self.fail_once_at for e in events):
            self.fail_once_at = None
            return CallbackResult.ERROR
        self.calls.append(events)
        if events[-1].scn >= LIMIT and self.client is not None:
            self.client.stop()
        return None

    def on_rollback(self, scn: int) -> CallbackResult | None:
        self.rollbacks.append(scn)
        return None


def _client(url: str, consumer: Any, store: MemoryCheckpointStore, **kw: Any
            ) -> DatabusClient:
    kw.setdefault("callback_timeout", 5.0)
    kw.setdefault("backoff_initial", 0.02)
    client = DatabusClient([url], sources=["synthetic.events"], checkpoint_store=store, **kw)
    consumer.client = client
    client.register(consumer)
    return client


def test_on_window_gets_every_window_whole_once_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            store = MemoryCheckpointStore()
            consumer = Windows()
            client = _client(r.url, consumer, store)
            await run_client(client)
            assert {w.scn: [e.key for e in w.events] for w in consumer.got} == expected
            assert [w.scn for w in consumer.got] == list(range(1, LIMIT + 1))
            assert store.load() == Checkpoint(LIMIT)
            assert client.metrics.windows == LIMIT
            # Kept windows are intact after their callbacks returned: values decode
            # now, from the window's own events.
            first = consumer.got[0]
            assert all(e.value is not None and e.value["id"] is not None for e in first.events)
            assert first.sources == ["synthetic.events"] and len(first) == 3
            assert all(w.timestamp_ns > 0 for w in consumer.got)

    asyncio.run(main())


def test_on_window_error_replays_from_the_last_committed_window(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            consumer = Windows()
            consumer.fail_once_at = 12
            client = _client(r.url, consumer, MemoryCheckpointStore())
            await run_client(client)
            # Window 11 was committed before 12 failed (whatever the response held):
            # the replay starts at 12, and no window is delivered twice.
            assert consumer.rollbacks == [11]
            assert [w.scn for w in consumer.got] == list(range(1, LIMIT + 1))
            assert {w.scn: [e.key for e in w.events] for w in consumer.got} == expected
            assert client.metrics.rollbacks == 1

    asyncio.run(main())


def test_checkpoint_every_commits_every_nth_window_and_on_checkpoint_is_asked(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            await expected_windows(r)
            store = MemoryCheckpointStore()
            consumer = Windows()
            consumer.fail_once_at = 14
            client = _client(r.url, consumer, store, checkpoint_every=5)
            await run_client(client)
            assert consumer.checkpoints[:2] == [5, 10]
            assert consumer.rollbacks == [10]  # 11..13 are replayed with 14
            scns = [w.scn for w in consumer.got]
            assert scns == [*range(1, 14), *range(11, LIMIT + 1)]
            assert store.load() == Checkpoint(LIMIT)

    asyncio.run(main())


def test_on_events_gets_whole_windows_and_an_error_replays_them(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            store = MemoryCheckpointStore()
            consumer = Events()
            consumer.fail_once_at = 20
            # Small responses: several batches, so the failing one is not the first.
            client = _client(r.url, consumer, store, max_request_bytes=2048)
            await run_client(client)
            assert len(consumer.rollbacks) == 1
            replay_from = consumer.rollbacks[0]
            delivered = [e for call in consumer.calls for e in call]
            # Each call holds whole windows only.
            for call in consumer.calls:
                scns = [e.scn for e in call]
                assert all(scns.count(s) == len(expected[s]) for s in set(scns))
            # Everything once, except the replay of the failed batch's windows, which
            # starts right after the last committed window.
            keys = {s: [e.key for e in delivered if e.scn == s] for s in expected}
            for s, want in expected.items():
                assert keys[s] in (want, want + want), s
                if keys[s] == want + want:
                    assert s > replay_from
            assert store.load() == Checkpoint(LIMIT)

    asyncio.run(main())


def test_a_batch_consumer_beside_a_callback_consumer(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            store = MemoryCheckpointStore()
            windows = Windows()
            recorder = Recorder()
            client = _client(r.url, windows, store)
            recorder.client = client
            client.register(recorder)
            await run_client(client)
            assert recorder.windows == expected
            assert {w.scn: [e.key for e in w.events] for w in windows.got} == expected
            assert store.load() == Checkpoint(LIMIT)

    asyncio.run(main())


def test_windows_iterator_commits_only_finished_windows(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            store = MemoryCheckpointStore()
            client = DatabusClient([r.url], sources=["synthetic.events"],
                                   checkpoint_store=store)
            kept: list[Window] = []
            async with contextlib.aclosing(client.windows()) as windows:
                async for window in windows:
                    kept.append(window)
                    if window.scn == 7:
                        break
            assert [w.scn for w in kept] == list(range(1, 8))
            assert {w.scn: [e.key for e in w.events] for w in kept} == {
                s: expected[s] for s in range(1, 8)}
            # The body of window 7 was left, not finished: at most 6 is committed,
            # and every window before it that finished may be.
            committed = store.load()
            assert committed is not None and committed.window_scn <= 7
            # A second iterator resumes right after the committed window.
            again = DatabusClient([r.url], sources=["synthetic.events"],
                                  checkpoint_store=store)
            async with contextlib.aclosing(again.windows()) as windows:
                async for window in windows:
                    assert window.scn == committed.window_scn + 1
                    break

    asyncio.run(main())


class Flaky(Windows):
    """Raises once at window 9, and runs past the time budget once at window 17."""

    def __init__(self) -> None:
        super().__init__()
        self.raised = self.slept = False

    def on_window(self, window: Window) -> CallbackResult | None:
        if window.scn == 9 and not self.raised:
            self.raised = True
            raise RuntimeError("consumer bug")
        if window.scn == 17 and not self.slept:
            self.slept = True
            import time

            time.sleep(0.6)  # past the 0.3 s budget: its answer does not count
            return None
        return super().on_window(window)


def test_an_exception_or_a_blown_budget_in_on_window_replays_the_window(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            expected = await expected_windows(r)
            consumer = Flaky()
            client = _client(r.url, consumer, MemoryCheckpointStore(), callback_timeout=0.3)
            await run_client(client)
            # The exception: windows before 9 were committed, the replay starts at 9.
            # The blown budget abandons the batch that held 17 (docs/client.md): the
            # replay starts after the last window committed before that batch.
            first, second = consumer.rollbacks
            assert first == 8 and 8 <= second < 17
            scns = [w.scn for w in consumer.got]
            assert scns == [*range(1, 17), *range(second + 1, LIMIT + 1)]
            assert {w.scn: [e.key for e in w.events] for w in consumer.got} == expected

    asyncio.run(main())
