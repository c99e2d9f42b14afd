"""Relay throughput to many consumers (paper Figure 13; issue 15), as a ratio of the raw
loopback socket ceiling measured in the same run, polling and streaming consumers, the
relay on 1 or more serving processes and on asyncio's loop or uvloop, and a Redis
Streams fan-out peer.

    .venv/bin/python benchmarks/relay_throughput.py [--quick] [--duration 3] [--repeat 3]
        [--events 20000] [--consumers 1,5,10,20] [--max-bytes 4194304]
        [--mode poll|stream|both] [--framed] [--workers 1,2] [--event-loop asyncio,uvloop]
        [--client-consumers 10] [--redis] [--redis-consumers 10] [--profile]

Setup: for each ``--workers`` N and ``--event-loop`` L, a ``databus relay --config``
child process (``[relay] workers = N`` in its TOML; ``DATABUS_EVENT_LOOP=L`` in its
environment; a relay whose config has no ``workers`` field yet serves from one process
and the N > 1 settings are skipped with a message) whose one buffer is prefilled by the
synthetic fetcher (``rate=0&limit=N``, 2.5 KB events, one event per window); the
benchmark waits until the buffer's max SCN is N and the workers run. Then, for each
consumer count, that many consumer *processes*, as fast as they can, for
``--duration`` seconds, starting over at the oldest window whenever they reach the
newest (a "pass"):

- ``poll``: ``/v1/stream`` over one persistent HTTP/1.1 connection each
  (``http.client``, body read with ``readinto`` into a reused buffer), ``max_bytes``
  per request;
- ``stream``: ``/v1/stream?follow=true`` (``max_bytes`` per write), the chunked body
  read with aiohttp's ``resp.content.readany()`` (on ``--consumer-loop``), bytes
  counted; a pass ends (the stream is closed, a new one opened) once the pass's event
  bytes have arrived. These consumers do not look at the bytes: one stream per relay
  setting is cut into frames by the client library's ``StreamFramer`` first (every
  event header checked, every checkpoint event decoded), which gives the pass's bytes
  and events; events/s of the raw consumers = their bytes x events per stream byte;
- ``stream+framer`` (``--framed``): the same consumers feeding every chunk to
  ``StreamFramer``, events counted from the checkpoint events (proof that what is
  counted is events; costs the consumers CPU);
- ``DatabusClient poll|stream`` (``--client-consumers``, 10 by default, at that count
  only): one ``DatabusClient`` per process (``streaming=False|True``, a no-op Consumer
  of the batch API counting each ``on_window``'s events (issue 30; values not read),
  checkpoints to a memory store, 4 MiB requests), a new client for each pass.

Aggregate MB/s = sum of the consumers' bytes / their elapsed time; events/s likewise.

Reference (same run, same consumer counts): the raw loopback ceiling, one Python server
process with a thread per connection doing ``sendall`` of a 1 MiB buffer, and N client
processes doing ``recv_into`` a 1 MiB buffer. It is measured before each relay run and
every ratio is to the best ceiling of the whole run at that consumer count.

The Redis Streams peer (``--redis``): Debian's ``redis-server`` on a free port (``--save
"" --appendonly no``, in a temp dir, killed at the end), one stream holding the relay's
own data events (wire format, 2.5 KB) as entries ``{e: event, ts: time_ns}``, and
``--redis-consumers`` redis-py (hiredis) consumer processes each XREAD-ing the stream
whole, ``COUNT --redis-count`` at a time, from the first entry again after the last;
its runs alternate with the relay's. Relay events/s / Redis events/s is the issue's
figure (goal >= 2 at 10 consumers).

Filtered run: 10 polling consumers, consumer i with ``{"<source>": {"type": "mod", "n":
10, "buckets": [i]}}``. Events scanned = the windows the consumers' checkpoints advanced
over (one data event per window, so = data events the relay looked at; it also parses
each window's EOW header). Per relay core = scanned / relay CPU seconds (utime + stime
from /proc/<pid>/stat of the relay and its worker processes over the interval).

Second reference, the "aiohttp floor" (10 consumers, first relay setting only): the
relay's own first response (body and headers) served from memory by a bare aiohttp app
to the same consumers, in three modes: ``ready`` (``web.Response`` of a ready-made
body: the relay with a free read), ``copy`` (one copy of the body per request, as a
scan-free read out of the mmap must do) and ``copy-split`` (the copy, with the headers
written apart so aiohttp does not join them with the body, which it does on Python <
3.12.9).

Noise: the machine is shared. Each figure is the best of ``--repeat`` runs, reference
and relay runs alternating (another job only ever lowers a figure); every line shows the
CPU cores used by the server (all the relay's processes), the consumers, everything
else ("other", of which "softirq" is the kernel's softirq work: loopback TCP, mostly the
run's own traffic, charged to no process) and the hypervisor's steal (a VM on a shared
host) meanwhile.

Before the HTTP runs, an in-process breakdown times the serving path without HTTP (the
real ``Relay`` and the server's own filter predicate): one ``EventBuffer.read`` of
``max_bytes``, the bare copy out of the mmap, the join aiohttp does, a whole filtered
and unfiltered pass (``--no-breakdown`` skips it).

``--profile`` adds one more run of each kind (10 consumers) against the first relay
setting with py-spy sampling the relay's main process and prints its top frames per
thread (needs ``py-spy`` in the venv; the figures come from the runs without the
profiler).
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import multiprocessing as mp
import os
import platform
import socket
import struct
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

from _relay_proc import (
    RedisServer,
    RelayProcess,
    WorkersUnsupported,
    code_version,
    cpu_seconds,
    default_consumer_loop,
    loadavg,
    machine_cpu,
    run_on,
    softirq_seconds,
    start_pyspy,
    summarize_pyspy,
)

MIB = 1 << 20
CTX = mp.get_context("fork")


@dataclass
class RunResult:
    consumers: int
    bytes: int
    seconds: float  # mean consumer elapsed
    mb_s: float  # aggregate MB/s (MB = 10**6 bytes)
    requests: int = 0
    scanned: int = 0
    passes: float = 0.0
    relay_cpu: float = 0.0  # relay CPU seconds over the interval
    machine_busy: float = 0.0  # busy share of all cores over the interval, steal excluded
    steal: float = 0.0  # cores the hypervisor took meanwhile (a shared host)
    clients_cpu: float = 0.0  # consumer processes' CPU seconds over the interval
    events_s: float = 0.0  # data events/s delivered, summed over the consumers (0: not counted)
    softirq: float = 0.0  # cores in softirq work meanwhile (loopback TCP; part of "other")

    @property
    def others(self) -> float:
        """Cores taken by other jobs and the hypervisor: "other" less softirq, plus steal."""
        return max(0.0, self.other_cpu - self.softirq) + self.steal

    @property
    def other_cpu(self) -> float:
        """Cores used by anything else (other jobs on the machine, the kernel's softirq
        work, this script)."""
        return max(0.0, (self.machine_busy * (os.cpu_count() or 1) * self.seconds
                         - self.relay_cpu - self.clients_cpu) / self.seconds)


# -- the loopback ceiling -------------------------------------------------------------


def _ceiling_server(port_q: Any, n: int, chunk: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(n + 8)
    port_q.put(srv.getsockname()[1])
    data = bytes(chunk)

    def pump(conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    conn.sendall(data)
            except OSError:
                pass

    threads = []
    for _ in range(n):
        conn, _ = srv.accept()
        t = threading.Thread(target=pump, args=(conn,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    srv.close()


def _ceiling_client(port: int, chunk: int, ready: Any, go: MpEvent, start: Any,
                    duration: float, out: Any) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    buf = bytearray(chunk)
    view = memoryview(buf)
    ready.release()
    go.wait()
    deadline = start.value + duration
    total = 0
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        n = sock.recv_into(view)
        if not n:
            break
        total += n
    elapsed = time.monotonic() - t0
    sock.close()
    out.put((total, elapsed, 0, 0, 0.0))


def loopback_ceiling(consumers: int, duration: float, chunk: int = MIB) -> RunResult:
    port_q = CTX.Queue()
    server = CTX.Process(target=_ceiling_server, args=(port_q, consumers, chunk), daemon=True)
    server.start()
    port = port_q.get(timeout=20)
    def make(i: int, ready: Any, go: MpEvent, start: Any, out: Any) -> Any:
        return CTX.Process(target=_ceiling_client,
                           args=(port, chunk, ready, go, start, duration, out), daemon=True)

    pid = server.pid
    assert pid is not None
    return _run_clients(consumers, duration, lambda: cpu_seconds(pid), make, cleanup=server)


# -- the aiohttp floor: the same HTTP stack serving a ready-made body -----------------


FLOOR_MODES = {
    "ready": "web.Response(body=ready-made bytes)",
    "copy": "web.Response(body=bytes(view)): one copy per request, as a scan-free read",
    "copy-split": "the copy, headers written apart (StreamResponse): no join with the body",
}


def _static_server(port: int, body: bytes, checkpoint: str, max_scn: str, mode: str) -> None:
    from aiohttp import web

    view = memoryview(bytearray(body))  # a stand-in for the mmap

    headers = {"Content-Type": "application/x-databus-events",
               "X-Databus-Checkpoint": checkpoint, "X-Databus-Min-Scn": "1",
               "X-Databus-Max-Scn": max_scn, "X-Databus-Buffer": "bench"}

    async def ready(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, headers=headers)

    async def copy(request: web.Request) -> web.StreamResponse:
        return web.Response(body=bytes(view), headers=headers)

    async def copy_split(request: web.Request) -> web.StreamResponse:
        data = bytes(view)
        resp = web.StreamResponse(headers=headers)
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(b"")  # sends the headers alone: no join with the body
        await resp.write(data)
        await resp.write_eof()
        return resp

    handlers = {"ready": ready, "copy": copy, "copy-split": copy_split}
    app = web.Application()
    app.router.add_get("/v1/stream", handlers[mode])
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=lambda *_: None)


def aiohttp_floor(relay: RelayProcess, consumers: int, duration: float, max_bytes: int,
                  mode: str) -> RunResult:
    """The relay's own first response (body and headers) served from memory by a bare
    aiohttp app, to the same consumers: what the relay would reach if reading the
    buffer cost nothing."""
    import urllib.request

    with urllib.request.urlopen(f"{relay.url}/v1/stream?max_bytes={max_bytes}") as resp:
        body = resp.read()
        cp = resp.headers["X-Databus-Checkpoint"]
    scn = str(json.loads(cp)["window_scn"])  # one response = one "pass" for the consumers
    from _relay_proc import free_port

    port = free_port()
    server = CTX.Process(target=_static_server, args=(port, body, cp, scn, mode), daemon=True)
    server.start()
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

        def make(i: int, ready: Any, go: MpEvent, start: Any, out: Any) -> Any:
            return CTX.Process(target=_relay_consumer, args=(
                port, {"max_bytes": str(max_bytes)}, ready, go, start, duration, out),
                daemon=True)

        pid = server.pid
        assert pid is not None
        return _run_clients(consumers, duration, lambda: cpu_seconds(pid), make)
    finally:
        server.terminate()
        server.join(timeout=10)


# -- relay consumers ------------------------------------------------------------------


def _relay_consumer(port: int, query: dict[str, str], ready: Any, go: MpEvent, start: Any,
                    duration: float, out: Any) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    max_bytes = int(query["max_bytes"])
    buf = bytearray(max_bytes + MIB)
    view = memoryview(buf)
    cp: str | None = None
    cp_scn = 0
    total = requests = scanned = 0
    passes = 0.0
    buffer_events = 0

    def pull() -> tuple[int, str, int]:
        q = dict(query)
        if cp is not None:
            q["checkpoint"] = cp
        conn.request("GET", "/v1/stream?" + urllib.parse.urlencode(q))
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        length = int(resp.headers["Content-Length"])
        got = 0
        while got < length:
            n = resp.readinto(view[got:length])
            if not n:
                raise RuntimeError("short body")
            got += n
        resp.read()  # let http.client finish the response (keeps the connection)
        return got, resp.headers["X-Databus-Checkpoint"], int(resp.headers["X-Databus-Max-Scn"])

    pull()  # warm the connection (and the page cache) before the clock starts
    ready.release()
    go.wait()
    deadline = start.value + duration
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        got, new_cp, max_scn = pull()
        requests += 1
        total += got
        new_scn = json.loads(new_cp)["window_scn"]
        scanned += max(new_scn - cp_scn, 0)
        buffer_events = max_scn
        if new_scn >= max_scn:  # reached the newest window: start a new pass
            passes += 1
            cp, cp_scn = None, 0
        else:
            cp, cp_scn = new_cp, new_scn
    elapsed = time.monotonic() - t0
    if buffer_events:
        passes += cp_scn / buffer_events
    conn.close()
    # One data event per window: unfiltered, the windows advanced over are the events.
    out.put((total, elapsed, requests, scanned, passes, 0 if "filter" in query else scanned))


def relay_run(relay: RelayProcess, consumers: int, duration: float, max_bytes: int,
              filters: list[str] | None = None) -> RunResult:
    def make(i: int, ready: Any, go: MpEvent, start: Any, out: Any) -> Any:
        query = {"max_bytes": str(max_bytes)}
        if filters is not None:
            query["filter"] = filters[i]
        return CTX.Process(target=_relay_consumer,
                           args=(relay.port, query, ready, go, start, duration, out), daemon=True)

    return _run_clients(consumers, duration, relay.cpu_seconds, make)


# -- streaming consumers (GET /v1/stream?follow=true) ---------------------------------


@dataclass(frozen=True)
class StreamPass:
    """What one stream from the oldest window to the newest carries, measured once by
    framing it (``StreamFramer``): the bytes of its events (windows, EOWs included),
    the control events' bytes, the writes and the data events."""

    body_bytes: int
    control_bytes: int
    writes: int
    events: int
    max_scn: int


def measure_pass(relay: RelayProcess, max_bytes: int) -> StreamPass:
    """Streams the whole buffer once through ``StreamFramer`` (every event header
    checked, every checkpoint event decoded), in this process."""
    from databus.client._relay_stream import StreamFramer

    max_scn = int(relay.buffer_status()["max_scn"])
    conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=60)
    conn.request("GET", "/v1/stream?" + urllib.parse.urlencode(
        {"follow": "true", "max_bytes": str(max_bytes)}))
    resp = conn.getresponse()
    if resp.status != 200 or resp.headers.get("X-Databus-Streaming") != "1":
        raise RuntimeError(f"no stream: HTTP {resp.status} {resp.read()[:300]!r}")
    framer = StreamFramer()
    body = total = writes = 0
    scn = 0
    while scn < max_scn:
        data = resp.read1(1 << 20)
        if not data:
            raise RuntimeError("the stream ended before the newest window")
        total += len(data)
        for frame in framer.feed(data):
            if frame.kind == "error":
                raise RuntimeError(f"in-band error: {frame.error}")
            if frame.kind == "write":
                assert frame.checkpoint is not None
                writes += 1
                body += len(frame.body)
                scn = frame.checkpoint.window_scn
    conn.close()
    return StreamPass(body, total - body, writes, max_scn, max_scn)


def _stream_consumer(port: int, query: dict[str, str], spec: StreamPass, framed: bool,
                     loop: str, ready: Any, go: MpEvent, start: Any, duration: float,
                     out: Any) -> None:
    """One streaming consumer: streams from the oldest window, reading the chunked body
    with aiohttp's ``resp.content.readany()``; at the newest window it closes the
    stream and starts a new one (a pass). Raw (``framed`` False): counts bytes, and a
    pass ends once it got the pass's event bytes; framed: feeds every chunk to the
    client library's ``StreamFramer`` and counts the windows its checkpoint events
    advance over (one data event per window)."""

    import aiohttp

    from databus.client._relay_stream import StreamFramer

    url = f"http://127.0.0.1:{port}/v1/stream"
    params = {**query, "follow": "true"}

    async def one_pass(session: aiohttp.ClientSession, stop_at: float,
                       limit: int) -> tuple[int, int, float]:
        """(bytes, events, passes) of one stream: whole, or cut at ``stop_at``
        (monotonic) or after ``limit`` bytes."""
        framer = StreamFramer() if framed else None
        got = events = scn = 0
        async with session.get(url, params=params) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
            content = resp.content
            while True:
                data = await content.readany()
                if not data:
                    raise RuntimeError("the stream ended")
                got += len(data)
                if framer is not None:
                    for frame in framer.feed(data):
                        if frame.kind == "write":
                            assert frame.checkpoint is not None
                            new = frame.checkpoint.window_scn
                            events += new - scn
                            scn = new
                        elif frame.kind == "error":
                            raise RuntimeError(f"in-band error: {frame.error}")
                    if scn >= spec.max_scn:
                        return got, events, 1.0
                elif got >= spec.body_bytes:  # at most the last checkpoint event early
                    return got, per_byte(got), 1.0
                if got >= limit or time.monotonic() >= stop_at:
                    if framer is not None:
                        return got, events, scn / spec.max_scn
                    return got, per_byte(got), got / spec.body_bytes

    def per_byte(got: int) -> int:
        # Raw: the events in ``got`` stream bytes (all windows alike: one 2.5 KB event
        # and its EOW, a checkpoint event per write).
        return round(got * spec.events / (spec.body_bytes + spec.control_bytes))

    async def run() -> tuple[int, float, int, float, int]:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
        conn = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            await one_pass(session, time.monotonic() + 30, 4 * MIB)  # warm up
            ready.release()
            go.wait()  # nothing else runs on this loop meanwhile
            deadline = start.value + duration
            total = requests = events = 0
            passes = 0.0
            t0 = time.monotonic()
            while time.monotonic() < deadline:
                got, n, part = await one_pass(session, deadline, 1 << 62)
                total += got
                events += n
                passes += part
                requests += 1
            return total, time.monotonic() - t0, requests, passes, events

    total, elapsed, requests, passes, events = run_on(loop, run())
    out.put((total, elapsed, requests, 0, passes, events))


def stream_run(relay: RelayProcess, consumers: int, duration: float, max_bytes: int,
               spec: StreamPass, framed: bool, loop: str) -> RunResult:
    def make(i: int, ready: Any, go: MpEvent, start: Any, out: Any) -> Any:
        return CTX.Process(target=_stream_consumer, args=(
            relay.port, {"max_bytes": str(max_bytes)}, spec, framed, loop, ready, go, start,
            duration, out), daemon=True)

    return _run_clients(consumers, duration, relay.cpu_seconds, make)


# -- DatabusClient consumers ----------------------------------------------------------


def _client_consumer(url: str, streaming: bool, max_scn: int, ready: Any, go: MpEvent,
                     start: Any, duration: float, out: Any) -> None:
    """One ``DatabusClient`` (a no-op Consumer of the batch API counting the events of
    each ``on_window``, values checked but not read; default options but 4 MiB
    requests, 16 MiB buffered; checkpoints to a memory store): from
    the oldest window to the newest, then a new client from the oldest again (a pass),
    until the deadline."""
    from databus.client import Consumer, DatabusClient, MemoryCheckpointStore, Window

    class Counter(Consumer):
        def __init__(self, client: DatabusClient) -> None:
            self.events = 0
            self.client = client

        def on_window(self, window: Window) -> None:
            self.events += len(window.events)
            if window.scn >= max_scn:
                self.client.stop()

    def new_client() -> tuple[DatabusClient, Counter]:
        client = DatabusClient([url], checkpoint_store=MemoryCheckpointStore(),
                               max_request_bytes=4 * MIB, max_buffered_bytes=16 * MIB,
                               streaming=streaming, name="bench")
        counter = Counter(client)
        client.register(counter)
        return client, counter

    client, counter = new_client()  # warm up: one short run (imports, first connection)
    threading.Timer(0.3, client.stop).start()
    client.run()
    ready.release()
    go.wait()
    deadline = start.value + duration
    events = passes = 0
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        client, counter = new_client()
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), client.stop)
        timer.start()
        client.run()
        timer.cancel()
        events += counter.events
        passes += 1
    elapsed = time.monotonic() - t0
    out.put((0, elapsed, passes, 0, events / max_scn, events))


def client_run(relay: RelayProcess, consumers: int, duration: float, streaming: bool,
               max_scn: int) -> RunResult:
    def make(i: int, ready: Any, go: MpEvent, start: Any, out: Any) -> Any:
        return CTX.Process(target=_client_consumer, args=(
            relay.url, streaming, max_scn, ready, go, start, duration, out), daemon=True)

    return _run_clients(consumers, duration, relay.cpu_seconds, make)


# -- the Redis Streams peer -----------------------------------------------------------


def relay_events(relay: RelayProcess) -> list[bytes]:
    """The buffer's data events, each in wire format (header, key, Avro value)."""
    from databus.event import iter_events

    with urllib.request.urlopen(f"{relay.url}/v1/stream?max_bytes={64 * MIB}",
                                timeout=120) as resp:
        body = resp.read()
    return [body[off : off + h.total_length] for off, h in iter_events(body)
            if h.source_id >= 0]


def redis_fill(port: int, events: list[bytes]) -> None:
    """One stream ``bench``: an entry per event, ``e`` = its bytes, ``ts`` = the time
    of the XADD (ns, as the latency peer writes it)."""
    import redis

    r = redis.Redis(port=port)
    r.delete("bench")
    pipe = r.pipeline(transaction=False)
    for i, event in enumerate(events):
        pipe.xadd("bench", {"e": event, "ts": time.time_ns()})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    assert r.xlen("bench") == len(events)


def _redis_consumer(port: int, count: int, ready: Any, go: MpEvent, start: Any,
                    duration: float, out: Any) -> None:
    """One redis-py (hiredis) consumer reading the stream whole, ``XREAD COUNT
    count`` from the first entry to the last, then from the first again (a pass)."""
    import redis

    r = redis.Redis(port=port)
    r.xread({"bench": "0-0"}, count=count)  # warm up the connection
    ready.release()
    go.wait()
    deadline = start.value + duration
    total = events = requests = 0
    passes = 0.0
    last: bytes | str = "0-0"
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        reply: Any = r.xread({"bench": last}, count=count)
        requests += 1
        entries = reply[0][1] if reply else []
        for _entry_id, fields in entries:
            total += len(fields[b"e"])
        events += len(entries)
        if len(entries) < count:
            last = "0-0"
            passes += 1
        else:
            last = entries[-1][0]
    elapsed = time.monotonic() - t0
    out.put((total, elapsed, requests, 0, passes, events))


def redis_run(port: int, server_pid: int, consumers: int, duration: float,
              count: int) -> RunResult:
    def make(i: int, ready: Any, go: MpEvent, start: Any, out: Any) -> Any:
        return CTX.Process(target=_redis_consumer, args=(
            port, count, ready, go, start, duration, out), daemon=True)

    return _run_clients(consumers, duration, lambda: cpu_seconds(server_pid), make)


def _run_clients(consumers: int, duration: float, server_cpu: Callable[[], float] | None,
                 make: Any, cleanup: Any = None) -> RunResult:
    """Starts ``consumers`` processes (``make(i, ready, go, start, out)``), lets them go
    together and measures ``duration`` seconds. Each puts (bytes, elapsed, requests,
    scanned, passes[, events]) on ``out``. ``server_cpu()``: the server's CPU seconds
    so far (the relay's whole process tree: its workers serve too)."""
    ready = CTX.Semaphore(0)
    go = CTX.Event()
    start = CTX.Value("d", 0.0)
    out = CTX.Queue()
    procs = [make(i, ready, go, start, out) for i in range(consumers)]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=60):
            raise TimeoutError("a consumer did not get ready")
    time.sleep(0.2)
    cpu0 = server_cpu() if server_cpu else 0.0
    ccpu0 = sum(cpu_seconds(p.pid) for p in procs)
    busy0, steal0, tot0 = machine_cpu()
    irq0 = softirq_seconds()
    start.value = time.monotonic()
    go.set()
    time.sleep(duration)
    cpu1 = server_cpu() if server_cpu else 0.0
    ccpu1 = sum(cpu_seconds(p.pid) for p in procs)
    busy1, steal1, tot1 = machine_cpu()
    irq1 = softirq_seconds()
    results = [out.get(timeout=60 + duration) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    if cleanup is not None:
        cleanup.join(timeout=10)
        if cleanup.is_alive():
            cleanup.terminate()
    total = sum(r[0] for r in results)
    mb_s = sum(r[0] / r[1] for r in results) / 1e6
    events_s = sum(r[5] / r[1] for r in results if len(r) > 5)
    return RunResult(
        events_s=events_s,
        softirq=(irq1 - irq0) / max(tot1 - tot0, 1e-9) * (os.cpu_count() or 1),
        consumers=consumers,
        bytes=total,
        seconds=sum(r[1] for r in results) / len(results),
        mb_s=mb_s,
        requests=sum(r[2] for r in results),
        scanned=sum(r[3] for r in results),
        passes=sum(r[4] for r in results),
        relay_cpu=cpu1 - cpu0,
        machine_busy=(busy1 - busy0) / max(tot1 - tot0, 1e-9),
        steal=(steal1 - steal0) / max(tot1 - tot0, 1e-9) * (os.cpu_count() or 1),
        clients_cpu=ccpu1 - ccpu0,
    )


# -- in-process breakdown -------------------------------------------------------------


class _Query:
    """Just enough of an aiohttp request for ``subscription`` (it reads ``query``)."""

    def __init__(self, **query: str) -> None:
        from multidict import MultiDict

        self.query = MultiDict(query)


def breakdown(events: int, event_bytes: int, max_bytes: int, capacity_mb: int,
              filter_n: int, repeat: int = 5) -> tuple[list[tuple[str, float, str]], float]:
    """Per-request costs of the serving path without HTTP, in this process.

    Uses the real ``Relay`` (in-process, synthetic fetcher) and the server's own
    ``subscription`` to build the filter, so it measures the code the relay
    runs. Returns (name, seconds per operation, note) rows, best of ``repeat``, and the
    windows/s of a minimal Python header walk (this machine's speed, right now: the
    floor of any per-event scan written in Python).
    """
    from databus.checkpoint import Checkpoint
    from databus.config import BufferConfig, RelayConfig
    from databus.relay._relay import Relay
    from databus.relay._subscription import subscription
    from databus.security import ANYONE

    tmp = Path(tempfile.mkdtemp(prefix="databus-breakdown-"))
    uri = (f"synthetic://?rate=0&keys=100000&event_bytes={event_bytes}"
           f"&events_per_window=1&update_ratio=0.5&limit={events}&seed=1")
    relay = Relay(RelayConfig(data_dir=tmp, port=0, buffers=(
        BufferConfig(name="bench", capacity_mb=capacity_mb, source=uri),)))
    relay.start()
    try:
        buf = relay.buffers["bench"]
        deadline = time.monotonic() + 120
        while (buf.state().max_scn or 0) < events:
            if time.monotonic() > deadline:
                raise TimeoutError("in-process buffer did not fill")
            time.sleep(0.05)
        source = relay.catalog.sources()[0].name

        def best(fn: Any) -> float:
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return min(times)

        ring = buf._ring  # the floor: one copy out of the mmap
        first = buf.read(Checkpoint.flexible(), max_bytes=max_bytes)
        body = first.data
        n_bytes = len(body)
        rows: list[tuple[str, float, str]] = []
        t_copy = best(lambda: bytes(ring[0:n_bytes]))
        rows.append(("copy max_bytes out of the mmap (bytes(memoryview))", t_copy,
                     f"{n_bytes / t_copy / 1e6:,.0f} MB/s: the floor of a safe read"))
        t_read = best(lambda: buf.read(Checkpoint.flexible(), max_bytes=max_bytes))
        rows.append((f"EventBuffer.read unfiltered ({first.events} events)", t_read,
                     f"{n_bytes / t_read / 1e6:,.0f} MB/s, "
                     f"{(t_read - t_copy) / max(first.events, 1) * 1e9:,.0f} ns/event "
                     "beyond the copy"))
        head = b"HTTP/1.1 200 OK\r\n" + b"X" * 300 + b"\r\n\r\n"
        t_join = best(lambda: b"".join((head, body)))
        rows.append(("b''.join((headers, body)) (aiohttp on Python < 3.12.9)", t_join,
                     f"{n_bytes / t_join / 1e6:,.0f} MB/s"))
        t_cp = best(lambda: Checkpoint.loads(first.checkpoint.dumps()))
        rows.append(("checkpoint loads + dumps (per request)", t_cp, ""))
        spec = json.dumps({source: {"type": "mod", "n": filter_n, "buckets": [0]}})
        _, select, _, _ = subscription(relay, _Query(filter=spec), ANYONE)  # type: ignore[arg-type]

        def filtered_pass() -> None:
            cp = Checkpoint.flexible()
            while True:
                r = buf.read(cp, max_bytes=max_bytes, select=select)
                if r.wait_after_scn is not None:
                    return
                cp = r.checkpoint

        t_f = best(filtered_pass)
        rows.append((f"filtered pass over {events} events (mod {filter_n}, 1 bucket)", t_f,
                     f"{events / t_f:,.0f} events scanned/s "
                     f"({t_f / events * 1e9:,.0f} ns/event incl. its EOW)"))

        def unfiltered_scan_pass() -> None:
            cp = Checkpoint.flexible()
            while True:
                r = buf.read(cp, max_bytes=max_bytes)
                if r.wait_after_scn is not None:
                    return
                cp = r.checkpoint

        t_u = best(unfiltered_scan_pass)
        rows.append((f"unfiltered pass over {events} events", t_u,
                     f"{events / t_u:,.0f} events/s, {events * (event_bytes + 64) / t_u / 1e6:,.0f}"
                     " MB/s"))

        total_at = struct.Struct(">12xI").unpack_from
        state = buf.state()

        def walk() -> None:
            # A fresh buffer that never wrapped: no padding, positions are offsets.
            pos, tail = state.head, state.tail
            while pos < tail:
                pos += total_at(ring, pos)[0]

        assert state.head == 0 and state.tail <= buf.capacity
        t_w = best(walk)
        rows.append(("minimal header walk (unpack total_length, advance), no filter, no copy",
                     t_w, f"{events / t_w:,.0f} windows/s: the Python floor of a scan"))
        return rows, events / t_w
    finally:
        relay.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


# -- main -----------------------------------------------------------------------------


def cpu_note(r: RunResult) -> str:
    """Server (relay: all its processes) CPU, consumers' CPU and everything else, in
    cores."""
    return (f"cpu: server {r.relay_cpu / r.seconds:.2f}, consumers "
            f"{r.clients_cpu / r.seconds:.2f}, other {r.other_cpu:.2f} (softirq "
            f"{r.softirq:.2f}), steal {r.steal:.2f}")


def best(runs: list[RunResult]) -> RunResult:
    return max(runs, key=lambda r: (r.events_s, r.mb_s) if r.bytes == 0 else (r.mb_s, 0.0))


@dataclass
class Row:
    """A kind of consumer against one relay setting at one consumer count."""

    setting: str  # "workers=1 asyncio"
    kind: str  # "poll", "stream", "stream+framer", "DatabusClient stream", ...
    consumers: int
    runs: list[RunResult]

    @property
    def best(self) -> RunResult:
        return best(self.runs)


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    parser.add_argument("--events", type=int, default=20_000, help="events in the buffer")
    parser.add_argument("--event-bytes", type=int, default=2500)
    parser.add_argument("--consumers", default="1,5,10,20", help="comma-separated counts")
    parser.add_argument("--max-bytes", type=int, default=4 * MIB,
                        help="max_bytes per request (per write, for streams)")
    parser.add_argument("--mode", choices=("poll", "stream", "both"), default="both",
                        help="polling consumers, streaming consumers (follow=true) or both")
    parser.add_argument("--framed", action="store_true",
                        help="also a streaming series whose consumers cut the bytes into "
                             "frames with the client's StreamFramer (proof they are events)")
    parser.add_argument("--workers", default="1,2",
                        help="relay.workers settings, comma-separated (skipped with a "
                             "message when the relay has no such field yet)")
    parser.add_argument("--event-loop", default="asyncio,uvloop",
                        help="DATABUS_EVENT_LOOP settings for the relay, comma-separated "
                             "(asyncio, uvloop; auto: the relay's own choice)")
    parser.add_argument("--consumer-loop", choices=("asyncio", "uvloop"),
                        default=default_consumer_loop(),
                        help="the streaming consumers' event loop (default: uvloop when "
                             "installed)")
    parser.add_argument("--client-consumers", type=int, default=10,
                        help="DatabusClient consumer processes (a no-op Consumer each), "
                             "for each mode (0: skip)")
    parser.add_argument("--redis", action="store_true",
                        help="the Redis Streams peer: redis-server, redis-py + hiredis")
    parser.add_argument("--redis-consumers", type=int, default=10)
    parser.add_argument("--redis-count", type=int, default=1000, help="XREAD COUNT")
    parser.add_argument("--filtered-consumers", type=int, default=10,
                        help="consumers of the filtered run (0: skip it)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per figure, reference and relay alternating; best kept")
    parser.add_argument("--floor-consumers", type=int, default=10,
                        help="consumers for the aiohttp-floor references (0: skip them)")
    parser.add_argument("--profile", action="store_true",
                        help="extra 10-consumer runs with py-spy on the relay")
    parser.add_argument("--no-breakdown", action="store_true",
                        help="skip the in-process cost breakdown of the serving path")
    parser.add_argument("--quick", action="store_true",
                        help="2 s runs, 10,000 events, consumers 1,10, one run (unless given)")
    args = parser.parse_args()
    if args.quick:  # shorter defaults; flags given explicitly still win
        for name, value in (("duration", 2.0), ("events", 10_000), ("consumers", "1,10"),
                            ("repeat", 1)):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    counts = [int(c) for c in _csv(args.consumers)]
    modes = ["poll", "stream"] if args.mode == "both" else [args.mode]
    workers_list = [int(w) for w in _csv(args.workers)]
    loops = [None if x == "auto" else x for x in _csv(args.event_loop)]
    for loop in loops:
        if loop not in (None, "asyncio", "uvloop"):
            parser.error(f"--event-loop: asyncio, uvloop or auto, not {loop!r}")
    window_bytes = args.event_bytes + 64  # + the EOW event
    capacity_mb = max(4, (args.events * window_bytes * 5 // 4) // MIB + 1)

    from databus import batch

    print(f"# relay throughput: {platform.python_version()}, {os.cpu_count()} cores, "
          f"{args.events} events of {args.event_bytes} B, max_bytes={args.max_bytes}, "
          f"{args.duration:g} s per run, modes {'+'.join(modes)}, workers {args.workers}, "
          f"event loops {args.event_loop}, streaming consumers on {args.consumer_loop}; "
          f"event core {batch.IMPLEMENTATION}; {loadavg()}; "
          f"{code_version()}")

    walk_rate = 0.0
    if not args.no_breakdown:
        print("\n## in-process breakdown (no HTTP; best of 5)")
        cost_rows, walk_rate = breakdown(args.events, args.event_bytes, args.max_bytes,
                                         capacity_mb, args.filtered_consumers or 10)
        for name, secs, note in cost_rows:
            print(f"{secs * 1e3:9.3f} ms  {name}  {note}")
        print()

    print(f"each figure: best of {args.repeat} runs, the loopback ceiling and the relay "
          "(and the Redis peer) alternating (other jobs on a shared machine only ever lower "
          "a figure); ratios are to the best ceiling of the whole run at that consumer "
          "count", flush=True)
    uri = (f"synthetic://?rate=0&keys=100000&event_bytes={args.event_bytes}"
           f"&events_per_window=1&update_ratio=0.5&limit={args.events}&seed=1")
    ceilings: dict[int, list[RunResult]] = collections.defaultdict(list)
    rows: list[Row] = []
    redis_runs: list[RunResult] = []
    skipped: list[str] = []
    filtered: dict[str, RunResult] = {}
    redis_server: RedisServer | None = None
    redis_filled = False
    first = True

    def ceiling(n: int) -> float:
        return max(r.mb_s for r in ceilings[n])

    def show(row: Row) -> None:
        r = row.best
        ratio = f"ratio {r.mb_s / ceiling(row.consumers):.3f}" if r.bytes else "           "
        mb = f"{r.mb_s:9.1f} MB/s" if r.bytes else " " * 14
        print(f"  {row.kind:<22} consumers={row.consumers:3d} {mb} {ratio}  "
              f"{r.events_s:11,.0f} events/s  {cpu_note(r)}  {r.requests} requests  "
              f"passes {r.passes:.1f}  (runs: "
              + ", ".join(f"{x.mb_s:.0f} MB/s" if x.bytes else f"{x.events_s:,.0f}/s"
                          for x in row.runs) + ")", flush=True)

    try:
        if args.redis:
            redis_server = RedisServer().__enter__()
            print(f"redis-server {redis_server.version()} pid {redis_server.pid} on port "
                  f"{redis_server.port} (--save '' --appendonly no), redis-py + hiredis; "
                  f"XREAD COUNT {args.redis_count}", flush=True)
        for workers in workers_list:
            for loop in loops:
                setting = f"workers={workers} {loop or 'auto'}"
                try:
                    relay = RelayProcess(uri, capacity_mb, workers=workers, event_loop=loop)
                except WorkersUnsupported as exc:
                    print(f"\n## {setting}: SKIPPED: {exc}", flush=True)
                    skipped.append(f"{setting}: {exc}")
                    continue
                try:
                    relay.start()
                    fill = relay.wait_for_scn(args.events)
                    relay.wait_serving(workers)
                except (RuntimeError, TimeoutError) as exc:
                    print(f"\n## {setting}: SKIPPED: the relay did not serve: {exc}",
                          flush=True)
                    skipped.append(f"{setting}: the relay did not serve")
                    relay.stop()
                    continue
                try:
                    status = relay.buffer_status()
                    source = relay.source_name()
                    print(f"\n## {setting}: relay pid {relay.pid}, {relay.serving()}; "
                          f"buffer prefilled in {fill:.1f} s, {status['used_bytes'] / 1e6:.1f}"
                          f" MB, {status['events']} events, capacity {capacity_mb} MiB, "
                          f"source {source}", flush=True)
                    spec = measure_pass(relay, args.max_bytes)
                    print(f"  one stream pass (framed once here): {spec.events} events, "
                          f"{spec.body_bytes / 1e6:.1f} MB of events in {spec.writes} writes "
                          f"+ {spec.control_bytes} bytes of checkpoint events", flush=True)
                    if redis_server is not None and not redis_filled:
                        events = relay_events(relay)
                        redis_fill(redis_server.port, events)
                        redis_filled = True
                        print(f"  Redis stream filled: {len(events)} entries of "
                              f"{len(events[0])} B (the relay's data events, wire format)",
                              flush=True)
                    for n in counts:
                        kinds = list(modes) + (["stream+framer"] if args.framed
                                               and "stream" in modes else [])
                        here = {k: Row(setting, k, n, []) for k in kinds}
                        with_redis = redis_server is not None and n == args.redis_consumers
                        for _ in range(args.repeat):
                            ceilings[n].append(loopback_ceiling(n, args.duration))
                            for k, row in here.items():
                                if k == "poll":
                                    row.runs.append(relay_run(relay, n, args.duration,
                                                              args.max_bytes))
                                else:
                                    row.runs.append(stream_run(
                                        relay, n, args.duration, args.max_bytes, spec,
                                        framed=k == "stream+framer", loop=args.consumer_loop))
                            if with_redis:
                                assert redis_server is not None
                                redis_runs.append(redis_run(
                                    redis_server.port, redis_server.pid, n, args.duration,
                                    args.redis_count))
                        c = max(ceilings[n][-args.repeat:], key=lambda r: r.mb_s)
                        print(f"  {'loopback ceiling':<22} consumers={n:3d} {c.mb_s:9.1f} MB/s"
                              f"  {cpu_note(c)}  (runs: "
                              + ", ".join(f"{x.mb_s:.0f}" for x in ceilings[n][-args.repeat:])
                              + ")", flush=True)
                        for row in here.values():
                            rows.append(row)
                            show(row)
                        if with_redis:
                            r = best(redis_runs)
                            print(f"  {'Redis XREAD (peer)':<22} consumers={n:3d} "
                                  f"{r.mb_s:9.1f} MB/s  {r.events_s:,.0f} events/s, best so "
                                  f"far  {cpu_note(r)}", flush=True)
                    if args.client_consumers:
                        n = args.client_consumers
                        for mode in modes:
                            row = Row(setting, f"DatabusClient {mode}", n, [
                                client_run(relay, n, args.duration, mode == "stream",
                                           spec.max_scn) for _ in range(args.repeat)])
                            rows.append(row)
                            show(row)
                    if args.filtered_consumers:
                        nf = args.filtered_consumers
                        filters = [json.dumps({source: {"type": "mod", "n": nf,
                                                        "buckets": [i]}}) for i in range(nf)]
                        f_runs = [relay_run(relay, nf, args.duration, args.max_bytes, filters)
                                  for _ in range(args.repeat)]
                        fr = max(f_runs, key=lambda r: r.scanned / max(r.relay_cpu, 1e-9))
                        filtered[setting] = fr
                        per_core = fr.scanned / max(fr.relay_cpu, 1e-9)
                        print(f"  filtered poll consumers={nf:3d} (mod {nf}): {fr.scanned:,} "
                              f"events scanned, {fr.scanned / fr.seconds:,.0f}/s wall, "
                              f"{cpu_note(fr)} -> {per_core:,.0f} events scanned per relay "
                              f"CPU-second; {fr.mb_s:.1f} MB/s served  (runs: "
                              + ", ".join(f"{x.scanned / max(x.relay_cpu, 1e-9):,.0f}"
                                          for x in f_runs) + ")", flush=True)
                        if walk_rate:
                            print(f"  that is {per_core / walk_rate:.3f} of the minimal "
                                  f"header walk ({walk_rate:,.0f} windows/s in this process)")
                    if first and args.floor_consumers:
                        n = args.floor_consumers
                        for mode, name in FLOOR_MODES.items():
                            f = best([aiohttp_floor(relay, n, args.duration, args.max_bytes,
                                                    mode) for _ in range(args.repeat)])
                            ref = f" ratio {f.mb_s / ceiling(n):.3f}" if ceilings[n] else ""
                            print(f"  floor [{mode}] consumers={n:3d} {f.mb_s:9.1f} MB/s{ref}"
                                  f"  {cpu_note(f)}  {name}", flush=True)
                    if first and args.profile:
                        profile(relay, args, source, modes, spec)
                    first = False
                finally:
                    relay.stop()
    finally:
        if redis_server is not None:
            redis_server.__exit__()

    summary(rows, ceilings, redis_runs, args, skipped)
    print(f"end: {loadavg()}")


def profile(relay: RelayProcess, args: argparse.Namespace, source: str, modes: list[str],
            spec: StreamPass) -> None:
    """One more 10-consumer run of each kind with py-spy sampling the relay."""
    nf = args.filtered_consumers or 10
    filters = [json.dumps({source: {"type": "mod", "n": nf, "buckets": [i]}})
               for i in range(nf)]
    for label in [*modes, "filtered"]:
        out = Path(tempfile.mkdtemp(prefix="databus-prof-")) / f"{label}.txt"
        spy = start_pyspy(relay.pid, args.duration, out)
        if spy is None:
            print("py-spy not found: pip install py-spy into the venv")
            return
        time.sleep(0.3)
        if label == "stream":
            stream_run(relay, 10, args.duration, args.max_bytes, spec, framed=False,
                       loop=args.consumer_loop)
        else:
            relay_run(relay, 10 if label == "poll" else nf, args.duration, args.max_bytes,
                      filters if label == "filtered" else None)
        _, err = spy.communicate(timeout=60)
        print(f"\n## py-spy of the relay's main process, 10 {label} consumers ({out})")
        if spy.returncode:
            print(err.decode(errors="replace")[-2000:])
        print(summarize_pyspy(out, seconds=args.duration))


def summary(rows: list[Row], ceilings: dict[int, list[RunResult]],
            redis_runs: list[RunResult], args: argparse.Namespace,
            skipped: list[str]) -> None:
    """The issue's figures: 10 unfiltered consumers / the loopback ceiling (goal >= 0.5),
    relay events/s / Redis's at the same consumer count (goal >= 2)."""
    print("\n## summary (ratios to the best loopback ceiling of the run at that count)")
    print("| setting | consumers | kind | MB/s | / loopback ceiling | events/s | / Redis "
          "| server cores | other jobs + steal cores (softirq left out) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    redis = best(redis_runs) if redis_runs else None
    for row in rows:
        r = row.best
        refs = ceilings.get(row.consumers)
        ceiling = max(c.mb_s for c in refs) if refs else 0.0
        vs_ceiling = f"{r.mb_s / ceiling:.3f}" if r.bytes and ceiling else "-"
        vs_redis = (f"{r.events_s / redis.events_s:.2f}"
                    if redis is not None and row.consumers == redis.consumers else "-")
        print(f"| {row.setting} | {row.consumers} | {row.kind} | "
              + (f"{r.mb_s:,.0f}" if r.bytes else "-")
              + f" | {vs_ceiling} | {r.events_s:,.0f} | {vs_redis} | "
              f"{r.relay_cpu / r.seconds:.2f} | {r.others:.2f} |")
    if redis is not None:
        top = max((c.mb_s for c in ceilings.get(redis.consumers, [])), default=float("nan"))
        print(f"| Redis Streams peer | {redis.consumers} | XREAD COUNT {args.redis_count} | "
              f"{redis.mb_s:,.0f} | {redis.mb_s / top:.3f}"
              f" | {redis.events_s:,.0f} | 1.00 | {redis.relay_cpu / redis.seconds:.2f} | "
              f"{redis.others:.2f} |")
    for n in sorted(n for n in ceilings if ceilings[n]):
        c = max(ceilings[n], key=lambda r: r.mb_s)
        print(f"loopback ceiling, {n} consumers: best {c.mb_s:,.0f} MB/s of "
              f"{len(ceilings[n])} runs ({', '.join(f'{x.mb_s:.0f}' for x in ceilings[n])})")
    for text in skipped:
        print(f"skipped: {text}")
    goal_rows = [r for r in rows if r.consumers == 10 and r.kind in ("poll", "stream")]
    for row in goal_rows:
        ratio = row.best.mb_s / max(c.mb_s for c in ceilings[10])  # measured with the row
        print(f"goal >= 0.5 of the ceiling, 10 consumers, {row.setting}, {row.kind}: "
              f"{ratio:.3f} ({'met' if ratio >= 0.5 else 'missed'})")
    if redis is not None:
        for row in rows:
            if row.consumers == redis.consumers and row.kind in (
                    "stream", "DatabusClient stream"):
                ratio = row.best.events_s / redis.events_s
                print(f"goal >= 2x Redis's events/s, {row.consumers} consumers, "
                      f"{row.setting}, {row.kind}: {ratio:.2f} "
                      f"({'met' if ratio >= 2 else 'missed'})")


if __name__ == "__main__":
    main()
