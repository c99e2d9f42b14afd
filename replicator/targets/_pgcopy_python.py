"""PostgreSQL's binary COPY format, written from the rows the type mapping produces: the
pure-Python twin (the reference) of ``_pgcopy_native``; ``_pgcopy`` chooses.

``COPY ... FROM STDIN (FORMAT binary)``: a header, then per row a 16-bit field count and
per field a 32-bit length (-1: NULL) and the value in the type's binary ``recv`` form,
then -1. Binary input takes no parsing in the server (no hex for ``bytea``, no decimal
text for numbers and times), and building it takes less Python than the text format:
``struct`` packs numbers, ``str.encode`` text, ``bytea`` goes as it is.

Binary input must match the column's type exactly (an ``integer`` takes 4 bytes, a
``bigint`` 8), so the encoders are chosen by the staging table's own column types
(``pg_type.typname``), and a value is encoded by its exact Python type, as
``copy_text`` does: an encoder per (column type, Python type). A column type without
one here (a domain, an enum, an array) makes the table go through ``copy_text``; a
value without one (a ``str`` for a ``numeric`` column, a ``bool`` for a ``bigint``, an
int out of the column's range) makes ``copy_binary`` answer None, and the batch goes
through ``copy_text`` too, where the server says what it thinks of the value. The
result in the table is the same either way: tests compare the two on every type the
mapping produces.

Times: ``timestamp``/``timestamptz`` are microseconds since 2000-01-01 (an aware value
as its UTC instant; for ``timestamp``, the UTC wall time, as the text path's offset is
dropped by the server; a naive value into ``timestamptz`` is UTC, the session's zone),
``date`` days since then, ``time`` microseconds since midnight (wall time), ``interval``
(microseconds, days, months) from a ``timedelta``'s normalized parts, as the text path
writes them (``N days S.U seconds``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

__all__ = ["BINARY_TYPES", "Encoder", "Encoders", "binary_encoders", "copy_binary"]

HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
TRAILER = b"\xff\xff"
NULL = b"\xff\xff\xff\xff"

_I2 = struct.Struct(">ih").pack
_I4 = struct.Struct(">ii").pack
_I8 = struct.Struct(">iq").pack
_F4 = struct.Struct(">if").pack
_F8 = struct.Struct(">id").pack
_LEN = struct.Struct(">i").pack
_INTERVAL = struct.Struct(">iqii").pack
_TRUE = b"\x00\x00\x00\x01\x01"
_FALSE = b"\x00\x00\x00\x01\x00"

_EPOCH_DATE = dt.date(2000, 1, 1).toordinal()
_EPOCH = dt.datetime(2000, 1, 1)
_EPOCH_UTC = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)

Encoder = Callable[[Any], bytes]
Encoders = list[dict[type, Encoder]]


def _text(v: str) -> bytes:
    b = v.encode("utf-8")
    return _LEN(len(b)) + b


def _jsonb(v: str) -> bytes:
    b = v.encode("utf-8")
    return _LEN(len(b) + 1) + b"\x01" + b


def _bytea(v: bytes | bytearray | memoryview) -> bytes:
    b = bytes(v)
    return _LEN(len(b)) + b


def _int2(v: int) -> bytes:
    return _I2(2, v)


def _int4(v: int) -> bytes:
    return _I4(4, v)


def _int8(v: int) -> bytes:
    return _I8(8, v)


def _float4(v: float) -> bytes:
    return _F4(4, v)


def _float8(v: float) -> bytes:
    return _F8(8, v)


def _bool(v: bool) -> bytes:
    return _TRUE if v else _FALSE


def _date(v: dt.date) -> bytes:
    return _I4(4, v.toordinal() - _EPOCH_DATE)


def _timestamp(v: dt.datetime) -> bytes:
    if v.tzinfo is not None:
        v = v.astimezone(dt.UTC).replace(tzinfo=None)
    return _I8(8, (v - _EPOCH) // _US)


def _timestamptz(v: dt.datetime) -> bytes:
    if v.tzinfo is None:
        return _I8(8, (v - _EPOCH) // _US)  # the session's zone is UTC
    return _I8(8, (v - _EPOCH_UTC) // _US)


def _time(v: dt.time) -> bytes:
    return _I8(8, ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond)


def _interval(v: dt.timedelta) -> bytes:
    return _INTERVAL(16, v.seconds * 1_000_000 + v.microseconds, v.days, 0)


def _uuid(v: uuid.UUID) -> bytes:
    return b"\x00\x00\x00\x10" + v.bytes


_NUMERIC_HEAD = struct.Struct(">ihhHh")
_EXACT = decimal.Context(prec=decimal.MAX_PREC)  # scaleb without rounding
_NUMERIC_SPECIAL = {"n": 0xC000, "N": 0xC000, "F": 0xD000}


def _numeric(v: Decimal) -> bytes:
    sign, digits, exp = v.as_tuple()
    if not isinstance(exp, int):  # NaN, sNaN, Infinity
        if exp == "N":  # a signalling NaN: the text path's server refuses it
            raise ValueError("sNaN")
        code = _NUMERIC_SPECIAL[exp] if exp != "F" or not sign else 0xF000
        return _NUMERIC_HEAD.pack(8, 0, 0, code, 0)
    # The coefficient as an int, its fraction padded to whole base-10000 digits.
    coef = int(v.scaleb(-exp, _EXACT)) if digits else 0
    if sign:
        coef = -coef
    if exp >= 0:
        coef *= 10 ** exp
        dscale = frac_groups = 0
    else:
        dscale = -exp
        pad = -dscale % 4
        coef *= 10 ** pad
        frac_groups = (dscale + pad) // 4
    if not coef:
        return _NUMERIC_HEAD.pack(8, 0, 0, 0, dscale)
    groups = []
    while coef:
        coef, r = divmod(coef, 10000)
        groups.append(r)
    weight = len(groups) - frac_groups - 1
    groups.reverse()
    while groups[-1] == 0:
        groups.pop()
    n = len(groups)
    return (_NUMERIC_HEAD.pack(8 + 2 * n, n, weight, 0x4000 if sign else 0, dscale)
            + struct.pack(f">{n}H", *groups))


def _numeric_int(v: int) -> bytes:
    return _numeric(Decimal(v))


_BYTES: dict[type, Encoder] = {bytes: _bytea, bytearray: _bytea, memoryview: _bytea}

# pg_type.typname -> (Python type -> encoder); what copy_text writes for that column.
BINARY_TYPES: dict[str, dict[type, Encoder]] = {
    "int2": {int: _int2},
    "int4": {int: _int4},
    "int8": {int: _int8},
    "bool": {bool: _bool},
    "float4": {float: _float4},
    "float8": {float: _float8},
    "numeric": {Decimal: _numeric, int: _numeric_int},
    "text": {str: _text},
    "varchar": {str: _text},
    "bpchar": {str: _text},
    "json": {str: _text},
    "jsonb": {str: _jsonb},
    "bytea": _BYTES,
    "date": {dt.date: _date},
    "timestamp": {dt.datetime: _timestamp},
    "timestamptz": {dt.datetime: _timestamptz},
    "time": {dt.time: _time},
    "interval": {dt.timedelta: _interval},
    "uuid": {uuid.UUID: _uuid},
}


def binary_encoders(typnames: Sequence[str]) -> Encoders | None:
    """The encoders of columns of these types (``pg_type.typname``), or None when a
    type has none here (the table is loaded in text format)."""
    try:
        return [BINARY_TYPES[t] for t in typnames]
    except KeyError:
        return None


def copy_binary(rows: Sequence[Sequence[Any]], encoders: Encoders) -> bytes | None:
    """``rows`` in COPY's binary format for columns with these ``encoders``, or None
    when a value has no encoder for its column (by exact type) or does not fit it (an
    int beyond the column's range): the caller writes the text format then."""
    count = struct.pack(">h", len(encoders))
    out = [HEADER]
    append = out.append
    try:
        for row in rows:
            append(count)
            for v, enc in zip(row, encoders, strict=True):
                append(NULL if v is None else enc[type(v)](v))
    except (KeyError, struct.error, OverflowError, ValueError):
        return None
    append(TRAILER)
    return b"".join(out)
