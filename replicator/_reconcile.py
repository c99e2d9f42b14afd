"""Reconciliation: what a target table must become to follow the source schema version
the replicator is about to apply (pure, no I/O; docs/replicator.md, "Reconciliation").

It runs at start, for every table, and at each schema change in the stream, and it
compares the target's *actual* columns (its catalog) with the version about to be
applied, not the replicator's memory of them. So a change made while the replicator was
down (or just before it crashed) is handled like one made while it ran, and a crash
between a target ALTER and the checkpoint is harmless: the next start finds the column
already there and has nothing left to do for it.

What the table followed before is the schema recorded in the target
(``databus_replication_schemas``, written after each reconciliation); with that, a
type change, a rename and a drop are told apart exactly (``_ddl.plan_ddl``). A table
with no record (made before the record existed, or by hand) is compared by column name
only: new columns are added, a target column the source no longer sends is left as it
is when it allows NULL, and types are not compared (a hand-made table may use types of
its own).

The catalog then says which changes are already done (an operator who added a NOT NULL
column with its default, renamed or converted a column, following a stop's fix): those
are no longer problems, and the replicator goes on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from databus.errors import DatabusError
from databus.replicator._ddl import DdlPlan, Problem, plan_ddl, widens
from databus.replicator._model import Dialect, TableMap

__all__ = ["CatalogColumn", "Reconciliation", "SchemaChangeStopped", "reconcile",
           "same_type"]

CatalogColumn = tuple[str, str, bool]  # (name, type as the catalog spells it, NULL-able)


class SchemaChangeStopped(DatabusError):
    """The replicator stopped on a source schema change it must not apply (``on_ddl``):
    the message names the source, the target table, the column and what differs;
    ``fix`` says what to do before restarting."""

    code = "schema_change_stopped"

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass
class Reconciliation:
    """What to do to one target table: ``plan``'s changes still to make (``pending``:
    not yet in the catalog), the ``problems`` left, and target columns the source does
    not send that stay as they are (``left``, NULL-able)."""

    plan: DdlPlan
    pending: DdlPlan
    problems: list[Problem] = field(default_factory=list)
    left: list[str] = field(default_factory=list)

    @property
    def changes(self) -> list[str]:
        return self.plan.describe()


# -- catalog types ---------------------------------------------------------------------

_PG_ALIASES = {
    "int": "integer", "int4": "integer", "int8": "bigint", "int2": "smallint",
    "bool": "boolean", "float8": "double precision", "float4": "real",
    "timestamp": "timestamp without time zone", "timestamptz": "timestamp with time zone",
    "time": "time without time zone", "timetz": "time with time zone",
    "varchar": "character varying", "char": "character", "decimal": "numeric",
}
_MYSQL_ALIASES = {
    "integer": "int", "boolean": "tinyint(1)", "bool": "tinyint(1)",
    "double precision": "double", "numeric": "decimal", "json": "longtext",
}
_SIZE = re.compile(r"^(?P<base>[a-z ]+)\s*(?P<size>\([0-9, ]*\))?(?P<rest>.*)$")
_MYSQL_INT = ("tinyint", "smallint", "mediumint", "int", "bigint")


def _norm(text: str, dialect: Dialect) -> str:
    t = " ".join(text.strip().lower().replace(" ,", ",").replace(", ", ",").split())
    if dialect == "mysql":
        t = re.sub(r" (character set|charset|collate) \w+", "", t)
    m = _SIZE.match(t)
    if m is None:
        return t
    base, size, rest = m["base"].strip(), m["size"] or "", m["rest"]
    if dialect == "postgresql":
        base = _PG_ALIASES.get(base, base)
    elif dialect == "mysql":
        if base + size in _MYSQL_ALIASES:
            return _MYSQL_ALIASES[base + size]
        base = _MYSQL_ALIASES.get(base, base)
        if base in _MYSQL_INT and size and base + size != "tinyint(1)":
            size = ""  # a display width, not a size
    return f"{base}{size}{rest}"


def same_type(catalog_type: str, target_type: str, dialect: Dialect) -> bool:
    """Whether the catalog's spelling of a column type is ``target_type`` (the mapping's
    spelling, ``_types.column_type``)."""
    return _norm(catalog_type, dialect) == _norm(target_type, dialect)


# -- reconciliation ------------------------------------------------------------------


def reconcile(new: TableMap, recorded: TableMap | None, catalog: Sequence[CatalogColumn],
              dialect: Dialect, *, table: str) -> Reconciliation:
    """Compare target table ``table`` (``catalog``: its columns; ``recorded``: the map of
    the schema it last followed, None when none is recorded) with ``new``, the map of
    the schema version about to be applied."""
    have = {name.lower(): (name, type_, nullable) for name, type_, nullable in catalog}
    if recorded is not None:
        plan = plan_ddl(recorded, new, table=table)
    else:
        plan = DdlPlan()
        for column in new.columns:
            if column.target.lower() in have:
                continue
            if column.nullable or column.target in new.key:
                plan.added.append(column)
            else:
                plan.incompatible.append(Problem(
                    column.target, f"new column {column.target} is NOT NULL",
                    f"ALTER TABLE {table} ADD COLUMN {column.target} {column.target_type} "
                    "NOT NULL DEFAULT <the source's default> (or NULL), then restart"))
    sent = {c.target.lower() for c in new.columns}
    # A change the catalog shows done (by an operator following a stop's fix, or by a
    # replicator that crashed before recording it) is no problem any more.
    problems = [p for p in plan.incompatible if not _done(p, new, have, dialect)]
    left: list[str] = []
    planned = {c.target.lower() for c in plan.added} | {n.lower() for n in plan.dropped}
    for column in new.columns:
        name = column.target.lower()
        if name not in have and name not in planned and not any(
                p.column.lower() == name for p in problems):
            # The record says the table has it, the catalog says not (dropped by hand).
            if column.nullable:
                plan.added.append(column)
            else:
                problems.append(Problem(
                    column.target, f"column {column.target} is missing from the target",
                    f"ALTER TABLE {table} ADD COLUMN {column.target} {column.target_type} "
                    "NOT NULL DEFAULT <a value>, then restart"))
    for lower, (name, _, nullable) in have.items():
        if lower in sent or lower in planned:
            continue
        if any(p.what.startswith(f"column {name} is gone") for p in problems):
            continue
        if recorded is not None and name in {c.target for c in recorded.columns}:
            continue  # planned as dropped, or part of a problem above
        if nullable:
            left.append(name)  # a column of the target's own (or dropped at the source)
        else:
            problems.append(Problem(
                name, f"target column {name} is NOT NULL and the source does not send it",
                f"ALTER TABLE {table} DROP COLUMN {name} (dropped at the source) or give "
                "it a default, then restart"))
    pending = DdlPlan(
        added=[c for c in plan.added if c.target.lower() not in have],
        dropped=[n for n in plan.dropped if n.lower() in have],
        widened=[c for c in plan.widened if c.target.lower() in have
                 and not same_type(have[c.target.lower()][1], c.target_type, dialect)])
    return Reconciliation(plan=plan, pending=pending, problems=problems, left=left)


def _done(problem: Problem, new: TableMap, have: dict[str, CatalogColumn],
          dialect: Dialect) -> bool:
    if not problem.column or problem.column not in {c.target for c in new.columns}:
        return False
    found = have.get(problem.column.lower())
    if found is None:
        return False
    column = new.column(problem.column)
    if problem.what.startswith("column ") and " changed from " in problem.what:
        # A type change: done once the catalog shows the new type (or a wider one).
        return (same_type(found[1], column.target_type, dialect)
                or widens(column.target_type, _norm(found[1], dialect)))
    if problem.what.startswith("column ") and " is gone and " in problem.what:
        gone = problem.what.split(" ", 2)[1]
        return gone.lower() not in have
    return True  # a NOT NULL column added by the operator


def applicable(new: TableMap, catalog: Sequence[CatalogColumn]) -> TableMap:
    """``new`` restricted to the columns the target table has (``on_ddl = "ignore"``:
    the table stays as it is; source columns it lacks are not written)."""
    have = {name.lower() for name, _, _ in catalog}
    return replace(new, columns=tuple(c for c in new.columns
                                      if c.target.lower() in have or c.target in new.key))
