"""The PostgreSQL TxLog fetcher against a real server: Figure 8, the issue's failure
cases, types, relay replicas, and the command line.

Each test gets a database of its own on the session's server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from databus.fetchers.txlog._postgres import PostgresSession
from databus.fetchers.txlog._uri import parse_source
from tests.fixtures.servers import PostgresServer
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_txlog_support import (
    BUFFER,
    WORKLOAD_DDL,
    DirectPuller,
    cli,
    relay_windows,
    replay,
    rows_by_key,
    summary,
    wait_for_window,
    wait_status,
)

pytestmark = pytest.mark.integration

TABLES = "orders,items,notes"
ORDERS, ITEMS, NOTES = "public.orders", "public.items", "public.notes"


class Pg:
    """A fresh database on the session server, with an autocommit connection."""

    def __init__(self, server: PostgresServer, dbname: str) -> None:
        self.server = server
        self.dbname = dbname
        self.conn = self.connect(autocommit=True)

    def connect(self, *, autocommit: bool = False) -> psycopg2.extensions.connection:
        conn: psycopg2.extensions.connection = psycopg2.connect(
            **self.server.connect_kwargs(self.dbname))
        conn.autocommit = autocommit
        return conn

    def uri(self, tables: str, **params: Any) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"tables": tables, "poll_ms": 10,
                                                  **params}.items())
        url = self.server.url(self.dbname).replace("postgresql://", "postgresql+txlog://", 1)
        return f"{url}?{query}"

    def install(self, tables: str) -> None:
        assert cli("install", "--source", self.uri(tables)) == 0

    def run(self, *statements: str) -> None:
        with self.conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def txn(self, *statements: str) -> None:
        self.run("BEGIN", *statements, "COMMIT")

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())

    def rows(self, table: str) -> list[dict[str, Any]]:
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description or ()]
            return [{n: v for n, v in zip(names, row, strict=True) if n != "databus_txn"}
                    for row in cur.fetchall()]


def fresh_database(server: PostgresServer, name: str) -> Pg:
    admin = psycopg2.connect(**server.connect_kwargs("postgres"))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    return Pg(server, name)


@pytest.fixture
def pg(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[Pg]:
    name = "txlog_" + re.sub(r"[^a-z0-9]", "_", request.node.name.lower())[:50]
    db = fresh_database(postgres_server, name)
    db.run(*WORKLOAD_DDL)
    yield db
    db.conn.close()


def order(i: int, tag: str, qty: int | None = None) -> dict[str, Any]:
    return {"id": i, "tag": tag, "qty": qty}


# -- Figure 8 -------------------------------------------------------------------------


def test_figure_8_a_long_running_transaction_arrives_in_its_own_later_window(
    pg: Pg, tmp_path: Path
) -> None:
    """T1 begins and writes, T2 writes and commits, the fetcher polls (T2 arrives), T1
    commits: T1 still arrives, in a window of its own after T2's; nothing twice."""
    pg.install(TABLES)
    config = relay_config(tmp_path, {BUFFER: pg.uri(TABLES)})

    async def scenario() -> None:
        async with running_relay(config) as r:
            t1 = pg.connect()
            with t1.cursor() as cur:  # T1 begins and writes: the older transaction id
                cur.execute("INSERT INTO orders (id, tag) VALUES (1, 'T1')")
                cur.execute("INSERT INTO notes (code, tag) VALUES ('n1', 'T1')")
            pg.txn("INSERT INTO orders (id, tag) VALUES (2, 'T2')",
                   "UPDATE orders SET tag = 'T2' WHERE id = 1")  # waits? no: T1's row is
            # invisible to T2, so T2 updates nothing there.
            windows = await wait_for_window(r, lambda w: "T2" in w.tags(), what="T2")
            assert [w.tags() for w in windows] == [{"T2"}]
            polled = (await wait_status(r, lambda s: True, what="status"))["fetcher"]
            await asyncio.sleep(0.2)  # many more polls while T1 is open
            assert [w.tags() for w in await relay_windows(r)] == [{"T2"}]
            t1.commit()
            t1.close()
            windows = await wait_for_window(r, lambda w: "T1" in w.tags(), what="T1")
            assert summary(windows) == [
                [(ORDERS, "upsert", 2, order(2, "T2"))],
                [(ORDERS, "upsert", 1, order(1, "T1")),
                 (NOTES, "upsert", "n1", {"code": "n1", "tag": "T1", "body": None})],
            ]
            assert windows[0].scn < windows[1].scn
            assert polled["state"] == "running"
        # T1 has the smaller transaction id, yet the later SCN: SCNs follow commits.
        (t1_txn, t1_scn), (t2_txn, t2_scn) = pg.query(
            "SELECT txn, scn FROM databus_txlog ORDER BY txn")
        assert t1_txn < t2_txn and t1_scn > t2_scn
        # A relay restarted on its data dir resumes after T1 and delivers nothing again.
        async with running_relay(config) as r:
            await wait_status(r, lambda s: s["fetcher"]["state"] == "running", what="up")
            pg.txn("INSERT INTO orders (id, tag) VALUES (3, 'T3')")
            windows = await wait_for_window(r, lambda w: "T3" in w.tags(), what="T3")
            assert [w.tags() for w in windows] == [{"T2"}, {"T1"}, {"T3"}]

    asyncio.run(scenario())


def test_a_long_running_transaction_does_not_hold_back_later_commits(
    pg: Pg, tmp_path: Path
) -> None:
    pg.install(TABLES)
    puller = DirectPuller(pg.uri(TABLES), tmp_path)
    long = pg.connect()
    with long.cursor() as cur:
        cur.execute("INSERT INTO orders (id, tag) VALUES (100, 'long')")
    for n in range(5):
        pg.txn(f"INSERT INTO orders (id, tag) VALUES ({n}, 'short{n}')")
        assert [w.tags() for w in puller.poll()] == [{f"short{n}"}]
    long.rollback()  # and a rolled back transaction never shows up
    long.close()
    pg.txn("INSERT INTO orders (id, tag) VALUES (6, 'after')")
    assert [w.tags() for w in puller.poll()] == [{"after"}]
    puller.close()


# -- windows ----------------------------------------------------------------------------


def test_a_transaction_over_three_tables_is_one_window(pg: Pg, tmp_path: Path) -> None:
    pg.install(TABLES)
    puller = DirectPuller(pg.uri(TABLES), tmp_path)
    pg.txn("INSERT INTO orders (id, tag, qty) VALUES (1, 't1', 5)",
           "INSERT INTO items (order_id, line, tag, sku) VALUES (1, 1, 't1', 'x'), "
           "(1, 2, 't1', NULL)",
           "INSERT INTO notes (code, tag, body) VALUES ('a', 't1', 'hello')")
    first = puller.poll()
    pg.txn("UPDATE orders SET qty = 6, tag = 't2' WHERE id = 1",
           "DELETE FROM items WHERE line = 2",
           "UPDATE notes SET code = 'b', tag = 't2' WHERE code = 'a'",
           "DELETE FROM notes WHERE code = 'b'",
           "INSERT INTO notes (code, tag) VALUES ('b', 't2')")  # delete + re-insert
    second = puller.poll()
    assert summary(first + second) == [
        [
            (ORDERS, "upsert", 1, order(1, "t1", 5)),
            (ITEMS, "upsert", (1, 1), {"order_id": 1, "line": 1, "tag": "t1", "sku": "x"}),
            (ITEMS, "upsert", (1, 2), {"order_id": 1, "line": 2, "tag": "t1", "sku": None}),
            (NOTES, "upsert", "a", {"code": "a", "tag": "t1", "body": "hello"}),
        ],
        [
            (ORDERS, "upsert", 1, order(1, "t2", 6)),
            (ITEMS, "delete", (1, 2), None),
            (NOTES, "delete", "a", None),
            (NOTES, "upsert", "b", {"code": "b", "tag": "t2", "body": None}),
        ],
    ]
    puller.close()


def test_a_column_added_between_polls_is_a_new_schema_version(
    pg: Pg, tmp_path: Path
) -> None:
    pg.install(TABLES)
    puller = DirectPuller(pg.uri(TABLES), tmp_path)
    pg.txn("INSERT INTO orders (id, tag, qty) VALUES (1, 'v1', 1)")
    assert summary(puller.poll()) == [[(ORDERS, "upsert", 1, order(1, "v1", 1))]]
    pg.txn("ALTER TABLE orders ADD COLUMN placed date DEFAULT '2024-01-02'",
           "INSERT INTO orders (id, tag, qty, placed) VALUES (2, 'v2', 2, '2025-05-06')")
    pg.txn("UPDATE orders SET tag = 'v3' WHERE id = 1")
    windows = puller.poll()
    assert summary(windows) == [
        [(ORDERS, "upsert", 2, {**order(2, "v2", 2), "placed": dt.date(2025, 5, 6)})],
        [(ORDERS, "upsert", 1, {**order(1, "v3", 1), "placed": dt.date(2024, 1, 2)})],
    ]
    first, second = puller.catalog.registry.versions(ORDERS)
    assert [f["name"] for f in first.fields] == ["id", "tag", "qty"]
    assert [f["name"] for f in second.fields] == ["id", "tag", "qty", "placed"]
    puller.close()


def test_two_relays_on_one_source_share_scns_and_checkpoints(pg: Pg, tmp_path: Path) -> None:
    """Relay replicas on one source: the assigners are serialised, so an SCN means the
    same transaction on both. Their windows may differ in content (each read the rows at
    its own time: coalescing), but a consumer that switches from one to the other at any
    checkpoint still ends with the source's state."""
    pg.install(TABLES)
    uri = pg.uri(TABLES)

    async def scenario() -> None:
        async with running_relay(relay_config(tmp_path / "a", {BUFFER: uri})) as a, \
                running_relay(relay_config(tmp_path / "b", {BUFFER: uri})) as b:
            def write() -> None:
                conn = pg.connect(autocommit=True)
                with conn.cursor() as cur:
                    for n in range(150):
                        cur.execute("INSERT INTO orders (id, tag) VALUES (%s, %s) ON CONFLICT "
                                    "(id) DO UPDATE SET tag = excluded.tag", (n % 40, f"x{n}"))
                        if n % 9 == 0:
                            cur.execute("DELETE FROM orders WHERE id = %s", (n % 13,))
                conn.close()

            await asyncio.gather(*(asyncio.to_thread(write) for _ in range(3)))
            pg.txn("INSERT INTO notes (code, tag) VALUES ('end', 'end')")
            wa = await wait_for_window(a, lambda w: "end" in w.tags(), what="a")
            wb = await wait_for_window(b, lambda w: "end" in w.tags(), what="b")
            assert wa[-1].scn == wb[-1].scn
            final = {ORDERS: rows_by_key(pg.rows("orders"), ("id",)),
                     NOTES: rows_by_key(pg.rows("notes"), ("code",))}
            for switch in [0, *(w.scn for w in wa)]:
                for first, second in ((wa, wb), (wb, wa)):
                    windows = [w for w in first if w.scn <= switch] + \
                              [w for w in second if w.scn > switch]
                    assert replay(windows) == final, f"switching at SCN {switch}"

    asyncio.run(scenario())
    ((assigned, distinct),) = pg.query("SELECT count(scn), count(DISTINCT scn) "
                                       "FROM databus_txlog")
    assert assigned == distinct > 100


TYPES_DDL = """
CREATE TABLE typed (
    id bigint PRIMARY KEY, small smallint, whole integer, big bigint, r real,
    d double precision, flag boolean, t text, v varchar(10), c char(3), raw bytea,
    money_exact numeric(10, 2), any_numeric numeric, day date, at timestamp,
    at_tz timestamptz, clock time, u uuid, doc jsonb, tags text[], span interval,
    "Odd Name" text
)"""


def test_every_postgres_type_of_the_mapping_table(pg: Pg, tmp_path: Path) -> None:
    pg.run(TYPES_DDL)
    pg.install("typed")
    puller = DirectPuller(pg.uri("typed"), tmp_path)
    pg.txn(
        "INSERT INTO typed VALUES (1, 2, 3, 4000000000, 1.5, 2.25, true, 'text', 'var', 'ab', "
        "'\\x00ff', 12.34, 3.14159265358979323846, '2024-02-29', '2024-02-29 12:34:56.789',"
        " '2024-02-29 12:34:56.789+02', '23:59:58.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
        "'{\"a\": [1, 2]}', '{x,y}', '1 day 2 hours', 'odd')",
        "INSERT INTO typed (id) VALUES (2)",
    )
    (window,) = puller.poll()
    full, empty = (c.row for c in window.changes)
    assert full == {
        "id": 1, "small": 2, "whole": 3, "big": 4000000000, "r": 1.5, "d": 2.25,
        "flag": True, "t": "text", "v": "var", "c": "ab ", "raw": b"\x00\xff",
        "money_exact": Decimal("12.34"), "any_numeric": "3.14159265358979323846",
        "day": dt.date(2024, 2, 29), "at": dt.datetime(2024, 2, 29, 12, 34, 56, 789000),
        "at_tz": dt.datetime(2024, 2, 29, 10, 34, 56, 789000, tzinfo=dt.UTC),
        "clock": dt.time(23, 59, 58, 500000), "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "doc": '{"a": [1, 2]}', "tags": "{x,y}", "span": "1 day 02:00:00", "Odd_Name": "odd",
    }
    assert empty == {name: (2 if name == "id" else None) for name in full}
    (schema,) = puller.catalog.registry.versions("public.typed")
    by_name = {f["name"]: f for f in schema.fields}
    assert by_name["Odd_Name"]["sql_name"] == "Odd Name"
    assert by_name["money_exact"]["type"][1] == {
        "type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
    puller.close()


# -- failure cases -----------------------------------------------------------------------


async def failed(tmp_path: Path, uri: str) -> dict[str, Any]:
    async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
        doc = await wait_status(r, lambda s: s["fetcher"]["state"] == "failed", what="failed")
        fetcher: dict[str, Any] = doc["fetcher"]
        return fetcher


def test_missing_or_disabled_triggers_are_a_clear_error_at_start(
    pg: Pg, tmp_path: Path
) -> None:
    pg.install(TABLES)
    pg.run("ALTER TABLE items DISABLE TRIGGER databus_deleted")
    fetcher = asyncio.run(failed(tmp_path / "a", pg.uri(TABLES)))
    assert fetcher["restarts"] == 0
    assert "TxlogNotInstalledError" in fetcher["last_error"]
    assert "public.items" in fetcher["last_error"]
    assert "databus_deleted (absent or disabled)" in fetcher["last_error"]
    pg.run("ALTER TABLE items ENABLE TRIGGER databus_deleted",
           "DROP TRIGGER databus_stamp ON notes")
    fetcher = asyncio.run(failed(tmp_path / "b", pg.uri(TABLES)))
    assert "public.notes" in fetcher["last_error"] and "databus_stamp" in fetcher["last_error"]


def test_a_table_without_a_primary_key_is_refused(
    pg: Pg, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pg.run("CREATE TABLE events (at timestamptz, what text)")
    assert cli("install", "--source", pg.uri("orders,events")) == 1
    assert "public.events has no primary key" in capsys.readouterr().err
    assert pg.query("SELECT to_regclass('databus_txlog')") == [(None,)]  # all or nothing
    fetcher = asyncio.run(failed(tmp_path, pg.uri("events")))
    assert "no primary key" in fetcher["last_error"]


def test_prune_while_the_fetcher_runs(pg: Pg, tmp_path: Path) -> None:
    pg.install(TABLES)
    uri = pg.uri(TABLES)
    prunes: list[int] = []

    async def scenario() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
            stop = threading.Event()

            def write() -> None:
                conn = pg.connect(autocommit=True)
                with conn.cursor() as cur:
                    # Write until several prunes have run concurrently (however slow
                    # the machine), with a cap so the test always ends.
                    n = 0
                    while n < 5000 and (n < 200 or len(prunes) < 5):
                        n += 1
                        cur.execute("BEGIN")
                        cur.execute("INSERT INTO orders (id, tag) VALUES (%s, %s) ON CONFLICT "
                                    "(id) DO UPDATE SET tag = excluded.tag", (n % 30, f"p{n}"))
                        cur.execute("DELETE FROM items WHERE order_id = %s", (n % 7,))
                        cur.execute("INSERT INTO items (order_id, line, tag) VALUES (%s, 1, %s)"
                                    " ON CONFLICT DO NOTHING", (n % 5, f"p{n}"))
                        cur.execute("COMMIT")
                conn.close()
                stop.set()

            writer = asyncio.create_task(asyncio.to_thread(write))
            while not stop.is_set():
                max_scn = (await r.json("/v1/status"))["buffers"][BUFFER]["max_scn"]
                if max_scn:
                    # Everything the relay has may go (the fetcher is at least there).
                    code = await asyncio.to_thread(cli, "prune", "--source", uri,
                                                   "--before-scn", str(max_scn + 1))
                    assert code == 0
                    prunes.append(max_scn + 1)
                await asyncio.sleep(0.01)
            await writer
            pg.txn("INSERT INTO notes (code, tag) VALUES ('end', 'end')")
            windows = await wait_for_window(r, lambda w: "end" in w.tags(), what="end")
            doc = await r.json("/v1/status")
            assert doc["buffers"][BUFFER]["fetcher"]["restarts"] == 0
            assert replay(windows) == {
                ORDERS: rows_by_key(pg.rows("orders"), ("id",)),
                ITEMS: rows_by_key(pg.rows("items"), ("order_id", "line")),
                NOTES: rows_by_key(pg.rows("notes"), ("code",)),
            }
            # One last prune once the relay has everything: how many rows the writer
            # added after the last concurrent prune depends on the machine's speed.
            max_scn = (await r.json("/v1/status"))["buffers"][BUFFER]["max_scn"]
            code = await asyncio.to_thread(cli, "prune", "--source", uri,
                                           "--before-scn", str(max_scn + 1))
            assert code == 0
            prunes.append(max_scn + 1)

    asyncio.run(scenario())
    assert len(prunes) >= 5
    ((pruned_before,),) = pg.query("SELECT pruned_before FROM databus_txlog_state")
    assert pruned_before == max(prunes)
    ((left,),) = pg.query("SELECT count(*) FROM databus_txlog")
    assert left < 100


def test_source_unreachable_and_back(pg: Pg, postgres_server: PostgresServer,
                                     tmp_path: Path) -> None:
    pg.install(TABLES)

    async def scenario() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: pg.uri(TABLES)})) as r:
            pg.txn("INSERT INTO orders (id, tag) VALUES (1, 'before')")
            await wait_for_window(r, lambda w: "before" in w.tags(), what="before")
            # Lag in seconds (DESIGN 17): an idle TxLog source is known (each poll that
            # finds nothing is its heartbeat), unknown while it is down, never 0.
            await wait_status(r, lambda s: s["fetcher"]["lag_seconds"] is not None,
                              what="lag known")
            pg.conn.close()
            await asyncio.to_thread(postgres_server.stop)
            try:
                doc = await wait_status(r, lambda s: s["fetcher"]["restarts"] >= 1,
                                        what="retrying")
                assert doc["fetcher"]["last_error"].startswith("SourceError: PostgreSQL")
                assert doc["fetcher"]["lag_seconds"] is None
            finally:
                await asyncio.to_thread(postgres_server.start)
            pg.conn = pg.connect(autocommit=True)
            pg.txn("INSERT INTO orders (id, tag) VALUES (2, 'after')")
            windows = await wait_for_window(r, lambda w: "after" in w.tags(), what="after",
                                            timeout=40)
            assert [w.tags() for w in windows] == [{"before"}, {"after"}]
            await wait_status(r, lambda s: s["fetcher"]["lag_seconds"] is not None,
                              what="lag known again")

    asyncio.run(scenario())


def test_error_classification(pg: Pg) -> None:
    session = PostgresSession(parse_source(pg.uri("orders")))
    session.connect()
    with pytest.raises(Exception) as info, session.guard():
        session.query("SELECT * FROM no_such_table")
    assert not getattr(info.value, "retriable", True)
    session.close()
    unreachable = PostgresSession(parse_source(
        "postgresql+txlog://u:secret-pw@127.0.0.1:1/db?tables=t&connect_timeout_s=1"))
    with pytest.raises(Exception) as info:
        unreachable.connect()
    assert getattr(info.value, "retriable", False)
    assert "secret-pw" not in str(info.value)


# -- the command line ---------------------------------------------------------------------


def test_install_dry_run_then_install_twice_then_uninstall(
    pg: Pg, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = "SELECT count(*) FROM pg_class WHERE relname LIKE 'databus%%'"
    assert cli("install", "--source", pg.uri(TABLES), "--dry-run") == 0
    out = capsys.readouterr().out
    assert 'CREATE OR REPLACE TRIGGER "databus_stamp" BEFORE INSERT OR UPDATE ON ' \
           '"public"."orders"' in out
    assert pg.query(catalog.replace("%%", "%")) == [(0,)]
    pg.install(TABLES)
    pg.install(TABLES)
    pg.txn("INSERT INTO orders (id, tag) VALUES (1, 'x')")
    assert cli("uninstall", "--source", pg.uri(TABLES), "--drop-txlog") == 0
    assert pg.query(catalog.replace("%%", "%")) == [(0,)]
    assert pg.query("SELECT count(*) FROM pg_proc WHERE proname LIKE 'databus%'") == [(0,)]
    assert pg.rows("orders") == [order(1, "x")]
