"""``FollowerBuffer``: a ring file that another process writes, mapped read-only (relay
workers, docs/relay.md "Workers"). The file layout, the live record it reads and the
reader/writer rules are in ``relay/_buffer.py``'s docstring; the read path is
``EventBuffer``'s own, with the state and the head re-checks taken from the live record.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
import zlib

from databus.errors import EventFormatError
from databus.relay._buffer import (
    _LIVE,
    _LIVE_MAGIC,
    _LIVE_OFFSET,
    _LIVE_PATIENCE_S,
    _LIVE_SPINS,
    _NO_SCN,
    _READ_ATTEMPTS,
    META_SIZE,
    BufferCorruptedError,
    BufferError_,
    BufferState,
    EventBuffer,
)

__all__ = ["FollowerBuffer"]

log = logging.getLogger("databus.relay.buffer")


class FollowerBuffer(EventBuffer):
    """A buffer file another process writes, mapped read-only (relay workers,
    docs/relay.md "Workers").

    Serves with the writer's own read path (``read``, ``state``): the state and the
    head re-checks come from the file's live record (module docstring). Its sparse SCN
    index is its own, built by ``catch_up``, which scans the windows published since its
    last call (one batch scan per run of the ring, as recovery does); call it when the
    writer says windows landed. Reads never depend on the index being current: a stale
    one only makes a scan start earlier. The writer API raises ``BufferError_``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity: int,
        *,
        index_every_bytes: int = 64 * 1024,
        partition_id: int = 0,
    ) -> None:
        self._init_state(path, capacity, index_every_bytes, partition_id)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size != META_SIZE + capacity:
                raise BufferError_(
                    f"buffer file {self.path} has {size - META_SIZE} bytes of ring, the "
                    f"config says {capacity}"
                )
            self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._ring = memoryview(self._mm)[META_SIZE:]
        self._indexed_to = 0  # where the last window indexed ends (absolute)
        self._indexed_scn = -1  # and its SCN
        self._seen_seq = -1  # the live record's seq at the last catch_up
        # Windows (scn, start, end) the scan in progress found, indexed only if the head
        # shows that no byte under the scan was overwritten meanwhile.
        self._found: list[tuple[int, int, int]] = []
        self._found_scn = -1
        self._damage_logged: int | None = None
        try:
            self.catch_up()
        except BaseException:
            self.close()
            raise

    # -- the live record --------------------------------------------------------------

    def _live(self) -> tuple[int, BufferState]:
        """(seq, state) from the live record: one copy of it, read again while it races
        the writer's copy (a CRC mismatch)."""
        cap = self.capacity
        deadline: float | None = None
        attempts = 0
        while True:
            raw = self._mm[_LIVE_OFFSET : _LIVE_OFFSET + _LIVE.size]
            magic, seq, head, tail, prev, low, high, windows, events, _, crc = _LIVE.unpack(raw)
            if magic == _LIVE_MAGIC and zlib.crc32(raw[:-4]) == crc and head <= tail <= head + cap:
                return seq, BufferState(
                    prev, None if low == _NO_SCN else low, None if high == _NO_SCN else high,
                    head, tail, cap, windows, events,
                )
            attempts += 1
            if attempts < _LIVE_SPINS:
                continue
            now = time.monotonic()
            if deadline is None:
                deadline = now + _LIVE_PATIENCE_S
            elif now >= deadline:
                break
            time.sleep(0.0002)  # let a preempted writer finish its copy
        raise BufferCorruptedError(
            f"buffer {self.path.stem}: its live record is not valid (is the relay that "
            "writes it of this version?)"
        )

    def _snapshot(self) -> BufferState:
        return self._live()[1]

    def _head_now(self) -> int:
        return self._live()[1].head

    # -- the index --------------------------------------------------------------------

    def catch_up(self) -> bool:
        """Index the windows published since the last call. When the writer published
        anything since then (windows, evictions), call the listeners (``add_listener``)
        with the newest SCN, as the writer calls its own, and return True."""
        seq, live = self._live()
        if seq == self._seen_seq:
            return False
        self._seen_seq = seq
        with self._lock:
            while self._index and self._index.peekitem(0)[1] < live.head:
                self._index.popitem(0)
        for _ in range(_READ_ATTEMPTS):
            start, last = self._indexed_to, self._indexed_scn
            if start < live.head:
                start, last = live.head, live.prev_scn
            if start >= live.tail:
                break
            self._found, self._found_scn = [], last
            error: EventFormatError | None = None
            try:
                self._verify_windows(start, live.tail)
            except EventFormatError as exc:
                error = exc
            except Exception:
                # Bytes that change under a scan can fail in other ways too (the
                # compiled scan, finding a bad event, asks its Python twin for the
                # error, and the twin may see other bytes): noise if the head moved
                # past them, a bug otherwise.
                if self._head_now() <= start:
                    raise
            head = self._head_now()
            if head > start:
                # The writer evicted bytes the scan went over: what it found may be
                # anything. Scan again from the new head (its windows are intact).
                live = self._live()[1]
                continue
            with self._lock:
                for scn, win_start, _ in self._found:
                    self._maybe_index(scn, win_start)
            if self._found:
                self._indexed_scn, _, self._indexed_to = self._found[-1]
            if error is not None and self._damage_logged != self._indexed_to:
                # Reads refuse these bytes themselves (buffer_corrupted); log it once.
                self._damage_logged = self._indexed_to
                log.error("buffer %s (follower): no valid window at position %d (%s)",
                          self.path, self._indexed_to, error)
            break
        self._found = []
        if live.max_scn is not None:
            for listener in self._listeners:
                listener(live.max_scn)
        return True

    def _commit_recovered(self, start: int, end: int, scn: int, count: int) -> None:
        if scn <= self._found_scn:
            raise EventFormatError("window SCNs go backwards", reason="bad scn")
        self._found_scn = scn
        self._found.append((scn, start, end))

    # -- no writer API ----------------------------------------------------------------

    def start_after(self, scn: int) -> None:
        raise BufferError_(f"buffer {self.path.stem} is mapped read-only here")

    def start_window(self, scn: int) -> None:
        raise BufferError_(f"buffer {self.path.stem} is mapped read-only here")

    def flush(self) -> None:
        """Nothing to flush: this process never writes the file."""
