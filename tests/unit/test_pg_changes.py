"""``ChangeStream`` (decoded pgoutput messages -> windows) with a recording sink and
catalog, on the decoder's dataclasses; and the fetcher's preflight and error
classification with fake connections (``wal_level`` cannot be changed on the shared test
server)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg2
import pytest

from databus.errors import (
    ConnectionLostError,
    SourceError,
    SourceMisconfiguredError,
    SourceQuarantinedError,
)
from databus.event import Op, decode_event
from databus.fetchers._api import FetcherContext, SourceFailure
from databus.fetchers.postgres._changes import (
    HEARTBEAT_PREFIX,
    CaptureError,
    ChangeStream,
    RereadError,
    TableInfo,
)
from databus.fetchers.postgres._fetcher import LogicalFetcher
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
    TupleValue,
    Update,
    pg_timestamp_to_unix_ns,
)
from databus.fetchers.postgres._types import column_mapping
from databus.schemas import AvroCodec, Schema

pytestmark = pytest.mark.twin("databus.batch", "databus.fetchers.postgres._transcode")

INT4, TEXT, INT8 = 23, 25, 20
ORDERS, OTHER, WATERMARK = 16384, 16390, 16400


def relation(oid: int = ORDERS, name: str = "orders", identity: str = "d",
             columns: Sequence[tuple[bool, str, int]] = ((True, "id", INT4),
                                                         (False, "note", TEXT)),
             namespace: str = "public") -> Relation:
    return Relation(oid, namespace, name, identity,
                    tuple(Column(k, n, t, -1) for k, n, t in columns))


class Sink:
    """Records every call, events decoded: ("start", scn), ("event", op, source id, key,
    value bytes, fingerprint, scn), ("watermark", token), ("end", ts), ("rollback",)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def start_window(self, scn: int) -> None:
        self.calls.append(("start", scn))

    def append(self, event: bytes) -> None:
        e = decode_event(event)
        self.calls.append(("event", e.op, e.source_id, e.key, e.value,
                           e.header.schema_fingerprint, e.scn))

    def watermark(self, token: str) -> None:
        self.calls.append(("watermark", token))

    def end_window(self, timestamp_ns: int | None = None) -> int:
        self.calls.append(("end", timestamp_ns))
        return 0

    def rollback(self) -> None:
        self.calls.append(("rollback",))

    def events(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "event"]


class Catalog:
    """Source ids from 1; every schema version registered, in order."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.versions: dict[str, list[Schema]] = {}

    def source_id(self, name: str) -> int:
        return self.ids.setdefault(name, len(self.ids) + 1)

    def register_schema(self, name: str, schema: Schema) -> Schema:
        versions = self.versions.setdefault(name, [])
        if not versions or versions[-1].fingerprint != schema.fingerprint:
            versions.append(schema)
        return versions[-1]

    def decode(self, name: str, value: bytes, fingerprint: int) -> Any:
        (schema,) = [s for s in self.versions[name] if s.fingerprint == fingerprint]
        return AvroCodec(schemas=[schema]).decode(value, schema)


def table_info(rel: Relation) -> TableInfo:
    key = tuple(c.name for c in rel.columns if c.name == "id")
    return TableInfo(key, frozenset(key),
                     tuple(column_mapping(c.type_oid, c.type_modifier, {})
                           for c in rel.columns))


def no_key_info(rel: Relation) -> TableInfo:
    return TableInfo((), frozenset(), table_info(rel).mappings)


def wanted(schema: str, table: str) -> bool:
    return schema == "public" and table in ("orders", "items")


def make(skip_through: int | None = None, info: Any = table_info
         ) -> tuple[ChangeStream, Sink, Catalog]:
    sink, catalog = Sink(), Catalog()
    return ChangeStream(sink, catalog, 3, wanted, info, skip_through), sink, catalog


def txn(final_lsn: int, *changes: PgOutputMessage, end: int | None = None,
        time_us: int = 1_000_000) -> list[PgOutputMessage]:
    return [Begin(final_lsn, time_us, 700), *changes,
            Commit(0, final_lsn, end if end is not None else final_lsn + 40, time_us)]


def feed(stream: ChangeStream, messages: Sequence[PgOutputMessage]) -> None:
    for message in messages:
        stream.feed(message)


def ins(*values: TupleValue, oid: int = ORDERS) -> Insert:
    return Insert(oid, tuple(values))


# -- windows ------------------------------------------------------------------------------


def test_a_transaction_is_one_whole_window_at_its_commit_lsn() -> None:
    stream, sink, catalog = make()
    stream.feed(relation())
    feed(stream, txn(1000, ins("1", "a"), ins("2", None))[:-1])
    # Nothing ends before the Commit: the window is open, nothing is confirmable.
    assert [c[0] for c in sink.calls] == ["start", "event", "event"]
    assert stream.in_transaction and stream.confirmable is None
    stream.feed(Commit(0, 1000, 1040, 1_000_000))
    assert sink.calls[0] == ("start", 1000)
    assert sink.calls[-1] == ("end", pg_timestamp_to_unix_ns(1_000_000))
    events = sink.events()
    assert [(e[1], e[2], e[3], e[6]) for e in events] == [
        (Op.UPSERT, 1, 1, 1000), (Op.UPSERT, 1, 2, 1000)]
    assert [catalog.decode("public.orders", e[4], e[5]) for e in events] == [
        {"id": 1, "note": "a"}, {"id": 2, "note": None}]
    assert stream.confirmable == 1040 and not stream.in_transaction
    assert (stream.windows, stream.events, stream.last_scn) == (1, 2, 1000)


def test_windows_come_in_commit_order_one_per_transaction() -> None:
    stream, sink, _ = make()
    stream.feed(relation())
    for lsn in (100, 200, 300):
        feed(stream, txn(lsn, ins(str(lsn), "x")))
    assert [c[1] for c in sink.calls if c[0] == "start"] == [100, 200, 300]
    assert sum(1 for c in sink.calls if c[0] == "end") == 3
    assert stream.confirmable == 340


def test_transactions_with_nothing_captured_write_nothing_and_are_confirmable() -> None:
    stream, sink, _ = make()
    stream.feed(relation())
    stream.feed(relation(OTHER, "other"))
    feed(stream, txn(100, ins("1", "x", oid=OTHER), end=150))
    assert sink.calls == [] and stream.confirmable == 150
    feed(stream, txn(200, end=260))  # an empty transaction (older servers send them)
    assert sink.calls == [] and stream.confirmable == 260
    # A transaction touching both: only the captured table's rows, in one window.
    feed(stream, txn(300, ins("2", "x", oid=OTHER), ins("3", "y")))
    assert [c[0] for c in sink.calls] == ["start", "event", "end"]


def test_transactions_at_or_before_the_resume_point_are_skipped_but_confirmable() -> None:
    stream, sink, _ = make(skip_through=200)
    stream.feed(relation())
    feed(stream, txn(100, ins("1", "a"), end=140))
    feed(stream, txn(200, ins("2", "b"), Truncate(0, (ORDERS,)), end=240))
    assert sink.calls == [] and stream.confirmable == 240
    feed(stream, txn(300, ins("3", "c")))
    assert [c[1] for c in sink.calls if c[0] == "start"] == [300]
    assert [e[3] for e in sink.events()] == [3]


def test_a_heartbeat_message_is_confirmable() -> None:
    stream, sink, _ = make()
    stream.feed(LogicalMessage(False, 500, HEARTBEAT_PREFIX, b""))
    assert stream.confirmable == 500 and sink.calls == []
    # A transactional message inside a transaction moves nothing until the commit.
    stream.feed(relation())
    feed(stream, txn(600, LogicalMessage(True, 610, "app", b"x"), end=650)[:-1])
    assert stream.confirmable == 500
    stream.feed(Commit(0, 600, 650, 0))
    assert stream.confirmable == 650 and sink.calls == []
    # Never backwards.
    stream.feed(LogicalMessage(False, 400, "late", b""))
    assert stream.confirmable == 650


def test_protocol_violations_are_capture_errors() -> None:
    stream, _sink, _ = make()
    stream.feed(Begin(100, 0, 1))
    with pytest.raises(CaptureError, match="Begin of 200 inside the transaction of 100"):
        stream.feed(Begin(200, 0, 2))
    with pytest.raises(CaptureError, match="differs from its Begin"):
        stream.feed(Commit(0, 101, 140, 0))
    stream2, _sink2, _ = make()
    with pytest.raises(CaptureError, match="outside a transaction"):
        stream2.feed(Commit(0, 100, 140, 0))
    with pytest.raises(CaptureError, match="outside a transaction"):
        stream2.feed(ins("1", "a"))
    stream2.feed(Begin(100, 0, 1))
    with pytest.raises(CaptureError, match="before its Relation message"):
        stream2.feed(ins("1", "a"))


# -- rows ----------------------------------------------------------------------------------


def test_an_update_that_changes_the_key_is_a_delete_then_an_upsert() -> None:
    stream, sink, catalog = make()
    stream.feed(relation())
    feed(stream, txn(100, Update(ORDERS, ("2", "b"), ("1", None), True),
                     Update(ORDERS, ("2", "c"), None, False)))
    events = sink.events()
    assert [(e[1], e[3]) for e in events] == [
        (Op.DELETE, 1), (Op.UPSERT, 2), (Op.UPSERT, 2)]
    assert events[0][4] == b""
    assert catalog.decode("public.orders", events[1][4], events[1][5]) == {
        "id": 2, "note": "b"}


def test_replica_identity_full_updates_compare_keys_from_the_old_row() -> None:
    stream, sink, _ = make()
    stream.feed(relation(identity="f", columns=((True, "id", INT4), (True, "note", TEXT))))
    feed(stream, txn(100, Update(ORDERS, ("1", "new"), ("1", "old"), False),
                     Update(ORDERS, ("5", "new"), ("1", "new"), False)))
    assert [(e[1], e[3]) for e in sink.events()] == [
        (Op.UPSERT, 1), (Op.DELETE, 1), (Op.UPSERT, 5)]


def test_an_unchanged_toasted_value_comes_from_the_old_row_of_identity_full() -> None:
    stream, sink, catalog = make()
    big = "x" * 10_000
    stream.feed(relation(identity="f", columns=((True, "id", INT4), (True, "note", TEXT))))
    feed(stream, txn(100, Update(ORDERS, ("1", UNCHANGED_TOAST), ("1", big), False)))
    (event,) = sink.events()
    assert catalog.decode("public.orders", event[4], event[5]) == {"id": 1, "note": big}


@pytest.mark.parametrize("old", [None, ("1", None)])
def test_an_unchanged_toasted_value_without_the_old_row_stops_with_the_fix(
        old: tuple[TupleValue, ...] | None) -> None:
    stream, sink, _ = make()
    stream.feed(relation())
    stream.feed(Begin(100, 0, 1))
    # Without a host (the default quarantine): the fetcher stops, not retried.
    with pytest.raises(SourceQuarantinedError) as info:
        stream.feed(Update(ORDERS, ("1", UNCHANGED_TOAST), old, old is not None))
    assert info.value.reason.startswith("an UPDATE left the large (TOASTed) column "
                                        "'note' unchanged")
    assert info.value.fix.startswith("run ALTER TABLE public.orders REPLICA IDENTITY FULL")
    assert info.value.fix.endswith("databus relay heal --relay URL --source public.orders")
    assert not info.value.retriable
    assert sink.events() == []


def test_a_delete_carries_the_key_and_an_empty_value() -> None:
    stream, sink, _ = make()
    stream.feed(relation())
    feed(stream, txn(100, Delete(ORDERS, ("7", None), True)))
    (event,) = sink.events()
    assert (event[1], event[3], event[4]) == (Op.DELETE, 7, b"")


def test_a_delete_without_a_key_stops_with_the_fix() -> None:
    stream, _sink, _ = make(info=no_key_info)
    stream.feed(relation(identity="n", columns=((False, "id", INT4), (False, "note", TEXT))))
    stream.feed(Begin(100, 0, 1))
    with pytest.raises(SourceQuarantinedError, match=re.escape(
            "it has no primary key and no replica identity index")) as info:
        stream.feed(Delete(ORDERS, ("7", "x"), False))
    assert "REPLICA IDENTITY FULL" in info.value.fix


def test_a_truncate_of_a_captured_table_is_refused() -> None:
    stream, sink, _ = make()
    stream.feed(relation())
    stream.feed(relation(OTHER, "other"))
    # Of tables that are not captured: nothing.
    feed(stream, txn(100, Truncate(0, (OTHER,))))
    assert sink.calls == [] and stream.confirmable == 140
    stream.feed(Begin(200, 0, 1))
    with pytest.raises(SourceQuarantinedError) as info:
        stream.feed(Truncate(0, (OTHER, ORDERS)))
    assert (info.value.source, info.value.scn) == ("public.orders", 200)
    assert info.value.reason.startswith("a TRUNCATE of it was published")
    assert "publish = 'insert, update, delete'" in info.value.fix
    assert not info.value.retriable


def test_watermark_rows_go_to_the_sink_in_log_order_and_are_never_events() -> None:
    stream, sink, catalog = make()
    stream.feed(relation())
    stream.feed(relation(WATERMARK, "databus_watermark",
                         columns=((True, "id", TEXT), (False, "created_at", 1184))))
    feed(stream, txn(100, Insert(WATERMARK, ("low-1", "2024-01-01 00:00:00+00"))))
    feed(stream, txn(200, ins("1", "a"),
                     Insert(WATERMARK, ("high-1", "2024-01-01 00:00:00+00")),
                     Delete(WATERMARK, ("old", None), True), ins("2", "b")))
    assert [c[:2] if c[0] != "event" else ("event", c[3]) for c in sink.calls] == [
        ("start", 100), ("watermark", "low-1"), ("end", pg_timestamp_to_unix_ns(1_000_000)),
        ("start", 200), ("event", 1), ("watermark", "high-1"), ("event", 2),
        ("end", pg_timestamp_to_unix_ns(1_000_000))]
    assert "public.databus_watermark" not in catalog.ids


def test_a_relation_message_with_new_columns_is_a_new_schema_version() -> None:
    stream, sink, catalog = make()
    stream.feed(relation())
    feed(stream, txn(100, ins("1", "a")))
    # Sent again unchanged (a new session, or DDL elsewhere): the same version.
    stream.feed(relation())
    feed(stream, txn(200, ins("2", "b")))
    stream.feed(relation(columns=((True, "id", INT4), (False, "note", TEXT),
                                  (False, "extra", INT8))))
    feed(stream, txn(300, ins("3", "c", "9")))
    stream.feed(relation(columns=((True, "id", INT4), (False, "extra", TEXT))))
    feed(stream, txn(400, ins("4", "t")))
    versions = catalog.versions["public.orders"]
    assert [[f["name"] for f in v.fields] for v in versions] == [
        ["id", "note"], ["id", "note", "extra"], ["id", "extra"]]
    events = sink.events()
    assert [e[5] for e in events] == [versions[0].fingerprint, versions[0].fingerprint,
                                      versions[1].fingerprint, versions[2].fingerprint]
    assert [catalog.decode("public.orders", e[4], e[5]) for e in events[2:]] == [
        {"id": 3, "note": "c", "extra": 9}, {"id": 4, "extra": "t"}]


def test_a_table_matched_by_a_pattern_gets_its_source_when_first_seen() -> None:
    stream, sink, catalog = make()
    stream.feed(relation())
    feed(stream, txn(100, ins("1", "a")))
    stream.feed(relation(OTHER + 1, "items"))
    feed(stream, txn(200, ins("5", "i", oid=OTHER + 1)))
    assert catalog.ids == {"public.orders": 1, "public.items": 2}
    assert [e[2] for e in sink.events()] == [1, 2]


# -- the fetcher's preflight and errors (fake connections) --------------------------------


class FakeCursor:
    """Answers the preflight's queries from ``answers`` (SQL start -> rows)."""

    def __init__(self, answers: dict[str, list[tuple[Any, ...]]]) -> None:
        self.answers = answers
        self.rows: list[tuple[Any, ...]] = []
        self.queries: list[str] = []

    def execute(self, sql: str, params: Any = None) -> None:
        self.queries.append(sql)
        for start, rows in self.answers.items():
            if sql.startswith(start):
                self.rows = list(rows)
                return
        raise AssertionError(f"unexpected query {sql}")

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows.pop(0) if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self.rows = self.rows, []
        return rows


class FakeConnection:
    def __init__(self, answers: dict[str, list[tuple[Any, ...]]]) -> None:
        self.cur = FakeCursor(answers)

    @contextmanager
    def cursor(self) -> Iterator[FakeCursor]:
        yield self.cur


URI = ("postgresql://databus:S3cret-pw@db:5432/shop?slot=s1&publication=p1"
       "&tables=public.orders")


def fetcher() -> LogicalFetcher:
    return LogicalFetcher(URI, FetcherContext("pg", 0, Catalog()))


def answers(**changes: list[tuple[Any, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    good = {
        "SHOW wal_level": [("logical",)],
        "SELECT plugin, database, active_pid": [("pgoutput", "shop", None)],
        "SELECT 1 FROM pg_publication": [(1,)],
        "SELECT schemaname, tablename": [("public", "orders")],
        "SELECT s.active_pid": [(None, None, None)],
    }
    keys = {"wal_level": "SHOW wal_level", "slot": "SELECT plugin, database, active_pid",
            "publication": "SELECT 1 FROM pg_publication",
            "published": "SELECT schemaname, tablename"}
    for name, rows in changes.items():
        good[keys[name]] = rows
    return good


def test_the_preflight_passes_a_server_that_is_set_up() -> None:
    conn = FakeConnection(answers())
    fetcher()._preflight(conn)
    assert conn.cur.queries[0] == "SHOW wal_level"


@pytest.mark.parametrize("level", ["replica", "minimal"])
def test_wal_level_not_logical_is_a_clear_error(level: str) -> None:
    with pytest.raises(SourceMisconfiguredError) as info:
        fetcher()._preflight(FakeConnection(answers(wal_level=[(level,)])))
    message = str(info.value)
    assert f"wal_level is {level!r}, logical decoding needs 'logical'" in message
    assert "ALTER SYSTEM SET wal_level = logical" in message
    assert "S3cret-pw" not in message and "databus:***@db" in message
    assert not info.value.retriable


def test_a_missing_slot_and_a_slot_dropped_under_the_relay() -> None:
    with pytest.raises(SourceMisconfiguredError, match="replication slot 's1' does not "
                                                       "exist: run databus pg setup"):
        fetcher()._preflight(FakeConnection(answers(slot=[])))
    with pytest.raises(SourceMisconfiguredError) as info:
        fetcher()._preflight(FakeConnection(answers(slot=[])), 0x16B374D848)
    message = str(info.value)
    assert "replication slot 's1' does not exist any more" in message
    assert "read up to LSN 16/B374D848" in message and "databus dump" in message


def test_a_slot_of_another_plugin_or_database() -> None:
    with pytest.raises(SourceMisconfiguredError, match="slot 's1' is a 'test_decoding' "
                                                       "slot of database 'shop'"):
        fetcher()._preflight(FakeConnection(answers(
            slot=[("test_decoding", "shop", None)])))
    with pytest.raises(SourceMisconfiguredError, match="of database 'other'"):
        fetcher()._preflight(FakeConnection(answers(slot=[("pgoutput", "other", None)])))


def test_a_publication_missing_or_without_a_table() -> None:
    with pytest.raises(SourceMisconfiguredError, match="publication 'p1' does not exist"):
        fetcher()._preflight(FakeConnection(answers(publication=[])))
    with pytest.raises(SourceMisconfiguredError,
                       match=re.escape("publication 'p1' does not publish public.orders: "
                                       "ALTER PUBLICATION p1 ADD TABLE public.orders")):
        fetcher()._preflight(FakeConnection(answers(published=[("public", "items")])))


def _pg_error(code: str | None, text: str,
              base: type[psycopg2.Error] = psycopg2.ProgrammingError) -> psycopg2.Error:
    cls = type("FakePgError", (base,), {"pgcode": code})
    return cls(text)


@pytest.mark.parametrize(("code", "base", "expected"), [
    ("42704", psycopg2.ProgrammingError, SourceMisconfiguredError),  # publication gone
    ("55000", psycopg2.OperationalError, SourceMisconfiguredError),  # slot invalidated
    ("55006", psycopg2.OperationalError, SourceMisconfiguredError),  # slot in use
    (None, psycopg2.ProgrammingError, ConnectionLostError),  # "no COPY in progress"
    (None, psycopg2.DatabaseError, ConnectionLostError),  # PGRES_COPY_BOTH, no message
    ("57P01", psycopg2.OperationalError, ConnectionLostError),  # admin shutdown
    ("08006", psycopg2.OperationalError, ConnectionLostError),
    ("XX000", psycopg2.InternalError, SourceError),  # anything else: retried
])
def test_stream_errors_are_classified(code: str | None, base: type[psycopg2.Error],
                                      expected: type[Exception]) -> None:
    error = fetcher()._stream_error(_pg_error(code, "boom for S3cret-pw", base),
                                    "replication stream ended")
    assert type(error) is expected
    assert "S3cret-pw" not in str(error)
    assert str(error).startswith("PostgreSQL postgresql://databus:***@db:5432/shop")


# -- REPLICA IDENTITY USING INDEX of other columns than the primary key --------------------

INDEXED = ((False, "id", INT4), (True, "code", TEXT), (False, "note", TEXT))


def test_a_delete_whose_identity_lacks_the_primary_key_is_refused_not_keyed_none() -> None:
    """The events are keyed by the primary key, but such a table's deletes carry only
    the identity index's columns: no event with a made-up key."""
    stream, sink, _ = make()
    stream.feed(relation(identity="i", columns=INDEXED))
    feed(stream, txn(100, ins("1", "c1", "a")))  # inserts are fine
    stream.feed(Begin(200, 0, 1))
    with pytest.raises(SourceQuarantinedError) as info:
        stream.feed(Delete(ORDERS, (None, "c1", None), True))
    assert info.value.source == "public.orders" and "primary key (id)" in info.value.reason
    assert "REPLICA IDENTITY DEFAULT" in info.value.fix
    assert [e[3] for e in sink.events()] == [1]


def test_an_update_of_the_identity_columns_without_the_primary_key_is_refused() -> None:
    stream, sink, _ = make()
    stream.feed(relation(identity="i", columns=INDEXED))
    # Identity unchanged: no old tuple, an upsert by the primary key.
    feed(stream, txn(100, Update(ORDERS, ("1", "c1", "b"), None, False)))
    stream.feed(Begin(200, 0, 1))
    with pytest.raises(SourceQuarantinedError, match="primary key"):
        stream.feed(Update(ORDERS, ("1", "c2", "b"), (None, "c1", None), True))
    assert [(e[1], e[3]) for e in sink.events()] == [(Op.UPSERT, 1)]


# -- per-source quarantine (DESIGN 17) -------------------------------------------------------

NUMERIC = 1700


def quarantining(info: Any = table_info) -> tuple[ChangeStream, Sink, list[SourceFailure]]:
    sink, failures = Sink(), []
    stream = ChangeStream(sink, Catalog(), 3, wanted, info, None,
                          quarantine=failures.append)
    return stream, sink, failures


def numeric_info(rel: Relation) -> TableInfo:
    base = table_info(rel)
    typmod = ((10 << 16) | 2) + 4  # numeric(10,2)
    return TableInfo(base.primary_key, base.not_null, tuple(
        column_mapping(NUMERIC, typmod, {}) if c.type_oid == NUMERIC else m
        for c, m in zip(rel.columns, base.mappings, strict=True)))


ITEMS = 16500
PRICED = ((True, "id", INT4), (False, "price", NUMERIC))


def test_a_value_its_schema_refuses_quarantines_that_table_and_the_others_flow() -> None:
    stream, sink, failures = quarantining(numeric_info)
    stream.feed(relation(ITEMS, "items", columns=PRICED))
    stream.feed(relation())
    feed(stream, txn(100, Insert(ITEMS, ("1", "1.50")), ins("1", "a")))
    # NaN: no numeric(10,2) Avro decimal holds it.
    feed(stream, txn(200, ins("2", "b"), Insert(ITEMS, ("2", "NaN")), ins("3", "c")))
    feed(stream, txn(300, Insert(ITEMS, ("3", "2.00")), ins("4", "d")))
    [failure] = failures
    assert (failure.source, failure.scn) == ("public.items", 200)
    assert failure.reason == ("a value of column 'price' (numeric(10,2)) cannot be held by "
                              "its schema")  # never the value
    assert failure.fix.endswith("databus relay heal --relay URL --source public.items")
    ids = {"public.items": 1, "public.orders": 2}
    assert [(c[1], c[6], c[2], c[3]) for c in sink.events()] == [
        (Op.UPSERT, 100, ids["public.items"], 1), (Op.UPSERT, 100, ids["public.orders"], 1),
        (Op.UPSERT, 200, ids["public.orders"], 2), (Op.UPSERT, 200, ids["public.orders"], 3),
        (Op.UPSERT, 300, ids["public.orders"], 4)]
    assert ("rollback",) not in sink.calls


def test_a_failure_after_the_tables_first_changes_rereads_the_transaction() -> None:
    stream, sink, failures = quarantining(numeric_info)
    stream.feed(relation(ITEMS, "items", columns=PRICED))
    stream.feed(relation())
    stream.feed(Begin(200, 0, 1))
    stream.feed(Insert(ITEMS, ("1", "1.00")))
    stream.feed(ins("1", "a"))
    with pytest.raises(RereadError) as info:
        stream.feed(Insert(ITEMS, ("2", "NaN")))
    assert info.value.retriable
    assert [f.source for f in failures] == ["public.items"]
    assert sink.calls[-1] == ("rollback",)
    # The fetcher started again with the table quarantined: it is left out from the start.
    stream, sink, failures = quarantining(numeric_info)
    stream.quarantined.add("public.items")
    stream.feed(relation(ITEMS, "items", columns=PRICED))
    stream.feed(relation())
    feed(stream, txn(200, Insert(ITEMS, ("1", "1.00")), ins("1", "a"),
                     Insert(ITEMS, ("2", "NaN"))))
    assert failures == [] and [c[3] for c in sink.events()] == [1]


def test_a_healed_table_skips_what_the_last_run_read_before_the_heal() -> None:
    """After ``databus relay heal`` the fetcher resumes after the buffer's end, which may
    be before transactions of the table the last run read (they wrote no window): the
    heal's dump brings those, and a failure among them must not set it aside again."""
    sink, failures = Sink(), []
    stream = ChangeStream(sink, Catalog(), 3, wanted, numeric_info, None,
                          quarantine=failures.append, healed={"public.items": 200})
    stream.feed(relation(ITEMS, "items", columns=PRICED))
    stream.feed(relation())
    feed(stream, txn(150, Insert(ITEMS, ("1", "NaN")), ins("1", "a")))
    feed(stream, txn(200, Insert(ITEMS, ("2", "2.00"))))
    feed(stream, txn(300, Insert(ITEMS, ("3", "3.00")), ins("2", "b")))
    assert failures == [] and stream.healed == {}
    assert [(c[6], c[3]) for c in sink.events()] == [(150, 1), (300, 3), (300, 2)]


def test_a_table_without_primary_key_under_full_has_nullable_columns() -> None:
    """Every column is the replica identity (FULL), none is NOT NULL: a NULL is a value,
    not a failure (issue 28: 'must be string on field note')."""
    stream, sink, catalog = make(info=no_key_info)
    stream.feed(relation(identity="f", columns=((True, "id", INT4), (True, "note", TEXT))))
    feed(stream, txn(100, Insert(ORDERS, ("1", None)), Insert(ORDERS, (None, "x"))))
    feed(stream, txn(200, Update(ORDERS, ("1", "y"), ("1", None), False)))
    rows = [(e[1], e[3], catalog.decode("public.orders", e[4], e[5]) if e[4] else None)
            for e in sink.events()]
    assert rows == [
        (Op.UPSERT, (1, None), {"id": 1, "note": None}),
        (Op.UPSERT, (None, "x"), {"id": None, "note": "x"}),
        (Op.DELETE, (1, None), None),
        (Op.UPSERT, (1, "y"), {"id": 1, "note": "y"})]


# -- the fetcher's loop on a fake replication connection ------------------------------------


class FakeMessage:
    def __init__(self, message: PgOutputMessage, data_start: int) -> None:
        from tests.unit.test_pgoutput import encode

        self.payload = encode(message)  # the bytes psycopg2 hands over
        self.data_start = data_start


class FakeReplication:
    """A replication connection and cursor in one: an endless stream of one-row
    transactions that never pauses (``read_message`` never returns None) for
    ``seconds``, then ``stop`` is set; or ``error`` raised at the first read."""

    def __init__(self, stop: Any, seconds: float, error: Exception | None = None) -> None:
        import time

        self.stop = stop
        self.deadline = time.monotonic() + seconds
        self.error = error
        self.started: dict[str, Any] = {}
        self.feedback: list[int] = []
        self.confirmable_then: list[int | None] = []
        self.pending: list[PgOutputMessage] = [relation()]
        self.lsn = 1000
        self.stream: ChangeStream | None = None

    def cursor(self) -> FakeReplication:
        return self

    def start_replication(self, **kwargs: Any) -> None:
        self.started = kwargs

    def read_message(self) -> FakeMessage:
        import time

        if self.error is not None:
            raise self.error
        if time.monotonic() > self.deadline:
            self.stop.set()
        if not self.pending:
            self.lsn += 100
            self.pending = txn(self.lsn, ins(str(self.lsn), "x"), end=self.lsn + 40)
        return FakeMessage(self.pending.pop(0), self.lsn)

    def send_feedback(self, write_lsn: int = 0, flush_lsn: int = 0, apply_lsn: int = 0,
                      reply: bool = False, force: bool = False) -> None:
        self.feedback.append(flush_lsn)

    def close(self) -> None:
        pass


def run_on_fakes(monkeypatch: pytest.MonkeyPatch, repl: FakeReplication,
                 uri: str = URI + "&status_interval_s=0.05") -> tuple[LogicalFetcher, Sink]:
    import threading

    flushes: list[int] = []
    context = FetcherContext("pg", 0, Catalog(), flush_buffer=lambda: flushes.append(1))
    fetcher = LogicalFetcher(uri, context)
    monkeypatch.setattr(fetcher, "_connect", lambda replication=False: (
        repl if replication else FakeConnection({})))
    monkeypatch.setattr(fetcher, "_preflight", lambda side, after=None: None)
    monkeypatch.setattr(fetcher, "_report_slot", lambda side: None)
    monkeypatch.setattr(fetcher, "_table_info", table_info)
    sink = Sink()
    fetcher.run(sink, None, repl.stop if repl.stop is not None else threading.Event())
    assert len(flushes) >= len(repl.feedback) > 0 or repl.error is not None
    return fetcher, sink


def test_a_stream_that_never_pauses_is_still_confirmed_as_it_goes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    repl = FakeReplication(threading.Event(), seconds=0.6)
    _fetcher, sink = run_on_fakes(monkeypatch, repl)
    ends = [c for c in sink.calls if c[0] == "end"]
    assert len(ends) > 100
    # Several confirmations while the stream ran, each the end of a committed window.
    assert len(repl.feedback) >= 3, repl.feedback
    assert repl.feedback == sorted(repl.feedback)
    assert all((lsn - 1040) % 100 == 0 for lsn in repl.feedback)
    # psycopg2 refuses a status interval under 1 s; the fetcher's own is 0.05 s.
    assert repl.started["status_interval"] == 1.0
    assert repl.started["options"] == {"proto_version": "1", "publication_names": "p1",
                                       "messages": "true"}


@pytest.mark.parametrize(("error", "expected"), [
    (_pg_error(None, "no COPY in progress"), ConnectionLostError),
    (_pg_error("42704", 'publication "p1" does not exist', psycopg2.ProgrammingError),
     SourceMisconfiguredError),
])
def test_errors_of_the_stream_are_classified(monkeypatch: pytest.MonkeyPatch,
                                             error: Exception,
                                             expected: type[Exception]) -> None:
    import threading

    repl = FakeReplication(threading.Event(), seconds=5, error=error)
    with pytest.raises(expected) as info:
        run_on_fakes(monkeypatch, repl)
    assert "replication stream ended" in str(info.value)


def test_a_null_in_a_column_not_null_now_gets_a_nullable_version() -> None:
    """NOT NULL comes from the catalog as it is now: a relay catching up across SET NOT
    NULL meets rows from before it."""
    def info(rel: Relation) -> TableInfo:
        return TableInfo(("id",), frozenset({"id", "note"}), table_info(rel).mappings)

    stream, sink, catalog = make(info=info)
    stream.feed(relation())
    feed(stream, txn(100, ins("1", "a"), ins("2", None), ins("3", "c")))
    versions = catalog.versions["public.orders"]
    assert [dict((f["name"], f["type"]) for f in v.fields)["note"] for v in versions] == [
        "string", ["null", "string"]]
    events = sink.events()
    assert [e[5] for e in events] == [versions[0].fingerprint, versions[1].fingerprint,
                                      versions[1].fingerprint]
    assert [catalog.decode("public.orders", e[4], e[5])["note"] for e in events] == [
        "a", None, "c"]


def test_the_dump_source_lists_captured_tables_only() -> None:
    """With ``tables=public.*`` and ``heartbeat=table`` the publication has the
    heartbeat and watermark tables too: neither is a source, so neither is dumped."""
    from databus.fetchers.postgres._dump import LogicalDumpSource
    from databus.fetchers.postgres._uri import parse_logical_source

    conn = FakeConnection({"SELECT schemaname, tablename FROM pg_publication_tables": [
        ("public", "orders"), ("public", "databus_heartbeat"),
        ("public", "databus_watermark"), ("sales", "items"), ("public", "items")]})
    conn.closed = False  # type: ignore[attr-defined]
    source = parse_logical_source(
        "postgresql://u@db/shop?tables=public.*&heartbeat=table")
    dump = LogicalDumpSource(source, FetcherContext("pg", 0, Catalog()), lambda: conn)
    assert dump.tables() == ["public.items", "public.orders"]
