"""Dumps of TxLog sources on a real PostgreSQL (issue 13, DESIGN 8.1, docs/dumps.md):
the PostgreSQL counterpart of tests/unit/test_txlog_dump.py (SQLite) and of
test_dump_binlog.py / test_dump_failures.py (MariaDB).

The tables (an int key, a text key, a composite key) are filled *before* ``databus
txlog install`` and before any relay, so only a dump can bring their rows; writers
commit random inserts, updates, deletes, re-keys and transactions that stay open a
while, aimed at the keys around the dump's cursor (behind and ahead of it). A consumer
view built by applying every event of the relay's stream in order must then equal the
source, row by row and by a checksum PostgreSQL computes on both.

1. a dump of every table while writing (HTTP API, ``databus dump setup``), with chunk
   windows larger than the relay's first slice of a response;
2. a transaction committed after a chunk's SELECT but numbered before its low
   watermark (SCNs are assigned after commit): why the relay waits for the low
   watermark before it selects, made deterministic by holding the assigners' lock;
3. ``databus relay`` killed (SIGKILL) between chunks and at a random moment, restarted
   on its data dir: the dump resumes after its last completed chunk;
4. no watermark table, and users who may not write it: clear errors; a user with
   exactly the documented grants can dump.

``DATABUS_DUMP_ROWS`` sets the table size (3,000 in ``make test``, 100,000 in
``make test-full``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg2
import psycopg2.errors
import psycopg2.extras
import pytest

from databus.cli import main as databus_main
from databus.event import DUMP_END_SOURCE_ID, DUMP_START_SOURCE_ID, Op, decode_event, iter_events
from databus.relay._server import FIRST_SLICE
from databus.schemas import AvroCodec, Schema
from tests.fixtures.servers import PostgresServer
from tests.integration.binlog_support import BUFFER
from tests.integration.test_dump_failures import (
    AUTH,
    Rec,
    RelayProc,
    Stream,
    start_dump,
    wait_dump,
    wait_finished,
    wait_running,
    wait_scn,
)
from tests.integration.test_txlog_postgres import Pg, fresh_database
from tests.relay_harness import relay_config, running_relay, stream_body_at
from tests.tiers import count

pytestmark = pytest.mark.integration

ROWS = count("DATABUS_DUMP_ROWS", smoke=3_000, full=100_000)
# The relay's buffer holds the whole dump and the writers' changes beside it.
STREAM_MB = 16 + ROWS // 500
TABLES = "items,tags,pairs"
ITEMS, TAGS, PAIRS = "public.items", "public.tags", "public.pairs"
DDL = {
    "items": "(id integer PRIMARY KEY, name text NOT NULL, qty integer, price numeric(10,2), "
             "seen timestamptz, note text)",
    "tags": "(word text PRIMARY KEY, n integer)",
    "pairs": "(a text NOT NULL, b integer NOT NULL, v text, PRIMARY KEY (a, b))",
}
KEYS = {"items": ("id",), "tags": ("word",), "pairs": ("a", "b")}
# What PostgreSQL hashes per table: every column, in key order.
CHECKSUM = {
    "items": ("format('%s|%s|%s|%s|%s|%s', id, name, qty, price, seen, note)", "id"),
    "tags": ("format('%s|%s', word, n)", "word"),
    "pairs": ("format('%s|%s|%s', a, b, v)", "a, b"),
}
Key = Any


# -- the source ---------------------------------------------------------------------------


def _source(server: PostgresServer, name: str, rows: int = ROWS) -> Pg:
    """A database whose tables hold rows older than the capture: items has the even ids
    0, 2, ... (odd ids are free for inserts behind and ahead of the cursor) and rows of
    about 200 bytes."""
    pg = fresh_database(server, name)
    pg.run(*(f"CREATE TABLE {table} {columns}" for table, columns in DDL.items()))
    pg.run(
        "INSERT INTO items (id, name, qty, price, seen, note) SELECT 2 * i, 'item' || i, "
        "i % 97, i + 0.25, timestamptz '2024-01-02 03:04:05.123456+00' + i * interval '1 ms', "
        f"repeat(chr(97 + i % 26), 150) FROM generate_series(0, {rows - 1}) i",
        "INSERT INTO tags (word, n) SELECT 'w' || lpad(i::text, 6, '0'), i "
        f"FROM generate_series(0, {rows // 2 - 1}) i",
        "INSERT INTO pairs (a, b, v) SELECT 'p' || (i % 5), i, 'v' || i "
        f"FROM generate_series(0, {rows // 2 - 1}) i",
    )
    pg.install(TABLES)
    return pg


def _dump_setup(uri: str, *extra: str) -> tuple[int, str]:
    """``databus dump setup --source URI [extra]``: exit status and stderr."""
    err = io.StringIO()
    with redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = databus_main(["dump", "setup", "--source", uri, *extra])
    return code, err.getvalue()


def _key(table: str, row: dict[str, Any]) -> Key:
    values = tuple(row[k] for k in KEYS[table])
    return values if len(values) > 1 else values[0]


def _source_rows(pg: Pg, table: str) -> dict[Key, dict[str, Any]]:
    return {_key(table, row): row for row in pg.rows(table)}


def _checksum(pg: Pg, table: str, schema: str = "public") -> tuple[int, str]:
    expr, order = CHECKSUM[table]
    ((count, digest),) = pg.query(f"SELECT count(*), md5(coalesce(string_agg({expr}, "
                                  f"chr(10) ORDER BY {order}), '')) FROM {schema}.{table}")
    return int(count), str(digest)


def _assert_replica_is_the_source(pg: Pg, stream: Stream, tables: list[str]) -> None:
    """Row by row in Python, then by PostgreSQL's checksum of the replica loaded into a
    scratch schema with the tables' own column types."""
    pg.run("DROP SCHEMA IF EXISTS replica CASCADE", "CREATE SCHEMA replica")
    for table in tables:
        replica = stream.replica(f"public.{table}")
        source = _source_rows(pg, table)
        assert replica.keys() == source.keys(), (
            f"{table}: missing {sorted(source.keys() - replica.keys())[:10]}, "
            f"extra {sorted(replica.keys() - source.keys())[:10]}")
        wrong = [k for k in source if replica[k] != source[k]]
        assert not wrong, [(k, replica[k], source[k]) for k in wrong[:5]]
        pg.run(f"CREATE TABLE replica.{table} {DDL[table]}")
        columns = list(next(iter(replica.values())).keys()) if replica else []
        if replica:
            with pg.conn.cursor() as cur:
                psycopg2.extras.execute_values(
                    cur, f"INSERT INTO replica.{table} ({', '.join(columns)}) VALUES %s",
                    [tuple(row[c] for c in columns) for row in replica.values()])
        assert _checksum(pg, table, "replica") == _checksum(pg, table), table


class Writer(threading.Thread):
    """Random small transactions over the three tables until stopped (a few hundred a
    second), half of them at the ``focus`` ids (around the dump's cursor in items).
    ``slow``: updates of the ids the dump reads next in transactions that stay open
    2-50 ms while others commit, so that they straddle a chunk's watermarks and
    SELECT (paper Figure 8)."""

    def __init__(self, pg: Pg, rows: int, *, seed: int, slow: bool = False) -> None:
        super().__init__(daemon=True)
        self.conn = pg.connect()
        with self.conn.cursor() as cur:
            cur.execute("SET deadlock_timeout = '50ms'")
        self.conn.commit()
        self.rows = rows
        self.slow = slow
        self.seed = seed
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        self.retried = 0
        self.error: BaseException | None = None
        self.focus: tuple[int, int] | None = None

    def _id(self) -> int:
        focus = self.focus
        if focus is not None and self.slow:  # the ids of the chunk read next
            return self.rng.randrange((focus[0] + focus[1]) // 2, focus[1])
        if focus is not None and self.rng.random() < 0.5:
            return self.rng.randrange(*focus)
        return self.rng.randrange(2 * self.rows + 400)

    def _statements(self, n: int) -> list[str]:
        rng, k, tag = self.rng, self._id(), f"{self.seed}-{n}"
        if self.slow:
            return [f"UPDATE items SET qty = qty + 1, name = 's{tag}' WHERE id = {k}"]
        word = f"w{rng.randrange(self.rows // 2 + 100):06d}"
        a, b = f"p{k % 5}", k // 2
        r = rng.random()
        if r < 0.25:
            return [f"UPDATE items SET qty = qty + 1, name = 'u{tag}', seen = clock_timestamp() "
                    f"WHERE id = {k}"]
        if r < 0.35:
            return [f"DELETE FROM items WHERE id = {k}"]
        if r < 0.47:  # odd ids: new keys behind and ahead of the cursor
            return [f"INSERT INTO items (id, name, qty, price) VALUES ({k | 1}, 'i{tag}', 1, "
                    f"9.99) ON CONFLICT (id) DO UPDATE SET name = 'again{tag}', "
                    "qty = items.qty + 1"]
        if r < 0.52:  # updated, then deleted, in one transaction
            return [f"UPDATE items SET name = 'gone{tag}' WHERE id = {k}",
                    f"DELETE FROM items WHERE id = {k}"]
        if r < 0.56:  # re-keyed behind every cursor, or ahead of it; even ids, unique
            # per n: the inserts above take odd ids only
            new = -2 * n if rng.random() < 0.5 else 10_000_000 + 2 * n
            return [f"UPDATE items SET id = {new} WHERE id = {k}"]
        if r < 0.68:
            return [f"INSERT INTO tags (word, n) VALUES ('{word}', 0) ON CONFLICT (word) "
                    "DO UPDATE SET n = tags.n + 1"]
        if r < 0.73:
            return [f"DELETE FROM tags WHERE word = '{word}'"]
        if r < 0.76:  # text keys before and after every existing one
            return [f"INSERT INTO tags (word, n) VALUES ('{rng.choice('az')}{tag}', {n})"]
        if r < 0.86:
            return [f"UPDATE pairs SET v = 'u{tag}' WHERE a = '{a}' AND b = {b}"]
        if r < 0.91:
            return [f"DELETE FROM pairs WHERE a = '{a}' AND b = {b}"]
        if r < 0.95:
            return [f"INSERT INTO pairs (a, b, v) VALUES ('{a}', {b}, 'i{tag}') "
                    "ON CONFLICT (a, b) DO UPDATE SET v = 'again'"]
        return [f"UPDATE items SET qty = qty - 1 WHERE id = {k}",  # all three tables
                f"UPDATE tags SET n = n - 1 WHERE word = '{word}'",
                f"UPDATE pairs SET v = 'm{tag}' WHERE a = '{a}' AND b = {b}"]

    def run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                n += 1
                try:
                    with self.conn.cursor() as cur:
                        for statement in self._statements(n):
                            cur.execute(statement)
                    if self.slow:
                        time.sleep(self.rng.uniform(0.002, 0.05))
                    self.conn.commit()
                    self.transactions += 1
                except psycopg2.errors.TransactionRollbackError:  # a deadlock: again
                    self.conn.rollback()
                    self.retried += 1
                time.sleep(0.002)
        except BaseException as exc:  # surfaced by finish()
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert not self.is_alive()
        assert self.error is None, repr(self.error)
        self.conn.close()


@contextmanager
def writing(pg: Pg, rows: int) -> Iterator[list[Writer]]:
    writers = [Writer(pg, rows, seed=1),
               *(Writer(pg, rows, seed=n, slow=True) for n in (2, 3, 4))]
    for writer in writers:
        writer.start()
    try:
        yield writers
    finally:
        for writer in writers:
            writer.stop.set()
            writer.join(30)


def follow_cursor(session: aiohttp.ClientSession, url: str, dump_id: str,
                  writers: list[Writer], span: int) -> asyncio.Task[None]:
    """Aim the writers at the ``span`` ids on either side of the items cursor (the slow
    ones at those after it: the chunk the dump reads next, if ``span`` is its size)."""

    async def follow() -> None:
        while True:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, AssertionError):
                async with session.get(f"{url}/v1/dumps/{dump_id}") as resp:
                    doc = await resp.json() if resp.status == 200 else None
                for table in (doc or {}).get("tables", []):
                    if table["source"] == ITEMS and table["cursor"]:
                        (cursor,) = table["cursor"]
                        for writer in writers:
                            writer.focus = (cursor - span, cursor + span)
            await asyncio.sleep(0.02)

    return asyncio.ensure_future(follow())


@dataclass
class PgStream(Stream):
    window_bytes: dict[int, int] = field(default_factory=dict)  # by SCN


async def read_stream(session: aiohttp.ClientSession, url: str) -> PgStream:
    """Every event the relay at ``url`` serves from its start, decoded with the schemas
    it serves (a TxLog delete carries the key only: its row is empty)."""
    body = await stream_body_at(session, url)
    stream = PgStream()
    async with session.get(url + "/v1/sources") as resp:
        stream.sources = {s["id"]: s["name"] for s in (await resp.json())["sources"]}
    codec = AvroCodec()
    for offset, header in iter_events(body):
        event = decode_event(body, offset)
        stream.window_bytes[header.scn] = (stream.window_bytes.get(header.scn, 0)
                                           + header.total_length)
        if header.source_id in (DUMP_START_SOURCE_ID, DUMP_END_SOURCE_ID):
            stream.markers.append((header.scn, header.source_id, json.loads(event.value)))
            continue
        if header.is_control:
            continue
        fp = header.schema_fingerprint
        if not codec.has(fp):
            async with session.get(f"{url}/v1/schemas/{fp:016x}") as resp:
                codec.add(Schema((await resp.json())["schema"]))
        delete = header.op is Op.DELETE
        key = event.key
        stream.records.append(Rec(
            scn=header.scn, source=stream.sources[header.source_id],
            op="delete" if delete else "upsert",
            key=tuple(key) if isinstance(key, list) else key,
            row={} if delete else codec.decode(event.value, fp),
            dumped=header.from_snapshot, fingerprint=fp))
    return stream


def _sentinel(pg: Pg) -> int:
    """One last transaction after everything else; its SCN once the fetcher numbered it."""
    with pg.conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO tags (word, n) VALUES ('zz-sentinel', 0) ON CONFLICT (word) "
                    "DO UPDATE SET n = tags.n + 1 RETURNING txid_current()")
        ((txid,),) = cur.fetchall()
        cur.execute("COMMIT")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ((scn,),) = pg.query(f"SELECT scn FROM databus_txlog WHERE txn = {txid}")
        if scn is not None:
            return int(scn)
        time.sleep(0.02)
    raise TimeoutError("the sentinel transaction never got an SCN (is the relay running?)")


def _chunks(doc: dict[str, Any]) -> int:
    return sum(t["chunks"] for t in doc["tables"])


def _assert_dump_windows_sound(stream: Stream, source: str) -> None:
    """Each dump window of ``source`` holds distinct keys in key order (one chunk)."""
    for scn, keys in stream.windows(source):
        assert len(set(keys)) == len(keys), f"{source} window {scn}: a key dumped twice"
        assert keys == sorted(keys), f"{source} window {scn}: rows out of key order"


# -- 1. a dump while writing -----------------------------------------------------------------


def test_dump_while_writing_equals_the_source(postgres_server: PostgresServer,
                                             tmp_path: Path) -> None:
    """``databus dump setup`` (twice, then ``--check``), a relay, writers, and a dump of
    every table of the buffer through ``POST /v1/admin/dumps``: the dump is done, each
    table framed by one start and one end marker, the watermark table never a source,
    and the replica of every event in stream order equals the source."""
    pg = _source(postgres_server, "txdump_acceptance")
    uri = pg.uri(TABLES)
    assert _dump_setup(uri)[0] == 0
    assert _dump_setup(uri)[0] == 0  # again: idempotent
    code, err = _dump_setup(uri, "--check")
    assert code == 0, err
    chunk_rows = max(50, ROWS // 8)
    config = relay_config(tmp_path, {BUFFER: uri}, capacity_mb=max(64, STREAM_MB))

    async def main() -> tuple[PgStream, dict[str, Any], list[str], list[Writer]]:
        async with running_relay(config) as r:
            s, url = r.session, r.url
            await wait_running(s, url)
            with writing(pg, ROWS) as writers:
                await asyncio.sleep(0.2)
                async with s.post(url + "/v1/admin/dumps", json={"chunk_rows": chunk_rows},
                                  headers=AUTH) as resp:
                    assert resp.status == 201, await resp.text()
                    dump = await resp.json()
                follower = follow_cursor(s, url, dump["id"], writers, 2 * chunk_rows)
                try:
                    doc = await wait_finished(s, url, dump["id"], timeout=120)
                finally:
                    follower.cancel()
                await asyncio.sleep(0.3)  # changes after the dump too
                for writer in writers:
                    writer.finish()
            await wait_scn(s, url, await asyncio.to_thread(_sentinel, pg))
            listed = [x["name"] for x in (await r.json("/v1/sources"))["sources"]]
            return await read_stream(s, url), doc, listed, writers

    stream, doc, listed, writers = asyncio.run(main())
    assert doc["state"] == "done", doc
    assert sorted(doc["sources"]) == sorted([ITEMS, TAGS, PAIRS])
    assert all(t["state"] == "done" and t["error"] is None for t in doc["tables"]), doc
    assert doc["progress"]["percent"] == 100.0
    assert writers[0].transactions > 100 and writers[1].transactions > 5
    # The watermark table is never a source, and its rows never events.
    assert sorted(listed) == sorted([ITEMS, TAGS, PAIRS]), listed
    assert {r.source for r in stream.records} <= {ITEMS, TAGS, PAIRS}
    # Every row that existed before the capture came through the dump (less those the
    # writers deleted or changed first: rows of the three tables add up to 2 * ROWS).
    flagged = [r for r in stream.records if r.dumped]
    assert len(flagged) >= ROWS
    assert len(flagged) == doc["progress"]["rows"]
    # Chunk windows of items span several slices of a response (the relay serves the
    # rest of a window from a checkpoint inside it): still one start marker per table.
    assert max(stream.window_bytes[scn] for scn, _ in stream.windows(ITEMS)) > FIRST_SLICE
    for source in (ITEMS, TAGS, PAIRS):
        _assert_dump_windows_sound(stream, source)
        (start,) = [d for d in stream.marker_docs(DUMP_START_SOURCE_ID) if d["source"] == source]
        (end,) = [d for d in stream.marker_docs(DUMP_END_SOURCE_ID) if d["source"] == source]
        assert start["dump"] == end["dump"] == doc["id"]
        assert end["rows"] == len(stream.dumped(source))
        (table,) = [t for t in doc["tables"] if t["source"] == source]
        assert table["rows"] == end["rows"]
    _assert_replica_is_the_source(pg, stream, ["items", "tags", "pairs"])
    pg.conn.close()


# -- 2. numbered after commit -----------------------------------------------------------------


def test_a_transaction_committed_after_the_select_but_numbered_before_the_low_watermark(
        postgres_server: PostgresServer, tmp_path: Path) -> None:
    """T updates a row of the first chunk and stays open; the dump writes its low
    watermark L (a later txid). While the test holds the assigners' lock, L gets no SCN;
    T commits; the lock goes; one assignment numbers T and L in txid order: T before L,
    so T's event is not between the watermarks and cannot drop the row from the chunk.
    The relay selects only once the fetcher read L, so its SELECT sees T; a relay that
    selected right after writing L (as DBLog does) would emit the row as it was before
    T, after T's event: the replica would keep the old row."""
    pg = _source(postgres_server, "txdump_numbered", rows=200)
    uri = pg.uri(TABLES)
    assert _dump_setup(uri)[0] == 0
    config = relay_config(tmp_path, {BUFFER: uri})

    async def main() -> tuple[PgStream, dict[str, Any]]:
        async with running_relay(config) as r:
            s, url = r.session, r.url
            await wait_running(s, url)
            t = pg.connect()
            lock = pg.connect()
            try:
                with t.cursor() as cur:
                    cur.execute("UPDATE items SET name = 'by T', qty = -1 WHERE id = 2")
                with lock.cursor() as cur:
                    cur.execute("SELECT last_scn FROM databus_txlog_state WHERE id = 1 "
                                "FOR UPDATE")
                dump = await start_dump(s, url, [ITEMS], chunk_rows=1000, delay_ms=0)
                deadline = time.monotonic() + 10
                while not pg.query("SELECT 1 FROM databus_watermark"):  # L committed
                    assert time.monotonic() < deadline, "no low watermark"
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.3)  # time for a SELECT that does not wait for L
                t.commit()
                lock.commit()
            finally:
                t.close()
                lock.close()
            doc = await wait_finished(s, url, dump["id"], timeout=30)
            await wait_scn(s, url, await asyncio.to_thread(_sentinel, pg))
            return await read_stream(s, url), doc

    stream, doc = asyncio.run(main())
    assert doc["state"] == "done", doc
    ((t_scn,),) = [(r.scn,) for r in stream.logged(ITEMS) if r.key == 2]
    (dumped,) = [r for r in stream.dumped(ITEMS) if r.key == 2]
    assert t_scn < dumped.scn  # T's event came first: the dumped row must hold T
    assert (dumped.row["name"], dumped.row["qty"]) == ("by T", -1)
    _assert_replica_is_the_source(pg, stream, ["items"])
    pg.conn.close()


# -- 3. the relay killed in the middle of a dump --------------------------------------------


def test_relay_killed_during_the_dump_resumes_after_the_last_chunk(
        postgres_server: PostgresServer, tmp_path: Path) -> None:
    """SIGKILL between two chunks (in the delay after a chunk completed), then at a
    random moment, restarting on the same data dir each time: the dump resumes after
    the last chunk ``dumps.json`` recorded (never from the start), and the replica of
    the dumped tables equals the source."""
    pg = _source(postgres_server, "txdump_kill")
    uri = pg.uri(TABLES)
    assert _dump_setup(uri)[0] == 0
    chunk_rows = max(20, ROWS // 10)
    relay = RelayProc(tmp_path, uri, capacity_mb=STREAM_MB)
    rng = random.Random(int(os.environ.get("DATABUS_TEST_SEED", "0")) or None)
    saved: list[dict[str, Any]] = []  # the tables as dumps.json had them after each kill

    def kill(dump_id: str) -> None:
        relay.kill()
        record = relay.saved(dump_id)
        assert record["state"] == "running", record
        saved.extend(t for t in record["tables"] if t["cursor"] is not None)

    async def main() -> tuple[PgStream, dict[str, Any]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            relay.start()
            try:
                await wait_running(s, relay.url)
                with writing(pg, ROWS) as writers:
                    dump = await start_dump(s, relay.url, [ITEMS, PAIRS],
                                            chunk_rows=chunk_rows, delay_ms=80)
                    dump_id = dump["id"]
                    follower = follow_cursor(s, relay.url, dump_id, writers,
                                             2 * chunk_rows)
                    # Between chunks: right after one completed, in the delay.
                    doc = await wait_dump(s, relay.url, dump_id, lambda d: _chunks(d) >= 2,
                                          what="2 chunks")
                    seen = _chunks(doc)
                    await wait_dump(s, relay.url, dump_id, lambda d: _chunks(d) > seen,
                                    what="one more chunk", every=0.002)
                    kill(dump_id)
                    (between,) = [t for t in saved if t["source"] == ITEMS]
                    assert between["chunks"] == seen + 1 and between["state"] == "running"
                    relay.start()
                    await wait_dump(s, relay.url, dump_id,
                                    lambda d: _chunks(d) >= seen + 3,
                                    what="2 chunks after the restart")
                    # At a random moment (maybe in the middle of a chunk).
                    await asyncio.sleep(rng.uniform(0.0, 0.3))
                    async with s.get(f"{relay.url}/v1/dumps/{dump_id}") as resp:
                        state = (await resp.json())["state"]
                    if state == "running":
                        kill(dump_id)
                        relay.start()
                    doc = await wait_finished(s, relay.url, dump_id, timeout=120)
                    follower.cancel()
                    await asyncio.sleep(0.2)
                    for writer in writers:
                        writer.finish()
                    assert writers[0].transactions > 100
                await wait_scn(s, relay.url, await asyncio.to_thread(_sentinel, pg))
                return await read_stream(s, relay.url), doc
            finally:
                relay.stop()

    stream, doc = asyncio.run(main())
    assert doc["state"] == "done", doc
    assert relay.kills >= 1 and saved
    _assert_replica_is_the_source(pg, stream, ["items", "pairs"])
    # Each restart resumed after the last chunk dumps.json had: the dump windows of that
    # table after that chunk's window hold only keys after its cursor.
    for table in saved:
        source = table["source"]
        cursor = table["cursor"]
        after = cursor[0] if len(cursor) == 1 else tuple(cursor)
        later = [keys for scn, keys in stream.windows(source) if scn > table["last_scn"]]
        if table["state"] == "running":
            assert later, table
        assert all(k > after for keys in later for k in keys), (table, later[0][:5])
    # Nothing was dumped twice but (at most) one chunk per kill that landed before
    # dumps.json recorded it.
    for source in (ITEMS, PAIRS):
        windows = stream.windows(source)
        repeated = [scn for i, (scn, keys) in enumerate(windows)
                    if set(keys) & {k for _, ks in windows[i + 1:] for k in ks}]
        assert len(repeated) <= relay.kills, (source, repeated)
    pg.conn.close()


# -- 4. setup errors and grants --------------------------------------------------------------


async def _dump_once(uri: str, tmp_path: Path, sources: list[str]) -> dict[str, Any]:
    config = relay_config(tmp_path, {BUFFER: uri})
    async with running_relay(config) as r:
        await wait_running(r.session, r.url)
        dump = await start_dump(r.session, r.url, sources, chunk_rows=100, delay_ms=0)
        return await wait_finished(r.session, r.url, dump["id"], timeout=60)


def test_a_dump_without_setup_names_databus_dump_setup(postgres_server: PostgresServer,
                                                       tmp_path: Path) -> None:
    """No watermark table: ``setup --check`` and the dump (GET /v1/dumps) say to run
    ``databus dump setup``; after the setup a dump on the same relay (its fetcher
    started before the table existed) works."""
    pg = _source(postgres_server, "txdump_nosetup", rows=300)
    uri = pg.uri(TABLES)
    code, err = _dump_setup(uri, "--check")
    assert code == 1 and "databus dump setup" in err and "databus_watermark" in err, err

    async def main() -> tuple[dict[str, Any], dict[str, Any], PgStream]:
        config = relay_config(tmp_path, {BUFFER: uri})
        async with running_relay(config) as r:
            s, url = r.session, r.url
            await wait_running(s, url)
            dump = await start_dump(s, url, [ITEMS], chunk_rows=100, delay_ms=0)
            failed = await wait_finished(s, url, dump["id"], timeout=30)
            assert (await asyncio.to_thread(_dump_setup, uri))[0] == 0
            started = time.monotonic()
            dump = await start_dump(s, url, [ITEMS], chunk_rows=100, delay_ms=0)
            done = await wait_finished(s, url, dump["id"], timeout=60)
            assert time.monotonic() - started < 20, "the watermark table was found late"
            await wait_scn(s, url, await asyncio.to_thread(_sentinel, pg))
            return failed, done, await read_stream(s, url)

    failed, done, stream = asyncio.run(main())
    assert failed["state"] == "failed", failed
    assert "databus dump setup" in failed["error"], failed
    assert "databus_watermark" in failed["error"], failed
    assert done["state"] == "done" and done["tables"][0]["rows"] == 300, done
    assert stream.replica(ITEMS) == _source_rows(pg, "items")
    pg.conn.close()


def _role(pg: Pg, name: str, *grants: str) -> str:
    """A login role (trust auth: no password) with ``grants``; the URI as that role."""
    pg.run(f"DROP ROLE IF EXISTS {name}", f"CREATE ROLE {name} LOGIN",
           *(f"GRANT {g} TO {name}" for g in grants))
    user = pg.server.user
    return pg.uri(TABLES).replace(f"://{user}@", f"://{name}@", 1)


# What the fetcher's user needs (docs/txlog-fetcher.md: it assigns SCNs).
FETCHER_GRANTS = ("SELECT ON ALL TABLES IN SCHEMA public",
                  "UPDATE ON databus_txlog, databus_txlog_state")


def test_a_user_who_may_not_write_the_watermark_table_is_told_the_grant(
        postgres_server: PostgresServer, tmp_path: Path) -> None:
    """The relay's user has the fetcher's grants (given before the watermark table
    existed, so nothing on it) and its relay runs when an administrator runs ``databus
    dump setup``: the fetcher goes on capturing (before the fix it adopted the table
    and stopped for good on "permission denied"); ``setup --check`` and a dump name the
    GRANT on the watermark table."""
    pg = _source(postgres_server, "txdump_grant", rows=300)
    uri = _role(pg, "dump_reader", *FETCHER_GRANTS)
    grant = 'GRANT SELECT, INSERT, DELETE ON "public"."databus_watermark"'

    async def main() -> tuple[dict[str, Any], dict[str, Any], PgStream]:
        async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
            s, url = r.session, r.url
            await wait_running(s, url)
            assert (await asyncio.to_thread(_dump_setup, pg.uri(TABLES)))[0] == 0
            await asyncio.sleep(1.5)  # the fetcher looks for the table once a second
            pg.txn("UPDATE items SET qty = -5 WHERE id = 4")
            await wait_scn(s, url, await asyncio.to_thread(_sentinel, pg))
            code, err = await asyncio.to_thread(_dump_setup, uri, "--check")
            assert code == 1 and grant in err, err
            dump = await start_dump(s, url, [ITEMS], chunk_rows=100, delay_ms=0)
            doc = await wait_finished(s, url, dump["id"], timeout=30)
            pg.txn("UPDATE items SET qty = -6 WHERE id = 6")
            await wait_scn(s, url, await asyncio.to_thread(_sentinel, pg))
            status = (await r.json("/v1/status"))["buffers"][BUFFER]["fetcher"]
            return doc, status, await read_stream(s, url)

    doc, status, stream = asyncio.run(main())
    assert doc["state"] == "failed", doc
    assert grant in doc["error"], doc
    assert "permission denied" not in doc["error"], doc
    assert doc["tables"][0]["rows"] == 0
    assert status["state"] == "running" and status["restarts"] == 0, status
    assert [(r.key, r.row["qty"]) for r in stream.of(ITEMS)] == [(4, -5), (6, -6)]
    pg.conn.close()


def test_the_documented_grants_are_enough_to_dump(postgres_server: PostgresServer,
                                                 tmp_path: Path) -> None:
    """The watermark writes go through the watermark table's capture triggers, which
    run as the relay's user and write the TxLog and the delete log: without INSERT on
    those, ``setup --check`` names that grant (before the fix it passed, and every dump
    then failed with "permission denied for table databus_txlog"); with the grants
    docs/txlog-fetcher.md lists, the user dumps."""
    pg = _source(postgres_server, "txdump_grants_ok", rows=300)
    assert _dump_setup(pg.uri(TABLES))[0] == 0
    uri = _role(pg, "dump_writer", *FETCHER_GRANTS, "INSERT, DELETE ON databus_watermark")
    code, err = _dump_setup(uri, "--check")
    assert code == 1, err
    assert ('GRANT INSERT ON "public"."databus_txlog", '
            '"public"."databus_deleted_databus_watermark"') in err, err
    assert "GRANT SELECT, INSERT, DELETE" not in err, err
    pg.run("GRANT INSERT ON databus_txlog, databus_deleted_databus_watermark TO dump_writer")
    code, err = _dump_setup(uri, "--check")
    assert code == 0, err
    doc = asyncio.run(_dump_once(uri, tmp_path, [ITEMS, PAIRS]))
    assert doc["state"] == "done", doc
    assert [t["rows"] for t in doc["tables"]] == [300, 150]
    pg.conn.close()
