"""Unknown sources fail fast; a source waited for says why (issue 28 item 6, DESIGN 17).

Real MariaDB:
- a name that no configured table or pattern of the relay can ever match is
  ``unknown_source`` at once, with a did-you-mean from the relay's catalog, in the HTTP
  error, from ``DatabusClient.run`` and from ``databus tail`` (one line, status 1);
- a name that matches a pattern (``db.*``) but is absent is waited for, and the client's
  waiting line says "no such table at the source yet (did you mean db.actor?)", then
  its rows flow once the table exists;
- a real table whose database the relay's user cannot see (only the documented binlog
  grants) is waited for with "not visible to the relay's user", not "does not exist".
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pymysql
import pytest

from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from databus.errors import UnknownSourceError
from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import binlog_relay, fresh_database, source_uri
from tests.waiting import async_wait_until

DB = "unknown_src"


class Collect(Consumer):
    def __init__(self) -> None:
        self.keys: list[object] = []

    def on_data_event(self, event: DataEvent) -> None:
        self.keys.append(event.key)


def _client(url: str, source: str) -> DatabusClient:
    return DatabusClient([url], sources=[source], poll_wait_ms=200,
                         checkpoint_store=MemoryCheckpointStore())


async def _waiting(url: str, source: str, caplog: pytest.LogCaptureFixture
                   ) -> tuple[Collect, DatabusClient, asyncio.Task[None], str]:
    """A client of ``source`` started, once it logged its waiting line: that line."""
    collect = Collect()
    client = _client(url, source)
    client.register(collect)
    with caplog.at_level(logging.WARNING):
        run = asyncio.create_task(client.run_async())
        await async_wait_until(lambda: "waiting for it" in caplog.text,
                               "the client's waiting line", 60)
    line = next(r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage())
    return collect, client, run, line


def test_a_name_no_configuration_matches_is_unknown_at_once_with_a_suggestion(
        mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    sql = fresh_database(mariadb_server, DB)
    sql.run("CREATE TABLE actor (id INT PRIMARY KEY)", "CREATE TABLE film (id INT PRIMARY KEY)")
    uri = source_uri(mariadb_server, f"{DB}.actor,{DB}.film")

    async def scenario() -> None:
        async with binlog_relay(tmp_path, uri) as relay:
            async with await relay.get("/v1/stream", sources=f"{DB}.actors") as resp:
                assert resp.status == 404
                doc = await resp.json()
            assert doc["error"] == "unknown_source"
            assert f"did you mean {DB}.actor?" in doc["message"], doc
            client = _client(relay.url, f"{DB}.actors")
            client.register(Collect())
            with pytest.raises(UnknownSourceError) as raised:
                async with asyncio.timeout(60):  # at once: well inside this bound
                    await client.run_async()
            assert f"did you mean {DB}.actor?" in str(raised.value)
            tail = await asyncio.to_thread(
                subprocess.run,
                [str(Path(sys.executable).with_name("databus")), "tail", "--relay", relay.url,
                 "--sources", f"{DB}.actors"],
                capture_output=True, text=True, timeout=60)
            assert tail.returncode != 0
            assert "Traceback" not in tail.stderr
            assert f"did you mean {DB}.actor?" in tail.stderr, tail.stderr

    asyncio.run(scenario())


def test_a_pattern_name_that_is_absent_waits_and_says_no_such_table(
        mariadb_server: MariaDBServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = DB + "_pattern"
    sql = fresh_database(mariadb_server, db)
    sql.run("CREATE TABLE actor (id INT PRIMARY KEY)")
    uri = source_uri(mariadb_server, f"{db}.*")

    async def scenario() -> None:
        async with binlog_relay(tmp_path, uri) as relay:
            collect, client, run, line = await _waiting(relay.url, f"{db}.actors", caplog)
            assert "no such table at the source yet" in line, line
            assert f"did you mean {db}.actor?" in line, line
            # The table created after all: its rows flow to the waiting consumer.
            sql.run("CREATE TABLE actors (id INT PRIMARY KEY)")
            sql.txn("INSERT INTO actors VALUES (1), (2)")
            await async_wait_until(lambda: len(collect.keys) == 2, "both rows", 60)
            client.stop()
            await run

    asyncio.run(scenario())


def test_a_table_the_relay_user_cannot_see_is_waited_for_as_not_visible(
        mariadb_server: MariaDBServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = DB + "_grants"
    sql = fresh_database(mariadb_server, db)
    sql.run("CREATE TABLE actor (id INT PRIMARY KEY)")
    user = "unknown_src_repl"
    admin = pymysql.connect(autocommit=True, **mariadb_server.root_connect_kwargs())
    with admin.cursor() as cur:
        cur.execute(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")
        cur.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw12345'")
        # The documented binlog grants, nothing on the database.
        cur.execute(f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'127.0.0.1'")
    admin.close()
    uri = source_uri(mariadb_server, f"{db}.*").replace(
        f"{mariadb_server.user}:{mariadb_server.password}@", f"{user}:pw12345@")

    async def scenario() -> None:
        async with binlog_relay(tmp_path, uri) as relay:
            collect, client, run, line = await _waiting(relay.url, f"{db}.actor", caplog)
            assert "not visible to the relay's user" in line, line
            assert "does not exist" not in line, line
            # Its first change makes it known all the same.
            sql.txn("INSERT INTO actor VALUES (7)")
            await async_wait_until(lambda: len(collect.keys) == 1, "the row", 60)
            client.stop()
            await run

    asyncio.run(scenario())
