"""Dumps of MariaDB tables through a real relay while a writer keeps changing them
(issue 13): a consumer that applies every window from before the dump ends equal to the
source, rows are encoded as the binlog fetcher encodes them, and the failure cases."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import pymysql
import pytest

from databus.event import DUMP_END_SOURCE_ID, DUMP_START_SOURCE_ID, decode_event, iter_events
from databus.fetchers.mysql import BinlogSourceConfig
from databus.fetchers.mysql._dump import setup_statements
from databus.relay.dumps import DumpRequest
from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import (
    BUFFER,
    Sql,
    binlog_relay,
    captured,
    fresh_database,
    source_uri,
    wait_for_scn,
)
from tests.relay_harness import RunningRelay, stream_body
from tests.tiers import count
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

ROWS = count("DATABUS_DUMP_ROWS", smoke=3_000, full=100_000)


def _setup_watermark(server: MariaDBServer, uri: str) -> None:
    admin = Sql(server)
    admin.run(*setup_statements(BinlogSourceConfig.from_uri(uri)))
    admin.close()


def _load(sql: Sql, rows: int) -> None:
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL, "
            "qty INT NOT NULL, price DECIMAL(10,2), seen DATETIME(3))",
            "CREATE TABLE tags (a VARCHAR(20) NOT NULL, b INT NOT NULL, val TEXT, "
            "PRIMARY KEY (a, b))")
    for start in range(0, rows, 1000):
        values = ", ".join(
            f"({i}, 'item{i}', {i % 97}, {i}.25, '2024-01-02 03:04:05.{i % 1000:03d}')"
            for i in range(start, min(rows, start + 1000)))
        sql.run(f"INSERT INTO items VALUES {values}")
    tag_values = ", ".join(f"('t{i % 37}', {i}, 'v{i}')" for i in range(rows // 3))
    sql.run(f"INSERT INTO tags VALUES {tag_values}")


class Writer(threading.Thread):
    """Random updates, inserts and deletes in small transactions until stopped."""

    def __init__(self, server: MariaDBServer, database: str, rows: int) -> None:
        super().__init__(daemon=True)
        self.sql = Sql(server, database)
        self.rows = rows
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self.rng = random.Random(13)

    def run(self) -> None:
        try:
            next_id = self.rows + 1_000_000
            while not self.stop.is_set():
                r = self.rng.random()
                key = self.rng.randrange(self.rows + 200)
                if r < 0.5:
                    stmts = [f"UPDATE items SET qty = qty + 1, name = 'u{self.transactions}' "
                             f"WHERE id = {key}"]
                elif r < 0.7:
                    stmts = [f"DELETE FROM items WHERE id = {key}"]
                elif r < 0.85:
                    next_id += 1
                    stmts = [f"INSERT INTO items VALUES ({next_id}, 'new', 1, 9.99, NULL)",
                             f"REPLACE INTO items VALUES ({key}, 'replaced', 2, 1.5, NULL)"]
                else:
                    stmts = [f"UPDATE tags SET val = 'w{self.transactions}' WHERE a = "
                             f"'t{key % 37}' AND b = {key}",
                             f"DELETE FROM tags WHERE a = 't{(key + 1) % 37}' AND b = {key + 1}"]
                self.sql.txn(*stmts)
                self.transactions += 1
                time.sleep(0.001)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def _apply(windows: Any) -> dict[str, dict[Any, dict[str, Any]]]:
    replica: dict[str, dict[Any, dict[str, Any]]] = {}
    for window in windows:
        for change in window.changes:
            table = replica.setdefault(change.source, {})
            key = tuple(change.key) if isinstance(change.key, list) else change.key
            if change.op == "delete":
                table.pop(key, None)
            else:
                table[key] = change.row
    return replica


def _source_items(sql: Sql) -> dict[Any, tuple[Any, ...]]:
    return {r[0]: (r[1], r[2], r[3]) for r in sql.query("SELECT id, name, qty, price FROM items")}


def _source_tags(sql: Sql) -> dict[Any, Any]:
    return {(r[0], r[1]): r[2] for r in sql.query("SELECT a, b, val FROM tags")}


async def _wait_done(r: RunningRelay, dump_id: str, timeout: float = 120) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        doc: dict[str, Any] = await r.json(f"/v1/dumps/{dump_id}")
        return doc if doc["state"] in ("done", "failed", "cancelled") else None

    done: dict[str, Any] = await async_wait_until(ended, f"dump {dump_id} finished", timeout)
    return done


def test_dump_while_writing_equals_the_source(mariadb_server: MariaDBServer,
                                             tmp_path: Path) -> None:
    sql = fresh_database(mariadb_server, "dump1")
    _load(sql, ROWS)
    uri = source_uri(mariadb_server, "dump1.items,dump1.tags")
    _setup_watermark(mariadb_server, uri)
    writer = Writer(mariadb_server, "dump1", ROWS)

    async def main() -> None:
        async with binlog_relay(tmp_path, uri, capacity_mb=16 + ROWS // 250) as r:
            writer.start()
            try:
                await asyncio.sleep(0.2)
                async with r.session.post(
                        r.url + "/v1/admin/dumps",
                        json={"sources": ["dump1.items", "dump1.tags"], "chunk_rows": 400},
                        headers={"Authorization": "Bearer test-admin-token"}) as resp:
                    assert resp.status == 201, await resp.text()
                    dump = await resp.json()
                doc = await _wait_done(r, dump["id"])
                assert doc["state"] == "done", doc
                assert doc["progress"]["percent"] == 100.0
                await asyncio.sleep(0.3)
            finally:
                writer.stop.set()
                writer.join()
            assert writer.error is None, writer.error
            assert writer.transactions > 50
            await wait_for_scn(r, sql.position())
            windows, _ = await captured(r)
            replica = _apply(windows)
            items = {k: (v["name"], v["qty"], v["price"]) for k, v in
                     replica.get("dump1.items", {}).items()}
            assert items == _source_items(sql)
            tags = {k: v["val"] for k, v in replica.get("dump1.tags", {}).items()}
            assert tags == _source_tags(sql)
            # Dumped rows carry the flag; each table has one start and one end marker,
            # the end marker's count equal to the flagged rows of that table.
            body = await stream_body(r)
            markers = [(h.source_id, decode_event(body, o).value) for o, h in iter_events(body)
                       if h.source_id in (DUMP_START_SOURCE_ID, DUMP_END_SOURCE_ID)]
            assert len([m for m in markers if m[0] == DUMP_START_SOURCE_ID]) == 2
            assert len([m for m in markers if m[0] == DUMP_END_SOURCE_ID]) == 2
            flagged = sum(1 for _, h in iter_events(body) if h.source_id >= 0 and h.from_snapshot)
            assert flagged == doc["progress"]["rows"]
            assert flagged >= ROWS // 2

    asyncio.run(main())
    sql.close()


@pytest.mark.twin("databus.fetchers.mysql._rows")
def test_dumped_rows_are_encoded_as_the_binlog_encodes_them(mariadb_server: MariaDBServer,
                                                            tmp_path: Path) -> None:
    """Every type row of the fetcher's mapping, dumped and then logged by a no-op
    UPDATE-style rewrite: the two events' values are byte-identical. The dump reads
    with the compiled twin and mysqlclient (``make test``) and with the reference twin
    (``make twins``), whose rows it also declines to (the edge values)."""
    sql = fresh_database(mariadb_server, "dump2")
    sql.run("CREATE TABLE t (id BIGINT UNSIGNED PRIMARY KEY, a TINYINT, b SMALLINT UNSIGNED, "
            "c MEDIUMINT, d INT UNSIGNED, e DECIMAL(20,6), f FLOAT, g DOUBLE, h BIT(1), "
            "i BIT(12), j YEAR, k DATE, l TIME(3), m DATETIME(6), n TIMESTAMP(2) NULL, "
            "o CHAR(5), p VARCHAR(30), q TEXT, r BINARY(4), s VARBINARY(10), u BLOB, "
            "v ENUM('x','y'), w SET('p','q','r'), x JSON, y POINT, z INET6, zz UUID)")
    sql.run("INSERT INTO t VALUES (18446744073709551615, -128, 65535, -8388608, 4294967295, "
            "-12345678901234.123456, 1.5, -2.25e100, b'1', b'101010101010', 2024, "
            "'2024-02-29', '-838:59:58.999', '2024-01-02 03:04:05.123456', "
            "'2024-06-01 12:00:00.25', 'ab', 'héllo wörld', REPEAT('z', 300), 'ab', 'xyz', "
            "x'00ff10', 'y', 'p,r', '{\"k\": [1, 2]}', POINT(1, 2), '::1', "
            "'123e4567-e89b-12d3-a456-426614174000')",
            "INSERT INTO t (id) VALUES (1)",
            # Edges: zero dates (the text branch), the widest values of each type, a
            # DECIMAL of 20 digits (beyond the compiled twin's 18: declined), negative
            # fractions, 4-byte UTF-8, control characters.
            "INSERT INTO t VALUES (2, 127, 0, 8388607, 0, 99999999999999.999999, "
            "-3.40282e38, 1.7976931348623157e308, b'0', b'0', 1901, '0000-00-00', "
            "'838:59:59', '0000-00-00 00:00:00', '1970-01-01 00:00:01.5', '', "
            "'tab\there\nline', '😀 ∑ ü', x'00000000', '', '', 'x', '', "
            "'{\"ü\": \"😀\", \"n\": null}', POINT(-1.5, 1e10), 'ffff::', "
            "'00000000-0000-0000-0000-000000000000')",
            "INSERT INTO t VALUES (3, -1, 1, -1, 1, -0.5, 0, -0.0, b'1', b'111111111111', "
            "2155, '9999-12-31', '-00:00:00.001', '9999-12-31 23:59:59.999999', NULL, "
            "'zzzzz', 'x', '', NULL, NULL, NULL, NULL, 'p,q,r', '[]', NULL, NULL, NULL)",
            "SET SESSION sql_mode = 'ALLOW_INVALID_DATES'",
            "INSERT INTO t VALUES (4, 0, 2, 0, 2, 0.000001, 1e-30, 5e-324, NULL, NULL, NULL, "
            "'2024-02-30', NULL, '2023-02-29 00:00:00', '2038-01-19 03:14:07.99', NULL, "
            "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
    uri = source_uri(mariadb_server, "dump2.t")
    _setup_watermark(mariadb_server, uri)

    async def main() -> None:
        async with binlog_relay(tmp_path, uri) as r:
            dump = r.relay.dumps.start_dump(
                DumpRequest(buffer=BUFFER, sources=("dump2.t",)),
                buffer_of=r.relay.fetchers.configured_buffer)
            doc = await _wait_done(r, dump.id)
            assert doc["state"] == "done", doc
            # The same rows through the log: rewrite them as they are.
            sql.txn("CREATE TEMPORARY TABLE tmp AS SELECT * FROM t", "DELETE FROM t",
                    "INSERT INTO t SELECT * FROM tmp")
            await wait_for_scn(r, sql.position())
            body = await stream_body(r)
            dumped: dict[Any, bytes] = {}
            logged: dict[Any, bytes] = {}
            for offset, header in iter_events(body):
                if header.source_id < 0 or header.op != 1:
                    continue
                event = decode_event(body, offset)
                (dumped if header.from_snapshot else logged)[event.key] = (
                    event.value, header.schema_fingerprint)
            assert set(dumped) == set(logged) and len(dumped) == 5
            for key, value in dumped.items():
                assert value == logged[key], key

    asyncio.run(main())
    sql.close()


def test_no_watermark_table_is_a_clear_error(mariadb_server: MariaDBServer,
                                            tmp_path: Path) -> None:
    sql = fresh_database(mariadb_server, "dump3")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    uri = source_uri(mariadb_server, "dump3.t", watermark_table="dump3.nowhere")

    async def main() -> None:
        async with binlog_relay(tmp_path, uri) as r:
            dump = r.relay.dumps.start_dump(DumpRequest(buffer=BUFFER, sources=("dump3.t",)),
                                            buffer_of=r.relay.fetchers.configured_buffer)
            doc = await _wait_done(r, dump.id, timeout=30)
            assert doc["state"] == "failed"
            assert "databus dump setup" in doc["error"] and "dump3.nowhere" in doc["error"]

    asyncio.run(main())
    sql.close()


def test_no_write_grant_names_the_grant(mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    sql = fresh_database(mariadb_server, "dump4")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    base_uri = source_uri(mariadb_server, "dump4.t", watermark_table="dump4.databus_watermark")
    _setup_watermark(mariadb_server, base_uri)
    admin = pymysql.connect(**mariadb_server.root_connect_kwargs())
    with admin.cursor() as cur:
        cur.execute("DROP USER IF EXISTS 'reader'@'127.0.0.1'")
        cur.execute("CREATE USER 'reader'@'127.0.0.1' IDENTIFIED BY 'readerpw'")
        cur.execute("GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO "
                    "'reader'@'127.0.0.1'")
    admin.close()
    uri = base_uri.replace(f"{mariadb_server.user}:", "reader:", 1).replace(
        f":{mariadb_server.password}@", ":readerpw@", 1)

    async def main() -> None:
        async with binlog_relay(tmp_path, uri) as r:
            dump = r.relay.dumps.start_dump(DumpRequest(buffer=BUFFER, sources=("dump4.t",)),
                                            buffer_of=r.relay.fetchers.configured_buffer)
            doc = await _wait_done(r, dump.id, timeout=30)
            assert doc["state"] == "failed"
            assert "GRANT SELECT, INSERT, DELETE ON `dump4`.`databus_watermark`" in doc["error"]
            assert "readerpw" not in doc["error"]

    asyncio.run(main())
    sql.close()


def test_table_without_primary_key_is_refused(mariadb_server: MariaDBServer,
                                             tmp_path: Path) -> None:
    sql = fresh_database(mariadb_server, "dump5")
    sql.run("CREATE TABLE nokey (a INT, b INT)", "INSERT INTO nokey VALUES (1, 2)",
            "CREATE TABLE ok (id INT PRIMARY KEY)", "INSERT INTO ok VALUES (1), (2)")
    uri = source_uri(mariadb_server, "dump5.nokey,dump5.ok")
    _setup_watermark(mariadb_server, uri)

    async def main() -> None:
        async with binlog_relay(tmp_path, uri) as r:
            dump = r.relay.dumps.start_dump(
                DumpRequest(buffer=BUFFER, sources=("dump5.nokey", "dump5.ok")),
                buffer_of=r.relay.fetchers.configured_buffer)
            doc = await _wait_done(r, dump.id, timeout=30)
            assert doc["state"] == "failed"
            tables = {t["source"]: t for t in doc["tables"]}
            assert tables["dump5.nokey"]["state"] == "failed"
            assert "no primary key" in tables["dump5.nokey"]["error"]
            assert tables["dump5.ok"]["state"] == "done" and tables["dump5.ok"]["rows"] == 2

    asyncio.run(main())
    sql.close()


def test_chunks_too_big_for_the_buffer_are_read_smaller(mariadb_server: MariaDBServer,
                                                       tmp_path: Path) -> None:
    """10,000 rows of 1 KB would be a 10 MB window in a 1 MiB buffer (which would stop
    the fetcher for good): the engine reads smaller chunks instead."""
    sql = fresh_database(mariadb_server, "dump6")
    sql.run("CREATE TABLE big (id INT PRIMARY KEY, pad VARCHAR(1100))")
    sql.run("INSERT INTO big VALUES " + ", ".join(
        f"({i}, REPEAT('x', 1000))" for i in range(1500)))
    uri = source_uri(mariadb_server, "dump6.big")
    _setup_watermark(mariadb_server, uri)

    async def main() -> None:
        async with binlog_relay(tmp_path, uri, capacity_mb=1) as r:
            dump = r.relay.dumps.start_dump(
                DumpRequest(buffer=BUFFER, sources=("dump6.big",), chunk_rows=10_000),
                buffer_of=r.relay.fetchers.configured_buffer)
            doc = await _wait_done(r, dump.id, timeout=60)
            assert doc["state"] == "done", doc
            table = doc["tables"][0]
            assert table["rows"] == 1500 and table["chunks"] >= 6
            status_doc = await r.json("/v1/status")
            assert status_doc["buffers"][BUFFER]["fetcher"]["state"] == "running"

    asyncio.run(main())
    sql.close()


def test_a_client_sees_the_dump_between_its_markers(mariadb_server: MariaDBServer,
                                                    tmp_path: Path) -> None:
    from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore

    sql = fresh_database(mariadb_server, "dump7")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            "INSERT INTO t VALUES " + ", ".join(f"({i}, {i})" for i in range(250)),
            "CREATE TABLE empty_one (id INT PRIMARY KEY)")
    uri = source_uri(mariadb_server, "dump7.t,dump7.empty_one")
    _setup_watermark(mariadb_server, uri)
    calls: list[tuple[str, Any]] = []

    class Recorder(Consumer):
        def on_dump_start(self, source: str) -> None:
            calls.append(("start", source))

        def on_dump_end(self, source: str) -> None:
            calls.append(("end", source))

        def on_data_event(self, event: DataEvent) -> None:
            calls.append(("row" if event.from_dump else "change", event.key))

    async def main() -> None:
        async with binlog_relay(tmp_path, uri) as r:
            client = DatabusClient([r.url], sources=["dump7.t", "dump7.empty_one"],
                                   checkpoint_store=MemoryCheckpointStore(), poll_wait_ms=100)
            client.register(Recorder())
            task = asyncio.create_task(client.run_async())
            sql.txn("UPDATE t SET v = -1 WHERE id = 3")
            dump = r.relay.dumps.start_dump(
                DumpRequest(buffer=BUFFER, sources=("dump7.t", "dump7.empty_one"),
                            chunk_rows=100),
                buffer_of=r.relay.fetchers.configured_buffer)
            assert (await _wait_done(r, dump.id))["state"] == "done"
            deadline = time.monotonic() + 30
            while calls.count(("end", "dump7.empty_one")) == 0:
                assert time.monotonic() < deadline, calls
                await asyncio.sleep(0.05)
            client.stop()
            await asyncio.wait_for(task, 30)
        assert calls[0] == ("change", 3)
        t_start, t_end = calls.index(("start", "dump7.t")), calls.index(("end", "dump7.t"))
        rows = [c[1] for c in calls[t_start:t_end] if c[0] == "row"]
        # Each key once, between the markers; in key order within each chunk's window
        # only, since the table's key ranges are read in parallel (docs/dumps.md).
        assert sorted(rows) == list(range(250))
        assert not [c for c in calls if c[0] == "row" and c not in calls[t_start:t_end]]
        e_start = calls.index(("start", "dump7.empty_one"))
        assert calls[e_start + 1] == ("end", "dump7.empty_one")

    asyncio.run(main())
    sql.close()
