"""Relay response bodies -> ``DataEvent``/``EndOfWindow`` items (pure, no I/O).

Every event's CRCs are checked, and then every field a relay could have forged with
CRCs recomputed: keys (UTF-8, canonical composite JSON, the partition key derived from
them), control-event fields, and the Avro value against its writer schema. Any failure
is an ``EventFormatError``; nothing else escapes. When a window arrives whole and
unfiltered, its EOW count and checksum are checked too: a relay that serves a window
with an event missing or reordered is caught here. A body that fails any check is
rejected whole, and the caller asks again (from the same checkpoint, possibly from
another relay); a failed window check condemns the whole window (``WINDOW_FAILURES``),
which is then asked for again from its start.

A window's events are held until its EOW (see ``ResponseDecoder``).

Bootstrap bodies use the same format but another framing (``Framing``): in a snapshot
batch the rows keep their own SCNs and only the EOW (carrying the snapshot's SCN) ends a
window, so the decoder emits ``StartOfWindow`` once it has seen that EOW. Bootstrap
windows are never checked against their EOW: the server builds them from stored rows.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any

from databus import batch
from databus.batch import Scan
from databus.client._events import (
    DataEvent,
    DumpMarker,
    EndOfWindow,
    Item,
    StartOfWindow,
    Window,
    lazy_event,
)
from databus.errors import EventFormatError, SchemaError, UnknownSchemaError
from databus.event import (
    DUMP_END_SOURCE_ID,
    DUMP_START_SOURCE_ID,
    EOW_SOURCE_ID,
    FLAG_FROM_SNAPSHOT,
    HEADER_SIZE,
    EventHeader,
    WindowChecksum,
    check_control_fields,
    decode_data_key,
    decode_dump_marker,
)
from databus.schemas import AvroCodec, Schema
from databus.schemas._program import compile_program

_EOW = struct.Struct(">II")
# The ``reason`` of failures that condemn a whole window, not just one response: the
# window must be fetched again from its start (its earlier part may be the bad one).
WINDOW_CHECK = "window checksum"
MISSING_EOW = "missing eow"
WINDOW_FAILURES = frozenset({WINDOW_CHECK, MISSING_EOW})


class Framing(Enum):
    RELAY = "relay"  # a window is a run of one SCN, ended by its EOW
    CATCHUP = "catchup"  # bootstrap catch-up: relay framing, events from bootstrap
    SNAPSHOT = "snapshot"  # bootstrap snapshot: a window is everything up to an EOW


class ResponseDecoder:
    """Decodes bodies of one stream; keeps the window state that spans responses.

    A window's data events are *held* until its EOW has arrived and checked out, so a
    window split over several responses (``max_bytes`` smaller than the window) never
    reaches the consumer before its count and checksum are verified (docs/client.md,
    "Windows split over responses"). The caller bounds what is held: ``held_bytes``
    says how much, and ``release_held`` hands the held events over to be delivered
    unverified (``spilled``) when a window does not fit in the client's buffer.
    """

    def __init__(
        self,
        codec: AvroCodec,
        *,
        reader_schemas: Mapping[str, Schema] | None = None,
        verify_windows: bool = True,
        lazy: bool = True,
    ) -> None:
        self.codec = codec
        self.reader_schemas = dict(reader_schemas or {})
        self.verify_windows = verify_windows
        self.framing = Framing.RELAY
        self._window: int | None = None
        self._check = WindowChecksum()
        self._whole = False
        # The open window's events, held until its EOW (every framing; for a snapshot
        # window that EOW also gives its SCN).
        self._pending: list[DataEvent | DumpMarker] = []
        self._held_bytes = 0
        self._spilled = False  # the open window's events go out as they arrive
        self._last_scan: tuple[bytes, Scan] | None = None
        # (source, writer fingerprint) -> (decode, schema, the reader schema it is for).
        self._value_decoders: dict[tuple[str, int], tuple[Callable[[bytes], Any],
                                                          Schema | None, Schema | None,
                                                          Any]] = {}
        # Values checked at receive time and decoded on first access (docs/client.md,
        # "Lazy values"); False decodes every value at once, as before.
        self.lazy = lazy
        # Relay bodies in one call of the event core (``_decode_fast``); False: the
        # reference path for every body (the tests hold the two equal).
        self.fast = True
        # Windows that begin and end in a body come as one ``Window`` item each (the
        # batch API's delivery, ``_batches.py``); the client sets it for batch consumers.
        self.whole_windows = False

    def reset(self, *, at_window_start: bool = True, framing: Framing = Framing.RELAY) -> None:
        """A new pull position: a window in progress is abandoned. ``at_window_start``
        is False when the position is inside a window (its start was not seen)."""
        self.framing = framing
        self._window = None
        self._check = WindowChecksum()
        self._whole = at_window_start
        self._pending = []
        self._held_bytes = 0
        self._spilled = False

    @property
    def in_window(self) -> bool:
        """True when the bodies so far ended inside a window (before its EOW)."""
        if self.framing is Framing.SNAPSHOT:
            return bool(self._pending)
        return self._window is not None and self._check.count > 0

    @property
    def window_scn(self) -> int | None:
        """The SCN of the open window, if any."""
        return self._window if self.in_window else None

    @property
    def held_bytes(self) -> int:
        """Bytes of the held (not yet returned) events of the open window."""
        return self._held_bytes

    @property
    def spilled(self) -> bool:
        """True when some events of the open window were returned before its EOW."""
        return self._spilled

    def release_held(self) -> list[Item]:
        """Hand over the open relay window's held events, unverified; the rest of that
        window is returned as it arrives, and its EOW is still checked (a failure then
        needs a rollback: ``spilled``)."""
        if self.framing is Framing.SNAPSHOT:
            return []  # a snapshot window's SCN is known only at its EOW
        held: list[Item] = list(self._pending)
        self._pending = []
        self._held_bytes = 0
        self._spilled = bool(held) or self._spilled
        return held

    def discard_window(self) -> None:
        """Forget the open window (its check failed): the caller asks for it again
        from its start, so the next window begins whole."""
        self._window = None
        self._check = WindowChecksum()
        self._whole = True
        self._pending = []
        self._held_bytes = 0
        self._spilled = False

    def missing_fingerprints(self, body: bytes, found: Scan | None = None) -> set[int]:
        """Schema fingerprints used in ``body`` that the codec cannot resolve yet
        (``found``: the body's scan, when the caller has one)."""
        if found is not None:
            self._last_scan = (body, found)
        s = self._scan(body)
        if s.error is not None and s.error.reason != "body crc":
            raise s.error  # as a header walk would (the body CRCs are checked in decode)
        missing: set[int] = set()
        has = self.codec.has
        for fp, sid in set(zip(s.fingerprint, s.source_id, strict=True)):
            if sid >= 0 and fp and not has(fp):
                missing.add(fp)
        return missing

    def _scan(self, body: bytes) -> Scan:
        # One scan per body: missing_fingerprints and decode of the same body share it.
        last = self._last_scan
        if last is not None and last[0] is body:
            return last[1]
        s = batch.scan(body)
        self._last_scan = (body, s)
        return s

    def decode(self, body: bytes, source_names: Mapping[int, str],
               found: Scan | None = None) -> list[Item]:
        """All items of ``body`` that can be delivered; raises ``EventFormatError`` if
        any check fails (the decoder's state is then unchanged, so the body can be
        fetched again). Every failure to decode is an ``EventFormatError``.

        ``found`` is the body's scan when the caller has one (a relay answer comes with
        the scan its check made: ``databus.client._answers``, which also checks that the
        relay's checkpoint stands where the body ends)."""
        if found is not None:
            self._last_scan = (body, found)
        if self.fast and self.framing is Framing.RELAY and not self._spilled and self.lazy:
            fast = self._decode_fast(body, source_names)
            if fast is not None:
                return fast
        # Events are only appended to the held list until an EOW replaces it, so its
        # length is enough to restore it.
        pending = self._pending
        saved = (self._window, self._check.count, self._check.crc, self._whole,
                 pending, len(pending), self._held_bytes, self._spilled)
        try:
            return list(self._decode(body, source_names))
        except BaseException:
            (self._window, self._check.count, self._check.crc, self._whole,
             self._pending, size, self._held_bytes, self._spilled) = saved
            del pending[size:]
            raise

    def _decode_fast(self, body: bytes, source_names: Mapping[int, str]) -> list[Item] | None:
        """The items of a relay body by the event core's one-call fast path
        (``batch.decode_relay_body``), or None when the body needs the reference path
        below (a dump marker, anything wrong): that path then gives the same items or
        the exact error. Nothing changes here unless the fast path succeeds."""
        s = self._scan(body)
        if s.error is not None:
            return None
        check = self._check
        try:
            found = batch.decode_relay_body(
                body, s, source_names, self._value_decoder(source_names), DataEvent,
                DataEvent, EndOfWindow, self._window, check.count, check.crc, self._whole,
                self.verify_windows, Window if self.whole_windows else None)
        except (SchemaError, UnknownSchemaError):
            return None  # the reference path says which event and why
        if found is None:
            return None
        self._last_scan = None
        items, held_from, eows, self._window, check.count, check.crc, self._whole, held = found
        if not eows:  # the open window goes on: all of it is held
            self._pending.extend(items)
            self._held_bytes += held
            return []
        out: list[Item] = [*self._pending, *items[:held_from]]
        self._pending = items[held_from:]
        self._held_bytes = held
        return out

    def _decode(self, body: bytes, source_names: Mapping[int, str]) -> Iterable[Item]:
        # Hot path: one scan checks every CRC and gives the header fields as arrays;
        # runs of data events between control events are counted into the window
        # checksum and decoded in one batch call each (databus.batch).
        s = self._scan(body)
        self._last_scan = None
        s.check()
        framing = self.framing
        snapshot = framing is Framing.SNAPSHOT
        bootstrap = framing is not Framing.RELAY
        verify = self.verify_windows and not bootstrap
        check = self._check
        n = s.count
        scns, sids, offsets = s.scn, s.source_id, s.offset
        frames = batch.frame_windows(s, self._window, check.count, check.crc)
        controls = list(frames.controls)
        controls.append(n)
        next_control = 0
        i = 0
        while i < n:
            scn = scns[i]
            offset = offsets[i]
            if scn != self._window and not snapshot:
                if self._window is not None and check.count:
                    # A new window began before the previous one's EOW: torn stream.
                    raise EventFormatError(
                        f"window {self._window} ended without its EOW", offset=offset,
                        reason=MISSING_EOW,
                    )
                self._window = scn
                check = self._check = WindowChecksum()
            source_id = sids[i]
            if source_id >= 0:
                while controls[next_control] < i:
                    next_control += 1
                stop = controls[next_control]
                if not snapshot and 0 <= frames.broken < stop:
                    stop = max(frames.broken, i + 1)
                check.count, check.crc = batch.window_checksum(s, i, stop, check.count,
                                                               check.crc)
                events = self._data_events(body, s, i, stop, source_names, bootstrap)
                if self._spilled:
                    yield from events
                else:
                    self._pending.extend(events)
                    self._held_bytes += sum(s.length[i:stop])
                i = stop
                continue
            i += 1
            header = s.header(i - 1)
            check_control_fields(header, offset)
            if source_id in (DUMP_START_SOURCE_ID, DUMP_END_SOURCE_ID):
                marker = self._marker(body, offset, header, source_names)
                if marker is None:
                    continue
                if self._spilled:
                    yield marker
                else:
                    self._pending.append(marker)
                continue
            if source_id != EOW_SOURCE_ID:
                continue  # other control events (heartbeats) carry nothing to deliver
            count, checksum = _EOW.unpack_from(body, offset + HEADER_SIZE)
            if verify and self._whole and (count != check.count or checksum != check.crc):
                raise EventFormatError(
                    f"window {scn}: {check.count} events and checksum "
                    f"{check.crc:08x}, EOW says {count} and {checksum:08x}",
                    offset=offset, reason=WINDOW_CHECK,
                )
            self._window = None
            self._whole = True
            held, self._pending = self._pending, []
            self._held_bytes = 0
            self._spilled = False
            if held:
                if snapshot:
                    yield StartOfWindow(scn)  # a snapshot window: only now is its SCN known
                yield from held
            yield EndOfWindow(scn, header.timestamp_ns, count)

    def _value_decoder(self, source_names: Mapping[int, str]
                       ) -> Callable[[int, int], tuple[Callable[[bytes], Any], Schema | None,
                                                       Any]]:
        """``value_decoder(source_id, fingerprint)`` as the event core asks for it."""
        codec, readers = self.codec, self.reader_schemas
        cache = self._value_decoders
        lazy = self.lazy

        def value_decoder(source_id: int, fingerprint: int
                          ) -> tuple[Callable[[bytes], Any], Schema | None, Any]:
            # Cached by source name and fingerprint: a run of one-event windows asks
            # once per window. Values are checked now and decoded on first access
            # (``lazy_event``) when the writer's own schema reads them; a value resolved
            # to another reader schema is decoded now (resolution itself may fail).
            name = source_names[source_id]
            reader = readers.get(name)
            found = cache.get((name, fingerprint))
            if found is None or found[2] is not reader:
                program = None
                if not fingerprint:
                    found = (functools.partial(codec.decode, writer=0, reader=reader),
                             reader, reader, None)
                else:
                    writer = codec.schema(fingerprint)
                    if lazy and (reader is None or reader.fingerprint == fingerprint):
                        program = compile_program(reader or writer)
                    found = (codec.decoder(fingerprint, reader),
                             reader if reader is not None else writer, reader, program)
                cache[(name, fingerprint)] = found
            return found[0], found[1], found[3]

        return value_decoder

    def _data_events(self, body: bytes, s: Scan, first: int, stop: int,
                     source_names: Mapping[int, str], bootstrap: bool) -> list[DataEvent]:
        """The data events ``first..stop`` of a scan, decoded in one batch call; a value
        that does not decode is found again event by event for its exact error."""
        value_decoder = self._value_decoder(source_names)
        try:
            events: list[DataEvent] = batch.decode_events(
                body, s, first, stop, source_names, value_decoder, DataEvent, bootstrap,
                lazy_event)
        except (SchemaError, UnknownSchemaError):
            for i in range(first, stop):  # raises the first event's error, with its offset
                source = source_names[s.source_id[i]]
                self._data_event(body, s.offset[i], s.header(i), source,
                                 self.reader_schemas.get(source),
                                 bootstrap)
            raise
        return events

    def _marker(self, body: bytes, offset: int, header: EventHeader,
                source_names: Mapping[int, str]) -> DumpMarker | None:
        """A dump marker of a source this client reads, else None (dropped)."""
        start = offset + HEADER_SIZE + header.key_length
        marker = decode_dump_marker(header, body[start:offset + header.total_length], offset)
        if marker.source not in source_names.values():
            return None
        return DumpMarker(header.scn, marker.source, marker.dump_id, marker.kind == "start",
                          marker.rows, marker.outcome)

    def _data_event(self, body: bytes, offset: int, header: EventHeader, source: str,
                    reader: Schema | None, bootstrap: bool) -> DataEvent:
        start = offset + HEADER_SIZE
        key_end = start + header.key_length
        end = offset + header.total_length
        key = decode_data_key(header, body[start:key_end], offset)
        fp = header.schema_fingerprint
        try:
            # A known fingerprint does not make the bytes fit its schema (a relay may
            # recompute CRCs): any decoding failure is a bad event, never a crash.
            value = self.codec.decode(body[key_end:end], fp, reader) if end > key_end else None
            schema = reader if reader is not None else self.codec.schema(fp) if fp else None
        except (SchemaError, UnknownSchemaError) as exc:
            raise EventFormatError(f"event value: {exc}", offset=offset,
                                   reason="bad value") from exc
        return DataEvent(
            header.scn, source, header.op, key, value, header.timestamp_ns, schema,
            header.partition_key, bootstrap, bool(header.flags & FLAG_FROM_SNAPSHOT),
        )
