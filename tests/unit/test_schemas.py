"""Parsing Canonical Form, CRC-64-AVRO fingerprints and the ``Schema`` value object.

Checked three ways: against the published Avro test vectors (whose fingerprints the
Java implementation validates), against fastavro and against the ``avro`` package, on
hand-written and on random schemas.
"""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import avro.schema
import pytest
from fastavro.schema import fingerprint as fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form as fastavro_pcf
from hypothesis import given, settings
from hypothesis import strategies as st

from databus.errors import SchemaError
from databus.schemas import (
    EMPTY64,
    PRIMITIVE_TYPES,
    Schema,
    as_schema,
    crc64_avro,
    fingerprint,
    fingerprint_bytes,
    fingerprint_from_bytes,
    fingerprint_to_bytes,
    parsing_canonical_form,
    to_signed64,
    to_unsigned64,
)
from tests.unit.test_schema_strategies import avro_schemas, strip_logical_types

# The Avro project's shared test vectors (share/test/data/schema-tests.txt):
# input, canonical form, fingerprint as Java's signed long (None where not given).
AVRO_VECTORS: list[tuple[str, str, int | None]] = [
    ('"null"', '"null"', 7195948357588979594),
    ('{"type":"null"}', '"null"', None),
    ('"boolean"', '"boolean"', -6970731678124411036),
    ('{"type":"boolean"}', '"boolean"', None),
    ('"int"', '"int"', 8247732601305521295),
    ('{"type":"int"}', '"int"', None),
    ('"long"', '"long"', -3434872931120570953),
    ('{"type":"long"}', '"long"', None),
    ('"float"', '"float"', 5583340709985441680),
    ('{"type":"float"}', '"float"', None),
    ('"double"', '"double"', -8181574048448539266),
    ('{"type":"double"}', '"double"', None),
    ('"bytes"', '"bytes"', 5746618253357095269),
    ('{"type":"bytes"}', '"bytes"', None),
    ('"string"', '"string"', -8142146995180207161),
    ('{"type":"string"}', '"string"', None),
    ("[  ]", "[]", -1241056759729112623),
    ('[ "int"  ]', '["int"]', -5232228896498058493),
    ('[ "int" , {"type":"boolean"} ]', '["int","boolean"]', 5392556393470105090),
    (
        '{"fields":[], "type":"record", "name":"foo"}',
        '{"name":"foo","type":"record","fields":[]}',
        -4824392279771201922,
    ),
    (
        '{"fields":[], "type":"record", "name":"foo", "namespace":"x.y"}',
        '{"name":"x.y.foo","type":"record","fields":[]}',
        5916914534497305771,
    ),
    (
        '{"fields":[], "type":"record", "name":"a.b.foo", "namespace":"x.y"}',
        '{"name":"a.b.foo","type":"record","fields":[]}',
        -4616218487480524110,
    ),
    (
        '{"fields":[], "type":"record", "name":"foo", "doc":"Useful info"}',
        '{"name":"foo","type":"record","fields":[]}',
        -4824392279771201922,
    ),
    (
        '{"fields":[], "type":"record", "name":"foo", "aliases":["foo","bar"]}',
        '{"name":"foo","type":"record","fields":[]}',
        -4824392279771201922,
    ),
    (
        '{"fields":[], "type":"record", "name":"foo", "doc":"foo", "aliases":["foo","bar"]}',
        '{"name":"foo","type":"record","fields":[]}',
        -4824392279771201922,
    ),
    (
        '{"fields":[{"type":{"type":"boolean"}, "name":"f1"}], "type":"record", "name":"foo"}',
        '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}',
        7843277075252814651,
    ),
    (
        '{ "fields":[{"type":"boolean", "aliases":[], "name":"f1", "default":"true"},\n'
        '            {"order":"descending","name":"f2","doc":"Hello","type":"int"}],\n'
        '  "type":"record", "name":"foo"\n}',
        '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"},'
        '{"name":"f2","type":"int"}]}',
        -4860222112080293046,
    ),
    (
        '{"type":"enum", "name":"foo", "symbols":["A1"]}',
        '{"name":"foo","type":"enum","symbols":["A1"]}',
        -6342190197741309591,
    ),
    (
        '{"namespace":"x.y.z", "type":"enum", "name":"foo", "doc":"foo bar", '
        '"symbols":["A1", "A2"]}',
        '{"name":"x.y.z.foo","type":"enum","symbols":["A1","A2"]}',
        -4448647247586288245,
    ),
    (
        '{"name":"foo","type":"fixed","size":15}',
        '{"name":"foo","type":"fixed","size":15}',
        1756455273707447556,
    ),
    (
        '{"namespace":"x.y.z", "type":"fixed", "name":"foo", "doc":"foo bar", "size":32}',
        '{"name":"x.y.z.foo","type":"fixed","size":32}',
        -3064184465700546786,
    ),
    (
        '{ "items":{"type":"null"}, "type":"array"}',
        '{"type":"array","items":"null"}',
        -589620603366471059,
    ),
    (
        '{ "values":"string", "type":"map"}',
        '{"type":"map","values":"string"}',
        -8732877298790414990,
    ),
    (
        '{"name":"PigValue","type":"record",\n'
        ' "fields":[{"name":"value", "type":["null", "int", "long", "PigValue"]}]}',
        '{"name":"PigValue","type":"record","fields":[{"name":"value",'
        '"type":["null","int","long","PigValue"]}]}',
        -1759257747318642341,
    ),
]


def avro_fingerprint(schema: Any) -> int:
    """The ``avro`` package's CRC-64-AVRO fingerprint, as an unsigned int."""
    parsed = avro.schema.parse(json.dumps(schema))
    return int.from_bytes(parsed.fingerprint("CRC-64-AVRO"), "little")


def repair_fixed_references(pcf: str) -> str:
    """Undo an ``avro`` package bug: it writes every reference to a ``fixed`` as the
    whole definition again, where the spec, Java and fastavro write its fullname."""
    seen: set[str] = set()

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        if node.get("type") == "fixed":
            if node["name"] in seen:
                return node["name"]
            seen.add(node["name"])
        return {
            k: walk(v) if k in ("type", "items", "values", "fields") else v for k, v in node.items()
        }

    return json.dumps(walk(json.loads(pcf)), separators=(",", ":"))


def assert_matches_avro_package(schema: Any) -> None:
    # The avro package mishandles logical types (see strip_logical_types): compare on
    # schemas without them, and check that the PCF does not depend on them.
    plain = strip_logical_types(schema)
    pcf = parsing_canonical_form(schema)
    assert pcf == parsing_canonical_form(plain)
    raw = avro.schema.parse(json.dumps(plain)).canonical_form
    assert pcf == repair_fixed_references(raw)
    if pcf == raw:
        assert fingerprint(schema) == avro_fingerprint(plain)


# Hand-written schemas covering every kind of type, namespaces and logical types.
DEC_BYTES = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}
DEC_FIXED = {
    "type": "fixed",
    "name": "Money",
    "size": 8,
    "logicalType": "decimal",
    "precision": 18,
    "scale": 2,
}
SCHEMAS: list[Any] = [
    "int",
    {"type": "long", "logicalType": "timestamp-micros"},
    ["null", "string"],
    {"type": "array", "items": {"type": "map", "values": ["null", "double"]}},
    {"type": "enum", "name": "Color", "namespace": "shop", "symbols": ["RED", "GREEN"]},
    {"type": "fixed", "name": "md5", "size": 16, "doc": "a digest"},
    {
        "type": "record",
        "name": "orders",
        "namespace": "shop.v1",
        "doc": "Rows of shop.orders",
        "aliases": ["old_orders"],
        "fields": [
            {"name": "id", "type": "long", "doc": "primary key", "order": "descending"},
            {"name": "amount", "type": DEC_BYTES},
            {"name": "total", "type": DEC_FIXED},
            {"name": "price", "type": "Money"},
            {"name": "created", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "note", "type": ["null", "string"], "default": None},
            {
                "name": "status",
                "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]},
                "default": "NEW",
            },
            {
                "name": "address",
                "type": {
                    "type": "record",
                    "name": "Address",
                    "namespace": "geo",
                    "fields": [
                        {"name": "city", "type": "string"},
                        {
                            "name": "point",
                            "type": {
                                "type": "record",
                                "name": "Point",  # inherits geo, not shop.v1
                                "fields": [
                                    {"name": "lat", "type": "double"},
                                    {"name": "lon", "type": "double"},
                                ],
                            },
                        },
                    ],
                },
            },
            {"name": "home", "type": ["null", "geo.Address"]},
            {"name": "where", "type": {"type": "array", "items": "geo.Point"}},
            {"name": "again", "type": {"type": "map", "values": "Status"}},
            {"name": "other", "type": {"type": "fixed", "name": "x.y.Hash", "size": 4}},
            {"name": "hash2", "type": "x.y.Hash"},
            {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
            {"name": "flags", "type": ["null", "boolean", "int", "bytes", "Status"]},
        ],
    },
]


class TestFingerprintAlgorithm:
    def test_empty_input_gives_empty64(self) -> None:
        assert crc64_avro(b"") == EMPTY64 == 0xC15D213AA4D7A795

    @pytest.mark.parametrize("data", [b"", b"a", b'"int"', bytes(range(256)) * 3])
    def test_equals_bitwise_reference(self, data: bytes) -> None:
        # The spec's slow bit-by-bit definition, to cross-check the table.
        fp = EMPTY64
        for byte in data:
            fp ^= byte
            for _ in range(8):
                fp = (fp >> 1) ^ (EMPTY64 & -(fp & 1))
        assert crc64_avro(data) == fp

    def test_int_has_published_fingerprint(self) -> None:
        assert fingerprint('"int"') == 8247732601305521295
        assert fingerprint("int") == 8247732601305521295
        assert fingerprint_bytes("int") == (8247732601305521295).to_bytes(8, "little")

    def test_signed_and_unsigned_forms(self) -> None:
        fp = fingerprint("long")  # a "negative" one in Java
        assert fp >= 1 << 63
        assert to_signed64(fp) == -3434872931120570953
        assert to_unsigned64(-3434872931120570953) == fp
        assert to_unsigned64(fp) == fp
        assert fingerprint_from_bytes(fingerprint_to_bytes(fp)) == fp
        with pytest.raises(SchemaError):
            to_unsigned64(1 << 64)
        with pytest.raises(SchemaError):
            fingerprint_from_bytes(b"1234567")


class TestAvroVectors:
    @pytest.mark.parametrize(("text", "canonical", "signed_fp"), AVRO_VECTORS)
    def test_canonical_form_and_fingerprint(
        self, text: str, canonical: str, signed_fp: int | None
    ) -> None:
        assert parsing_canonical_form(text) == canonical
        fp = fingerprint(text)
        assert 0 <= fp < 1 << 64
        assert fp == crc64_avro(canonical.encode())
        if signed_fp is not None:
            assert to_signed64(fp) == signed_fp


class TestAgainstLibraries:
    @pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: json.dumps(s)[:40])
    def test_matches_fastavro(self, schema: Any) -> None:
        pcf = parsing_canonical_form(schema)
        assert pcf == fastavro_pcf(copy.deepcopy(schema))
        assert fingerprint_bytes(schema).hex() == fastavro_fingerprint(pcf, "CRC-64-AVRO")

    @pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: json.dumps(s)[:40])
    def test_matches_avro_package(self, schema: Any) -> None:
        assert_matches_avro_package(schema)

    def test_logical_types_are_stripped_as_in_java(self) -> None:
        assert parsing_canonical_form(DEC_BYTES) == '"bytes"'
        assert fingerprint(DEC_BYTES) == fingerprint("bytes")
        ts = {"type": "long", "logicalType": "timestamp-micros"}
        assert fingerprint(ts) == fingerprint("long")
        assert parsing_canonical_form(DEC_FIXED) == '{"name":"Money","type":"fixed","size":8}'
        # The avro package differs here (a deviation from the spec and from Java).
        assert avro.schema.parse(json.dumps(DEC_BYTES)).canonical_form == '{"type":"bytes"}'
        with_ref = {
            "type": "record",
            "name": "R",
            "fields": [{"name": "a", "type": DEC_FIXED}, {"name": "b", "type": "Money"}],
        }
        expected = (
            '{"name":"R","type":"record","fields":[{"name":"a","type":'
            '{"name":"Money","type":"fixed","size":8}},{"name":"b","type":"Money"}]}'
        )
        assert parsing_canonical_form(with_ref) == expected == fastavro_pcf(with_ref)
        # The avro package writes the reference as a second definition (its bug).
        assert avro.schema.parse(json.dumps(with_ref)).canonical_form != expected

    def test_error_type_canonicalises_as_record(self) -> None:
        # Java writes "record" (Schema.Type.RECORD); so does fastavro.
        schema = {"type": "error", "name": "Oops", "fields": [{"name": "m", "type": "string"}]}
        pcf = parsing_canonical_form(schema)
        assert pcf == '{"name":"Oops","type":"record","fields":[{"name":"m","type":"string"}]}'
        assert pcf == fastavro_pcf(schema)

    def test_namespaces(self) -> None:
        schema = {
            "type": "record",
            "name": "R",
            "namespace": "a",
            "fields": [
                {
                    "name": "s",
                    "type": {
                        "type": "record",
                        "name": "S",
                        "namespace": "",  # the null namespace
                        "fields": [
                            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]}}
                        ],
                    },
                },
                {"name": "t", "type": {"type": "fixed", "name": "b.T", "size": 1}},
                {"name": "u", "type": {"type": "record", "name": "U", "fields": []}},
                {"name": "e2", "type": "E"},  # not a.E: falls back to the null namespace
                {"name": "u2", "type": "U"},  # a.U
                {"name": "t2", "type": {"type": "b.T"}},
            ],
        }
        assert parsing_canonical_form(schema) == (
            '{"name":"a.R","type":"record","fields":['
            '{"name":"s","type":{"name":"S","type":"record","fields":['
            '{"name":"e","type":{"name":"E","type":"enum","symbols":["X"]}}]}},'
            '{"name":"t","type":{"name":"b.T","type":"fixed","size":1}},'
            '{"name":"u","type":{"name":"a.U","type":"record","fields":[]}},'
            '{"name":"e2","type":"E"},{"name":"u2","type":"a.U"},{"name":"t2","type":"b.T"}]}'
        )

    def test_null_namespace_fallback_is_fingerprinted_but_fastavro_rejects_it(self) -> None:
        schema = {
            "type": "record",
            "name": "R",
            "fields": [
                {"name": "t", "type": {"type": "record", "name": "T", "fields": []}},
                {
                    "name": "u",
                    "type": {
                        "type": "record",
                        "name": "U",
                        "namespace": "a",
                        "fields": [{"name": "t", "type": "T"}],  # a.T is not defined: T
                    },
                },
            ],
        }
        assert parsing_canonical_form(schema).endswith('"fields":[{"name":"t","type":"T"}]}}]}')
        with pytest.raises(SchemaError, match=r"UnknownType: a\.T"):
            Schema(schema)

    @settings(max_examples=150, deadline=None)
    @given(avro_schemas())
    def test_random_schemas_match_both_libraries(self, schema: dict[str, Any]) -> None:
        pcf = parsing_canonical_form(schema)
        assert pcf == fastavro_pcf(copy.deepcopy(schema))
        assert_matches_avro_package(schema)
        assert fingerprint_bytes(schema).hex() == fastavro_fingerprint(pcf, "CRC-64-AVRO")
        assert Schema(schema).fingerprint == fingerprint(schema)


INVALID: list[tuple[Any, str]] = [
    ("not json {", "not JSON"),
    ("42", "not a schema"),
    ("foo", "not JSON"),
    ('"foo"', "unknown type 'foo'"),
    ({"type": "foo"}, "unknown type 'foo'"),
    ({"doc": "no type"}, "missing 'type'"),
    ({"type": {"type": "int"}}, "'type' must be a string"),
    ({"type": "record", "fields": []}, "needs a 'name'"),
    ({"type": "record", "name": "1R", "fields": []}, "not a valid Avro name"),
    ({"type": "record", "name": "a..R", "fields": []}, "not a valid Avro name"),
    ({"type": "record", "name": "R", "namespace": 5, "fields": []}, "'namespace' must be"),
    ({"type": "record", "name": "int", "fields": []}, "redefines a primitive"),
    ({"type": "record", "name": "R"}, "needs a 'fields' list"),
    ({"type": "record", "name": "R", "fields": [{"name": "x"}]}, "has no 'type'"),
    ({"type": "record", "name": "R", "fields": ["x"]}, "a field must be an object"),
    ({"type": "record", "name": "R", "fields": [{"name": "a-b", "type": "int"}]}, "field name"),
    (
        {"type": "record", "name": "R", "fields": [{"name": "x", "type": "int"}] * 2},
        "appears twice",
    ),
    (
        {
            "type": "record",
            "name": "R",
            "fields": [{"name": "x", "type": {"type": "record", "name": "R", "fields": []}}],
        },
        "defined twice",
    ),
    (
        {"type": "record", "name": "R", "fields": [{"name": "x", "type": "int", "default": "a"}]},
        "Default value",
    ),
    (
        {"type": "record", "name": "R", "fields": [{"name": "x", "type": "Later"}]},
        "unknown type 'Later'",
    ),
    ({"type": "enum", "name": "E", "symbols": ["A", "A"]}, "duplicate symbols"),
    ({"type": "enum", "name": "E", "symbols": ["in progress"]}, "not a valid symbol"),
    ({"type": "enum", "name": "E"}, "needs a 'symbols' list"),
    ({"type": "enum", "name": "E", "symbols": ["A"], "default": "B"}, "Default value for enum"),
    ({"type": "fixed", "name": "F"}, "non-negative integer 'size'"),
    ({"type": "fixed", "name": "F", "size": -1}, "non-negative integer 'size'"),
    ({"type": "fixed", "name": "F", "size": "16"}, "non-negative integer 'size'"),
    ({"type": "fixed", "name": "F", "size": True}, "non-negative integer 'size'"),
    ({"type": "array"}, "needs 'items'"),
    ({"type": "map"}, "needs 'values'"),
    (["int", "int"], "more than one 'int'"),
    (["null", {"type": "array", "items": "int"}, {"type": "array", "items": "long"}], "'array'"),
    (["null", ["int"]], "cannot contain a union"),
    ([1], "expected a type name"),
    ({"type": "record", "name": "R", "fields": [{"name": "x", "type": "int", "default": 1.5}]}, ""),
]


class TestSchema:
    def test_from_text_dict_list_and_name(self) -> None:
        record = SCHEMAS[-1]
        from_dict = Schema(record)
        from_text = Schema(json.dumps(record, indent=2))
        assert from_dict == from_text
        assert from_dict.name == "shop.v1.orders"
        assert from_dict.schema == record
        assert from_dict.canonical_form == parsing_canonical_form(record)
        assert from_dict.fingerprint == fingerprint(record)
        assert from_dict.fingerprint_bytes == fingerprint_bytes(record)
        assert Schema("int").name == "int"
        assert Schema('"long"').name == "long"
        assert Schema(["null", "int"]).name == "union"
        with pytest.raises(SchemaError, match="not a record"):
            _ = Schema("int").fields
        assert Schema({"type": "map", "values": "int"}).name == "map"
        assert Schema({"type": "fixed", "name": "F", "namespace": "n", "size": 2}).name == "n.F"

    def test_keeps_a_private_copy(self) -> None:
        record = copy.deepcopy(SCHEMAS[-1])
        schema = Schema(record)
        record["fields"].clear()
        assert schema.schema != record
        assert len(schema.fields) > 0

    def test_equality_hash_and_fingerprint(self) -> None:
        base = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "int"}]}
        documented = {**base, "doc": "same bytes, other JSON"}
        a, b, c = Schema(base), Schema(dict(base)), Schema(documented)
        assert a == b and hash(a) == hash(b)
        assert a.fingerprint == c.fingerprint  # doc is not in the PCF
        assert a != c  # but the schemas are not the same JSON
        assert a != "R"
        assert len({a, b, c}) == 2

    def test_json_and_pickle_round_trip(self) -> None:
        schema = Schema(SCHEMAS[-1])
        assert Schema(schema.to_json()) == schema
        clone = pickle.loads(pickle.dumps(schema))
        assert clone == schema
        assert clone.parsed == schema.parsed
        assert "0x" in repr(schema) and "shop.v1.orders" in repr(schema)

    def test_as_schema(self) -> None:
        schema = Schema("int")
        assert as_schema(schema) is schema
        assert as_schema('"int"') == schema

    @pytest.mark.parametrize(("bad", "message"), INVALID, ids=lambda v: str(v)[:40])
    def test_invalid_schemas_raise_schema_error(self, bad: Any, message: str) -> None:
        with pytest.raises(SchemaError, match="invalid Avro schema") as info:
            Schema(bad)
        assert message in str(info.value)

    def test_canonical_form_checks_names_without_full_validation(self) -> None:
        # The PCF of the spec's vector 026 has a bad default: fingerprintable, not valid.
        text = AVRO_VECTORS[26][0]
        assert fingerprint(text) == to_unsigned64(-4860222112080293046)
        with pytest.raises(SchemaError, match="Default value"):
            Schema(text)

    def test_non_json_input(self) -> None:
        with pytest.raises(SchemaError, match="not JSON-serialisable"):
            Schema({"type": "record", "name": "R", "fields": [], "doc": object()})
        with pytest.raises(SchemaError):
            Schema(42)  # type: ignore[arg-type]

    def test_every_primitive(self) -> None:
        for name in PRIMITIVE_TYPES:
            assert Schema(name).canonical_form == f'"{name}"'
            assert Schema({"type": name}).fingerprint == fingerprint(name)

    def test_recursive_record(self) -> None:
        schema = Schema(AVRO_VECTORS[-1][0])
        assert schema.fingerprint == to_unsigned64(-1759257747318642341)
        assert schema.name == "PigValue"


@given(st.binary(max_size=64))
def test_table_matches_avro_package_on_random_bytes(data: bytes) -> None:
    expected = int.from_bytes(avro.schema._crc_64_fingerprint(data), "little")
    assert crc64_avro(data) == expected
