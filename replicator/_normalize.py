"""The documented normalisation of values: a source value (as fastavro decodes it) and a
target value (as the target's driver reads it) map to one canonical form, so that a
source row and its replica compare equal exactly when the replica is right (tests, the
acceptance runs, anyone checking a replica). ``docs/replicator.md``, "Comparing rows".
"""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
from decimal import Decimal
from typing import Any

from databus.replicator._classify import DATELIKE, Col, Kind, classify
from databus.replicator._model import Dialect
from databus.replicator._types import UTC, mixed_text

__all__ = ["normalize"]

# -- normalisation (comparing a source row with a target row) -------------------------


def _float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _micros(value: dt.timedelta) -> int:
    return value // dt.timedelta(microseconds=1)


def _date_text(value: str) -> str:
    """A zero/invalid date's text without trailing fraction zeros: a DATETIME(0)
    source prints 0000-00-00 00:00:00, the DATETIME(6) target 0000-00-00 00:00:00.000000."""
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value


def _normalize(col: Col, value: Any, dialect: Dialect | None, key: bool) -> Any:
    kind = col.kind
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if kind in (Kind.INT, Kind.LONG):
        return int(value)
    if kind is Kind.BOOL:
        return bool(value)
    if kind in (Kind.FLOAT, Kind.DOUBLE):
        f = float(value)
        if math.isnan(f):
            return "NaN"  # NaN != NaN
        return _float32(f) if kind is Kind.FLOAT else f
    if kind in (Kind.DECIMAL, Kind.NUMERIC_TEXT):
        d = value if isinstance(value, Decimal) else Decimal(str(value))
        return "NaN" if d.is_nan() else d.normalize()
    if kind in DATELIKE:
        if isinstance(value, str):
            try:
                parsed: Any = (dt.date.fromisoformat(value) if kind is Kind.DATE
                               else dt.datetime.fromisoformat(value))
            except ValueError:
                # A zero/invalid date: PostgreSQL holds it as NULL (a key: its text).
                return None if dialect == "postgresql" and not key else _date_text(value)
            value = parsed
        if kind is Kind.DATE:
            return value.date() if isinstance(value, dt.datetime) else value
        if kind is Kind.LOCAL_TIMESTAMP:
            return value.replace(tzinfo=None)
        if value.tzinfo is None:  # MySQL DATETIME(6) holds UTC
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
    if kind is Kind.TIME:
        if isinstance(value, str):
            value = dt.time.fromisoformat(value)
        if isinstance(value, dt.timedelta):  # pymysql reads TIME as a timedelta
            return _micros(value)
        seconds = (value.hour * 60 + value.minute) * 60 + value.second
        return seconds * 10**6 + value.microsecond
    if kind is Kind.DURATION:
        return _micros(value) if isinstance(value, dt.timedelta) else int(value)
    if kind is Kind.JSON:
        if not isinstance(value, str | bytes):
            # psycopg2 parses json/jsonb itself, floats as float: back to text, whose
            # shortest float repr parses to the same Decimal as the source's digits.
            value = json.dumps(value)
        try:
            return json.loads(value, parse_float=Decimal)
        except ValueError:
            return value
    if kind is Kind.STRING:
        return value.decode("utf-8") if isinstance(value, bytes) else value
    if kind is Kind.SET:
        if isinstance(value, str):
            return tuple(sorted(value.split(","))) if value else ()
        return tuple(sorted(value))
    if kind is Kind.MIXED:
        if dialect == "sqlite":
            return value
        try:
            return mixed_text(value)
        except ValueError:
            return value
    return value  # BYTES


def normalize(value: Any, avro_type: Any, *, dialect: Dialect | None = None,
              key: bool = False, sql_type: str | None = None) -> Any:
    """A canonical form of a column value, for comparing a source row (as decoded) with
    a target row (as its driver reads it): equal values normalise equal.

    None -> None; integers -> int; booleans -> bool (0/1 too); floats -> float, a
    single-precision column rounded to single precision, NaN -> "NaN"; decimals ->
    ``Decimal.normalize()`` (exact, 1.10 == 1.1; text too); dates -> ``date``, wall-clock
    date-times -> naive ``datetime``, instants -> aware UTC ``datetime`` (a naive one is
    read as UTC, as MySQL's DATETIME holds them); zero/invalid dates -> their text without
    trailing fraction zeros, or None when ``dialect`` is PostgreSQL and not ``key`` (where
    they land as NULL); times of day and durations -> microseconds (int); JSON (with a hint) -> the
    parsed value, numbers as Decimal; strings -> str; bytes -> bytes; SET -> a sorted
    tuple of members (a list or MySQL's 'a,b'); a mixed (SQLite dynamic) column -> its
    text, or the value itself when the target is SQLite."""
    if value is None:
        return None
    return _normalize(classify(avro_type, sql_type), value, dialect, key)
