"""What the consumer-group tests and the group benchmark share: a relay on the synthetic
source, member processes (``tests.integration.group_member``) and the checks of what
they applied."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.relay_harness import RelayProcess

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
    deadline = time.monotonic() + timeout
    missing: list[int] = []
    while time.monotonic() < deadline:
        counts = applied_seqs([m.log() for m in members] + (extra_logs or []))
        missing = [s for s in range(total) if s not in counts]
        if not missing:
            return counts
        for m in members:
            if m.proc is not None and m.proc.poll() not in (None, -9, -15):
                raise AssertionError(f"member {m.name} exited {m.proc.returncode}: "
                                     f"{m.err.read_text()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{len(missing)} events never applied (first {missing[:10]}); "
                         f"stderr of {members[0].name}: {members[0].err.read_text()[-2000:]}")


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
