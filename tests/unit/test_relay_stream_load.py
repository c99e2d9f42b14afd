"""What streams that do not read, or have nothing to read, cost the relay (issue 27, item
13): a window's waiters are woken in batches with other work between them, a stream
reads the ring in slices (one at a time held, whatever its ``max_bytes``), and a stream
parked at the tail reads nothing until a window lands, its heartbeats spread over their
interval."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from databus._serving import SERVING
from databus.checkpoint import Checkpoint
from databus.client._relay_stream import StreamFramer
from databus.relay._buffer import EventBuffer, ReadResult
from databus.relay._streaming import (
    BULK_SLICE,
    HEARTBEAT_SPREAD,
    WAKE_BATCH,
    WindowNotifier,
    heartbeat_delay,
)
from tests.relay_harness import relay_config, running_relay, stream_body
from tests.unit.test_relay_streaming import at_scn, body_of, frames_until, open_stream
from tests.waiting import async_wait_until

pytestmark = pytest.mark.twin("databus.batch")

# About 15 MiB of windows (6,000 of one 2.5 KB event), written at once: more than the
# kernel's socket buffers take from a client that reads nothing.
WINDOWS = 6000
BIG = (f"synthetic://?rate=0&keys=100000&event_bytes=2500&events_per_window=1"
       f"&limit={WINDOWS}&seed=3")


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def count_reads(buffer: EventBuffer) -> list[int]:
    """Record the ``max_bytes`` of every read of ``buffer`` from now on (the streams of
    requests made afterwards bind the wrapper)."""
    sizes: list[int] = []
    real: Callable[..., ReadResult] = buffer.read

    def read(checkpoint: Checkpoint, **kw: Any) -> ReadResult:
        sizes.append(kw["max_bytes"])
        return real(checkpoint, **kw)

    buffer.read = read  # type: ignore[method-assign]
    return sizes


def test_a_window_wakes_its_waiters_in_batches_with_other_work_between() -> None:
    """Thousands of streams parked on one buffer, woken by one window: other connections
    run between batches of them, not after all of them (2,000 woken in one loop turn
    held the loop for all of their writes)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        notifier = WindowNotifier(loop)
        order: list[object] = []
        count = WAKE_BATCH * 4

        async def waiter(i: int) -> None:
            await notifier.wait(60)
            order.append(i)
            if i == 0:
                # Work that becomes ready once the first waiter runs: another
                # connection's bytes, a window of another buffer.
                loop.call_soon(order.append, "other")

        tasks = [asyncio.create_task(waiter(i)) for i in range(count)]
        await asyncio.sleep(0)  # every one waiting
        notifier.on_window(1)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        woken = [x for x in order if x != "other"]
        assert sorted(woken) == list(range(count))  # each woken once
        assert order.index("other") <= WAKE_BATCH + 1 < count

        # A waiter that times out is gone; the next window wakes only those waiting.
        await notifier.wait(0.01)
        late = asyncio.create_task(notifier.wait(60))
        await asyncio.sleep(0)
        notifier.on_window(2)
        await asyncio.wait_for(late, 30)

    run(main())


def test_a_stream_reads_the_ring_in_slices_and_serves_what_polls_serve(
        tmp_path: Path) -> None:
    """A stream from the oldest window with ``max_bytes`` 8 MiB over a 15 MiB backlog: no
    read of the ring is larger than a bulk slice (one 8 MiB read held the event loop
    5-8 ms, 30 reconnecting non-readers 150-250 ms), and the bytes are a poll's."""

    async def main() -> None:
        cfg = relay_config(tmp_path, {"load": BIG}, capacity_mb=32)
        async with running_relay(cfg) as r:
            await r.wait_for_scn("load", WINDOWS)
            polled = await stream_body(r)
            sizes = count_reads(r.relay.buffers["load"])
            resp = await open_stream(r, checkpoint=json.dumps({"window_scn": -1}),
                                     max_bytes=8 << 20)
            frames = await frames_until(resp, StreamFramer(), at_scn(WINDOWS), timeout=120)
            resp.close()
            assert body_of(frames) == polled
            assert sizes and max(sizes) <= BULK_SLICE, sorted(sizes)[-5:]

    run(main())


def test_a_stream_that_never_reads_holds_one_slice_of_the_budget(tmp_path: Path) -> None:
    """A stream asking for 8 MiB from the oldest window and reading nothing holds at most
    one slice of the stream budget until it is cut (it held its whole 8 MiB), and is
    cut after ``write_timeout_s`` as docs/relay.md says."""

    async def main() -> None:
        cfg = relay_config(tmp_path, {"load": BIG}, capacity_mb=32, write_timeout_s=1.0,
                           max_stream_memory_mb=64)
        async with running_relay(cfg) as r:
            await r.wait_for_scn("load", WINDOWS)
            assert r.app is not None
            serving = r.app[SERVING]
            host, port = r.url.removeprefix("http://").split(":")
            query = urllib.parse.urlencode({"follow": "true", "max_bytes": str(8 << 20),
                                            "checkpoint": json.dumps({"window_scn": -1})})
            loop = asyncio.get_running_loop()
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await loop.sock_connect(sock, (host, int(port)))
                await loop.sock_sendall(
                    sock, f"GET /v1/stream?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                # Reads nothing: the relay writes until the socket's buffers are full,
                # then waits, and cuts it write_timeout_s later.
                await async_wait_until(lambda: serving.rejects.total["write_timeout"] >= 1,
                                       "the never-reading stream cut", 120)
                # Cut: reading now ends in a reset within what the kernel held.
                got = 0
                with pytest.raises(ConnectionResetError):
                    while chunk := await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 30):
                        got += len(chunk)
                assert got < 8 << 20
            assert 0 < serving.budget.peak <= BULK_SLICE
            assert serving.budget.used == 0

    run(main())


def test_a_parked_stream_reads_nothing_until_a_window_lands(tmp_path: Path) -> None:
    """Idle streams cost a timer and a heartbeat each: no ring read per heartbeat (each
    heartbeat was followed by two reads finding nothing)."""

    async def main() -> None:
        load = "synthetic://?rate=0&keys=10&event_bytes=100&events_per_window=1&limit=5"
        async with running_relay(relay_config(tmp_path, {"load": load})) as r:
            await r.wait_for_scn("load", 5)
            buffer = r.relay.buffers["load"]
            sizes = count_reads(buffer)
            resp = await open_stream(r, checkpoint=Checkpoint(5).dumps(), heartbeat_ms=50)
            framer = StreamFramer()
            frames = await frames_until(
                resp, framer, lambda fs: sum(f.kind == "heartbeat" for f in fs) >= 10)
            assert len(sizes) <= 1, len(sizes)
            # A window that lands is read and written at once.
            await asyncio.to_thread(buffer.append_window, 6, [_event(6)])
            frames = await frames_until(resp, framer, at_scn(6))
            assert frames[-1].checkpoint == Checkpoint(6)
            resp.close()

    run(main())


def test_heartbeats_come_within_their_interval_and_spread_over_it() -> None:
    """Never later than ``heartbeat_ms`` (clients count missed heartbeats), and not all
    at the same instant for streams that went idle together."""
    delays = [heartbeat_delay(1.0) for _ in range(200)]
    assert all(HEARTBEAT_SPREAD <= d <= 1.0 for d in delays)
    assert max(delays) - min(delays) > (1.0 - HEARTBEAT_SPREAD) / 2


def _event(scn: int) -> bytes:
    from databus.event import Op, encode_event

    return encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=scn, value=b"v" * 100)
