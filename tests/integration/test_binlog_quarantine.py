"""Per-source failure isolation of the binlog fetcher (DESIGN 17) on the real MariaDB,
through a relay: a change to one table logged as a statement, a rows event written
without the full row, and a table whose name the relay cannot serve each set that table
aside at the SCN of the transaction they were met in (with the reason and the fix),
while every other table keeps flowing, whole and in order."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import (
    Sql,
    binlog_relay,
    captured,
    fresh_database,
    source_uri,
    status,
    wait_for_scn,
    wait_until,
)

DB = "bl_quar"


def _by_source(windows: Any) -> dict[str, list[tuple[int, str, Any]]]:
    out: dict[str, list[tuple[int, str, Any]]] = {}
    for w in windows:
        for c in w.changes:
            out.setdefault(c.source, []).append((w.scn, c.op, c.key))
    return out


@pytest.mark.parametrize(
    ("session", "reason"),
    [("SET SESSION binlog_format = 'STATEMENT'", "was logged as a statement"),
     ("SET SESSION binlog_row_image = 'MINIMAL'", "binlog_row_image other than FULL")],
    ids=["statement", "minimal"],
)
def test_a_session_setting_quarantines_only_its_table(
        mariadb_server: MariaDBServer, tmp_path: Path, session: str, reason: str) -> None:
    """A session writing one table with the wrong format sets that table aside at that
    transaction's SCN; the other table's rows (in the same transactions after it) flow on."""
    db = f"{DB}_s"
    sql = fresh_database(mariadb_server, db)
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v INT)", "CREATE TABLE u (id INT PRIMARY KEY)",
            "INSERT INTO t VALUES (1, 1)")
    writer = Sql(mariadb_server, db)  # the session with the wrong setting

    async def scenario() -> None:
        async with binlog_relay(tmp_path, source_uri(mariadb_server, f"{db}.*")) as r:
            sql.txn("INSERT INTO u VALUES (1)", "INSERT INTO t VALUES (2, 1)")
            writer.run(session)
            sql.txn("INSERT INTO u VALUES (2)")
            writer.run("UPDATE t SET v = 2 WHERE id = 1")
            bad = writer.position()
            sql.txn("INSERT INTO t VALUES (3, 3)", "INSERT INTO u VALUES (3)")
            sql.txn("INSERT INTO u VALUES (4)")
            last = sql.txn("INSERT INTO u VALUES (5)", "UPDATE t SET v = 9")
            await wait_for_scn(r, last)
            doc = await status(r)
            assert doc["fetcher"]["state"] == "running", doc["fetcher"]
            [q] = doc["quarantined"]
            assert q["source"] == f"{db}.t" and q["scn"] == bad, q
            assert reason in q["reason"], q
            assert q["fix"].endswith(f"databus relay heal --relay URL --source {db}.t"), q
            windows, _ = await captured(r, quarantine="pass")
            rows = _by_source(windows)
            assert [k for _, _, k in rows[f"{db}.u"]] == [1, 2, 3, 4, 5]
            # t's events stop before the failing transaction's SCN: none from it on.
            assert [(op, k) for scn, op, k in rows[f"{db}.t"]] == [("upsert", 2)]
            assert all(scn < bad for scn, _, _ in rows[f"{db}.t"])
            # The failing transaction has a window of its own (the quarantine's marker).
            assert [w.changes for w in windows if w.scn == bad] == [[]]

    asyncio.run(scenario())
    writer.close()
    sql.close()


def test_a_table_the_relay_cannot_name_is_quarantined(mariadb_server: MariaDBServer,
                                                     tmp_path: Path) -> None:
    """``a b`` matches ``db.*`` but no source may be named with a space: it is set aside
    at its first change, and ``ok`` beside it (in the same transaction too) goes on."""
    db = f"{DB}_n"
    sql = fresh_database(mariadb_server, db)
    sql.run("CREATE TABLE ok (id INT PRIMARY KEY)", "CREATE TABLE `a b` (id INT PRIMARY KEY)")

    async def scenario() -> None:
        async with binlog_relay(tmp_path, source_uri(mariadb_server, f"{db}.*")) as r:
            sql.txn("INSERT INTO ok VALUES (1)")
            bad = sql.txn("INSERT INTO `a b` VALUES (1)", "INSERT INTO ok VALUES (2)")
            sql.txn("INSERT INTO `a b` VALUES (2)")
            last = sql.txn("INSERT INTO ok VALUES (3)", "INSERT INTO `a b` VALUES (3)")
            await wait_for_scn(r, last)
            await wait_until(r, lambda s: s["quarantined"], what="a quarantine")
            doc = await status(r)
            assert doc["fetcher"]["state"] == "running", doc["fetcher"]
            [q] = doc["quarantined"]
            assert q["source"] == f"{db}.a b" and q["scn"] == bad, q
            assert "cannot be served" in q["reason"]
            assert q["fix"].endswith(f"--source '{db}.a b'"), q
            windows, _ = await captured(r, quarantine="pass")
            assert _by_source(windows) == {f"{db}.ok": [
                (w.scn, "upsert", k) for w, k in zip(windows, [1, 2, 3], strict=True)]}

    asyncio.run(scenario())
    sql.close()


def test_a_truncate_of_a_captured_table_quarantines_it(mariadb_server: MariaDBServer,
                                                      tmp_path: Path) -> None:
    """TRUNCATE deletes every row with no row event (consumers would keep them all): the
    table is set aside at its SCN, the other table goes on."""
    db = f"{DB}_t"
    sql = fresh_database(mariadb_server, db)
    sql.run("CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE u (id INT PRIMARY KEY)")

    async def scenario() -> None:
        async with binlog_relay(tmp_path, source_uri(mariadb_server, f"{db}.t,{db}.u")) as r:
            sql.txn("INSERT INTO t VALUES (1)", "INSERT INTO u VALUES (1)")
            sql.run("TRUNCATE TABLE t")
            bad = sql.position()
            sql.txn("INSERT INTO t VALUES (2)", "INSERT INTO u VALUES (2)")
            last = sql.txn("INSERT INTO u VALUES (3)")
            await wait_for_scn(r, last)
            doc = await status(r)
            [q] = doc["quarantined"]
            assert q["source"] == f"{db}.t" and q["scn"] == bad, q
            assert q["reason"].startswith("TRUNCATE TABLE at "), q
            windows, _ = await captured(r, quarantine="pass")
            rows = _by_source(windows)
            assert [k for _, _, k in rows[f"{db}.u"]] == [1, 2, 3]
            assert [k for _, _, k in rows[f"{db}.t"]] == [1]

    asyncio.run(scenario())
    sql.close()
