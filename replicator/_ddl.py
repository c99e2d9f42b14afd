"""What a new source schema version does to a target table: columns added, dropped,
widened, or a change the table cannot follow (pure; the replicator applies it per
``on_ddl``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from databus.replicator._model import ColumnMap, TableMap

__all__ = ["DdlPlan", "plan_ddl"]

_SIZED = re.compile(r"^(?P<base>[A-Za-z ]+?)\s*\((?P<args>[0-9, ]+)\)(?P<rest>.*)$")
# Integer types, each holding every value of those before it.
_INT_ORDER = {"smallint": 1, "int2": 1, "integer": 2, "int": 2, "int4": 2, "mediumint": 2,
              "bigint": 3, "int8": 3}


@dataclass
class DdlPlan:
    added: list[ColumnMap] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    widened: list[ColumnMap] = field(default_factory=list)
    incompatible: list[str] = field(default_factory=list)

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


def plan_ddl(old: TableMap, new: TableMap) -> DdlPlan:
    """The target changes that take table ``old`` to ``new`` (column by target name)."""
    plan = DdlPlan()
    if old.key != new.key:
        plan.incompatible.append(f"the key changed from ({', '.join(old.key)}) to "
                                 f"({', '.join(new.key)})")
    before = {c.target: c for c in old.columns}
    after = {c.target: c for c in new.columns}
    for name, column in after.items():
        was = before.get(name)
        if was is None:
            if not column.nullable:
                # Existing rows have no value for it: added as nullable would not match
                # the source's constraint, and NOT NULL cannot be added to a filled table.
                plan.incompatible.append(f"new column {name} is NOT NULL")
            else:
                plan.added.append(column)
        elif was.target_type != column.target_type:
            if widens(was.target_type, column.target_type):
                plan.widened.append(column)
            else:
                plan.incompatible.append(f"column {name} changed from {was.target_type} "
                                         f"to {column.target_type}")
    for name in before:
        if name not in after:
            if name in old.key:
                plan.incompatible.append(f"key column {name} was dropped")
            else:
                plan.dropped.append(name)
    return plan
