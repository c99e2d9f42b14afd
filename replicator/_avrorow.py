"""An event's Avro bytes straight to the replicator's row (issue 30): the fold's survivors
skip the general decode (fastavro into a dict, then a converter per column) when their
table's columns allow it.

``plan_for(schema, fold)`` reads the writer schema once per version: per field, how to
read it (T or a ``["null", T]`` union, T one of boolean, int, long, float, double,
string, bytes, fixed, or the logical types date, time-micros, timestamp-micros, local-
timestamp-micros, decimal on bytes or fixed; and the ``[T, "string"]`` unions of dates
and instants that may hold MySQL's zero dates, whose text the PostgreSQL converter makes
NULL) and which column of the row it fills. No plan (None) when a field has another type
(an enum, an array, a named type used by name, another logical type) or a column's
converter does anything but give the value back (``is_identity``), refuse a NUL in text
(``_pg_text``), make an instant aware (``_aware``, which fastavro's instants are
already) or a zero date's text NULL (``_pg_zero_date_null``): the general path then,
always. ``row(data, plan)`` gives the tuple the general path gives, value for value and
type for type, or None where it declines (a NUL the converter refuses, bytes that are
not UTF-8, a date or instant outside Python's range, bytes left over, a decimal of more
digits than its precision): the caller takes the general path for that event, which
raises what it raises.

Two twins, as ``databus.batch``: ``_avrorow_native`` (Cython) and ``_avrorow_python``
(fastavro then the same layout, the reference). The fold uses the compiled one only;
without it (``DATABUS_PURE_PYTHON=1``, no compiler) it takes the general path, which the
reference twin equals.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from databus.batch import load_compiled
from databus.replicator import _avrorow_python

__all__ = ["IMPLEMENTATION", "Plan", "native", "plan_for", "twin"]

K_BOOL, K_LONG, K_FLOAT, K_DOUBLE, K_STRING, K_BYTES = 1, 2, 3, 4, 5, 6
K_FIXED, K_DEC_BYTES, K_DEC_FIXED, K_DATE, K_TS, K_LOCAL_TS, K_TIME = 7, 8, 9, 10, 11, 12, 13
K_NULL, K_ZERO_TEXT = 0, 14  # union branches: NULL; a text the converter makes NULL

_PRIMITIVE = {"boolean": K_BOOL, "int": K_LONG, "long": K_LONG, "float": K_FLOAT,
              "double": K_DOUBLE, "string": K_STRING, "bytes": K_BYTES}
_LOGICAL = {("int", "date"): K_DATE, ("long", "time-micros"): K_TIME,
            ("long", "timestamp-micros"): K_TS,
            ("long", "local-timestamp-micros"): K_LOCAL_TS}


@dataclass(frozen=True)
class Plan:
    """How to read one writer schema into one table's row (module docstring)."""

    # Per writer field: (-1, kind, column or -1, NUL check / fixed size, decimal scale,
    # decimal precision, the kind of each union branch or None: not a union).
    steps: tuple[tuple[int, int, int, int, int, int, tuple[int, ...] | None], ...]
    width: int
    # For the reference twin: the writer schema, each column's field name (None: no
    # such field), the columns whose text must hold no NUL, those whose text is NULL.
    reference: tuple[Any, tuple[str | None, ...], tuple[int, ...], tuple[int, ...]]


def _kind(avro: Any) -> tuple[int, int, int, int] | None:
    """(kind, size, scale, precision) of a non-union Avro type, or None."""
    if isinstance(avro, str):
        kind = _PRIMITIVE.get(avro)
        return None if kind is None else (kind, 0, 0, 0)
    if not isinstance(avro, dict):
        return None
    base, logical = avro.get("type"), avro.get("logicalType")
    if logical == "decimal":
        scale, precision = avro.get("scale", 0), avro.get("precision")
        if not isinstance(scale, int) or not isinstance(precision, int) or precision < 1:
            return None
        if base == "bytes":
            return K_DEC_BYTES, 0, scale, precision
        if base == "fixed" and isinstance(avro.get("size"), int):
            return K_DEC_FIXED, avro["size"], scale, precision
        return None
    if logical is not None:
        kind = _LOGICAL.get((base, logical))  # type: ignore[arg-type]
        return None if kind is None else (kind, 0, 0, 0)
    if base == "fixed" and isinstance(avro.get("size"), int):
        return K_FIXED, avro["size"], 0, 0
    if isinstance(base, str) and base in _PRIMITIVE:
        return _PRIMITIVE[base], 0, 0, 0
    return None


def plan_for(schema: Any, sources: list[str], converters: list[Any]) -> Plan | None:
    """The plan of writer schema ``schema`` (Avro JSON) for a row of columns read from
    fields ``sources`` through ``converters`` (``TableFold``'s), or None."""
    from databus.replicator._types import _aware, _pg_text, _pg_zero_date_null, is_identity

    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    fields = schema.get("fields")
    if not isinstance(fields, list):
        return None
    column = {name: i for i, name in enumerate(sources)}
    checks: list[int] = []
    zeros: list[int] = []
    steps: list[tuple[int, int, int, int, int, int, tuple[int, ...] | None]] = []
    for f in fields:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            return None
        avro = f.get("type")
        col = column.get(f["name"], -1)
        conv = converters[col] if col >= 0 else None
        inner = getattr(conv, "__wrapped__", None)
        branches: tuple[int, ...] | None = None
        ident = conv is not None and is_identity(conv)
        if isinstance(avro, list):
            # ["null", T] (either order); T or "string" (and "null") where the column's
            # converter turns a text (MySQL's zero date) into NULL.
            others = [b for b in avro if b != "null"]
            zero_text = (inner is _pg_zero_date_null and len(others) == 2
                         and others.count("string") == 1)
            if zero_text:
                others.remove("string")
            if len(others) != 1 or len(avro) != len(set(map(str, avro))):
                return None
            read = _kind(others[0])
            if read is None or (zero_text and read[0] not in (K_DATE, K_TS, K_LOCAL_TS)):
                return None
            branches = tuple(K_NULL if b == "null" else
                             K_ZERO_TEXT if zero_text and b == "string" else read[0]
                             for b in avro)
        else:
            read = _kind(avro)
            if read is None:
                return None
        kind, size, scale, precision = read
        check = 0
        if col >= 0:
            if inner is _pg_text and kind == K_STRING:
                check = 1
                checks.append(col)
            elif inner is _aware and kind == K_TS:
                pass  # fastavro's instants are aware (UTC) already
            elif inner is _pg_zero_date_null and branches and K_ZERO_TEXT in branches:
                zeros.append(col)  # a date or instant as it is; the text reads as NULL
            elif not ident:
                return None
        steps.append((-1, kind, col, size if kind in (K_FIXED, K_DEC_FIXED) else check,
                      scale, precision, branches))
    names = {f["name"] for f in fields}
    return Plan(tuple(steps), len(sources),
                (schema, tuple(s if s in names else None for s in sources), tuple(checks),
                 tuple(zeros)))


native, _ = load_compiled("databus.replicator._avrorow_native")
IMPLEMENTATION = "native" if native is not None else "python"


def twin(name: str) -> ModuleType:
    """The module of one twin: "python" always, "native" if it was built."""
    if name == "python":
        return _avrorow_python
    if name == "native":
        from databus.replicator import _avrorow_native  # type: ignore[attr-defined]

        return _avrorow_native  # type: ignore[no-any-return]
    raise ValueError(f"no twin named {name!r}")
