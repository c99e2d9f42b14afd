"""What a source column holds: its Avro type (plus the ``sql_type`` hint) classified
into one ``Kind`` with precision, scale, length and hints (pure, no I/O).

The column types and converters (``_types``) and the normalisation (``_normalize``)
both start from this classification, so that the three agree on what a column is.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any

from databus.errors import SchemaError


class UnmappableTypeError(SchemaError):
    """A source column type no column of the target can hold (``unmappable``'s reason)."""

    code = "unmappable_type"


# -- classification: Avro type (+ hint) -> what the column holds ---------------------


class Kind(enum.Enum):
    INT = "int"  # Avro int: any 32-bit signed integer
    LONG = "long"
    BOOL = "boolean"
    FLOAT = "float"  # single precision
    DOUBLE = "double"
    DECIMAL = "decimal"  # exact, with precision and scale
    NUMERIC_TEXT = "numeric text"  # an exact number of no fixed scale, sent as text
    DATE = "date"
    LOCAL_TIMESTAMP = "local timestamp"  # a wall-clock date and time, no zone
    TIMESTAMP = "timestamp"  # an instant (UTC)
    TIME = "time"  # a time of day
    DURATION = "duration"  # signed microseconds (MySQL TIME, with a hint)
    STRING = "string"
    JSON = "json"  # JSON text (with a hint)
    BYTES = "bytes"
    SET = "set"  # array of string: MySQL SET members
    MIXED = "mixed"  # a union of several value types (SQLite's dynamic columns)


DATELIKE = (Kind.DATE, Kind.LOCAL_TIMESTAMP, Kind.TIMESTAMP)


@dataclass(frozen=True, slots=True)
class Col:
    kind: Kind
    nullable: bool = False
    text_branch: bool = False  # [date-like, string]: zero and invalid dates as text
    precision: int = 0
    scale: int = 0
    length: int = 0  # a length hint (characters or bytes), 0 without one
    hint: str = ""  # json / jsonb
    mysql_type: str = ""  # a SET(...)/ENUM(...) hint, as the source spells it


_LOGICAL: dict[tuple[str, str], Kind] = {
    ("int", "date"): Kind.DATE,
    ("long", "local-timestamp-micros"): Kind.LOCAL_TIMESTAMP,
    ("long", "local-timestamp-millis"): Kind.LOCAL_TIMESTAMP,
    ("long", "timestamp-micros"): Kind.TIMESTAMP,
    ("long", "timestamp-millis"): Kind.TIMESTAMP,
    ("long", "time-micros"): Kind.TIME,
    ("int", "time-millis"): Kind.TIME,
}
_PRIMITIVE: dict[str, Kind] = {
    "int": Kind.INT,
    "long": Kind.LONG,
    "boolean": Kind.BOOL,
    "float": Kind.FLOAT,
    "double": Kind.DOUBLE,
    "string": Kind.STRING,
    "bytes": Kind.BYTES,
}
# The binlog fetcher names its decimals decimal_<p>_<s> (a second column of the same
# precision and scale refers to the first by that name), so the name is the type.
_DECIMAL_NAME = re.compile(r"(?:^|\.)decimal_(\d+)_(\d+)$")
_LENGTH = re.compile(r"\(\s*(\d+)\s*(?:byte|char)?\s*\)", re.IGNORECASE)
# SET('a','b') / ENUM(...): only quoted labels, since the hint goes into DDL as is.
_SET_OR_ENUM = re.compile(r"^(?:set|enum)\s*\(\s*'(?:[^'\\]|''|\\.)*'"
                          r"(?:\s*,\s*'(?:[^'\\]|''|\\.)*')*\s*\)$", re.DOTALL)
_TEXT_HINTS = ("char", "text", "clob", "string")
_BYTES_HINTS = ("binary", "raw")
_NUMERIC_HINTS = ("numeric", "decimal", "number", "float")


def _branch(avro: Any) -> tuple[Kind, int, int]:
    """One non-null branch -> (kind, precision, scale)."""
    if isinstance(avro, dict):
        base, logical = avro.get("type"), avro.get("logicalType")
        if logical == "decimal" and base in ("bytes", "fixed"):
            return Kind.DECIMAL, int(avro["precision"]), int(avro.get("scale", 0))
        if isinstance(base, str) and isinstance(logical, str) and (base, logical) in _LOGICAL:
            return _LOGICAL[base, logical], 0, 0
        if base == "array" and avro.get("items") == "string":
            return Kind.SET, 0, 0
        if base == "enum":
            return Kind.STRING, 0, 0
        if base == "fixed":
            return Kind.BYTES, 0, 0
        if isinstance(base, str) and base in _PRIMITIVE:  # {"type": "string"}, unknown logical
            return _PRIMITIVE[base], 0, 0
        raise UnmappableTypeError(f"Avro type {json.dumps(avro)} has no column type "
                                  "(records, maps and arrays of non-strings are not replicated)")
    if isinstance(avro, str):
        if avro in _PRIMITIVE:
            return _PRIMITIVE[avro], 0, 0
        m = _DECIMAL_NAME.search(avro)
        if m:
            return Kind.DECIMAL, int(m[1]), int(m[2])
        raise UnmappableTypeError(f"Avro type {avro!r} has no column type (a named type "
                                  "other than the fetchers' decimal_<p>_<s>, or null)")
    raise UnmappableTypeError(f"Avro type {avro!r} has no column type")


def classify(avro_type: Any, sql_type: str | None) -> Col:
    branches = list(avro_type) if isinstance(avro_type, list) else [avro_type]
    nullable = "null" in branches
    branches = [b for b in branches if b != "null"]
    if not branches:
        raise UnmappableTypeError("a column that is always null has no column type")
    parsed = [_branch(b) for b in branches]
    kind, precision, scale = parsed[0]
    text_branch = False
    if len(parsed) == 2 and kind in DATELIKE and parsed[1][0] is Kind.STRING:
        text_branch = True
    elif len(parsed) > 1:
        return Col(Kind.MIXED, nullable)
    hint = (sql_type or "").strip().lower()
    length = 0
    extra = mysql_type = ""
    if hint and not hint.endswith("[]"):  # an array's text: no hint about its elements
        m = _LENGTH.search(hint)
        base = hint.split("(")[0].strip()
        if kind is Kind.STRING:
            if base in ("json", "jsonb"):
                kind, extra = Kind.JSON, base
            elif base in ("set", "enum") and _SET_OR_ENUM.match(hint):
                mysql_type = (sql_type or "").strip()  # labels keep their case
            elif any(base.startswith(n) for n in _NUMERIC_HINTS):
                kind = Kind.NUMERIC_TEXT
            elif m and any(t in base for t in _TEXT_HINTS):
                length = int(m[1])
        elif kind is Kind.SET and base == "set" and _SET_OR_ENUM.match(hint):
            mysql_type = (sql_type or "").strip()
        elif kind is Kind.BYTES and m and any(t in base for t in _BYTES_HINTS):
            length = int(m[1])
        elif kind is Kind.LONG and base == "time":
            kind = Kind.DURATION
    return Col(kind, nullable, text_branch, precision, scale, length, extra, mysql_type)


def decimal_bounds(col: Col) -> tuple[int, int]:
    """Precision and scale of a column that holds every value of ``col``: Oracle allows
    a scale above the precision (NUMBER(2,5): 0.000dd) and a negative one (NUMBER(5,-2):
    ddddd00), which SQL DECIMAL does not."""
    p, s = col.precision, col.scale
    if s < 0:
        return p - s, 0
    return max(p, s), s
