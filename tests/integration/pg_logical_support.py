"""What the PostgreSQL logical decoding tests share: a fresh database per test with its
slot and publication (made by ``databus pg setup``), a relay process reading it, and a
consumer that keeps every window."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg2
import psycopg2.extensions

from databus.cli import main as databus_main
from databus.client import CallbackResult, Consumer, DatabusClient, DataEvent
from tests.fixtures.servers import PostgresServer
from tests.relay_harness import RelayProcess
from tests.waiting import wait_until

T = TypeVar("T")


class PgDatabase:
    """A database of its own on the session's server; ``drop()`` removes its slot."""

    def __init__(self, server: PostgresServer, *ddl: str) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.server = server
        self.dbname = f"logical_{suffix}"
        self.slot = f"slot_{suffix}"
        self.publication = f"pub_{suffix}"
        self.admin(f'CREATE DATABASE "{self.dbname}"')
        self.conn = self.connect()
        for statement in ddl:
            self.run(statement)

    def connect(self, *, autocommit: bool = True) -> psycopg2.extensions.connection:
        # Logical decoding sees flushed WAL only; the fixture commits asynchronously.
        conn: psycopg2.extensions.connection = psycopg2.connect(
            **self.server.connect_kwargs(self.dbname), options="-c synchronous_commit=on")
        conn.autocommit = autocommit
        return conn

    def admin(self, statement: str) -> None:
        conn = psycopg2.connect(**self.server.connect_kwargs("postgres"))
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()

    def uri(self, tables: str, **params: Any) -> str:
        query = "&".join(f"{k}={v}" for k, v in {
            "tables": tables, "slot": self.slot, "publication": self.publication,
            **params}.items())
        return f"{self.server.url(self.dbname)}?{query}"

    def setup(self, tables: str, *extra: str) -> None:
        assert databus_main(["pg", "setup", "--source", self.uri(tables), *extra]) == 0

    def run(self, *statements: str, params: tuple[Any, ...] | None = None) -> None:
        with self.conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, params)

    def txn(self, *statements: str) -> None:
        """One transaction."""
        with self.conn.cursor() as cur:
            cur.execute("BEGIN")
            for statement in statements:
                cur.execute(statement)
            cur.execute("COMMIT")

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())

    def drop(self) -> None:
        self.conn.close()
        self.admin(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                   f"WHERE slot_name = '{self.slot}' AND NOT active")
        self.admin(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')


@contextmanager
def logical_relay(tmp_path: Path, uri: str, capacity_mb: int = 32,
                  extra_toml: str = "") -> Iterator[RelayProcess]:
    relay = RelayProcess(tmp_path, {"pg": uri}, capacity_mb=capacity_mb, workers=1,
                         extra_toml=extra_toml)
    relay.start()
    try:
        yield relay
    finally:
        if relay.proc is not None and relay.proc.poll() is None:
            relay.kill()


class Windows(Consumer):
    """Every window: (scn, [(source, op, key, value)])."""

    def __init__(self) -> None:
        self.windows: list[tuple[int, list[tuple[str, str, Any, Any]]]] = []
        self._current: list[tuple[str, str, Any, Any]] = []
        self.lock = threading.Lock()

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        self._current.append((event.source, event.op.name, event.key, event.value))
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        with self.lock:
            self.windows.append((scn, self._current))
        self._current = []
        return CallbackResult.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        self._current = []
        return CallbackResult.SUCCESS


def consume(relay: RelayProcess, sources: list[str], until: Any, timeout: float = 60
            ) -> Windows:
    """Consume from the start until ``until(windows)`` is true."""
    windows = Windows()
    client = DatabusClient([relay.url], sources=sources, poll_wait_ms=200,
                           backoff_max=0.5)
    client.register(windows)
    thread = threading.Thread(target=client.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with windows.lock:
                if until(windows.windows):
                    return windows
            if not thread.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"not reached: {len(windows.windows)} windows; relay log: "
                             f"{relay.log_path.read_text()[-3000:]}")
    finally:
        client.stop()
        thread.join(10)


def status(relay: RelayProcess) -> dict[str, Any]:
    with urllib.request.urlopen(relay.url + "/v1/status", timeout=5) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def fetcher_of(relay: RelayProcess) -> dict[str, Any]:
    """The ``pg`` buffer's fetcher in ``/v1/status``."""
    return status(relay)["buffers"]["pg"]["fetcher"]  # type: ignore[no-any-return]


def wait_for(check: Callable[[], T], what: str, timeout: float = 30, *,
             diagnose: Callable[[], str] | None = None) -> T:
    """``check()``'s first truthy answer (:func:`tests.waiting.wait_until`); a relay or
    server not answering (restarting, killed) counts as not yet."""
    return wait_until(check, what, timeout, ignore=(OSError, psycopg2.OperationalError),
                      diagnose=diagnose)


def drop_slot(db: PgDatabase) -> None:
    """Terminate the slot's walsender (a relay just killed may still hold it) and drop
    it, retrying while a reconnecting relay takes it again."""
    deadline = time.monotonic() + 15
    while True:
        rows = db.rows(f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = "
                       f"'{db.slot}'")
        if not rows:
            return
        (pid,) = rows[0]
        try:
            if pid is not None:
                db.run(f"SELECT pg_terminate_backend({pid})")
            db.run(f"SELECT pg_drop_replication_slot('{db.slot}')")
        except psycopg2.Error:
            pass  # taken again, or still held by the terminating walsender
        if time.monotonic() > deadline:
            raise AssertionError(f"slot {db.slot} cannot be dropped: {rows}")
        time.sleep(0.05)


@contextmanager
def scratch_database(server: PostgresServer, *ddl: str) -> Iterator[PgDatabase]:
    """A fresh database for one test (``PgDatabase``), its slot dropped and the database
    dropped afterwards, whatever the test left running."""
    database = PgDatabase(server, *ddl)
    try:
        yield database
    finally:
        with contextlib.suppress(psycopg2.Error):
            if database.conn.closed:
                database.conn = database.connect()
            drop_slot(database)
        database.drop()
