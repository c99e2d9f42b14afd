"""What consumers receive: decoded row changes and whole windows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from databus.checkpoint import Checkpoint
from databus.event import Key, Op
from databus.schemas import Schema


@dataclass(slots=True)
class DataEvent:
    """One row change, decoded.

    ``op`` is ``Op.UPSERT`` or ``Op.DELETE``; ``value`` is the row as a dict (decoded with
    the consumer's reader schema when it pinned one, else the writer's); ``schema`` is
    the schema ``value`` follows. Not frozen: it is built once per event on the hot path.
    """

    scn: int
    source: str
    op: Op
    key: Key
    value: dict[str, Any] | None
    timestamp_ns: int
    schema: Schema | None
    partition_key: int = 0
    from_bootstrap: bool = False  # served by the bootstrap service
    from_dump: bool = False  # a row of a table dump (header flag bit 2), not a change

    @property
    def timestamp(self) -> datetime:
        """The source commit time."""
        return datetime.fromtimestamp(self.timestamp_ns / 1e9, tz=UTC)

    @property
    def is_delete(self) -> bool:
        return self.op is Op.DELETE


@dataclass(slots=True)
class EndOfWindow:
    """The end of window ``scn``: ``event_count`` events were in it (before filtering).

    ``checkpoint`` is what to commit after this window when it is not the online
    checkpoint at ``scn``: a bootstrap response's checkpoint rides on its last window.
    """

    scn: int
    timestamp_ns: int
    event_count: int
    checkpoint: Checkpoint | None = None


@dataclass(slots=True)
class StartOfWindow:
    """Opens window ``scn`` whose events keep SCNs of their own (a bootstrap snapshot
    batch); relay windows need no such marker, their first event opens them."""

    scn: int


@dataclass(slots=True)
class DumpMarker:
    """A table's dump starts (``start`` True) or ends in window ``scn`` (docs/dumps.md);
    an end marker says how many rows the dump emitted for the table and how it ended
    (``outcome``: ``done``, ``failed`` or ``cancelled``). In ``Window.markers``
    (``DatabusClient.windows``) the dump id and row count are None: they reach
    consumers only as ``on_dump_start(source)`` / ``on_dump_end(source, outcome)``."""

    scn: int
    source: str
    dump_id: str | None
    start: bool
    rows: int | None = None
    outcome: str | None = None  # end markers only


@dataclass(slots=True)
class BootstrapMark:
    """Not a row: the bootstrap begins (``end`` False) or has delivered its last window."""

    end: bool


@dataclass(slots=True)
class Window:
    """A whole window, for ``async for window in client.windows()``."""

    scn: int
    timestamp_ns: int
    events: list[DataEvent] = field(default_factory=list)
    # Dump start/end markers of this window, in stream order (docs/dumps.md).
    markers: list[DumpMarker] = field(default_factory=list)

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(e.source for e in self.events))


# What the decoder and the pull loop hand to the dispatcher.
Item = DataEvent | EndOfWindow | StartOfWindow | BootstrapMark | DumpMarker
