"""The twins of the PostgreSQL target's binary COPY rows (``replicator/targets/_pgcopy``)
write the same bytes, or refuse the same rows, on many random values of every encoder
(dates from year 1 to 9999, instants naive, UTC and in other zones, ints at and past each
column's bounds, floats past a float4, text with lone surrogates). What the server makes
of the bytes is tested against the text format in
``tests/integration/test_replicator_pgcopy.py``."""

from __future__ import annotations

import datetime as dt
import random
import struct
import uuid
from decimal import Decimal
from typing import Any

import pytest

from databus.replicator.targets import _pgcopy
from databus.replicator.targets._pgcopy import binary_encoders, twin

pytestmark = pytest.mark.twin("databus.replicator.targets._pgcopy")

TWINS = ["python"] + (["native"] if _pgcopy.IMPLEMENTATION == "native" else [])
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))


def same(rows: list[tuple[Any, ...]], types: list[str]) -> bytes | None:
    encoders = binary_encoders(types)
    assert encoders is not None
    out = [twin(name).copy_binary(rows, encoders) for name in TWINS]
    assert all(o == out[0] for o in out), (types, rows)
    return out[0]


def rand_date(rng: random.Random) -> dt.date:
    return dt.date.fromordinal(rng.randint(1, dt.date(9999, 12, 31).toordinal()))


def rand_datetime(rng: random.Random, tz: dt.tzinfo | None) -> dt.datetime:
    d = rand_date(rng)
    v = dt.datetime(d.year, d.month, d.day, rng.randint(0, 23), rng.randint(0, 59),
                    rng.randint(0, 59), rng.randint(0, 999_999), tzinfo=tz)
    if tz is not None and not dt.datetime(2, 1, 1, tzinfo=dt.UTC) < v < dt.datetime(
            9999, 12, 30, tzinfo=dt.UTC):
        v = v.replace(year=2000)  # astimezone would leave datetime's range
    return v


def test_the_twins_write_the_same_bytes_on_random_values() -> None:
    rng = random.Random(30)
    for _ in range(300):
        rows = [(rng.randint(-2**63, 2**63 - 1), rng.randint(-2**31, 2**31 - 1),
                 rng.randint(-2**15, 2**15 - 1), rng.random() * 10 ** rng.randint(-300, 300),
                 struct.unpack("f", struct.pack("f", rng.random()))[0], rng.random() < 0.5,
                 "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0xD7FF),
                                         rng.randint(0x10000, 0x10FFFF)]))
                         for _ in range(rng.randint(0, 20))),
                 rng.randbytes(rng.randint(0, 50)), rand_date(rng),
                 rand_datetime(rng, None), rand_datetime(rng, dt.UTC),
                 rand_datetime(rng, rng.choice([None, dt.UTC, IST])),
                 f'{{"a": {rng.randint(0, 9)}}}',
                 Decimal(rng.randint(-10**rng.randint(0, 40), 10**rng.randint(0, 40))).scaleb(
                     rng.randint(-40, 10)),
                 dt.time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                         rng.randint(0, 999_999)),
                 dt.timedelta(microseconds=rng.randint(-10**15, 10**15)),
                 uuid.UUID(int=rng.getrandbits(128)))
                for _ in range(5)]
        rows = [tuple(None if rng.random() < 0.1 else v for v in row) for row in rows]
        assert same(rows, ["int8", "int4", "int2", "float8", "float4", "bool", "text",
                           "bytea", "date", "timestamp", "timestamptz", "timestamptz",
                           "jsonb", "numeric", "time", "interval", "uuid"]) is not None


@pytest.mark.parametrize(("types", "value"), [
    (["int8"], 2**63), (["int8"], -2**63 - 1), (["int4"], 2**31), (["int4"], -2**31 - 1),
    (["int2"], 2**15), (["int2"], -2**15 - 1), (["float4"], 1e300), (["int8"], True),
    (["int8"], 1.0), (["text"], "a\udc80"), (["jsonb"], "\ud800"), (["numeric"], "1"),
    (["date"], dt.datetime(2020, 1, 1)), (["bool"], 1),
])
def test_the_twins_refuse_the_same_values(types: list[str], value: Any) -> None:
    assert same([(value,)], types) is None


@pytest.mark.parametrize(("types", "value"), [
    (["int8"], 2**63 - 1), (["int8"], -2**63), (["int4"], -2**31), (["int2"], 2**15 - 1),
    (["float4"], float("inf")), (["float8"], float("nan")), (["float4"], 3.4028234663852886e38),
    (["bytea"], bytearray(b"\x00x")), (["bytea"], memoryview(b"yz")), (["text"], ""),
    (["date"], dt.date(1, 1, 1)), (["date"], dt.date(9999, 12, 31)),
    (["timestamp"], dt.datetime(1, 1, 1)),
    (["timestamptz"], dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),
])
def test_the_twins_agree_at_the_bounds(types: list[str], value: Any) -> None:
    assert same([(value,), (None,)], types) is not None
