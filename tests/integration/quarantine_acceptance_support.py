"""What the quarantine acceptance tests (issue 28) share, for MariaDB and PostgreSQL:
four tables under a writer, one ``DatabusClient`` per table keeping a replica, and the
checks: a replica equal to its table, the quarantine visible at ``/v1/status`` and
``/readyz``, ``databus relay heal``."""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from databus.cli import main as databus_main
from databus.client import Consumer, DatabusClient, DataEvent
from tests.tiers import count
from tests.waiting import wait_until

TOKEN = "quarantine-acceptance-token"
TABLES = ("t1", "t2", "t3", "t4")
KEYS = count("DATABUS_QUARANTINE_ACCEPTANCE_KEYS", smoke=60, full=2_000)
# Transactions the writer commits in each phase (before, during, after the quarantine).
PHASE = count("DATABUS_QUARANTINE_ACCEPTANCE_TXNS", smoke=150, full=5_000)
PATIENCE = 60 + PHASE / 50  # seconds to converge, generous for a busy 2-core machine

Rows = dict[int, tuple[Any, Any]]


class Replica(Consumer):
    """A consumer's copy of one table: key -> (v, price), as a user's would be; after
    the heal's dump it drops the rows whose last change is older than the quarantine
    SCN (deleted while quarantined: docs/client.md, "Quarantined sources")."""

    def __init__(self) -> None:
        self.rows: Rows = {}
        self.last: dict[Any, int] = {}  # key -> SCN of its last change
        self.quarantine_scn: int | None = None  # set by the test once it is known
        self.errors: list[str] = []
        self.dumps = 0
        self.lock = threading.Lock()

    def on_data_event(self, event: DataEvent) -> None:
        with self.lock:
            if event.is_delete:
                self.rows.pop(event.key, None)  # type: ignore[arg-type]
                self.last.pop(event.key, None)
            else:
                assert event.value is not None
                self.rows[event.key] = (event.value["v"], event.value["price"])  # type: ignore[index]
                self.last[event.key] = event.scn

    def on_dump_end(self, source: str, outcome: str = "done") -> None:
        with self.lock:
            if outcome == "done":
                self.dumps += 1
                if self.quarantine_scn is not None:
                    for key in [k for k, scn in self.last.items()
                                if scn < self.quarantine_scn]:
                        self.rows.pop(key, None)
                        del self.last[key]

    def on_error(self, error: BaseException) -> None:
        self.errors.append(type(error).__name__)

    def copy(self) -> Rows:
        with self.lock:
            return dict(self.rows)


class Writer(threading.Thread):
    """One- and two-table transactions (upsert, update, delete of random keys) until
    ``stop()``; ``execute(statements)`` runs one transaction on the test's server."""

    def __init__(self, execute: Callable[[list[str]], None], upsert: Callable[[str, int, int],
                 str], seed: int) -> None:
        super().__init__(daemon=True)
        self.execute = execute
        self.upsert = upsert
        self.random = random.Random(seed)
        self.done = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def statement(self) -> str:
        table = self.random.choice(TABLES)
        key = self.random.randrange(KEYS)
        op = self.random.random()
        if op < 0.55:
            return self.upsert(table, key, self.random.randrange(1000))
        if op < 0.8:
            return f"UPDATE {table} SET v = v + 1, price = price + 1 WHERE id = {key}"
        return f"DELETE FROM {table} WHERE id = {key}"

    def run(self) -> None:
        try:
            while not self.done.is_set():
                self.execute([self.statement() for _ in range(self.random.choice((1, 2)))])
                self.transactions += 1
        except BaseException as exc:  # the test reports it
            self.error = exc

    def stop(self) -> int:
        self.done.set()
        self.join(30)
        if self.error is not None:
            raise self.error
        return self.transactions


@contextmanager
def writing(execute: Callable[[list[str]], None], upsert: Callable[[str, int, int], str],
            seed: int) -> Iterator[Writer]:
    """A writer running for at least ``PHASE`` transactions of the block."""
    writer = Writer(execute, upsert, seed)
    writer.start()
    try:
        wait_until(lambda: writer.transactions >= PHASE or writer.error is not None,
                   f"{PHASE} transactions of the writer", PATIENCE)
        yield writer
    finally:
        writer.stop()


@contextmanager
def replicas(relay_url: str, sources: list[str]) -> Iterator[dict[str, Replica]]:
    """One client per source, each keeping a replica, from the start of the stream."""
    out: dict[str, Replica] = {}
    clients: list[tuple[DatabusClient, threading.Thread]] = []
    for source in sources:
        replica = out[source] = Replica()
        client = DatabusClient([relay_url], sources=[source], poll_wait_ms=200,
                               backoff_max=0.5)
        client.register(replica)
        thread = threading.Thread(target=client.run, daemon=True)
        thread.start()
        clients.append((client, thread))
    try:
        yield out
    finally:
        for client, _ in clients:
            client.stop()
        for _, thread in clients:
            thread.join(30)


def wait_equal(replica: Replica, read_source: Callable[[], Rows], what: str) -> None:
    """The replica equals the (quiet) source table, once it has caught up."""
    wait_until(lambda: replica.copy() == read_source(), what, PATIENCE,
               diagnose=lambda: _difference(replica.copy(), read_source()))


def _difference(mine: Rows, source: Rows) -> str:
    wrong = sorted(k for k in mine.keys() | source.keys() if mine.get(k) != source.get(k))
    return (f"{len(wrong)} rows differ, e.g. "
            f"{[(k, source.get(k), mine.get(k)) for k in wrong[:5]]}")


def http(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def quarantined(relay_url: str, buffer: str) -> list[dict[str, Any]]:
    return list(http(relay_url + "/v1/status")[1]["buffers"][buffer]["quarantined"])


def heal(relay_url: str, source: str) -> int:
    return databus_main(["relay", "heal", "--relay", relay_url, "--source", source,
                         "--token", TOKEN])


def decimal(value: Any) -> Decimal | None:
    return None if value is None else Decimal(value)
