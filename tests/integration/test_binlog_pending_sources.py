"""A consumer deployed with its relay before the schema migration (issue 12, defect 13).

Real MariaDB: a relay with ``tables=db.orders`` starts before the table exists; it lists
the source at once (state ``pending``, an id that survives a restart, no fingerprint),
a ``DatabusClient`` and a ``databus tail`` process subscribe and wait; then CREATE TABLE
(a QueryEvent in the binlog: the relay lists the source ``active`` before any row) and
inserts, and both consumers receive every row.
"""

from __future__ import annotations

import asyncio
import json
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import binlog_relay, fresh_database, source_uri
from tests.relay_harness import RunningRelay
from tests.waiting import async_wait_until

ROWS = 6


class Collect(Consumer):
    def __init__(self, want: int) -> None:
        self.want = want
        self.rows: list[tuple[str, Any, Any]] = []
        self.client: DatabusClient | None = None

    def on_data_event(self, event: DataEvent) -> None:
        self.rows.append((event.source, event.key, event.value))

    def on_end_data_event_sequence(self, scn: int) -> None:
        if len(self.rows) >= self.want and self.client is not None:
            self.client.stop()


async def listed(r: RunningRelay) -> dict[str, dict[str, Any]]:
    doc = await r.json("/v1/sources")
    return {e["name"]: e for e in doc["sources"]}


def test_consumers_started_before_create_table_get_every_row(
    mariadb_server: MariaDBServer, tmp_path: Path
) -> None:
    db = "pending_sources"
    name = f"{db}.orders"
    sql = fresh_database(mariadb_server, db)  # no table yet
    uri = source_uri(mariadb_server, name)
    stderr_path = tmp_path / "tail.err"

    async def first_start() -> int:
        async with binlog_relay(tmp_path, uri) as relay:
            entry = (await listed(relay))[name]
            assert entry["state"] == "pending" and entry["schema_fingerprint"] is None
            async with await relay.get("/v1/stream", sources=name, wait_ms="200") as resp:
                assert resp.status == 200 and await resp.read() == b""
            async with await relay.get("/v1/stream", sources=f"{db}.other") as resp:
                assert resp.status == 404
                assert (await resp.json())["error"] == "unknown_source"
            source_id: int = entry["id"]
            return source_id

    async def main(source_id: int) -> None:
        async with binlog_relay(tmp_path, uri) as relay:
            entry = (await listed(relay))[name]
            assert (entry["id"], entry["state"]) == (source_id, "pending")  # after a restart
            collect = Collect(ROWS)
            client = DatabusClient([relay.url], sources=[name], poll_wait_ms=200,
                                   checkpoint_store=MemoryCheckpointStore())
            collect.client = client
            client.register(collect)
            run = asyncio.create_task(client.run_async())
            with stderr_path.open("wb") as err:
                tail = await asyncio.create_subprocess_exec(
                    str(Path(sys.executable).with_name("databus")), "tail", "--relay",
                    relay.url, "--sources", name, "--from-earliest", "--count", str(ROWS),
                    stdout=asyncio.subprocess.PIPE, stderr=err,
                )
            try:
                async def both_waiting() -> bool:
                    return (client.metrics.source_states == {name: "pending"}
                            and "waiting for it" in stderr_path.read_text())

                await async_wait_until(both_waiting, "client and tail waiting")
                await asyncio.sleep(0.5)
                assert not run.done() and tail.returncode is None  # alive, waiting

                sql.run("CREATE TABLE orders (id INT PRIMARY KEY, total DECIMAL(10,2))")

                async def active() -> bool:
                    return bool((await listed(relay))[name]["state"] == "active")

                await async_wait_until(active, "listed active after CREATE TABLE, before any row")
                entry = (await listed(relay))[name]
                assert entry["id"] == source_id and entry["schema_fingerprint"] is not None
                for i in range(1, ROWS + 1):
                    sql.txn(f"INSERT INTO orders VALUES ({i}, {i}.50)")
                await asyncio.wait_for(run, 60)
                out, _ = await asyncio.wait_for(tail.communicate(), 60)
            finally:
                if tail.returncode is None:
                    tail.kill()
                    await tail.wait()
            assert [(s, k) for s, k, _ in collect.rows] == [(name, i) for i in
                                                            range(1, ROWS + 1)]
            assert collect.rows[0][2] == {"id": 1, "total": Decimal("1.50")}
            assert client.metrics.source_states == {name: "active"}
            assert tail.returncode == 0, stderr_path.read_text()
            lines = [json.loads(line) for line in out.decode().splitlines()]
            assert [(x["source"], x["key"]) for x in lines] == [(name, i) for i in
                                                                range(1, ROWS + 1)]
            assert stderr_path.read_text().count("waiting for it") == 1

    source_id = asyncio.run(first_start())
    asyncio.run(main(source_id))
    sql.close()


def test_a_table_named_by_a_pattern_is_waited_for(mariadb_server: MariaDBServer,
                                                  tmp_path: Path) -> None:
    """``tables=db.*``: the table has no id until CREATE TABLE; the client waits for it
    all the same (the relay answers its stream, not 404) and gets its rows."""
    db = "pending_pattern"
    name = f"{db}.late"
    sql = fresh_database(mariadb_server, db)
    uri = source_uri(mariadb_server, f"{db}.*")

    async def main() -> None:
        async with binlog_relay(tmp_path, uri) as relay:
            assert name not in await listed(relay)
            collect = Collect(3)
            client = DatabusClient([relay.url], sources=[name], poll_wait_ms=1000,
                                   checkpoint_store=MemoryCheckpointStore())
            collect.client = client
            client.register(collect)
            run = asyncio.create_task(client.run_async())

            async def waiting() -> bool:
                return client.metrics.source_states == {name: "pending"}

            await async_wait_until(waiting, "client waiting")
            async with await relay.get("/v1/stream", sources="elsewhere.late") as resp:
                assert resp.status == 404
            await asyncio.sleep(0.3)  # its long poll is open now
            sql.run("CREATE TABLE late (id INT PRIMARY KEY, note VARCHAR(10))")
            sql.txn("INSERT INTO late VALUES (1, 'a'), (2, 'b')")
            sql.txn("INSERT INTO late VALUES (3, 'c')")
            await asyncio.wait_for(run, 60)
            assert [(s, k) for s, k, _ in collect.rows] == [(name, 1), (name, 2), (name, 3)]
            assert (await listed(relay))[name]["state"] == "active"

    asyncio.run(main())
    sql.close()
