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
from datetime import UTC, date, datetime, time
from decimal import Decimal
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
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def key_json(key: object) -> str:
    """The key as compact JSON text (bytes, and bytes in a composite key, as hex)."""
    if isinstance(key, bytes):
        return json.dumps(key.hex())
    return json.dumps(list(key) if isinstance(key, tuple) else key, default=_plain,
                      separators=(",", ":"), ensure_ascii=False)


def value_json(value: dict[str, Any] | None) -> str | None:
    if value is None:
        return None
    return json.dumps(value, default=_plain, separators=(",", ":"), ensure_ascii=False,
                      sort_keys=False)


def event_row(event: DataEvent, partition: int, seq: int,
              value_columns: ValueColumns | None) -> tuple[Any, ...]:
    """One event as a row of the source's schema."""
    ts = event.timestamp_ns
    meta = (event.scn, event.source, "delete" if event.op == Op.DELETE else "upsert",
            key_json(event.key),
            datetime.fromtimestamp(ts / 1e9, tz=UTC) if ts > 0 else None,
            bool(event.from_bootstrap or event.from_dump), partition, seq)
    if value_columns is None:
        return (*meta, value_json(event.value))
    return (*meta, *value_columns(event.value))


def window_rows(events: Sequence[DataEvent], partition: int,
                value_columns: ValueColumns | None) -> list[tuple[Any, ...]]:
    """The rows of one window's events (``seq`` = position in the list)."""
    return [event_row(e, partition, i, value_columns) for i, e in enumerate(events)]


__all__ = ["CLASH_PREFIX", "META_COLUMNS", "VALUE_COLUMN", "ColumnClashError", "event_row",
           "json_ddl", "key_json", "value_column_names", "value_json", "window_rows"]
