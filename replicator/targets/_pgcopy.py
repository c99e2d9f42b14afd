"""PostgreSQL's binary COPY rows (``COPY ... FROM STDIN (FORMAT binary)``) for the
replicator's PostgreSQL target: ``binary_encoders(typnames)`` chooses an encoder per
column by its type, ``copy_binary(rows, encoders)`` writes the rows, or None when a value
has no encoder for its column (the caller writes the text format then).

Two twins with one signature, as ``databus.batch``: ``_pgcopy_native`` (Cython, built by
the package's build: numbers, text, ``bytea``, dates and UTC or naive timestamps written
in C, every other value through the reference's encoder) and ``_pgcopy_python`` (the
reference, where the format and every encoder is described). ``DATABUS_PURE_PYTHON=1``
forces the reference. The tests run both on the same rows
(``tests/integration/test_replicator_pgcopy.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from databus.batch import load_compiled
from databus.replicator.targets import _pgcopy_python
from databus.replicator.targets._pgcopy_python import (
    BINARY_TYPES,
    Encoders,
    binary_encoders,
)

__all__ = ["BINARY_TYPES", "IMPLEMENTATION", "Encoders", "binary_encoders", "copy_binary",
           "twin"]

_native, _ = load_compiled("databus.replicator.targets._pgcopy_native")
_impl: ModuleType = _native if _native is not None else _pgcopy_python
IMPLEMENTATION = "native" if _native is not None else "python"


# (rows, encoders) -> bytes or None (_pgcopy_python.copy_binary).
copy_binary: Callable[[Sequence[Sequence[Any]], Encoders], bytes | None] = _impl.copy_binary


def twin(name: str) -> ModuleType:
    """The module of one twin: "python" always, "native" if it was built."""
    if name == "python":
        return _pgcopy_python
    if name == "native":
        from databus.replicator.targets import _pgcopy_native  # type: ignore[attr-defined]

        return _pgcopy_native  # type: ignore[no-any-return]
    raise ValueError(f"no twin named {name!r}")
