"""The replicator's targets (``databus.replicator.targets``) against real databases: one
contract, run on SQLite, PostgreSQL and MariaDB.

Each test gets its own space (a schema on PostgreSQL, a database on MariaDB, a file
for SQLite) and reads what the target wrote through a connection of its own.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extras
import pymysql
import pytest

from databus.errors import ConfigError
from databus.replicator._model import Batch, Change, ColumnMap, TableMap
from databus.replicator.targets import (
    STATE_TABLE,
    ReplicationApplyError,
    Target,
    TargetError,
    TargetUnavailableError,
    open_target,
)
from databus.replicator.targets._postgres import copy_text
from tests.fixtures.servers import MariaDBServer, PostgresServer

pytestmark = pytest.mark.integration

KINDS = ["sqlite", "postgresql", "mysql"]

# Column types per dialect, as the type mapping would give them.
TYPES: dict[str, dict[str, str]] = {
    "sqlite": {"int": "INTEGER", "name": "TEXT", "short": "TEXT", "decimal": "TEXT",
               "blob": "BLOB", "text": "TEXT", "ts": "TEXT", "long": "TEXT"},
    "postgresql": {"int": "bigint", "name": "character varying(40)",
                   "short": "character varying(5)", "decimal": "numeric(20,6)",
                   "blob": "bytea", "text": "text", "ts": "timestamp with time zone",
                   "long": "character varying(50)"},
    "mysql": {"int": "BIGINT", "name": "VARCHAR(40)", "short": "VARCHAR(5)",
              "decimal": "DECIMAL(20,6)", "blob": "LONGBLOB", "text": "LONGTEXT",
              "ts": "DATETIME(6)", "long": "VARCHAR(50)"},
}


@dataclass
class Env:
    """One target under test and a side door to read what it wrote."""

    kind: str
    url: str
    target: Target
    schema: str | None
    query: Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
    quote: str
    # Where tables without a schema go: the PostgreSQL schema, the MariaDB database.
    space: str | None = None

    def shown(self, table: str) -> str:
        return f"{self.space}.{table}" if self.space else table

    def table(self, name: str, columns: Sequence[tuple[str, str, bool]],
              key: Sequence[str], *, source: str | None = None) -> TableMap:
        """A table map; columns are (name, logical type, nullable)."""
        types = TYPES[self.kind]
        return TableMap(
            source=source or f"db.{name}", schema=None, table=name, key=tuple(key),
            columns=tuple(ColumnMap(n, n, "string", types[t], nullable)
                          for n, t, nullable in columns),
            fingerprint=1)

    def qname(self, table: str) -> str:
        q = self.quote
        name = q + table.replace(q, q + q) + q
        return f"{q}{self.schema}{q}.{name}" if self.schema else name

    def rows(self, t: TableMap) -> list[tuple[Any, ...]]:
        cols = ", ".join(self.quote + c.target + self.quote for c in t.columns)
        keys = ", ".join(self.quote + k + self.quote for k in t.key)
        out = self.query(f"SELECT {cols} FROM {self.qname(t.table)} ORDER BY {keys}", ())
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in out]


def _sqlite_env(tmp_path: Path) -> Iterator[Env]:
    import sqlite3

    path = tmp_path / "replica.db"

    def query(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(path)
        try:
            return conn.execute(sql, tuple(params)).fetchall()
        finally:
            conn.close()

    target = open_target(f"sqlite:///{path}")
    try:
        yield Env("sqlite", f"sqlite:///{path}", target, None, query, '"')
    finally:
        target.close()


def _postgres_env(pg: PostgresServer) -> Iterator[Env]:
    schema = "rt_" + uuid.uuid4().hex[:10]

    def query(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(pg.dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, tuple(params) or None)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    url = f"{pg.url()}?schema={schema}"
    target = open_target(url)
    try:
        yield Env("postgresql", url, target, schema, query, '"', schema)
    finally:
        target.close()
        query(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE', ())


def _mysql_env(db: MariaDBServer) -> Iterator[Env]:
    database = "rt_" + uuid.uuid4().hex[:10]

    def query(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        conn = pymysql.connect(**db.connect_kwargs(database=database))
        try:
            with conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
                cur.execute(sql, tuple(params) or None)
                return list(cur.fetchall())
        finally:
            conn.close()

    admin = pymysql.connect(**db.connect_kwargs(database=None))
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{database}`")
    url = db.url(database)
    target = open_target(url)
    try:
        yield Env("mysql", url, target, None, query, "`", database)
    finally:
        target.close()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        admin.close()


@pytest.fixture
def sqlite_env(tmp_path: Path) -> Iterator[Env]:
    yield from _sqlite_env(tmp_path)


@pytest.fixture
def postgresql_env(postgres_server: PostgresServer) -> Iterator[Env]:
    yield from _postgres_env(postgres_server)


@pytest.fixture
def mysql_env(mariadb_server: MariaDBServer) -> Iterator[Env]:
    yield from _mysql_env(mariadb_server)


@pytest.fixture(params=KINDS)
def env(request: pytest.FixtureRequest) -> Env:
    env: Env = request.getfixturevalue(f"{request.param}_env")
    return env


def batch(scn: int,
          changes: Mapping[str, Sequence[tuple[tuple[Any, ...], tuple[Any, ...] | None]]],
          *, checkpoint: str | None = None) -> Batch:
    """A batch to ``scn``: per source, (key, row or None for a delete)."""
    b = Batch(scn=scn, windows=1, checkpoint=checkpoint)
    for source, items in changes.items():
        b.changes[source] = {key: Change(key, row, scn) for key, row in items}
        b.events += len(items)
    return b


def people(env: Env, name: str = "people") -> TableMap:
    return env.table(name, [("id", "int", False), ("name", "name", False),
                            ("note", "text", True)], ["id"])


def ready(env: Env, *tables: TableMap) -> None:
    env.target.ensure_state()
    for t in tables:
        env.target.create_table(t)


# -- the contract ------------------------------------------------------------------------


def test_create_table_and_read_the_catalog(env: Env) -> None:
    t = env.table("orders", [("id", "int", False), ("name", "name", False),
                             ("amount", "decimal", True), ("note", "text", True)], ["id"])
    assert env.target.load_state("r") is None  # no state table yet
    assert not env.target.table_exists(t)
    assert env.target.table_columns(t) == {}
    env.target.create_table(t)
    env.target.create_table(t)  # already there: nothing
    assert env.target.table_exists(t)
    columns = env.target.table_columns(t)
    assert list(columns) == ["id", "name", "amount", "note"]
    expected = {"sqlite": "TEXT", "postgresql": "character varying(40)",
                "mysql": "varchar(40)"}[env.kind]
    assert columns["name"] == expected
    assert env.target.table_key(t) == ("id",)


def test_upserts_updates_and_deletes_across_batches(env: Env) -> None:
    t = people(env)
    ready(env, t)
    src = t.source
    assert env.target.load_state("r1") is None
    env.target.apply("r1", {src: t}, batch(10, {src: [
        ((i,), (i, f"name {i}", None)) for i in range(1, 6)]}, checkpoint='{"scn": 10}'))
    assert env.rows(t) == [(i, f"name {i}", None) for i in range(1, 6)]
    assert env.target.load_state("r1") == 10
    assert env.target.load_checkpoint("r1") == '{"scn": 10}'

    env.target.apply("r1", {src: t}, batch(20, {src: [
        ((2,), (2, "two", "updated")), ((3,), None), ((6,), (6, "six", None)),
        ((99,), None)]}))  # deleting a key that is not there is no error
    assert env.rows(t) == [(1, "name 1", None), (2, "two", "updated"), (4, "name 4", None),
                           (5, "name 5", None), (6, "six", None)]
    assert env.target.load_state("r1") == 20
    assert env.target.load_checkpoint("r1") is None

    # The key deleted before comes back; the one inserted last batch goes.
    env.target.apply("r1", {src: t}, batch(30, {src: [((3,), (3, "three", "back")),
                                                      ((6,), None)]}))
    assert [r[0] for r in env.rows(t)] == [1, 2, 3, 4, 5]
    assert env.target.load_state("r1") == 30
    assert env.target.load_state("another") is None


def test_state_is_kept_per_replication_and_survives_reconnects(env: Env) -> None:
    t = people(env)
    ready(env, t)
    env.target.ensure_state()  # twice: nothing
    env.target.apply("a", {t.source: t}, batch(5, {}))  # no rows: the SCN still counts
    env.target.apply("b", {t.source: t}, batch(7, {t.source: [((1,), (1, "x", None))]}))
    env.target.close()
    again = open_target(env.url)
    try:
        assert (again.load_state("a"), again.load_state("b")) == (5, 7)
    finally:
        again.close()
    assert env.query(f"SELECT replication, scn FROM {env.qname(STATE_TABLE)} "
                     "ORDER BY replication", ()) == [("a", 5), ("b", 7)]


def test_the_schema_record_and_the_catalog_reconciliation_reads(env: Env) -> None:
    """``databus_replication_schemas`` per replication and source (replicator/_reconcile
    .py), and the catalog's spelling of each mapped type recognised as that type."""
    from databus.replicator._reconcile import same_type

    t = env.table("typed", [("id", "int", False), *((k, k, True) for k in TYPES[env.kind]
                                                     if k != "int")], ["id"])
    ready(env, t)
    assert env.target.load_schema("a", "db.typed") is None
    env.target.save_schema("a", "db.typed", (1 << 64) - 5, '{"v": 1}')  # a high fingerprint
    env.target.save_schema("a", "db.typed", 12, '{"v": 2}')  # replaced
    env.target.save_schema("b", "db.typed", 13, '{"v": 3}')
    assert env.target.load_schema("a", "db.typed") == '{"v": 2}'
    assert env.target.load_schema("b", "db.typed") == '{"v": 3}'
    catalog = env.target.catalog(t)
    assert [c[0] for c in catalog] == [c.target for c in t.columns]
    for (name, spelled, _), column in zip(catalog, t.columns, strict=True):
        assert same_type(spelled, column.target_type, env.target.dialect), (name, spelled)


def test_values_round_trip(env: Env) -> None:
    t = env.table("vals", [("id", "int", False), ("name", "name", True),
                           ("amount", "decimal", True), ("data", "blob", True),
                           ("note", "text", True), ("at", "ts", True)], ["id"])
    ready(env, t)
    text = 'h\u00e9llo \u2603 \U0001f600 tab\there "q" \\ back\\slash\nline\r\n%s %% \'x'
    blob = bytes(range(256)) + b"\\x00\t\n\\N"
    amount: Any = Decimal("-12345678901234.123456")
    instant = dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.UTC)
    at: Any = {"sqlite": instant.isoformat(), "postgresql": instant,
               "mysql": instant.replace(tzinfo=None)}[env.kind]
    if env.kind == "sqlite":
        amount = str(amount)
    zero: Any = "0" if env.kind == "sqlite" else Decimal(0)
    rows = [
        (1, text[:40], amount, blob, text, at),
        (2, None, None, None, None, None),
        (3, "", zero, b"", "", at),
        (4, "\\N", amount, b"\\N", "\\N", at),  # COPY's NULL spelling, as a value
    ]
    env.target.apply("r", {t.source: t}, batch(1, {t.source: [((r[0],), r) for r in rows]}))
    # Decimals compare by value (the servers give numeric(20,6) back with its scale),
    # aware datetimes by instant (read back in the reading session's zone).
    assert env.rows(t) == rows


def test_composite_keys(env: Env) -> None:
    t = env.table("tenants", [("tenant", "name", False), ("id", "int", False),
                              ("note", "text", True)], ["tenant", "id"])
    ready(env, t)
    src = t.source
    env.target.apply("r", {src: t}, batch(1, {src: [
        (("a", 1), ("a", 1, "a1")), (("a", 2), ("a", 2, "a2")), (("b", 1), ("b", 1, "b1")),
        (("A", 1), ("A", 1, "upper A"))]}))  # a key differing in case only: its own row
    env.target.apply("r", {src: t}, batch(2, {src: [
        (("a", 1), None), (("b", 1), ("b", 1, "b1 updated")), (("b", 2), ("b", 2, "b2"))]}))
    assert env.rows(t) == [("A", 1, "upper A"), ("a", 2, "a2"), ("b", 1, "b1 updated"),
                           ("b", 2, "b2")]
    assert env.target.table_key(t) == ("tenant", "id")


def test_a_refused_row_leaves_nothing_and_names_the_table_and_key(env: Env) -> None:
    first = people(env, "first")
    second = people(env, "second")
    ready(env, first, second)
    tables = {first.source: first, second.source: second}
    env.target.apply("r", tables, batch(10, {first.source: [((1,), (1, "one", None))]}))

    bad = batch(20, {
        first.source: [((1,), None), ((2,), (2, "two", None))],
        second.source: [((i,), (i, f"n{i}", None)) for i in range(1, 50)]
        + [((77,), (77, None, "name is NOT NULL"))]
        + [((i,), (i, f"n{i}", None)) for i in range(100, 150)]})
    bad.changes[second.source][(77,)].scn = 17
    with pytest.raises(ReplicationApplyError) as caught:
        env.target.apply("r", tables, bad)
    err = caught.value
    assert not err.retriable
    assert (err.table, err.source, err.key, err.scn) == (
        env.shown("second"), second.source, (77,), 17)
    assert env.shown("second") in str(err) and "(77)" in str(err) and "SCN 17" in str(err)
    # Nothing of the batch: not the first table's changes, not the state.
    assert env.rows(first) == [(1, "one", None)]
    assert env.rows(second) == []
    assert env.target.load_state("r") == 10

    # The target goes on with the next batch.
    env.target.apply("r", tables, batch(30, {second.source: [((5,), (5, "five", None))]}))
    assert env.rows(second) == [(5, "five", None)]
    assert env.target.load_state("r") == 30


def test_a_value_too_long_is_refused_with_its_key(env: Env) -> None:
    if env.kind == "sqlite":
        pytest.skip("SQLite does not enforce declared lengths")
    t = env.table("codes", [("id", "int", False), ("code", "short", True)], ["id"])
    ready(env, t)
    rows = [((i,), (i, "ok", )) for i in range(1, 200)] + [((500,), (500, "much too long"))]
    with pytest.raises(ReplicationApplyError) as caught:
        env.target.apply("r", {t.source: t}, batch(3, {t.source: rows}))
    assert caught.value.key == (500,)
    assert env.shown("codes") in str(caught.value)
    assert env.rows(t) == []
    assert env.target.load_state("r") is None


def test_add_drop_and_widen_columns(env: Env) -> None:
    t = env.table("evolving", [("id", "int", False), ("code", "short", False)], ["id"])
    ready(env, t)
    env.target.apply("r", {t.source: t}, batch(1, {t.source: [((1,), (1, "abc"))]}))

    added = ColumnMap("extra", "extra", ["null", "string"], TYPES[env.kind]["text"], False)
    t2 = TableMap(t.source, t.schema, t.table, t.key, (*t.columns, added), 2)
    env.target.add_column(t2, added)
    env.target.add_column(t2, added)  # replayed after a crash: nothing
    assert list(env.target.table_columns(t2)) == ["id", "code", "extra"]
    env.target.apply("r", {t.source: t2}, batch(2, {t.source: [((2,), (2, "def", "more"))]}))
    assert env.rows(t2) == [(1, "abc", None), (2, "def", "more")]

    wide = ColumnMap("code", "code", "string", TYPES[env.kind]["long"], False)
    t3 = TableMap(t.source, t.schema, t.table, t.key, (t.columns[0], wide, added), 3)
    env.target.widen_column(t3, wide)
    long_code = "a code of more than five characters"
    env.target.apply("r", {t.source: t3}, batch(3, {t.source: [((3,), (3, long_code, None))]}))
    if env.kind == "postgresql":
        assert env.target.table_columns(t3)["code"] == "character varying(50)"
    if env.kind == "mysql":
        assert env.target.table_columns(t3)["code"] == "varchar(50)"
        # MODIFY kept the column NOT NULL.
        assert env.query("SELECT IS_NULLABLE FROM information_schema.COLUMNS WHERE "
                         "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'evolving' AND "
                         "COLUMN_NAME = 'code'", ()) == [("NO",)]

    t4 = TableMap(t.source, t.schema, t.table, t.key, (t.columns[0], wide), 4)
    env.target.drop_column(t4, "extra")
    env.target.drop_column(t4, "extra")
    assert list(env.target.table_columns(t4)) == ["id", "code"]
    env.target.apply("r", {t.source: t4}, batch(4, {t.source: [((1,), (1, "again"))]}))
    assert env.rows(t4) == [(1, "again"), (2, "def"), (3, long_code)]


def test_awkward_identifiers(env: Env) -> None:
    """Names that need quoting: a reserved word, a quote of each kind, a percent sign
    (the drivers' parameter marker), mixed case."""
    odd = 'Odd "name" `x` %s'
    t = TableMap("db.odd", None, odd, ("select",), (
        ColumnMap("select", "select", "long", TYPES[env.kind]["int"], False),
        ColumnMap("a%b", "a%b", "string", TYPES[env.kind]["text"], True),
        ColumnMap("MixedCase", "MixedCase", "string", TYPES[env.kind]["text"], True)), 1)
    ready(env, t)
    assert env.target.table_exists(t)
    env.target.apply("r", {t.source: t}, batch(1, {t.source: [
        ((1,), (1, "x%sy", "M")), ((2,), (2, None, None))]}))
    env.target.apply("r", {t.source: t}, batch(2, {t.source: [((2,), None),
                                                               ((1,), (1, "z", "N"))]}))
    assert list(env.target.table_columns(t)) == ["select", "a%b", "MixedCase"]
    q = env.quote
    assert env.query(f"SELECT {q}select{q}, {q}a%b{q} FROM {env.qname(odd)}", ()) == [
        (1, "z")]


class _CountingCursor:
    """A driver cursor that notes each statement sent through it."""

    def __init__(self, cur: Any, sent: list[str]) -> None:
        self._cur, self._sent = cur, sent

    def __getattr__(self, name: str) -> Any:
        if name in ("execute", "executemany", "copy_expert"):
            self._sent.append(name)
        return getattr(self._cur, name)


class _CountingConnection:
    def __init__(self, conn: Any, sent: list[str]) -> None:
        self._conn, self._sent = conn, sent

    def cursor(self, *args: Any, **kwargs: Any) -> _CountingCursor:
        return _CountingCursor(self._conn.cursor(*args, **kwargs), self._sent)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_a_large_batch(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    t = env.table("big", [("id", "int", False), ("name", "name", False),
                          ("amount", "decimal", True), ("note", "text", True)], ["id"])
    ready(env, t)
    n = 20_000

    def no_fallback(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("these values go through COPY, not execute_values")

    monkeypatch.setattr(psycopg2.extras, "execute_values", no_fallback)
    # The statements the target sends for the two batches (its transactions get their
    # cursors from _connection).
    sent: list[str] = []
    connection = env.target._connection  # type: ignore[attr-defined]
    monkeypatch.setattr(env.target, "_connection",
                        lambda: _CountingConnection(connection(), sent))

    def amount(i: int) -> Any:
        value = Decimal(i) / 100
        return str(value) if env.kind == "sqlite" else value

    started = time.monotonic()
    env.target.apply("r", {t.source: t}, batch(1, {t.source: [
        ((i,), (i, f"name {i}", amount(i), "x" * (i % 50) or None)) for i in range(n)]}))
    # Every row again (updates), and a thousand deletes, in the next batch.
    env.target.apply("r", {t.source: t}, batch(2, {t.source: [
        ((i,), (i, f"renamed {i}", amount(i + 1), None)) if i % 20 else ((i,), None)
        for i in range(n)]}))
    elapsed = time.monotonic() - started
    assert env.query(f"SELECT COUNT(*) FROM {env.qname('big')}", ()) == [(n - n // 20,)]
    sample = env.query(f"SELECT name, amount FROM {env.qname('big')} WHERE id = 12345", ())
    expected = str(Decimal(12346) / 100) if env.kind == "sqlite" else Decimal("123.460000")
    assert sample == [("renamed 12345", expected)]
    assert env.target.load_state("r") == 2
    # In bulk: a handful of statements per batch (multi-row INSERTs of up to 4 MiB, a
    # COPY, executemany; deletes by the hundred), not one per row: a count no machine's
    # speed changes. (How long it took depends on the machine: only shown.)
    print(f"two batches of {n} rows: {len(sent)} statements in {elapsed:.1f} s")
    assert len(sent) < 100, (len(sent), sent[:20])


def test_a_lost_connection_is_retriable_and_the_next_call_reconnects(env: Env) -> None:
    if env.kind == "sqlite":
        pytest.skip("no connection to lose")
    t = people(env)
    ready(env, t)
    env.target.apply("r", {t.source: t}, batch(1, {t.source: [((1,), (1, "one", None))]}))
    if env.kind == "postgresql":
        env.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE application_name = 'databus-replicator' AND pid <> pg_backend_pid()",
                  ())
    else:
        ids = env.query("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
                        "AND ID <> CONNECTION_ID()", ())
        for (pid,) in ids:
            env.query(f"KILL {int(pid)}", ())
    two = batch(2, {t.source: [((2,), (2, "two", None))]})
    with pytest.raises(TargetUnavailableError) as caught:
        env.target.apply("r", {t.source: t}, two)
    assert caught.value.retriable
    env.target.apply("r", {t.source: t}, two)  # the retry reconnects
    assert [r[0] for r in env.rows(t)] == [1, 2]
    assert env.target.load_state("r") == 2


def test_calls_from_several_threads_take_turns(env: Env) -> None:
    tables = [people(env, f"t{i}") for i in range(4)]
    ready(env, *tables)
    errors: list[BaseException] = []

    def work(t: TableMap) -> None:
        try:
            for scn in range(1, 11):
                env.target.apply(t.table, {t.source: t}, batch(scn, {t.source: [
                    ((scn,), (scn, f"row {scn}", None))]}))
                env.target.load_state(t.table)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in tables]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    for t in tables:
        assert len(env.rows(t)) == 10
        assert env.target.load_state(t.table) == 10


# -- dialect specifics ----------------------------------------------------------------------


def test_postgresql_values_copy_cannot_write_go_through_the_driver(
        postgresql_env: Env) -> None:
    """A jsonb (psycopg2 Json) and an array (a list) are loaded with execute_values."""
    env = postgresql_env
    t = TableMap("db.docs", None, "docs", ("id",), (
        ColumnMap("id", "id", "long", "bigint", False),
        ColumnMap("doc", "doc", "string", "jsonb", True),
        ColumnMap("tags", "tags", "string", "text[]", True)), 1)
    ready(env, t)
    assert copy_text([(1, psycopg2.extras.Json({"a": 1}), ["x"])]) is None
    env.target.apply("r", {t.source: t}, batch(1, {t.source: [
        ((1,), (1, psycopg2.extras.Json({"a": [1, "\u00e9"]}), ["x", "y z"])),
        ((2,), (2, None, None))]}))
    assert env.rows(t) == [(1, {"a": [1, "\u00e9"]}, ["x", "y z"]), (2, None, None)]


def test_postgresql_a_nul_character_is_refused_with_its_key(postgresql_env: Env) -> None:
    env = postgresql_env
    t = people(env)
    ready(env, t)
    with pytest.raises(ReplicationApplyError) as caught:
        env.target.apply("r", {t.source: t}, batch(1, {t.source: [
            ((1,), (1, "fine", None)), ((2,), (2, "nul \x00 inside", None))]}))
    assert caught.value.key == (2,)
    assert env.rows(t) == []


def test_mysql_session_is_utc_and_keys_are_case_and_space_exact(mysql_env: Env) -> None:
    env = mysql_env
    t = env.table("k", [("code", "name", False), ("note", "text", True)], ["code"])
    stamp = env.table("stamps", [("id", "int", False), ("at", "ts", True)], ["id"])
    ready(env, t, stamp)
    aware = dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    env.target.apply("r", {t.source: t, stamp.source: stamp}, batch(1, {
        t.source: [(("a",), ("a", "lower")), (("A",), ("A", "upper")),
                   (("a ",), ("a ", "trailing space"))],
        stamp.source: [((1,), (1, aware))]}))
    assert sorted(env.rows(t)) == [("A", "upper"), ("a", "lower"), ("a ", "trailing space")]
    # An aware datetime lands as its UTC wall time.
    assert env.rows(stamp) == [(1, dt.datetime(2024, 1, 1, 7, 0))]


def test_mysql_rows_are_packed_into_statements_within_the_packet_limit(
        mysql_env: Env) -> None:
    env = mysql_env
    t = env.table("packed", [("id", "int", False), ("data", "blob", True)], ["id"])
    ready(env, t)
    target: Any = env.target
    target.max_statement_bytes = 2000  # a few rows per INSERT
    rows = [((i,), (i, bytes([i % 256]) * 300)) for i in range(100)]
    env.target.apply("r", {t.source: t}, batch(1, {t.source: rows}))
    assert env.rows(t) == [row for _, row in rows]

    # A row the server would refuse by closing the connection is refused with its key
    # before it is sent.
    packet = env.query("SELECT @@max_allowed_packet", ())[0][0]
    huge = [((1000,), (1000, b"x" * (int(packet) // 2 + 1)))]
    with pytest.raises(ReplicationApplyError, match="max_allowed_packet") as caught:
        env.target.apply("r", {t.source: t}, batch(2, {t.source: [*rows[:3], *huge]}))
    assert caught.value.key == (1000,)
    assert env.target.load_state("r") == 1


def test_mysql_bad_credentials_are_not_retriable_and_keep_the_password_out(
        mariadb_server: MariaDBServer) -> None:
    secret = "Wr0ng-pa55word-zz"
    target = open_target(f"mysql://{mariadb_server.user}:{secret}@{mariadb_server.host}:"
                         f"{mariadb_server.port}/test")
    with pytest.raises(TargetError) as caught:
        target.open()
    assert not caught.value.retriable
    assert not isinstance(caught.value, TargetUnavailableError)
    assert secret not in str(caught.value) and "***" in str(caught.value)


def test_a_target_that_is_down_is_retriable(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url in (f"postgresql://u:Secret-pw-123@127.0.0.1:{port}/db",
                f"mysql://u:Secret-pw-123@127.0.0.1:{port}/db"):
        target = open_target(url)
        with pytest.raises(TargetUnavailableError) as caught:
            target.ensure_state()
        assert caught.value.retriable
        assert "Secret-pw-123" not in str(caught.value)


def test_urls_that_cannot_work_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown target") as caught:
        open_target("oracle://u:Secret-pw-123@h/db")
    assert "Secret-pw-123" not in str(caught.value)
    with pytest.raises(ConfigError, match="name the database"):
        open_target("mysql://u:pw1234@127.0.0.1:3306/")
    with pytest.raises(ConfigError, match="needs a file"):
        open_target("sqlite:///:memory:")
    sqlite = open_target(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(ConfigError, match="one schema"):
        sqlite.table_exists(TableMap("db.t", "other", "t", ("id",), (), 1))


def test_copy_text_format() -> None:
    row = (None, True, 7, 1.5, float("nan"), Decimal("1E+3"), "a\tb\nc\\d\re", b"\x00\xff",
           dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5, 6,
                                            tzinfo=dt.timezone(dt.timedelta(hours=2))),
           dt.timedelta(days=1, seconds=2, microseconds=3), uuid.UUID(int=1))
    assert copy_text([row]) == (
        "\\N\tt\t7\t1.5\tNaN\t1E+3\ta\\tb\\nc\\\\d\\re\t\\\\x00ff\t2024-01-02\t"
        "2024-01-02 01:04:05.000006+00:00\t1 days 2.000003 seconds\t"
        "00000000-0000-0000-0000-000000000001\n")


def test_one_process_holds_a_replication_on_a_target(env: Env) -> None:
    """Safe start (DESIGN 17): a second replicator of the same replication on the same
    target is refused while the first holds it, and may run once it let go."""
    from databus.errors import AlreadyRunningError
    from databus.replicator.targets import open_target

    name = f"held-{uuid.uuid4().hex[:8]}"
    first = env.target.hold(name)
    other = open_target(env.url)
    try:
        with pytest.raises(AlreadyRunningError, match=f"replication {name} on target"):
            other.hold(name)
        other.hold(f"{name}-other").release()  # another replication is another lock
        first.release()
        other.hold(name).release()
    finally:
        first.release()
        other.close()


# -- straight copies (issue 30): an initial copy into an empty table, no merge ---------


class _SqlCursor:
    """A driver cursor that notes the SQL of each statement sent through it."""

    def __init__(self, cur: Any, sent: list[str]) -> None:
        self._cur, self._sent = cur, sent

    def execute(self, sql: Any, *args: Any) -> Any:
        self._sent.append(str(sql))
        return self._cur.execute(sql, *args)

    def copy_expert(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._sent.append(sql)
        return self._cur.copy_expert(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


class _SqlConnection(_CountingConnection):
    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return _SqlCursor(self._conn.cursor(*args, **kwargs), self._sent)


def test_a_straight_copy_goes_into_the_table_and_merges_when_a_key_is_there(
        postgresql_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env = postgresql_env
    t = people(env)
    ready(env, t)
    target = env.target
    assert target.accepts_straight_copy(t)  # empty, keyed by id
    sent: list[str] = []
    connection = target._connection  # type: ignore[attr-defined]
    monkeypatch.setattr(target, "_connection", lambda: _SqlConnection(connection(), sent))
    first = batch(1, {t.source: [((i,), (i, f"n{i}", None)) for i in range(100)]})
    first.straight = {t.source}
    target.apply("r", {t.source: t}, first)
    assert env.rows(t) == [(i, f"n{i}", None) for i in range(100)]
    assert first.straight == {t.source}
    assert not any("databus_stage" in s or (s.startswith("INSERT") and "people" in s)
                   for s in sent), sent
    assert any("FORMAT binary" in s for s in sent)
    assert not target.accepts_straight_copy(t)  # not empty any more
    # A key the table holds: the COPY fails on the primary key, the batch is rolled
    # back whole (its delete too) and applied again with the merge.
    second = batch(2, {t.source: [((5,), (5, "changed", "x")), ((1000,), (1000, "new", None)),
                                  ((7,), None)]})
    second.straight = {t.source}
    target.apply("r", {t.source: t}, second)
    assert second.straight == set()
    want = [(i, f"n{i}", None) for i in range(100) if i != 7]
    want[5] = (5, "changed", "x")
    assert env.rows(t) == [*want, (1000, "new", None)]
    assert target.load_state("r") == 2


def test_no_straight_copy_into_a_table_keyed_otherwise(postgresql_env: Env) -> None:
    env = postgresql_env
    t = people(env)
    ready(env, t)
    other_key = TableMap(t.source, t.schema, t.table, ("name",), t.columns, t.fingerprint)
    assert env.target.accepts_straight_copy(t)
    assert not env.target.accepts_straight_copy(other_key)


def test_other_targets_never_copy_straight(sqlite_env: Env) -> None:
    t = people(sqlite_env)
    ready(sqlite_env, t)
    assert not sqlite_env.target.accepts_straight_copy(t)
