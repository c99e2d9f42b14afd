"""Starting a real relay (in-process or as a ``databus relay`` process) for tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from databus.config import BufferConfig, RelayConfig, Secret
from databus.event import decode_eow, decode_event, iter_events
from databus.relay._relay import Relay
from databus.relay._server import create_app
from databus.security import ClientCredentials
from tests.fixtures._procs import free_port
from tests.waiting import async_wait_until

ADMIN_TOKEN = "test-admin-token"


def relay_config(tmp_path: Path, buffers: dict[str, str], capacity_mb: int = 4,
                 **extra: Any) -> RelayConfig:
    return RelayConfig(
        data_dir=tmp_path / "relay",
        buffers=tuple(BufferConfig(name=n, capacity_mb=capacity_mb, source=s)
                      for n, s in buffers.items()),
        port=0,
        admin_token=Secret(ADMIN_TOKEN),
        **extra,
    )


@dataclass
class RunningRelay:
    relay: Relay
    url: str
    session: aiohttp.ClientSession
    app: web.Application | None = None

    async def get(self, path: str, **params: Any) -> aiohttp.ClientResponse:
        return await self.session.get(self.url + path, params=params)

    async def json(self, path: str, **params: Any) -> Any:
        async with await self.get(path, **params) as resp:
            return await resp.json()

    async def wait_for_scn(self, buffer: str, scn: int, timeout: float = 20) -> None:
        async def reached() -> bool:
            max_scn = (await self.json("/v1/status"))["buffers"][buffer]["max_scn"]
            return max_scn is not None and max_scn >= scn

        await async_wait_until(reached, f"buffer {buffer} at SCN {scn}", timeout,
                               max_interval=0.1)


@asynccontextmanager
async def running_relay(config: RelayConfig) -> AsyncIterator[RunningRelay]:
    relay = Relay(config, backoff_initial=0.05, backoff_max=0.5)
    app = create_app(relay)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        # No connection limit: tests open hundreds of concurrent long polls.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            yield RunningRelay(relay, f"http://127.0.0.1:{port}", session, app)
    finally:
        await runner.cleanup()


@dataclass
class Window:
    scn: int
    events: list[tuple[int, object, bytes]] = field(default_factory=list)  # (source, key, value)
    eow_count: int = -1


def parse_windows(data: bytes) -> list[Window]:
    """Group a stream body into windows; every CRC is checked on the way."""
    windows: list[Window] = []
    current: Window | None = None
    for off, header in iter_events(data):
        event = decode_event(data, off)
        if current is None or current.scn != header.scn:
            current = Window(header.scn)
            windows.append(current)
        if header.is_eow:
            current.eow_count = decode_eow(event).event_count
        elif not header.is_control:
            current.events.append((header.source_id, event.key, event.value))
    return windows


async def stream_bytes(
    relay: RunningRelay, checkpoint: str | None = None, **params: Any
) -> tuple[bytes, str]:
    """Pull until the relay has nothing new; returns the bytes served and the final
    checkpoint."""
    body = b""
    cp = checkpoint
    while True:
        query = dict(params)
        if cp is not None:
            query["checkpoint"] = cp
        async with await relay.get("/v1/stream", **query) as resp:
            assert resp.status == 200, await resp.text()
            chunk = await resp.read()
            new_cp = resp.headers["X-Databus-Checkpoint"]
        if not chunk:
            return body, cp or new_cp
        body += chunk
        cp = new_cp


async def stream_all(
    relay: RunningRelay, checkpoint: str | None = None, **params: Any
) -> tuple[list[Window], str]:
    """Pull until the relay has nothing new; returns windows and the final checkpoint."""
    body, cp = await stream_bytes(relay, checkpoint, **params)
    return parse_windows(body), cp


async def stream_body_at(session: aiohttp.ClientSession, url: str,
                         max_bytes: int = 64 << 20) -> bytes:
    """Every byte the relay at ``url`` serves from its start to its newest window (raw
    events), pulled with the checkpoint each answer returns."""
    out, cp = b"", None
    while True:
        params = {"max_bytes": str(max_bytes)}
        if cp is not None:
            params["checkpoint"] = cp
        async with session.get(url + "/v1/stream", params=params) as resp:
            assert resp.status == 200, await resp.text()
            chunk = await resp.read()
            cp = resp.headers["X-Databus-Checkpoint"]
        if not chunk:
            return out
        out += chunk


async def stream_body(relay: RunningRelay, max_bytes: int = 64 << 20) -> bytes:
    """Every byte ``relay`` serves from its start to its newest window (raw events)."""
    return await stream_body_at(relay.session, relay.url, max_bytes)


def wait_port_closed(port: int, timeout: float = 10) -> None:
    """Return once nothing accepts connections on ``port`` (at once for a free one)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                pass
        except OSError:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"port {port} still accepts connections")
        time.sleep(0.02)


def _listening_pids(port: int) -> set[int]:
    """The processes holding a socket that listens on TCP ``port`` (Linux ``/proc``);
    empty when that cannot be told."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    pids: set[int] = set()
    if not inodes:
        return pids
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                pids.add(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def _lineage(pid: int) -> list[int]:
    """``pid`` and its ancestors (Linux ``/proc``)."""
    out = []
    while pid > 1 and len(out) < 64:
        out.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def start_databus(args: list[str], port: int, log_path: Path,
                  timeout: float = 30) -> subprocess.Popen[bytes]:
    """``databus ARGS`` as a child process; returns once it listens on ``port``."""
    # A relay killed just before may leave worker processes (relay.workers) that die a
    # moment after it: a port that still accepts is theirs, not the new process's.
    wait_port_closed(port)
    exe = Path(sys.executable).with_name("databus")
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen([str(exe), *args], stdout=log, stderr=log,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"databus {args[0]} exited: {log_path.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                pass
        except OSError:
            time.sleep(0.05)
            continue
        holders = _listening_pids(port)
        if holders and not any(proc.pid in _lineage(pid) for pid in holders):
            # Another program (another test run on this machine) took the port between
            # free_port() and the child's bind: the child cannot listen on it.
            proc.kill()
            proc.wait(timeout=20)
            raise RuntimeError(f"databus {args[0]}: port {port} is taken by another program "
                               f"(pid {sorted(holders)}): {log_path.read_text()}")
        return proc
    proc.kill()
    raise TimeoutError(f"databus {args[0]} did not listen: {log_path.read_text()}")


def get_url(url: str, credentials: ClientCredentials | None = None,
            timeout: float = 5) -> bytes:
    """The body of ``GET url`` (urllib); with ``credentials``, their TLS context for an
    ``https://`` URL and their token (a ``ClientCredentials``)."""
    request = urllib.request.Request(url)
    context = None
    if credentials is not None:
        for name, value in credentials.headers().items():
            request.add_header(name, value)
        context = credentials.ssl_for(url)
    with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
        body: bytes = resp.read()
    return body


class RelayProcess:
    """``databus relay --config FILE`` as a child process (for kill -9 tests).

    ``scheme="https"`` for a relay whose ``extra_toml`` has ``[relay.tls]``;
    ``credentials`` (a ``ClientCredentials``) are what ``status()`` and the cluster
    tests' helpers present to it (a reader's token or certificate, the CA)."""

    def __init__(self, tmp_path: Path, buffers: dict[str, str], capacity_mb: int = 4,
                 workers: int | None = None, admin_token: str | None = None,
                 extra_toml: str = "", port: int | None = None, *, scheme: str = "http",
                 credentials: ClientCredentials | None = None) -> None:
        self.port = port or free_port()
        self.scheme = scheme
        self.credentials = credentials
        self.config_path = tmp_path / "relay.toml"
        lines = [
            "[relay]",
            f'data_dir = "{tmp_path / "relay"}"',
            f"port = {self.port}",
        ]
        if workers is not None:  # else relay.workers' default: one process per core
            lines.append(f"workers = {workers}")
        if admin_token is not None:
            lines.append(f'admin_token = "{admin_token}"')
        for name, source in buffers.items():
            lines += ["[[relay.buffers]]", f'name = "{name}"', f"capacity_mb = {capacity_mb}",
                      f'source = "{source}"']
        self.config_path.write_text("\n".join(lines) + "\n" + extra_toml)
        self.log_path = tmp_path / "relay.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = start_databus(["relay", "--config", str(self.config_path)], self.port,
                                  self.log_path)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=20)
        # Its worker processes (relay.workers) die with it, a moment later.
        wait_port_closed(self.port)

    def status(self) -> dict[str, Any]:
        return json.loads(get_url(self.url + "/v1/status",  # type: ignore[no-any-return]
                                  self.credentials))
