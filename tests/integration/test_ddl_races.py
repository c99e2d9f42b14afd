"""Schema setup raced by several processes on a fresh database (issue 27 item 7).

``CREATE ... IF NOT EXISTS`` on PostgreSQL lets two concurrent creators both find
nothing; the second to commit dies on a duplicate catalog row. Every component that sets
up its own schema takes one named lock first (``databus/_ddl.py``). Each test starts
``RACERS`` setups at the same instant (a barrier; psycopg2 and PyMySQL release the GIL
while they wait on the server) on a fresh schema, ``ROUNDS`` times, and asserts that all
of them start. Without the lock, the bootstrap store fails in most rounds.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg2
import pymysql
import pytest

from databus._ddl import ddl_lock_key, serialized_ddl
from databus.bootstrap._postgres import PostgresStorage
from databus.cli import main as databus_main
from databus.client import PostgresCheckpointStore
from databus.replicator.targets import open_target
from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.tiers import count

pytestmark = pytest.mark.integration

RACERS = 8
ROUNDS = count("DATABUS_DDL_RACE_ROUNDS", smoke=3, full=30)


def race(setup: Callable[[int], Any], racers: int = RACERS) -> list[Any]:
    """``setup(i)`` on ``racers`` threads released together; their results, or the
    first error raised."""
    barrier = threading.Barrier(racers)
    results: list[Any] = [None] * racers
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = setup(i)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a racer never finished"
    if errors:
        raise AssertionError(f"{len(errors)} of {racers} setups failed: {errors[0]!r}")
    return results


def _pg_run(pg: PostgresServer, sql: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(pg.dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


def test_bootstrap_stores_started_together_all_start(postgres_server: PostgresServer) -> None:
    for _ in range(ROUNDS):
        schema = "race_" + uuid.uuid4().hex[:10]
        url = f"{postgres_server.url()}?schema={schema}"
        stores: list[PostgresStorage] = []
        lock = threading.Lock()

        def start(i: int, url: str = url, stores: list[PostgresStorage] = stores,
                  lock: threading.Lock = lock) -> dict[str, int]:
            storage = PostgresStorage(url)
            with lock:
                stores.append(storage)
            # Every service registers the same sources when it starts.
            return storage.ensure_sources(["shop.orders", "shop.customers"])

        try:
            ids = race(start)
            assert all(found == ids[0] for found in ids), ids
            assert sorted(ids[0].values()) == [1, 2]
        finally:
            for storage in stores:
                storage.close()
            _pg_run(postgres_server, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_checkpoint_stores_started_together_all_start(
        postgres_server: PostgresServer) -> None:
    for _ in range(ROUNDS):
        table = "race_cp_" + uuid.uuid4().hex[:10]
        stores: list[PostgresCheckpointStore] = []
        lock = threading.Lock()

        def start(i: int, table: str = table, stores: list[PostgresCheckpointStore] = stores,
                  lock: threading.Lock = lock) -> None:
            store = PostgresCheckpointStore(postgres_server.dsn, f"consumer-{i}", table=table)
            with lock:
                stores.append(store)
            store.load()

        try:
            race(start)
        finally:
            for store in stores:
                store.close()
            _pg_run(postgres_server, f"DROP TABLE IF EXISTS {table}")


def test_replicators_started_together_all_start(postgres_server: PostgresServer,
                                                 mariadb_server: MariaDBServer) -> None:
    """Replication targets on a fresh schema: the schema and the state table."""
    for _ in range(ROUNDS):
        schema = "race_rt_" + uuid.uuid4().hex[:10]
        url = f"{postgres_server.url()}?schema={schema}"
        targets: list[Any] = []
        lock = threading.Lock()

        def start(i: int, url: str = url, targets: list[Any] = targets,
                  lock: threading.Lock = lock) -> None:
            target = open_target(url)
            with lock:
                targets.append(target)
            target.ensure_state()

        try:
            race(start)
        finally:
            for target in targets:
                target.close()
            _pg_run(postgres_server, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_replicators_on_mariadb_started_together_all_start(
        mariadb_server: MariaDBServer) -> None:
    for _ in range(max(2, ROUNDS // 2)):
        database = "race_rt_" + uuid.uuid4().hex[:10]
        admin = pymysql.connect(**mariadb_server.connect_kwargs(database=None))
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {database}")
        targets: list[Any] = []
        lock = threading.Lock()

        def start(i: int, url: str = mariadb_server.url(database),
                  targets: list[Any] = targets, lock: threading.Lock = lock) -> None:
            target = open_target(url)
            with lock:
                targets.append(target)
            target.ensure_state()

        try:
            race(start)
        finally:
            for target in targets:
                target.close()
            with admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {database}")
            admin.close()


def test_txlog_installs_together_all_succeed(postgres_server: PostgresServer) -> None:
    """``databus txlog install`` twice at once on one table (TxLog tables, functions,
    triggers: CREATE OR REPLACE collides too)."""
    dbname = "race_txlog"
    admin = psycopg2.connect(**postgres_server.connect_kwargs("postgres"))
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{dbname}"')
    admin.close()
    uri = (postgres_server.url(dbname).replace("postgresql://", "postgresql+txlog://", 1)
           + "?tables=orders")
    for _ in range(max(2, ROUNDS // 2)):
        conn = psycopg2.connect(**postgres_server.connect_kwargs(dbname))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;"
                        "CREATE TABLE orders (id int PRIMARY KEY, tag text)")
        conn.close()
        codes = race(lambda i: databus_main(["txlog", "install", "--source", uri]), racers=4)
        assert codes == [0] * 4


def test_serialized_ddl_postgres_in_a_transaction_and_autocommit(
        postgres_server: PostgresServer) -> None:
    """The helper itself: a schema created by racers in transactions and in autocommit."""
    for autocommit in (False, True):
        for _ in range(ROUNDS):
            schema = "race_h_" + uuid.uuid4().hex[:10]

            def create(i: int, schema: str = schema, autocommit: bool = autocommit) -> None:
                conn = psycopg2.connect(postgres_server.dsn)
                conn.autocommit = autocommit
                try:
                    with conn.cursor() as cur, serialized_ddl(cur, "postgresql", schema):
                        cur.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
                        cur.execute(f"CREATE TABLE IF NOT EXISTS {schema}.t (id int)")
                    conn.commit()
                finally:
                    conn.close()

            try:
                race(create)
            finally:
                _pg_run(postgres_server, f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        # Nothing is left holding the lock.
        held = _pg_run(postgres_server,
                       "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        assert held == [(0,)]


def test_serialized_ddl_mariadb(mariadb_server: MariaDBServer) -> None:
    for _ in range(max(2, ROUNDS // 2)):
        db = "race_" + uuid.uuid4().hex[:10]

        def create(i: int, db: str = db) -> None:
            conn = pymysql.connect(**mariadb_server.connect_kwargs())
            try:
                with conn.cursor() as cur, serialized_ddl(cur, "mysql", db):
                    cur.execute(f"CREATE DATABASE IF NOT EXISTS {db}")
                    cur.execute(f"CREATE TABLE IF NOT EXISTS {db}.t (id int PRIMARY KEY)")
            finally:
                conn.close()

        try:
            race(create)
        finally:
            conn = pymysql.connect(**mariadb_server.connect_kwargs())
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {db}")
            conn.close()


def test_lock_keys_are_stable_and_distinct() -> None:
    assert ddl_lock_key("bootstrap:databus") == ddl_lock_key("bootstrap:databus")
    assert ddl_lock_key("bootstrap:a") != ddl_lock_key("bootstrap:b")
    assert -(1 << 63) <= ddl_lock_key("x") < (1 << 63)
