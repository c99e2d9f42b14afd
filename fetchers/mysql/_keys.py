"""Event keys of rows: a column value as a key part, and a table's key function. Pure."""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, TypeAlias

from databus.event import Key
from databus.fetchers.mysql._types import (
    ColumnSpec,
    Kind,
    Native,
)

__all__ = ["EPOCH_ORDINAL", "KeyOf", "key_value", "row_key_function"]

# -- keys -----------------------------------------------------------------------------

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()
EPOCH_ORDINAL = _EPOCH_ORDINAL  # public: DATE values are days since it (spark_jobs)
_US_PER_DAY = 86_400_000_000
_EXACT = decimal.Context(prec=100)  # above DECIMAL's 65 digits: scaleb never rounds


def key_value(column: ColumnSpec, value: Native) -> int | str | bytes | float | bool | None:
    """A column value as an event key part: ints stay ints, text stays text, binary
    stays bytes; decimals and temporals become their canonical text.

    BIGINT UNSIGNED values of 2**63 and more wrap to negative int64 (two's complement),
    so the key of every integer column is an int64 and ``mod`` filters keep working.
    """
    if value is None:
        return None
    kind = column.kind
    if kind is Kind.UINT64:
        return value - (1 << 64) if value > _INT64_MAX else int(value)
    if kind is Kind.DECIMAL:
        return str(Decimal(value).scaleb(-column.scale, _EXACT))
    if kind is Kind.DATE:
        if isinstance(value, str):
            return value
        return _dt.date.fromordinal(value + _EPOCH_ORDINAL).isoformat()
    if kind is Kind.DATETIME:
        if isinstance(value, str):
            return value
        return _format_micros(value, naive=True)
    if kind is Kind.TIMESTAMP:
        return _format_micros(value, naive=False)
    if kind is Kind.SET:
        return ",".join(value)
    if isinstance(value, bool | int | float | str | bytes):
        return value
    raise AssertionError(f"unexpected key value {value!r}")


def _format_micros(micros: int, *, naive: bool) -> str:
    days, rest = divmod(micros, _US_PER_DAY)
    moment = _dt.datetime.fromordinal(days + _EPOCH_ORDINAL) + _dt.timedelta(microseconds=rest)
    text = moment.isoformat(sep=" ")
    return text if naive else text + "Z"


KeyOf: TypeAlias = Callable[[list[Native], bytes], Key]
"""Computes a row's event key from its values and its Avro encoding."""

_ROW_HASH_BYTES = 16


def _key_part(column: ColumnSpec, value: Native, composite: bool) -> Any:
    part = key_value(column, value)
    if isinstance(part, bool):
        return int(part)
    if isinstance(part, float):
        return part if composite else repr(part)
    if composite and isinstance(part, bytes):
        return part.hex()  # a composite key is a JSON array: no bytes in it
    return part


def row_key_function(columns: Sequence[ColumnSpec], primary_key: Sequence[int]) -> KeyOf:
    """How to key the rows of a table: its primary key column's value (an int64, text
    or bytes), a tuple for a composite key, and for a table without a primary key
    16 bytes of BLAKE2b over the row's Avro encoding (equal rows share a key)."""
    if not primary_key:
        def row_hash(values: list[Native], encoded: bytes) -> Key:
            return hashlib.blake2b(encoded, digest_size=_ROW_HASH_BYTES).digest()

        return row_hash
    if len(primary_key) == 1:
        index = primary_key[0]
        column = columns[index]

        def single(values: list[Native], encoded: bytes) -> Key:
            part: Key = _key_part(column, values[index], False)
            return part

        return single
    parts = [(i, columns[i]) for i in primary_key]

    def composite(values: list[Native], encoded: bytes) -> Key:
        return tuple(_key_part(c, values[i], True) for i, c in parts)

    return composite


