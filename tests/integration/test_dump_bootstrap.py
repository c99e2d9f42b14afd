"""Issue 13: the bootstrap service seeded by a dump. Rows that existed before the relay
started reach the bootstrap snapshot through a dump (no Spark): a new consumer, whose
relay has long evicted the dump's windows, bootstraps and ends with exactly the source's
state, then follows the relay."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from databus.bootstrap._service import build_app, open_configured_storage
from databus.client import Consumer, DatabusClient, DataEvent, FileCheckpointStore
from databus.config import BootstrapConfig, from_mapping
from databus.fetchers.mysql import BinlogSourceConfig
from databus.fetchers.mysql._dump import setup_statements
from databus.relay.dumps import DumpRequest
from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.integration.binlog_support import (
    BUFFER,
    Sql,
    binlog_relay,
    fresh_database,
    source_uri,
    status,
    wait_for_scn,
)
from tests.integration.bootstrap_support import storage_url

pytestmark = pytest.mark.integration

DB = "dump_boot"
TABLE = f"{DB}.items"
ROWS = 2000
PAD = "p" * 300  # a 1 MiB relay holds about 3,000 rows: the dump's windows get evicted


class Replica(Consumer):
    def __init__(self) -> None:
        self.rows: dict[Any, tuple[Any, ...]] = {}
        self.scn = 0
        self.bootstraps = 0
        self.lock = threading.Lock()

    def on_start_bootstrap(self) -> None:
        self.bootstraps += 1

    def on_data_event(self, event: DataEvent) -> None:
        with self.lock:
            if event.is_delete:
                self.rows.pop(event.key, None)
            else:
                assert event.value is not None
                self.rows[event.key] = (event.value["name"], event.value["qty"])

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.scn = max(self.scn, scn)


def logged_keys(storage: Any) -> set[int]:
    """The keys of every event in the bootstrap log (to tell, when the snapshot lacks
    rows, whether the producer or the applier lost them)."""
    from databus.event import decode_header
    from databus.filters import FilterSpec

    return {decode_header(r.event, 0).partition_key for r in storage.log_batch(
        [TABLE], after_scn=-1, upto_scn=1 << 62, limit=1 << 30, filter=FilterSpec())}


def test_a_bootstrap_seeded_by_a_dump_gives_a_new_consumer_the_source_state(
        mariadb_server: MariaDBServer, postgres_server: PostgresServer, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    sql = fresh_database(mariadb_server, DB)
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), qty INT NOT NULL, "
            "pad VARCHAR(400))")
    for start in range(0, ROWS, 500):
        sql.run("INSERT INTO items VALUES " + ", ".join(
            f"({i}, 'n{i}', {i}, '{PAD}')" for i in range(start, start + 500)))
    uri = source_uri(mariadb_server, TABLE)
    admin = Sql(mariadb_server)
    admin.run(*setup_statements(BinlogSourceConfig.from_uri(uri)))
    admin.close()
    url = storage_url("postgresql", tmp_path, request)

    async def main() -> None:
        async with binlog_relay(tmp_path, uri, capacity_mb=1) as relay:
            config = from_mapping(BootstrapConfig, {
                "storage": url, "port": 0,
                "producer": {"relays": [relay.url], "poll_wait_ms": 100},
                "applier": {"batch_rows": 500, "poll_interval_ms": 50},
                "server": {"batch_rows": 300}})
            storage = open_configured_storage(config)
            runner = web.AppRunner(build_app(config, storage))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            boot_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            try:
                dump = relay.relay.dumps.start_dump(
                    DumpRequest(buffer=BUFFER, sources=(TABLE,), chunk_rows=250),
                    buffer_of=relay.relay.fetchers.configured_buffer)
                n = 0
                while relay.relay.dumps.get(dump.id)["state"] not in ("done", "failed"):
                    n += 1  # writes while the dump runs
                    sql.txn(f"UPDATE items SET qty = qty + 1000 WHERE id = {(n * 7) % ROWS}",
                            f"DELETE FROM items WHERE id = {(n * 13) % ROWS}")
                    await asyncio.sleep(0.005)
                assert relay.relay.dumps.get(dump.id)["state"] == "done"
                # More writes until the relay has evicted every dump window.
                dump_scn = max(t["last_scn"] for t in relay.relay.dumps.get(dump.id)["tables"])
                k = 0
                deadline = time.monotonic() + 120
                while ((await status(relay))["min_scn"] or 0) <= dump_scn:
                    assert time.monotonic() < deadline, "the relay was never overrun"
                    k += 1
                    sql.txn(f"INSERT INTO items VALUES ({ROWS + k}, 'late', {k}, '{PAD}')")
                final = sql.position()
                await wait_for_scn(relay, final)
                replica = Replica()
                client = DatabusClient([relay.url], bootstrap=[boot_url], sources=[TABLE],
                                       checkpoint_store=FileCheckpointStore(tmp_path / "cp"),
                                       poll_wait_ms=200, max_request_bytes=256 * 1024)
                client.register(replica)
                task = asyncio.create_task(client.run_async())
                deadline = time.monotonic() + 120
                # A snapshot's windows carry the snapshot's SCN, which can be final
                # already: done only once the bootstrap is over too.
                while replica.scn < final or client.metrics.bootstrapping:
                    assert time.monotonic() < deadline, (replica.scn, final)
                    if task.done():
                        task.result()
                    await asyncio.sleep(0.1)
                client.stop()
                await asyncio.wait_for(task, 30)
                assert replica.bootstraps >= 1
                expected = {r[0]: (r[1], r[2]) for r in
                            sql.query("SELECT id, name, qty FROM items")}
                assert len(expected) > ROWS // 2
                # Every row came through the relay (the dump's chunks, then changes), so
                # the bootstrap log holds every key of the source.
                unlogged = sorted(set(expected) - logged_keys(storage))
                assert not unlogged, (f"not in the bootstrap log: {len(unlogged)} keys "
                                      f"({unlogged[:3]}..{unlogged[-3:]}), store "
                                      f"{storage.state()}")
                missing = sorted(set(expected) - set(replica.rows))
                assert replica.rows == expected, (
                    f"replica at {replica.scn}, final {final}, missing {len(missing)} "
                    f"({missing[:3]}..{missing[-3:]}), store {storage.state()}, "
                    f"client {client.metrics}")
            finally:
                await runner.cleanup()

    asyncio.run(main())
    sql.close()
