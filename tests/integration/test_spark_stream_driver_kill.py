"""``databus spark stream``'s driver killed (SIGKILL of its process group: the Python
driver, its JVM and its Python workers) while a writer keeps changing the source, and
restarted from its checkpoint each time: the Parquet table ends equal to the source,
with no row lost and no batch applied twice.

A relay (in this process) on a SQLite TxLog source, a writer thread (inserts, updates
of one key twice in a transaction, deletes, re-inserts), and the driver as a child
process in a session of its own (``databus.cli.main(["spark", "stream", ...])``, two
partitions, ``--trigger 0.5``). It is killed twice:

1. mid-batch, from outside: batch K1 is in flight (``offsets/K1`` logged,
   ``commits/K1`` not) and its new table version is being written but not published.
   The driver's process group is stopped (SIGSTOP), that state checked again, then
   killed; the restarted query runs batch K1 again from the same offsets.
2. after batch K2's publish (``commit.json`` names K2) and before Spark's ``commits/K2``:
   the one point where a restarted query re-runs a batch that the table already holds.
   That point lasts milliseconds, so the child, started to die after batch K1, kills
   its own process group there: the same SIGKILL, at a known point.

Then the writer stops, and the third run catches up. The table (``read_table``) equals
the source table; its ``commit.json`` names the last committed batch; and its version
counter equals the number of batches that had rows (counted from the query's offset
log against the relay's windows): every batch with rows published one version, the
re-run of K1 once and the re-run of K2 none (a second apply of K2 would count one
more).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from databus.fetchers.txlog import seal_sqlite_transaction
from databus.spark_jobs._apply import read_commit, read_table
from tests.fixtures._spark import find_prerequisites
from tests.integration.spark_stream_acceptance_support import SPARK_CONF
from tests.integration.spark_stream_support import ServerThread, captured
from tests.relay_harness import relay_config, running_relay
from tests.tiers import FULL
from tests.unit.test_txlog_support import BUFFER, CapturedWindow, SqliteSource
from tests.waiting import wait_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Three driver starts (a JVM each) on two cores: an issue-size run, beside the other
# JVMs of the suite one after another (the ``spark`` xdist group).
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.xdist_group("spark"),
              pytest.mark.skipif(not (FULL or os.environ.get("DATABUS_SPARK_DRIVER_KILL") == "1"),
                                 reason="an issue-size run (three driver starts, ~5 min on "
                                 "two busy cores): make test-full (or "
                                 "DATABUS_SPARK_DRIVER_KILL=1)")]

SOURCE = "shop.items"
DDL = "CREATE TABLE items (id INTEGER PRIMARY KEY, sku TEXT, qty INTEGER)"
KEYS = 40  # few keys: every key is inserted, updated, deleted and inserted again
PARTITIONS = 2
# A driver's start (a JVM, a session, its first batch) on two busy cores.
START_TIMEOUT = 300.0

# The driver: ``databus spark stream``, which SIGKILLs its own process group right
# after publishing the table's commit of a batch after DRIVER_KILL_AFTER_BATCH (before
# the function returns to Spark, which then logs ``commits/N``).
DRIVER = """
import os, signal, sys
from databus.spark_jobs import _apply
after = os.environ.get("DRIVER_KILL_AFTER_BATCH")
publish = _apply._publish
def publish_then_die(root, commit):
    publish(root, commit)
    if after is not None and commit.batch_id > int(after):
        os.killpg(0, signal.SIGKILL)
_apply._publish = publish_then_die
from databus.cli import main
sys.exit(main(sys.argv[1:]))
"""


class Writer(threading.Thread):
    """Transactions of one to three changes on ``KEYS`` keys until halted: an insert of
    an absent key, a delete, or an update (twice in one transaction, half the time)."""

    def __init__(self, db: SqliteSource) -> None:
        super().__init__(daemon=True, name="items-writer")
        self.conn = db.connect()
        self.rng = random.Random(33)
        self.present: set[int] = set()
        self.n = 0
        self.transactions = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def transaction(self) -> list[str]:
        out = []
        for _ in range(self.rng.randint(1, 3)):
            self.n += 1
            key = self.rng.randint(1, KEYS)
            if key not in self.present:
                self.present.add(key)
                out.append(f"INSERT INTO items (id, sku, qty) VALUES ({key}, "
                           f"'sku{key}-{self.n}', {self.n})")
            elif self.rng.random() < 0.3:
                self.present.discard(key)
                out.append(f"DELETE FROM items WHERE id = {key}")
            else:
                update = f"UPDATE items SET qty = qty + 1, sku = 'sku{key}-{self.n}' " \
                         f"WHERE id = {key}"
                out += [update] * self.rng.randint(1, 2)
        return out

    def commit(self, statements: list[str]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        for statement in statements:
            self.conn.execute(statement)
        seal_sqlite_transaction(self.conn)
        self.conn.execute("COMMIT")
        self.transactions += 1

    def run(self) -> None:
        try:
            while not self.halt.wait(0.05):
                self.commit(self.transaction())
        except BaseException as exc:
            self.error = exc

    def stop(self) -> int:
        """Stop, re-raise what failed, and return the number of transactions."""
        self.halt.set()
        self.join(60)
        self.conn.close()
        if self.error is not None:
            raise self.error
        return self.transactions


class Driver:
    """The streaming query's driver as a child process in a session of its own; each
    ``start`` resumes from the same table and checkpoint."""

    def __init__(self, work: Path, relay: str) -> None:
        self.table = work / "table"
        self.checkpoint = work / "checkpoint"
        self.log_path = work / "driver.log"
        self.args = [sys.executable, "-c", DRIVER, "spark", "stream", "--relay", relay,
                     "--sources", SOURCE, "--to", str(self.table),
                     "--checkpoint", str(self.checkpoint),
                     "--partitions", str(PARTITIONS), "--trigger", "0.5",
                     "--master", "local[2]",
                     "--conf", f"spark.local.dir={work / 'spark-local'}",
                     # Keep every batch's offsets: the test counts the batches with rows.
                     "--conf", "spark.sql.streaming.minBatchesToRetain=100000"]
        for item in SPARK_CONF:
            self.args += ["--conf", item]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.procs[-1]

    def start(self, *, kill_after_batch: int | None = None) -> None:
        """Start the driver; with ``kill_after_batch``, it kills itself right after it
        publishes a later batch."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYSPARK_PYTHON": sys.executable}
        if kill_after_batch is not None:
            env["DRIVER_KILL_AFTER_BATCH"] = str(kill_after_batch)
        with self.log_path.open("ab") as log:
            log.write(f"\n--- start {len(self.procs) + 1}\n".encode())
            log.flush()
            self.procs.append(subprocess.Popen(
                self.args, stdout=log, stderr=log, start_new_session=True, env=env))

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL every process group started (driver, JVM, Python workers)."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)

    def alive(self) -> bool:
        assert self.proc.poll() is None, f"the driver exited by itself:\n{self.log()}"
        return True

    def log(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-6000:]

    def newest(self, log: str) -> int:
        """The newest batch id in the checkpoint's ``offsets`` or ``commits``, -1."""
        directory = self.checkpoint / log
        if not directory.is_dir():
            return -1
        return max((int(p.name) for p in directory.iterdir() if p.name.isdigit()),
                   default=-1)

    def end_offset(self, batch: int) -> list[int]:
        """Each partition's window SCN at the end of ``batch`` (its logged offset: the
        lines "v1", the batch's metadata, then the source's offset)."""
        lines = (self.checkpoint / "offsets" / str(batch)).read_text().splitlines()
        offset = json.loads(lines[2])
        return [int(offset["checkpoints"][str(p)]["window_scn"])
                for p in range(PARTITIONS)]


@pytest.fixture
def db(tmp_path: Path) -> SqliteSource:
    source = SqliteSource(tmp_path / "shop.db", DDL)
    source.install("items")
    return source


@pytest.fixture
def relay(db: SqliteSource, tmp_path: Path) -> Iterator[ServerThread]:
    # 32 MB: every window since the start stays (the test counts them), whatever time
    # the driver's restarts take.
    config = relay_config(tmp_path, {BUFFER: db.uri("items")}, capacity_mb=32)
    with ServerThread(running_relay(config)) as server:
        yield server


@pytest.fixture
def writer(db: SqliteSource) -> Iterator[Writer]:
    w = Writer(db)
    try:
        yield w
    finally:
        w.halt.set()
        if w.is_alive():
            w.join(60)


@pytest.fixture
def driver(relay: ServerThread, tmp_path: Path) -> Iterator[Driver]:
    d = Driver(tmp_path, relay.value.url)
    try:
        yield d
    finally:
        d.kill()


def batches_with_rows(driver: Driver, windows: list[CapturedWindow], last: int) -> int:
    """How many of batches 0..``last`` read at least one row: a change in a window
    after the batch's start offset and up to its end offset, in a partition whose key
    bucket it is (batch 0 starts with nothing read)."""
    count = 0
    start = [-1] * PARTITIONS
    for batch in range(last + 1):
        end = driver.end_offset(batch)
        if any(start[p] < w.scn <= end[p] and abs(int(c.key)) % PARTITIONS == p
               for w in windows for c in w.changes if c.source == SOURCE
               for p in range(PARTITIONS)):
            count += 1
        start = end
    return count


# Three driver starts (a JVM each) and a batch or two after each, on two busy cores.
@pytest.mark.timeout(1200)
def test_driver_killed_mid_batch_and_after_a_publish_resumes_exactly_once(
        spark: SparkSession, db: SqliteSource, relay: ServerThread, writer: Writer,
        driver: Driver) -> None:
    find_prerequisites()  # pyspark and java, or a clear error
    table = driver.table
    for _ in range(5):  # batch 0 has rows
        writer.commit(writer.transaction())
    writer.start()
    driver.start()

    # Kill 1: batch K1 in flight, its version written and not published.
    def version_being_written() -> int | None:
        driver.alive()
        offset, committed = driver.newest("offsets"), driver.newest("commits")
        commit = read_commit(table)
        if commit is None or offset <= committed:
            return None
        unpublished = table / f"v{commit.version + 1:010d}-b{offset}"
        if not unpublished.is_dir():
            return None
        driver.signal(signal.SIGSTOP)  # hold the state, check it again, kill in it
        if (read_commit(table) == commit and unpublished.is_dir()
                and driver.newest("commits") < offset):
            driver.signal(signal.SIGKILL)
            return offset
        driver.signal(signal.SIGCONT)
        return None

    k1 = wait_until(version_being_written, "a batch's version written, not published",
                    START_TIMEOUT, interval=0.01, max_interval=0.02, diagnose=driver.log)
    assert k1 is not None and driver.proc.wait(30) == -signal.SIGKILL
    before = read_commit(table)
    assert before is not None and before.batch_id < k1
    assert driver.newest("offsets") == k1 and driver.newest("commits") < k1

    # Kill 2: the restarted query runs K1 again, then is killed right after the
    # publish of a later batch K2.
    driver.start(kill_after_batch=k1)
    wait_until(lambda: driver.proc.poll() is not None, "the driver killed after a publish",
               START_TIMEOUT, max_interval=0.5, diagnose=driver.log)
    assert driver.proc.returncode == -signal.SIGKILL, driver.log()
    published = read_commit(table)
    assert published is not None
    k2 = published.batch_id
    assert k2 > k1
    assert driver.newest("offsets") == k2 and driver.newest("commits") == k2 - 1
    transactions = writer.stop()
    # A last transaction whose window tells that the relay has read everything.
    marker = KEYS + 1
    db.txn(f"INSERT INTO items (id, sku, qty) VALUES ({marker}, 'end', 0)")
    last_scn = wait_until(
        lambda: max((w.scn for w in captured(relay) if any(c.key == marker
                                                           for c in w.changes)),
                    default=None),
        "the last transaction at the relay", 60)
    assert last_scn is not None

    # The last run: batch K2 again (already in the table), then the rest.
    driver.start()

    def caught_up() -> bool:
        driver.alive()
        committed = driver.newest("commits")
        return committed >= 0 and min(driver.end_offset(committed)) >= last_scn

    wait_until(caught_up, f"the query committed up to window {last_scn}", START_TIMEOUT,
               max_interval=0.5, diagnose=driver.log)
    driver.kill()

    # The table is the source: every row, none deleted, each key once.
    rows = read_table(spark, table).collect()
    got = {r["id"]: (r["sku"], r["qty"]) for r in rows}
    assert len(got) == len(rows)
    assert got == {r["id"]: (r["sku"], r["qty"]) for r in db.rows("items")}
    assert all(r["key"] == str(r["id"]) and r["partition"] == r["id"] % PARTITIONS
               for r in rows)
    # Every batch applied once: the commit names the last batch, and one version was
    # published per batch with rows (K1's re-run once, K2's re-run not again).
    last = driver.newest("commits")
    final = read_commit(table)
    assert final is not None and final.batch_id == last
    with_rows = batches_with_rows(driver, captured(relay), last)
    assert final.version == with_rows, (
        f"version {final.version} after {with_rows} batches with rows of {last + 1} "
        f"(killed in batch {k1} and after batch {k2}'s publish)")
    print(f"{transactions} transactions, {len(rows)} rows, {last + 1} batches, "
          f"version {final.version}; killed in batch {k1} and after batch {k2}'s publish")
