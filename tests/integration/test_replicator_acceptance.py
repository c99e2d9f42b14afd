"""The replicator's acceptance run (issue 19): MariaDB to PostgreSQL and MariaDB to
MariaDB.

A Sakila-shaped database (tests/integration/sakila_support.py) gets its rows while the
replicator runs, then a random workload over every table for
``DATABUS_REPLICATE_ACCEPTANCE_SECONDS`` (8 in ``make test``, the issue's 60 in
``make test-full``), and
the replicator is killed with SIGKILL three times (once during the load, twice during
the workload) and started again each time. At the end:

- every target table equals its source table, row by row, compared through
  ``databus.replicator.normalize`` (the documented normalisation of types; the source
  is read with pymysql in a UTC session, which reads values as a MySQL target does);
- the SCN the target recorded equals the SCN of the last source transaction, found in
  the server's own binlog (the end of the transaction whose GTID the session reports),
  not taken from the relay.

And the initial copy through a relay dump (``initial_copy = "dump"``): the rows that
existed before the relay started reach PostgreSQL through the dump while a writer
changes them, with a kill -9 of the replicator in the middle of the dump.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import pymysql
import pytest

from databus.fetchers.mysql import BinlogSourceConfig, make_scn
from databus.fetchers.mysql._dump import setup_statements
from databus.fetchers.mysql._scn import binlog_file_number
from databus.replicator import normalize
from tests import waiting
from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.integration.binlog_support import Sql, fresh_database, source_uri
from tests.integration.sakila_support import (
    FEATURES,
    RATINGS,
    SAKILA_SCHEMA,
    SAKILA_TABLES,
    load_sakila_rows,
    load_sakila_shape,
)
from tests.relay_harness import RelayProcess
from tests.tiers import size

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

NAME = "sakila-copy"
SECONDS = size("DATABUS_REPLICATE_ACCEPTANCE_SECONDS", smoke=8, full=60)
NAMES = ["Ñúñez", "O''Brien", "李", "Smith", "emoji 🎬"]  # SQL text: '' is one quote
PICTURES = ["NULL", "x'00ff'", "x''"]


# -- the targets ---------------------------------------------------------------------------


@dataclass
class Target:
    dialect: str  # as databus.replicator._types names it
    url: str
    query: Callable[[str], list[tuple[Any, ...]]]
    qualifier: str  # a quoted schema or database, with its dot

    def rows(self, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
        quote = '"' if self.dialect == "postgresql" else "`"
        cols = ", ".join(f"{quote}{c}{quote}" for c in columns)
        return self.query(f"SELECT {cols} FROM {self.qualifier}{quote}{table}{quote}")

    def scn(self) -> int | None:
        try:
            rows = self.query(f"SELECT scn FROM {self.qualifier}databus_replication_state "
                              f"WHERE replication = '{NAME}'")
        except (psycopg2.Error, pymysql.MySQLError):
            return None  # not created yet
        return int(rows[0][0]) if rows else None


def _pg_target(pg: PostgresServer) -> Iterator[Target]:
    schema = "racc_" + uuid.uuid4().hex[:10]

    def query(sql: str) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(pg.dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    query(f'CREATE SCHEMA "{schema}"')
    try:
        yield Target("postgresql", f"{pg.url()}?schema={schema}", query, f'"{schema}".')
    finally:
        query(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _mariadb_target(db: MariaDBServer) -> Iterator[Target]:
    database = "racc_copy_" + uuid.uuid4().hex[:10]

    def query(sql: str) -> list[tuple[Any, ...]]:
        conn = pymysql.connect(**db.connect_kwargs(database=None))
        try:
            with conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            conn.close()

    query(f"CREATE DATABASE `{database}`")
    try:
        yield Target("mysql", db.url(database), query, f"`{database}`.")
    finally:
        query(f"DROP DATABASE IF EXISTS `{database}`")


@pytest.fixture(params=["postgresql", "mariadb"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    if request.param == "postgresql":
        yield from _pg_target(request.getfixturevalue("postgres_server"))
    else:
        yield from _mariadb_target(request.getfixturevalue("mariadb_server"))


# -- the workload ----------------------------------------------------------------------


class RandomWriter(threading.Thread):
    """Random transactions over every Sakila table, one to four changes each, until
    stopped; foreign keys respected, so every transaction commits."""

    def __init__(self, server: MariaDBServer, db: str, seed: int) -> None:
        super().__init__(daemon=True, name="sakila-writer")
        self.sql = Sql(server, db)
        self.rng = random.Random(seed)
        self.halt = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def _pick(self, table: str, column: str) -> int:
        """An id that exists now (0 when the table is empty): ids move on as rows
        come and go, and a long run must keep changing rows, not missing them."""
        rows = self.sql.query(f"SELECT {column} FROM {table} ORDER BY RAND() LIMIT 1")
        return int(rows[0][0]) if rows else 0

    def _one(self, n: int) -> list[str]:
        rng = self.rng
        film = self._pick("film", "film_id")
        actor = self._pick("actor", "actor_id")
        kind = rng.randrange(9)
        if kind == 0:
            features = ",".join(f for f in FEATURES if rng.random() < 0.5)
            length = "NULL" if rng.random() < 0.2 else str(rng.randint(1, 65535))
            return [f"UPDATE film SET description = 'changed {n} {'é' * rng.randint(0, 3)}', "
                    f"rating = '{rng.choice(RATINGS)}', special_features = '{features}', "
                    f"rental_rate = {rng.randint(0, 9999) / 100}, length = {length} "
                    f"WHERE film_id = {film}"]
        if kind == 1:  # a film and its cast go (the trigger deletes its film_text)
            return [f"DELETE FROM film_actor WHERE film_id = {film}",
                    f"DELETE FROM film WHERE film_id = {film}"]
        if kind == 2:
            return ["INSERT INTO film (title, language_id, release_year, special_features) "
                    f"VALUES ('NEW {n}', {rng.randint(1, 6)}, {rng.choice([1901, 2155, 2000])}, "
                    "'Commentaries,Behind the Scenes')"]
        if kind == 3:
            return [f"INSERT IGNORE INTO film_actor (actor_id, film_id) SELECT actor_id, "
                    f"{film} FROM actor WHERE actor_id = {actor} AND EXISTS (SELECT 1 FROM "
                    f"film WHERE film_id = {film})"]
        if kind == 4:
            return [f"UPDATE actor SET first_name = 'F{n}', last_name = "
                    f"'{rng.choice(NAMES)}' "
                    f"WHERE actor_id = {actor}"]
        if kind == 5 and rng.random() < 0.5:
            return [f"DELETE FROM film_actor WHERE actor_id = {actor}",
                    f"DELETE FROM actor WHERE actor_id = {actor}"]
        if kind == 5:  # as many actors come as go: no table drains in a long run
            return [f"INSERT INTO actor (first_name, last_name) VALUES ('NEW{n}', "
                    f"'{rng.choice(NAMES)}')"]
        if kind == 6:
            x, y = rng.uniform(-90, 90), rng.uniform(-180, 180)
            return ["INSERT INTO address (address, district, postal_code, phone, location) "
                    f"VALUES ('{n} Side St', 'D{n % 7}', NULL, '555{n % 10000:04d}', "
                    f"ST_GeomFromText('POINT({x:.6f} {y:.6f})'))"]
        if kind == 7:
            last = "NULL" if rng.random() < 0.3 else "CURRENT_TIMESTAMP"
            return [f"UPDATE payment SET amount = {rng.randint(0, 99999) / 100}, "
                    f"payment_date = '20{rng.randint(0, 38):02d}-0{rng.randint(1, 9)}-"
                    f"{rng.randint(10, 28)} 12:{rng.randint(10, 59)}:00', last_update = {last} "
                    f"WHERE payment_id = {rng.randint(1, 1500)}"]
        return [f"UPDATE staff SET picture = {rng.choice(PICTURES)}, "
                f"active = {rng.randint(0, 1)} WHERE staff_id = {rng.randint(1, 2)}"]

    def run(self) -> None:
        n = 0
        try:
            while not self.halt.is_set():
                statements: list[str] = []
                for _ in range(self.rng.randint(1, 4)):
                    n += 1
                    statements += self._one(n)
                self.sql.txn(*statements)
                self.transactions += 1
                time.sleep(self.rng.uniform(0.001, 0.008))
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        assert self.error is None, self.error
        self.sql.close()


def last_transaction_scn(sql: Sql, statement: str) -> int:
    """Run ``statement`` as one transaction; its SCN, read from the binlog itself: the end
    of the Xid event after the Gtid event of the GTID the session reports."""
    file, pos = sql.query("SHOW MASTER STATUS")[0][:2]
    sql.txn(statement)
    gtid = str(sql.query("SELECT @@last_gtid")[0][0])
    files = [str(r[0]) for r in sql.query("SHOW BINARY LOGS")]
    for name in files[files.index(str(file)):]:
        start = int(pos) if name == file else 4
        seen = False
        for row in sql.query(f"SHOW BINLOG EVENTS IN '{name}' FROM {start}"):
            event_type, end, info = str(row[2]), int(row[4]), str(row[5])
            if event_type == "Gtid" and info.endswith(f"GTID {gtid}"):
                seen = True
            elif seen and event_type == "Xid":
                return make_scn(binlog_file_number(name), end)
    raise AssertionError(f"GTID {gtid} not found in the binlog")


# -- the replicator process ---------------------------------------------------------------


class Replicator:
    """``databus replicate --config FILE`` as a child process."""

    def __init__(self, tmp_path: Path, relay_url: str, target_url: str,
                 sources: list[str], *extra: str) -> None:
        self.config_path = tmp_path / "replicate.toml"
        self.config_path.write_text("\n".join([
            "[replicate]", f'name = "{NAME}"', f'relays = ["{relay_url}"]',
            f'target = "{target_url}"', "batch_rows = 500", "batch_ms = 100",
            "retry_initial_s = 0.2", "retry_max_s = 1.0", *extra,
            *[f'[[replicate.tables]]\nsource = "{s}"' for s in sources]]) + "\n")
        self.log_path = tmp_path / "replicate.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("databus")), "replicate",
                 "--config", str(self.config_path)],
                stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.log()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=20)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)


def wait_until(check: Callable[[], bool], what: str, repl: Replicator,
               timeout: float = 120) -> None:
    """:func:`tests.waiting.wait_until` that fails at once if the replicator exits; its
    log in the message either way."""

    def done() -> bool:
        if check():
            return True
        assert repl.proc is not None
        if repl.proc.poll() is not None:
            raise AssertionError(f"{what}: the replicator exited\n{repl.log()}")
        return False

    waiting.wait_until(done, what, timeout, diagnose=lambda: repl.log()[-4000:])


def relay_schemas(relay: RelayProcess, source: str) -> dict[str, Any]:
    query = urllib.parse.urlencode({"source": source})
    with urllib.request.urlopen(f"{relay.url}/v1/schemas?{query}", timeout=5) as resp:
        doc = json.loads(resp.read())
    schema: dict[str, Any] = doc["versions"][-1]["schema"]
    return schema


# -- the run ---------------------------------------------------------------------------


def test_sakila_loaded_and_changed_while_replicating_with_three_kill_9s(
        mariadb_server: MariaDBServer, target: Target, tmp_path: Path) -> None:
    db = "racc_" + uuid.uuid4().hex[:8]
    sql = fresh_database(mariadb_server, db)
    sql.run(*SAKILA_SCHEMA)  # the tables, empty: the replicator creates its own
    sources = [f"{db}.{t}" for t in SAKILA_TABLES]
    relay = RelayProcess(tmp_path, {"src": source_uri(mariadb_server, f"{db}.*")},
                         capacity_mb=64, workers=1)
    relay.start()
    repl = Replicator(tmp_path, relay.url, target.url, sources)
    rng = random.Random(19)
    try:
        repl.start()
        wait_until(lambda: target.scn() is not None or _has_tables(target),
                   "the replicator ready", repl)

        # The sample's rows, with a kill in the middle of them.
        loader_error: list[BaseException] = []

        def load() -> None:
            loader = Sql(mariadb_server, db)
            try:
                load_sakila_rows(loader)
            except BaseException as exc:
                loader_error.append(exc)
            finally:
                loader.close()

        loading = threading.Thread(target=load, daemon=True)
        loading.start()
        time.sleep(rng.uniform(0.05, 0.3))
        repl.kill()
        repl.start()
        loading.join(60)
        assert not loading.is_alive() and not loader_error, loader_error

        writer = RandomWriter(mariadb_server, db, seed=19)
        writer.start()
        started = time.monotonic()
        try:
            for at in (0.3, 0.7):  # two more kills, at random moments of the workload
                at += rng.uniform(-0.1, 0.1)
                time.sleep(max(0.0, started + SECONDS * at - time.monotonic()))
                repl.kill()
                time.sleep(rng.uniform(0, 1))
                repl.start()
            time.sleep(max(0.0, started + SECONDS - time.monotonic()))
        finally:
            writer.stop()
        assert writer.transactions > 100

        last = last_transaction_scn(sql, "UPDATE language SET name = 'Last' "
                                         "WHERE language_id = 1")
        wait_until(lambda: (target.scn() or -1) >= last,
                   f"the target at the last source transaction's SCN {last}", repl)
        assert target.scn() == last
        assert repl.starts == 4

        for table, source in zip(SAKILA_TABLES, sources, strict=True):
            _assert_table_equal(sql, target, table, relay_schemas(relay, source))
        assert repl.stop() == 0, repl.log()
    finally:
        repl.cleanup()
        relay.kill()
        sql.close()


def test_rows_that_existed_before_come_through_a_relay_dump(
        mariadb_server: MariaDBServer, postgres_server: PostgresServer, tmp_path: Path) -> None:
    db = "rdump_" + uuid.uuid4().hex[:8]
    sql = fresh_database(mariadb_server, db)
    uri = source_uri(mariadb_server, f"{db}.*", watermark_table=f"{db}.databus_watermark")
    sql.run(*setup_statements(BinlogSourceConfig.from_uri(uri)))
    load_sakila_shape(sql)  # before the relay: only a dump can bring these rows
    for _ in range(4):  # payments enough for a dump of many chunks, killed in the middle
        sql.run("INSERT INTO payment (staff_id, amount, payment_date) SELECT staff_id, "
                "amount + 1, payment_date FROM payment LIMIT 5000")
    sources = [f"{db}.{t}" for t in SAKILA_TABLES]
    relay = RelayProcess(tmp_path, {"src": uri}, capacity_mb=64, workers=1,
                         admin_token="dump-secret")
    relay.start()
    target_schema = _pg_target(postgres_server)
    target = next(target_schema)  # its schema goes when the generator is closed
    repl = Replicator(tmp_path, relay.url, target.url, sources, 'initial_copy = "dump"',
                      'relay_admin_token = "dump-secret"')
    writer = RandomWriter(mariadb_server, db, seed=7)
    try:
        _wait_relay_running(relay)
        writer.start()
        repl.start()
        wait_until(lambda: (target.scn() or -1) > 0, "a first batch", repl)
        during = _relay_json(relay, "/v1/dumps")["dumps"][0]["state"]
        repl.kill()  # the dump is under way: the next start resumes, asks no new dump
        repl.start()
        time.sleep(min(SECONDS / 3, 10))
        writer.stop()
        dumps = _relay_json(relay, "/v1/dumps")["dumps"]
        assert len(dumps) == 1  # the restart asked for no second dump
        assert sorted(t["source"] for t in dumps[0]["tables"]) == sorted(sources)
        wait_until(lambda: _relay_json(relay, f"/v1/dumps/{dumps[0]['id']}")["state"]
                   == "done", "the dump done", repl)
        print(f"the dump was {during} at the kill")
        last = last_transaction_scn(sql, "UPDATE language SET name = 'Last' "
                                         "WHERE language_id = 2")
        wait_until(lambda: (target.scn() or -1) >= last, f"the target at SCN {last}", repl)
        for table, source in zip(SAKILA_TABLES, sources, strict=True):
            _assert_table_equal(sql, target, table, relay_schemas(relay, source))
        assert repl.stop() == 0, repl.log()
    finally:
        if writer.is_alive():
            writer.halt.set()
        repl.cleanup()
        relay.kill()
        sql.close()
        target_schema.close()


def _relay_json(relay: RelayProcess, path: str) -> Any:
    with urllib.request.urlopen(relay.url + path, timeout=5) as resp:
        return json.loads(resp.read())


def _wait_relay_running(relay: RelayProcess) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            fetcher = relay.status()["buffers"]["src"]["fetcher"]
            if fetcher["state"] == "running" and fetcher["source_scn"] is not None:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the relay's fetcher did not start"
        time.sleep(0.1)


def _has_tables(target: Target) -> bool:
    try:
        target.rows("language", ["language_id"])
    except (psycopg2.Error, pymysql.MySQLError):
        return False
    return True


def _assert_table_equal(sql: Sql, target: Target, table: str, schema: dict[str, Any]) -> None:
    fields = schema["fields"]
    columns = [f["name"] for f in fields]
    key = set(schema.get("key") or [])
    assert key, f"{table}: the schema names no key"

    def canonical(rows: list[tuple[Any, ...]], dialect: str) -> dict[Any, tuple[Any, ...]]:
        out: dict[Any, tuple[Any, ...]] = {}
        for row in rows:
            values = tuple(normalize(v, f["type"], dialect=dialect, key=f["name"] in key,
                                     sql_type=f.get("sql_type"))
                           for v, f in zip(row, fields, strict=True))
            out[tuple(v for v, f in zip(values, fields, strict=True)
                      if f["name"] in key)] = values
        return out

    sql.run("SET time_zone = '+00:00'")  # TIMESTAMP read as UTC, as the target holds it
    cols = ", ".join(f"`{c}`" for c in columns)
    want = canonical(sql.query(f"SELECT {cols} FROM `{table}`"), "mysql")
    got = canonical(target.rows(table, columns), target.dialect)
    missing = sorted(set(want) - set(got))[:5]
    extra = sorted(set(got) - set(want))[:5]
    assert not missing and not extra, f"{table}: missing keys {missing}, extra keys {extra}"
    differ = [(k, want[k], got[k]) for k in want if want[k] != got[k]][:3]
    assert not differ, f"{table}: rows differ: {differ}"
    assert want, f"{table} is empty"
