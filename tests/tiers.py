"""The suite's two tiers (DESIGN section 13, docs/testing.md): one place that says how big
an acceptance run is.

``make test`` (what CI runs) takes every acceptance test at its *smoke* size: small
enough for the whole suite to stay within its time budget on two busy cores, big enough
that every kill, pause and failover path of the test still runs at least once.
``make test-full`` sets ``DATABUS_TEST_TIER=full``: each test at the size its issue
names. A test's own knob (``DATABUS_PG_ACCEPTANCE_SECONDS`` and the like) overrides both.
"""

from __future__ import annotations

import os

TIER = os.environ.get("DATABUS_TEST_TIER", "smoke").strip().lower() or "smoke"
if TIER not in ("smoke", "full"):
    raise ValueError(f"DATABUS_TEST_TIER={TIER!r}: expected 'smoke' or 'full'")
FULL = TIER == "full"


def size(knob: str, *, smoke: float, full: float) -> float:
    """The size of an acceptance run: the knob ``knob`` when it is set, else the tier's."""
    raw = os.environ.get(knob, "").strip()
    if raw:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{knob}={raw!r} is not a number") from None
    return full if FULL else smoke


def count(knob: str, *, smoke: int, full: int) -> int:
    """:func:`size` for a whole number (rows, events, examples)."""
    return int(size(knob, smoke=smoke, full=full))
