"""The Arrow rows of the ``databus`` source (``_arrow_rows.RowBatches``) equal, batch for
batch, what Spark's Python data source makes of the tuple rows (``_rows.window_rows``,
the reference) with its own converter: for every fetcher type, nulls, deletes without a
row, text branches, renamed clashing columns, every key shape, and random windows."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from databus.client._events import DataEvent
from databus.event import Op
from databus.fetchers.mysql._types import Kind
from databus.spark_jobs.stream._arrow_rows import RowBatches
from databus.spark_jobs.stream._rows import window_rows
from databus.spark_jobs.stream._schema import row_converter
from databus.spark_jobs.stream._source import DatabusDataSource, _meta_fields
from tests.unit.test_spark_stream_schema import FETCHER_TYPES, mysql, record, round_trip


def struct(avro: dict[str, Any] | None, source: str = "db.t") -> Any:
    """The source's StructType, as ``_source._Planned.schema`` makes it."""
    from pyspark.sql.types import StringType, StructField, StructType

    from databus.spark_jobs.stream._rows import value_column_names
    from databus.spark_jobs.stream._schema import spark_schema

    fields = _meta_fields()
    if avro is None:
        fields.append(StructField("value", StringType(), True))
    else:
        typed = spark_schema(avro).fields
        names = value_column_names([f.name for f in typed], source=source)
        fields += [StructField(n, f.dataType, f.nullable, f.metadata)
                   for n, f in zip(names, typed, strict=True)]
    return StructType(fields)


def spark_batch(windows: list[list[DataEvent]], avro: dict[str, Any] | None,
                partition: int) -> pa.RecordBatch:
    """What Spark builds from the tuple rows (its converter, one batch)."""
    columns = None if avro is None else row_converter(avro)
    rows = [row for events in windows for row in window_rows(events, partition, columns)]
    batches = list(records_to_arrow_batches(iter(rows), 1 << 20, struct(avro),
                                            DatabusDataSource))
    assert len(batches) == 1
    return batches[0]


def arrow_batch(windows: list[list[DataEvent]], avro: dict[str, Any] | None,
                partition: int) -> pa.RecordBatch:
    builder = RowBatches(struct(avro), partition, avro)
    for events in windows:
        builder.add(events)
    assert len(builder) == sum(map(len, windows))
    batch = builder.take()
    assert batch is not None and builder.take() is None and len(builder) == 0
    return batch


def same(windows: list[list[DataEvent]], avro: dict[str, Any] | None,
         partition: int = 1) -> pa.RecordBatch:
    ours, theirs = arrow_batch(windows, avro, partition), spark_batch(windows, avro, partition)
    assert ours.schema.equals(theirs.schema)
    assert ours.to_pylist() == theirs.to_pylist()
    assert ours.equals(theirs)
    return ours


def event(scn: int, key: Any, value: dict[str, Any] | None, *, op: Op = Op.UPSERT,
          ts: int = 1_700_000_000_123_456_789, source: str = "db.t",
          boot: bool = False, dump: bool = False) -> DataEvent:
    return DataEvent(scn, source, op, key, value, ts, None, from_bootstrap=boot,
                     from_dump=dump)


@pytest.mark.parametrize(("label", "avro", "spark", "value", "expected"), FETCHER_TYPES,
                         ids=[row[0] for row in FETCHER_TYPES])
def test_every_fetcher_type(label: str, avro: Any, spark: str, value: Any,
                            expected: Any) -> None:
    schema = record(("id", "long"), ("c", avro))
    decoded = round_trip(schema, {"id": 1, "c": value})
    windows = [[event(10, 1, decoded), event(10, 2, None, op=Op.DELETE)],
               [event(11, 1, decoded, ts=0, boot=True)]]
    same(windows, schema)
    same(windows, None)  # the same values as JSON text


def test_text_branches_nulls_and_clashing_names() -> None:
    schema = record(("id", "long"), ("d", mysql(Kind.DATE, nullable=True)),
                    ("key", ["null", "string"]), ("seq", "int"),
                    ("timestamp", ["null", "long"]))
    values = [round_trip(schema, v) for v in (
        {"id": 1, "d": ("string", "0000-00-00"), "key": "k", "seq": 3, "timestamp": 9},
        {"id": 2, "d": dt.date(2020, 1, 2), "key": None, "seq": -1, "timestamp": None},
        {"id": 3, "d": None, "key": "x", "seq": 0, "timestamp": 1})]
    batch = same([[event(5, v["id"], v) for v in values],
                  [event(6, 4, None, op=Op.DELETE, dump=True)]], schema)
    assert batch.schema.names[8:] == ["id", "d", "d__str", "value_key", "value_seq",
                                      "value_timestamp"]


def test_keys_of_every_shape_and_values_json_has_no_type_for() -> None:
    import uuid

    value = {"b": b"\x00\xff", "d": Decimal("1.50"), "t": dt.time(1, 2),
             "w": dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "u": uuid.UUID(int=7),
             "n": None, "l": [1, "a"], "m": {"k": 1.5}}
    keys = [0, -(2**63), 2**64 - 1, "alice", "é\"\\", b"\x01\xff", (1, "eu"),
            (b"\x00", 2), True]
    batch = same([[event(7, k, value) for k in keys]], None, partition=0)
    assert batch.column("key").to_pylist()[:6] == [
        "0", str(-(2**63)), str(2**64 - 1), '"alice"', '"é\\"\\\\"', '"01ff"']
    assert json.loads(batch.column("value")[0].as_py())["u"] == str(uuid.UUID(int=7))


def test_the_commit_time_is_kept_to_the_microsecond_below() -> None:
    stamps = [1, 999, 1_000, 1_700_000_000_999_999_999, 2**62]
    batch = same([[event(1, i, None, ts=ts) for i, ts in enumerate(stamps)]], None)
    micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
    assert micros == [0, 0, 1, 1_700_000_000_999_999, 2**62 // 1000]


KEYS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=8),
                 st.binary(max_size=4))
SCHEMA = record(("id", "long"), ("name", ["null", "string"]), ("qty", ["null", "int"]),
                ("price", mysql(Kind.DECIMAL, precision=10, scale=2)))
VALUES = st.one_of(st.none(), st.fixed_dictionaries({
    "id": st.integers(-(2**63), 2**63 - 1), "name": st.none() | st.text(max_size=10),
    "qty": st.none() | st.integers(-(2**31), 2**31 - 1),
    "price": st.decimals(min_value=-(10**7), max_value=10**7, places=2,
                         allow_nan=False)}).map(lambda v: round_trip(SCHEMA, v)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(KEYS, VALUES, st.booleans()), max_size=6),
                min_size=1, max_size=5).filter(lambda w: any(w)),
       st.integers(0, 1023))
def test_random_windows(windows: list[list[tuple[Any, Any, bool]]], partition: int) -> None:
    events = [[event(100 + i, k, v, op=Op.DELETE if v is None else Op.UPSERT, boot=b)
               for k, v, b in w] for i, w in enumerate(windows)]
    same(events, SCHEMA, partition)
    same(events, None, partition)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary()
    | st.decimals(allow_nan=False) | st.dates() | st.times() | st.uuids(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=6))
def test_value_json_is_the_encoders_text(value: dict[str, Any]) -> None:
    """The C encoder made once writes what ``json.dumps`` with the same arguments does."""
    from databus.spark_jobs.stream._rows import _plain, value_json

    assert value_json(value) == json.dumps(value, default=_plain, separators=(",", ":"),
                                           ensure_ascii=False)
