"""The bootstrap store contract, run against PostgreSQL and SQLite alike."""

from __future__ import annotations

from pathlib import Path

import psycopg2
import pytest

from databus.bootstrap._storage import BootstrapStorage, LogBatch, open_storage
from databus.checkpoint import Checkpoint
from databus.errors import (
    ConfigError,
    FilterNotPushableError,
    StorageUnavailableError,
    UnknownSourceError,
)
from databus.event import Op, decode_event
from databus.filters import FilterSpec
from tests.fixtures.servers import PostgresServer
from tests.integration.bootstrap_support import change, drop_schema, storage_url, window

pytestmark = pytest.mark.integration

A, B = "shop.orders", "shop.items"


def keys_of(rows: list) -> list:  # type: ignore[type-arg]
    return [decode_event(r.event).key for r in rows]


def fill(store: BootstrapStorage) -> None:
    """Windows 10..60 over two sources: updates, a delete, a two-source transaction."""
    store.append([
        window(10, [change(10, A, 1, b"a1"), change(10, A, 2, b"a2")]),
        window(20, [change(20, A, 1, b"a1'"), change(20, B, "x", b"bx")]),
        window(30, [change(30, A, 3, b"a3")]),
    ], Checkpoint(30), log_floor_scn=0)
    store.append([
        window(40, [change(40, A, 2, b"", Op.DELETE)]),
        window(50, [change(50, B, "y", b"by"), change(50, A, 4, b"a4")]),
        window(60, [change(60, A, 1, b"a1''")]),
    ], Checkpoint(60))


def test_append_then_apply_keeps_the_latest_row_per_key(store: BootstrapStorage) -> None:
    fill(store)
    assert store.producer_checkpoint() == Checkpoint(60)
    assert store.state().producer_scn == 60
    assert store.state().applied_scn is None
    results = []
    while (r := store.apply(max_rows=3)) is not None:
        results.append(r)
    # Whole windows per batch, in order, ending at the log's end.
    assert [r.to_scn for r in results] == [20, 50, 60]
    assert sum(r.rows for r in results) == 9
    state = store.state()
    assert state.applied_scn == 60
    assert state.snapshot_rows == {A: 3, B: 2}
    assert state.applier_rows == 9
    # new keys: 1, 2, x, 3, y, 4 -> 6 of 9 rows
    assert state.applier_new_keys == 6
    assert state.update_ratio == pytest.approx(1 - 6 / 9)
    full = store.snapshot_batch(A, after_key=None, since_scn=None, limit=100,
                                filter=FilterSpec())
    assert keys_of(full) == [1, 3, 4]
    assert [decode_event(r.event).value for r in full] == [b"a1''", b"a3", b"a4"]
    assert [r.scn for r in full] == [60, 30, 50]


def test_snapshot_is_read_in_batches_by_key_and_delta_keeps_tombstones(
        store: BootstrapStorage) -> None:
    fill(store)
    while store.apply(max_rows=100):
        pass
    first = store.snapshot_batch(A, after_key=None, since_scn=None, limit=2, filter=FilterSpec())
    rest = store.snapshot_batch(A, after_key=first[-1].key, since_scn=None, limit=2,
                                filter=FilterSpec())
    assert keys_of(first) + keys_of(rest) == [1, 3, 4]
    # A delta comes in (scn, key) order and resumes after an (scn, key) pair.
    delta = store.snapshot_batch(A, after_key=None, since_scn=30, limit=100, filter=FilterSpec())
    assert [(decode_event(r.event).key, r.scn, r.op) for r in delta] == [
        (2, 40, int(Op.DELETE)), (4, 50, int(Op.UPSERT)), (1, 60, int(Op.UPSERT))]
    head = store.snapshot_batch(A, after_key=None, since_scn=30, limit=1, filter=FilterSpec())
    tail = store.snapshot_batch(A, after_key=head[-1].key, after_scn=head[-1].scn,
                                since_scn=30, limit=100, filter=FilterSpec())
    assert keys_of(head) + keys_of(tail) == [2, 4, 1]
    # A key whose SCN moved up after it was read comes again, never is skipped.
    store.append([window(70, [change(70, A, 2, b"again")])], Checkpoint(70))
    while store.apply(max_rows=100):
        pass
    tail = store.snapshot_batch(A, after_key=head[-1].key, after_scn=head[-1].scn,
                                since_scn=30, limit=100, filter=FilterSpec())
    assert keys_of(tail) == [4, 1, 2]


def test_log_batches_are_whole_windows_in_commit_order(store: BootstrapStorage) -> None:
    fill(store)
    rows = store.log_batch([A, B], after_scn=10, upto_scn=60, limit=100, filter=FilterSpec())
    assert [(r.scn, r.seq) for r in rows] == [(20, 0), (20, 1), (30, 0), (40, 0), (50, 0),
                                              (50, 1), (60, 0)]
    # A limit inside window 50 stops before it; a limit smaller than one window gives
    # that whole window.
    cut = store.log_batch([A, B], after_scn=10, upto_scn=60, limit=4, filter=FilterSpec())
    assert [r.scn for r in cut] == [20, 20, 30, 40]
    one = store.log_batch([A, B], after_scn=40, upto_scn=60, limit=1, filter=FilterSpec())
    assert [(r.scn, r.seq) for r in one] == [(50, 0), (50, 1)]
    only_a = store.log_batch([A], after_scn=0, upto_scn=30, limit=100, filter=FilterSpec())
    assert [decode_event(r.event).key for r in only_a] == [1, 2, 1, 3]
    assert store.log_key_stats([A], after_scn=0, sample=1000) == (7, 4)


def test_filters_are_pushed_down_and_agree_with_the_relay(store: BootstrapStorage) -> None:
    changes = [change(100 + k, A, k - 50, f"v{k}".encode()) for k in range(100)]
    changes += [change(300 + k, B, f"key-{k}", b"s") for k in range(60)]
    store.append([window(scn_of(ev), [(src, ev)]) for src, ev in changes], Checkpoint(359))
    while store.apply(max_rows=50):
        pass
    specs = [
        FilterSpec.parse({A: {"type": "mod", "n": 3, "buckets": [0, 2]},
                          B: {"type": "hash", "n": 4, "buckets": [1]}}),
        FilterSpec.parse({A: {"type": "range", "lo": -10, "hi": 20}}),
    ]
    for spec in specs:
        for source, pushed in (
            (A, store.snapshot_batch(A, after_key=None, since_scn=None, limit=1000, filter=spec)),
            (B, store.snapshot_batch(B, after_key=None, since_scn=None, limit=1000, filter=spec)),
        ):
            everything = store.snapshot_batch(source, after_key=None, since_scn=None,
                                              limit=1000, filter=FilterSpec())
            expected = [r.key for r in everything
                        if spec.passes(source, decode_event(r.event).header.partition_key, r.key)]
            assert [r.key for r in pushed] == expected
            assert 0 < len(expected) <= len(everything)
        log = store.log_batch([A, B], after_scn=0, upto_scn=1000, limit=1000, filter=spec)
        every = store.log_batch([A, B], after_scn=0, upto_scn=1000, limit=1000,
                                filter=FilterSpec())
        names = {100 <= r.scn < 300: A for r in every} | {False: B}
        want = [r.scn for r in every if spec.passes(
            names[100 <= r.scn < 300], decode_event(r.event).header.partition_key,
            decode_event(r.event).key_bytes)]
        assert [r.scn for r in log] == want


def scn_of(event: bytes) -> int:
    return decode_event(event).scn


def test_a_hash_filter_on_a_store_without_key_hashes_is_refused(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    for kind in ("sqlite", "postgresql"):
        url = storage_url(kind, tmp_path / kind, request)
        store = open_storage(url, key_hash=False)
        try:
            store.append([window(1, [change(1, A, 1)])], Checkpoint(1))
            spec = FilterSpec.parse({A: {"type": "hash", "n": 2, "buckets": [0]}})
            with pytest.raises(FilterNotPushableError, match="hash"):
                store.snapshot_batch(A, after_key=None, since_scn=None, limit=10, filter=spec)
            with pytest.raises(FilterNotPushableError):
                store.log_batch([A], after_scn=0, upto_scn=9, limit=10, filter=spec)
            # The setting belongs to the store: reopening with another option keeps it.
            again = open_storage(url, key_hash=True)
            assert again.key_hash is False
            again.close()
        finally:
            store.close()
            if kind == "postgresql":
                drop_schema(request.getfixturevalue("postgres_server"), url)


def test_windows_must_come_after_the_log_end_and_a_failed_append_leaves_nothing(
        store: BootstrapStorage) -> None:
    fill(store)
    with pytest.raises(ValueError, match="after the log's end"):
        store.append([window(70, [change(70, A, 9)]), window(65, [change(65, A, 8)])],
                     Checkpoint(70))
    assert store.producer_checkpoint() == Checkpoint(60)
    assert store.state().producer_scn == 60
    assert store.log_batch([A], after_scn=60, upto_scn=100, limit=10, filter=FilterSpec()) == []


def test_retention_never_passes_the_applier_and_purges_old_tombstones(
        store: BootstrapStorage) -> None:
    fill(store)
    store.apply(max_rows=5)  # applies 10..30 (whole windows reaching 5 rows)
    applied = store.state().applied_scn
    assert applied == 30
    result = store.retain(cut_scn=1000)
    # Never beyond the applied SCN; PostgreSQL (span 100) cannot drop partition 0..99.
    state = store.state()
    if result.windows_dropped:
        assert state.log_floor_scn == 30
        assert store.log_batch([A, B], after_scn=0, upto_scn=100, limit=100,
                               filter=FilterSpec())[0].scn == 40
    else:
        assert state.log_floor_scn == 0
    while store.apply(max_rows=100):
        pass
    store.retain(cut_scn=1000)
    state = store.state()
    assert state.applied_scn == 60
    if state.log_windows == 0:
        assert state.log_floor_scn == 60
        # The tombstone of key 2 (SCN 40) is below the floor: no delta needs it.
        delta = store.snapshot_batch(A, after_key=None, since_scn=0, limit=100,
                                     filter=FilterSpec())
        assert 2 not in keys_of(delta)
    assert store.state().producer_scn == 60


def test_postgres_retention_drops_whole_partitions(postgres_server: PostgresServer,
                                                   tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    url = storage_url("postgresql", tmp_path, request, span=100)
    store = open_storage(url)
    try:
        store.append([window(scn, [change(scn, A, scn % 7)]) for scn in range(50, 450, 10)],
                     Checkpoint(440), log_floor_scn=0)
        schema = url.split("schema=")[1].split("&")[0]
        with psycopg2.connect(postgres_server.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s"
                        " AND tablename LIKE 'dbus_log_1_p%%'", (schema,))
            assert cur.fetchone()[0] == 6  # 0..4, and 5 made ahead of need
        while store.apply(max_rows=10):
            pass
        result = store.retain(cut_scn=250)  # partitions 0 and 1 are wholly <= 250
        assert result.log_floor_scn == 190
        with psycopg2.connect(postgres_server.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s"
                        " AND tablename LIKE 'dbus_log_1_p%%' ORDER BY 1", (schema,))
            assert [r[0] for r in cur.fetchall()] == ["dbus_log_1_p2", "dbus_log_1_p3",
                                                      "dbus_log_1_p4", "dbus_log_1_p5"]
        assert store.state().log_floor_scn == 190
        rows = store.log_batch([A], after_scn=0, upto_scn=1000, limit=1000, filter=FilterSpec())
        assert rows[0].scn == 200
    finally:
        store.close()
        drop_schema(postgres_server, url)


def test_retention_cut_by_time_and_size(store: BootstrapStorage) -> None:
    fill(store)  # window timestamps are scn * 1000 ns; every event is the same size
    assert store.retention_cut(older_than_ns=None, max_log_bytes=None) is None
    assert store.retention_cut(older_than_ns=35_000, max_log_bytes=None) == 30
    size = store.state().log_bytes
    one = size // 9  # nine events of equal size
    assert store.retention_cut(older_than_ns=None, max_log_bytes=size) is None
    assert store.retention_cut(older_than_ns=None, max_log_bytes=size - one) == 10


def test_schemas_and_sources(store: BootstrapStorage) -> None:
    big = (1 << 64) - 5  # fingerprints are unsigned 64-bit
    store.add_schema(big, A, '{"type": "record"}')
    store.add_schema(12, B, '{"x": 1}')
    store.add_schema(12, B, '{"x": 1}')  # idempotent
    assert store.schema(big) == '{"type": "record"}'
    assert store.schema(99) is None
    assert store.schemas() == [(big, A, '{"type": "record"}'), (12, B, '{"x": 1}')]
    ids = store.ensure_sources([A, B])
    assert sorted(ids) == sorted([A, B]) and len(set(ids.values())) == 2
    assert store.ensure_sources([B, A]) == ids
    with pytest.raises(UnknownSourceError):
        store.snapshot_batch("nope.t", after_key=None, since_scn=None, limit=1,
                             filter=FilterSpec())


def test_bad_urls_are_clear_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="postgresql:// or sqlite:///"):
        open_storage("mysql://x/y")
    with pytest.raises(ConfigError, match="needs a file"):
        open_storage("sqlite://:memory:")
    with pytest.raises(ConfigError, match="schema name"):
        open_storage("postgresql://u@127.0.0.1:1/db?schema=Bad;Name")


def test_an_unreachable_postgres_is_a_retriable_error_without_the_password() -> None:
    with pytest.raises(StorageUnavailableError) as info:
        open_storage("postgresql://u:s3cret@127.0.0.1:1/db", connect_timeout=1)
    assert info.value.retriable
    assert "s3cret" not in str(info.value)


def test_one_process_holds_each_component_of_a_store(store: BootstrapStorage) -> None:
    """Safe start (DESIGN 17): ``databus bootstrap`` holds the producer and the applier it
    runs before it takes their fencing tokens; another holder is refused, per component,
    until the first lets go (or ends)."""
    from databus.errors import AlreadyRunningError

    held = store.hold("producer")
    try:
        with pytest.raises(AlreadyRunningError, match="the producer of bootstrap store"):
            store.hold("producer")
        store.hold("applier").release()  # another component, another hold
    finally:
        held.release()
    store.hold("producer").release()


def _batch(windows: list[tuple[int, list[tuple[int, int | str]]]], *,
           verify: bool = True) -> LogBatch:
    """A producer's batch (``LogBatch``) of relay windows: (scn, [(relay source id,
    key)]), relay ids 1 = A, 2 = B."""
    from databus.bootstrap._producer import _Assembler
    from databus.event import WindowChecksum, encode_eow, encode_event

    events: list[bytes] = []
    for scn, rows in windows:
        check = WindowChecksum()
        for sid, key in rows:
            e = encode_event(scn=scn, source_id=sid, op=Op.UPSERT, key=key,
                             value=f"{scn}:{key}".encode(), timestamp_ns=scn * 1000)
            check.add_event(e)
            events.append(e)
        events.append(encode_eow(scn=scn, event_count=check.count, checksum=check.crc,
                                 timestamp_ns=scn * 1000))
    return _Assembler(key_hash=True, verify_windows=verify).feed(b"".join(events),
                                                                  {1: A, 2: B})


def test_a_producers_batch_is_stored_as_its_windows_would_be(
        store: BootstrapStorage) -> None:
    """The producer's path (PostgreSQL: binary COPY streams made in one call) stores
    what the same windows as ``LogWindow`` objects store; a batch out of order, or
    presented with a fence taken over, writes nothing and leaves the store usable."""
    from databus.bootstrap._storage import Fence, FencedError

    token = store.take_fence("producer")
    fence = Fence("producer", token)
    store.append(_batch([(10, [(1, 1), (1, 2)]), (20, [(2, "x"), (1, 1)]), (25, []),
                         (30, [(1, 3)])]), Checkpoint(30), log_floor_scn=5, fence=fence)
    rows = store.log_batch([A, B], after_scn=-1, upto_scn=100, limit=100,
                           filter=FilterSpec())
    assert [(r.scn, r.seq, decode_event(r.event).key, decode_event(r.event).value)
            for r in rows] == [(10, 0, 1, b"10:1"), (10, 1, 2, b"10:2"), (20, 0, "x", b"20:x"),
                               (20, 1, 1, b"20:1"), (30, 0, 3, b"30:3")]
    state = store.state()
    assert (state.producer_scn, state.log_floor_scn, state.log_windows) == (30, 5, 3)
    assert store.producer_checkpoint() == Checkpoint(30)
    for bad, error in ((_batch([(40, [(1, 4)]), (35, [(1, 5)])]), ValueError),
                       (_batch([(30, [(1, 4)])]), ValueError)):
        with pytest.raises(error, match="after the log's end"):
            store.append(bad, Checkpoint(40), fence=fence)
    newer = store.take_fence("producer")
    with pytest.raises(FencedError):
        store.append(_batch([(40, [(1, 4)])]), Checkpoint(40), fence=fence)
    assert store.producer_checkpoint() == Checkpoint(30)
    assert store.log_batch([A, B], after_scn=30, upto_scn=100, limit=10,
                           filter=FilterSpec()) == []
    store.append(_batch([(40, [(1, 4)])]), Checkpoint(40), log_floor_scn=0,
                 fence=Fence("producer", newer))
    state = store.state()
    assert (state.producer_scn, state.log_floor_scn, state.log_windows) == (40, 5, 4)
    store.append(_batch([(50, [(2, "y")])]), Checkpoint(50))  # an embedder without fence
    assert store.state().producer_scn == 50
    while store.apply(max_rows=100):
        pass
    assert store.state().snapshot_rows == {A: 4, B: 2}
