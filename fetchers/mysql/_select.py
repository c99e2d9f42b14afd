"""Reading a MariaDB/MySQL table with ``SELECT`` so that its rows encode exactly as the
binlog fetcher encodes them: the relay's dumps (DB-API, ``_dump``) and the Spark seed
job (JDBC) both select through these expressions. Pure: SQL text and value conversions;
``table_layout`` is the one function that reads (information_schema).

The table's layout comes from information_schema through the fetcher's own code
(``shape_from_information_schema``), so the Avro schema and its fingerprint are the
fetcher's; rows are encoded with the fetcher's Avro writers (``row_writers``,
``encode_row``) and keyed with its ``row_key_function``. What remains here is getting
each column's value out of a ``SELECT`` in the fetcher's "Avro-native" form (the value
its binlog decoder produces). JDBC's own conversions lose information (zero dates,
fractional TIMESTAMPs, FLOAT digits, unsigned BIGINT), so every column is selected
through an expression whose text or number converts back exactly:

=======================  ===================================  ==========================
kind (fetcher)           SELECT expression                    Avro-native value
=======================  ===================================  ==========================
INT, LONG, YEAR, BOOL    ``CAST(c AS SIGNED)``                int (bool for BIT(1))
UINT64, DECIMAL          ``CAST(c AS CHAR)``                  int (unscaled for DECIMAL)
FLOAT                    ``CAST(c AS DOUBLE)`` (exact widen)  float
DOUBLE                   ``c`` (printed round-trip exact)     float
BITS                     ``HEX(c)``                           big-endian bytes
DATE, DATETIME           ``CAST(c AS CHAR)``                  days / micros, or the text
                                                              of a zero or invalid date
TIME                     ``CAST(c AS CHAR)``                  signed microseconds
TIMESTAMP                ``CAST(UNIX_TIMESTAMP(c) AS CHAR)``  UTC microseconds (session
                                                              time_zone +00:00)
TEXT, ENUM, JSON         ``CAST(c AS CHAR)`` (not CHAR(n):    str
                         Spark pads CHAR values)
SET                      ``CAST(c AS CHAR)``                  list of labels
BYTES, GEOMETRY          ``c`` (INET6/UUID/INET4: ``CAST(c    bytes (GEOMETRY: SRID +
                         AS BINARY(n))``, the binlog bytes)   WKB, MySQL's internal form)
=======================  ===================================  ==========================
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from databus.errors import SourceError
from databus.fetchers.mysql._binlog_values import _date_value, _datetime_value
from databus.fetchers.mysql._keys import _EXACT
from databus.fetchers.mysql._schema import (
    INFORMATION_SCHEMA_COLUMNS,
    INFORMATION_SCHEMA_PRIMARY_KEYS,
    TableShape,
    shape_from_information_schema,
)
from databus.fetchers.mysql._types import ColumnSpec, Kind

Convert = Callable[[Any], Any]

_BINARY_TYPES = {"inet6": 16, "uuid": 16, "inet4": 4}
_DATE_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_DATETIME_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")
_TIME_RE = re.compile(r"(-?)(\d+):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")
_MICROS = Decimal(1_000_000)


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class DumpColumn:
    """One column of the dump: the SQL that selects it and how its value converts."""

    spec: ColumnSpec
    expression: str
    convert: Convert


def _micros_fraction(digits: str | None) -> int:
    return int((digits or "").ljust(6, "0")) if digits else 0


def _date(text: str) -> int | str:
    match = _DATE_RE.fullmatch(text)
    if match is None:
        raise SourceError(f"unexpected DATE text {text!r} from the dump", retriable=False)
    return _date_value(*(int(g) for g in match.groups()))


def _datetime_converter(fsp: int) -> Convert:
    def convert(text: str) -> int | str:
        match = _DATETIME_RE.fullmatch(text)
        if match is None:
            raise SourceError(f"unexpected DATETIME text {text!r} from the dump",
                              retriable=False)
        y, mo, d, h, mi, s, frac = match.groups()
        return _datetime_value(int(y), int(mo), int(d), int(h), int(mi), int(s),
                               _micros_fraction(frac), fsp)

    return convert


def _time(text: str) -> int:
    match = _TIME_RE.fullmatch(text)
    if match is None:
        raise SourceError(f"unexpected TIME text {text!r} from the dump", retriable=False)
    sign, h, m, s, frac = match.groups()
    micros = ((int(h) * 60 + int(m)) * 60 + int(s)) * 1_000_000 + _micros_fraction(frac)
    return -micros if sign else micros


def _timestamp(text: str) -> int:
    return int(Decimal(text) * _MICROS)


def _decimal_converter(scale: int) -> Convert:
    def convert(text: str) -> int:
        return int(Decimal(text).scaleb(scale, _EXACT))

    return convert


def _bits_converter(width: int) -> Convert:
    size = (width + 7) // 8

    def convert(text: str) -> bytes:
        return bytes.fromhex(text.rjust(2 * size, "0"))

    return convert


def _set(text: str) -> list[str]:
    return text.split(",") if text else []


def _json(text: str) -> str:
    # The fetcher writes MySQL's binary JSON re-serialised compactly; SELECT prints it
    # with spaces. (MariaDB's JSON is a LONGTEXT, a TEXT column here.)
    return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))


def dump_column(spec: ColumnSpec, data_type: str) -> DumpColumn:
    """How to select ``spec`` (its information_schema DATA_TYPE is ``data_type``)."""
    q = quote(spec.name)
    kind = spec.kind
    if kind in (Kind.INT, Kind.LONG, Kind.YEAR):
        return DumpColumn(spec, f"CAST({q} AS SIGNED)", int)
    if kind is Kind.BOOL:
        return DumpColumn(spec, f"CAST({q} AS SIGNED)", lambda v: bool(int(v)))
    if kind is Kind.UINT64:
        return DumpColumn(spec, f"CAST({q} AS CHAR)", int)
    if kind is Kind.DECIMAL:
        return DumpColumn(spec, f"CAST({q} AS CHAR)", _decimal_converter(spec.scale))
    if kind is Kind.FLOAT:
        return DumpColumn(spec, f"CAST({q} AS DOUBLE)", float)
    if kind is Kind.DOUBLE:
        return DumpColumn(spec, q, float)
    if kind is Kind.BITS:
        return DumpColumn(spec, f"HEX({q})", _bits_converter(spec.precision or 64))
    if kind is Kind.DATE:
        return DumpColumn(spec, f"CAST({q} AS CHAR)", _date)
    if kind is Kind.DATETIME:
        return DumpColumn(spec, f"CAST({q} AS CHAR)", _datetime_converter(spec.precision))
    if kind is Kind.TIME:
        return DumpColumn(spec, f"CAST({q} AS CHAR)", _time)
    if kind is Kind.TIMESTAMP:
        return DumpColumn(spec, f"CAST(UNIX_TIMESTAMP({q}) AS CHAR)", _timestamp)
    # Text through CAST(... AS CHAR): a VARCHAR for JDBC, where CHAR(n), ENUM and SET
    # columns would be CHAR(n), which Spark pads with spaces on read.
    if kind in (Kind.TEXT, Kind.ENUM):
        return DumpColumn(spec, f"CAST({q} AS CHAR)", str)
    if kind is Kind.JSON:
        return DumpColumn(spec, f"CAST({q} AS CHAR)", _json)
    if kind is Kind.SET:
        return DumpColumn(spec, f"CAST({q} AS CHAR)", _set)
    size = _BINARY_TYPES.get(data_type.lower())
    if size is not None:
        return DumpColumn(spec, f"CAST({q} AS BINARY({size}))", bytes)
    return DumpColumn(spec, q, bytes)  # BYTES, GEOMETRY


def with_precision(spec: ColumnSpec, column_type: str) -> ColumnSpec:
    """information_schema's layout lacks what the binlog's table map has for temporals
    (fractional digits) and BIT widths, which the value conversion needs; they are read
    off COLUMN_TYPE (``datetime(3)``, ``bit(9)``). The Avro schema does not depend on
    them, so the shape stays the fetcher's."""
    match = re.search(r"\((\d+)\)", column_type)
    if match is None or spec.kind not in (Kind.DATETIME, Kind.TIME, Kind.TIMESTAMP, Kind.BITS):
        return spec
    from dataclasses import replace

    return replace(spec, precision=int(match.group(1)))


def select_sql(shape: TableShape, columns: Sequence[DumpColumn], partition_column: str | None
               ) -> str:
    """The derived table Spark reads: ``c0..cN`` in column order, plus the raw partition
    column as ``__part`` so that range predicates can use the primary key index."""
    parts = [f"{c.expression} AS c{i}" for i, c in enumerate(columns)]
    if partition_column is not None:
        parts.append(f"{quote(partition_column)} AS __part")
    table = f"{quote(shape.database)}.{quote(shape.table)}"
    return f"(SELECT {', '.join(parts)} FROM {table}) AS databus_dump"


def partition_column(shape: TableShape) -> str | None:
    """The primary key column if it is a single integer (range partitions), else None
    (one partition: hashing arbitrary keys would make every partition scan the table)."""
    if len(shape.primary_key) != 1:
        return None
    column = shape.columns[shape.primary_key[0]]
    return column.name if column.kind in (Kind.INT, Kind.LONG) else None


@dataclass(frozen=True)
class TableLayout:
    """A table as the fetcher sees it (``shape``: the binlog fetcher's own schema and
    key), how to select each column (``columns``), and the server's row estimate."""

    shape: TableShape
    columns: tuple[DumpColumn, ...]
    rows_estimate: int


class UnmappableTableError(SourceError):
    """A column type the fetcher's mapping knows only from the binlog."""

    retriable = False


def table_layout(cursor: Any, database: str, table: str) -> TableLayout | None:
    """Read ``database.table``'s layout through a DB-API cursor (pymysql); None when the
    table does not exist. ``UnmappableTableError`` when a column type cannot be mapped
    from information_schema (the fetcher's schema could not be reproduced)."""
    where = " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
    cursor.execute(INFORMATION_SCHEMA_COLUMNS + where + " ORDER BY ORDINAL_POSITION",
                   (database, table))
    rows = [row[2:] for row in cursor.fetchall()]
    cursor.execute(INFORMATION_SCHEMA_PRIMARY_KEYS + " AND TABLE_SCHEMA = %s AND"
                   " TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (database, table))
    primary_key = [str(r[2]) for r in cursor.fetchall()]
    cursor.execute("SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s"
                   " AND TABLE_NAME = %s", (database, table))
    found = cursor.fetchone()
    if not rows or found is None:
        return None
    shape = shape_from_information_schema(database, table, rows, primary_key)
    if shape is None:
        raise UnmappableTableError(
            f"table {database}.{table} has a column type the binlog fetcher's mapping does "
            "not know from information_schema; its rows cannot be read with the same schema")
    specs = tuple(with_precision(spec, str(row[2])) for spec, row in zip(shape.columns, rows,
                                                                          strict=True))
    shape = TableShape(shape.database, shape.table, specs, shape.primary_key)
    columns = tuple(dump_column(spec, str(row[1])) for spec, row in zip(specs, rows,
                                                                        strict=True))
    return TableLayout(shape, columns, int(found[0] or 0))
