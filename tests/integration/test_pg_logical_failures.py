"""The PostgreSQL logical decoding fetcher's failure and error cases (issue 18), each on
the real server of the session with a ``databus relay`` process and a client.

Every transaction the tests write carries a ``tag`` of its own in every row it touches,
so the consumer's windows can be checked against the committed transactions: each one
once, whole, in commit order. Each test has a database, slot and publication of its own
(``PgDatabase``); slots are cluster-wide and pin WAL, so every one is dropped afterwards,
its walsender terminated first.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extras
import pytest

from tests.fixtures.servers import PostgresServer
from tests.integration.pg_logical_support import (
    PgDatabase,
    consume,
    drop_slot,
    fetcher_of,
    logical_relay,
    scratch_database,
    status,
    wait_for,
)
from tests.relay_harness import RelayProcess

pytestmark = pytest.mark.integration

ORDERS = ("CREATE TABLE orders (id int PRIMARY KEY, qty int NOT NULL, note text, "
          "tag int NOT NULL)")


# -- helpers ---------------------------------------------------------------------------


@pytest.fixture
def db(postgres_server: PostgresServer) -> Iterator[PgDatabase]:
    with scratch_database(postgres_server, ORDERS) as database:
        yield database








def wait_failed(relay: RelayProcess, timeout: float = 30) -> str:
    """The fetcher's ``last_error`` once it is ``failed``; it must stay failed (not
    ready) for a second more. (A misconfigured source is retried meanwhile, at the
    backoff's pace, so that a fix at the source brings it back without a restart:
    docs/operations.md, "Runbook: not ready / second instance".)"""
    fetcher = wait_for(lambda: (f := fetcher_of(relay))["state"] == "failed" and f,
                       "the fetcher failed", timeout,
                       diagnose=lambda: f"relay log: {relay.log_path.read_text()[-2000:]}")
    time.sleep(1.0)
    again = fetcher_of(relay)
    assert again["state"] == "failed", again
    assert isinstance(fetcher["last_error"], str)
    return fetcher["last_error"]  # type: ignore[no-any-return]


def tags_of(windows: list[tuple[int, list[Any]]]) -> list[set[int]]:
    return [{v["tag"] for _s, op, _k, v in events if op == "UPSERT"} for _scn, events in
            windows]


def has_tag(tag: int) -> Callable[[list[tuple[int, list[Any]]]], bool]:
    def check(windows: list[tuple[int, list[Any]]]) -> bool:
        return any(tag in tags for tags in tags_of(windows))
    return check


def slot_lsn(db: PgDatabase, column: str = "confirmed_flush_lsn") -> int:
    ((lsn,),) = db.rows(f"SELECT ({column} - '0/0')::bigint FROM pg_replication_slots "
                        f"WHERE slot_name = '{db.slot}'")
    return int(lsn)


def current_lsn(db: PgDatabase) -> int:
    ((lsn,),) = db.rows("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
    return int(lsn)


class TaggedWriter(threading.Thread):
    """Commits one tagged transaction after another (two inserts and an update of row
    0), through a server restart: a failing write is retried on a new connection with
    the next tag. Which transactions committed is read back from the table."""

    def __init__(self, db: PgDatabase, first_tag: int) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.tag = first_tag
        self.stop = threading.Event()
        self.failures = 0
        self.commits = 0

    def run(self) -> None:
        conn: Any = None
        while not self.stop.is_set():
            tag, self.tag = self.tag, self.tag + 1
            try:
                if conn is None or conn.closed:
                    conn = self.db.connect(autocommit=False)
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO orders VALUES (%s, 1, 'w', %s), (%s, 2, 'w', %s)",
                                (tag * 10, tag, tag * 10 + 1, tag))
                    cur.execute("UPDATE orders SET tag = %s WHERE id = 0", (tag,))
                conn.commit()
                self.commits += 1
            except psycopg2.Error:
                self.failures += 1
                if conn is not None:
                    with contextlib.suppress(psycopg2.Error):
                        conn.close()
                conn = None
                time.sleep(0.05)
            time.sleep(0.01)
        if conn is not None:
            conn.close()


# -- 1. a PostgreSQL restart ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_postgres_restart_while_streaming_loses_and_repeats_nothing(
        postgres_server: PostgresServer, db: PgDatabase, tmp_path: Path, mode: str) -> None:
    """Transactions before, during (some writes fail) and after a fast or immediate
    shutdown: the consumer gets every committed transaction once, in commit order."""
    db.run("INSERT INTO orders VALUES (0, 0, 'counter', 0)")
    db.setup("public.orders")
    control = postgres_server._control
    with logical_relay(tmp_path, db.uri("public.orders")) as relay:
        for tag in range(1, 6):
            db.txn(f"INSERT INTO orders VALUES ({tag * 10}, 1, 'before', {tag}), "
                   f"({tag * 10 + 1}, 2, 'before', {tag})",
                   f"UPDATE orders SET tag = {tag} WHERE id = 0")
        consume(relay, ["public.orders"], has_tag(5))
        writer = TaggedWriter(db, first_tag=6)
        writer.start()
        try:
            wait_for(lambda: writer.commits >= 10, "the writer commits")
            db.conn.close()
            stopping = time.monotonic()
            control.stop(mode)
            print(f"{mode} shutdown took {time.monotonic() - stopping:.2f} s")
            time.sleep(1.0)  # writes fail meanwhile
            control.start()
            db.conn = db.connect()
            wait_for(lambda: writer.commits >= 30, "the writer commits after the restart")
        finally:
            writer.stop.set()
            writer.join(10)
            control.ensure_running()
            if db.conn.closed:
                db.conn = db.connect()
        assert writer.failures > 0  # the restart was felt
        last = writer.tag
        db.txn(f"INSERT INTO orders VALUES ({last * 10}, 1, 'after', {last}), "
               f"({last * 10 + 1}, 2, 'after', {last})",
               f"UPDATE orders SET tag = {last} WHERE id = 0")
        committed = sorted(t for (t,) in db.rows("SELECT DISTINCT tag FROM orders "
                                                 "WHERE id > 0"))
        windows = consume(relay, ["public.orders"], has_tag(last), timeout=90).windows
        assert tags_of(windows) == [{t} for t in committed]
        scns = [scn for scn, _ in windows]
        assert scns == sorted(scns) and len(set(scns)) == len(scns)
        for _scn, events in windows:
            assert len(events) == 3  # both inserts and the update, whole
        fetcher = fetcher_of(relay)
        assert fetcher["state"] == "running" and fetcher["restarts"] >= 1
        assert status(relay)["buffers"]["pg"]["max_scn"] == scns[-1]
        # Retried as a lost connection, each time in one line (no traceback: not a bug).
        log = relay.log_path.read_text()
        assert "Traceback" not in log
        assert "the connection was lost or the server shut down or restarted" in log


def test_a_postgres_crash_while_a_large_transaction_streams(
        postgres_server: PostgresServer, db: PgDatabase, tmp_path: Path) -> None:
    """The server killed (immediate shutdown) while the relay reads a 60,000-row
    transaction, or just after: a partial window is rolled back, and after the restart
    the transaction arrives whole, once (where the crash lands is a race at any load)."""
    db.setup("public.orders")
    control = postgres_server._control
    with logical_relay(tmp_path, db.uri("public.orders"), capacity_mb=64) as relay:
        db.txn("INSERT INTO orders VALUES (0, 0, 'first', 1)")
        consume(relay, ["public.orders"], has_tag(1))
        db.txn("INSERT INTO orders SELECT g, g, 'big', 2 FROM generate_series(1, 60000) g")
        wait_for(lambda: db.rows("SELECT sent_lsn > '0/0' FROM pg_stat_replication "
                                 f"WHERE application_name = 'databus-{db.slot}'"),
                 "the walsender streaming")
        time.sleep(0.2)
        max_scn = status(relay)["buffers"]["pg"]["max_scn"]
        db.conn.close()
        try:
            control.stop("immediate")
        finally:
            control.ensure_running()
            db.conn = db.connect()
        db.txn("INSERT INTO orders VALUES (100000, 3, 'after', 3)")
        windows = consume(relay, ["public.orders"], has_tag(3), timeout=120).windows
        # Whichever side of the crash the big window landed on (still streaming: rolled
        # back and sent again; already in the buffer: kept), it is there whole, once.
        assert tags_of(windows) == [{1}, {2}, {3}]
        assert max_scn in (windows[0][0], windows[1][0])
        assert sorted(k for _s, _o, k, _v in windows[1][1]) == list(range(1, 60001))
        assert fetcher_of(relay)["restarts"] >= 1


# -- 2. the slot dropped while the relay runs --------------------------------------------


def test_the_slot_dropped_while_the_relay_runs_fails_the_fetcher(
        db: PgDatabase, tmp_path: Path) -> None:
    """Dropping an active slot takes terminating its walsender first; the relay's
    reconnection then finds no slot: ``failed``, naming the slot, not retried."""
    db.setup("public.orders")
    with logical_relay(tmp_path, db.uri("public.orders")) as relay:
        db.txn("INSERT INTO orders VALUES (1, 1, 'one', 1)")
        consume(relay, ["public.orders"], has_tag(1))
        drop_slot(db)
        error = wait_failed(relay)
        assert f"replication slot {db.slot!r}" in error, error
        assert "dropped" in error and "databus dump" in error, error
        # Nothing was left holding or recreating it.
        assert db.rows(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = "
                       f"'{db.slot}'") == []


# -- 3. DDL during the stream ------------------------------------------------------------


def test_add_drop_and_retype_columns_during_the_stream(db: PgDatabase,
                                                      tmp_path: Path) -> None:
    """Each DDL gives the table a new schema version; the windows before and after
    each carry their own columns and values."""
    db.setup("public.orders")
    with logical_relay(tmp_path, db.uri("public.orders")) as relay:
        db.txn("INSERT INTO orders VALUES (1, 1, 'one', 1)")
        consume(relay, ["public.orders"], has_tag(1))  # streaming before the DDL
        db.run("ALTER TABLE orders ADD COLUMN extra text DEFAULT 'dflt'")
        db.txn("INSERT INTO orders VALUES (2, 2, 'two', 2, 'e2')",
               "UPDATE orders SET qty = 10, tag = 2 WHERE id = 1")
        db.run("ALTER TABLE orders DROP COLUMN note")
        db.txn("INSERT INTO orders (id, qty, tag, extra) VALUES (3, 3, 3, 'e3')")
        db.run("ALTER TABLE orders ALTER COLUMN qty TYPE bigint")
        db.txn(f"INSERT INTO orders (id, qty, tag) VALUES (4, {2**40}, 4)",
               "DELETE FROM orders WHERE id = 2")
        windows = consume(relay, ["public.orders"], has_tag(4)).windows
        assert tags_of(windows) == [{1}, {2}, {3}, {4}]
        values = [[(op, key, value) for _s, op, key, value in events]
                  for _scn, events in windows]
        assert values[0] == [("UPSERT", 1, {"id": 1, "qty": 1, "note": "one", "tag": 1})]
        assert values[1] == [
            ("UPSERT", 2, {"id": 2, "qty": 2, "note": "two", "tag": 2, "extra": "e2"}),
            # The row written before the column existed has its default.
            ("UPSERT", 1, {"id": 1, "qty": 10, "note": "one", "tag": 2, "extra": "dflt"})]
        assert values[2] == [("UPSERT", 3, {"id": 3, "qty": 3, "tag": 3, "extra": "e3"})]
        assert values[3] == [("UPSERT", 4, {"id": 4, "qty": 2**40, "tag": 4, "extra": "dflt"}),
                             ("DELETE", 2, None)]
        # Four versions, in order, listed by the relay.
        with urllib.request.urlopen(relay.url + "/v1/schemas?source=public.orders",
                                    timeout=5) as resp:
            versions = json.loads(resp.read())["versions"]
        fields = [[(f["name"], f["type"]) for f in v["schema"]["fields"]] for v in versions]
        assert [[name for name, _t in f] for f in fields] == [
            ["id", "qty", "note", "tag"], ["id", "qty", "note", "tag", "extra"],
            ["id", "qty", "tag", "extra"], ["id", "qty", "tag", "extra"]]
        assert dict(fields[2])["qty"] == "int" and dict(fields[3])["qty"] == "long"
        with urllib.request.urlopen(relay.url + "/v1/sources", timeout=5) as resp:
            sources = {s["name"]: s for s in json.loads(resp.read())["sources"]}
        assert sources["public.orders"]["schema_fingerprint"] == versions[-1]["fingerprint"]


def test_a_relay_behind_set_not_null_captures_the_older_nulls(db: PgDatabase,
                                                             tmp_path: Path) -> None:
    """NOT NULL is read from the catalog as it is now; rows logged before ``SET NOT
    NULL`` may be NULL there: a nullable schema version, not a stopped fetcher."""
    db.setup("public.orders")
    db.txn("INSERT INTO orders VALUES (1, 1, NULL, 1)")
    db.txn("UPDATE orders SET note = 'x', tag = 2")
    db.run("ALTER TABLE orders ALTER note SET NOT NULL")
    db.txn("INSERT INTO orders VALUES (2, 2, 'y', 3)")
    with logical_relay(tmp_path, db.uri("public.orders")) as relay:
        windows = consume(relay, ["public.orders"], has_tag(3)).windows
        assert [[v for _s, _o, _k, v in events] for _scn, events in windows] == [
            [{"id": 1, "qty": 1, "note": None, "tag": 1}],
            [{"id": 1, "qty": 1, "note": "x", "tag": 2}],
            [{"id": 2, "qty": 2, "note": "y", "tag": 3}]]
        assert fetcher_of(relay)["state"] == "running"


# -- 4. TRUNCATE ---------------------------------------------------------------------------


def test_truncate_is_not_published_by_setup_and_the_stream_goes_on(
        db: PgDatabase, tmp_path: Path) -> None:
    db.setup("public.orders")
    with logical_relay(tmp_path, db.uri("public.orders")) as relay:
        db.txn("INSERT INTO orders VALUES (1, 1, 'one', 1), (2, 2, 'two', 1)")
        db.run("TRUNCATE orders")
        db.txn("INSERT INTO orders VALUES (3, 3, 'three', 2)")
        windows = consume(relay, ["public.orders"], has_tag(2)).windows
        # Nothing stands for the truncate: consumers keep rows 1 and 2 (documented).
        assert tags_of(windows) == [{1}, {2}]
        assert fetcher_of(relay)["state"] == "running"


def test_truncate_published_by_hand_quarantines_the_table(db: PgDatabase,
                                                           tmp_path: Path) -> None:
    # A publication made by hand publishes truncates (PostgreSQL's default). The table
    # is set aside (DESIGN 17); the fetcher goes on with the others.
    db.run("CREATE TABLE other (id int PRIMARY KEY)",
           f"CREATE PUBLICATION {db.publication} FOR TABLE orders, other",
           f"SELECT pg_create_logical_replication_slot('{db.slot}', 'pgoutput')")
    with logical_relay(tmp_path, db.uri("public.orders,public.other")) as relay:
        db.txn("INSERT INTO orders VALUES (1, 1, 'one', 1)")
        consume(relay, ["public.orders"], has_tag(1))
        db.run("TRUNCATE orders")
        db.txn("INSERT INTO other VALUES (1)")
        consume(relay, ["public.other"], lambda w: len(w) >= 1)
        [q] = status(relay)["buffers"]["pg"]["quarantined"]
        assert q["source"] == "public.orders", q
        assert q["reason"].startswith("a TRUNCATE of it was published"), q
        assert "publish = 'insert, update, delete'" in q["fix"], q
        assert fetcher_of(relay)["state"] == "running"


# -- 5. a table added to the publication while running ---------------------------------


def test_a_table_added_to_the_publication_while_running(db: PgDatabase,
                                                        tmp_path: Path) -> None:
    db.setup("public.*")
    with logical_relay(tmp_path, db.uri("public.*")) as relay:
        db.txn("INSERT INTO orders VALUES (1, 1, 'one', 1)")
        consume(relay, ["public.orders"], has_tag(1))
        db.run("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, tag int NOT NULL)",
               f"ALTER PUBLICATION {db.publication} ADD TABLE items")
        db.txn("INSERT INTO items VALUES (7, 'seven', 2), (8, 'eight', 2)",
               "INSERT INTO orders VALUES (2, 2, 'two', 2)")
        db.txn("UPDATE items SET name = 'SEVEN', tag = 3 WHERE id = 7")
        windows = consume(relay, ["public.orders", "public.items"], has_tag(3)).windows
        assert tags_of(windows) == [{1}, {2}, {3}]
        assert [(s, k, v) for s, _op, k, v in windows[1][1]] == [
            ("public.items", 7, {"id": 7, "name": "seven", "tag": 2}),
            ("public.items", 8, {"id": 8, "name": "eight", "tag": 2}),
            ("public.orders", 2, {"id": 2, "qty": 2, "note": "two", "tag": 2})]
        assert [(s, k) for s, _op, k, _v in windows[2][1]] == [("public.items", 7)]
        with urllib.request.urlopen(relay.url + "/v1/sources", timeout=5) as resp:
            names = {s["name"] for s in json.loads(resp.read())["sources"]}
        assert {"public.orders", "public.items"} <= names


# -- 6. TOAST --------------------------------------------------------------------------------

DOCS = "CREATE TABLE docs (id int PRIMARY KEY, body text, n int NOT NULL, tag int NOT NULL)"
# 40 KB of hex digits that no compression shrinks: stored out of line (TOASTed).
BIG = "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 1250) i)"


@pytest.mark.parametrize("identity", ["full", "default"])
def test_an_unchanged_toasted_value(db: PgDatabase, tmp_path: Path, identity: str) -> None:
    """An UPDATE that leaves a large value alone: pgoutput sends it only in the old row
    of REPLICA IDENTITY FULL; without it the table is quarantined, saying why."""
    db.run(DOCS)
    db.setup("public.docs", *(["--replica-identity-full"] if identity == "full" else []))
    ((big,),) = db.rows(f"SELECT {BIG}")
    assert len(big) == 40_000
    with logical_relay(tmp_path, db.uri("public.docs")) as relay:
        db.txn(f"INSERT INTO docs VALUES (1, {BIG}, 1, 1)")
        consume(relay, ["public.docs"], has_tag(1))
        ((external,),) = db.rows("SELECT pg_column_size(body) < 20000 FROM docs")
        assert external is False  # not compressed: out of line, whole
        db.txn("UPDATE docs SET n = 2, tag = 2 WHERE id = 1")
        if identity == "full":
            windows = consume(relay, ["public.docs"], has_tag(2)).windows
            assert [v for _s, _o, _k, v in windows[1][1]] == [
                {"id": 1, "body": big, "n": 2, "tag": 2}]
        else:
            # The table is set aside (DESIGN 17) with the reason and the fix.
            [q] = wait_for(lambda: status(relay)["buffers"]["pg"]["quarantined"],
                           "the quarantine")
            assert q["source"] == "public.docs" and "'body' unchanged" in q["reason"], q
            assert q["fix"].startswith("run ALTER TABLE public.docs REPLICA IDENTITY FULL")
            assert fetcher_of(relay)["state"] == "running"


# -- 7. heartbeats ---------------------------------------------------------------------------


def _confirmed_advances(db: PgDatabase, seconds: float, write: bool) -> tuple[int, int, int]:
    """(confirmed LSN before, confirmed LSN after, server LSN reached) over ``seconds``
    of writes to a table that is not captured (``write``) or of nothing at all."""
    before = slot_lsn(db)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if write:
            db.txn("INSERT INTO other SELECT coalesce(max(id), 0) + 1, repeat('x', 2000) "
                   "FROM other")
        time.sleep(0.05)
    return before, slot_lsn(db), current_lsn(db)


def heartbeat_records(db: PgDatabase, start: int, end: int) -> int:
    """How many ``pg_logical_emit_message`` records the WAL has between two LSNs."""
    if end <= start:
        return 0  # no WAL at all
    db.run("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    ((count,),) = db.rows(
        f"SELECT count(*) FROM pg_get_wal_records_info('0/0'::pg_lsn + {start}, "
        f"'0/0'::pg_lsn + {end}) WHERE resource_manager = 'LogicalMessage'")
    return int(count)


def test_heartbeats_advance_an_idle_slot(db: PgDatabase, tmp_path: Path) -> None:
    db.run("CREATE TABLE other (id int PRIMARY KEY, pad text)")
    db.setup("public.orders")
    uri = db.uri("public.orders", heartbeat_s=1, status_interval_s=0.2)
    with logical_relay(tmp_path, uri) as relay:
        db.txn("INSERT INTO orders VALUES (1, 1, 'one', 1)")
        consume(relay, ["public.orders"], has_tag(1))
        # Writes to a table that is not captured: nothing comes through the slot for them.
        before, _after, reached = _confirmed_advances(db, 3, write=True)
        wait_for(lambda: slot_lsn(db) >= reached, "the slot confirmed past the writes", 5)
        details = fetcher_of(relay)["details"]
        assert details["slot_lag_bytes"] < (reached - before) / 2, details
        # Nothing at all: the heartbeats are the only WAL, and the slot follows them.
        start = current_lsn(db)
        wait_for(lambda: heartbeat_records(db, start, current_lsn(db)) >= 2,
                 "two heartbeats in 3 s (one a second)", 3)
        end = current_lsn(db)
        wait_for(lambda: slot_lsn(db) >= end, "the heartbeats confirmed", 5)
        details = wait_for(lambda: (d := fetcher_of(relay)["details"])["slot_lag_bytes"]
                           < 1024 and d, "a small slot lag", 10)
        assert details["slot_retained_bytes"] >= details["slot_lag_bytes"]
        assert fetcher_of(relay)["state"] == "running"


def test_without_heartbeats_the_fetcher_writes_nothing(db: PgDatabase,
                                                       tmp_path: Path) -> None:
    """``heartbeat=off``: an idle database gets no WAL from the fetcher. The slot still
    follows writes to tables that are not captured: the server's keepalives carry its
    position, which the replication client confirms when nothing is pending."""
    db.run("CREATE TABLE other (id int PRIMARY KEY, pad text)")
    db.setup("public.orders")
    uri = db.uri("public.orders", heartbeat="off", heartbeat_s=1, status_interval_s=0.2)
    with logical_relay(tmp_path, uri) as relay:
        db.txn("INSERT INTO orders VALUES (1, 1, 'one', 1)")
        consume(relay, ["public.orders"], has_tag(1))
        start = current_lsn(db)
        time.sleep(3)
        end = current_lsn(db)
        assert heartbeat_records(db, start, end) == 0
        _before, _after, reached = _confirmed_advances(db, 2, write=True)
        wait_for(lambda: slot_lsn(db) >= reached, "the slot confirmed past the writes", 5)
        assert heartbeat_records(db, start, current_lsn(db)) == 0


# -- 8. clear errors that are not retried -----------------------------------------------------


def test_a_slot_that_does_not_exist(db: PgDatabase, tmp_path: Path) -> None:
    db.setup("public.orders")
    uri = db.uri("public.orders").replace(f"slot={db.slot}", "slot=no_such_slot")
    with logical_relay(tmp_path, uri) as relay:
        error = wait_failed(relay)
    assert error.startswith("SourceMisconfiguredError: PostgreSQL postgresql://"), error
    assert "replication slot 'no_such_slot' does not exist: run databus pg setup" in error


def test_a_slot_in_use_by_another_process(db: PgDatabase, tmp_path: Path) -> None:
    """A slot streams to one process at a time: the relay waits 10 s for it (a relay
    killed a moment ago may still hold it), then fails naming the holder."""
    db.setup("public.orders")
    holder = psycopg2.connect(**db.server.connect_kwargs(db.dbname),
                              application_name="someone_else",
                              connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        holder.cursor().start_replication(
            slot_name=db.slot, decode=False,
            options={"proto_version": "1", "publication_names": db.publication})
        ((pid,),) = db.rows(f"SELECT active_pid FROM pg_replication_slots WHERE "
                            f"slot_name = '{db.slot}'")
        assert pid is not None
        with logical_relay(tmp_path, db.uri("public.orders")) as relay:
            started = time.monotonic()
            error = wait_failed(relay)
            assert time.monotonic() - started >= 9
        assert f"replication slot {db.slot!r} is in use by process {pid} (someone_else " \
               "from 127.0.0.1): one slot serves one relay" in error, error
    finally:
        holder.close()


def test_a_publication_that_misses_a_table(db: PgDatabase, tmp_path: Path) -> None:
    db.setup("public.orders")
    db.run("CREATE TABLE items (id int PRIMARY KEY)")
    with logical_relay(tmp_path, db.uri("public.orders,public.items")) as relay:
        error = wait_failed(relay)
    assert f"publication {db.publication!r} does not publish public.items: ALTER " \
           f"PUBLICATION {db.publication} ADD TABLE public.items" in error, error


def test_a_publication_dropped_while_streaming(db: PgDatabase, tmp_path: Path) -> None:
    """The walsender reads the publication when it decodes a change: the server's error
    in the stream is not retried."""
    db.setup("public.orders")
    with logical_relay(tmp_path, db.uri("public.orders")) as relay:
        db.txn("INSERT INTO orders VALUES (1, 1, 'one', 1)")
        consume(relay, ["public.orders"], has_tag(1))
        db.run(f"DROP PUBLICATION {db.publication}")
        db.txn("INSERT INTO orders VALUES (2, 2, 'two', 2)")
        error = wait_failed(relay)
    assert f"publication {db.publication!r} does not exist" in error \
        or f'publication "{db.publication}" does not exist' in error, error


def test_a_role_without_replication(db: PgDatabase, tmp_path: Path) -> None:
    db.setup("public.orders")
    role = f"{db.dbname}_norepl"
    db.run(f"CREATE ROLE {role} LOGIN")
    try:
        uri = db.uri("public.orders").replace("postgresql://postgres@",
                                              f"postgresql://{role}@")
        with logical_relay(tmp_path, uri) as relay:
            error = wait_failed(relay)
        assert error.startswith("SourceMisconfiguredError: PostgreSQL postgresql://"), error
        assert "must be superuser or replication role to start walsender" in error, error
    finally:
        db.run(f"DROP ROLE {role}")


@pytest.fixture
def password_role(postgres_server: PostgresServer, db: PgDatabase) -> Iterator[str]:
    """A role that must give its password (the shared server trusts every other login):
    a pg_hba.conf line for it alone, removed afterwards."""
    role = f"{db.dbname}_pw"
    db.run(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'Right-Pa55'",
           f"GRANT SELECT ON orders TO {role}")
    hba = Path(postgres_server.datadir) / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + original)
    db.run("SELECT pg_reload_conf()")
    try:
        yield role
    finally:
        hba.write_text(original)
        db.run("SELECT pg_reload_conf()")
        db.run(f"DROP OWNED BY {role}", f"DROP ROLE {role}")


def test_a_wrong_password_is_not_retried_and_never_shown(
        db: PgDatabase, password_role: str, tmp_path: Path) -> None:
    db.setup("public.orders")
    wrong = "Wr0ng-S3cret@qx9Zk"
    uri = db.uri("public.orders").replace(
        "postgresql://postgres@", f"postgresql://{password_role}:Wr0ng-S3cret%40qx9Zk@")
    # The reload is asynchronous: the line is in force once a trust login is refused.
    wait_for(lambda: not _trusted(db, password_role), "pg_hba.conf reloaded", 10)
    with logical_relay(tmp_path, uri) as relay:
        error = wait_failed(relay)
        with urllib.request.urlopen(relay.url + "/v1/status", timeout=5) as resp:
            whole_status = resp.read().decode()
        with urllib.request.urlopen(relay.url + "/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
    assert f'password authentication failed for user "{password_role}"' in error, error
    assert f"postgresql://{password_role}:***@" in error
    log = relay.log_path.read_text()
    assert "password authentication failed" in log
    for form in (wrong, "Wr0ng-S3cret", "Wr0ng-S3cret%40qx9Zk", "qx9Zk"):
        assert form not in whole_status + metrics + log


def _trusted(db: PgDatabase, role: str) -> bool:
    try:
        psycopg2.connect(**{**db.server.connect_kwargs(db.dbname), "user": role}).close()
    except psycopg2.OperationalError:
        return False
    return True


# -- 9. dumps ---------------------------------------------------------------------------------

ADMIN_TOKEN = "pg-logical-admin"


def _admin_post(relay: RelayProcess, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        relay.url + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}",
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get(relay: RelayProcess, path: str) -> Any:
    with urllib.request.urlopen(relay.url + path, timeout=10) as resp:
        return json.loads(resp.read())


class RandomWriter(threading.Thread):
    """Updates, deletes and inserts rows of ``orders`` at random, one transaction each."""

    def __init__(self, db: PgDatabase, keys: int) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.keys = keys
        self.stop = threading.Event()
        self.writes = 0

    def run(self) -> None:
        import random

        rng = random.Random(18)
        conn = self.db.connect()
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    key, choice = rng.randrange(1, self.keys), rng.random()
                    if choice < 0.5:
                        cur.execute("UPDATE orders SET qty = qty + 1, note = 'upd' "
                                    "WHERE id = %s", (key,))
                    elif choice < 0.7:
                        cur.execute("DELETE FROM orders WHERE id = %s", (key,))
                    else:
                        cur.execute("INSERT INTO orders VALUES (%s, 0, 'ins', 0) ON CONFLICT "
                                    "(id) DO UPDATE SET note = 'reins'", (key,))
                    self.writes += 1
                    time.sleep(0.002)
        finally:
            conn.close()


def test_a_dump_of_rows_older_than_the_slot_with_concurrent_writes(
        db: PgDatabase, tmp_path: Path) -> None:
    """``databus dump setup`` and a dump through the relay's admin endpoint: the rows
    written before the slot existed reach the consumer only by the dump; writes go on
    while it runs. Applying the stream in order gives the table."""
    from databus.cli import main as databus_main

    rows = 2000
    db.run(f"INSERT INTO orders SELECT i, i % 7, 'old' || i, 0 FROM generate_series(1, {rows}) i")
    db.setup("public.orders")
    uri = db.uri("public.orders")
    assert databus_main(["dump", "setup", "--source", uri]) == 0
    assert db.rows(f"SELECT tablename FROM pg_publication_tables WHERE pubname = "
                   f"'{db.publication}' ORDER BY 1") == [("databus_watermark",), ("orders",)]
    relay = RelayProcess(tmp_path, {"pg": uri}, capacity_mb=32, workers=1,
                         admin_token=ADMIN_TOKEN)
    relay.start()
    writer = RandomWriter(db, keys=rows + 200)
    try:
        writer.start()
        wait_for(lambda: writer.writes >= 50, "the writer")
        writes_before = writer.writes
        code, dump = _admin_post(relay, "/v1/admin/dumps", {
            "sources": ["public.orders"], "chunk_rows": 150, "delay_ms": 50})
        assert code == 201, dump
        doc = wait_for(lambda: (d := _get(relay, f"/v1/dumps/{dump['id']}"))["state"] in (
            "done", "failed", "cancelled") and d, "the dump finished", 90)
        assert doc["state"] == "done", doc
        assert writer.writes > writes_before + 100  # writes went on during the dump
        writer.stop.set()
        writer.join(10)
        (table,) = doc["tables"]
        assert table["chunks"] >= 10 and table["rows"] > 0, doc
        # A table never analyzed (reltuples -1) is still estimated, from its statistics.
        assert table["estimate"] >= rows // 2, doc
        db.txn("INSERT INTO orders VALUES (999999, 0, 'last', 1)")
        windows = consume(relay, ["public.orders"], has_tag(1), timeout=60).windows
        # The watermarks were never events.
        assert [s["name"] for s in _get(relay, "/v1/sources")["sources"]] == [
            "public.orders"]
    finally:
        writer.stop.set()
        writer.join(10)
        if relay.proc is not None and relay.proc.poll() is None:
            relay.kill()
    replica: dict[Any, Any] = {}
    for _scn, events in windows:
        for _source, op, key, value in events:
            if op == "DELETE":
                replica.pop(key, None)
            else:
                replica[key] = value
    source = {r[0]: {"id": r[0], "qty": r[1], "note": r[2], "tag": r[3]}
              for r in db.rows("SELECT id, qty, note, tag FROM orders")}
    assert replica == source
    # Rows never written since the slot exists came from the dump alone.
    assert sum(1 for v in source.values() if v["note"].startswith("old")) > rows // 2
