"""The Avro encoder of rows in the fetcher's Avro-native form (see ``_types``). Pure."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from databus.fetchers.mysql._types import (
    _UINT64_PRECISION,
    ColumnSpec,
    Kind,
    Native,
    Writer,
    decimal_fixed_size,
)

__all__ = ["encode_row", "row_writers"]

# -- the Avro encoder -----------------------------------------------------------------

_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")


def _varint(value: int) -> bytes:
    """Avro's zigzag varint of a long (values are in the int64 range, so z >= 0)."""
    z = (value << 1) ^ (value >> 63)
    if z < 0x80:
        return _SMALL_VARINTS[z]
    if z < 0x4000:
        return bytes((z & 0x7F | 0x80, z >> 7))
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_VARINTS = tuple(bytes([z]) for z in range(0x80))
_NULL_BRANCH = b"\x00"


def _write_long(value: int, out: list[bytes]) -> None:
    out.append(_varint(value))


def _write_bytes(value: bytes, out: list[bytes]) -> None:
    out.append(_varint(len(value)))
    out.append(value)


def _write_string(value: str, out: list[bytes]) -> None:
    data = value.encode("utf-8")
    out.append(_varint(len(data)))
    out.append(data)


def _write_float(value: float, out: list[bytes]) -> None:
    out.append(_FLOAT.pack(value))


def _write_double(value: float, out: list[bytes]) -> None:
    out.append(_DOUBLE.pack(value))


def _write_bool(value: bool, out: list[bytes]) -> None:
    out.append(b"\x01" if value else b"\x00")


def _write_set(value: list[str], out: list[bytes]) -> None:
    if value:
        out.append(_varint(len(value)))
        for item in value:
            _write_string(item, out)
    out.append(b"\x00")


def _fixed_writer(size: int) -> Writer:
    def write(value: int, out: list[bytes]) -> None:
        out.append(value.to_bytes(size, "big", signed=True))

    return write


def _either_writer(branch_offset: int) -> Writer:
    """DATE / DATETIME: the number branch for an int, the string branch for text."""
    number, text = _varint(branch_offset), _varint(branch_offset + 1)

    def write(value: int | str, out: list[bytes]) -> None:
        if isinstance(value, str):
            out.append(text)
            _write_string(value, out)
        else:
            out.append(number)
            out.append(_varint(value))

    return write


def _value_writer(column: ColumnSpec) -> Writer:
    kind = column.kind
    if kind in (Kind.INT, Kind.LONG, Kind.YEAR, Kind.TIME, Kind.TIMESTAMP):
        return _write_long
    if kind is Kind.DECIMAL:
        return _fixed_writer(decimal_fixed_size(column.precision))
    if kind is Kind.UINT64:
        return _fixed_writer(decimal_fixed_size(_UINT64_PRECISION))
    if kind in (Kind.DATE, Kind.DATETIME):
        return _either_writer(1 if column.nullable else 0)
    if kind is Kind.FLOAT:
        return _write_float
    if kind is Kind.DOUBLE:
        return _write_double
    if kind is Kind.BOOL:
        return _write_bool
    if kind in (Kind.BITS, Kind.BYTES, Kind.GEOMETRY):
        return _write_bytes
    if kind in (Kind.TEXT, Kind.ENUM, Kind.JSON):
        return _write_string
    if kind is Kind.SET:
        return _write_set
    raise AssertionError(f"no writer for {kind}")


def _column_writer(column: ColumnSpec) -> Writer:
    write = _value_writer(column)
    if not column.nullable:
        return write
    if column.kind in (Kind.DATE, Kind.DATETIME):
        # The branch index is written by the either-writer (offset by the null branch).
        def write_nullable_either(value: Native, out: list[bytes]) -> None:
            if value is None:
                out.append(_NULL_BRANCH)
            else:
                write(value, out)

        return write_nullable_either
    value_branch = _varint(1)

    def write_nullable(value: Native, out: list[bytes]) -> None:
        if value is None:
            out.append(_NULL_BRANCH)
        else:
            out.append(value_branch)
            write(value, out)

    return write_nullable


def row_writers(columns: Sequence[ColumnSpec]) -> tuple[Writer, ...]:
    """One Avro writer per column, for ``encode_row``."""
    return tuple(_column_writer(c) for c in columns)


def encode_row(writers: Sequence[Writer], values: Sequence[Native]) -> bytes:
    """The Avro record of one row (``writers`` from ``row_writers``)."""
    out: list[bytes] = []
    for write, value in zip(writers, values, strict=True):
        write(value, out)
    return b"".join(out)


