"""Relay response bodies -> ``DataEvent``/``EndOfWindow`` items (pure, no I/O).

Every event's CRCs are checked. When a window arrives whole and unfiltered, its EOW
count and checksum are checked too: a relay that serves a window with an event missing
or reordered is caught here. A body that fails any check is rejected whole, and the
caller asks again (from the same checkpoint, possibly from another relay).

Bootstrap bodies use the same format but another framing (``Framing``): in a snapshot
batch the rows keep their own SCNs and only the EOW (carrying the snapshot's SCN) ends a
window, so the decoder emits ``StartOfWindow`` once it has seen that EOW. Bootstrap
windows are never checked against their EOW: the server builds them from stored rows.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from enum import Enum

from databus.client._events import DataEvent, EndOfWindow, Item, StartOfWindow
from databus.errors import EventFormatError
from databus.event import (
    EOW_SOURCE_ID,
    FLAG_FROM_SNAPSHOT,
    HEADER_SIZE,
    KEY_KIND_MASK,
    KeyKind,
    WindowChecksum,
    decode_key,
    iter_events,
)
from databus.schemas import AvroCodec, Schema

_EOW = struct.Struct(">II")
# An int key's bytes are the partition key itself (event.py), so no decode is needed.
_INT_KEY = int(KeyKind.INT)


class Framing(Enum):
    RELAY = "relay"  # a window is a run of one SCN, ended by its EOW
    CATCHUP = "catchup"  # bootstrap catch-up: relay framing, events from bootstrap
    SNAPSHOT = "snapshot"  # bootstrap snapshot: a window is everything up to an EOW


class ResponseDecoder:
    """Decodes bodies of one stream; keeps the window state that spans responses."""

    def __init__(
        self,
        codec: AvroCodec,
        *,
        reader_schemas: Mapping[str, Schema] | None = None,
        verify_windows: bool = True,
    ) -> None:
        self.codec = codec
        self.reader_schemas = dict(reader_schemas or {})
        self.verify_windows = verify_windows
        self.framing = Framing.RELAY
        self._window: int | None = None
        self._check = WindowChecksum()
        self._whole = False
        self._pending: list[DataEvent] = []  # a snapshot window's events before its EOW

    def reset(self, *, at_window_start: bool = True, framing: Framing = Framing.RELAY) -> None:
        """A new pull position: a window in progress is abandoned. ``at_window_start``
        is False when the position is inside a window (its start was not seen)."""
        self.framing = framing
        self._window = None
        self._check = WindowChecksum()
        self._whole = at_window_start
        self._pending = []

    @property
    def in_window(self) -> bool:
        """True when the bodies so far ended inside a window (before its EOW)."""
        if self.framing is Framing.SNAPSHOT:
            return bool(self._pending)
        return self._window is not None and self._check.count > 0

    def missing_fingerprints(self, body: bytes) -> set[int]:
        """Schema fingerprints used in ``body`` that the codec cannot resolve yet."""
        missing: set[int] = set()
        for _, header in iter_events(body, verify_body=False):
            fp = header.schema_fingerprint
            if header.source_id >= 0 and fp and fp not in missing and not self.codec.has(fp):
                missing.add(fp)
        return missing

    def decode(self, body: bytes, source_names: Mapping[int, str]) -> list[Item]:
        """All items of ``body``; raises ``EventFormatError`` if any check fails (the
        decoder's window state is then unchanged, so the body can be fetched again)."""
        saved = (self._window, self._check.count, self._check.crc, self._whole,
                 list(self._pending))
        try:
            return list(self._decode(body, source_names))
        except BaseException:
            (self._window, self._check.count, self._check.crc, self._whole,
             self._pending) = saved
            raise

    def _decode(self, body: bytes, source_names: Mapping[int, str]) -> Iterable[Item]:
        # Hot path: each event's CRCs are checked once (by iter_events), then fields
        # are sliced straight out of the body.
        codec_decode = self.codec.decode
        codec_schema = self.codec.schema
        readers = self.reader_schemas
        framing = self.framing
        snapshot = framing is Framing.SNAPSHOT
        bootstrap = framing is not Framing.RELAY
        verify = self.verify_windows and not bootstrap
        pending = self._pending
        check = self._check
        for offset, header in iter_events(body):
            scn = header.scn
            if scn != self._window and not snapshot:
                if self._window is not None and check.count:
                    # A new window began before the previous one's EOW: torn stream.
                    raise EventFormatError(
                        f"window {self._window} ended without its EOW", offset=offset,
                        reason="missing eow",
                    )
                self._window = scn
                check = self._check = WindowChecksum()
            source_id = header.source_id
            if source_id == EOW_SOURCE_ID:
                if header.value_length != _EOW.size:
                    raise EventFormatError("EOW payload is not 8 bytes", offset=offset,
                                           reason="bad length")
                count, checksum = _EOW.unpack_from(body, offset + HEADER_SIZE)
                if verify and self._whole and (count != check.count or checksum != check.crc):
                    raise EventFormatError(
                        f"window {scn}: {check.count} events and checksum "
                        f"{check.crc:08x}, EOW says {count} and {checksum:08x}",
                        offset=offset, reason="window checksum",
                    )
                self._window = None
                self._whole = True
                if pending:
                    # A snapshot window: only now is its SCN known.
                    yield StartOfWindow(scn)
                    yield from pending
                    pending.clear()
                yield EndOfWindow(scn, header.timestamp_ns, count)
                continue
            if source_id < 0:
                continue  # other control events (heartbeats) carry nothing to deliver
            check.add(header.header_crc)
            source = source_names.get(source_id)
            if source is None:
                raise EventFormatError(
                    f"unknown source id {source_id}", offset=offset, reason="unknown source"
                )
            start = offset + HEADER_SIZE
            key_end = start + header.key_length
            end = offset + header.total_length
            fp = header.schema_fingerprint
            reader = readers.get(source)
            value = codec_decode(body[key_end:end], fp, reader) if end > key_end else None
            kind = header.flags & KEY_KIND_MASK
            event = DataEvent(
                scn,
                source,
                header.op,
                header.partition_key if kind == _INT_KEY else decode_key(
                    KeyKind(kind), body[start:key_end]),
                value,
                header.timestamp_ns,
                reader if reader is not None else codec_schema(fp) if fp else None,
                header.partition_key,
                bootstrap or bool(header.flags & FLAG_FROM_SNAPSHOT),
            )
            if snapshot:
                pending.append(event)
            else:
                yield event
