"""Per-source failure isolation of the PostgreSQL logical fetcher (DESIGN 17, issue 28)
on the real server, with a ``databus relay`` process and a client: a value a table's
schema refuses and a table name the relay cannot serve set that table aside at the
commit LSN of its transaction, while the other tables flow on, whole and in order; and
a table without a primary key under REPLICA IDENTITY FULL captures its NULLs."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.cli import main as databus_main
from tests.fixtures.servers import PostgresServer
from tests.integration.pg_logical_support import (
    PgDatabase,
    consume,
    fetcher_of,
    logical_relay,
    scratch_database,
    status,
    wait_for,
)
from tests.relay_harness import RelayProcess, parse_windows

pytestmark = pytest.mark.integration

TOKEN = "pg-quarantine-token"


@pytest.fixture
def db(postgres_server: PostgresServer) -> Iterator[PgDatabase]:
    with scratch_database(postgres_server) as database:
        yield database


def _quarantined(relay: Any) -> list[dict[str, Any]]:
    return list(status(relay)["buffers"]["pg"]["quarantined"])


def served(relay: Any) -> list[tuple[int, str, Any]]:
    """Every event the relay's buffer holds, as (window SCN, source, key), read with
    ``quarantine=pass`` (a quarantined source's events would be there if any were)."""
    with urllib.request.urlopen(relay.url + "/v1/sources", timeout=5) as resp:
        names = {s["id"]: s["name"] for s in json.loads(resp.read())["sources"]}
    body, checkpoint = b"", ""
    while True:
        url = relay.url + "/v1/stream?quarantine=pass&max_bytes=67108864"
        if checkpoint:
            url += "&checkpoint=" + checkpoint
        with urllib.request.urlopen(url, timeout=10) as resp:
            chunk = resp.read()
            checkpoint = resp.headers["X-Databus-Checkpoint"]
        if not chunk:
            break
        body += chunk
    return [(w.scn, names[source], key) for w in parse_windows(body)
            for source, key, _value in w.events]


def _keys(windows: list[tuple[int, list[tuple[str, str, Any, Any]]]]) -> list[Any]:
    return [key for _scn, events in windows for _s, _op, key, _v in events]


def test_a_table_without_primary_key_under_full_captures_its_nulls(
        db: PgDatabase, tmp_path: Path) -> None:
    """Issue 28: every column was the key, so none was nullable, and the first NULL
    stopped the fetcher ('must be string on field b')."""
    db.run("CREATE TABLE kl (a int, b text)")
    db.setup("public.kl", "--replica-identity-full")
    with logical_relay(tmp_path, db.uri("public.kl")) as relay:
        db.txn("INSERT INTO kl VALUES (1, NULL), (NULL, 'x')")
        db.txn("UPDATE kl SET b = 'y' WHERE a = 1")
        db.txn("DELETE FROM kl WHERE b = 'x'")
        windows = consume(relay, ["public.kl"], lambda w: len(w) >= 3).windows
        assert [[(op, key, value) for _s, op, key, value in events]
                for _scn, events in windows] == [
            [("UPSERT", (1, None), {"a": 1, "b": None}),
             ("UPSERT", (None, "x"), {"a": None, "b": "x"})],
            [("DELETE", (1, None), None), ("UPSERT", (1, "y"), {"a": 1, "b": "y"})],
            [("DELETE", (None, "x"), None)]]
        assert fetcher_of(relay)["state"] == "running"
        assert _quarantined(relay) == []


def test_a_value_its_schema_refuses_quarantines_that_table_only(
        db: PgDatabase, tmp_path: Path) -> None:
    """NaN in a numeric(10,2) column: no Avro decimal holds it. ``items`` is set aside at
    that transaction's commit LSN (its earlier row in the same transaction left out: the
    transaction is read again without it); ``orders`` flows on."""
    db.run("CREATE TABLE items (id int PRIMARY KEY, price numeric(10,2))",
           "CREATE TABLE orders (id int PRIMARY KEY, tag int NOT NULL)")
    db.setup("public.items,public.orders")
    with logical_relay(tmp_path, db.uri("public.items,public.orders")) as relay:
        db.txn("INSERT INTO items VALUES (1, 1.5)", "INSERT INTO orders VALUES (1, 1)")
        db.txn("INSERT INTO items VALUES (2, 2)", "INSERT INTO orders VALUES (2, 2)",
               "INSERT INTO items VALUES (3, 'NaN')", "INSERT INTO orders VALUES (3, 2)")
        db.txn("INSERT INTO items VALUES (4, 4)", "INSERT INTO orders VALUES (4, 3)")
        db.txn("INSERT INTO orders VALUES (5, 4)")
        orders = consume(relay, ["public.orders"], lambda w: len(w) >= 4).windows
        assert [[key for _s, _o, key, _v in events] for _scn, events in orders] == [
            [1], [2, 3], [4], [5]]
        [q] = wait_for(lambda: _quarantined(relay), "the quarantine")
        assert q["source"] == "public.items" and q["scn"] == orders[1][0], q
        assert q["reason"] == ("a value of column 'price' (numeric(10,2)) cannot be held "
                               "by its schema"), q
        assert q["fix"].endswith("databus relay heal --relay URL --source public.items")
        # Nothing of items from its quarantine on (2 was before 3 in its transaction).
        assert [(scn, key) for scn, source, key in served(relay)
                if source == "public.items"] == [(orders[0][0], 1)]
        assert wait_for(lambda: fetcher_of(relay)["state"] == "running", "fetcher running")


def test_a_table_name_the_relay_cannot_serve_is_quarantined_and_ok_flows(
        db: PgDatabase, tmp_path: Path) -> None:
    """Issue 28: ``ws."a b"`` in a publication made by hand stopped the buffer, and
    ``ws.ok`` beside it with it. Now it is set aside at its first change."""
    db.run("CREATE SCHEMA ws", "CREATE TABLE ws.ok (id int PRIMARY KEY)",
           'CREATE TABLE ws."a b" (id int PRIMARY KEY)',
           f'CREATE PUBLICATION {db.publication} FOR TABLE ws.ok, ws."a b" '
           "WITH (publish = 'insert, update, delete')",
           f"SELECT pg_create_logical_replication_slot('{db.slot}', 'pgoutput')")
    assert databus_main(["dump", "setup", "--source", db.uri("ws.*")]) == 0  # for heal
    relay = RelayProcess(tmp_path, {"pg": db.uri("ws.*")}, capacity_mb=32, workers=1,
                         admin_token=TOKEN)
    relay.start()
    try:
        db.txn("INSERT INTO ws.ok VALUES (1)")
        db.txn('INSERT INTO ws."a b" VALUES (1)', "INSERT INTO ws.ok VALUES (2)")
        db.txn('INSERT INTO ws."a b" VALUES (2)')
        db.txn("INSERT INTO ws.ok VALUES (3)", 'INSERT INTO ws."a b" VALUES (3)')
        windows = consume(relay, ["ws.ok"], lambda w: len(w) >= 3).windows
        assert _keys(windows) == [1, 2, 3]
        [q] = wait_for(lambda: _quarantined(relay), "the quarantine")
        assert q["source"] == "ws.a b" and q["scn"] == windows[1][0], q
        assert "cannot be served" in q["reason"] and q["fix"].endswith("--source 'ws.a b'")
        assert fetcher_of(relay)["state"] == "running"
        # The fix: rename it; the heal lifts the quarantine (nothing to dump under a
        # name no consumer can ask for), and the renamed table is captured.
        db.run('ALTER TABLE ws."a b" RENAME TO a_b')
        assert databus_main(["relay", "heal", "--relay", relay.url, "--source", "ws.a b",
                             "--token", TOKEN]) == 0
        wait_for(lambda: not _quarantined(relay), "the quarantine lifted")
        db.txn("INSERT INTO ws.a_b VALUES (4)", "INSERT INTO ws.ok VALUES (5)")
        windows = consume(relay, ["ws.ok", "ws.a_b"], lambda w: len(w) >= 4).windows
        assert [k for _s, _o, k, _v in windows[-1][1]] == [4, 5]
    finally:
        if relay.proc is not None and relay.proc.poll() is None:
            relay.kill()
