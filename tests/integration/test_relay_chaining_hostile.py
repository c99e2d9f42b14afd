"""A chained relay (``relay+http://``) under a hostile upstream (issue 27 items 1-3, 12,
14): windows swapped, a checkpoint header 1,000 SCNs ahead or 50 behind, a stream that
dribbles a byte at a time with no heartbeat, 64 MiB more than asked for, by long polls
and by streaming. Whatever the attack, the chained relay refuses the answer whole, asks
again, and ends byte-identical to the honest upstream; it never skips a window.

The hostile relay is ``tests/hostile_upstream.py`` in front of a real relay fed by the
synthetic source; the chained relay runs in this process (``running_relay``).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from databus.bootstrap._producer import LogProducer
from databus.bootstrap._storage import open_storage
from databus.checkpoint import Checkpoint
from databus.client import CallbackResult, Consumer, DatabusClient, DataEvent, RelayPuller
from databus.filters import FilterSpec
from tests.hostile_upstream import OVERSEND_BYTES, hostile_upstream
from tests.integration.test_relay_chaining import (
    SOURCES,
    chained,
    config,
    synthetic,
    windows_of,
)
from tests.relay_harness import running_relay, stream_body
from tests.waiting import async_wait_until, wait_until

WINDOWS = 120

CASES = [
    ("reorder", "false"), ("reorder", "true"),
    ("ahead", "false"), ("ahead", "true"),
    ("behind", "false"), ("behind", "true"),
    ("dribble", "true"),
    ("oversend", "false"), ("oversend", "true"),
]


@pytest.mark.parametrize(("attack", "follow"), CASES)
def test_a_hostile_upstream_leaves_no_gap(tmp_path: Path, attack: str, follow: str,
                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")

    async def main() -> None:
        async with running_relay(config(tmp_path, "up", {"src": synthetic(WINDOWS)})) as up:
            await up.wait_for_scn("src", WINDOWS)
            async with hostile_upstream(up.url, up.session, attack, times=3) as hostile:
                # Answers of a few windows each (3 events of 300 bytes a window), so that
                # there are windows to swap; heartbeats every 100 ms, so a stream with no
                # whole frame for 0.5 s is dead.
                down_config = config(tmp_path, "down", {"copy": chained(
                    hostile.url, follow=follow, max_bytes="4096", wait_ms="200",
                    heartbeat_ms="100", backoff_max_s="0.2")})
                async with running_relay(down_config) as down:
                    await down.wait_for_scn("copy", WINDOWS, timeout=60)
                    copy = await stream_body(down)
                    assert windows_of(copy) == list(range(1, WINDOWS + 1))
                    assert copy == await stream_body(up)
                    status = (await down.json("/v1/status"))["buffers"]["copy"]
                assert hostile.attacks >= 1, "the attack never happened"
                if attack == "oversend":
                    # Refused as it arrived: far less than the 64 MiB sent was read.
                    assert hostile.oversent < OVERSEND_BYTES // 4
        assert status["max_scn"] == WINDOWS
        said = "\n".join(r.getMessage() for r in caplog.records)
        expected = {"reorder": "its SCNs go back", "ahead": "does not stand where the body",
                    "behind": "does not stand where the body",
                    "dribble": "sent no whole heartbeat or write",
                    "oversend": "asked for"}[attack]
        assert expected in said

    asyncio.run(main())


class _Windows(Consumer):
    """Each window's SCN and data event count, in delivery order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.windows: list[tuple[int, int]] = []
        self.rollbacks = 0
        self._events = 0

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        self._events += 1
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        with self.lock:
            self.windows.append((scn, self._events))
        self._events = 0
        return CallbackResult.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        self.rollbacks += 1
        self._events = 0
        return CallbackResult.SUCCESS


@pytest.mark.parametrize(("attack", "streaming"), [
    ("reorder", False), ("reorder", True), ("ahead", False), ("ahead", True),
    ("dribble", True), ("oversend", False),
])
def test_a_client_of_a_hostile_relay_gets_every_window_once_in_order(
        tmp_path: Path, attack: str, streaming: bool) -> None:
    """The same check in DatabusClient (and so in the replicator and ``databus tail``)."""

    async def main() -> None:
        async with running_relay(config(tmp_path, "up", {"src": synthetic(WINDOWS)})) as up:
            await up.wait_for_scn("src", WINDOWS)
            async with hostile_upstream(up.url, up.session, attack, times=2) as hostile:
                consumer = _Windows()
                client = DatabusClient([hostile.url], sources=SOURCES.split(","),
                                       poll_wait_ms=200, backoff_max=0.2,
                                       max_request_bytes=4096, streaming=streaming)
                client.register(consumer)
                thread = threading.Thread(target=client.run, daemon=True)
                thread.start()
                try:
                    def done() -> bool:
                        assert thread.is_alive(), "the client stopped"
                        with consumer.lock:
                            return len(consumer.windows) >= WINDOWS

                    await asyncio.to_thread(wait_until, done, f"{WINDOWS} windows", 60)
                finally:
                    client.stop()
                    await asyncio.to_thread(thread.join, 10)
                assert hostile.attacks >= 1
        assert [scn for scn, _ in consumer.windows] == list(range(1, WINDOWS + 1))
        assert all(count == 3 for _, count in consumer.windows)
        assert consumer.rollbacks == 0

    asyncio.run(main())


@pytest.mark.parametrize("attack", ["reorder", "ahead"])
def test_the_bootstrap_log_writer_of_a_hostile_relay_logs_every_window_once_in_order(
        tmp_path: Path, attack: str) -> None:
    """The same check in the bootstrap service's log writer (a SQLite store here)."""

    async def main() -> list[int]:
        storage = open_storage(f"sqlite:///{tmp_path / 'bootstrap.db'}")
        try:
            async with running_relay(config(tmp_path, "up", {"src": synthetic(WINDOWS)})) as up:
                await up.wait_for_scn("src", WINDOWS)
                async with hostile_upstream(up.url, up.session, attack, times=3) as hostile:
                    producer = LogProducer(storage, [hostile.url], max_bytes=4096,
                                           poll_wait_ms=200, backoff_max=0.2)
                    producer.start()
                    try:
                        await async_wait_until(
                            lambda: producer.status.scn == WINDOWS,
                            f"the log at SCN {WINDOWS}", 60,
                            diagnose=lambda: str(producer.status.to_json()))
                    finally:
                        await producer.close()
                    assert hostile.attacks >= 1
            rows = storage.log_batch(SOURCES.split(","), after_scn=-1, upto_scn=1 << 62,
                                     limit=1 << 30, filter=FilterSpec())
            return [row.scn for row in rows]
        finally:
            storage.close()

    scns = asyncio.run(main())
    assert scns == sorted(scns)
    assert sorted(set(scns)) == list(range(1, WINDOWS + 1))
    assert len(scns) == 3 * WINDOWS


def test_a_reader_that_pauses_does_not_take_an_honest_stream_for_a_stalled_one(
        tmp_path: Path) -> None:
    """The per-frame deadline counts the time the reader waits for a frame, not the time
    it spent elsewhere (a consumer whose buffer was full): after a pause of several
    deadlines, the writes that came meanwhile are read from the same stream."""

    async def main() -> None:
        async with running_relay(config(tmp_path, "up", {"src": synthetic(WINDOWS,
                                                                          rate=200)})) as up:
            await up.wait_for_scn("src", 2)
            puller = RelayPuller([up.url], SOURCES.split(","), up.session, heartbeat_ms=100,
                                 backoff_max=0.2)
            try:
                position = Checkpoint.flexible()
                batch = await puller.next_batch(position, max_bytes=4096, wait_ms=200)
                position = batch.checkpoint
                await asyncio.sleep(2.0)  # four deadlines of 0.5 s; windows go on landing
                while position.window_scn < WINDOWS:
                    batch = await puller.next_batch(position, max_bytes=4096, wait_ms=200)
                    position = batch.checkpoint
                assert puller.failovers == 0, puller.last_error
            finally:
                await puller.close_stream()

    asyncio.run(main())
