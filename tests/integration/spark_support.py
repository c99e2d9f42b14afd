"""Shared by the Spark job tests: PostgreSQL stores in throwaway schemas, a random but
reproducible bootstrap log, and table dumps to compare snapshots row for row."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg2

from databus.bootstrap._storage import BootstrapStorage, LogWindow, open_storage, stored_event
from databus.checkpoint import Checkpoint
from databus.event import Op, encode_event
from tests.fixtures.servers import PostgresServer

SOURCES = ("shop.orders", "shop.items", "shop.tags")
Row = tuple[Any, ...]


class Stores:
    """Creates stores in fresh schemas of the session PostgreSQL; drops them at the end."""

    def __init__(self, pg: PostgresServer) -> None:
        self.pg = pg
        self.schemas: list[str] = []
        self.opened: list[BootstrapStorage] = []

    def url(self, *, span: int | None = None) -> str:
        schema = "bt_spark_" + uuid.uuid4().hex[:10]
        self.schemas.append(schema)
        url = f"{self.pg.url()}?schema={schema}"
        return url + (f"&log_partition_span={span}" if span else "")

    def open(self, url: str) -> BootstrapStorage:
        storage = open_storage(url)
        self.opened.append(storage)
        return storage

    def query(self, url: str, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        schema = url.split("schema=")[1].split("&")[0]
        conn = psycopg2.connect(self.pg.dsn, options=f"-c search_path={schema}")
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, params or None)
                rows = cur.fetchall() if cur.description else []
            return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)
                    for r in rows]
        finally:
            conn.close()

    def snapshot(self, url: str) -> dict[str, list[Row]]:
        """Every snapshot table, row for row, by source name."""
        out = {}
        for name, source_id in self.query(url, "SELECT name, source_id FROM dbus_sources"):
            out[name] = self.query(url, f"SELECT key, scn, op, pkey, key_hash, event FROM"
                                        f" dbus_snapshot_{source_id} ORDER BY key")
        return out

    def staging_tables(self, url: str) -> list[Row]:
        """Staging tables (``dbus_snapshot_<id>_next``) in the store's schema."""
        return self.query(url, "SELECT tablename FROM pg_tables WHERE schemaname ="
                               " current_schema() AND tablename LIKE '%\\_next'")

    def state(self, url: str) -> dict[str, str]:
        return dict(self.query(url, "SELECT name, value FROM dbus_state"))  # type: ignore[arg-type]

    def close(self) -> None:
        for storage in self.opened:
            storage.close()
        conn = psycopg2.connect(self.pg.dsn)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                for schema in self.schemas:
                    cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        finally:
            conn.close()


def make_stores(postgres_server: PostgresServer) -> Iterator[Stores]:
    """The body of each test module's ``stores`` fixture."""
    made = Stores(postgres_server)
    try:
        yield made
    finally:
        made.close()


def random_log(seed: int, *, windows: int, keys: int = 150, first_scn: int = 1_000,
               sources: Sequence[str] = SOURCES, delete_ratio: float = 0.2,
               value_bytes: int = 24) -> list[LogWindow]:
    """Windows of 1-5 changes over int, string and composite keys; deletes, re-inserts
    after deletes, and the same key more than once in a window (the later one wins)."""
    rng = random.Random(seed)
    out = []
    scn = first_scn
    for _ in range(windows):
        scn += rng.randint(1, 40)
        events = []
        for _ in range(rng.randint(1, 5)):
            source = rng.choice(sources)
            k = rng.randrange(keys)
            index = sources.index(source) % 3
            key: Any = (k if index == 0 else f"key-{k}" if index == 1 else (k % 7, f"t{k}"))
            op = Op.DELETE if rng.random() < delete_ratio else Op.UPSERT
            value = rng.randbytes(rng.randint(0, value_bytes))
            events.append(stored_event(source, encode_event(
                scn=scn, source_id=1 + index, op=op, key=key, value=value,
                timestamp_ns=scn * 1_000)))
        out.append(LogWindow(scn, scn * 1_000, events))
    return out


def append(storage: BootstrapStorage, windows: Sequence[LogWindow], *, batch: int = 100,
           log_floor_scn: int | None = None) -> None:
    for i in range(0, len(windows), batch):
        chunk = windows[i:i + batch]
        storage.append(chunk, Checkpoint.after(chunk[-1].scn),
                       log_floor_scn=log_floor_scn if i == 0 else None)


def apply_all(storage: BootstrapStorage, *, upto: int | None = None, max_rows: int = 37) -> None:
    """The applier's SQL path, in small batches (whole windows), to the end or past
    ``upto``."""
    while True:
        state = storage.state()
        if upto is not None and state.applied_scn is not None and state.applied_scn >= upto:
            return
        if storage.apply(max_rows=max_rows) is None:
            return
