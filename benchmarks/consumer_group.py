"""Consumer groups (issue 17): rebalance time after a member's SIGKILL, and group
throughput with 1, 2 and 4 members, on real processes, in one run.

    .venv/bin/python benchmarks/consumer_group.py [--quick] [--session-timeout 4]
        [--also-timeouts 8] [--kills 5] [--events 120000] [--rounds 3]

Setup: a throwaway 3-node ZooKeeper ensemble (the test fixtures'
``tests.fixtures._zookeeper_ensemble.launch()``: three JVMs, 200 ms tick, started once
for the whole run, a fresh chroot per phase), ``databus relay --config`` child
processes (one worker) on the synthetic source (``tests.integration.group_support``'s
``start_relay`` and ``synthetic_uri``: every event numbered by ``seq``), and group
members as processes of their own (``python -m tests.integration.group_member``, the
tests' ``MemberProcess``: ``DatabusClient(group=..., partitions=P)`` whose consumer
spins ``--work-us`` per event and appends ``E <scn> <key> <seq> <partition>`` per
applied event to its log, flushed at each window end, and ``A``/``V`` lines for the
partitions assigned/revoked). The benchmark adds nothing to the member: it tails the
members' log files (every ``--poll-ms``, 10 ms) and stamps what it reads with its own
wall clock, and watches the group's znodes with a kazoo client of its own.

1. ``rebalance`` (per session timeout): a group of 3 members, P = 64, a relay producing
   a steady stream (``--rate`` events/s, 5 per window, unbounded). ``--kills`` times:
   the group steady (the assignment names the 3 live members, balanced, each member's
   log shows it holds exactly what it is assigned and applied events in the last
   second, generation unchanged for a second), 0.5-1.0 s (random) later the relay's
   max SCN is read and a member (round robin over the three seats) is SIGKILLed. Then
   the survivors' logs are polled. **Rebalance time** = the first ``E`` line, in a
   survivor's log, of one of the victim's partitions with an SCN above the relay's
   max SCN at the kill (an event produced after the kill, now applied by its new
   owner) - the kill; as a ratio of the session timeout. Breakdown, all after the
   kill: ``expired`` (the ensemble's "Expiring session" log line), ``member gone``
   (the victim's member znode deleted, seen by a children watch), ``generation`` (the
   assignment znode's generation changed, seen by a data watch), ``assigned`` (an
   ``A`` line with victim partitions in a survivor's log), ``resumed`` (the first
   ``E`` of a victim partition in a survivor's log, whatever its SCN: the new owner
   re-reading from the partition's checkpoint), ``all`` (every victim partition has
   an ``E`` above the kill SCN). Odd kills take the group's leader (the holder of the
   leader lock: its lock moves too), even kills another member; p50 and max are also
   given per kind. A fresh member (a new name) is started in the victim's seat after
   each kill, so the group is back to 3.
2. ``throughput``: a relay whose synthetic source has a fixed ``limit`` (``--events``,
   rate 0: as fast as it can, 10,000 keys), produced completely (its
   ``/v1/status`` max SCN at the limit) before any member starts. Then M members (a
   new group each time, so no checkpoints: they start at the beginning) are started
   at once and timed until the union of their logs holds every ``seq`` 0..N-1.
   ``--rounds`` times M = 1, 2, 4. Figures per M: events/s over the whole
   (process start -> complete, including the interpreter's start, ZooKeeper, joins
   and rebalances), over the middle (10 % -> 90 % of the seqs applied) and after the
   group formed (from the first assignment naming all M members, seen by a data watch
   on the assignment znode, to the end: the events not yet applied then / the time);
   ratios 2-member/1-member and 4-member/1-member, in the same round. Two series, one
   relay each (``--tput-per-window``): 5 events per window (the main figure) and 50.
   A member is sent every window that has an event of one of its partitions (a
   5-event window touches about 5 of the 64) and pays the per-window work for each
   (the dispatcher's window calls, the test member's log flush at each window end):
   that does not shrink as members are added; with 50 events per window it weighs 10
   times less. Checkpoints are not per window: the client's checkpoint writer thread
   persists the newest committed one (all the member's partitions in one ZooKeeper
   transaction) whenever the previous write is done. Also printed: the windows each
   member applied (distinct SCNs in its log) and the ensemble's write transactions
   during the run (the leader's zxid before and after, ``srvr``). The machine has
   ``os.cpu_count()`` cores: M members cannot go faster than that many times one
   (and share them with the relay and ZooKeeper).

Machine: load average before and after (``os.getloadavg()``), the number of CPUs,
and per phase the cores used by the members, the relay, ZooKeeper, this process and
everything else ("other": other jobs on this shared machine). Member stderr lines at
WARNING or above are counted; each phase ends with the tests' invariants checked on
every log (per-key SCN order within a member, events only of partitions it held).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the scripts run as benchmarks/x.py: make ``tests`` importable
    sys.path.insert(0, str(ROOT))

from _relay_proc import code_version, descendants  # noqa: E402
from cluster_failover import Meter, pct, zk_expiries  # noqa: E402

from databus.client.group import group_root  # noqa: E402
from tests.fixtures._procs import shutdown  # noqa: E402
from tests.fixtures._zookeeper_ensemble import (  # noqa: E402
    EnsembleChroot,
    ZooKeeperEnsemble,
    launch,
)
from tests.integration.group_support import (  # noqa: E402
    GROUP,
    MemberLog,
    MemberProcess,
    check_member_order,
    check_partitions_owned,
    read_assignment,
    start_relay,
    synthetic_uri,
)
from tests.relay_harness import RelayProcess  # noqa: E402

P = 64
MEMBERS = 3
BUFFER = "syn"  # start_relay's buffer name


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def max_scn(relay: RelayProcess) -> int:
    return int(relay.status()["buffers"][BUFFER]["max_scn"] or 0)


def wait_for(check: Any, what: str, timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(every)
    raise TimeoutError(f"timed out: {what} (last: {last})")


# -- tailing a member's log ------------------------------------------------------------


class Tail:
    """A member's ``--out`` file read incrementally: what it holds (A adds, V removes),
    when it last applied an event (as seen by this process) and how many."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.held: set[int] = set()
        self.events = 0
        self.last_event_at = 0.0

    def poll(self) -> list[tuple[str, tuple[int, ...]]]:
        """The complete lines written since the last poll, parsed (torn lines skipped)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        buf = self.rest + data
        cut = buf.rfind(b"\n") + 1
        self.rest = buf[cut:]
        out: list[tuple[str, tuple[int, ...]]] = []
        for raw in buf[:cut].split(b"\n"):
            parts = raw.split()
            if not parts:
                continue
            try:
                kind = parts[0].decode()
                if kind == "E" and len(parts) == 5:
                    out.append(("E", tuple(int(x) for x in parts[1:])))
                elif kind in ("A", "V") and len(parts) == 2:
                    out.append((kind, tuple(int(x) for x in parts[1].split(b","))))
            except ValueError:
                continue
        now = time.time()
        for kind, payload in out:
            if kind == "A":
                self.held |= set(payload)
            elif kind == "V":
                self.held -= set(payload)
            else:
                self.events += 1
                self.last_event_at = now
        return out


_SEQ = re.compile(rb"^E (\d+) -?\d+ (\d+) \d+$", re.MULTILINE)


class SeqTail:
    """The throughput phase's cheaper reader: only the ``seq`` of each complete ``E``
    line (one regex over what was appended, no per-line parsing in Python), and the
    distinct SCNs (windows) seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.scns: set[bytes] = set()

    def poll(self) -> list[int]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        buf = self.rest + data
        cut = buf.rfind(b"\n") + 1
        self.rest = buf[cut:]
        found = _SEQ.findall(buf, 0, cut)
        self.scns.update(scn for scn, _ in found)
        return [int(seq) for _, seq in found]


@dataclass
class Seat:
    member: MemberProcess
    tail: Tail


# -- watching the group's znodes -------------------------------------------------------


class GroupWatch:
    """A kazoo client of this process on the chroot, with a data watch on the group's
    assignment (every generation and the wall time it was seen) and a children watch
    on its member nodes (every change, timed)."""

    def __init__(self, chroot: EnsembleChroot, group: str, members: bool = True) -> None:
        from kazoo.recipe.watchers import ChildrenWatch, DataWatch

        self.client = chroot.client()
        self.root = group_root(group)
        self.lock = threading.Lock()
        self.generations: list[tuple[float, int, dict[str, list[int]]]] = []
        self.children: list[tuple[float, frozenset[str]]] = []

        def on_assignment(data: bytes | None, _stat: Any, _event: Any = None) -> None:
            if data:
                import json

                doc = json.loads(data)
                with self.lock:
                    self.generations.append((time.time(), int(doc["generation"]),
                                             doc.get("owners", {})))

        def on_members(children: list[str]) -> None:
            with self.lock:
                self.children.append((time.time(), frozenset(children)))

        DataWatch(self.client, f"{self.root}/assignment", on_assignment)
        if members:
            self.client.ensure_path(f"{self.root}/members")
            ChildrenWatch(self.client, f"{self.root}/members", on_members)

    def current(self) -> tuple[float, int, dict[str, list[int]]]:
        with self.lock:
            return self.generations[-1] if self.generations else (0.0, 0, {})

    def formed(self, size: int) -> tuple[float, int] | None:
        """(when, generation) of the first assignment naming ``size`` members."""
        with self.lock:
            return next(((t, g) for t, g, owners in self.generations if len(owners) >= size),
                        None)

    def generation_after(self, gen: int) -> float | None:
        with self.lock:
            return next((t for t, g, _ in self.generations if g > gen), None)

    def member_nodes(self) -> dict[str, str]:
        """Member id -> its member node's name (read now)."""
        import json

        out = {}
        for node in self.client.get_children(f"{self.root}/members"):
            with contextlib.suppress(Exception):
                data, _ = self.client.get(f"{self.root}/members/{node}")
                out[json.loads(data)["member"]] = node
        return out

    def gone_after(self, node: str, since: float) -> float | None:
        with self.lock:
            return next((t for t, names in self.children if t >= since and node not in names),
                        None)

    def leader(self) -> str | None:
        """The member id in the first leader-lock contender's node (None if unreadable)."""
        with contextlib.suppress(Exception):
            lock = f"{self.root}/leader"
            nodes = sorted(self.client.get_children(lock), key=lambda n: n[-10:])
            if nodes:
                data, _ = self.client.get(f"{lock}/{nodes[0]}")
                text = data.decode(errors="replace")
                with contextlib.suppress(Exception):
                    import json

                    doc = json.loads(text)
                    if isinstance(doc, dict):
                        return str(doc.get("member") or doc.get("id") or text)
                return text
        return None


# -- CPU -------------------------------------------------------------------------------


_ZXID = re.compile(r"^Zxid: 0x([0-9a-f]+)", re.MULTILINE)


def zxid(ensemble: ZooKeeperEnsemble) -> int | None:
    """The ensemble's last zxid (one per write transaction), from its leader's srvr."""
    with contextlib.suppress(Exception):
        leader = ensemble.leader()
        if leader is not None:
            match = _ZXID.search(ensemble.four_letter_word(leader, "srvr"))
            if match:
                return int(match.group(1), 16)
    return None


def tree_state(paths: tuple[str, ...]) -> str:
    """The content of ``paths`` in the working tree (a tree hash, uncommitted edits
    included), to tell whether the code measured changed during the run."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-m", "-o",
                                "--exclude-standard", "--", *paths], capture_output=True,
                               text=True, check=True).stdout.split()
        tree = subprocess.run(["git", "-C", str(ROOT), "rev-parse", f"HEAD:{paths[0]}",
                               *[f"HEAD:{p}" for p in paths[1:]]], capture_output=True,
                              text=True, check=False).stdout.split()
        stamps = [f"{f}:{os.stat(ROOT / f).st_mtime_ns}" for f in sorted(files)
                  if (ROOT / f).exists()]
        return " ".join(tree + stamps)
    return "unknown"


def pids_of(relay: RelayProcess, ensemble: ZooKeeperEnsemble,
            members: list[MemberProcess], seen: set[int]) -> dict[str, list[int]]:
    """This run's processes by group; members killed since a call stay listed."""
    for m in members:
        if m.proc is not None and m.proc.poll() is None:
            seen.update([m.proc.pid, *descendants(m.proc.pid)])
    relay_pids = []
    if relay.proc is not None and relay.proc.poll() is None:
        relay_pids = [relay.proc.pid, *descendants(relay.proc.pid)]
    zk = [p for i in range(ensemble.size) if (p := ensemble.pid(i)) is not None]
    return {"members": sorted(seen), "relay": relay_pids, "zookeeper": zk}


_LEVEL = re.compile(r" (WARNING|ERROR|CRITICAL) ")


def stderr_problems(members: list[MemberProcess]) -> list[str]:
    """Distinct member stderr lines at WARNING or above (times and numbers folded)."""
    seen: collections.Counter[str] = collections.Counter()
    for m in members:
        with contextlib.suppress(OSError), open(m.err, errors="replace") as f:
            for line in f:
                if _LEVEL.search(line) or line.startswith("Traceback"):
                    text = re.sub(r"^\S+ \S+ ", "", line.strip())
                    seen[re.sub(r"\d+", "N", text)[:160]] += 1
    return [f"{n:5d} x {text}" for text, n in seen.most_common()]


def check_logs(members: list[MemberProcess]) -> str:
    """The tests' invariants on every member's log; returns a one-line verdict."""
    bad = []
    for m in members:
        log = MemberLog.read(m.out)
        for check in (check_member_order, check_partitions_owned):
            try:
                check(log)
            except AssertionError as exc:
                bad.append(f"{m.name}: {check.__name__}: {exc}")
    return "invariants hold on every log" if not bad else "INVARIANTS BROKEN: " + "; ".join(bad)


# -- 1. rebalance ----------------------------------------------------------------------


@dataclass
class Kill:
    victim: str
    was_leader: bool
    partitions: int
    total: float | None  # kill -> first E of a victim partition above the kill SCN
    expired: float | None
    gone: float | None
    generation: float | None
    assigned: float | None
    resumed: float | None
    all_new: float | None


@dataclass
class RebalanceRun:
    session_s: float
    kills: list[Kill] = field(default_factory=list)
    joins: list[float] = field(default_factory=list)  # a fresh member: start -> steady
    notes: list[str] = field(default_factory=list)


class Group:
    def __init__(self, base: Path, ensemble: ZooKeeperEnsemble, relay: RelayProcess,
                 session_s: float, work_us: float) -> None:
        self.base = base
        self.ensemble = ensemble
        self.relay = relay
        self.session_s = session_s
        self.work_us = work_us
        self.chroot = EnsembleChroot(ensemble)
        self.chroot.create()
        self.seats: list[Seat] = []
        self.all_members: list[MemberProcess] = []
        self.counter = 0
        self.watch: GroupWatch | None = None

    def new_member(self) -> Seat:
        self.counter += 1
        m = MemberProcess(self.base, f"m{self.counter}", self.relay.url, self.chroot.hosts,
                          P, session_timeout=self.session_s, work_us=self.work_us)
        m.start()
        self.all_members.append(m)
        return Seat(m, Tail(m.out))

    def poll(self) -> None:
        for seat in self.seats:
            seat.tail.poll()

    def steady(self, timeout: float = 90.0) -> dict[str, list[int]]:
        """Wait until the group is steady (see the module doc); returns the owners."""
        deadline = time.monotonic() + timeout
        state = "no assignment"
        while time.monotonic() < deadline:
            self.poll()
            for seat in self.seats:
                proc = seat.member.proc
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"member {seat.member.name} exited {proc.returncode}: "
                                       f"{seat.member.err.read_text()[-2000:]}")
            if self.watch is None:
                if read_assignment(self.chroot.hosts):
                    self.watch = GroupWatch(self.chroot, GROUP)
                time.sleep(0.05)
                continue
            seen_at, _gen, owners = self.watch.current()
            names = {s.member.name for s in self.seats}
            sizes = [len(v) for v in owners.values()]
            now = time.time()
            if set(owners) != names:
                state = f"owners {sorted(owners)} != members {sorted(names)}"
            elif max(sizes) - min(sizes) > 1:
                state = f"unbalanced {sizes}"
            elif any(s.tail.held != set(owners[s.member.name]) for s in self.seats):
                state = "a member does not hold what it is assigned"
            elif any(now - s.tail.last_event_at > 1.0 for s in self.seats):
                state = "a member applied nothing in the last second"
            elif now - seen_at < 1.0:
                state = "generation younger than 1 s"
            else:
                return owners
            time.sleep(0.05)
        raise TimeoutError(f"group never steady: {state}")

    def close(self) -> None:
        for m in self.all_members:
            m.stop()
        if self.watch is not None:
            self.watch.client.stop()
        with contextlib.suppress(Exception):
            self.chroot.close()


def one_kill(group: Group, run: RebalanceRun, n: int, args: argparse.Namespace,
             meter: Meter) -> None:
    owners = group.steady()
    assert group.watch is not None
    time.sleep(random.uniform(0.5, 1.0))
    # Odd kills take the group's leader (the leader lock moves too), even kills one of
    # the others (in turn).
    leader = group.watch.leader()
    others = [i for i, s in enumerate(group.seats) if s.member.name != leader]
    if n % 2 == 1 and len(others) < MEMBERS:
        seat_index = next(i for i in range(MEMBERS) if i not in others)
    else:
        seat_index = others[(n // 2) % len(others)]
    victim_seat = group.seats[seat_index]
    victim = victim_seat.member
    survivors = [s for i, s in enumerate(group.seats) if i != seat_index]
    group.poll()
    victim_parts = set(owners[victim.name])
    if victim_seat.tail.held != victim_parts:
        run.notes.append(f"kill {n}: {victim.name} held {sorted(victim_seat.tail.held)}, "
                         f"assigned {sorted(victim_parts)}")
    node = group.watch.member_nodes().get(victim.name)
    was_leader = leader == victim.name
    gen_at_kill = group.watch.current()[1]
    meter.sample()
    kill_scn = max_scn(group.relay)
    t_kill = time.time()
    assert victim.proc is not None
    victim.proc.send_signal(signal.SIGKILL)
    # Lines the survivors wrote before the kill (none of the victim's partitions: they
    # held exactly their own) are read now, so that what follows is after the kill.
    for s in survivors:
        s.tail.poll()
    assigned = resumed = new = all_new = None
    waiting = set(victim_parts)
    deadline = time.monotonic() + max(60.0, 10 * run.session_s)
    while time.monotonic() < deadline and all_new is None:
        time.sleep(args.poll_ms / 1000)
        for s in survivors:
            lines = s.tail.poll()
            now = time.time()
            for kind, payload in lines:
                if kind == "A" and assigned is None and victim_parts & set(payload):
                    assigned = now
                elif kind == "E" and payload[3] in victim_parts:
                    if resumed is None:
                        resumed = now
                    if payload[0] > kill_scn:
                        if new is None:
                            new = now
                        waiting.discard(payload[3])
                        if not waiting:
                            all_new = now
    victim.proc.wait(10)
    expiries = zk_expiries(group.ensemble, t_kill - 0.05)
    gen_at = group.watch.generation_after(gen_at_kill)
    gone_at = group.watch.gone_after(node, t_kill) if node else None

    def rel(t: float | None) -> float | None:
        return t - t_kill if t is not None else None
    k = Kill(victim.name, was_leader, len(victim_parts), rel(new),
             rel(expiries[0]) if expiries else None, rel(gone_at), rel(gen_at), rel(assigned),
             rel(resumed), rel(all_new))
    run.kills.append(k)
    if new is None:
        run.notes.append(f"kill {n}: no event of the victim's partitions above SCN {kill_scn} "
                         f"in the survivors' logs within the deadline")

    def s(v: float | None) -> str:
        return f"{v:6.3f}" if v is not None else "   n/a"
    print(f"kill {n:2d}: {victim.name}{' (leader)' if was_leader else ''}, "
          f"{len(victim_parts)} partitions, SCN {kill_scn}: expired {s(k.expired)}  member "
          f"gone {s(k.gone)}  generation {s(k.generation)}  assigned {s(k.assigned)}  "
          f"resumed {s(k.resumed)}  new events {s(k.total)} s"
          + (f" ({k.total / run.session_s:.2f} x timeout)" if k.total is not None else "")
          + f"  all partitions {s(k.all_new)}", flush=True)
    # A fresh member in the victim's seat: the group is back to three.
    t_start = time.time()
    group.seats[seat_index] = group.new_member()
    group.steady()
    run.joins.append(time.time() - t_start)


def rebalance_run(base: Path, ensemble: ZooKeeperEnsemble, session_s: float,
                  args: argparse.Namespace) -> RebalanceRun:
    run = RebalanceRun(session_s)
    print(f"\n## rebalance, session timeout {session_s:g} s: {MEMBERS} members, P = {P}, "
          f"relay at {args.rate:g} events/s ({args.per_window} per window), work "
          f"{args.rebalance_work_us:g} us/event, {args.kills} kills; {load()}", flush=True)
    base.mkdir(parents=True)
    relay = start_relay(base / "relay", synthetic_uri(
        10**9, rate=args.rate, events_per_window=args.per_window), capacity_mb=256)
    group = Group(base, ensemble, relay, session_s, args.rebalance_work_us)
    seen: set[int] = set()
    try:
        group.seats = [group.new_member() for _ in range(MEMBERS)]
        group.steady()
        meter = Meter()
        for n in range(1, args.kills + 1):
            one_kill(group, run, n, args, meter)
            pids_of(relay, ensemble, group.all_members, seen)
        print(f"  {meter.stop(pids_of(relay, ensemble, group.all_members, seen))}")
        time.sleep(0.5)
    finally:
        group.close()
        relay.kill(signal.SIGTERM)
    print(f"  {check_logs(group.all_members)}")
    problems = stderr_problems(group.all_members)
    print(f"  member stderr lines at WARNING or above: {sum(int(p.split()[0]) for p in problems)}"
          f" ({len(problems)} distinct)")
    for line in problems[:12]:
        print(f"    {line}")
    summarize_rebalance(run)
    return run


def med(values: list[float | None]) -> str:
    v = [x for x in values if x is not None]
    return f"{pct(v, 50):.3f}" if v else "n/a"


def summarize_rebalance(run: RebalanceRun) -> None:
    ks = run.kills
    tot = [k.total for k in ks if k.total is not None]
    t = run.session_s
    if tot:
        print(f"rebalance (kill -> first new event of a victim partition at a survivor), "
              f"{len(tot)} kills, session timeout {t:g} s: p50 {pct(tot, 50):.3f} s "
              f"({pct(tot, 50) / t:.2f} x), max {max(tot):.3f} s ({max(tot) / t:.2f} x), "
              f"min {min(tot):.3f} s ({min(tot) / t:.2f} x)")
    for kind, led in (("the leader", True), ("another member", False)):
        sub = [k.total for k in ks if k.total is not None and k.was_leader == led]
        if sub:
            print(f"  killed {kind}: {len(sub)} kills, p50 {pct(sub, 50) / t:.2f} x, max "
                  f"{max(sub) / t:.2f} x ({', '.join(f'{x:.3f}' for x in sub)} s)")
    print(f"  medians (s after the kill): expired {med([k.expired for k in ks])}, member "
          f"gone {med([k.gone for k in ks])}, generation {med([k.generation for k in ks])}, "
          f"assigned {med([k.assigned for k in ks])}, resumed {med([k.resumed for k in ks])},"
          f" new events {med([k.total for k in ks])}, all partitions "
          f"{med([k.all_new for k in ks])}")
    after = [k.total - k.generation for k in ks if k.total is not None and k.generation is not None]
    expiry = [k.generation - k.expired for k in ks
              if k.generation is not None and k.expired is not None]
    past = [k.total - k.expired for k in ks if k.total is not None and k.expired is not None]
    if past:
        print(f"  after the session expired (ZooKeeper's log line): expiry -> new events p50 "
              f"{pct(past, 50):.3f} s, max {max(past):.3f} s")
    if after:
        print(f"  after the session: expiry -> generation p50 {med(list(expiry))} s; "
              f"generation -> new events p50 {pct(after, 50):.3f} s, max {max(after):.3f} s")
    if run.joins:
        print(f"  a fresh member, start -> group steady again: p50 {pct(run.joins, 50):.2f} s")
    for note in run.notes:
        print(f"  note: {note}")


# -- 2. throughput ---------------------------------------------------------------------


@dataclass
class Throughput:
    per_window: int
    members: int
    round: int
    whole: float  # seconds, member start -> every seq applied
    first: float  # member start -> first event seen
    steady: float  # seconds between 10 % and 90 % of the seqs applied
    formed: float  # member start -> the first assignment naming all M members
    after_formed: float  # events/s from then to the end
    generations: int  # assignments written during the run
    zk_writes: int | None  # ZooKeeper write transactions during the run (zxid delta)
    windows: float  # windows with events applied, per member (mean)
    duplicates: int
    cpu: str


def throughput_one(base: Path, ensemble: ZooKeeperEnsemble, relay: RelayProcess,
                   per_window: int, total: int, m: int, rnd: int,
                   args: argparse.Namespace) -> Throughput:
    chroot = EnsembleChroot(ensemble)
    chroot.create()
    home = base / f"w{per_window}-r{rnd}-m{m}"
    home.mkdir(parents=True)
    group = f"tput{m}r{rnd}"
    seen = bytearray(total)
    count = applied = 0
    members = [MemberProcess(home, f"g{i + 1}", relay.url, chroot.hosts, P,
                             session_timeout=args.session_timeout, work_us=args.work_us,
                             group=group) for i in range(m)]
    tails = [SeqTail(x.out) for x in members]
    pids: set[int] = set()
    watch = GroupWatch(chroot, group, members=False)
    zxid0 = zxid(ensemble)
    meter = Meter()
    t0 = time.time()
    for x in members:
        x.start()
    first = t10 = t90 = done = formed = None
    count_formed = 0
    lo, hi = total // 10, total - total // 10
    deadline = time.monotonic() + args.timeout
    try:
        while done is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{m} members: {total - count} of {total} events never "
                                   f"applied in {args.timeout:g} s")
            time.sleep(args.tput_poll_ms / 1000)
            for x in members:
                if x.proc is not None and x.proc.poll() is not None:
                    raise RuntimeError(f"member {x.name} exited {x.proc.returncode}: "
                                       f"{x.err.read_text()[-2000:]}")
            for tail in tails:
                seqs = tail.poll()
                applied += len(seqs)
                for seq in seqs:
                    if 0 <= seq < total and not seen[seq]:
                        seen[seq] = 1
                        count += 1
            now = time.time()
            if first is None and count:
                first = now
            if t10 is None and count >= lo:
                t10 = now
            if t90 is None and count >= hi:
                t90 = now
            if formed is None and (f := watch.formed(m)) is not None:
                formed, count_formed = f[0], count
            if count == total:
                done = now
            pids_of(relay, ensemble, members, pids)
        cpu = meter.stop(pids_of(relay, ensemble, members, pids))
        zxid1 = zxid(ensemble)
    finally:
        for x in members:
            x.stop()
        with contextlib.suppress(Exception):
            chroot.close()
    generations = watch.current()[1]
    assert first is not None and t10 is not None and t90 is not None and formed is not None
    windows = sum(len(t.scns) for t in tails) / m
    writes = zxid1 - zxid0 if zxid0 is not None and zxid1 is not None else None
    result = Throughput(per_window, m, rnd, done - t0, first - t0, t90 - t10, formed - t0,
                        (total - count_formed) / (done - formed), generations, writes,
                        windows, applied - total, cpu)
    print(f"  round {rnd}, {m} member{'s' if m > 1 else ' '}: {total / result.whole:9,.0f} "
          f"events/s whole ({result.whole:.2f} s, first event after {result.first:.2f} s), "
          f"{0.8 * total / result.steady:9,.0f} events/s 10->90 % ({result.steady:.2f} s), "
          f"{result.after_formed:9,.0f} events/s after the group formed ({result.formed:.2f} s"
          f", {total - count_formed:,} events left, {generations} generations), "
          f"{windows:,.0f} windows per member, ZooKeeper writes "
          f"{writes if writes is not None else 'n/a'}, "
          f"{result.duplicates} applied twice; {check_logs(members)}", flush=True)
    print(f"    {cpu}", flush=True)
    problems = stderr_problems(members)
    for line in problems[:6]:
        print(f"    stderr: {line}")
    return result


def throughput_run(base: Path, ensemble: ZooKeeperEnsemble, per_window: int,
                   args: argparse.Namespace) -> list[Throughput]:
    windows = -(-args.events // per_window)
    total = windows * per_window
    print(f"\n## throughput: {total:,} events ({per_window} per window, 10,000 keys) "
          f"produced before the members start; P = {P}, work {args.work_us:g} us/event, "
          f"members {', '.join(map(str, args.members))}, {args.rounds} round(s); {load()}",
          flush=True)
    base.mkdir(parents=True)
    relay = start_relay(base / "relay", synthetic_uri(
        windows, rate=0, events_per_window=per_window, keys=10_000), capacity_mb=256)
    results = []
    try:
        t0 = time.time()
        wait_for(lambda: max_scn(relay) >= windows, f"the relay's max SCN at {windows}", 300)
        print(f"  relay produced {windows:,} windows in {time.time() - t0:.1f} s", flush=True)
        for rnd in range(1, args.rounds + 1):
            for m in args.members:
                results.append(throughput_one(base, ensemble, relay, per_window, total, m,
                                              rnd, args))
    finally:
        relay.kill(signal.SIGTERM)
    return results


def summarize_throughput(results: list[Throughput], args: argparse.Namespace) -> None:
    ncpu = os.cpu_count()
    total = -(-args.events // results[0].per_window) * results[0].per_window
    def median_of(m: int, what: str) -> str:
        v = [getattr(r, what) for r in results if r.members == m and getattr(r, what) is not None]
        return f"{pct(v, 50):,.0f}" if v else "n/a"
    print(f"\nthroughput, {total:,} events, {results[0].per_window} per window, work "
          f"{args.work_us:g} us/event; by member count, medians over rounds: windows "
          f"applied per member "
          + ", ".join(f"{m}: {median_of(m, 'windows')}" for m in args.members)
          + "; ZooKeeper writes (all members) "
          + ", ".join(f"{m}: {median_of(m, 'zk_writes')}" for m in args.members))
    print("\n| members | events/s whole | ratio | events/s 10->90 % | ratio | events/s after "
          "formed | ratio | ratios per round: whole / 10->90 % / after formed |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    by_round: dict[int, dict[int, Throughput]] = collections.defaultdict(dict)
    for r in results:
        by_round[r.round][r.members] = r
    base_m = min(args.members)
    for m in args.members:
        rs = [r for r in results if r.members == m]
        whole = [total / r.whole for r in rs]
        steady = [0.8 * total / r.steady for r in rs]
        ratios_w = [rd[base_m].whole / rd[m].whole
                    for rd in by_round.values() if m in rd and base_m in rd]
        ratios_s = [rd[base_m].steady / rd[m].steady
                    for rd in by_round.values() if m in rd and base_m in rd]
        formed = [r.after_formed for r in rs]
        ratios_f = [rd[m].after_formed / rd[base_m].after_formed
                    for rd in by_round.values() if m in rd and base_m in rd]

        def listed(xs: list[float]) -> str:
            return ", ".join(f"{x:.2f}" for x in xs)
        print(f"| {m} | {pct(whole, 50):,.0f} | {pct(ratios_w, 50):.2f} | "
              f"{pct(steady, 50):,.0f} | {pct(ratios_s, 50):.2f} | {pct(formed, 50):,.0f} | "
              f"{pct(ratios_f, 50):.2f} | {listed(ratios_w)} / {listed(ratios_s)} / "
              f"{listed(ratios_f)} |")
    print(f"(medians over the rounds; each ratio is to {base_m} member(s) of the same round; "
          f"this machine has {ncpu} CPUs: M members "
          f"cannot exceed {ncpu} x one member, and share the cores with the relay and "
          f"ZooKeeper)")


# -- main ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--session-timeout", type=float, default=4.0,
                        help="the members' ZooKeeper session timeout (seconds)")
    parser.add_argument("--also-timeouts", default="8",
                        help="further session timeouts for the rebalance phase, comma "
                             "separated ('' for none)")
    parser.add_argument("--kills", type=int, default=5, help="member kills per timeout")
    parser.add_argument("--rate", type=float, default=2000.0,
                        help="events per second of the relay in the rebalance phase")
    parser.add_argument("--per-window", type=int, default=5,
                        help="events per window of the rebalance phase")
    parser.add_argument("--tput-per-window", default="5,50",
                        help="events per window of the throughput phase, one relay and one "
                             "series each, comma separated (the first is the main figure)")
    parser.add_argument("--rebalance-work-us", type=float, default=50.0,
                        help="busy work per event of the members in the rebalance phase")
    parser.add_argument("--events", type=int, default=120_000,
                        help="events of the throughput phase")
    parser.add_argument("--work-us", type=float, default=50.0,
                        help="busy work per event of the members in the throughput phase")
    parser.add_argument("--members", default="1,2,4",
                        help="member counts of the throughput phase (the smallest is the "
                             "reference)")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a throughput run may take")
    parser.add_argument("--poll-ms", type=float, default=10.0,
                        help="interval of the member log polls")
    parser.add_argument("--tput-poll-ms", type=float, default=50.0,
                        help="interval of the member log polls in the throughput phase")
    parser.add_argument("--skip-rebalance", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 2 kills at one timeout, 15,000 events, one round")
    args = parser.parse_args()
    if args.quick:
        for name, value in (("kills", 2), ("also_timeouts", ""), ("events", 15_000),
                            ("rounds", 1)):
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    args.members = [int(x) for x in args.members.split(",")]
    args.tput_per_window = [int(x) for x in args.tput_per_window.split(",") if x.strip()]
    timeouts = [args.session_timeout] + [float(x) for x in args.also_timeouts.split(",")
                                         if x.strip()]
    load_before = os.getloadavg()
    code_paths = ("client", "databus", "relay", "fetchers")
    version_before = code_version(code_paths)
    tree_before = tree_state(code_paths)
    print(f"# consumer groups: {platform.python_version()}, {os.cpu_count()} CPUs, P = {P}, "
          f"session timeouts {', '.join(f'{t:g}' for t in timeouts)} s, {args.kills} kills "
          f"each, throughput {args.events:,} events x members {args.members}; {load()}; "
          f"{version_before}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="databus-groupbench-"))
    ensemble = launch()
    runs: list[RebalanceRun] = []
    results: list[list[Throughput]] = []
    try:
        print(f"ZooKeeper ensemble {ensemble.hosts} (tick {ensemble.tick_time_ms} ms); "
              f"work dir {base}", flush=True)
        if not args.skip_rebalance:
            for i, session_s in enumerate(timeouts):
                runs.append(rebalance_run(base / f"rebalance{i}", ensemble, session_s, args))
        if not args.skip_throughput:
            for w in args.tput_per_window:
                results.append(throughput_run(base / f"throughput{w}", ensemble, w, args))
        print("\n## summary")
        for run in runs:
            summarize_rebalance(run)
        for series in results:
            summarize_throughput(series, args)
        tree_after = tree_state(code_paths)
        if tree_after != tree_before:
            print(f"WARNING: the code measured changed during the run: {version_before} at "
                  f"the start, {code_version(code_paths)} at the end (members started "
                  f"after the change ran the new code)")
        else:
            print(f"code unchanged during the run ({version_before})")
        load_after = os.getloadavg()
        print(f"machine: {os.cpu_count()} CPUs; load average (1, 5, 15 min) before "
              f"{' '.join(f'{x:.2f}' for x in load_before)}, after "
              f"{' '.join(f'{x:.2f}' for x in load_after)}", flush=True)
    finally:
        shutdown(ensemble)
        if os.environ.get("DATABUS_KEEP_SERVER_DIRS", "") in ("", "0"):
            subprocess.run(["rm", "-rf", str(base)], check=False)


if __name__ == "__main__":
    main()
