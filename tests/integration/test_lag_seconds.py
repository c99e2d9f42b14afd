"""Lag in seconds (DESIGN 17) against real MariaDB and PostgreSQL, as product promises:

- on a busy source, and then on an idle one, the fetcher's lag in seconds is known and
  stays bounded by the heartbeat interval plus slack: it does not grow with idle time
  (heartbeats keep it true), and it is never reported as a guess;
- with the source blocked (a proxy that stops forwarding: a network partition, nothing
  closed), it becomes unknown: null in ``/v1/status``, no sample in ``/metrics``, never
  0; it comes back once the source answers again;
- a consumer at the newest window has lag 0; a stale one's lag is now minus its
  checkpoint window's commit time (bounded by the test's own clock around the commit).

How close to the truth the figure is (within 2 s) is measured by benchmarks/lag_truth.py,
not timed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.integration.binlog_support import fresh_database, source_uri
from tests.integration.pg_logical_support import PgDatabase
from tests.relay_harness import RunningRelay, relay_config, running_relay, stream_all
from tests.waiting import async_wait_until

BUFFER = "lag"
# What a test allows beyond the heartbeat interval on a shared, loaded machine. The
# promise is "bounded, not growing": the idle phase lasts longer than this bound.
SLACK_S = 4.0
IDLE_S = 5.5


class PausableProxy:
    """A TCP proxy to ``upstream`` whose forwarding can be paused (bytes held, no
    connection closed: the source looks blocked, not down) and resumed."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.open = threading.Event()
        self.open.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                return
            server.settimeout(None)
            with self.lock:
                self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                self.open.wait()
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.open.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.close()


@contextlib.contextmanager
def proxy_to(host: str, port: int) -> Iterator[PausableProxy]:
    proxy = PausableProxy((host, port))
    try:
        yield proxy
    finally:
        proxy.close()


class Source:
    """What a test needs of either server: a relay URI (through the proxy), a write
    that commits one captured row, and the heartbeat interval configured."""

    def __init__(self, uri: str, write: Any, heartbeat_s: float) -> None:
        self.uri = uri
        self.write = write
        self.heartbeat_s = heartbeat_s


@pytest.fixture(params=["mariadb", "postgres"])
def source(request: pytest.FixtureRequest) -> Iterator[tuple[Source, PausableProxy]]:
    if request.param == "mariadb":
        server: MariaDBServer = request.getfixturevalue("mariadb_server")
        sql = fresh_database(server, "lag_seconds")
        sql.run("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        counter = iter(range(1, 1 << 30))
        lock = threading.Lock()

        def write_mariadb() -> None:
            with lock:
                sql.run(f"INSERT INTO t VALUES ({next(counter)}, 1)")

        with proxy_to(server.host, server.port) as proxy:
            uri = source_uri(server, "lag_seconds.t", heartbeat_ms=100).replace(
                f":{server.port}/", f":{proxy.port}/")
            yield Source(uri, write_mariadb, 0.1), proxy
        sql.close()
        return
    pg: PostgresServer = request.getfixturevalue("postgres_server")
    db = PgDatabase(pg, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    db.setup("public.t")
    pg_counter = iter(range(1, 1 << 30))
    pg_lock = threading.Lock()

    def write_postgres() -> None:
        with pg_lock:
            db.run(f"INSERT INTO t VALUES ({next(pg_counter)}, 1)")

    try:
        with proxy_to(pg.host, pg.port) as proxy:
            uri = db.uri("public.t", heartbeat_s=0.5).replace(f":{pg.port}/",
                                                              f":{proxy.port}/")
            yield Source(uri, write_postgres, 0.5), proxy
    finally:
        db.drop()


@asynccontextmanager
async def relay_of(tmp_path: Path, uri: str) -> AsyncIterator[RunningRelay]:
    async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
        yield r


async def fetcher(r: RunningRelay) -> dict[str, Any]:
    doc: dict[str, Any] = (await r.json("/v1/status"))["buffers"][BUFFER]["fetcher"]
    return doc


async def metric_samples(r: RunningRelay, name: str) -> dict[tuple[str, ...], float]:
    async with await r.get("/metrics") as resp:
        text = await resp.text()
    out: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sample.labels[k] for k in sorted(sample.labels))] = sample.value
    return out


async def wait_lag(r: RunningRelay, check: Any, what: str, timeout: float = 30) -> Any:
    last: dict[str, Any] = {}

    async def reached() -> bool:
        nonlocal last
        last = await fetcher(r)
        return bool(check(last["lag_seconds"]))

    await async_wait_until(reached, what, timeout, max_interval=0.1,
                           diagnose=lambda: f"fetcher: {last}")
    return last["lag_seconds"]


def test_fetcher_lag_is_known_and_bounded_busy_and_idle_and_unknown_when_blocked(
        source: tuple[Source, PausableProxy], tmp_path: Path) -> None:
    asyncio.run(_fetcher_lag(*source, tmp_path))


async def _fetcher_lag(src: Source, proxy: PausableProxy, tmp_path: Path) -> None:
    bound = src.heartbeat_s + SLACK_S
    async with relay_of(tmp_path, src.uri) as r:
        await wait_lag(r, lambda lag: lag is not None, "a known fetcher lag")
        # Busy: a writer commits continuously; the lag is known and bounded throughout.
        stop = threading.Event()

        def writer() -> None:
            while not stop.is_set():
                src.write()
                time.sleep(0.01)

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        try:
            busy = []
            for _ in range(8):
                busy.append((await fetcher(r))["lag_seconds"])
                await asyncio.sleep(0.25)
        finally:
            stop.set()
            thread.join(10)
        assert all(lag is not None and 0 <= lag <= bound for lag in busy), busy
        # Idle for longer than the bound: heartbeats keep it bounded, it does not grow.
        idle = []
        started = time.monotonic()
        while time.monotonic() - started < IDLE_S:
            idle.append((await fetcher(r))["lag_seconds"])
            await asyncio.sleep(0.25)
        assert all(lag is not None and 0 <= lag <= bound for lag in idle), idle
        assert (await metric_samples(r, "databus_relay_fetcher_lag_seconds"))[(BUFFER,)] \
            <= bound
        # Blocked: nothing is closed, the source just stops answering. Unknown, not 0,
        # and no sample on /metrics (an alert on absence fires, one on > N stays quiet).
        proxy.open.clear()
        try:
            await wait_lag(r, lambda lag: lag is None, "lag unknown while blocked")
            assert (await fetcher(r))["state"] == "running"  # the fetcher itself is fine
            assert (BUFFER,) not in await metric_samples(
                r, "databus_relay_fetcher_lag_seconds")
        finally:
            proxy.open.set()
        lag = await wait_lag(r, lambda lag: lag is not None and lag <= bound,
                             "the lag known again once the source answers", timeout=60)
        assert lag <= bound


def test_consumer_lag_is_zero_at_the_newest_window_and_the_checkpoints_age_behind(
        source: tuple[Source, PausableProxy], tmp_path: Path) -> None:
    asyncio.run(_consumer_lag(source[0], tmp_path))


async def _consumer_lag(src: Source, tmp_path: Path) -> None:
    async with relay_of(tmp_path, src.uri) as r:
        await wait_lag(r, lambda lag: lag is not None, "a known fetcher lag")
        before_a = time.time()
        src.write()
        after_a = time.time()
        await async_wait_until(lambda: r.relay.buffers[BUFFER].state().max_scn is not None,
                               "window A in the buffer", 30)
        await stream_all(r, client_id="stale")
        await asyncio.sleep(1.5)  # B commits visibly later than A
        scn_a = r.relay.buffers[BUFFER].state().max_scn
        src.write()
        await async_wait_until(
            lambda: (r.relay.buffers[BUFFER].state().max_scn or 0) > (scn_a or 0),
            "window B in the buffer", 30)
        await stream_all(r, client_id="fresh")
        asked = time.time()
        doc = await r.json("/v1/consumers")
        answered = time.time()
        consumers = {c["client_id"]: c for c in doc["consumers"]}
        assert consumers["fresh"]["lag_seconds"] == 0.0
        assert consumers["fresh"]["lag_scn"] == 0
        stale = consumers["stale"]
        assert stale["checkpoint_scn"] == scn_a and stale["lag_scn"] > 0
        # now - commit time of A: the binlog keeps whole seconds (floor), PostgreSQL
        # microseconds; the test's clock brackets the commit.
        low = asked - after_a - 0.01
        high = answered - math.floor(before_a) + 0.01
        assert low <= stale["lag_seconds"] <= high, (low, stale, high)
        samples = await metric_samples(r, "databus_relay_consumer_lag_seconds")
        assert samples[(BUFFER, "fresh", "anonymous")] == 0.0
        assert low <= samples[(BUFFER, "stale", "anonymous")] \
            <= time.time() - math.floor(before_a) + 0.01


def test_a_chained_relay_is_as_fresh_as_its_upstream_and_unknown_with_it(
        mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    """A chained relay (and so a cluster follower) between windows: its lag is its
    upstream's, known on an idle source, unknown when the upstream's is."""
    sql = fresh_database(mariadb_server, "lag_chain")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    try:
        with proxy_to(mariadb_server.host, mariadb_server.port) as proxy:
            uri = source_uri(mariadb_server, "lag_chain.t", heartbeat_ms=100).replace(
                f":{mariadb_server.port}/", f":{proxy.port}/")
            asyncio.run(_chained(uri, sql, proxy, tmp_path))
    finally:
        sql.close()


async def _chained(uri: str, sql: Any, proxy: PausableProxy, tmp_path: Path) -> None:
    async with relay_of(tmp_path / "up", uri) as up:
        await wait_lag(up, lambda lag: lag is not None, "the upstream's lag known")
        sql.run("INSERT INTO t VALUES (1, 1)")
        host = up.url.removeprefix("http://")
        chain = f"relay+http://{host}/?sources=lag_chain.t"
        async with relay_of(tmp_path / "down", chain) as down:
            await async_wait_until(
                lambda: down.relay.buffers[BUFFER].state().max_scn is not None,
                "the window copied downstream", 30)
            # Idle longer than the bound: known and bounded, from the upstream's status.
            started = time.monotonic()
            idle = []
            while time.monotonic() - started < IDLE_S:
                idle.append((await fetcher(down))["lag_seconds"])
                await asyncio.sleep(0.25)
            tail = idle[len(idle) // 2:]  # the first second may precede the first report
            assert all(lag is not None and lag <= 0.1 + SLACK_S + 1 for lag in tail), idle
            proxy.open.clear()
            try:
                await wait_lag(down, lambda lag: lag is None,
                               "the chained relay's lag unknown with its upstream's")
            finally:
                proxy.open.set()
            await wait_lag(down, lambda lag: lag is not None, "known again", timeout=60)
