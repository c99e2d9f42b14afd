"""Issue 28's acceptance, on MariaDB and on PostgreSQL, through a ``databus relay``
process and one ``DatabusClient`` per table: four tables under a writer; one is broken
mid-run (MariaDB: an UPDATE logged as a statement; PostgreSQL: a value its schema
refuses, NaN in a numeric(10,2) column). The other three consumers' copies equal their
tables before and while it is quarantined; ``/readyz`` answers 503 and ``/v1/status``
shows the quarantine; once the cause is fixed, ``databus relay heal`` takes it out and
every consumer's copy equals its table.

Sizes: ``DATABUS_QUARANTINE_ACCEPTANCE_TXNS`` transactions per phase (150 in ``make
test``, 5,000 in ``make test-full``) over ``DATABUS_QUARANTINE_ACCEPTANCE_KEYS`` keys.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from databus.cli import main as databus_main
from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.integration.binlog_support import Sql, fresh_database, source_uri
from tests.integration.pg_logical_support import PgDatabase, scratch_database
from tests.integration.quarantine_acceptance_support import (
    TABLES,
    TOKEN,
    Rows,
    heal,
    http,
    quarantined,
    replicas,
    wait_equal,
    writing,
)
from tests.relay_harness import RelayProcess
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

BUFFER = "src"


@contextlib.contextmanager
def relay_on(tmp_path: Path, uri: str) -> Iterator[RelayProcess]:
    relay = RelayProcess(tmp_path, {BUFFER: uri}, capacity_mb=32, workers=1,
                         admin_token=TOKEN)
    relay.start()
    try:
        wait_until(lambda: relay.status()["buffers"][BUFFER]["fetcher"]["state"] == "running",
                   "the fetcher running", 30, ignore=(OSError,))
        yield relay
    finally:
        if relay.proc is not None and relay.proc.poll() is None:
            relay.kill()


def scenario(relay: RelayProcess, sources: list[str], read: Callable[[str], Rows],
             execute: Callable[[list[str]], None], upsert: Callable[[str, int, int], str],
             break_it: Callable[[], None], fix_it: Callable[[], None],
             check_failure: Callable[[dict[str, Any]], None]) -> None:
    """The acceptance run, the same on both servers; ``sources[3]`` is broken."""
    broken = sources[3]
    with replicas(relay.url, sources) as copies:
        with writing(execute, upsert, seed=1):
            pass
        for source in sources:  # before: every copy equals its table
            wait_equal(copies[source], lambda s=source: read(s), f"{source} before")
        with writing(execute, upsert, seed=2):
            break_it()
            [q] = wait_until(lambda: quarantined(relay.url, BUFFER), "the quarantine", 30)
            assert q["source"] == broken, q
            copies[broken].quarantine_scn = q["scn"]
            check_failure(q)
            assert q["fix"].endswith(f"databus relay heal --relay URL --source {broken}"), q
            code, doc = http(relay.url + "/readyz")
            assert code == 503, doc
            assert relay.status()["buffers"][BUFFER]["fetcher"]["state"] == "running"
        # While it is quarantined, the other three copies equal their tables.
        for source in sources[:3]:
            wait_equal(copies[source], lambda s=source: read(s), f"{source} quarantined")
        fix_it()
        assert heal(relay.url, broken) == 0
        with writing(execute, upsert, seed=3):
            pass
        # After the heal: every copy, the healed one's too, equals its table.
        for source in sources:
            wait_equal(copies[source], lambda s=source: read(s), f"{source} after heal")
        assert copies[broken].dumps >= 1
        assert quarantined(relay.url, BUFFER) == []
        assert http(relay.url + "/readyz")[0] == 200


# -- MariaDB ---------------------------------------------------------------------------



def in_one_transaction(conn: Any, statements: list[str]) -> None:
    """``statements`` as one transaction on a DB-API connection (PyMySQL or psycopg2)."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        for statement in statements:
            cur.execute(statement)
        cur.execute("COMMIT")

def test_mariadb_a_statement_format_update_quarantines_one_of_four_tables(
        mariadb_server: MariaDBServer, tmp_path: Path) -> None:
    db = "qacc"
    sql = fresh_database(mariadb_server, db)
    for table in TABLES:
        sql.run(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT NOT NULL, "
                "price DECIMAL(10,2))")
    uri = source_uri(mariadb_server, f"{db}.*")
    assert databus_main(["dump", "setup", "--source", uri]) == 0
    writer = pymysql.connect(**mariadb_server.connect_kwargs(database=db))
    reader = Sql(mariadb_server, db)

    execute = functools.partial(in_one_transaction, writer)

    def upsert(table: str, key: int, v: int) -> str:
        return (f"INSERT INTO {table} VALUES ({key}, {v}, {v}.25) "
                "ON DUPLICATE KEY UPDATE v = VALUES(v), price = VALUES(price)")

    def read(source: str) -> Rows:
        reader.conn.commit()  # a fresh snapshot
        return {int(i): (int(v), p) for i, v, p in reader.query(
            f"SELECT id, v, price FROM {source.split('.')[1]}")}

    def break_it() -> None:
        session = Sql(mariadb_server, db)
        session.run("SET SESSION binlog_format = 'STATEMENT'", "UPDATE t4 SET v = v + 1000")
        session.close()

    def check_failure(q: dict[str, Any]) -> None:
        assert "was logged as a statement" in q["reason"], q

    try:
        with relay_on(tmp_path, uri) as relay:
            scenario(relay, [f"{db}.{t}" for t in TABLES], read, execute, upsert, break_it,
                     lambda: None,  # the session that wrote statements is gone
                     check_failure)
    finally:
        writer.close()
        reader.close()
        sql.close()


# -- PostgreSQL --------------------------------------------------------------------------


@pytest.fixture
def pg(postgres_server: PostgresServer) -> Iterator[PgDatabase]:
    with scratch_database(postgres_server) as database:
        yield database


def test_postgres_a_value_its_schema_refuses_quarantines_one_of_four_tables(
        pg: PgDatabase, tmp_path: Path) -> None:
    for table in TABLES:
        pg.run(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, "
               "price numeric(10,2))")
    tables = ",".join(f"public.{t}" for t in TABLES)
    pg.setup(tables)
    uri = pg.uri(tables)
    assert databus_main(["dump", "setup", "--source", uri]) == 0
    writer = pg.connect()

    execute = functools.partial(in_one_transaction, writer)

    def upsert(table: str, key: int, v: int) -> str:
        return (f"INSERT INTO {table} VALUES ({key}, {v}, {v}.25) ON CONFLICT (id) DO "
                "UPDATE SET v = excluded.v, price = excluded.price")

    def read(source: str) -> Rows:
        return {int(i): (int(v), p) for i, v, p in pg.rows(
            f"SELECT id, v, price FROM {source}")}

    def break_it() -> None:
        pg.txn("INSERT INTO t4 VALUES (100000, 1, 'NaN')")

    def fix_it() -> None:
        pg.txn("UPDATE t4 SET price = 0 WHERE price = 'NaN'")

    def check_failure(q: dict[str, Any]) -> None:
        assert q["reason"] == ("a value of column 'price' (numeric(10,2)) cannot be held "
                               "by its schema"), q

    try:
        with relay_on(tmp_path, uri) as relay:
            scenario(relay, [f"public.{t}" for t in TABLES], read, execute, upsert,
                     break_it, fix_it, check_failure)
    finally:
        writer.close()
