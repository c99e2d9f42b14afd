"""Column types -> Avro, row values -> Avro values and event keys, per dialect (pure).

The value of an upsert event is the whole current row (without ``databus_txn``) as an
Avro record named after the table, in a namespace named after the first part of the
source name (``shop.orders`` -> record ``orders`` in namespace ``shop``). Field names are
the column names made valid Avro names (``avro_names``); each field keeps its SQL name
and type in ``sql_name`` / ``sql_type`` attributes. A nullable column is a union with
``null`` first and ``null`` as default, so a column added later resolves for readers of
older data. A delete event carries the key only: its value is empty (consumers see
``value is None``), because the row is gone when the fetcher reads it.

Type mapping (``docs/txlog-fetcher.md`` summarises it; ``tests/unit/
test_txlog_schema.py`` tests every row):

==========  =================================================  ============================
dialect     column type                                        Avro type
==========  =================================================  ============================
SQLite      declared type contains INT                         long
SQLite      ... contains CHAR, CLOB or TEXT                    string
SQLite      ... contains REAL, FLOA or DOUB                    double
SQLite      ... contains BLOB, or no declared type             [bytes, long, double, string]
SQLite      anything else (NUMERIC, DECIMAL, BOOLEAN, DATE..)  [long, double, string]
PostgreSQL  smallint, integer                                  int
PostgreSQL  bigint, oid                                        long
PostgreSQL  real / double precision                            float / double
PostgreSQL  boolean                                            boolean
PostgreSQL  text, varchar(n), char(n), name                    string
PostgreSQL  bytea                                              bytes
PostgreSQL  numeric(p,s)                                       bytes, decimal(p,s)
PostgreSQL  numeric (no precision)                             string (exact text)
PostgreSQL  date                                               int, date
PostgreSQL  timestamp [without time zone]                      long, local-timestamp-micros
PostgreSQL  timestamp with time zone                           long, timestamp-micros
PostgreSQL  time [without time zone]                           long, time-micros
PostgreSQL  anything else (uuid, json, jsonb, interval,        string (the column's text
            arrays, enums, inet, money, timetz, ...)            form, ``::text``)
Oracle      NUMBER(p,0), p <= 18 / INTEGER                     long
Oracle      NUMBER(p,s), s > 0                                 bytes, decimal(p,s)
Oracle      NUMBER, FLOAT                                      string
Oracle      BINARY_FLOAT / BINARY_DOUBLE                       float / double
Oracle      VARCHAR2, NVARCHAR2, CHAR, NCHAR, CLOB, NCLOB      string
Oracle      RAW, BLOB                                          bytes
Oracle      DATE, TIMESTAMP(n)                                 long, local-timestamp-micros
Oracle      TIMESTAMP(n) WITH [LOCAL] TIME ZONE                long, timestamp-micros
Oracle      anything else                                      string
==========  =================================================  ============================

SQLite is dynamically typed: the first three rows are strict (an INTEGER column holding
the text ``'abc'`` raises a ``SchemaError`` naming the table, column and key: fix the
data or use a STRICT table), while columns with NUMERIC or no/BLOB affinity may hold
several storage classes and so map to unions.

Keys: a single-column key is the event key as it is when it is an int, a str or bytes,
else its text (``str()``); a composite key is a tuple of JSON values (int, float, str,
None; bytes become hex, other values their text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from databus import batch
from databus.batch import encode_flat_record
from databus.errors import SchemaError
from databus.event import Key
from databus.fetchers._keys import normalize_key
from databus.fetchers.txlog._model import Column, TableShape
from databus.fetchers.txlog._uri import Dialect
from databus.schemas import AvroCodec, JsonSchema, Schema, avro_names

__all__ = [
    "FieldMapping",
    "TableCodec",
    "field_mapping",
    "normalize_key",
]

Converter = Callable[[Any], Any]


class ColumnValueError(SchemaError):
    """A value of ``column`` its Avro type cannot carry (the message names the value;
    ``column`` lets a quarantine reason say which column without it)."""

    def __init__(self, column: Column, message: str) -> None:
        super().__init__(message)
        self.column = column


class _BadValue(Exception):
    """A value that does not fit its column's Avro type (SQLite's dynamic typing)."""


@dataclass(frozen=True, slots=True)
class FieldMapping:
    """How one column travels: its Avro type (without null), the conversion of the
    driver's value (None: as is), and whether it is selected as text (``::text``)."""

    avro: JsonSchema
    convert: Converter | None = None
    as_text: bool = False


# -- SQLite -------------------------------------------------------------------------


def _sqlite_long(value: Any) -> Any:
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _BadValue


def _sqlite_double(value: Any) -> Any:
    if isinstance(value, int | float):
        return float(value)
    raise _BadValue


def _sqlite_string(value: Any) -> Any:
    if isinstance(value, str):
        return value
    raise _BadValue


def _sqlite_numeric(value: Any) -> Any:
    if isinstance(value, bytes):
        raise _BadValue
    return value


def _sqlite_mapping(sql_type: str) -> FieldMapping:
    # SQLite's affinity rules (https://sqlite.org/datatype3.html, 3.1), in their order.
    t = sql_type.upper()
    if "INT" in t:
        return FieldMapping("long", _sqlite_long)
    if "CHAR" in t or "CLOB" in t or "TEXT" in t:
        return FieldMapping("string", _sqlite_string)
    if "BLOB" in t or not t.strip():
        return FieldMapping(["bytes", "long", "double", "string"])
    if "REAL" in t or "FLOA" in t or "DOUB" in t:
        return FieldMapping("double", _sqlite_double)
    return FieldMapping(["long", "double", "string"], _sqlite_numeric)


# -- PostgreSQL ---------------------------------------------------------------------


def _to_bytes(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview | bytearray) else value


def _decimal(precision: int, scale: int) -> JsonSchema:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


def _precision_scale(sql_type: str) -> tuple[int, int] | None:
    """``(p, s)`` of ``numeric(p,s)`` / ``NUMBER(p,s)`` / ``NUMBER(p)``; None without p."""
    if "(" not in sql_type:
        return None
    inner = sql_type[sql_type.index("(") + 1 : sql_type.rindex(")")]
    numbers = [int(x) for x in inner.split(",")]
    return numbers[0], numbers[1] if len(numbers) > 1 else 0


def _postgres_mapping(sql_type: str) -> FieldMapping:
    t = sql_type.lower()
    base = t.split("(")[0].strip()
    if t.endswith("[]"):
        return FieldMapping("string", as_text=True)
    if base in ("smallint", "integer"):
        return FieldMapping("int")
    if base in ("bigint", "oid"):
        return FieldMapping("long")
    if base == "real":
        return FieldMapping("float")
    if base == "double precision":
        return FieldMapping("double")
    if base == "boolean":
        return FieldMapping("boolean")
    if base in ("text", "character varying", "character", "name", "bpchar"):
        return FieldMapping("string")
    if base == "bytea":
        return FieldMapping("bytes", _to_bytes)
    if base == "numeric":
        ps = _precision_scale(t)
        return FieldMapping(_decimal(*ps)) if ps else FieldMapping("string", as_text=True)
    if base == "date":
        return FieldMapping({"type": "int", "logicalType": "date"})
    if base == "timestamp" or t.startswith("timestamp"):
        if "with time zone" in t and "without" not in t:
            return FieldMapping({"type": "long", "logicalType": "timestamp-micros"})
        return FieldMapping({"type": "long", "logicalType": "local-timestamp-micros"})
    if (base == "time" or t.startswith("time")) and "with time zone" not in t:
        return FieldMapping({"type": "long", "logicalType": "time-micros"})
    return FieldMapping("string", as_text=True)


# -- Oracle (untested against a live server) ---------------------------------------


def _read_lob(value: Any) -> Any:
    read = getattr(value, "read", None)
    return read() if callable(read) else value


def _oracle_mapping(sql_type: str) -> FieldMapping:
    t = sql_type.upper()
    base = t.split("(")[0].strip()
    if base == "INTEGER":
        return FieldMapping("long")
    if base == "NUMBER":
        ps = _precision_scale(t)
        if ps is None:
            return FieldMapping("string", str)
        precision, scale = ps
        if scale == 0 and precision <= 18:
            return FieldMapping("long")
        return FieldMapping(_decimal(precision, scale), Decimal)
    if base == "FLOAT":
        return FieldMapping("string", str)
    if base == "BINARY_FLOAT":
        return FieldMapping("float")
    if base == "BINARY_DOUBLE":
        return FieldMapping("double")
    if base in ("VARCHAR2", "NVARCHAR2", "CHAR", "NCHAR", "CLOB", "NCLOB", "LONG"):
        return FieldMapping("string", _read_lob)
    if base in ("RAW", "BLOB"):
        return FieldMapping("bytes", _read_lob)
    if base == "DATE" or (base.startswith("TIMESTAMP") and "TIME ZONE" not in t):
        return FieldMapping({"type": "long", "logicalType": "local-timestamp-micros"})
    if base.startswith("TIMESTAMP"):
        return FieldMapping({"type": "long", "logicalType": "timestamp-micros"})
    return FieldMapping("string", str)


_MAPPERS: dict[Dialect, Callable[[str], FieldMapping]] = {
    "sqlite": _sqlite_mapping,
    "postgresql": _postgres_mapping,
    "oracle": _oracle_mapping,
}


def field_mapping(dialect: Dialect, sql_type: str) -> FieldMapping:
    """How a column of ``sql_type`` maps to Avro in ``dialect`` (the table above)."""
    return _MAPPERS[dialect](sql_type)


# -- the per-table codec ----------------------------------------------------------

_FLAT_CODES = {"long": 1, "int": 2, "double": 3, "boolean": 4, "string": 5, "bytes": 6}
_NULLABLE = 16


def _flat_codes(fields: Sequence[dict[str, Any]]) -> bytes | None:
    """``encode_flat_record``'s codes of a record's fields: each a primitive type or
    ["null", primitive]; None when any field is something else (a logical type, a
    union of several types: fastavro writes those)."""
    codes = []
    for field in fields:
        avro = field["type"]
        nullable = isinstance(avro, list) and len(avro) == 2 and avro[0] == "null"
        base = avro[1] if nullable else avro
        if not isinstance(base, str) or base not in _FLAT_CODES:
            return None
        codes.append(_FLAT_CODES[base] | (_NULLABLE if nullable else 0))
    return bytes(codes)




class TableCodec:
    """A table's Avro schema, and rows (tuples in column order) -> event values/keys."""

    def __init__(self, shape: TableShape, dialect: Dialect, source_name: str) -> None:
        self.shape = shape
        self.source_name = source_name
        namespace, _, record = source_name.rpartition(".")
        self.mappings = [field_mapping(dialect, c.sql_type) for c in shape.columns]
        self.field_names = avro_names([c.name for c in shape.columns])
        fields: list[dict[str, Any]] = []
        for column, name, mapping in zip(shape.columns, self.field_names, self.mappings,
                                         strict=True):
            avro = mapping.avro
            field: dict[str, Any] = {"name": name}
            if column.nullable:
                branches = avro if isinstance(avro, list) else [avro]
                field["type"] = ["null", *branches]
                field["default"] = None
            else:
                field["type"] = avro
            field["sql_name"] = column.name
            field["sql_type"] = column.sql_type
            fields.append(field)
        record_schema: dict[str, Any] = {
            "type": "record",
            "name": avro_names([record])[0],
            "doc": f"Rows of {source_name}, captured by the databus TxLog fetcher",
            "fields": fields,
        }
        if namespace:
            record_schema["namespace"] = ".".join(avro_names(namespace.split(".")))
        # The primary key's columns (SQL names), for consumers that keep a copy of the
        # table (the replicator). Not in Avro's canonical form: the fingerprint is the
        # same with or without it.
        record_schema["key"] = [c.name for c in shape.key_columns]
        self.schema = Schema(record_schema)
        self.fingerprint = self.schema.fingerprint
        self._converters = [
            (i, m.convert) for i, m in enumerate(self.mappings) if m.convert is not None
        ]
        names = [c.name for c in shape.columns]
        self.key_positions = [names.index(k) for k in shape.key]
        self._codec = AvroCodec(schemas=[self.schema])
        # The compiled core writes a record of primitive fields straight from the row
        # (fastavro wants a dict per row); None: a field it does not write, or the pure
        # twin, whose writer is the reference only (fastavro is faster than it).
        self._flat = _flat_codes(fields) if batch.IMPLEMENTATION == "native" else None

    def key(self, row: Sequence[Any]) -> Key:
        """The event key of a row (all columns, in order)."""
        return normalize_key([row[i] for i in self.key_positions])

    def encode(self, row: Sequence[Any]) -> bytes:
        """The Avro value of a row (all columns, in order)."""
        if self._flat is not None:
            # Values already of their fields' exact types need no conversion (every
            # converter returns those unchanged); anything else goes the long way.
            data = encode_flat_record(row, self._flat)
            if data is not None:
                return data
        values = list(row)
        for i, convert in self._converters:
            value = values[i]
            if value is not None:
                try:
                    values[i] = convert(value)
                except _BadValue:
                    column = self.shape.columns[i]
                    declared = column.sql_type or "no type"
                    raise ColumnValueError(column,
                        f"{self.source_name}: column {column.name!r} ({declared}) holds the "
                        f"{type(value).__name__} {value!r:.40} in the row with key "
                        f"{self.key(row)!r}, which its Avro type cannot carry (SQLite's "
                        "dynamic typing let it in): fix the value, or declare the column's "
                        "type to match (a STRICT table prevents this)"
                    ) from None
        if self._flat is not None:
            data = encode_flat_record(values, self._flat)
            if data is not None:
                return data  # else fastavro decides: the same bytes, or the error
        return self._codec.encode(dict(zip(self.field_names, values, strict=True)), self.schema)
