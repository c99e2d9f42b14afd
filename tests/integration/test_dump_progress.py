"""Dump progress and how a dump's tables end (issue 27 item 8), against the real MariaDB
through a real relay:

- a multi-table dump reports percent and ETA of the whole dump from its first poll
  (every table estimated when the dump starts), percent never going back;
- ``rows_per_second`` after a relay killed with SIGKILL and restarted is rows over the
  whole running time (``dumps.json`` keeps the running time with the rows);
- a cancelled or failed dump leaves no table ``running`` or ``pending``, and a table
  whose start marker consumers saw gets an end marker with its outcome: a consumer
  sees ``on_dump_end(source, outcome)`` for done, failed and cancelled tables, and one
  written before outcomes (``on_dump_end(self, source)``) still gets its call.

``DATABUS_DUMP_ROWS`` sets the table size (3000 by default), as in the other dump tests.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from databus.client import CallbackResult, Consumer, DatabusClient, MemoryCheckpointStore
from databus.event import DUMP_END_SOURCE_ID, DUMP_START_SOURCE_ID
from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.integration.binlog_support import BUFFER, Sql, binlog_relay
from tests.integration.test_dump_failures import (
    ROWS,
    RelayProc,
    _admin,
    _chunks,
    _create,
    _get,
    _post,
    _session,
    _setup,
    _uri,
    read_stream,
    start_dump,
    wait_dump,
    wait_finished,
)
from tests.relay_harness import relay_config, running_relay
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

FINISHED = ("done", "failed", "cancelled")


def _analyze(sql: Sql, *tables: str) -> None:
    """Fresh InnoDB statistics: the estimates the dump reads come from them."""
    for table in tables:
        sql.query(f"ANALYZE TABLE {table}")


def test_percent_covers_every_table_from_the_first_poll(mariadb_server: MariaDBServer,
                                                        tmp_path: Path) -> None:
    db = "dprog_percent"
    sizes = {"big": ROWS, "mid": ROWS // 2, "small": ROWS // 3}
    sql = _setup(mariadb_server, db, sizes["big"], table="big")
    _create(sql, "mid", sizes["mid"])
    _create(sql, "small", sizes["small"])
    _analyze(sql, *sizes)
    sources = [f"{db}.{t}" for t in sizes]
    total = sum(sizes.values())

    async def main() -> list[dict[str, Any]]:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db, ",".join(sizes)),
                                capacity_mb=32) as r:
            s, url = r.session, r.url
            dump = await start_dump(s, url, sources, chunk_rows=max(20, ROWS // 15),
                                    delay_ms=20)
            polls = [dump]
            while polls[-1]["state"] not in FINISHED:
                polls.append(await _get(s, f"{url}/v1/dumps/{dump['id']}"))
                await asyncio.sleep(0.02)
            return polls

    polls = asyncio.run(main())
    assert polls[-1]["state"] == "done", polls[-1]
    percents = [p["progress"]["percent"] for p in polls]
    assert None not in percents, percents
    assert percents == sorted(percents), f"percent went back: {percents}"
    assert percents[-1] == 100.0
    started = [p for p in polls if p["progress"]["rows"] > 0 and p["state"] != "done"]
    assert len(started) >= 3, "too few polls while the dump ran"
    first = started[0]
    # While the first table is being dumped, every table has its estimate already: the
    # whole dump's estimate, and an ETA for all of it.
    assert first["progress"]["table"] == sources[0], first
    assert all(t["estimate"] > 0 for t in first["tables"]), first["tables"]
    assert total / 2 <= first["progress"]["estimate"] <= total * 2, first["progress"]
    assert all(p["progress"]["eta_seconds"] is not None for p in started), [
        (p["progress"], [(t["estimate"], t["rows"], t["state"]) for t in p["tables"]])
        for p in started if p["progress"]["eta_seconds"] is None]
    assert first["progress"]["percent"] < 100.0 * sizes["big"] / total + 5
    sql.close()


def test_rate_is_over_the_whole_running_time_across_a_restart(
        mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    db = "dprog_rate"
    source = f"{db}.items"
    sql = _setup(mariadb_server, db, ROWS)
    relay = RelayProc(tmp_path, _uri(mariadb_server, db))
    chunk_rows = max(10, ROWS // 30)

    async def main() -> None:
        relay.start()
        async with _session() as s:
            url = relay.url
            dump = await start_dump(s, url, [source], chunk_rows=chunk_rows, delay_ms=100)
            await wait_dump(s, url, dump["id"], lambda d: _chunks(d) >= 5, what="5 chunks",
                            every=0.05)
            relay.kill()
            saved = relay.saved(dump["id"])
            saved_rows = sum(t["rows"] for t in saved["tables"])
            # The running time was saved with the rows of the last completed chunk.
            assert saved_rows > 0 and saved["run_seconds"] > 0, saved
            restarted = time.monotonic()
            relay.start()
            doc = await wait_dump(s, url, dump["id"],
                                  lambda d: _chunks(d) >= saved["tables"][0]["chunks"] + 3,
                                  what="3 chunks after the restart", every=0.05)
            polled = time.monotonic()
            progress = doc["progress"]
            assert progress["rows"] > saved_rows
            seconds = progress["rows"] / progress["rows_per_second"]
            # Rows over the whole running time: the time saved before the kill, plus at
            # most the time since the restart (the relay down in between is not
            # running time). The rate is rounded to 0.1 rows/s: 1 % of slack.
            assert seconds >= saved["run_seconds"] * 0.99, (progress, saved)
            assert seconds <= (saved["run_seconds"] + (polled - restarted)) * 1.01, (
                progress, saved, polled - restarted)
            status, _ = await _post(s, f"{url}/v1/admin/dumps/{dump['id']}/cancel")
            assert status == 200

    try:
        asyncio.run(main())
    finally:
        relay.stop()
    sql.close()


class Markers(Consumer):
    """Records dump starts and ends (with outcome) until it saw ``want`` ends."""

    def __init__(self, want: int) -> None:
        self.want = want
        self.starts: list[str] = []
        self.ends: list[tuple[str, str]] = []
        self.client: DatabusClient | None = None

    def on_dump_start(self, source: str) -> CallbackResult | None:
        self.starts.append(source)
        return None

    def on_dump_end(self, source: str, outcome: str = "done") -> CallbackResult | None:
        self.ends.append((source, outcome))
        if len(self.ends) >= self.want and self.client is not None:
            self.client.stop()
        return None


class OldMarkers(Consumer):
    """A consumer written before outcomes existed."""

    def __init__(self) -> None:
        self.ends: list[str] = []

    def on_dump_end(self, source: str) -> CallbackResult | None:  # type: ignore[override]
        self.ends.append(source)
        return None


def test_cancelled_and_failed_tables_end_with_their_outcome(mariadb_server: MariaDBServer,
                                                            tmp_path: Path) -> None:
    db = "dprog_ends"
    sql = _setup(mariadb_server, db, ROWS, table="slow")
    _create(sql, "after", 200)
    _create(sql, "gone", 1000)
    _create(sql, "kept", 300)
    slow, after, gone, kept = (f"{db}.{t}" for t in ("slow", "after", "gone", "kept"))
    sources = [slow, after, gone, kept]
    markers, old = Markers(want=3), OldMarkers()

    async def main() -> tuple[dict[str, Any], dict[str, Any], Any]:
        async with binlog_relay(tmp_path, _uri(mariadb_server, db, "slow,after,gone,kept"),
                                capacity_mb=32) as r:
            s, url = r.session, r.url
            client = DatabusClient([url], sources=sources, poll_wait_ms=200,
                                   checkpoint_store=MemoryCheckpointStore())
            markers.client = client
            client.register(markers)
            client.register(old)
            consuming = asyncio.ensure_future(client.run_async())
            # A table dropped during its dump fails; the next table is dumped whole.
            failing = await start_dump(s, url, [gone, kept], chunk_rows=50, delay_ms=50)
            await wait_dump(s, url, failing["id"], lambda d: _chunks(d, gone) >= 2,
                            what="2 chunks of the dropped table")
            sql.run("DROP TABLE gone")
            failed = await wait_finished(s, url, failing["id"])
            # A dump cancelled during its first table: that table and the one after.
            cancelling = await start_dump(s, url, [slow, after],
                                          chunk_rows=max(20, ROWS // 20), delay_ms=50)
            await wait_dump(s, url, cancelling["id"], lambda d: _chunks(d) >= 2,
                            what="2 chunks")
            status, doc = await _post(s, f"{url}/v1/admin/dumps/{cancelling['id']}/cancel")
            assert status == 200 and doc["state"] == "cancelled", doc
            await asyncio.wait_for(consuming, 60)
            cancelled = await _get(s, f"{url}/v1/dumps/{cancelling['id']}")
            return failed, cancelled, await read_stream(s, url)

    failed, cancelled, stream = asyncio.run(main())
    states = {t["source"]: t["state"] for t in failed["tables"] + cancelled["tables"]}
    assert failed["state"] == "failed" and cancelled["state"] == "cancelled"
    assert states == {gone: "failed", kept: "done", slow: "cancelled", after: "cancelled"}
    rows = {t["source"]: t["rows"] for t in failed["tables"] + cancelled["tables"]}
    assert 0 < rows[slow] < ROWS and rows[after] == 0
    # Consumers: every table whose dump started ended, with its outcome, in order.
    assert markers.starts == [gone, kept, slow]
    assert markers.ends == [(gone, "failed"), (kept, "done"), (slow, "cancelled")]
    assert old.ends == [gone, kept, slow]
    # On the wire: the outcome only where it is not done (a done end as it always was).
    ends = {d["source"]: d for d in stream.marker_docs(DUMP_END_SOURCE_ID)}
    assert ends[kept] == {"dump": failed["id"], "source": kept, "rows": 300}
    assert ends[gone] == {"dump": failed["id"], "source": gone, "rows": rows[gone],
                          "outcome": "failed"}
    assert ends[slow] == {"dump": cancelled["id"], "source": slow, "rows": rows[slow],
                          "outcome": "cancelled"}
    assert after not in {d["source"] for d in stream.marker_docs(DUMP_START_SOURCE_ID)}
    sql.close()


def test_owed_end_is_written_after_a_restart(mariadb_server: MariaDBServer,
                                             tmp_path: Path) -> None:
    """A relay killed between a cancel and the cancelled table's end marker writes the
    marker when it comes back (``dumps.json`` says the table owes it)."""
    db = "dprog_owed"
    source = f"{db}.items"
    sql = _setup(mariadb_server, db, ROWS)
    relay = RelayProc(tmp_path, _uri(mariadb_server, db))

    async def main() -> Any:
        relay.start()
        async with _session() as s:
            url = relay.url
            dump = await start_dump(s, url, [source], chunk_rows=max(10, ROWS // 30),
                                    delay_ms=50)
            await wait_dump(s, url, dump["id"], lambda d: _chunks(d) >= 2, what="2 chunks",
                            every=0.05)
            # The watermark table locked: the engine cannot write the end marker (it
            # travels through the log, after a watermark) before the kill.
            admin = _admin(mariadb_server)
            try:
                with admin.cursor() as cur:
                    cur.execute(f"LOCK TABLES {db}.databus_watermark WRITE")
                status, _ = await _post(s, f"{url}/v1/admin/dumps/{dump['id']}/cancel")
                assert status == 200
                relay.kill()
                saved = relay.saved(dump["id"])
                assert saved["state"] == "cancelled"
                assert [(t["state"], t["started"], t["ended"]) for t in saved["tables"]] == [
                    ("cancelled", True, False)], saved
                with admin.cursor() as cur:
                    cur.execute("UNLOCK TABLES")
            finally:
                admin.close()
            relay.start()

            async def ended() -> bool:
                record = await _get(s, f"{url}/v1/dumps/{dump['id']}")
                return all(t["ended"] for t in record["tables"])

            await async_wait_until(ended, "the cancelled table's end marker", 30)
            return await read_stream(s, url), dump["id"]

    try:
        stream, dump_id = asyncio.run(main())
    finally:
        relay.stop()
    ends = stream.marker_docs(DUMP_END_SOURCE_ID)
    assert [(d["dump"], d["outcome"]) for d in ends] == [(dump_id, "cancelled")]
    sql.close()


def test_postgres_txlog_percent_and_a_cancelled_table(postgres_server: PostgresServer,
                                                      tmp_path: Path) -> None:
    """The same promises on a PostgreSQL (TxLog) source: percent of a dump of three
    tables from the first poll and never going back; a second dump cancelled during its
    first table leaves both tables ``cancelled`` and ends the started one "cancelled"."""
    from tests.integration.test_txlog_dump_postgres import (
        ITEMS,
        PAIRS,
        TABLES,
        TAGS,
        _dump_setup,
        _source,
    )
    from tests.integration.test_txlog_dump_postgres import read_stream as read_pg_stream

    pg = _source(postgres_server, "dprog_txlog")
    uri = pg.uri(TABLES)
    assert _dump_setup(uri)[0] == 0
    config = relay_config(tmp_path, {BUFFER: uri}, capacity_mb=64)
    chunk_rows = max(20, ROWS // 15)

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
        async with running_relay(config) as r:
            s, url = r.session, r.url
            dump = await start_dump(s, url, [ITEMS, TAGS, PAIRS], chunk_rows=chunk_rows,
                                    delay_ms=20)
            polls = [dump]
            while polls[-1]["state"] not in FINISHED:
                polls.append(await _get(s, f"{url}/v1/dumps/{dump['id']}"))
                await asyncio.sleep(0.02)
            second = await start_dump(s, url, [ITEMS, TAGS], chunk_rows=chunk_rows,
                                      delay_ms=100)
            await wait_dump(s, url, second["id"], lambda d: _chunks(d) >= 2, what="2 chunks")
            status, _ = await _post(s, f"{url}/v1/admin/dumps/{second['id']}/cancel")
            assert status == 200

            async def ended() -> dict[str, Any] | None:
                doc: dict[str, Any] = await _get(s, f"{url}/v1/dumps/{second['id']}")
                return doc if all(t["ended"] or not t["started"] for t in doc["tables"]) \
                    else None

            cancelled = await async_wait_until(ended, "the cancelled table's end", 30)
            return polls, cancelled, await read_pg_stream(s, url)

    polls, cancelled, stream = asyncio.run(main())
    assert polls[-1]["state"] == "done", polls[-1]
    percents = [p["progress"]["percent"] for p in polls]
    assert None not in percents and percents == sorted(percents), percents
    assert percents[-1] == 100.0
    running = [p for p in polls if p["progress"]["rows"] > 0 and p["state"] != "done"]
    assert running and all(t["estimate"] > 0 for t in running[0]["tables"]), running[:1]
    assert running[0]["progress"]["estimate"] == 2 * ROWS  # TxLog counts: exact
    assert [(t["source"], t["state"]) for t in cancelled["tables"]] == [
        (ITEMS, "cancelled"), (TAGS, "cancelled")]
    (end,) = [d for d in stream.marker_docs(DUMP_END_SOURCE_ID)
              if d["dump"] == cancelled["id"]]
    assert end == {"dump": cancelled["id"], "source": ITEMS, "outcome": "cancelled",
                   "rows": cancelled["tables"][0]["rows"]}
    pg.conn.close()
