"""What consumers receive: decoded row changes and whole windows."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from databus import batch
from databus.batch import EventBase
from databus.checkpoint import Checkpoint
from databus.event import Key, Op
from databus.schemas import Schema

_UNDECODED: Any = object()  # ``DataEvent._value`` before the first access


class DataEvent(EventBase):
    """One row change.

    ``op`` is ``Op.UPSERT`` or ``Op.DELETE``; ``value`` is the row as a dict (decoded with
    the consumer's reader schema when it pinned one, else the writer's); ``schema`` is
    the schema ``value`` follows.

    Values arrive *lazily* (docs/client.md, "Lazy values"): the client checks each
    value's Avro bytes when the response arrives (bad bytes refuse the response, as
    before), and decodes them on the first access of ``value``, once. A consumer that
    reads only keys and headers (a replicator folding a batch on its keys, a filter)
    never pays for decoding. ``value_bytes`` is the Avro encoding itself (None for a
    delete without a row, or an event built with its value already decoded). An event
    stays whole after its callback returns: it holds its own bytes.
    """

    # The fields are ``databus.batch.EventBase``'s: in C with the compiled event core,
    # which then builds the events of a relay body without a Python call each.
    __slots__ = ()

    scn: int
    source: str
    op: Op
    key: Key
    timestamp_ns: int
    schema: Schema | None
    partition_key: int
    from_bootstrap: bool  # served by the bootstrap service
    from_dump: bool  # a row of a table dump (header flag bit 2), not a change

    def __init__(self, scn: int, source: str, op: Op, key: Key, value: dict[str, Any] | None,
                 timestamp_ns: int, schema: Schema | None, partition_key: int = 0,
                 from_bootstrap: bool = False, from_dump: bool = False) -> None:
        self.scn = scn
        self.source = source
        self.op = op
        self.key = key
        self._value = value
        self._raw: bytes | None = None
        self._decode: Callable[[bytes], Any] | None = None
        self.timestamp_ns = timestamp_ns
        self.schema = schema
        self.partition_key = partition_key
        self.from_bootstrap = from_bootstrap
        self.from_dump = from_dump

    @property
    def value(self) -> dict[str, Any] | None:
        value = self._value
        if value is _UNDECODED:
            decode, raw = self._decode, self._raw
            assert decode is not None and raw is not None
            # Two threads may decode it at once (parallel consumers): same result.
            value = self._value = decode(raw)
        return value  # type: ignore[no-any-return]  # the fields are EventBase's (Any)

    @value.setter
    def value(self, value: dict[str, Any] | None) -> None:
        self._value = value

    @property
    def value_bytes(self) -> bytes | None:
        """The value's Avro bytes as the writer encoded them (schema fingerprint in the
        event header), when the event came from a stream; None otherwise."""
        return self._raw

    @property
    def decoded(self) -> bool:
        """Whether ``value`` has been decoded already (for tests and metrics)."""
        return self._value is not _UNDECODED

    @property
    def timestamp(self) -> datetime:
        """The source commit time."""
        return datetime.fromtimestamp(self.timestamp_ns / 1e9, tz=UTC)

    @property
    def is_delete(self) -> bool:
        return self.op is Op.DELETE

    def _fields(self) -> tuple[Any, ...]:
        return (self.scn, self.source, self.op, self.key, self.value, self.timestamp_ns,
                self.schema, self.partition_key, self.from_bootstrap, self.from_dump)

    def __eq__(self, other: object) -> bool:
        if type(other) is not DataEvent:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    def __repr__(self) -> str:
        names = ("scn", "source", "op", "key", "value", "timestamp_ns", "schema",
                 "partition_key", "from_bootstrap", "from_dump")
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(names, self._fields(), strict=True))
        return f"DataEvent({inner})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (DataEvent, self._fields())


def lazy_event(scn: int, source: str, op: Op, key: Key, raw: bytes,
               decode: Callable[[bytes], Any], timestamp_ns: int, schema: Schema | None,
               partition_key: int, from_bootstrap: bool, from_dump: bool) -> DataEvent:
    """A ``DataEvent`` whose value ``raw`` (already checked) is decoded on first access."""
    event = _new_event(DataEvent)
    event.scn = scn
    event.source = source
    event.op = op
    event.key = key
    event._value = _UNDECODED
    event._raw = raw
    event._decode = decode
    event.timestamp_ns = timestamp_ns
    event.schema = schema
    event.partition_key = partition_key
    event.from_bootstrap = from_bootstrap
    event.from_dump = from_dump
    return event


_new_event = EventBase.__new__
for _twin in ("python", "native"):  # both, so that either may fill events (tests)
    with contextlib.suppress(ImportError):
        batch.twin(_twin).set_undecoded(_UNDECODED)


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
    (``outcome``: ``done``, ``failed`` or ``cancelled``). ``Window.markers`` of the
    batch API and ``DatabusClient.windows`` hold them as they came; a batch consumer
    served per event (beside a consumer of the per-event callbacks) gets them without
    the dump id and row count, which ``on_dump_start(source)`` /
    ``on_dump_end(source, outcome)`` do not carry."""

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
    """A whole window (one source transaction): what ``Consumer.on_window`` and
    ``async for window in client.windows()`` receive.

    ``scn`` is the window's SCN (for a bootstrap snapshot batch, the snapshot's: its
    events keep their own SCNs); ``timestamp_ns`` the source commit time of the window;
    ``events`` its data events in commit order; ``markers`` its dump start/end markers
    in stream order (docs/dumps.md). A window may be kept after the callback that got
    it returns: it and its events own their data.
    """

    scn: int
    timestamp_ns: int
    events: list[DataEvent] = field(default_factory=list)
    # Dump start/end markers of this window, in stream order (docs/dumps.md).
    markers: list[DumpMarker] = field(default_factory=list)
    from_bootstrap: bool = False  # served by the bootstrap service

    @property
    def sources(self) -> list[str]:
        """The logical sources of the window's events, in the order they first appear."""
        return list(dict.fromkeys(e.source for e in self.events))

    @property
    def timestamp(self) -> datetime:
        """The source commit time."""
        return datetime.fromtimestamp(self.timestamp_ns / 1e9, tz=UTC)

    def __len__(self) -> int:
        return len(self.events)


# What the decoder and the pull loop hand to the dispatcher.
Item = DataEvent | EndOfWindow | StartOfWindow | BootstrapMark | DumpMarker
