"""Checking Avro values without decoding them (databus.schemas._program and the
event core's ``check_value``, both twins): the promise lazy values rest on.

- GOOD means fastavro decodes the bytes (all of them) with the schema;
- BAD means decoding refuses them;
- the twins give the same verdict on every valid, truncated, extended and mutated value.
"""

from __future__ import annotations

import io
import os
from types import ModuleType
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databus import batch
from databus.errors import SchemaError
from databus.schemas import AvroCodec, Schema
from databus.schemas._program import BAD, GOOD, UNSURE, compile_program

pytestmark = pytest.mark.twin("databus.batch")


def _native() -> ModuleType:
    try:
        return batch.twin("native")
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("the compiled batch module is not built")


@pytest.fixture(params=["python", "native"])
def core(request: pytest.FixtureRequest) -> ModuleType:
    return batch.twin("python") if request.param == "python" else _native()


ROW = Schema({
    "type": "record", "name": "Row", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "n", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "name", "type": ["null", "string"]},
        {"name": "blob", "type": "bytes"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "t", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
                                   "precision": 20, "scale": 2}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "color", "type": {"type": "enum", "name": "Color",
                                   "symbols": ["RED", "GREEN"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 3}},
        {"name": "again", "type": "Color"},
        {"name": "inner", "type": {"type": "record", "name": "Inner",
                                   "fields": [{"name": "x", "type": "shop.Code"}]}},
    ],
})


def _row(**change: Any) -> dict[str, Any]:
    import datetime
    import decimal
    import uuid

    row: dict[str, Any] = {
        "id": 7, "n": -3, "ok": True, "f": 1.5, "d": -2.25, "name": "é✓ name",
        "blob": b"\x00\xff", "day": datetime.date(2024, 2, 29),
        "at": datetime.datetime(2024, 1, 1, 12, tzinfo=datetime.UTC),
        "t": datetime.time(23, 59, 59, 999000), "price": decimal.Decimal("12.34"),
        "uid": str(uuid.UUID(int=12345)), "color": "GREEN", "tags": ["a", "", "ü"],
        "attrs": {"k": 1, "n": None}, "code": b"abc", "again": "RED",
        "inner": {"x": b"xyz"},
    }
    row.update(change)
    return row


def _encode(schema: Schema, value: Any) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, schema.parsed, value)
    return buf.getvalue()


def _decodes(schema: Schema, data: bytes) -> bool:
    try:
        AvroCodec().decode(data, schema)
    except SchemaError:
        return False
    return True


def test_a_valid_row_is_good_and_decodes(core: ModuleType) -> None:
    program = compile_program(ROW)
    assert program is not None
    data = _encode(ROW, _row())
    assert core.check_value(program, data) == GOOD
    assert _decodes(ROW, data)


def test_every_truncation_and_extension_is_bad(core: ModuleType) -> None:
    program = compile_program(ROW)
    data = _encode(ROW, _row())
    for cut in range(len(data)):
        assert core.check_value(program, data[:cut]) == BAD, cut
        assert not _decodes(ROW, data[:cut])
    assert core.check_value(program, data + b"\x00") == BAD  # trailing bytes


def test_bad_utf8_and_indexes_out_of_range_are_bad(core: ModuleType) -> None:
    schema = Schema({"type": "record", "name": "r", "fields": [
        {"name": "s", "type": "string"},
        {"name": "u", "type": ["null", "long"]},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}]})
    program = compile_program(schema)
    good = b"\x04ok" + b"\x02\x02" + b"\x00"
    assert core.check_value(program, good) == GOOD
    for bad in (b"\x04\xc3\x28" + good[3:],          # invalid continuation byte
                b"\x06\xed\xa0\x80" + good[3:],      # an encoded surrogate
                b"\x04\xc0\xaf" + good[3:],          # overlong
                good[:3] + b"\x04\x02" + b"\x00",    # union index 2 of 2
                good[:5] + b"\x02"):                 # enum index 1 of 1
        assert core.check_value(program, bad) == BAD, bad
        assert not _decodes(schema, bad), bad


def test_odd_but_decodable_values_are_unsure_not_bad(core: ModuleType) -> None:
    # A negative union index: Python indexing takes it; the client decodes such a
    # value at once instead of guessing.
    schema = Schema(["null", "long"])
    program = compile_program(schema)
    assert core.check_value(program, b"\x01\x02") == UNSURE
    # A timestamp past year 9999 is left to the decoder, which refuses it.
    ts = Schema({"type": "long", "logicalType": "timestamp-millis"})
    far = _encode(Schema("long"), 10**15)
    assert core.check_value(compile_program(ts), far) == UNSURE
    assert not _decodes(ts, far)


def test_a_recursive_schema_has_no_program() -> None:
    schema = Schema({"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "long"}, {"name": "next", "type": ["null", "Node"]}]})
    assert compile_program(schema) is None


def test_a_hostile_length_reads_nothing_outside_the_value(core: ModuleType) -> None:
    program = compile_program(Schema("bytes"))
    huge = b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01"  # a length of 2**63 - 1
    assert core.check_value(program, huge + b"abc") == BAD
    assert core.check_value(program, b"x" * 4 + b"\x02a", 4) == GOOD  # start honoured
    with pytest.raises(ValueError):
        core.check_value(program, b"abc", 2, 10)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_twins_agree_and_good_always_decodes(data: st.DataObject) -> None:
    python, native = batch.twin("python"), _native()
    program = compile_program(ROW)
    value = _encode(ROW, _row(
        id=data.draw(st.integers(-(2**63), 2**63 - 1)),
        n=data.draw(st.integers(-(2**31), 2**31 - 1)),
        name=data.draw(st.none() | st.text()),
        tags=data.draw(st.lists(st.text(), max_size=3)),
        blob=data.draw(st.binary(max_size=20))))
    mutated = bytearray(value)
    for _ in range(data.draw(st.integers(0, 3))):
        pos = data.draw(st.integers(0, len(mutated) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(mutated)))
    for candidate in (value, bytes(mutated), bytes(mutated[:cut])):
        verdict = python.check_value(program, candidate)
        assert native.check_value(program, candidate) == verdict
        if verdict == GOOD:
            assert _decodes(ROW, candidate)
        elif verdict == BAD:
            assert not _decodes(ROW, candidate)
