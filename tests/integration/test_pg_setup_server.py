"""``databus pg setup|teardown`` against the real PostgreSQL 15 of the session
(``wal_level=logical``): publication and slot created once, checks that stop setup
before it changes anything, ``--replica-identity-full``, teardown, ``--dry-run``, a role
without REPLICATION and a wrong password.

Each test gets a database of its own (the heartbeat and watermark tables live in its
``public``) and a slot and publication named after it; slots are cluster-wide and pin
WAL, so every one is dropped afterwards. ``wal_level`` cannot be changed on the shared
server: its ``replica`` verdict is a unit test (tests/unit/test_pg_setup.py).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras
import pytest

from databus.cli import main
from tests.fixtures.servers import PostgresServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


class Db:
    """A fresh database; ``name`` is also its slot's and publication's name."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.name = f"pgsetup_{uuid.uuid4().hex[:10]}"
        self.roles: list[str] = []
        admin = self.admin()
        try:
            with admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE {self.name}")
        finally:
            admin.close()
        self.conn = self.connect()

    def admin(self) -> psycopg2.extensions.connection:
        conn: psycopg2.extensions.connection = psycopg2.connect(
            **self.server.connect_kwargs("postgres"))
        conn.autocommit = True
        return conn

    def connect(self, **kwargs: Any) -> Any:
        conn = psycopg2.connect(**{**self.server.connect_kwargs(self.name), **kwargs})
        if "connection_factory" not in kwargs:
            conn.autocommit = True
        return conn

    def uri(self, tables: str, user: str = "postgres", password: str | None = None,
            **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"tables": tables, "slot": self.name,
                                                  "publication": self.name,
                                                  **params}.items())
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql://{auth}@{self.server.host}:{self.server.port}/{self.name}?{query}"

    def run(self, *statements: str) -> None:
        with self.conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def role(self, name: str, *options: str) -> str:
        role = f"{self.name}_{name}"
        self.roles.append(role)
        self.run(f"CREATE ROLE {role} LOGIN {' '.join(options)}")
        return role

    # -- what the server has -------------------------------------------------------

    def slot(self) -> tuple[Any, ...] | None:
        rows = self.query("SELECT plugin, database, active_pid FROM pg_replication_slots "
                          "WHERE slot_name = %s", self.name)
        return rows[0] if rows else None

    def publication(self) -> tuple[Any, ...] | None:
        rows = self.query("SELECT pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot "
                          "FROM pg_publication WHERE pubname = %s", self.name)
        return rows[0] if rows else None

    def published(self) -> set[str]:
        return {f"{s}.{t}" for s, t in self.query(
            "SELECT n.nspname, c.relname FROM pg_publication_rel pr JOIN pg_publication p "
            "ON p.oid = pr.prpubid JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace "
            "n ON n.oid = c.relnamespace WHERE p.pubname = %s", self.name)}

    def replica_identity(self, table: str) -> str:
        return str(self.query("SELECT relreplident FROM pg_class WHERE oid = %s::regclass",
                              table)[0][0])

    def nothing_created(self) -> bool:
        return self.slot() is None and self.publication() is None

    def close(self) -> None:
        self.conn.close()
        admin = self.admin()
        try:
            with admin.cursor() as cur:
                deadline = time.monotonic() + 10
                while True:  # a slot is dropped once no walsender holds it
                    cur.execute("SELECT slot_name, active_pid FROM pg_replication_slots "
                                "WHERE database = %s", (self.name,))
                    rows = cur.fetchall()
                    if not rows:
                        break
                    for slot, pid in rows:
                        if pid is not None:
                            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        else:
                            with contextlib.suppress(psycopg2.Error):  # just taken
                                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    if time.monotonic() > deadline:
                        raise AssertionError(f"slots of {self.name} left behind: {rows}")
                    time.sleep(0.1)
                cur.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
                for role in self.roles:
                    cur.execute(f"DROP ROLE IF EXISTS {role}")
        finally:
            admin.close()


@pytest.fixture
def db(postgres_server: PostgresServer) -> Iterator[Db]:
    database = Db(postgres_server)
    try:
        yield database
    finally:
        database.close()


def pg(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["pg", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def pg_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = pg(capsys, *args, "--json")
    return code, json.loads(out)


SHOP = [
    "CREATE SCHEMA shop",
    "CREATE TABLE shop.orders (id int PRIMARY KEY, qty int NOT NULL)",
    "CREATE TABLE shop.notes (id int PRIMARY KEY, body text)",
]


def test_setup_creates_the_publication_and_slot_once(
        db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    db.run(*SHOP)
    uri = db.uri("shop.*")
    code, out, err = pg(capsys, "setup", "--source", uri)
    assert (code, err) == (0, "")
    assert f"CREATE PUBLICATION {db.name} FOR TABLE shop.notes, shop.orders WITH " \
           "(publish = 'insert, update, delete');" in out
    assert f"SELECT pg_create_logical_replication_slot('{db.name}', 'pgoutput');" in out
    assert out.splitlines()[-1] == "-- done: ran 2 statements (1 warning)"
    # The TOAST warning names the column and the fix, and does not fail setup.
    assert "shop.notes: TOASTable columns body (text): an UPDATE that leaves such a " \
           "column unchanged quarantines the table" in out
    assert "fix: ALTER TABLE shop.notes REPLICA IDENTITY FULL" in out

    assert db.slot() == ("pgoutput", db.name, None)
    assert db.publication() == (True, True, True, False, False)  # never TRUNCATE
    assert db.published() == {"shop.orders", "shop.notes"}

    # The slot streams the publication: Begin, Relation, Insert, Commit come out.
    db.run("INSERT INTO shop.orders VALUES (1, 5)")
    # (Decoding stops at the flushed WAL, and the server commits asynchronously.)
    wait_until(lambda: db.query(
        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s)", db.name, db.name)[0][0] >= 4,
        "four messages in the slot", 10)

    code, body = pg_json(capsys, "setup", "--source", uri)
    assert code == 0 and body["ok"]
    assert body["statements"] == [] and body["executed"] == []
    assert body["tables"] == ["shop.notes", "shop.orders"]
    code, out, _ = pg(capsys, "setup", "--source", uri)
    assert code == 0 and out.splitlines()[-1] == "-- nothing to do: already set up (1 warning)"


def test_a_new_table_joins_and_tables_someone_added_stay(
        db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    db.run(*SHOP, "CREATE TABLE public.theirs (id int PRIMARY KEY)")
    uri = db.uri("shop.*")
    assert pg(capsys, "setup", "--source", uri)[0] == 0
    db.run(f"ALTER PUBLICATION {db.name} ADD TABLE public.theirs",
           "CREATE TABLE shop.items (id int PRIMARY KEY)")
    code, body = pg_json(capsys, "setup", "--source", uri)
    assert code == 0
    assert body["executed"] == [f"ALTER PUBLICATION {db.name} ADD TABLE shop.items"]
    assert db.published() == {"shop.orders", "shop.notes", "shop.items", "public.theirs"}


def test_a_table_without_primary_key_is_reported_and_nothing_is_created(
        db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    db.run(*SHOP, "CREATE TABLE shop.log (at timestamptz, what int)")
    code, out, err = pg(capsys, "setup", "--source", db.uri("shop.orders,shop.log"))
    assert (code, err) == (1, "")
    assert "-- ERROR    replica_identity       shop.log: REPLICA IDENTITY DEFAULT and no " \
           "primary key: its deletes and updates cannot give their key" in out
    assert "fix: add a primary key (ALTER TABLE shop.log ADD PRIMARY KEY (...)), or ALTER " \
           "TABLE shop.log REPLICA IDENTITY FULL" in out
    assert out.splitlines()[-1].startswith("-- 1 check failed: nothing was changed")
    # The statements are shown, commented out, and were not run.
    assert f"-- CREATE PUBLICATION {db.name} FOR TABLE shop.orders, shop.log" in out
    assert db.nothing_created()
    # A missing table and NOTHING are refused the same way.
    db.run("ALTER TABLE shop.orders REPLICA IDENTITY NOTHING")
    code, body = pg_json(capsys, "setup", "--source", db.uri("shop.orders,shop.gone"))
    assert code == 1
    errors = {(c["name"], c["subject"]) for c in body["checks"] if c["verdict"] == "error"}
    assert errors == {("replica_identity", "shop.orders"), ("table", "shop.gone")}
    assert db.nothing_created()


def test_a_table_name_the_relay_cannot_serve_is_refused_before_anything_is_published(
        db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28: ``shop."a b"`` under ``shop.*`` was published, then stopped the relay's
    buffer at its first change (``ws.ok`` beside it with it)."""
    db.run(*SHOP, 'CREATE TABLE shop."a b" (id int PRIMARY KEY)')
    code, body = pg_json(capsys, "setup", "--source", db.uri("shop.*"))
    assert code == 1
    errors = [c for c in body["checks"] if c["verdict"] == "error"]
    assert [(c["name"], c["subject"]) for c in errors] == [("name", "shop.a b")]
    assert "cannot serve a source named shop.a b" in errors[0]["message"]
    assert errors[0]["fix"].startswith('rename it (ALTER TABLE shop."a b" RENAME TO')
    assert db.nothing_created()
    db.run('ALTER TABLE shop."a b" RENAME TO a_b')
    assert pg(capsys, "setup", "--source", db.uri("shop.*"))[0] == 0
    assert db.published() == {"shop.orders", "shop.notes", "shop.a_b"}


def test_replica_identity_full_option(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    db.run(*SHOP, "CREATE TABLE shop.log (at timestamptz, what int)")
    uri = db.uri("shop.*")
    code, out, _ = pg(capsys, "setup", "--source", uri, "--replica-identity-full")
    assert code == 0
    assert "ALTER TABLE shop.log REPLICA IDENTITY FULL;\n" \
           "ALTER TABLE shop.notes REPLICA IDENTITY FULL;\n" \
           f"CREATE PUBLICATION {db.name} FOR TABLE shop.log, shop.notes, shop.orders" in out
    assert [db.replica_identity(t) for t in ("shop.log", "shop.notes", "shop.orders")] == \
        ["f", "f", "d"]
    assert db.slot() is not None
    # Published without a key, the table would refuse these; FULL lets them through.
    db.run("INSERT INTO shop.log VALUES (now(), 1)", "UPDATE shop.log SET what = 2",
           "DELETE FROM shop.log")
    # Now FULL: no warning is left, and nothing to do even without the option.
    code, body = pg_json(capsys, "setup", "--source", uri)
    assert code == 0 and body["statements"] == []
    assert [c for c in body["checks"] if c["verdict"] != "ok"] == []


def test_teardown(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    db.run(*SHOP)
    uri = db.uri("shop.orders")
    assert pg(capsys, "setup", "--source", uri)[0] == 0

    # Held by a walsender (as a running relay holds it): refused, nothing dropped.
    repl = db.connect(connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = repl.cursor()
        cur.start_replication(slot_name=db.name, decode=False, options={
            "proto_version": "1", "publication_names": db.name})
        pid = wait_until(lambda: (db.slot() or (None, None, None))[2], "the slot active", 10)
        code, out, _ = pg(capsys, "teardown", "--source", uri)
        assert code == 1
        assert f"-- ERROR    slot                   slot {db.name} is in use by process " \
               f"{pid}" in out
        assert f"pg_terminate_backend({pid})" in out
        assert db.slot() is not None and db.publication() is not None
    finally:
        repl.close()
    wait_until(lambda: db.slot() is not None and db.slot()[2] is None,  # type: ignore[index]
               "the slot released", 10)

    code, out, _ = pg(capsys, "teardown", "--source", uri, "--dry-run")
    assert code == 0 and out.splitlines()[-1] == "-- dry run: nothing was changed"
    assert db.slot() is not None and db.publication() is not None

    code, out, _ = pg(capsys, "teardown", "--source", uri)
    assert code == 0
    assert f"SELECT pg_drop_replication_slot('{db.name}');\n" \
           f"DROP PUBLICATION IF EXISTS {db.name};\n-- done: ran 2 statements" in out
    assert db.nothing_created()
    code, out, _ = pg(capsys, "teardown", "--source", uri)
    assert code == 0 and out.splitlines()[-1] == "-- nothing to do: already removed"


def test_dry_run_changes_nothing(db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    db.run(*SHOP)
    uri = db.uri("shop.*", heartbeat="table")
    code, body = pg_json(capsys, "setup", "--source", uri, "--dry-run",
                         "--replica-identity-full")
    assert code == 0 and body["dry_run"] and body["executed"] == []
    assert body["statements"] == [
        "ALTER TABLE shop.notes REPLICA IDENTITY FULL",
        "CREATE TABLE IF NOT EXISTS public.databus_heartbeat (id int PRIMARY KEY, beat "
        "timestamptz NOT NULL)",
        f"CREATE PUBLICATION {db.name} FOR TABLE shop.notes, shop.orders, "
        "public.databus_heartbeat WITH (publish = 'insert, update, delete')",
        f"SELECT pg_create_logical_replication_slot('{db.name}', 'pgoutput')",
    ]
    assert db.nothing_created()
    assert db.replica_identity("shop.notes") == "d"
    assert db.query("SELECT to_regclass('public.databus_heartbeat')") == [(None,)]
    # The printed script is what setup then runs.
    code, body2 = pg_json(capsys, "setup", "--source", uri, "--replica-identity-full")
    assert code == 0 and body2["executed"] == body["statements"]
    assert db.published() == {"shop.notes", "shop.orders", "public.databus_heartbeat"}


def test_the_watermark_table_of_dumps_is_published(
        db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    db.run(*SHOP)
    uri = db.uri("shop.orders")
    assert pg(capsys, "setup", "--source", uri)[0] == 0
    db.run("CREATE TABLE public.databus_watermark (id text PRIMARY KEY, created_at "
           "timestamptz NOT NULL DEFAULT now())")
    code, body = pg_json(capsys, "setup", "--source", uri)
    assert code == 0
    assert body["executed"] == [f"ALTER PUBLICATION {db.name} ADD TABLE "
                                "public.databus_watermark"]


def test_a_partitioned_table_is_published_through_its_root(
        db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    db.run("CREATE TABLE public.m (id int PRIMARY KEY, body text) PARTITION BY RANGE (id)",
           "CREATE TABLE public.m_1 PARTITION OF public.m FOR VALUES FROM (0) TO (100)")
    code, out, _ = pg(capsys, "setup", "--source", db.uri("public.*"),
                      "--replica-identity-full")
    assert code == 0
    assert "ALTER TABLE public.m_1 REPLICA IDENTITY FULL;" in out
    assert db.published() == {"public.m"}
    assert db.publication() == (True, True, True, False, True)
    assert db.replica_identity("public.m_1") == "f"


def test_a_role_without_replication_is_reported(
        db: Db, capsys: pytest.CaptureFixture[str]) -> None:
    role = db.role("app")
    db.run(*SHOP, f"ALTER SCHEMA shop OWNER TO {role}", f"ALTER TABLE shop.orders OWNER TO "
           f"{role}", f"GRANT CREATE ON DATABASE {db.name} TO {role}")
    uri = db.uri("shop.orders", user=role)
    code, out, _ = pg(capsys, "setup", "--source", uri)
    assert code == 1
    assert f"-- ERROR    replication_role       {role} may not replicate (neither " \
           "REPLICATION nor superuser)" in out
    assert f"fix: as a superuser: ALTER ROLE {role} REPLICATION" in out
    assert db.nothing_created()

    # A table it does not own cannot be published by it: said before anything runs.
    db.run("CREATE TABLE shop.other (id int PRIMARY KEY)", f"ALTER ROLE {role} REPLICATION",
           f"GRANT SELECT ON shop.other TO {role}")
    code, body = pg_json(capsys, "setup", "--source", db.uri("shop.orders,shop.other",
                                                             user=role))
    assert code == 1
    errors = [c for c in body["checks"] if c["verdict"] == "error"]
    assert len(errors) == 1, errors
    error = errors[0]
    assert "publishing a table needs its owner: shop.other" in error["message"]
    assert db.nothing_created()

    # With the attribute, a non-superuser owner sets its own tables up.
    code, out, _ = pg(capsys, "setup", "--source", uri)
    assert code == 0, out
    assert db.slot() == ("pgoutput", db.name, None)


@pytest.fixture
def password_auth(postgres_server: PostgresServer, db: Db) -> Iterator[str]:
    """A role that must give its password (the shared server trusts everyone else):
    a pg_hba.conf line for it alone, removed afterwards."""
    role = db.role("pw", "PASSWORD 'Right-Pa55'")
    hba = Path(postgres_server.datadir) / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + original)
    db.run("SELECT pg_reload_conf()")
    try:
        yield role
    finally:
        hba.write_text(original)
        db.run("SELECT pg_reload_conf()")


def test_a_wrong_password_is_one_clear_line_without_it(
        db: Db, password_auth: str, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = "Wr0ng-S3cret@qx9Zk"
    uri = db.uri("shop.orders", user=password_auth, password=wrong.replace("@", "%40"))
    for action in ("setup", "teardown"):
        deadline = time.monotonic() + 10
        while True:  # the reload is asynchronous
            code, out, err = pg(capsys, action, "--source", uri)
            if "password authentication failed" in err or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert code == 1 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith(f"databus pg {action}: error: PostgreSQL postgresql://"
                                   f"{password_auth}:***@")
        assert f'password authentication failed for user "{password_auth}"' in lines[0]
        for form in (wrong, "Wr0ng-S3cret", "Wr0ng-S3cret%40qx9Zk", "qx9Zk"):
            assert form not in out + err
    # The right password gets in (and on to the checks).
    code, out, _ = pg(capsys, "setup", "--source",
                      db.uri("shop.orders", user=password_auth, password="Right-Pa55"))
    assert "Right-Pa55" not in out
    assert "-- ERROR    table                  shop.orders does not exist" in out
