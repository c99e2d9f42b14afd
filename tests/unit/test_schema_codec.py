"""The Avro codec: interoperability with the ``avro`` package, round trips, resolution.

Bytes written by our codec must decode with the ``avro`` package and the other way
round; writer->reader resolution must follow the Avro rules and be skipped when the
fingerprints are equal; every failure must be a ``SchemaError``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import uuid
from decimal import Decimal
from typing import Any

import avro.io
import avro.schema
import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import databus.schemas._codec as codec_module
from databus.errors import SchemaError
from databus.schemas import AvroCodec, MemorySchemaRegistry, Schema, UnknownSchemaError
from tests.unit.test_schema_strategies import normalise, schemas_with_values

UTC = dt.UTC

EVERYTHING = Schema(
    {
        "type": "record",
        "name": "Everything",
        "namespace": "test.v1",
        "fields": [
            {"name": "n", "type": "null"},
            {"name": "b", "type": "boolean"},
            {"name": "i", "type": "int"},
            {"name": "l", "type": "long"},
            {"name": "f", "type": "float"},
            {"name": "d", "type": "double"},
            {"name": "by", "type": "bytes"},
            {"name": "s", "type": "string"},
            {"name": "opt_s", "type": ["null", "string"], "default": None},
            {"name": "opt_l", "type": ["null", "long"], "default": None},
            {"name": "multi", "type": ["null", "boolean", "double", "string", "bytes"]},
            {
                "name": "color",
                "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]},
            },
            {"name": "opt_color", "type": ["null", "Color"]},
            {"name": "ints", "type": {"type": "array", "items": "int"}},
            {"name": "names", "type": {"type": "map", "values": "string"}},
            {"name": "md5", "type": {"type": "fixed", "name": "MD5", "size": 16}},
            {
                "name": "price",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
            },
            {
                "name": "total",
                "type": {
                    "type": "fixed",
                    "name": "Money",
                    "size": 8,
                    "logicalType": "decimal",
                    "precision": 18,
                    "scale": 4,
                },
            },
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
            {
                "name": "lines",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Line",
                        "fields": [
                            {"name": "sku", "type": "string"},
                            {"name": "qty", "type": "int"},
                            {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
                        ],
                    },
                },
            },
        ],
    }
)


def everything_value(**changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "n": None,
        "b": True,
        "i": -(2**31),
        "l": 2**63 - 1,
        "f": 1.5,
        "d": -2.25e300,
        "by": b"\x00\xff\x10",
        "s": "héllo wörld ✓",
        "opt_s": None,
        "opt_l": -7,
        "multi": "text",
        "color": "GREEN",
        "opt_color": "BLUE",
        "ints": [0, 1, -1, 2**31 - 1],
        "names": {"a": "x", "": "empty key"},
        "md5": bytes(range(16)),
        "price": Decimal("-1234567890.12"),
        "total": Decimal("12345678901234.5678"),
        "ts": dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        "day": dt.date(1969, 12, 31),
        "uid": "1b4e28ba-2d53-41a8-9f0d-2e1c8e8f0a2b",
        "lines": [
            {"sku": "A-1", "qty": 3, "attrs": {"w": 10, "h": None}},
            {"sku": "B-2", "qty": 0, "attrs": {}},
        ],
    }
    value.update(changes)
    return value


def avro_write(schema: Schema, value: Any) -> bytes:
    buf = io.BytesIO()
    writer = avro.io.DatumWriter(avro.schema.parse(schema.to_json()))
    writer.write(value, avro.io.BinaryEncoder(buf))
    return buf.getvalue()


def avro_read(writer: Schema, data: bytes, reader: Schema | None = None) -> Any:
    datum_reader = avro.io.DatumReader(
        avro.schema.parse(writer.to_json()),
        avro.schema.parse(reader.to_json()) if reader else None,
    )
    return datum_reader.read(avro.io.BinaryDecoder(io.BytesIO(data)))


def record(name: str, *fields: dict[str, Any], **extra: Any) -> Schema:
    return Schema({"type": "record", "name": name, "fields": list(fields), **extra})


@pytest.fixture
def codec() -> AvroCodec:
    return AvroCodec()


class TestInteroperability:
    @pytest.mark.parametrize(
        "changes",
        [
            {},
            {"multi": None, "opt_s": "set", "opt_l": None, "opt_color": None},
            {"multi": True, "ints": [], "names": {}, "lines": []},
            {"multi": 0.5, "f": float("inf"), "d": -0.0},
            {"multi": b"raw", "price": Decimal("0.01"), "total": Decimal("-0.0001")},
        ],
    )
    def test_our_bytes_decode_with_avro_package(
        self, codec: AvroCodec, changes: dict[str, Any]
    ) -> None:
        value = everything_value(**changes)
        data = codec.encode(value, EVERYTHING)
        assert normalise(avro_read(EVERYTHING, data)) == value
        if not isinstance(value["multi"], bool):
            # Same bytes, except that the avro package writes True as the double branch.
            assert data == avro_write(EVERYTHING, value)

    @pytest.mark.parametrize(
        "changes",
        [{}, {"multi": None, "opt_s": "x", "opt_color": None}, {"multi": False, "lines": []}],
    )
    def test_avro_package_bytes_decode_with_ours(
        self, codec: AvroCodec, changes: dict[str, Any]
    ) -> None:
        value = everything_value(**changes)
        assert normalise(codec.decode(avro_write(EVERYTHING, value), EVERYTHING)) == value

    def test_decoded_logical_types(self, codec: AvroCodec) -> None:
        decoded = codec.decode(codec.encode(everything_value(), EVERYTHING), EVERYTHING)
        assert decoded["uid"] == uuid.UUID("1b4e28ba-2d53-41a8-9f0d-2e1c8e8f0a2b")
        assert decoded["price"] == Decimal("-1234567890.12")
        assert decoded["ts"] == dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)

    def test_avro_package_resolves_our_bytes(self, codec: AvroCodec) -> None:
        v1 = record("R", {"name": "id", "type": "int"})
        v2 = record(
            "R",
            {"name": "id", "type": "long"},
            {"name": "email", "type": ["null", "string"], "default": None},
        )
        data = codec.encode({"id": 42}, v1)
        assert avro_read(v1, data, v2) == {"id": 42, "email": None}
        assert codec.decode(data, v1, v2) == {"id": 42, "email": None}


@settings(max_examples=150, deadline=None)
@given(schemas_with_values())
def test_random_records_round_trip_and_match_avro_package(
    pair: tuple[dict[str, Any], Any],
) -> None:
    schema = Schema(pair[0])
    value = pair[1]
    codec = AvroCodec()
    data = codec.encode(value, schema)
    assert codec.decode(data, schema) == value
    assert codec.decode(data, schema, Schema(pair[0])) == value
    assert normalise(avro_read(schema, data)) == normalise(value)


class TestResolution:
    V1 = record(
        "User",
        {"name": "id", "type": "int"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": "float"},
        {"name": "tier", "type": {"type": "enum", "name": "Tier", "symbols": ["A", "B", "C"]}},
        namespace="app",
    )

    def value(self) -> dict[str, Any]:
        return {"id": 7, "name": "ann", "score": 0.5, "tier": "B"}

    def test_added_field_takes_its_default(self, codec: AvroCodec) -> None:
        v2 = record(
            "User",
            *self.V1.fields,
            {"name": "email", "type": ["null", "string"], "default": None},
            {"name": "visits", "type": "long", "default": 0},
            namespace="app",
        )
        data = codec.encode(self.value(), self.V1)
        assert codec.decode(data, self.V1, v2) == {**self.value(), "email": None, "visits": 0}

    def test_removed_field_is_skipped(self, codec: AvroCodec) -> None:
        v2 = record(
            "User",
            {"name": "tier", "type": {"type": "enum", "name": "Tier", "symbols": ["A", "B", "C"]}},
            {"name": "id", "type": "int"},
            namespace="app",
        )
        data = codec.encode(self.value(), self.V1)
        assert codec.decode(data, self.V1, v2) == {"tier": "B", "id": 7}

    def test_promotions(self, codec: AvroCodec) -> None:
        v2 = record(
            "User",
            {"name": "id", "type": "long"},
            {"name": "name", "type": "bytes"},
            {"name": "score", "type": "double"},
            {"name": "tier", "type": {"type": "enum", "name": "Tier", "symbols": ["A", "B", "C"]}},
            namespace="app",
        )
        decoded = codec.decode(codec.encode(self.value(), self.V1), self.V1, v2)
        assert decoded == {"id": 7, "name": b"ann", "score": 0.5, "tier": "B"}

    def test_incompatible_reader_raises_schema_error(self, codec: AvroCodec) -> None:
        v2 = record(
            "User",
            {"name": "id", "type": "int"},
            {"name": "required", "type": "string"},  # no default, not written
            namespace="app",
        )
        data = codec.encode(self.value(), self.V1)
        with pytest.raises(SchemaError, match=r"reader schema app\.User .* cannot read"):
            codec.decode(data, self.V1, v2)
        narrowed = record("User", {"name": "id", "type": "string"}, namespace="app")
        with pytest.raises(SchemaError, match="cannot read"):
            codec.decode(data, self.V1, narrowed)

    def test_skipped_when_fingerprints_are_equal(
        self, codec: AvroCodec, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        calls: list[Any] = []
        real = fastavro.schemaless_reader

        def spy(fo: Any, writer: Any, reader: Any = None) -> Any:
            calls.append(reader)
            return real(fo, writer, reader)

        monkeypatch.setattr(codec_module, "schemaless_reader", spy)
        # Same PCF, other JSON: a doc and a default do not change the encoding.
        same = record(
            "User",
            *self.V1.fields,
            namespace="app",
            doc="the same shape",
        )
        assert same != self.V1 and same.fingerprint == self.V1.fingerprint
        data = codec.encode(self.value(), self.V1)
        assert codec.decode(data, self.V1) == self.value()
        assert codec.decode(data, self.V1, self.V1) == self.value()
        assert codec.decode(data, self.V1, same) == self.value()
        assert calls == [None, None, None]  # never resolved
        other = record("User", {"name": "id", "type": "long"}, namespace="app")
        assert codec.decode(data, self.V1, other) == {"id": 7}
        assert calls[-1] is other.parsed  # resolved

    def test_equal_fingerprint_reads_with_the_readers_logical_types(self, codec: AvroCodec) -> None:
        plain = record("E", {"name": "at", "type": "long"})
        typed = record(
            "E", {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}}
        )
        assert plain.fingerprint == typed.fingerprint
        data = codec.encode({"at": 1_700_000_000_000_000}, plain)
        assert codec.decode(data, plain) == {"at": 1_700_000_000_000_000}
        assert codec.decode(data, plain, typed) == {
            "at": dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
        }


class TestErrors:
    SCHEMA = record(
        "R",
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "s", "type": ["null", "string"], "default": None},
    )

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ({"l": 1}, "Field i is specified in the schema but missing"),
            ({"i": 1, "l": 1, "x": 3}, "more fields than the schema"),
            ({"i": "1", "l": 1}, "i"),
            ({"i": 1, "l": 2**64}, "OverflowError"),
            ({"i": 1, "l": 1, "s": 5}, "do not match"),
            (5, "R"),
            (None, "R"),
        ],
    )
    def test_values_that_do_not_fit(self, codec: AvroCodec, value: Any, message: str) -> None:
        with pytest.raises(SchemaError, match="value does not fit schema R") as info:
            codec.encode(value, self.SCHEMA)
        assert message in str(info.value)

    def test_missing_field_with_default_is_fine(self, codec: AvroCodec) -> None:
        data = codec.encode({"i": 1, "l": 2}, self.SCHEMA)
        assert codec.decode(data, self.SCHEMA) == {"i": 1, "l": 2, "s": None}

    def test_non_strict_ignores_extra_fields(self) -> None:
        data = AvroCodec(strict=False).encode({"i": 1, "l": 2, "x": 0}, self.SCHEMA)
        assert AvroCodec().decode(data, self.SCHEMA) == {"i": 1, "l": 2, "s": None}

    def test_validate_catches_what_the_writer_lets_through(self, codec: AvroCodec) -> None:
        overflow = {"i": 2**40, "l": 1}
        assert codec.encode(overflow, self.SCHEMA)  # fastavro's writer does not check
        with pytest.raises(SchemaError, match="value does not fit"):
            AvroCodec(validate=True).encode(overflow, self.SCHEMA)
        with pytest.raises(SchemaError, match="value does not fit"):
            AvroCodec(validate=True).encode({"i": 1.5, "l": 1}, self.SCHEMA)
        valid = {"i": 1, "l": 1, "s": "x"}
        assert AvroCodec(validate=True).encode(valid, self.SCHEMA) == codec.encode(
            valid, self.SCHEMA
        )

    def test_truncated_bytes(self, codec: AvroCodec) -> None:
        data = codec.encode(everything_value(), EVERYTHING)
        for cut in (0, 1, len(data) // 2, len(data) - 1):
            with pytest.raises(SchemaError, match="cannot decode"):
                codec.decode(data[:cut], EVERYTHING)

    def test_trailing_bytes(self, codec: AvroCodec) -> None:
        data = codec.encode({"i": 1, "l": 1}, self.SCHEMA)
        with pytest.raises(SchemaError, match="2 trailing bytes"):
            codec.decode(data + b"\x00\x00", self.SCHEMA)

    def test_bad_enum_index_and_utf8(self, codec: AvroCodec) -> None:
        enum = record("E", {"name": "c", "type": {"type": "enum", "name": "C", "symbols": ["A"]}})
        with pytest.raises(SchemaError, match="cannot decode"):
            codec.decode(b"\x04", enum)
        text = record("T", {"name": "s", "type": "string"})
        with pytest.raises(SchemaError, match="cannot decode"):
            codec.decode(b"\x04\xff\xfe", text)

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=200))
    def test_garbage_never_escapes_as_another_error(self, data: bytes) -> None:
        with contextlib.suppress(SchemaError):
            AvroCodec().decode(data, EVERYTHING)

    @settings(max_examples=200, deadline=None)
    @given(st.data())
    def test_flipped_bytes_never_escape_as_another_error(self, data: st.DataObject) -> None:
        encoded = bytearray(AvroCodec().encode(everything_value(), EVERYTHING))
        at = data.draw(st.integers(0, len(encoded) - 1))
        encoded[at] ^= data.draw(st.integers(1, 255))
        with contextlib.suppress(SchemaError):
            AvroCodec().decode(bytes(encoded), EVERYTHING)


class TestFingerprintLookup:
    def test_writer_by_fingerprint_through_registry(self) -> None:
        registry = MemorySchemaRegistry()
        schema = registry.register("shop.orders", TestErrors.SCHEMA.to_json())
        codec = AvroCodec(registry)
        data = codec.encode({"i": 1, "l": 2}, schema)
        assert codec.decode(data, schema.fingerprint) == {"i": 1, "l": 2, "s": None}
        assert codec.schema(schema.fingerprint) is schema
        with pytest.raises(UnknownSchemaError):
            codec.decode(data, 12345)

    def test_without_registry(self) -> None:
        schema = TestErrors.SCHEMA
        codec = AvroCodec()
        data = codec.encode({"i": 1, "l": 2}, schema)
        with pytest.raises(UnknownSchemaError, match="no registry"):
            codec.decode(data, schema.fingerprint)
        codec.add(schema)
        assert codec.decode(data, schema.fingerprint) == {"i": 1, "l": 2, "s": None}
        assert AvroCodec(schemas=[schema]).decode(memoryview(data), schema.fingerprint) == {
            "i": 1,
            "l": 2,
            "s": None,
        }

    def test_accepts_bytes_like(self, codec: AvroCodec) -> None:
        data = codec.encode({"i": 1, "l": 2}, TestErrors.SCHEMA)
        for buf in (bytearray(data), memoryview(data)):
            assert codec.decode(buf, TestErrors.SCHEMA)["l"] == 2


def test_schema_json_is_what_avro_parses() -> None:
    # to_json keeps logical types and defaults, which the avro package uses.
    parsed = avro.schema.parse(EVERYTHING.to_json())
    assert json.loads(EVERYTHING.to_json()) == EVERYTHING.schema
    assert int.from_bytes(parsed.fingerprint("CRC-64-AVRO"), "little") != 0
