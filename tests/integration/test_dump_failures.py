"""The failure cases of dumps (issue 13, DESIGN 8.1, docs/dumps.md), each against the
real MariaDB through a real relay, most of them with a writer changing the table the
whole time; the check is always the replica a consumer builds from every window, by key,
against the source table.

1. ``databus relay`` killed with SIGKILL between chunks, in the middle of a chunk (its
   SELECT in flight; its rows in the buffer but not yet in ``dumps.json``) and at a
   random moment, restarted on the same data dir each time;
2. a dump cancelled and started again, a second dump of a table refused, pause/resume,
   and pause or cancel while a chunk's rows are being written into the buffer;
3. a column added to a table during its dump, a table dropped during its dump;
4. keys inserted behind and ahead of the dump's cursor;
5. the dump's connection killed in the middle of a chunk ``SELECT`` (retried with
   backoff, the retry visible in ``/v1/dumps``);
6. the source restarted during a dump;
7. two relays on one source while one of them dumps; the watermark table is never
   listed as a source, also by a relay whose ``tables=`` pattern matches it.

``DATABUS_DUMP_ROWS`` sets the table size (3000 by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pymysql
import pytest

from databus.event import (
    DUMP_END_SOURCE_ID,
    DUMP_START_SOURCE_ID,
    Op,
    decode_event,
    iter_events,
)
from databus.fetchers.mysql import BinlogSourceConfig
from databus.fetchers.mysql._dump import setup_statements
from databus.schemas import AvroCodec, Schema
from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import BUFFER, Sql, binlog_relay, fresh_database, source_uri
from tests.relay_harness import ADMIN_TOKEN, free_port, start_databus, stream_body_at
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

ROWS = int(os.environ.get("DATABUS_DUMP_ROWS", "3000"))
# A relay buffer that keeps every window of a test (they read the whole stream back).
STREAM_MB = 16 + ROWS // 500
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
Key = Any


# -- the source ---------------------------------------------------------------------------


def _setup(server: MariaDBServer, db: str, rows: int = ROWS, *, step: int = 1,
           table: str = "items") -> Sql:
    """Database ``db`` with its watermark table and ``table`` holding ``rows`` rows with
    ids 0, step, 2*step, ..."""
    sql = fresh_database(server, db)
    config = BinlogSourceConfig.from_uri(_uri(server, db, table))
    sql.run(*setup_statements(config))
    _create(sql, table, rows, step=step)
    return sql


def _create(sql: Sql, table: str, rows: int, *, step: int = 1) -> None:
    sql.run(f"CREATE TABLE {table} (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL, "
            "qty INT NOT NULL, price DECIMAL(10,2))")
    for start in range(0, rows, 1000):
        values = ", ".join(f"({i * step}, 'item{i}', {i % 97}, {i}.25)"
                           for i in range(start, min(rows, start + 1000)))
        sql.run(f"INSERT INTO {table} (id, name, qty, price) VALUES {values}")


def _uri(server: MariaDBServer, db: str, tables: str = "items") -> str:
    """The relay's source: ``tables`` of ``db`` (comma-separated, or ``*``), and a
    watermark table of the test's own."""
    names = ",".join(f"{db}.{t}" for t in tables.split(","))
    return source_uri(server, names, watermark_table=f"{db}.databus_watermark")


def _source_rows(sql: Sql, table: str = "items") -> dict[Key, tuple[Any, ...]]:
    return {r[0]: (r[1], r[2], r[3])
            for r in sql.query(f"SELECT id, name, qty, price FROM {table}")}


def _admin(server: MariaDBServer) -> pymysql.Connection[Any]:
    return pymysql.connect(autocommit=True, **server.root_connect_kwargs())


class Writer(threading.Thread):
    """Random updates, deletes, inserts and replaces of ``db.items`` in small
    transactions until stopped; survives a source restart (reconnects)."""

    def __init__(self, server: MariaDBServer, db: str, keys: int, *, seed: int = 13) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.db = db
        self.keys = keys
        self.sql: Sql | None = Sql(server, db)
        self.stop = threading.Event()
        self.transactions = 0
        self.lost_connections = 0
        self.error: BaseException | None = None
        self.rng = random.Random(seed)
        # Keys [lo, hi) to change half of the time: the chunk the dump reads next, so
        # that its rows change between its SELECT and its high watermark.
        self.focus: tuple[int, int] | None = None

    def _statements(self, n: int) -> list[str]:
        r = self.rng.random()
        focus = self.focus
        if focus is not None and self.rng.random() < 0.5:
            key = self.rng.randrange(*focus)
        else:
            key = self.rng.randrange(self.keys)
        if r < 0.5:
            return [f"UPDATE items SET qty = qty + 1, name = 'u{n}' WHERE id = {key}"]
        if r < 0.7:
            return [f"DELETE FROM items WHERE id = {key}"]
        if r < 0.85:
            return [f"INSERT INTO items (id, name, qty, price) VALUES ({10_000_000 + n}, "
                    "'new', 1, 9.99) ON DUPLICATE KEY UPDATE name = 'again'"]
        return [f"REPLACE INTO items (id, name, qty, price) VALUES ({key}, 'replaced', 2, 1.5)"]

    def run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    if self.sql is None:
                        self.sql = Sql(self.server, self.db)
                    self.sql.txn(*self._statements(n))
                    self.transactions += 1
                except (pymysql.err.OperationalError, pymysql.err.InterfaceError):
                    # The source restarting: whatever committed is in the source and in
                    # the log; the comparison at the end is with the source as it is.
                    self.lost_connections += 1
                    if self.sql is not None:
                        with contextlib.suppress(Exception):  # a dead connection
                            self.sql.close()
                        self.sql = None
                    self.stop.wait(0.1)
                    continue
                time.sleep(0.001)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert not self.is_alive()
        assert self.error is None, self.error
        if self.sql is not None:
            self.sql.close()


@contextmanager
def writing(server: MariaDBServer, db: str, keys: int, *, seed: int = 13) -> Iterator[Writer]:
    writer = Writer(server, db, keys, seed=seed)
    writer.start()
    try:
        yield writer
    finally:
        writer.stop.set()
        writer.join(30)


def follow_cursor(session: aiohttp.ClientSession, url: str, dump_id: str, writer: Writer,
                  span: int) -> asyncio.Task[None]:
    """Point ``writer`` at the ``span`` keys after the dump's cursor while the dump runs
    (until the task is cancelled)."""

    async def follow() -> None:
        while True:
            try:
                doc = await _get(session, f"{url}/v1/dumps/{dump_id}")
            except (TimeoutError, aiohttp.ClientError, AssertionError):
                doc = None  # the relay restarting
            if doc is not None:
                cursors = [t["cursor"] for t in doc["tables"] if t["state"] == "running"]
                if cursors and cursors[0] is not None:
                    writer.focus = (cursors[0][0] + 1, cursors[0][0] + 1 + span)
            await asyncio.sleep(0.02)

    return asyncio.ensure_future(follow())


# -- the relay's HTTP side ---------------------------------------------------------------


@dataclass
class Rec:
    """One data event of a stream, decoded."""

    scn: int
    source: str
    op: str  # "upsert" | "delete"
    key: Key
    row: dict[str, Any]
    dumped: bool
    fingerprint: int


@dataclass
class Stream:
    records: list[Rec] = field(default_factory=list)
    markers: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)  # scn, id, doc
    sources: dict[int, str] = field(default_factory=dict)

    def of(self, source: str) -> list[Rec]:
        return [r for r in self.records if r.source == source]

    def dumped(self, source: str) -> list[Rec]:
        return [r for r in self.records if r.source == source and r.dumped]

    def logged(self, source: str) -> list[Rec]:
        return [r for r in self.records if r.source == source and not r.dumped]

    def replica(self, source: str) -> dict[Key, dict[str, Any]]:
        """What a consumer applying every window in order has of ``source``."""
        out: dict[Key, dict[str, Any]] = {}
        for rec in self.of(source):
            if rec.op == "delete":
                out.pop(rec.key, None)
            else:
                out[rec.key] = rec.row
        return out

    def windows(self, source: str) -> list[tuple[int, list[Key]]]:
        """The dump windows of ``source`` in stream order: (SCN, dumped keys in order)."""
        out: list[tuple[int, list[Key]]] = []
        for rec in self.dumped(source):
            if not out or out[-1][0] != rec.scn:
                out.append((rec.scn, []))
            out[-1][1].append(rec.key)
        return out

    def marker_docs(self, source_id: int) -> list[dict[str, Any]]:
        return [doc for _, sid, doc in self.markers if sid == source_id]


def _values(replica: dict[Key, dict[str, Any]]) -> dict[Key, tuple[Any, ...]]:
    return {k: (v["name"], v["qty"], v["price"]) for k, v in replica.items()}


async def _get(session: aiohttp.ClientSession, url: str, **params: str) -> Any:
    async with session.get(url, params=params) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any] | None = None
                ) -> tuple[int, Any]:
    async with session.post(url, json=body or {}, headers=AUTH) as resp:
        return resp.status, await resp.json()


async def read_stream(session: aiohttp.ClientSession, url: str) -> Stream:
    """Every window the relay at ``url`` serves, decoded (schemas fetched by fingerprint)."""
    body = await stream_body_at(session, url)
    stream = Stream()
    stream.sources = {s["id"]: s["name"]
                      for s in (await _get(session, url + "/v1/sources"))["sources"]}
    codec = AvroCodec()
    for offset, header in iter_events(body):
        event = decode_event(body, offset)
        if header.source_id in (DUMP_START_SOURCE_ID, DUMP_END_SOURCE_ID):
            stream.markers.append((header.scn, header.source_id, json.loads(event.value)))
            continue
        if header.is_control:
            continue
        fp = header.schema_fingerprint
        if not codec.has(fp):
            doc = await _get(session, f"{url}/v1/schemas/{fp:016x}")
            codec.add(Schema(doc["schema"]))
        key = event.key
        stream.records.append(Rec(
            scn=header.scn, source=stream.sources[header.source_id],
            op="delete" if header.op is Op.DELETE else "upsert",
            key=tuple(key) if isinstance(key, list) else key,
            row=codec.decode(event.value, fp), dumped=header.from_snapshot, fingerprint=fp))
    return stream


async def start_dump(session: aiohttp.ClientSession, url: str, sources: list[str], *,
                     chunk_rows: int, delay_ms: int, parallelism: int = 1) -> dict[str, Any]:
    status, doc = await _post(session, url + "/v1/admin/dumps",
                              {"sources": sources, "chunk_rows": chunk_rows,
                               "delay_ms": delay_ms, "parallelism": parallelism})
    assert status == 201, doc
    return doc  # type: ignore[no-any-return]


async def wait_dump(session: aiohttp.ClientSession, url: str, dump_id: str,
                    check: Callable[[dict[str, Any]], bool], *, what: str,
                    timeout: float = 60, every: float = 0.02) -> dict[str, Any]:
    """Until ``check`` holds of the dump's document, polled every ``every`` s (tests
    that kill a relay mid-dump must see the chunk counts move); a dump that ended first
    fails at once."""

    async def reached() -> dict[str, Any] | None:
        doc = await _get(session, f"{url}/v1/dumps/{dump_id}")
        if check(doc):
            return doc
        if doc["state"] in ("done", "failed", "cancelled") and what != "finished":
            raise AssertionError(f"dump {dump_id} ended before {what}: {doc}")
        return None

    done: dict[str, Any] = await async_wait_until(
        reached, f"dump {dump_id}: {what}", timeout, interval=every, max_interval=every)
    return done


async def wait_finished(session: aiohttp.ClientSession, url: str, dump_id: str,
                        timeout: float = 60) -> dict[str, Any]:
    return await wait_dump(session, url, dump_id,
                           lambda d: d["state"] in ("done", "failed", "cancelled"),
                           what="finished", timeout=timeout)


def _chunks(doc: dict[str, Any], source: str | None = None) -> int:
    return sum(t["chunks"] for t in doc["tables"] if source is None or t["source"] == source)


async def wait_scn(session: aiohttp.ClientSession, url: str, scn: int,
                   timeout: float = 30) -> None:
    """Until the relay's buffer holds the window of ``scn``."""

    async def reached() -> bool:
        doc = (await _get(session, url + "/v1/status"))["buffers"][BUFFER]
        return (doc["max_scn"] or 0) >= scn

    await async_wait_until(reached, f"the buffer at SCN {scn}", timeout, max_interval=0.05)


async def wait_running(session: aiohttp.ClientSession, url: str, timeout: float = 30) -> None:
    async def running() -> bool:
        doc = (await _get(session, url + "/v1/status"))["buffers"][BUFFER]["fetcher"]
        return bool(doc["state"] == "running" and doc["source_scn"] is not None)

    await async_wait_until(running, "the fetcher running", timeout, max_interval=0.05)


def _sentinel(sql: Sql) -> int:
    """A last change of ``items`` after everything else: its SCN (wait for it)."""
    return sql.txn("INSERT INTO items (id, name, qty, price) VALUES (-1, 'sentinel', 0, 0) "
                   "ON DUPLICATE KEY UPDATE qty = qty + 1")


def _assert_dump_windows_sound(stream: Stream, source: str) -> None:
    """Each dump window holds distinct keys in key order (one chunk)."""
    for scn, keys in stream.windows(source):
        assert keys == sorted(keys), f"window {scn}: chunk rows out of key order"
        assert len(set(keys)) == len(keys), f"window {scn}: a key dumped twice"


@pytest.fixture(params=[1, 4], ids=["one-reader", "4-readers-ranges"])
def parallelism(request: pytest.FixtureRequest) -> int:
    """The dump's readers: one chunk at a time, or four readers over key ranges of the
    table (the tests' tables are many chunks long, so they are split)."""
    return int(request.param)


# -- a ``databus relay`` process ----------------------------------------------------------


class RelayProc:
    """``databus relay --config FILE`` with an admin token, one buffer (``BUFFER``)."""

    def __init__(self, tmp_path: Path, uri: str, capacity_mb: int = STREAM_MB) -> None:
        self.port = free_port()
        self.data_dir = tmp_path / "relay"
        self.config_path = tmp_path / "relay.toml"
        self.config_path.write_text("\n".join([
            "[relay]",
            f'data_dir = "{self.data_dir}"',
            f"port = {self.port}",
            f'admin_token = "{ADMIN_TOKEN}"',
            "[[relay.buffers]]",
            f'name = "{BUFFER}"',
            f"capacity_mb = {capacity_mb}",
            f'source = "{uri}"',
        ]) + "\n")
        self.log_path = tmp_path / "relay.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = start_databus(["relay", "--config", str(self.config_path)], self.port,
                                  self.log_path)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=20)
        self.proc = None
        self.kills += 1

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def saved(self, dump_id: str) -> dict[str, Any]:
        """The dump as ``dumps.json`` holds it (read while the relay is down)."""
        data = json.loads((self.data_dir / "dumps.json").read_text("utf-8"))
        (record,) = [d for d in data["dumps"] if d["id"] == dump_id]
        return record  # type: ignore[no-any-return]


async def _stop_after_a_landed_chunk(s: aiohttp.ClientSession, relay: RelayProc,
                                     dump_id: str, attempts: int = 30) -> int:
    """Freeze the relay (SIGSTOP) as soon as a dump window reaches its stream; keep it
    frozen if ``dumps.json`` does not record that chunk yet (the engine saves right
    after the window landed), else let it go on and wait for the next one. The SCN of
    that window."""
    assert relay.proc is not None
    cp: str | None = None
    catching_up = True
    deadline = time.monotonic() + 60
    while attempts and time.monotonic() < deadline:
        params = {"max_bytes": str(64 << 20)}
        if not catching_up:
            params["wait_ms"] = "2000"
        if cp is not None:
            params["checkpoint"] = cp
        async with s.get(relay.url + "/v1/stream", params=params) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.read()
            cp = resp.headers["X-Databus-Checkpoint"]
        if catching_up:  # what is there already does not count
            catching_up = bool(body)
            continue
        scns = [h.scn for _, h in iter_events(body) if h.source_id >= 0 and h.from_snapshot]
        if not scns:
            continue
        relay.proc.send_signal(signal.SIGSTOP)
        table = relay.saved(dump_id)["tables"][0]
        if table["last_scn"] is not None and table["last_scn"] < scns[-1]:
            return scns[-1]
        relay.proc.send_signal(signal.SIGCONT)
        attempts -= 1
    raise AssertionError("never caught a chunk between its rows landing and dumps.json")


@asynccontextmanager
async def _session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def _processlist_select(admin: pymysql.Connection[Any], db: str, table: str,
                        timeout: float = 20, *, many: bool = False) -> int:
    """The id of the connection whose chunk ``SELECT`` of ``db.table`` waits for the
    table's metadata lock (which the test holds); ``many``: one of several readers'."""
    pattern = f"SELECT %FROM `{db}`.`{table}`%"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with admin.cursor() as cur:
            cur.execute("SELECT ID, STATE FROM information_schema.PROCESSLIST WHERE "
                        "INFO LIKE %s AND ID <> CONNECTION_ID()", (pattern,))
            rows = cur.fetchall()
        waiting = [r[0] for r in rows if "metadata lock" in (r[1] or "")]
        if waiting:
            assert len(waiting) == 1 or many, rows
            return int(waiting[0])
        time.sleep(0.01)
    raise TimeoutError(f"no chunk SELECT of {db}.{table} waits for its lock")


# -- 1. kill -9 of the relay ----------------------------------------------------------------


def test_relay_killed_between_and_in_the_middle_of_chunks_resumes_the_dump(
        mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    """SIGKILL between two chunks, while a chunk's SELECT is in flight, after a chunk's
    rows landed but before ``dumps.json`` recorded it, and at a random moment; each
    restart on the same data dir resumes after the last completed chunk that
    ``dumps.json`` recorded, and a writer runs the whole time: the replica built from
    every window equals the source, and rows come twice only as a whole chunk repeated
    in a later window."""
    db = "dfail_kill"
    source = f"{db}.items"
    # Its own size: the kills aim at moments a few milliseconds long, which chunks of
    # another size make rarer (the size of the data is test_dump_acceptance's concern).
    rows = 3000
    sql = _setup(mariadb_server, db, rows)
    chunk_rows = rows // 20
    relay = RelayProc(tmp_path, _uri(mariadb_server, db))
    rng = random.Random(int(os.environ.get("DATABUS_TEST_SEED", "0")) or None)
    saved: list[dict[str, Any]] = []  # the table's record in dumps.json after each kill
    landed: list[int] = []  # the SCN of the chunk whose rows landed before dumps.json had it

    def table_saved(dump_id: str) -> dict[str, Any]:
        record = relay.saved(dump_id)
        assert record["state"] == "running", record
        (table,) = record["tables"]
        saved.append(table)
        return table  # type: ignore[no-any-return]

    async def main() -> Stream:
        async with _session() as s:
            relay.start()
            try:
                await wait_running(s, relay.url)
                with writing(mariadb_server, db, rows + 200) as writer:
                    dump = await start_dump(s, relay.url, [source], chunk_rows=chunk_rows,
                                            delay_ms=150)
                    dump_id = dump["id"]
                    follower = follow_cursor(s, relay.url, dump_id, writer, chunk_rows)
                    # Between chunks: right after a chunk was recorded, in the delay.
                    doc = await wait_dump(s, relay.url, dump_id, lambda d: _chunks(d) >= 2,
                                          what="2 chunks")
                    seen = _chunks(doc)
                    await wait_dump(s, relay.url, dump_id, lambda d: _chunks(d) > seen,
                                    what="one more chunk", every=0.002)
                    relay.kill()
                    between = table_saved(dump_id)
                    assert between["chunks"] == seen + 1  # nothing after the one we saw
                    assert between["cursor"] is not None and between["state"] == "running"
                    relay.start()
                    await wait_dump(s, relay.url, dump_id,
                                    lambda d: _chunks(d) >= between["chunks"] + 2,
                                    what="2 chunks after the restart")
                    # In the middle of a chunk: its low watermark is through, its SELECT
                    # waits for the lock the test holds on the table.
                    admin = _admin(mariadb_server)
                    try:
                        with admin.cursor() as cur:
                            cur.execute(f"LOCK TABLES `{db}`.`items` WRITE")
                        await asyncio.to_thread(_processlist_select, admin, db, "items")
                        relay.kill()
                        with admin.cursor() as cur:
                            cur.execute("UNLOCK TABLES")
                    finally:
                        admin.close()
                    middle = table_saved(dump_id)
                    assert middle["chunks"] >= between["chunks"] + 2
                    relay.start()
                    # In the middle of a chunk: its rows are in the buffer, dumps.json
                    # does not have it yet.
                    landed.append(await _stop_after_a_landed_chunk(s, relay, dump_id))
                    relay.kill()
                    table_saved(dump_id)
                    relay.start()
                    # At a random moment.
                    await asyncio.sleep(rng.uniform(0.05, 0.5))
                    doc = await _get(s, f"{relay.url}/v1/dumps/{dump_id}")
                    if doc["state"] == "running":
                        relay.kill()
                        table_saved(dump_id)
                        relay.start()
                    doc = await wait_finished(s, relay.url, dump_id)
                    follower.cancel()
                    assert doc["state"] == "done", doc
                    assert doc["tables"][0]["chunks"] >= saved[-1]["chunks"]
                    await asyncio.sleep(0.2)
                writer.finish()
                assert writer.transactions > 100
                await wait_scn(s, relay.url, _sentinel(sql))
                return await read_stream(s, relay.url)
            finally:
                relay.stop()

    stream = asyncio.run(main())
    assert relay.kills >= 3 and len(landed) == 1
    # The replica is the source.
    assert _values(stream.replica(source)) == _source_rows(sql)
    _assert_dump_windows_sound(stream, source)
    windows = stream.windows(source)
    # Each restart resumed after the last chunk dumps.json had: the dump windows after
    # that chunk's window hold only keys after its cursor.
    for table in saved:
        cursor = table["cursor"][0]
        later = [keys for scn, keys in windows if scn > table["last_scn"]]
        assert later, table
        assert all(k > cursor for keys in later for k in keys), (table, later[0][:5])
    # A chunk whose rows landed before the kill but which dumps.json did not record yet
    # comes again, whole, in a later window; no other rows come twice.
    logged_after: dict[Key, int] = {}
    for rec in stream.logged(source):
        logged_after[rec.key] = rec.scn  # the last log event of each key
    repeated: list[tuple[int, list[Key]]] = []
    for i, (scn, keys) in enumerate(windows):
        later_keys = {k for _, ks in windows[i + 1:] for k in ks}
        if later_keys & set(keys):
            repeated.append((scn, keys))
            # Whole: each of its rows is dumped again later or the log overtook it.
            for key in keys:
                assert key in later_keys or logged_after.get(key, 0) > scn, (scn, key)
    assert len(repeated) <= relay.kills, [scn for scn, _ in repeated]
    assert landed[0] in [scn for scn, _ in repeated], (landed, [scn for scn, _ in repeated])
    # The end marker counts the rows of the recorded chunks; the flagged rows in the
    # stream are those plus the repeated windows'.
    # A marker travels in its chunk's window: it comes again only with a repeated
    # first or last chunk.
    starts = stream.marker_docs(DUMP_START_SOURCE_ID)
    ends = stream.marker_docs(DUMP_END_SOURCE_ID)
    assert 1 <= len(starts) <= 1 + relay.kills and 1 <= len(ends) <= 1 + relay.kills
    start, end = starts[-1], ends[-1]
    assert start["source"] == end["source"] == source
    flagged = len(stream.dumped(source))
    assert flagged == end["rows"] + sum(len(keys) for _, keys in repeated)
    assert end["rows"] >= rows // 2
    sql.close()


# -- 2. cancel, conflict, pause ---------------------------------------------------------------


def test_a_cancelled_dump_started_again_finishes(mariadb_server: MariaDBServer,
                                                 tmp_path: Path, parallelism: int) -> None:
    db = "dfail_cancel" + ("" if parallelism == 1 else f"_p{parallelism}")
    source = f"{db}.items"
    sql = _setup(mariadb_server, db)
    chunk_rows = max(20, ROWS // 20)

    async def main() -> tuple[Stream, str, str]:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db)) as r:
            s, url = r.session, r.url
            with writing(mariadb_server, db, ROWS + 200) as writer:
                first = await start_dump(s, url, [source], chunk_rows=chunk_rows, delay_ms=50,
                                         parallelism=parallelism)
                follower = follow_cursor(s, url, first["id"], writer, chunk_rows)
                await wait_dump(s, url, first["id"], lambda d: _chunks(d) >= 2, what="2 chunks")
                status, doc = await _post(s, f"{url}/v1/admin/dumps/{first['id']}/cancel")
                assert status == 200 and doc["state"] == "cancelled", doc
                # Cancel abandons the chunk in flight: no row of it reaches the buffer.
                await asyncio.sleep(0.3)
                before = len((await read_stream(s, url)).dumped(source))
                rows = (await _get(s, f"{url}/v1/dumps/{first['id']}"))["progress"]["rows"]
                await asyncio.sleep(0.5)
                assert len((await read_stream(s, url)).dumped(source)) == before == rows
                assert 0 < rows < ROWS
                # Cancelling it again, or resuming it, is a conflict.
                status, doc = await _post(s, f"{url}/v1/admin/dumps/{first['id']}/cancel")
                assert status == 409 and doc["error"] == "conflict", doc
                status, doc = await _post(s, f"{url}/v1/admin/dumps/{first['id']}/resume")
                assert status == 409 and doc["error"] == "conflict", doc
                follower.cancel()
                second = await start_dump(s, url, [source], chunk_rows=chunk_rows, delay_ms=0,
                                          parallelism=parallelism)
                assert second["id"] != first["id"]
                follower = follow_cursor(s, url, second["id"], writer, chunk_rows)
                doc = await wait_finished(s, url, second["id"])
                follower.cancel()
                assert doc["state"] == "done", doc
                assert (await _get(s, f"{url}/v1/dumps/{first['id']}"))["state"] == "cancelled"
                await asyncio.sleep(0.2)
            writer.finish()
            assert writer.transactions > 50
            await wait_scn(s, url, _sentinel(sql))
            return await read_stream(s, url), first["id"], second["id"]

    stream, first_id, second_id = asyncio.run(main())
    assert _values(stream.replica(source)) == _source_rows(sql)
    _assert_dump_windows_sound(stream, source)
    # The cancelled dump ended "cancelled" before the second one started; the second
    # one ended done (its end marker as it always was: no outcome field).
    starts = [d["dump"] for d in stream.marker_docs(DUMP_START_SOURCE_ID)]
    ends = [(d["dump"], d.get("outcome")) for d in stream.marker_docs(DUMP_END_SOURCE_ID)]
    assert starts == [first_id, second_id]
    assert ends == [(first_id, "cancelled"), (second_id, None)]
    scns = {(sid, d["dump"]): scn for scn, sid, d in stream.markers}
    assert scns[(DUMP_END_SOURCE_ID, first_id)] <= scns[(DUMP_START_SOURCE_ID, second_id)]
    sql.close()


def test_a_second_dump_of_a_table_is_a_conflict(mariadb_server: MariaDBServer,
                                                tmp_path: Path) -> None:
    db = "dfail_conflict"
    sql = _setup(mariadb_server, db, 400)
    _create(sql, "other", 50)
    items, other = f"{db}.items", f"{db}.other"

    async def main() -> None:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db, "items,other")) as r:
            s, url = r.session, r.url
            first = await start_dump(s, url, [items], chunk_rows=20, delay_ms=100)
            for body in ({"sources": [items]}, {"sources": [other, items]}, {}):
                status, doc = await _post(s, url + "/v1/admin/dumps", body)
                assert status == 409 and doc["error"] == "conflict", (body, doc)
                assert doc["message"], doc
            # Paused, it still holds its tables.
            status, doc = await _post(s, f"{url}/v1/admin/dumps/{first['id']}/pause")
            assert status == 200 and doc["state"] == "paused", doc
            status, doc = await _post(s, url + "/v1/admin/dumps", {"sources": [items]})
            assert status == 409 and doc["error"] == "conflict", doc
            # Another table of the buffer is queued behind it, not refused.
            status, queued = await _post(s, url + "/v1/admin/dumps", {"sources": [other]})
            assert status == 201 and queued["state"] == "queued", queued
            doc = await wait_finished(s, url, queued["id"])
            assert doc["state"] == "done" and doc["progress"]["rows"] == 50, doc
            status, doc = await _post(s, f"{url}/v1/admin/dumps/{first['id']}/resume")
            assert status == 200, doc
            doc = await wait_finished(s, url, first["id"])
            assert doc["state"] == "done" and doc["progress"]["rows"] == 400, doc
            # Once it is done, the table can be dumped again.
            again = await start_dump(s, url, [items], chunk_rows=1000, delay_ms=0)
            assert (await wait_finished(s, url, again["id"]))["state"] == "done"
            dumps = (await _get(s, url + "/v1/dumps"))["dumps"]
            assert [d["id"] for d in dumps] == [first["id"], queued["id"], again["id"]]

    asyncio.run(main())
    sql.close()


async def _settled(session: aiohttp.ClientSession, url: str, dump_id: str) -> dict[str, Any]:
    """The paused dump's document once its rows stopped moving (two polls 0.3 s apart
    agree): chunks in flight when the pause came have landed or were abandoned."""
    previous = None
    for _ in range(50):
        doc = await _get(session, f"{url}/v1/dumps/{dump_id}")
        if previous is not None and doc["progress"]["rows"] == previous:
            return doc  # type: ignore[no-any-return]
        previous = doc["progress"]["rows"]
        await asyncio.sleep(0.3)
    raise AssertionError(f"dump {dump_id} still moves while paused: {doc}")


def test_pause_stops_the_rows_and_resume_finishes(mariadb_server: MariaDBServer,
                                                  tmp_path: Path, parallelism: int) -> None:
    db = "dfail_pause" + ("" if parallelism == 1 else f"_p{parallelism}")
    source = f"{db}.items"
    sql = _setup(mariadb_server, db)
    chunk_rows = max(20, ROWS // 20)

    async def main() -> Stream:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db)) as r:
            s, url = r.session, r.url
            with writing(mariadb_server, db, ROWS + 200) as writer:
                dump = await start_dump(s, url, [source], chunk_rows=chunk_rows, delay_ms=50,
                                        parallelism=parallelism)
                dump_id = dump["id"]
                follower = follow_cursor(s, url, dump_id, writer, chunk_rows)
                await wait_dump(s, url, dump_id, lambda d: _chunks(d) >= 2, what="2 chunks")
                status, doc = await _post(s, f"{url}/v1/admin/dumps/{dump_id}/pause")
                assert status == 200 and doc["state"] == "paused", doc
                status, doc = await _post(s, f"{url}/v1/admin/dumps/{dump_id}/pause")
                assert status == 409, doc
                # The chunks in flight (one per reader) are abandoned or land.
                doc = await _settled(s, url, dump_id)
                stream = await read_stream(s, url)
                rows, flagged, logged = (doc["progress"]["rows"], len(stream.dumped(source)),
                                         len(stream.logged(source)))
                assert doc["state"] == "paused" and 0 < rows < ROWS and flagged == rows
                await asyncio.sleep(1.0)
                doc = await _get(s, f"{url}/v1/dumps/{dump_id}")
                stream = await read_stream(s, url)
                # Paused: no dumped row, while the log goes on.
                assert doc["state"] == "paused" and doc["progress"]["rows"] == rows, doc
                assert len(stream.dumped(source)) == flagged
                assert len(stream.logged(source)) > logged
                status, doc = await _post(s, f"{url}/v1/admin/dumps/{dump_id}/resume")
                assert status == 200 and doc["state"] == "running", doc
                doc = await wait_finished(s, url, dump_id)
                follower.cancel()
                assert doc["state"] == "done" and doc["progress"]["rows"] > rows, doc
                assert doc["progress"]["percent"] == 100.0
                await asyncio.sleep(0.2)
            writer.finish()
            await wait_scn(s, url, _sentinel(sql))
            return await read_stream(s, url)

    stream = asyncio.run(main())
    assert _values(stream.replica(source)) == _source_rows(sql)
    _assert_dump_windows_sound(stream, source)
    # Resumed after its last chunk: no key dumped twice.
    keys = [r.key for r in stream.dumped(source)]
    assert len(keys) == len(set(keys))
    assert len(stream.marker_docs(DUMP_START_SOURCE_ID)) == 1
    assert len(stream.marker_docs(DUMP_END_SOURCE_ID)) == 1
    sql.close()


@pytest.mark.parametrize("action", ["cancel", "pause"])
def test_pause_or_cancel_while_a_chunk_lands(mariadb_server: MariaDBServer, tmp_path: Path,
                                             parallelism: int,
                                             action: str) -> None:
    """The request comes while the fetcher thread writes a chunk's rows into the high
    watermark's window (held there by the test): either the chunk is abandoned and
    none of its rows reach the buffer, or it lands and is counted, never rows in the
    stream that the dump does not count (which a resumed dump would read again)."""
    db = f"dfail_race_{action}"
    source = f"{db}.items"
    sql = _setup(mariadb_server, db, 600)
    entered, release = threading.Event(), threading.Event()

    async def main() -> tuple[Stream, dict[str, Any]]:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db)) as r:
            s, url = r.session, r.url
            sink = r.relay.fetchers.dump_ports()[BUFFER].sink
            emit_rows = sink._emit_rows
            calls = 0

            def held(*args: Any) -> int:
                nonlocal calls
                calls += 1
                emitted = emit_rows(*args)
                if calls == 2:  # the second chunk's rows are in the open window
                    entered.set()
                    release.wait(10)
                return emitted

            sink._emit_rows = held  # type: ignore[method-assign,assignment]
            dump = await start_dump(s, url, [source], chunk_rows=100, delay_ms=0,
                                    parallelism=parallelism)
            assert await asyncio.to_thread(entered.wait, 10)
            request = asyncio.ensure_future(
                _post(s, f"{url}/v1/admin/dumps/{dump['id']}/{action}"))
            await asyncio.sleep(0.5)  # the engine sees the request, if it can
            release.set()
            status, doc = await request
            assert status == 200, doc
            await asyncio.sleep(0.5)
            if action == "pause":
                status, doc = await _post(s, f"{url}/v1/admin/dumps/{dump['id']}/resume")
                assert status == 200, doc
                doc = await wait_finished(s, url, dump["id"])
                assert doc["state"] == "done", doc
            doc = await _get(s, f"{url}/v1/dumps/{dump['id']}")
            return await read_stream(s, url), doc

    stream, doc = asyncio.run(main())
    keys = [r.key for r in stream.dumped(source)]
    assert len(keys) == len(set(keys)), "rows of an abandoned chunk reached the stream"
    assert len(keys) == doc["progress"]["rows"], doc
    if action == "pause":
        assert sorted(keys) == sorted(_source_rows(sql))
    sql.close()


# -- 3. the table changes under the dump ---------------------------------------------------------


def test_a_column_added_during_the_dump(mariadb_server: MariaDBServer, tmp_path: Path,
                                        parallelism: int) -> None:
    """ALTER TABLE ADD COLUMN between chunks: the following chunks carry the new schema
    version (the one the binlog's rows have after the ALTER), the earlier ones the old."""
    db = "dfail_alter" + ("" if parallelism == 1 else f"_p{parallelism}")
    source = f"{db}.items"
    sql = _setup(mariadb_server, db)
    chunk_rows = max(20, ROWS // 20)

    async def main() -> tuple[Stream, int, int]:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db)) as r:
            s, url = r.session, r.url
            with writing(mariadb_server, db, ROWS + 200) as writer:
                dump = await start_dump(s, url, [source], chunk_rows=chunk_rows, delay_ms=50,
                                        parallelism=parallelism)
                follower = follow_cursor(s, url, dump["id"], writer, chunk_rows)
                await wait_dump(s, url, dump["id"], lambda d: _chunks(d) >= 3, what="3 chunks")
                admin = Sql(mariadb_server, db)
                before = admin.position()
                admin.run("ALTER TABLE items ADD COLUMN note VARCHAR(20) NOT NULL DEFAULT 'n'")
                after = admin.position()
                admin.close()
                doc = await wait_finished(s, url, dump["id"])
                follower.cancel()
                assert doc["state"] == "done", doc
                await asyncio.sleep(0.2)
            writer.finish()
            sql.run("UPDATE items SET note = CONCAT('x', id) WHERE id % 7 = 0")
            await wait_scn(s, url, _sentinel(sql))
            return await read_stream(s, url), before, after

    stream, before, after = asyncio.run(main())
    dumped = stream.dumped(source)
    old_fp = {r.fingerprint for r in stream.of(source) if r.scn < before}
    new_fp = {r.fingerprint for r in stream.logged(source) if r.scn > after}
    assert len(old_fp) == 1 and len(new_fp) == 1 and old_fp != new_fp
    # Chunks before the ALTER have the old version, every later one the new: the schema
    # of the rows changes once, in SCN order, to the version the log has.
    versions = [r.fingerprint for r in dumped]
    if parallelism == 1:
        switch = versions.index(next(iter(new_fp)))
        assert set(versions[:switch]) == old_fp and set(versions[switch:]) == new_fp
        assert 0 < switch < len(versions)
        assert all("note" in r.row for r in dumped[switch:])
        assert all("note" not in r.row for r in dumped[:switch])
    else:
        # Several readers: a chunk read before the ALTER can land after another
        # reader's chunk read after it (docs/dumps.md); each row has the version it was
        # read with.
        assert set(versions) == old_fp | new_fp
        assert all(("note" in r.row) == (r.fingerprint in new_fp) for r in dumped)
    # By key, the replica is the source; the new column is right wherever the replica's
    # row has it (rows dumped or logged before the ALTER and never changed after lack it).
    replica = stream.replica(source)
    assert _values(replica) == _source_rows(sql)
    notes = {r[0]: r[1] for r in sql.query("SELECT id, note FROM items")}
    with_note = {k: v["note"] for k, v in replica.items() if "note" in v}
    assert len(with_note) > ROWS // 4
    assert with_note == {k: notes[k] for k in with_note}
    sql.close()


def test_a_table_dropped_during_its_dump_fails_alone(mariadb_server: MariaDBServer,
                                                     tmp_path: Path, parallelism: int) -> None:
    db = "dfail_drop" + ("" if parallelism == 1 else f"_p{parallelism}")
    sql = _setup(mariadb_server, db, 1000, table="gone")
    _create(sql, "kept", 300)
    gone, kept = f"{db}.gone", f"{db}.kept"

    async def main() -> tuple[Stream, dict[str, Any]]:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db, "gone,kept")) as r:
            s, url = r.session, r.url
            dump = await start_dump(s, url, [gone, kept], chunk_rows=50, delay_ms=50,
                                    parallelism=parallelism)
            await wait_dump(s, url, dump["id"], lambda d: _chunks(d, gone) >= 2,
                            what="2 chunks of the first table")
            sql.run("DROP TABLE gone")
            doc = await wait_finished(s, url, dump["id"])
            sql.run("UPDATE kept SET qty = qty + 1 WHERE id = 1")
            await wait_scn(s, url, sql.position())
            return await read_stream(s, url), doc

    stream, doc = asyncio.run(main())
    tables = {t["source"]: t for t in doc["tables"]}
    assert doc["state"] == "failed" and gone in doc["error"] and kept not in doc["error"], doc
    assert tables[gone]["state"] == "failed", tables
    assert "dropped" in tables[gone]["error"], tables[gone]
    assert 0 < tables[gone]["rows"] < 1000
    assert tables[kept]["state"] == "done" and tables[kept]["rows"] == 300, tables
    assert tables[kept]["error"] is None
    assert _values(stream.replica(kept)) == _source_rows(sql, "kept")
    # The dropped table's dump ended "failed" (with the rows it had emitted); the
    # other's ended done.
    assert [d["source"] for d in stream.marker_docs(DUMP_START_SOURCE_ID)] == [gone, kept]
    failed, done = stream.marker_docs(DUMP_END_SOURCE_ID)
    assert failed == {"dump": doc["id"], "source": gone, "rows": tables[gone]["rows"],
                      "outcome": "failed"}
    assert done == {"dump": doc["id"], "source": kept, "rows": 300}
    sql.close()


# -- 4. keys inserted behind and ahead of the cursor -------------------------------------------


def _one_done_one_untouched(doc: dict[str, Any]) -> bool:
    ranges = doc["tables"][0]["ranges"] or []
    return (any(r["done"] for r in ranges)
            and any(r["cursor"] is None and not r["done"] and r["lo"] is not None
                    for r in ranges[len(ranges) // 2:]))


def _odd_after(lo: list[int] | None) -> int:
    """The first odd id after a range's start (ids in the table are even)."""
    first = -1 if lo is None else lo[0]
    return first + 1 if first % 2 == 0 else first + 2


def test_keys_inserted_behind_and_ahead_of_the_cursor(mariadb_server: MariaDBServer,
                                                      tmp_path: Path, parallelism: int) -> None:
    """Even ids only; during the dump an odd id below the cursor (the dump will not read
    it: the log brings it) and one above it (the log brings it, the dump reads it
    again later), both updated once more: both are in the replica as the source has
    them."""
    db = "dfail_cursor" + ("" if parallelism == 1 else f"_p{parallelism}")
    source = f"{db}.items"
    sql = _setup(mariadb_server, db, step=2)
    chunk_rows = max(20, ROWS // 20)

    async def main() -> tuple[Stream, Key, Key]:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db)) as r:
            s, url = r.session, r.url
            dump = await start_dump(s, url, [source], chunk_rows=chunk_rows, delay_ms=50,
                                    parallelism=parallelism)
            if parallelism == 1:
                doc = await wait_dump(s, url, dump["id"], lambda d: _chunks(d) >= 3,
                                      what="3 chunks")
                (cursor,) = doc["tables"][0]["cursor"]
                behind, ahead = cursor - 3, cursor + 2 * 3 * chunk_rows + 1
                assert ahead < 2 * ROWS - 2 * chunk_rows  # not in the last chunk
            else:
                # Key ranges: behind = in a range already read, ahead = in a range no
                # reader has started.
                doc = await wait_dump(s, url, dump["id"], _one_done_one_untouched,
                                      what="a range done and one not started")
                ranges = doc["tables"][0]["ranges"]
                done = next(r for r in ranges if r["done"])
                fresh = next(r for r in reversed(ranges) if r["cursor"] is None
                             and not r["done"] and r["lo"] is not None)
                behind = _odd_after(done["lo"])
                ahead = _odd_after(fresh["lo"])
                assert behind <= (done["hi"] or [2 * ROWS])[0]
                assert ahead <= (fresh["hi"] or [2 * ROWS])[0]
            sql.txn(f"INSERT INTO items (id, name, qty, price) VALUES ({behind}, 'behind', 1, "
                    f"1.00), ({ahead}, 'ahead', 2, 2.00)")
            sql.txn(f"UPDATE items SET qty = qty + 10 WHERE id IN ({behind}, {ahead})")
            doc = await wait_finished(s, url, dump["id"])
            assert doc["state"] == "done", doc
            await wait_scn(s, url, _sentinel(sql))
            return await read_stream(s, url), behind, ahead

    stream, behind, ahead = asyncio.run(main())
    replica = _values(stream.replica(source))
    assert replica == _source_rows(sql)
    assert replica[behind] == ("behind", 11, 1) and replica[ahead] == ("ahead", 12, 2)
    dumped = {r.key for r in stream.dumped(source)}
    logged = [r.key for r in stream.logged(source)]
    assert behind not in dumped and logged.count(behind) == 2
    assert ahead in dumped and logged.count(ahead) == 2
    # The row the dump read holds the state after both changes.
    (row,) = [r.row for r in stream.dumped(source) if r.key == ahead]
    assert (row["name"], row["qty"]) == ("ahead", 12)
    sql.close()


# -- 5. the chunk SELECT fails ------------------------------------------------------------------


def test_a_killed_dump_connection_is_retried_with_backoff(
        mariadb_server: MariaDBServer, tmp_path: Path,
        parallelism: int, caplog: pytest.LogCaptureFixture) -> None:
    """KILL CONNECTION of the dump's connection while its chunk SELECT runs (held on the
    table's lock by the test), twice: the dump goes on after 0.5 s and then 1 s, shows
    the retry in /v1/dumps meanwhile, and finishes with every row."""
    db = "dfail_select" + ("" if parallelism == 1 else f"_p{parallelism}")
    source = f"{db}.items"
    sql = _setup(mariadb_server, db)
    chunk_rows = max(20, ROWS // 20)

    async def main() -> tuple[Stream, list[dict[str, Any]]]:
        seen: list[dict[str, Any]] = []
        async with binlog_relay(tmp_path, _uri(mariadb_server, db)) as r:
            s, url = r.session, r.url
            with writing(mariadb_server, db, ROWS + 200) as writer:
                dump = await start_dump(s, url, [source], chunk_rows=chunk_rows, delay_ms=20,
                                        parallelism=parallelism)
                dump_id = dump["id"]
                follower = follow_cursor(s, url, dump_id, writer, chunk_rows)
                await wait_dump(s, url, dump_id, lambda d: _chunks(d) >= 2, what="2 chunks")
                admin = _admin(mariadb_server)
                try:
                    with admin.cursor() as cur:
                        cur.execute(f"LOCK TABLES `{db}`.`items` WRITE")
                    # One reader: killed twice, its backoff doubles. Several: each has
                    # its own backoff, so one kill (a second might hit another reader).
                    for backoff in ("0.5", "1.0")[:1 if parallelism > 1 else 2]:
                        conn_id = await asyncio.to_thread(_processlist_select, admin, db,
                                                          "items", many=parallelism > 1)
                        chunks = _chunks(await _get(s, f"{url}/v1/dumps/{dump_id}"))
                        with admin.cursor() as cur:
                            cur.execute(f"KILL CONNECTION {conn_id}")
                        retrying = f"trying again in {backoff} s"
                        doc = await wait_dump(s, url, dump_id,
                                              lambda d: retrying in (d["error"] or ""),  # noqa: B023
                                              what="the retry in its state", every=0.01)
                        seen.append(doc)
                        # No chunk was lost; a reader's chunk ahead of the failed one
                        # (its rows on their way into the buffer) may still land.
                        assert doc["state"] == "running", doc
                        assert chunks <= _chunks(doc) <= chunks + parallelism, doc
                    with admin.cursor() as cur:
                        cur.execute("UNLOCK TABLES")
                finally:
                    admin.close()
                doc = await wait_finished(s, url, dump_id)
                follower.cancel()
                assert doc["state"] == "done" and doc["error"] is None, doc
                await asyncio.sleep(0.2)
            writer.finish()
            await wait_scn(s, url, _sentinel(sql))
            return await read_stream(s, url), seen

    with caplog.at_level(logging.WARNING, logger="databus.relay.dumps"):
        stream, seen = asyncio.run(main())
    backoffs = ("0.5", "1.0")[:1 if parallelism > 1 else 2]
    for doc, backoff in zip(seen, backoffs, strict=True):
        assert f"trying again in {backoff} s" in doc["error"], doc["error"]
        assert "lost or no connection" in doc["error"], doc["error"]
    retries = [m.rsplit("trying again in ", 1)[1] for m in caplog.messages
               if "trying again" in m]
    assert retries == [f"{b} s" for b in backoffs]
    assert _values(stream.replica(source)) == _source_rows(sql)
    _assert_dump_windows_sound(stream, source)
    keys = [r.key for r in stream.dumped(source)]
    assert len(keys) == len(set(keys))  # the abandoned chunk was never emitted
    sql.close()


# -- 6. the source restarts -------------------------------------------------------------------


def test_a_source_restart_during_the_dump(mariadb_server: MariaDBServer,
                                          tmp_path: Path, parallelism: int) -> None:
    """The session MariaDB killed and started again (crash recovery) in the middle of a
    dump: the fetcher reconnects, the dump goes on after its last chunk and finishes,
    and the replica is the source, writer included."""
    db = "dfail_restart" + ("" if parallelism == 1 else f"_p{parallelism}")
    source = f"{db}.items"
    sql = _setup(mariadb_server, db)
    sql.close()
    chunk_rows = max(20, ROWS // 20)

    async def main() -> tuple[Stream, int]:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db)) as r:
            s, url = r.session, r.url
            with writing(mariadb_server, db, ROWS + 200) as writer:
                dump = await start_dump(s, url, [source], chunk_rows=chunk_rows, delay_ms=30,
                                        parallelism=parallelism)
                follower = follow_cursor(s, url, dump["id"], writer, chunk_rows)
                doc = await wait_dump(s, url, dump["id"], lambda d: _chunks(d) >= 3,
                                      what="3 chunks")
                # From this thread, not a worker's: the server dies with the thread that
                # started it (PR_SET_PDEATHSIG). It blocks the relay's HTTP side for the
                # restart only; its fetcher and dump threads go on.
                try:
                    mariadb_server.restart(crash=True)
                finally:
                    if not mariadb_server.running:
                        mariadb_server.start()
                doc = await wait_finished(s, url, dump["id"])
                follower.cancel()
                assert doc["state"] == "done", doc
                await asyncio.sleep(0.2)
            writer.finish()
            assert writer.lost_connections > 0 and writer.transactions > 50
            status = (await _get(s, url + "/v1/status"))["buffers"][BUFFER]["fetcher"]
            assert status["restarts"] >= 1 and status["state"] == "running", status
            after = Sql(mariadb_server, db)
            await wait_scn(s, url, _sentinel(after))
            after.close()
            return await read_stream(s, url), status["restarts"]

    stream, _ = asyncio.run(main())
    sql = Sql(mariadb_server, db)
    assert _values(stream.replica(source)) == _source_rows(sql)
    _assert_dump_windows_sound(stream, source)
    assert len(stream.marker_docs(DUMP_END_SOURCE_ID)) == 1
    sql.close()


# -- 7. two relays on one source ---------------------------------------------------------------


def test_two_relays_on_one_source_while_one_dumps(mariadb_server: MariaDBServer,
                                                  tmp_path: Path, parallelism: int) -> None:
    """Both relays capture every table of the database, the watermark table included by
    their pattern: the one that does not dump never serves a watermark row, a dumped
    row or a marker, and its windows are exactly the other's logged ones."""
    db = "dfail_two" + ("" if parallelism == 1 else f"_p{parallelism}")
    source = f"{db}.items"
    sql = _setup(mariadb_server, db)
    chunk_rows = max(20, ROWS // 20)
    watermark = f"{db}.databus_watermark"

    async def main() -> tuple[Stream, Stream, list[str]]:
        async with binlog_relay(tmp_path / "a", _uri(mariadb_server, db, "*")) as a, \
                binlog_relay(tmp_path / "b", _uri(mariadb_server, db, "*")) as b:
            with writing(mariadb_server, db, ROWS + 200) as writer:
                dump = await start_dump(a.session, a.url, [], chunk_rows=chunk_rows,
                                        delay_ms=10, parallelism=parallelism)
                follower = follow_cursor(a.session, a.url, dump["id"], writer, chunk_rows)
                doc = await wait_finished(a.session, a.url, dump["id"])
                follower.cancel()
                assert doc["state"] == "done", doc
                assert doc["sources"] == [source], doc  # every table but the watermarks
                assert (await _get(b.session, b.url + "/v1/dumps"))["dumps"] == []
                await asyncio.sleep(0.2)
            writer.finish()
            scn = _sentinel(sql)
            await wait_scn(a.session, a.url, scn)
            await wait_scn(b.session, b.url, scn)
            b_sources = [x["name"] for x in
                         (await _get(b.session, b.url + "/v1/sources"))["sources"]]
            return (await read_stream(a.session, a.url), await read_stream(b.session, b.url),
                    b_sources)

    a, b, b_sources = asyncio.run(main())
    assert _values(a.replica(source)) == _source_rows(sql)
    assert len(a.marker_docs(DUMP_START_SOURCE_ID)) == len(a.marker_docs(DUMP_END_SOURCE_ID)) == 1
    assert len(a.dumped(source)) >= ROWS // 2
    # b: no watermark row, no dumped row, no marker (a: no watermark row either).
    assert {r.source for r in b.records} == {r.source for r in a.records} == {source}
    assert watermark not in b_sources  # matched by the pattern, never a source
    assert not [r for r in b.records if r.dumped] and not b.markers
    # b's windows are a's without the dump: the same changes at the same SCNs.
    def changes(stream: Stream) -> list[tuple[int, str, Key, dict[str, Any]]]:
        return [(r.scn, r.op, r.key, r.row) for r in stream.logged(source)]
    assert changes(b) == changes(a) and len(changes(b)) > 50
    sql.close()


def test_the_watermark_table_is_not_a_source(mariadb_server: MariaDBServer,
                                             tmp_path: Path) -> None:
    db = "dfail_listed"
    sql = _setup(mariadb_server, db, 10)

    async def main() -> list[str]:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db, "*")) as r:
            sql.run("CREATE TABLE later (id INT PRIMARY KEY)")  # DDL: discover_new_tables
            await wait_scn(r.session, r.url, _sentinel(sql))
            doc = await _get(r.session, r.url + "/v1/sources")
            return [x["name"] for x in doc["sources"]]

    names = asyncio.run(main())
    assert f"{db}.items" in names
    assert f"{db}.databus_watermark" not in names, names
    sql.close()
