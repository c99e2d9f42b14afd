"""The pgoutput decoder on what a real PostgreSQL 15 sends (issue 18).

Each test makes a database of its own, a publication and a ``pgoutput`` slot, runs
transactions, then reads the slot's raw messages through the SQL interface
(``pg_logical_slot_peek_binary_changes``: the same bytes as the XLogData payloads of
the replication protocol) and decodes every one. Commit LSNs are checked against the
WAL itself (``pg_walinspect``). The slot is dropped afterwards: a slot pins WAL.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from databus.fetchers.postgres._pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    PgOutputMessage,
    Relation,
    Truncate,
    TypeMessage,
    Update,
    decode,
    format_lsn,
    parse_lsn,
    pg_timestamp_to_unix_ns,
)
from tests.fixtures.servers import PostgresServer

pytestmark = pytest.mark.integration

# Type oids of pg_type (stable across versions).
INT4, INT8, TEXT, NUMERIC, BOOL, TIMESTAMPTZ, BYTEA, JSONB, UUID, VARCHAR = (
    23, 20, 25, 1700, 16, 1184, 17, 3802, 2950, 1043)
TEXT_ARRAY = 1009


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4  # VARHDRSZ, as PostgreSQL stores it


class Slot:
    """A fresh database with a publication and a pgoutput slot, on the session server."""

    def __init__(self, server: PostgresServer) -> None:
        suffix = uuid.uuid4().hex[:12]
        self.server = server
        self.dbname = f"pgoutput_{suffix}"
        self.slot = f"pgoutput_slot_{suffix}"
        self.publication = f"pgoutput_pub_{suffix}"
        self._admin(f'CREATE DATABASE "{self.dbname}"')
        self.conn = self.connect(autocommit=True)

    def connect(self, *, autocommit: bool) -> psycopg2.extensions.connection:
        # Logical decoding reads only WAL that is flushed: the fixture turns
        # synchronous_commit off, so a commit could be missing from an immediate peek.
        conn: psycopg2.extensions.connection = psycopg2.connect(
            **self.server.connect_kwargs(self.dbname), options="-c synchronous_commit=on")
        conn.autocommit = autocommit
        return conn

    def _admin(self, sql: str) -> None:
        admin = psycopg2.connect(**self.server.connect_kwargs("postgres"))
        admin.autocommit = True
        try:
            with admin.cursor() as cur:
                cur.execute(sql)
        finally:
            admin.close()

    def run(self, *statements: str) -> None:
        with self.conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def one(self, sql: str, *args: Any) -> Any:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            row = cur.fetchone()
            assert row is not None
            return row[0]

    def txn(self, *statements: str) -> tuple[int, int, int]:
        """Run statements as one transaction: its xid and the Unix ns just before and
        just after its commit."""
        conn = self.connect(autocommit=False)
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                cur.execute("SELECT pg_current_xact_id()::text::bigint")
                row = cur.fetchone()
                assert row is not None
            before = time.time_ns()
            conn.commit()
            after = time.time_ns()
        finally:
            conn.close()
        return int(row[0]), before, after

    def start(self, *tables: str) -> None:
        """The publication, then the slot: changes after this point are decoded."""
        self.run(f"CREATE PUBLICATION {self.publication} FOR TABLE {', '.join(tables)}",
                 "CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        self.start_lsn = parse_lsn(self.one(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
            self.slot))

    def peek(self, *options: str) -> list[tuple[int, bytes]]:
        """Every message the slot holds, raw: (the row's LSN, the bytes)."""
        args = dict(zip(options[::2], options[1::2], strict=True))
        args.setdefault("proto_version", "1")
        args.setdefault("publication_names", self.publication)
        args.setdefault("messages", "true")
        placeholders = ", ".join("%s" for _ in range(2 * len(args)))
        flat = [x for pair in args.items() for x in pair]
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
                        f"%s, NULL, NULL, {placeholders})", [self.slot, *flat])
            return [(parse_lsn(lsn), bytes(data)) for lsn, data in cur.fetchall()]

    def messages(self, *options: str, protocol_version: int = 1) -> list[PgOutputMessage]:
        return [decode(data, protocol_version) for _, data in self.peek(*options)]

    def oid(self, table: str) -> int:
        return int(self.one("SELECT %s::regclass::oid", table))

    def commit_records(self) -> dict[int, tuple[int, int]]:
        """xid -> (start LSN, end LSN) of every COMMIT record since the slot began."""
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT xid::text::bigint, start_lsn::text, end_lsn::text "
                "FROM pg_get_wal_records_info(%s::pg_lsn, pg_current_wal_flush_lsn()) "
                "WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT'",
                (format_lsn(self.start_lsn),))
            return {int(x): (parse_lsn(s), parse_lsn(e)) for x, s, e in cur.fetchall()}

    def record_ends(self, resource_manager: str) -> list[int]:
        """The end LSNs of the WAL records of one resource manager since the slot began."""
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT end_lsn::text FROM pg_get_wal_records_info(%s::pg_lsn, "
                "pg_current_wal_flush_lsn()) WHERE resource_manager = %s ORDER BY start_lsn",
                (format_lsn(self.start_lsn), resource_manager))
            return [parse_lsn(end) for (end,) in cur.fetchall()]

    def close(self) -> None:
        try:
            self.run("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     f"WHERE slot_name = '{self.slot}'")
        finally:
            self.conn.close()
            self._admin(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')


@pytest.fixture
def pg(postgres_server: PostgresServer) -> Iterator[Slot]:
    slot = Slot(postgres_server)
    try:
        yield slot
    finally:
        slot.close()


def transactions(messages: list[PgOutputMessage]) -> list[list[PgOutputMessage]]:
    """Messages split at Begin..Commit; a message outside a transaction (a
    non-transactional logical message) is a group of its own."""
    groups: list[list[PgOutputMessage]] = []
    current: list[PgOutputMessage] | None = None
    for message in messages:
        if isinstance(message, Begin):
            assert current is None, "Begin inside a transaction"
            current = [message]
        elif current is not None:
            current.append(message)
            if isinstance(message, Commit):
                groups.append(current)
                current = None
        else:
            groups.append([message])
    assert current is None, "a transaction without its Commit"
    return groups


def commit_of(group: list[PgOutputMessage]) -> Commit:
    commit = group[-1]
    assert isinstance(commit, Commit)
    return commit


def kinds(group: list[PgOutputMessage]) -> list[str]:
    return [type(m).__name__ for m in group]


def check_envelope(pg: Slot, group: list[PgOutputMessage], xid: int, before: int,
                   after: int) -> None:
    """Begin and Commit agree with each other, with the WAL and with the clock."""
    begin, commit = group[0], group[-1]
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.xid == xid
    assert begin.final_lsn == commit.commit_lsn
    assert commit.flags == 0 and commit.commit_lsn < commit.end_lsn
    assert pg.commit_records()[xid] == (commit.commit_lsn, commit.end_lsn)
    assert begin.commit_time_us == commit.commit_time_us
    # The commit time is taken inside conn.commit(); the server shares this clock.
    assert before - 1_000_000 <= pg_timestamp_to_unix_ns(commit.commit_time_us) <= after


ACCOUNTS_DDL = (
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    # REPLICA IDENTITY DEFAULT: the primary key.
    "CREATE TABLE accounts (id bigint PRIMARY KEY, name text NOT NULL, "
    "balance numeric(12,2), active boolean, created timestamptz, photo bytea, doc jsonb, "
    "feeling mood, ref uuid)",
    "CREATE TABLE ledger (entry int PRIMARY KEY, account bigint, amount numeric(12,2), "
    "note varchar(40))",
    "ALTER TABLE ledger REPLICA IDENTITY FULL",
)


def test_inserts_updates_and_deletes_of_a_default_and_a_full_identity_table(pg: Slot) -> None:
    pg.run(*ACCOUNTS_DDL)
    pg.start("accounts", "ledger")
    accounts, ledger = pg.oid("accounts"), pg.oid("ledger")
    mood = int(pg.one("SELECT 'mood'::regtype::oid"))
    ref = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"

    t1 = pg.txn(
        "INSERT INTO accounts VALUES (1, 'ann', 12.5, true, '2024-01-02 03:04:05.25+00', "
        f"'\\x00ff', '{{\"a\": [1, \"é\"]}}', 'happy', '{ref}')",
        "INSERT INTO accounts (id, name) VALUES (2, '')",
        "INSERT INTO ledger VALUES (10, 1, 12.5, 'open')")
    t2 = pg.txn(
        "UPDATE accounts SET name = 'anna', balance = 13 WHERE id = 1",  # key unchanged
        "UPDATE accounts SET id = 3 WHERE id = 2",  # key changed: the old key travels
        "UPDATE ledger SET note = 'closed' WHERE entry = 10")  # FULL: the whole old row
    t3 = pg.txn("DELETE FROM accounts WHERE id = 3", "DELETE FROM ledger WHERE entry = 10")

    groups = transactions(pg.messages())
    assert [kinds(g) for g in groups] == [
        ["Begin", "TypeMessage", "Relation", "Insert", "Insert", "Relation", "Insert",
         "Commit"],
        ["Begin", "Update", "Update", "Update", "Commit"],
        ["Begin", "Delete", "Delete", "Commit"],
    ]
    for group, (xid, before, after) in zip(groups, (t1, t2, t3), strict=True):
        check_envelope(pg, group, xid, before, after)
    # Commit order is LSN order.
    commit_lsns = [commit_of(g).commit_lsn for g in groups]
    assert commit_lsns == sorted(commit_lsns)

    _, type_message, rel_accounts, ins1, ins2, rel_ledger, ins3, _ = groups[0]
    # An enum is not a built-in type: its name is sent before the relation that uses it.
    assert type_message == TypeMessage(mood, "public", "mood")
    assert rel_accounts == Relation(accounts, "public", "accounts", "d", (
        Column(True, "id", INT8, -1),
        Column(False, "name", TEXT, -1),
        Column(False, "balance", NUMERIC, numeric_typmod(12, 2)),
        Column(False, "active", BOOL, -1),
        Column(False, "created", TIMESTAMPTZ, -1),
        Column(False, "photo", BYTEA, -1),
        Column(False, "doc", JSONB, -1),
        Column(False, "feeling", mood, -1),
        Column(False, "ref", UUID, -1),
    ))
    # REPLICA IDENTITY FULL: every column is part of the key.
    assert rel_ledger == Relation(ledger, "public", "ledger", "f", (
        Column(True, "entry", INT4, -1),
        Column(True, "account", INT8, -1),
        Column(True, "amount", NUMERIC, numeric_typmod(12, 2)),
        Column(True, "note", VARCHAR, 40 + 4),
    ))
    assert ins1 == Insert(accounts, (
        "1", "ann", "12.50", "t", "2024-01-02 03:04:05.25+00", "\\x00ff",
        '{"a": [1, "é"]}', "happy", ref))
    # The empty string and NULL stay apart.
    assert ins2 == Insert(accounts, ("2", "", None, None, None, None, None, None, None))
    assert ins3 == Insert(ledger, ("10", "1", "12.50", "open"))

    _, upd1, upd2, upd3, _ = groups[1]
    new1 = ("1", "anna", "13.00", "t", "2024-01-02 03:04:05.25+00", "\\x00ff",
            '{"a": [1, "é"]}', "happy", ref)
    assert upd1 == Update(accounts, new1, None, False)
    assert upd2 == Update(accounts, ("3", "", None, None, None, None, None, None, None),
                          ("2", None, None, None, None, None, None, None, None), True)
    assert upd3 == Update(ledger, ("10", "1", "12.50", "closed"), ("10", "1", "12.50", "open"),
                          False)

    _, del1, del2, _ = groups[2]
    assert del1 == Delete(accounts, ("3", None, None, None, None, None, None, None, None), True)
    assert del2 == Delete(ledger, ("10", "1", "12.50", "closed"), False)


def test_toast_messages_truncate_and_a_new_relation_after_alter_table(pg: Slot) -> None:
    pg.run(
        "CREATE TABLE docs (id int PRIMARY KEY, title text, body text)",
        # EXTERNAL: out of line and uncompressed, so the >2 KB value is surely TOASTed.
        "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL",
        "CREATE TABLE docs_full (id int PRIMARY KEY, title text, body text)",
        "ALTER TABLE docs_full ALTER COLUMN body SET STORAGE EXTERNAL",
        "ALTER TABLE docs_full REPLICA IDENTITY FULL",
        "CREATE TABLE counters (id serial PRIMARY KEY, n int)",
    )
    pg.start("docs", "docs_full", "counters")
    docs, docs_full, counters = pg.oid("docs"), pg.oid("docs_full"), pg.oid("counters")
    body = "".join(f"{i:05d}-lorem-ipsum " for i in range(400))  # 6,400 characters
    assert len(body) > 2048

    t1 = pg.txn(f"INSERT INTO docs VALUES (1, 'draft', '{body}')",
                f"INSERT INTO docs_full VALUES (1, 'draft', '{body}')",
                "INSERT INTO counters (n) VALUES (7)")
    # The body is left alone: its TOASTed value is not sent again.
    t2 = pg.txn("UPDATE docs SET title = 'final' WHERE id = 1",
                "UPDATE docs_full SET title = 'final' WHERE id = 1")
    t3 = pg.txn("SELECT pg_logical_emit_message(true, 'databus', 'hi')")
    pg.run("SELECT pg_logical_emit_message(false, 'databus', '\\x00ff00'::bytea)")
    t4 = pg.txn("TRUNCATE docs, counters RESTART IDENTITY CASCADE")
    t5 = pg.txn("ALTER TABLE docs ADD COLUMN tags text[] DEFAULT '{a,b}'",
                "INSERT INTO docs (id, title, body) VALUES (2, 'x', 'short')")

    groups = transactions(pg.messages())
    assert [kinds(g) for g in groups] == [
        ["Begin", "Relation", "Insert", "Relation", "Insert", "Relation", "Insert", "Commit"],
        ["Begin", "Update", "Update", "Commit"],
        ["Begin", "LogicalMessage", "Commit"],
        ["LogicalMessage"],
        ["Begin", "Relation", "Relation", "Truncate", "Commit"],
        ["Begin", "Relation", "Insert", "Commit"],
    ]
    for group, (xid, before, after) in zip(groups[:3] + groups[4:], (t1, t2, t3, t4, t5),
                                           strict=True):
        check_envelope(pg, group, xid, before, after)

    _, rel_docs, ins_docs, rel_full, ins_full, _, ins_counter, _ = groups[0]
    assert isinstance(rel_docs, Relation) and isinstance(rel_full, Relation)
    assert (rel_docs.oid, rel_docs.replica_identity) == (docs, "d")
    assert (rel_full.oid, rel_full.replica_identity) == (docs_full, "f")
    assert ins_docs == Insert(docs, ("1", "draft", body))
    assert ins_full == Insert(docs_full, ("1", "draft", body))
    assert ins_counter == Insert(counters, ("1", "7"))

    _, upd_docs, upd_full, _ = groups[1]
    assert upd_docs == Update(docs, ("1", "final", UNCHANGED_TOAST), None, False)
    # REPLICA IDENTITY FULL sends the whole old row, TOASTed values fetched, but the new
    # row still marks the untouched value unchanged (PostgreSQL 15).
    assert upd_full == Update(docs_full, ("1", "final", UNCHANGED_TOAST),
                              ("1", "draft", body), False)

    message = groups[2][1]
    assert isinstance(message, LogicalMessage)
    assert (message.transactional, message.prefix, message.content) == (True, "databus", b"hi")
    untransactional = groups[3][0]
    assert isinstance(untransactional, LogicalMessage)
    assert (untransactional.transactional, untransactional.prefix,
            untransactional.content) == (False, "databus", b"\x00\xff\x00")
    # A message's LSN is where its WAL record ends (for the transactional one, where the
    # commit record starts).
    assert pg.record_ends("LogicalMessage") == [message.lsn, untransactional.lsn]
    assert message.lsn == commit_of(groups[2]).commit_lsn

    # TRUNCATE gives new files to the tables, so their relations are sent again first.
    truncate = groups[4][3]
    assert {m.oid for m in groups[4][1:3] if isinstance(m, Relation)} == {docs, counters}
    assert isinstance(truncate, Truncate) and truncate.options == 0b11
    assert sorted(truncate.relation_oids) == sorted((docs, counters))

    _, rel_altered, ins_altered, _ = groups[5]
    assert rel_altered == Relation(docs, "public", "docs", "d", (
        Column(True, "id", INT4, -1), Column(False, "title", TEXT, -1),
        Column(False, "body", TEXT, -1), Column(False, "tags", TEXT_ARRAY, -1)))
    assert ins_altered == Insert(docs, ("2", "x", "short", "{a,b}"))


def test_protocol_version_2_with_binary_values(pg: Slot) -> None:
    """Version 2 without streaming sends no xid in data messages; binary mode sends each
    value in its type's send format ('b' values)."""
    pg.run("CREATE TABLE points (id int PRIMARY KEY, label text, weight bigint)")
    pg.start("points")
    points = pg.oid("points")
    t1 = pg.txn("INSERT INTO points VALUES (7, 'seven', NULL)",
                "UPDATE points SET weight = -2 WHERE id = 7",
                "DELETE FROM points WHERE id = 7")

    messages = pg.messages("proto_version", "2", "binary", "true", protocol_version=2)
    [group] = transactions(messages)
    assert kinds(group) == ["Begin", "Relation", "Insert", "Update", "Delete", "Commit"]
    check_envelope(pg, group, *t1)
    seven = (7).to_bytes(4, "big")
    assert group[2:5] == [
        Insert(points, (seven, b"seven", None)),
        Update(points, (seven, b"seven", (-2).to_bytes(8, "big", signed=True)), None, False),
        Delete(points, (seven, None, None), True),
    ]
