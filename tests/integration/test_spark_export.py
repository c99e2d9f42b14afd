"""Parquet export of a snapshot: decoded columns for every Avro type, older schema
versions resolved to the newest, the SCN in the metadata and the marker, consistency
while the applier runs, and a round trip through seeding."""

from __future__ import annotations

import datetime as dt
import io
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest
from fastavro import schemaless_writer

from databus.bootstrap._storage import LogWindow, stored_event
from databus.errors import ConfigError
from databus.event import Op, decode_event, encode_event
from databus.schemas import AvroCodec, Schema
from databus.spark_jobs._store import PgStore
from databus.spark_jobs.export import Decoder, decode_snapshot, export, prepare_export
from databus.spark_jobs.seed import KEY_COLUMN, prepare_seed, seed
from tests.fixtures.servers import PostgresServer
from tests.integration.spark_support import Stores, append, apply_all, make_stores

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SOURCE = "shop.items"
V1: dict[str, Any] = {
    "type": "record", "name": "Item", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                   "scale": 2}},
        {"name": "big", "type": {"type": "fixed", "name": "d50", "size": 22,
                                 "logicalType": "decimal", "precision": 50, "scale": 5}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "dims", "type": {"type": "record", "name": "Dims", "fields": [
            {"name": "w", "type": "float"}, {"name": "h", "type": "double"}]}},
        {"name": "color", "type": {"type": "enum", "name": "Color",
                                   "symbols": ["RED", "GREEN"]}},
        {"name": "flag", "type": "boolean"},
        {"name": "blob", "type": "bytes"},
        {"name": "when", "type": [{"type": "int", "logicalType": "date"}, "string"]},
        {"name": "either", "type": ["null", "long", "string"]},
    ]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "extra", "type": "string", "default": "none"}]}


@pytest.fixture
def stores(postgres_server: PostgresServer) -> Iterator[Stores]:
    yield from make_stores(postgres_server)


def _item(i: int, version: int, schema: dict[str, Any]) -> dict[str, Any]:
    row = {
        "id": i, "name": None if i % 4 == 0 else f"item {i} v{version}",
        "price": Decimal(f"{i}.{version % 100:02d}"),
        "big": Decimal("-" + "9" * 40 + f".{i:05d}"),
        "day": dt.date(2020, 1, 1) + dt.timedelta(days=i),
        "at": dt.datetime(2024, 5, 6, 7, 8, 9, i, tzinfo=dt.UTC),
        "local": dt.datetime(2024, 5, 6, 7, 8, 9, version),
        "tags": [f"t{j}" for j in range(i % 3)], "attrs": {"v": version, "i": i},
        "dims": {"w": 1.5, "h": i / 3}, "color": "GREEN" if i % 2 else "RED",
        "flag": bool(i % 2), "blob": bytes([i % 256]) * (i % 5),
        "when": ("string", "0000-00-00") if i % 3 == 0 else dt.date(2021, 1, i % 28 + 1),
        "either": [None, i, f"s{i}"][i % 3],
    }
    if schema is V2:
        row["extra"] = f"x{version}"
    return row


def _log(v1: Schema, v2: Schema, windows: int = 120) -> list[LogWindow]:
    out = []
    for version in range(1, windows + 1):
        schema, raw = (v1, V1) if version < windows // 2 else (v2, V2)
        events = []
        for i in (version % 17, (version * 7) % 17):
            op = Op.DELETE if version % 11 == 0 else Op.UPSERT
            buf = io.BytesIO()
            schemaless_writer(buf, schema.parsed, _item(i, version, raw))
            events.append(stored_event(SOURCE, encode_event(
                scn=version * 10, source_id=1, op=op, key=i, value=buf.getvalue(),
                schema_fingerprint=schema.fingerprint)))
        out.append(LogWindow(version * 10, version, events))
    return out


def _store(stores: Stores) -> tuple[str, Any, list[LogWindow], Schema, Schema]:
    url = stores.url(span=100)
    storage = stores.open(url)
    v1, v2 = Schema(V1), Schema(V2)
    storage.ensure_sources([SOURCE])
    storage.add_schema(v1.fingerprint, SOURCE, v1.to_json())
    storage.add_schema(v2.fingerprint, SOURCE, v2.to_json())
    log = _log(v1, v2)
    append(storage, log)
    return url, storage, log, v1, v2


def _expected(log: list[LogWindow], upto: int, v1: Schema, v2: Schema
              ) -> dict[int, tuple[int, dict[str, Any]]]:
    codec = AvroCodec(schemas=[v1, v2])
    state: dict[int, tuple[int, dict[str, Any]]] = {}
    for window in log:
        if window.scn > upto:
            break
        for e in window.events:
            event = decode_event(e.event)
            key = int.from_bytes(event.key_bytes, "big", signed=True)
            if event.op is Op.DELETE:
                state.pop(key, None)
            else:
                state[key] = (window.scn, codec.decode(event.value,
                                                       event.header.schema_fingerprint, v2))
    return state


def _comparable(value: Any) -> Any:
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return dict(value)  # an Arrow map
    return value


def _check_rows(rows: list[dict[str, Any]], expected: dict[int, tuple[int, dict[str, Any]]]
                ) -> None:
    assert sorted(r["id"] for r in rows) == sorted(expected)
    for row in rows:
        scn, value = expected[row["id"]]
        assert row["_databus_row_scn"] == scn
        assert int.from_bytes(row[KEY_COLUMN], "big") == row["id"]
        for name, want in value.items():
            got = _comparable(row[name])
            if row.get(name + "__str") is not None:  # the [T, "string"] unions
                got = row[name + "__str"]
            if name == "big":  # precision 50: exported as its exact text
                got = Decimal(got)
            assert got == want, (row["id"], name, got, want)


def test_export_decodes_every_type_at_the_applied_scn(spark: SparkSession, stores: Stores,
                                                      tmp_path: Path) -> None:
    url, storage, log, v1, v2 = _store(stores)
    apply_all(storage, upto=log[80].scn)
    applied = storage.state().applied_scn
    assert applied is not None
    out = tmp_path / "items"

    summary = export(spark, prepare_export(url, source=SOURCE, out=str(out)), partitions=3)

    assert summary.scn == applied
    assert (out / "_databus_scn").read_text() == f"{applied}\n"
    assert not (out / "_temporary").exists()
    files = sorted(out.glob("*.parquet"))
    assert files
    for file in files:
        meta = pq.read_schema(file).metadata
        assert meta[b"databus.scn"] == str(applied).encode()
        assert Schema(meta[b"databus.avro_schema"].decode()).fingerprint == v2.fingerprint
    table = pq.read_table(out)
    expected = _expected(log, applied, v1, v2)
    assert table.num_rows == summary.rows_out == len(expected)
    _check_rows(table.to_pylist(), expected)

    # The same through Spark's own Parquet reader, and decode_snapshot without files.
    assert spark.read.parquet(str(out)).count() == len(expected)
    with PgStore.for_url(url).reading() as view:
        from databus.spark_jobs.compact import read_snapshot

        frame = read_snapshot(spark, view, 1, parts=2)
        decoded = decode_snapshot(frame, Decoder((v1.to_json(), v2.to_json()), v2.to_json()))
        assert sorted(r["id"] for r in decoded.collect()) == sorted(expected)

    with pytest.raises(ConfigError, match="not empty"):
        prepare_export(url, source=SOURCE, out=str(out))
    apply_all(storage)
    again = export(spark, prepare_export(url, source=SOURCE, out=str(out), overwrite=True))
    assert again.scn == log[-1].scn
    _check_rows(pq.read_table(out).to_pylist(), _expected(log, log[-1].scn, v1, v2))

    # An export is a stamped dump: it seeds an empty store to the same values.
    second = stores.url()
    seeded = seed(spark, prepare_seed(second, from_parquet=str(out)))
    assert seeded.scn == log[-1].scn
    codec = AvroCodec(schemas=[v2])
    rows = stores.query(second, "SELECT key, scn, event FROM dbus_snapshot_1 WHERE op = 1")
    final = _expected(log, log[-1].scn, v1, v2)
    assert {int.from_bytes(k, "big"): codec.decode(decode_event(e).value, v2)
            for k, _, e in rows} == {k: v for k, (_, v) in final.items()}


def test_export_is_consistent_while_the_applier_runs(spark: SparkSession, stores: Stores,
                                                     tmp_path: Path) -> None:
    url, storage, log, v1, v2 = _store(stores)
    apply_all(storage, upto=log[10].scn)
    applier = stores.open(url)
    stop = threading.Event()

    def run_applier() -> None:  # one window at a time, all along the export
        while not stop.is_set() and applier.apply(max_rows=1) is not None:
            time.sleep(0.03)

    thread = threading.Thread(target=run_applier)
    thread.start()
    try:
        summary = export(spark, prepare_export(url, source=SOURCE, out=str(tmp_path / "x")))
    finally:
        stop.set()
        thread.join()
    assert summary.scn is not None
    assert log[10].scn < summary.scn < log[-1].scn, "the applier was not running meanwhile"
    _check_rows(pq.read_table(tmp_path / "x").to_pylist(),
                _expected(log, summary.scn, v1, v2))
