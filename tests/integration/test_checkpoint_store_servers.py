"""The PostgreSQL and ZooKeeper checkpoint stores against real servers.

Each behaviour is tested on both stores through one factory: round trip, independent
consumers, persistence across instances, surviving a server restart or crash, a server
that is gone (a retriable ``ConnectionLostError``, then recovery), and damaged data
(``CheckpointError``, never ``None``).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import pytest
from kazoo.client import KazooClient

from databus.checkpoint import Checkpoint, Mode
from databus.client import CheckpointStore, PostgresCheckpointStore, ZooKeeperCheckpointStore
from databus.client._checkpoint_envelope import decode_envelope
from databus.errors import CheckpointError, ConfigError, ConnectionLostError, DatabusError
from tests.fixtures.servers import PostgresServer, ZooKeeperServer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

BOOTSTRAP = Checkpoint(
    -1,
    mode=Mode.BOOTSTRAP_CATCHUP,
    bootstrap_start_scn=10,
    bootstrap_target_scn=20,
    bootstrap_source_index=0,
    bootstrap_last_key="k\u00e9y\u0000",  # NUL: why the column is text and not jsonb
)
ZK_ROOT = "/databus-test/checkpoints"


class Backend:
    """One store kind: how to make a store, how to reach its raw data, its server."""

    kind: str

    def make(self, consumer: str, **kwargs: Any) -> CheckpointStore:
        raise NotImplementedError

    def write_raw(self, consumer: str, raw: bytes) -> None:
        """Put ``raw`` where the store keeps ``consumer``'s checkpoint, bypassing it."""
        raise NotImplementedError

    def read_raw(self, consumer: str) -> bytes:
        raise NotImplementedError

    def restart(self, *, crash: bool) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError


class PostgresBackend(Backend):
    kind = "postgres"

    def __init__(self, server: PostgresServer) -> None:
        self.server = server

    def make(self, consumer: str, **kwargs: Any) -> CheckpointStore:
        return PostgresCheckpointStore(self.server.dsn, consumer, **kwargs)

    def _execute(self, query: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(self.server.dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(query, args)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def write_raw(self, consumer: str, raw: bytes) -> None:
        self._execute(
            "INSERT INTO databus_checkpoints (consumer, checkpoint) VALUES (%s, %s) "
            "ON CONFLICT (consumer) DO UPDATE SET checkpoint = EXCLUDED.checkpoint",
            (consumer, raw.decode("latin-1")),
        )

    def read_raw(self, consumer: str) -> bytes:
        rows = self._execute(
            "SELECT checkpoint FROM databus_checkpoints WHERE consumer = %s", (consumer,))
        return str(rows[0][0]).encode("ascii")

    def restart(self, *, crash: bool) -> None:
        self.server.restart(crash=crash)

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server.start()


class ZooKeeperBackend(Backend):
    kind = "zookeeper"

    def __init__(self, server: ZooKeeperServer) -> None:
        self.server = server

    def make(self, consumer: str, **kwargs: Any) -> CheckpointStore:
        kwargs.setdefault("root", ZK_ROOT)
        return ZooKeeperCheckpointStore(self.server.hosts, consumer, **kwargs)

    def _client(self) -> KazooClient:
        client = KazooClient(hosts=self.server.hosts, timeout=5.0)
        client.start(timeout=15)
        return client

    def write_raw(self, consumer: str, raw: bytes) -> None:
        client = self._client()
        try:
            path = f"{ZK_ROOT}/{consumer}"
            client.ensure_path(path)
            client.set(path, raw)
        finally:
            client.stop()
            client.close()

    def read_raw(self, consumer: str) -> bytes:
        client = self._client()
        try:
            data, _stat = client.get(f"{ZK_ROOT}/{consumer}")
            return bytes(data)
        finally:
            client.stop()
            client.close()

    def restart(self, *, crash: bool) -> None:
        self.server.restart(crash=crash)

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server.start()


@pytest.fixture(params=["postgres", "zookeeper"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "postgres":
        return PostgresBackend(request.getfixturevalue("postgres_server"))
    return ZooKeeperBackend(request.getfixturevalue("zookeeper_server"))


@pytest.fixture
def make_store(backend: Backend) -> Iterator[Callable[..., CheckpointStore]]:
    """``make_store(consumer, **kwargs)``. Every store made is closed after the test."""
    stores: list[CheckpointStore] = []

    def make(consumer: str, **kwargs: Any) -> CheckpointStore:
        store = backend.make(consumer, **kwargs)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def consumer() -> str:
    return f"consumer-{uuid.uuid4().hex[:12]}"


# -- behaviour common to both stores ------------------------------------------------------


@pytest.mark.parametrize("checkpoint", [Checkpoint(1234), Checkpoint(99, 4), BOOTSTRAP])
def test_round_trip(
    make_store: Callable[..., CheckpointStore], consumer: str, checkpoint: Checkpoint
) -> None:
    store = make_store(consumer)
    assert store.load() is None
    store.store(checkpoint)
    assert store.load() == checkpoint
    store.store(Checkpoint(5000))
    assert store.load() == Checkpoint(5000)


def test_stored_data_is_the_shared_envelope(
    make_store: Callable[..., CheckpointStore], backend: Backend, consumer: str
) -> None:
    make_store(consumer).store(BOOTSTRAP)
    raw = backend.read_raw(consumer)
    assert decode_envelope(raw, where="w", recovery="r") == BOOTSTRAP
    assert json.loads(raw)["format"] == 1


def test_two_consumers_are_independent(
    make_store: Callable[..., CheckpointStore], consumer: str
) -> None:
    a, b = make_store(consumer + "-a"), make_store(consumer + "-b")
    a.store(Checkpoint(1))
    assert b.load() is None
    b.store(Checkpoint(2))
    a.store(Checkpoint(3))
    assert (a.load(), b.load()) == (Checkpoint(3), Checkpoint(2))


def test_a_new_instance_reads_what_the_old_one_stored(
    make_store: Callable[..., CheckpointStore], consumer: str
) -> None:
    first = make_store(consumer)
    first.store(Checkpoint(777, 2))
    first.close()
    assert make_store(consumer).load() == Checkpoint(777, 2)


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "crash-restart"])
def test_survives_a_server_restart(
    make_store: Callable[..., CheckpointStore], backend: Backend, consumer: str, crash: bool
) -> None:
    store = make_store(consumer)
    store.store(Checkpoint(100))
    backend.restart(crash=crash)
    # The same instance reconnects by itself. How soon is the machine's business (a
    # ZooKeeper JVM that has just bound its port can hold a connection a while before it
    # answers): until then a call fails with the retriable ConnectionLostError, nothing else.
    assert wait_until(store.load, "the same store reading again after the restart", 60,
                      ignore=(ConnectionLostError,)) == Checkpoint(100)
    store.store(Checkpoint(101))
    assert store.load() == Checkpoint(101)
    assert make_store(consumer).load() == Checkpoint(101)


def test_server_gone_is_a_retriable_connection_lost_then_recovers(
    make_store: Callable[..., CheckpointStore], backend: Backend, consumer: str
) -> None:
    store = make_store(consumer, **({"timeout": 2.0} if backend.kind == "zookeeper" else {}))
    store.store(Checkpoint(1))
    backend.stop()
    try:
        with pytest.raises(ConnectionLostError) as info:
            store.store(Checkpoint(2))
        assert info.value.retriable
        with pytest.raises(ConnectionLostError):
            store.load()
    finally:
        backend.start()
    assert store.load() == Checkpoint(1)  # the failed store changed nothing
    store.store(Checkpoint(3))
    assert store.load() == Checkpoint(3)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json at all", "not valid JSON"),
        (b'{"format":1,"checkpoint":{"window_s', "truncated"),
        (b"[]", "not an envelope"),
        (b'{"window_scn": 5}', "no 'format' field"),
    ],
)
def test_damaged_data_raises_checkpoint_error(
    make_store: Callable[..., CheckpointStore],
    backend: Backend,
    consumer: str,
    raw: bytes,
    reason: str,
) -> None:
    store = make_store(consumer)
    # The store prepares its table on first use: this test's may be the first of its
    # server (tests run in any order), and the damaged row goes into that table.
    assert store.load() is None
    backend.write_raw(consumer, raw)
    with pytest.raises(CheckpointError) as info:
        store.load()
    message = str(info.value)
    assert consumer in message and reason in message, message
    assert "delete" in message  # tells how to recover
    assert not info.value.retriable


def test_an_edited_checkpoint_fails_its_crc(
    make_store: Callable[..., CheckpointStore], backend: Backend, consumer: str
) -> None:
    store = make_store(consumer)
    store.store(Checkpoint(1234))
    raw = backend.read_raw(consumer)
    edited = raw.replace(b'"window_scn":1234', b'"window_scn":9234')
    assert edited != raw
    backend.write_raw(consumer, edited)
    with pytest.raises(CheckpointError, match="checksum does not match"):
        store.load()
    # Storing a new checkpoint is the deliberate way out.
    store.store(Checkpoint(9234))
    assert store.load() == Checkpoint(9234)


def test_concurrent_stores_from_threads(
    make_store: Callable[..., CheckpointStore], consumer: str
) -> None:
    store = make_store(consumer)
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for i in range(20):
                store.store(Checkpoint(w * 100 + i))
                store.load()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.load() in {Checkpoint(w * 100 + 19) for w in range(6)}


def test_close_is_idempotent_and_final(
    make_store: Callable[..., CheckpointStore], consumer: str
) -> None:
    store = make_store(consumer)
    store.store(Checkpoint(1))
    store.close()
    store.close()
    with pytest.raises(DatabusError, match="closed"):
        store.load()


# -- PostgreSQL only ----------------------------------------------------------------------


def test_postgres_reconnects_once_after_its_backend_is_killed(
    postgres_server: PostgresServer, consumer: str
) -> None:
    with PostgresCheckpointStore(postgres_server.dsn, consumer) as store:
        store.store(Checkpoint(1))
        conn = psycopg2.connect(postgres_server.dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'databus-checkpoint-store' AND pid <> pg_backend_pid()"
            )
            assert cur.fetchall()
        conn.close()
        store.store(Checkpoint(2))  # transparently on a new connection
        assert store.load() == Checkpoint(2)


def test_postgres_accepts_a_schema_qualified_table_and_an_existing_jsonb_column(
    postgres_server: PostgresServer, consumer: str
) -> None:
    conn = psycopg2.connect(postgres_server.dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE SCHEMA IF NOT EXISTS cp_schema")
        cur.execute("DROP TABLE IF EXISTS cp_schema.jsonb_checkpoints")
        cur.execute(
            "CREATE TABLE cp_schema.jsonb_checkpoints (consumer text PRIMARY KEY, "
            "checkpoint jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
        )
    checkpoint = Checkpoint(
        -1, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=3, bootstrap_source_index=0,
        bootstrap_last_key="zz\u00e9",
    )
    with PostgresCheckpointStore(postgres_server.dsn, consumer,
                                 table="cp_schema.jsonb_checkpoints") as store:
        store.store(checkpoint)
        # jsonb reordered and re-spaced the envelope; the CRC still verifies.
        assert store.load() == checkpoint
    with conn.cursor() as cur:
        cur.execute("SELECT checkpoint->'checkpoint'->>'bootstrap_start_scn', updated_at "
                    "FROM cp_schema.jsonb_checkpoints WHERE consumer = %s", (consumer,))
        scn, updated_at = cur.fetchone() or (None, None)
    conn.close()
    assert scn == "3" and updated_at is not None


def test_postgres_creates_its_table(postgres_server: PostgresServer, consumer: str) -> None:
    table = f"cp_{uuid.uuid4().hex[:8]}"
    with PostgresCheckpointStore(postgres_server.dsn, consumer, table=table) as store:
        assert store.load() is None
        store.store(Checkpoint(5))
    conn = psycopg2.connect(postgres_server.dsn)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = %s ORDER BY ordinal_position", (table,))
        columns = cur.fetchall()
    conn.close()
    assert columns == [("consumer", "text"), ("checkpoint", "text"),
                       ("updated_at", "timestamp with time zone")]


@pytest.mark.parametrize(
    "table",
    ['x"; DROP TABLE databus_checkpoints; --', "a.b.c", "1abc", "", "t-t", "a" * 64, "a. b"],
)
def test_postgres_rejects_unsafe_table_names(table: str) -> None:
    with pytest.raises(ConfigError, match="checkpoint table"):
        PostgresCheckpointStore("host=127.0.0.1", "c", table=table)


@pytest.mark.parametrize(
    "dsn",
    [
        "host=127.0.0.1 port=1 user=u password=hunter2-secret dbname=d connect_timeout=2",
        "postgresql://u:hunter2-secret@127.0.0.1:1/d?connect_timeout=2",
    ],
)
def test_postgres_password_never_appears_in_errors_logs_or_repr(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = PostgresCheckpointStore(dsn, "c")
    with pytest.raises(ConnectionLostError) as info:
        store.load()
    store.close()
    seen = [str(info.value), repr(info.value), repr(store), caplog.text]
    assert "127.0.0.1:1" in str(info.value)  # the server is named...
    assert not any("hunter2" in text for text in seen)  # ...the password is not
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_postgres_invalid_dsn_does_not_echo_it() -> None:
    with pytest.raises(ConfigError) as info:
        PostgresCheckpointStore("host=x password=hunter2 'broken", "c")
    assert "hunter2" not in str(info.value)


def test_postgres_null_checkpoint_column(postgres_server: PostgresServer, consumer: str) -> None:
    table = f"cp_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(postgres_server.dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (consumer text PRIMARY KEY, checkpoint text, "
                    "updated_at timestamptz)")
        cur.execute(f"INSERT INTO {table} VALUES (%s, NULL, now())", (consumer,))
    conn.close()
    with (PostgresCheckpointStore(postgres_server.dsn, consumer, table=table) as store,
          pytest.raises(CheckpointError, match="NULL")):
        store.load()


# -- ZooKeeper only -----------------------------------------------------------------------


def test_zookeeper_empty_znode_is_damage_not_absence(
    zookeeper_server: ZooKeeperServer, consumer: str
) -> None:
    # The store never creates the znode without data. An empty one was made by
    # something else, e.g. ensure_path by hand.
    client = KazooClient(hosts=zookeeper_server.hosts, timeout=5.0)
    client.start(timeout=15)
    client.ensure_path(f"{ZK_ROOT}/{consumer}")
    client.stop()
    client.close()
    with ZooKeeperCheckpointStore(zookeeper_server.hosts, consumer, root=ZK_ROOT) as store, \
            pytest.raises(CheckpointError, match="is empty"):
        store.load()


def test_zookeeper_creates_parents_and_a_persistent_znode(
    zookeeper_server: ZooKeeperServer, consumer: str
) -> None:
    root = f"/databus-test/{uuid.uuid4().hex[:8]}/deep/"
    with ZooKeeperCheckpointStore(zookeeper_server.hosts, consumer, root=root) as store:
        assert store.path == f"{root.rstrip('/')}/{consumer}"
        store.store(Checkpoint(42))
    client = KazooClient(hosts=zookeeper_server.hosts, timeout=5.0)
    client.start(timeout=15)
    try:
        data, stat = client.get(f"{root}{consumer}")
        assert stat.ephemeralOwner == 0  # outlives the store's session
        assert decode_envelope(data, where="w", recovery="r") == Checkpoint(42)
    finally:
        client.stop()
        client.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"consumer": "a/b"}, "consumer name"),
        ({"consumer": ".."}, "consumer name"),
        ({"consumer": ""}, "consumer name"),
        ({"root": "relative/path"}, "absolute path"),
        ({"root": "/a//b"}, "invalid component"),
        ({"root": "/a/../b"}, "invalid component"),
        ({"timeout": 0}, "positive"),
    ],
)
def test_zookeeper_rejects_bad_paths(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"hosts": "127.0.0.1:2181", "consumer": "c", **kwargs}
    with pytest.raises(ConfigError, match=match):
        ZooKeeperCheckpointStore(**args)


def test_zookeeper_unreachable_at_start(consumer: str) -> None:
    # Port 1 on localhost: nothing listens, the connection is refused at once.
    with ZooKeeperCheckpointStore("127.0.0.1:1", consumer, timeout=1.0) as store, \
            pytest.raises(ConnectionLostError, match="cannot connect to ZooKeeper"):
        store.load()


def test_postgres_partition_rows_of_a_consumer_group(
    postgres_server: PostgresServer, consumer: str
) -> None:
    """A group member's per-partition checkpoints: rows ``<consumer>#<p>``, written in
    one transaction; a missing row is None, a damaged one a clear error naming it."""
    with PostgresCheckpointStore(postgres_server.dsn, consumer) as store:
        assert store.load_partitions([0, 1, 2]) == {0: None, 1: None, 2: None}
        store.store_partitions([0, 2], Checkpoint(7))
        store.store_partitions([2], Checkpoint(9))
        assert store.load_partitions([0, 1, 2]) == {0: Checkpoint(7), 1: None,
                                                    2: Checkpoint(9)}
        assert store.load() is None  # the consumer's own row is another row
        conn = psycopg2.connect(postgres_server.dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("UPDATE databus_checkpoints SET checkpoint = '{\"format\": 1}' "
                        "WHERE consumer = %s", (f"{consumer}#2",))
        conn.close()
        with pytest.raises(CheckpointError, match=f"partition 2 .'{consumer}#2'"):
            store.load_partitions([0, 2])
