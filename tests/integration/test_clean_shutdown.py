"""Clean shutdown of the clients (DESIGN 17, "Logs"): SIGTERM and SIGINT end ``databus
tail`` and an application's ``DatabusClient.run()`` with one log line and exit status 0,
no traceback. (The daemons: tests/integration/test_safe_start.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.relay_harness import RelayProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

SOURCE = "synthetic://?rate=50&keys=100&event_bytes=60&events_per_window=1"
APP = textwrap.dedent("""
    import logging, sys
    from databus.client import CallbackResult, Consumer, DatabusClient, MemoryCheckpointStore

    class Printer(Consumer):
        def on_data_event(self, event):
            print("event", event.scn, flush=True)
            return CallbackResult.SUCCESS

    logging.basicConfig(level=logging.INFO)
    client = DatabusClient(relays=[sys.argv[1]], sources=["synthetic.events"],
                           checkpoint_store=MemoryCheckpointStore(), start_from="earliest")
    client.register(Printer())
    client.run()
    print("run() returned", flush=True)
""")


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    relay = RelayProcess(tmp_path_factory.mktemp("shutdown"), {"load": SOURCE}, workers=1)
    relay.start()
    try:
        yield relay
    finally:
        relay.kill()


def _stop(argv: list[str], sig: signal.Signals, tmp_path: Path) -> tuple[str, str]:
    """Start ``argv``, wait for its first event on stdout, send ``sig``; its output, once
    it exited with status 0."""
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(argv, stdout=o, stderr=e,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until(lambda: proc.poll() is None and out.stat().st_size > 0,
                   "the first event printed", 30, diagnose=err.read_text)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out.read_text(), err.read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_tail_ends_with_status_0(relay: RelayProcess, tmp_path: Path,
                                 sig: signal.Signals) -> None:
    databus = str(Path(sys.executable).with_name("databus"))
    out, err = _stop([databus, "tail", "--relay", relay.url, "--sources", "synthetic.events",
                      "--from-earliest"], sig, tmp_path)
    assert out.startswith("{")
    assert "Traceback" not in err
    assert err.count(f"databus tail: stopping ({sig.name})") == 1, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_client_application_run_returns_on_a_signal(relay: RelayProcess, tmp_path: Path,
                                                      sig: signal.Signals) -> None:
    out, err = _stop([sys.executable, "-c", APP, relay.url], sig, tmp_path)
    assert out.startswith("event ") and out.rstrip().endswith("run() returned"), out
    assert "Traceback" not in err
    assert err.count(f"stopping ({sig.name})") == 1, err
