"""Hypothesis strategies for random Avro schemas and values that fit them.

Used by the schema and codec tests; the tests here check the strategies themselves.
The generated schemas stay inside what all three implementations (ours, fastavro, the
``avro`` package) agree on: no ``""`` namespace (the ``avro`` package gets it wrong),
references by fullname or by a name in the current namespace (never to a type
in the null namespace from inside another: fastavro cannot resolve those), unions ``["null", X]``
(so that every value has exactly one branch), no recursive types.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

from fastavro import parse_schema
from fastavro.validation import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from databus.schemas import PRIMITIVE_TYPES

_PRIMITIVES = sorted(PRIMITIVE_TYPES)
_NAMESPACES = ["a", "b.c", "shop.v1"]
_SYMBOLS = ["A", "B", "C", "D_1", "_x", "zz"]
_UTC = dt.UTC

LOGICAL: list[dict[str, Any]] = [
    {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
    {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 0},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "string", "logicalType": "uuid"},
]


class _Generator:
    """Builds one random schema; names are unique by construction (N0, N1, ...)."""

    def __init__(self, draw: st.DrawFn, max_depth: int) -> None:
        self.draw = draw
        self.max_depth = max_depth
        self.count = 0
        self.defined: list[str] = []  # fullnames of finished named types

    def any(self, depth: int, ns: str | None, *, union: bool = True) -> Any:
        kinds = ["primitive", "primitive", "primitive_object", "logical"]
        if depth < self.max_depth:
            kinds += ["record", "enum", "fixed", "array", "map"]
            if union:
                kinds += ["union", "union"]
        if self.defined:
            kinds.append("reference")
        kind = self.draw(st.sampled_from(kinds))
        if kind == "primitive":
            return self.draw(st.sampled_from(_PRIMITIVES))
        if kind == "primitive_object":
            return {"type": self.draw(st.sampled_from(_PRIMITIVES)), "doc": "d"}
        if kind == "logical":
            return dict(self.draw(st.sampled_from(LOGICAL)))
        if kind == "record":
            return self.record(depth, ns)
        if kind == "enum":
            named = self.named("enum", ns)
            named["symbols"] = self.draw(
                st.lists(st.sampled_from(_SYMBOLS), min_size=1, max_size=4, unique=True)
            )
            return self.finish(named, ns)
        if kind == "fixed":
            named = self.named("fixed", ns)
            named["size"] = size = self.draw(st.integers(1, 8))
            if self.draw(st.booleans()):
                # The largest precision that a two's complement of `size` bytes holds.
                precision = math.floor(math.log10(2 ** (8 * size - 1) - 1))
                if precision > 0:
                    named.update(logicalType="decimal", precision=precision, scale=1)
            return self.finish(named, ns)
        if kind == "array":
            return {"type": "array", "items": self.any(depth + 1, ns)}
        if kind == "map":
            return {"type": "map", "values": self.any(depth + 1, ns)}
        if kind == "union":
            branch = self.any(depth + 1, ns, union=False)
            while branch == "null" or (isinstance(branch, dict) and branch["type"] == "null"):
                branch = self.draw(st.sampled_from(_PRIMITIVES[1:]))
            return ["null", branch]
        full = self.draw(st.sampled_from(self.defined))
        space, _, short = full.rpartition(".")
        if not space and ns:
            # Only Java's fallback to the null namespace resolves it; fastavro cannot.
            return "string"
        # A short name resolves in the current namespace; else use the fullname.
        return short if space == ns else full

    def named(self, type_: str, ns: str | None) -> dict[str, Any]:
        name = f"N{self.count}"
        self.count += 1
        how = self.draw(st.sampled_from(["inherit", "namespace", "dotted"]))
        if how == "inherit":
            return {"type": type_, "name": name}
        space = self.draw(st.sampled_from(_NAMESPACES))
        if how == "namespace":
            return {"type": type_, "name": name, "namespace": space}
        return {"type": type_, "name": f"{space}.{name}", "namespace": "ignored"}

    def finish(self, named: dict[str, Any], ns: str | None) -> dict[str, Any]:
        self.defined.append(fullname(named, ns))
        return named

    def record(self, depth: int, ns: str | None) -> dict[str, Any]:
        named = self.named("record", ns)
        inner = fullname(named, ns).rpartition(".")[0] or None
        fields = []
        for i in range(self.draw(st.integers(0 if depth else 1, 4))):
            field: dict[str, Any] = {"name": f"f{i}", "type": self.any(depth + 1, inner)}
            if isinstance(field["type"], list):
                field["default"] = None
            fields.append(field)
        named["fields"] = fields
        return self.finish(named, ns)


def fullname(named: dict[str, Any], ns: str | None) -> str:
    name: str = named["name"]
    if "." in name:
        return name
    space = named.get("namespace", ns)
    return f"{space}.{name}" if space else name


@st.composite
def avro_schemas(draw: st.DrawFn, max_depth: int = 3) -> dict[str, Any]:
    """A random record schema (a value schema, as events carry)."""
    return _Generator(draw, max_depth).record(0, None)


def strip_logical_types(schema: Any) -> Any:
    """``schema`` without logical types and with primitives in their simple form.

    For comparing with the ``avro`` package, whose PCF is wrong for both: it writes a
    primitive with attributes as ``{"type":"bytes"}``, and a reference to a decimal
    ``fixed`` as its whole definition again.
    """
    if isinstance(schema, list):
        return [strip_logical_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    type_ = schema["type"]
    if type_ in PRIMITIVE_TYPES:
        return type_
    out = dict(schema)
    if type_ == "fixed":
        for key in ("logicalType", "precision", "scale"):
            out.pop(key, None)
    elif type_ in ("record", "error"):
        out["fields"] = [{**f, "type": strip_logical_types(f["type"])} for f in schema["fields"]]
    elif type_ == "array":
        out["items"] = strip_logical_types(schema["items"])
    elif type_ == "map":
        out["values"] = strip_logical_types(schema["values"])
    return out


def values_for(schema: Any) -> st.SearchStrategy[Any]:
    """Values of a fastavro-expanded schema (``parse_schema(s, expand=True)``)."""
    if isinstance(schema, list):
        return st.one_of([values_for(s) for s in schema])
    if isinstance(schema, str):
        return _PRIMITIVE_VALUES[schema]
    type_ = schema["type"]
    logical = schema.get("logicalType")
    if logical == "decimal":
        precision, scale = schema["precision"], schema.get("scale", 0)
        digits = st.integers(-(10**precision - 1), 10**precision - 1)
        return digits.map(lambda i: Decimal(i).scaleb(-scale))
    if logical is not None:
        return _LOGICAL_VALUES[logical]
    if type_ in PRIMITIVE_TYPES:
        return _PRIMITIVE_VALUES[type_]
    if type_ == "record":
        return st.fixed_dictionaries({f["name"]: values_for(f["type"]) for f in schema["fields"]})
    if type_ == "enum":
        return st.sampled_from(schema["symbols"])
    if type_ == "fixed":
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    if type_ == "array":
        return st.lists(values_for(schema["items"]), max_size=3)
    if type_ == "map":
        return st.dictionaries(st.text(max_size=5), values_for(schema["values"]), max_size=3)
    raise AssertionError(f"unexpected schema {schema!r}")


_PRIMITIVE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "bytes": st.binary(max_size=16),
    "string": st.text(max_size=16),
}

_DATETIMES = st.datetimes(
    min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(_UTC)
)
_LOGICAL_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "timestamp-millis": _DATETIMES.map(
        lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
    ),
    "timestamp-micros": _DATETIMES,
    "date": st.dates(min_value=dt.date(1, 1, 1)),
    "time-millis": st.times().map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000)),
    "time-micros": st.times(),
    "uuid": st.uuids(),
}


@st.composite
def schemas_with_values(draw: st.DrawFn, max_depth: int = 3) -> tuple[dict[str, Any], Any]:
    """A random record schema and a value that fits it."""
    schema = draw(avro_schemas(max_depth))
    value = draw(values_for(parse_schema(schema, named_schemas={}, expand=True)))
    return schema, value


def normalise(value: Any) -> Any:
    """Values as the ``avro`` package returns them (it reads a uuid as ``str``)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


@settings(max_examples=50, deadline=None)
@given(schemas_with_values())
def test_generated_values_fit_their_schemas(pair: tuple[dict[str, Any], Any]) -> None:
    schema, value = pair
    assert validate(value, parse_schema(schema, named_schemas={}), raise_errors=True)


@settings(max_examples=50, deadline=None)
@given(avro_schemas())
def test_generated_schemas_use_named_types(schema: dict[str, Any]) -> None:
    assert schema["type"] == "record"
    assert schema["fields"]
    assert strip_logical_types(strip_logical_types(schema)) == (strip_logical_types(schema))
