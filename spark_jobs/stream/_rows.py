"""Rows of the ``databus`` source (pure: decoded events in, tuples out).

Columns, in order:

| column | type | |
|---|---|---|
| `scn` | long | the event's SCN (a snapshot row: the SCN of its last change) |
| `source` | string | the logical source (`database.table`) |
| `op` | string | `upsert` or `delete` |
| `key` | string | the row's key as JSON text (`42`, `"alice"`, `[1,"eu"]`; bytes as hex text) |
| `timestamp` | timestamp | the source commit time of the event's window (null if unknown) |
| `from_snapshot` | boolean | from the bootstrap service or a relay's dump (a state, not a change) |
| `partition` | int | the input partition (mod bucket of the key) that read it |
| `seq` | int | the event's position among this partition's events of its window |

then the value: with one source, its columns typed from the source's Avro schema; with
several, `value`, the row as JSON text (null for a delete without a row). All the changes
of one key are in one partition, in commit order; ``(scn, seq)`` orders several changes
of one key in one transaction (one window has one SCN).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from databus.client._events import DataEvent
from databus.errors import DatabusError
from databus.event import Op

META_COLUMNS: tuple[tuple[str, str], ...] = (
    ("scn", "bigint"), ("source", "string"), ("op", "string"), ("key", "string"),
    ("timestamp", "timestamp"), ("from_snapshot", "boolean"), ("partition", "int"),
    ("seq", "int"),
)
VALUE_COLUMN = ("value", "string")

# value dict -> the typed columns (one source), or None: the ``value`` JSON column.
ValueColumns = Callable[[dict[str, Any] | None], tuple[Any, ...]]


# A value column named like one of the row's own columns (case-insensitively, as Spark
# resolves names) is shown with this prefix: a table with a column ``key``, ``source``
# or ``timestamp`` is common, and two fields of one name would misread every row.
CLASH_PREFIX = "value_"


class ColumnClashError(DatabusError):
    """A value column cannot be given a name of its own (the message says which)."""

    code = "column_clash"


def value_column_names(names: Sequence[str], *, source: str) -> list[str]:
    """The names the value's columns get in the rows: their own, or ``value_<name>``
    for one that clashes with a row column (``scn``, ``source``, ``op``, ``key``,
    ``timestamp``, ``from_snapshot``, ``partition``, ``seq``, ``value``)."""
    taken = {n.lower() for n, _ in (*META_COLUMNS, VALUE_COLUMN)}
    own = [n.lower() for n in names]
    out = []
    for name in names:
        shown = name if name.lower() not in taken else CLASH_PREFIX + name
        if shown.lower() in taken or (shown != name and shown.lower() in own):
            raise ColumnClashError(
                f"source {source}: its column {name!r} clashes with the row's column of "
                f"that name and {shown!r} is taken too; read it with several sources "
                "(the JSON value column) or rename the column")
        taken.add(shown.lower())
        out.append(shown)
    return out


def json_ddl() -> str:
    """The schema (Spark DDL) of a query on several sources."""
    return ", ".join(f"`{n}` {t}" for n, t in (*META_COLUMNS, VALUE_COLUMN))


def _plain(value: object) -> object:
    """What JSON has no type for: bytes as hex, dates and times in ISO 8601, decimals,
    UUIDs and the rest as their text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return str(value)


# One encoder, made once: ``json.dumps`` with these arguments builds a new one per call,
# which costs more than the encoding of a small row.
_ENCODER = json.JSONEncoder(default=_plain, separators=(",", ":"), ensure_ascii=False)


def key_json(key: object) -> str:
    """The key as compact JSON text (bytes, and bytes in a composite key, as hex)."""
    if type(key) is int:
        return str(key)  # what json.dumps writes for an int, without the encoder
    if isinstance(key, bytes):
        return _ENCODER.encode(key.hex())
    return _ENCODER.encode(list(key) if isinstance(key, tuple) else key)


def _value_encoder() -> Callable[[dict[str, Any]], str]:
    """``_ENCODER.encode`` of a dict, without its Python frames (``iterencode`` makes a
    new C encoder per call): the C encoder made once, with no check for circular
    references, which a decoded value (a tree) cannot have. Same text; 1-2 µs less a
    row. Where the C encoder is missing, ``_ENCODER.encode``."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover (CPython has it)
        return _ENCODER.encode
    chunks = make(None, _plain, json.encoder.encode_basestring, None, ":", ",", False,
                  False, True)
    return lambda value: "".join(chunks(value, 0))


_encode_value = _value_encoder()


def value_json(value: dict[str, Any] | None) -> str | None:
    """A decoded value as the JSON text of the ``value`` column (several sources)."""
    if value is None:
        return None
    return _encode_value(value)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def event_time(timestamp_ns: int) -> datetime | None:
    """The ``timestamp`` column: the commit time to the microsecond below (exactly what
    the Arrow rows hold), None when unknown (0)."""
    if timestamp_ns <= 0:
        return None
    return _EPOCH + timedelta(microseconds=timestamp_ns // 1000)


def event_row(event: DataEvent, partition: int, seq: int,
              value_columns: ValueColumns | None) -> tuple[Any, ...]:
    """One event as a row of the source's schema."""
    ts = event.timestamp_ns
    meta = (event.scn, event.source, "delete" if event.op == Op.DELETE else "upsert",
            key_json(event.key),
            event_time(ts),
            bool(event.from_bootstrap or event.from_dump), partition, seq)
    if value_columns is None:
        return (*meta, value_json(event.value))
    return (*meta, *value_columns(event.value))


def window_rows(events: Sequence[DataEvent], partition: int,
                value_columns: ValueColumns | None) -> list[tuple[Any, ...]]:
    """The rows of one window's events (``seq`` = position in the list)."""
    return [event_row(e, partition, i, value_columns) for i, e in enumerate(events)]


__all__ = ["CLASH_PREFIX", "META_COLUMNS", "VALUE_COLUMN", "ColumnClashError", "event_row",
           "event_time", "json_ddl", "key_json", "value_column_names", "value_json", "window_rows"]
