"""A streaming client across relay restarts: `databus relay` processes stopped with
SIGTERM and killed with SIGKILL while a `DatabusClient` follows them."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

from databus.client import CallbackResult, Consumer, DatabusClient, MemoryCheckpointStore
from tests.relay_harness import RelayProcess

WINDOWS = 1500
LIVE = ("synthetic://?rate=600&keys=1000&event_bytes=500&events_per_window=2"
        f"&limit={WINDOWS * 2}&seed=5")


class Windows(Consumer):
    def __init__(self) -> None:
        self.ends: list[int] = []
        self.events = 0
        self.client: DatabusClient | None = None
        self.lock = threading.Lock()

    def on_data_event(self, event: object) -> CallbackResult:
        self.events += 1
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        with self.lock:
            self.ends.append(scn)
        if scn >= WINDOWS and self.client is not None:
            self.client.stop()
        return CallbackResult.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        # Windows after the rolled-back-to SCN are delivered again: forget them.
        with self.lock:
            self.ends = [s for s in self.ends if s <= scn]
        return CallbackResult.SUCCESS


def test_streams_resume_across_relay_restarts(tmp_path: Path) -> None:
    relay = RelayProcess(tmp_path, {"load": LIVE})
    relay.start()
    seen = Windows()
    store = MemoryCheckpointStore()
    client = DatabusClient([relay.url], sources=["synthetic.events"], checkpoint_store=store,
                           backoff_initial=0.05, backoff_max=0.3, max_request_bytes=16 * 1024)
    seen.client = client
    client.register(seen)

    async def main() -> None:
        task = asyncio.create_task(client.run_async())
        try:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                at = len(seen.ends) + 200
                deadline = time.monotonic() + 60
                while len(seen.ends) < at:
                    assert not task.done() and time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(relay.kill, sig)
                await asyncio.sleep(0.5)  # the client is without a relay for a while
                await asyncio.to_thread(relay.start)
            await asyncio.wait_for(task, 90)
        finally:
            if not task.done():
                client.stop()
                await asyncio.wait_for(task, 10)

    try:
        asyncio.run(main())
    finally:
        relay.kill()
    # Every window once, in order, across both restarts (the relay kept what it had;
    # the client resumed each time from where it was).
    assert seen.ends[:WINDOWS] == list(range(1, WINDOWS + 1))
    stored = store.load()
    assert stored is not None and stored.window_scn >= WINDOWS
