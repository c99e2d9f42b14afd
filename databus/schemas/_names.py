"""Column and table names as Avro names (pure). Every fetcher names its record fields
this way; the SQL name stays in the field's ``sql_name``."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["avro_name", "avro_names"]

_INVALID_RE = re.compile(r"[^A-Za-z0-9_]")


def avro_name(name: str) -> str:
    """``name`` as a valid Avro name: other characters become ``_``, a leading digit (or
    an empty name) gets a ``_`` prefix."""
    clean = _INVALID_RE.sub("_", name)
    return clean if clean and not clean[0].isdigit() else "_" + clean


def avro_names(names: Sequence[str]) -> list[str]:
    """Valid, distinct Avro names for ``names`` in order: a name that collides after
    sanitising gets ``_2``, ``_3``..."""
    taken: set[str] = set()
    out = []
    for name in names:
        base = candidate = avro_name(name)
        n = 2
        while candidate in taken:
            candidate = f"{base}_{n}"
            n += 1
        taken.add(candidate)
        out.append(candidate)
    return out
