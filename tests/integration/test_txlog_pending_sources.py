"""PostgreSQL TxLog: a relay started before the migration (issue 12, defect 13).

The database has neither the tables nor the TxLog when the relay starts; both
configured sources are listed ``pending``. The migration then creates one table and
installs its capture (that source turns ``active`` and its rows flow), creates the
other without its capture (still ``pending``: the relay does not install triggers and
does not fail), and installs it: its rows flow too, under the id reserved at start.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.fixtures.servers import PostgresServer
from tests.integration.test_txlog_postgres import fresh_database
from tests.relay_harness import RunningRelay, relay_config, running_relay
from tests.unit.test_txlog_support import BUFFER, relay_windows
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

ORDERS, ITEMS = "public.orders", "public.items"


async def states(r: RunningRelay) -> dict[str, tuple[int, str]]:
    doc = await r.json("/v1/sources")
    return {e["name"]: (e["id"], e["state"]) for e in doc["sources"]}


def test_postgres_tables_created_after_the_relay_started(
    postgres_server: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pg = fresh_database(postgres_server, "txlog_pending_sources")
    uri = pg.uri("orders,items")

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
            await async_wait_until(lambda: "does not exist yet" in caplog.text,
                                   "the fetcher looked", 20)
            before = await states(r)
            assert {n: s for n, (_, s) in before.items()} == {ORDERS: "pending",
                                                              ITEMS: "pending"}
            pg.run("CREATE TABLE items (id INT PRIMARY KEY, sku TEXT)")
            pg.install("items")

            async def items_active() -> bool:
                return (await states(r))[ITEMS][1] == "active"

            await async_wait_until(items_active, "items active", 20)
            pg.txn("INSERT INTO items VALUES (1, 'a')")
            pg.run("CREATE TABLE orders (id INT PRIMARY KEY, tag TEXT)")
            pg.txn("INSERT INTO items VALUES (2, 'b')")
            await async_wait_until(lambda: "exists but is not set up for capture" in caplog.text,
                                   "the warning", 20)
            assert (await states(r))[ORDERS][1] == "pending"
            status = (await r.json("/v1/status"))["buffers"][BUFFER]["fetcher"]
            assert status["state"] == "running"
            pg.install("orders")
            pg.txn("INSERT INTO orders VALUES (10, 'x')", "INSERT INTO items VALUES (3, 'c')")

            async def three_windows() -> bool:
                return r.relay.buffers[BUFFER].state().windows == 3

            await async_wait_until(three_windows, "three windows", 20)
            after = await states(r)
            assert after == {ORDERS: (before[ORDERS][0], "active"),
                             ITEMS: (before[ITEMS][0], "active")}
            windows = await relay_windows(r)
            assert [sorted((c.source, c.key) for c in w.changes) for w in windows] == [
                [(ITEMS, 1)], [(ITEMS, 2)], [(ITEMS, 3), (ORDERS, 10)]]

    asyncio.run(main())
    pg.conn.close()
