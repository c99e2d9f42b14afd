"""Relay clusters (issue 16): leader failover time and a chained relay's added latency,
on real processes, in one run.

    .venv/bin/python benchmarks/cluster_failover.py [--quick] [--session-timeout 2]
        [--also-timeouts 4] [--kills 10] [--rate 200] [--latency-seconds 15]

Setup, per session timeout: a throwaway 3-node ZooKeeper ensemble (the test fixtures'
``tests.fixtures._zookeeper_ensemble.launch()``: three JVMs, 200 ms tick, started once
for the whole run, on a fresh chroot per session timeout), a fresh SQLite source
``bench(id INTEGER PRIMARY KEY, committed_us, payload)`` captured by triggers (``databus
txlog install``; ``poll_ms=10``), and three ``databus relay --config`` child processes
(one worker each) with one buffer ``src`` on it and ``[relay.cluster] mode =
"leader-follower"``, ``session_timeout_s`` = the timeout measured. A writer *process*
commits single-row transactions (one window each) at ``--rate`` per second, paced by
absolute deadlines, for the whole run; each row's ``committed_us`` is the wall time
read just before its ``BEGIN IMMEDIATE``. This process holds one streaming subscription
(``/v1/stream?follow=true`` from "latest", aiohttp, event headers only, no Avro, no
client library) per relay it watches, in one asyncio thread, and notes the wall time at
which each window's EOW arrived (reconnecting every 50 ms to a relay that is down).

Phases:

1. ``chained latency`` (first session timeout only): the cluster steady (one leader
   reading the source, two followers chaining from it), two subscriptions, one on the
   leader and one on a follower; for ``--latency-seconds`` (the first ``--warmup`` s
   left out), latency of a window = its arrival - its row's ``committed_us``. Reported:
   p50/p90/p99/max for both, follower/leader ratios and the added ms, windows missing
   (must be 0).
2. ``failover`` (each session timeout): ``--kills`` times, SIGKILL of the current
   leader 0.5-1.0 s (random) after the cluster was last seen steady. The followers'
   ``/v1/status`` is polled every ``--poll-ms`` ms; the one seen with ``role`` "leader"
   is the new leader, and its epoch history's newest entry ``[epoch, s]`` says that the
   windows after SCN ``s`` are its own. **Failover time** = the arrival, at the
   subscription on the new leader, of its first window after ``s`` (the first window
   the new leader appended) - the kill. Then the killed relay is restarted and the
   script waits until it follows the new leader (role "follower", fetcher running,
   holding the leader's max SCN). Breakdown of each failover, all on the wall clock:
   ``expired`` (the ZooKeeper ensemble's "Expiring session" log line), ``elected``
   (the new leader's own log line "leader, epoch N", written after it won the lock, took
   the epoch by compare-and-set and wrote its epoch history), ``first window`` (the
   above), ``new to the cluster`` (the first window above the highest SCN any
   subscription had seen before the kill), and ``other follower`` (the first window
   after ``s`` at the third relay, which has to find the new leader and chain from it).

Reported: p50 and p99 over the kills (with 10 samples, p99 is the maximum) in seconds
and as a ratio of the session timeout, and the breakdown's medians. Machine: load
average before and after, and the CPU cores used over each phase by the relays,
ZooKeeper, the writer, this process and everything else ("other": other engineers'
jobs on this shared machine, with the biggest one named). Relay log lines at WARNING
or above are counted and the distinct ones printed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import multiprocessing as mp
import os
import platform
import random
import re
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the scripts run as benchmarks/x.py: make ``tests`` importable
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from _relay_proc import CLK_TCK, code_version, descendants, loadavg, total_cpu_seconds  # noqa: E402

from databus.checkpoint import Checkpoint  # noqa: E402
from databus.event import EOW_SOURCE_ID  # noqa: E402
from databus.fetchers.txlog import seal_sqlite_transaction  # noqa: E402
from tests.fixtures._procs import shutdown  # noqa: E402
from tests.fixtures._zookeeper_ensemble import (  # noqa: E402
    EnsembleChroot,
    ZooKeeperEnsemble,
    launch,
)
from tests.relay_harness import RelayProcess  # noqa: E402

CTX = mp.get_context("fork")
SOURCE = "shop.bench"  # the logical source name: the SQLite file's stem, the table
DDL = ("CREATE TABLE bench (id INTEGER PRIMARY KEY, committed_us INTEGER NOT NULL, "
       "payload TEXT NOT NULL)")
PAYLOAD = "x" * 64
LATEST = Checkpoint.latest().dumps()
# Event header fields after magic, version, op, flags and the two CRCs: total length,
# SCN, timestamp, (partition id), source id, partition key (= the key for int keys).
_FIELDS = struct.Struct(">Iq8x2xhq")
_HEAD = 12 + _FIELDS.size
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def now_us() -> int:
    return time.time_ns() // 1000


def log_time(line: str) -> float | None:
    """The wall time (seconds) of a log line stamped ``YYYY-MM-DD HH:MM:SS,mmm`` in local
    time (Python's logging ``asctime`` and log4j's ISO8601 both write that)."""
    match = _LOG_TIME.match(line)
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


# -- the source and its writer ---------------------------------------------------------


def make_source(path: Path) -> str:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(DDL)
    conn.close()
    uri = f"sqlite://{path}?tables=bench&poll_ms=10"
    exe = Path(sys.executable).with_name("databus")
    subprocess.run([str(exe), "txlog", "install", "--source", uri], check=True,
                   capture_output=True)
    return uri


def _writer(path: str, rate: float, stop: Any, out: Any) -> None:
    """Single-row transactions at ``rate`` per second until ``stop``; sends (commits,
    seconds, CPU seconds, commits later than 10 ms past their deadline)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    interval = 1.0 / rate
    t0 = time.perf_counter()
    n = late = 0
    while not stop.is_set():
        due = t0 + n * interval
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        elif delay < -0.010:
            late += 1
        committed = now_us()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO bench (committed_us, payload) VALUES (?, ?)",
                     (committed, PAYLOAD))
        seal_sqlite_transaction(conn)
        conn.execute("COMMIT")
        n += 1
    conn.close()
    out.put((n, time.perf_counter() - t0, time.process_time(), late))


class Writer:
    def __init__(self, path: Path, rate: float) -> None:
        self.stop_event, self.out = CTX.Event(), CTX.Queue()
        self.proc = CTX.Process(target=_writer, args=(str(path), rate, self.stop_event,
                                                      self.out), daemon=True)
        self.proc.start()

    def stop(self) -> tuple[int, float, float, int]:
        self.stop_event.set()
        result: tuple[int, float, float, int] = self.out.get(timeout=60)
        self.proc.join(10)
        return result


def commit_times(path: Path) -> dict[int, int]:
    conn = sqlite3.connect(path)
    rows = dict(conn.execute("SELECT id, committed_us FROM bench").fetchall())
    conn.close()
    return rows


# -- streaming subscriptions -----------------------------------------------------------


@dataclass
class Arrival:
    at_us: int
    scn: int
    keys: tuple[int, ...]


class Watcher:
    """One streaming subscription per watched relay URL, in an asyncio thread of its
    own; ``windows[url]`` lists each window's arrival (its EOW's) in order."""

    def __init__(self) -> None:
        self.windows: dict[str, list[Arrival]] = collections.defaultdict(list)
        self.reconnects: collections.Counter[str] = collections.Counter()
        self.errors: list[str] = []
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="watcher")
        self._thread.start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def watch(self, url: str) -> None:
        """Subscribe to ``url`` from its newest window on; returns once the stream is
        open (the subscription retries while the relay is down)."""
        opened = threading.Event()

        async def start() -> bool:
            if self._session is None:
                self._session = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=None, connect=2, sock_read=30))
            if url in self._tasks:
                return False
            self._tasks[url] = asyncio.create_task(self._follow(url, opened))
            return True
        if self._call(start()) and not opened.wait(30):
            raise TimeoutError(f"no stream from {url}: {self.errors[-3:]}")

    def unwatch(self, url: str) -> None:
        async def cancel() -> None:
            task = self._tasks.pop(url, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._call(cancel())

    async def _follow(self, url: str, opened: threading.Event) -> None:
        assert self._session is not None
        unpack = _FIELDS.unpack_from
        out = self.windows[url]
        params = {"sources": SOURCE, "follow": "true", "checkpoint": LATEST,
                  "max_bytes": str(1 << 20), "heartbeat_ms": "1000"}
        while True:
            try:
                async with self._session.get(url + "/v1/stream", params=params) as resp:
                    if resp.status != 200 or resp.headers.get("X-Databus-Streaming") != "1":
                        raise OSError(f"no stream from {url}: HTTP {resp.status}")
                    opened.set()
                    pending = b""
                    keys: list[int] = []
                    while True:
                        data = await resp.content.readany()
                        at = now_us()
                        if not data:
                            break
                        buf = pending + data if pending else data
                        off, n = 0, len(buf)
                        while n - off >= _HEAD:
                            total, scn, source_id, key = unpack(buf, off + 12)
                            if off + total > n:
                                break
                            if source_id >= 0:
                                keys.append(key)
                            elif source_id == EOW_SOURCE_ID:
                                out.append(Arrival(at, scn, tuple(keys)))
                                keys = []
                            off += total
                        pending = buf[off:] if off < n else b""
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                if "Connect" not in type(exc).__name__:  # not a relay that is down
                    self.errors.append(f"{url}: {type(exc).__name__}: {exc}")
            self.reconnects[url] += 1
            await asyncio.sleep(0.05)

    def first_after(self, url: str, scn: int, since_us: int) -> Arrival | None:
        for arrival in list(self.windows[url]):
            if arrival.scn > scn and arrival.at_us >= since_us:
                return arrival
        return None

    def max_scn(self, urls: list[str]) -> int:
        return max((self.windows[u][-1].scn for u in urls if self.windows[u]), default=-1)

    def close(self) -> None:
        async def close() -> None:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            if self._session is not None:
                await self._session.close()
        self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


# -- CPU and machine -------------------------------------------------------------------


def _all_cpu() -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2 :].split()
            out[int(entry)] = (text[text.index("(") + 1 : text.rindex(")")],
                               (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return out


class Meter:
    """Cores used over an interval by groups of this run's processes (by pid, read at the
    end: a process killed meanwhile is not counted) and by everything else ("other": the
    machine's busy time minus the processes of this run, i.e. other users' jobs)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0 = total_cpu_seconds()[0]
        self.all0 = _all_cpu()
        self.seen: dict[int, tuple[str, float]] = dict(self.all0)
        self.gone: set[int] = set()

    def sample(self) -> None:
        """Note every process's CPU now, so that one killed later still counts (up to
        this sample) and is kept under the name of its group."""
        ours = {os.getpid(), *descendants(os.getpid())}
        for pid, value in _all_cpu().items():
            self.seen[pid] = value
            if pid in ours:
                self.gone.add(pid)

    def stop(self, groups: dict[str, list[int]]) -> str:
        seconds = time.monotonic() - self.t0
        busy = total_cpu_seconds()[0] - self.busy0
        now = _all_cpu()
        ours = {os.getpid(), *descendants(os.getpid())}
        # Processes of this run that ended since a sample (a killed relay) count up to it.
        ended = {pid: self.seen[pid] for pid in self.gone if pid not in now}
        ours |= set(ended)
        delta = {pid: cpu - self.all0.get(pid, (name, 0.0))[1]
                 for pid, (name, cpu) in (now | ended).items()}
        now |= ended
        used: dict[str, float] = {}
        for name, pids in groups.items():
            used[name] = sum(delta.get(pid, 0.0) for pid in pids)
        grouped = {pid for pids in groups.values() for pid in pids}
        used["rest of this run"] = sum(delta.get(pid, 0.0) for pid in ours - grouped)
        used["other"] = max(0.0, busy - sum(used.values()))
        others = sorted(((d, now[pid][0]) for pid, d in delta.items() if pid not in ours),
                        reverse=True)
        top = ", ".join(f"{name} {d / seconds:.2f}" for d, name in others[:2]
                        if d / seconds >= 0.05)
        return ("cpu (cores): " + ", ".join(f"{k} {v / seconds:.2f}" for k, v in used.items())
                + f"; machine {busy / seconds:.2f} of {os.cpu_count()}"
                + (f" (other, biggest: {top})" if top else ""))


# -- statistics ------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p99 of 10 samples is the maximum)."""
    v = sorted(values)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, max(0, -(-int(p * 1000) * len(v) // 100_000) - 1))]


def lat_line(name: str, ms: list[float], extra: str = "") -> str:
    return (f"{name:28s} n={len(ms):6d}  p50 {pct(ms, 50):7.2f}  p90 {pct(ms, 90):7.2f}  "
            f"p99 {pct(ms, 99):7.2f}  max {max(ms, default=float('nan')):7.2f} ms"
            + (f"  {extra}" if extra else ""))


# -- the cluster -----------------------------------------------------------------------


def cluster_toml(zk: EnsembleChroot, session_s: float) -> str:
    return ("[relay.cluster]\n" f'zookeeper = "{zk.hosts}"\n' 'name = "bench"\n'
            'mode = "leader-follower"\n' f"session_timeout_s = {session_s}\n")


def buffer_status(relay: RelayProcess) -> dict[str, Any]:
    doc: dict[str, Any] = relay.status()["buffers"]["src"]
    return doc


def alive(relay: RelayProcess) -> bool:
    return relay.proc is not None and relay.proc.poll() is None


def wait_for(check: Any, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"timed out: {what} (last: {last})")


def steady(relays: list[RelayProcess]) -> tuple[RelayProcess, list[RelayProcess]]:
    """One leader, the others following it with their fetcher running and within a
    few windows of it: returns (leader, followers)."""
    def check() -> tuple[RelayProcess, list[RelayProcess]] | None:
        docs = {r.port: buffer_status(r) for r in relays}
        leaders = [r for r in relays if docs[r.port]["cluster"]["role"] == "leader"]
        if len(leaders) != 1:
            return None
        leader = leaders[0]
        top = docs[leader.port]["max_scn"] or 0
        followers = [r for r in relays if r is not leader]
        for r in followers:
            doc = docs[r.port]
            if (doc["cluster"]["role"] != "follower" or doc["cluster"]["leader"] != leader.url
                    or doc["fetcher"]["state"] != "running"
                    or (doc["max_scn"] or 0) < top - 20):
                return None
        return leader, followers
    found: tuple[RelayProcess, list[RelayProcess]] = wait_for(check, "a steady cluster", 90)
    return found


def zk_expiries(ensemble: ZooKeeperEnsemble, after: float) -> list[float]:
    """Wall times of the ensemble's "Expiring session" log lines after ``after``."""
    times = []
    for path in ensemble.log_paths:
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            for line in f:
                if "Expiring session" in line:
                    t = log_time(line)
                    if t is not None and t >= after:
                        times.append(t)
    return sorted(times)


def elected_at(relay: RelayProcess, epoch: int) -> float | None:
    pattern = f"leader, epoch {epoch}, "
    with contextlib.suppress(OSError), open(relay.log_path, errors="replace") as f:
        for line in f:
            if pattern in line:
                return log_time(line)
    return None


def log_problems(relays: list[RelayProcess]) -> list[str]:
    """Distinct relay log lines at WARNING or above (timestamps and numbers folded)."""
    seen: collections.Counter[str] = collections.Counter()
    for relay in relays:
        with contextlib.suppress(OSError), open(relay.log_path, errors="replace") as f:
            for line in f:
                if " WARNING " in line or " ERROR " in line or " CRITICAL " in line \
                        or line.startswith("Traceback"):
                    text = _LOG_TIME.sub("", line.strip())
                    seen[re.sub(r"\d+", "N", text)[:200]] += 1
    return [f"{n:4d} x {text}" for text, n in seen.most_common()]


@dataclass
class Failover:
    total: float  # kill -> first window of the new leader, at its subscription
    expired: float | None
    elected: float | None
    role_seen: float
    new_to_cluster: float | None
    other_follower: float | None
    epoch: int
    windows_reread: int  # windows the new leader read again (the old leader had them)


@dataclass
class Run:
    session_s: float
    failovers: list[Failover] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Cluster:
    def __init__(self, base: Path, ensemble: ZooKeeperEnsemble, session_s: float,
                 rate: float) -> None:
        self.base = base
        self.ensemble = ensemble
        self.chroot = EnsembleChroot(ensemble)
        self.chroot.create()
        base.mkdir(parents=True)
        self.db = base / "shop.db"
        uri = make_source(self.db)
        self.writer = Writer(self.db, rate)
        self.relays = []
        self.relay_pids: set[int] = set()
        for i in range(3):
            home = base / f"relay{i}"
            home.mkdir()
            self.relays.append(RelayProcess(home, {"src": uri}, workers=1,
                                            extra_toml=cluster_toml(self.chroot, session_s)))
        for relay in self.relays:
            relay.start()

    def pids(self) -> dict[str, list[int]]:
        """This run's processes by group; relays killed since a call stay listed."""
        for r in self.relays:
            if alive(r):
                assert r.proc is not None
                self.relay_pids.update([r.proc.pid, *descendants(r.proc.pid)])
        relays = sorted(self.relay_pids)
        zk = [p for i in range(self.ensemble.size) if (p := self.ensemble.pid(i)) is not None]
        return {"relays": relays, "zookeeper": zk, "writer": [self.writer.proc.pid]}

    def close(self) -> tuple[int, float, float, int]:
        for relay in self.relays:
            if alive(relay):
                relay.kill()
        result = self.writer.stop()
        with contextlib.suppress(Exception):
            self.chroot.close()
        return result


def chained_latency(cluster: Cluster, watcher: Watcher, args: argparse.Namespace) -> None:
    leader, followers = steady(cluster.relays)
    follower = followers[0]
    for relay in cluster.relays:
        watcher.unwatch(relay.url)
    watcher.windows.clear()
    watcher.watch(leader.url)
    watcher.watch(follower.url)
    print(f"\n## chained latency: leader {leader.url}, follower {follower.url} (chaining "
          f"from it), {args.rate:g} single-row transactions/s, {args.latency_seconds:g} s "
          f"(first {args.warmup:g} s left out); {loadavg()}", flush=True)
    meter = Meter()
    start = now_us() + int(args.warmup * 1e6)
    time.sleep(args.warmup + args.latency_seconds)
    end = now_us()
    cpu = meter.stop(cluster.pids())
    time.sleep(1.0)  # the last windows of the interval arrive
    committed = commit_times(cluster.db)
    wanted = {k for k, t in committed.items() if start <= t <= end}
    result: dict[str, list[float]] = {}
    for name, relay in (("leader (direct)", leader), ("follower (chained)", follower)):
        ms: list[float] = []
        seen: set[int] = set()
        for arrival in list(watcher.windows[relay.url]):
            keys = [k for k in arrival.keys if k in wanted]
            if keys:
                seen.update(keys)
                ms.append((arrival.at_us - max(committed[k] for k in keys)) / 1000)
        result[name] = ms
        print(lat_line(name, ms, f"windows missing {len(wanted - seen)}"))
    lead, fol = result["leader (direct)"], result["follower (chained)"]
    print(f"  {cpu}")
    print(f"ratio follower/leader: p50 {pct(fol, 50) / pct(lead, 50):.2f}, p99 "
          f"{pct(fol, 99) / pct(lead, 99):.2f}; added by the chained relay: p50 "
          f"{pct(fol, 50) - pct(lead, 50):+.2f} ms, p99 {pct(fol, 99) - pct(lead, 99):+.2f} ms",
          flush=True)


def one_failover(cluster: Cluster, watcher: Watcher, run: Run, n: int, meter: Meter,
                 args: argparse.Namespace) -> None:
    leader, followers = steady(cluster.relays)
    old_epoch = buffer_status(leader)["cluster"]["epoch"]
    time.sleep(random.uniform(0.5, 1.0))
    before = watcher.max_scn([r.url for r in cluster.relays])
    cluster.pids()
    meter.sample()
    assert leader.proc is not None
    t_kill = time.time()
    os.kill(leader.proc.pid, signal.SIGKILL)
    kill_us = int(t_kill * 1e6)
    timeout = time.monotonic() + max(30.0, run.session_s * 10)
    new: RelayProcess | None = None
    role_seen = 0.0
    start_scn = epoch = 0
    while time.monotonic() < timeout:
        for r in followers:
            with contextlib.suppress(OSError):
                doc = buffer_status(r)
                if doc["cluster"]["role"] == "leader":
                    role_seen = time.time() - t_kill
                    new, epoch = r, doc["cluster"]["epoch"]
                    last = doc["cluster"]["epochs"][-1]
                    assert last[0] == epoch, doc["cluster"]["epochs"]
                    start_scn = last[1] if last[1] is not None else -1
                    break
        if new is not None:
            break
        time.sleep(args.poll_ms / 1000)
    if new is None:
        raise TimeoutError(f"kill {n}: no follower became leader")
    first = wait_for(lambda: watcher.first_after(new.url, start_scn, kill_us),
                     "the new leader's first window at its subscription", 30)
    other = next(r for r in followers if r is not new)
    other_first = None
    with contextlib.suppress(TimeoutError):
        other_first = wait_for(lambda: watcher.first_after(other.url, start_scn, kill_us),
                               "the other follower's first window of the new epoch", 30)
    # Windows up to the new leader's start were chained from the old leader, which had
    # served them: "new to the cluster" is after both that and what was seen before.
    fresh = wait_for(lambda: watcher.first_after(new.url, max(before, start_scn), kill_us),
                     "a window new to the cluster", 30)
    leader.proc.wait(20)
    expiries = zk_expiries(cluster.ensemble, t_kill - 0.05)
    elected = elected_at(new, epoch)
    f = Failover(
        total=first.at_us / 1e6 - t_kill,
        expired=expiries[0] - t_kill if expiries else None,
        elected=elected - t_kill if elected is not None else None,
        role_seen=role_seen,
        new_to_cluster=fresh.at_us / 1e6 - t_kill,
        other_follower=other_first.at_us / 1e6 - t_kill if other_first else None,
        epoch=epoch,
        windows_reread=max(0, before - start_scn),
    )
    if epoch != old_epoch + 1:
        run.notes.append(f"kill {n}: epoch {old_epoch} -> {epoch}")
    run.failovers.append(f)

    def s(v: float | None) -> str:
        return f"{v:6.3f}" if v is not None else "   n/a"
    print(f"kill {n:2d}: epoch {old_epoch}->{epoch}  expired {s(f.expired)}  elected "
          f"{s(f.elected)}  role seen {s(f.role_seen)}  first window {s(f.total)} s "
          f"({f.total / run.session_s:.2f} x timeout)  new to cluster {s(f.new_to_cluster)}"
          f"  other follower {s(f.other_follower)}  (the new leader started after SCN "
          f"{start_scn}; the subscriptions had seen up to {before})", flush=True)
    # Back, as a follower of the new leader.
    leader.start()
    watcher.watch(leader.url)


def failover_run(cluster: Cluster, watcher: Watcher, run: Run,
                 args: argparse.Namespace) -> None:
    print(f"\n## failover, session timeout {run.session_s:g} s, {args.kills} kills of the "
          f"leader; {loadavg()}", flush=True)
    for relay in cluster.relays:
        watcher.watch(relay.url)
    meter = Meter()
    for n in range(1, args.kills + 1):
        one_failover(cluster, watcher, run, n, meter, args)
    steady(cluster.relays)
    print(f"  {meter.stop(cluster.pids())}")
    summarize(run)


def summarize(run: Run) -> None:
    fs = run.failovers
    tot = [f.total for f in fs]
    t = run.session_s
    print(f"failover (kill -> first window of the new leader), {len(fs)} kills, timeout "
          f"{t:g} s: p50 {pct(tot, 50):.3f} s ({pct(tot, 50) / t:.2f} x), p99 "
          f"{pct(tot, 99):.3f} s ({pct(tot, 99) / t:.2f} x){' = max' if len(fs) <= 100 else ''}"
          f", min {min(tot):.3f} s")

    def med(values: list[float | None]) -> str:
        v = [x for x in values if x is not None]
        return f"{pct(v, 50):.3f}" if v else "n/a"
    print(f"  medians (s after the kill): expired {med([f.expired for f in fs])}, elected "
          f"{med([f.elected for f in fs])}, role seen {med([f.role_seen for f in fs])}, "
          f"first window {med(tot)}, new to the cluster "
          f"{med([f.new_to_cluster for f in fs])}, other follower "
          f"{med([f.other_follower for f in fs])}")
    steps = [(f.elected - f.expired, f.total - f.elected) for f in fs
             if f.expired is not None and f.elected is not None]
    if steps:
        print(f"  medians of the steps: expiry -> elected {pct([a for a, _ in steps], 50):.3f}"
              f" s, elected -> first window {pct([b for _, b in steps], 50):.3f} s")
    for note in run.notes:
        print(f"  note: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--session-timeout", type=float, default=2.0,
                        help="session_timeout_s of the relays (seconds)")
    parser.add_argument("--also-timeouts", default="4",
                        help="further session timeouts measured in the same run, comma "
                             "separated ('' for none)")
    parser.add_argument("--kills", type=int, default=10, help="leader kills per timeout")
    parser.add_argument("--rate", type=float, default=200.0,
                        help="single-row transactions per second of the writer")
    parser.add_argument("--latency-seconds", type=float, default=15.0,
                        help="seconds of the chained latency phase (0: skip it)")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds left out at the start of the latency phase")
    parser.add_argument("--poll-ms", type=float, default=10.0,
                        help="interval of the /v1/status polls during a failover")
    parser.add_argument("--quick", action="store_true",
                        help="3 kills, one timeout, a 5 s latency phase")
    args = parser.parse_args()
    if args.quick:
        for name, value in (("kills", 3), ("latency_seconds", 5.0), ("also_timeouts", ""),
                            ("warmup", 1.0)):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    timeouts = [args.session_timeout] + [float(x) for x in args.also_timeouts.split(",")
                                         if x.strip()]

    print(f"# relay cluster failover: {platform.python_version()}, {os.cpu_count()} cores, "
          f"session timeouts {', '.join(f'{t:g}' for t in timeouts)} s, {args.kills} kills "
          f"each, writer {args.rate:g} tx/s; {loadavg()}; "
          f"{code_version(('relay', 'databus', 'fetchers', 'client'))}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="databus-clusterbench-"))
    ensemble = launch()
    runs: list[Run] = []
    all_relays: list[RelayProcess] = []
    watcher = Watcher()
    try:
        print(f"ZooKeeper ensemble {ensemble.hosts} (tick {ensemble.tick_time_ms} ms); "
              f"work dir {base}", flush=True)
        for i, session_s in enumerate(timeouts):
            cluster = Cluster(base / f"run{i}", ensemble, session_s, args.rate)
            all_relays += cluster.relays
            run = Run(session_s)
            try:
                if i == 0 and args.latency_seconds > 0:
                    chained_latency(cluster, watcher, args)
                failover_run(cluster, watcher, run, args)
            finally:
                for relay in cluster.relays:
                    watcher.unwatch(relay.url)
                n, seconds, _, late = cluster.close()
                print(f"  writer: {n:,} transactions in {seconds:.1f} s "
                      f"({n / seconds:,.0f}/s), {late} later than 10 ms past their slot")
            runs.append(run)
        print("\n## summary")
        for run in runs:
            summarize(run)
        # A stream cut by the kill of its relay ends with an incomplete chunked body.
        kinds = collections.Counter(e.split(": ")[1] for e in watcher.errors)
        print(f"subscription errors other than 'connection refused': {len(watcher.errors)} "
              f"({', '.join(f'{n} {k}' for k, n in kinds.items()) or 'none'}; a stream cut "
              f"by a kill of its relay is a ClientPayloadError)")
        problems = log_problems(all_relays)
        print(f"relay log lines at WARNING or above: {len(problems)} distinct")
        for line in problems[:20]:
            print(f"  {line}")
        print(f"end: {loadavg()}")
    finally:
        watcher.close()
        for relay in all_relays:
            if alive(relay):
                relay.kill()
        shutdown(ensemble)
        if os.environ.get("DATABUS_KEEP_SERVER_DIRS", "") in ("", "0"):
            subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    main()
