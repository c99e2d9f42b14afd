"""Shared by the bootstrap tests: stores on both backends and windows built from events."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import psycopg2
import pytest

from databus.bootstrap._storage import LogWindow, stored_event
from databus.event import Op, encode_event
from tests.fixtures.servers import PostgresServer

BACKENDS = ["sqlite", "postgresql"]


def storage_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest,
                *, span: int | None = None) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'bootstrap.db'}"
    pg: PostgresServer = request.getfixturevalue("postgres_server")
    schema = "bt_" + uuid.uuid4().hex[:12]
    url = f"{pg.url()}?schema={schema}"
    return url + (f"&log_partition_span={span}" if span else "")


def drop_schema(pg: PostgresServer, url: str) -> None:
    schema = url.split("schema=")[1].split("&")[0]
    with psycopg2.connect(pg.dsn) as conn, conn.cursor() as cur:
        cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    conn.close()


def change(scn: int, source: str, key: int | str, value: bytes = b"v",
           op: Op = Op.UPSERT, source_id: int = 7) -> tuple[str, bytes]:
    return source, encode_event(scn=scn, source_id=source_id, op=op, key=key, value=value,
                                timestamp_ns=scn * 1000)


def window(scn: int, changes: Sequence[tuple[str, bytes]]) -> LogWindow:
    return LogWindow(scn, scn * 1000, [stored_event(src, ev) for src, ev in changes])
