"""Event keys from a row's key column values, the same for every SQL fetcher (pure).

A single-column key is the event key as it is when it is an int, a str or bytes (a bool
as an int, a bytearray or memoryview as bytes); a date, time or datetime is its ISO
text; anything else (Decimal, UUID...) its ``str()``. A composite key is a tuple of JSON
values: int, float, str and None as they are, bytes as hex, the rest as above.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from databus.event import Key

__all__ = ["normalize_key"]


def _json_part(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return value.isoformat()
    return str(value)


def normalize_key(values: Sequence[Any]) -> Key:
    """The event key of a row whose key columns hold ``values`` (see the docstring)."""
    if len(values) == 1:
        value = values[0]
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int | str | bytes):
            return value
        if isinstance(value, bytearray | memoryview):
            return bytes(value)
        if isinstance(value, dt.date | dt.time):
            return value.isoformat()
        return str(value)
    return tuple(_json_part(v) for v in values)
