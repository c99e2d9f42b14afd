"""A normal consumer's latency next to hostile consumers, and the relay's memory (issue 12,
defect 12: long polls; issue 27, item 13: streaming subscriptions).

    .venv/bin/python benchmarks/relay_hostile.py [--mode poll|streaming]
        [--phase-seconds 12] [--rounds 2] [--write-timeout 5] [--header-timeout 5]
        [--stream-memory-mb 128] [--rate R] [--max-connections N]
        [--normal 50 --idle 2000 --never-reading 30 --dribblers 20]   (streaming)

Setup: a ``databus relay --config`` child process whose synthetic fetcher writes
``--rate`` windows/s (1000 for polls, 200 for streams) of one 2.5 KB event each into a
256 MiB buffer (it does not wrap during the run), filled with ``--prefill-mb`` MiB before
the clock starts; its limits are the defaults except the write and header timeouts
(``--write-timeout``/``--header-timeout``, 5 s here instead of 30 s and 10 s so that the
phases see several cuts), ``max_stream_memory_mb`` and ``max_connections`` (2,200 for
streams: 2,100 of them are open at once). A second buffer gets one window a minute: the
idle clients park there.

``--mode poll``: one **normal consumer** (its own process, one aiohttp session)
long-polls from the newest window (``wait_ms=1000``, ``max_bytes`` 1 MiB) for the whole
run; its latency per event = receipt time minus the event's ``timestamp_ns`` (same
clock, taken when the window is written: commit to receipt).

``--mode streaming``: ``--normal`` **normal streaming consumers** (``follow=true`` from
the newest window, default heartbeat; raw asyncio protocols in ``--normal-procs``
processes, parsing the chunked body and each event's header only), each event's latency
measured the same way, all of them pooled.

The run alternates two phases, ``--rounds`` times each, ``--phase-seconds`` each, so
both cases see the same relay and the same machine noise:

- **quiet**: the normal consumer(s) alone;
- **hostile**, polls: a second process adds 200 long polls parked on the idle buffer
  (``wait_ms=30000``, re-issued when answered), 20 clients that ask for 8 MiB from the
  oldest window with a 4 KiB receive buffer and never read (reconnecting when the relay
  cuts them, or after ``--non-reader-give-up`` seconds if it did not: a short body fits
  in the socket buffers and is never cut), and 10 slowloris clients sending one header
  byte per second (reconnecting when cut);
- **hostile**, streams: a second process adds ``--idle`` streams parked on the idle
  buffer (default heartbeat, reading what comes), ``--never-reading`` streams from the
  oldest window with ``max_bytes`` 8 MiB and a 4 KiB receive buffer that never read and
  ``--dribblers`` streams from the newest window that read one byte a second (both
  reconnecting when cut); it connects them all (64 connects at a time) before the
  phase's clock starts.

Figures: the normal consumers' p50/p99/max latency per phase kind (all rounds pooled),
their ratio, and the ratio per round; the relay's anonymous resident memory (``RssAnon``
in ``/proc/<pid>/status``: the ring's mapped file pages left out) before, peak during
each phase kind, and at the end, against the bound docs/relay.md gives for the limits;
how often the hostile clients were cut; machine CPU busy and steal during each phase
kind (the machine is shared: the ratio is what counts)."""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import math
import multiprocessing as mp
import os
import socket
import struct
import threading
import time
import urllib.parse
from typing import Any

from _hostile_streams import hostile_streams, normal_streams
from _relay_proc import RelayProcess, code_version, cpu_seconds, loadavg, machine_cpu

CTX = mp.get_context("fork")
_FIELDS = struct.Struct(">I8xq2xh")  # from offset 12: total_length, timestamp_ns, source_id
SOURCE = "synthetic.events"
OLDEST = json.dumps({"window_scn": -1})


def percentile(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return float(values[k])


def rss_mib(pid: int) -> float:
    """Anonymous resident memory (heap, buffers) of ``pid``: what the limits bound. The
    ring file's mapped pages are file-backed and left out (they are the buffer itself)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# -- the normal consumer ------------------------------------------------------------------


def _normal_consumer(url: str, ready: Any, stop: Any, out: Any) -> None:
    import aiohttp

    async def run() -> None:
        times: array.array[int] = array.array("q")
        lats: array.array[int] = array.array("q")
        errors = 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            async with s.get(url + "/v1/stream", params={"wait_ms": "0", "sources": SOURCE,
                             "checkpoint": json.dumps({"window_scn": -2})}) as r:
                await r.read()
                cp = json.dumps({"window_scn": int(r.headers["X-Databus-Max-Scn"])})
            ready.set()
            while not stop.is_set():
                try:
                    async with s.get(url + "/v1/stream", params={
                            "wait_ms": "1000", "max_bytes": str(1 << 20), "checkpoint": cp,
                            "sources": SOURCE,
                    }) as r:
                        body = await r.read()
                        now = time.time_ns()
                        if r.status != 200:
                            errors += 1
                            await asyncio.sleep(0.05)
                            continue
                        cp = r.headers["X-Databus-Checkpoint"]
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1
                    await asyncio.sleep(0.05)
                    continue
                off = 0
                while off < len(body):
                    total, ts, source_id = _FIELDS.unpack_from(body, off + 12)
                    if source_id >= 0:
                        times.append(now)
                        lats.append(now - ts)
                    off += total
        out.put((times.tobytes(), lats.tobytes(), errors))

    asyncio.run(run())


# -- the hostile clients ------------------------------------------------------------------


def _hostile(port: int, give_up_s: float, ready: Any, stop: Any, out: Any) -> None:
    import aiohttp

    counts = {"long_poll_answers": 0, "non_reader_cut": 0, "non_reader_gave_up": 0,
              "slowloris_cut": 0, "errors": 0}

    async def long_poll(session: aiohttp.ClientSession, url: str) -> None:
        cp = json.dumps({"window_scn": -2})
        while not stop.is_set():
            try:
                async with session.get(url, params={"wait_ms": "30000", "checkpoint": cp,
                                                    "sources": "idle.events"}) as r:
                    await r.read()
                    if r.status == 200:
                        cp = r.headers["X-Databus-Checkpoint"]
                        counts["long_poll_answers"] += 1
                    else:
                        counts["errors"] += 1
                        await asyncio.sleep(0.5)
            except (aiohttp.ClientError, TimeoutError):
                counts["errors"] += 1
                await asyncio.sleep(0.5)

    async def gone(sock: socket.socket) -> bool:
        """Closed or reset by the relay? The TCP state says so without reading (a peek
        would see the unread bytes still queued)."""
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
        except OSError:
            return True
        return info[0] != 1  # tcpi_state: 1 is ESTABLISHED

    async def non_reader() -> None:
        query = (f"max_bytes={8 << 20}&sources={SOURCE}"
                 f"&checkpoint={urllib.parse.quote(OLDEST)}")
        request = f"GET /v1/stream?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        while not stop.is_set():
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
                await asyncio.get_running_loop().sock_sendall(sock, request)
                t0 = time.monotonic()
                while not stop.is_set():
                    await asyncio.sleep(0.5)
                    if await gone(sock):
                        counts["non_reader_cut"] += 1
                        break
                    if give_up_s and time.monotonic() - t0 > give_up_s:
                        # Not cut (its body fit in the socket buffers): ask again, so
                        # the relay sees as many 8 MiB requests as when every one is cut.
                        counts["non_reader_gave_up"] += 1
                        break
            except OSError:
                counts["errors"] += 1
                await asyncio.sleep(0.5)
            finally:
                sock.close()

    async def slowloris() -> None:
        head = b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 10_000
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                counts["errors"] += 1
                await asyncio.sleep(0.5)
                continue
            try:
                for byte in head:
                    if stop.is_set():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    try:
                        data = await asyncio.wait_for(reader.read(4096), 1.0)
                    except TimeoutError:
                        continue
                    if data or reader.at_eof():
                        counts["slowloris_cut"] += 1
                        break
            except OSError:
                counts["slowloris_cut"] += 1
            finally:
                writer.close()

    async def run() -> None:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn,
                                         timeout=aiohttp.ClientTimeout(total=90)) as session:
            url = f"http://127.0.0.1:{port}/v1/stream"
            tasks = [asyncio.create_task(long_poll(session, url)) for _ in range(200)]
            tasks += [asyncio.create_task(non_reader()) for _ in range(20)]
            tasks += [asyncio.create_task(slowloris()) for _ in range(10)]
            await asyncio.sleep(1.0)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.1)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        out.put(counts)

    asyncio.run(run())


# -- the run ---------------------------------------------------------------------------


def _stream_bound_mib(max_connections: int, stream_memory_mb: int) -> float:
    """The anonymous memory HTTP serving may take (docs/relay.md, "Memory bound"):
    the stream budget plus, per connection (the overflow allowance included), the 64 KiB
    body floor, 64 KiB request head, 128 KiB write buffer and ~20 KiB of objects."""
    connections = max_connections + max(16, max_connections // 8)
    return stream_memory_mb + connections * (64 + 64 + 128 + 20) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("poll", "streaming"), default="poll",
                        help="poll: issue 12's long-poll run; streaming: issue 27's "
                             "streaming consumers")
    parser.add_argument("--phase-seconds", type=float, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-timeout", type=float, default=5)
    parser.add_argument("--header-timeout", type=float, default=5)
    parser.add_argument("--stream-memory-mb", type=int, default=128)
    parser.add_argument("--prefill-mb", type=int, default=None,
                        help="MiB in the buffer before the clock starts; default 24 (poll), "
                             "8 (streaming: 16 s at 200 windows/s)")
    parser.add_argument("--non-reader-give-up", type=float, default=6,
                        help="poll mode: a non-reader not cut after this many seconds "
                             "reconnects and asks again (0: never)")
    parser.add_argument("--rate", type=float, default=None,
                        help="windows per second (one 2.5 KB event each); default 1000 "
                             "(poll), 200 (streaming)")
    parser.add_argument("--normal", type=int, default=50,
                        help="streaming: normal consumers (in --normal-procs processes)")
    parser.add_argument("--normal-procs", type=int, default=2)
    parser.add_argument("--idle", type=int, default=2000, help="streaming: idle streams")
    parser.add_argument("--never-reading", type=int, default=30)
    parser.add_argument("--dribblers", type=int, default=20,
                        help="streaming: streams reading one byte a second")
    parser.add_argument("--max-connections", type=int, default=None,
                        help="relay max_connections; default 1000 (poll), 2200 (streaming)")
    parser.add_argument("--latencies-out", metavar="FILE",
                        help="write each event's receipt time (unix ns) and latency (ns)")
    args = parser.parse_args()
    streaming = args.mode == "streaming"
    rate = args.rate if args.rate is not None else (200.0 if streaming else 1000.0)
    max_connections = args.max_connections or (2200 if streaming else 1000)

    uri = f"synthetic://?rate={rate:g}&keys=100000&event_bytes=2500&events_per_window=1"
    relay = RelayProcess(uri, 256)  # no lap during the run
    # The bench's own limits (RelayProcess writes max_bytes_cap = 64 MiB: back to 8).
    text = relay.config_path.read_text().replace(f"max_bytes_cap = {64 << 20}\n",
                                                 f"max_bytes_cap = {8 << 20}\n")
    text = text.replace("\n[[relay.buffers]]", (
        f"write_timeout_s = {args.write_timeout}\nheader_timeout_s = {args.header_timeout}\n"
        f"max_stream_memory_mb = {args.stream_memory_mb}\n"
        f"max_connections = {max_connections}\n\n[[relay.buffers]]"), 1)
    # A second buffer that gets one window a minute: the hostile long polls park there.
    text += ('\n[[relay.buffers]]\nname = "idle"\ncapacity_mb = 1\nsource = '
             '"synthetic://?rate=0.016&events_per_window=1&source=idle.events"\n')
    relay.config_path.write_text(text)
    print(f"# relay_hostile --mode {args.mode}: {code_version()}; {os.cpu_count()} CPUs; "
          f"{loadavg()}")
    with relay:
        prefill = args.prefill_mb if args.prefill_mb is not None else (8 if streaming else 24)
        while (relay.buffer_status()["used_bytes"] or 0) < prefill << 20:
            time.sleep(0.2)
        rss: list[tuple[float, float]] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                rss.append((time.monotonic(), rss_mib(relay.pid)))
                time.sleep(0.1)

        threading.Thread(target=sample, daemon=True).start()
        rss_before = rss_mib(relay.pid)
        stop, out = CTX.Event(), CTX.Queue()
        consumers = []
        if streaming:
            per = [args.normal // args.normal_procs + (i < args.normal % args.normal_procs)
                   for i in range(args.normal_procs)]
            for n in per:
                ready = CTX.Event()
                consumers.append(CTX.Process(target=normal_streams, args=(
                    relay.port, n, SOURCE, ready, stop, out)))
                consumers[-1].start()
                ready.wait(60)
        else:
            ready = CTX.Event()
            consumers.append(CTX.Process(target=_normal_consumer,
                                         args=(relay.url, ready, stop, out)))
            consumers[-1].start()
            ready.wait(30)
        time.sleep(1.0)
        # kind, t0 ns, t1 ns, machine busy, steal, relay cores
        phases: list[tuple[str, int, int, float, float, float]] = []
        mono_phases: list[tuple[str, float, float]] = []
        cuts: dict[str, int] = {}
        for _ in range(args.rounds):
            for kind in ("quiet", "hostile"):
                hostile = None
                if kind == "hostile":
                    h_ready, h_stop, h_out = CTX.Event(), CTX.Event(), CTX.Queue()
                    if streaming:
                        hostile = CTX.Process(target=hostile_streams, args=(
                            relay.port, args.idle, args.never_reading, args.dribblers,
                            SOURCE, "idle.events", h_ready, h_stop, h_out))
                    else:
                        hostile = CTX.Process(target=_hostile,
                                              args=(relay.port, args.non_reader_give_up,
                                                    h_ready, h_stop, h_out))
                    hostile.start()
                    h_ready.wait(120)
                busy0, steal0, tot0 = machine_cpu()
                relay0 = cpu_seconds(relay.pid)
                t0, m0 = time.time_ns(), time.monotonic()
                time.sleep(args.phase_seconds)
                t1, m1 = time.time_ns(), time.monotonic()
                busy1, steal1, tot1 = machine_cpu()
                relay1 = cpu_seconds(relay.pid)
                phases.append((kind, t0, t1, (busy1 - busy0) / (tot1 - tot0),
                               (steal1 - steal0) / (tot1 - tot0),
                               (relay1 - relay0) / ((m1 - m0) or 1)))
                mono_phases.append((kind, m0, m1))
                if hostile is not None:
                    h_stop.set()
                    for k, v in h_out.get(timeout=60).items():
                        cuts[k] = cuts.get(k, 0) + v
                    hostile.join(30)
                    time.sleep(3.0)  # let the relay drop what the hostile ones left
        stop.set()
        times: array.array[int] = array.array("q")
        lats: array.array[int] = array.array("q")
        errors = 0
        for _ in consumers:
            got = out.get(timeout=60)
            times.frombytes(got[0])
            lats.frombytes(got[1])
            errors += sum(got[2:])
        for c in consumers:
            c.join(30)
        sampling.set()
        rss_after = rss_mib(relay.pid)
    if args.latencies_out:
        with open(args.latencies_out, "w") as f:
            f.writelines(f"{t} {lat}\n" for t, lat in zip(times, lats, strict=True))
            f.writelines(f"# {kind} {a} {b}\n" for kind, a, b, *_ in phases)
    who = (f"{args.normal} normal streams in {args.normal_procs} processes; hostile: "
           f"{args.idle} idle, {args.never_reading} never reading, {args.dribblers} one "
           "byte per second" if streaming else "one normal long-poller")
    print(f"relay: {rate:g} windows/s; write_timeout_s={args.write_timeout} header_timeout_s="
          f"{args.header_timeout} max_stream_memory_mb={args.stream_memory_mb} "
          f"max_bytes_cap=8 MiB max_connections={max_connections}; phases of "
          f"{args.phase_seconds:g} s, {args.rounds} rounds; {who}; normal consumer "
          f"errors/reconnects: {errors}")
    print("| phase | events | p50 ms | p99 ms | max ms | relay RssAnon peak MiB | "
          "relay cores | machine busy | steal |")
    print("|---|---|---|---|---|---|---|---|---|")
    p99s = {}
    per_round: dict[str, list[float]] = {"quiet": [], "hostile": []}
    # An event counts in the phase it was committed in (receipt - latency), not the one
    # it arrived in: a relay that fell behind in a hostile phase must not hand its late
    # events to the quiet phase after it.
    committed = [t - lat for t, lat in zip(times, lats, strict=True)]
    for kind, a, b, *_ in phases:
        sel = sorted(lat for c, lat in zip(committed, lats, strict=True) if a <= c <= b)
        per_round[kind].append(percentile(sel, 0.99) / 1e6)
    for kind in ("quiet", "hostile"):
        sel = sorted(lat for c, lat in zip(committed, lats, strict=True)
                     if any(k == kind and a <= c <= b for k, a, b, *_ in phases))
        peak = max((r for t, r in rss if any(k == kind and a <= t <= b
                                            for k, a, b in mono_phases)), default=0.0)
        busy = sum(p[3] for p in phases if p[0] == kind) / args.rounds
        cores = sum(p[5] for p in phases if p[0] == kind) / args.rounds
        steal = sum(p[4] for p in phases if p[0] == kind) / args.rounds
        p99s[kind] = percentile(sel, 0.99) / 1e6
        print(f"| {kind} | {len(sel)} | {percentile(sel, 0.5) / 1e6:.1f} | "
              f"{p99s[kind]:.1f} | {(sel[-1] / 1e6 if sel else float('nan')):.1f} | "
              f"{peak:.0f} | {cores:.2f} | {busy:.0%} | {steal:.0%} |")
    ratios = [h / q for q, h in zip(per_round["quiet"], per_round["hostile"], strict=True)]
    print(f"p99 hostile / quiet = {p99s['hostile'] / p99s['quiet']:.2f}; per round: "
          + ", ".join(f"{r:.2f}" for r in ratios)
          + f" (median {sorted(ratios)[len(ratios) // 2]:.2f})")
    bound = _stream_bound_mib(max_connections, args.stream_memory_mb)
    peak = max(r for _, r in rss)
    print(f"relay RssAnon: {rss_before:.0f} MiB before, {peak:.0f} MiB peak "
          f"(+{peak - rss_before:.0f} MiB of a {bound:.0f} MiB bound), {rss_after:.0f} MiB "
          "at the end")
    print(f"hostile clients: {json.dumps(cuts)}; {loadavg()}")


if __name__ == "__main__":
    main()
