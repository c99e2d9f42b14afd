"""Snapshot delta or log replay: where they break even (paper 000 Figure 16).

    .venv/bin/python benchmarks/bootstrap_breakeven.py [--quick] [--changes 100000]
        [--bases 100000,1000000] [--ratios 0.1,0.2,0.33,0.5,0.66,0.8,0.9,0.99] [--repeat 5]
        [--window-events 10] [--value-bytes 400] [--http]
        [--plot benchmarks/bootstrap_breakeven.png]

Setup, per snapshot size B (``--bases``) and update ratio r: a fresh schema in a
throwaway PostgreSQL 15 (started as the test fixture starts it: fsync off) holds a
bootstrap store whose log has B inserts (keys 0, 2, 4, ...; windows of
``--window-events`` events) up to SCN T, then ``--changes`` N changes after T: a
fraction 1 - r inserts a new key (an odd key, drawn at random, so new rows land all over
the key order), the rest update a key inserted since T, drawn uniformly among those
(deterministic: seeded per ratio). So
the ratio of updates to existing keys is exactly r and equals what the server measures
(``1 - distinct keys / rows`` over the log after T). Windows go in with
``storage.append`` (binary COPY), the applier (``storage.apply``) runs until caught up,
then every table is ``VACUUM ANALYZE``d (the steady state autovacuum reaches).

A consumer holds the state at T (a dict key -> value bytes) and is brought up to date,
in the same process, through ``Bootstrapper.serve`` in a loop (default), or with
``--http`` through the real aiohttp server (``/v1/bootstrap/stream``, in-process, on
loopback) and an aiohttp client. Each run starts from a copy of the state at T and
sends back each response's checkpoint until the phase is ``done``; every response body
is verified (``iter_events``: header and body CRCs, as the client does), split into key
and value bytes and applied to the dict (same work for both paths), and the final dict
is checked against the expected state. Paths:

- **snapshot**: ``strategy = "snapshot"``: the consolidated delta (snapshot rows with SCN
  > T, in (scn, key) order, in batches the server resumes after the last pair), then the
  catch-up (empty: the applier is at the log's end);
- **log**: ``strategy = "log"``: replay of every log row after T;
- **auto**: ``strategy = "auto"`` with the defaults of ``[bootstrap.server]``
  (``breakeven_ratio``, ``ratio_sample_rows``): which path it chose and its time.

Each path runs once to warm the caches, then ``--repeat`` times (the paths alternate);
kept is the best time of each. Figures (ratios measured in the same run): snapshot time
/ log time (below 1: the snapshot delta is faster); auto time / the faster of the two
(goal <= 1.10); and, free of the noise of auto's own runs, the best time of the path
auto chose / the faster path's (1.00 when it chose the faster one). The break-even is
where snapshot / log crosses 1, interpolated, for each B (read in (scn, key) order, the
delta costs what it returns, whatever the snapshot's size; read in key order, as at
first, it walked the whole primary key and the break-even moved with B). The plot shows
both paths' times against r, one pair of lines per B. ``--quick``: 20,000 changes,
B = 20,000 and 200,000, 1 repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _pg import PostgresServer, fresh_schema, postgres, vacuum_analyze
from _relay_proc import code_version, loadavg

from databus.bootstrap._postgres import PostgresStorage
from databus.bootstrap._serve import Bootstrapper, ServePolicy
from databus.bootstrap._storage import LogWindow, StoredEvent, stored_event
from databus.checkpoint import Checkpoint
from databus.config import BootstrapServerConfig
from databus.event import HEADER_SIZE, Op, encode_event, iter_events
from databus.filters import FilterSpec

SOURCE = "bench.rows"
CODE = ("bootstrap", "databus")  # the code measured (uncommitted changes are listed)
SOURCE_ID = 1
State = dict[bytes, bytes]


# -- the data ---------------------------------------------------------------------------


def change_keys(n: int, ratio: float, base: int, seed: int) -> list[int]:
    """The key of each of ``n`` changes: inserts of new (odd) keys spread evenly
    (Bresenham: ``ceil(i * (1 - ratio))`` inserts among the first i changes), updates of
    a key inserted since T otherwise."""
    rng = random.Random(seed)
    p = 1.0 - ratio
    distinct = max(1, round(n * p))
    if distinct > base:
        raise SystemExit(f"--base must be at least {distinct} (new keys are odd keys below "
                         "2 * base)")
    new_keys = [2 * k + 1 for k in rng.sample(range(base), distinct)]
    inserted: list[int] = []
    keys = []
    for i in range(n):
        # Insert when the target count of distinct keys after change i has grown.
        if len(inserted) < distinct and (not inserted or len(inserted) < round((i + 1) * p)):
            inserted.append(new_keys[len(inserted)])
            keys.append(inserted[-1])
        else:
            keys.append(inserted[rng.randrange(len(inserted))])
    return keys


def value_for(key: int, n: int, size: int) -> bytes:
    head = f"{key}:{n}:".encode()
    return head + b"x" * max(0, size - len(head))


def make_windows(keys: list[int], first_scn: int, first_n: int, per_window: int,
                 value_bytes: int) -> tuple[list[LogWindow], State]:
    windows = []
    final: State = {}
    scn = first_scn
    for start in range(0, len(keys), per_window):
        events: list[StoredEvent] = []
        for i, key in enumerate(keys[start:start + per_window]):
            value = value_for(key, first_n + start + i, value_bytes)
            event = encode_event(scn=scn, source_id=SOURCE_ID, op=Op.UPSERT, key=key,
                                 value=value, timestamp_ns=scn * 1000)
            stored = stored_event(SOURCE, event)
            events.append(stored)
            final[stored.key] = value
        windows.append(LogWindow(scn, scn * 1000, events))
        scn += 1
    return windows, final


@dataclass
class Store:
    ratio: float
    base: int
    schema: str
    storage: PostgresStorage
    since_scn: int  # T
    at_t: State
    expected: State
    measured_ratio: float
    delta_rows: int
    log_rows: int
    build_s: float


def build_store(server: PostgresServer, ratio: float, base: int, args: argparse.Namespace
                ) -> Store:
    began = time.perf_counter()
    schema = f"bench_breakeven_{base}_{round(ratio * 100):03d}"
    storage = PostgresStorage(fresh_schema(server, schema))
    storage.ensure_sources([SOURCE])
    base_keys = [2 * k for k in range(base)]
    base_windows, at_t = make_windows(base_keys, 1, 0, args.window_events, args.value_bytes)
    since = base_windows[-1].scn
    keys = change_keys(args.changes, ratio, base, seed=round(ratio * 1000))
    windows, changed = make_windows(keys, since + 1, base, args.window_events,
                                    args.value_bytes)
    floor: int | None = 0
    everything = base_windows + windows
    for start in range(0, len(everything), 500):
        batch = everything[start:start + 500]
        storage.append(batch, Checkpoint.after(batch[-1].scn), log_floor_scn=floor)
        floor = None
    while storage.apply(max_rows=20_000) is not None:
        pass
    vacuum_analyze(server, schema)
    rows, distinct = storage.log_key_stats([SOURCE], after_scn=since, sample=args.changes)
    return Store(ratio, base, schema, storage, since, at_t, {**at_t, **changed},
                 1.0 - distinct / rows, len(set(keys)), len(keys),
                 time.perf_counter() - began)


# -- the consumer -----------------------------------------------------------------------


def apply_body(state: State, body: bytes | bytearray) -> int:
    """Verify (header and body CRCs, as a client does), split and apply a stream body's
    data events; how many."""
    n = 0
    data = bytes(body)
    for offset, header in iter_events(data):
        if header.is_control:
            continue
        start = offset + HEADER_SIZE
        key = data[start:start + header.key_length]
        if header.op is Op.DELETE:
            state.pop(key, None)
        else:
            state[key] = data[start + header.key_length:offset + header.total_length]
        n += 1
    return n


@dataclass
class Run:
    seconds: float
    started_as: str
    requests: int
    events: int


def run_inprocess(store: Store, strategy: str, max_bytes: int) -> tuple[Run, State]:
    defaults = BootstrapServerConfig()
    boot = Bootstrapper(store.storage, ServePolicy(
        strategy=strategy,  # type: ignore[arg-type]
        breakeven_ratio=defaults.breakeven_ratio,
        ratio_sample_rows=defaults.ratio_sample_rows, batch_rows=defaults.batch_rows))
    spec = FilterSpec.parse(None)
    state = dict(store.at_t)
    cp = Checkpoint(store.since_scn)
    started_as = ""
    requests = events = 0
    began = time.perf_counter()
    while True:
        served = boot.serve(cp, [SOURCE], spec, max_bytes)
        requests += 1
        events += apply_body(state, served.body)
        started_as = served.started_as or started_as
        cp = served.checkpoint
        if served.done:
            break
    return Run(time.perf_counter() - began, started_as, requests, events), state


def run_http(store: Store, strategy: str, max_bytes: int) -> tuple[Run, State]:
    return asyncio.run(_run_http(store, strategy, max_bytes))


async def _run_http(store: Store, strategy: str, max_bytes: int) -> tuple[Run, State]:
    import aiohttp
    from aiohttp import web

    from databus.bootstrap._server import ServiceInfo, create_app

    defaults = BootstrapServerConfig()
    boot = Bootstrapper(store.storage, ServePolicy(
        strategy=strategy,  # type: ignore[arg-type]
        breakeven_ratio=defaults.breakeven_ratio,
        ratio_sample_rows=defaults.ratio_sample_rows, batch_rows=defaults.batch_rows))
    runner = web.AppRunner(create_app(boot, ServiceInfo(max_bytes_cap=max(max_bytes, 1024))))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/bootstrap/stream"
    state = dict(store.at_t)
    cp = json.dumps({"window_scn": store.since_scn})
    started_as = ""
    requests = events = 0
    try:
        async with aiohttp.ClientSession() as session:
            began = time.perf_counter()
            while True:
                params = {"checkpoint": cp, "sources": SOURCE, "max_bytes": str(max_bytes)}
                async with session.get(url, params=params) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"{resp.status}: {await resp.text()}")
                    body = await resp.read()
                    cp = resp.headers["X-Databus-Checkpoint"]
                    phase = resp.headers["X-Databus-Bootstrap-Phase"]
                    started_as = resp.headers.get("X-Databus-Bootstrap-Strategy", started_as)
                requests += 1
                events += apply_body(state, body)
                if phase == "done":
                    break
            seconds = time.perf_counter() - began
    finally:
        await runner.cleanup()
    return Run(seconds, started_as, requests, events), state


# -- the experiment ---------------------------------------------------------------------


@dataclass
class Result:
    store: Store
    best: dict[str, Run]

    @property
    def snapshot_over_log(self) -> float:
        return self.best["snapshot"].seconds / self.best["log"].seconds

    @property
    def choice_over_best(self) -> float:
        """The best time of the path auto chose over the faster path's: the cost of the
        decision alone, without the noise of auto's own runs."""
        chosen = self.best[self.best["auto"].started_as].seconds
        return chosen / min(self.best["snapshot"].seconds, self.best["log"].seconds)

    @property
    def auto_over_best(self) -> float:
        return self.best["auto"].seconds / min(self.best["snapshot"].seconds,
                                               self.best["log"].seconds)


def measure(store: Store, args: argparse.Namespace) -> Result:
    runner: Callable[[Store, str, int], tuple[Run, State]] = (
        run_http if args.http else run_inprocess)
    best: dict[str, Run] = {}
    for round_no in range(args.repeat + 1):
        order = ["snapshot", "log", "auto"]
        if round_no % 2:
            order.reverse()
        for strategy in order:
            run, state = runner(store, strategy, args.max_bytes)
            if state != store.expected:
                raise AssertionError(f"{strategy} at ratio {store.ratio}: the consumer's state "
                                     "differs from the source's")
            if round_no == 0:
                continue  # warm-up
            if strategy not in best or run.seconds < best[strategy].seconds:
                best[strategy] = run
    return Result(store, best)


def breakeven(results: list[Result]) -> float | None:
    """Where snapshot / log crosses 1 (linear interpolation; the first crossing)."""
    pts = [(r.store.measured_ratio, r.snapshot_over_log) for r in results]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if (y0 - 1) * (y1 - 1) <= 0 and y0 != y1:
            return x0 + (1 - y0) * (x1 - x0) / (y1 - y0)
    return None


def plot(results: list[Result], path: Path, args: argparse.Namespace) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot (make venv installs the [bench] extra)"
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, base in enumerate(sorted({r.store.base for r in results})):
        rows = [r for r in results if r.store.base == base]
        xs = [r.store.measured_ratio for r in rows]
        size = f"{base:,} rows before T"
        ax.plot(xs, [r.best["snapshot"].seconds for r in rows], "o-", color=f"C{2 * i}",
                label=f"snapshot delta + catch-up, {size}")
        ax.plot(xs, [r.best["log"].seconds for r in rows], "s--", color=f"C{2 * i + 1}",
                label=f"log replay, {size}")
        cross = breakeven(rows)
        if cross is not None:
            ax.axvline(cross, color=f"C{2 * i}", linestyle=":", linewidth=0.9,
                       label=f"measured break-even {cross:.2f} ({size})")
    ax.axvline(BootstrapServerConfig().breakeven_ratio, color="grey", linestyle="--",
               linewidth=0.8, label="breakeven_ratio (config default)")
    ax.set_xlabel("ratio of updates to existing keys after T")
    ax.set_ylabel("seconds to bring the consumer up to date")
    via = "HTTP" if args.http else "Bootstrapper.serve"
    ax.set_title(f"Bootstrap from T over {args.changes:,} changes ({via}, best of "
                 f"{args.repeat})", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot written to {path}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="20,000 changes, bases 20,000 and 200,000, 1 repeat")
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--bases", default="100000,1000000",
                        help="rows inserted before T (the consumer already has them): one "
                             "sweep per value")
    parser.add_argument("--ratios", default="0.1,0.2,0.33,0.5,0.66,0.8,0.9,0.99")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--window-events", type=int, default=10)
    parser.add_argument("--value-bytes", type=int, default=400)
    parser.add_argument("--max-bytes", type=int, default=1 << 20,
                        help="max_bytes of each stream request (the server's default)")
    parser.add_argument("--http", action="store_true",
                        help="through the aiohttp server instead of Bootstrapper.serve")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG")
    parser.add_argument("--keep", action="store_true", help="keep each ratio's schema")
    args = parser.parse_args()
    if args.quick:
        args.changes, args.bases, args.repeat = 20_000, "20000,200000", 1
    ratios = [float(x) for x in args.ratios.split(",")]
    bases = [int(x) for x in args.bases.split(",")]
    print(f"Python {platform.python_version()}; {code_version(CODE)}; {loadavg()}")
    print(f"{args.changes:,} changes after T on "
          f"{' or '.join(f'{b:,}' for b in bases)} rows, windows of {args.window_events} "
          "events of "
          f"~{args.value_bytes + 60} bytes; via "
          f"{'HTTP' if args.http else 'Bootstrapper.serve'}; best of {args.repeat}")
    results: list[Result] = []
    with postgres() as server:
        for base in bases:
            for ratio in ratios:
                store = build_store(server, ratio, base, args)
                try:
                    result = measure(store, args)
                finally:
                    store.storage.close()
                    if not args.keep:
                        fresh_schema(server, store.schema)
                results.append(result)
                b = result.best
                print(f"  {base:,} rows before T, r={ratio:.2f} (measured "
                      f"{store.measured_ratio:.3f}, delta {store.delta_rows:,} rows, log "
                      f"{store.log_rows:,}; built in {store.build_s:.1f} s): snapshot "
                      f"{b['snapshot'].seconds:.3f} s, log {b['log'].seconds:.3f} s, auto "
                      f"{b['auto'].seconds:.3f} s ({b['auto'].started_as})", flush=True)
    for base in bases:
        report([r for r in results if r.store.base == base], base, args)
    print(loadavg())
    if args.plot:
        print(plot(results, args.plot, args))


def report(results: list[Result], base: int, args: argparse.Namespace) -> None:
    print()
    print(f"{base:,} rows before T ({base / args.changes:g} x the changes):")
    print()
    print("| update ratio | delta rows / log rows | snapshot s | log s | snapshot / log "
          "| faster | auto chose | auto / faster | chosen path / faster |")
    print("|---:|---:|---:|---:|---:|---|---|---:|---:|")
    for r in results:
        b = r.best
        faster = "snapshot" if b["snapshot"].seconds < b["log"].seconds else "log"
        print(f"| {r.store.measured_ratio:.2f} | {r.store.delta_rows / r.store.log_rows:.2f} "
              f"| {b['snapshot'].seconds:.3f} | {b['log'].seconds:.3f} "
              f"| {r.snapshot_over_log:.2f} | {faster} | {b['auto'].started_as} "
              f"| {r.auto_over_best:.2f} | {r.choice_over_best:.2f} |")
    cross = breakeven(results)
    print()
    print(f"measured break-even (snapshot / log = 1): "
          f"{'none in range' if cross is None else f'{cross:.2f}'}; configured "
          f"breakeven_ratio {BootstrapServerConfig().breakeven_ratio}")
    worst = max(results, key=lambda r: r.auto_over_best)
    print(f"auto within 10% of the faster path: "
          f"{sum(r.auto_over_best <= 1.10 for r in results)}/{len(results)} ratios "
          f"(worst {worst.auto_over_best:.2f} at {worst.store.measured_ratio:.2f}); its "
          f"choice alone (chosen path / faster): "
          f"{sum(r.choice_over_best <= 1.10 for r in results)}/{len(results)} (worst "
          f"{max(r.choice_over_best for r in results):.2f})")


if __name__ == "__main__":
    main()
