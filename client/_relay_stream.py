"""Reading a streaming subscription (``GET /v1/stream?...&follow=true``).

The relay writes whole events; after each write a CHECKPOINT control event (-3) whose
value is the checkpoint after it, a HEARTBEAT (-5) when idle, and an ERROR (-4) before
it ends the response (relay/_streaming.py has the layout). ``StreamFramer`` is the pure
part: bytes in (as the socket gives them, cut anywhere), writes out, each one a body of
events and the checkpoint after it, exactly what one polling response carries. The
bodies go through the same decoder, window checks and failover as polled ones.

The framer checks each event's header (magic, version, lengths, header CRC) to find
where it ends; body CRCs are checked by the decoder as for a polled body, and the
control events' here. Anything else than a cut-off last event is damage: an
``EventFormatError`` (retriable), after which the client reconnects from its checkpoint.

What it holds is bounded by the write size the stream was opened with (``limit``, the
request's ``max_bytes``): a write may pass it by its last event only (a single event
larger than the limit is written alone), so a data event that begins at or past the
limit is refused as soon as its header arrives, before its bytes are held
(``databus.client._answers``, "oversize answer").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from databus.batch import scan
from databus.checkpoint import Checkpoint
from databus.client._answers import OVERSIZE, refused
from databus.client._headers import bad_answer
from databus.errors import CheckpointError, EventFormatError
from databus.event import (
    CHECKPOINT_SOURCE_ID,
    ERROR_SOURCE_ID,
    HEADER_SIZE,
    HEARTBEAT_SOURCE_ID,
    decode_event,
    decode_header,
)

__all__ = ["StreamFrame", "StreamFramer"]

_STREAM_CONTROLS = frozenset({CHECKPOINT_SOURCE_ID, ERROR_SOURCE_ID, HEARTBEAT_SOURCE_ID})
# A JSON control value larger than this is not one a relay writes.
_MAX_CONTROL_VALUE = 64 * 1024


@dataclass(frozen=True, slots=True)
class StreamFrame:
    """One unit of a stream: ``kind`` is "write" (``body`` and the ``checkpoint`` after
    it, ``timestamp_ns`` of its last window), "heartbeat" (``min_scn``/``max_scn`` of the
    buffer) or "error" (``error``: the JSON error body)."""

    kind: str
    body: bytes = b""
    checkpoint: Checkpoint | None = None
    timestamp_ns: int = 0
    min_scn: int | None = None
    max_scn: int | None = None
    error: dict[str, object] | None = None


class StreamFramer:
    """Cuts a stream's bytes into ``StreamFrame``s. Feed bytes; take frames."""

    def __init__(self, limit: int | None = None) -> None:
        self._buf = bytearray()
        self._scanned = 0  # end of the last whole event seen
        self.ended = False  # an error frame was seen: nothing may follow it
        self.limit = limit  # bytes of a write (module docstring)

    @property
    def pending_bytes(self) -> int:
        """Bytes received that belong to no frame yet."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[StreamFrame]:
        if self.ended and data:
            raise bad_answer("the relay sent bytes after an in-band error event")
        self._buf += data
        frames: list[StreamFrame] = []
        found = scan(self._buf, self._scanned, verify_body=False)
        if found.error is not None and found.error.reason != "truncated":
            raise found.error
        sids = found.source_id
        cut = 0  # where the write in progress begins
        # Slices of a view: one copy of each write's bytes, not two (a bytearray slice
        # and then bytes of it). The view is released before the buffer is cut below.
        with memoryview(self._buf) as view:
            for i in range(found.count):
                if sids[i] not in _STREAM_CONTROLS:
                    continue
                start = found.offset[i]
                end = start + found.length[i]
                frames.append(self._control(bytes(view[start:end]), bytes(view[cut:start])))
                cut = end
                if self.ended:
                    if end != found.end or found.error is not None:
                        raise bad_answer("the relay sent bytes after an in-band error event")
                    break
        self._scanned = found.end
        if self.limit is not None and not self.ended:
            self._check_size(found.offset, found.source_id, found.count, cut, found.end)
        if cut:
            # Frames taken: keep only the bytes after the last one.
            del self._buf[:cut]
            self._scanned -= cut
        return frames

    def _check_size(self, offsets: Sequence[int], sids: Sequence[int], count: int,
                    cut: int, end: int) -> None:
        """Refuse a write whose events go on past ``limit`` (module docstring)."""
        limit = self.limit
        assert limit is not None
        if end - cut < limit and len(self._buf) - cut <= limit + HEADER_SIZE:
            return
        for i in range(count - 1, -1, -1):
            if offsets[i] - cut < limit:
                break  # this one and every earlier one began within the limit
            if sids[i] not in _STREAM_CONTROLS:
                raise self._oversize()
        if end - cut >= limit and len(self._buf) - end >= HEADER_SIZE:
            # The event being received begins past the limit: its header says what it is.
            try:
                header = decode_header(self._buf, end)
            except EventFormatError:
                return  # damage: the next feed's scan reports it
            if header.source_id not in _STREAM_CONTROLS:
                raise self._oversize()
            if header.total_length > HEADER_SIZE + _MAX_CONTROL_VALUE:
                raise bad_answer(f"stream control event of {header.total_length} bytes")

    def _oversize(self) -> EventFormatError:
        return refused(f"a streaming write goes on past the {self.limit} bytes asked for "
                       "(max_bytes) with more than its one last event", OVERSIZE)

    def _control(self, raw: bytes, body: bytes) -> StreamFrame:
        event = decode_event(raw)  # checks its body CRC
        if len(event.value) > _MAX_CONTROL_VALUE:
            raise bad_answer(f"stream control event of {len(event.value)} bytes")
        sid = event.header.source_id
        if sid == CHECKPOINT_SOURCE_ID:
            try:
                checkpoint = Checkpoint.loads(bytes(event.value).decode())
            except (CheckpointError, UnicodeDecodeError) as exc:
                raise bad_answer(f"bad checkpoint event in the stream: {exc}") from None
            return StreamFrame("write", body, checkpoint, event.header.timestamp_ns)
        if body:
            raise bad_answer("the relay sent events not followed by a checkpoint event")
        doc = _json_object(event.value)
        if sid == HEARTBEAT_SOURCE_ID:
            return StreamFrame("heartbeat", min_scn=_int_or_none(doc.get("min_scn")),
                               max_scn=_int_or_none(doc.get("max_scn")))
        self.ended = True
        return StreamFrame("error", error=doc)


def _json_object(value: bytes | memoryview) -> dict[str, object]:
    try:
        doc = json.loads(bytes(value))
    except (ValueError, RecursionError):
        raise bad_answer("a stream control event whose value is not JSON") from None
    if not isinstance(doc, dict):
        raise bad_answer("a stream control event whose value is not a JSON object")
    return doc


def _int_or_none(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63:
        return value
    raise bad_answer(f"a heartbeat with a bad SCN {value!r}")

