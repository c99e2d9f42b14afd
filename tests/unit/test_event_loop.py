"""The event loop of ``databus relay`` and ``databus bootstrap``: uvloop when installed
(``event_loop = "auto"``), asyncio on request, ``DATABUS_EVENT_LOOP`` over the config;
and the relay serving through databus/_serving.py on each loop, as a real process."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from databus import _event_loop
from databus.cli import main
from databus.errors import ConfigError
from tests.relay_harness import RelayProcess, free_port, parse_windows, start_databus

uvloop = pytest.importorskip("uvloop")  # the "fast" extra, which `make venv` installs

# As the suite was started (the autouse fixture below clears it for each test).
SUITE_LOOP = os.environ.get(_event_loop.ENV, "").strip().lower()
LOAD = "synthetic://?rate=0&keys=1000&event_bytes=2000&events_per_window=5&limit=200&seed=3"


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_event_loop.ENV, raising=False)


def _without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError


def test_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    auto = _event_loop.choose("auto", "relay.event_loop")
    assert auto.name == "uvloop" and auto.factory is uvloop.new_event_loop
    assert "relay.event_loop = auto" in auto.describe()
    assert _event_loop.choose("asyncio", "relay.event_loop").factory is None
    monkeypatch.setenv(_event_loop.ENV, "asyncio")
    forced = _event_loop.choose("uvloop", "relay.event_loop")
    assert forced.name == "asyncio" and "DATABUS_EVENT_LOOP = asyncio" in forced.why
    monkeypatch.setenv(_event_loop.ENV, "fast")
    with pytest.raises(ConfigError, match="DATABUS_EVENT_LOOP must be one of"):
        _event_loop.choose("auto", "relay.event_loop")


def test_without_uvloop_auto_falls_back_and_uvloop_is_a_config_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _without_uvloop(monkeypatch)
    fallback = _event_loop.choose("auto", "bootstrap.event_loop")
    assert fallback.name == "asyncio" and "uvloop not installed" in fallback.why
    with pytest.raises(ConfigError, match=r"bootstrap.event_loop = uvloop, but uvloop "
                                          r"cannot be imported .*databus\[fast\]"):
        _event_loop.choose("uvloop", "bootstrap.event_loop")


async def _name() -> str:
    return _event_loop.running_loop_name()


def test_running_loop_name() -> None:
    assert asyncio.Runner(loop_factory=uvloop.new_event_loop).run(_name()) == "uvloop"
    assert asyncio.Runner(loop_factory=asyncio.SelectorEventLoop).run(_name()) == "asyncio"


def test_the_suite_runs_on_uvloop_when_asked() -> None:
    """``DATABUS_EVENT_LOOP=uvloop pytest`` (tests/conftest.py): asyncio.run is uvloop."""
    expected = "uvloop" if SUITE_LOOP == "uvloop" else "asyncio"
    assert asyncio.run(_name()) == expected


def test_databus_relay_asking_for_a_missing_uvloop_stops_with_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    proc = RelayProcess(tmp_path, {"load": LOAD})
    text = proc.config_path.read_text().replace("[relay]\n", '[relay]\nevent_loop = "uvloop"\n')
    proc.config_path.write_text(text)
    _without_uvloop(monkeypatch)
    assert main(["relay", "--config", str(proc.config_path)]) == 1
    err = capsys.readouterr().err
    assert "relay.event_loop = uvloop, but uvloop cannot be imported" in err
    assert not (tmp_path / "relay").exists()  # refused before anything was opened


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


@pytest.mark.parametrize("configured,env,expected", [
    ("auto", None, "uvloop"),
    ("asyncio", None, "asyncio"),
    ("asyncio", "uvloop", "uvloop"),  # the environment overrides the config
])
def test_databus_relay_serves_on_the_chosen_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, configured: str, env: str | None,
        expected: str) -> None:
    if env is not None:
        monkeypatch.setenv(_event_loop.ENV, env)
    proc = RelayProcess(tmp_path, {"load": LOAD})
    text = proc.config_path.read_text().replace(
        "[relay]\n", f'[relay]\nevent_loop = "{configured}"\n')
    proc.config_path.write_text(text)
    proc.start()
    try:
        for _ in range(200):
            status = _get_json(proc.url + "/v1/status")
            if status["buffers"]["load"]["max_scn"] == 200:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert status["event_loop"] == expected
        # A stream of about 2 MB in one response: written in 64 KiB pieces through the
        # transport's write buffer limits (databus/_serving.py), on this loop.
        body = b""
        checkpoint = None
        while True:
            query = "max_bytes=8388608" + (f"&checkpoint={checkpoint}" if checkpoint else "")
            with urllib.request.urlopen(f"{proc.url}/v1/stream?{query}", timeout=10) as resp:
                chunk = resp.read()
                checkpoint = urllib.request.quote(resp.headers["X-Databus-Checkpoint"])
            if not chunk:
                break
            body += chunk
        windows = parse_windows(body)
        assert [w.scn for w in windows] == list(range(1, 201))
        assert all(len(w.events) == 5 for w in windows)
        # A protocol error is answered by the custom protocol in JSON.
        raw = _raw(proc.port, b"G(T / HTTP/1.1\r\n\r\n")
        assert raw.split(b" ", 2)[1] == b"400" and b'"bad_request"' in raw
    finally:
        proc.kill()
    log = proc.log_path.read_text()
    assert log.count("event loop: ") == 1 and f"event loop: {expected} (" in log
    assert "Traceback" not in log


def test_databus_bootstrap_reports_its_loop(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    config = tmp_path / "bootstrap.toml"
    config.write_text("\n".join([
        "[bootstrap]",
        f'storage = "sqlite:///{tmp_path / "boot.db"}"',
        f"port = {port}",
        'run = ["server"]',
        'event_loop = "uvloop"',
    ]) + "\n")
    monkeypatch.setenv(_event_loop.ENV, "asyncio")
    log = tmp_path / "bootstrap.log"
    proc = start_databus(["bootstrap", "--config", str(config)], port, log)
    try:
        status = _get_json(f"http://127.0.0.1:{port}/v1/status")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert status["event_loop"] == "asyncio"
    assert "event loop: asyncio (DATABUS_EVENT_LOOP = asyncio)" in log.read_text()
