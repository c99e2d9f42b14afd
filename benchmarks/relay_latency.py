"""Relay end-to-end latency and consumption rate under load (paper Figures 14 and 15).

    .venv/bin/python benchmarks/relay_latency.py [--quick] [--duration 3] [--repeat 2]
        [--rates 100,1000,2000] [--consumers 1,5,10,20,40] [--wait-ms 1000]
        [--poll-ms 0] [--no-partitioned] [--profile] [--plot benchmarks/relay_latency.png]

Setup, per update rate R: a ``databus relay --config`` child process whose synthetic
fetcher writes R windows/s of one 2.5 KB event each (``events_per_window=1``). For each
consumer count C, C long-polling consumers (``/v1/stream?wait_ms=...``, each with its
own checkpoint, starting at the newest window) run in ceil(C / 10) consumer processes,
one asyncio loop with up to 10 consumers (one aiohttp session, one keep-alive
connection per consumer) in each. After a warm-up second, for ``--duration`` seconds,
every data event received counts: latency = receipt time (``time.time_ns()`` right
after the response body is read) minus the event's header ``timestamp_ns`` (set by the
synthetic fetcher via ``time.time_ns()`` just before it appends the window). Same
machine, same clock.

Figures per configuration: p50 and p99 latency; consumption rate per consumer and in
aggregate, as a ratio of the production rate (windows the relay's max SCN advanced
over during the same interval, times C: every consumer should get every event); relay
process CPU share (``/proc/<pid>/stat``); requests per second the relay answered.

Reference for timing (same run, same relay, no consumers attached): the bare loopback
HTTP round trip of ``GET /healthz`` from one aiohttp client, p50 and p99.

The partitioned series (skip it with ``--no-partitioned``), the paper's "2000 updates/s
(with partitioning)": at the highest rate, consumer i of C gets only mod-C bucket i, so the relay's
outbound bytes equal its inbound bytes whatever C.

Noise: the machine is shared and tail latency is what other jobs hurt first; each row
shows the CPU cores used by the relay, the consumer processes, everything else
("other") and the hypervisor's steal (this is a VM on a shared host: steal slows every
process here without showing in any of them) during the interval. Each configuration
runs ``--repeat`` times (plus up to ``--retries`` more while no run was quiet, i.e.
other jobs and steal took more than ``--quiet-cores``); kept is the lowest p99 among
the quiet runs (or among all runs if none was quiet: the "other" and "steal" columns
then say so).

``--profile`` adds one run at the highest rate and consumer count with py-spy sampling
the relay (its top frames per thread are printed; the figures come from the other runs).

The plot (matplotlib, optional) has p99 latency vs consumers (one line per rate, p50
dashed, the /healthz p99 reference dotted) and the consumption ratio vs consumers.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import math
import multiprocessing as mp
import os
import platform
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _relay_proc import (
    RelayProcess,
    code_version,
    cpu_seconds,
    loadavg,
    machine_cpu,
    start_pyspy,
    summarize_pyspy,
)

CTX = mp.get_context("fork")
HERE = Path(__file__).resolve().parent
# From offset 12 of an event header: total_length u32, (scn), timestamp_ns i64,
# (partition_id), source_id i16.
_FIELDS = struct.Struct(">I8xq2xh")
LATEST = json.dumps({"window_scn": -2})


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
    relay_cpu: float  # share of one core
    consumers_cpu: float  # all consumer processes, in cores
    machine_busy: float  # share of all cores, steal excluded
    steal: float  # cores the hypervisor took (a shared host)
    requests: int
    empty: int
    errors: int = 0
    per_consumer: list[float] = field(default_factory=list)

    @property
    def other_cpu(self) -> float:
        """Cores used by anything else on the machine (other users' jobs, the kernel's
        softirq work not charged to a process, this script's parent); steal apart."""
        return max(0.0, self.machine_busy * (os.cpu_count() or 1) - self.relay_cpu
                   - self.consumers_cpu)

    @property
    def interference(self) -> float:
        """Cores taken from this run by others: other jobs plus the hypervisor's steal."""
        return self.other_cpu + self.steal

    @property
    def consumer_rate(self) -> float:
        return sum(self.received) / len(self.received) / self.seconds

    @property
    def aggregate_rate(self) -> float:
        return sum(self.received) / self.seconds


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


def _consumer_process(url: str, queries: list[dict[str, str]], window: Any, go: Any,
                      ready: Any, poll_s: float, out: Any) -> None:
    import aiohttp

    async def run() -> None:
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            # Open the connections and find the newest SCN before the clock starts. A -2
            # checkpoint is re-resolved on every read, so a long poll with it would never
            # return data: each consumer starts after the newest SCN the relay reports.
            cps = []
            for q in queries:
                async with session.get(url, params={**q, "checkpoint": LATEST,
                                                    "wait_ms": "0"}) as r:
                    await r.read()
                    cps.append(json.dumps({"window_scn": int(r.headers["X-Databus-Max-Scn"])}))
            lats = [array.array("q") for _ in queries]
            stats = [[0, 0, 0, 0] for _ in queries]  # events, requests, errors, empty
            ready.release()
            await asyncio.gather(*(
                _consume(session, url, q, cps[i], window, go, poll_s, lats[i], stats[i])
                for i, q in enumerate(queries)
            ))
            out.put(([lat.tobytes() for lat in lats], stats))

    asyncio.run(run())


def _cpu_of(procs: list[Any]) -> float:
    return sum((cpu_seconds(p.pid) for p in procs if p.pid is not None), 0.0)


def run_config(relay: RelayProcess, label: str, rate: float, consumers: int,
               duration: float, warmup: float, wait_ms: int, poll_ms: float,
               filters: list[str] | None, per_process: int) -> ConfigResult:
    url = relay.url + "/v1/stream"
    queries = []
    for i in range(consumers):
        q = {"wait_ms": str(wait_ms), "max_bytes": str(4 << 20)}
        if filters is not None:
            q["filter"] = filters[i]
        queries.append(q)
    groups = [queries[i : i + per_process] for i in range(0, consumers, per_process)]
    window = CTX.Array("q", [0, 0], lock=False)
    go = CTX.Event()
    ready = CTX.Semaphore(0)
    out = CTX.Queue()
    procs = [CTX.Process(target=_consumer_process,
                         args=(url, g, window, go, ready, poll_ms / 1000, out), daemon=True)
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
    scn0 = relay.buffer_status()["max_scn"] or 0
    cpu0 = cpu_seconds(relay.pid)
    ccpu0 = _cpu_of(procs)
    busy0, steal0, tot0 = machine_cpu()
    t0 = time.monotonic()
    time.sleep(max(0.0, (window[1] - time.time_ns()) / 1e9))
    scn1 = relay.buffer_status()["max_scn"] or 0
    cpu1 = cpu_seconds(relay.pid)
    ccpu1 = _cpu_of(procs)
    busy1, steal1, tot1 = machine_cpu()
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
        requests=requests, empty=empty, errors=errors,
    )


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
         goal_ms: float) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot (pip install matplotlib into the venv)"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    labels = list(dict.fromkeys(r.label for r in results))
    for i, label in enumerate(labels):
        rows = [r for r in results if r.label == label]
        xs = [r.consumers for r in rows]
        color = f"C{i}"
        ax1.plot(xs, [r.p99_ms for r in rows], "o-", color=color, label=f"{label} p99")
        ax1.plot(xs, [r.p50_ms for r in rows], "x--", color=color, alpha=0.6,
                 label=f"{label} p50")
        ax2.plot(xs, [r.aggregate_rate / (r.produced_rate * r.consumers) for r in rows]
                 if "partitioned" not in label else
                 [r.aggregate_rate / r.produced_rate for r in rows], "o-", color=color,
                 label=label)
    ref_p99 = sorted(p99 for _, p99 in refs.values())[len(refs) // 2]  # the median
    ax1.axhline(ref_p99, color="grey", linestyle=":",
                label=f"GET /healthz p99, median of the series ({ref_p99:.2f} ms)")
    ax1.axhline(goal_ms, color="red", linestyle=":", alpha=0.5, label=f"goal p99 {goal_ms:g} ms")
    ax1.set_xlabel("consumers (long-polling)")
    ax1.set_ylabel("append -> receipt latency (ms)")
    ax1.set_yscale("log")
    ax1.set_title("Relay E2E latency (paper Fig. 15)")
    ax1.legend(fontsize=7)
    ax1.grid(True, which="both", alpha=0.3)
    ax2.set_xlabel("consumers (long-polling)")
    ax2.set_ylabel("events received / events produced")
    ax2.set_ylim(0, 1.2)
    ax2.set_title("Consumption rate as a share of production (paper Fig. 14)")
    ax2.legend(fontsize=7)
    ax2.grid(True, alpha=0.3)
    fig.suptitle(f"databus relay, synthetic 2.5 KB events, {os.cpu_count()} cores, "
                 f"Python {platform.python_version()}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot saved to {path}"


# -- main -----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per config")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rates", default="100,1000,2000", help="updates/s, comma-separated")
    parser.add_argument("--consumers", default="1,5,10,20,40")
    parser.add_argument("--wait-ms", type=int, default=1000, help="long-poll wait_ms")
    parser.add_argument("--poll-ms", type=float, default=0.0,
                        help="sleep between polls (0: poll again at once; the paper used 10)")
    parser.add_argument("--per-process", type=int, default=10,
                        help="consumers per asyncio consumer process")
    parser.add_argument("--event-bytes", type=int, default=2500)
    parser.add_argument("--rtt-count", type=int, default=2000)
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
    parser.add_argument("--goal-ms", type=float, default=10.0)
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
    print(f"# relay latency: Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"{args.event_bytes} B events, 1 event/window, wait_ms={args.wait_ms}, "
          f"poll_ms={args.poll_ms:g}, {args.duration:g} s per config, "
          f"{args.per_process} consumers per process; {loadavg()}; {code_version()}")
    print(f"{'series':>28} {'C':>3} {'prod/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7} {'per-cons/s':>10} {'ratio':>6} {'aggr/s':>8} {'relay':>6} "
          f"{'cons':>5} {'other':>5} {'steal':>5} {'req/s':>7}   (cpu columns in cores)")
    results: list[ConfigResult] = []
    refs: dict[str, tuple[float, float]] = {}
    series: list[tuple[str, float, bool]] = [(f"{r:g} updates/s", r, False) for r in rates]
    if not args.no_partitioned:
        top = max(rates)
        series.append((f"{top:g} updates/s partitioned", top, True))
    window_bytes = args.event_bytes + 64
    for label, rate, partitioned in series:
        capacity_mb = max(16, int(rate * window_bytes * 30 / (1 << 20)) + 1)
        uri = (f"synthetic://?rate={rate:g}&keys=100000&event_bytes={args.event_bytes}"
               f"&events_per_window=1&update_ratio=0.5&seed=1")
        relay = RelayProcess(uri, capacity_mb)
        relay.start()
        try:
            relay.wait_for_scn(1)
            time.sleep(0.5)
            source = relay.source_name()
            p50, p99 = healthz_rtt(relay, args.rtt_count)
            refs[label] = (p50, p99)
            print(f"{'reference GET /healthz':>28} rtt p50 {p50:.3f} ms, p99 {p99:.3f} ms "
                  f"(relay fetcher at {rate:g}/s, no consumers)", flush=True)
            for c in counts:
                filters = None
                if partitioned:
                    filters = [json.dumps({source: {"type": "mod", "n": c, "buckets": [i]}})
                               for i in range(c)]
                config = (relay, label, rate, c, args.duration, args.warmup, args.wait_ms,
                          args.poll_ms, filters, args.per_process)
                runs = [run_config(*config) for _ in range(args.repeat)]
                while (min(x.interference for x in runs) > args.quiet_cores
                       and len(runs) < args.repeat + args.retries):
                    runs.append(run_config(*config))  # another job ran: try a quieter slot
                r = min(runs, key=lambda x: (x.interference > args.quiet_cores, x.p99_ms))
                results.append(r)
                expected = r.produced_rate * (1 if partitioned else c)
                ratio = r.aggregate_rate / expected if expected else float("nan")
                print(f"{label:>28} {c:3d} {r.produced_rate:7.0f} {r.p50_ms:7.2f} "
                      f"{r.p99_ms:7.2f} {r.max_ms:7.1f} {r.consumer_rate:10.1f} {ratio:6.3f} "
                      f"{r.aggregate_rate:8.0f} {r.relay_cpu:6.2f} {r.consumers_cpu:5.2f} "
                      f"{r.other_cpu:5.2f} {r.steal:5.2f} "
                      f"{r.requests / r.seconds:7.0f}"
                      + (f" errors {r.errors}" if r.errors else "")
                      + ("  (runs, p99 ms/other+steal cores: "
                         + ", ".join(f"{x.p99_ms:.1f}/{x.interference:.2f}" for x in runs) + ")"
                         if len(runs) > 1 else ""), flush=True)
            if args.profile and not partitioned and rate == max(rates):
                c = max(counts)
                out = Path(tempfile.mkdtemp(prefix="databus-prof-")) / "latency.txt"
                spy = start_pyspy(relay.pid, args.duration + args.warmup, out)
                if spy is None:
                    print("py-spy not found: pip install py-spy into the venv")
                else:
                    r = run_config(relay, label, rate, c, args.duration, args.warmup,
                                   args.wait_ms, args.poll_ms, None, args.per_process)
                    _, err = spy.communicate(timeout=60)
                    print(f"\n## py-spy of the relay, {label}, {c} consumers, under the "
                          f"profiler p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms ({out})")
                    if spy.returncode:
                        print(err.decode(errors="replace")[-2000:])
                    print(summarize_pyspy(out, seconds=args.duration + args.warmup) + "\n")
        finally:
            relay.stop()
    goal = [r for r in results if r.label == f"{max(rates):g} updates/s"
            and r.consumers == max(counts)]
    if goal:
        g = goal[0]
        print(f"\nsummary: {g.label}, {g.consumers} consumers: p99 {g.p99_ms:.2f} ms "
              f"(goal <= {args.goal_ms:g} ms: ratio {g.p99_ms / args.goal_ms:.2f}), p50 "
              f"{g.p50_ms:.2f} ms; /healthz p99 {refs[g.label][1]:.3f} ms -> p99 is "
              f"{g.p99_ms / refs[g.label][1]:.0f}x the bare round trip")
    print(f"end: {loadavg()}")
    if args.plot:
        print(plot(results, refs, Path(args.plot), args.goal_ms))


if __name__ == "__main__":
    main()
