"""DDL: ALTER TABLE ADD/DROP COLUMN, RENAME, TRUNCATE, DROP + CREATE mid-stream give new
schema versions; every event decodes with the schema it was written with, also when
the binlog is replayed after the DDL (the table map, not information_schema, decides)."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path

from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import (
    binlog_relay,
    captured,
    fresh_database,
    source_uri,
    summary,
    wait_for_scn,
)

DB = "bl_ddl"


def test_ddl_between_transactions_of_a_running_stream(
    mariadb_server: MariaDBServer, tmp_path: Path
) -> None:
    sql = fresh_database(mariadb_server, DB)
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10), b INT)")
    t, t2, n = f"{DB}.t", f"{DB}.t2", f"{DB}.n"

    async def scenario() -> None:
        async with binlog_relay(tmp_path, source_uri(mariadb_server, f"{DB}.*")) as r:
            sql.txn("INSERT INTO t VALUES (1, 'one', 10)")
            sql.run("ALTER TABLE t ADD COLUMN c DECIMAL(10,2) DEFAULT 1.5, DROP COLUMN b")
            sql.txn("INSERT INTO t (id, a) VALUES (2, 'two')",
                    "UPDATE t SET a = 'uno' WHERE id = 1")
            sql.run("ALTER TABLE t MODIFY c DECIMAL(10,4)")  # same Avro bytes type, new scale
            sql.txn("UPDATE t SET c = 2.1234 WHERE id = 2")
            # (A TRUNCATE here would quarantine t2: test_binlog_quarantine.)
            sql.run("RENAME TABLE t TO t2")
            sql.txn("INSERT INTO t2 VALUES (3, 'three', 3)")
            sql.run("DROP TABLE t2", "CREATE TABLE t2 (id VARCHAR(5) PRIMARY KEY)",
                    "CREATE TABLE n (id INT PRIMARY KEY)")
            last = sql.txn("INSERT INTO t2 VALUES ('k')", "INSERT INTO n VALUES (7)")
            await wait_for_scn(r, last)
            windows, _ = await captured(r)
            assert summary(windows) == [
                [(t, "upsert", 1, {"id": 1, "a": "one", "b": 10})],
                [(t, "upsert", 2, {"id": 2, "a": "two", "c": Decimal("1.50")}),
                 (t, "upsert", 1, {"id": 1, "a": "uno", "c": Decimal("1.50")})],
                [(t, "upsert", 2, {"id": 2, "a": "two", "c": Decimal("2.1234")})],
                [(t2, "upsert", 3, {"id": 3, "a": "three", "c": Decimal("3.0000")})],
                [(t2, "upsert", "k", {"id": "k"}), (n, "upsert", 7, {"id": 7})],
            ]
            versions = (await r.json("/v1/schemas", source=t))["versions"]
            assert [[f["name"] for f in v["schema"]["fields"]] for v in versions] == [
                ["id", "a", "b"], ["id", "a", "c"], ["id", "a", "c"]
            ]
            assert len((await r.json("/v1/schemas", source=t2))["versions"]) == 2

    asyncio.run(scenario())
    sql.close()


def test_replay_after_ddl_uses_the_historical_layout(
    mariadb_server: MariaDBServer, tmp_path: Path
) -> None:
    """Rows written before an ALTER, read only after it: decoded with the old layout."""
    sql = fresh_database(mariadb_server, DB + "_replay")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(5))")
    uri = source_uri(mariadb_server, f"{DB}_replay.t")
    t = f"{DB}_replay.t"

    async def first() -> None:
        async with binlog_relay(tmp_path, uri) as r:
            await wait_for_scn(r, sql.txn("INSERT INTO t VALUES (1, 1, 'x')"))

    async def second(last: int) -> None:
        async with binlog_relay(tmp_path, uri) as r:
            await wait_for_scn(r, last)
            windows, _ = await captured(r)
            assert summary(windows) == [
                [(t, "upsert", 1, {"id": 1, "a": 1, "b": "x"})],
                [(t, "upsert", 2, {"id": 2, "a": 2, "b": "y"})],
                [(t, "upsert", 3, {"id": 3, "b": "z", "a": "3"})],
            ]

    asyncio.run(first())
    sql.txn("INSERT INTO t VALUES (2, 2, 'y')")  # the relay is down: read after the ALTER
    sql.run("ALTER TABLE t MODIFY a VARCHAR(5) AFTER b")
    last = sql.txn("INSERT INTO t (id, a, b) VALUES (3, '3', 'z')")
    asyncio.run(second(last))
    sql.close()
