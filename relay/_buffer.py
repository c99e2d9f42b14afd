"""The relay's event buffer: a circular buffer of whole windows over an mmap'd file.

File layout::

    [0, 4096)             metadata page: two 64-byte slots (A at 0, B at 64), written
                          alternately; the valid slot with the higher sequence wins
    [4096, 4096 + C)      the ring: events in wire format (databus.event), C = capacity

    slot: magic "DBRB" | version u16 | pad u16 | seq u64 | capacity u64 | head u64 |
          tail u64 | prev_scn i64 | crc32 u32 (over the 52 bytes before it)

    [128, 208)            the live record, rewritten in place (one 80-byte copy) with the
                          slot of every change, for readers in other processes
                          (``FollowerBuffer``, relay workers: docs/relay.md, "Workers"):

    live: magic "DBLV" | seq u64 | head u64 | tail u64 | prev_scn i64 | min_scn i64 |
          max_scn i64 | windows u64 | events u64 | bytes_in u64 | crc32 u32 (over the
          76 bytes before it); an absent min/max SCN is -2**63

    The slots are for recovery: two, so that a torn write (a machine crash) leaves the
    other. They cannot serve a live reader: one that read slot A, then B while the
    writer rewrote both, takes B's older head for the newest, and a stale head is what
    lets torn bytes through. The live record has one copy, so a reader gets the newest
    state or, if it raced the copy, a CRC mismatch (and reads again: spinning, then
    yielding to a writer preempted in the middle of its copy). Files without it
    (zeros: written before it existed) read as before; the writer fills it at open.

    version 2: pad markers (below). Version 1 files marked padding with a bare 0x00
    byte, which cannot be told from damage: they are refused, not guessed at.

Positions are *absolute* byte counts that only grow (``head`` = oldest byte held,
``tail`` = end of the last complete window); the physical offset is ``pos % C``. An
event never straddles the end of the ring: when it does not fit, the rest of the lap is
padding and the event goes to the start of the next lap. Padding must be *provable*,
because a zeroed page (a torn write after a machine crash) looks just like it:

- fewer than a header's bytes (56) left before the end of the ring: no event can start
  there, so the rest of the lap is padding by geometry alone;
- otherwise the writer puts a pad marker where the next event would have started::

    pad marker (16 bytes): 0x00 | "PAD" | absolute position u64 | crc32 u32 (of the 12
                           bytes before it)

  An event starts with its magic 0xDB, so a 0x00 first byte is never an event; the
  absolute position ties the marker to this lap (a stale marker from an older lap at
  the same offset does not match), and the CRC tells it from a zeroed page.

Anything else where an event should start is damage: recovery drops that window and
everything after it, a reader refuses to skip it. ``prev_scn`` is the SCN of the last
window evicted, or the SCN the buffer started after.

Concurrency: one writer thread, many readers. The writer moves ``head`` past a window
*before* it overwrites that window's bytes, and readers check ``head`` *after* they have
copied bytes out: a reader whose range start is still >= head got untouched bytes;
otherwise its range was overwritten and it gets ``scn_not_found``. Readers never take a
lock while copying; the small lock guards only the SCN index and the state snapshot.

Readers in other processes (``relay._follower.FollowerBuffer``: the file
mapped read-only) run the same read code; they take the state, and re-check ``head``, from the live
record, which the writer publishes before it overwrites evicted bytes and after a
window's bytes are all written. Stores reach other cores in program order on x86-64
(TSO), so a follower that copied an overwritten byte then reads a head past it. Weakly
ordered CPUs (arm64) give no such promise to code without barriers: there a torn read is
still caught by the events' CRCs (clients check them) but not turned into
``scn_not_found``; run one serving process there (``relay.workers = 1``). A follower
keeps its own sparse index by scanning the windows published since its last look
(``catch_up``).

Durability: metadata is written through the mmap after every window, so a killed
process (kill -9) leaves a consistent file in the page cache: on restart everything up
to the committed tail is verified by CRC (every event, every window's count and
checksum) and served again; a half-written window after the tail is ignored; a bad
window and everything after it are dropped and logged. A machine crash can lose what
the kernel had not flushed yet (``flush()`` msyncs, e.g. on shutdown).
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sortedcontainers import SortedDict

from databus._limited_log import limited
from databus.batch import (
    CompiledFilter,
    FilterPlan,
    Predicate,
    ReadState,
    compile_filter,
    frame_windows,
    gather,
    scan,
    select_events,
    window_checksum,
)
from databus.checkpoint import LATEST_SCN, Checkpoint, NothingNew, ServeFrom, decide
from databus.errors import DatabusError, EventFormatError, ScnNotFoundError
from databus.event import (
    DUMP_END_SOURCE_ID,
    DUMP_START_SOURCE_ID,
    EOW_SOURCE_ID,
    HEADER,
    HEADER_SIZE,
    QUARANTINE_SOURCE_ID,
    WindowChecksum,
    decode_header,
    encode_eow,
)

log = logging.getLogger("databus.relay.buffer")

META_SIZE = 4096
_SLOT = struct.Struct(">4sHHQQQQqI")
_SLOT_MAGIC = b"DBRB"
_SLOT_VERSION = 2
_SLOT_OFFSETS = (0, 64)
_PAD = 0x00
_PAD_MARKER = struct.Struct(">B3sQI")
_PAD_MAGIC = b"PAD"
_HDR_SCN = struct.Struct(">q")
_HDR_SOURCE = struct.Struct(">h")
_HDR_CRC = struct.Struct(">I")
_U32 = struct.Struct(">I")
_EOW_VALUE = struct.Struct(">II")
_SEQ_SLOT_UNSET = -1
_LIVE = struct.Struct(">4sQQQqqqQQQI")
_LIVE_MAGIC = b"DBLV"
_LIVE_OFFSET = 128
_NO_SCN = -(1 << 63)
# A follower reads the live record again while it races the writer's copy. A race
# lasts one 80-byte copy, unless the writer's process is preempted in the middle of it
# (a loaded machine: milliseconds). Spin a little, then yield, and give up only after
# _LIVE_PATIENCE_S (no writer finishing its copy that long means damage or no writer).
_LIVE_SPINS = 100
_LIVE_PATIENCE_S = 2.0


def _pad_marker_fields(pos: int) -> tuple[int, bytes, int, int]:
    """The fields of the pad marker at absolute position ``pos`` (its CRC included)."""
    crc = zlib.crc32(struct.pack(">B3sQ", _PAD, _PAD_MAGIC, pos))
    return _PAD, _PAD_MAGIC, pos, crc


class _Overflowed(Exception):
    """The open window stopped fitting in the ring (``_make_room_until``)."""


class _Overwritten(Exception):
    """Internal: the writer evicted bytes a read was using; the read starts over."""


_READ_ATTEMPTS = 8


class BufferError_(DatabusError):
    """Misuse of the buffer's window API (a bug in a fetcher)."""

    code = "buffer_error"


class BufferCorruptedError(DatabusError):
    """Bytes of the ring that should hold an event or a pad marker hold neither.

    Recovery never raises it (it drops the damaged window and everything after it); a
    reader raises it instead of skipping bytes it cannot prove are padding. Retriable:
    a restart of the relay recovers the verified part of the buffer.
    """

    code = "buffer_corrupted"
    http_status = 503
    retriable = True


class WindowTooLargeError(BufferError_):
    """A window that does not fit in the whole buffer. ``window_bytes`` is its whole
    size (the buffer counts the rest of the window once it no longer fits) and
    ``needed_mb`` the smallest ``capacity_mb`` that holds it."""

    def __init__(self, message: str, *, window_bytes: int = 0, needed_mb: int = 0) -> None:
        super().__init__(message)
        self.window_bytes = window_bytes
        self.needed_mb = needed_mb


_MIB = 1 << 20


def capacity_mb_for(window_bytes: int, largest_event: int) -> int:
    """The smallest ``capacity_mb`` whose ring holds one window of ``window_bytes``
    bytes, whatever the padding before it (at most one event's size: an event that does
    not fit before the end of the ring starts the next lap)."""
    return max(1, -(-(window_bytes + largest_event) // _MIB))


class ScnOrderError(BufferError_):
    """A window whose SCN is not greater than the last one."""


@dataclass(frozen=True, slots=True)
class BufferState:
    """A consistent snapshot of what the buffer holds."""

    prev_scn: int
    min_scn: int | None
    max_scn: int | None
    head: int
    tail: int
    capacity: int
    windows: int
    events: int

    @property
    def used_bytes(self) -> int:
        return self.tail - self.head


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one read produced.

    ``data`` holds whole events (EOWs included). ``checkpoint`` is where the consumer is
    after consuming ``data``. ``pending_event_size`` is set when the very first event did
    not fit in ``max_bytes``. ``wait_after_scn`` is set when nothing was served: a
    long-poll should wait for a window with SCN greater than it.
    """

    data: bytes
    checkpoint: Checkpoint
    events: int
    windows: int
    pending_event_size: int | None = None
    wait_after_scn: int | None = None


class EventBuffer:
    """A fixed-capacity ring of windows in an mmap'd file, with a sparse SCN index."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity: int,
        *,
        index_every_bytes: int = 64 * 1024,
        partition_id: int = 0,
    ) -> None:
        self._init_state(path, capacity, index_every_bytes, partition_id)

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            want = META_SIZE + capacity
            if not fresh and size not in (0, want):
                have, want_mb = size - META_SIZE, capacity / (1 << 20)
                raise BufferError_(
                    f"buffer file {self.path} has {have:,} bytes of ring "
                    f"({have / (1 << 20):g} MiB), the config says {capacity:,} "
                    f"({want_mb:g} MiB): to change its capacity keeping every window, "
                    f"stop the relay and run `databus relay resize --config FILE --buffer "
                    f"{self.path.stem} --capacity-mb {want_mb:g}`; or set capacity_mb back "
                    f"to {have / (1 << 20):g}"
                )
            if size != want:
                os.ftruncate(fd, want)
                fresh = True
            self._mm = mmap.mmap(fd, want)
        finally:
            os.close(fd)
        self._ring = memoryview(self._mm)[META_SIZE:]
        if fresh:
            self._write_meta()
        else:
            self._recover()

    def _init_state(self, path: str | os.PathLike[str], capacity: int,
                    index_every_bytes: int, partition_id: int) -> None:
        """Every attribute but the mapping (shared with ``FollowerBuffer``)."""
        if capacity < 4 * HEADER_SIZE:
            raise ValueError(f"buffer capacity {capacity} is too small")
        self.path = Path(path)
        self.capacity = capacity
        self.partition_id = partition_id
        self._index_every = index_every_bytes
        self._lock = threading.Lock()
        self._index: SortedDict = SortedDict()  # window SCN -> absolute start position
        self._last_indexed_pos = -(1 << 62)
        self._listeners: list[Callable[[int], None]] = []
        self._seq = 0
        # Committed state (readers use these).
        self._head = 0
        self._tail = 0
        self._prev_scn = -1
        self._min_scn: int | None = None
        self._max_scn: int | None = None
        self._windows = 0
        self._events = 0
        self._bytes_in = 0
        self._started = time.monotonic()
        # Writer state: the window in progress.
        self._win_scn: int | None = None
        self._win_start = 0
        self._write = 0
        self._win_check = WindowChecksum()
        self._win_last_ts = 0
        self._win_bytes = 0  # the open window's event bytes written (padding aside)
        # Once the open window no longer fits: its bytes so far and its largest event,
        # counted to the end of the window (nothing more is written) so that the error
        # says the size it needs.
        self._overflow: int | None = None
        self._overflow_largest = 0
        # The commit time of the newest window written by this process (None: none yet).
        self.last_window_timestamp_ns: int | None = None
        # Source id -> schema fingerprints of the events recovery found in the file, so
        # the relay can check them against its catalog before serving anything.
        self.recovered_sources: dict[int, set[int]] = {}

    # -- metadata -------------------------------------------------------------------

    def _write_meta(self) -> None:
        self._seq += 1
        body = _SLOT.pack(
            _SLOT_MAGIC, _SLOT_VERSION, 0, self._seq, self.capacity, self._head, self._tail,
            self._prev_scn, 0,
        )[:-4]
        slot = _SLOT_OFFSETS[self._seq % 2]
        self._mm[slot : slot + _SLOT.size] = body + _U32.pack(zlib.crc32(body))
        # The live record (module docstring), in one copy: followers in other processes
        # re-check the head in it, so it is written before evicted bytes are overwritten
        # (``_evict_one`` calls this first) and after a window's bytes (``end_window``).
        live = _LIVE.pack(
            _LIVE_MAGIC, self._seq, self._head, self._tail, self._prev_scn,
            _NO_SCN if self._min_scn is None else self._min_scn,
            _NO_SCN if self._max_scn is None else self._max_scn,
            self._windows, self._events, self._bytes_in, 0,
        )[:-4]
        self._mm[_LIVE_OFFSET : _LIVE_OFFSET + _LIVE.size] = live + _U32.pack(zlib.crc32(live))

    def _read_meta(self) -> tuple[int, int, int, int] | None:
        best: tuple[int, int, int, int] | None = None
        older_format = None
        for off in _SLOT_OFFSETS:
            raw = bytes(self._mm[off : off + _SLOT.size])
            magic, version, _, seq, cap, head, tail, prev, crc = _SLOT.unpack(raw)
            if magic != _SLOT_MAGIC or zlib.crc32(raw[:-4]) != crc:
                continue
            if version != _SLOT_VERSION:
                older_format = version
                continue
            if cap != self.capacity or not head <= tail <= head + cap:
                continue
            if best is None or seq > best[0]:
                best = (seq, head, tail, prev)
        if best is None and older_format is not None:
            # Starting empty would throw away windows we could have served; guessing at
            # the old format's padding is what this version exists to stop.
            raise BufferError_(
                f"buffer file {self.path} has format version {older_format}, this relay "
                f"reads version {_SLOT_VERSION}: move the file away to start an empty "
                "buffer (consumers behind it will bootstrap)"
            )
        return best

    # -- recovery -------------------------------------------------------------------

    def _recover(self) -> None:
        meta = self._read_meta()
        if meta is None:
            log.warning("buffer %s: no valid metadata, starting empty", self.path)
            self._write_meta()
            return
        self._seq, self._head, tail, self._prev_scn = meta
        self._tail = self._write = self._head
        try:
            self._verify_windows(self._head, tail)
        except EventFormatError as exc:
            log.error(
                "buffer %s: corrupted window at position %d (%s); dropping it and "
                "everything after it (%d bytes)", self.path, self._tail, str(exc),
                tail - self._tail,
            )
        self._write_meta()
        log.info(
            "buffer %s: recovered %d windows, SCN %s..%s", self.path, self._windows,
            self._min_scn, self._max_scn,
        )

    def _verify_windows(self, pos: int, limit: int) -> None:
        """Check every window from ``pos`` to ``limit`` (every event's CRCs, every
        window's count and checksum, one SCN per window) and commit each whole one;
        raises ``EventFormatError`` at the first that fails. One batch scan per run of
        the ring between padding (``databus.batch``)."""
        cap = self.capacity
        ring = self._ring
        window: int | None = None  # the window open across a wrap, its count and CRC
        count = crc = 0
        win_start = pos
        while pos < limit:
            pos = self._skip_pad(pos)
            if pos >= limit:
                break
            phys = pos % cap
            stop = min(cap, phys + (limit - pos))
            s = scan(ring, phys, stop)
            frames = frame_windows(s, window, count, crc)
            scns, sids = s.scn, s.source_id
            first = 0  # the first event of the current window in this scan
            for k, eow in enumerate(frames.eows):
                scn = scns[eow]
                if (window is not None and window != scn) or min(scns[first:eow + 1]) != scn \
                        or max(scns[first:eow + 1]) != scn:
                    raise EventFormatError("SCN changes inside a window", reason="bad scn")
                if s.length[eow] != HEADER_SIZE + _EOW_VALUE.size or s.key_length[eow]:
                    raise EventFormatError("EOW payload is not 8 bytes", reason="bad length")
                stored = _EOW_VALUE.unpack_from(ring, s.offset[eow] + HEADER_SIZE)
                if stored != (frames.counts[k], frames.crcs[k]):
                    raise EventFormatError("window count or checksum mismatch",
                                           offset=s.offset[eow], reason="window checksum")
                end = pos + (s.offset[eow] + s.length[eow] - phys)
                self._commit_recovered(win_start, end, scn, frames.counts[k])
                win_start, first, window = end, eow + 1, None
            if frames.broken >= 0:
                raise EventFormatError("SCN changes inside a window", reason="bad scn")
            if first < s.count:  # a window goes on past this run (a wrap, or the tail)
                scn = scns[first] if window is None else window
                if min(scns[first:]) != scn or max(scns[first:]) != scn:
                    raise EventFormatError("SCN changes inside a window", reason="bad scn")
                window, count, crc = scn, frames.count, frames.crc
            for source_id, fingerprint in set(zip(sids, s.fingerprint, strict=True)):
                if source_id >= 0:
                    self.recovered_sources.setdefault(source_id, set()).add(fingerprint)
            # A run may stop early only at padding: the end of the lap (less than a header
            # left: padding by geometry, whatever old bytes it holds) or a pad marker
            # (0x00; ``_skip_pad`` checks it on the next turn).
            if s.error is not None and cap - s.end >= HEADER_SIZE and ring[s.end] != _PAD:
                raise s.error
            pos += s.end - phys
        if window is not None or win_start < limit:
            raise EventFormatError("window is cut off by the tail", reason="truncated")

    def _commit_recovered(self, start: int, end: int, scn: int, count: int) -> None:
        last = self._max_scn if self._max_scn is not None else self._prev_scn
        if scn <= last:
            raise EventFormatError("window SCNs go backwards", reason="bad scn")
        self._tail = self._write = end
        if self._min_scn is None:
            self._min_scn = scn
        self._max_scn = scn
        self._windows += 1
        self._events += count
        self._maybe_index(scn, start)

    # -- writer API (one thread) ----------------------------------------------------

    def start_after(self, scn: int) -> None:
        """Declare the SCN an empty buffer starts after (where its fetcher begins).

        Consumers with an older checkpoint then get ``scn_not_found`` instead of silently
        skipping the changes this buffer never saw.
        """
        with self._lock:
            if self._max_scn is not None:
                raise BufferError_("start_after() is only for an empty buffer")
            self._prev_scn = scn
            self._write_meta()

    def start_window(self, scn: int) -> None:
        if self._win_scn is not None:
            raise BufferError_(f"window {self._win_scn} is still open")
        last = self._max_scn if self._max_scn is not None else self._prev_scn
        if scn <= last:
            raise ScnOrderError(f"window SCN {scn} is not after the last SCN {last}")
        self._win_scn = scn
        self._win_start = self._write = self._tail
        self._win_check = WindowChecksum()
        self._win_last_ts = 0
        self._overflow = None
        self._overflow_largest = 0
        self._win_bytes = 0

    def append(self, event: bytes) -> None:
        """Append one encoded data event (its SCN must be the open window's)."""
        scn = self._win_scn
        if scn is None:
            raise BufferError_("append() outside a window")
        if len(event) < HEADER_SIZE:
            raise EventFormatError("event shorter than a header", reason="truncated")
        if _HDR_SCN.unpack_from(event, 16)[0] != scn:
            raise BufferError_(f"event SCN differs from the open window's {scn}")
        if _HDR_SOURCE.unpack_from(event, 34)[0] < 0:
            raise BufferError_("control events are written by the buffer itself")
        self._put(event)
        self._win_check.add(_HDR_CRC.unpack_from(event, 4)[0])
        self._win_last_ts = struct.unpack_from(">q", event, 24)[0]

    def append_many(self, events: list[bytes]) -> None:
        """Append data events of the open window in one call (a dump chunk's rows): the
        same checks and the same bytes as ``append`` per event, with one scan (compiled
        core) instead of Python per event, and runs of events written in one copy."""
        scn = self._win_scn
        if scn is None:
            raise BufferError_("append_many() outside a window")
        if not events:
            return
        blob = b"".join(events)
        s = scan(blob, verify_body=False)
        if s.error is not None or s.count != len(events):
            raise EventFormatError("append_many: the events do not frame", reason="bad field")
        if min(s.scn) != scn or max(s.scn) != scn:
            raise BufferError_(f"event SCN differs from the open window's {scn}")
        if min(s.source_id) < 0:
            raise BufferError_("control events are written by the buffer itself")
        if self._overflow is not None or self._win_bytes + len(blob) > self.capacity:
            for event in events:  # the overflow accounting counts events one by one
                self._put(event)
        else:
            self._put_run(blob, s.offset)
        check = self._win_check
        check.count, check.crc = window_checksum(s, 0, None, check.count, check.crc)
        self._win_last_ts = s.timestamp[s.count - 1]

    def _put_run(self, blob: bytes, offsets: array[int]) -> None:
        """``blob`` (whole events starting at ``offsets``) in as few copies as the ring
        allows: one, or, where the ring's end falls inside it, the events that fit before
        the end, then the rest (placed on the next lap as ``_put`` places any event)."""
        room = self.capacity - self._write % self.capacity
        if len(blob) <= room:
            self._put(blob)
            return
        # Events 0..fit-1 end at or before ``room`` (event i ends where i + 1 starts).
        fit = bisect.bisect_right(offsets, room, 1) - 1
        if fit <= 0:  # not even the first fits: all of it on the next lap (_put pads)
            self._put(blob)
            return
        split = offsets[fit]
        self._put(blob[:split])
        self._put_run(blob[split:], array("q", [o - split for o in offsets[fit:]]))

    def append_control(self, event: bytes) -> None:
        """Append a dump start/end marker (DESIGN 8.1) or a quarantine marker (DESIGN 17,
        relay/quarantine/_record.py) to the open window. Markers are
        control events: not counted in the window's EOW, passed by every filter."""
        scn = self._win_scn
        if scn is None:
            raise BufferError_("append_control() outside a window")
        header = decode_header(event)
        if header.source_id not in (DUMP_START_SOURCE_ID, DUMP_END_SOURCE_ID,
                                    QUARANTINE_SOURCE_ID):
            raise BufferError_("only dump and quarantine markers are appended as "
                               "control events")
        if header.scn != scn or header.total_length != len(event):
            raise BufferError_(f"marker SCN or length differs from the open window's {scn}")
        self._put(event)

    def window_events(self) -> int:
        """Data events appended to the open window so far (0 outside a window)."""
        return self._win_check.count if self._win_scn is not None else 0

    def watermark(self, token: str) -> None:
        """A fetcher read a dump watermark row: without a dump engine in front of this
        buffer (``relay.dumps.DumpSink``) there is nothing to do with it."""

    def end_window(self, timestamp_ns: int | None = None) -> int:
        """Write the EOW and publish the window to readers; returns its SCN."""
        scn = self._win_scn
        if scn is None:
            raise BufferError_("end_window() outside a window")
        ts = self._win_last_ts if timestamp_ns is None else timestamp_ns
        if self._overflow is not None:
            self._too_large(scn)
        eow = encode_eow(
            scn=scn, event_count=self._win_check.count, checksum=self._win_check.crc,
            timestamp_ns=ts, partition_id=self.partition_id,
        )
        self.last_window_timestamp_ns = ts
        self._put(eow)
        count = self._win_check.count
        with self._lock:
            self._tail = self._write
            if self._min_scn is None:
                self._min_scn = scn
            self._max_scn = scn
            self._windows += 1
            self._events += count
            self._bytes_in += self._write - self._win_start
            self._maybe_index(scn, self._win_start)
            self._write_meta()
        self._win_scn = None
        for listener in self._listeners:
            listener(scn)
        return scn

    def rollback(self) -> None:
        """Discard the open window (its bytes were never visible to readers)."""
        self._win_scn = None
        self._write = self._tail
        self._overflow = None

    def _too_large(self, scn: int) -> None:
        """End an overflowed window: nothing of it was kept; say the size it needs."""
        size = (self._overflow or 0) + HEADER_SIZE + _EOW_VALUE.size  # and its EOW
        largest = self._overflow_largest
        self.rollback()
        needed = capacity_mb_for(size, largest)
        raise WindowTooLargeError(
            f"window {scn} is {size:,} bytes, larger than the buffer ({self.capacity:,} "
            f"bytes, capacity_mb {self.capacity // _MIB}): it needs capacity_mb >= "
            f"{needed}. Stop the relay, run `databus relay resize --config FILE --buffer "
            f"NAME --capacity-mb {max(needed, 2 * (self.capacity // _MIB))}` (it keeps every "
            "window), set the same capacity_mb in the config, and start it again",
            window_bytes=size, needed_mb=needed)

    def append_window(self, scn: int, events: Iterable[bytes]) -> None:
        """start_window + append* + end_window, rolled back on any error."""
        self.start_window(scn)
        try:
            for event in events:
                self.append(event)
        except BaseException:
            self.rollback()
            raise
        self.end_window()

    def _put(self, data: bytes) -> None:
        n = len(data)
        if self._overflow is not None:
            self._overflow += n
            self._overflow_largest = max(self._overflow_largest, n)
            return
        cap = self.capacity
        if self._win_scn is not None and self._win_bytes + n > cap:
            # The open window can never fit: evict nothing more for it.
            self._overflowed(n)
            return
        pos = self._write
        phys = pos % cap
        if phys + n > cap:
            # It does not fit before the end of the ring: the rest of this lap is padding
            # and the event goes to the next lap. Where a header would fit, a pad marker
            # proves it (see the module docstring); room is made first, because the
            # marker overwrites bytes of the previous lap.
            pad_at = pos
            pos += cap - phys
            try:
                self._make_room_until(pos + n)
            except _Overflowed:
                self._overflowed(n)
                return
            if cap - phys >= HEADER_SIZE:
                _PAD_MARKER.pack_into(self._ring, phys, *_pad_marker_fields(pad_at))
            phys = 0
        else:
            try:
                self._make_room_until(pos + n)
            except _Overflowed:
                self._overflowed(n)
                return
        self._ring[phys : phys + n] = data
        self._write = pos + n
        self._win_bytes += n

    def _overflowed(self, n: int) -> None:
        """The open window no longer fits: from now on its bytes are only counted."""
        self._overflow = self._win_bytes + n
        self._overflow_largest = n

    def _make_room_until(self, end: int) -> None:
        """Evict whole windows from the head until [head, end) fits in the ring."""
        while end - self._head > self.capacity:
            if self._head >= self._tail:
                # Only the open window is left and it still does not fit: nothing more
                # of it is written, its bytes are counted to its end (``end_window``
                # raises with the size it needs).
                if self._win_scn is None:
                    raise WindowTooLargeError(
                        f"an event larger than the buffer ({self.capacity:,} bytes)")
                raise _Overflowed
            self._evict_one()

    def _evict_one(self) -> None:
        pos = self._head
        count = 0
        while True:
            pos = self._skip_pad(pos)
            fields = HEADER.unpack_from(self._ring, pos % self.capacity)
            total, scn, source_id = fields[6], fields[7], fields[10]
            pos += total
            if source_id == EOW_SOURCE_ID:
                break
            count += source_id >= 0
        with self._lock:
            self._head = pos
            self._prev_scn = scn
            self._min_scn = self._scn_at(pos) if pos < self._tail else None
            if self._min_scn is None:
                self._max_scn = None
            self._windows -= 1
            self._events -= count
            while self._index and self._index.peekitem(0)[1] < pos:
                self._index.popitem(0)
            # Persist the new head before the caller overwrites the evicted bytes.
            self._write_meta()

    def _maybe_index(self, scn: int, start: int) -> None:
        if start - self._last_indexed_pos >= self._index_every:
            self._index[scn] = start
            self._last_indexed_pos = start

    # -- readers --------------------------------------------------------------------

    def add_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(scn)`` (from the writer thread) after each published window."""
        self._listeners.append(listener)

    def state(self) -> BufferState:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> BufferState:
        """The published state (the caller holds the lock; a follower reads the live
        record, whose one copy is consistent by itself)."""
        return BufferState(
            self._prev_scn, self._min_scn, self._max_scn, self._head, self._tail,
            self.capacity, self._windows, self._events,
        )

    def _head_now(self) -> int:
        """The head as the writer last moved it: readers re-check it after copying."""
        return self._head

    def input_rate(self) -> float:
        """Bytes per second written since the buffer was opened."""
        return self._bytes_in / max(time.monotonic() - self._started, 1e-9)

    def read(
        self,
        checkpoint: Checkpoint,
        *,
        max_bytes: int,
        predicate: Predicate | None = None,
        needs_key: bool = True,
        select: FilterPlan | CompiledFilter | None = None,
    ) -> ReadResult:
        """Serve whole events after ``checkpoint``, at most ``max_bytes`` of them.

        ``select`` says which data events a request wants (``databus.batch.FilterPlan``,
        or one compiled by ``databus.batch.compile_filter`` to reuse over reads);
        ``predicate`` is the per-event form of the same (source id, partition key, key
        bytes; the key is passed as b"" unless ``needs_key``). EOW events always pass so
        the consumer's checkpoint advances through filtered windows. Raises
        ``ScnNotFoundError`` if the checkpoint is too old.

        A "from the latest" checkpoint comes back as the concrete SCN it stood for, so
        a long poll that reads again waits for exactly the windows after it.
        """
        if predicate is not None:
            base = select.plan if isinstance(select, CompiledFilter) else select
            base = base if base is not None else FilterPlan()
            select = FilterPlan(wanted=base.wanted, filters=base.filters,
                                resolve=base.resolve, predicate=predicate,
                                needs_key=needs_key or base.needs_key)
        flt = compile_filter(select) if isinstance(select, FilterPlan) else select
        for _ in range(_READ_ATTEMPTS):
            with self._lock:
                published = self._snapshot()
                decision = decide(
                    checkpoint, prev_scn=published.prev_scn, min_scn=published.min_scn,
                    max_scn=published.max_scn,
                )
                tail = published.tail
                if isinstance(decision, NothingNew):
                    after = decision.after_scn
                    if checkpoint.window_scn == LATEST_SCN:
                        checkpoint = Checkpoint(after) if after >= 0 else Checkpoint.flexible()
                    return ReadResult(b"", checkpoint, 0, 0, wait_after_scn=after)
                start = self._scan_start(decision.after_scn, published.head)
            try:
                return self._read_from(checkpoint, decision, start, tail, max_bytes, flt)
            except _Overwritten:
                # The writer evicted bytes under the scan. Decide again: a checkpoint
                # that is really gone now gets scn_not_found; one still held (only
                # windows before it were evicted) is read again from the new head.
                continue
        raise ScnNotFoundError(
            f"SCN {checkpoint.window_scn} kept being evicted while it was read",
            min_scn=self.state().min_scn,
        )

    def _scan_start(self, after_scn: int, head: int) -> int:
        # Largest indexed window SCN <= after_scn; its window is <= after, so the first
        # window > after_scn is at or after it.
        i = self._index.bisect_right(after_scn)
        return head if i == 0 else max(self._index.peekitem(i - 1)[1], head)

    def _read_from(
        self,
        checkpoint: Checkpoint,
        decision: ServeFrom,
        start: int,
        tail: int,
        max_bytes: int,
        flt: CompiledFilter | None,
    ) -> ReadResult:
        # The hot loop of the relay is ``databus.batch.select_events`` (compiled), one
        # call per run of the ring between padding; this loop walks the laps, tells
        # padding from damage and checks that the writer left the bytes alone.
        cap = self.capacity
        ring = self._ring
        st = ReadState(decision.after_scn, max_bytes, decision.partial_scn,
                       decision.skip_events, cp_scn=checkpoint.window_scn,
                       cp_offset=checkpoint.window_offset)
        pos = start
        first_pos: int | None = None
        while pos < tail and not st.full:
            phys = pos % cap
            if cap - phys < HEADER_SIZE:
                pos += cap - phys
                continue
            stop = min(cap, phys + (tail - pos))
            served_before = st.first is not None
            end = select_events(ring, phys, stop, st, flt)
            if not served_before and st.first is not None:
                first_pos = pos + (st.first - phys)  # absolute: where serving began
            # Fields read from bytes the writer may since have overwritten are only
            # trusted if the head is still at or before where this run began.
            if self._head_now() > pos:
                raise _Overwritten
            pos += end - phys
            if st.full or end == stop:
                continue
            if cap - end < HEADER_SIZE:
                continue  # the rest of the lap is padding by geometry (next turn)
            if ring[end] == _PAD and self._is_pad_marker(pos):
                pos += cap - end
                continue
            if self._head_now() > pos:
                raise _Overwritten
            if st.size:
                break  # serve what precedes the damage; the next read reports it
            limited(log).error(
                "buffer %s: no event and no pad marker at position %d; refusing "
                "to skip bytes that may be damage (restart the relay to recover "
                "the verified windows)", self.path, pos, kind=self.path,
            )
            raise BufferCorruptedError(f"buffer {self.path.stem} is damaged at position {pos}")
        cp_size = st.cp_size
        data = gather(ring, st.runs, cp_size)
        if first_pos is not None and self._head_now() > first_pos:
            raise _Overwritten  # bytes already copied may have been overwritten
        # Markers after the last event that moves the checkpoint (``size > cp_size``)
        # are cut off: a checkpoint cannot say they were consumed, so they go with the
        # next response (served here and again there, a consumer would see them twice;
        # served alone, forever).
        cp = Checkpoint(st.cp_scn, st.cp_offset) if cp_size else checkpoint
        pending = st.pending if st.full else None
        wait = None
        partial_scn = decision.partial_scn
        if not data and pending is None:
            wait = partial_scn - 1 if partial_scn is not None else decision.after_scn
        return ReadResult(data, cp, st.events, st.windows, pending, wait)

    def window_timestamp_ns(self, scn: int) -> int | None:
        """The commit time (its EOW's timestamp) of window ``scn``, or None when the
        buffer does not hold a window with that SCN (evicted, never written, or being
        overwritten while it is looked up). Walks event headers from the nearest
        indexed window (at most ``index_every_bytes`` and one window)."""
        with self._lock:
            published = self._snapshot()
            if published.max_scn is None or published.min_scn is None or \
                    not published.min_scn <= scn <= published.max_scn:
                return None
            start = self._scan_start(scn, published.head)
        ring, found = self._ring, None
        try:
            for _pos, phys in self._event_headers(start, published.tail):
                at = _HDR_SCN.unpack_from(ring, phys + 16)[0]
                if at > scn:
                    break
                if at == scn and _HDR_SOURCE.unpack_from(ring, phys + 34)[0] == EOW_SOURCE_ID:
                    found = int(_HDR_SCN.unpack_from(ring, phys + 24)[0])
                    break
        except (EventFormatError, struct.error):
            return None
        # Bytes read after the writer moved the head past them may be another window's.
        return found if self._head_now() <= start else None

    @property
    def bytes_in(self) -> int:
        """Window bytes written (``databus_relay_buffer_input_bytes_total``)."""
        return self._bytes_in

    def bytes_from(self, scn: int) -> int | None:
        """Bytes from the start of the first window with SCN >= ``scn`` to the newest
        window's end: what a consumer that needs that window next still has to read,
        and what the buffer's capacity must keep for it (a consumer's eviction
        headroom is ``capacity - bytes_from``). 0 when no such window is held yet, every
        byte held when ``scn`` is at or before the oldest window; None when the bytes
        looked at were overwritten meanwhile. Walks event headers from the nearest
        indexed window, as ``window_timestamp_ns``."""
        with self._lock:
            published = self._snapshot()
            if published.max_scn is None or scn > published.max_scn:
                return 0
            if published.min_scn is None or scn <= published.min_scn:
                return published.tail - published.head
            start = self._scan_start(scn - 1, published.head)
        ring, tail, found = self._ring, published.tail, None
        try:
            for pos, phys in self._event_headers(start, tail):
                if _HDR_SCN.unpack_from(ring, phys + 16)[0] >= scn:
                    found = pos
                    break
        except (EventFormatError, struct.error):
            return None
        if self._head_now() > start:
            return None
        return 0 if found is None else tail - found

    def _event_headers(self, start: int, tail: int) -> Iterator[tuple[int, int]]:
        """(logical position, ring offset) of each event from ``start`` up to ``tail``,
        past end-of-lap padding, for walks over headers under the writer
        (``window_timestamp_ns``, ``bytes_from``). Bytes that are not an event header
        (overwritten under the walk, or damage: ``read()`` says which) raise
        ``EventFormatError``."""
        ring, cap, pos = self._ring, self.capacity, start
        while pos < tail:
            pos = self._skip_pad(pos)
            if pos >= tail:
                return
            phys = pos % cap
            length = _U32.unpack_from(ring, phys + 12)[0]
            if ring[phys] != 0xDB or length < HEADER_SIZE:
                raise EventFormatError("not an event header", offset=phys,
                                       reason="overwritten or damaged")
            yield pos, phys
            pos += length

    def _skip_pad(self, pos: int) -> int:
        """The position of the event at or after ``pos``: past the end-of-lap padding if
        ``pos`` is provably padding. A 0x00 byte without a valid pad marker is damage
        (``EventFormatError``), never skipped."""
        phys = pos % self.capacity
        if self.capacity - phys < HEADER_SIZE:
            return pos + (self.capacity - phys)
        if self._ring[phys] == _PAD:
            if not self._is_pad_marker(pos):
                raise EventFormatError(
                    "a 0x00 byte where an event should start, without a valid pad marker",
                    offset=phys, reason="damaged padding",
                )
            return pos + (self.capacity - phys)
        return pos

    def _is_pad_marker(self, pos: int) -> bool:
        phys = pos % self.capacity
        raw = bytes(self._ring[phys : phys + _PAD_MARKER.size])
        return raw == _PAD_MARKER.pack(*_pad_marker_fields(pos))

    def _scn_at(self, pos: int) -> int:
        pos = self._skip_pad(pos)
        phys = pos % self.capacity
        return int(_HDR_SCN.unpack_from(self._ring, phys + 16)[0])

    # -- lifecycle ------------------------------------------------------------------

    def flush(self) -> None:
        """msync the file (for a clean shutdown; a killed process needs no flush)."""
        self._mm.flush()

    def close(self) -> None:
        self._ring.release()
        self._mm.flush()
        self._mm.close()

    def __enter__(self) -> EventBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
