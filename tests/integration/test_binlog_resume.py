"""Resume: a fetcher stopped at a random window and restarted from the buffer's max SCN
produces exactly the remaining windows; across a binlog rotation SCNs keep rising; a
MariaDB restart (clean or crash) mid-stream loses and repeats nothing."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from databus.fetchers.mysql import split_scn
from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import (
    Sql,
    binlog_relay,
    captured,
    fresh_database,
    source_uri,
    status,
    summary,
    wait_for_scn,
    wait_until,
)

DB = "bl_resume"


def _expected(first: int, count: int) -> list[list[tuple[str, str, int, dict[str, object]]]]:
    return [[(f"{DB}.t", "upsert", i, {"id": i, "v": f"row {i}"})]
            for i in range(first, first + count)]


def test_stop_at_a_random_window_and_resume(mariadb_server: MariaDBServer,
                                            tmp_path: Path) -> None:
    sql = fresh_database(mariadb_server, DB)
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    uri = source_uri(mariadb_server, f"{DB}.t")
    rng = random.Random(4)
    scns: list[int] = []

    def write(first: int, count: int) -> None:
        for i in range(first, first + count):
            if i == 25:
                sql.run("FLUSH BINARY LOGS")  # a rotation in the middle of it all
            scns.append(sql.txn(f"INSERT INTO t VALUES ({i}, 'row {i}')"))

    async def first_run() -> int:
        async with binlog_relay(tmp_path, uri) as r:
            write(0, 40)
            stop_at = scns[rng.randrange(5, 35)]
            await wait_for_scn(r, stop_at)
            # The relay (and its fetcher) stops wherever it is now: at or after stop_at.
        async with binlog_relay(tmp_path, uri) as r:
            return int((await status(r))["max_scn"])

    async def second_run() -> None:
        async with binlog_relay(tmp_path, uri) as r:
            await wait_for_scn(r, scns[-1])
            windows, _ = await captured(r)
            assert [w.scn for w in windows] == scns
            assert summary(windows) == _expected(0, 50)
            # SCNs rise across the rotation: the file number went up.
            assert split_scn(scns[30])[0] == split_scn(scns[20])[0] + 1

    stopped_at = asyncio.run(first_run())
    assert stopped_at in scns
    write(40, 10)
    asyncio.run(second_run())
    sql.close()


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])
def test_mariadb_restarted_mid_stream(mariadb_server: MariaDBServer, tmp_path: Path,
                                      crash: bool) -> None:
    db = f"{DB}_restart"
    fresh_database(mariadb_server, db).run("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(9))")

    def write(ids: range, note: str) -> int:
        sql = Sql(mariadb_server, db)
        try:
            return max(sql.txn(f"INSERT INTO t VALUES ({i}, '{note}')") for i in ids)
        finally:
            sql.close()

    async def scenario() -> None:
        async with binlog_relay(tmp_path, source_uri(mariadb_server, f"{db}.t")) as r:
            await wait_for_scn(r, write(range(5), "before"))
            mariadb_server.restart(crash=crash)
            await wait_for_scn(r, write(range(5, 10), "after"))
            windows, _ = await captured(r)
            assert [[(c.key, c.row["v"]) for c in w.changes] for w in windows] == [
                [(i, "before" if i < 5 else "after")] for i in range(10)
            ]
            fetcher = (await status(r))["fetcher"]
            assert fetcher["restarts"] >= 1  # the stream broke and was resumed
            assert fetcher["last_error"].startswith("SourceError: ")  # retriable


def test_idle_source_reads_lag_zero(mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    """Heartbeats: idle, or busy only with tables not captured, the lag reads 0."""
    sql = fresh_database(mariadb_server, f"{DB}_idle")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE other (id INT PRIMARY KEY)")

    async def scenario() -> None:
        async with binlog_relay(tmp_path, source_uri(mariadb_server, f"{DB}_idle.t")) as r:
            last = sql.txn("INSERT INTO t VALUES (1)")
            await wait_for_scn(r, last)
            for i in range(20):
                sql.txn(f"INSERT INTO other VALUES ({i})")
            await wait_until(
                r, lambda s: s["fetcher"]["lag_scn"] == 0 and s["fetcher"]["source_scn"] == last,
                what="lag 0 after changes to tables that are not captured",
            )
            doc = await status(r)
            assert doc["max_scn"] == last

    asyncio.run(scenario())
    sql.close()
