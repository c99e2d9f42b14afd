"""The fold's rows straight from Avro bytes (``replicator/_avrorow``): both twins give,
for random values of every type a plan reads, exactly the row the general path gives
(fastavro into a dict, then the PostgreSQL converters: ``TableFold.row``), value for
value and type for type; they decline the same values; and a schema or converter the
plan does not cover has no plan."""

from __future__ import annotations

import datetime as dt
import io
import math
import random
from decimal import Decimal
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from databus.replicator import _avrorow
from databus.replicator._avrorow import plan_for, twin
from databus.replicator._model import ColumnMap, TableMap
from databus.replicator._replicator import make_fold

pytestmark = pytest.mark.twin("databus.replicator._avrorow")

TWINS = ["python"] + (["native"] if _avrorow.IMPLEMENTATION == "native" else [])

FIELDS: list[tuple[str, Any]] = [
    ("id", "long"),
    ("i", ["null", "int"]),
    ("flag", "boolean"),
    ("f4", "float"),
    ("f8", ["double", "null"]),
    ("s", "string"),
    ("note", ["null", "string"]),
    ("b", "bytes"),
    ("fx", {"type": "fixed", "name": "f3", "size": 3}),
    ("amount", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}),
    ("big", ["null", {"type": "fixed", "name": "d", "size": 16, "logicalType": "decimal",
                      "precision": 38, "scale": 10}]),
    ("day", {"type": "int", "logicalType": "date"}),
    ("at", {"type": "long", "logicalType": "timestamp-micros"}),
    ("local", ["null", {"type": "long", "logicalType": "local-timestamp-micros"}]),
    ("tod", {"type": "long", "logicalType": "time-micros"}),
    ("created", [{"type": "long", "logicalType": "local-timestamp-micros"}, "string"]),
    ("born", ["null", {"type": "int", "logicalType": "date"}, "string"]),
    ("skipped", "string"),  # in the schema, not replicated
]
SCHEMA = {"type": "record", "name": "r", "fields": [{"name": n, "type": t} for n, t in FIELDS]}
PARSED = parse_schema(SCHEMA)
REPLICATED = [n for n, _ in FIELDS if n != "skipped"] + ["absent"]  # absent: no such field


def table() -> TableMap:
    types = {n: t for n, t in FIELDS}
    types["absent"] = ["null", "long"]
    return TableMap("s.t", None, "t", ("id",), tuple(
        ColumnMap(n, n, types[n], "x", n != "id") for n in REPLICATED), 1)


FOLD = make_fold(table(), "postgresql")
PLAN = plan_for(SCHEMA, REPLICATED, FOLD._converters)


def rand_value(rng: random.Random) -> dict[str, Any]:
    def maybe(v: Any) -> Any:
        return None if rng.random() < 0.2 else v

    text = "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0xD7FF),
                                   rng.randint(0x10000, 0x10FFFF)]))
                   for _ in range(rng.randint(0, 12)))
    return {
        "id": rng.randint(-2**63, 2**63 - 1), "i": maybe(rng.randint(-2**31, 2**31 - 1)),
        "flag": rng.random() < 0.5, "f4": rng.choice([rng.random() * 1e6, -0.0, math.inf]),
        "f8": maybe(rng.choice([rng.random() * 10 ** rng.randint(-300, 300), math.nan])),
        "s": text, "note": maybe(text[::-1]), "b": rng.randbytes(rng.randint(0, 20)),
        "fx": rng.randbytes(3),
        "amount": Decimal(rng.randint(-10**10, 10**10)).scaleb(-2),
        "big": maybe(Decimal(rng.randint(-10**37, 10**37)).scaleb(-10)),
        "day": dt.date.fromordinal(rng.randint(1, dt.date(9999, 12, 31).toordinal())),
        "at": dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
            microseconds=rng.randint(-62135596800 * 10**6, 253402300799 * 10**6)),
        "local": maybe(dt.datetime(1, 1, 1) + dt.timedelta(
            microseconds=rng.randint(0, 315537897599 * 10**6))),
        "tod": dt.time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                       rng.randint(0, 999_999)),
        "created": rng.choice([dt.datetime(2024, 5, 6, 7, 8, 9, rng.randint(0, 999_999)),
                               "0000-00-00 00:00:00"]),
        # (a tuple names the union branch: fastavro would read the text as a date)
        "born": rng.choice([None, dt.date(1999, 12, 31), ("string", "2021-02-31")]),
        "skipped": "x",
    }


def encode(value: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, PARSED, value)
    return buf.getvalue()


def general(data: bytes) -> tuple[Any, ...]:
    from fastavro import schemaless_reader

    return FOLD.row(schemaless_reader(io.BytesIO(data), PARSED, None), None, 0)


def typed(row: tuple[Any, ...] | None) -> Any:
    if row is None:
        return None
    return [(type(v), repr(v)) for v in row]


def test_the_twins_give_the_general_paths_rows() -> None:
    assert PLAN is not None
    rng = random.Random(30)
    for _ in range(2000):
        data = encode(rand_value(rng))
        want = typed(general(data))
        for name in TWINS:
            assert typed(twin(name).row(data, PLAN)) == want, name


@pytest.mark.parametrize("value", [
    {"s": "a\x00b"},  # the text converter refuses a NUL: declined
    {"note": "\x00"},
])
def test_the_twins_decline_what_the_general_path_refuses(value: dict[str, Any]) -> None:
    assert PLAN is not None
    data = encode({**rand_value(random.Random(1)), **value})
    with pytest.raises(Exception, match="NUL"):
        general(data)
    for name in TWINS:
        assert twin(name).row(data, PLAN) is None, name


def test_broken_bytes_are_declined() -> None:
    assert PLAN is not None
    data = encode(rand_value(random.Random(2)))
    for name in TWINS:
        mod = twin(name)
        assert mod.row(data + b"\x00", PLAN) is None  # bytes left over
        assert mod.row(data[:-1], PLAN) is None  # cut short
        assert mod.row(b"", PLAN) is None


def test_no_plan_for_types_or_converters_it_does_not_cover() -> None:
    sources = ["id", "x"]
    ident = make_fold(TableMap("s.t", None, "t", ("id",), (
        ColumnMap("id", "id", "long", "x", False),
        ColumnMap("x", "x", "long", "x", True)), 1), "postgresql")._converters

    def schema(t: Any) -> dict[str, Any]:
        return {"type": "record", "name": "r",
                "fields": [{"name": "id", "type": "long"}, {"name": "x", "type": t}]}

    assert plan_for(schema("long"), sources, ident) is not None
    for t in [{"type": "enum", "name": "e", "symbols": ["A"]},
              {"type": "array", "items": "string"}, ["null", "string", "long"],
              {"type": "string", "logicalType": "uuid"},
              {"type": "long", "logicalType": "timestamp-millis"}, "f3"]:
        assert plan_for(schema(t), sources, ident) is None, t
    mysql = make_fold(TableMap("s.t", None, "t", ("id",), (
        ColumnMap("id", "id", "long", "x", False),
        ColumnMap("x", "x", {"type": "long", "logicalType": "timestamp-micros"}, "x",
                  True)), 1), "mysql")._converters  # instants made naive: a converter
    assert plan_for(schema({"type": "long", "logicalType": "timestamp-micros"}), sources,
                    mysql) is None


class BytesEvent:
    """An upsert as the client delivers it: Avro bytes, the writer schema, a lazy value."""

    def __init__(self, data: bytes, key: Any, scn: int) -> None:
        from databus.schemas import Schema

        self.source, self.key, self.scn, self.is_delete = "s.t", key, scn, False
        self.value_bytes, self.schema = data, Schema(SCHEMA)
        self.reads = 0

    @property
    def value(self) -> dict[str, Any]:
        from fastavro import schemaless_reader

        self.reads += 1
        out: dict[str, Any] = schemaless_reader(io.BytesIO(self.value_bytes), PARSED, None)
        return out


def test_the_fold_reads_survivors_rows_from_their_bytes() -> None:
    from databus.replicator._fold import Folder

    rng = random.Random(3)
    values = [rand_value(rng) for _ in range(50)]
    events = [BytesEvent(encode(v), v["id"], i) for i, v in enumerate(values)]
    events.append(BytesEvent(encode({**values[0], "s": "NUL \x00"}), values[0]["id"], 99))
    f = Folder({"s.t": make_fold(table(), "postgresql")})
    for e in events:
        f.start_window()
        f.add(e)
        f.end_window(e.scn)
    with pytest.raises(Exception, match="NUL"):  # declined, then refused the general way
        f.materialize()
    f = Folder({"s.t": make_fold(table(), "postgresql")})
    for e in events[:-1]:
        f.start_window()
        f.add(e)
        f.end_window(e.scn)
    rows = {k: c.row for k, c in f.take().changes["s.t"].items()}
    assert {k: typed(r) for k, r in rows.items()} == {
        (v["id"],): typed(general(encode(v))) for v in values}
    reads = sum(e.reads for e in events[:-1])
    assert reads == (0 if _avrorow.IMPLEMENTATION == "native" else len(values))
