"""Relay streaming throughput and latency with TLS, as a ratio of the same relay
without it, measured in the same run (issue 31: goal >= 0.7 of the throughput).

    .venv/bin/python benchmarks/relay_tls.py [--quick] [--duration 3] [--repeat 2]
        [--consumers 1,10] [--rate 1000] [--events 20000] [--part throughput,latency]
        [--kinds plain,tls,tls+reader] [--grant '*'] [--workers 1]
        [--event-loop asyncio|uvloop] [--consumer-loop asyncio|uvloop] [--profile]

Setup: a throwaway CA and a server certificate for 127.0.0.1 (``make_pki`` of
tests/fixtures/_certs.py, EC P-256, needs ``cryptography``) in a temp dir. Kinds of
``databus relay --config`` child processes (``--kinds``), the same synthetic source
(2.5 KB events, one event per window), ``--workers`` serving processes (default 1),
the relay's default event loop (uvloop when installed, as ``make venv`` does) unless
``--event-loop`` says otherwise:

- ``plain``: HTTP, no readers (anonymous reading on loopback): the reference;
- ``tls``: ``[relay.tls]`` (cert_file, key_file), no readers: what TLS alone costs;
- ``tls+reader``: ``[relay.tls]`` and one ``[[relay.readers]]`` (``sources`` from
  ``--grant``, default ``["*"]``; a random bearer token): the issue's figure. Its
  clients send ``Authorization: Bearer <token>``; the clients of both TLS kinds verify
  the relay against the CA (``databus.security.client_context(ca)``).

1. Streaming throughput: the relays run side by side, each prefilled by the
   synthetic fetcher (``rate=0&limit=--events``; the benchmark waits until the
   buffer's max SCN is that), then idle. For each consumer count C, C consumer
   processes each stream ``/v1/stream?follow=true`` (``max_bytes`` 4 MiB per write)
   from the oldest window, read with aiohttp's ``resp.content.readany()`` (on
   ``--consumer-loop``), the events cut at their boundaries by a header walk (no CRC
   checks) and counted; once a stream has brought every event of the buffer (a
   pass), it is closed and a new one opened (a new connection: for TLS a new
   handshake, no session resumption). Bytes and data events counted for
   ``--duration`` seconds: aggregate MB/s (10**6 B) and events/s. Runs of the relays
   alternate (in the order above in odd repeats, reversed in even ones); each figure
   is the best of ``--repeat`` runs (another job only ever lowers a figure); ratio =
   best of a TLS kind / best plain at that consumer count (the goal: tls+reader >=
   0.7). Relay CPU seconds per GB = CPU time of the relay's processes
   (``tree_cpu_seconds``) over the run / GB delivered. Before the runs, one pass of
   each relay is read in this process with the same walk: each must bring --events
   data events (the TLS relays' bytes are the plain relay's), and the reader's relay
   must refuse a stream without the token.
2. Latency: a relay of each kind in turn (one at a time: an idle relay producing
   alongside would take CPU from the measured one), the synthetic source at
   ``rate=--rate`` windows/s. For each C, C streaming consumers (up to 10 per
   process, one aiohttp session per process, one connection each) open their streams
   at the newest position (checkpoint ``{"window_scn": -2}``) before the clock
   starts, then relay_latency's ``_consume_stream`` walks the headers; after a
   ``--warmup``, every data event whose last byte arrives within ``--duration``
   seconds counts: latency = receipt time (``time.time_ns()`` after the read) minus
   the event header's ``timestamp_ns`` (the synthetic fetcher's ``time.time_ns()``
   just before it appends the window). p50 and p99 per kind; each TLS kind's p99 /
   plain's. Each configuration runs ``--repeat`` times (a new relay each repeat, the
   kinds alternating as above); kept is the lowest p99 among the quiet runs (other
   jobs and steal under ``--quiet-cores``), else among all runs.

Noise: the machine is shared; the load average is printed at the start and the end,
and each row shows the cores the relay used and those taken by other jobs and the
hypervisor's steal meanwhile ("others", softirq work left out: loopback TCP, mostly
the run's own).

``--profile`` adds one throughput run of each kind at the highest consumer count with
py-spy sampling the relay's main process (needs ``py-spy`` in the venv) and prints its
top frames.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import multiprocessing as mp
import os
import platform
import secrets
import shutil
import socket
import ssl
import struct
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

from _relay_proc import (
    RelayProcess,
    code_version,
    default_consumer_loop,
    loadavg,
    machine_cpu,
    run_on,
    softirq_seconds,
    start_pyspy,
    summarize_pyspy,
)
from relay_latency import ConfigResult, _consume_stream, _cpu_of, percentile
from relay_throughput import RunResult, _run_clients

MIB = 1 << 20
CTX = mp.get_context("fork")
ROOT = Path(__file__).resolve().parent.parent
KINDS = ("plain", "tls", "tls+reader")
ISSUE = "tls+reader"  # the configuration of the issue's figure
LATEST = json.dumps({"window_scn": -2})
# From offset 12 of an event header: total_length u32, (scn), timestamp_ns i64,
# (partition_id), source_id i16 (as relay_latency reads it).
_FIELDS = struct.Struct(">I8xq2xh")
_HEAD = 12 + _FIELDS.size


# -- the PKI and the relays -----------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    cert: Path
    key: Path


def make_pki() -> Pki:
    """A throwaway CA and a server certificate for localhost/127.0.0.1, in a temp dir."""
    sys.path.insert(0, str(ROOT))
    try:
        from tests.fixtures._certs import make_pki as _make_pki
    except ImportError as exc:  # cryptography missing
        raise SystemExit(f"cannot make the test PKI ({exc}): .venv/bin/pip install "
                         "cryptography") from exc
    pki = _make_pki(Path(tempfile.mkdtemp(prefix="databus-bench-pki-")))
    return Pki(pki.directory, pki.ca, pki.server.cert, pki.server.key)


def new_relay(kind: str, uri: str, capacity_mb: int, pki: Pki,
              args: argparse.Namespace) -> RelayProcess:
    """plain: HTTP, no readers; tls: HTTPS, no readers; tls+reader: HTTPS and one
    reader (a random token, granted ``--grant``)."""
    if kind == "plain":
        return RelayProcess(uri, capacity_mb, workers=args.workers,
                            event_loop=args.event_loop)
    token = secrets.token_urlsafe(24) if kind == "tls+reader" else None
    return RelayProcess(uri, capacity_mb, workers=args.workers, event_loop=args.event_loop,
                        tls=(pki.cert, pki.key), ca_file=pki.ca, reader_token=token,
                        reader_sources=tuple(args.grant.split(",")))


def alternate(kinds: list[str], rep: int) -> list[str]:
    """The kinds' order in repeat ``rep``: as given, then reversed, and so on."""
    return kinds if rep % 2 == 0 else kinds[::-1]


def start_relay(relay: RelayProcess, workers: int) -> None:
    relay.start()
    try:
        relay.wait_for_scn(1)
        relay.wait_serving(workers)
    except BaseException:
        relay.stop()
        raise


def tls_session(relay: RelayProcess) -> str:
    """The protocol and cipher the relay's TLS listener agrees on with our client."""
    ctx = relay.ssl_context
    assert ctx is not None
    with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        cipher = s.cipher()
        return f"{s.version()} {cipher[0] if cipher else '?'}"


def check_refused(relay: RelayProcess) -> str:
    """A relay with a reader must refuse a stream without the token (else it is not
    the configuration the issue measures)."""
    req = urllib.request.Request(relay.url + "/v1/stream?max_bytes=1024")
    try:
        with urllib.request.urlopen(req, timeout=10, context=relay.ssl_context) as resp:
            return f"NOT refused: HTTP {resp.status} without a token"
    except urllib.error.HTTPError as exc:
        return f"refused without a token (HTTP {exc.code})"
    except (OSError, ssl.SSLError) as exc:
        return f"no answer without a token ({exc})"


# -- the header walk ------------------------------------------------------------------


class EventWalk:
    """Counts the data events of a stream's bytes, fed as they arrive, cutting at event
    boundaries by their headers (total length, source id; no CRC check). An event
    counts once its last byte is in."""

    def __init__(self) -> None:
        self.rest = 0  # bytes still to come of the event under way
        self.is_data = False  # whether that event is a data event
        self.partial = b""  # the start of a header cut by a chunk boundary

    def feed(self, data: bytes) -> int:
        unpack = _FIELDS.unpack_from
        n = len(data)
        pos = done = 0
        while pos < n:
            if self.rest:
                take = min(self.rest, n - pos)
                pos += take
                self.rest -= take
                if not self.rest and self.is_data:
                    done += 1
                continue
            if self.partial or n - pos < _HEAD:
                need = _HEAD - len(self.partial)
                self.partial += data[pos : pos + need]
                pos = min(n, pos + need)
                if len(self.partial) < _HEAD:
                    break
                total, _ts, source_id = unpack(self.partial, 12)
                self.partial = b""
                self.rest = total - _HEAD
                self.is_data = source_id >= 0
                if not self.rest and self.is_data:
                    done += 1
                continue
            total, _ts, source_id = unpack(data, pos + 12)
            if pos + total <= n:
                pos += total
                done += source_id >= 0
            else:
                self.rest = total - (n - pos)
                self.is_data = source_id >= 0
                pos = n
        return done


def client_ssl(ca_file: Path | None) -> dict[str, Any]:
    """aiohttp connector arguments: verify the relay with the CA (TLS relays)."""
    if ca_file is None:
        return {}
    from databus.security import client_context

    return {"ssl": client_context(ca_file)}


def one_pass_here(relay: RelayProcess, max_bytes: int, events: int) -> tuple[int, int]:
    """(bytes, data events) of one stream from the oldest window until it has brought
    ``events`` data events, read in this process with the consumers' walk."""

    async def run() -> tuple[int, int]:
        import aiohttp

        conn = aiohttp.TCPConnector(force_close=True, **client_ssl(relay.ca_file))
        timeout = aiohttp.ClientTimeout(total=120, sock_read=30)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout,
                                         headers=relay.headers) as session:
            got = n = 0
            walk = EventWalk()
            params = {"follow": "true", "max_bytes": str(max_bytes)}
            async with session.get(relay.url + "/v1/stream", params=params) as resp:
                if resp.status != 200 or resp.headers.get("X-Databus-Streaming") != "1":
                    raise RuntimeError(f"no stream: HTTP {resp.status} "
                                       f"{(await resp.read())[:300]!r}")
                while n < events:
                    data = await resp.content.readany()
                    if not data:
                        raise RuntimeError("the stream ended before the newest window")
                    got += len(data)
                    n += walk.feed(data)
            return got, n

    return asyncio.run(run())


# -- 1. streaming throughput ----------------------------------------------------------


def _stream_consumer(url: str, ca_file: Path | None, headers: dict[str, str],
                     max_bytes: int, pass_events: int, loop: str, ready: Any, go: MpEvent,
                     start: Any, duration: float, out: Any) -> None:
    """One streaming consumer: from the oldest window, ``readany`` and the header walk;
    a pass ends once ``pass_events`` data events are in (the stream is closed and a new
    one opened)."""
    import aiohttp

    params = {"follow": "true", "max_bytes": str(max_bytes)}

    async def one_pass(session: aiohttp.ClientSession, stop_at: float) -> tuple[int, int]:
        walk = EventWalk()
        got = events = 0
        async with session.get(url, params=params) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
            content = resp.content
            while True:
                data = await content.readany()
                if not data:
                    raise RuntimeError("the stream ended")
                got += len(data)
                events += walk.feed(data)
                if events >= pass_events or time.monotonic() >= stop_at:
                    return got, events

    async def run() -> tuple[int, float, int, float, int]:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
        conn = aiohttp.TCPConnector(force_close=True, **client_ssl(ca_file))
        async with aiohttp.ClientSession(connector=conn, timeout=timeout,
                                         headers=headers) as session:
            await one_pass(session, time.monotonic() + 0.3)  # warm up
            ready.release()
            go.wait()  # nothing else runs on this loop meanwhile
            deadline = start.value + duration
            total = requests = events = 0
            passes = 0.0
            t0 = time.monotonic()
            while time.monotonic() < deadline:
                got, n = await one_pass(session, deadline)
                total += got
                events += n
                passes += n / pass_events
                requests += 1
            return total, time.monotonic() - t0, requests, passes, events

    total, elapsed, requests, passes, events = run_on(loop, run())
    out.put((total, elapsed, requests, 0, passes, events))


def stream_run(relay: RelayProcess, consumers: int, args: argparse.Namespace) -> RunResult:
    def make(i: int, ready: Any, go: MpEvent, start: Any, out: Any) -> Any:
        return CTX.Process(target=_stream_consumer, args=(
            relay.url + "/v1/stream", relay.ca_file, relay.headers, args.max_bytes,
            args.events, args.consumer_loop, ready, go, start, args.duration, out),
            daemon=True)

    return _run_clients(consumers, args.duration, relay.cpu_seconds, make)


def cpu_per_gb(r: RunResult) -> float:
    return r.relay_cpu / max(r.bytes / 1e9, 1e-12)


def throughput(pki: Pki, kinds: list[str], counts: list[int], args: argparse.Namespace,
               summary: list[str]) -> None:
    window_bytes = args.event_bytes + 64  # + the EOW event
    capacity_mb = max(4, (args.events * window_bytes * 5 // 4) // MIB + 1)
    uri = (f"synthetic://?rate=0&keys=100000&event_bytes={args.event_bytes}"
           f"&events_per_window=1&update_ratio=0.5&limit={args.events}&seed=1")
    relays = {kind: new_relay(kind, uri, capacity_mb, pki, args) for kind in kinds}
    try:
        for relay in relays.values():
            relay.start()
        print("\n## 1. streaming throughput", flush=True)
        for kind, relay in relays.items():
            relay.wait_for_scn(args.events)
            relay.wait_serving(args.workers)
            got, n = one_pass_here(relay, args.max_bytes, args.events)
            used = relay.buffer_status()["used_bytes"] / 1e6
            extra = ""
            if relay.tls is not None:
                extra = f"; {tls_session(relay)}"
            if relay.reader_token is not None:
                extra += f"; reader granted {args.grant}, {check_refused(relay)}"
            print(f"{kind}: relay pid {relay.pid} at {relay.url}, {relay.serving()}; "
                  f"buffer {used:.1f} MB; one pass: {got / 1e6:.1f} MB, {n} data "
                  f"events{extra}", flush=True)
            if n != args.events:
                raise RuntimeError(f"{kind}: a pass brought {n} events, not {args.events}")
        print(f"{'kind':>10} {'C':>3} {'MB/s':>9} {'events/s':>10} {'relay cores':>11} "
              f"{'CPU s/GB':>8} {'consumers':>9} {'others':>6}  (runs MB/s; cores: "
              "relay, consumer processes, other jobs + steal)", flush=True)
        for c in counts:
            runs: dict[str, list[RunResult]] = {kind: [] for kind in kinds}
            for rep in range(args.repeat):
                for kind in alternate(kinds, rep):
                    runs[kind].append(stream_run(relays[kind], c, args))
            best = {kind: max(rs, key=lambda r: r.mb_s) for kind, rs in runs.items()}
            for kind in kinds:
                r = best[kind]
                print(f"{kind:>10} {c:3d} {r.mb_s:9.1f} {r.events_s:10,.0f} "
                      f"{r.relay_cpu / r.seconds:11.2f} {cpu_per_gb(r):8.3f} "
                      f"{r.clients_cpu / r.seconds:9.2f} {r.others:6.2f}  ("
                      + ", ".join(f"{x.mb_s:.0f}" for x in runs[kind]) + ")", flush=True)
            plain = best["plain"]
            for kind in kinds[1:]:
                b = best[kind]
                ratio = b.mb_s / max(plain.mb_s, 1e-9)
                cost = cpu_per_gb(b) / max(cpu_per_gb(plain), 1e-12)
                goal = (f" -> goal >= 0.7 {'met' if ratio >= 0.7 else 'missed'}"
                        if kind == ISSUE else "")
                line = (f"throughput, {c} consumer(s): {kind} / plain {ratio:.3f} (MB/s; "
                        f"events/s {b.events_s / max(plain.events_s, 1e-9):.3f}){goal}; "
                        f"relay CPU s/GB plain {cpu_per_gb(plain):.3f}, {kind} "
                        f"{cpu_per_gb(b):.3f} (x{cost:.2f}: per relay core {1 / cost:.3f} of "
                        "plain's MB/s)")
                print(line, flush=True)
                summary.append(line)
        if args.profile:
            for kind in kinds:
                profile(relays[kind], kind, max(counts), args)
    finally:
        for relay in relays.values():
            relay.stop()


def profile(relay: RelayProcess, kind: str, consumers: int, args: argparse.Namespace) -> None:
    """One more throughput run with py-spy sampling the relay's main process."""
    out = Path(tempfile.mkdtemp(prefix="databus-prof-")) / f"tls-{kind}.txt"
    spy = start_pyspy(relay.pid, args.duration + 1, out)
    if spy is None:
        print("py-spy not found: pip install py-spy into the venv")
        return
    time.sleep(0.3)
    r = stream_run(relay, consumers, args)
    _, err = spy.communicate(timeout=60)
    print(f"\n## py-spy of the {kind} relay's main process, {consumers} streaming consumers, "
          f"under the profiler {r.mb_s:.1f} MB/s, {cpu_per_gb(r):.3f} relay CPU s/GB ({out})")
    if spy.returncode:
        print(err.decode(errors="replace")[-2000:])
    print(summarize_pyspy(out, seconds=args.duration + 1), flush=True)


# -- 2. latency -----------------------------------------------------------------------


def _latency_process(url: str, ca_file: Path | None, headers: dict[str, str], n: int,
                     window: Any, go: Any, ready: Any, loop: str, out: Any) -> None:
    async def run() -> None:
        import aiohttp

        lats = [array.array("q") for _ in range(n)]
        stats = [[0, 0, 0, 0] for _ in range(n)]  # events, writes, errors, (unused)
        conn = aiohttp.TCPConnector(limit=0, **client_ssl(ca_file))
        timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout,
                                         headers=headers) as session:
            resps = []
            for _ in range(n):
                resp = await session.get(url, params={
                    "max_bytes": str(4 * MIB), "follow": "true", "checkpoint": LATEST})
                if resp.status != 200 or resp.headers.get("X-Databus-Streaming") != "1":
                    raise RuntimeError(f"no stream: HTTP {resp.status}")
                resps.append(resp)
            ready.release()
            await asyncio.gather(*(_consume_stream(r, window, go, lats[i], stats[i])
                                   for i, r in enumerate(resps)))
        out.put(([lat.tobytes() for lat in lats], stats))

    run_on(loop, run())


def latency_run(relay: RelayProcess, kind: str, consumers: int,
                args: argparse.Namespace) -> ConfigResult:
    """C streaming consumers from the newest position (relay_latency's ``run_config``
    for streams, with the relay's TLS context and token)."""
    sizes = [min(args.per_process, consumers - i)
             for i in range(0, consumers, args.per_process)]
    window = CTX.Array("q", [0, 0], lock=False)
    go = CTX.Event()
    ready = CTX.Semaphore(0)
    out = CTX.Queue()
    procs = [CTX.Process(target=_latency_process, args=(
        relay.url + "/v1/stream", relay.ca_file, relay.headers, n, window, go, ready,
        args.consumer_loop, out), daemon=True) for n in sizes]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=60):
            raise TimeoutError("a consumer process did not get ready")
    window[0] = time.time_ns() + int(args.warmup * 1e9)
    window[1] = window[0] + int(args.duration * 1e9)
    go.set()
    time.sleep(max(0.0, (window[0] - time.time_ns()) / 1e9))
    scn0 = int(relay.buffer_status()["max_scn"] or 0)
    cpu0 = relay.cpu_seconds()
    ccpu0 = _cpu_of(procs)
    busy0, steal0, tot0 = machine_cpu()
    irq0 = softirq_seconds()
    t0 = time.monotonic()
    time.sleep(max(0.0, (window[1] - time.time_ns()) / 1e9))
    scn1 = int(relay.buffer_status()["max_scn"] or 0)
    cpu1 = relay.cpu_seconds()
    ccpu1 = _cpu_of(procs)
    busy1, steal1, tot1 = machine_cpu()
    irq1 = softirq_seconds()
    elapsed = time.monotonic() - t0
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    lat_all: array.array[int] = array.array("q")
    received: list[int] = []
    writes = errors = 0
    for blobs, stats in results:
        for blob in blobs:
            lat_all.frombytes(blob)
        for s in stats:
            received.append(s[0])
            writes += s[1]
            errors += s[2]
    ordered = sorted(lat_all)
    cores = os.cpu_count() or 1
    return ConfigResult(
        label=kind, rate=args.rate, consumers=consumers,
        produced_rate=(scn1 - scn0) / elapsed, received=received, seconds=args.duration,
        p50_ms=percentile(ordered, 0.50) / 1e6, p99_ms=percentile(ordered, 0.99) / 1e6,
        max_ms=(ordered[-1] / 1e6) if ordered else float("nan"),
        relay_cpu=(cpu1 - cpu0) / elapsed, consumers_cpu=(ccpu1 - ccpu0) / elapsed,
        machine_busy=(busy1 - busy0) / max(tot1 - tot0, 1e-9),
        steal=(steal1 - steal0) / max(tot1 - tot0, 1e-9) * cores,
        requests=writes, empty=0, errors=errors, mode="stream",
        softirq=(irq1 - irq0) / max(tot1 - tot0, 1e-9) * cores)


def latency(pki: Pki, kinds: list[str], counts: list[int], args: argparse.Namespace,
            summary: list[str]) -> None:
    window_bytes = args.event_bytes + 64
    capacity_mb = max(16, int(args.rate * window_bytes * 30 / MIB) + 1)
    uri = (f"synthetic://?rate={args.rate:g}&keys=100000&event_bytes={args.event_bytes}"
           f"&events_per_window=1&update_ratio=0.5&seed=1")
    print(f"\n## 2. latency: {args.rate:g} windows/s, streams from the newest position; "
          f"{args.warmup:g} s warm-up, {args.duration:g} s measured", flush=True)
    runs: dict[tuple[str, int], list[ConfigResult]] = {}
    for rep in range(args.repeat):
        for kind in alternate(kinds, rep):
            relay = new_relay(kind, uri, capacity_mb, pki, args)
            start_relay(relay, args.workers)
            try:
                time.sleep(0.5)
                print(f"  repeat {rep + 1}, {kind}: relay pid {relay.pid}, "
                      f"{relay.serving()}" + (f", {tls_session(relay)}"
                                              if relay.tls is not None else ""), flush=True)
                for c in counts:
                    r = latency_run(relay, kind, c, args)
                    runs.setdefault((kind, c), []).append(r)
                    print(f"    C={c:3d} p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms  "
                          f"max {r.max_ms:7.1f} ms  consumption/production {r.ratio:.3f}  "
                          f"relay {r.relay_cpu:.2f} cores  others {r.interference:.2f}"
                          + (f"  errors {r.errors}" if r.errors else ""), flush=True)
            finally:
                relay.stop()
    print(f"{'kind':>10} {'C':>3} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'cons/prod':>9} "
          f"{'relay':>6} {'others':>6}  (kept: lowest p99 of the runs with others <= "
          f"{args.quiet_cores:g} cores, else of all; runs p99/others)")
    for c in counts:
        kept: dict[str, ConfigResult] = {}
        for kind in kinds:
            rs = runs[(kind, c)]
            r = min(rs, key=lambda x: (x.interference > args.quiet_cores, x.p99_ms))
            kept[kind] = r
            print(f"{kind:>10} {c:3d} {r.p50_ms:7.2f} {r.p99_ms:7.2f} {r.max_ms:7.1f} "
                  f"{r.ratio:9.3f} {r.relay_cpu:6.2f} {r.interference:6.2f}  ("
                  + ", ".join(f"{x.p99_ms:.1f}/{x.interference:.2f}" for x in rs) + ")",
                  flush=True)
        p = kept["plain"]
        for kind in kinds[1:]:
            t = kept[kind]
            line = (f"latency, {c} consumer(s) at {args.rate:g}/s: p50 plain {p.p50_ms:.2f} ms, "
                    f"{kind} {t.p50_ms:.2f} ms; p99 plain {p.p99_ms:.2f} ms, {kind} "
                    f"{t.p99_ms:.2f} ms; {kind} / plain p99 {t.p99_ms / max(p.p99_ms, 1e-9):.2f}"
                    f"; relay cores plain {p.relay_cpu:.2f}, {kind} {t.relay_cpu:.2f}")
            print(line, flush=True)
            summary.append(line)


# -- main -----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs per configuration and kind (plain and TLS alternating)")
    parser.add_argument("--consumers", default="1,10", help="consumer counts, comma-separated")
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="windows/s of the synthetic source in the latency part")
    parser.add_argument("--events", type=int, default=20_000,
                        help="windows prefilled for the throughput part (one pass)")
    parser.add_argument("--event-bytes", type=int, default=2500)
    parser.add_argument("--max-bytes", type=int, default=4 * MIB,
                        help="max_bytes of the throughput streams (per write)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="relays compared, comma-separated: plain (always, the "
                             "reference), tls (HTTPS, no readers), tls+reader (HTTPS and a "
                             "reader with a token: the issue's figure)")
    parser.add_argument("--grant", default="*",
                        help="sources = [...] of the tls+reader relay's reader, "
                             "comma-separated")
    parser.add_argument("--part", default="throughput,latency",
                        help="throughput, latency or both (comma-separated)")
    parser.add_argument("--warmup", type=float, default=1.0,
                        help="latency: seconds of streaming before the clock starts")
    parser.add_argument("--per-process", type=int, default=10,
                        help="latency: streaming consumers per consumer process")
    parser.add_argument("--quiet-cores", type=float, default=0.25,
                        help="latency: cores other jobs and steal may take from a quiet run")
    parser.add_argument("--workers", type=int, default=1, help="relay.workers of every relay")
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default=None,
                        help="DATABUS_EVENT_LOOP of the relays (default: their own choice)")
    parser.add_argument("--consumer-loop", choices=("asyncio", "uvloop"),
                        default=default_consumer_loop(),
                        help="the consumer processes' event loop (default: uvloop when "
                             "installed)")
    parser.add_argument("--profile", action="store_true",
                        help="throughput: one more run of each kind at the highest consumer "
                             "count with py-spy sampling the relay (figures come from the "
                             "other runs)")
    parser.add_argument("--quick", action="store_true",
                        help="2 s per run, 10,000 events, 0.5 s warm-up, one run (unless "
                             "given)")
    args = parser.parse_args()
    if args.quick:  # shorter defaults; flags given explicitly still win
        for name, value in (("duration", 2.0), ("events", 10_000), ("warmup", 0.5),
                            ("repeat", 1)):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    counts = [int(c) for c in args.consumers.split(",") if c.strip()]
    parts = {p.strip() for p in args.part.split(",") if p.strip()}
    kinds = ["plain"] + [k for k in KINDS[1:] if k in args.kinds.split(",")]
    if set(args.kinds.split(",")) - set(KINDS):
        parser.error(f"--kinds: of {', '.join(KINDS)}")
    if not parts or parts - {"throughput", "latency"}:
        parser.error("--part: throughput, latency or both")
    print(f"# relay TLS: Python {platform.python_version()}, {ssl.OPENSSL_VERSION}, "
          f"{os.cpu_count()} cores, relays {', '.join(kinds)}, {args.event_bytes} B events, "
          "1 event/window, "
          f"consumers {','.join(map(str, counts))} on {args.consumer_loop}, relay workers="
          f"{args.workers}, event loop {args.event_loop or 'relay default'}, "
          f"{args.duration:g} s per run, best of {args.repeat}; {loadavg()}; "
          f"{code_version()}", flush=True)
    pki = make_pki()
    summary: list[str] = []
    try:
        if "throughput" in parts:
            throughput(pki, kinds, counts, args, summary)
        if "latency" in parts:
            latency(pki, kinds, counts, args, summary)
    finally:
        shutil.rmtree(pki.dir, ignore_errors=True)
    print("\n## summary")
    for line in summary:
        print(line)
    print(f"end: {loadavg()}")


if __name__ == "__main__":
    main()
