"""Avro schemas compiled to a check program: what the event core walks to check a
value's bytes without decoding them (``databus.batch.check_value``).

The client decodes values lazily (docs/client.md, "Lazy values"): at receive time the
bytes are only *checked*, and decoded on first access of ``event.value``. The check must
never accept bytes that decoding would refuse, so it answers one of three verdicts:

- ``GOOD``: fastavro decodes these bytes with this schema, surely (every length within
  the value, every union and enum index in range, strict UTF-8, no trailing byte, and
  every logical value inside the range its Python type can hold);
- ``BAD``: fastavro surely refuses them (a truncated value, an index past the end, bad
  UTF-8, trailing bytes): the event is refused;
- ``UNSURE``: bytes that are odd but not surely wrong (a negative index, which Python
  indexing accepts; a varint longer than its type; a timestamp past year 9999 ...):
  the caller decodes them at once, and decoding gives the verdict, as it always did.

Program layout: a flat ``array('i')`` of nodes; node 0 is the schema's root; each node
is its op code followed by its arguments, child nodes referred to by their index::

    NULL | BOOLEAN | INT | LONG | FLOAT | DOUBLE | BYTES | STRING        (no argument)
    DATE | TIME_MILLIS | TIME_MICROS | TIMESTAMP_MILLIS | TIMESTAMP_MICROS | UUID
    DECIMAL_BYTES
    FIXED size | DECIMAL_FIXED size | ENUM symbols
    ARRAY item | MAP value
    UNION n branch_1 .. branch_n | RECORD n field_1 .. field_n

A named type is compiled once and referred to by index. A recursive schema (a named
type used inside itself) has no program: its values are decoded at receive time.
"""

from __future__ import annotations

from array import array
from typing import Any

from databus.schemas._canonical import Schema

GOOD, BAD, UNSURE = 0, 1, 2

(NULL, BOOLEAN, INT, LONG, FLOAT, DOUBLE, BYTES, STRING, FIXED, ENUM, ARRAY, MAP, UNION,
 RECORD, DATE, TIME_MILLIS, TIME_MICROS, TIMESTAMP_MILLIS, TIMESTAMP_MICROS, UUID,
 DECIMAL_BYTES, DECIMAL_FIXED) = range(22)

_PRIMITIVE = {"null": NULL, "boolean": BOOLEAN, "int": INT, "long": LONG, "float": FLOAT,
              "double": DOUBLE, "bytes": BYTES, "string": STRING}
# fastavro's logical readers ("base-logical"); other logical types read as their base.
_LOGICAL = {"int-date": DATE, "int-time-millis": TIME_MILLIS,
            "long-time-micros": TIME_MICROS, "long-timestamp-millis": TIMESTAMP_MILLIS,
            "long-local-timestamp-millis": TIMESTAMP_MILLIS,
            "long-timestamp-micros": TIMESTAMP_MICROS,
            "long-local-timestamp-micros": TIMESTAMP_MICROS,
            "string-uuid": UUID, "bytes-decimal": DECIMAL_BYTES}


class _Recursive(Exception):
    pass


class _Compiler:
    def __init__(self) -> None:
        self.code: list[int] = []
        self.named: dict[str, int | None] = {}  # full name -> node (None: being compiled)

    def node(self, schema: Any, namespace: str | None) -> int:
        if isinstance(schema, str):
            if schema in _PRIMITIVE:
                return self._emit(_PRIMITIVE[schema])
            return self._ref(schema, namespace)
        if isinstance(schema, list):
            branches = [self.node(b, namespace) for b in schema]
            return self._emit(UNION, len(branches), *branches)
        kind = schema["type"]
        logical = schema.get("logicalType")
        if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in _PRIMITIVE
                                              and kind not in ("record", "error", "enum",
                                                               "fixed", "array", "map")):
            # {"type": <a schema>} as a wrapper, or a named reference
            return self.node(kind, namespace)
        if kind in _PRIMITIVE:
            op = _LOGICAL.get(f"{kind}-{logical}") if logical else None
            return self._emit(op if op is not None else _PRIMITIVE[kind])
        if kind == "array":
            return self._emit(ARRAY, self.node(schema["items"], namespace))
        if kind == "map":
            return self._emit(MAP, self.node(schema["values"], namespace))
        name, namespace = _full_name(schema, namespace)
        if kind == "enum":
            return self._define(name, ENUM, len(schema["symbols"]))
        if kind == "fixed":
            op = DECIMAL_FIXED if logical == "decimal" else FIXED
            return self._define(name, op, int(schema["size"]))
        # record / error: the fields are compiled before the record's own node, so the
        # name is marked as "being compiled" to catch recursion.
        self.named[name] = None
        fields = [self.node(f["type"], namespace) for f in schema["fields"]]
        self.named[name] = index = self._emit(RECORD, len(fields), *fields)
        return index

    def _define(self, name: str, *node: int) -> int:
        self.named[name] = index = self._emit(*node)
        return index

    def _ref(self, name: str, namespace: str | None) -> int:
        candidates = [name] if "." in name or not namespace else [f"{namespace}.{name}", name]
        for candidate in candidates:
            if candidate in self.named:
                index = self.named[candidate]
                if index is None:
                    raise _Recursive(candidate)
                return index
        raise KeyError(name)  # Schema validated it: cannot happen

    def _emit(self, *node: int) -> int:
        index = len(self.code)
        self.code.extend(node)
        return index


def _full_name(schema: dict[str, Any], namespace: str | None) -> tuple[str, str | None]:
    name = str(schema["name"])
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    ns = schema.get("namespace", namespace) or None
    return (f"{ns}.{name}" if ns else name), ns


def compile_program(schema: Schema) -> array[int] | None:
    """The check program of ``schema``, or None for a recursive schema (or one this
    compiler does not follow): its values are then decoded at receive time."""
    compiler = _Compiler()
    try:
        # Node 0 is a record of one field, the root (a record's node is emitted after
        # its fields', so the root is not always first).
        compiler.code.extend((RECORD, 1, 0))
        root = compiler.node(schema.schema, None)
    except (_Recursive, KeyError, TypeError, ValueError):
        return None
    compiler.code[2] = root
    return array("i", compiler.code)
