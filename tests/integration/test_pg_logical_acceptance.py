"""Acceptance of the PostgreSQL logical decoding fetcher (issue 18): a ``pgbench`` TPC-B-like
run (4 clients, ``DATABUS_PG_ACCEPTANCE_SECONDS``: 6 s in ``make test``, the issue's 60 in
``make test-full``) captured through ``databus pg setup``, a ``databus relay`` process and
a ``DatabusClient`` into a replica (a second database on the same server, each window
applied in one transaction), then:

- the replica equals the source, table by table, by checksums PostgreSQL computes in
  each database (``md5(string_agg(t::text, ',' ORDER BY key))``) and row counts;
- every window is one source transaction: its SCN is the commit LSN of a COMMIT record
  read from the source's WAL with ``pg_walinspect``, the windows' SCNs strictly
  increase, and the set of window SCNs *equals* the set of commit LSNs of the
  transactions whose WAL records wrote rows of the four captured tables (matched by
  their relfilenodes): nothing missing, nothing extra;
- the first window is ``pgbench -i``'s data generation (one transaction: every branch,
  teller and account inserted); every later window is one pgbench transaction, with
  exactly its four row changes: the three updates (of an account, a teller and a
  branch that existed) and the one insert into ``pgbench_history`` (a new key), whose
  row names that same account, teller and branch; their count is the count pgbench
  reports.

``pgbench_history`` has no primary key: it gets ``hid bigserial PRIMARY KEY`` (pgbench
names its columns when it inserts, so the default fills it). Not ``REPLICA IDENTITY
FULL``: history is insert-only, so FULL would change nothing in the WAL, but the event
key would then be every column, which is no identity (two transactions can insert equal
rows: same account, teller, branch, delta within one clock tick), the replica could not
hold a unique key for its upserts, and the checksums could not be ordered by a key.

The tables are created (``pgbench -i -I dtp``, primary keys included) before ``databus
pg setup`` and filled after it (``pgbench -i -I g``: TRUNCATE, which the publication does
not publish, then the inserts and the COPY in one transaction), so the replica is built
from the stream alone. The WAL is kept for ``pg_walinspect`` by a physical slot made
before anything else (the relay confirms its slot, and a checkpoint could otherwise
recycle the segments read at the end).
"""

from __future__ import annotations

import array
import itertools
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from databus.client import CallbackResult, Consumer, DatabusClient, DataEvent
from databus.fetchers.postgres._pgoutput import format_lsn, parse_lsn
from tests.fixtures.servers import PostgresServer
from tests.integration.pg_logical_support import PgDatabase, logical_relay
from tests.tiers import size

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

SECONDS = size("DATABUS_PG_ACCEPTANCE_SECONDS", smoke=6, full=60)
CLIENTS = 4
SCALE = 1  # 1 branch, 10 tellers, 100,000 accounts
PG_BIN = Path(os.environ.get("DATABUS_PG_BIN", "/usr/lib/postgresql/15/bin"))

KEYS = {"pgbench_accounts": "aid", "pgbench_branches": "bid", "pgbench_tellers": "tid",
        "pgbench_history": "hid"}
SOURCES = [f"public.{t}" for t in KEYS]
UPDATED = {"public.pgbench_accounts": "aid", "public.pgbench_tellers": "tid",
           "public.pgbench_branches": "bid"}
HISTORY = "public.pgbench_history"


def pgbench(db: PgDatabase, *args: str, timeout: float) -> str:
    server = db.server
    cmd = [str(PG_BIN / "pgbench"), "-h", server.host, "-p", str(server.port), "-U",
           server.user, *args, db.dbname]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} failed: {done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def make_tables(db: PgDatabase) -> None:
    """pgbench's tables with their primary keys, and one for pgbench_history."""
    pgbench(db, "-i", "-I", "dtp", "-s", str(SCALE), timeout=120)
    db.run("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")


class Replica(Consumer):
    """Applies each window to the replica in one transaction (upserts as INSERT ... ON
    CONFLICT DO UPDATE, deletes by key) and checks its shape as it goes: memory stays
    small over a few hundred thousand windows."""

    def __init__(self, conn: psycopg2.extensions.connection) -> None:
        self.conn = conn
        self.scns = array.array("q")
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.init_counts: dict[str, int] = {}
        self.existing: dict[str, set[Any]] = {s: set() for s in UPDATED}
        self.history_keys: set[Any] = set()
        self.columns: dict[str, list[str]] = {}
        self._events: list[DataEvent] = []

    def error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)

    def on_start_data_event_sequence(self, scn: int) -> CallbackResult:
        self._events = []
        return CallbackResult.SUCCESS

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        self._events.append(event)
        return CallbackResult.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        self._events = []
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        events, self._events = self._events, []
        if not self.scns:
            self._check_init(scn, events)
        else:
            self._check_pgbench(scn, events)
        self._apply(events)
        with self.lock:
            self.scns.append(scn)
        return CallbackResult.SUCCESS

    # -- the shape of a window -----------------------------------------------------------

    def _check_init(self, scn: int, events: list[DataEvent]) -> None:
        """pgbench -i's data generation: every branch, teller and account, inserted."""
        for event in events:
            self.init_counts[event.source] = self.init_counts.get(event.source, 0) + 1
            if event.op.name != "UPSERT" or event.source not in UPDATED:
                self.error(f"first window {format_lsn(scn)}: {event.op.name} of "
                           f"{event.source} {event.key}")
            else:
                self.existing[event.source].add(event.key)

    def _check_pgbench(self, scn: int, events: list[DataEvent]) -> None:
        """One TPC-B transaction: an account, a teller and a branch updated, one history
        row inserted naming the same three."""
        where = f"window {format_lsn(scn)} ({len(self.scns)})"
        shape = sorted((e.source, e.op.name) for e in events)
        if shape != sorted([(s, "UPSERT") for s in SOURCES]):
            self.error(f"{where}: {shape}, not one upsert of each table")
            return
        by_source = {e.source: e for e in events}
        history = by_source[HISTORY]
        assert history.value is not None
        for source, column in UPDATED.items():
            key = by_source[source].key
            if key not in self.existing[source]:
                self.error(f"{where}: {source} {key} was not there before (an insert, "
                           "not an update)")
            if history.value[column] != key:
                self.error(f"{where}: history names {column} {history.value[column]}, "
                           f"the window updates {key}")
        if history.key in self.history_keys:
            self.error(f"{where}: history {history.key} inserted twice")
        self.history_keys.add(history.key)

    # -- the replica ---------------------------------------------------------------------

    def _apply(self, events: list[DataEvent]) -> None:
        # A window is one transaction: only the last change of each key counts.
        last: dict[tuple[str, Any], DataEvent] = {}
        for event in events:
            last[(event.source, event.key)] = event
        upserts: dict[str, list[dict[str, Any]]] = {}
        deletes: dict[str, list[Any]] = {}
        for (source, key), event in last.items():
            if event.op.name == "DELETE":
                deletes.setdefault(source, []).append(key)
            else:
                assert event.value is not None
                upserts.setdefault(source, []).append(event.value)
        statements: list[bytes] = [b"BEGIN"]
        with self.conn.cursor() as cur:
            for source, keys in deletes.items():
                table = source.split(".", 1)[1]
                statements.append(cur.mogrify(
                    f"DELETE FROM {table} WHERE {KEYS[table]} = ANY(%s)", (keys,)))
            for source, rows in upserts.items():
                table = source.split(".", 1)[1]
                columns = list(rows[0])
                updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns
                                    if c != KEYS[table])
                row_sql = "(" + ", ".join(["%s"] * len(columns)) + ")"
                for i in range(0, len(rows), 5000):
                    values = b",".join(cur.mogrify(row_sql, [r[c] for c in columns])
                                       for r in rows[i:i + 5000])
                    statements.append(
                        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ".encode()
                        + values + f" ON CONFLICT ({KEYS[table]}) DO UPDATE SET "
                                   f"{updates}".encode())
            statements.append(b"COMMIT")
            cur.execute(b";\n".join(statements))

    def seen(self) -> int:
        with self.lock:
            return len(self.scns)


def checksums(db: PgDatabase) -> dict[str, tuple[int, str]]:
    out = {}
    for table, key in KEYS.items():
        rows = db.rows(f"SELECT count(*), md5(string_agg(t::text, ',' ORDER BY t.{key})) "
                       f"FROM {table} t")
        out[table] = (int(rows[0][0]), str(rows[0][1]))
    return out


def wal_commits(db: PgDatabase, start: str, end: str
                ) -> tuple[set[int], set[int]]:
    """(every COMMIT record's LSN, the LSNs of the COMMITs of transactions that wrote
    rows of the captured tables), from ``start`` to ``end`` in the source's WAL."""
    db_oid = db.rows("SELECT oid FROM pg_database WHERE datname = current_database()")[0][0]
    nodes = [f"{db_oid}/{db.rows(f'SELECT pg_relation_filenode({t!r})')[0][0]}"
             for t in KEYS]
    # Two scans, joined here: joined in SQL, the function's rows (whose count the
    # planner guesses) went into a nested loop that had not ended minutes later.
    records = f"pg_get_wal_records_info('{start}'::pg_lsn, '{end}'::pg_lsn)"
    commits = db.rows(f"SELECT start_lsn::text, xid::text::bigint FROM {records} "
                      "WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT'")
    wrote = {xid for (xid,) in db.rows(
        f"SELECT DISTINCT xid::text::bigint FROM {records} "
        "WHERE resource_manager IN ('Heap', 'Heap2') "
        "AND record_type ~ '^(INSERT|UPDATE|HOT_UPDATE|DELETE|MULTI_INSERT)' "
        "AND substring(block_ref from 'rel [0-9]+/([0-9]+/[0-9]+) ') = "
        f"ANY(ARRAY{nodes!r})")}
    every = {parse_lsn(lsn) for lsn, _ in commits}
    writers = {parse_lsn(lsn) for lsn, xid in commits if xid in wrote}
    return every, writers


def wal_around(db: PgDatabase, lsn: str) -> list[tuple[Any, ...]]:
    """The WAL records near ``lsn`` (for a failure's message)."""
    return db.rows(f"SELECT start_lsn::text, end_lsn::text, xid, resource_manager, "
                   f"record_type, description FROM pg_get_wal_records_info("
                   f"'{lsn}'::pg_lsn - 400, '{lsn}'::pg_lsn + 200)")


@pytest.fixture
def databases(postgres_server: PostgresServer) -> Iterator[tuple[PgDatabase, PgDatabase]]:
    source = PgDatabase(postgres_server)
    replica = PgDatabase(postgres_server)
    try:
        yield source, replica
    finally:
        source.drop()
        replica.drop()


@pytest.mark.timeout(900 + 20 * SECONDS)
def test_pgbench_run_is_replicated_window_by_transaction(
        databases: tuple[PgDatabase, PgDatabase], tmp_path: Path) -> None:
    source, replica = databases
    make_tables(source)
    make_tables(replica)
    source.run("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    # Keeps every WAL segment from here on until the fixture drops it.
    guard = f"walguard_{source.slot.removeprefix('slot_')}"
    wal_start = source.rows(
        f"SELECT lsn::text FROM pg_create_physical_replication_slot('{guard}', true)")[0][0]
    try:
        run(source, replica, tmp_path, wal_start)
    finally:
        source.admin(f"SELECT pg_drop_replication_slot('{guard}')")


def run(source: PgDatabase, replica: PgDatabase, tmp_path: Path, wal_start: str) -> None:
    tables = ",".join(SOURCES)
    source.setup(tables)
    apply_conn = replica.connect()
    consumer = Replica(apply_conn)
    # Room for the whole run in case the replica falls behind (about 200 bytes an event).
    with logical_relay(tmp_path, source.uri(tables), capacity_mb=1024) as relay:
        client = DatabusClient([relay.url], sources=SOURCES, poll_wait_ms=200,
                               backoff_max=0.5)
        client.register(consumer)
        thread = threading.Thread(target=client.run, daemon=True)
        thread.start()
        try:
            pgbench(source, "-i", "-I", "g", "-s", str(SCALE), timeout=120)
            out = pgbench(source, "-n", "-c", str(CLIENTS), "-j", "2", "-T",
                          str(round(SECONDS)), timeout=SECONDS + 120)
            ended = time.monotonic()
            print(out)
            processed = int(re.search(r"actually processed: (\d+)", out).group(1))  # type: ignore[union-attr]
            failed = re.search(r"number of failed transactions: (\d+)", out)
            assert failed is None or int(failed.group(1)) == 0, out
            # Every commit so far is flushed (logical decoding reads flushed WAL only,
            # and commits are asynchronous on this server: pg_current_wal_lsn() is
            # where WAL is written to, the inserted records go further).
            end = source.rows("SELECT pg_current_wal_insert_lsn()::text")[0][0]
            deadline = time.monotonic() + 30
            while source.rows(f"SELECT pg_current_wal_flush_lsn() < '{end}'")[0][0]:
                assert time.monotonic() < deadline, "WAL not flushed"
                time.sleep(0.1)
            scanned = time.monotonic()
            every, writers = wal_commits(source, wal_start, end)
            print(f"WAL read in {time.monotonic() - scanned:.1f} s; the replica has "
                  f"{consumer.seen()} windows")
            expected = processed + 1  # and pgbench -i's data
            # Wait for the replica, as long as it makes progress.
            last, last_change = -1, time.monotonic()
            while (seen := consumer.seen()) < len(writers):
                if seen != last:
                    last, last_change = seen, time.monotonic()
                assert time.monotonic() - last_change < 120, (
                    f"the replica stopped at {seen} of {len(writers)} windows; relay log: "
                    f"{relay.log_path.read_text()[-3000:]}")
                assert thread.is_alive(), "the client stopped"
                time.sleep(0.2)
            print(f"the replica caught up {time.monotonic() - ended:.1f} s after "
                  "pgbench ended")
            time.sleep(1)  # nothing more may come
        finally:
            client.stop()
            thread.join(30)
            apply_conn.close()
        status = relay.status()["buffers"]["pg"]
        print(f"relay: max SCN {status['max_scn']}, fetcher {status['fetcher']}")

    scns = list(consumer.scns)
    print(f"pgbench: {processed} transactions in {SECONDS:.0f} s; windows {len(scns)}; "
          f"COMMIT records in the range {len(every)}, of writers of the tables "
          f"{len(writers)}")
    assert consumer.errors == [], consumer.errors
    assert consumer.init_counts == {"public.pgbench_branches": SCALE,
                                    "public.pgbench_tellers": 10 * SCALE,
                                    "public.pgbench_accounts": 100_000 * SCALE}
    assert all(a < b for a, b in itertools.pairwise(scns)), \
        "window SCNs not strictly increasing"
    not_commits = [format_lsn(s) for s in scns if s not in every]
    assert not not_commits, (f"window SCNs that are no COMMIT record: {not_commits[:10]}; "
                             f"the WAL there: {wal_around(source, not_commits[0])}")
    missing = sorted(writers - set(scns))
    assert not missing, (f"{len(missing)} transactions writing the tables have no window: "
                         f"{[format_lsn(s) for s in missing[:10]]}")
    extra = sorted(set(scns) - writers)
    assert not extra, f"windows of no writing transaction: {extra[:10]}"
    assert len(scns) == expected, f"{len(scns)} windows, pgbench committed {processed} + 1"
    assert len(consumer.history_keys) == processed
    source_sums, replica_sums = checksums(source), checksums(replica)
    print(f"checksums: {source_sums}")
    assert replica_sums == source_sums
    assert source_sums["pgbench_history"][0] == processed
