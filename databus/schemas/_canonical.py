"""Avro Parsing Canonical Form, the CRC-64-AVRO fingerprint and the ``Schema`` value object.

The Parsing Canonical Form (PCF) keeps only what matters for reading the binary data:
two schemas with the same PCF encode every value to the same bytes. Its 64-bit Rabin
fingerprint (CRC-64-AVRO) identifies a writer schema in every event header, as in Avro
single-object encoding.

The PCF follows the Avro specification and the Java reference implementation
(``SchemaNormalization``), which agree with fastavro. The ``avro`` Python package
differs on two points and is wrong there: it keeps primitives that carry extra
attributes (``{"type":"long","logicalType":"timestamp-micros"}``) as objects instead of
``"long"``, and it writes ``"type":"error"`` where Java writes ``"record"``.

Everything here is pure: no I/O, no global state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, TypeAlias

from fastavro import parse_schema

from databus.errors import SchemaError

JsonSchema: TypeAlias = str | dict[str, Any] | list[Any]
"""An Avro schema as parsed JSON: a type name, an object or a union list."""

SchemaLike: TypeAlias = "Schema | str | Mapping[str, Any] | list[Any]"
"""Anything accepted where a schema is expected: a ``Schema``, JSON text, a dict or a list.

A string is JSON text (``'"int"'``, ``'{"type": "record", ...}'``); a bare primitive
type name (``int``) is accepted too.
"""

PRIMITIVE_TYPES: frozenset[str] = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
)

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# CRC-64-AVRO: the Rabin fingerprint of the Avro spec, EMPTY = the fingerprint of b"".
EMPTY64 = 0xC15D213AA4D7A795
_MASK64 = (1 << 64) - 1


def _make_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (EMPTY64 & -(fp & 1))
        table.append(fp)
    return tuple(table)


_FP_TABLE = _make_table()


def crc64_avro(data: bytes) -> int:
    """The CRC-64-AVRO (64-bit Rabin) fingerprint of ``data``, unsigned (0 .. 2**64-1)."""
    fp = EMPTY64
    table = _FP_TABLE
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def fingerprint_to_bytes(fp: int) -> bytes:
    """The 8 little-endian bytes of a fingerprint, as in Avro single-object encoding."""
    return (fp & _MASK64).to_bytes(8, "little")


def fingerprint_from_bytes(data: bytes) -> int:
    """The unsigned fingerprint from its 8 little-endian bytes."""
    if len(data) != 8:
        raise SchemaError(f"a CRC-64-AVRO fingerprint has 8 bytes, got {len(data)}")
    return int.from_bytes(data, "little")


def to_signed64(fp: int) -> int:
    """The fingerprint as a signed 64-bit int (Java's ``long``, SQL ``BIGINT``)."""
    fp &= _MASK64
    return fp - (1 << 64) if fp >= 1 << 63 else fp


def to_unsigned64(fp: int) -> int:
    """The fingerprint as an unsigned 64-bit int, from its signed or unsigned form."""
    if not -(1 << 63) <= fp < 1 << 64:
        raise SchemaError(f"{fp} is not a 64-bit fingerprint")
    return fp & _MASK64


# --------------------------------------------------------------------------------------
# Parsing Canonical Form
# --------------------------------------------------------------------------------------


def _invalid(path: str, message: str) -> SchemaError:
    return SchemaError(f"invalid Avro schema at {path}: {message}")


class _Canonicalizer:
    """Writes the PCF of one schema while checking what the PCF depends on.

    Names are checked as the spec (and Java) requires, which fastavro does not do:
    valid identifiers, no redefinition, no primitive names, unique field names and
    enum symbols, no nested or ambiguous unions, references only to defined names.
    """

    def __init__(self) -> None:
        self.out: list[str] = []
        self.defined: set[str] = set()

    def emit(self, schema: object, namespace: str | None, path: str) -> str:
        """Append the PCF of ``schema``; return its union key (a type or a fullname)."""
        out = self.out
        if isinstance(schema, str):
            if schema in PRIMITIVE_TYPES:
                out.append(f'"{schema}"')
                return schema
            full = self.resolve(schema, namespace, path)
            out.append(f'"{full}"')
            return full
        if isinstance(schema, list):
            self.emit_union(schema, namespace, path)
            return "union"
        if not isinstance(schema, dict):
            raise _invalid(path, f"expected a type name, an object or a list, got {schema!r}")
        type_ = schema.get("type")
        if type_ is None:
            raise _invalid(path, "missing 'type'")
        if not isinstance(type_, str):
            raise _invalid(path, f"'type' must be a string, got {type_!r}")
        # STRIP + PRIMITIVES: logicalType and any other attribute do not change the bytes.
        if type_ in PRIMITIVE_TYPES:
            out.append(f'"{type_}"')
            return type_
        if type_ in ("record", "error"):
            return self.emit_record(schema, namespace, path)
        if type_ == "enum":
            return self.emit_enum(schema, namespace, path)
        if type_ == "fixed":
            return self.emit_fixed(schema, namespace, path)
        if type_ == "array":
            if "items" not in schema:
                raise _invalid(path, "an array needs 'items'")
            out.append('{"type":"array","items":')
            self.emit(schema["items"], namespace, f"{path}.items")
            out.append("}")
            return "array"
        if type_ == "map":
            if "values" not in schema:
                raise _invalid(path, "a map needs 'values'")
            out.append('{"type":"map","values":')
            self.emit(schema["values"], namespace, f"{path}.values")
            out.append("}")
            return "map"
        # {"type": "SomeName"} refers to a named type, as Java allows.
        full = self.resolve(type_, namespace, path)
        out.append(f'"{full}"')
        return full

    def emit_union(self, branches: list[Any], namespace: str | None, path: str) -> None:
        out = self.out
        out.append("[")
        seen: set[str] = set()
        for i, branch in enumerate(branches):
            if i:
                out.append(",")
            key = self.emit(branch, namespace, f"{path}[{i}]")
            if key == "union":
                raise _invalid(f"{path}[{i}]", "a union cannot contain a union")
            if key in seen:
                raise _invalid(f"{path}[{i}]", f"the union has more than one {key!r}")
            seen.add(key)
        out.append("]")

    def define(self, schema: dict[str, Any], namespace: str | None, path: str) -> str:
        """Register a named type; return its fullname (FULLNAMES)."""
        name = schema.get("name")
        if not isinstance(name, str) or not name:
            raise _invalid(path, f"a {schema['type']} needs a 'name', got {name!r}")
        if "." in name:
            full = name  # a dotted name is a fullname; 'namespace' is ignored
        else:
            space = schema.get("namespace", namespace)
            if space is not None and not isinstance(space, str):
                raise _invalid(path, f"'namespace' must be a string, got {space!r}")
            full = f"{space}.{name}" if space else name  # "" is the null namespace
        for part in full.split("."):
            if not _NAME_RE.match(part):
                raise _invalid(path, f"{full!r} is not a valid Avro name")
        if full.rpartition(".")[2] in PRIMITIVE_TYPES:
            raise _invalid(path, f"{full!r} redefines a primitive type")
        if full in self.defined:
            raise _invalid(path, f"the named type {full!r} is defined twice")
        self.defined.add(full)
        return full

    def resolve(self, ref: str, namespace: str | None, path: str) -> str:
        """The fullname a reference denotes: namespace-relative first, then null namespace.

        The fallback to the null namespace is Java's rule, kept for compatibility.
        """
        if "." not in ref and namespace:
            qualified = f"{namespace}.{ref}"
            if qualified in self.defined:
                return qualified
        if ref in self.defined:
            return ref
        raise _invalid(path, f"unknown type {ref!r}")

    def emit_record(self, schema: dict[str, Any], namespace: str | None, path: str) -> str:
        full = self.define(schema, namespace, path)
        inner = full.rpartition(".")[0] or None
        fields = schema.get("fields")
        if not isinstance(fields, list):
            raise _invalid(path, f"record {full!r} needs a 'fields' list")
        out = self.out
        # Java writes "record" for errors too (the type's name is RECORD).
        out.append(f'{{"name":"{full}","type":"record","fields":[')
        names: set[str] = set()
        for i, field in enumerate(fields):
            fpath = f"{path}.fields[{i}]"
            if not isinstance(field, dict):
                raise _invalid(fpath, f"a field must be an object, got {field!r}")
            fname = field.get("name")
            if not isinstance(fname, str) or not _NAME_RE.match(fname):
                raise _invalid(fpath, f"{fname!r} is not a valid field name")
            if fname in names:
                raise _invalid(fpath, f"field {fname!r} appears twice in {full!r}")
            names.add(fname)
            if "type" not in field:
                raise _invalid(fpath, f"field {fname!r} has no 'type'")
            if i:
                out.append(",")
            out.append(f'{{"name":"{fname}","type":')
            self.emit(field["type"], inner, f"{fpath}.type")
            out.append("}")
        out.append("]}")
        return full

    def emit_enum(self, schema: dict[str, Any], namespace: str | None, path: str) -> str:
        full = self.define(schema, namespace, path)
        symbols = schema.get("symbols")
        if not isinstance(symbols, list):
            raise _invalid(path, f"enum {full!r} needs a 'symbols' list")
        for symbol in symbols:
            if not isinstance(symbol, str) or not _NAME_RE.match(symbol):
                raise _invalid(path, f"enum {full!r}: {symbol!r} is not a valid symbol")
        if len(set(symbols)) != len(symbols):
            raise _invalid(path, f"enum {full!r} has duplicate symbols")
        # Symbols are identifiers, so no JSON escaping is ever needed (STRINGS).
        quoted = ",".join(f'"{s}"' for s in symbols)
        self.out.append(f'{{"name":"{full}","type":"enum","symbols":[{quoted}]}}')
        return full

    def emit_fixed(self, schema: dict[str, Any], namespace: str | None, path: str) -> str:
        full = self.define(schema, namespace, path)
        size = schema.get("size")
        # bool is an int in Python; JSON true is not a size.
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _invalid(path, f"fixed {full!r} needs a non-negative integer 'size'")
        self.out.append(f'{{"name":"{full}","type":"fixed","size":{size}}}')
        return full


def _load(schema: str | Mapping[str, Any] | list[Any]) -> JsonSchema:
    """JSON text or a bare primitive name -> parsed JSON; a Mapping -> a dict copy."""
    if isinstance(schema, str):
        if schema in PRIMITIVE_TYPES:
            return schema
        try:
            loaded = json.loads(schema)
        except ValueError as exc:
            raise SchemaError(f"invalid Avro schema: not JSON ({exc})") from None
        if not isinstance(loaded, str | dict | list):
            raise SchemaError(f"invalid Avro schema: {schema!r} is not a schema")
        return loaded
    if isinstance(schema, Mapping):
        return dict(schema)
    if isinstance(schema, list):
        return schema
    raise SchemaError(f"invalid Avro schema: expected JSON text, a dict or a list, got {schema!r}")


def _pcf(schema: JsonSchema) -> str:
    canonicalizer = _Canonicalizer()
    canonicalizer.emit(schema, None, "$")
    return "".join(canonicalizer.out)


def parsing_canonical_form(schema: SchemaLike) -> str:
    """The Avro Parsing Canonical Form of ``schema``.

    Checks names, references and unions (raising ``SchemaError``) but not default
    values: use ``Schema`` for a full validation.
    """
    if isinstance(schema, Schema):
        return schema.canonical_form
    return _pcf(_load(schema))


def fingerprint(schema: SchemaLike) -> int:
    """The CRC-64-AVRO fingerprint of ``schema``'s PCF, unsigned (0 .. 2**64-1)."""
    if isinstance(schema, Schema):
        return schema.fingerprint
    return crc64_avro(parsing_canonical_form(schema).encode())


def fingerprint_bytes(schema: SchemaLike) -> bytes:
    """The fingerprint as 8 little-endian bytes, as in Avro single-object encoding."""
    return fingerprint_to_bytes(fingerprint(schema))


# --------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------


class Schema:
    """A validated Avro schema with its full name, PCF and fingerprint.

    Immutable by contract: ``schema`` is a private copy of the input, do not mutate it.
    Two schemas are equal when their JSON is equal (so a changed default or doc makes
    them differ although their fingerprints, which only depend on the PCF, are equal).
    Pickles as its JSON text, so it can be shipped to Spark executors.
    """

    __slots__ = ("_canonical_form", "_fingerprint", "_name", "_parsed", "_schema")

    _schema: JsonSchema
    _canonical_form: str
    _fingerprint: int
    _name: str
    _parsed: Any

    def __init__(self, schema: str | Mapping[str, Any] | list[Any]) -> None:
        loaded = _load(schema)
        try:
            text = json.dumps(loaded, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"invalid Avro schema: not JSON-serialisable ({exc})") from None
        self._schema = json.loads(text)  # a deep private copy
        self._canonical_form = _pcf(self._schema)
        self._fingerprint = crc64_avro(self._canonical_form.encode())
        try:
            # fastavro checks what the PCF does not: defaults, logical type attributes.
            self._parsed = parse_schema(json.loads(text), named_schemas={})
        except Exception as exc:  # fastavro raises many types; all mean "invalid"
            raise SchemaError(f"invalid Avro schema: {type(exc).__name__}: {exc}") from exc
        self._name = _type_name(self._schema, self._canonical_form)

    @property
    def name(self) -> str:
        """The full name of a named type, else the type (``long``, ``array``, ``union``)."""
        return self._name

    @property
    def schema(self) -> JsonSchema:
        """The schema as parsed JSON (usually a record's dict)."""
        return self._schema

    @property
    def fields(self) -> list[dict[str, Any]]:
        """A record's fields (as JSON objects); ``SchemaError`` for other types."""
        if isinstance(self._schema, dict) and self._schema["type"] in ("record", "error"):
            fields: list[dict[str, Any]] = self._schema["fields"]
            return fields
        raise SchemaError(f"schema {self._name} is not a record")

    @property
    def canonical_form(self) -> str:
        """The Parsing Canonical Form."""
        return self._canonical_form

    @property
    def fingerprint(self) -> int:
        """The CRC-64-AVRO fingerprint of the PCF, unsigned."""
        return self._fingerprint

    @property
    def fingerprint_bytes(self) -> bytes:
        """The fingerprint as 8 little-endian bytes (Avro single-object encoding)."""
        return fingerprint_to_bytes(self._fingerprint)

    @property
    def parsed(self) -> Any:
        """The schema as parsed by fastavro once, for ``schemaless_writer``/``_reader``."""
        return self._parsed

    def to_json(self) -> str:
        """The full schema as compact JSON text (with docs, defaults and logical types)."""
        return json.dumps(self._schema, separators=(",", ":"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schema):
            return NotImplemented
        return self._fingerprint == other._fingerprint and self._schema == other._schema

    def __hash__(self) -> int:
        return hash(self._fingerprint)

    def __repr__(self) -> str:
        return f"Schema({self._name!r}, fingerprint=0x{self._fingerprint:016x})"

    def __reduce__(self) -> tuple[type[Schema], tuple[str]]:
        return (Schema, (self.to_json(),))


def _type_name(schema: JsonSchema, canonical_form: str) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        # The PCF holds the fullname, already resolved against namespaces.
        if schema.get("type") in ("record", "error", "enum", "fixed"):
            return str(json.loads(canonical_form)["name"])
        type_ = schema["type"]
        return str(type_)
    return schema


def as_schema(schema: SchemaLike) -> Schema:
    """``schema`` itself if it is a ``Schema``, else a new validated ``Schema``."""
    return schema if isinstance(schema, Schema) else Schema(schema)
