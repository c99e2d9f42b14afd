"""kill -9 of a ``databus relay`` process mid-write, then a restart: every complete
window it had is served again, byte for byte, and the fetcher resumes without a gap."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path

from tests.relay_harness import RelayProcess, Window, parse_windows
from tests.waiting import wait_until

SOURCE = "synthetic://?rate=300&events_per_window=5&event_bytes=400&keys=500&seed=9"


def pull_everything(url: str) -> list[Window]:
    body = b""
    checkpoint: str | None = None
    while True:
        query = {"max_bytes": "200000"}
        if checkpoint:
            query["checkpoint"] = checkpoint
        with urllib.request.urlopen(
            f"{url}/v1/stream?{urllib.parse.urlencode(query)}", timeout=10
        ) as resp:
            chunk = resp.read()
            checkpoint = resp.headers["X-Databus-Checkpoint"]
        if not chunk:
            return parse_windows(body)
        body += chunk


def test_kill_9_then_restart_serves_every_complete_window(tmp_path: Path) -> None:
    relay = RelayProcess(tmp_path, {"load": SOURCE})
    relay.start()
    try:
        wait_until(lambda: (relay.status()["buffers"]["load"]["max_scn"] or 0) >= 300,
                   "300 windows", 20)
        before = pull_everything(relay.url)
    finally:
        relay.kill()  # SIGKILL while the fetcher keeps writing
    assert len(before) >= 300

    relay.start()
    try:
        after_restart = relay.status()["buffers"]["load"]
        assert after_restart["max_scn"] >= before[-1].scn
        wait_until(lambda: relay.status()["buffers"]["load"]["max_scn"]
                   > after_restart["max_scn"], "the fetcher appending after the restart", 20)
        after = pull_everything(relay.url)
    finally:
        relay.kill()
    by_scn = {w.scn: w for w in after}
    for w in before:
        assert by_scn[w.scn] == w
    scns = [w.scn for w in after]
    assert scns == list(range(scns[0], scns[0] + len(scns)))  # no gap, no repeat
    assert scns[-1] > before[-1].scn
    assert all(len(w.events) == 5 == w.eow_count for w in after)
    assert json.loads(json.dumps(after_restart))["fetcher"] is not None
