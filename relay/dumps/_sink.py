"""The watermark step of a dump (DBLog, DESIGN 8.1): a ``WindowSink`` between a fetcher
and its buffer.

The dump engine (``_engine``) reads a table in chunks on its own connection; for each
chunk it hands this sink a ``Chunk`` and writes two watermark rows through the source's
log. The fetcher passes the log on to this sink unchanged, calling ``watermark(token)``
where it read a watermark row, and this sink does the rest in log order::

    log:     ... w1  [L]  w2(k=5)  w3(k=9)  [H]  w4 ...
    chunk:            SELECT k in (3, 5, 7, 9)  (read between L and H)
    buffer:  ... w1       w2       w3       H-window: [start?] 3 7 [end?] EOW   w4 ...

- ``awaiting_low``: the chunk is registered; events pass through untouched.
- ``open`` (L seen): every event appended is noted by (source id, key kind, key bytes)
  as *touched*; the engine reads the chunk now (it waits for L first, so the read
  snapshot is later than everything logged before L).
- H seen (inside its window): at ``end_window`` the chunk's rows whose key was touched
  are dropped (the log has their newer state), the rest are appended to that window
  with its SCN, opcode upsert and the dump flag, framed by the table's dump start
  marker (first chunk) and end marker (last chunk), then the window ends. The chunk is
  ``emitted`` only once the buffer took the window: if it fails, the fetcher host rolls
  back and restarts the fetcher, which reads H again and this sink tries again.

Touched keys are a superset when windows were rolled back (the keys of a window read
twice are noted twice): harmless, a dropped row's key has a log event after L that the
restarted fetcher writes again. Watermarks nobody registered (an old chunk after a
restart, another relay's dump of the same source) are ignored. A window that holds
only watermarks is not stored (there is nothing in it for consumers).

No I/O and no threads of its own: the fetcher thread calls the ``WindowSink`` methods,
the engine thread ``offer``/``set_rows``/``wait``; a condition guards the hand-over.
Per event, the cost while no chunk is open is nothing (``append`` is the buffer's own
bound method); while one is open, one slice and one set insertion.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from databus.batch import encode_event
from databus.event import (
    HEADER_SIZE,
    KEY_KIND_MASK,
    Op,
    encode_dump_marker,
    encode_key,
)
from databus.fetchers._api import DumpRow

__all__ = ["Chunk", "ChunkPhase", "DumpSink", "MarkerSink", "key_identity"]

log = logging.getLogger("databus.relay.dumps")

ChunkPhase = Literal["awaiting_low", "open", "emitted", "abandoned"]
Identity = tuple[int, int, bytes]


class MarkerSink(Protocol):
    """The buffer as this sink needs it: a ``WindowSink`` that also takes dump markers."""

    def start_window(self, scn: int) -> None: ...

    def append(self, event: bytes) -> None: ...

    def append_control(self, event: bytes) -> None: ...

    def window_events(self) -> int: ...

    def end_window(self, timestamp_ns: int | None = None) -> int: ...

    def rollback(self) -> None: ...


def key_identity(source_id: int, key: object) -> Identity:
    """How a chunk row is matched against log events: source id, key kind, key bytes."""
    kind, key_bytes, _ = encode_key(key)  # type: ignore[arg-type]
    return (source_id, int(kind), key_bytes)


@dataclass(eq=False)
class Chunk:
    """One chunk of one table in flight between the engine and the fetcher thread."""

    dump_id: str
    source: str
    source_id: int
    low: str
    high: str
    first: bool  # the table's first chunk: the start marker goes before its rows
    phase: ChunkPhase = "awaiting_low"
    rows: list[DumpRow] | None = None  # set by the engine once the SELECT returned
    last: bool = False  # the table's last chunk: the end marker goes after its rows
    rows_before: int = 0  # rows of this table emitted by earlier chunks (the end marker)
    outcome: str = "done"  # the end marker's: failed or cancelled for an empty last chunk
    touched: set[Identity] = field(default_factory=set)
    emitted_scn: int | None = None
    emitted_rows: int = 0
    dropped_rows: int = 0


class DumpSink:
    """The fetcher's ``WindowSink`` for one buffer (see the module docstring)."""

    def __init__(self, target: MarkerSink, partition_id: int,
                 on_window: Callable[[], None] | None = None) -> None:
        self._target = target
        self._partition_id = partition_id
        self._on_window = on_window
        self._cond = threading.Condition()
        self._chunk: Chunk | None = None
        # Per window, fetcher thread only.
        self._scn: int | None = None
        self._watermarks = False  # the open window held a watermark
        self._controls = False  # the open window holds a marker from the fetcher's side
        self._emit: Chunk | None = None
        # The buffer's own bound method while no chunk is open: no cost per event.
        self.append: Callable[[bytes], None] = target.append

    # -- the engine's side ------------------------------------------------------------

    def offer(self, chunk: Chunk) -> None:
        """Make ``chunk`` the one in flight (any older one is abandoned)."""
        with self._cond:
            old = self._chunk
            if old is not None and old.phase in ("awaiting_low", "open"):
                old.phase = "abandoned"
            self._chunk = chunk
            self._cond.notify_all()

    def set_rows(self, chunk: Chunk, rows: list[DumpRow], *, last: bool) -> None:
        """The chunk's SELECT returned (before its high watermark is written)."""
        with self._cond:
            chunk.rows = rows
            chunk.last = last

    def withdraw(self, chunk: Chunk) -> None:
        """Give up on ``chunk`` (cancel, pause, an error before its high watermark)."""
        with self._cond:
            if chunk.phase in ("awaiting_low", "open"):
                chunk.phase = "abandoned"
            if self._chunk is chunk:
                self._chunk = None
                self.append = self._target.append

    def wait(self, chunk: Chunk, phases: tuple[ChunkPhase, ...], timeout: float) -> bool:
        """Wait until ``chunk`` reaches one of ``phases``; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: chunk.phase in phases, timeout)

    def wake(self) -> None:
        """Wake waiters (they re-check their own stop conditions)."""
        with self._cond:
            self._cond.notify_all()

    # -- the fetcher's side (WindowSink) ----------------------------------------------

    def start_window(self, scn: int) -> None:
        self._target.start_window(scn)
        self._scn = scn
        self._watermarks = False
        self._controls = False
        self._emit = None

    def _append_touching(self, event: bytes) -> None:
        self._target.append(event)
        chunk = self._chunk
        if chunk is not None and chunk.phase == "open":
            key_length = int.from_bytes(event[52:56], "big")
            chunk.touched.add((
                int.from_bytes(event[34:36], "big", signed=True),
                event[3] & KEY_KIND_MASK,
                event[HEADER_SIZE:HEADER_SIZE + key_length],
            ))

    def append_control(self, event: bytes) -> None:
        """A dump marker the fetcher read from an upstream relay (relay chaining,
        docs/relay-chaining.md), or a quarantine marker (relay/quarantine/_sink.py):
        stored in the open window as it came. A window holding one is kept even if
        it holds watermarks only."""
        self._controls = True
        self._target.append_control(event)

    def watermark(self, token: str) -> None:
        self._watermarks = True
        with self._cond:
            chunk = self._chunk
            if chunk is None or chunk.phase not in ("awaiting_low", "open"):
                log.debug("watermark %s: no chunk waits for it", token)
                return
            if token == chunk.low:
                if chunk.phase == "awaiting_low":
                    chunk.phase = "open"
                    self.append = self._append_touching
                    self._cond.notify_all()
            elif token == chunk.high and chunk.phase == "open":
                self._emit = chunk
            else:
                log.debug("watermark %s: not the chunk's (%s, %s)", token, chunk.low, chunk.high)

    def end_window(self, timestamp_ns: int | None = None) -> int:
        scn = self._scn
        if scn is None:
            return self._target.end_window(timestamp_ns)
        chunk = self._emit
        if chunk is None:
            return self._end_window(scn, None, timestamp_ns)
        # Under the condition: the engine's withdraw (pause, cancel, retry) either finds
        # the chunk abandoned before its rows are written, or waits until they landed
        # and finds it emitted; never rows in the buffer of a chunk it gave up on.
        with self._cond:
            return self._end_window(scn, chunk if chunk.phase == "open" else None,
                                    timestamp_ns)

    def _end_window(self, scn: int, chunk: Chunk | None, timestamp_ns: int | None) -> int:
        emitted = 0
        if chunk is not None:
            emitted = self._emit_rows(chunk, scn, timestamp_ns or 0)
        marked = chunk is not None and (chunk.first or chunk.last)
        if (self._watermarks and not marked and not self._controls
                and self._target.window_events() == 0):
            # Watermarks only (or a chunk whose rows were all touched): nothing in it
            # for consumers.
            self._target.rollback()
            result = scn
        else:
            result = self._target.end_window(timestamp_ns)
        self._reset_window()
        if self._on_window is not None:
            self._on_window()
        if chunk is not None:
            with self._cond:
                chunk.emitted_scn = scn
                chunk.emitted_rows = emitted
                if chunk.phase == "open":
                    chunk.phase = "emitted"
                if self._chunk is chunk:
                    self._chunk = None
                    self.append = self._target.append
                self._cond.notify_all()
        return result

    def _emit_rows(self, chunk: Chunk, scn: int, timestamp_ns: int) -> int:
        rows = chunk.rows
        if rows is None:  # the engine writes H only after set_rows; defensive
            raise AssertionError("high watermark of a chunk without rows")
        partition = self._partition_id
        target = self._target
        if chunk.first:
            target.append_control(encode_dump_marker(
                scn=scn, kind="start", source=chunk.source, dump_id=chunk.dump_id,
                timestamp_ns=timestamp_ns, partition_id=partition))
        touched = chunk.touched
        source_id = chunk.source_id
        emitted = dropped = 0
        for row in rows:
            kind, key_bytes, _ = encode_key(row.key)
            if (source_id, int(kind), key_bytes) in touched:
                dropped += 1
                continue
            target.append(encode_event(scn, Op.UPSERT, source_id, row.key, row.value,
                                       row.fingerprint, timestamp_ns, partition, True))
            emitted += 1
        if chunk.last:
            target.append_control(encode_dump_marker(
                scn=scn, kind="end", source=chunk.source, dump_id=chunk.dump_id,
                rows=chunk.rows_before + emitted, timestamp_ns=timestamp_ns,
                partition_id=partition, outcome=chunk.outcome))
        chunk.dropped_rows = dropped
        return emitted

    def rollback(self) -> None:
        self._target.rollback()
        self._reset_window()

    def _reset_window(self) -> None:
        self._scn = None
        self._watermarks = False
        self._controls = False
        self._emit = None

