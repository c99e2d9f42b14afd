"""What a scan of a body gives: one array per header field, no object per event.

Both twins (``_python`` and the compiled ``_native``) fill the same ``Scan``: the
arrays are ``array.array`` so that Python reads them by index and the compiled code
writes them through raw pointers. An event ``i`` starts at ``offset[i]``, its key at
``offset[i] + 56`` for ``key_length[i]`` bytes, its value right after the key up to
``offset[i] + length[i]``.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from databus.errors import EventFormatError
from databus.event import _OPS, EventHeader

# Field name -> array typecode, in header order (the twins allocate these).
FIELDS: tuple[tuple[str, str], ...] = (
    ("offset", "q"),
    ("length", "q"),
    ("scn", "q"),
    ("timestamp", "q"),
    ("op", "B"),
    ("flags", "B"),
    ("partition_id", "h"),
    ("source_id", "h"),
    ("partition_key", "q"),
    ("key_length", "q"),
    ("fingerprint", "Q"),
    ("header_crc", "I"),
    ("body_crc", "I"),
)


class Scan:
    """The events found in ``buf[start:end]`` and the first error after them.

    ``end`` is where the scan stopped: the end of the last good event. ``error`` is the
    ``EventFormatError`` of the bytes at ``end`` (None when the scan reached the stop);
    ``reason == "truncated"`` there means the bytes simply ran out, which a stream
    reader treats as "wait for more" rather than damage.
    """

    __slots__ = ("body_crc", "count", "end", "error", "fingerprint", "flags", "header_crc",
                 "key_length", "length", "offset", "op", "partition_id", "partition_key",
                 "scn", "source_id", "timestamp")

    offset: array[int]
    length: array[int]
    scn: array[int]
    timestamp: array[int]
    op: array[int]
    flags: array[int]
    partition_id: array[int]
    source_id: array[int]
    partition_key: array[int]
    key_length: array[int]
    fingerprint: array[int]
    header_crc: array[int]
    body_crc: array[int]

    def __init__(self) -> None:
        for name, code in FIELDS:
            setattr(self, name, array(code))
        self.count = 0
        self.end = 0
        self.error: EventFormatError | None = None

    def check(self) -> Scan:
        """Raise the scan's error, if any; return self."""
        if self.error is not None:
            raise self.error
        return self

    def header(self, i: int) -> EventHeader:
        """Event ``i``'s header as ``databus.event.decode_header`` gives it."""
        return EventHeader(
            _OPS[self.op[i]], self.flags[i], self.header_crc[i], self.body_crc[i],
            self.length[i], self.scn[i], self.timestamp[i], self.partition_id[i],
            self.source_id[i], self.partition_key[i], self.fingerprint[i], self.key_length[i],
        )

    def key_span(self, i: int) -> tuple[int, int]:
        start = self.offset[i] + 56
        return start, start + self.key_length[i]

    def value_span(self, i: int) -> tuple[int, int]:
        start = self.offset[i] + 56 + self.key_length[i]
        return start, self.offset[i] + self.length[i]


@dataclass(slots=True)
class WindowFrames:
    """The EOWs of a scan with the count and checksum of the data events before each.

    ``eows[k]`` is the index of an EOW event, ``counts[k]``/``crcs[k]`` what its window's
    data events add up to (the window may have begun before the scan: the carried
    count and checksum start it). ``broken`` is the index of the first event whose SCN
    differs from the open window's before that window's EOW (-1: none): a torn stream.
    ``count``/``crc``/``window`` describe the window still open at the end.
    ``controls`` holds the index of every control event (EOWs included), so a reader
    can take the runs of data events between them whole.
    """

    controls: array[int]
    eows: array[int]
    counts: array[int]
    crcs: array[int]
    broken: int
    window: int | None
    count: int
    crc: int


@dataclass(slots=True)
class LogCopy:
    """The bootstrap log's rows of a response's whole windows, as binary COPY streams
    ready to send (``log_copy``): each one complete, header and trailer included.

    ``logs`` maps a store source id to its log table's stream, ``spans`` to the first
    and last SCN of its rows (the partitions they need). ``windows`` is the stream of
    the ``dbus_windows`` rows, one per window with a data event (``stored`` of them;
    ``events`` log rows in all). ``first_scn``/``last_scn`` are those windows' first
    and last SCN (-1: none); ``unordered`` is (SCN, previous SCN) of the first of them
    whose SCN is not above the one before (None: strictly increasing).
    """

    logs: dict[int, bytes]
    spans: dict[int, tuple[int, int]]
    windows: bytes
    stored: int
    events: int
    first_scn: int
    last_scn: int
    unordered: tuple[int, int] | None
