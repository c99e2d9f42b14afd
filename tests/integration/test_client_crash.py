"""kill -9 of a consumer process mid-window, then a restart: the replica ends equal to
the source, and events are repeated only inside windows after the stored checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from databus.checkpoint import Checkpoint
from databus.client import FileCheckpointStore
from tests.relay_harness import RelayProcess

LIMIT = 60
SOURCE = f"synthetic://?rate=0&keys=40&event_bytes=200&events_per_window=4&limit={LIMIT}&seed=11"

CONSUMER = textwrap.dedent("""
    import json, os, sys, time
    from databus.client import Consumer, DatabusClient, FileCheckpointStore

    relay, cp_dir, log_path, pause_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    class Replica(Consumer):
        def __init__(self):
            self.log = open(log_path, "a")
        def on_data_event(self, event):
            self.log.write(json.dumps([event.scn, event.key, event.value["seq"]]) + "\\n")
            self.log.flush()
            if event.scn == pause_at and not os.path.exists(log_path + ".paused"):
                open(log_path + ".paused", "w").close()
                print("paused", flush=True)
                time.sleep(3600)  # killed here, mid-window
        def on_end_data_event_sequence(self, scn):
            if scn == LIMIT:
                client.stop()

    client = DatabusClient([relay], sources=["synthetic.events"],
                           checkpoint_store=FileCheckpointStore(cp_dir))
    client.register(Replica())
    client.run()
    print("done", flush=True)
""").replace("LIMIT", str(LIMIT))


def expected_state(relay_url: str) -> dict[int, int]:
    import urllib.request

    from tests.relay_harness import parse_windows

    with urllib.request.urlopen(f"{relay_url}/v1/stream?max_bytes=10000000", timeout=10) as r:
        windows = parse_windows(r.read())
    from databus.schemas import AvroCodec, Schema

    with urllib.request.urlopen(f"{relay_url}/v1/schemas?source=synthetic.events") as r:
        schema = Schema(json.loads(r.read())["versions"][0]["schema"])
    codec = AvroCodec(schemas=[schema])
    state: dict[int, int] = {}
    for w in windows:
        for _, key, value in w.events:
            state[key] = codec.decode(value, schema)["seq"]  # type: ignore[index]
    return state


def test_kill_9_mid_window_then_restart(tmp_path: Path) -> None:
    relay = RelayProcess(tmp_path, {"load": SOURCE})
    relay.start()
    try:
        deadline = time.monotonic() + 20
        while (relay.status()["buffers"]["load"]["max_scn"] or 0) < LIMIT:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        expected = expected_state(relay.url)
        log_path = tmp_path / "applied.jsonl"
        script = tmp_path / "consumer.py"
        script.write_text(CONSUMER)
        argv = [sys.executable, str(script), relay.url, str(tmp_path / "cp"), str(log_path), "37"]
        first = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "paused"
        # The checkpoint writer persists the last committed window shortly after it.
        store = FileCheckpointStore(tmp_path / "cp")
        deadline = time.monotonic() + 10
        while store.load() != Checkpoint(36):
            assert time.monotonic() < deadline, store.load()
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        checkpoint = FileCheckpointStore(tmp_path / "cp").load()
        assert checkpoint is not None and checkpoint.window_scn < 37
        second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert "done" in second.stdout
    finally:
        relay.kill()
    applied = [json.loads(line) for line in log_path.read_text().splitlines()]
    replica: dict[int, int] = {}
    for _, key, seq in applied:
        replica[key] = seq
    assert replica == expected
    seen: dict[tuple[int, int, int], int] = {}
    for entry in applied:
        seen[tuple(entry)] = seen.get(tuple(entry), 0) + 1  # type: ignore[index]
    repeated = {scn for (scn, _, _), n in seen.items() if n > 1}
    assert repeated  # the window in progress (at least) was replayed
    assert all(scn > checkpoint.window_scn for scn in repeated)
    assert FileCheckpointStore(tmp_path / "cp").load() == Checkpoint(LIMIT)
