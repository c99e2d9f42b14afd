"""The ``databus`` Spark streaming source (spark_jobs/stream) against a real relay on a
SQLite TxLog source: rows equal the source's changes (every change once, whole windows,
commit order per key), a restarted query resumes from its checkpoint with nothing lost
or repeated, a batch whose sink failed is read again whole from the same offsets,
partitions split keys by bucket, a changed partition count is refused, a query with no
offset catches up from the bootstrap and one that fell off the relay too (and a batch
read of the snapshot), a relay answering garbage fails the query clearly."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web

from tests.integration.spark_stream_support import ServerThread, captured, run_query, shop_source
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_txlog_support import BUFFER, CapturedWindow, SqliteSource
from tests.waiting import wait_until

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ITEMS = "shop.items"
TAGS = "shop.tags"


@pytest.fixture
def db(tmp_path: Path) -> SqliteSource:
    return shop_source(tmp_path)


def write(db: SqliteSource, first: int, count: int) -> str:
    """Transactions: inserts, updates (two of one key in one transaction), deletes, on
    both tables; the last one writes the tag it returns (the TxLog source coalesces a
    row's changes that it has not read yet, so windows cannot be counted)."""
    for n in range(first, first + count):
        db.txn(f"INSERT INTO items (id, sku, qty) VALUES ({n}, 'sku{n}', {n})",
               f"INSERT OR REPLACE INTO tags (name, n) VALUES ('t{n % 5}', {n})")
        if n % 3 == 0:
            db.txn(f"UPDATE items SET qty = qty + 1 WHERE id = {n}",
                   f"UPDATE items SET qty = qty + 1 WHERE id = {n}",
                   f"DELETE FROM items WHERE id = {n - 1}")
    marker = f"end-{first + count}"
    db.txn(f"INSERT INTO tags (name, n) VALUES ('{marker}', 0)")
    return marker


def changes(windows: list[CapturedWindow], sources: set[str]) -> list[tuple[Any, ...]]:
    """(scn, source, op, key JSON, seq, row) of every change, in stream order."""
    out = []
    for w in windows:
        seq = 0
        for c in w.changes:
            if c.source in sources:
                out.append((w.scn, c.source, c.op, json.dumps(c.key), seq, c.row))
                seq += 1
    return out


def wait_captured(relay: ServerThread, marker: str) -> list[CapturedWindow]:
    def done() -> list[CapturedWindow] | None:
        windows = captured(relay)
        keys = {c.key for w in windows for c in w.changes}
        return windows if marker in keys else None

    return wait_until(done, f"tag {marker} at the relay", 60)


def typed(rows: list[Row]) -> list[tuple[Any, ...]]:
    return [(r.scn, r.source, r.op, r.key, r.seq,
             None if r.op == "delete" else {"id": r.id, "sku": r.sku, "qty": r.qty})
            for r in rows]


def test_rows_are_the_changes_and_a_restart_resumes(
        databus_spark: SparkSession, db: SqliteSource, tmp_path: Path) -> None:
    with ServerThread(running_relay(relay_config(tmp_path, {BUFFER: db.uri("items,tags")}))
                      ) as relay:
        url = relay.value.url
        first = wait_captured(relay, write(db, 1, 9))
        options = {"relays": url, "sources": ITEMS}
        progress: list[dict[str, Any]] = []
        rows = run_query(databus_spark, tmp_path / "cp", options, progress)
        want = changes(first, {ITEMS})
        # Spark's own progress: rows read, and each batch's offsets (the partition's
        # position) up to the relay's newest window (latestOffset).
        assert sum(p["numInputRows"] for p in progress) == len(rows)
        ran = [p["sources"][0] for p in progress if p["numInputRows"]]
        newest = max(w.scn for w in first)
        end = json.loads(ran[-1]["endOffset"])
        assert end["checkpoints"]["0"]["window_scn"] == newest
        assert json.loads(ran[-1]["latestOffset"]) == end
        # Deletes carry the key only: compare their rows on the meta columns.
        assert [t[:5] for t in typed(rows)] == [t[:5] for t in want]
        assert [t for t in typed(rows) if t[2] == "upsert"] == [
            (*t[:5], {k: t[5][k] for k in ("id", "sku", "qty")}) for t in want
            if t[2] == "upsert"]
        assert {r.partition for r in rows} == {0}
        assert all(r.timestamp is not None and not r.from_snapshot for r in rows)
        # Stopped, more changes, started again from its checkpoint: only the new ones.
        everything = wait_captured(relay, write(db, 10, 6))
        again = run_query(databus_spark, tmp_path / "cp", options)
        assert [t[:5] for t in typed(again)] == [
            t[:5] for t in changes(everything[len(first):], {ITEMS})]


def test_two_partitions_split_keys_and_a_changed_count_is_refused(
        databus_spark: SparkSession, db: SqliteSource, tmp_path: Path) -> None:
    with ServerThread(running_relay(relay_config(tmp_path, {BUFFER: db.uri("items,tags")}))
                      ) as relay:
        windows = wait_captured(relay, write(db, 1, 12))
        options = {"relays": relay.value.url, "sources": f"{ITEMS},{TAGS}", "partitions": 2}
        rows = run_query(databus_spark, tmp_path / "cp", options)
        want = changes(windows, {ITEMS, TAGS})
        got = [(r.scn, r.source, r.op, r.key) for r in rows]
        # Every change once; per partition in commit order; every key in one partition.
        assert sorted(got) == sorted(t[:4] for t in want)
        for p in (0, 1):
            mine = [(r.scn, r.seq) for r in rows if r.partition == p]
            assert mine == sorted(mine)
        by_key: dict[tuple[str, str], set[int]] = {}
        for r in rows:
            by_key.setdefault((r.source, r.key), set()).add(r.partition)
        assert all(len(parts) == 1 for parts in by_key.values())
        assert {r.partition for r in rows} == {0, 1}
        ints = [r for r in rows if r.source == ITEMS]
        assert all(r.partition == abs(int(r.key)) % 2 for r in ints)
        values = {(r.scn, r.key): json.loads(r.value) for r in rows if r.op == "upsert"}
        assert all(isinstance(v, dict) for v in values.values())
        # The same checkpoint with partitions=3: refused, with the reason.
        from pyspark.errors import StreamingQueryException

        with pytest.raises(StreamingQueryException, match=r"partitions=2.*partitions=3"):
            run_query(databus_spark, tmp_path / "cp", {**options, "partitions": 3})
        # starting=latest: nothing of what was there, then only what comes.
        latest = {**options, "starting": "latest"}
        assert run_query(databus_spark, tmp_path / "cp-latest", latest) == []
        more = wait_captured(relay, write(db, 20, 3))
        rows = run_query(databus_spark, tmp_path / "cp-latest", latest)
        assert sorted((r.scn, r.source, r.op, r.key) for r in rows) == sorted(
            t[:4] for t in changes(more[len(windows):], {ITEMS, TAGS}))


# -- the bootstrap: relay B has dropped the stream's start, the bootstrap service holds
# the state at BOOT_SCN (tests/unit/test_client_bootstrap.py's pipeline) ------------


def fold(rows: list[Row], state: dict[tuple[str, object], int] | None = None
         ) -> dict[tuple[str, object], int]:
    """Latest state per key, applying the rows in the order they came (each key's rows
    are in one partition, in commit order)."""
    out = dict(state or {})
    for r in rows:
        key = (r.source, json.loads(r.key))
        if r.op == "delete":
            out.pop(key, None)
        else:
            out[key] = json.loads(r.value)["seq"]
    return out


def test_no_offset_catches_up_from_the_bootstrap_and_a_fallen_partition_too(
        databus_spark: SparkSession, tmp_path: Path) -> None:
    from tests.unit.test_client_bootstrap import LAST_SCN, SOURCES, pipeline, source_state

    with ServerThread(pipeline(tmp_path)) as servers:
        p = servers.value
        expected = servers.call(source_state(p, LAST_SCN)).rows
        options = {"relays": p.b.url, "bootstrap": p.boot, "sources": ",".join(SOURCES),
                   "partitions": 2}
        rows = run_query(databus_spark, tmp_path / "cp", options)
        assert fold(rows) == expected
        snapshot = [r for r in rows if r.from_snapshot]
        assert snapshot and {r.partition for r in snapshot} == {0, 1}
        assert any(not r.from_snapshot for r in rows)  # then the relay
        assert max(r.scn for r in rows) == LAST_SCN
        # Started after window 50, which relay B no longer holds: each partition gets
        # the bootstrap's delta since 50, then the relay.
        at_50 = servers.call(source_state(p, 50)).rows
        late = run_query(databus_spark, tmp_path / "cp50", {**options, "startingScn": 50})
        assert fold(late, at_50) == expected
        assert any(r.from_snapshot for r in late)  # through the bootstrap service
        # The same query into a Parquet table of the latest state per key
        # (apply_changes): the table equals the source.
        from databus.spark_jobs import foreach_batch, read_table

        table = tmp_path / "table"
        reader = databus_spark.readStream.format("databus")
        for name, value in options.items():
            reader = reader.option(name, str(value))
        query = (reader.load().writeStream.foreachBatch(foreach_batch(table))
                 .option("checkpointLocation", str(tmp_path / "cp-table"))
                 .trigger(processingTime="200 milliseconds").start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        state = {(r.source, json.loads(r.key)): json.loads(r.value)["seq"]
                 for r in read_table(databus_spark, table).collect()}
        assert state == expected
        # A batch read: the bootstrap snapshot (and its catch-up) once, per bucket.
        from tests.unit.test_client_bootstrap import BOOT_SCN

        reader = databus_spark.read.format("databus")
        for name, value in options.items():
            reader = reader.option(name, str(value))
        snap = reader.load().collect()
        assert fold(snap) == servers.call(source_state(p, BOOT_SCN)).rows
        assert {r.partition for r in snap} == {0, 1} and max(r.scn for r in snap) <= BOOT_SCN


# -- a relay answering garbage -------------------------------------------------------


@asynccontextmanager
async def garbage_relay(upstream: str | None) -> AsyncIterator[str]:
    """A server answering garbage: to everything (``upstream`` None), or only to stream
    reads that are not "from the latest" (the rest is passed to ``upstream``)."""
    async with aiohttp.ClientSession() as session:
        async def handle(request: web.Request) -> web.Response:
            latest = '"window_scn": -2' in request.query.get("checkpoint", "").replace(
                '"window_scn":-2', '"window_scn": -2')
            if upstream is None or (request.path == "/v1/stream" and not latest):
                return web.Response(body=b"\x7fnot databus events\x00" * 64,
                                    content_type="application/x-databus-events")
            async with session.get(upstream + request.path_qs) as resp:
                return web.Response(body=await resp.read(), status=resp.status,
                                    headers={k: v for k, v in resp.headers.items()
                                             if k.lower().startswith(("x-databus",
                                                                      "content-type"))})

        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()


def test_a_relay_answering_garbage_fails_the_query_clearly(
        databus_spark: SparkSession, db: SqliteSource, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    options = {"sources": f"{ITEMS},{TAGS}", "relayTimeout": 3}
    # Garbage to every request: the driver cannot plan a batch.
    with ServerThread(garbage_relay(None)) as bad:
        got: list[Row] = []
        with pytest.raises(StreamingQueryException,
                           match=r"no relay of http://127\.0\.0\.1:\d+ gave a valid answer"):
            got = run_query(databus_spark, tmp_path / "cp1", {**options, "relays": bad.value})
        assert got == []
    # An honest catalog but garbage streams: the partitions' reads fail, nothing is
    # written.
    with ServerThread(running_relay(relay_config(tmp_path, {BUFFER: db.uri("items,tags")}))
                      ) as relay:
        wait_captured(relay, write(db, 1, 3))
        with ServerThread(garbage_relay(relay.value.url)) as bad:
            batches: list[Row] = []
            with pytest.raises(StreamingQueryException,
                               match=r"partition 0: no progress in 3 s \(relays failing"):
                batches = run_query(databus_spark, tmp_path / "cp2",
                                    {**options, "relays": bad.value})
            assert batches == []


def test_a_batch_that_failed_is_read_again_whole_after_a_restart(
        databus_spark: SparkSession, db: SqliteSource, tmp_path: Path) -> None:
    """The sink fails in the middle of batch 0 (after its offsets were logged, before
    its commit): the restarted query reads that batch again from the same offsets, with
    the same rows, and nothing after it twice."""
    from pyspark.errors import StreamingQueryException

    with ServerThread(running_relay(relay_config(tmp_path, {BUFFER: db.uri("items,tags")}))
                      ) as relay:
        windows = wait_captured(relay, write(db, 1, 8))
        options = {"relays": relay.value.url, "sources": f"{ITEMS},{TAGS}", "partitions": 2}
        seen: list[Row] = []

        def failing(df: Any, batch_id: int) -> None:
            seen.extend(df.collect())
            raise RuntimeError("the sink failed")

        reader = databus_spark.readStream.format("databus")
        for name, value in options.items():
            reader = reader.option(name, str(value))
        query = (reader.load().writeStream.option("checkpointLocation", str(tmp_path / "cp"))
                 .foreachBatch(failing).start())
        with pytest.raises(StreamingQueryException, match="the sink failed"):
            query.awaitTermination(120)
        assert seen
        rows = run_query(databus_spark, tmp_path / "cp", options)
        key = lambda r: (r.partition, r.scn, r.seq, r.key)  # noqa: E731
        assert sorted(map(key, rows[:len(seen)])) == sorted(map(key, seen))
        assert sorted((r.scn, r.source, r.op, r.key) for r in rows) == sorted(
            t[:4] for t in changes(windows, {ITEMS, TAGS}))


def test_a_bad_option_fails_the_query_when_it_is_defined(databus_spark: SparkSession) -> None:
    reader = (databus_spark.readStream.format("databus")
              .option("relays", "http://127.0.0.1:1").option("sources", "shop.items")
              .option("partitons", "2").option("token", "s3cret-token"))
    with pytest.raises(Exception, match=r"unknown option.*partitons") as info:
        reader.load()
    assert "s3cret" not in str(info.value)


def test_value_columns_named_like_row_columns_are_read_under_a_prefix(
        databus_spark: SparkSession, tmp_path: Path) -> None:
    """A table with columns ``key``, ``timestamp`` and ``seq``: the row's own columns
    keep their meaning and the table's come as ``value_key``, ``value_timestamp``,
    ``value_seq`` (two fields of one name misread every row)."""
    (tmp_path / "clash").mkdir()
    db = SqliteSource(tmp_path / "clash" / "shop.db",
                      "CREATE TABLE events (id INTEGER PRIMARY KEY, "
                      "key TEXT, timestamp INTEGER, seq INTEGER)")
    db.install("events")
    with ServerThread(running_relay(relay_config(tmp_path, {BUFFER: db.uri("events")}))
                      ) as relay:
        for n in range(1, 6):
            db.txn(f"INSERT INTO events (id, key, timestamp, seq) "
                   f"VALUES ({n}, 'k{n}', {1000 + n}, {-n})")
        wait_until(lambda: {c.key for w in captured(relay) for c in w.changes} >= {5} or None,
                   "the five rows at the relay", 60)
        rows = run_query(databus_spark, tmp_path / "cp",
                         {"relays": relay.value.url, "sources": "shop.events"})
    assert sorted((r.key, r.value_key, r.value_timestamp, r.value_seq, r.seq) for r in rows
                  ) == [(str(n), f"k{n}", 1000 + n, -n, 0) for n in range(1, 6)]
    assert all(r.source == "shop.events" and r.op == "upsert" and r.timestamp is not None
               for r in rows)
