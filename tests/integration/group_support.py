"""What the consumer-group tests and the group benchmark share: a relay on the synthetic
source, member processes (``tests.integration.group_member``) and the checks of what
they applied."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.relay_harness import RelayProcess
from tests.waiting import wait_until

GROUP = "indexer"


def synthetic_uri(windows: int, *, events_per_window: int = 5, keys: int = 10_000,
                  rate: int = 5000, event_bytes: int = 96) -> str:
    return (f"synthetic://?rate={rate}&keys={keys}&event_bytes={event_bytes}"
            f"&events_per_window={events_per_window}&update_ratio=0.9&limit={windows}"
            "&seed=17")


def start_relay(home: Path, uri: str, capacity_mb: int = 64) -> RelayProcess:
    home.mkdir(parents=True, exist_ok=True)
    relay = RelayProcess(home, {"syn": uri}, capacity_mb=capacity_mb, workers=1)
    relay.start()
    return relay


class MemberProcess:
    def __init__(self, home: Path, name: str, relay: str, zookeeper: str, partitions: int,
                 *, session_timeout: float = 4.0, work_us: float = 0.0,
                 group: str = GROUP, checkpoint_dsn: str | None = None) -> None:
        self.name = name
        self.out = home / f"{name}.log"
        self.err = home / f"{name}.stderr"
        self.args = [sys.executable, "-m", "tests.integration.group_member",
                     "--relay", relay, "--zookeeper", zookeeper, "--group", group,
                     "--partitions", str(partitions), "--name", name, "--out",
                     str(self.out), "--work-us", str(work_us),
                     "--session-timeout", str(session_timeout)]
        if checkpoint_dsn is not None:
            self.args += ["--checkpoint-dsn", checkpoint_dsn]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MemberProcess:
        err = open(self.err, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(self.args, stdout=err, stderr=err,
                                     cwd=Path(__file__).resolve().parents[2],
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.proc.wait(timeout=30)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def log(self) -> MemberLog:
        return MemberLog.read(self.out)


@dataclass
class MemberLog:
    """A member's ``--out`` file, parsed: events as (scn, key, seq, partition), and the
    lines in order (kind, payload)."""

    lines: list[tuple[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> MemberLog:
        log = cls()
        if not path.exists():
            return log
        for raw in path.read_text().splitlines():
            parts = raw.split()
            try:
                if parts[0] == "E" and len(parts) == 5:
                    log.lines.append(("E", tuple(int(x) for x in parts[1:])))
                elif parts[0] in ("A", "V") and len(parts) == 2:
                    log.lines.append((parts[0], tuple(int(x) for x in parts[1].split(","))))
                elif parts[0] == "R" and len(parts) == 2:
                    log.lines.append(("R", int(parts[1])))
            except (ValueError, IndexError):
                continue  # a line torn by SIGKILL
        return log

    @property
    def events(self) -> list[tuple[int, int, int, int]]:
        return [payload for kind, payload in self.lines if kind == "E"]

    def held(self) -> set[int]:
        """The partitions held after the last line (A adds, V removes)."""
        held: set[int] = set()
        for kind, payload in self.lines:
            if kind == "A":
                held |= set(payload)
            elif kind == "V":
                held -= set(payload)
        return held


def applied_seqs(logs: list[MemberLog]) -> dict[int, int]:
    """seq -> how many times it was applied, over every member."""
    counts: dict[int, int] = defaultdict(int)
    for log in logs:
        for _scn, _key, seq, _p in log.events:
            counts[seq] += 1
    return counts


def wait_until_complete(members: list[MemberProcess], total: int, timeout: float,
                        extra_logs: list[MemberLog] | None = None) -> dict[int, int]:
    """:func:`tests.waiting.wait_until` every event of ``0..total`` applied by one of the
    members (or in ``extra_logs``); fails at once if a member exits by itself."""
    missing: list[int] = []

    def complete() -> dict[int, int] | None:
        nonlocal missing
        counts = applied_seqs([m.log() for m in members] + (extra_logs or []))
        missing = [s for s in range(total) if s not in counts]
        if not missing:
            return counts
        for m in members:
            if m.proc is not None and m.proc.poll() not in (None, -9, -15):
                raise AssertionError(f"member {m.name} exited {m.proc.returncode}: "
                                     f"{m.err.read_text()[-3000:]}")
        return None

    # Reading every member's log is not cheap: a pause of 0.1 s at first.
    counts = wait_until(complete, f"all {total} events applied", timeout, interval=0.1,
                        diagnose=lambda: f"{len(missing)} events never applied (first "
                                         f"{missing[:10]}); stderr of {members[0].name}: "
                                         f"{members[0].err.read_text()[-2000:]}")
    assert counts is not None
    return counts


def check_member_order(log: MemberLog) -> None:
    """Per key, a member applies SCNs in order; it may go back only after a rollback
    or a new assignment (a stream restarted from an earlier partition checkpoint)."""
    last: dict[int, int] = {}
    for kind, payload in log.lines:
        if kind in ("R", "A"):
            last.clear()
        elif kind == "E":
            scn, key = payload[0], payload[1]
            assert scn >= last.get(key, -1), f"key {key}: SCN {scn} after {last[key]}"
            last[key] = scn


def check_partitions_owned(log: MemberLog) -> None:
    """Every event a member applied belongs to a partition it held at the time."""
    held: set[int] = set()
    for kind, payload in log.lines:
        if kind == "A":
            held |= set(payload)
        elif kind == "V":
            held -= set(payload)
        elif kind == "E":
            assert payload[3] in held, f"event {payload} of partition {payload[3]} " \
                                       f"not held ({sorted(held)})"


@dataclass
class Run:
    """One member's uninterrupted holding of one partition: from its assignment (or a
    rollback) to its revocation, its next rollback or the end of its log. ``ended_by``
    says which: "V" (revoked while alive), "R" (rolled back) or "end"."""

    member: str
    partition: int
    windows: dict[int, frozenset[int]] = field(default_factory=dict)  # scn -> seqs
    ended_by: str = "end"

    @property
    def scns(self) -> list[int]:
        return sorted(self.windows)


def partition_runs(name: str, log: MemberLog) -> list[Run]:
    """A member's log cut into runs, one per partition held (see :class:`Run`)."""
    runs: list[Run] = []
    open_runs: dict[int, Run] = {}

    def close(partition: int, how: str) -> None:
        run = open_runs.pop(partition)
        run.ended_by = how
        runs.append(run)

    for kind, payload in log.lines:
        if kind == "A":
            for p in payload:
                if p not in open_runs:
                    open_runs[p] = Run(name, p)
        elif kind == "V":
            for p in payload:
                if p in open_runs:
                    close(p, "V")
        elif kind == "R":  # the stream restarts after payload: a new run per partition
            for p in list(open_runs):
                close(p, "R")
                open_runs[p] = Run(name, p)
        elif kind == "E":
            scn, _key, seq, p = payload
            run = open_runs.get(p)
            if run is not None:  # else check_partitions_owned reports it
                run.windows[scn] = run.windows.get(scn, frozenset()) | {seq}
    for p in list(open_runs):
        close(p, "end")
    return [run for run in runs if run.windows]


def check_duplicates_are_replays(logs: dict[str, MemberLog],
                                 killed: frozenset[str] = frozenset()) -> dict[str, int]:
    """What the group promises of duplicates (at-least-once, replay from a checkpoint),
    whatever the machine's speed: an event applied twice is part of a *whole window*
    applied again, and the windows of a partition applied again by its next holder are
    exactly the *tail* of what its previous holder applied (everything after the last
    checkpoint it wrote), replayed from that checkpoint in the same order: the overlap of
    two holdings of a partition is a suffix of the earlier one and a prefix of the later.

    ``killed`` names members killed with SIGKILL: their log may end with a torn window.
    Returns how many window slices came again, by how the earlier holding ended
    ("V" revoked, "R" rolled back, "end" killed or stopped), for the test to print."""
    runs = [run for name, log in logs.items() for run in partition_runs(name, log)]
    # Whole windows: every holding that applied (scn, partition) applied all of it.
    whole: dict[tuple[int, int], frozenset[int]] = {}
    for run in runs:
        for scn, seqs in run.windows.items():
            whole[(run.partition, scn)] = whole.get((run.partition, scn), frozenset()) | seqs
    for run in runs:
        last = max(run.windows)
        for scn, seqs in run.windows.items():
            torn_ok = run.member in killed and run.ended_by == "end" and scn == last
            assert torn_ok or seqs == whole[(run.partition, scn)], (
                f"{run.member} applied part of window {scn} of partition {run.partition}: "
                f"{sorted(seqs)} of {sorted(whole[(run.partition, scn)])}")
    # Replays: overlaps are a suffix of the earlier holding and a prefix of the later.
    replayed: dict[str, int] = defaultdict(int)
    by_partition: dict[int, list[Run]] = defaultdict(list)
    for run in runs:
        by_partition[run.partition].append(run)
    for partition, held in by_partition.items():
        held.sort(key=lambda r: (min(r.windows), max(r.windows)))
        for i, earlier in enumerate(held):
            first_e, last_e = min(earlier.windows), max(earlier.windows)
            for later in held[i + 1:]:
                first_l, last_l = min(later.windows), max(later.windows)
                if first_l > last_e:
                    continue
                upto = min(last_e, last_l)
                tail = [s for s in earlier.scns if first_l <= s <= upto]
                head = [s for s in later.scns if s <= upto]
                assert tail == head, (
                    f"partition {partition}: {later.member} started at window {first_l} "
                    f"inside {earlier.member}'s holding ({first_e}..{last_e}) but did not "
                    f"replay its tail: {tail[:5]}.. vs {head[:5]}..")
                replayed[earlier.ended_by] += len(tail)
    return dict(replayed)


def read_assignment(zk_hosts: str, group: str = GROUP) -> dict[str, Any]:
    """The group's assignment znode ({} while there is none yet)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    client = KazooClient(hosts=zk_hosts)
    client.start(timeout=15)
    try:
        raw, _ = client.get(f"/databus/groups/{group}/assignment")
        return json.loads(raw)  # type: ignore[no-any-return]
    except NoNodeError:
        return {}
    finally:
        client.stop()
        client.close()
