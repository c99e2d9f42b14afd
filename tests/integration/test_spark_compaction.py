"""Spark compaction against the applier's SQL path on the same log, on real PostgreSQL:
equal row for row (tombstones included), refusals, idempotence, and the old snapshot
surviving a failure inside the swap and a kill -9 in the middle of the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg2
import pytest

from databus.bootstrap._storage import LogWindow
from databus.errors import DatabusError
from databus.filters import FilterSpec
from databus.spark_jobs import JobRefused
from databus.spark_jobs.compact import compact
from tests.fixtures.servers import PostgresServer
from tests.integration.spark_support import Row, Stores, append, apply_all, make_stores, random_log
from tests.waiting import wait_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def stores(postgres_server: PostgresServer) -> Iterator[Stores]:
    yield from make_stores(postgres_server)


def model(log: Sequence[LogWindow], upto: int) -> dict[str, list[Row]]:
    """The snapshot at ``upto`` computed in plain Python: newest row per key, tombstones
    kept (what the applier and the compaction must both produce)."""
    latest: dict[str, dict[bytes, Row]] = {}
    for window in log:
        if window.scn > upto:
            break
        for e in window.events:  # in window order: a later change of a key wins
            latest.setdefault(e.source, {})[e.key] = (e.key, window.scn, e.op, e.pkey,
                                                      e.key_hash, e.event)
    return {source: [rows[k] for k in sorted(rows)] for source, rows in latest.items()}


def twins(stores: Stores, log: Sequence[LogWindow], *, span: int = 400) -> tuple[str, str]:
    """Two stores holding the same log: one for the applier, one for Spark."""
    urls = stores.url(span=span), stores.url(span=span)
    for url in urls:
        append(stores.open(url), log)
    return urls


def test_compaction_equals_the_applier_row_for_row(spark: SparkSession, stores: Stores) -> None:
    log = random_log(1, windows=400)
    applier_url, spark_url = twins(stores, log)
    apply_all(stores.open(applier_url))

    summary = compact(spark, spark_url)

    expected = stores.snapshot(applier_url)
    assert stores.snapshot(spark_url) == expected
    assert expected == model(log, log[-1].scn)
    assert any(row[2] == 2 for rows in expected.values() for row in rows), "no tombstone"
    # Same applied SCN and the same applier counters (the server plans with them).
    assert stores.state(spark_url) == stores.state(applier_url)
    assert summary.scn == log[-1].scn
    assert summary.rows_in == sum(len(w.events) for w in log)
    assert summary.rows_out == sum(len(rows) for rows in expected.values())


def test_merge_absorbs_a_backlog_and_the_applier_carries_on(spark: SparkSession,
                                                             stores: Stores) -> None:
    log = random_log(2, windows=500)
    applier_url, spark_url = twins(stores, log)
    storage = stores.open(spark_url)
    apply_all(storage, upto=log[150].scn)  # the applier did part of the log
    target = log[400].scn

    compact(spark, spark_url, target_scn=target)

    assert storage.state().applied_scn == target
    assert stores.snapshot(spark_url) == model(log, target)
    # The applier continues right after the target, on the new tables.
    apply_all(storage)
    apply_all(stores.open(applier_url))
    assert stores.snapshot(spark_url) == stores.snapshot(applier_url)
    assert stores.state(spark_url) == stores.state(applier_url)


def test_merge_after_retention_cut_the_log(spark: SparkSession, stores: Stores) -> None:
    log = random_log(3, windows=400)
    applier_url, spark_url = twins(stores, log, span=200)
    cut = log[250].scn
    for url in (applier_url, spark_url):
        storage = stores.open(url)
        apply_all(storage, upto=cut)
        assert storage.retain(cut_scn=cut).windows_dropped > 0
    apply_all(stores.open(applier_url))

    with pytest.raises(JobRefused, match="would lose every key"):
        compact(spark, spark_url, rebuild=True)
    compact(spark, spark_url)

    assert stores.snapshot(spark_url) == stores.snapshot(applier_url)


def test_target_beyond_the_log_end_and_other_bad_plans_are_refused(
    spark: SparkSession, stores: Stores
) -> None:
    log = random_log(4, windows=60)
    url = stores.url()
    storage = stores.open(url)
    append(storage, log)
    apply_all(storage, upto=log[30].scn)
    before = stores.snapshot(url), stores.state(url)
    end = log[-1].scn

    with pytest.raises(JobRefused, match=f"target SCN {end + 1} is beyond the log's end {end}"):
        compact(spark, url, target_scn=end + 1)
    applied = storage.state().applied_scn
    assert applied is not None
    with pytest.raises(JobRefused, match=r"never moves a snapshot back"):
        compact(spark, url, target_scn=applied - 1)
    with pytest.raises(JobRefused, match=r"no source shop\.nothing"):
        compact(spark, url, sources=["shop.nothing"])
    with pytest.raises(JobRefused, match="must be compacted together"):
        compact(spark, url, sources=["shop.orders"])

    assert (stores.snapshot(url), stores.state(url)) == before
    empty = stores.url()
    stores.open(empty)
    with pytest.raises(JobRefused, match="log is empty"):
        compact(spark, empty)


def test_a_rerun_is_idempotent(spark: SparkSession, stores: Stores) -> None:
    log = random_log(5, windows=200)
    url = stores.url()
    storage = stores.open(url)
    append(storage, log)
    apply_all(storage, upto=log[50].scn)
    target = log[150].scn

    compact(spark, url, target_scn=target)
    first = stores.snapshot(url), stores.state(url)
    again = compact(spark, url, target_scn=target)  # nothing left to merge
    assert again.rows_in == 0 and again.scn == target
    assert (stores.snapshot(url), stores.state(url)) == first
    compact(spark, url, target_scn=target, rebuild=True)  # the full path, same result
    assert (stores.snapshot(url), stores.state(url)) == first
    # A subset is fine when the others have nothing in (applied, target].
    compact(spark, url, target_scn=target, rebuild=True, sources=["shop.items"])
    assert (stores.snapshot(url), stores.state(url)) == first


def test_a_failure_inside_the_swap_leaves_the_old_snapshot(spark: SparkSession,
                                                           stores: Stores) -> None:
    log = random_log(6, windows=300)
    applier_url, spark_url = twins(stores, log)
    storage = stores.open(spark_url)
    apply_all(storage, upto=log[100].scn)
    before = stores.snapshot(spark_url), stores.state(spark_url)

    def crash() -> None:
        raise RuntimeError("killed between the DDL and the commit")

    with pytest.raises(RuntimeError, match="killed between"):
        compact(spark, spark_url, before_commit=crash)

    assert (stores.snapshot(spark_url), stores.state(spark_url)) == before
    assert stores.staging_tables(spark_url) == []
    # Still usable: served as before, and the applier goes on from where it was.
    assert storage.snapshot_batch("shop.orders", after_key=None, since_scn=None, limit=10,
                                  filter=FilterSpec())
    apply_all(storage)
    apply_all(stores.open(applier_url))
    assert stores.snapshot(spark_url) == stores.snapshot(applier_url)


def _wait(what: str, check: Callable[[], bool], job: subprocess.Popen[bytes], log: Path,
          timeout: float = 120) -> None:
    """:func:`tests.waiting.wait_until` that fails at once if ``job`` ends; polled finely
    (the test must lock the staging tables before the job's COPY into them starts)."""

    def done() -> bool:
        if check():
            return True
        assert job.poll() is None, f"the job ended first: {log.read_text()[-3000:]}"
        return False

    wait_until(done, what, timeout, max_interval=0.02)


def _wait_for_no_job(stores: Stores, url: str, timeout: float = 30) -> None:
    wait_until(lambda: not stores.query(
        url, "SELECT 1 FROM pg_stat_activity WHERE application_name = 'databus-spark'"
             " AND pid <> pg_backend_pid()"), "the killed job's sessions gone", timeout)


def test_a_compaction_killed_mid_way_leaves_the_old_snapshot(
    spark: SparkSession, stores: Stores, tmp_path: Path, postgres_server: PostgresServer
) -> None:
    log = random_log(7, windows=400)
    applier_url, spark_url = twins(stores, log)
    storage = stores.open(spark_url)
    apply_all(storage, upto=log[100].scn)
    before = stores.snapshot(spark_url), stores.state(spark_url)
    schema = spark_url.split("schema=")[1].split("&")[0]

    exe = Path(sys.executable).with_name("databus")
    job_log = tmp_path / "compact.log"
    with job_log.open("wb") as out:
        job = subprocess.Popen(
            [str(exe), "spark", "compact", "--store", spark_url, "--master", "local[1]",
             "--quiet", "--conf", "spark.ui.enabled=false",
             "--conf", "spark.driver.host=127.0.0.1",
             "--conf", "spark.driver.bindAddress=127.0.0.1"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    # Hold the staging tables in SHARE mode as soon as they exist: the job's COPY then
    # waits in the middle of its load, and is killed right there.
    blocker = psycopg2.connect(postgres_server.dsn, options=f"-c search_path={schema}")
    try:
        _wait("the staging tables", lambda: len(stores.staging_tables(spark_url)) == 3,
              job, job_log)
        with blocker.cursor() as cur:
            cur.execute("LOCK TABLE dbus_snapshot_1_next, dbus_snapshot_2_next,"
                        " dbus_snapshot_3_next IN SHARE MODE")
        _wait("a COPY into a staging table", lambda: bool(stores.query(
            spark_url, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                       " AND query LIKE 'COPY dbus\\_snapshot\\_%\\_next %'")), job, job_log)
        os.killpg(job.pid, signal.SIGKILL)  # the driver, its Python workers, its JVM
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        blocker.close()
    _wait_for_no_job(stores, spark_url)

    assert (stores.snapshot(spark_url), stores.state(spark_url)) == before
    assert storage.snapshot_batch("shop.items", after_key=None, since_scn=None, limit=5,
                                  filter=FilterSpec())
    assert stores.staging_tables(spark_url), "the killed job's staging tables are gone?"

    compact(spark, spark_url)  # the next run replaces the leftovers and finishes
    apply_all(stores.open(applier_url))
    assert stores.snapshot(spark_url) == stores.snapshot(applier_url)
    assert stores.staging_tables(spark_url) == []


def test_compaction_while_the_applier_runs(spark: SparkSession, stores: Stores) -> None:
    """The swap locks dbus_state first: an applier transaction is either wholly before it
    or reads the new applied SCN after it, so applied never goes back and no window is
    applied twice on top of the new snapshot."""
    log = random_log(8, windows=400)
    applier_url, spark_url = twins(stores, log)
    apply_all(stores.open(spark_url), upto=log[50].scn)
    applier = stores.open(spark_url)
    seen: list[int] = []
    stop = threading.Event()

    def run_applier() -> None:
        while not stop.is_set():
            try:
                applier.apply(max_rows=3)
                applied = applier.state().applied_scn
            except DatabusError:  # a deadlock victim or a lock timeout: retry, as it does
                continue
            assert applied is not None
            seen.append(applied)
            time.sleep(0.005)

    thread = threading.Thread(target=run_applier)
    thread.start()
    try:
        summary = compact(spark, spark_url)  # to the log's end: the applier cannot pass it
    finally:
        stop.set()
        thread.join()
    assert summary.scn == log[-1].scn
    assert len(seen) > 5 and seen == sorted(seen), "applied went backwards"
    apply_all(stores.open(applier_url))
    assert stores.snapshot(spark_url) == stores.snapshot(applier_url)
