"""Issue 13's acceptance on MariaDB, through ``databus relay`` processes and a real
``DatabusClient``:

1. a table loaded before the relay started is dumped while a writer updates, inserts,
   deletes and replaces random rows in one-row transactions (about 1,000 a second on an
   idle machine); a consumer that started before the dump and applies every window ends
   equal to the source table, by a checksum the source computes (``COUNT`` and the sum
   of ``CRC32`` of every row) and row by row; the same with the relay killed with
   SIGKILL in the middle of the dump and restarted on its data dir;
2. a schema shaped like MySQL's Sakila sample (loaded before the relay started, every
   table of the database captured with ``tables=db.*``): composite and ``SMALLINT
   UNSIGNED`` keys, ``ENUM``, ``SET``, ``YEAR``, ``DECIMAL``, ``BLOB``, ``GEOMETRY``,
   ``TEXT`` with a ``FULLTEXT`` index, ``TIMESTAMP ... ON UPDATE``, foreign keys,
   triggers and views; every table dumped at once while the writer changes one of them.
   Each dumped row must have the schema version and the value the binlog path gives the
   same row (every row is rewritten afterwards, so the log carries it), and the stream's
   replica must equal the rewritten state, table by table.

``DATABUS_DUMP_ACCEPTANCE_ROWS`` sets the size of the table of (1) (5,000 in ``make test``;
the issue's 1,000,000 in ``make test-full``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from databus.client import Consumer, DatabusClient, DataEvent, FileCheckpointStore
from databus.fetchers.mysql import BinlogSourceConfig
from databus.fetchers.mysql._dump import setup_statements
from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import BUFFER, Sql, fresh_database, source_uri
from tests.integration.sakila_support import SAKILA_TABLES, FilmWriter, load_sakila_shape
from tests.integration.test_dump_failures import (
    RelayProc,
    _create,
    _get,
    _post,
    _session,
    _uri,
    read_stream,
    start_dump,
    wait_dump,
    wait_running,
    wait_scn,
    writing,
)
from tests.tiers import count
from tests.waiting import async_wait_until

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

ROWS = count("DATABUS_DUMP_ACCEPTANCE_ROWS", smoke=5_000, full=1_000_000)
# Seconds to wait for the dump and the consumer: generous per row (a busy 2-core CI).
PATIENCE = 120 + ROWS / 2000


class Replica(Consumer):
    """A consumer keeping ``source`` as a dict by key, as a user's would. The dump
    markers it saw are kept with their window's SCN: after a relay kill the client may
    roll back and replay the windows after its last checkpoint (the promise: duplicates
    only as whole replayed windows), and a replayed marker is not a second dump."""

    def __init__(self) -> None:
        self.rows: dict[Any, dict[str, Any]] = {}
        self.scn = 0
        self.dumped = 0
        self._window = -1
        self._starts: list[tuple[int, str]] = []
        self._ends: list[tuple[int, str]] = []
        self.lock = threading.Lock()

    @property
    def dump_starts(self) -> list[str]:
        return [source for _, source in self._starts]

    @property
    def dump_ends(self) -> list[str]:
        return [source for _, source in self._ends]

    def on_start_data_event_sequence(self, scn: int) -> None:
        self._window = scn

    def on_rollback(self, scn: int) -> None:
        # The windows after ``scn`` come again, with their markers.
        self._starts = [m for m in self._starts if m[0] <= scn]
        self._ends = [m for m in self._ends if m[0] <= scn]

    def on_data_event(self, event: DataEvent) -> None:
        with self.lock:
            if event.is_delete:
                self.rows.pop(event.key, None)
            else:
                assert event.value is not None
                self.rows[event.key] = event.value
            self.dumped += event.from_dump

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.scn = max(self.scn, scn)

    def on_dump_start(self, source: str) -> None:
        self._starts.append((self._window, source))

    def on_dump_end(self, source: str) -> None:
        self._ends.append((self._window, source))


def _row_text(values: list[Any]) -> str:
    """What MariaDB's ``CONCAT_WS('|', ...)`` makes of the values (NULLs skipped)."""
    return "|".join(str(v) for v in values if v is not None)


def source_checksum(sql: Sql) -> tuple[int, int]:
    (count, crc), = sql.query(
        "SELECT COUNT(*), COALESCE(SUM(CRC32(CONCAT_WS('|', id, name, qty, price))), 0) "
        "FROM items")
    return int(count), int(crc)


def replica_checksum(rows: dict[Any, dict[str, Any]]) -> tuple[int, int]:
    crc = 0
    for key, row in rows.items():
        price = row["price"]
        assert price is None or isinstance(price, Decimal), price
        crc += zlib.crc32(_row_text([key, row["name"], row["qty"], price]).encode())
    return len(rows), crc


@pytest.mark.parametrize("kill", [False, True], ids=["plain", "relay-kill-9"])
def test_a_dump_under_writes_gives_a_consumer_the_source_table(
        mariadb_server: MariaDBServer, tmp_path: Path, kill: bool) -> None:
    db = f"dacc_{'kill' if kill else 'plain'}"
    source = f"{db}.items"
    sql = fresh_database(mariadb_server, db)
    sql.run(*setup_statements(BinlogSourceConfig.from_uri(_uri(mariadb_server, db))))
    _create(sql, "items", ROWS)  # before the relay exists: only a dump can bring it
    relay = RelayProc(tmp_path, _uri(mariadb_server, db), capacity_mb=64 + ROWS // 4000)
    replica = Replica()

    async def main() -> None:
        async with _session() as s:
            relay.start()
            client_task: asyncio.Task[None] | None = None
            try:
                await wait_running(s, relay.url)
                client = DatabusClient([relay.url], sources=[source],
                                       checkpoint_store=FileCheckpointStore(tmp_path / "cp"),
                                       poll_wait_ms=200, backoff_max=0.5)
                client.register(replica)
                client_task = asyncio.create_task(client.run_async())
                with writing(mariadb_server, db, ROWS) as writer:
                    await async_wait_until(lambda: replica.scn > 0,
                                           "the consumer following the writes before the dump")
                    dump_id = (await start_dump(s, relay.url, [source],
                                                chunk_rows=max(1000, ROWS // 40),
                                                delay_ms=0))["id"]
                    if kill:
                        await wait_dump(s, relay.url, dump_id,
                                        lambda d: (d["progress"]["percent"] or 0) >= 40,
                                        what="40 %", timeout=PATIENCE, every=0.05)
                        relay.kill()
                        relay.start()
                        await wait_running(s, relay.url)
                    doc = await wait_dump(s, relay.url, dump_id,
                                          lambda d: d["state"] != "running"
                                          and d["state"] != "queued",
                                          what="finished", timeout=PATIENCE, every=0.1)
                    assert doc["state"] == "done", doc
                    await asyncio.sleep(0.5)  # writes after the dump, too
                    writer.finish()
                    assert writer.transactions > 0
                final = sql.position()
                await wait_scn(s, relay.url, final, timeout=PATIENCE)
                deadline = time.monotonic() + PATIENCE
                while replica.scn < final:
                    assert not client_task.done(), client_task.result()
                    assert time.monotonic() < deadline, (replica.scn, final)
                    await asyncio.sleep(0.1)
                client.stop()
                await asyncio.wait_for(client_task, 30)
                status = (await _get(s, relay.url + "/v1/status"))["buffers"][BUFFER]
                assert status["fetcher"]["state"] == "running", status
            finally:
                if client_task is not None and not client_task.done():
                    client_task.cancel()
                relay.stop()

    asyncio.run(main())
    expected = source_checksum(sql)
    got = replica_checksum(replica.rows)
    if got != expected:  # say which rows, not only that the sums differ
        source = {r[0]: (r[1], r[2], r[3])
                  for r in sql.query("SELECT id, name, qty, price FROM items")}
        mine = {k: (v["name"], v["qty"], v["price"]) for k, v in replica.rows.items()}
        wrong = sorted(k for k in source.keys() | mine.keys() if source.get(k) != mine.get(k))
        raise AssertionError(f"checksum {got} != source {expected}; {len(wrong)} rows "
                             f"differ, e.g. {[(k, source.get(k), mine.get(k)) for k in wrong[:5]]}")
    assert replica.dumped >= ROWS // 2  # the rows that existed came in through the dump
    assert replica.dump_starts.count(source) >= 1
    if kill:
        # Killed as the dump ends (the 40 % seen, then the rest done before the kill
        # lands, on a busy machine), the relay resumes the dump from its last recorded
        # chunk and ends it again: a duplicate after a kill (docs/decisions.md).
        assert replica.dump_ends in ([source], [source, source]), replica.dump_ends
    else:
        assert replica.dump_ends == [source]
    sql.close()


def test_a_sakila_shaped_database_is_dumped_as_the_binlog_encodes_it(
        mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    db = "dacc_sakila"
    sql = fresh_database(mariadb_server, db)
    uri = source_uri(mariadb_server, f"{db}.*", watermark_table=f"{db}.databus_watermark")
    sql.run(*setup_statements(BinlogSourceConfig.from_uri(uri)))
    load_sakila_shape(sql)
    relay = RelayProc(tmp_path, uri)
    sources = [f"{db}.{t}" for t in SAKILA_TABLES]

    async def main() -> None:
        async with _session() as s:
            relay.start()
            try:
                await wait_running(s, relay.url)
                writer = FilmWriter(mariadb_server, db)
                writer.start()
                try:
                    # Every table of the buffer: no "sources" in the request.
                    status, doc = await _post(s, relay.url + "/v1/admin/dumps", {"chunk_rows": 100})
                    assert status == 201, doc
                    doc = await wait_dump(s, relay.url, doc["id"],
                                          lambda d: d["state"] not in ("running", "queued"),
                                          what="finished", timeout=120, every=0.05)
                    assert doc["state"] == "done", doc
                    # Every table, and neither the view nor the watermark table.
                    assert sorted(t["source"] for t in doc["tables"]) == sorted(sources), doc
                finally:
                    writer.finish()
                assert writer.transactions > 0
                before = await read_stream(s, relay.url)
                # Every row again through the log, as it is now (triggers off: they
                # would write film_text a second time; a DROP TRIGGER is no schema
                # change for the fetcher).
                sql.run("DROP TRIGGER ins_film", "DROP TRIGGER upd_film",
                        "DROP TRIGGER del_film")
                for table in SAKILA_TABLES:
                    sql.txn("SET FOREIGN_KEY_CHECKS = 0",
                            f"CREATE TEMPORARY TABLE tmp_{table} AS SELECT * FROM {table}",
                            f"DELETE FROM {table}",
                            f"INSERT INTO {table} SELECT * FROM tmp_{table}",
                            f"DROP TEMPORARY TABLE tmp_{table}", "SET FOREIGN_KEY_CHECKS = 1")
                await wait_scn(s, relay.url, sql.position())
                after = await read_stream(s, relay.url)
            finally:
                relay.stop()
        cut = max(r.scn for r in before.records)
        for source in sources:
            replica = before.replica(source)
            rewritten = {r.key: r for r in after.of(source)
                         if r.scn > cut and r.op == "upsert"}
            assert replica.keys() == rewritten.keys(), source
            assert replica == {k: r.row for k, r in rewritten.items()}, source
            dumped = before.dumped(source)
            assert dumped, source
            # Byte-level: a dumped row not changed since has the logged row's value.
            for rec in dumped:
                later = [r for r in before.of(source) if r.key == rec.key and r.scn > rec.scn]
                if not later:
                    assert rec.fingerprint == rewritten[rec.key].fingerprint, source
                    assert rec.row == rewritten[rec.key].row, (source, rec.key)

    asyncio.run(main())
    sql.close()

