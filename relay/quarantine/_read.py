"""The in-band ``source_quarantined`` error of a stream (DESIGN 17; docs/relay.md,
"Quarantined sources"). Pure: it works on read results.

A stream whose subscription includes a quarantined source S (names it, or names no
source: every source of the buffer) is served the windows before S's quarantine SCN
X, then the error: ``guard`` wraps a buffer read so that a result is cut before the
first event of a window at or after X (its checkpoint is then the last whole window
before X), and a read that would serve nothing before X (or finds the consumer at or
past X already) raises the quarantine's ``SourceQuarantinedError`` (retriable). A poll
answers it as its JSON error (409); a streaming subscription writes it in-band (-4)
and ends. The rule is the same for both, so polling and streaming give the same
windows and the same error. Once the source is healed, nothing is cut: the consumer
goes on past X (the quarantine marker is a control event it ignores), and gets the
heal's dump.

``?quarantine=pass`` turns this off for one request: a chained relay, a cluster
follower and the bootstrap producer copy every window (the marker travels with them,
and a chained relay records the quarantine itself); a consumer of S asking so gets no
events of S after X, without an error.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping

from databus.checkpoint import Checkpoint
from databus.event import EOW_SOURCE_ID, HEADER_SIZE
from databus.relay._buffer import ReadResult
from databus.relay.quarantine._record import Quarantine

__all__ = ["QUARANTINE_MODES", "cut_before", "guard", "including"]

QUARANTINE_MODES = ("error", "pass")

_LENGTH_SCN = struct.Struct(">Iq")  # total length (offset 12), SCN (offset 16)
_SOURCE = struct.Struct(">h")  # source id (offset 34)

Read = Callable[..., ReadResult]


def including(active: Mapping[str, Quarantine], names: Iterable[str]) -> Quarantine | None:
    """The quarantine a subscription meets first (the lowest SCN) among the sources it
    includes: ``names``, or every source of the buffer when ``names`` is empty."""
    if not active:
        return None  # the common case, on every read
    wanted = set(names)
    hit = [q for s, q in active.items() if not wanted or s in wanted]
    return min(hit, key=lambda q: (q.scn, q.source)) if hit else None


def cut_before(result: ReadResult, stop: int) -> ReadResult | None:
    """``result`` without the windows at or after SCN ``stop`` (the same object when it
    holds none); None when nothing before ``stop`` is left to serve (the consumer
    reached the quarantine)."""
    data = result.data
    if not data:
        if result.pending_event_size is None and result.wait_after_scn is not None \
                and result.wait_after_scn >= stop:
            return None  # already past the quarantine SCN: nothing may come
        return result
    if result.checkpoint.window_scn < stop:
        return result  # every event is of a window before stop (SCNs only grow)
    pos = end = events = windows = 0
    last_scn: int | None = None
    size = len(data)
    while pos + HEADER_SIZE <= size:
        length, scn = _LENGTH_SCN.unpack_from(data, pos + 12)
        if scn >= stop:
            break
        source_id = _SOURCE.unpack_from(data, pos + 34)[0]
        pos += length
        if source_id == EOW_SOURCE_ID:
            end, last_scn, windows = pos, scn, windows + 1
        elif source_id >= 0:
            events += 1
    else:
        return result  # no event at or after stop (a partial window before it)
    if last_scn is None:
        return None
    # The data events counted up to the cut are those of whole windows before it.
    return ReadResult(data[:end], Checkpoint(last_scn), events, windows)


def guard(read: Read, quarantine: Quarantine | None) -> Read:
    """``read`` (``buffer.read`` with the request's filter bound), cut before
    ``quarantine``'s SCN, raising its error when nothing is left (module docstring)."""
    if quarantine is None:
        return read
    stop = quarantine.scn

    def guarded(checkpoint: Checkpoint, *, max_bytes: int) -> ReadResult:
        cut = cut_before(read(checkpoint, max_bytes=max_bytes), stop)
        if cut is None:
            raise quarantine.error()
        return cut

    return guarded
