"""Which sources a reader may read: pure matching of names against its grants.

A grant is ``db.table`` (that source), ``db.*`` (every table of database ``db``, now
and later) or ``*`` (every source). ``Grant.narrow`` is how a subscription that names
no source, or names a pattern, is cut down to what the reader may see: the relay and
the bootstrap never widen a request, they only answer part of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


def _matches(grant: str, name: str) -> bool:
    if grant == "*":
        return True
    if grant.endswith(".*"):
        database, dot, table = name.rpartition(".")
        return bool(dot) and bool(table) and database == grant[:-2]
    return grant == name


@dataclasses.dataclass(frozen=True)
class Grant:
    """The sources one reader may read (``everything``: no restriction, the grant of
    an anonymous reader on a relay with no readers configured)."""

    patterns: tuple[str, ...] = ()
    everything: bool = False

    @classmethod
    def all(cls) -> Grant:
        return cls(everything=True)

    def allows(self, source: str) -> bool:
        """Whether the source called ``source`` (``db.table``) may be read."""
        return self.everything or any(_matches(g, source) for g in self.patterns)

    def narrow(self, sources: Iterable[str]) -> list[str]:
        """The names of ``sources`` this grant allows, in their order."""
        return [s for s in sources if self.allows(s)]

    def refused(self, sources: Iterable[str]) -> list[str]:
        """The names of ``sources`` this grant does not allow, in their order."""
        return [s for s in sources if not self.allows(s)]


def overlaps(pattern: str, grant: Grant) -> bool:
    """Whether some source (existing or not) matches both the requested ``pattern``
    (``db.*``, ``*`` or a name) and ``grant``."""
    if grant.everything or pattern == "*" or "*" in grant.patterns:
        return True
    database = pattern[:-2] if pattern.endswith(".*") else None
    for granted in grant.patterns:
        if database is None:
            if _matches(granted, pattern):
                return True
        elif granted.rpartition(".")[0] == database:
            return True  # db.* or db.table of the same database
    return False


def is_pattern(name: str) -> bool:
    """Whether a requested source name is a pattern (``db.*`` or ``*``)."""
    return name == "*" or name.endswith(".*")


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether the requested pattern (or plain name) ``pattern`` covers ``name``."""
    return _matches(pattern, name)
