"""Helpers for the binlog fetcher's integration tests: a database per test, SQL, a relay
reading the session MariaDB, and the relay's windows decoded into comparable changes."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from databus.event import Op, decode_eow, decode_event, iter_events
from databus.fetchers.mysql import make_scn
from databus.fetchers.mysql._scn import binlog_file_number
from databus.schemas import AvroCodec
from tests.fixtures.servers import MariaDBServer
from tests.relay_harness import RunningRelay, relay_config, running_relay
from tests.waiting import async_wait_until

BUFFER = "db"
_server_ids = itertools.count(5001)


@dataclass
class Change:
    source: str
    op: str  # "upsert" or "delete"
    key: Any
    row: dict[str, Any]


@dataclass
class CapturedWindow:
    scn: int
    timestamp_ns: int
    changes: list[Change] = field(default_factory=list)
    eow_count: int = -1


class Sql:
    """A connection as the test user; ``run`` executes statements one by one."""

    def __init__(self, server: MariaDBServer, database: str | None = None, **kwargs: Any) -> None:
        self.conn = pymysql.connect(**server.connect_kwargs(database=database, **kwargs))

    def run(self, *statements: str) -> None:
        with self.conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def txn(self, *statements: str) -> int:
        """Run ``statements`` as one transaction; returns its SCN (the binlog end after it)."""
        self.run("BEGIN", *statements, "COMMIT")
        return self.position()

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(statement)
            return list(cur.fetchall())

    def position(self) -> int:
        file, pos = self.query("SHOW MASTER STATUS")[0][:2]
        return make_scn(binlog_file_number(str(file)), int(pos))

    def close(self) -> None:
        self.conn.close()


def fresh_database(server: MariaDBServer, name: str) -> Sql:
    """Drop and create database ``name``; a connection using it."""
    admin = Sql(server)
    admin.run(f"DROP DATABASE IF EXISTS `{name}`", f"CREATE DATABASE `{name}`")
    admin.close()
    return Sql(server, name)


def source_uri(server: MariaDBServer, tables: str, **params: Any) -> str:
    query = {"tables": tables, "server_id": next(_server_ids), "heartbeat_ms": 100, **params}
    return server.url() + "?" + "&".join(f"{k}={v}" for k, v in query.items())


@asynccontextmanager
async def binlog_relay(tmp_path: Path, uri: str, capacity_mb: int = 16
                       ) -> AsyncIterator[RunningRelay]:
    """A relay with one buffer (``BUFFER``) reading ``uri``; waits until its fetcher runs."""
    async with running_relay(relay_config(tmp_path, {BUFFER: uri}, capacity_mb=capacity_mb)) as r:
        await wait_until(r, lambda s: s["fetcher"]["state"] == "running"
                         and s["fetcher"]["source_scn"] is not None, what="fetcher running")
        yield r


async def status(r: RunningRelay) -> dict[str, Any]:
    doc = await r.json("/v1/status")
    buffer: dict[str, Any] = doc["buffers"][BUFFER]
    return buffer


async def wait_until(r: RunningRelay, check: Any, *, what: str, timeout: float = 30) -> None:
    """:func:`tests.waiting.async_wait_until` over the buffer's ``/v1/status`` (``check``
    gets the document); the last one in the failure message."""
    doc: dict[str, Any] = {}

    async def reached() -> bool:
        nonlocal doc
        doc = await status(r)
        return bool(check(doc))

    # The status of a relay in this process is cheap to read: a short backoff cap.
    await async_wait_until(reached, what, timeout, max_interval=0.1,
                           diagnose=lambda: f"status: {doc}")


async def wait_for_scn(r: RunningRelay, scn: int, timeout: float = 30) -> None:
    await wait_until(r, lambda s: (s["max_scn"] or 0) >= scn, what=f"max_scn >= {scn}",
                     timeout=timeout)


async def captured(r: RunningRelay, checkpoint: str | None = None, **params: str
                   ) -> tuple[list[CapturedWindow], str]:
    """Every window the relay serves (after ``checkpoint``), decoded; and the checkpoint.
    ``params``: more query parameters of ``/v1/stream`` (``quarantine="pass"``)."""
    catalog = r.relay.catalog
    codec = AvroCodec(catalog.registry)
    names = {s.id: s.name for s in catalog.sources()}
    body = b""
    cp = checkpoint
    while True:
        query: dict[str, str] = {"max_bytes": str(64 << 20), **params}
        if cp is not None:
            query["checkpoint"] = cp
        async with await r.get("/v1/stream", **query) as resp:
            assert resp.status == 200, await resp.text()
            chunk = await resp.read()
            new_cp = resp.headers["X-Databus-Checkpoint"]
        if not chunk:
            break
        body += chunk
        cp = new_cp
    windows: list[CapturedWindow] = []
    current: CapturedWindow | None = None
    for off, header in iter_events(body):
        event = decode_event(body, off)
        if current is None or current.scn != header.scn:
            current = CapturedWindow(header.scn, header.timestamp_ns)
            windows.append(current)
        if header.is_eow:
            current.eow_count = decode_eow(event).event_count
        elif not header.is_control:
            if header.source_id not in names:
                names = {s.id: s.name for s in catalog.sources()}
            row = codec.decode(event.value, header.schema_fingerprint)
            op = "delete" if header.op is Op.DELETE else "upsert"
            current.changes.append(Change(names[header.source_id], op, event.key, row))
    for window in windows:
        assert window.eow_count == len(window.changes), window
    return windows, cp or ""


def summary(windows: Iterable[CapturedWindow]) -> list[list[tuple[str, str, Any, dict[str, Any]]]]:
    """Windows as plain lists of (source, op, key, row), for equality checks."""
    return [[(c.source, c.op, c.key, c.row) for c in w.changes] for w in windows]
