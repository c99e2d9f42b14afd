"""A ``databus relay`` process with hostile streaming consumers attached (issue 27, item
13): hundreds of idle streams, streams that never read and streams that read one byte a
second, beside normal streaming consumers.

The promise (docs/relay.md, "Streaming subscriptions" and "Limits"), without any speed
threshold: the normal consumers get every window, once, whole and in order; a stream
that reads nothing is cut after ``write_timeout_s`` (reset, its buffers freed); and the
relay's anonymous memory grows by less than the bound docs/relay.md gives for its
limits. How much the hostile ones slow the normal ones is measured by
``benchmarks/relay_hostile.py --mode streaming`` (benchmarks/README.md).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.parse
from pathlib import Path

import aiohttp
import pytest

from databus.client._relay_stream import StreamFramer
from tests.relay_harness import RelayProcess, parse_windows
from tests.tiers import count
from tests.waiting import async_wait_until

WINDOWS = count("DATABUS_HOSTILE_STREAM_WINDOWS", smoke=3000, full=12000)
RATE = 400  # windows per second, one 2.5 KB event each
IDLE, NEVER_READING, DRIBBLERS, NORMAL = 400, 10, 5, 4
MAX_CONNECTIONS = 600
STREAM_MEMORY_MB = 32
WRITE_TIMEOUT_S = 2.0


def memory_bound_mib() -> float:
    """docs/relay.md, "Memory bound": the stream budget plus, per connection (the
    overflow allowance included), 64 KiB body floor + 64 KiB request head + 128 KiB
    write buffer + ~20 KiB of objects."""
    connections = MAX_CONNECTIONS + max(16, MAX_CONNECTIONS // 8)
    return STREAM_MEMORY_MB + connections * (64 + 64 + 128 + 20) / 1024


def rss_anon_mib(pid: int) -> float:
    """Anonymous resident memory: the ring files' mapped pages are left out."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


def stream_request(sources: str, checkpoint: int, **params: str) -> bytes:
    query = urllib.parse.urlencode({"follow": "true", "sources": sources,
                                    "checkpoint": json.dumps({"window_scn": checkpoint}),
                                    **params})
    return f"GET /v1/stream?{query} HTTP/1.1\r\nHost: relay\r\n\r\n".encode()


def established(sock: socket.socket) -> bool:
    """Still open from the relay's side? (TCP state, without reading: a peek would see the
    unread bytes still queued.)"""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except OSError:
        return False
    return info[0] == 1  # tcpi_state ESTABLISHED


async def open_raw(port: int, request: bytes, rcvbuf: int | None = None) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    return sock


async def idle_stream(port: int, stop: asyncio.Event, beats: list[int]) -> None:
    """Parked on the idle buffer, reading (and dropping) its heartbeats and windows."""
    loop = asyncio.get_running_loop()
    sock = await open_raw(port, stream_request("idle.events", -2, heartbeat_ms="100"))
    try:
        while not stop.is_set():
            if not await loop.sock_recv(sock, 65536):
                return
            beats[0] += 1
    finally:
        sock.close()


async def dribbler(port: int, stop: asyncio.Event) -> None:
    """Reads one byte a second until the relay cuts it."""
    sock = await open_raw(port, stream_request("synthetic.events", -2), rcvbuf=4096)
    try:
        while not stop.is_set() and established(sock):
            await asyncio.sleep(1.0)
            try:
                if not sock.recv(1):
                    return
            except BlockingIOError:
                pass
            except OSError:
                return
    finally:
        sock.close()


async def normal_consumer(session: aiohttp.ClientSession, url: str) -> bytes:
    """Everything from the oldest window to the last one, through the client's framer."""
    params = {"follow": "true", "sources": "synthetic.events",
              "checkpoint": json.dumps({"window_scn": -1})}
    framer = StreamFramer()
    body = bytearray()
    async with session.get(url + "/v1/stream", params=params) as resp:
        assert resp.status == 200, await resp.text()
        while True:
            chunk = await resp.content.readany()
            assert chunk, "the stream ended"
            for frame in framer.feed(chunk):
                assert frame.kind != "error", frame.error
                if frame.kind == "write":
                    body += frame.body
                    assert frame.checkpoint is not None
                    if frame.checkpoint.window_scn >= WINDOWS \
                            and frame.checkpoint.window_offset == -1:
                        return bytes(body)


def test_normal_streams_get_every_window_beside_hostile_ones(tmp_path: Path) -> None:
    relay = RelayProcess(tmp_path, {
        "load": (f"synthetic://?rate={RATE}&keys=100000&event_bytes=2500"
                 f"&events_per_window=1&limit={WINDOWS}&seed=7"),
        # A window a second: every one wakes the 400 idle streams together.
        "idle": "synthetic://?rate=1&events_per_window=1&source=idle.events&seed=8",
    }, capacity_mb=64, workers=1)
    text = relay.config_path.read_text()
    relay.config_path.write_text(text.replace("[[relay.buffers]]", (
        f"write_timeout_s = {WRITE_TIMEOUT_S}\nmax_connections = {MAX_CONNECTIONS}\n"
        f"max_stream_memory_mb = {STREAM_MEMORY_MB}\n[[relay.buffers]]"), 1))
    relay.start()
    assert relay.proc is not None
    pid = relay.proc.pid
    peak = [0.0]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], rss_anon_mib(pid))
            time.sleep(0.05)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        beats = [0]
        idle = [asyncio.create_task(idle_stream(relay.port, stop, beats))
                for _ in range(IDLE)]
        never = [await open_raw(relay.port, stream_request(
            "synthetic.events", -1, max_bytes=str(8 << 20)), rcvbuf=4096)
            for _ in range(NEVER_READING)]
        dribblers = [asyncio.create_task(dribbler(relay.port, stop))
                     for _ in range(DRIBBLERS)]
        try:
            async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as session:
                bodies = await asyncio.gather(*(normal_consumer(session, relay.url)
                                                for _ in range(NORMAL)))
            for body in bodies:
                windows = parse_windows(body)  # every CRC checked on the way
                assert [w.scn for w in windows] == list(range(1, WINDOWS + 1))
                assert all(len(w.events) == w.eow_count == 1 for w in windows)
            # The never-reading ones are cut (reset) write_timeout_s after their buffers
            # filled, and got far less than the 8 MiB they asked for.
            await async_wait_until(
                lambda: not any(established(s) for s in never),
                f"the {NEVER_READING} never-reading streams cut", 120)
            for sock in never:
                got = 0
                with pytest.raises(ConnectionResetError):
                    while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), 30):
                        got += len(chunk)
                assert got < 8 << 20
            assert beats[0] > 0 and all(not t.done() for t in idle)  # still served
        finally:
            stop.set()
            for sock in never:
                sock.close()
            for t in idle + dribblers:
                t.cancel()
            await asyncio.gather(*idle, *dribblers, return_exceptions=True)

    try:
        before = rss_anon_mib(pid)
        threading.Thread(target=sample, daemon=True).start()
        asyncio.run(asyncio.wait_for(main(), 600))
        sampling.set()
        grown = peak[0] - before
        assert grown < memory_bound_mib(), (before, peak[0], memory_bound_mib())
    finally:
        sampling.set()
        relay.kill()
