"""The Spark jobs' pure parts, without Spark or servers: plans and their refusals, the
MariaDB dump conversions, the Avro <-> Arrow mapping, JVM error messages."""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from fastavro import schemaless_reader, schemaless_writer

from databus.errors import ConfigError
from databus.fetchers.mysql import dump_column, with_precision
from databus.fetchers.mysql._types import ColumnSpec, Kind
from databus.schemas import Schema
from databus.spark_jobs._arrow_avro import from_row, record_columns, to_arrays
from databus.spark_jobs._common import JobRefused, java_message
from databus.spark_jobs._jdbc import StoreLocation, mysql_jdbc
from databus.spark_jobs._plan import plan_compaction, plan_seed
from databus.spark_jobs._store import StoreState, SwapPlan, _check_still_valid

SOURCES = {"a": 1, "b": 2}


def state(**kw: Any) -> StoreState:
    values: dict[str, Any] = {"applied_scn": None, "log_floor_scn": None,
                              "newest_window_scn": 500, "producer_scn": 500, "key_hash": True,
                              "sources": SOURCES}
    values.update(kw)
    return StoreState(**values)


def rows(counts: dict[int, int]) -> Any:
    return lambda source_id, after, upto: counts.get(source_id, 0)


def test_compaction_plan_merges_from_the_applied_scn() -> None:
    plan = plan_compaction(state(applied_scn=100), rows({1: 5, 2: 0}))
    assert plan.target_scn == 500
    assert [(j.name, j.base, j.log_after) for j in plan.sources] == [("a", "snapshot", 100)]
    assert plan.swap.replace == {1: "a"} and plan.swap.applied_at_plan == 100


def test_compaction_plan_refusals() -> None:
    with pytest.raises(JobRefused, match="beyond the log's end 500"):
        plan_compaction(state(), rows({}), target_scn=501)
    with pytest.raises(JobRefused, match="never moves a snapshot back"):
        plan_compaction(state(applied_scn=300), rows({}), target_scn=200)
    with pytest.raises(JobRefused, match="log is empty"):
        plan_compaction(state(newest_window_scn=None, producer_scn=None), rows({}))
    with pytest.raises(JobRefused, match="would lose every key"):
        plan_compaction(state(log_floor_scn=50), rows({}), rebuild=True)
    with pytest.raises(JobRefused, match=r"b \(3 rows\) is left out"):
        plan_compaction(state(), rows({1: 1, 2: 3}), sources=["a"])
    with pytest.raises(JobRefused, match="no source c"):
        plan_compaction(state(), rows({}), sources=["c"])


def test_the_log_end_falls_back_to_the_producer_position() -> None:
    plan = plan_compaction(state(newest_window_scn=None, producer_scn=700, applied_scn=700),
                           rows({}))
    assert plan.target_scn == 700 and plan.sources == ()


def test_seed_plans() -> None:
    empty = state(newest_window_scn=None, producer_scn=None)
    plan = plan_seed(empty, rows({}), source="a", dump_scn=42)
    assert plan.swap.new_floor == plan.swap.producer_start == plan.target_scn == 42
    with pytest.raises(JobRefused, match="producer is already past the dump"):
        plan_seed(state(newest_window_scn=None, producer_scn=50), rows({}), source="a",
                  dump_scn=42)
    live = state(applied_scn=300, log_floor_scn=100)
    plan = plan_seed(live, rows({1: 4, 2: 0}), source="a", dump_scn=200)
    assert plan.target_scn == 300 and [j.base for j in plan.sources] == ["dump"]
    plan = plan_seed(live, rows({1: 0, 2: 9}), source="a", dump_scn=450)
    assert plan.target_scn == 450 and [j.base for j in plan.sources] == ["dump", "snapshot"]
    assert plan.swap.log_after == 300
    with pytest.raises(JobRefused, match="after the log's end 500"):
        plan_seed(live, rows({}), source="a", dump_scn=501)
    with pytest.raises(JobRefused, match="later than the dump's SCN 50"):
        plan_seed(live, rows({}), source="a", dump_scn=50)


def test_the_swap_rechecks_what_the_applier_and_retention_did() -> None:
    plan = SwapPlan(target_scn=500, replace={1: "a"}, applied_at_plan=100, reads_log=True,
                    log_after=100, floor_at_plan=50)
    _check_still_valid(plan, 300, 50)  # the applier moved, but not past the target
    _check_still_valid(plan, 500, 100)
    with pytest.raises(JobRefused, match="past the job's target"):
        _check_still_valid(plan, 501, 50)
    with pytest.raises(JobRefused, match="went back"):
        _check_still_valid(plan, 90, 50)
    with pytest.raises(JobRefused, match="retention cut the log at SCN 150"):
        _check_still_valid(plan, 300, 150)


def test_store_and_source_urls() -> None:
    loc = StoreLocation.parse("postgresql://u:p%40ss@db.example:6543/bootstrap"
                              "?schema=bt&log_partition_span=5&sslmode=require")
    assert loc.jdbc_url == "jdbc:postgresql://db.example:6543/bootstrap?sslmode=require"
    assert (loc.user, loc.password, loc.schema) == ("u", "p@ss", "bt")
    assert "p@ss" not in loc.where and "log_partition_span" not in loc.dsn
    assert loc.properties()["password"] == "p@ss"
    with pytest.raises(ConfigError, match="no database"):
        StoreLocation.parse("postgresql://u@host/?schema=x")
    url, props = mysql_jdbc("::1", 3306, "u", "")
    assert url == "jdbc:mysql://[::1]:3306/" and "password" not in props


def test_dump_columns_convert_to_the_fetchers_values() -> None:
    def convert(kind: Kind, text: Any, data_type: str = "", column_type: str = "",
                **kw: Any) -> Any:
        spec = with_precision(ColumnSpec("c", kind, True, **kw), column_type)
        return dump_column(spec, data_type).convert(text)

    assert convert(Kind.DATE, "2024-02-29") == (dt.date(2024, 2, 29) - dt.date(1970, 1, 1)).days
    assert convert(Kind.DATE, "0000-00-00") == "0000-00-00"
    assert convert(Kind.DATETIME, "2020-00-00 10:11:12.500", column_type="datetime(3)") \
        == "2020-00-00 10:11:12.500"
    assert convert(Kind.DATETIME, "1970-01-02 00:00:01.000001",
                   column_type="datetime(6)") == 86_401_000_001
    assert convert(Kind.TIME, "-00:00:00.000001") == -1
    assert convert(Kind.TIME, "838:59:59") == 3_020_399_000_000
    assert convert(Kind.TIMESTAMP, "1714979289.123") == 1_714_979_289_123_000
    assert convert(Kind.DECIMAL, "-12.3400", scale=4, precision=10) == -123_400
    assert convert(Kind.UINT64, "18446744073709551615") == 2**64 - 1
    assert convert(Kind.BITS, "101", column_type="bit(9)") == b"\x01\x01"
    assert convert(Kind.SET, "") == [] and convert(Kind.SET, "x,z") == ["x", "z"]
    assert convert(Kind.BOOL, 1) is True
    assert convert(Kind.JSON, '{"a": [1, 2.5]}') == '{"a":[1,2.5]}'
    inet = dump_column(ColumnSpec("ip", Kind.BYTES, True), "inet6")
    assert inet.expression == "CAST(`ip` AS BINARY(16))"
    text = dump_column(ColumnSpec("c`x", Kind.TEXT, True), "char")
    assert text.expression == "CAST(`c``x` AS CHAR)"


SCHEMA = Schema({
    "type": "record", "name": "r", "namespace": "ns", "fields": [
        {"name": "d", "type": [{"type": "int", "logicalType": "date"}, "string"]},
        {"name": "n", "type": ["null", {"type": "fixed", "name": "dec", "size": 9,
                                        "logicalType": "decimal", "precision": 20,
                                        "scale": 0}]},
        {"name": "again", "type": ["null", "ns.dec"]},
        {"name": "huge", "type": {"type": "bytes", "logicalType": "decimal", "precision": 60,
                                  "scale": 3}},
        {"name": "m", "type": {"type": "map", "values": {"type": "array", "items": "long"}}},
        {"name": "u", "type": ["null", "long", "string", "boolean"]},
        {"name": "t", "type": {"type": "long", "logicalType": "time-micros"}},
    ]})


def test_avro_records_round_trip_through_arrow_columns() -> None:
    records = [
        {"d": dt.date(2024, 1, 2), "n": Decimal(2**64 - 1), "again": None,
         "huge": Decimal("-1" + "0" * 50 + ".125"), "m": {"a": [1, 2]}, "u": 5,
         "t": dt.time(1, 2, 3, 4)},
        {"d": ("string", "0000-00-00"), "n": None, "again": Decimal(7), "huge": Decimal(0),
         "m": {}, "u": "x", "t": dt.time(0)},
    ]
    encoded = []
    for record in records:
        buf = io.BytesIO()
        schemaless_writer(buf, SCHEMA.parsed, record)
        encoded.append(buf.getvalue())
    decoded = [schemaless_reader(io.BytesIO(b), SCHEMA.parsed, None) for b in encoded]
    columns = record_columns(SCHEMA.schema)  # type: ignore[arg-type]
    fields = [f for c in columns for f in c.arrow_fields()]
    assert [f.name for f in fields] == ["d", "d__str", "n", "again", "huge", "m", "u", "t"]
    table = pa.Table.from_arrays(to_arrays(decoded, columns), schema=pa.schema(fields))
    assert table.schema.field("n").type == pa.decimal128(20, 0)
    assert table.schema.field("huge").type == pa.string()
    assert table.column("d__str").to_pylist() == [None, "0000-00-00"]
    assert table.column("u").to_pylist() == ["5", '"x"']  # a 3-way union: JSON text
    for row, original in zip(table.to_pylist(), encoded, strict=True):
        buf = io.BytesIO()
        schemaless_writer(buf, SCHEMA.parsed, from_row(row, columns))
        assert buf.getvalue() == original


def test_java_errors_become_their_root_cause() -> None:
    text = ("An error occurred while calling o35.jdbc.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure\n"
            "\tat org.apache.spark.scheduler.DAGScheduler...\n"
            "Caused by: org.postgresql.util.PSQLException: FATAL: password authentication "
            "failed for user \"x\"\n\tat org.postgresql.core...")
    assert java_message(RuntimeError(text)) == (
        'PSQLException: FATAL: password authentication failed for user "x"')
    assert java_message(RuntimeError("plain")) == "plain"
