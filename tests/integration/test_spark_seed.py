"""Spark seeding on real servers.

Acceptance: a MariaDB table with every column type the binlog fetcher maps is seeded
over JDBC, then changed; the relay's binlog windows after the dump's SCN are appended to
the store and applied. Seeded rows must carry exactly the bytes the fetcher produces for
the same rows (schema, key, Avro value), and the snapshot must end up equal to the
source state. The export of that snapshot seeds a second store to the very same values.
Also: dumps without an SCN stamp are refused; a seed into a store that already has a
log merges the log after the dump and compacts the other sources with it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastavro import schemaless_writer

from databus.bootstrap._storage import LogWindow, stored_event
from databus.event import Op, decode_event, encode_event, iter_events, restamp_source_id
from databus.schemas import AvroCodec, Schema, avro_name
from databus.spark_jobs import JobRefused
from databus.spark_jobs.export import export, prepare_export
from databus.spark_jobs.seed import prepare_seed, seed
from tests.fixtures.servers import MariaDBServer, PostgresServer
from tests.integration.binlog_support import binlog_relay, fresh_database, source_uri
from tests.integration.spark_support import Stores, append, apply_all, make_stores
from tests.integration.test_binlog_types import ALL, COLUMNS
from tests.relay_harness import RunningRelay

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DB = "spark_seed"
SOURCE = f"{DB}.t"


@pytest.fixture
def stores(postgres_server: PostgresServer) -> Iterator[Stores]:
    yield from make_stores(postgres_server)


async def raw_windows(r: RunningRelay) -> list[tuple[int, int, list[bytes]]]:
    """Every window the relay holds: (SCN, timestamp, data events as served)."""
    body = b""
    checkpoint: str | None = None
    while True:
        params = {"max_bytes": str(64 << 20)}
        if checkpoint is not None:
            params["checkpoint"] = checkpoint
        async with await r.get("/v1/stream", **params) as resp:
            assert resp.status == 200, await resp.text()
            chunk = await resp.read()
            checkpoint = resp.headers["X-Databus-Checkpoint"]
        if not chunk:
            break
        body += chunk
    windows: list[tuple[int, int, list[bytes]]] = []
    current: list[bytes] = []
    for offset, header in iter_events(body):
        if header.is_eow:
            windows.append((header.scn, header.timestamp_ns, current))
            current = []
        elif not header.is_control:
            current.append(bytes(body[offset:offset + header.total_length]))
    return windows


def _insert(row_id: int, which: int | None) -> str:
    names = ["id"] + [name for name, _, _ in ALL]
    literals = [str(row_id)]
    for column in ALL:
        values = column[2]
        literals.append("NULL" if which is None and column in COLUMNS
                        else values[which or 0][0])
    return (f"INSERT INTO t ({', '.join(f'`{n}`' for n in names)}) "
            f"VALUES ({', '.join(literals)})")


def live_rows(stores: Stores, url: str, source: str) -> dict[bytes, bytes]:
    """key -> Avro value of the snapshot's live rows."""
    (source_id,) = stores.query(url, "SELECT source_id FROM dbus_sources WHERE name = %s",
                                (source,))[0]
    rows = stores.query(url, f"SELECT event FROM dbus_snapshot_{source_id} WHERE op = 1")
    out = {}
    for (data,) in rows:
        event = decode_event(data)
        out[event.key_bytes] = event.value
    return out


def test_seed_from_mariadb_plus_the_log_after_it_is_the_source_state(
    spark: SparkSession, stores: Stores, mariadb_server: MariaDBServer, tmp_path: Path
) -> None:
    sql = fresh_database(mariadb_server, DB)
    sql.run(
        "SET SESSION time_zone = '+00:00'",
        "SET SESSION sql_mode = 'ALLOW_INVALID_DATES'",
        "SET @big = FROM_BASE64('" + __import__("base64").b64encode(
            __import__("tests.integration.test_binlog_types", fromlist=["BIG"]).BIG).decode()
        + "')",
        "CREATE TABLE t (id INT PRIMARY KEY, "
        + ", ".join(f"`{name}` {sql_type}" for name, sql_type, _ in ALL) + ")",
    )
    url = stores.url()

    async def scenario() -> tuple[list[tuple[int, int, list[bytes]]], dict[int, str], int]:
        async with binlog_relay(tmp_path, source_uri(mariadb_server, SOURCE)) as r:
            for row_id, which in ((1, 0), (2, None), (3, 1), (4, 2)):
                sql.txn(_insert(row_id, which))
            prepared = prepare_seed(url, from_mysql=mariadb_server.url(), table=SOURCE,
                                    lock=True)
            summary = await asyncio.to_thread(seed, spark, prepared)
            assert summary.scn == prepared.scn
            assert summary.sources[SOURCE]["dump_rows"] == 4
            # After the dump: an update, a delete, an insert, a key change.
            sql.txn("UPDATE t SET vc = 'changed', d = 2.5, dte = '2000-01-02' WHERE id = 2")
            sql.txn("DELETE FROM t WHERE id = 3")
            sql.txn(_insert(5, 1))
            last = sql.txn("UPDATE t SET id = 6 WHERE id = 4")
            await r.wait_for_scn("db", last)
            windows = await raw_windows(r)
            names = {s.id: s.name for s in r.relay.catalog.sources()}
        return windows, names, prepared.scn

    windows, names, dump_scn = asyncio.run(scenario())
    assert all(names[decode_event(e).header.source_id] == SOURCE for _, _, w in windows for e in w)

    # Seeded rows are byte for byte what the fetcher produced for the same rows.
    before = {}
    for scn, _, events in windows:
        if scn <= dump_scn:
            for data in events:
                event = decode_event(data)
                before[event.key_bytes] = event
    seeded = stores.query(url, "SELECT key, scn, op, pkey, event FROM dbus_snapshot_1")
    assert len(seeded) == 4
    for key, scn, op, pkey, data in seeded:
        event, fetched = decode_event(data), before[key]
        assert (scn, op, event.header.from_snapshot) == (dump_scn, 1, True)
        assert pkey == fetched.header.partition_key
        assert event.header.schema_fingerprint == fetched.header.schema_fingerprint
        assert event.value == fetched.value, _differences(stores, url, event, fetched)
    state = stores.state(url)
    assert int(state["applied_scn"]) == int(state["log_floor_scn"]) == dump_scn
    assert json.loads(state["producer_checkpoint"])["window_scn"] == dump_scn

    # The log after the dump (as the producer would append it), applied on top.
    storage = stores.open(url)
    source_id = storage.source_ids()[SOURCE]
    after = [LogWindow(scn, ts, [stored_event(SOURCE, restamp_source_id(e, source_id))
                                 for e in events])
             for scn, ts, events in windows if scn > dump_scn]
    assert len(after) == 4
    append(storage, after)
    apply_all(storage)
    replay: dict[bytes, bytes | None] = {}
    for _, _, events in windows:
        for data in events:
            event = decode_event(data)
            replay[event.key_bytes] = event.value if event.op is Op.UPSERT else None
    source_state = {k: v for k, v in replay.items() if v is not None}
    assert live_rows(stores, url, SOURCE) == source_state
    assert sorted(int.from_bytes(k, "big") for k in source_state) == [1, 2, 5, 6]

    # Export, then seed a second store from the export: the same keys and Avro bytes.
    out = tmp_path / "export"
    exported = export(spark, prepare_export(url, source=SOURCE, out=str(out)))
    assert exported.rows_out == 4 and exported.scn == int(stores.state(url)["applied_scn"])
    check_export_values(out, exported.scn, windows)
    second = stores.url()
    prepared = prepare_seed(second, from_parquet=str(out))
    assert prepared.scn == exported.scn and prepared.source == SOURCE
    seed(spark, prepared)
    assert live_rows(stores, second, SOURCE) == source_state
    sql.close()


def _differences(stores: Stores, url: str, seeded: Any, fetched: Any) -> str:
    (text,) = stores.query(url, "SELECT schema_json FROM dbus_schemas")[0]
    schema = Schema(text)
    codec = AvroCodec(schemas=[schema])
    a, b = codec.decode(seeded.value, schema), codec.decode(fetched.value, schema)
    return f"key {seeded.key}: " + ", ".join(
        f"{k}: seeded {a[k]!r} != fetched {b[k]!r}" for k in a if a[k] != b[k])


def check_export_values(out: Path, scn: int, windows: list[tuple[int, int, list[bytes]]]
                        ) -> None:
    """The Parquet columns hold the decoded values of the last event of every key."""
    assert (out / "_databus_scn").read_text().strip() == str(scn)
    table = pq.read_table(out)
    meta = table.schema.metadata
    assert meta[b"databus.scn"] == str(scn).encode()
    assert meta[b"databus.source"] == SOURCE.encode()
    schema = Schema(meta[b"databus.avro_schema"].decode())
    codec = AvroCodec(schemas=[schema])
    latest = {}
    for _, _, events in windows:
        for data in events:
            event = decode_event(data)
            latest[event.key_bytes] = (event.op, codec.decode(event.value, schema))
    rows = table.to_pylist()
    assert {r["_databus_key"] for r in rows} == {k for k, (op, _) in latest.items()
                                                 if op is Op.UPSERT}
    for row in rows:
        _, expected = latest[row["_databus_key"]]
        for name, _, _ in ALL:
            field = avro_name(name)
            value = row[field]
            text = row.get(field + "__str")
            if text is not None:
                value = text
            if isinstance(value, str) and isinstance(expected[field], Decimal):
                value = Decimal(value)
            assert value == expected[field], (row["id"], name, value, expected[field])


def test_a_dump_without_an_scn_stamp_is_refused(stores: Stores, tmp_path: Path,
                                                mariadb_server: MariaDBServer) -> None:
    url = stores.url()
    dump = tmp_path / "dump.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]}), dump)
    with pytest.raises(JobRefused, match="carries no SCN stamp"):
        prepare_seed(url, from_parquet=str(dump), source="shop.t", key=["id"])
    sql = fresh_database(mariadb_server, "spark_nostamp")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY)")
    with pytest.raises(JobRefused, match="a JDBC dump needs an SCN stamp"):
        prepare_seed(url, from_mysql=mariadb_server.url(), table="spark_nostamp.t")
    sql.close()
    # Files of one dump that disagree on the SCN are not one dump either.
    parts = tmp_path / "parts"
    parts.mkdir()
    for i, scn in enumerate((100, 200)):
        table = pa.table({"id": pa.array([i], pa.int64())})
        pq.write_table(table.replace_schema_metadata({"databus.scn": str(scn)}),
                       parts / f"part-{i}.parquet")
    with pytest.raises(JobRefused, match="different SCNs"):
        prepare_seed(url, from_parquet=str(parts), source="shop.t", key=["id"])


# -- seeding a store that already has a log -------------------------------------------

TABLE_SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("name", pa.string()),
    pa.field("price", pa.decimal128(10, 2)),
    pa.field("born", pa.date32()),
    pa.field("seen", pa.timestamp("us", tz="UTC")),
])


def _row(i: int, version: int) -> dict[str, Any]:
    return {"id": i, "name": f"n{i}-v{version}", "price": Decimal(f"{i}.{version:02d}"),
            "born": dt.date(2000, 1, 1) + dt.timedelta(days=i),
            "seen": dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=version)}


def test_seed_into_a_store_with_a_log(spark: SparkSession, stores: Stores,
                                      tmp_path: Path) -> None:
    """The producer captured both sources since SCN 1000 and the applier got to about
    3000 when shop.users is seeded from a dump taken at 2000: the seed merges the log
    (2000, applied] over the dump. A second dump, taken at 4000, moves the store to 4000:
    the other source is compacted to 4000 in the same swap."""
    url = stores.url(span=1000)
    storage = stores.open(url)
    first = tmp_path / "users.parquet"
    pq.write_table(pa.Table.from_pylist([_row(i, 0) for i in range(1, 6)], TABLE_SCHEMA),
                   first)
    # The Avro schema a table dump gets (the fetcher's, for the same MariaDB table).
    probe = prepare_seed(url, from_parquet=str(first), source="shop.users", key=["id"],
                         scn=900)
    schema = probe.schema
    probe.close()
    state = {i: _row(i, 0) for i in range(1, 6)}
    states: dict[int, dict[int, dict[str, Any]]] = {}
    other: dict[str, int] = {}
    history: list[LogWindow] = []
    for version, scn in enumerate(range(1_100, 5_000, 100), start=1):
        user = version % 7 + 1
        if version % 5 == 0:
            state.pop(user, None)
            event = _event(schema, scn, user, None)
        else:
            state[user] = _row(user, version)
            event = _event(schema, scn, user, state[user])
        other[f"o{version % 3}"] = scn
        change = stored_event("shop.other", encode_event(
            scn=scn, source_id=2, op=Op.UPSERT, key=f"o{version % 3}", value=b"x" * version))
        history.append(LogWindow(scn, scn, [event, change]))
        states[scn] = {k: state[k] for k in sorted(state)}
    append(storage, history, log_floor_scn=1_000)
    apply_all(storage, upto=3_000, max_rows=4)
    applied = storage.state().applied_scn
    assert applied is not None and 3_000 <= applied < 4_000

    dump = tmp_path / "users-2000.parquet"
    pq.write_table(pa.Table.from_pylist(list(states[2_000].values()), TABLE_SCHEMA)
                   .replace_schema_metadata({"databus.scn": "2000"}), dump)
    summary = seed(spark, prepare_seed(url, from_parquet=str(dump), source="shop.users",
                                       key=["id"]))
    assert summary.scn == applied
    assert int(stores.state(url)["log_floor_scn"]) == 2_000
    assert _decoded(stores, url, schema) == states[applied]

    with pytest.raises(JobRefused, match="later than the dump's SCN 1500"):
        prepare_seed(url, from_parquet=str(first), source="shop.users", key=["id"], scn=1_500)

    dump = tmp_path / "users-4000.parquet"
    pq.write_table(pa.Table.from_pylist(list(states[4_000].values()), TABLE_SCHEMA)
                   .replace_schema_metadata({"databus.scn": "4000"}), dump)
    summary = seed(spark, prepare_seed(url, from_parquet=str(dump), source="shop.users",
                                       key=["id"]))
    assert summary.scn == 4_000 and "shop.other" in summary.sources
    assert _decoded(stores, url, schema) == states[4_000]
    # shop.other is at 4000 too, and the applier finishes both from there.
    apply_all(storage)
    assert _decoded(stores, url, schema) == states[4_900]
    rows = stores.query(url, "SELECT key, scn FROM dbus_snapshot_2")
    assert {key.decode(): scn for key, scn in rows} == other


def _event(schema: Schema, scn: int, key: int, row: dict[str, Any] | None) -> Any:
    buf = io.BytesIO()
    if row is not None:
        schemaless_writer(buf, schema.parsed, row)
    return stored_event("shop.users", encode_event(
        scn=scn, source_id=1, op=Op.UPSERT if row is not None else Op.DELETE, key=key,
        value=buf.getvalue(), schema_fingerprint=schema.fingerprint))


def _decoded(stores: Stores, url: str, schema: Schema) -> dict[int, Any]:
    codec = AvroCodec(schemas=[schema])
    rows = {}
    for key, data in live_rows(stores, url, "shop.users").items():
        rows[int.from_bytes(key, "big", signed=True)] = codec.decode(data, schema)
    return {k: rows[k] for k in sorted(rows)}
