"""The ``databus`` Spark streaming source (spark_jobs/stream) against relays that are not
simply there: one that needs TLS (mutual) and a reader token, one that corrupts a window
part-way through a micro-batch, and a source whose table changes under a running query.

The promises (docs/spark.md "Streaming source", docs/security.md): with the right CA,
certificate and token every change is read once; a wrong or missing token, a token of
a reader not granted the source, or a CA that did not sign the relay's certificate fails
the query with the reason and writes nothing, and the token never shows in the error. A
window whose bytes do not check out never reaches Spark: a transient corruption is asked
again and the query reads every change once; a persistent one fails the query after
``relayTimeout`` with nothing of the batch written, and the query reads the batch whole
once the relay answers honestly. A nullable column added under a running query keeps it
running with its columns, nothing lost; started again from its checkpoint it has the new
column (null in the rows written before). A column removed fails the query with the
message naming the source and the column, nothing of the new version written.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web

from databus._serving import AppRunner
from databus.checkpoint import Checkpoint
from databus.config import ReaderConfig, Secret, TLSConfig
from databus.event import HEADER_SIZE, iter_events
from databus.relay._access import tls_for
from databus.relay._relay import Relay
from databus.relay._server import create_app
from databus.security import client_context
from tests.fixtures._certs import PKI
from tests.hostile_upstream import HostileUpstream
from tests.integration.spark_stream_support import ServerThread, captured, shop_source
from tests.relay_harness import RunningRelay, relay_config, running_relay
from tests.unit.test_txlog_support import BUFFER, CapturedWindow, SqliteSource
from tests.waiting import wait_until

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ITEMS = "shop.items"
TOKEN = "tok-spark-3e8c1f"
OTHER_TOKEN = "tok-other-77d0a2"


@pytest.fixture
def db(tmp_path: Path) -> SqliteSource:
    return shop_source(tmp_path)


def write(db: SqliteSource, first: int, count: int) -> str:
    """One transaction (one window) per n: an item inserted, every third one updated
    and its predecessor deleted; the last one writes the tag it returns."""
    for n in range(first, first + count):
        db.txn(f"INSERT INTO items (id, sku, qty) VALUES ({n}, 'sku{n}', {n})",
               f"INSERT OR REPLACE INTO tags (name, n) VALUES ('t{n % 5}', {n})")
        if n % 3 == 0:
            db.txn(f"UPDATE items SET qty = qty + 1 WHERE id = {n}",
                   f"DELETE FROM items WHERE id = {n - 1}")
    marker = f"end-{first + count}"
    db.txn(f"INSERT INTO tags (name, n) VALUES ('{marker}', 0)")
    return marker


def wait_captured(relay: ServerThread, marker: str) -> list[CapturedWindow]:
    return windows_with(relay, marker, f"tag {marker} at the relay")


def windows_with(relay: ServerThread, key: object, what: str) -> list[CapturedWindow]:
    """The relay's windows, once one has a change of ``key``."""
    def done() -> list[CapturedWindow] | None:
        windows = captured(relay)
        return windows if key in {c.key for w in windows for c in w.changes} else None

    found = wait_until(done, what, 60)
    assert found is not None
    return found


Change = tuple[int, str, str, int, Any]  # (scn, op, key JSON, seq, row)


def changes(windows: list[CapturedWindow]) -> list[Change]:
    """The changes of ``shop.items``, in stream order, with their position ``seq`` in
    their window."""
    out: list[Change] = []
    for w in windows:
        seq = 0
        for c in w.changes:
            if c.source == ITEMS:
                out.append((w.scn, c.op, json.dumps(c.key), seq, c.row))
                seq += 1
    return out


def got(rows: list[Row], columns: tuple[str, ...] = ("id", "sku", "qty")) -> list[Change]:
    return [(r.scn, r.op, r.key, r.seq,
             None if r.op == "delete" else {c: getattr(r, c) for c in columns})
            for r in rows]


def want(windows: list[CapturedWindow], columns: tuple[str, ...] = ("id", "sku", "qty")
         ) -> list[Change]:
    """``changes``, the rows cut to ``columns`` (deletes carry the key only)."""
    return [(scn, op, key, seq, None if op == "delete" else {c: row.get(c) for c in columns})
            for scn, op, key, seq, row in changes(windows)]


def start_query(spark: SparkSession, checkpoint: Path, options: dict[str, object],
                rows: list[Row], table: Path | None = None) -> Any:
    """A started ``databus`` query whose micro-batches' rows go to ``rows`` (and, with
    ``table``, through ``apply_changes`` into that table)."""
    from databus.spark_jobs import apply_changes

    def batch(df: Any, batch_id: int) -> None:
        collected = df.collect()
        if table is not None:
            apply_changes(df, batch_id, table)
        rows.extend(collected)

    reader = spark.readStream.format("databus")
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return (reader.load().writeStream.option("checkpointLocation", str(checkpoint))
            .foreachBatch(batch).trigger(processingTime="200 milliseconds").start())


def run_into(spark: SparkSession, checkpoint: Path, options: dict[str, object],
             rows: list[Row], table: Path | None = None) -> None:
    """Run a query until it has read everything available, then stop it; its rows go
    to ``rows`` (kept when it fails)."""
    query = start_query(spark, checkpoint, options, rows, table)
    try:
        query.processAllAvailable()
    finally:
        query.stop()


# -- 1. TLS, mutual TLS and a reader token -------------------------------------------


@asynccontextmanager
async def tls_relay(tmp_path: Path, db: SqliteSource, pki: PKI) -> AsyncIterator[RunningRelay]:
    """A relay on the SQLite source serving HTTPS only to clients with a certificate of
    the test CA (``require_client_cert``), with two readers: ``spark`` (TOKEN, granted
    ``shop.*``) and ``other`` (OTHER_TOKEN, granted ``other.*``). Its ``session`` is a
    reader's (certificate and TOKEN), for the tests' own look at the stream."""
    config = relay_config(
        tmp_path, {BUFFER: db.uri("items,tags")},
        tls=TLSConfig(cert_file=pki.server.cert, key_file=pki.server.key,
                      client_ca_file=pki.ca, require_client_cert=True),
        readers=(ReaderConfig(name="spark", sources=("shop.*",), token=Secret(TOKEN)),
                 ReaderConfig(name="other", sources=("other.*",),
                              token=Secret(OTHER_TOKEN))))
    relay = Relay(config, backoff_initial=0.05, backoff_max=0.5)
    app = create_app(relay)
    runner = AppRunner(app)
    await runner.setup()
    context, _ = tls_for(config)
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    port = runner.addresses[0][1]
    cert = pki.client("spark-executor")
    try:
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=client_context(pki.ca, cert.cert,
                                                                  cert.key)),
                headers={"Authorization": f"Bearer {TOKEN}"}) as session:
            yield RunningRelay(relay, f"https://localhost:{port}", session, app)
    finally:
        await runner.cleanup()


def test_tls_and_a_token_read_every_change_and_wrong_credentials_fail_clearly(
        databus_spark: SparkSession, db: SqliteSource, pki: PKI, tmp_path: Path) -> None:
    cert = pki.client("spark-executor")
    with ServerThread(tls_relay(tmp_path, db, pki)) as relay:
        windows = wait_captured(relay, write(db, 1, 8))
        secure = {"relays": relay.value.url, "sources": ITEMS, "caFile": pki.ca,
                  "certFile": cert.cert, "keyFile": cert.key, "relayTimeout": 5}
        rows: list[Row] = []
        run_into(databus_spark, tmp_path / "cp", {**secure, "token": TOKEN}, rows)
        assert got(rows) == want(windows)
        # A wrong token, none, or the token of a reader not granted shop.items: the
        # reason, never the token, and nothing written.
        unauthorized = r"relay https://localhost:\d+ answered 401 unauthorized"
        cases = [({"token": TOKEN[:-1] + "0"}, unauthorized), ({}, unauthorized),
                 ({"token": OTHER_TOKEN},
                  r"answered 403 forbidden: reader 'other' is not granted shop\.items")]
        for i, (credential, reason) in enumerate(cases):
            bad: list[Row] = []
            with pytest.raises(Exception, match=reason) as info:
                run_into(databus_spark, tmp_path / f"cp-bad{i}", {**secure, **credential},
                         bad)
            assert bad == []
            said = str(info.value)
            assert TOKEN[:-1] not in said and OTHER_TOKEN not in said
        # The relay's certificate checked against another CA: refused, and said so.
        bad = []
        with pytest.raises(Exception, match=r"the TLS certificate of https://localhost:\d+ "
                                                r"does not verify") as info:
            run_into(databus_spark, tmp_path / "cp-ca",
                     {**secure, "token": TOKEN, "caFile": pki.other_ca}, bad)
        assert bad == []
        assert TOKEN not in str(info.value)


# -- 2. a window corrupted part-way through a micro-batch ----------------------------


def corrupted(body: bytes, scn: int) -> bytes | None:
    """``body`` with the last byte of window ``scn``'s first data event flipped (its
    body CRC no longer matches); None when the body has no data event of that window."""
    for offset, header in iter_events(body):
        if header.scn == scn and header.source_id >= 0 and header.total_length > HEADER_SIZE:
            out = bytearray(body)
            out[offset + header.total_length - 1] ^= 0xFF
            return bytes(out)
    return None


@dataclass
class Corrupting(HostileUpstream):
    """``tests/hostile_upstream.py``'s relay (polls and streams) with one more attack:
    the answers that hold window ``bad_scn`` have it corrupted, the first ``times`` of
    them (then honest again)."""

    bad_scn: int | None = None

    def _attacking(self) -> bool:
        return self.bad_scn is not None and self.attacks < self.times

    def _mangle(self, body: bytes, checkpoint: Checkpoint) -> tuple[bytes, Checkpoint]:
        if body and self._attacking():
            assert self.bad_scn is not None
            bad = corrupted(body, self.bad_scn)
            if bad is not None:
                self.attacks += 1
                return bad, checkpoint
        return body, checkpoint


@asynccontextmanager
async def corrupting(upstream: str) -> AsyncIterator[Corrupting]:
    async with aiohttp.ClientSession() as session:
        hostile = Corrupting(upstream, session, "corrupt", times=0)
        app = web.Application()
        app.router.add_get("/v1/stream", hostile._stream)
        app.router.add_get("/{tail:.*}", hostile._passthrough)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        hostile.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield hostile
        finally:
            await runner.cleanup()


def middle_window(windows: list[CapturedWindow]) -> int:
    """The SCN of the middle one of ``windows`` that has a change of ``shop.items``."""
    with_items = [w.scn for w in windows if any(c.source == ITEMS for c in w.changes)]
    return with_items[len(with_items) // 2]


def whole_windows(rows: list[Row], windows: list[CapturedWindow]) -> None:
    """Every row written belongs to a window all of whose changes were written."""
    by_scn: dict[int, list[Change]] = {}
    for change in got(rows):
        by_scn.setdefault(change[0], []).append(change)
    expected: dict[int, list[Change]] = {}
    for change in want(windows):
        expected.setdefault(change[0], []).append(change)
    for scn, written in by_scn.items():
        assert sorted(written, key=repr) == sorted(expected[scn], key=repr), scn


def test_a_transiently_corrupted_window_is_read_again_and_every_change_once(
        databus_spark: SparkSession, db: SqliteSource, tmp_path: Path) -> None:
    with ServerThread(running_relay(relay_config(tmp_path, {BUFFER: db.uri("items,tags")}))
                      ) as relay, ServerThread(corrupting(relay.value.url)) as proxy:
        windows = wait_captured(relay, write(db, 1, 12))
        hostile: Corrupting = proxy.value
        hostile.bad_scn, hostile.times = middle_window(windows), 1
        rows: list[Row] = []
        run_into(databus_spark, tmp_path / "cp",
                 {"relays": hostile.url, "sources": ITEMS, "partitions": 2,
                  "relayTimeout": 30}, rows)
        assert hostile.attacks == 1, "the corruption never happened"
        # Every change once (``seq`` counts a partition's changes of a window).
        def unseq(changes: list[Change]) -> list[tuple[Any, ...]]:
            return sorted((c[:3] + c[4:] for c in changes), key=repr)

        assert unseq(got(rows)) == unseq(want(windows))
        for p in (0, 1):  # each partition in commit order
            mine = [(r.scn, r.seq) for r in rows if r.partition == p]
            assert mine == sorted(mine)


def test_a_persistently_corrupted_window_fails_the_query_with_nothing_of_its_batch(
        databus_spark: SparkSession, db: SqliteSource, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    with ServerThread(running_relay(relay_config(tmp_path, {BUFFER: db.uri("items,tags")}))
                      ) as relay, ServerThread(corrupting(relay.value.url)) as proxy:
        hostile: Corrupting = proxy.value
        options = {"relays": hostile.url, "sources": ITEMS, "relayTimeout": 3}
        first = wait_captured(relay, write(db, 1, 5))
        rows: list[Row] = []
        run_into(databus_spark, tmp_path / "cp", options, rows)
        assert got(rows) == want(first)
        # More windows; one in their middle corrupted in every answer that holds it.
        everything = wait_captured(relay, write(db, 6, 10))
        second = everything[len(first):]
        hostile.bad_scn, hostile.times = middle_window(second), 10**9
        failed: list[Row] = []
        with pytest.raises(StreamingQueryException,
                           match=r"partition 0: no progress in 3 s .*the client's last "
                                 r"warning: relay http://127\.0\.0\.1:\d+ .*body CRC "
                                 r"mismatch"):
            run_into(databus_spark, tmp_path / "cp", options, failed)
        assert hostile.attacks >= 1, "the corruption never happened"
        whole_windows(failed, everything)
        assert hostile.bad_scn not in {r.scn for r in failed}
        # The relay answers honestly again: the same checkpoint reads the failed batch
        # whole, each change once.
        hostile.bad_scn = None
        again: list[Row] = []
        run_into(databus_spark, tmp_path / "cp", options, again)
        assert sorted(got(failed + again), key=repr) == sorted(want(second), key=repr)


# -- 3. the source's table changes under a running query -----------------------------


def test_a_column_added_keeps_the_query_running_and_one_removed_fails_it(
        databus_spark: SparkSession, db: SqliteSource, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    from databus.spark_jobs import read_table

    table = tmp_path / "table"
    with ServerThread(running_relay(relay_config(tmp_path, {BUFFER: db.uri("items,tags")}))
                      ) as relay:
        options = {"relays": relay.value.url, "sources": ITEMS, "relayTimeout": 30}
        first = wait_captured(relay, write(db, 1, 4))
        rows: list[Row] = []
        query = start_query(databus_spark, tmp_path / "cp", options, rows, table)
        try:
            query.processAllAvailable()
            assert got(rows) == want(first)
            # A nullable column added while the query runs: it goes on, with its
            # columns, and reads every change.
            db.run("ALTER TABLE items ADD COLUMN note TEXT")
            db.txn("INSERT INTO items (id, sku, qty, note) VALUES (100, 'sku100', 7, 'new')",
                   "UPDATE items SET note = 'noted' WHERE id = 1")
            everything = wait_captured(relay, write(db, 5, 3))
            query.processAllAvailable()
            assert query.isActive and query.exception() is None
        finally:
            query.stop()
        assert got(rows) == want(everything)
        assert "note" not in rows[-1].asDict()
        # Started again from its checkpoint: the new column, null in the rows written
        # before it (the table of apply_changes).
        db.txn("INSERT INTO items (id, sku, qty, note) VALUES (101, 'sku101', 8, 'newer')")
        later = wait_captured(relay, write(db, 8, 1))
        more: list[Row] = []
        run_into(databus_spark, tmp_path / "cp", options, more, table)
        columns = ("id", "sku", "qty", "note")
        assert got(more, columns) == want(later[len(everything):], columns)
        state = {r.id: r.note for r in read_table(databus_spark, table).collect()}
        assert state[101] == "newer"
        assert state[100] is None and state[1] is None  # read before the restart
        assert state[4] is None  # written before the column was added
        # A query started before another nullable column is added, that reads its
        # first rows after it: the columns it started with (every reader of a query
        # takes the query's schema version, not the newest).
        fresh: list[Row] = []
        query = start_query(databus_spark, tmp_path / "cp-fresh",
                            {**options, "starting": "latest"}, fresh)
        try:
            query.processAllAvailable()
            db.run("ALTER TABLE items ADD COLUMN size INTEGER")
            db.txn("INSERT INTO items (id, sku, qty, note, size) "
                   "VALUES (102, 'sku102', 9, 'n', 3)")
            added = windows_with(relay, 102, "the row with a size at the relay")
            query.processAllAvailable()
        finally:
            query.stop()
        assert got(fresh, columns) == want(added[len(later):], columns)
        assert "size" not in fresh[-1].asDict()
        # A column removed: the next batch fails the query, naming the source and
        # the column; nothing of the new version is written.
        query = start_query(databus_spark, tmp_path / "cp", options, more, table)
        try:
            query.processAllAvailable()
            count = len(more)
            assert {r.id for r in more} >= {101, 102}
            db.run("ALTER TABLE items DROP COLUMN qty")
            db.txn("INSERT INTO items (id, sku, note) VALUES (200, 'sku200', 'dropped')")
            dropped = windows_with(relay, 200, "the row written without qty at the relay")
            with pytest.raises(StreamingQueryException,
                               match=r"source shop\.items: column 'qty' was removed"):
                query.awaitTermination(120)
        finally:
            query.stop()
        assert more[count:] == []
        new_version = {w.scn for w in dropped[len(added):]}
        assert not {r.scn for r in more} & new_version
        assert 200 not in {r.id for r in read_table(databus_spark, table).collect()}
