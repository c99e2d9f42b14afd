"""``databus tail`` against a real relay: JSON lines, start points, filters, --exit."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from databus.client._tail import tail
from tests.relay_harness import RelayProcess, relay_config, running_relay
from tests.waiting import wait_until

SOURCE = "synthetic://?rate=0&keys=20&event_bytes=150&events_per_window=2&limit=10&seed=8"


def args(url: str, **kw: object) -> argparse.Namespace:
    base = dict(relay=[url], sources="synthetic.events", from_scn=None, from_earliest=False,
                filter=None, count=0, exit=True, client_id=None)
    base.update(kw)
    return argparse.Namespace(**base)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_tail_prints_json_lines_from_any_point(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            await r.wait_for_scn("load", 10)
            out = io.StringIO()
            await asyncio.wait_for(tail(args(r.url, from_earliest=True), out), 20)
            rows = lines(out)
            assert [row["scn"] for row in rows] == [s for s in range(1, 11) for _ in (0, 1)]
            first = rows[0]
            assert first["source"] == "synthetic.events" and first["op"] in ("upsert",)
            assert isinstance(first["value"], dict) and isinstance(first["value"]["payload"], str)
            out = io.StringIO()
            await asyncio.wait_for(tail(args(r.url, from_scn=7), out), 20)
            assert {row["scn"] for row in lines(out)} == {8, 9, 10}
            out = io.StringIO()
            spec = json.dumps({"synthetic.events": {"type": "mod", "n": 2, "buckets": [0]}})
            await asyncio.wait_for(tail(args(r.url, from_earliest=True, filter=spec), out), 20)
            assert rows and all(row["key"] % 2 == 0 for row in lines(out))  # type: ignore[operator]
            out = io.StringIO()
            await asyncio.wait_for(tail(args(r.url, from_earliest=True, count=3,
                                             exit=False), out), 20)
            assert len(lines(out)) == 3
            out = io.StringIO()
            await asyncio.wait_for(tail(args(r.url), out), 20)  # latest: nothing new
            assert lines(out) == []

    asyncio.run(main())


def test_tail_command_line(tmp_path: Path) -> None:
    relay = RelayProcess(tmp_path, {"load": SOURCE})
    relay.start()
    try:
        deadline = 0
        while (relay.status()["buffers"]["load"]["max_scn"] or 0) < 10 and deadline < 200:
            deadline += 1
            import time

            time.sleep(0.05)
        exe = Path(sys.executable).with_name("databus")
        runs = {}
        for client_id, extra in (("streamer", []), ("poller", ["--no-streaming"])):
            runs[client_id] = subprocess.run(
                [str(exe), "tail", "--relay", relay.url, "--sources", "synthetic.events",
                 "--from-scn", "8", "--exit", "--client-id", client_id, *extra],
                capture_output=True, text=True, timeout=60, check=True,
            )
        import urllib.request

        def listed() -> dict[str, Any]:
            with urllib.request.urlopen(relay.url + "/v1/consumers", timeout=5) as resp:
                return {c["client_id"]: c for c in json.loads(resp.read())["consumers"]}

        # The relay sees the streaming tail's connection end within a heartbeat.
        def streamer_gone() -> dict[str, Any] | None:
            now = listed()
            return None if "streamer" in now else now

        consumers = wait_until(streamer_gone, "the streaming tail's row gone", 15)
    finally:
        relay.kill()
    for done in runs.values():
        assert [json.loads(line)["scn"] for line in done.stdout.splitlines()] == [9, 9, 10, 10]
    # The streaming tail's row went when it exited (its stream closed): a poller's
    # stays until the relay's consumer_expiry_s.
    assert "streamer" not in consumers
    assert consumers["poller"]["streaming"] is False
