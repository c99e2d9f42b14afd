"""``databus init`` against the real servers: on a misconfigured source it exits 1 with
each failed check and the SQL to run, and writes nothing; once that SQL has run (as the
administrator), init writes configs that ``databus check-config`` accepts, with no
password in them. On MariaDB and PostgreSQL the relay then starts from the written
config and serves a change made after it started (on MariaDB also the rows that existed,
through its first dump).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sqlite3
import subprocess
from pathlib import Path

import psycopg2
import pymysql
import pytest

from databus.cli import main
from tests.fixtures._procs import free_port
from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.relay_harness import get_url, start_databus
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TOKEN = "init-admin-token"


def init(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["init", *argv])
    return code, out.getvalue()


def sql_block(text: str) -> list[str]:
    """The statements of init's SQL block (after its ``-- SQL to run`` line)."""
    lines = text.split("-- SQL to run once", 1)[1].splitlines()[1:]
    block = []
    for line in lines:
        if not line.strip():
            break
        if not line.startswith("--"):
            block.append(line.split(";   -- ", 1)[0].rstrip(";"))
    return block


def check_config(path: Path) -> dict[str, object]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["check-config", str(path)]) == 0
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def mariadb_root(server: MariaDBServer, *statements: str) -> None:
    conn = pymysql.connect(autocommit=True, **server.root_connect_kwargs())
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def test_mariadb_init_then_the_relay_serves_a_change(
        mariadb_server: MariaDBServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user, password = "init_relay", "Pw@Kx93tq:Lm40"  # '@' and ':' percent-encoded in the URI
    mariadb_root(mariadb_server,
                 f"DROP USER IF EXISTS '{user}'@'127.0.0.1'",
                 "DROP DATABASE IF EXISTS init_shop", "CREATE DATABASE init_shop",
                 "CREATE TABLE init_shop.orders (id INT PRIMARY KEY, item VARCHAR(40))",
                 "CREATE TABLE init_shop.events (at INT)",  # no primary key
                 "INSERT INTO init_shop.orders VALUES (1, 'before')",
                 f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'")
    uri = (f"mysql://{user}:Pw%40Kx93tq%3ALm40@{mariadb_server.host}:{mariadb_server.port}/"
           "init_shop")
    conf = tmp_path / "conf"
    mariadb_root(mariadb_server, "SET GLOBAL binlog_format = 'STATEMENT'")
    try:
        code, out = init("mysql", "--source", uri, "--dir", str(conf))
    finally:
        mariadb_root(mariadb_server, "SET GLOBAL binlog_format = 'ROW'")
    assert code == 1, out
    errors = {line.split()[1] for line in out.splitlines() if line.startswith("  ERROR")}
    assert {"binlog", "grants", "select", "watermark"} <= errors, out
    assert "binlog_format is STATEMENT" in out
    assert "no config written" in out and not conf.exists()
    assert password not in out and "Kx93tq" not in out
    block = sql_block(out)
    assert f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'127.0.0.1'" in block
    # The administrator runs the block; the keyless table is still refused.
    mariadb_root(mariadb_server, *block)
    code, out = init("mysql", "--source", uri, "--dir", str(conf))
    assert code == 1 and "init_shop.events has no primary key" in out, out
    assert "-- no SQL to run yet: fix what failed above first" in out
    mariadb_root(mariadb_server, "DROP TABLE init_shop.events")
    relay_port, boot_port = free_port(), free_port()
    argv = ["mysql", "--source", uri, "--dir", str(conf), "--relay-port", str(relay_port),
            "--bootstrap-port", str(boot_port), "--capacity-mb", "8"]
    code, out = init(*argv)
    assert code == 0, out
    files = {p.name: p.read_text() for p in conf.glob("*.toml")}
    assert set(files) == {"relay.toml", "bootstrap.toml", "replicate.toml"}
    assert all(password not in text and "Kx93tq" not in text for text in files.values())
    assert "${DATABUS_SOURCE_PASSWORD}" in files["relay.toml"]
    assert "DATABUS_SOURCE_PASSWORD" in out and "DATABUS_ADMIN_TOKEN" in out
    # Run again: the same files are no change; other contents need --force.
    assert init(*argv)[0] == 0
    (conf / "replicate.toml").write_text("# edited\n")
    code, out = init(*argv)
    assert code == 1 and "replicate.toml" in out and "--force" in out
    assert (conf / "replicate.toml").read_text() == "# edited\n"
    assert init(*argv, "--force")[0] == 0
    monkeypatch.setenv("DATABUS_SOURCE_PASSWORD", "Pw%40Kx93tq%3ALm40")
    monkeypatch.setenv("DATABUS_ADMIN_TOKEN", TOKEN)
    for name in files:
        check_config(conf / name)
    replicate = check_config(conf / "replicate.toml")
    assert "init_shop.orders" in json.dumps(replicate)
    relay = start_databus(["relay", "--config", str(conf / "relay.toml")], relay_port,
                          tmp_path / "relay.log")
    try:
        url = f"http://127.0.0.1:{relay_port}"
        wait_until(lambda: json.loads(get_url(url + "/v1/status"))["ready"],
                   "the relay ready", 60, diagnose=(tmp_path / "relay.log").read_text)
        mariadb_root(mariadb_server, "INSERT INTO init_shop.orders VALUES (2, 'after')")
        seen = _tail(url, "init_shop.orders", tmp_path, want={1, 2})
        assert seen == {1: "before", 2: "after"}
    finally:
        relay.terminate()
        assert relay.wait(timeout=30) == 0


def _tail(url: str, source: str, tmp_path: Path, want: set[int]) -> dict[int, str]:
    """The rows ``databus tail --from-earliest`` prints, once it has printed ``want``."""
    out_path = tmp_path / "tail.out"
    exe = Path(__import__("sys").executable).with_name("databus")
    with open(out_path, "wb") as out:
        proc = subprocess.Popen([str(exe), "tail", "--relay", url, "--sources", source,
                                 "--from-earliest"], stdout=out, stderr=subprocess.DEVNULL)
    try:
        def rows() -> dict[int, str] | None:
            found = {}
            for line in out_path.read_text().splitlines():
                doc = json.loads(line)
                if doc.get("source") == source and "value" in doc:
                    found[doc["key"]] = doc["value"]["item"]
            return found if set(found) >= want else None
        return wait_until(rows, f"{sorted(want)} in databus tail", 60,
                          diagnose=out_path.read_text)
    finally:
        proc.kill()
        proc.wait()


def pg_run(server: PostgresServer, dbname: str, *statements: str) -> None:
    conn = psycopg2.connect(**server.connect_kwargs(dbname))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def test_postgres_init_findings_sql_and_configs(postgres_server: PostgresServer,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pg_run(postgres_server, "postgres", "DROP DATABASE IF EXISTS init_shop",
           "CREATE DATABASE init_shop")
    pg_run(postgres_server, "init_shop",
           "DROP ROLE IF EXISTS init_relay",
           "CREATE ROLE init_relay LOGIN PASSWORD 'init-pw'",
           "CREATE TABLE orders (id int PRIMARY KEY, item text)",
           "CREATE TABLE events (at int)")
    base = (f"postgresql://init_relay:init-pw@{postgres_server.host}:{postgres_server.port}"
            "/init_shop?slot=init_slot&publication=init_pub&tables=")
    conf = tmp_path / "conf"
    code, out = init("postgres", "--source", base + "public.*", "--dir", str(conf))
    assert code == 1, out
    errors = {line.split()[1] for line in out.splitlines() if line.startswith("  ERROR")}
    assert errors == {"replication_role", "replica_identity", "select"}, out
    assert not conf.exists() and "init-pw" not in out
    code, out = init("postgres", "--source", base + "public.orders", "--dir", str(conf))
    assert code == 1
    block = sql_block(out)
    assert block[0].startswith("CREATE TABLE IF NOT EXISTS public.databus_watermark")
    assert "ALTER ROLE init_relay REPLICATION" in block
    assert block[-2].startswith("CREATE PUBLICATION init_pub FOR TABLE public.orders, "
                                "public.databus_watermark")
    assert block[-1] == "SELECT pg_create_logical_replication_slot('init_slot', 'pgoutput')"
    relay_port = free_port()
    relay = None
    try:
        pg_run(postgres_server, "init_shop", *block)  # as the superuser, as told
        code, out = init("postgres", "--source", base + "public.orders", "--dir", str(conf),
                         "--relay-port", str(relay_port), "--capacity-mb", "8")
        assert code == 0, out
        assert "-- no SQL to run" in out
        files = {p.name: p.read_text() for p in conf.glob("*.toml")}
        assert len(files) == 3 and not any("init-pw" in t for t in files.values())
        monkeypatch.setenv("DATABUS_SOURCE_PASSWORD", "init-pw")
        monkeypatch.setenv("DATABUS_ADMIN_TOKEN", TOKEN)
        for name in files:
            check_config(conf / name)
        assert '"public.orders"' in files["replicate.toml"]
        # The written relay config runs: a change made after it started is served.
        relay = start_databus(["relay", "--config", str(conf / "relay.toml")], relay_port,
                              tmp_path / "relay.log")
        url = f"http://127.0.0.1:{relay_port}"
        wait_until(lambda: json.loads(get_url(url + "/v1/status"))["ready"],
                   "the relay ready", 60, diagnose=(tmp_path / "relay.log").read_text)
        pg_run(postgres_server, "init_shop", "INSERT INTO orders VALUES (7, 'after')")
        assert _tail(url, "public.orders", tmp_path, want={7}) == {7: "after"}
    finally:
        status = 0
        if relay is not None:
            relay.terminate()
            status = relay.wait(timeout=30)

        def dropped() -> bool:  # once the relay's walsender is gone
            try:
                pg_run(postgres_server, "init_shop",
                       "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                       "WHERE slot_name = 'init_slot'")
            except psycopg2.errors.ObjectInUse:
                return False
            return True
        wait_until(dropped, "the slot dropped", 30)
        assert status == 0


def test_sqlite_init_findings_then_configs(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "shop.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
    conn.execute("CREATE TABLE events (at INTEGER)")
    conn.commit()
    conn.close()
    conf = tmp_path / "conf"
    code, out = init("sqlite", "--source", f"sqlite://{db}?tables=orders,events",
                     "--dir", str(conf))
    assert code == 1
    assert re.search(r"ERROR +primary_key +table main.events has no primary key", out), out
    assert re.search(r"ERROR +capture +shop.orders is not captured yet", out), out
    assert re.search(r"ERROR +watermark +no watermark table", out), out
    assert any(s.startswith('CREATE TRIGGER "databus_ins_orders"') for s in sql_block(out))
    uri = f"sqlite://{db}?tables=orders"
    code, out = init("sqlite", "--source", uri, "--dir", str(conf))
    conn = sqlite3.connect(db)
    conn.executescript(";\n".join(sql_block(out)) + ";")  # the owner runs the block
    conn.close()
    code, out = init("sqlite", "--source", uri, "--dir", str(conf))
    assert code == 0, out
    monkeypatch.setenv("DATABUS_ADMIN_TOKEN", TOKEN)
    for name in ("relay.toml", "bootstrap.toml", "replicate.toml"):
        check_config(conf / name)


def test_init_refuses_a_uri_of_another_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "postgres", "--source", "mysql://u:secret-pw@h/db"]) == 2
    err = capsys.readouterr().err
    assert "not a postgres URI" in err and "secret-pw" not in err
