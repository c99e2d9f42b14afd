"""Avro records <-> Arrow columns, for the Parquet export and for seeding from it (pure).

Each top-level field of the Avro record becomes one Arrow column:

==========================================  ==============================================
Avro                                        Arrow (Parquet)
==========================================  ==============================================
boolean, int, long, float, double           bool, int32, int64, float32, float64
string, enum, uuid                          string
bytes, fixed                                binary
int date                                    date32
long timestamp-millis / -micros             timestamp[us, UTC]
long local-timestamp-millis / -micros       timestamp[us] (no zone)
int time-millis / long time-micros          int32 milliseconds / int64 microseconds
decimal(p, s), p <= 38                      decimal128(p, s)
decimal(p, s), p > 38                       string (the exact decimal text)
record, array, map                          struct, list, map<string, _>
["null", T]                                 T, nullable
[T, "string"] (top level)                   T, plus a ``<field>__str`` string column set
                                            when the value took the string branch (the
                                            binlog fetcher's zero dates)
any other union                             string: the value as JSON text
==========================================  ==============================================

``to_arrow`` converts a decoded (fastavro) value for its column; ``from_arrow`` turns
the Python value of such a column back into what fastavro writes, so a snapshot
exported to Parquet seeds back to the same Avro bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from databus.errors import SchemaError

Convert = Callable[[Any], Any]
TEXT_SUFFIX = "__str"
MAX_DECIMAL128_PRECISION = 38


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Mapped:
    type: pa.DataType
    to_arrow: Convert
    from_arrow: Convert


@dataclass(frozen=True)
class Column:
    """One top-level Avro field as one (or two) Arrow columns."""

    name: str
    mapped: Mapped
    nullable: bool
    text_sibling: bool = False  # a [T, "string"] union: typed column + <name>__str

    @property
    def text_name(self) -> str:
        return self.name + TEXT_SUFFIX

    def arrow_fields(self) -> list[pa.Field]:
        fields = [pa.field(self.name, self.mapped.type, nullable=self.nullable
                           or self.text_sibling)]
        if self.text_sibling:
            fields.append(pa.field(self.text_name, pa.string(), nullable=True))
        return fields


class _Names:
    """Named Avro types seen so far (a later field may refer to one by name)."""

    def __init__(self) -> None:
        self.types: dict[str, Mapped] = {}

    def full(self, name: str, namespace: str | None) -> str:
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def add(self, name: str, namespace: str | None, mapped: Mapped) -> None:
        self.types[self.full(name, namespace)] = mapped
        self.types.setdefault(name.rsplit(".", 1)[-1], mapped)


_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(),
    "string": pa.string(),
}


def _json_text(value: Any) -> Any:
    return None if value is None else json.dumps(value, default=str, ensure_ascii=False)


def _json_value(text: Any) -> Any:
    return None if text is None else json.loads(text)


def _map_named_or_primitive(name: str, names: _Names, namespace: str | None) -> Mapped:
    if name in _PRIMITIVES:
        return Mapped(_PRIMITIVES[name], _same, _same)
    found = names.types.get(names.full(name, namespace)) or names.types.get(name)
    if found is None:
        raise SchemaError(f"Avro type {name!r} is not defined before its use")
    return found


def _decimal(avro: Mapping[str, Any]) -> Mapped:
    precision, scale = int(avro["precision"]), int(avro.get("scale", 0))
    if precision <= MAX_DECIMAL128_PRECISION:
        return Mapped(pa.decimal128(precision, scale), _same, _same)
    return Mapped(pa.string(), lambda v: None if v is None else str(v),
                  lambda v: None if v is None else Decimal(v))


def _map_type(avro: Any, names: _Names, namespace: str | None) -> Mapped:
    if isinstance(avro, str):
        return _map_named_or_primitive(avro, names, namespace)
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) == 1:
            return _map_type(branches[0], names, namespace)
        return Mapped(pa.string(), _json_text, _json_value)
    if not isinstance(avro, Mapping):
        raise SchemaError(f"not an Avro type: {avro!r}")
    kind = avro.get("type")
    logical = avro.get("logicalType")
    namespace = avro.get("namespace", namespace)
    if kind == "record" or kind == "error":
        fields = [(f["name"], _map_type(f["type"], names, namespace)) for f in avro["fields"]]
        struct = pa.struct([pa.field(n, m.type) for n, m in fields])

        def record_to(value: Any) -> Any:
            if value is None:
                return None
            return {n: m.to_arrow(value.get(n)) for n, m in fields}

        def record_from(value: Any) -> Any:
            if value is None:
                return None
            return {n: m.from_arrow(value.get(n)) for n, m in fields}

        mapped = Mapped(struct, record_to, record_from)
        names.add(avro["name"], namespace, mapped)
        return mapped
    if kind == "enum":
        mapped = Mapped(pa.string(), _same, _same)
        names.add(avro["name"], namespace, mapped)
        return mapped
    if kind == "fixed":
        mapped = _decimal(avro) if logical == "decimal" else Mapped(pa.binary(), _same, _same)
        names.add(avro["name"], namespace, mapped)
        return mapped
    if kind == "array":
        item = _map_type(avro["items"], names, namespace)
        return Mapped(pa.list_(item.type),
                      lambda v: None if v is None else [item.to_arrow(x) for x in v],
                      lambda v: None if v is None else [item.from_arrow(x) for x in v])
    if kind == "map":
        value = _map_type(avro["values"], names, namespace)
        return Mapped(pa.map_(pa.string(), value.type),
                      lambda v: None if v is None else [(k, value.to_arrow(x))
                                                        for k, x in v.items()],
                      lambda v: None if v is None else {k: value.from_arrow(x) for k, x in
                                                        (v.items() if isinstance(v, dict)
                                                         else v)})
    if logical == "date" and kind == "int":
        return Mapped(pa.date32(), _same, _same)
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return Mapped(pa.timestamp("us", tz="UTC"), _same, _same)
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return Mapped(pa.timestamp("us"), _same, _same)
    if logical == "time-millis" and kind == "int":
        return Mapped(pa.int32(), _time_to_int(1000), _same)
    if logical == "time-micros" and kind == "long":
        return Mapped(pa.int64(), _time_to_int(1), _same)
    if logical == "decimal" and kind == "bytes":
        return _decimal(avro)
    if logical == "uuid" and kind == "string":
        return Mapped(pa.string(), lambda v: None if v is None else str(v), _same)
    if isinstance(kind, str | list | dict):
        return _map_type(kind, names, namespace)
    raise SchemaError(f"unsupported Avro type {avro!r}")


def _time_to_int(divisor: int) -> Convert:
    def convert(value: Any) -> Any:
        if value is None or isinstance(value, int):
            return value
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
        return (micros + value.microsecond) // divisor

    return convert


def _is_string(avro: Any) -> bool:
    return avro == "string" or (isinstance(avro, Mapping) and avro.get("type") == "string"
                                and "logicalType" not in avro)


def record_columns(schema: Mapping[str, Any]) -> list[Column]:
    """The Arrow columns of an Avro record schema (see the module docstring)."""
    if not isinstance(schema, Mapping) or schema.get("type") not in ("record", "error"):
        raise SchemaError("only Avro records can be exported to columns")
    names = _Names()
    namespace = schema.get("namespace")
    if "." in schema["name"]:
        namespace = schema["name"].rsplit(".", 1)[0]
    columns = []
    for field in schema["fields"]:
        avro = field["type"]
        branches = [b for b in avro if b != "null"] if isinstance(avro, list) else [avro]
        nullable = isinstance(avro, list) and "null" in avro
        strings = [b for b in branches if _is_string(b)]
        if len(branches) == 2 and len(strings) == 1:
            typed = next(b for b in branches if not _is_string(b))
            mapped = _map_type(typed, names, namespace)
            if mapped.type != pa.string():
                columns.append(Column(field["name"], mapped, nullable, text_sibling=True))
                continue
        columns.append(Column(field["name"], _map_type(avro, names, namespace), nullable))
    return columns


def to_arrays(records: list[Mapping[str, Any]], columns: list[Column]) -> list[pa.Array]:
    """Decoded records as Arrow arrays, in ``Column.arrow_fields`` order."""
    arrays: list[pa.Array] = []
    for column in columns:
        values = [r.get(column.name) for r in records]
        convert = column.mapped.to_arrow
        if column.text_sibling:
            typed = [None if isinstance(v, str) else convert(v) for v in values]
            texts = [v if isinstance(v, str) else None for v in values]
            arrays.append(pa.array(typed, type=column.mapped.type))
            arrays.append(pa.array(texts, type=pa.string()))
        elif convert is _same:  # most columns: no call per value
            arrays.append(pa.array(values, type=column.mapped.type))
        else:
            arrays.append(pa.array([convert(v) for v in values], type=column.mapped.type))
    return arrays


def from_row(row: Mapping[str, Any], columns: list[Column]) -> dict[str, Any]:
    """A row of such columns (Python values) as the datum fastavro writes; a value that
    came from the string branch is passed in fastavro's (branch, value) notation, or
    fastavro would try it as a date first and fail on '0000-00-00'."""
    datum: dict[str, Any] = {}
    for column in columns:
        if column.text_sibling:
            text = row.get(column.text_name)
            if text is not None:
                datum[column.name] = ("string", text)
                continue
        datum[column.name] = column.mapped.from_arrow(row.get(column.name))
    return datum
