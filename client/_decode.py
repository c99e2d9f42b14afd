"""Relay response bodies -> ``DataEvent``/``EndOfWindow`` items (pure, no I/O).

Every event's CRCs are checked. When a window arrives whole and unfiltered, its EOW
count and checksum are checked too: a relay that serves a window with an event missing
or reordered is caught here. A body that fails any check is rejected whole, and the
caller asks again (from the same checkpoint, possibly from another relay).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from databus.client._events import DataEvent, EndOfWindow
from databus.errors import EventFormatError
from databus.event import (
    EOW_SOURCE_ID,
    HEADER_SIZE,
    WindowChecksum,
    decode_eow,
    decode_event,
    decode_key,
    iter_events,
)
from databus.schemas import AvroCodec, Schema

Item = DataEvent | EndOfWindow


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
        self._window: int | None = None
        self._check = WindowChecksum()
        self._whole = False

    def reset(self, *, at_window_start: bool = True) -> None:
        """A new pull position: a window in progress is abandoned. ``at_window_start``
        is False when the position is inside a window (its start was not seen)."""
        self._window = None
        self._check = WindowChecksum()
        self._whole = at_window_start

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
        saved = (self._window, self._check.count, self._check.crc, self._whole)
        try:
            return list(self._decode(body, source_names))
        except BaseException:
            self._window, self._check.count, self._check.crc, self._whole = saved
            raise

    def _decode(self, body: bytes, source_names: Mapping[int, str]) -> Iterable[Item]:
        codec = self.codec
        readers = self.reader_schemas
        for offset, header in iter_events(body):
            scn = header.scn
            if scn != self._window:
                if self._window is not None and self._check.count:
                    # A new window began before the previous one's EOW: torn stream.
                    raise EventFormatError(
                        f"window {self._window} ended without its EOW", offset=offset,
                        reason="missing eow",
                    )
                self._window = scn
                self._check = WindowChecksum()
            source_id = header.source_id
            if source_id == EOW_SOURCE_ID:
                eow = decode_eow(decode_event(body, offset))
                if self.verify_windows and self._whole and (
                    eow.event_count != self._check.count or eow.checksum != self._check.crc
                ):
                    raise EventFormatError(
                        f"window {scn}: {self._check.count} events and checksum "
                        f"{self._check.crc:08x}, EOW says {eow.event_count} and "
                        f"{eow.checksum:08x}", offset=offset, reason="window checksum",
                    )
                self._window = None
                self._whole = True
                yield EndOfWindow(scn, header.timestamp_ns, eow.event_count)
                continue
            if source_id < 0:
                continue  # other control events (heartbeats) carry nothing to deliver
            self._check.add(header.header_crc)
            source = source_names.get(source_id)
            if source is None:
                raise EventFormatError(
                    f"unknown source id {source_id}", offset=offset, reason="unknown source"
                )
            start = offset + HEADER_SIZE
            key_end = start + header.key_length
            value_bytes = body[key_end : offset + header.total_length]
            fp = header.schema_fingerprint
            reader = readers.get(source)
            value = codec.decode(value_bytes, fp, reader) if value_bytes else None
            yield DataEvent(
                scn=scn,
                source=source,
                op=header.op,
                key=decode_key(header.key_kind, body[start:key_end]),
                value=value,
                timestamp_ns=header.timestamp_ns,
                schema=reader if reader is not None else codec.schema(fp) if fp else None,
                partition_key=header.partition_key,
                from_bootstrap=header.from_snapshot,
            )
