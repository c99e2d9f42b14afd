"""Issue 31 acceptance: a relay with TLS and readers, a TLS bootstrap service, a
replicator and ``databus tail`` as readers; each reads exactly what it was granted,
end to end through a relay fall-off and a bootstrap catch-up.

Setup, all as ``databus`` processes over HTTPS with a CA made for the test:
- a SQLite source ``shop`` (tables orders and items) with trigger capture;
- a relay with a 1 MiB buffer (the workload overruns it), mutual TLS, and three
  readers: ``orders`` (a token, ``shop.orders``), ``warehouse`` (a client certificate,
  ``shop.*``) and ``producer`` (a token, ``shop.*``, the bootstrap's producer);
- a bootstrap service with TLS and the readers ``orders`` and ``warehouse``, its
  producer reading the relay as ``producer``;
- a replicator of ``shop.orders`` into SQLite, reading as ``orders``.

Then: a consumer of ``orders`` that saw the first windows, stopped while the relay
evicted them, and comes back (scn_not_found, a bootstrap catch-up, the relay again) ends
with exactly the source's orders and never an item; ``warehouse`` ends with both tables;
``orders`` asking for items is refused (403) by relay and bootstrap; the replica equals
the source's orders; ``databus tail`` as ``orders`` prints only orders, and as nobody
is refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from databus.client import (
    Consumer,
    DatabusClient,
    DataEvent,
    FileCheckpointStore,
)
from databus.errors import ForbiddenError
from databus.fetchers.txlog import seal_sqlite_transaction
from databus.fetchers.txlog._model import TXLOG_TABLE
from tests.fixtures._certs import PKI
from tests.fixtures._procs import free_port
from tests.relay_harness import start_databus
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

ORDERS_TOKEN = "orders-token-5f0c9a7e21"
PRODUCER_TOKEN = "producer-token-8be41d0c77"
ADMIN_TOKEN = "admin-token-0d9f3c1b55"
PAD = "p" * 1500
TABLES = ("orders", "items")


def _exe() -> str:
    return str(Path(sys.executable).with_name("databus"))


def _toml_list(values: list[str]) -> str:
    return json.dumps(values)


class Shop:
    """The source database: orders and items, written in transactions of both."""

    def __init__(self, path: Path) -> None:
        self.path = path
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER, pad TEXT)")
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, pad TEXT)")
        conn.commit()
        conn.close()
        self.next_id = 1

    @property
    def uri(self) -> str:
        return f"sqlite://{self.path}?tables={','.join(TABLES)}&poll_ms=20"

    def write(self, transactions: int) -> None:
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            for _ in range(transactions):
                i = self.next_id
                self.next_id += 1
                with conn:
                    conn.execute("INSERT INTO orders (id, amount, pad) VALUES (?, ?, ?)",
                                 (i, i * 10, PAD))
                    conn.execute("INSERT INTO items (id, name, pad) VALUES (?, ?, ?)",
                                 (i, f"item {i}", PAD))
                    if i % 7 == 0:
                        conn.execute("UPDATE orders SET amount = amount + 1 WHERE id = ?",
                                     (i // 2,))
                    if i % 11 == 0:
                        conn.execute("DELETE FROM orders WHERE id = ?", (i // 3,))
                        conn.execute("DELETE FROM items WHERE id = ?", (i // 3,))
                    seal_sqlite_transaction(conn)  # one window per transaction
        finally:
            conn.close()

    def top_scn(self) -> int:
        """The SCN of the source's newest transaction (its TxLog)."""
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            return int(conn.execute(f"SELECT max(scn) FROM {TXLOG_TABLE}").fetchone()[0])
        finally:
            conn.close()

    def rows(self, table: str) -> dict[int, Any]:
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            column = "amount" if table == "orders" else "name"
            return dict(conn.execute(f"SELECT id, {column} FROM {table}").fetchall())
        finally:
            conn.close()


class Copy(Consumer):
    """Keeps every source it is given; remembers bootstraps and the newest SCN."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[int, Any]] = {}
        self.bootstraps = 0
        self.bootstrapping = False
        self.scn = 0
        self.lock = threading.Lock()

    def on_start_bootstrap(self) -> None:
        self.bootstraps += 1
        self.bootstrapping = True

    def on_end_bootstrap(self) -> None:
        self.bootstrapping = False

    def on_data_event(self, event: DataEvent) -> None:
        with self.lock:
            rows = self.tables.setdefault(event.source, {})
            if event.is_delete:
                rows.pop(event.key, None)
            else:
                value = event.value
                assert value is not None
                rows[event.key] = value["amount"] if "amount" in value else value["name"]

    def on_end_data_event_sequence(self, scn: int) -> None:
        self.scn = max(self.scn, scn)


async def _run_until(client: DatabusClient, copy: Copy, scn: int, timeout: float = 90
                     ) -> None:
    client.register(copy)
    task = asyncio.create_task(client.run_async())
    deadline = time.monotonic() + timeout
    try:
        # A bootstrap's windows end at its target SCN before its catch-up is done.
        while copy.scn < scn or copy.bootstrapping:
            if task.done():
                task.result()
                raise AssertionError(f"the client stopped at {copy.scn}, before {scn}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumer at {copy.scn}, wanted {scn}")
            await asyncio.sleep(0.05)
    finally:
        client.stop()
        await asyncio.wait_for(task, 30)


def _get(url: str, pki: PKI, token: str | None = None) -> Any:
    import urllib.request

    from databus.security import client_context

    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10, context=client_context(pki.ca)) as r:
        return json.loads(r.read())


class Deployment:
    def __init__(self, tmp_path: Path, pki: PKI) -> None:
        self.tmp = tmp_path
        self.pki = pki
        self.shop = Shop(tmp_path / "shop.db")
        subprocess.run([_exe(), "txlog", "install", "--source", self.shop.uri], check=True,
                       capture_output=True)
        self.relay_port = free_port()
        self.boot_port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        tls = (f'cert_file = "{pki.server.cert}"\nkey_file = "{pki.server.key}"\n'
               f'client_ca_file = "{pki.ca}"\n')
        (tmp_path / "relay.toml").write_text(f"""
[relay]
data_dir = "{tmp_path / 'relay'}"
port = {self.relay_port}
workers = 1
admin_token = "{ADMIN_TOKEN}"
[relay.tls]
{tls}
[[relay.readers]]
name = "orders"
sources = ["shop.orders"]
token = "{ORDERS_TOKEN}"
[[relay.readers]]
name = "warehouse"
sources = ["shop.*"]
client_cert_cn = "warehouse"
[[relay.readers]]
name = "producer"
sources = ["shop.*"]
token = "{PRODUCER_TOKEN}"
[[relay.buffers]]
name = "shop"
capacity_mb = 1
source = "{self.shop.uri}"
""")
        (tmp_path / "bootstrap.toml").write_text(f"""
[bootstrap]
storage = "sqlite:///{tmp_path / 'bootstrap.db'}"
port = {self.boot_port}
[bootstrap.tls]
{tls}
[[bootstrap.readers]]
name = "orders"
sources = ["shop.orders"]
token = "{ORDERS_TOKEN}"
[[bootstrap.readers]]
name = "warehouse"
sources = ["shop.*"]
client_cert_cn = "warehouse"
[bootstrap.producer]
relays = ["{self.relay_url}"]
ca_file = "{pki.ca}"
token = "{PRODUCER_TOKEN}"
poll_wait_ms = 100
max_bytes = 262144
""")
        self.replica = tmp_path / "replica.db"
        (tmp_path / "replicate.toml").write_text(f"""
[replicate]
name = "orders"
target = "sqlite:///{self.replica}"
relays = ["{self.relay_url}"]
bootstrap = ["{self.boot_url}"]
ca_file = "{pki.ca}"
token = "{ORDERS_TOKEN}"
batch_ms = 100
[[replicate.tables]]
source = "shop.orders"
""")

    @property
    def relay_url(self) -> str:
        return f"https://127.0.0.1:{self.relay_port}"

    @property
    def boot_url(self) -> str:
        return f"https://127.0.0.1:{self.boot_port}"

    def start(self) -> None:
        self.procs.append(start_databus(["relay", "--config", str(self.tmp / "relay.toml")],
                                        self.relay_port, self.tmp / "relay.log"))
        self.procs.append(start_databus(["bootstrap", "--config",
                                         str(self.tmp / "bootstrap.toml")],
                                        self.boot_port, self.tmp / "bootstrap.log"))

    def start_replicator(self) -> None:
        log = open(self.tmp / "replicate.log", "ab")  # noqa: SIM115 - handed to the child
        self.procs.append(subprocess.Popen(
            [_exe(), "replicate", "--config", str(self.tmp / "replicate.toml"),
             "--no-progress"], stdout=log, stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}))

    def relay_buffer(self) -> dict[str, Any]:
        doc = _get(f"{self.relay_url}/v1/status", self.pki, PRODUCER_TOKEN)
        return doc["buffers"]["shop"]  # type: ignore[no-any-return]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in sorted(self.tmp.glob("*.log")))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _client(d: Deployment, *, sources: list[str], checkpoints: Path,
            **credentials: Any) -> DatabusClient:
    return DatabusClient(relays=[d.relay_url], bootstrap=[d.boot_url], sources=sources,
                         checkpoint_store=FileCheckpointStore(checkpoints),
                         ca_file=d.pki.ca, poll_wait_ms=200, backoff_max=0.5,
                         **credentials)


def test_each_reader_reads_exactly_its_grant(tmp_path: Path, pki: PKI) -> None:
    d = Deployment(tmp_path, pki)
    warehouse = pki.client("warehouse")
    try:
        d.start()
        d.shop.write(5)
        max_scn = wait_until(lambda: d.relay_buffer()["max_scn"], "first windows")

        # The orders consumer sees the first windows, then stops.
        early = Copy()
        asyncio.run(_run_until(_client(d, sources=["shop.orders"],
                                       checkpoints=tmp_path / "cp-orders",
                                       token=ORDERS_TOKEN), early, max_scn))
        first_scn = early.scn
        assert set(early.tables) == {"shop.orders"}

        # The workload overruns the 1 MiB buffer: the first windows are evicted.
        d.shop.write(900)
        d.start_replicator()
        wait_until(lambda: (d.relay_buffer()["prev_scn"] or 0) > first_scn,
                   "the relay evicting the first windows", timeout=120, diagnose=d.logs)
        top = d.shop.top_scn()
        final_scn = wait_until(lambda: (lambda m: m if (m or 0) >= top else None)(
            d.relay_buffer()["max_scn"]), "the relay reading the last transaction",
            timeout=120, diagnose=d.logs)

        # Back after the fall-off: a bootstrap catch-up, then the relay again; only
        # orders, equal to the source.
        again = Copy()
        again.tables = {k: dict(v) for k, v in early.tables.items()}
        asyncio.run(_run_until(_client(d, sources=["shop.orders"],
                                       checkpoints=tmp_path / "cp-orders",
                                       token=ORDERS_TOKEN), again, final_scn, timeout=180))
        assert again.bootstraps >= 1, "the consumer should have caught up from the bootstrap"
        assert set(again.tables) == {"shop.orders"}
        assert again.tables["shop.orders"] == d.shop.rows("orders")

        # warehouse (a client certificate, shop.*) starts from nothing: both tables.
        whole = Copy()
        asyncio.run(_run_until(_client(d, sources=["shop.orders", "shop.items"],
                                       checkpoints=tmp_path / "cp-warehouse",
                                       cert_file=warehouse.cert, key_file=warehouse.key),
                               whole, final_scn, timeout=180))
        assert whole.tables["shop.orders"] == d.shop.rows("orders")
        assert whole.tables["shop.items"] == d.shop.rows("items")

        # orders naming no source: narrowed to its grant by the relay, which says so, so
        # the client does not check EOW counts that cover the items it cannot see.
        narrowed = Copy()
        asyncio.run(_run_until(DatabusClient(
            relays=[d.relay_url], ca_file=pki.ca, token=ORDERS_TOKEN, backoff_max=0.5,
            checkpoint_store=FileCheckpointStore(tmp_path / "cp-narrowed")),
            narrowed, final_scn))
        assert set(narrowed.tables) == {"shop.orders"}

        # orders asking for items: refused by the relay and by the bootstrap.
        for bootstrap in (True, False):
            refused = DatabusClient(
                relays=[d.relay_url], bootstrap=[d.boot_url] if bootstrap else [],
                sources=["shop.items"], ca_file=pki.ca, token=ORDERS_TOKEN,
                checkpoint_store=FileCheckpointStore(tmp_path / f"cp-refused-{bootstrap}"),
                backoff_max=0.2)
            refused.register(Copy())
            with pytest.raises(ForbiddenError):
                asyncio.run(asyncio.wait_for(refused.run_async(), 60))

        # The replica of orders equals the source.
        def replica_rows() -> dict[int, Any] | None:
            try:
                conn = sqlite3.connect(d.replica, timeout=5)
                try:
                    rows = dict(conn.execute("SELECT id, amount FROM orders").fetchall())
                finally:
                    conn.close()
            except sqlite3.Error:
                return None
            return rows if rows == d.shop.rows("orders") else None

        wait_until(replica_rows, "the replica equal to the source's orders", timeout=120,
                   diagnose=d.logs)

        # databus tail as orders: only orders; with no credential: refused.
        env = {**os.environ, "DATABUS_TOKEN": ORDERS_TOKEN}
        out = subprocess.run(
            [_exe(), "tail", "--relay", d.relay_url, "--ca-file", str(pki.ca),
             "--sources", "shop.orders", "--from-earliest", "--exit"],
            capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        assert lines and {line["source"] for line in lines} == {"shop.orders"}
        assert ORDERS_TOKEN not in out.stdout + out.stderr
        refused_tail = subprocess.run(
            [_exe(), "tail", "--relay", d.relay_url, "--ca-file", str(pki.ca),
             "--sources", "shop.items", "--from-earliest", "--exit"],
            capture_output=True, text=True, timeout=60, env=env)
        assert refused_tail.returncode != 0
        assert "forbidden" in refused_tail.stderr.lower()
        anonymous = subprocess.run(
            [_exe(), "tail", "--relay", d.relay_url, "--ca-file", str(pki.ca),
             "--sources", "shop.orders", "--from-earliest", "--exit"],
            capture_output=True, text=True, timeout=60,
            env={k: v for k, v in os.environ.items() if k != "DATABUS_TOKEN"})
        assert anonymous.returncode != 0
        assert "unauthorized" in anonymous.stderr.lower()
    finally:
        d.close()
    logs = d.logs()
    for secret in (ORDERS_TOKEN, PRODUCER_TOKEN, ADMIN_TOKEN):
        assert secret not in logs
