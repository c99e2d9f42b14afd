"""The relay as deploy/systemd/databus-relay.service runs it: its ExecStart command line
(the venv's ``databus`` for the install path, a test config for /etc/databus/relay.toml)
on a SQLite source with two serving processes, traced with ``strace -f``. It serves a
stream through its workers, then the unit's KillSignal (SIGTERM) ends it with status 0
within the unit's TimeoutStopSec, and every system call it and its workers made is in
the unit's SystemCallFilter (@system-service): under systemd, anything else would fail
with EPERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures._procs import free_port
from tests.integration.test_replicator_failures import new_source
from tests.relay_harness import wait_port_closed
from tests.unit.test_deploy_systemd import (
    INSTALLED,
    UNITS_DIR,
    allowed_syscalls,
    directive,
    exec_argv,
    tool,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

UNIT = UNITS_DIR / "databus-relay.service"


def traced_calls(trace: Path, pid: int | None = None) -> set[str]:
    """The system calls in an ``strace -f`` output (of one process, or all)."""
    names: set[str] = set()
    for line in trace.read_text(errors="replace").splitlines():
        found = re.match(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()", line)
        if found and (pid is None or int(found.group(1)) == pid):
            names.add(found.group(2) or found.group(3))
    return names


def test_the_relay_unit_serves_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    strace = tool("strace")
    src = new_source(tmp_path)
    port = free_port()
    config = tmp_path / "relay.toml"
    config.write_text("\n".join([
        "[relay]", f"port = {port}", f'data_dir = "{tmp_path / "relay"}"', "workers = 2",
        'admin_token = "${DATABUS_ADMIN_TOKEN}"',
        "[[relay.buffers]]", 'name = "src"', "capacity_mb = 4",
        f'source = "{src.uri("orders")}"']) + "\n")
    argv = [str(Path(sys.executable).with_name("databus")) if a == INSTALLED
            else str(config) if a == "/etc/databus/relay.toml" else a
            for a in exec_argv(UNIT)]
    assert argv[1:3] == ["relay", "--config"]
    trace, log = tmp_path / "trace", tmp_path / "relay.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [strace, "-f", "-qq", "-o", str(trace), *argv], stdout=out, stderr=out,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "DATABUS_ADMIN_TOKEN": "t0ken"})
    try:
        url = f"http://127.0.0.1:{port}"

        def served() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/v1/stream?client_id=unit", timeout=5) \
                        as resp:
                    return resp.status == 200 and len(resp.read()) > 0
            except OSError:
                return False

        # Under strace everything is slower: the first window may take a while.
        wait_until(served, "the relay serving its first window", 120,
                   diagnose=lambda: log.read_text(errors="replace"))

        def workers() -> list[dict[str, object]]:
            with urllib.request.urlopen(f"{url}/v1/status", timeout=10) as resp:
                found: list[dict[str, object]] = json.loads(resp.read())["workers"]
            return found

        # The main process and one worker, which serves its share of new connections.
        wait_until(lambda: [w["state"] for w in workers()] == ["running"],
                   "the worker running", 120, diagnose=lambda: log.read_text(errors="replace"))
        worker_pid = int(str(workers()[0]["pid"]))
        for _ in range(20):
            assert served()
        relay_pid = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
                        .split()[0])
        stop_timeout = float(directive(UNIT, "TimeoutStopSec")[0])
        assert directive(UNIT, "KillSignal") == ["SIGTERM"]
        began = time.monotonic()
        os.kill(relay_pid, signal.SIGTERM)
        # strace exits with its tracee's status.
        status_code = proc.wait(timeout=stop_timeout)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=20)
    text = log.read_text(errors="replace")
    assert status_code == 0, text
    assert took < stop_timeout
    assert "Traceback" not in text, text
    wait_port_closed(port)
    calls = traced_calls(trace)
    assert "accept4" in traced_calls(trace, worker_pid), "the worker served nothing"
    assert {"mmap", "socketpair", "execve", "accept4"} <= calls, sorted(calls)
    outside = calls - allowed_syscalls("@system-service")
    assert outside == set(), f"system calls the unit's filter refuses: {sorted(outside)}"
    # The check can fail: a narrower filter would refuse some of them.
    assert calls - allowed_syscalls("@basic-io")
