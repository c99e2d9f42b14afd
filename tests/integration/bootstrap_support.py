"""Shared by the bootstrap tests: stores on both backends and windows built from events."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from databus.bootstrap._storage import LogWindow, stored_event
from databus.event import Op, encode_event
from databus.security import ClientCredentials
from tests.fixtures.servers import PostgresServer
from tests.relay_harness import free_port, get_url, start_databus

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


class BootstrapProcess:
    """``databus bootstrap --config FILE --run PARTS`` as a child process (kill -9 tests).

    ``sections`` are ``[bootstrap.NAME]`` tables (``producer`` adds to the producer's
    table: ``ca_file``, ``token``...); ``extra_toml`` is appended as it is (``[bootstrap.tls]``,
    ``[[bootstrap.readers]]``). ``scheme="https"`` for a service serving TLS;
    ``credentials`` (a ``ClientCredentials``) are what ``status()`` presents to it."""

    def __init__(self, tmp_path: Path, storage: str, relay_url: str | list[str], run: str,
                 *, extra_toml: str = "", scheme: str = "http",
                 credentials: ClientCredentials | None = None,
                 **sections: dict[str, object]) -> None:
        self.port = free_port()
        self.run = run
        self.scheme = scheme
        self.credentials = credentials
        self.config_path = tmp_path / f"bootstrap-{run.replace(',', '-')}.toml"
        producer: dict[str, object] = {
            "relays": [relay_url] if isinstance(relay_url, str) else relay_url,
            "poll_wait_ms": 100, "max_bytes": 65536, **sections.pop("producer", {})}
        lines = ["[bootstrap]", f'storage = "{storage}"', f"port = {self.port}"]
        for name, values in {"producer": producer, **sections}.items():
            lines.append(f"[bootstrap.{name}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        self.config_path.write_text("\n".join(lines) + "\n" + extra_toml)
        self.log_path = tmp_path / f"bootstrap-{run.replace(',', '-')}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = start_databus(["bootstrap", "--config", str(self.config_path), "--run",
                                   self.run], self.port, self.log_path)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    def status(self) -> dict[str, Any]:
        return json.loads(get_url(self.url + "/v1/status",  # type: ignore[no-any-return]
                                  self.credentials))
