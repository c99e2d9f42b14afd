"""Issue 7 acceptance: MariaDB -> binlog fetcher -> a relay small enough to be overrun
-> bootstrap service on PostgreSQL, with a write workload that keeps running. A new
consumer (no checkpoint) and one that was stopped for a long time both end with exactly
the source state and then follow the relay; a transfer (a transaction over two tables)
is never seen half-applied at the end of catch-up."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from databus.bootstrap._service import build_app, open_configured_storage
from databus.client import Consumer, DatabusClient, DataEvent, FileCheckpointStore
from databus.config import BootstrapConfig, from_mapping
from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.integration.binlog_support import (
    Sql,
    binlog_relay,
    fresh_database,
    source_uri,
    status,
    wait_for_scn,
)
from tests.integration.bootstrap_support import drop_schema, storage_url

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

DB = "boot_accept"
ACCOUNTS, TRANSFERS = f"{DB}.accounts", f"{DB}.transfers"
N_ACCOUNTS = 60
TOTAL = N_ACCOUNTS * 1000
PAD = "x" * 180  # makes windows big enough to overrun a 1 MiB relay buffer quickly


class Replica(Consumer):
    """Keeps both tables; checks the money invariant whenever a bootstrap ends."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[Any, dict[str, Any]]] = {ACCOUNTS: {}, TRANSFERS: {}}
        self.bootstraps = 0
        self.bootstrap_events = 0
        self.invariant_failures: list[str] = []
        self.scn = 0
        self.lock = threading.Lock()

    def on_start_bootstrap(self) -> None:
        self.bootstraps += 1

    def on_data_event(self, event: DataEvent) -> None:
        self.bootstrap_events += event.from_bootstrap
        with self.lock:
            rows = self.tables[event.source]
            if event.is_delete:
                rows.pop(event.key, None)
            else:
                assert event.value is not None
                rows[event.key] = dict(event.value)

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.scn = max(self.scn, scn)

    def on_end_bootstrap(self) -> None:
        # Consistent at the target: every transfer applied whole or not at all.
        self.check("end of bootstrap")

    def check(self, when: str) -> None:
        with self.lock:
            accounts = self.tables[ACCOUNTS]
            total = sum(row["balance"] for row in accounts.values())
        if len(accounts) == N_ACCOUNTS and total != TOTAL:
            self.invariant_failures.append(f"{when}: balances sum to {total}, not {TOTAL}")

    def state(self) -> dict[str, dict[Any, tuple[Any, ...]]]:
        with self.lock:
            return {ACCOUNTS: {k: (v["owner"], v["balance"]) for k, v in
                               self.tables[ACCOUNTS].items()},
                    TRANSFERS: {k: (v["src"], v["dst"], v["amount"]) for k, v in
                                self.tables[TRANSFERS].items()}}


def source_state(sql: Sql) -> dict[str, dict[Any, tuple[Any, ...]]]:
    return {ACCOUNTS: {r[0]: (r[1], r[2]) for r in
                       sql.query("SELECT id, owner, balance FROM accounts")},
            TRANSFERS: {r[0]: (r[1], r[2], r[3]) for r in
                        sql.query("SELECT id, src, dst, amount FROM transfers")}}


class Workload:
    """Transfers between accounts (two tables per transaction), some deletes."""

    def __init__(self, server: MariaDBServer) -> None:
        self.sql = Sql(server, DB)
        self.rng = random.Random(11)
        self.stop = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def one(self) -> None:
        rng = self.rng
        src, dst = rng.sample(range(1, N_ACCOUNTS + 1), 2)
        amount = rng.randint(1, 50)
        statements = [
            f"UPDATE accounts SET balance = balance - {amount} WHERE id = {src}",
            f"UPDATE accounts SET balance = balance + {amount} WHERE id = {dst}",
            f"INSERT INTO transfers (src, dst, amount, pad) VALUES ({src}, {dst}, {amount},"
            f" '{PAD}')",
        ]
        if rng.random() < 0.2:
            statements.append("DELETE FROM transfers ORDER BY RAND() LIMIT 1")
        self.sql.txn(*statements)
        self.count += 1

    def _run(self) -> None:
        while not self.stop.is_set():
            self.one()
            time.sleep(0.001)

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(30)
        self.sql.close()


async def run_until(client: DatabusClient, replica: Replica, scn: int, timeout: float) -> None:
    task = asyncio.create_task(client.run_async())
    deadline = time.monotonic() + timeout
    try:
        while replica.scn < scn:
            if task.done():
                task.result()
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumer at {replica.scn}, wanted {scn}")
            await asyncio.sleep(0.05)
    finally:
        client.stop()
        await asyncio.wait_for(task, 30)


def test_new_and_long_stopped_consumers_bootstrap_to_the_source_state(
        mariadb_server: MariaDBServer, postgres_server: PostgresServer, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    sql = fresh_database(mariadb_server, DB)
    sql.run(
        "CREATE TABLE accounts (id INT PRIMARY KEY, owner VARCHAR(20), balance INT NOT NULL,"
        " pad VARCHAR(200))",
        "CREATE TABLE transfers (id INT AUTO_INCREMENT PRIMARY KEY, src INT, dst INT,"
        " amount INT, pad VARCHAR(200))",
    )
    uri = source_uri(mariadb_server, f"{ACCOUNTS},{TRANSFERS}")
    url = storage_url("postgresql", tmp_path, request)
    sources = [ACCOUNTS, TRANSFERS]

    async def main() -> None:
        async with binlog_relay(tmp_path, uri, capacity_mb=1) as relay:
            # The accounts are created through the relay, so the log has all history.
            sql.txn(*[f"INSERT INTO accounts VALUES ({i}, 'owner{i}', 1000, '{PAD}')"
                      for i in range(1, N_ACCOUNTS + 1)])
            config = from_mapping(BootstrapConfig, {
                "storage": url, "port": 0,
                "producer": {"relays": [relay.url], "poll_wait_ms": 100},
                "applier": {"batch_rows": 500, "poll_interval_ms": 50},
                "server": {"batch_rows": 200}})
            storage = open_configured_storage(config)
            runner = web.AppRunner(build_app(config, storage))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            boot_url = f"http://127.0.0.1:{runner.addresses[0][1]}"

            def client(replica: Replica, name: str) -> DatabusClient:
                c = DatabusClient([relay.url], bootstrap=[boot_url], sources=sources,
                                  checkpoint_store=FileCheckpointStore(tmp_path / name),
                                  poll_wait_ms=200, max_request_bytes=64 * 1024)
                c.register(replica)
                return c

            workload = Workload(mariadb_server)
            try:
                # The "old" consumer reads a little, then stops for a long time.
                for _ in range(20):
                    workload.one()
                early = sql.position()
                await wait_for_scn(relay, early)
                old = Replica()
                await run_until(client(old, "old"), old, early, 60)
                stopped_at = old.scn
                workload.thread.start()
                # Writes go on until the relay has evicted the old consumer's position.
                deadline = time.monotonic() + 120
                while ((await status(relay))["min_scn"] or 0) <= stopped_at + 1:
                    assert time.monotonic() < deadline, "the relay buffer was never overrun"
                    await asyncio.sleep(0.2)
                # Both consumers start while the writer is still running.
                new = Replica()
                writes_before = workload.count
                consumers = [(old, client(old, "old")), (new, client(new, "new"))]
                tasks = [asyncio.create_task(c.run_async()) for _, c in consumers]
                deadline = time.monotonic() + 120
                while any(r.bootstraps == 0 or r.scn == 0 for r, _ in consumers):
                    assert time.monotonic() < deadline, "the consumers never bootstrapped"
                    for task in tasks:
                        if task.done():
                            task.result()
                    await asyncio.sleep(0.1)
                while workload.count < writes_before + 200:
                    await asyncio.sleep(0.1)
                workload.stop.set()
                workload.thread.join(30)
                final = sql.position()
                await wait_for_scn(relay, final)
                deadline = time.monotonic() + 120
                while any(r.scn < final for r, _ in consumers):
                    assert time.monotonic() < deadline, [r.scn for r, _ in consumers]
                    for task in tasks:
                        if task.done():
                            task.result()
                    await asyncio.sleep(0.1)
                for _, c in consumers:
                    c.stop()
                await asyncio.wait_for(asyncio.gather(*tasks), 30)
            finally:
                workload.close()
                await runner.cleanup()
            expected = source_state(sql)
            assert sum(b for _, b in expected[ACCOUNTS].values()) == TOTAL
            for replica, _ in consumers:
                assert replica.bootstraps >= 1 and replica.bootstrap_events > 0
                assert replica.invariant_failures == []
                assert replica.state() == expected
                replica.check("end")
                assert replica.invariant_failures == []
            # Both followed the relay after the bootstrap: events after the hand-over.
            assert all(c.metrics.bootstrapping is False for _, c in consumers)

    try:
        asyncio.run(main())
    finally:
        sql.close()
        drop_schema(postgres_server, url)
