"""A dump chunk's rows to events' keys and Avro bodies: the compiled twin
(``_rows_native``, one call per chunk) beside the reference (``_rows_python``), chosen
as every compiled module is (``databus.batch.load_compiled``; ``DATABUS_PURE_PYTHON=1``
forces the reference).

The rows come from the chunk ``SELECT`` of ``_select`` (one expression per column, then
the raw primary key columns) as the driver returns them: mysqlclient without
conversions (``_dump_driver``) gives numbers and temporals as their ASCII text and
``CAST(.. AS CHAR)`` columns as str; pymysql gives typed values. The compiled twin reads
the text straight to Avro by column code::

    code       column kind (fetcher)     text accepted                   Avro written
    ---------  ------------------------  ------------------------------  -------------------
    LONG       INT, LONG, YEAR           -?[0-9]{1,19}, in int64         long (zigzag)
    BOOL       BIT(1) / BOOL             an integer                      boolean
    DOUBLE     DOUBLE                    what MySQL prints (strtod)      double, LE
    FLOAT      FLOAT (CAST AS DOUBLE)    the same, within float          float, LE
    DECIMAL    DECIMAL(p, s)             -?digits[.digits], <= 18        fixed(size), two's
                                         digits, <= s after the point    complement
    UINT64     BIGINT UNSIGNED           [0-9]{1,20} within 2^64         fixed(9)
    DATE       DATE                      YYYY-MM-DD, a real date         either: number
    DATETIME   DATETIME(f)               YYYY-MM-DD HH:MM:SS[.f{1,6}]    branch, long
    TIMESTAMP  TIMESTAMP (UNIX_TIMESTAMP)  [0-9]+[.f{1,6}]               long µs UTC
    TIME       TIME                      -?H+:MM:SS[.f{1,6}]             long µs
    STRING     TEXT, ENUM                a str                           string
    BYTES      BLOB, BINARY, GEOMETRY    bytes                           bytes
    PY         JSON, SET, BIT(n)         (the reference's encoder, called per value)

A nullable column is the union ``["null", T]`` (branch 0 null, 1 the value); DATE and
DATETIME are ``[("null",) number, text]``, the text branch holding zero or invalid
dates, which the compiled twin declines. A declined row (a value outside the codes
above, a NULL in a NOT NULL column) is encoded by the reference, so the compiled path
can only be faster, never different: the tests run both on the same rows, from a real
server and made up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pymysql.converters
from pymysql.constants import FIELD_TYPE

from databus.batch import load_compiled
from databus.fetchers._api import DumpRow
from databus.fetchers.mysql import _rows_python
from databus.fetchers.mysql._avro_writers import row_writers
from databus.fetchers.mysql._keys import row_key_function
from databus.fetchers.mysql._select import TableLayout
from databus.fetchers.mysql._types import _UINT64_PRECISION, Kind, decimal_fixed_size

__all__ = ["IMPLEMENTATION", "RowPlan", "encode_rows", "make_rows", "row_plan", "twin",
           "typers_for"]

C_LONG, C_BOOL, C_DOUBLE, C_FLOAT, C_DECIMAL, C_UINT64 = 1, 2, 3, 4, 5, 6
C_DATE, C_DATETIME, C_TIMESTAMP, C_TIME, C_STRING, C_BYTES, C_PY = 7, 8, 9, 10, 11, 12, 13
K_INT, K_PY = 1, 2

_CODES: dict[Kind, int] = {
    Kind.INT: C_LONG, Kind.LONG: C_LONG, Kind.YEAR: C_LONG, Kind.BOOL: C_BOOL,
    Kind.DOUBLE: C_DOUBLE, Kind.FLOAT: C_FLOAT, Kind.DECIMAL: C_DECIMAL,
    Kind.UINT64: C_UINT64, Kind.DATE: C_DATE, Kind.DATETIME: C_DATETIME,
    Kind.TIMESTAMP: C_TIMESTAMP, Kind.TIME: C_TIME, Kind.TEXT: C_STRING,
    Kind.ENUM: C_STRING, Kind.BYTES: C_BYTES, Kind.GEOMETRY: C_BYTES,
}

# Result field types whose values mysqlclient (no conversions) gives as ASCII text and
# pymysql converts: the reference twin converts them the way pymysql does.
_TEXT_TYPES = frozenset({
    FIELD_TYPE.DECIMAL, FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.TINY, FIELD_TYPE.SHORT,
    FIELD_TYPE.LONG, FIELD_TYPE.INT24, FIELD_TYPE.LONGLONG, FIELD_TYPE.FLOAT,
    FIELD_TYPE.DOUBLE, FIELD_TYPE.YEAR, FIELD_TYPE.DATE, FIELD_TYPE.DATETIME,
    FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIME,
})
Typer = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def typers_for(type_codes: Sequence[int | None]) -> tuple[Typer, ...]:
    """Per result column, how a raw value becomes what pymysql would have returned (the
    identity for values already typed, and for text and binary columns)."""
    out: list[Typer] = []
    for code in type_codes:
        decode = pymysql.converters.decoders.get(code) if code in _TEXT_TYPES else None
        if decode is None:
            out.append(_same)
        else:
            out.append(_text_typer(decode))
    return tuple(out)


def _text_typer(decode: Callable[[str], Any]) -> Typer:
    def typed(value: Any) -> Any:
        if isinstance(value, bytes):
            return decode(value.decode("ascii"))
        return value

    return typed


@dataclass(frozen=True, eq=False)
class RowPlan:
    """One table's rows as both twins encode them (see the module docstring)."""

    layout: TableLayout
    converts: tuple[Callable[[Any], Any], ...]
    writers: tuple[Any, ...]
    key_of: Callable[[list[Any], bytes], Any]
    typers: tuple[Typer, ...] = ()
    native: Any = field(default=None)

    def with_types(self, type_codes: Sequence[int | None]) -> RowPlan:
        """This plan for a result whose columns have these field types."""
        return RowPlan(self.layout, self.converts, self.writers, self.key_of,
                       typers_for(type_codes), self.native)

    def typed(self, values: Sequence[Any], start: int = 0) -> list[Any]:
        """``values`` (the result's columns from ``start`` on) as pymysql would have
        returned them: as they are when the rows were typed already (no field types)."""
        typers = self.typers
        if not typers:
            return list(values)
        return [None if v is None else typers[start + i](v) for i, v in enumerate(values)]


def row_plan(layout: TableLayout) -> RowPlan:
    shape = layout.shape
    writers = tuple(row_writers(shape.columns))
    converts = tuple(c.convert for c in layout.columns)
    key_of = row_key_function(shape.columns, shape.primary_key)
    plan = RowPlan(layout, converts, writers, key_of)
    if _native is None:
        return plan
    n = len(layout.columns)
    codes, nullable, either, scales, sizes = bytearray(), bytearray(), bytearray(), [], []
    encoders: list[Callable[[Any], bytes] | None] = []
    for i, column in enumerate(layout.columns):
        spec = column.spec
        code = _CODES.get(spec.kind, C_PY)
        codes.append(code)
        nullable.append(1 if spec.nullable else 0)
        either.append(1 if spec.nullable else 0)
        scales.append(spec.scale if spec.kind is Kind.DECIMAL else 0)
        sizes.append(decimal_fixed_size(spec.precision) if spec.kind is Kind.DECIMAL
                     else decimal_fixed_size(_UINT64_PRECISION) if spec.kind is Kind.UINT64
                     else 0)
        encoders.append(_field_encoder(plan, i) if code == C_PY else None)
    key = shape.primary_key
    key_code = (K_INT if len(key) == 1 and shape.columns[key[0]].kind in
                (Kind.INT, Kind.LONG, Kind.YEAR) else K_PY)
    native = _native.prepare(bytes(codes), bytes(nullable), bytes(either), tuple(scales),
                             tuple(sizes), tuple(encoders), key_code, n)
    return RowPlan(layout, converts, writers, key_of, (), native)


def _field_encoder(plan: RowPlan, i: int) -> Callable[[Any], bytes]:
    """Column ``i``'s whole field (union branch included) by the reference's writer."""
    convert, write = plan.converts[i], plan.writers[i]

    def encode(raw: Any) -> bytes:
        out: list[bytes] = []
        write(convert(raw), out)
        return b"".join(out)

    return encode


def encode_rows(rows: list[tuple[Any, ...]], plan: RowPlan
                ) -> tuple[list[Any], list[bytes]]:
    """(keys, values) of a chunk's rows, by the active twin; rows the compiled twin
    declines (and keys it does not compute) by the reference."""
    if _native is None or plan.native is None or not plan.typers:
        # No compiled twin, or rows a driver already typed (pymysql): the reference.
        return _rows_python.encode_rows(rows, plan)
    keys, values = _native.encode_rows(rows, plan.native)
    for i, value in enumerate(values):
        if value is None:
            keys[i], values[i] = _rows_python.encode_row_reference(rows[i], plan)
        elif keys[i] is None:
            keys[i] = _key_reference(rows[i], plan, value)
    return keys, values


def make_rows(keys: list[Any], values: list[bytes], fingerprint: int) -> list[DumpRow]:
    """The chunk's ``DumpRow``s (built by the compiled twin without ``__init__``)."""
    impl = _native if _native is not None else _rows_python
    return impl.make_rows(keys, values, fingerprint, DumpRow)  # type: ignore[no-any-return]


def _key_reference(row: tuple[Any, ...], plan: RowPlan, value: bytes) -> Any:
    """The key of a row whose body the compiled twin wrote: the key columns' values
    converted by the reference (the others are not needed)."""
    native: list[Any] = [None] * len(plan.converts)
    for i in plan.layout.shape.primary_key:
        (typed,) = plan.typed(row[i:i + 1], i)
        native[i] = None if typed is None else plan.converts[i](typed)
    return plan.key_of(native, value)


_native, WHY_PURE = load_compiled("databus.fetchers.mysql._rows_native")
IMPLEMENTATION: str = "native" if _native is not None else "python"


def twin(name: str) -> ModuleType:
    """One twin's module: "python" always, "native" if it was built."""
    if name == "python":
        return _rows_python
    if name == "native":
        from databus.fetchers.mysql import _rows_native  # type: ignore[attr-defined]

        return _rows_native  # type: ignore[no-any-return]
    raise ValueError(f"no twin named {name!r}")
