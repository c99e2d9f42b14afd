"""Acceptance: the relay's windows are the source's transactions, exactly.

Mixed transactions over three tables (inserts, updates, deletes, multi-row statements,
a trigger writing a second table, a primary key change, a composite key) through a
real relay: every window has the rows of one transaction, in binlog order, and the
window SCNs are the binlog positions after each COMMIT.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import (
    binlog_relay,
    captured,
    fresh_database,
    source_uri,
    status,
    summary,
    wait_for_scn,
)

DB = "bl_windows"


def test_windows_match_source_transactions(mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    sql = fresh_database(mariadb_server, DB)
    sql.run(
        "CREATE TABLE orders (id INT PRIMARY KEY, customer VARCHAR(40) NOT NULL, qty INT)",
        "CREATE TABLE audit (seq INT AUTO_INCREMENT PRIMARY KEY, order_id INT, note TEXT)",
        "CREATE TABLE stock (sku VARCHAR(10), site INT, level DOUBLE, PRIMARY KEY (sku, site))",
        "CREATE TABLE ignored (id INT PRIMARY KEY)",
        "CREATE TRIGGER orders_audit AFTER INSERT ON orders FOR EACH ROW "
        "INSERT INTO audit (order_id, note) VALUES (NEW.id, CONCAT('new ', NEW.customer))",
    )
    uri = source_uri(mariadb_server, f"{DB}.orders,{DB}.audit,{DB}.stock")
    o, a, s = f"{DB}.orders", f"{DB}.audit", f"{DB}.stock"

    def order(i: int, customer: str, qty: int | None) -> dict[str, object]:
        return {"id": i, "customer": customer, "qty": qty}

    def audit(seq: int, order_id: int, note: str) -> dict[str, object]:
        return {"seq": seq, "order_id": order_id, "note": note}

    async def scenario() -> None:
        async with binlog_relay(tmp_path, uri) as r:
            start = (await status(r))["prev_scn"]
            scns = [
                sql.txn("INSERT INTO orders VALUES (1, 'ann', 2), (2, 'bob', NULL)"),
                sql.txn("UPDATE orders SET qty = qty + 1 WHERE id = 1",
                        "INSERT INTO stock VALUES ('x', 1, 0.5), ('x', 2, 1.5)",
                        "DELETE FROM orders WHERE id = 2"),
                sql.txn("INSERT INTO ignored VALUES (1)"),  # not captured: no window
                sql.txn("UPDATE stock SET level = level * 2",
                        "UPDATE orders SET id = 10 WHERE id = 1",
                        "DELETE FROM stock WHERE site = 1"),
            ]
            await wait_for_scn(r, scns[-1])
            windows, _ = await captured(r)
            assert [w.scn for w in windows] == [scns[0], scns[1], scns[3]]
            assert all(w.scn > start for w in windows)
            assert summary(windows) == [
                [
                    (o, "upsert", 1, order(1, "ann", 2)),
                    (a, "upsert", 1, audit(1, 1, "new ann")),
                    (o, "upsert", 2, order(2, "bob", None)),
                    (a, "upsert", 2, audit(2, 2, "new bob")),
                ],
                [
                    (o, "upsert", 1, order(1, "ann", 3)),
                    (s, "upsert", ("x", 1), {"sku": "x", "site": 1, "level": 0.5}),
                    (s, "upsert", ("x", 2), {"sku": "x", "site": 2, "level": 1.5}),
                    (o, "delete", 2, order(2, "bob", None)),
                ],
                [
                    (s, "upsert", ("x", 1), {"sku": "x", "site": 1, "level": 1.0}),
                    (s, "upsert", ("x", 2), {"sku": "x", "site": 2, "level": 3.0}),
                    (o, "delete", 1, order(1, "ann", 3)),
                    (o, "upsert", 10, order(10, "ann", 3)),
                    (s, "delete", ("x", 1), {"sku": "x", "site": 1, "level": 1.0}),
                ],
            ]
            sources = {e["name"] for e in (await r.json("/v1/sources"))["sources"]}
            assert sources == {o, a, s}

    asyncio.run(scenario())
    sql.close()
