"""Table layouts and their Avro schemas, from the binlog and from information_schema,
and the classification of binlog statements (DDL tracking).

The binlog is the authority: every rows event is preceded by a table map event that,
with ``binlog_row_metadata=FULL``, names the columns and gives their types, signedness,
nullability, charsets, ENUM/SET labels and primary key *as they were when the row was
written*. A layout read there (``TableShape``) decodes exactly the rows that follow it,
also when the fetcher replays an old binlog across ALTERs. information_schema only gives
today's layout: the fetcher uses it at start-up to register a schema for every captured
table before any row arrives (so ``/v1/sources`` lists them), and both paths are built
to give the same Avro schema, hence the same fingerprint.

Avro names: a column name becomes a valid Avro name by replacing every character
outside ``[A-Za-z0-9_]`` with ``_`` and prefixing ``_`` when it starts with a digit (or
is empty); if two columns then collide, later ones get ``_2``, ``_3``, ... in column
order. Such a field keeps its SQL name in a ``sql_name`` attribute. The record is named
after the table, in a namespace named after the database, sanitised the same way.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE

from databus.errors import SourceError
from databus.fetchers.mysql._binlog_values import python_codec
from databus.fetchers.mysql._errors import SourceMisconfiguredError
from databus.fetchers.mysql._types import ColumnSpec, Kind, avro_field_type
from databus.schemas import Schema, avro_name, avro_names

__all__ = [
    "QueryKind",
    "TableShape",
    "avro_name",
    "avro_names",
    "classify_query",
    "dml_target",
    "shape_from_information_schema",
    "shape_from_table_map",
]

_INVALID_RE = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True, slots=True)
class TableShape:
    """A table's layout: its columns and primary key (column indexes, in key order)."""

    database: str
    table: str
    columns: tuple[ColumnSpec, ...]
    primary_key: tuple[int, ...]

    @property
    def source_name(self) -> str:
        """The logical source name, ``database.table``."""
        return f"{self.database}.{self.table}"

    def schema_json(self) -> dict[str, Any]:
        namespace = avro_name(self.database)
        defined: set[str] = set()
        fields: list[dict[str, Any]] = []
        for column, name in zip(self.columns, avro_names([c.name for c in self.columns]),
                                strict=True):
            field: dict[str, Any] = {"name": name, "type": avro_field_type(column, namespace,
                                                                           defined)}
            if column.nullable:
                field["default"] = None
            if name != column.name:
                field["sql_name"] = column.name
            fields.append(field)
        return {
            "type": "record",
            "name": avro_name(self.table),
            "namespace": namespace,
            "doc": f"Row of MySQL table {self.source_name} (databus binlog fetcher)",
            "fields": fields,
            # The primary key's columns (SQL names), for consumers that keep a copy of
            # the table (the replicator); not in Avro's canonical form, so not in the
            # fingerprint: a schema first registered without it keeps its old JSON.
            "key": [self.columns[i].name for i in self.primary_key],
        }

    def avro_schema(self) -> Schema:
        return Schema(self.schema_json())

    def schema_signature(self) -> tuple[Any, ...]:
        """What the Avro schema depends on: equal signatures give equal schemas."""
        return (
            self.database,
            self.table,
            tuple((c.name, c.kind, c.nullable, c.precision if c.kind is Kind.DECIMAL else 0,
                   c.scale) for c in self.columns),
        )


# -- from the binlog's table map event ------------------------------------------------


_INT_TYPES = {FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.INT24}
_TEXT_TYPES = {FIELD_TYPE.STRING, FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.BLOB}


def _binlog_column(col: Any, nullable: bool) -> ColumnSpec:
    """A ColumnSpec from the library's ``Column`` of a table map event."""
    t: int = col.type
    name: str = col.name
    unsigned = bool(col.unsigned)
    base = ColumnSpec(name=name, kind=Kind.BYTES, nullable=nullable, type_code=t,
                      unsigned=unsigned)
    if t in _INT_TYPES:
        return replace(base, kind=Kind.INT)
    if t == FIELD_TYPE.LONG:
        return replace(base, kind=Kind.LONG if unsigned else Kind.INT)
    if t == FIELD_TYPE.LONGLONG:
        return replace(base, kind=Kind.UINT64 if unsigned else Kind.LONG)
    if t == FIELD_TYPE.FLOAT:
        return replace(base, kind=Kind.FLOAT)
    if t == FIELD_TYPE.DOUBLE:
        return replace(base, kind=Kind.DOUBLE)
    if t == FIELD_TYPE.NEWDECIMAL:
        return replace(base, kind=Kind.DECIMAL, precision=col.precision, scale=col.decimals)
    if t == FIELD_TYPE.BIT:
        kind = Kind.BOOL if col.bits == 1 else Kind.BITS
        return replace(base, kind=kind, precision=col.bits)
    if t == FIELD_TYPE.YEAR:
        return replace(base, kind=Kind.YEAR)
    if t == FIELD_TYPE.DATE:
        return replace(base, kind=Kind.DATE)
    if t in (FIELD_TYPE.TIME, FIELD_TYPE.TIME2):
        return replace(base, kind=Kind.TIME, precision=getattr(col, "fsp", 0))
    if t in (FIELD_TYPE.DATETIME, FIELD_TYPE.DATETIME2):
        return replace(base, kind=Kind.DATETIME, precision=getattr(col, "fsp", 0))
    if t in (FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2):
        return replace(base, kind=Kind.TIMESTAMP, precision=getattr(col, "fsp", 0))
    if t == FIELD_TYPE.ENUM:
        return replace(base, kind=Kind.ENUM, length_size=col.size,
                          labels=tuple(col.enum_values or ("",)))
    if t == FIELD_TYPE.SET:
        return replace(base, kind=Kind.SET, length_size=col.size,
                          labels=tuple(col.set_values or ()))
    if t == FIELD_TYPE.JSON:
        return replace(base, kind=Kind.JSON, length_size=col.length_size)
    if t == FIELD_TYPE.GEOMETRY:
        return replace(base, kind=Kind.GEOMETRY, length_size=col.length_size)
    if t in _TEXT_TYPES:
        charset: str | None = col.character_set_name
        # Without a charset the column cannot be told from binary: keep its bytes.
        binary = charset is None or charset == "binary"
        if t == FIELD_TYPE.BLOB:
            size = col.length_size
            fixed = 0
        else:
            size = 1 if col.max_length <= 255 else 2
            fixed = col.max_length if t == FIELD_TYPE.STRING and binary else 0
        return replace(
            base,
            kind=Kind.BYTES if binary else Kind.TEXT,
            length_size=size,
            fixed_length=fixed,
            codec=None if binary else python_codec(charset),
        )
    raise SourceError(
        f"column {name!r}: binlog field type {t} is not supported "
        "(a pre-MySQL-5.0 DECIMAL or an unknown type)", retriable=False
    )


def shape_from_table_map(event: Any) -> TableShape:
    """The layout a ``TableMapEvent`` describes (needs binlog_row_metadata=FULL)."""
    meta = event.optional_metadata
    names = meta.column_name_list
    if len(names) != len(event.columns):
        raise SourceMisconfiguredError(
            f"the binlog does not name the columns of {event.schema}.{event.table}: the "
            "server must run with binlog_row_metadata=FULL (it was changed at runtime?)"
        )
    nulls: bytes = event.null_bitmask
    columns = tuple(
        _binlog_column(col, bool(nulls[i >> 3] >> (i & 7) & 1))
        for i, col in enumerate(event.columns)
    )
    if meta.simple_primary_key_list:
        primary_key = tuple(int(i) for i in meta.simple_primary_key_list)
    else:
        # A key on a prefix of a column (PRIMARY KEY (name(10))): the whole column is
        # unique too, so it serves as the key. The library does not mark these.
        primary_key = tuple(int(i) for i in meta.primary_keys_with_prefix)
    return TableShape(event.schema, event.table, columns, primary_key)


# -- from information_schema ------------------------------------------------------------

_IS_KINDS: Mapping[str, Kind] = {
    "tinyint": Kind.INT, "smallint": Kind.INT, "mediumint": Kind.INT,
    "float": Kind.FLOAT, "double": Kind.DOUBLE, "real": Kind.DOUBLE,
    "decimal": Kind.DECIMAL, "numeric": Kind.DECIMAL, "year": Kind.YEAR, "date": Kind.DATE,
    "time": Kind.TIME, "datetime": Kind.DATETIME, "timestamp": Kind.TIMESTAMP,
    "char": Kind.TEXT, "varchar": Kind.TEXT, "tinytext": Kind.TEXT, "text": Kind.TEXT,
    "mediumtext": Kind.TEXT, "longtext": Kind.TEXT,
    "binary": Kind.BYTES, "varbinary": Kind.BYTES, "tinyblob": Kind.BYTES, "blob": Kind.BYTES,
    "mediumblob": Kind.BYTES, "longblob": Kind.BYTES,
    "inet6": Kind.BYTES, "inet4": Kind.BYTES, "uuid": Kind.BYTES,
    "enum": Kind.ENUM, "set": Kind.SET, "json": Kind.JSON,
    "geometry": Kind.GEOMETRY, "point": Kind.GEOMETRY, "linestring": Kind.GEOMETRY,
    "polygon": Kind.GEOMETRY, "multipoint": Kind.GEOMETRY, "multilinestring": Kind.GEOMETRY,
    "multipolygon": Kind.GEOMETRY, "geometrycollection": Kind.GEOMETRY,
}

INFORMATION_SCHEMA_COLUMNS = (
    "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, "
    "NUMERIC_PRECISION, NUMERIC_SCALE, CHARACTER_SET_NAME "
    "FROM information_schema.COLUMNS"
)
INFORMATION_SCHEMA_PRIMARY_KEYS = (
    "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
    "WHERE CONSTRAINT_NAME = 'PRIMARY'"
)


def _is_column(row: Sequence[Any]) -> ColumnSpec | None:
    """A ColumnSpec (schema fields only) from an information_schema.COLUMNS row, or
    None for a type this mapping does not know."""
    name, data_type, column_type, is_nullable, precision, scale, charset = row
    data_type = str(data_type).lower()
    unsigned = "unsigned" in str(column_type).lower()
    nullable = str(is_nullable).upper() == "YES"
    if data_type == "int":
        kind = Kind.LONG if unsigned else Kind.INT
    elif data_type == "bigint":
        kind = Kind.UINT64 if unsigned else Kind.LONG
    elif data_type == "bit":
        kind = Kind.BOOL if int(precision or 1) == 1 else Kind.BITS
    else:
        found = _IS_KINDS.get(data_type)
        if found is None:
            return None
        kind = found
        # A CHAR/VARCHAR/TEXT with the binary charset (CHAR(3) BINARY is not that).
        if kind is Kind.TEXT and charset is None:
            kind = Kind.BYTES
    if kind is Kind.DECIMAL:
        return ColumnSpec(name=str(name), kind=kind, nullable=nullable, unsigned=unsigned,
                          precision=int(precision), scale=int(scale or 0))
    return ColumnSpec(name=str(name), kind=kind, nullable=nullable, unsigned=unsigned)


def shape_from_information_schema(
    database: str, table: str, rows: Iterable[Sequence[Any]], primary_key: Sequence[str]
) -> TableShape | None:
    """The layout of ``database.table`` from its information_schema.COLUMNS rows
    (``COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION,
    NUMERIC_SCALE, CHARACTER_SET_NAME``, in ordinal order) and its primary key column
    names in key order. None when a column has a type this mapping does not know:
    the binlog will tell when a row arrives."""
    columns = []
    for row in rows:
        column = _is_column(row)
        if column is None:
            return None
        columns.append(column)
    if not columns:
        return None
    index = {c.name: i for i, c in enumerate(columns)}
    try:
        pk = tuple(index[name] for name in primary_key)
    except KeyError:
        return None
    return TableShape(database, table, tuple(columns), pk)


# -- statements in the binlog ---------------------------------------------------------


class QueryKind(enum.Enum):
    BEGIN = "begin"
    COMMIT = "commit"
    ROLLBACK = "rollback"
    SAVEPOINT = "savepoint"  # SAVEPOINT, ROLLBACK TO, RELEASE SAVEPOINT: no boundary
    XA = "xa"
    DML = "dml"  # a row change logged as a statement (binlog_format was not ROW)
    OTHER = "other"  # DDL, GRANT, ...: table layouts may have changed


_COMMENT_RE = re.compile(r"\A(?:\s+|/\*.*?\*/|(?:--|#)[^\n]*(?:\n|\Z))*", re.S)
_WORD_RE = re.compile(r"[A-Za-z]+")
_NAME = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+)"
_QUALIFIED = rf"({_NAME})(?:\s*\.\s*({_NAME}))?"
_DML_TARGET_RES = (
    re.compile(rf"(?:INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*"
               rf"(?:INTO\s+)?{_QUALIFIED}", re.I),
    re.compile(rf"UPDATE\s+(?:(?:LOW_PRIORITY|IGNORE)\s+)*{_QUALIFIED}", re.I),
    re.compile(rf"DELETE\s+(?:(?:LOW_PRIORITY|QUICK|IGNORE)\s+)*FROM\s+{_QUALIFIED}", re.I),
    re.compile(rf"LOAD\s+DATA\s+.*?\s+INTO\s+TABLE\s+{_QUALIFIED}", re.I | re.S),
)


def _strip(query: str) -> str:
    return query[_COMMENT_RE.match(query).end():]  # type: ignore[union-attr]


def classify_query(query: str) -> QueryKind:
    """What a statement in the binlog means for transaction boundaries and layouts."""
    text = _strip(query)
    match = _WORD_RE.match(text)
    if match is None:
        return QueryKind.OTHER
    word = match.group(0).upper()
    rest = text[match.end():].lstrip().upper()
    if word == "BEGIN" or (word == "START" and rest.startswith("TRANSACTION")):
        return QueryKind.BEGIN
    if word == "COMMIT":
        return QueryKind.COMMIT
    if word == "ROLLBACK":
        return QueryKind.SAVEPOINT if rest.startswith("TO") else QueryKind.ROLLBACK
    if word in ("SAVEPOINT", "RELEASE"):
        return QueryKind.SAVEPOINT
    if word == "XA":
        return QueryKind.XA
    if word in ("INSERT", "REPLACE", "UPDATE", "DELETE", "LOAD"):
        return QueryKind.DML
    return QueryKind.OTHER


def _unquote(name: str) -> str:
    if name.startswith("`"):
        return name[1:-1].replace("``", "`")
    return name


_TRUNCATE_RE = re.compile(rf"TRUNCATE\s+(?:TABLE\s+)?{_QUALIFIED}\s*(?:;\s*)?\Z", re.I)


def truncate_target(query: str, default_database: str) -> tuple[str, str] | None:
    """``(database, table)`` of a ``TRUNCATE [TABLE] t`` (it deletes every row of the
    table with no row event), None for any other statement."""
    match = _TRUNCATE_RE.match(_strip(query))
    if match is None:
        return None
    first, second = match.group(1), match.group(2)
    if second is None:
        return (default_database, _unquote(first)) if default_database else None
    return _unquote(first), _unquote(second)


def dml_target(query: str, default_database: str) -> tuple[str, str] | None:
    """``(database, table)`` a statement-format row change writes to, when it can be
    read off the statement's start; None otherwise (multi-table forms, odd syntax)."""
    text = _strip(query)
    for pattern in _DML_TARGET_RES:
        match = pattern.match(text)
        if match is not None:
            first, second = match.group(1), match.group(2)
            if second is None:
                return (default_database, _unquote(first)) if default_database else None
            return _unquote(first), _unquote(second)
    return None
