"""What a new source schema version does to a target table: columns added, dropped,
widened, or a change the table cannot follow (pure; the replicator applies it per
``on_ddl``, replicator/_reconcile.py).

A change the table cannot follow is a ``Problem``: the column, what differs and the fix
an operator applies, so that the stop is one line that says what to do."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from databus.replicator._model import ColumnMap, TableMap

__all__ = ["DdlPlan", "Problem", "plan_ddl"]

_SIZED = re.compile(r"^(?P<base>[A-Za-z ]+?)\s*\((?P<args>[0-9, ]+)\)(?P<rest>.*)$")
# Integer types, each holding every value of those before it.
_INT_ORDER = {"smallint": 1, "int2": 1, "integer": 2, "int": 2, "int4": 2, "mediumint": 2,
              "bigint": 3, "int8": 3}


@dataclass(frozen=True)
class Problem:
    """A change the target table cannot follow by itself: ``column`` (target name, ""
    for the key), ``what`` differs, and the ``fix`` (what to do, then restart)."""

    column: str
    what: str
    fix: str

    def __str__(self) -> str:
        return self.what


@dataclass
class DdlPlan:
    added: list[ColumnMap] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    widened: list[ColumnMap] = field(default_factory=list)
    incompatible: list[Problem] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(self.added or self.dropped or self.widened)

    def describe(self) -> list[str]:
        return ([f"add column {c.target} {c.target_type}" for c in self.added]
                + [f"drop column {n}" for n in self.dropped]
                + [f"widen column {c.target} to {c.target_type}" for c in self.widened])


def widens(old: str, new: str) -> bool:
    """Does column type ``new`` hold every value of ``old``? (the same base type with
    larger sizes, or a larger integer type)."""
    a, b = old.strip().lower(), new.strip().lower()
    if a == b:
        return True
    if a in _INT_ORDER and b in _INT_ORDER:
        return _INT_ORDER[b] >= _INT_ORDER[a]
    ma, mb = _SIZED.match(a), _SIZED.match(b)
    if ma is None or mb is None or ma["base"] != mb["base"] or ma["rest"] != mb["rest"]:
        return False
    sa = [int(x) for x in ma["args"].split(",")]
    sb = [int(x) for x in mb["args"].split(",")]
    if len(sa) != len(sb):
        return False
    if len(sa) == 2:  # (precision, scale): more integer digits and at least the scale
        return sb[1] >= sa[1] and sb[0] - sb[1] >= sa[0] - sa[1]
    return sb[0] >= sa[0]


def plan_ddl(old: TableMap, new: TableMap, *, table: str = "the target table") -> DdlPlan:
    """The target changes that take table ``old`` to ``new`` (column by target name);
    ``table`` names the target table in the fixes."""
    plan = DdlPlan()
    if old.key != new.key:
        plan.incompatible.append(Problem(
            "", f"the key changed from ({', '.join(old.key)}) to ({', '.join(new.key)})",
            f"recreate {table} with the new key and copy it again (drop it and the "
            "replication's row in databus_replication_state, then restart)"))
    before = {c.target: c for c in old.columns}
    after = {c.target: c for c in new.columns}
    gone = [n for n in before if n not in after and n not in old.key]
    for index, (name, column) in enumerate(after.items()):
        was = before.get(name)
        if was is None:
            renamed = _renamed_from(old, new, index, gone)
            if renamed is not None:
                # A column gone and one new in its place with its type: a rename, or a
                # drop and an add. Applying either guess may lose the column's values.
                plan.incompatible.append(Problem(
                    name, f"column {renamed} is gone and {name} ({column.target_type}) is "
                    f"new in its place (renamed, or dropped and added)",
                    f"if renamed: ALTER TABLE {table} RENAME COLUMN {renamed} TO {name}; "
                    f"if not: ALTER TABLE {table} DROP COLUMN {renamed}, ADD COLUMN "
                    f"{name} {column.target_type} (NULL); then restart"))
                gone.remove(renamed)
            elif not column.nullable:
                # The rows already there hold the source's default, which the schema
                # does not carry: only the operator knows it.
                plan.incompatible.append(Problem(
                    name, f"new column {name} is NOT NULL",
                    f"ALTER TABLE {table} ADD COLUMN {name} {column.target_type} NOT NULL "
                    "DEFAULT <the source's default> (or NULL), then restart"))
            else:
                plan.added.append(column)
        elif was.target_type != column.target_type:
            if widens(was.target_type, column.target_type):
                plan.widened.append(column)
            else:
                plan.incompatible.append(Problem(
                    name, f"column {name} changed from {was.target_type} to "
                    f"{column.target_type}",
                    f"change the column in the target (ALTER TABLE {table} ... {name} "
                    f"{column.target_type}, converting its values), then restart"))
    for name in before:
        if name not in after:
            if name in old.key:
                plan.incompatible.append(Problem(
                    name, f"key column {name} was dropped",
                    f"recreate {table} with the source's new key and copy it again"))
            elif name in gone:
                plan.dropped.append(name)
    return plan


def _renamed_from(old: TableMap, new: TableMap, index: int, gone: list[str]) -> str | None:
    """The gone column a new column at ``index`` of ``new`` may be renamed from: the one
    at the same place in ``old`` with the same type."""
    if index >= len(old.columns):
        return None
    was = old.columns[index]
    column = new.columns[index]
    if was.target in gone and was.target_type == column.target_type:
        return was.target
    return None
