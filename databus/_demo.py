"""``databus demo``: the whole pipeline on embedded defaults, with a live status view.

A SQLite database with trigger capture (the TxLog) is the source, with a shop's rows
already in it before capture is installed; a writer thread runs random shop transactions
against it; a relay (in this process, on 127.0.0.1) pulls them
with the trigger fetcher and, as its first act (``initial_dump``), dumps the rows that
were there before (DBLog watermarks, docs/dumps.md), interleaved with the new changes;
a bootstrap service (SQLite store: producer, applier, server)
keeps the long log and the snapshot; a ``DatabusClient`` keeps a replica from the
start, and a second, late one joins half-way with no checkpoint: it starts from a
snapshot of the bootstrap service, then follows the relay; the replicator keeps a copy
of the tables in a second SQLite database. At the end the writer stops, everyone
catches up, and the replicas and the copy are compared with the source row by row.
Nothing needs a server or root.

This module composes every part, so it imports them inside functions: the core
package itself never depends on the relay or the client.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = [
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL,"
    " status TEXT NOT NULL, total_cents INTEGER NOT NULL)",
    "CREATE TABLE order_items (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL,"
    " sku TEXT NOT NULL, quantity INTEGER NOT NULL)",
]
TABLES = ("customers", "orders", "order_items")
CITIES = ("Lyon", "Oslo", "Porto", "Kyoto", "Quito", "Accra")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the whole pipeline on embedded defaults and check the replica"
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="how long to write")
    parser.add_argument("--rate", type=float, default=150.0, help="transactions per second")
    parser.add_argument("--dir", help="keep the demo's files here (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--existing", type=int, default=2000,
                        help="customers in the source before capture starts (with about "
                        "1.5 orders and 3 items each), brought in by a dump")
    parser.set_defaults(handler=run)


# -- the source workload ------------------------------------------------------------


class Workload:
    """Random shop transactions: new customers, orders with items, status changes,
    cancelled items. Each transaction touches one to three tables."""

    def __init__(self, path: Path, seed: int) -> None:
        self.path = path
        self.rng = random.Random(seed)
        self.transactions = 0
        self.next_id = {t: 1 for t in TABLES}

    def populate(self, conn: sqlite3.Connection, customers: int) -> None:
        """Rows that exist before capture is installed: only a dump can bring them in."""
        rng = self.rng
        with conn:
            for _ in range(customers):
                cid = self._new_id("customers")
                conn.execute("INSERT INTO customers (id, name, city) VALUES (?, ?, ?)",
                             (cid, f"customer {cid}", rng.choice(CITIES)))
            for _ in range(customers * 3 // 2):
                oid = self._new_id("orders")
                conn.execute("INSERT INTO orders (id, customer_id, status, total_cents)"
                             " VALUES (?, ?, 'delivered', ?)",
                             (oid, rng.randrange(1, self.next_id["customers"]),
                              rng.randint(1, 40) * 1250))
                conn.executemany(
                    "INSERT INTO order_items (id, order_id, sku, quantity) VALUES (?, ?, ?, ?)",
                    [(self._new_id("order_items"), oid, f"SKU-{rng.randrange(100):03d}",
                      rng.randint(1, 5)) for _ in range(2)])

    def _new_id(self, table: str) -> int:
        value = self.next_id[table]
        self.next_id[table] += 1
        return value

    def one(self, conn: sqlite3.Connection) -> None:
        from databus.fetchers.txlog import seal_sqlite_transaction

        rng = self.rng
        with conn:  # one transaction, sealed so that it becomes one window
            self._changes(conn, rng)
            seal_sqlite_transaction(conn)
        self.transactions += 1

    def _changes(self, conn: sqlite3.Connection, rng: random.Random) -> None:
        choice = rng.random()
        if choice < 0.25 or self.next_id["customers"] == 1:
            cid = self._new_id("customers")
            conn.execute("INSERT INTO customers (id, name, city) VALUES (?, ?, ?)",
                         (cid, f"customer {cid}", rng.choice(CITIES)))
        elif choice < 0.6:
            cid = rng.randrange(1, self.next_id["customers"])
            oid = self._new_id("orders")
            items = [(self._new_id("order_items"), oid, f"SKU-{rng.randrange(100):03d}",
                      rng.randint(1, 5)) for _ in range(rng.randint(1, 3))]
            conn.execute("INSERT INTO orders (id, customer_id, status, total_cents)"
                         " VALUES (?, ?, 'new', ?)",
                         (oid, cid, sum(q for *_, q in items) * 1250))
            conn.executemany("INSERT INTO order_items (id, order_id, sku, quantity)"
                             " VALUES (?, ?, ?, ?)", items)
        elif choice < 0.85 and self.next_id["orders"] > 1:
            oid = rng.randrange(1, self.next_id["orders"])
            conn.execute("UPDATE orders SET status = ? WHERE id = ?",
                         (rng.choice(("paid", "shipped", "delivered")), oid))
            conn.execute("UPDATE customers SET city = ? WHERE id = "
                         "(SELECT customer_id FROM orders WHERE id = ?)",
                         (rng.choice(CITIES), oid))
        elif self.next_id["order_items"] > 1:
            iid = rng.randrange(1, self.next_id["order_items"])
            conn.execute("DELETE FROM order_items WHERE id = ?", (iid,))


def source_rows(path: Path) -> dict[str, dict[Any, dict[str, Any]]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        out: dict[str, dict[Any, dict[str, Any]]] = {}
        for table in TABLES:
            rows = conn.execute(f"SELECT * FROM {table}").fetchall()  # a fixed name
            out[table] = {row["id"]: dict(row) for row in rows}
        return out
    finally:
        conn.close()


def target_replica(path: Path) -> Replica:
    """The replicator's copy (a SQLite database) as a ``Replica`` to compare."""
    copy = Replica()
    if not path.exists():
        return copy
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        for table in TABLES:
            try:
                rows = conn.execute(f"SELECT * FROM {table}").fetchall()  # a fixed name
            except sqlite3.OperationalError:  # not created yet
                continue
            copy.tables[table] = {row["id"]: dict(row) for row in rows}
    finally:
        conn.close()
    return copy


# -- the consumer ---------------------------------------------------------------------


@dataclass
class Replica:
    tables: dict[str, dict[Any, dict[str, Any]]] = field(
        default_factory=lambda: {t: {} for t in TABLES})
    events: int = 0


def make_consumer(replica: Replica) -> Any:
    from databus.client import Consumer

    class ReplicaKeeper(Consumer):
        def on_data_event(self, event: Any) -> None:
            table = event.source.split(".", 1)[1]
            replica.events += 1
            if event.is_delete:
                replica.tables[table].pop(event.key, None)
            else:
                replica.tables[table][event.key] = dict(event.value)

    return ReplicaKeeper()


def compare(source: dict[str, dict[Any, dict[str, Any]]], replica: Replica) -> list[str]:
    """Differences between the source tables and the replica (business columns)."""
    problems = []
    for table, rows in source.items():
        copy = replica.tables[table]
        if set(rows) != set(copy):
            missing = sorted(set(rows) - set(copy))[:5]
            extra = sorted(set(copy) - set(rows))[:5]
            problems.append(f"{table}: keys differ (missing {missing}, extra {extra})")
            continue
        for key, row in rows.items():
            mismatched = {c: (v, copy[key].get(c)) for c, v in row.items()
                          if c in copy[key] and copy[key][c] != v}
            if mismatched:
                problems.append(f"{table}[{key}]: {mismatched}")
    return problems


# -- the run --------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="databus-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_run(args, base))


async def _run(args: argparse.Namespace, base: Path) -> int:
    from aiohttp import web
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from databus import cli
    from databus.bootstrap._service import build_app, open_configured_storage
    from databus.client import DatabusClient, FileCheckpointStore
    from databus.config import BootstrapConfig, BufferConfig, RelayConfig
    from databus.relay._relay import Relay
    from databus.relay._server import create_app

    console = Console()
    db = base / "shop.db"
    db.unlink(missing_ok=True)
    conn = sqlite3.connect(db, check_same_thread=False)
    for statement in SCHEMA:
        conn.execute(statement)
    conn.commit()
    workload = Workload(db, args.seed)
    workload.populate(conn, max(0, args.existing))
    existing = sum(len(rows) for rows in source_rows(db).values())
    uri = f"sqlite://{db}?tables={','.join(TABLES)}&poll_ms=20"
    console.print(f"[bold]databus demo[/] in {base}")
    console.print(f"source: {db} (SQLite, {existing:,} rows already there; trigger capture "
                  "installed by `databus txlog install`, dump watermarks by `databus dump "
                  "setup`)")
    for command in (["txlog", "install"], ["dump", "setup"]):
        if cli.main(["--log-level", "WARNING", *command, "--source", uri]) != 0:
            console.print(f"[red]databus {' '.join(command)} failed[/]")
            return 1

    relay_dir = base / "relay"
    # initial_dump: the rows that were there before come in through a dump, in chunks
    # small enough (and paced) that its progress can be watched below.
    config = RelayConfig(data_dir=relay_dir, port=0,
                         buffers=(BufferConfig(name="shop", capacity_mb=16, source=uri,
                                               initial_dump=True, dump_chunk_rows=500,
                                               dump_delay_ms=150),))
    relay = Relay(config)
    runner = web.AppRunner(create_app(relay), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    console.print(f"relay: {url} (trigger fetcher -> mmap buffer; a dump of the existing "
                  "rows)")

    # The fetcher registers the sources as it starts; subscribe once they are listed.
    wanted = {f"shop.{t}" for t in TABLES}
    deadline = time.monotonic() + 30
    while not wanted <= {e.name for e in relay.catalog.sources()}:
        if time.monotonic() > deadline:
            console.print(f"[red]the relay never listed {sorted(wanted)}[/]")
            await runner.cleanup()
            return 1
        await asyncio.sleep(0.05)

    boot_config = BootstrapConfig(storage=f"sqlite:///{base / 'bootstrap.db'}", port=0,
                                  producer=_producer_config(url))
    boot_storage = open_configured_storage(boot_config)
    boot_runner = web.AppRunner(build_app(boot_config, boot_storage), access_log=None)
    await boot_runner.setup()
    boot_site = web.TCPSite(boot_runner, "127.0.0.1", 0)
    await boot_site.start()
    boot_url = f"http://127.0.0.1:{boot_runner.addresses[0][1]}"
    console.print(f"bootstrap: {boot_url} (log writer, log applier, snapshot server;"
                  f" {base / 'bootstrap.db'})")

    sources = [f"shop.{t}" for t in TABLES]
    # The replicator keeps a copy of the tables in a second SQLite database: an initial
    # copy through the bootstrap service, then the stream, each batch applied with the
    # SCN it reached in one transaction (docs/replicator.md).
    from databus.config import ReplicateConfig, ReplicatedTableConfig
    from databus.replicator._replicator import Replicator

    replica_db = base / "replica.db"
    replica_db.unlink(missing_ok=True)
    replicator = Replicator(ReplicateConfig(
        name="demo", relays=(url,), bootstrap=(boot_url,), target=f"sqlite:///{replica_db}",
        tables=tuple(ReplicatedTableConfig(source=s) for s in sources),
        batch_rows=2000, batch_ms=200))
    replicator_task = asyncio.create_task(replicator.run_async())
    console.print(f"replicator: the tables into {replica_db} (databus replicate)")
    replica = Replica()
    client = DatabusClient([url], sources=sources, bootstrap=[boot_url],
                           checkpoint_store=FileCheckpointStore(base / "checkpoints"),
                           poll_wait_ms=500)
    client.register(make_consumer(replica))
    consumer_task = asyncio.create_task(client.run_async())
    # Joins half-way with no checkpoint: a snapshot first, then the relay.
    late_replica = Replica()
    late = DatabusClient([url], sources=sources, bootstrap=[boot_url],
                         checkpoint_store=FileCheckpointStore(base / "late-checkpoints"),
                         poll_wait_ms=500)
    late.register(make_consumer(late_replica))
    late_task: asyncio.Task[None] | None = None

    stop_writing = threading.Event()

    def write() -> None:
        interval = 1.0 / args.rate if args.rate > 0 else 0.0
        next_at = time.monotonic()
        while not stop_writing.is_set():
            workload.one(conn)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                stop_writing.wait(delay)

    writer = threading.Thread(target=write, name="demo-writer", daemon=True)
    writer.start()
    started = time.monotonic()

    def view(phase: str) -> Table:
        status = relay.status()["buffers"]["shop"]
        fetcher = status.get("fetcher") or {}
        metrics = client.metrics
        table = Table(title=f"databus demo: {phase}", show_header=True)
        for column in ("", "SCN", "detail"):
            table.add_column(column)
        table.add_row("source", str(fetcher.get("source_scn")),
                      f"{workload.transactions} transactions written")
        table.add_row("relay", f"{status['min_scn']}..{status['max_scn']}",
                      f"{status['windows']} windows, {status['used_bytes']:,} bytes, "
                      f"fetcher {fetcher.get('state')}")
        table.add_row("dump", *_dump_row(relay.dumps.list_dumps()))
        boot = boot_storage.state()
        table.add_row("bootstrap", f"{boot.applied_scn}/{boot.producer_scn}",
                      f"applied/logged; {boot.log_windows} windows in the log, "
                      f"{sum(boot.snapshot_rows.values())} rows in the snapshot")
        table.add_row("consumer", str(metrics.consumer_scn),
                      f"lag {metrics.lag_scn} SCN / {metrics.lag_ms or 0:.0f} ms, "
                      f"{metrics.events_per_second:.0f} events/s, "
                      f"{sum(len(t) for t in replica.tables.values())} rows in the replica")
        applier = replicator.consumer
        if applier is not None:
            stats = applier.stats
            table.add_row("replicator", str(stats.applied_scn),
                          f"{stats.batches} target transactions, "
                          f"{sum(stats.rows.values())} rows applied")
        if late_task is None:
            table.add_row("late consumer", "-", "joins half-way")
        else:
            late_metrics = late.metrics
            phase = "bootstrapping" if late_metrics.bootstrapping else "following the relay"
            table.add_row("late consumer", str(late_metrics.consumer_scn),
                          f"{phase}, {late_replica.events} events, "
                          f"{sum(len(t) for t in late_replica.tables.values())} rows")
        return table

    ok = False
    try:
        with Live(view("writing"), console=console, refresh_per_second=4) as live:
            while time.monotonic() - started < args.seconds:
                await asyncio.sleep(0.25)
                if late_task is None and time.monotonic() - started >= args.seconds / 2:
                    late_task = asyncio.create_task(late.run_async())
                live.update(view("writing"))
                if consumer_task.done() or (late_task is not None and late_task.done()):
                    break
            if late_task is None:
                late_task = asyncio.create_task(late.run_async())
            stop_writing.set()
            writer.join()
            # Caught up when the dump is over and the replica equals the source (compared a
            # few times a second). The replicas can equal the source before the dump ends: its
            # last chunks may hold only rows the log already brought (written since).
            deadline = time.monotonic() + 60
            tasks = (consumer_task, late_task, replicator_task)
            while time.monotonic() < deadline and not any(t.done() for t in tasks):
                live.update(view("catching up"))
                dumps = relay.dumps.list_dumps()
                dumped = bool(dumps) and dumps[0]["state"] == "done"
                final = source_rows(db)
                if (dumped and not compare(final, replica)
                        and not compare(final, late_replica)
                        and not compare(final, target_replica(replica_db))):
                    break
                await asyncio.sleep(0.25)
            live.update(view("done"))
        for task in (consumer_task, late_task, replicator_task):
            if task.done():
                task.result()  # raises what stopped the consumer
        final = source_rows(db)
        ok = True
        applied = replicator.consumer.stats.applied_scn if replicator.consumer else None
        for name, copy, scn in (("replica", replica, client.metrics.consumer_scn),
                                ("late replica", late_replica, late.metrics.consumer_scn),
                                (f"replicated copy ({replica_db.name})",
                                 target_replica(replica_db), applied)):
            problems = compare(final, copy)
            rows = sum(len(t) for t in copy.tables.values())
            if problems:
                ok = False
                console.print(f"[red]{name} differs from the source[/] ({len(problems)}):")
                for line in problems[:10]:
                    console.print(f"  {line}")
            else:
                console.print(
                    f"[green]{name} equals source[/]: {rows} rows in {len(TABLES)} tables, "
                    f"{copy.events} events, consumer at SCN {scn}"
                )
        dumps = relay.dumps.list_dumps()
        if ok and not (dumps and dumps[0]["state"] == "done"):
            ok = False
            console.print(f"[red]the dump of the existing rows did not finish[/]: {dumps}")
        if ok:
            rows = dumps[0]["progress"]["rows"]
            console.print(f"the dump brought in {rows:,} rows as each chunk found them: the "
                          f"{existing:,} that existed before capture, and rows written since")
            console.print(f"{workload.transactions} transactions written; the late consumer "
                          f"started from a bootstrap snapshot "
                          f"({late.metrics.bootstraps} bootstrap(s))")
    finally:
        stop_writing.set()
        client.stop()
        late.stop()
        replicator.stop()
        for running in (consumer_task, late_task, replicator_task):
            if running is not None and not running.done():
                await asyncio.wait([running], timeout=10)
        await boot_runner.cleanup()
        await runner.cleanup()
        conn.close()
    return 0 if ok else 1


def _dump_row(dumps: list[dict[str, Any]]) -> tuple[str, str]:
    """The SCN and detail cells of the live view's dump row."""
    if not dumps:
        return "-", "waiting for the fetcher"
    # The same progress bar as `databus status` shows for a relay's active dumps.
    from databus._status_view import dump_cells, dump_entry

    dump = dumps[0]
    tables = [t for t in dump["tables"] if t["last_scn"] is not None]
    scn = str(tables[-1]["last_scn"]) if tables else "-"
    return scn, dump_cells(dump_entry(dump) or {})


def _producer_config(relay_url: str) -> Any:
    from databus.config import ProducerConfig

    return ProducerConfig(relays=(relay_url,), poll_wait_ms=200)
