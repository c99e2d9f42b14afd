"""Relay end-to-end latency and consumption rate under load (paper Figures 14 and 15),
long-polling and streaming consumers side by side, and a Redis Streams peer (issue 15).

    .venv/bin/python benchmarks/relay_latency.py [--quick] [--duration 3] [--repeat 2]
        [--rates 100,1000,2000] [--consumers 1,10,20,40,100] [--mode poll,stream]
        [--wait-ms 1000] [--poll-ms 0] [--workers 1] [--event-loop asyncio|uvloop]
        [--redis] [--no-partitioned] [--profile] [--plot benchmarks/relay_latency.png]

Setup, per update rate R: a ``databus relay --config`` child process (``--workers``
serving processes; ``DATABUS_EVENT_LOOP`` from ``--event-loop``, else the relay's own
choice) whose synthetic fetcher writes R windows/s of one 2.5 KB event each
(``events_per_window=1``). For each consumer count C and each mode, C consumers run in
ceil(C / 10) consumer processes, one asyncio loop with up to 10 consumers (one aiohttp
session, one connection per consumer) in each:

- ``poll``: long polls (``/v1/stream?wait_ms=...``), each consumer with its own
  checkpoint, starting at the newest window; latency counted when the whole response
  body has been read;
- ``stream``: one streaming subscription each (``/v1/stream?follow=true``, starting at
  ``latest``), its chunked body read with ``resp.content.readany()`` and cut at event
  boundaries by a header walk (no CRC checks, as the poll consumers); latency counted
  when the event's last byte has arrived.

After a warm-up, for ``--duration`` seconds, every data event received counts: latency =
receipt time (``time.time_ns()`` right after the read that completed it) minus the
event's header ``timestamp_ns`` (set by the synthetic fetcher via ``time.time_ns()``
just before it appends the window). Same machine, same clock.

Figures per configuration: p50 and p99 latency; consumption rate per consumer and in
aggregate, as a ratio of the production rate (windows the relay's max SCN advanced
over during the same interval, times C: every consumer should get every event); the
relay's CPU (all its processes, in cores); requests per second the relay answered (for
streams: the writes it made, one checkpoint event each).

The Redis Streams peer (``--redis``), at the highest rate after the relay series: a
``redis-server`` (Debian's, on a free port, nothing on disk), a producer process
XADDing R entries/s (paced as the synthetic fetcher paces its windows) of the same
2.5 KB event bytes with a ``ts`` field = ``time.time_ns()`` at the XADD, one stream
(trimmed to about 50,000 entries), and C redis-py (hiredis, asyncio) consumers each on
its own connection doing ``XREAD BLOCK 1000 COUNT 1000`` from ``$`` and then from the
last id it got; latency = receipt time minus ``ts``. Its "relay" CPU column is
redis-server plus the producer.

Reference for timing (same run, same relay, no consumers attached): the bare loopback
HTTP round trip of ``GET /healthz`` from one aiohttp client, p50 and p99.

The partitioned series (skip it with ``--no-partitioned``), the paper's "2000 updates/s
(with partitioning)": at the highest rate, consumer i of C gets only mod-C bucket i, so the
relay's outbound bytes equal its inbound bytes whatever C.

Noise: the machine is shared and tail latency is what other jobs hurt first; each row
shows the CPU cores used by the relay, the consumer processes, everything else
("other") and the hypervisor's steal (this is a VM on a shared host: steal slows every
process here without showing in any of them) during the interval; "sirq" is the part
of "other" the kernel spent in softirq work (loopback TCP: mostly the run's own traffic,
charged to no process), left out of what counts as other jobs. Each configuration
runs ``--repeat`` times (plus up to ``--retries`` more while no run was quiet, i.e.
other jobs and steal took more than ``--quiet-cores``); kept is the lowest p99 among
the quiet runs (or among all runs if none was quiet: the "other" and "steal" columns
then say so).

``--profile`` adds one run at the highest rate and consumer count with py-spy sampling
the relay's main process (its top frames per thread are printed; the figures come
from the other runs).

The plot (matplotlib, optional) has p99 latency against consumers at each rate for
long-poll and streaming side by side (p50 dashed; the Redis peer's p99; the paper's
knee, 15-20 ms at 20 consumers and 2,000 updates/s; the goals) and the consumption
ratio against consumers.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import functools
import json
import math
import multiprocessing as mp
import os
import platform
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _relay_proc import (
    RedisServer,
    RelayProcess,
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

CTX = mp.get_context("fork")
HERE = Path(__file__).resolve().parent
# From offset 12 of an event header: total_length u32, (scn), timestamp_ns i64,
# (partition_id), source_id i16.
_FIELDS = struct.Struct(">I8xq2xh")
_HEAD = 12 + _FIELDS.size  # bytes of a header up to its source id
LATEST = json.dumps({"window_scn": -2})
CHECKPOINT_SOURCE_ID = -3
MODES = ("poll", "stream")
# The paper's knee (Figure 15): p99 of 15-20 ms at 20 consumers, 2,000 updates/s.
PAPER_KNEE = (20, 15.0, 20.0)
# Issue 15's goals for streaming consumers at 2,000 updates/s: (consumers, p99 ms).
GOALS = ((40, 5.0), (100, 20.0))


@dataclass
class ConfigResult:
    label: str
    rate: float  # nominal
    consumers: int
    produced_rate: float  # windows/s the buffer's max SCN advanced
    received: list[int]  # data events per consumer in the interval
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    relay_cpu: float  # cores (all the relay's processes; for Redis: server + producer)
    consumers_cpu: float  # all consumer processes, in cores
    machine_busy: float  # share of all cores, steal excluded
    steal: float  # cores the hypervisor took (a shared host)
    requests: int  # polls answered; for streams the writes (checkpoint events)
    empty: int
    errors: int = 0
    mode: str = "poll"  # poll, stream or redis
    softirq: float = 0.0  # cores in softirq work (loopback TCP: charged to no process)
    partitioned: bool = False
    per_consumer: list[float] = field(default_factory=list)

    @property
    def other_cpu(self) -> float:
        """Cores used by anything else on the machine (other users' jobs, the kernel's
        softirq work not charged to a process, this script's parent); steal apart."""
        return max(0.0, self.machine_busy * (os.cpu_count() or 1) - self.relay_cpu
                   - self.consumers_cpu)

    @property
    def interference(self) -> float:
        """Cores taken from this run by others: other jobs plus the hypervisor's steal
        (the kernel's softirq work, mostly this run's own loopback TCP, left out)."""
        return max(0.0, self.other_cpu - self.softirq) + self.steal

    @property
    def consumer_rate(self) -> float:
        return sum(self.received) / len(self.received) / self.seconds

    @property
    def aggregate_rate(self) -> float:
        return sum(self.received) / self.seconds

    @property
    def ratio(self) -> float:
        """Consumption / production: every consumer should get every event (of its
        bucket, partitioned)."""
        expected = self.produced_rate * (1 if self.partitioned else self.consumers)
        return self.aggregate_rate / expected if expected else float("nan")


def percentile(sorted_values: list[int] | array.array[int], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[k])


# -- consumers ------------------------------------------------------------------------


async def _consume(session: Any, url: str, query: dict[str, str], cp: str, window: Any,
                   go: Any, poll_s: float, lat: array.array[int], stats: list[int]) -> None:
    """One long-polling consumer; appends latencies (ns) of events received in window."""
    unpack = _FIELDS.unpack_from
    while True:
        q = dict(query)
        q["checkpoint"] = cp
        try:
            async with session.get(url, params=q) as resp:
                body = await resp.read()
                now = time.time_ns()
                if resp.status != 200:
                    stats[2] += 1
                    await asyncio.sleep(0.05)
                    continue
                cp = resp.headers["X-Databus-Checkpoint"]
        except Exception:  # count it, keep polling
            stats[2] += 1
            await asyncio.sleep(0.05)
            continue
        start_ns, end_ns = window[0], window[1]
        if go.is_set() and now > end_ns:
            return
        inside = go.is_set() and start_ns <= now <= end_ns
        if inside:
            stats[1] += 1
            if not body:
                stats[3] += 1
        off = 0
        n = len(body)
        while off < n:
            total, ts, source_id = unpack(body, off + 12)
            if source_id >= 0 and inside:
                lat.append(now - ts)
                stats[0] += 1
            off += total
        if poll_s:
            await asyncio.sleep(poll_s)


async def _consume_stream(resp: Any, window: Any, go: Any, lat: array.array[int],
                          stats: list[int]) -> None:
    """One streaming consumer on an open ``follow=true`` response: reads what the socket
    gives (``readany``), walks the event headers across chunk boundaries, and appends
    the latency of each data event whose last byte arrived inside the window."""
    unpack = _FIELDS.unpack_from
    content = resp.content
    pending = b""
    try:
        while True:
            data = await content.readany()
            now = time.time_ns()
            if not data:
                stats[2] += 1  # the relay ended the stream
                return
            start_ns, end_ns = window[0], window[1]
            if go.is_set() and now > end_ns:
                return
            inside = go.is_set() and start_ns <= now <= end_ns
            buf = pending + data if pending else data
            off = 0
            n = len(buf)
            while n - off >= _HEAD:
                total, ts, source_id = unpack(buf, off + 12)
                if off + total > n:
                    break
                if inside:
                    if source_id >= 0:
                        lat.append(now - ts)
                        stats[0] += 1
                    elif source_id == CHECKPOINT_SOURCE_ID:
                        stats[1] += 1
                off += total
            pending = buf[off:] if off < n else b""
    finally:
        resp.release()


async def _consume_redis(client: Any, window: Any, go: Any, lat: array.array[int],
                         stats: list[int]) -> None:
    """One Redis Streams consumer: XREAD BLOCK from "$", then from the last id."""
    last: bytes | str = "$"
    while True:
        reply = await client.xread({"bench": last}, count=1000, block=1000)
        now = time.time_ns()
        start_ns, end_ns = window[0], window[1]
        if go.is_set() and now > end_ns:
            return
        inside = go.is_set() and start_ns <= now <= end_ns
        if not reply:
            continue
        entries = reply[0][1]
        if inside:
            stats[1] += 1
            for _entry_id, fields in entries:
                lat.append(now - int(fields[b"ts"]))
            stats[0] += len(entries)
        last = entries[-1][0]


def _consumer_process(mode: str, address: str, queries: list[dict[str, str]], window: Any,
                      go: Any, ready: Any, poll_s: float, loop: str, out: Any) -> None:
    async def run() -> None:
        lats = [array.array("q") for _ in queries]
        stats = [[0, 0, 0, 0] for _ in queries]  # events, requests, errors, empty
        if mode == "redis":
            import redis.asyncio as aioredis

            clients = [aioredis.Redis(port=int(address), single_connection_client=True)
                       for _ in queries]
            for c in clients:
                await c.ping()
            ready.release()
            await asyncio.gather(*(_consume_redis(c, window, go, lats[i], stats[i])
                                   for i, c in enumerate(clients)))
            for c in clients:
                await c.aclose()
            out.put(([lat.tobytes() for lat in lats], stats))
            return
        import aiohttp

        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            if mode == "stream":
                # Open every stream before the clock starts; a "latest" stream is told
                # its concrete position at once and misses nothing that lands after.
                resps = []
                for q in queries:
                    resp = await session.get(address, params={
                        **q, "follow": "true", "checkpoint": LATEST})
                    if resp.status != 200 or resp.headers.get("X-Databus-Streaming") != "1":
                        raise RuntimeError(f"no stream: HTTP {resp.status}")
                    resps.append(resp)
                ready.release()
                await asyncio.gather(*(_consume_stream(r, window, go, lats[i], stats[i])
                                       for i, r in enumerate(resps)))
            else:
                # Open the connections and find the newest SCN before the clock starts.
                # A -2 checkpoint is re-resolved on every read, so a long poll with it
                # would never return data: each consumer starts after the newest SCN.
                cps = []
                for q in queries:
                    async with session.get(address, params={**q, "checkpoint": LATEST,
                                                            "wait_ms": "0"}) as r:
                        await r.read()
                        cps.append(json.dumps(
                            {"window_scn": int(r.headers["X-Databus-Max-Scn"])}))
                ready.release()
                await asyncio.gather(*(
                    _consume(session, address, q, cps[i], window, go, poll_s, lats[i],
                             stats[i])
                    for i, q in enumerate(queries)
                ))
        out.put(([lat.tobytes() for lat in lats], stats))

    run_on(loop, run())


def _cpu_of(procs: list[Any]) -> float:
    return sum((cpu_seconds(p.pid) for p in procs if p.pid is not None), 0.0)


@dataclass
class Target:
    """What the consumers read: a relay (poll and stream modes) or the Redis peer."""

    address: str  # the relay's /v1/stream URL, or Redis's port
    server_cpu: Callable[[], float]  # CPU seconds of the serving side so far
    produced: Callable[[], int]  # windows (entries) produced so far


def relay_target(relay: RelayProcess) -> Target:
    return Target(relay.url + "/v1/stream", relay.cpu_seconds,
                  lambda: int(relay.buffer_status()["max_scn"] or 0))


def run_config(target: Target, mode: str, label: str, rate: float, consumers: int,
               duration: float, warmup: float, wait_ms: int, poll_ms: float,
               filters: list[str] | None, per_process: int,
               consumer_loop: str = "asyncio") -> ConfigResult:
    queries = []
    for i in range(consumers):
        q = {"max_bytes": str(4 << 20)}
        if mode == "poll":
            q["wait_ms"] = str(wait_ms)
        if filters is not None:
            q["filter"] = filters[i]
        queries.append(q)
    groups = [queries[i : i + per_process] for i in range(0, consumers, per_process)]
    window = CTX.Array("q", [0, 0], lock=False)
    go = CTX.Event()
    ready = CTX.Semaphore(0)
    out = CTX.Queue()
    procs = [CTX.Process(target=_consumer_process,
                         args=(mode, target.address, g, window, go, ready, poll_ms / 1000,
                               consumer_loop, out), daemon=True)
             for g in groups]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=60):
            raise TimeoutError("a consumer process did not get ready")
    now = time.time_ns()
    window[0] = now + int(warmup * 1e9)
    window[1] = window[0] + int(duration * 1e9)
    go.set()
    time.sleep(max(0.0, (window[0] - time.time_ns()) / 1e9))
    scn0 = target.produced()
    cpu0 = target.server_cpu()
    ccpu0 = _cpu_of(procs)
    busy0, steal0, tot0 = machine_cpu()
    irq0 = softirq_seconds()
    t0 = time.monotonic()
    time.sleep(max(0.0, (window[1] - time.time_ns()) / 1e9))
    scn1 = target.produced()
    cpu1 = target.server_cpu()
    ccpu1 = _cpu_of(procs)
    busy1, steal1, tot1 = machine_cpu()
    irq1 = softirq_seconds()
    elapsed = time.monotonic() - t0
    results = [out.get(timeout=60 + wait_ms / 1000) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    lat_all: array.array[int] = array.array("q")
    received: list[int] = []
    requests = errors = empty = 0
    for lat_blobs, stats in results:
        for blob in lat_blobs:
            lat_all.frombytes(blob)
        for s in stats:
            received.append(s[0])
            requests += s[1]
            errors += s[2]
            empty += s[3]
    ordered = sorted(lat_all)
    return ConfigResult(
        label=label, rate=rate, consumers=consumers,
        produced_rate=(scn1 - scn0) / elapsed,
        received=received, seconds=duration,
        p50_ms=percentile(ordered, 0.50) / 1e6,
        p99_ms=percentile(ordered, 0.99) / 1e6,
        max_ms=(ordered[-1] / 1e6) if ordered else float("nan"),
        relay_cpu=(cpu1 - cpu0) / elapsed,
        consumers_cpu=(ccpu1 - ccpu0) / elapsed,
        machine_busy=(busy1 - busy0) / max(tot1 - tot0, 1e-9),
        steal=(steal1 - steal0) / max(tot1 - tot0, 1e-9) * (os.cpu_count() or 1),
        requests=requests, empty=empty, errors=errors, mode=mode,
        softirq=(irq1 - irq0) / max(tot1 - tot0, 1e-9) * (os.cpu_count() or 1),
        partitioned=filters is not None,
    )


# -- the Redis Streams peer -----------------------------------------------------------


def _redis_producer(port: int, rate: float, event: bytes, stop: Any, produced: Any) -> None:
    """XADDs ``rate`` entries/s, paced as the synthetic fetcher paces its windows (due
    times from a start, no sleep under 1 ms, a reset when 1 s behind); the entries due
    at once go in one pipeline (the fetcher appends in-process, with no round trip: a
    round trip per entry would starve the peer's production on a busy machine)."""
    import redis

    r = redis.Redis(port=port)
    interval = 1 / rate
    t0 = time.monotonic()
    i = 0
    while not stop.is_set():
        now = time.monotonic()
        due = t0 + i * interval
        if due - now > 0.001:
            time.sleep(due - now)
            continue
        if now - due > 1.0:
            t0 = now - i * interval
        n = max(1, min(100, int((now - due) / interval) + 1))
        pipe = r.pipeline(transaction=False)
        for _ in range(n):
            pipe.xadd("bench", {"e": event, "ts": time.time_ns()}, maxlen=50_000,
                      approximate=True)
        pipe.execute()
        i += n
        produced.value = i


def relay_event(relay: RelayProcess) -> bytes:
    """One data event of the relay's buffer, in wire format (the Redis peer's entry)."""
    import urllib.request

    from databus.event import iter_events

    with urllib.request.urlopen(f"{relay.url}/v1/stream?max_bytes=65536", timeout=30) as resp:
        body = bytes(resp.read())
    for off, h in iter_events(body):
        if h.source_id >= 0:
            return body[off : off + h.total_length]
    raise RuntimeError("no data event in the relay's buffer")


# -- the reference --------------------------------------------------------------------


def healthz_rtt(relay: RelayProcess, count: int) -> tuple[float, float]:
    """p50, p99 (ms) of sequential GET /healthz round trips from one aiohttp client."""
    def child(out: Any) -> None:
        import aiohttp

        async def run() -> list[int]:
            async with aiohttp.ClientSession() as session:
                times = []
                for i in range(count + 50):
                    t0 = time.perf_counter_ns()
                    async with session.get(relay.url + "/healthz") as r:
                        await r.read()
                    if i >= 50:
                        times.append(time.perf_counter_ns() - t0)
                return times

        out.put(asyncio.run(run()))

    out = CTX.Queue()
    p = CTX.Process(target=child, args=(out,), daemon=True)
    p.start()
    times = sorted(out.get(timeout=120))
    p.join()
    return percentile(times, 0.5) / 1e6, percentile(times, 0.99) / 1e6


# -- plot -----------------------------------------------------------------------------


def plot(results: list[ConfigResult], refs: dict[str, tuple[float, float]], path: Path,
         subtitle: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot (make bench-deps)"
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    lat_axes = {"poll": axes[0], "stream": axes[1]}
    axes[0].sharey(axes[1])
    axes[0].sharex(axes[1])
    labels = list(dict.fromkeys(r.label for r in results if r.mode != "redis"))
    redis_rows = [r for r in results if r.mode == "redis"]
    ref_p99 = sorted(p99 for _, p99 in refs.values())[len(refs) // 2] if refs else None
    for mode, ax in lat_axes.items():
        for i, label in enumerate(labels):
            rows = [r for r in results if r.label == label and r.mode == mode]
            if not rows:
                continue
            xs = [r.consumers for r in rows]
            color = f"C{i}"
            ax.plot(xs, [r.p99_ms for r in rows], "o-", color=color, label=f"{label} p99")
            ax.plot(xs, [r.p50_ms for r in rows], "x--", color=color, alpha=0.5,
                    label=f"{label} p50")
        if redis_rows:
            ax.plot([r.consumers for r in redis_rows], [r.p99_ms for r in redis_rows],
                    "s:", color="black", alpha=0.7,
                    label=f"Redis Streams XREAD BLOCK p99, {redis_rows[0].label}")
        x, lo, hi = PAPER_KNEE
        ax.errorbar([x], [(lo + hi) / 2], yerr=[[(hi - lo) / 2], [(hi - lo) / 2]],
                    fmt="D", color="purple", capsize=6, markersize=5,
                    label="paper's knee: 15-20 ms at 20 consumers, 2000 updates/s")
        if mode == "stream":
            ax.plot([c for c, _ in GOALS], [ms for _, ms in GOALS], "v", color="red",
                    markersize=9, label="goal: p99 <= 5 ms (40), <= 20 ms (100), 2000/s")
        if ref_p99 is not None:
            ax.axhline(ref_p99, color="grey", linestyle=":",
                       label=f"GET /healthz p99, median of the series ({ref_p99:.2f} ms)")
        ax.set_xlabel("consumers")
        ax.set_ylabel("append -> receipt latency (ms)")
        ax.set_yscale("log")
        ax.set_title("long-poll consumers" if mode == "poll"
                     else "streaming consumers (follow=true)")
        ax.legend(fontsize=6.5)
        ax.grid(True, which="both", alpha=0.3)
    ax2 = axes[2]
    for i, label in enumerate(labels):
        for mode, style in (("poll", "o-"), ("stream", "s--")):
            rows = [r for r in results if r.label == label and r.mode == mode]
            if rows:
                ax2.plot([r.consumers for r in rows], [r.ratio for r in rows], style,
                         color=f"C{i}", label=f"{label}, {mode}")
    if redis_rows:
        ax2.plot([r.consumers for r in redis_rows], [r.ratio for r in redis_rows], "s:",
                 color="black", alpha=0.7, label=f"Redis, {redis_rows[0].label}")
    ax2.set_xlabel("consumers")
    ax2.set_ylabel("events received / events produced")
    ax2.set_ylim(0, 1.2)
    ax2.set_title("Consumption as a share of production (paper Fig. 14)")
    ax2.legend(fontsize=6.5)
    ax2.grid(True, alpha=0.3)
    fig.suptitle(f"databus relay E2E latency (paper Fig. 15), synthetic 2.5 KB events, "
                 f"{os.cpu_count()} cores, Python {platform.python_version()}; {subtitle}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot saved to {path}"


# -- main -----------------------------------------------------------------------------


def _row(r: ConfigResult, runs: list[ConfigResult]) -> str:
    name = f"{r.label} {r.mode}"
    return (f"{name:>34} {r.consumers:3d} {r.produced_rate:7.0f} {r.p50_ms:7.2f} "
            f"{r.p99_ms:7.2f} {r.max_ms:7.1f} {r.consumer_rate:10.1f} {r.ratio:6.3f} "
            f"{r.aggregate_rate:8.0f} {r.relay_cpu:6.2f} {r.consumers_cpu:5.2f} "
            f"{r.other_cpu:5.2f} {r.softirq:5.2f} {r.steal:5.2f} "
            f"{r.requests / r.seconds:7.0f}"
            + (f" errors {r.errors}" if r.errors else "")
            + ("  (runs, p99 ms/other jobs+steal cores: "
               + ", ".join(f"{x.p99_ms:.1f}/{x.interference:.2f}" for x in runs) + ")"
               if len(runs) > 1 else ""))


def measure(config: Callable[[], ConfigResult], args: argparse.Namespace) -> ConfigResult:
    """``--repeat`` runs, more while none was quiet; the lowest p99 of the quiet ones."""
    runs = [config() for _ in range(args.repeat)]
    while (min(x.interference for x in runs) > args.quiet_cores
           and len(runs) < args.repeat + args.retries):
        runs.append(config())  # another job ran: try a quieter slot
    r = min(runs, key=lambda x: (x.interference > args.quiet_cores, x.p99_ms))
    print(_row(r, runs), flush=True)
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per config")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rates", default="100,1000,2000", help="updates/s, comma-separated")
    parser.add_argument("--consumers", default="1,10,20,40,100")
    parser.add_argument("--mode", default="poll,stream",
                        help="consumer kinds, comma-separated: poll (long polls), stream "
                             "(follow=true)")
    parser.add_argument("--wait-ms", type=int, default=1000, help="long-poll wait_ms")
    parser.add_argument("--poll-ms", type=float, default=0.0,
                        help="sleep between polls (0: poll again at once; the paper used 10)")
    parser.add_argument("--per-process", type=int, default=10,
                        help="consumers per asyncio consumer process")
    parser.add_argument("--workers", type=int, default=1,
                        help="relay.workers (serving processes) of the relay")
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default=None,
                        help="DATABUS_EVENT_LOOP for the relay (default: its own choice)")
    parser.add_argument("--consumer-loop", choices=("asyncio", "uvloop"),
                        default=default_consumer_loop(),
                        help="the consumer processes' event loop, relay's and Redis's alike "
                             "(default: uvloop when installed)")
    parser.add_argument("--event-bytes", type=int, default=2500)
    parser.add_argument("--rtt-count", type=int, default=2000)
    parser.add_argument("--redis", action="store_true",
                        help="the Redis Streams peer at the highest rate, same consumer "
                             "counts (redis-server, redis-py + hiredis)")
    parser.add_argument("--no-partitioned", action="store_true",
                        help="skip the partitioned (mod-C filter) series at the highest rate")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs per configuration; kept: the lowest p99 among the runs "
                             "with at most --quiet-cores of other load (else of all runs)")
    parser.add_argument("--quiet-cores", type=float, default=0.25,
                        help="cores other jobs and the hypervisor's steal may take from a run "
                             "that counts as quiet")
    parser.add_argument("--retries", type=int, default=2,
                        help="extra runs of a configuration while none was quiet")
    parser.add_argument("--profile", action="store_true",
                        help="one more run at the highest rate and consumer count, with "
                             "py-spy sampling the relay (figures come from the other runs)")
    parser.add_argument("--plot", default=str(HERE / "relay_latency.png"))
    parser.add_argument("--quick", action="store_true",
                        help="2 s per config, consumers 1,10,40, 500 round trips, one run "
                             "(unless given)")
    args = parser.parse_args()
    if args.quick:  # shorter defaults; flags given explicitly still win
        for name, value in (("duration", 2.0), ("warmup", 0.5), ("consumers", "1,10,40"),
                            ("rtt_count", 500), ("repeat", 1)):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    counts = [int(c) for c in args.consumers.split(",") if c.strip()]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            parser.error(f"--mode: poll or stream, not {m!r}")
    print(f"# relay latency: Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"{args.event_bytes} B events, 1 event/window, modes {','.join(modes)}, "
          f"wait_ms={args.wait_ms}, poll_ms={args.poll_ms:g}, {args.duration:g} s per config, "
          f"{args.per_process} consumers per process on {args.consumer_loop}, "
          f"relay workers={args.workers}, "
          f"event loop {args.event_loop or 'relay default'}; {loadavg()}; {code_version()}")
    print(f"{'series':>34} {'C':>3} {'prod/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'per-cons/s':>10} {'ratio':>6} {'aggr/s':>8} {'relay':>6} "
          f"{'cons':>5} {'other':>5} {'sirq':>5} {'steal':>5} {'req/s':>7}   (cpu columns "
          "in cores, other includes sirq, the kernel's softirq work; req/s: polls, or a "
          "stream's writes)")
    results: list[ConfigResult] = []
    refs: dict[str, tuple[float, float]] = {}
    series: list[tuple[str, float, bool]] = [(f"{r:g} updates/s", r, False) for r in rates]
    if not args.no_partitioned:
        top = max(rates)
        series.append((f"{top:g} updates/s partitioned", top, True))
    window_bytes = args.event_bytes + 64
    serving = ""
    event: bytes | None = None
    for label, rate, partitioned in series:
        capacity_mb = max(16, int(rate * window_bytes * 30 / (1 << 20)) + 1)
        uri = (f"synthetic://?rate={rate:g}&keys=100000&event_bytes={args.event_bytes}"
               f"&events_per_window=1&update_ratio=0.5&seed=1")
        relay = RelayProcess(uri, capacity_mb, workers=args.workers,
                             event_loop=args.event_loop)
        relay.start()
        try:
            relay.wait_for_scn(1)
            relay.wait_serving(args.workers)
            time.sleep(0.5)
            serving = relay.serving()
            source = relay.source_name()
            if event is None:
                event = relay_event(relay)
            p50, p99 = healthz_rtt(relay, args.rtt_count)
            refs[label] = (p50, p99)
            print(f"{'reference GET /healthz':>34} rtt p50 {p50:.3f} ms, p99 {p99:.3f} ms "
                  f"(relay fetcher at {rate:g}/s, no consumers; {serving})", flush=True)
            target = relay_target(relay)
            for c in counts:
                filters = None
                if partitioned:
                    filters = [json.dumps({source: {"type": "mod", "n": c, "buckets": [i]}})
                               for i in range(c)]
                for mode in modes:
                    results.append(measure(functools.partial(
                        run_config, target, mode, label, rate, c, args.duration, args.warmup,
                        args.wait_ms, args.poll_ms, filters, args.per_process,
                        args.consumer_loop), args))
            if args.profile and not partitioned and rate == max(rates):
                profile(relay, target, label, rate, max(counts), modes, args)
        finally:
            relay.stop()
    if args.redis:
        assert event is not None
        redis_series(event, max(rates), counts, args, results)
    summarize(results, refs, rates, counts, modes, args)
    print(f"end: {loadavg()}")
    if args.plot:
        print(plot(results, refs, Path(args.plot),
                   f"relay: {serving}; {args.duration:g} s per point, lowest p99 of "
                   f"{args.repeat}+ runs"))


def redis_series(event: bytes, rate: float, counts: list[int], args: argparse.Namespace,
                 results: list[ConfigResult]) -> None:
    with RedisServer() as server:
        stop = CTX.Event()
        produced = CTX.Value("q", 0, lock=False)
        producer = CTX.Process(target=_redis_producer,
                               args=(server.port, rate, event, stop, produced), daemon=True)
        producer.start()
        producer_pid = producer.pid
        assert producer_pid is not None
        try:
            print(f"{'Redis Streams peer':>34} redis-server {server.version()}, producer "
                  f"at {rate:g} entries/s of {len(event)} B, redis-py + hiredis (asyncio), "
                  "XREAD BLOCK 1000 COUNT 1000", flush=True)
            time.sleep(0.5)
            target = Target(str(server.port),
                            lambda: cpu_seconds(server.pid) + cpu_seconds(producer_pid),
                            lambda: int(produced.value))
            label = f"{rate:g} updates/s"
            for c in counts:
                results.append(measure(functools.partial(
                    run_config, target, "redis", label, rate, c, args.duration, args.warmup,
                    args.wait_ms, args.poll_ms, None, args.per_process,
                    args.consumer_loop), args))
        finally:
            stop.set()
            producer.join(timeout=10)
            if producer.is_alive():
                producer.kill()


def profile(relay: RelayProcess, target: Target, label: str, rate: float, c: int,
            modes: list[str], args: argparse.Namespace) -> None:
    for mode in modes:
        out = Path(tempfile.mkdtemp(prefix="databus-prof-")) / f"latency-{mode}.txt"
        spy = start_pyspy(relay.pid, args.duration + args.warmup, out)
        if spy is None:
            print("py-spy not found: pip install py-spy into the venv")
            return
        r = run_config(target, mode, label, rate, c, args.duration, args.warmup,
                       args.wait_ms, args.poll_ms, None, args.per_process, args.consumer_loop)
        _, err = spy.communicate(timeout=60)
        print(f"\n## py-spy of the relay's main process, {label}, {c} {mode} consumers, under "
              f"the profiler p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms ({out})")
        if spy.returncode:
            print(err.decode(errors="replace")[-2000:])
        print(summarize_pyspy(out, seconds=args.duration + args.warmup) + "\n")


def summarize(results: list[ConfigResult], refs: dict[str, tuple[float, float]],
              rates: list[float], counts: list[int], modes: list[str],
              args: argparse.Namespace) -> None:
    top = f"{max(rates):g} updates/s"
    print("\n## summary")

    def find(mode: str, c: int) -> ConfigResult | None:
        return next((r for r in results if r.label == top and r.mode == mode
                     and r.consumers == c and not r.partitioned), None)

    for c, goal in GOALS:
        for mode in modes:
            r = find(mode, c)
            if r is None:
                continue
            verdict = ("met" if r.p99_ms <= goal else "missed") if mode == "stream" else (
                "the goal is for streams")
            print(f"{top}, {c} {mode} consumers: p99 {r.p99_ms:.2f} ms, p50 {r.p50_ms:.2f} ms "
                  f"(goal <= {goal:g} ms: ratio {r.p99_ms / goal:.2f}, {verdict}); "
                  f"consumption/production {r.ratio:.3f}; relay {r.relay_cpu:.2f} cores; "
                  f"other jobs+steal {r.interference:.2f} cores; /healthz p99 "
                  f"{refs[top][1]:.3f} ms")
    redis40 = find("redis", 40)
    if redis40 is not None:
        for mode in modes:
            r = find(mode, 40)
            if r is not None:
                print(f"{top}, 40 consumers: {mode} p99 {r.p99_ms:.2f} ms vs Redis Streams "
                      f"p99 {redis40.p99_ms:.2f} ms (relay / Redis {r.p99_ms / redis40.p99_ms:.2f}"
                      f"); Redis p50 {redis40.p50_ms:.2f} ms, consumption/production "
                      f"{redis40.ratio:.3f}")
    off = [r for r in results if not 0.99 <= r.ratio <= 1.01]
    print("consumption / production within 0.99-1.01 everywhere: "
          + ("yes" if not off else "no: " + "; ".join(
              f"{r.label} {r.mode} C={r.consumers}: {r.ratio:.3f}" for r in off)))


if __name__ == "__main__":
    main()
