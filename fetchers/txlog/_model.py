"""Tables as the TxLog scheme sees them, and the names of the objects it installs (pure).

Every dialect installs the same objects (see ``docs/txlog-fetcher.md``):

- ``databus_txlog``: one row per source transaction: ``txn`` (the id the triggers give
  the transaction), ``scn`` (assigned once the transaction is known to be committed;
  NULL, or "infinity" on Oracle, until then) and the time of its first change;
- ``databus_txlog_state``: one row: the newest SCN handed out and ``pruned_before``;
- per captured table: a ``databus_txn`` column (the paper's ``txn`` column, named so that
  it cannot clash with a user's column), an index on it, a delete log
  ``databus_deleted_<table>`` holding the key of every deleted row with its ``txn``,
  and the triggers.

Generated names are the table's name when it is a plain identifier, else a sanitised
form with an 8-hex-digit hash of the real name (so ``a-b`` and ``a_b`` get different
objects), cut to the dialect's identifier limit.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = [
    "STATE_TABLE",
    "TXLOG_TABLE",
    "TXN_COLUMN",
    "WATERMARK_READY",
    "WATERMARK_TABLE",
    "Column",
    "TableRef",
    "TableShape",
    "object_name",
]

TXN_COLUMN = "databus_txn"
# The dump watermark table (docs/dumps.md): captured like a table, never a source.
WATERMARK_TABLE = "databus_watermark"
# Key of ``FetcherContext.memory`` set by the dump source once it checked the watermark
# table: the fetcher looks for the table in its next batch, not a second later (a
# watermark in a batch read before the table was found would be missed).
WATERMARK_READY = "txlog_watermark_ready"
TXLOG_TABLE = "databus_txlog"
STATE_TABLE = "databus_txlog_state"

_PLAIN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INVALID_RE = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True, slots=True, order=True)
class TableRef:
    """A table: ``schema`` is SQLite's ``main``, a PostgreSQL schema or an Oracle owner."""

    schema: str
    name: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True, slots=True)
class Column:
    """A column as the source's catalog describes it.

    ``sql_type`` is the dialect's own spelling (SQLite: the declared type; PostgreSQL:
    ``format_type()``, e.g. ``numeric(10,2)``; Oracle: ``DATA_TYPE`` with precision).
    """

    name: str
    sql_type: str
    nullable: bool = True


@dataclass(frozen=True, slots=True)
class TableShape:
    """A captured table: its columns (without ``databus_txn``) and primary key."""

    ref: TableRef
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    has_txn_column: bool = False

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(self.column(name) for name in self.key)


def object_name(kind: str, table: str, max_len: int = 63, suffix: str = "") -> str:
    """``databus_<kind>_<table><suffix>``, a plain identifier of at most ``max_len``."""
    prefix = f"databus_{kind}_"
    if _PLAIN_RE.match(table) and len(prefix) + len(table) + len(suffix) <= max_len:
        return prefix + table + suffix
    digest = hashlib.blake2b(table.encode(), digest_size=4).hexdigest()
    clean = _INVALID_RE.sub("_", table)
    room = max_len - len(prefix) - len(suffix) - len(digest) - 1
    return f"{prefix}{clean[:max(room, 1)]}_{digest}{suffix}"
