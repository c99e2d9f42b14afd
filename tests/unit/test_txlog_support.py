"""Helpers shared by the TxLog fetcher tests (SQLite here, PostgreSQL in integration).
This module holds no tests.

- ``relay_windows``: every window a running relay serves, decoded with the relay's own
  catalog into ``Change``s (source name, op, key, row dict), EOW counts checked;
- ``replay``: the state a consumer builds by applying windows in order;
- ``Workload``: random transactions over three tables (int, composite and text keys)
  that tag every row they write with the transaction's tag, so that a test can check
  that a transaction's rows never span windows;
- ``SqliteSource``: a SQLite database with a writer connection.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from databus.cli import main as databus_main
from databus.event import Op, decode_eow, decode_event, iter_events
from databus.fetchers._api import FetcherContext, fetcher_class
from databus.fetchers.txlog import TxlogFetcher, seal_sqlite_transaction
from databus.fetchers.txlog._fetcher import PendingWindow, TxlogPuller
from databus.fetchers.txlog._schema import normalize_key
from databus.relay._catalog import RelayCatalog
from databus.schemas import AvroCodec
from tests.relay_harness import RunningRelay

BUFFER = "src"


@dataclass(frozen=True)
class Change:
    source: str
    op: str  # "upsert" or "delete"
    key: Any
    row: dict[str, Any] | None


@dataclass
class CapturedWindow:
    scn: int
    timestamp_ns: int
    changes: list[Change] = field(default_factory=list)

    def tags(self) -> set[str]:
        return {c.row["tag"] for c in self.changes if c.row is not None and "tag" in c.row}


def decode_change(data: bytes, offset: int, catalog: RelayCatalog, codec: AvroCodec) -> Change:
    event = decode_event(data, offset)
    header = event.header
    name = catalog.by_id(header.source_id).name
    value = event.value
    row = codec.decode(value, header.schema_fingerprint) if value else None
    return Change(name, "upsert" if header.op is Op.UPSERT else "delete", event.key, row)


def decode_windows(data: bytes, catalog: RelayCatalog) -> list[CapturedWindow]:
    """Windows of a stream body; every CRC and every EOW count is checked."""
    codec = AvroCodec(catalog.registry)
    windows: list[CapturedWindow] = []
    current: CapturedWindow | None = None
    for offset, header in iter_events(data):
        event = decode_event(data, offset)
        if current is None:
            current = CapturedWindow(header.scn, header.timestamp_ns)
        assert header.scn == current.scn, "a window without its EOW"
        if header.is_eow:
            assert decode_eow(event).event_count == len(current.changes)
            windows.append(current)
            current = None
            continue
        current.changes.append(decode_change(data, offset, catalog, codec))
    assert current is None, "the body ends inside a window"
    return windows


class DirectPuller:
    """A fetcher's pull step driven by hand (``poll``), into decoded windows.

    For tests that need to decide when the fetcher polls (coalescing, resume points).
    The session and catalog are the real ones; only the thread loop is left out.
    """

    def __init__(self, uri: str, tmp_path: Path, last: int = 0) -> None:
        self.catalog = RelayCatalog(tmp_path / "direct-catalog.json")
        context = FetcherContext(BUFFER, 0, self.catalog.for_buffer(BUFFER, 0))
        fetcher = fetcher_class(uri)(uri, context)
        assert isinstance(fetcher, TxlogFetcher)
        self.session = fetcher.new_session()
        self.session.connect()
        self.puller = TxlogPuller(self.session, context)
        self.puller.prepare()
        self.last = last

    def poll(self) -> list[CapturedWindow]:
        """Poll until caught up; the windows read."""
        windows: list[CapturedWindow] = []
        while True:
            with self.session.guard():
                result = self.puller.poll(self.last)
            self.last = result.upto
            windows += [self.decode(w) for w in result.windows]
            if not result.full:
                return windows

    def decode(self, window: PendingWindow) -> CapturedWindow:
        codec = AvroCodec(self.catalog.registry)
        data = b"".join(window.events)
        changes = [decode_change(data, off, self.catalog, codec) for off, _ in iter_events(data)]
        return CapturedWindow(window.scn, window.timestamp_ns, changes)

    def close(self) -> None:
        self.session.close()


async def relay_windows(r: RunningRelay, checkpoint: str | None = None
                        ) -> list[CapturedWindow]:
    """Every window the relay serves after ``checkpoint`` (all of them by default)."""
    body = b""
    cp = checkpoint
    while True:
        query: dict[str, Any] = {"max_bytes": 1 << 22}
        if cp is not None:
            query["checkpoint"] = cp
        async with await r.get("/v1/stream", **query) as resp:
            assert resp.status == 200, await resp.text()
            chunk = await resp.read()
            cp = resp.headers["X-Databus-Checkpoint"]
        if not chunk:
            return decode_windows(body, r.relay.catalog)
        body += chunk


async def status(r: RunningRelay) -> dict[str, Any]:
    doc = await r.json("/v1/status")
    buffer: dict[str, Any] = doc["buffers"][BUFFER]
    return buffer


async def wait_status(r: RunningRelay, check: Callable[[dict[str, Any]], bool], *,
                      what: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = await status(r)
        if check(doc):
            return doc
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{what}: not reached; status: {doc}")


async def wait_for_window(r: RunningRelay, check: Callable[[CapturedWindow], bool], *,
                          what: str, timeout: float = 20.0) -> list[CapturedWindow]:
    """Poll the relay until one of its windows passes ``check``; all its windows."""
    deadline = time.monotonic() + timeout
    while True:
        windows = await relay_windows(r)
        if any(check(w) for w in windows):
            return windows
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: no such window in {summary(windows)}")
        await asyncio.sleep(0.05)


def summary(windows: list[CapturedWindow]) -> list[list[tuple[str, str, Any, Any]]]:
    """Windows as plain lists, for equality assertions."""
    return [[(c.source, c.op, c.key, c.row) for c in w.changes] for w in windows]


def replay(windows: list[CapturedWindow]) -> dict[str, dict[Any, dict[str, Any]]]:
    """The state a consumer holds after applying ``windows`` in order."""
    state: dict[str, dict[Any, dict[str, Any]]] = {}
    for window in windows:
        for change in window.changes:
            table = state.setdefault(change.source, {})
            if change.op == "delete":
                table.pop(change.key, None)
            else:
                assert change.row is not None
                table[change.key] = change.row
    return state


def rows_by_key(rows: list[dict[str, Any]], key: tuple[str, ...]) -> dict[Any, dict[str, Any]]:
    """Source rows keyed as the fetcher keys events."""
    return {normalize_key([row[k] for k in key]): row for row in rows}


def cli(*args: str) -> int:
    return databus_main(["txlog", *args])


# -- the random workload ----------------------------------------------------------

WORKLOAD_TABLES = {
    "orders": ("id",),
    "items": ("order_id", "line"),
    "notes": ("code",),
}
WORKLOAD_DDL = [
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL, qty INTEGER)",
    "CREATE TABLE items (order_id INTEGER NOT NULL, line INTEGER NOT NULL, tag TEXT NOT NULL, "
    "sku TEXT, PRIMARY KEY (order_id, line))",
    "CREATE TABLE notes (code TEXT PRIMARY KEY, tag TEXT NOT NULL, body TEXT)",
]
END_TAG = "end"


class Workload:
    """Random transactions: each statement writes ``tag`` into every row it touches.

    ``param`` renders a named placeholder for the driver (``:x`` or ``%(x)s``).
    """

    def __init__(self, param: Callable[[str], str], keys: int = 40) -> None:
        self.p = param
        self.keys = keys

    def transaction(self, rng: random.Random, tag: str) -> list[tuple[str, dict[str, Any]]]:
        return [self.statement(rng, tag) for _ in range(rng.randint(1, 6))]

    def statement(self, rng: random.Random, tag: str) -> tuple[str, dict[str, Any]]:
        p = self.p
        k = rng.randrange(self.keys)
        new = rng.randrange(self.keys)
        table = rng.choice(("orders", "items", "notes"))
        kind = rng.choices(("upsert", "update", "delete", "rekey", "bulk"),
                           weights=(5, 3, 2, 1, 1))[0]
        args: dict[str, Any] = {"tag": tag, "k": k, "new": new, "q": rng.randrange(100),
                                "o": k % 8, "line": k // 8, "code": f"c{k}", "ncode": f"c{new}"}
        if table == "orders":
            sql = {
                "upsert": f"INSERT INTO orders (id, tag, qty) VALUES ({p('k')}, {p('tag')}, "
                          f"{p('q')}) ON CONFLICT (id) DO UPDATE SET tag = excluded.tag, "
                          "qty = excluded.qty",
                "update": f"UPDATE orders SET tag = {p('tag')}, qty = qty + 1 WHERE id = {p('k')}",
                "delete": f"DELETE FROM orders WHERE id = {p('k')}",
                "rekey": f"UPDATE orders SET id = {p('new')}, tag = {p('tag')} WHERE id = {p('k')} "
                         f"AND NOT EXISTS (SELECT 1 FROM orders WHERE id = {p('new')})",
                "bulk": f"UPDATE orders SET tag = {p('tag')} WHERE id / 7 = {p('o')}",
            }[kind]
        elif table == "items":
            sql = {
                "upsert": f"INSERT INTO items (order_id, line, tag, sku) VALUES ({p('o')}, "
                          f"{p('line')}, {p('tag')}, {p('tag')}) ON CONFLICT (order_id, line) "
                          "DO UPDATE SET tag = excluded.tag, sku = excluded.sku",
                "update": f"UPDATE items SET tag = {p('tag')}, sku = NULL WHERE order_id = "
                          f"{p('o')} AND line = {p('line')}",
                "delete": f"DELETE FROM items WHERE order_id = {p('o')} AND line = {p('line')}",
                "rekey": f"UPDATE items SET line = line + 100, tag = {p('tag')} WHERE order_id = "
                         f"{p('o')} AND line = {p('line')} AND NOT EXISTS (SELECT 1 FROM items "
                         f"WHERE order_id = {p('o')} AND line = {p('line')} + 100)",
                "bulk": f"UPDATE items SET tag = {p('tag')} WHERE order_id = {p('o')}",
            }[kind]
        else:
            sql = {
                "upsert": f"INSERT INTO notes (code, tag, body) VALUES ({p('code')}, {p('tag')}, "
                          f"{p('tag')}) ON CONFLICT (code) DO UPDATE SET tag = excluded.tag, "
                          "body = excluded.body",
                "update": f"UPDATE notes SET tag = {p('tag')} WHERE code = {p('code')}",
                "delete": f"DELETE FROM notes WHERE code = {p('code')}",
                "rekey": f"UPDATE notes SET code = {p('ncode')}, tag = {p('tag')} WHERE code = "
                         f"{p('code')} AND NOT EXISTS (SELECT 1 FROM notes WHERE code = "
                         f"{p('ncode')})",
                "bulk": f"UPDATE notes SET tag = {p('tag')} WHERE length(code) = 2",
            }[kind]
        return sql, {name: args[name] for name in args if f"{p(name)}" in sql}


def check_acceptance(windows: list[CapturedWindow], committed: set[str], rolled_back: set[str],
                     source_state: dict[str, dict[Any, dict[str, Any]]],
                     *, one_transaction_per_window: bool) -> None:
    """The relay's windows reproduce the source, and no transaction spans windows."""
    scns = [w.scn for w in windows]
    assert scns == sorted(set(scns)), "window SCNs must increase"
    seen_in: dict[str, int] = {}
    for window in windows:
        tags = window.tags()
        if one_transaction_per_window:
            assert len(tags) <= 1, f"window {window.scn} mixes transactions {tags}"
        for tag in tags:
            assert tag not in seen_in, f"transaction {tag} is in windows {seen_in[tag]} and " \
                                       f"{window.scn}"
            seen_in[tag] = window.scn
    assert not set(seen_in) & rolled_back, "a rolled back transaction was delivered"
    assert set(seen_in) <= committed | {END_TAG}
    assert replay(windows) == source_state


def iter_tags(prefix: str) -> Iterator[str]:
    n = 0
    while True:
        n += 1
        yield f"{prefix}-{n}"


# -- SQLite ----------------------------------------------------------------------------


class SqliteSource:
    """A SQLite database file and a writer connection (autocommit, explicit BEGIN)."""

    def __init__(self, path: Path, *ddl: str) -> None:
        self.path = path
        self.conn = self.connect()
        for statement in ddl:
            self.conn.execute(statement)

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, isolation_level=None, timeout=10,
                               check_same_thread=False)

    def uri(self, tables: str, **params: Any) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"tables": tables, "poll_ms": 10,
                                                  **params}.items())
        return f"sqlite://{self.path}?{query}"

    def install(self, tables: str) -> None:
        assert cli("install", "--source", self.uri(tables)) == 0

    def run(self, *statements: str) -> None:
        for statement in statements:
            self.conn.execute(statement)

    def txn(self, *statements: str, seal: bool = True) -> None:
        """One transaction; sealed (its own window) unless ``seal`` is False."""
        self.conn.execute("BEGIN IMMEDIATE")
        for statement in statements:
            self.conn.execute(statement)
        if seal:
            seal_sqlite_transaction(self.conn)
        self.conn.execute("COMMIT")

    def rows(self, table: str, columns: str = "*") -> list[dict[str, Any]]:
        cur = self.conn.execute(f"SELECT {columns} FROM {table}")
        names = [d[0] for d in cur.description]
        return [
            {n: v for n, v in zip(names, row, strict=True) if n != "databus_txn"}
            for row in cur.fetchall()
        ]

    def close(self) -> None:
        self.conn.close()
