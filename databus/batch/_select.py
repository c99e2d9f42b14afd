"""The relay's read rules over a run of trusted events (the ring of an event buffer):
which events a request gets, where its checkpoint stands, and the byte runs to serve
(``gather`` copies them out of the ring in one allocation).

``ReadState`` carries a read across the runs it is made of (the ring wraps, so one read
may be two runs); ``select_events`` in each twin applies the rules to one run.
The rules, for each event in order:

- an event of a window at or before ``after`` is not served;
- a data event the filter rejects is not served; neither are the first
  ``skip_events`` data events of window ``partial_scn`` (the checkpoint consumed them)
  nor the control events before them (a dump marker served with them already);
- EOWs always pass (the consumer's checkpoint moves through filtered windows);
- an event that would take the response past ``max_bytes`` ends it (``full``); when
  nothing that moves the checkpoint was served yet, ``pending`` says how many bytes the
  client needs.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# (source id, partition key, key bytes) -> pass?
Predicate = Callable[[int, int, bytes], bool]


@dataclass(slots=True)
class ReadState:
    after: int
    max_bytes: int
    partial_scn: int | None = None
    skip_events: int = 0
    # Progress (carried over the runs of one read).
    win_scn: int | None = None
    win_seen: int = 0
    skip: int = 0
    size: int = 0
    events: int = 0
    windows: int = 0
    cp_scn: int = 0
    cp_offset: int = 0
    cp_size: int = 0
    pending: int | None = None
    full: bool = False
    first: int | None = None  # position of the first byte served
    # The byte runs to serve, flat: start, end, start, end... (``gather`` copies them).
    runs: array[int] = field(default_factory=lambda: array("q"))


@dataclass(frozen=True, slots=True)
class FilterPlan:
    """What a request asks of the data events of a buffer.

    ``wanted``: the source ids it streams (None: all); ``filters``: a source filter by
    id (``databus.filters.SourceFilter``: mod, hash, range or interval); ``resolve``:
    for an id in neither (a source created after the request began), its
    ``(wanted, filter)``, asked once per id; ``predicate``: any other test, called
    per event (tests use it; it makes the compiled twin call back into Python).
    A source filter has ``passes(pkey, key)``; the compiled twin also reads the kind
    and fields of ``databus.filters``' mod, hash, range and interval filters.
    """

    wanted: frozenset[int] | None = None
    filters: dict[int, Any] = field(default_factory=dict)
    resolve: Callable[[int], tuple[bool, Any]] | None = None
    predicate: Predicate | None = None
    needs_key: bool = False  # some filter (hash) reads the key bytes
