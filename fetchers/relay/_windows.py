"""Whole windows out of an upstream relay's response bodies, and source ids remapped
(pure, no I/O).

``WindowAssembler`` takes the bodies of one upstream read position after another (as
the client library's ``RelayPuller`` hands them out: a body may end anywhere inside a
window, and the next body goes on from there) and gives back only the windows whose
EOW it has seen, each with its events' bytes exactly as the upstream served them, in
order, dump markers included. A window still open at the end of a body is held until
the next one; ``reset`` drops it (the connection was cut: the window is read again from
its start, never ended here early). Every event's CRCs are checked (``databus.batch``'s
scan), an SCN change before an EOW is a torn window, and stream controls that have no
place in a body are refused: each is an ``EventFormatError`` marked retriable (a bad
answer: roll back, ask again).

``SourceIdMap`` maps an upstream's source ids to this relay's by name: source ids are
per relay, names are what the two relays share. ``remap_event`` rewrites one event's id
and its header CRC (``databus.event.restamp_source_id``); the body and its CRC are
untouched, and an event whose id is already this relay's comes out as the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from databus import batch
from databus.errors import EventFormatError
from databus.event import (
    DUMP_END_SOURCE_ID,
    DUMP_START_SOURCE_ID,
    EOW_SOURCE_ID,
    QUARANTINE_SOURCE_ID,
    WindowChecksum,
    restamp_source_id,
)

__all__ = ["SourceIdMap", "UpstreamWindow", "WindowAssembler", "bad_answer", "remap_event"]

_EOW_VALUE = struct.Struct(">II")
# Markers travel with their window: dump start/end and quarantine (relay/quarantine/_record.py).
_MARKERS = frozenset({DUMP_START_SOURCE_ID, DUMP_END_SOURCE_ID, QUARANTINE_SOURCE_ID})


def bad_answer(message: str) -> EventFormatError:
    """An upstream answer that cannot be stored: retriable (ask again, maybe elsewhere)."""
    error = EventFormatError(message, reason="bad answer")
    error.retriable = True
    return error


@dataclass(slots=True)
class UpstreamWindow:
    """One whole window as the upstream served it.

    ``events`` are (source id, raw bytes) in stream order: data events (id >= 0) and
    dump markers (-6/-7); the EOW is not among them (this relay's buffer writes its own,
    with ``timestamp_ns``). ``count``/``checksum`` are what the received data events
    add up to, ``eow_count``/``eow_checksum`` what the upstream's EOW says: they differ
    when the upstream filtered the window (``filter=``, or sources it holds that were
    not asked for).
    """

    scn: int
    timestamp_ns: int = 0
    events: list[tuple[int, bytes]] = field(default_factory=list)
    count: int = 0
    checksum: int = 0
    eow_count: int = 0
    eow_checksum: int = 0

    @property
    def complete(self) -> bool:
        """Every data event of the upstream's window is here (same count)."""
        return self.count == self.eow_count


class WindowAssembler:
    """Bodies in, whole windows out (see the module docstring)."""

    def __init__(self) -> None:
        self._open: UpstreamWindow | None = None
        self._check = WindowChecksum()

    @property
    def open_scn(self) -> int | None:
        """The SCN of the window begun but not ended by the bodies so far."""
        return self._open.scn if self._open is not None else None

    def reset(self) -> None:
        """Drop the open window (it is read again from its start)."""
        self._open = None
        self._check = WindowChecksum()

    def feed(self, body: bytes, found: batch.Scan | None = None) -> list[UpstreamWindow]:
        """The windows ``body`` ends; a bad body raises and leaves the state unchanged.
        ``found`` is the body's scan when the caller has one."""
        if not body:
            return []
        if found is None:
            found = batch.scan(body)
        if found.error is not None:
            raise bad_answer(f"upstream body: {found.error}")
        done: list[UpstreamWindow] = []
        current, check = self._open, self._check
        if current is not None:  # a copy: a body that fails below leaves self as it was
            current = UpstreamWindow(current.scn, 0, list(current.events), current.count,
                                     current.checksum)
            check = WindowChecksum()
            check.count, check.crc = self._check.count, self._check.crc
        offsets, lengths, scns, sids = found.offset, found.length, found.scn, found.source_id
        for i in range(found.count):
            scn, sid = scns[i], sids[i]
            if current is None:
                current = UpstreamWindow(scn)
                check = WindowChecksum()
            elif scn != current.scn:
                raise bad_answer(f"upstream window {current.scn} was not ended before "
                                 f"window {scn} began")
            start = offsets[i]
            raw = body[start:start + lengths[i]]
            if sid >= 0:
                current.events.append((sid, raw))
                check.add(found.header_crc[i])
            elif sid in _MARKERS:
                current.events.append((sid, raw))
            elif sid == EOW_SOURCE_ID:
                value_start, value_end = found.value_span(i)
                if value_end - value_start != _EOW_VALUE.size:
                    raise bad_answer(f"upstream EOW of window {scn} is not 8 bytes")
                current.eow_count, current.eow_checksum = _EOW_VALUE.unpack_from(
                    body, value_start)
                current.timestamp_ns = found.timestamp[i]
                current.count, current.checksum = check.count, check.crc
                done.append(current)
                current = None
            else:
                raise bad_answer(f"upstream body holds a control event with source id {sid}")
        if current is not None:
            current.count, current.checksum = check.count, check.crc
        self._open, self._check = current, check
        return done


class SourceIdMap:
    """Upstream source ids -> this relay's, by name (see the module docstring).

    ``local_id(name)`` gives (allocates) this relay's id of a source; ``allowed`` are
    the sources this buffer holds: an upstream event of another source is a bad answer
    (the upstream was asked for these only), never a new source bound to this buffer.
    The map of each upstream is cached until that upstream's id -> name map changes.
    """

    def __init__(self, local_id: Callable[[str], int], allowed: frozenset[str]) -> None:
        self._local_id = local_id
        self._allowed = allowed
        self._names: dict[str, Mapping[int, str]] = {}
        self._ids: dict[str, dict[int, int]] = {}

    def local(self, upstream: str, names: Mapping[int, str], source_id: int) -> int:
        """This relay's id for ``source_id`` of ``upstream`` (whose map is ``names``)."""
        if self._names.get(upstream) is not names:
            self._names[upstream] = names
            self._ids[upstream] = {}
        ids = self._ids[upstream]
        local = ids.get(source_id)
        if local is None:
            name = names.get(source_id)
            if name is None:
                raise bad_answer(f"upstream {upstream} sent source id {source_id}, which its "
                                 "/v1/sources does not list")
            if name not in self._allowed:
                raise bad_answer(f"upstream {upstream} sent events of source {name!r}, which "
                                 "this buffer does not hold (sources=)")
            local = ids[source_id] = self._local_id(name)
        return local


def remap_event(raw: bytes, upstream_id: int, local_id: int) -> bytes:
    """``raw`` with source id ``local_id`` (header CRC recomputed); the same bytes when the
    ids agree."""
    return raw if upstream_id == local_id else restamp_source_id(raw, local_id)
