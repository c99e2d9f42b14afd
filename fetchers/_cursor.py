"""Dump cursors as JSON: a primary key's column values, kept in the relay's dump state.

Drivers give key columns as int, str, bytes, Decimal, float, date, datetime, time or
timedelta; JSON has only some of those, so the others are tagged one-key objects that
come back as the same Python value (and so compare the same way in SQL)::

    bytes -> {"hex": "00ff"}    Decimal -> {"dec": "1.50"}    datetime -> {"dt": iso}
    date -> {"d": iso}           time -> {"t": iso}            timedelta -> {"us": int}
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

__all__ = ["cursor_from_json", "cursor_to_json"]


def _to_json(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"hex": bytes(value).hex()}
    if isinstance(value, Decimal):
        return {"dec": str(value)}
    if isinstance(value, _dt.datetime):
        return {"dt": value.isoformat()}
    if isinstance(value, _dt.date):
        return {"d": value.isoformat()}
    if isinstance(value, _dt.time):
        return {"t": value.isoformat()}
    if isinstance(value, _dt.timedelta):
        return {"us": (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds}
    raise TypeError(f"a key value of type {type(value).__name__} cannot be kept in a cursor")


def _from_json(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError(f"bad cursor value {value!r}")
    (tag, text), = value.items()
    if tag == "hex":
        return bytes.fromhex(text)
    if tag == "dec":
        return Decimal(text)
    if tag == "dt":
        return _dt.datetime.fromisoformat(text)
    if tag == "d":
        return _dt.date.fromisoformat(text)
    if tag == "t":
        return _dt.time.fromisoformat(text)
    if tag == "us":
        return _dt.timedelta(microseconds=int(text))
    raise ValueError(f"bad cursor tag {tag!r}")


def cursor_to_json(values: Sequence[Any]) -> list[Any]:
    """Key column values -> JSON-able list."""
    return [_to_json(v) for v in values]


def cursor_from_json(values: Sequence[Any]) -> list[Any]:
    """The inverse of ``cursor_to_json``."""
    return [_from_json(v) for v in values]
