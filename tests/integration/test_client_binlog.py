"""End to end: real MariaDB -> binlog fetcher -> relay -> DatabusClient.

The consumer sees exactly the source transactions, window by window, in commit order;
a consumer pinned to an old schema keeps working after ALTER TABLE ADD COLUMN.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from databus.schemas import Schema
from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import (
    binlog_relay,
    fresh_database,
    source_uri,
    wait_for_scn,
)


class Collect(Consumer):
    def __init__(self) -> None:
        self.windows: list[tuple[int, list[tuple[str, str, Any, dict[str, Any] | None]]]] = []
        self.current: list[tuple[str, str, Any, dict[str, Any] | None]] = []
        self.client: DatabusClient | None = None
        self.stop_at: int | None = None

    def on_start_data_event_sequence(self, scn: int) -> None:
        self.current = []

    def on_data_event(self, event: DataEvent) -> None:
        self.current.append((event.source, event.op.name.lower(), event.key, event.value))

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.windows.append((scn, self.current))
        if self.stop_at is not None and scn >= self.stop_at and self.client is not None:
            self.client.stop()


def test_consumer_sees_the_source_transactions(mariadb_server: MariaDBServer,
                                               tmp_path: Path) -> None:
    db = "e2e_client"
    sql = fresh_database(mariadb_server, db)
    sql.run(
        "CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(40))",
        "CREATE TABLE orders (id INT PRIMARY KEY, customer INT, total DECIMAL(10,2))",
        "CREATE TABLE audit (id INT AUTO_INCREMENT PRIMARY KEY, order_id INT)",
        "CREATE TRIGGER orders_audit AFTER INSERT ON orders FOR EACH ROW "
        "INSERT INTO audit (order_id) VALUES (NEW.id)",
    )
    uri = source_uri(mariadb_server, f"{db}.customers,{db}.orders,{db}.audit")

    async def main() -> None:
        async with binlog_relay(tmp_path, uri) as relay:
            rng = random.Random(4)
            expected_scns: list[int] = []
            for txn in range(40):
                statements = []
                for _ in range(rng.randint(1, 4)):
                    cid = rng.randint(1, 15)
                    if rng.random() < 0.3:
                        statements.append(f"DELETE FROM customers WHERE id = {cid}")
                    else:
                        statements.append(
                            f"REPLACE INTO customers VALUES ({cid}, 'c{cid}-{txn}')")
                oid = 1000 + txn
                statements.append(f"INSERT INTO orders VALUES ({oid}, 1, {txn}.25)")
                # Row images are checked exactly by the fetcher's own tests; here: the
                # boundaries, the order and the resulting state.
                expected_scns.append(sql.txn(*statements))
            await wait_for_scn(relay, expected_scns[-1])
            collect = Collect()
            collect.stop_at = expected_scns[-1]
            client = DatabusClient([relay.url], sources=[f"{db}.customers", f"{db}.orders",
                                                         f"{db}.audit"],
                                   checkpoint_store=MemoryCheckpointStore())
            collect.client = client
            client.register(collect)
            await asyncio.wait_for(client.run_async(), 60)
            got_scns = [scn for scn, _ in collect.windows]
            assert got_scns == expected_scns  # one window per transaction, commit order
            for (_, changes), txn in zip(collect.windows, range(40), strict=True):
                orders = [c for c in changes if c[0] == f"{db}.orders"]
                audit = [c for c in changes if c[0] == f"{db}.audit"]
                assert [c[2] for c in orders] == [1000 + txn]
                assert len(audit) == 1 and audit[0][3]["order_id"] == 1000 + txn  # type: ignore[index]
                # Commit order inside the window: customers first, then the order.
                assert changes[-2:][0][0] == f"{db}.orders"
            # The replica equals the source.
            replica: dict[Any, Any] = {}
            for _, changes in collect.windows:
                for source, op, key, value in changes:
                    if source != f"{db}.customers":
                        continue
                    if op == "delete":
                        replica.pop(key, None)
                    else:
                        assert value is not None
                        replica[key] = value["name"]
            source_rows = dict(sql.query("SELECT id, name FROM customers"))
            assert replica == source_rows

    asyncio.run(main())
    sql.close()


def test_pinned_reader_schema_survives_add_column(mariadb_server: MariaDBServer,
                                                  tmp_path: Path) -> None:
    db = "e2e_pinned"
    sql = fresh_database(mariadb_server, db)
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))")
    uri = source_uri(mariadb_server, f"{db}.items")

    async def main() -> None:
        async with binlog_relay(tmp_path, uri) as relay:
            sql.txn("INSERT INTO items VALUES (1, 'one')")
            first = sql.txn("INSERT INTO items VALUES (2, 'two')")
            await wait_for_scn(relay, first)
            versions = (await relay.json("/v1/schemas", source=f"{db}.items"))["versions"]
            old = Schema(versions[-1]["schema"])
            sql.run("ALTER TABLE items ADD COLUMN price INT NOT NULL DEFAULT 7")
            sql.txn("INSERT INTO items VALUES (3, 'three', 30)")
            last = sql.txn("UPDATE items SET price = 9, name = 'uno' WHERE id = 1")
            await wait_for_scn(relay, last)
            new_versions = (await relay.json("/v1/schemas", source=f"{db}.items"))["versions"]
            assert len(new_versions) >= 2

            collect = Collect()
            collect.stop_at = last
            client = DatabusClient([relay.url], sources=[f"{db}.items"],
                                   reader_schemas={f"{db}.items": old},
                                   checkpoint_store=MemoryCheckpointStore())
            collect.client = client
            client.register(collect)
            await asyncio.wait_for(client.run_async(), 60)
            values = [c[3] for _, changes in collect.windows for c in changes]
            assert all(v is not None and "price" not in v for v in values)
            assert [(v["id"], v["name"]) for v in values if v] == [
                (1, "one"), (2, "two"), (3, "three"), (1, "uno")]

    asyncio.run(main())
    sql.close()
