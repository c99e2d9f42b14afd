"""Dumps of TxLog sources on SQLite (no server needed): setup, checks, chunks by int,
string and composite keys encoded as the fetcher encodes rows, watermark rows never
events, and a dump while a writer runs that a consumer applies into the source's state
(issue 13; PostgreSQL: tests/integration/test_txlog_dump_postgres.py)."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from databus.errors import DumpSetupError
from databus.event import decode_event, iter_events
from databus.fetchers._api import FetcherContext
from databus.fetchers.txlog import SqliteTxlogFetcher
from databus.relay._catalog import RelayCatalog
from databus.relay.dumps import DumpRequest
from tests.relay_harness import RunningRelay, relay_config, running_relay, stream_body
from tests.tiers import count
from tests.unit.test_txlog_support import BUFFER, SqliteSource, cli

ROWS = count("DATABUS_DUMP_ROWS", smoke=3_000, full=100_000)
DDL = (
    "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, qty INTEGER)",
    "CREATE TABLE tags (word TEXT PRIMARY KEY, n INTEGER)",
    "CREATE TABLE pairs (a TEXT NOT NULL, b INTEGER NOT NULL, v TEXT, PRIMARY KEY (a, b))",
)
TABLES = "items,tags,pairs"


def _source(tmp_path: Path, rows: int = 50) -> SqliteSource:
    db = SqliteSource(tmp_path / "shop.db", *DDL)
    db.run("BEGIN")
    db.conn.executemany("INSERT INTO items VALUES (?, ?, ?)",
                        [(i, f"item{i}", i % 7) for i in range(rows)])
    db.conn.executemany("INSERT INTO tags VALUES (?, ?)",
                        [(f"w{i:05d}", i) for i in range(rows // 2)])
    db.conn.executemany("INSERT INTO pairs VALUES (?, ?, ?)",
                        [(f"p{i % 5}", i, f"v{i}") for i in range(rows // 2)])
    db.run("COMMIT")
    db.install(TABLES)
    return db


def _dump_source(tmp_path: Path, db: SqliteSource) -> Any:
    catalog = RelayCatalog(tmp_path / "catalog.json")
    context = FetcherContext(BUFFER, 0, catalog.for_buffer(BUFFER, 0))
    fetcher = SqliteTxlogFetcher(db.uri(TABLES), context)
    source = fetcher.open_dump_source()
    assert source is not None
    return source


def test_setup_is_idempotent_and_dry_run_writes_nothing(tmp_path: Path) -> None:
    db = _source(tmp_path)
    source = _dump_source(tmp_path, db)
    statements = source.setup(dry_run=True)
    assert any("CREATE TABLE IF NOT EXISTS" in s and "databus_watermark" in s
               for s in statements)
    assert not db.conn.execute("SELECT name FROM sqlite_master WHERE name = "
                               "'databus_watermark'").fetchall()
    with pytest.raises(DumpSetupError, match="databus dump setup"):
        source.check()
    source.setup()
    source.setup()  # again: nothing changes, nothing fails
    source.check()
    source.close()


def test_chunks_cover_every_row_once_in_key_order(tmp_path: Path) -> None:
    db = _source(tmp_path, rows=101)
    source = _dump_source(tmp_path, db)
    source.setup()
    for name, expected in (("shop.items", list(range(101))),
                           ("shop.tags", [f"w{i:05d}" for i in range(50)]),
                           ("shop.pairs", sorted((f"p{i % 5}", i) for i in range(50)))):
        keys: list[Any] = []
        after = None
        while True:
            chunk = source.read_chunk(name, after, 7)
            keys += [tuple(r.key) if isinstance(r.key, tuple) else r.key for r in chunk.rows]
            if chunk.done:
                break
            after = chunk.cursor
        assert keys == expected, name
        # Cut into key ranges at split points: each range read to its end, every row
        # once, in key order within a range.
        points = source.split_points(name, 4)
        assert len(points) == 3 and points == sorted(points)
        bounds: list[Any] = [None, *points, None]
        ranged: list[Any] = []
        for lo, hi in itertools.pairwise(bounds):
            after = lo
            while True:
                chunk = source.read_chunk(name, after, 7, until=hi)
                ranged += [tuple(r.key) if isinstance(r.key, tuple) else r.key
                           for r in chunk.rows]
                if chunk.done:
                    break
                after = chunk.cursor
        assert ranged == expected, name
    only = source.read_keys("shop.pairs", [["p1", 1], ["p2", 2], ["nope", 0]])
    assert [tuple(r.key) for r in only.rows] == [("p1", 1), ("p2", 2)]
    with pytest.raises(DumpSetupError, match="not a table"):
        source.read_chunk("shop.nothing", None, 5)
    source.close()


async def _wait_done(r: RunningRelay, dump_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = r.relay.dumps.get(dump_id)
        if doc["state"] in ("done", "failed", "cancelled"):
            return doc
        await asyncio.sleep(0.05)
    raise TimeoutError(f"dump not finished: {doc}")


@pytest.mark.parametrize("parallelism", [1, 4])
def test_a_dump_while_writing_equals_the_source(tmp_path: Path, parallelism: int) -> None:
    db = _source(tmp_path, rows=ROWS)
    assert cli("install", "--source", db.uri(TABLES)) == 0
    _dump_source(tmp_path, db).setup()
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        conn = SqliteSource(db.path)
        rng = random.Random(5)
        while not stop.is_set():
            k = rng.randrange(ROWS + 100)
            statements = [f"UPDATE items SET qty = qty + 1, name = 'u{k}' WHERE id = {k}"]
            if rng.random() < 0.2:
                statements = [f"DELETE FROM items WHERE id = {k}",
                              f"DELETE FROM pairs WHERE a = 'p{k % 5}' AND b = {k}"]
            elif rng.random() < 0.2:
                statements = [f"INSERT OR REPLACE INTO items (id, name, qty) VALUES ({k}, 'r', 1)",
                              f"INSERT OR REPLACE INTO tags (word, n) VALUES ('w{k:05d}', -1)"]
            conn.txn(*statements)
            written[0] += 1
            time.sleep(0.0005)

    async def main() -> None:
        config = relay_config(tmp_path, {BUFFER: db.uri(TABLES)}, capacity_mb=32 + ROWS // 500)
        async with running_relay(config) as r:
            thread = threading.Thread(target=writer, daemon=True)
            thread.start()
            try:
                dump = r.relay.dumps.start_dump(
                    DumpRequest(buffer=BUFFER, sources=(), chunk_rows=500,
                                parallelism=parallelism),
                    buffer_of=r.relay.fetchers.configured_buffer)
                doc = await _wait_done(r, dump.id)
                assert doc["state"] == "done", doc
                assert sorted(doc["sources"]) == ["shop.items", "shop.pairs", "shop.tags"]
            finally:
                stop.set()
                thread.join()
            assert written[0] > 20
            # Everything written reaches the relay (a marker transaction closes it).
            db.txn("INSERT OR REPLACE INTO tags (word, n) VALUES ('zz-end', 0)")
            deadline = time.monotonic() + 30
            body = b""
            while b"zz-end" not in body:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
                body = await stream_body(r)
        names = {s.id: s.name for s in r.relay.catalog.sources()}
        from databus.schemas import AvroCodec
        codec = AvroCodec(r.relay.catalog.registry)
        replica: dict[str, dict[Any, dict[str, Any]]] = {}
        dumped = 0
        for offset, header in iter_events(body):
            if header.source_id < 0:
                continue
            event = decode_event(body, offset)
            dumped += header.from_snapshot
            rows = replica.setdefault(names[header.source_id], {})
            key = tuple(event.key) if isinstance(event.key, list) else event.key
            if header.op == 2:
                rows.pop(key, None)
            else:
                rows[key] = codec.decode(event.value, header.schema_fingerprint)
        assert dumped >= ROWS  # the rows that existed before the relay
        assert "databus.watermark" not in names.values()
        assert {k: (v["name"], v["qty"]) for k, v in replica["shop.items"].items()} == {
            r["id"]: (r["name"], r["qty"]) for r in db.rows("items")}
        assert {k: v["n"] for k, v in replica["shop.tags"].items()} == {
            r["word"]: r["n"] for r in db.rows("tags")}
        assert {k: v["v"] for k, v in replica["shop.pairs"].items()} == {
            (r["a"], r["b"]): r["v"] for r in db.rows("pairs")}

    asyncio.run(main())
