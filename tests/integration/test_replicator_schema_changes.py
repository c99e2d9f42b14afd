"""Schema changes made while the replicator is down (issue 28, DESIGN 16 and 17): a SQLite
source captured by triggers, a ``databus relay`` process and ``databus replicate``
processes into a PostgreSQL or SQLite target (the helpers of test_replicator_failures).

Each test: the replicator caught up, then stopped; on the source a change, rows written
after it; the replicator started again. The target table is reconciled with the schema
it is about to apply, so the change is handled as if made while it ran:

- columns added (nullable, and nullable with a DEFAULT): added; the rows written after
  equal the source's (rows already there read NULL in the DEFAULT column: the schema
  does not carry defaults, and the log names the dump that refills them);
- a NOT NULL column (with its DEFAULT): stopped with the fix; the fix applied to the
  target, the next start follows and the target equals the source;
- a dropped column: dropped (``apply``), stopped (``stop``), left (``ignore``);
- a renamed column: stopped, state "stopped" with error, message and fix in
  ``/v1/status``; after the fix the target equals the source;
- a changed type: stopped; after the fix (PostgreSQL) the target equals the source;
- kill -9 between the target's ALTER and the record/checkpoint: the next start
  converges.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from tests import waiting
from tests.integration.test_replicator_failures import (
    COLUMNS,
    ReplicatorProcess,
    Target,
    caught_up,
    new_source,
    pg_target,
    processes,
    source_rows,
    sqlite_target,
    started_relay,
    target,
)
from tests.relay_harness import RelayProcess, free_port
from tests.tiers import FULL
from tests.unit.test_txlog_support import SqliteSource

__all__ = ["pg_target", "processes", "sqlite_target", "target"]  # fixtures used here

pytestmark = pytest.mark.integration


def stopped_after_catching_up(tmp_path: Path, tgt: Target, processes: list[Any], *,
                              on_ddl: str = "apply", settings: tuple[str, ...] = ()
                              ) -> tuple[SqliteSource, RelayProcess, ReplicatorProcess, int]:
    """A source, its relay, and a replicator that caught up and was stopped."""
    src = new_source(tmp_path)
    relay = started_relay(tmp_path, src)
    processes.append(relay)
    repl = ReplicatorProcess(tmp_path, relay.url, tgt.url, on_ddl=on_ddl, settings=settings)
    processes.append(repl)
    repl.start()
    top = caught_up(relay, repl, tgt)
    assert repl.stop() == 0, repl.log()
    return src, relay, repl, top


def changed(src: SqliteSource, *statements: str) -> None:
    """A schema change on the source, its capture installed again, then rows after it
    (an insert, an update, a delete)."""
    src.run(*statements)
    src.install("orders")  # docs/txlog-fetcher.md: re-run install after a schema change
    src.txn("INSERT INTO orders (id, tag, qty) VALUES (40, 't40', 400)",
            "UPDATE orders SET tag = 'upd', qty = 77 WHERE id = 2",
            "DELETE FROM orders WHERE id = 5")


def target_columns(tgt: Target) -> list[str]:
    if tgt.kind == "sqlite":
        return [r[1] for r in tgt.execute("PRAGMA table_info(orders)")]
    return [r[0] for r in tgt.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = "
        f"'{tgt.schema}' AND table_name = 'orders' ORDER BY ordinal_position")]


def stop_line(repl: ReplicatorProcess) -> str:
    log = repl.log()
    return next((line for line in log.splitlines() if "error:" in line), log)


def assert_follows(src: SqliteSource, relay: RelayProcess, repl: ReplicatorProcess,
                   tgt: Target, columns: tuple[str, ...]) -> None:
    top = caught_up(relay, repl, tgt)
    assert tgt.rows(columns) == source_rows(src, columns) != []
    assert tgt.scn() == top
    assert repl.stop() == 0, repl.log()


def test_columns_added_while_down_are_added(
        tmp_path: Path, target: Target, processes: list[Any]) -> None:
    src, relay, repl, _ = stopped_after_catching_up(tmp_path, target, processes)
    changed(src, "ALTER TABLE orders ADD COLUMN y TEXT",
            "ALTER TABLE orders ADD COLUMN d INTEGER DEFAULT 7")
    src.txn("UPDATE orders SET y = 'why', d = 8 WHERE id = 3")
    repl.start()
    columns = (*COLUMNS, "y", "d")
    top = caught_up(relay, repl, target)
    assert target_columns(target) == list(columns)
    assert target.scn() == top
    # The rows written after the change are the source's, the new columns included.
    got = {r[0]: r for r in target.rows(columns)}
    want = {r[0]: r for r in source_rows(src, columns)}
    assert set(got) == set(want)
    for key in (2, 3, 40):
        assert got[key] == want[key]
    assert got[3][4:] == ("why", 8)
    # The rows already there: NULL for y as at the source; d's DEFAULT is not in the
    # source's schema, so they read NULL, and the log says how to refill them.
    assert got[1][4:] == (None, None) and want[1][4:] == (None, 7)
    assert "add column y" in repl.log() and "add column d" in repl.log()
    assert "databus dump start --relay URL --sources shop.orders" in repl.log()
    assert [r[0:4] for r in got.values()] == [r[0:4] for r in want.values()]
    assert repl.stop() == 0, repl.log()


def test_a_not_null_column_added_while_down_stops_then_follows_the_fix(
        tmp_path: Path, target: Target, processes: list[Any]) -> None:
    src, relay, repl, top = stopped_after_catching_up(tmp_path, target, processes)
    changed(src, "ALTER TABLE orders ADD COLUMN x TEXT NOT NULL DEFAULT 'a'")
    repl.start()
    assert repl.wait_exit() != 0
    line = stop_line(repl)
    assert "shop.orders" in line and "new column x is NOT NULL" in line, line
    assert "fix: ALTER TABLE" in line and "add column x text not null default" in line.lower()
    assert target.scn() == top and "x" not in target_columns(target)
    # The fix: the column, with the source's default, added to the target by hand.
    target.execute(f"ALTER TABLE {target.qname('orders')} ADD COLUMN x TEXT NOT NULL "
                   "DEFAULT 'a'")
    repl.start()
    assert_follows(src, relay, repl, target, (*COLUMNS, "x"))


@pytest.mark.parametrize(("kind", "on_ddl"), [
    ("postgresql", "apply"),
    pytest.param("sqlite", "apply", marks=pytest.mark.skipif(
        not FULL, reason="the PostgreSQL case covers apply (make test-full runs both)")),
    ("sqlite", "stop"), ("sqlite", "ignore")])
def test_a_column_dropped_while_down(
        tmp_path: Path, kind: str, on_ddl: str, processes: list[Any],
        request: pytest.FixtureRequest) -> None:
    tgt: Target = request.getfixturevalue("pg_target" if kind == "postgresql"
                                          else "sqlite_target")
    src, relay, repl, top = stopped_after_catching_up(tmp_path, tgt, processes,
                                                      on_ddl=on_ddl)
    changed(src, "ALTER TABLE orders DROP COLUMN note")
    repl.start()
    kept = ("id", "tag", "qty")
    if on_ddl == "stop":
        assert repl.wait_exit() != 0
        line = stop_line(repl)
        assert "shop.orders" in line and "drop column note" in line, line
        assert 'on_ddl = "stop"' in line and "fix:" in line, line
        assert tgt.scn() == top and "note" in target_columns(tgt)
        return
    assert_follows(src, relay, repl, tgt, kept)
    if on_ddl == "apply":
        assert target_columns(tgt) == list(kept)
    else:  # ignore: the table stays as it is
        assert target_columns(tgt) == list(COLUMNS)
        assert 'on_ddl = "ignore"' in repl.log()


def _status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=5) as resp:
        doc: dict[str, Any] = json.load(resp)
    return doc


def test_a_column_renamed_while_down_stops_and_says_so_in_its_status(
        tmp_path: Path, pg_target: Target, processes: list[Any]) -> None:
    port = free_port()
    src, relay, repl, top = stopped_after_catching_up(
        tmp_path, pg_target, processes, settings=(f"metrics_port = {port}",))
    changed(src, "ALTER TABLE orders RENAME COLUMN note TO memo")
    repl.start()
    doc = waiting.wait_until(
        lambda: (d := _status(port))["state"] == "stopped" and d, "state stopped",
        timeout=60, ignore=(OSError,), diagnose=repl.log)
    assert repl.alive()  # it stays, saying why: it never looks healthy while stopped
    assert doc["ready"] is False and doc["error"] == "schema_change_stopped", doc
    assert "shop.orders" in doc["message"] and "column note is gone and memo" in doc["message"]
    assert 'RENAME COLUMN note TO memo' in doc["fix"], doc
    assert [line for line in repl.log().splitlines() if "stopped:" in line] != []
    assert pg_target.scn() == top
    assert repl.stop() != 0  # SIGTERM ends it; the exit status says it had stopped
    pg_target.execute(f"ALTER TABLE {pg_target.qname('orders')} RENAME COLUMN note TO memo")
    repl.start()
    waiting.wait_until(lambda: _status(port)["state"] == "running", "state running",
                       timeout=60, ignore=(OSError,), diagnose=repl.log)
    assert_follows(src, relay, repl, pg_target, ("id", "tag", "qty", "memo"))


def test_a_type_changed_while_down_stops_then_follows_the_fix(
        tmp_path: Path, target: Target, processes: list[Any]) -> None:
    src, relay, repl, top = stopped_after_catching_up(tmp_path, target, processes)
    changed(src,
            "CREATE TABLE orders_new (id INTEGER PRIMARY KEY, tag TEXT NOT NULL, qty TEXT, "
            "note TEXT)",
            "INSERT INTO orders_new SELECT id, tag, CAST(qty AS TEXT), note FROM orders",
            "DROP TABLE orders", "ALTER TABLE orders_new RENAME TO orders")
    repl.start()
    assert repl.wait_exit() != 0
    line = stop_line(repl)
    was = "bigint" if target.kind == "postgresql" else "INTEGER"
    assert "shop.orders" in line and f"column qty changed from {was} to" in line, line
    assert "fix:" in line and target.scn() == top
    if target.kind != "postgresql":
        return  # SQLite cannot change a column's type in place
    target.execute(f"ALTER TABLE {target.qname('orders')} ALTER COLUMN qty TYPE text "
                   "USING qty::text")
    repl.start()
    assert_follows(src, relay, repl, target, COLUMNS)


@pytest.mark.parametrize("held", ["databus_replication_schemas", "databus_replication_state"])
def test_kill_9_between_the_alter_and_the_checkpoint_converges(
        tmp_path: Path, pg_target: Target, processes: list[Any], held: str,
        postgres_server: Any) -> None:
    src, relay, repl, top = stopped_after_catching_up(tmp_path, pg_target, processes)
    changed(src, "ALTER TABLE orders ADD COLUMN y TEXT")
    src.txn("UPDATE orders SET y = 'why' WHERE id = 3")
    # Writes to ``held`` wait: the replicator adds the column, then hangs before it
    # records the schema (or the batch's checkpoint) until it is killed.
    lock = psycopg2.connect(postgres_server.dsn)
    try:
        with lock.cursor() as cur:
            cur.execute(f"LOCK TABLE {pg_target.qname(held)} IN EXCLUSIVE MODE")
        repl.start()
        waiting.wait_until(lambda: "y" in target_columns(pg_target), "column y added",
                           timeout=60, diagnose=repl.log)
        assert pg_target.scn() == top
        repl.kill()
    finally:
        lock.rollback()
        lock.close()
    repl.start()
    assert_follows(src, relay, repl, pg_target, (*COLUMNS, "y"))
