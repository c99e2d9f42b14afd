"""What a first day's setup commands say and do, against real servers:

- ``databus replicate assess`` on a PostgreSQL target says "will be created" for a table
  that is not there and leaves the catalog as it was (no table, no schema, no
  ``databus_replication_state``); a user who may not create tables gets a blocking
  finding, still with nothing written;
- ``databus dump setup`` prints runnable SQL in two parts, with ONE grant block for the
  relay's user, and that block is all the relay's user needs (``--check`` passes with
  its own URI after an administrator ran it);
- the same on MariaDB, where ``assess`` reads the user's privileges instead of trying
  (CREATE TABLE is not transactional there).
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import psycopg2
import pymysql
import pytest

from databus.cli import main as databus_main
from databus.config import ReplicateConfig, ReplicatedTableConfig
from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_txlog_support import SqliteSource

_names = itertools.count()

CATALOG = ("SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
           "ON n.oid = c.relnamespace WHERE n.nspname NOT IN ('pg_catalog', "
           "'information_schema') AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1, 2")


def fresh_database(server: PostgresServer, prefix: str) -> str:
    name = f"{prefix}_{next(_names)}"
    conn = psycopg2.connect(**server.connect_kwargs())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return name


def run_sql(server: PostgresServer, dbname: str, *statements: str) -> list[Any]:
    conn = psycopg2.connect(**server.connect_kwargs(dbname))
    conn.autocommit = True
    rows: list[Any] = []
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
            rows = cur.fetchall() if cur.description else []
    conn.close()
    return rows


def catalog(server: PostgresServer, dbname: str) -> list[Any]:
    return run_sql(server, dbname, CATALOG) + run_sql(
        server, dbname, "SELECT nspname FROM pg_namespace ORDER BY 1")


def ensure_role(server: PostgresServer, role: str) -> None:
    run_sql(server, server.dbname,
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') "
            f"THEN CREATE ROLE {role} LOGIN; END IF; END $$")


def test_assess_says_will_be_created_and_writes_nothing(
        postgres_server: PostgresServer, tmp_path: Path) -> None:
    from databus.replicator._assess import assess, render
    from databus.replicator.targets import open_target

    src = SqliteSource(tmp_path / "shop.db",
                       "CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL)")
    src.install("orders")
    dbname = fresh_database(postgres_server, "assess_probe")
    ensure_role(postgres_server, "assess_reader")
    run_sql(postgres_server, dbname, "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
            f"GRANT CONNECT ON DATABASE {dbname} TO assess_reader")
    before = catalog(postgres_server, dbname)
    # ?schema=: the state table would go into a schema that does not exist yet either.
    owner_url = postgres_server.url(dbname) + "?schema=replica"
    reader_url = (postgres_server.url(dbname).replace("postgres@", "assess_reader@", 1))

    async def main() -> tuple[str, str]:
        async with running_relay(relay_config(tmp_path, {"src": src.uri("orders")})) as r:
            texts = []
            for url in (owner_url, reader_url):
                config = ReplicateConfig(name="shop-copy", relays=(r.url,), target=url,
                                         tables=(ReplicatedTableConfig(source="shop.orders"),))
                reports = await assess(config, open_target(config.target))
                texts.append(render(reports))
            return texts[0], texts[1]

    owner, reader = asyncio.run(main())
    src.close()
    assert "target table will be created" in owner and "created)" not in \
        owner.replace("will be created)", "")
    assert "BLOCK" not in owner, owner  # the owner may create it: nothing blocks
    # The user who may not create tables is told, before anything runs.
    assert "BLOCKING: the target refused the replication state table" in reader, reader
    assert "permission denied" in reader
    # Nothing was written: no target table, no schema, no databus_replication_state.
    assert catalog(postgres_server, dbname) == before


def dump_setup(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = databus_main(["dump", "setup", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_dump_setup_prints_one_grant_block_for_the_relays_user(
        postgres_server: PostgresServer, capsys: pytest.CaptureFixture[str]) -> None:
    dbname = fresh_database(postgres_server, "dump_setup")
    run_sql(postgres_server, dbname, "CREATE TABLE orders (id int PRIMARY KEY, tag text)")
    ensure_role(postgres_server, "relay_reader")
    txlog = postgres_server.url(dbname).replace("postgresql://", "postgresql+txlog://", 1)
    admin_uri = txlog + "?tables=orders"
    relay_uri = admin_uri.replace("postgres@", "relay_reader@", 1)
    assert databus_main(["txlog", "install", "--source", admin_uri]) == 0
    capsys.readouterr()

    # --dry-run: the same two parts, nothing run.
    code, out, _ = dump_setup(capsys, "--source", admin_uri, "--dry-run",
                              "--relay-user", "relay_reader")
    assert code == 0 and "not run: --dry-run" in out
    assert run_sql(postgres_server, dbname,
                   "SELECT to_regclass('public.databus_watermark')") == [(None,)]

    # The administrator runs setup with their URI, naming the relay's user.
    code, out, err = dump_setup(capsys, "--source", admin_uri, "--relay-user", "relay_reader")
    assert code == 0, err
    comments = [line for line in out.splitlines() if line.startswith("--")]
    assert [c[:5] for c in comments] == ["-- 1.", "-- 2."]  # one block each, in order
    assert "relay_reader" in comments[1]
    made, _, granted = out.partition(comments[1])
    assert made.rstrip().endswith(";")  # each part is SQL to paste as it is
    grants = granted.strip().splitlines()
    assert all(g.startswith("GRANT") and g.endswith(";") for g in grants)
    assert grants and all('"relay_reader"' in g for g in grants)
    # GRANTs only after the block's comment: one block, not scattered hints.
    assert out.index("-- 2.") < out.index("GRANT")
    assert "--check" in err  # what to run next, as the relay's user

    # Before the block, the relay's user cannot write watermarks ...
    run_sql(postgres_server, dbname, "GRANT USAGE ON SCHEMA public TO relay_reader",
            "GRANT SELECT ON ALL TABLES IN SCHEMA public TO relay_reader")
    assert dump_setup(capsys, "--source", relay_uri, "--check")[0] != 0
    # ... after it (the SQL printed, as it is), it can.
    run_sql(postgres_server, dbname, *[g.rstrip(";") for g in grants])
    code, out, err = dump_setup(capsys, "--source", relay_uri, "--check")
    assert code == 0, err
    assert out.startswith("ok:")


# -- MariaDB: CREATE TABLE commits by itself, so nothing is tried, privileges are read --


def root_sql(server: MariaDBServer, *statements: str) -> list[Any]:
    conn = pymysql.connect(**server.root_connect_kwargs(), autocommit=True)
    rows: list[Any] = []
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
                rows = list(cur.fetchall())
    finally:
        conn.close()
    return rows


def test_assess_on_mariadb_reads_privileges_and_writes_nothing(
        mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    from databus.replicator._assess import assess, render
    from databus.replicator.targets import open_target

    src = SqliteSource(tmp_path / "shop.db",
                       "CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL)")
    src.install("orders")
    db = f"assess_probe_{next(_names)}"
    root_sql(mariadb_server, f"DROP DATABASE IF EXISTS `{db}`", f"CREATE DATABASE `{db}`",
             "CREATE USER IF NOT EXISTS 'assess_ro'@'%' IDENTIFIED BY 'ro-pw'",
             f"GRANT SELECT ON `{db}`.* TO 'assess_ro'@'%'")
    tables = f"SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{db}'"
    writer = mariadb_server.url(db)
    reader = f"mysql://assess_ro:ro-pw@{mariadb_server.host}:{mariadb_server.port}/{db}"

    async def main() -> list[str]:
        async with running_relay(relay_config(tmp_path, {"src": src.uri("orders")})) as r:
            texts = []
            for url in (writer, reader):
                config = ReplicateConfig(name="shop-copy", relays=(r.url,), target=url,
                                         tables=(ReplicatedTableConfig(source="shop.orders"),))
                texts.append(render(await assess(config, open_target(config.target))))
            return texts

    allowed, limited = asyncio.run(main())
    src.close()
    assert "target table will be created" in allowed and "warning" not in allowed, allowed
    assert "BLOCK" not in allowed
    # Not seen granted: said, as a warning (a role could grant it).
    assert "warning: could not confirm that assess_ro@% may CREATE and INSERT" in limited
    assert root_sql(mariadb_server, tables) == []  # nothing created


def test_dump_setup_on_mariadb_grants_the_relays_user(
        mariadb_server: MariaDBServer, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.integration.binlog_support import fresh_database, source_uri

    db = f"dump_setup_{next(_names)}"
    fresh_database(mariadb_server, db).run("CREATE TABLE orders (id INT PRIMARY KEY)")
    watermark = f"{db}.wm"
    admin_uri = source_uri(mariadb_server, f"{db}.orders", watermark_table=watermark)
    root_sql(mariadb_server, "CREATE USER IF NOT EXISTS 'relay_w'@'%' IDENTIFIED BY 'w-pw'",
             f"GRANT SELECT ON `{db}`.`orders` TO 'relay_w'@'%'")
    relay_uri = admin_uri.replace(
        f"{mariadb_server.user}:{mariadb_server.password}@", "relay_w:w-pw@", 1)
    code, out, err = dump_setup(capsys, "--source", admin_uri, "--relay-user", "relay_w")
    assert code == 0, err
    comments = [line for line in out.splitlines() if line.startswith("--")]
    assert [c[:5] for c in comments] == ["-- 1.", "-- 2."]
    grants = out.partition(comments[1])[2].strip().splitlines()
    assert grants == [f"GRANT SELECT, INSERT, DELETE ON `{db}`.`wm` TO 'relay_w'@'%';"]
    assert dump_setup(capsys, "--source", relay_uri, "--check")[0] != 0
    root_sql(mariadb_server, grants[0].rstrip(";"))
    code, out, err = dump_setup(capsys, "--source", relay_uri, "--check")
    assert code == 0, err
