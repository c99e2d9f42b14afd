"""The fast path of a captured row: a pgoutput Insert (or an Update without an old
tuple) straight to its event key and Avro body, with no Python value per column.

The reference is the fetcher's general path, ``decode`` (``_pgoutput``) then
``TableCodec.convert`` (the converters of ``_text_values``) then ``TableCodec.encode``
(fastavro). ``transcode_change(payload, plan)`` gives exactly what that path gives,
``(key, avro body)``, or None when it *declines*; the caller then takes the general path,
which produces the event or raises the error. So the fast path can only be faster, never
different: a value outside its grammar, an unchanged TOAST value, an old tuple, a NULL in
a NOT NULL column, bytes after the message, anything odd is declined, not judged.

Two twins with one signature, as ``databus.batch``: ``_transcode_native`` (Cython, built
by the package's build) and ``_transcode_python`` (the reference twin, which runs the
general path itself). ``DATABUS_PURE_PYTHON=1`` forces the twin. The tests run both on
the same inputs (tests/unit/test_pg_transcode.py) and on values from a real server.

What the native twin reads (pgoutput, protocol 1; integers big-endian)::

    'I' oid u32 'N' TupleData                 an insert
    'U' oid u32 'N' TupleData                 an update that sent no old key or row
    TupleData   ncols u16 | ncols x ('n' | 't' len i32 | len bytes of text)

and what it writes per column (Avro binary, as fastavro writes the general path's
values; a nullable column's field is ``["null", ...]``, branch 0 null, 1 the value)::

    code         PostgreSQL            text accepted                    Avro written
    -----------  --------------------  -------------------------------  ---------------------
    INT2/4/8     smallint/int/bigint   -?[0-9]{1,19}, in range          int/long zigzag
    OID          oid                   -?[0-9]{1,19}, 0..2^32-1         long zigzag
    FLOAT4/8     real/double           -?(digits[.digits]|.digits)      float/double LE
                                       [e[+-]digits]; not NaN/Infinity
    BOOLEAN      boolean               t | f                            one byte
    STRING       text, varchar, uuid,  any valid UTF-8                  length + bytes
                 json, enum, ...
    NUMERIC_TEXT numeric               -?[0-9]+[.[0-9]+] | NaN |        length + bytes
                                       Infinity | -Infinity
    DECIMAL      numeric(p<=18, s)     -?[0-9]+[.[0-9]+] that fits,     fixed(size), two's
                                       not a negative zero              complement
    BYTES        bytea                 \\x + hex digits (hex output)    length + bytes
    DATE         date                  YYYY-MM-DD, year 0001..9999      union 0, int days
    TIME         time                  HH:MM:SS[.f{1,6}], HH < 24       union 0, long µs
    TIMESTAMP    timestamp             YYYY-MM-DD HH:MM:SS[.f{1,6}]     union 0, long µs
    TIMESTAMPTZ  timestamptz           ... [+-]HH[:MM[:SS]], in         union 0, long µs UTC
                                       0001..9999 at UTC

A table any of whose columns has another type (interval, arrays, time with time zone
decoded as text is STRING, ...) has no plan: its rows take the general path.

A dump chunk (``_dump_copy``) is read as ``COPY (SELECT ...) TO STDOUT`` in text format,
whose values are the same text output pgoutput sends, escaped. ``transcode_copy_rows(data,
codec[, row_type])`` turns a chunk's bytes into ``(key, avro body)`` (or a ``DumpRow``)
per row and the last row's key
columns as text (the dump's cursor), again exactly as the general path (``reference_row``:
``TableCodec.convert`` then ``key`` and ``encode``, what the dump did with a SELECT's
text values) gives them; the native twin runs the grammar above on each unescaped value
and hands a row it declines (or every row of a table without a plan) to the general
path::

    data    row*            a row: field ('\\t' field)* '\\n', one field per column
    field   '\\N'            NULL (the whole field)
          | byte*           '\\' escapes the next byte: \\b \\f \\n \\r \\t \\v, \\ooo
                            (octal, & 0xFF), \\xh[h] (hex), any other byte itself
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from databus.batch import load_compiled
from databus.event import Key
from databus.fetchers.postgres import _transcode_python

if TYPE_CHECKING:
    from databus.fetchers.postgres._changes import TableCodec

__all__ = ["IMPLEMENTATION", "RowPlan", "row_plan", "transcode_change",
           "transcode_copy_rows", "twin"]

# Column codes (the low 5 bits); the flags say how the value's field is wrapped.
INT2, INT4, INT8, OID, FLOAT4, FLOAT8, BOOLEAN, STRING = 1, 2, 3, 4, 5, 6, 7, 8
NUMERIC_TEXT, DECIMAL, BYTES, DATE, TIME, TIMESTAMP, TIMESTAMPTZ = 9, 10, 11, 12, 13, 14, 15
NULLABLE = 0x40  # field ["null", T...]: null is branch 0, a value branch 1
UNION = 0x20  # field [T, "string"] (not nullable): a value is branch 0
_KEY_CODES = frozenset({INT2, INT4, INT8, OID, STRING})  # keys built without conversion
_MAX_DECIMAL_PRECISION = 18  # the unscaled value fits an int64


@dataclass(frozen=True, slots=True)
class RowPlan:
    """One table version's columns for the fast path. ``codes``: a byte per column
    (code | flags); ``scales``, ``int_digits``, ``sizes``: a DECIMAL column's scale,
    precision - scale and fixed size (0 elsewhere); ``key_positions``: the key columns,
    in key order; ``codec``: the general path's codec, which the reference twin runs;
    ``native``: the compiled twin's prepared form (None without it)."""

    codes: bytes
    scales: tuple[int, ...]
    int_digits: tuple[int, ...]
    sizes: tuple[int, ...]
    key_positions: tuple[int, ...]
    codec: TableCodec
    native: Any = None


def row_plan(codec: TableCodec) -> RowPlan | None:
    """The plan of ``codec``'s table version, or None when a column or the key has a
    type the fast path does not cover (its rows then take the general path)."""
    key = set(codec.key_positions)
    if not key:
        return None
    not_null = set(codec.required_positions)
    if not key <= not_null:
        return None  # a nullable key column (REPLICA IDENTITY FULL without a primary key)
    codes = bytearray()
    scales: list[int] = []
    int_digits: list[int] = []
    sizes: list[int] = []
    for i, mapping in enumerate(codec.info.mappings):
        code = mapping.fast_code
        if code == 0 or (i in key and code not in _KEY_CODES):
            return None
        scale, integer, size = mapping.fast_args
        if code == DECIMAL and (scale < 0 or integer < 0 or not 1 <= size <= 8
                                or scale + integer > _MAX_DECIMAL_PRECISION):
            return None
        union = isinstance(mapping.avro, list)
        codes.append(code | (0 if i in not_null else NULLABLE)
                     | (UNION if union and i in not_null else 0))
        scales.append(scale)
        int_digits.append(integer)
        sizes.append(size)
    keys = tuple(codec.key_positions)
    native = None
    if _native is not None:
        try:
            native = _native.prepare(bytes(codes), tuple(scales), tuple(int_digits),
                                     tuple(sizes), keys)
        except ValueError:  # beyond PostgreSQL's own limits (columns, key columns)
            return None
    return RowPlan(bytes(codes), tuple(scales), tuple(int_digits), tuple(sizes), keys,
                   codec, native)


# No compiler at install: databus.batch has said so once.
_native, _ = load_compiled("databus.fetchers.postgres._transcode_native")
_impl = _native if _native is not None else _transcode_python
IMPLEMENTATION: str = _impl.IMPLEMENTATION
transcode_change: Callable[[bytes, RowPlan], tuple[Key, bytes] | None] = (
    _impl.transcode_change)
# (data, codec[, row_type]) -> ([(key, body) or row_type(key, body, fingerprint)], cursor)
transcode_copy_rows: Callable[..., tuple[list[Any], list[str | None] | None]] = (
    _impl.transcode_copy_rows)


def twin(name: str) -> ModuleType:
    """The module of one twin: "python" always, "native" if it was built."""
    if name == "python":
        return _transcode_python
    if name == "native":
        from databus.fetchers.postgres import (  # type: ignore[attr-defined]
            _transcode_native,
        )

        return _transcode_native  # type: ignore[no-any-return]
    raise ValueError(f"no twin named {name!r}")
