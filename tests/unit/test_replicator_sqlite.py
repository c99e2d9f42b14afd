"""The replicator end to end on embedded parts: a SQLite source captured by triggers, a
relay in this process, a SQLite target file."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

from databus.config import ReplicateConfig, ReplicatedTableConfig
from databus.replicator._replicator import Replicator
from tests.relay_harness import RunningRelay, free_port, relay_config, running_relay
from tests.unit.test_txlog_support import SqliteSource
from tests.waiting import async_wait_until

DDL = ("CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL, amount REAL, "
       "note TEXT)")


def target_rows(path: Path, table: str = "orders") -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return sorted(conn.execute(f"SELECT id, tag, amount, note FROM {table}").fetchall())


def target_scn(path: Path, name: str) -> int | None:
    if not path.exists():
        return None
    with sqlite3.connect(path) as conn:
        try:
            row = conn.execute("SELECT scn FROM databus_replication_state WHERE replication=?",
                               (name,)).fetchone()
        except sqlite3.OperationalError:
            return None
    return None if row is None else int(row[0])


def source_rows(src: SqliteSource) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in ("id", "tag", "amount", "note"))
                  for r in src.rows("orders"))


def workload(src: SqliteSource, rng: random.Random, txns: int) -> None:
    for _ in range(txns):
        statements = []
        for _ in range(rng.randint(1, 5)):
            key = rng.randint(1, 40)
            kind = rng.random()
            if kind < 0.6:
                statements.append(
                    f"INSERT INTO orders(id, tag, amount, note) VALUES ({key}, 't{key}', "
                    f"{rng.randint(0, 10_000) / 100}, {rng.choice(['NULL', repr('é ' * 3)])}) "
                    f"ON CONFLICT(id) DO UPDATE SET amount = excluded.amount, "
                    f"note = excluded.note")
            else:
                statements.append(f"DELETE FROM orders WHERE id = {key}")
        src.txn(*statements)


async def relay_max(r: RunningRelay) -> int:
    doc = await r.json("/v1/status")
    return int(next(iter(doc["buffers"].values()))["max_scn"] or 0)


async def check_status(port: int, top: int) -> None:
    """The replicator's /v1/status and /metrics say what it applied."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/v1/status") as resp:
            doc = await resp.json()
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            page = await resp.text()
    assert doc["replication"] == "shop-copy" and doc["state"] == "running" and doc["ready"]
    assert doc["applied_scn"] >= top and doc["batches"] >= 1
    assert doc["tables"]["shop.orders"]["rows_applied"] > 0
    samples = {(s.name, s.labels.get("table")): s.value
               for f in text_string_to_metric_families(page) for s in f.samples}
    assert samples[("databus_replicator_rows_applied_total", "shop.orders")] > 0
    assert samples[("databus_replicator_applied_scn", None)] >= top


def test_a_sqlite_target_follows_the_source_across_restarts(tmp_path: Path) -> None:
    src = SqliteSource(tmp_path / "shop.db", DDL)
    src.install("orders")
    target = tmp_path / "replica.db"
    rng = random.Random(5)
    workload(src, rng, 30)

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"src": src.uri("orders")})) as r:
            port = free_port()
            config = ReplicateConfig(
                name="shop-copy", relays=(r.url,), target=f"sqlite:///{target}",
                tables=(ReplicatedTableConfig(source="shop.orders"),),
                batch_rows=50, batch_ms=50, metrics_port=port)

            async def run_until_equal() -> None:
                replicator = Replicator(config)
                task = asyncio.create_task(replicator.run_async())
                try:
                    await async_wait_until(lambda: task.done() or (
                        target.exists() and target_rows(target) == source_rows(src)
                        and target_scn(target, "shop-copy") is not None),
                        "the target equal to the source",
                        ignore=(sqlite3.OperationalError,))  # its tables not created yet
                    assert not task.done(), task.exception()
                    top = await relay_max(r)
                    await async_wait_until(
                        lambda: (target_scn(target, "shop-copy") or 0) >= top,
                        f"the target's state at SCN {top}")
                    await check_status(port, top)
                finally:
                    replicator.stop()
                    await asyncio.wait_for(task, 20)

            await run_until_equal()
            # More changes while it is down; it resumes from the target's own record.
            workload(src, rng, 30)
            await run_until_equal()
            assert target_rows(target) == source_rows(src) != []
            with sqlite3.connect(target) as conn:  # created with the source's key
                info = conn.execute("PRAGMA table_info(orders)").fetchall()
            assert [(c[1], c[5]) for c in info if c[5]] == [("id", 1)]

    asyncio.run(main())
    src.close()


def test_assess_reports_what_would_block(tmp_path: Path) -> None:
    from databus.replicator._assess import assess, render
    from databus.replicator.targets import open_target

    src = SqliteSource(tmp_path / "shop.db", DDL,
                       "CREATE TABLE items (id INTEGER PRIMARY KEY, sku TEXT)")
    src.install("orders,items")
    target = tmp_path / "replica.db"
    with sqlite3.connect(target) as conn:  # an existing table without the note column
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL, "
                     "amount REAL NOT NULL, extra TEXT)")

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"src": src.uri("orders,items")})) as r:
            config = ReplicateConfig(
                name="shop-copy", relays=(r.url,), target=f"sqlite:///{target}",
                tables=(ReplicatedTableConfig(source="shop.orders"),
                        ReplicatedTableConfig(source="shop.items", exclude=("id",))))
            reports = await assess(config, open_target(config.target))
            orders, items = reports
            assert orders.target_exists and orders.key == ("id",)
            assert orders.blocking
            assert any("no column note" in f.what and f.blocking for f in orders.findings)
            assert any("extra" in f.what and not f.blocking for f in orders.findings)
            # The source's amount may be NULL; the target's may not.
            assert any("amount is NOT NULL in the target" in f.what and f.blocking
                       for f in orders.findings)
            text = render(reports)
            assert "BLOCKED" in text and "note" in text
            # Its key left out of the copy: the map cannot be made.
            assert items.blocking and "key column(s) id not replicated" in items.findings[0].what

    asyncio.run(main())
    src.close()
