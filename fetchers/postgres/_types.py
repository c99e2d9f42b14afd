"""PostgreSQL column types -> Avro, and which converter of pgoutput's text values
(``_text_values``) each column takes (pure, except ``load_types``, which reads the
catalog once per type OID).

pgoutput describes a column by its type OID and type modifier (the Relation message) and
sends every non-NULL value as the type's text output (``t``, ``1.50``, ``{1,2}``,
``\\x0102``). ``column_mapping`` gives the column's Avro type, a converter from that
text to a value fastavro writes (``AvroCodec``), and a ``format_type``-like
``sql_type`` for the field's ``sql_type`` attribute. ``docs/postgres-logical-types.md``
has the full table with examples; ``tests/unit/test_pg_logical_types.py`` and
``tests/integration/test_pg_logical_types_server.py`` test every row.

=========================  ===================================  ===========================
PostgreSQL                 Avro (non-null branch)               value
=========================  ===================================  ===========================
smallint, integer          int                                  int
bigint, oid                long                                 int
numeric(p,s)               fixed ``decimal_P_S`` decimal(P,S)   Decimal; NaN: PgValueError
                           (P,S = p,s; s<0: p-s,0; s>p: s,s)
numeric                    string                               exact text; NaN, Infinity
real / double precision    float / double                       float; NaN, +-Infinity, -0
boolean                    boolean                              bool
text, varchar(n), char(n)  string                               as is (char(n) padded)
"char", name
bytea                      bytes                                from hex or escape output
date                       [int date, string]                   date; else the text
                                                                (infinity, BC, 10000+)
time(n)                    [long time-micros, string]           time; ``24:00:00`` as text
timestamp(n)               [long local-timestamp-micros,        naive datetime; else the
                           string]                              text
timestamptz(n)             [long timestamp-micros, string]      aware UTC datetime; else
                                                                the text at UTC (+00)
interval                   string                               ISO 8601, as PostgreSQL's
                                                                iso_8601 IntervalStyle
timetz, uuid, inet, cidr,  string                               the text as is
json, jsonb, money
enum                       string                               the label
domain                     its base type's mapping              as the base type
arrays (any dims)          array of [null, E, array of ...]     nested lists, NULL = None
anything else              string                               the text as is
=========================  ===================================  ===========================

Decisions, in short (the docs say why):

- **Unions with a string branch** carry what the logical type's decoders (fastavro,
  Python's ``date``/``datetime``/``time``) cannot hold: ``infinity``, BC dates, years
  after 9999, ``24:00:00``. The converter returns those as ``("string", text)``:
  fastavro's tuple notation, because its ``date`` branch would try to parse any ``str``.
- **Decimals** are ``fixed`` types named ``decimal_P_S`` (as from the binlog fetcher), so
  that an ALTER of the scale changes the fingerprint. Named types are defined once per
  record: run the record's field types through ``share_named_types`` in field order.
  A ``numeric(p,s)`` column accepts ``NaN``, which no Avro decimal holds: the converter
  raises ``PgValueError`` (declare the column ``numeric`` to capture NaN as text).
- **Arrays**: a column of an array type may hold values of any dimension (1 to 6), so the
  Avro type nests: items are ``["null", E..., array of ["null", E..., ...]]`` six levels
  deep. Lower bounds other than 1 (``[0:1]={1,2}``) are dropped.
- **Enums** are strings: a label added while the fetcher runs must not break it.
- **Session settings**: dates and timestamps must be printed with ``DateStyle`` ISO (the
  server default; ``CONNECTION_OPTIONS`` sets it), intervals in the ``postgres`` (default)
  or ``iso_8601`` style. ``TimeZone``, ``bytea_output`` and ``extra_float_digits`` may
  be anything. ``money``'s text follows ``lc_monetary``: it is kept as text.

Converters return None for None; any other text that is not a valid output of the type
raises ``PgValueError`` (never another exception).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from databus.fetchers.postgres import _transcode as _fast
from databus.fetchers.postgres._text_values import (
    MAX_DIMENSIONS,
    PgValueError,
    as_is,
    bad_value,
    decimal_parser,
    guarded,
    int_parser,
    parse_array,
    parse_bool,
    parse_bytea,
    parse_date,
    parse_double,
    parse_interval,
    parse_numeric_text,
    parse_real,
    parse_time,
    parse_timestamp,
    parse_timestamptz,
)

__all__ = [
    "CONNECTION_OPTIONS",
    "MAX_DIMENSIONS",
    "TYPE_QUERY",
    "ColumnMapping",
    "PgType",
    "PgValueError",
    "column_mapping",
    "decimal_fixed_size",
    "load_types",
    "parse_array",
    "share_named_types",
]

CONNECTION_OPTIONS = "-c DateStyle=ISO -c IntervalStyle=postgres -c extra_float_digits=3"
"""libpq ``options`` for the fetcher's connections (replication and dump): output styles
the converters parse. pgoutput runs the output functions in the walsender, with that
session's settings."""

# -- the catalog ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PgType:
    """One row of pg_type, resolved."""

    oid: int
    name: str
    namespace: str
    kind: str  # typtype: b base, e enum, d domain, c composite, r range, m multirange, p
    element_oid: int  # typelem of a true array type (not int2vector/oidvector), else 0
    base_oid: int  # typbasetype of a domain, else 0
    category: str  # typcategory
    enum_labels: tuple[str, ...] = ()  # in enumsortorder
    base_typmod: int = -1  # typtypmod of a domain (numeric(10,2) of its base), else -1
    delimiter: str = ","  # typdelim: the array delimiter of this type as an element


TYPE_QUERY = (
    "SELECT t.oid::bigint, t.typname::text, n.nspname::text, t.typtype::text, "
    "CASE WHEN t.typcategory = 'A' AND t.typlen = -1 AND t.typstorage <> 'p' "
    "THEN t.typelem ELSE 0::oid END::bigint, "
    "CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE 0::oid END::bigint, "
    "t.typcategory::text, "
    "ARRAY(SELECT e.enumlabel::text FROM pg_enum e WHERE e.enumtypid = t.oid "
    "ORDER BY e.enumsortorder), "
    "t.typtypmod, t.typdelim::text "
    "FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
    "WHERE t.oid = ANY(%s::oid[])"
)
"""What ``PgType`` needs of each type OID in a list (one parameter: the OIDs)."""


class _Cursor(Protocol):
    def execute(self, query: str, vars: Any = ..., /) -> Any: ...

    def fetchall(self) -> list[tuple[Any, ...]]: ...


def load_types(cursor: _Cursor, oids: Iterable[int]) -> dict[int, PgType]:
    """The ``PgType`` of each OID, and of the element and base types they refer to
    (recursively), read with a psycopg2 cursor. OIDs the catalog does not have are
    left out (``column_mapping`` then maps them to text)."""
    types: dict[int, PgType] = {}
    wanted = {int(o) for o in oids}
    asked: set[int] = set()
    while wanted:
        asked |= wanted
        cursor.execute(TYPE_QUERY, (sorted(wanted),))
        for row in cursor.fetchall():
            oid, name, nsp, kind, elem, base, cat, labels, typmod, delim = row
            types[int(oid)] = PgType(
                oid=int(oid), name=str(name), namespace=str(nsp), kind=str(kind),
                element_oid=int(elem), base_oid=int(base), category=str(cat),
                enum_labels=tuple(labels or ()), base_typmod=int(typmod),
                delimiter=str(delim) if delim else ",")
        wanted = {o for t in types.values() for o in (t.element_oid, t.base_oid)
                  if o and o not in asked}
    return types


# -- built-in types -----------------------------------------------------------------

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, MONEY, CIDR, INET = 114, 700, 701, 790, 650, 869
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ = 1042, 1043, 1082, 1083, 1114, 1184
INTERVAL, TIMETZ, BIT, VARBIT, NUMERIC, UUID, JSONB = 1186, 1266, 1560, 1562, 1700, 2950, 3802

# format_type()'s SQL names of built-in types (the others print their typname).
_SQL_NAMES = {
    BOOL: "boolean", CHAR: '"char"', INT8: "bigint", INT2: "smallint", INT4: "integer",
    FLOAT4: "real", FLOAT8: "double precision", BPCHAR: "character",
    VARCHAR: "character varying", TIME: "time without time zone",
    TIMESTAMP: "timestamp without time zone", TIMESTAMPTZ: "timestamp with time zone",
    TIMETZ: "time with time zone", BIT: "bit", VARBIT: "bit varying", NUMERIC: "numeric",
    INTERVAL: "interval",
}
# typnames of the built-ins, for a column_mapping without a loaded PgType.
_BUILTIN_NAMES = {
    BYTEA: "bytea", NAME: "name", TEXT: "text", OID: "oid", JSON: "json", MONEY: "money",
    CIDR: "cidr", INET: "inet", DATE: "date", UUID: "uuid", JSONB: "jsonb",
}

_VARHDRSZ = 4
_PLAIN_IDENT = re.compile(r"[a-z_][a-z0-9_$]*\Z")

# interval typmods: INTERVAL_MASK bits of datetime.h and intervaltypmodout's spellings.
_YEAR, _MONTH, _DAY, _HOUR, _MINUTE, _SECOND = 4, 2, 8, 1024, 2048, 4096
_INTERVAL_FIELDS = {
    _YEAR: " year", _MONTH: " month", _DAY: " day", _HOUR: " hour", _MINUTE: " minute",
    _SECOND: " second", _YEAR | _MONTH: " year to month", _DAY | _HOUR: " day to hour",
    _DAY | _HOUR | _MINUTE: " day to minute",
    _DAY | _HOUR | _MINUTE | _SECOND: " day to second",
    _HOUR | _MINUTE: " hour to minute", _HOUR | _MINUTE | _SECOND: " hour to second",
    _MINUTE | _SECOND: " minute to second", 0x7FFF: "",
}


def _quote_ident(name: str) -> str:
    return name if _PLAIN_IDENT.match(name) else '"' + name.replace('"', '""') + '"'


def _type_name(oid: int, pg: PgType | None) -> str:
    if oid in _SQL_NAMES:
        return _SQL_NAMES[oid]
    if pg is None:
        return _BUILTIN_NAMES.get(oid, f"oid {oid}")
    if pg.namespace == "pg_catalog":
        return _quote_ident(pg.name)
    return f"{_quote_ident(pg.namespace)}.{_quote_ident(pg.name)}"


def _typmod_suffix(oid: int, typmod: int) -> str:
    """What format_type() appends to a built-in type's name for a type modifier."""
    if typmod < 0:
        return ""
    if oid in (BPCHAR, VARCHAR):
        return f"({typmod - _VARHDRSZ})" if typmod >= _VARHDRSZ else ""
    if oid == NUMERIC:
        if typmod < _VARHDRSZ:
            return ""
        p, s = _numeric_typmod(typmod)
        return f"({p},{s})"
    if oid in (BIT, VARBIT, TIME, TIMETZ, TIMESTAMP, TIMESTAMPTZ):
        return f"({typmod})"
    if oid == INTERVAL:
        fields = _INTERVAL_FIELDS.get((typmod >> 16) & 0x7FFF, "")
        precision = typmod & 0xFFFF
        return fields if precision == 0xFFFF else f"{fields}({precision})"
    return ""


def _sql_type(oid: int, typmod: int, pg: PgType | None) -> str:
    if oid == BPCHAR and typmod < _VARHDRSZ:
        return "bpchar"  # character without a length: format_type says bpchar
    name = _type_name(oid, pg)
    suffix = _typmod_suffix(oid, typmod)
    if not suffix:
        return name
    if oid in (TIME, TIMETZ, TIMESTAMP, TIMESTAMPTZ):  # time(3) with time zone
        return name.replace(" ", f"({typmod}) ", 1)
    return f"{name}{suffix}"


def _numeric_typmod(typmod: int) -> tuple[int, int]:
    """(precision, scale) of numeric(p,s); PostgreSQL 15 allows -1000 <= s <= 1000."""
    t = typmod - _VARHDRSZ
    return (t >> 16) & 0xFFFF, ((t & 0x7FF) ^ 1024) - 1024


# -- the mapping ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColumnMapping:
    """How one column travels. ``avro``: the Avro type of the field without null, JSON
    form; a list is a union (``["null", *avro]`` when nullable). ``convert``: pgoutput
    text -> the value for ``avro`` (None -> None). ``sql_type``: format_type()-like.
    ``fast_code``: the column's code in the compiled fast path (``_transcode``; 0: none),
    ``fast_args``: a decimal's (scale, precision - scale, fixed size)."""

    avro: object
    convert: Callable[[str], Any]
    sql_type: str
    fast_code: int = 0
    fast_args: tuple[int, int, int] = (0, 0, 0)


def decimal_fixed_size(precision: int) -> int:
    """Bytes of a two's complement big-endian int that holds any ``precision`` digits
    (as the binlog fetcher sizes its ``decimal_p_s``)."""
    return _fixed_size(precision)


@functools.cache
def _fixed_size(precision: int) -> int:
    limit = 10**precision - 1
    size = 1
    while (1 << (8 * size - 1)) - 1 < limit:
        size += 1
    return size


def _decimal_avro(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "fixed", "name": f"decimal_{precision}_{scale}",
            "size": _fixed_size(precision), "logicalType": "decimal",
            "precision": precision, "scale": scale}


def _array_avro(element: object) -> dict[str, Any]:
    branches = element if isinstance(element, list) else [element]
    level: dict[str, Any] = {"type": "array", "items": ["null", *branches]}
    for _ in range(MAX_DIMENSIONS - 1):
        level = {"type": "array", "items": ["null", *branches, level]}
    # A decimal element is defined at the outermost level, referred to by name below.
    shared = share_named_types([level])[0]
    assert isinstance(shared, dict)
    return shared


def _has_array(avro: object) -> bool:
    branches = avro if isinstance(avro, list) else [avro]
    return any(isinstance(b, dict) and b.get("type") == "array" for b in branches)


def share_named_types(types: Sequence[object]) -> list[object]:
    """Avro types of a record's fields, in field order, with each named type (the
    ``decimal_P_S`` fixeds) defined where it first appears and referred to by name after
    that: Avro forbids defining a name twice in one schema."""
    defined: set[str] = set()

    def walk(avro: object) -> object:
        if isinstance(avro, list):
            return [walk(b) for b in avro]
        if not isinstance(avro, dict):
            return avro
        kind = avro.get("type")
        if kind in ("fixed", "enum", "record") and isinstance(avro.get("name"), str):
            name = avro["name"]
            if name in defined:
                return name
            defined.add(name)
        out = dict(avro)
        if kind == "array" and "items" in out:
            out["items"] = walk(out["items"])
        elif kind == "map" and "values" in out:
            out["values"] = walk(out["values"])
        elif kind == "record" and isinstance(out.get("fields"), list):
            out["fields"] = [dict(f, type=walk(f["type"])) for f in out["fields"]]
        return out

    return [walk(t) for t in types]


# -- column_mapping --------------------------------------------------------------

_DATE_AVRO: list[object] = [{"type": "int", "logicalType": "date"}, "string"]
_TIME_AVRO: list[object] = [{"type": "long", "logicalType": "time-micros"}, "string"]
_TIMESTAMP_AVRO: list[object] = [
    {"type": "long", "logicalType": "local-timestamp-micros"}, "string"]
_TIMESTAMPTZ_AVRO: list[object] = [{"type": "long", "logicalType": "timestamp-micros"},
                                   "string"]


_INT_RANGES = {INT2: (-(2**15), 2**15 - 1), INT4: (-(2**31), 2**31 - 1),
               INT8: (-(2**63), 2**63 - 1), OID: (0, 2**32 - 1)}
_FAST_INTS = {INT2: _fast.INT2, INT4: _fast.INT4, INT8: _fast.INT8, OID: _fast.OID}


def _string(sql_type: str) -> ColumnMapping:
    return ColumnMapping("string", as_is, sql_type, _fast.STRING)


def _builtin(oid: int, typmod: int, sql_type: str) -> ColumnMapping | None:
    """The mapping of a built-in scalar type, None for one that maps to its text."""
    parse: Callable[[str], Any]
    avro: object
    fast, args = 0, (0, 0, 0)
    if oid in _INT_RANGES:
        avro, parse = ("long" if oid in (INT8, OID) else "int"), int_parser(*_INT_RANGES[oid])
        fast = _FAST_INTS[oid]
    elif oid == NUMERIC:
        if typmod < _VARHDRSZ:
            avro, parse, fast = "string", parse_numeric_text, _fast.NUMERIC_TEXT
        else:
            p, s = _numeric_typmod(typmod)
            # Avro wants 0 <= scale <= precision: numeric(5,-2) holds 7-digit integers,
            # numeric(2,5) 0.000dd (the replicator widens Oracle's NUMBER alike).
            p, s = (p - s, 0) if s < 0 else (max(p, s), s)
            avro, parse = _decimal_avro(p, s), decimal_parser(sql_type, p, s)
            fast, args = _fast.DECIMAL, (s, p - s, _fixed_size(p))
    elif oid == FLOAT4:
        avro, parse, fast = "float", parse_real, _fast.FLOAT4
    elif oid == FLOAT8:
        avro, parse, fast = "double", parse_double, _fast.FLOAT8
    elif oid == BOOL:
        avro, parse, fast = "boolean", parse_bool, _fast.BOOLEAN
    elif oid == BYTEA:
        avro, parse, fast = "bytes", parse_bytea, _fast.BYTES
    elif oid == DATE:
        avro, parse, fast = list(_DATE_AVRO), parse_date, _fast.DATE
    elif oid == TIME:
        avro, parse, fast = list(_TIME_AVRO), parse_time, _fast.TIME
    elif oid == TIMESTAMP:
        avro, parse, fast = list(_TIMESTAMP_AVRO), parse_timestamp, _fast.TIMESTAMP
    elif oid == TIMESTAMPTZ:
        avro, parse, fast = list(_TIMESTAMPTZ_AVRO), parse_timestamptz, _fast.TIMESTAMPTZ
    elif oid == INTERVAL:
        avro, parse = "string", parse_interval
    else:
        return None
    return ColumnMapping(avro, guarded(sql_type, parse), sql_type, fast, args)


def column_mapping(oid: int, type_modifier: int, types: Mapping[int, PgType]
                   ) -> ColumnMapping:
    """The mapping of a column of type ``oid`` with ``type_modifier`` (as pgoutput's
    Relation message gives them; -1: none). ``types``: ``load_types`` of the table's
    column types (built-in scalar types need not be in it). A domain maps as its base
    type (its own type modifier when the column has none), an array type as nested
    arrays of its element type; anything else not in the table maps to its text."""
    return _mapping(oid, type_modifier, types, 0)


def _mapping(oid: int, typmod: int, types: Mapping[int, PgType], depth: int
             ) -> ColumnMapping:
    pg = types.get(oid)
    if pg is not None and pg.kind == "d" and pg.base_oid and depth < 32:
        return _mapping(pg.base_oid, typmod if typmod >= 0 else pg.base_typmod, types,
                        depth + 1)
    if pg is not None and pg.element_oid and depth < 32:
        element = _mapping(pg.element_oid, typmod, types, depth + 1)
        sql_type = f"{element.sql_type}[]"
        if _has_array(element.avro):  # an array of a domain over an array type
            return _string(sql_type)
        elem_type = types.get(pg.element_oid)
        delim = elem_type.delimiter if elem_type is not None else ","
        convert_element = element.convert

        def parse(text: str) -> Any:
            try:
                return parse_array(text, convert_element, delim)
            except PgValueError as exc:
                raise bad_value(sql_type, text, f"an element: {exc.message}") from None

        return ColumnMapping(_array_avro(element.avro), guarded(sql_type, parse),
                             sql_type)
    sql_type = _sql_type(oid, typmod, pg)
    if pg is None or pg.namespace == "pg_catalog":
        mapping = _builtin(oid, typmod, sql_type)
        if mapping is not None:
            return mapping
    return _string(sql_type)
