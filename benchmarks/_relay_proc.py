"""Shared helpers of the relay benchmarks: a ``databus relay`` child process (its
worker processes and event loop chosen per run), its CPU time, a throwaway
``redis-server`` for the Redis Streams peers, and an optional py-spy profile of the
relay. Not a benchmark by itself.

A ``RelayProcess`` may serve HTTPS (``tls=(cert_file, key_file)``, its ``ca_file``
for the clients' verification) and have one reader with a bearer token
(``reader_token``): ``url`` is then ``https://``, and ``get_json``, ``ssl_context``
and ``headers`` are what a client of it presents.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """utime + stime of process ``pid`` (all its threads), from /proc/<pid>/stat;
    ``reaped``: plus cutime + cstime, the children it has waited for."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2 :].split()
    # Fields 14 and 15 of stat(5) (16 and 17 with the reaped children).
    return sum(int(x) for x in fields[11:15 if reaped else 13]) / CLK_TCK


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes, their children and so on (from /proc; a relay's
    worker processes are its children)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children[ppid].append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and of its live descendants (a relay with workers serves
    from several processes). A descendant that exited meanwhile is not counted."""
    total = cpu_seconds(pid)
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(child)
    return total


def default_consumer_loop() -> str:
    """uvloop when it is installed (the ``fast`` extra), else asyncio: the event loop of
    the benchmarks' asyncio consumer processes, which share the machine's cores with
    the server they measure."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_on(loop: str, main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on ``loop`` ("asyncio" or "uvloop")."""
    factory = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def relay_config_fields() -> set[str]:
    """The ``[relay]`` fields the relay in this working tree accepts."""
    import dataclasses

    from databus.config import RelayConfig

    return {f.name for f in dataclasses.fields(RelayConfig)}


def total_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    total = sum(parts[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK


def loadavg() -> str:
    """The machine's load averages (other users' jobs show up here)."""
    with open("/proc/loadavg") as f:
        one, five, fifteen = f.read().split()[:3]
    return f"load average {one} {five} {fifteen}"


def code_version(paths: tuple[str, ...] = ("relay", "databus", "fetchers")) -> str:
    """The commit measured, and whether the code under ``paths`` differs from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", *paths],
            capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"commit {head}" + (f" + uncommitted {', '.join(changed)}" if changed else "")


def machine_cpu() -> tuple[float, float, float]:
    """(busy, steal, total) CPU seconds of the whole machine, from /proc/stat. ``busy``
    excludes steal: time the hypervisor gave this VM's vCPUs to someone else, which on
    a shared host slows every process here without showing up in any of them."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    steal = parts[7] if len(parts) > 7 else 0
    total = sum(parts[:8])
    return (total - idle - steal) / CLK_TCK, steal / CLK_TCK, total / CLK_TCK


def softirq_seconds() -> float:
    """Seconds all cores spent in softirq (and hardirq) work, from /proc/stat: on
    loopback, much of TCP's receive path runs there, charged to no process, so the
    benchmarks' "other" column holds it unless they take it out."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    return (parts[5] + parts[6]) / CLK_TCK


class WorkersUnsupported(RuntimeError):
    """The relay in this working tree has no ``[relay] workers`` yet."""


class RelayProcess:
    """``databus relay --config FILE`` with one synthetic buffer, in a temp dir.

    ``workers``: ``[relay] workers = N``, the serving processes (the main one included);
    a relay whose config has no such field yet serves from one process, and asking it
    for more raises ``WorkersUnsupported``. ``event_loop``: ``DATABUS_EVENT_LOOP`` for
    the child ("asyncio" or "uvloop"; None leaves the relay's own choice).

    ``tls``: (cert_file, key_file) of ``[relay.tls]`` (HTTPS); ``ca_file``: the CA
    that signed that certificate, which clients verify it with. ``reader_token``: one
    ``[[relay.readers]]`` (name ``bench``, granted ``reader_sources``, default every
    source) with that bearer token; the token goes into the temp dir's TOML only
    (mode 0600, removed on stop), never into a log line. ``extra_toml``: more TOML
    appended as it is."""

    def __init__(self, source_uri: str, capacity_mb: int, *, buffer: str = "bench",
                 keep_dir: bool = False, workers: int = 1,
                 event_loop: str | None = None,
                 tls: tuple[Path, Path] | None = None, ca_file: Path | None = None,
                 reader_token: str | None = None, reader_sources: tuple[str, ...] = ("*",),
                 extra_toml: str = "") -> None:
        has_workers = "workers" in relay_config_fields()
        if workers != 1 and not has_workers:
            raise WorkersUnsupported(
                f"workers = {workers} asked for, but this relay's config has no "
                "'workers' field yet (databus/config/_relay.py): one serving process only")
        self.dir = Path(tempfile.mkdtemp(prefix="databus-bench-"))
        self.keep_dir = keep_dir
        self.port = free_port()
        self.buffer = buffer
        self.workers = workers
        self.event_loop = event_loop
        self.tls = tls
        self.ca_file = ca_file
        self.reader_token = reader_token
        self._ssl_context: ssl.SSLContext | None = None
        security = ""
        if tls is not None:
            security += (f'\n[relay.tls]\ncert_file = "{tls[0]}"\n'
                         f'key_file = "{tls[1]}"\n')
        if reader_token is not None:
            security += ('\n[[relay.readers]]\nname = "bench"\n'
                         f"sources = {json.dumps(list(reader_sources))}\n"
                         f'token = "{reader_token}"\n')
        self.config_path = self.dir / "relay.toml"
        self.config_path.touch(mode=0o600)
        self.config_path.write_text(
            "[relay]\n"
            f'data_dir = "{self.dir / "data"}"\n'
            'host = "127.0.0.1"\n'
            f"port = {self.port}\n"
            f"max_bytes_cap = {64 << 20}\n"
            # One serving process unless a benchmark asks for more (relay.workers): the
            # figures and the CPU time of ``pid`` are those of one process.
            + (f"workers = {workers}\n" if has_workers else "")
            + "\n[[relay.buffers]]\n"
            f'name = "{buffer}"\n'
            f"capacity_mb = {capacity_mb}\n"
            f'source = "{source_uri}"\n'
            + security + extra_toml
        )
        self.log_path = self.dir / "relay.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The client side's TLS context (verifies the relay against ``ca_file``), or
        None for a plain relay."""
        if self.tls is None:
            return None
        if self._ssl_context is None:
            from databus.security import client_context

            self._ssl_context = client_context(self.ca_file)
        return self._ssl_context

    @property
    def headers(self) -> dict[str, str]:
        """What a client sends with every request: the reader's bearer token, if any."""
        if self.reader_token is None:
            return {}
        return {"Authorization": f"Bearer {self.reader_token}"}

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 30) -> None:
        exe = Path(sys.executable).with_name("databus")
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.event_loop is not None:
            env["DATABUS_EVENT_LOOP"] = self.event_loop
        self.proc = subprocess.Popen(
            [str(exe), "relay", "--config", str(self.config_path)], stdout=log, stderr=log,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"relay exited: {self.log_path.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"relay did not listen: {self.log_path.read_text()}")

    def cpu_seconds(self) -> float:
        """CPU seconds of the relay's processes (the main one and its workers)."""
        return tree_cpu_seconds(self.pid)

    def serving(self) -> str:
        """What serves, as the relay reports it: its event loop and worker processes."""
        status = self.get_json("/v1/status")
        workers = status.get("workers")
        extra = (f", {len(workers)} worker process(es) beside the main one"
                 if workers else ", one serving process")
        return f"event loop {status.get('event_loop', '?')}{extra}"

    def wait_serving(self, processes: int, timeout: float = 30) -> None:
        """Block until the relay reports ``processes - 1`` running workers (they start
        after the main process listens)."""
        deadline = time.monotonic() + timeout
        while processes > 1:
            workers = self.get_json("/v1/status").get("workers") or []
            if sum(w.get("state") == "running" for w in workers) >= processes - 1:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"relay workers not running: {workers}")
            time.sleep(0.1)

    def get_json(self, path: str, **params: Any) -> Any:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        request = urllib.request.Request(self.url + path + query, headers=self.headers)
        with urllib.request.urlopen(request, timeout=10, context=self.ssl_context) as resp:
            return json.loads(resp.read())

    def buffer_status(self) -> dict[str, Any]:
        return self.get_json("/v1/status")["buffers"][self.buffer]  # type: ignore[no-any-return]

    def source_name(self) -> str:
        sources = self.get_json("/v1/sources")["sources"]
        return str(sources[0]["name"])

    def wait_for_scn(self, scn: int, timeout: float = 300) -> float:
        """Block until the buffer's max SCN reaches ``scn``; returns the seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            max_scn = self.buffer_status()["max_scn"]
            if max_scn is not None and max_scn >= scn:
                return time.monotonic() - t0
            time.sleep(0.1)
        raise TimeoutError(f"buffer did not reach SCN {scn}: {self.buffer_status()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RelayProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the Redis Streams peer ----------------------------------------------------------


class RedisServer:
    """Debian's ``redis-server`` on a free port in a temp dir, persistence off
    (``--save "" --appendonly no``); killed and its dir removed on exit. ``make
    bench-deps`` installs it, redis-py and hiredis."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server not found: make bench-deps (or apt-get install "
                             "redis-server), or run without the Redis peer")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="databus-bench-redis-")
        self.proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def version(self) -> str:
        import redis

        return str(redis.Redis(port=self.port).info("server").get("redis_version", "?"))

    def __enter__(self) -> RedisServer:
        import redis
        from redis.utils import HIREDIS_AVAILABLE

        if not HIREDIS_AVAILABLE:
            self.__exit__()
            raise SystemExit("hiredis is not installed (make bench-deps): the peer uses it")
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=self.port).ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.__exit__()
                    raise
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- py-spy -------------------------------------------------------------------------


def pyspy_available() -> str | None:
    exe = Path(sys.executable).with_name("py-spy")
    if exe.exists():
        return str(exe)
    return shutil.which("py-spy")


def start_pyspy(pid: int, duration: float, out: Path,
                rate: int = 200) -> subprocess.Popen[bytes] | None:
    """Sample ``pid`` for ``duration`` seconds into ``out`` (collapsed stacks, one root
    frame per thread). Blocking sampling (the process is paused for each sample, a few
    per cent of overhead): non-blocking sampling produced torn stacks here."""
    exe = pyspy_available()
    if exe is None:
        return None
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(duration))),
         "--rate", str(rate), "--format", "raw", "--threads", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def summarize_pyspy(path: Path, top: int = 12, seconds: float | None = None,
                    rate: int = 200) -> str:
    """Per thread: its busy share (samples / possible samples, if ``seconds`` is given),
    then the top frames by self share (per function, per line) and by inclusive share
    of that thread's samples. Idle samples are not recorded by py-spy."""
    if not path.exists():
        return "(no profile: py-spy wrote nothing)"
    threads: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        raw = stack.split(";")
        thread = raw[0] if raw[0].startswith("thread ") else "thread ?"
        frames = [f for f in (_short(f) for f in raw) if f]
        if frames:
            threads[thread].append((frames, int(count_text)))
    if not threads:
        return "(empty profile)"
    out: list[str] = []
    for thread, stacks in sorted(threads.items(), key=lambda kv: -sum(n for _, n in kv[1])):
        total = sum(n for _, n in stacks)
        self_fn: collections.Counter[str] = collections.Counter()
        self_line: collections.Counter[str] = collections.Counter()
        incl_fn: collections.Counter[str] = collections.Counter()
        for frames, n in stacks:
            self_line[frames[-1]] += n
            self_fn[_no_line(frames[-1])] += n
            for f in {_no_line(f) for f in frames}:
                incl_fn[f] += n
        root = _no_line(stacks[0][0][0])
        busy = f", busy {total / (seconds * rate):.0%} of the interval" if seconds else ""
        out.append(f"### {thread} ({root}): {total} samples{busy}")
        out.append("self %  by function")
        out += [f"{100 * n / total:6.1f}  {name}" for name, n in self_fn.most_common(top)]
        out.append("self %  by line")
        out += [f"{100 * n / total:6.1f}  {name}" for name, n in self_line.most_common(top)]
        out.append("incl %  by function (frames in >= 95% of the samples left out)")
        out += [f"{100 * n / total:6.1f}  {name}" for name, n in incl_fn.most_common()
                if n < 0.95 * total][: top + 6]
        if total < 0.05 * sum(sum(n for _, n in st) for st in threads.values()):
            break
    return "\n".join(out)


def _no_line(frame: str) -> str:
    head, sep, rest = frame.rpartition(":")
    return head + ")" if sep and rest.endswith(")") else frame


def _short(frame: str) -> str:
    # py-spy raw frames look like "func (path/to/file.py:123)".
    if frame.startswith("process ") or frame.startswith("thread "):
        return ""
    name, _, rest = frame.partition(" (")
    where = rest.rstrip(")")
    file_part, _, line = where.rpartition(":")
    file_part = "/".join(file_part.split("/")[-2:])
    return f"{name} ({file_part}:{line})" if file_part else name
