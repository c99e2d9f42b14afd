"""What the parts of the replicator exchange: which source columns go to which target
columns (``TableMap``), and what one target transaction applies (``Batch``).

A batch holds the *latest* change per key of each table over one or more whole windows
(an upsert carries the whole row, a delete the key only), and the SCN of its last
window: the target applies the batch and records that SCN in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Batch", "Change", "ColumnMap", "Dialect", "TableMap"]

Dialect = Literal["postgresql", "mysql", "sqlite"]


@dataclass(frozen=True, slots=True)
class ColumnMap:
    """One replicated column: the Avro field it comes from, the target column it goes to.

    ``avro_type`` is the field's type as in the source's Avro schema JSON (a union with
    ``"null"`` for a nullable column), ``target_type`` the column type in the target's
    SQL (``databus.replicator._types.column_type``)."""

    source: str
    target: str
    avro_type: Any
    target_type: str
    nullable: bool
    # The source's SQL type when its schema names it (the TxLog fetcher does: a
    # ``sql_type`` field attribute): JSON, SET/ENUM labels, lengths (_types.py).
    sql_type: str | None = None


@dataclass(frozen=True, slots=True)
class TableMap:
    """One replicated table: ``source`` is the logical source name (``db.table``),
    ``schema``/``table`` name the target table, ``key`` its primary key columns (target
    names, a subset of ``columns``), ``columns`` every replicated column in target
    order, ``fingerprint`` the source schema version the map was made for."""

    source: str
    schema: str | None
    table: str
    key: tuple[str, ...]
    columns: tuple[ColumnMap, ...]
    fingerprint: int

    def column(self, target: str) -> ColumnMap:
        for c in self.columns:
            if c.target == target:
                return c
        raise KeyError(target)

    @property
    def key_indexes(self) -> tuple[int, ...]:
        """Where the key columns sit in ``columns`` (and in a change's ``row``)."""
        names = [c.target for c in self.columns]
        return tuple(names.index(k) for k in self.key)


@dataclass(slots=True)
class Change:
    """The latest change of one key in a batch: ``row`` holds the target values of every
    column of the table map, in order (converted for the target), or is None for a
    delete. ``key`` is the key values, in ``TableMap.key`` order."""

    key: tuple[Any, ...]
    row: tuple[Any, ...] | None
    scn: int


@dataclass(slots=True)
class Batch:
    """Whole windows, folded: per source name, per key, the latest change.

    ``scn`` is the SCN of the last window folded in (recorded with the batch in the
    target); ``windows`` and ``events`` count what was folded (for metrics)."""

    changes: dict[str, dict[tuple[Any, ...], Change]] = field(default_factory=dict)
    scn: int = -1
    windows: int = 0
    events: int = 0
    # The client checkpoint (JSON) the target records with the batch, to resume from:
    # ``{"window_scn": scn}`` online; during a bootstrap, the bootstrap's own checkpoint
    # (a snapshot's position is not an SCN). The target keeps it beside ``scn``.
    checkpoint: str | None = None
    # Sources whose upserts may go straight into their tables (COPY, no merge): an
    # initial copy into a table that was empty when it began (``Target.apply``; a
    # target takes a source out of the set when its table refuses a row's key).
    straight: set[str] = field(default_factory=set)

    @property
    def rows(self) -> int:
        return sum(len(c) for c in self.changes.values())
