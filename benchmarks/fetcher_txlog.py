"""TxLog fetcher throughput and trigger cost, on SQLite and PostgreSQL, as ratios.

    .venv/bin/python benchmarks/fetcher_txlog.py [--rows 40000] [--txn-rows 10]
        [--repeat 3] [--no-postgres]

Table: ``orders(id integer primary key, customer text, qty integer, price real/double,
note text)``, rows of about 160 bytes. Writes are transactions of ``--txn-rows`` rows:
first ``--rows`` inserts (one multi-row statement per transaction), then ``--rows``
updates (one ranged ``UPDATE`` per transaction, so the row triggers fire once per
row). SQLite writers seal each transaction (one window per transaction).

Figures (each the best of ``--repeat`` runs; with and without triggers alternate):

- write rate with triggers / write rate without, for inserts and for updates: what
  capture costs the source's writers;
- fetcher rows/s / raw scan rows/s: the fetcher pulls every row of the final state
  from SCN 0 (after the updates each row belongs to an update transaction: one event
  per row, windows of ``--txn-rows`` events) into a real relay ``EventBuffer``, through
  the real session and pull loop (``TxlogPuller``, batch 500 transactions), without the
  HTTP server. The reference is a plain ``SELECT`` of the same rows with the same
  driver, measured in the same run; a second reference adds one raw fastavro
  ``schemaless_writer`` per row to that scan (what any Avro-producing reader pays),
  so the remaining gap is the TxLog join, the event headers and CRCs, and the buffer.

PostgreSQL runs on a throwaway server started as the test fixture starts it
(``tests/fixtures/_postgres.py``: fsync off, synchronous_commit off).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the scripts run as benchmarks/x.py: make ``tests`` importable
    sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402
import psycopg2.extras  # noqa: E402
from fastavro import parse_schema, schemaless_writer  # noqa: E402

from databus.cli import main as databus_main  # noqa: E402
from databus.fetchers._api import FetcherContext, fetcher_class  # noqa: E402
from databus.fetchers.txlog import TxlogFetcher, seal_sqlite_transaction  # noqa: E402
from databus.fetchers.txlog._fetcher import TxlogPuller  # noqa: E402
from databus.relay._buffer import EventBuffer  # noqa: E402
from databus.relay._catalog import RelayCatalog  # noqa: E402

NOTE = "x" * 100


def row(i: int) -> tuple[Any, ...]:
    return (i, f"customer-{i % 9973:05d}", i % 17, 19.99 + i % 100, NOTE)


def install(uri: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert databus_main(["txlog", "install", "--source", uri]) == 0


class Backend(Protocol):
    name: str

    def reset(self, triggers: bool) -> None: ...

    def insert(self, rows: list[tuple[Any, ...]]) -> None: ...

    def update(self, lo: int, hi: int) -> None: ...

    def scan(self) -> list[tuple[Any, ...]]: ...

    def uri(self) -> str: ...


class SqliteBackend:
    name = "SQLite"

    def __init__(self, base: Path) -> None:
        self.path = base / "bench.db"
        self.conn: sqlite3.Connection | None = None
        self.triggers = False

    def reset(self, triggers: bool) -> None:
        if self.conn is not None:
            self.conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")  # as install sets it: same for both
        self.conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, "
                          "qty INTEGER, price REAL, note TEXT)")
        self.triggers = triggers
        if triggers:
            install(self.uri())

    def _txn(self, body: Callable[[sqlite3.Connection], object]) -> None:
        assert self.conn is not None
        self.conn.execute("BEGIN")
        body(self.conn)
        if self.triggers:
            seal_sqlite_transaction(self.conn)
        self.conn.execute("COMMIT")

    def insert(self, rows: list[tuple[Any, ...]]) -> None:
        self._txn(lambda c: c.executemany(
            "INSERT INTO orders (id, customer, qty, price, note) VALUES (?, ?, ?, ?, ?)", rows))

    def update(self, lo: int, hi: int) -> None:
        self._txn(lambda c: c.execute(
            "UPDATE orders SET qty = qty + 1 WHERE id >= ? AND id < ?", (lo, hi)))

    def scan(self) -> list[tuple[Any, ...]]:
        assert self.conn is not None
        return self.conn.execute("SELECT id, customer, qty, price, note FROM orders").fetchall()

    def uri(self) -> str:
        return f"sqlite://{self.path}?tables=orders"


class PostgresBackend:
    name = "PostgreSQL"

    def __init__(self, kwargs: dict[str, Any], url: str) -> None:
        self.kwargs = kwargs
        self.url = url
        self.conn: Any = None

    def reset(self, triggers: bool) -> None:
        if self.conn is None:
            self.conn = psycopg2.connect(**self.kwargs)
            self.conn.autocommit = True
        with self.conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS orders, databus_txlog, databus_txlog_state, "
                        "databus_deleted_orders")
            cur.execute("CREATE TABLE orders (id integer PRIMARY KEY, customer text, "
                        "qty integer, price double precision, note text)")
        if triggers:
            install(self.uri())

    def insert(self, rows: list[tuple[Any, ...]]) -> None:
        with self.conn.cursor() as cur:
            cur.execute("BEGIN")
            psycopg2.extras.execute_values(
                cur, "INSERT INTO orders (id, customer, qty, price, note) VALUES %s", rows,
                page_size=len(rows))
            cur.execute("COMMIT")

    def update(self, lo: int, hi: int) -> None:
        with self.conn.cursor() as cur:
            cur.execute("UPDATE orders SET qty = qty + 1 WHERE id >= %s AND id < %s", (lo, hi))

    def scan(self) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute("SELECT id, customer, qty, price, note FROM orders")
            return list(cur.fetchall())

    def uri(self) -> str:
        return self.url.replace("postgresql://", "postgresql+txlog://", 1) + "?tables=orders"


def write(backend: Backend, rows: int, txn_rows: int, triggers: bool) -> tuple[float, float]:
    """(insert rows/s, update rows/s) on fresh tables."""
    backend.reset(triggers)
    start = time.perf_counter()
    for lo in range(0, rows, txn_rows):
        backend.insert([row(i) for i in range(lo, min(lo + txn_rows, rows))])
    inserts = rows / (time.perf_counter() - start)
    start = time.perf_counter()
    for lo in range(0, rows, txn_rows):
        backend.update(lo, lo + txn_rows)
    updates = rows / (time.perf_counter() - start)
    return inserts, updates


def fetch(backend: Backend, base: Path, expected: int) -> float:
    """Fetcher rows/s: every row from SCN 0 into a real EventBuffer."""
    uri = backend.uri()
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        catalog = RelayCatalog(Path(tmp) / "catalog.json")
        context = FetcherContext("bench", 0, catalog.for_buffer("bench", 0))
        fetcher = fetcher_class(uri)(uri, context)
        assert isinstance(fetcher, TxlogFetcher)
        session = fetcher.new_session()
        session.connect()
        buffer = EventBuffer(Path(tmp) / "bench.buf", 128 << 20)
        try:
            start = time.perf_counter()
            puller = TxlogPuller(session, context)
            puller.prepare()
            last, events = 0, 0
            while True:
                result = puller.poll(last)
                for window in result.windows:
                    buffer.start_window(window.scn)
                    for event in window.events:
                        buffer.append(event)
                    buffer.end_window(window.timestamp_ns)
                    events += len(window.events)
                last = result.upto
                if not result.full:
                    break
            elapsed = time.perf_counter() - start
        finally:
            buffer.close()
            session.close()
    assert events == expected, f"{events} events, expected {expected}"
    return events / elapsed


def scan_rate(backend: Backend, expected: int) -> float:
    start = time.perf_counter()
    assert len(backend.scan()) == expected
    return expected / (time.perf_counter() - start)


SCHEMA = parse_schema({"type": "record", "name": "orders", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": ["null", "string"]},
    {"name": "qty", "type": ["null", "long"]}, {"name": "price", "type": ["null", "double"]},
    {"name": "note", "type": ["null", "string"]}]})
FIELDS = ("id", "customer", "qty", "price", "note")


def scan_encode_rate(backend: Backend, expected: int) -> float:
    """Second reference: the raw scan plus one fastavro encode per row (no events)."""
    start = time.perf_counter()
    rows = backend.scan()
    for r in rows:
        buf = io.BytesIO()
        schemaless_writer(buf, SCHEMA, dict(zip(FIELDS, r, strict=True)))
    assert len(rows) == expected
    return expected / (time.perf_counter() - start)


def measure(backend: Backend, base: Path, args: argparse.Namespace) -> dict[str, float]:
    best: dict[str, float] = {}

    def keep(name: str, value: float) -> None:
        best[name] = max(best.get(name, 0.0), value)

    for _ in range(args.repeat):
        for triggers in (False, True):
            inserts, updates = write(backend, args.rows, args.txn_rows, triggers)
            suffix = "trig" if triggers else "plain"
            keep(f"insert_{suffix}", inserts)
            keep(f"update_{suffix}", updates)
        # Tables now hold the triggered run's final state: fetch it, and scan it.
        keep("scan", scan_rate(backend, args.rows))
        keep("scan_encode", scan_encode_rate(backend, args.rows))
        keep("fetch", fetch(backend, base, args.rows))
    return best


@contextmanager
def postgres() -> Iterator[PostgresBackend]:
    from tests.fixtures._postgres import PostgresServer, launch
    from tests.fixtures._procs import shutdown

    control = launch()
    try:
        server = PostgresServer.from_control(control)
        yield PostgresBackend(server.connect_kwargs(), server.url())
    finally:
        shutdown(control)


def report(name: str, best: dict[str, float]) -> None:
    print(f"\n{name}")
    print(f"  insert rows/s  plain {best['insert_plain']:>10,.0f}  with triggers "
          f"{best['insert_trig']:>10,.0f}  ratio {best['insert_trig'] / best['insert_plain']:.2f}")
    print(f"  update rows/s  plain {best['update_plain']:>10,.0f}  with triggers "
          f"{best['update_trig']:>10,.0f}  ratio {best['update_trig'] / best['update_plain']:.2f}")
    print(f"  fetcher rows/s {best['fetch']:>10,.0f}  raw scan {best['scan']:>10,.0f}  "
          f"ratio {best['fetch'] / best['scan']:.3f}")
    print(f"  raw scan + fastavro encode {best['scan_encode']:>10,.0f}  "
          f"fetcher ratio to it {best['fetch'] / best['scan_encode']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--txn-rows", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
          f"{args.rows} rows, {args.txn_rows} rows per transaction, best of {args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        report("SQLite", measure(SqliteBackend(base), base, args))
        if not args.no_postgres:
            with postgres() as backend:
                report("PostgreSQL 15", measure(backend, base, args))


if __name__ == "__main__":
    main()
