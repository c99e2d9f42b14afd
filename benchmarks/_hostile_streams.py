"""The streaming clients of ``relay_hostile.py --mode streaming`` (issue 27, item 13): normal
streaming consumers that time every event they receive, and the hostile ones (idle,
never-reading, one byte per second). Raw asyncio protocols, no aiohttp: the clients share
the machine's two cores with the relay they measure, so they must cost little. Not a
benchmark by itself.
"""

from __future__ import annotations

import array
import asyncio
import json
import socket
import struct
import time
import urllib.parse
from typing import Any

from _relay_proc import default_consumer_loop, run_on

_FIELDS = struct.Struct(">I8xq2xh")  # from offset 12: total_length, timestamp_ns, source_id
_HEARTBEAT = -5
_ERROR = -4


def stream_request(sources: str, checkpoint: dict[str, int], *, max_bytes: int = 1 << 20,
                   heartbeat_ms: int | None = None) -> bytes:
    params = {"follow": "true", "sources": sources, "max_bytes": str(max_bytes),
              "checkpoint": json.dumps(checkpoint)}
    if heartbeat_ms is not None:
        params["heartbeat_ms"] = str(heartbeat_ms)
    query = urllib.parse.urlencode(params)
    return f"GET /v1/stream?{query} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()


class StreamReader(asyncio.Protocol):
    """One ``follow=true`` response, parsed as it arrives: the HTTP head, then chunks of
    whole events. ``on_events(body, now_ns)`` gets each chunk's bytes (whole events)."""

    def __init__(self, request: bytes, timed: bool) -> None:
        self.request = request
        self.timed = timed
        self.buf = bytearray()
        self.head_done = False
        self.need: int | None = None  # bytes of the current chunk still to come (+2 CRLF)
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status = 0
        self.lats: array.array[int] = array.array("q")
        self.times: array.array[int] = array.array("q")
        self.heartbeats = 0
        self.errors = 0
        self.events = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport) or hasattr(transport, "write")
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.time_ns()
        buf = self.buf
        buf += data
        if not self.head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status = int(buf[9:12])
            del buf[:end + 4]
            self.head_done = True
        while True:
            if self.need is None:
                eol = buf.find(b"\r\n")
                if eol < 0:
                    return
                size = int(buf[:eol], 16)
                del buf[:eol + 2]
                if size == 0:
                    return
                self.need = size
            if len(buf) < self.need + 2:
                return
            chunk = bytes(buf[:self.need])
            del buf[:self.need + 2]
            self.need = None
            self._events(chunk, now)

    def _events(self, chunk: bytes, now: int) -> None:
        off = 0
        while off < len(chunk):
            total, ts, source_id = _FIELDS.unpack_from(chunk, off + 12)
            if source_id >= 0:
                self.events += 1
                if self.timed:
                    self.lats.append(now - ts)
                    self.times.append(now)
            elif source_id == _HEARTBEAT:
                self.heartbeats += 1
            elif source_id == _ERROR:
                self.errors += 1
            off += total


async def _open(port: int, request: bytes, timed: bool, rcvbuf: int | None = None
                ) -> tuple[asyncio.Transport, StreamReader]:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    transport, proto = await loop.create_connection(lambda: StreamReader(request, timed),
                                                    sock=sock)
    return transport, proto  # type: ignore[return-value]


# -- the normal consumers ----------------------------------------------------------------


def normal_streams(port: int, count: int, source: str, ready: Any, stop: Any, out: Any
                   ) -> None:
    """``count`` streams from the newest window, each reading all it gets; puts
    (receipt times, latencies, reconnects, in-band errors) when ``stop`` is set."""

    async def run() -> None:
        request = stream_request(source, {"window_scn": -2})
        streams = [await _open(port, request, True) for _ in range(count)]
        ready.set()
        reconnects = 0
        while not stop.is_set():
            await asyncio.sleep(0.1)
            for i, (_, proto) in enumerate(streams):
                if proto.closed.done():  # should not happen: count it, keep measuring
                    reconnects += 1
                    streams[i] = await _open(port, request, True)
        times: array.array[int] = array.array("q")
        lats: array.array[int] = array.array("q")
        errors = 0
        for transport, proto in streams:
            times.extend(proto.times)
            lats.extend(proto.lats)
            errors += proto.errors
            transport.close()
        out.put((times.tobytes(), lats.tobytes(), reconnects, errors))

    run_on(default_consumer_loop(), run())


# -- the hostile ones --------------------------------------------------------------------


def hostile_streams(port: int, idle: int, non_readers: int, dribblers: int, source: str,
                    idle_source: str, ready: Any, stop: Any, out: Any) -> None:
    """``idle`` streams parked on an idle buffer (reading their heartbeats), ``non_readers``
    streams from the oldest window with 8 MiB writes that never read (4 KiB receive
    buffer), ``dribblers`` streams that read one byte a second; every one reconnects when
    the relay cuts it. Puts counts when ``stop`` is set."""
    counts = {"idle_connected": 0, "idle_heartbeats": 0, "idle_dropped": 0,
              "non_reader_cut": 0, "dribbler_cut": 0, "connect_errors": 0}

    async def connect(request: bytes, timed: bool = False, rcvbuf: int | None = None
                      ) -> tuple[asyncio.Transport, StreamReader] | None:
        try:
            return await _open(port, request, timed, rcvbuf)
        except OSError:
            counts["connect_errors"] += 1
            await asyncio.sleep(0.5)
            return None

    async def idle_stream(gate: asyncio.Semaphore) -> None:
        request = stream_request(idle_source, {"window_scn": -2})
        async with gate:
            got = await connect(request)
        if got is None:
            return
        transport, proto = got
        counts["idle_connected"] += 1
        try:
            await proto.closed
            counts["idle_dropped"] += 1
        finally:
            counts["idle_heartbeats"] += proto.heartbeats
            transport.close()

    async def stalled(kind: str, start: dict[str, int], pace: float | None) -> None:
        """Never reads (``pace`` None) or reads one byte per ``pace`` seconds."""
        request = stream_request(source, start, max_bytes=8 << 20)
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, ("127.0.0.1", port))
                await loop.sock_sendall(sock, request)
                while not stop.is_set():
                    await asyncio.sleep(pace if pace is not None else 0.5)
                    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
                    if info[0] != 1:  # tcpi_state: 1 is ESTABLISHED
                        counts[kind] += 1
                        break
                    if pace is not None:
                        try:
                            if not sock.recv(1):
                                counts[kind] += 1
                                break
                        except BlockingIOError:
                            pass
            except OSError:
                counts[kind] += 1
                await asyncio.sleep(0.2)
            finally:
                sock.close()

    async def run() -> None:
        gate = asyncio.Semaphore(64)  # connects in flight (the listen backlog is finite)
        tasks = [asyncio.create_task(idle_stream(gate)) for _ in range(idle)]
        while counts["idle_connected"] + counts["connect_errors"] < idle:
            await asyncio.sleep(0.1)
        tasks += [asyncio.create_task(stalled("non_reader_cut", {"window_scn": -1}, None))
                  for _ in range(non_readers)]
        tasks += [asyncio.create_task(stalled("dribbler_cut", {"window_scn": -2}, 1.0))
                  for _ in range(dribblers)]
        await asyncio.sleep(2.0)  # the connects done with (their accepts, their GC)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        out.put(counts)

    run_on(default_consumer_loop(), run())
