"""``apply_changes`` / ``foreach_batch``: micro-batches applied to a Parquet table as the
latest state per key, exactly once per batch id, never half-applied (local[2] Spark)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databus.spark_jobs._apply import (
    COMMIT_DIR,
    COMMIT_FILE,
    TableConflict,
    apply_changes,
    foreach_batch,
    read_commit,
    read_table,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

META = ("scn bigint, source string, op string, key string, timestamp timestamp, "
        "from_snapshot boolean, partition int, seq int")
TYPED = f"{META}, name string, n bigint"
JSON_MODE = f"{META}, value string"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

# A change: (scn, seq, op, key, n) of source "s" (or (source, key) pairs in JSON mode).
Change = tuple[int, int, str, str, int]


def typed(spark: SparkSession, changes: Sequence[Change], source: str = "s") -> DataFrame:
    rows = [(scn, source, op, key, T0, False, 0, seq,
             None if op == "delete" else f"{key}@{scn}", None if op == "delete" else n)
            for scn, seq, op, key, n in changes]
    return spark.createDataFrame(rows, TYPED)


def as_json(spark: SparkSession, changes: Sequence[tuple[int, int, str, str, str, int]]
            ) -> DataFrame:
    rows = [(scn, source, op, key, T0, False, 1, seq,
             None if op == "delete" else json.dumps({"n": n}))
            for scn, seq, op, source, key, n in changes]
    return spark.createDataFrame(rows, JSON_MODE)


def state(spark: SparkSession, path: Path, column: str = "n") -> dict[Any, Any]:
    rows = read_table(spark, path).collect()
    keys = [(r["source"], r["key"]) for r in rows]
    assert len(keys) == len(set(keys)), "one row per key"
    return {r["key"] if r["source"] == "s" else (r["source"], r["key"]): r[column]
            for r in rows}


def test_newest_change_per_key_wins_within_and_across_batches(
        spark: SparkSession, tmp_path: Path) -> None:
    table = tmp_path / "t"
    assert read_table(spark, table).count() == 0
    first = apply_changes(typed(spark, [
        (2, 0, "upsert", "k1", 2), (1, 0, "upsert", "k1", 1),  # out of order in the batch
        (2, 1, "upsert", "k2", 20),
        (3, 0, "upsert", "k3", 30), (3, 1, "delete", "k3", 0),  # one window: seq decides
        (4, 0, "delete", "k4", 0),  # a delete of a key never seen
    ]), 0, table)
    assert first.applied and first.rows == 2
    assert state(spark, table) == {"k1": 2, "k2": 20}
    apply_changes(typed(spark, [
        (5, 0, "delete", "k1", 0), (5, 1, "upsert", "k2", 21),
        (6, 0, "upsert", "k3", 31),  # re-inserted after its delete
        (7, 0, "upsert", "k1", 11),  # re-inserted in the batch that deleted it
        (7, 1, "upsert", "k5", 50), (8, 0, "delete", "k5", 0),
    ]), 1, table)
    assert state(spark, table) == {"k1": 11, "k2": 21, "k3": 31}
    row = read_table(spark, table).where("key = 'k2'").first()
    assert row is not None
    assert (row["scn"], row["seq"], row["name"]) == (5, 1, "k2@5")
    assert row["timestamp"].timestamp() == T0.timestamp()
    assert "op" not in read_table(spark, table).columns


def test_json_value_mode_keeps_sources_apart(spark: SparkSession, tmp_path: Path) -> None:
    table = tmp_path / "t"
    apply_changes(as_json(spark, [
        (1, 0, "upsert", "a", "1", 1), (1, 1, "upsert", "b", "1", 100),
        (2, 0, "upsert", "a", "1", 2), (2, 1, "upsert", "a", "2", 3),
    ]), 0, table)
    apply_changes(as_json(spark, [(3, 0, "delete", "b", "1", 0)]), 1, table)
    got = state(spark, table, "value")
    assert {k: json.loads(v)["n"] for k, v in got.items()} == {("a", "1"): 2, ("a", "2"): 3}
    assert read_table(spark, table).columns == [*[c.split()[0] for c in META.split(", ")
                                                   if c.split()[0] != "op"], "value"]


def test_a_batch_id_applied_twice_is_applied_once(spark: SparkSession,
                                                  tmp_path: Path) -> None:
    table = tmp_path / "t"
    apply_changes(typed(spark, [(1, 0, "upsert", "k", 1)]), 0, table)
    apply_changes(typed(spark, [(2, 0, "upsert", "k", 2)]), 1, table)
    commit = read_commit(table)
    assert commit is not None and commit.batch_id == 1
    # Spark re-runs the last batch after a driver crash (here with other rows, which
    # must be ignored just the same), and an older one is never applied again either.
    again = apply_changes(typed(spark, [(3, 0, "upsert", "k", 3)]), 1, table)
    older = apply_changes(typed(spark, [(4, 0, "delete", "k", 0)]), 0, table)
    assert not again.applied and not older.applied
    assert state(spark, table) == {"k": 2}
    assert read_commit(table) == commit


def test_a_crash_before_publishing_leaves_the_previous_state(spark: SparkSession,
                                                             tmp_path: Path) -> None:
    table = tmp_path / "t"
    apply_changes(typed(spark, [(1, 0, "upsert", "k", 1), (1, 1, "upsert", "j", 1)]), 0,
                  table)
    before = read_commit(table)
    written: list[Path] = []

    def crash(directory: Path) -> None:
        written.append(directory)
        raise KeyboardInterrupt("driver killed")

    batch = [(2, 0, "upsert", "k", 2), (2, 1, "delete", "j", 0)]
    with pytest.raises(KeyboardInterrupt):
        apply_changes(typed(spark, batch), 1, table, before_publish=crash)
    assert written and written[0].is_dir()  # the new version was written...
    assert read_commit(table) == before  # ...but not published
    assert state(spark, table) == {"k": 1, "j": 1}
    # The retried batch applies once; the stray version is gone.
    assert apply_changes(typed(spark, batch), 1, table).applied
    assert state(spark, table) == {"k": 2}
    published = read_commit(table)
    assert published is not None and published.batch_id == 1
    assert not written[0].exists() or written[0].name == published.dir
    apply_changes(typed(spark, [(3, 0, "upsert", "k", 3)]), 2, table)
    apply_changes(typed(spark, [(4, 0, "upsert", "k", 4)]), 3, table)
    versions = sorted(p.name for p in table.iterdir() if p.name != COMMIT_DIR)
    commit = read_commit(table)
    assert commit is not None and versions[-1] == commit.dir
    assert len(versions) == 2  # the published one and the one before it
    assert sorted(p.name for p in (table / COMMIT_DIR).iterdir()) == [COMMIT_FILE]


KILLED_CHILD = """
import os, signal, sys
from pyspark.sql import SparkSession
from databus.spark_jobs._apply import apply_changes
table, local = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[1]").appName("killed-apply")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.local.dir", local)
         .config("spark.sql.session.timeZone", "UTC").getOrCreate())
rows = [(2, "s", "upsert", "k", None, False, 0, 0, "k@2", 2),
        (2, "s", "delete", "j", None, False, 0, 1, None, None)]
df = spark.createDataFrame(rows, sys.argv[3])
apply_changes(df, 1, table, before_publish=lambda d: os.kill(os.getpid(), signal.SIGKILL))
"""


def test_a_writer_killed_before_publishing_changes_nothing(spark: SparkSession,
                                                          tmp_path: Path) -> None:
    """A driver killed (SIGKILL: no finally, no cleanup) between writing a version and
    publishing it: the table still reads the previous state, the retry applies once."""
    import os
    import subprocess
    import sys

    table = tmp_path / "t"
    apply_changes(typed(spark, [(1, 0, "upsert", "k", 1), (1, 1, "upsert", "j", 1)]), 0,
                  table)
    before = read_commit(table)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    child = subprocess.run([sys.executable, "-c", KILLED_CHILD, str(table),
                            str(tmp_path / "local"), TYPED], env=env, capture_output=True,
                           timeout=300, check=False)
    assert child.returncode == -9, child.stderr.decode(errors="replace")[-2000:]
    assert (table / "v0000000002-b1").is_dir()  # written, not published
    assert read_commit(table) == before
    assert state(spark, table) == {"k": 1, "j": 1}
    assert apply_changes(typed(spark, [(2, 0, "upsert", "k", 2), (2, 1, "delete", "j", 0)]),
                         1, table).applied
    assert not apply_changes(typed(spark, [(2, 0, "upsert", "k", 2)]), 1, table).applied
    assert state(spark, table) == {"k": 2}


def test_a_killed_writer_leaves_a_stray_version_that_is_ignored(
        spark: SparkSession, tmp_path: Path) -> None:
    table = tmp_path / "t"
    apply_changes(typed(spark, [(1, 0, "upsert", "k", 1)]), 0, table)
    stray = table / "v0000000002-b1"
    stray.mkdir()
    (stray / "part-00000.parquet").write_bytes(b"half a file")
    assert state(spark, table) == {"k": 1}
    apply_changes(typed(spark, [(2, 0, "upsert", "k", 2)]), 1, table)
    assert state(spark, table) == {"k": 2}


def test_new_nullable_columns_and_wider_types(spark: SparkSession, tmp_path: Path) -> None:
    table = tmp_path / "t"
    apply_changes(spark.createDataFrame([(1, "s", "upsert", "a", T0, True, 0, 0, 1)],
                                        f"{META}, n int"), 0, table)
    apply_changes(spark.createDataFrame(
        [(2, "s", "upsert", "b", T0, False, 0, 0, 2**40, "x")],
        f"{META}, n bigint, extra string"), 1, table)
    df = read_table(spark, table)
    assert dict(df.dtypes)["n"] == "bigint"
    assert {r["key"]: (r["n"], r["extra"]) for r in df.collect()} == {
        "a": (1, None), "b": (2**40, "x")}


def test_value_columns_of_every_spark_type(spark: SparkSession, tmp_path: Path) -> None:
    """Typed rows of a source's schema (spark_schema): arrays, maps, structs, binary,
    decimals, dates and the ``__str`` column travel through the merge unchanged."""
    from decimal import Decimal

    table = tmp_path / "t"
    schema = (f"{META}, tags array<string>, attrs map<string,bigint>, blob binary, "
              "price decimal(12,2), day date, day__str string, dims struct<w:float,h:double>")

    def row(scn: int, op: str, key: str, tag: str) -> tuple[Any, ...]:
        if op == "delete":
            return (scn, "s", op, key, T0, False, 0, 0, *([None] * 7))
        return (scn, "s", op, key, T0, False, 0, 0, [tag, "x"], {tag: scn}, tag.encode(),
                Decimal(f"{scn}.25"), dt.date(2020, 1, scn), None, (1.5, float(scn)))

    apply_changes(spark.createDataFrame([row(1, "upsert", "a", "p"), row(1, "upsert", "b", "q"),
                                         row(2, "upsert", "a", "r")], schema), 0, table)
    apply_changes(spark.createDataFrame([row(3, "delete", "b", ""), row(4, "upsert", "c", "s")],
                                        schema), 1, table)
    got = {r["key"]: r for r in read_table(spark, table).collect()}
    assert sorted(got) == ["a", "c"]
    a = got["a"]
    assert (a["tags"], a["attrs"], bytes(a["blob"]), a["price"], a["day"], a["day__str"],
            tuple(a["dims"])) == (["r", "x"], {"r": 2}, b"r", Decimal("2.25"),
                                  dt.date(2020, 1, 2), None, (1.5, 2.0))


def test_foreach_batch_in_a_query_restarted_from_its_checkpoint(
        spark: SparkSession, tmp_path: Path) -> None:
    """A real streaming query (a file source): restarted from its checkpoint it applies
    only the new batches; another query (a new checkpoint) is refused the table."""
    incoming, table, checkpoint = tmp_path / "in", tmp_path / "t", tmp_path / "cp"
    incoming.mkdir()

    def drop(name: str, changes: Sequence[Change]) -> None:
        rows = [{"scn": scn, "source": "s", "op": op, "key": key,
                 "timestamp": T0.isoformat(), "from_snapshot": False, "partition": 0,
                 "seq": seq, "name": key, "n": n} for scn, seq, op, key, n in changes]
        (incoming / name).write_text("\n".join(json.dumps(r) for r in rows))

    def run(checkpoint_dir: Path) -> None:
        query = (spark.readStream.schema(TYPED).json(str(incoming))
                 .writeStream.foreachBatch(foreach_batch(table))
                 .option("checkpointLocation", str(checkpoint_dir))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        if query.exception() is not None:
            raise query.exception()  # type: ignore[misc]

    drop("1.json", [(1, 0, "upsert", "a", 1), (1, 1, "upsert", "b", 1)])
    run(checkpoint)
    assert state(spark, table) == {"a": 1, "b": 1}
    first = read_commit(table)
    drop("2.json", [(2, 0, "delete", "a", 0), (2, 1, "upsert", "b", 2)])
    run(checkpoint)
    assert state(spark, table) == {"b": 2}
    second = read_commit(table)
    assert first is not None and second is not None
    assert second.batch_id == first.batch_id + 1
    # Spark tells each batch its query's id, which a restart from the checkpoint keeps.
    assert second.query_id is not None and second.query_id == first.query_id
    with pytest.raises(Exception, match=r"written by streaming query"):
        run(tmp_path / "other-cp")
    assert state(spark, table) == {"b": 2}


# -- a reference fold ---------------------------------------------------------------


def fold(batches: Sequence[Sequence[Change]]) -> dict[str, int]:
    """The table a sequence of batches must leave: each key's newest change."""
    newest: dict[str, Change] = {}
    for batch in batches:
        for change in batch:
            key = change[3]
            if key not in newest or change[:2] > newest[key][:2]:
                newest[key] = change
    return {k: c[4] for k, c in newest.items() if c[2] == "upsert"}


@st.composite
def batch_sequences(draw: st.DrawFn) -> list[list[Change]]:
    batches: list[list[Change]] = []
    scn = 0
    for _ in range(draw(st.integers(1, 3))):
        batch: list[Change] = []
        for _ in range(draw(st.integers(0, 4))):  # windows
            scn += draw(st.integers(1, 3))
            for seq in range(draw(st.integers(1, 3))):
                op = draw(st.sampled_from(["upsert", "upsert", "delete"]))
                batch.append((scn, seq, op, draw(st.sampled_from("abcd")),
                              draw(st.integers(0, 99))))
        batches.append(draw(st.permutations(batch)))  # order in a batch does not matter
    return batches


@settings(max_examples=5, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch_sequences())
def test_the_table_equals_a_reference_fold(spark: SparkSession, tmp_path_factory: Any,
                                           batches: list[list[Change]]) -> None:
    table = tmp_path_factory.mktemp("fold") / "t"
    for batch_id, batch in enumerate(batches):
        apply_changes(typed(spark, batch), batch_id, table)
        apply_changes(typed(spark, batch), batch_id, table)  # replayed: a no-op
        assert state(spark, table) == fold(batches[:batch_id + 1])


def test_a_path_that_is_not_a_file_system_path_or_table_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="file system path"):
        foreach_batch("s3a://bucket/t")
    (tmp_path / COMMIT_DIR).mkdir()
    (tmp_path / COMMIT_DIR / COMMIT_FILE).write_text('{"something": "else"}')
    with pytest.raises(TableConflict, match="not a databus table commit"):
        read_commit(tmp_path)
