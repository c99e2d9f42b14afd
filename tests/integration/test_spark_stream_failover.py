"""The ``databus`` Spark streaming source across relay failures, on real ``databus
relay`` processes over one SQLite source (captured by triggers) while a writer commits
transactions and the query runs (local[2], two partitions):

- the relay stopped (SIGTERM) and, later, killed (SIGKILL), each time started again on
  its port, config and data dir while a micro-batch reads: the partitions' clients
  retry until it is back, and the query goes on;
- a leader-follower relay cluster of two members, the query finding them through
  ZooKeeper (options ``zookeeper`` and ``cluster``): the leader, which the query has
  been reading from, killed with SIGKILL while a micro-batch reads; the partitions fail
  over to the follower, which is promoted and reads the source on.

Each time, once the writer stopped and the query caught up, its rows are the changes
the relay serves: every change once (op, key, value), each window in one micro-batch,
every partition's rows in the relay's order (commit order per key).
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from databus.event import Op, decode_eow, decode_event, iter_events
from databus.schemas import AvroCodec, Schema
from tests.fixtures.servers import EnsembleChroot
from tests.integration.cluster_support import OrdersWriter, cluster_toml, get_json, wait_for
from tests.relay_harness import RelayProcess
from tests.unit.test_txlog_support import SqliteSource

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DDL = "CREATE TABLE orders (id INTEGER PRIMARY KEY, qty INTEGER)"
ORDERS = "shop.orders"
PARTITIONS = 2
CAPACITY_MB = 32  # holds every window of a test: the query starts at the oldest one

# One change as the query's row says it: (partition, scn, op, key JSON, seq, qty).
Change = tuple[int, int, str, str, int, int | None]


@pytest.fixture
def src(tmp_path: Path) -> Iterator[SqliteSource]:
    source = SqliteSource(tmp_path / "shop.db", DDL)
    source.install("orders")
    source.txn("INSERT INTO orders (id, qty) VALUES (1, 1)")
    try:
        yield source
    finally:
        source.close()


def relay_process(tmp_path: Path, name: str, src: SqliteSource, extra_toml: str = ""
                  ) -> RelayProcess:
    home = tmp_path / name
    home.mkdir()
    return RelayProcess(home, {"src": src.uri("orders", poll_ms=10)}, CAPACITY_MB,
                        workers=1, extra_toml=extra_toml)


def alive(relay: RelayProcess) -> bool:
    return relay.proc is not None and relay.proc.poll() is None


def max_scn(relay: RelayProcess) -> int | None:
    scn = relay.status()["buffers"]["src"]["max_scn"]
    return None if scn is None else int(scn)


def newest_window(relay: RelayProcess) -> int:
    """The relay's newest window SCN, once it has one."""
    scn = wait_for(lambda: max_scn(relay), "a window at the relay")
    assert scn is not None
    return scn


def source_newest(src: SqliteSource) -> int:
    (newest,) = src.conn.execute("SELECT max(scn) FROM databus_txlog").fetchone()
    return int(newest)


def caught_up(relays: list[RelayProcess], src: SqliteSource) -> int:
    """Once the writer stopped: every relay at the source's newest transaction."""
    newest = source_newest(src)
    wait_for(lambda: all(max_scn(r) == newest for r in relays),
             f"the relays at the source's newest SCN {newest}", 60)
    return newest


def relay_changes(url: str) -> list[Change]:
    """Every change the relay at ``url`` serves from its oldest window, in stream order,
    as the query's rows state them (partition: the key's mod bucket; seq: the change's
    position among its partition's changes of the window). CRCs and every window's EOW
    count are checked."""
    body, checkpoint = b"", None
    while True:
        query = {"sources": ORDERS, "max_bytes": str(4 << 20)}
        if checkpoint is not None:
            query["checkpoint"] = checkpoint
        with urllib.request.urlopen(f"{url}/v1/stream?{urllib.parse.urlencode(query)}",
                                    timeout=10) as resp:
            chunk = resp.read()
            checkpoint = resp.headers["X-Databus-Checkpoint"]
        if not chunk:
            break
        body += chunk
    codec = AvroCodec()
    out: list[Change] = []
    window: list[Change] = []
    for offset, header in iter_events(body):
        event = decode_event(body, offset)
        if header.is_eow:
            assert decode_eow(event).event_count == len(window), "a window not whole"
            out += window
            window = []
            continue
        if header.is_control:
            continue
        assert not window or window[0][1] == header.scn, "a window without its EOW"
        part = abs(header.partition_key) % PARTITIONS
        seq = sum(1 for c in window if c[0] == part)
        qty = None
        if header.op is Op.UPSERT:
            fingerprint = header.schema_fingerprint
            if not codec.has(fingerprint):
                doc = get_json(f"{url}/v1/schemas/{fingerprint:016x}")
                codec.add(Schema(doc["schema"]))
            qty = codec.decode(event.value, fingerprint)["qty"]
        op = "upsert" if header.op is Op.UPSERT else "delete"
        window.append((part, header.scn, op, json.dumps(event.key), seq, qty))
    assert not window, "the stream ends inside a window"
    return out


class RunningQuery:
    """A ``databus`` query writing through ``foreachBatch``: every row with its batch
    id. ``hold()`` stops the next micro-batch after Spark logged its offsets and before
    it reads them, until ``release()``: what happens to the relays meanwhile happens
    while that batch reads."""

    def __init__(self, spark: SparkSession, checkpoint: Path, options: dict[str, object]
                 ) -> None:
        self.rows: list[tuple[int, Row]] = []
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self.waiting = threading.Event()
        self.held_id = -1
        reader = spark.readStream.format("databus")
        for name, value in options.items():
            reader = reader.option(name, str(value))
        self.query = (reader.load().writeStream
                      .option("checkpointLocation", str(checkpoint))
                      .foreachBatch(self._batch)
                      .trigger(processingTime="200 milliseconds").start())

    def _batch(self, df: Any, batch_id: int) -> None:
        if not self._open.is_set():
            self.held_id = batch_id
            self.waiting.set()
            self._open.wait(300)
        rows = df.collect()
        with self._lock:
            self.rows += [(batch_id, r) for r in rows]

    def newest(self) -> int:
        """The newest SCN the query wrote (-1: none yet); fails if the query failed."""
        if not self.query.isActive:
            raise AssertionError(f"the query stopped: {self.query.exception()}")
        with self._lock:
            return max((r.scn for _, r in self.rows), default=-1)

    def wait_past(self, scn: int, what: str) -> None:
        wait_for(lambda: self.newest() > scn, what, 120)

    def hold(self) -> dict[int, int]:
        """Return once a micro-batch waits (its offsets logged, nothing read): each
        partition's start SCN in it (the query's rows so far are the windows up to
        there)."""
        self.waiting.clear()
        self._open.clear()
        wait_for(lambda: self.newest() >= -1 and self.waiting.is_set(),
                 "a micro-batch planned and held", 60)
        held = self.held_id

        def previous_end() -> dict[int, int] | None:
            # The last batch's progress (or, after a trigger with nothing new, an idle
            # one, which may carry the next batch's id: its offsets are the same).
            progress = self.query.lastProgress
            if progress is None or progress["batchId"] not in (held - 1, held):
                return None
            end = progress["sources"][0]["endOffset"]
            offset = json.loads(end) if isinstance(end, str) else end
            return {int(p): int(c["window_scn"]) for p, c in offset["checkpoints"].items()}

        starts = wait_for(previous_end, "the previous batch's end offset")
        assert starts is not None
        return starts

    def release(self) -> None:
        self._open.set()

    def finish(self) -> list[tuple[int, Row]]:
        """Read what is available, stop; every row with its batch id, in batch order."""
        self.release()
        try:
            self.query.processAllAvailable()
        finally:
            self.query.stop()
        assert self.query.exception() is None
        return list(self.rows)

    def stop(self) -> None:
        self.release()
        self.query.stop()


def as_change(row: Row) -> Change:
    return (row.partition, row.scn, row.op, row.key, row.seq,
            None if row.op == "delete" else row.qty)


def assert_every_change_once(got: list[tuple[int, Row]], truth: list[Change]) -> None:
    """The query's rows are ``truth``'s changes, each once; each partition's in their
    order (commit order per key); each window's in one micro-batch."""
    rows = [as_change(r) for _, r in got]
    assert len(rows) == len(truth)
    assert sorted(rows) == sorted(truth)
    for p in range(PARTITIONS):
        assert [c for c in rows if c[0] == p] == [c for c in truth if c[0] == p]
    batches: dict[int, set[int]] = {}
    for batch_id, r in got:
        batches.setdefault(r.scn, set()).add(batch_id)
    assert all(len(ids) == 1 for ids in batches.values())
    assert {r.source for _, r in got} == {ORDERS} and not any(r.from_snapshot for _, r in got)
    assert {c[0] for c in truth} == set(range(PARTITIONS))


def test_a_relay_stopped_and_killed_while_a_batch_reads_comes_back_and_the_query_goes_on(
        databus_spark: SparkSession, src: SqliteSource, tmp_path: Path) -> None:
    relay = relay_process(tmp_path, "relay", src)
    relay.start()
    writer = OrdersWriter(src.path, seed=33, delete_share=0.2, pause_s=0.01)
    query: RunningQuery | None = None
    try:
        writer.start()
        query = RunningQuery(databus_spark, tmp_path / "cp",
                             {"relays": relay.url, "sources": ORDERS,
                              "partitions": PARTITIONS})
        query.wait_past(newest_window(relay), "the query reads")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            # A micro-batch is planned and held; the relay goes down; the batch reads
            # (its clients find no relay, and retry); the relay comes back on its port,
            # config and data dir, with every window it had, and reads the source on.
            query.hold()
            relay.kill(sig)
            query.release()
            time.sleep(1.0)  # the batch's reads meet no relay: time passing is the point
            relay.start()
        query.wait_past(newest_window(relay),
                        "the query reads windows captured after the restarts")
        writer.stop()
        caught_up([relay], src)
        got = query.finish()
        truth = relay_changes(relay.url)
    finally:
        if writer.is_alive():
            writer.stop()
        if query is not None:
            query.stop()
        if alive(relay):
            relay.kill()
    assert_every_change_once(got, truth)


def role(relay: RelayProcess) -> str | None:
    cluster = relay.status()["buffers"]["src"].get("cluster") or {}
    found = cluster.get("role")
    return None if found is None else str(found)


def spark_readers(relay: RelayProcess) -> set[str]:
    """The query's partitions that have read from ``relay`` (its consumers list)."""
    doc = get_json(f"{relay.url}/v1/consumers")
    return {c["client_id"] for c in doc["consumers"]
            if str(c["client_id"]).startswith("spark-databus-")}


def test_the_leader_the_query_reads_from_killed_the_query_fails_over_through_zookeeper(
        databus_spark: SparkSession, src: SqliteSource, tmp_path: Path,
        zookeeper_chroot: EnsembleChroot) -> None:
    """The writer goes on through the kill. With a trigger-captured source the promoted
    member reads the source again from its own max SCN, and a stretch the killed leader
    had read may come out as other windows there (docs/clusters.md): the query's rows
    are the windows it read before the kill (up to the held batch's start, the killed
    leader's) and the survivor's after it, every change once."""
    relays = [relay_process(tmp_path, f"relay{i}", src, cluster_toml(zookeeper_chroot))
              for i in range(2)]
    for relay in relays:
        relay.start()
    writer = OrdersWriter(src.path, seed=34, delete_share=0.2, pause_s=0.01)
    query: RunningQuery | None = None
    try:
        leaders: list[RelayProcess] = wait_for(
            lambda: [r for r in relays if role(r) == "leader"], "a leader")
        leader = leaders[0]
        (follower,) = [r for r in relays if r is not leader]
        wait_for(lambda: role(follower) == "follower"
                 and follower.status()["buffers"]["src"]["fetcher"]["state"] == "running",
                 "the follower chains from the leader")
        writer.start()
        query = RunningQuery(databus_spark, tmp_path / "cp",
                             {"zookeeper": zookeeper_chroot.hosts, "cluster": "shop",
                              "sources": ORDERS, "partitions": PARTITIONS})
        # The query found both members on ZooKeeper and reads from the leader.
        # (Its partitions' streams are listed while open: asked often.)
        wait_for(lambda: query.newest() > 0 and spark_readers(leader),
                 "the query reading from the leader", 120, max_interval=0.05)
        held_from = query.hold()
        read_before = relay_changes(leader.url)  # the windows up to held_from are these
        at_kill = newest_window(leader)
        leader.kill()
        query.release()
        wait_for(lambda: role(follower) == "leader", "the follower promoted", 60)
        query.wait_past(at_kill, "the query reads what the promoted member captured")
        writer.stop()
        caught_up([follower], src)
        got = query.finish()
        read_after = relay_changes(follower.url)
    finally:
        if writer.is_alive():
            writer.stop()
        if query is not None:
            query.stop()
        for relay in relays:
            if alive(relay):
                relay.kill()
    truth = ([c for c in read_before if c[1] <= held_from[c[0]]]
             + [c for c in read_after if c[1] > held_from[c[0]]])
    assert max(c[1] for c in truth) > at_kill
    assert_every_change_once(got, truth)
