"""The watermark step of a dump (DBLog, DESIGN 8.1): a ``WindowSink`` between a fetcher
and its buffer.

The dump engine (``_worker``) reads tables in chunks on connections of its own, several
chunks in flight at once (parallel readers, each one chunk ahead); for each chunk it
hands this sink a ``Chunk`` and writes two watermark rows through the source's log. The
fetcher passes the log on to this sink unchanged, calling ``watermark(token)`` where it
read a watermark row, and this sink does the rest in log order::

    log:     ... w1  [L]  w2(k=5)  w3(k=9)  [H]  w4 ...
    chunk:            SELECT k in (3, 5, 7, 9)  (read between L and H)
    buffer:  ... w1       w2       w3       H-window: [start?] 3 7 [end?] EOW   w4 ...

- ``awaiting_low``: the chunk is registered; events pass through untouched.
- ``open`` (L seen): the chunk notes the log's position (a sequence number of appended
  events); while any chunk is open, every event appended is noted by (source id, key
  kind, key bytes) as *touched*, with that sequence number. The engine reads the chunk
  now (it waits for L first, so the read snapshot is later than everything logged
  before L).
- H seen (inside its window): at ``end_window`` the chunk's rows whose key was touched
  after its L are dropped (the log has their newer state), the rest are appended to
  that window in one call (``append_many``) with its SCN, opcode upsert and the dump
  flag; the table's start marker goes before the first rows of the table that reach
  the buffer (whichever range they come from) and its end marker after the last chunk
  of its last range. The chunk is ``emitted`` only once the buffer took the window: if
  it fails, the fetcher host rolls back and restarts the fetcher, which reads H again
  and this sink tries again (the table's counts change only after success).

Touched keys are a superset when windows were rolled back (the keys of a window read
twice are noted twice): harmless, a dropped row's key has a log event after L that the
restarted fetcher writes again. Entries older than every open chunk's L are pruned;
with no chunk open the per-event cost is nothing (``append`` is the buffer's own bound
method). Watermarks nobody registered (an old chunk after a restart, another relay's
dump of the same source) are ignored. A window that holds only watermarks is not stored
(there is nothing in it for consumers).

No I/O and no threads of its own: the fetcher thread calls the ``WindowSink`` methods,
the engine's threads ``offer``/``set_rows``/``wait``; a condition guards the hand-over.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from databus.batch import encode_events
from databus.errors import EventFormatError
from databus.event import (
    HEADER_SIZE,
    KEY_KIND_MASK,
    KeyKind,
    Op,
    decode_key,
    encode_dump_marker,
    encode_key,
)
from databus.fetchers._api import DumpRow

__all__ = ["Chunk", "ChunkPhase", "DumpSink", "MarkerSink", "TableRun", "key_identity"]

log = logging.getLogger("databus.relay.dumps")

ChunkPhase = Literal["awaiting_low", "open", "emitted", "abandoned"]
Identity = tuple[int, int, bytes]


class MarkerSink(Protocol):
    """The buffer as this sink needs it: a ``WindowSink`` that also takes dump markers
    and a chunk's rows in one call."""

    def start_window(self, scn: int) -> None: ...

    def append(self, event: bytes) -> None: ...

    def append_many(self, events: list[bytes]) -> None: ...

    def append_control(self, event: bytes) -> None: ...

    def window_events(self) -> int: ...

    def end_window(self, timestamp_ns: int | None = None) -> int: ...

    def rollback(self) -> None: ...


def key_identity(source_id: int, key: object) -> Identity:
    """How a chunk row is matched against log events: source id, key kind, key bytes."""
    kind, key_bytes, _ = encode_key(key)  # type: ignore[arg-type]
    return (source_id, int(kind), key_bytes)


@dataclass(eq=False)
class TableRun:
    """One table of a running dump as the buffer has it, shared by the chunks of all its
    key ranges; changed only by the fetcher thread, after a window with its rows landed.

    ``ranges_left``: ranges whose last chunk has not landed (the end marker goes after
    the last one). ``rows``: rows of the table in the buffer so far (the end marker's
    count)."""

    dump_id: str
    source: str
    started: bool = False  # its start marker is in the buffer
    ranges_left: int = 1
    rows: int = 0
    ended: bool = False  # its end marker is in the buffer


@dataclass(eq=False)
class Chunk:
    """One chunk of one key range of a table, in flight between a reader and the
    fetcher thread."""

    table: TableRun
    source_id: int
    low: str
    high: str
    phase: ChunkPhase = "awaiting_low"
    rows: list[DumpRow] | None = None  # set by the engine once the SELECT returned
    last: bool = False  # its range's last chunk
    outcome: str = "done"  # the end marker's: failed or cancelled for an empty last chunk
    low_seq: int = 0  # the sink's event sequence number when L was read
    emitted_scn: int | None = None
    emitted_rows: int = 0
    dropped_rows: int = 0

    @property
    def source(self) -> str:
        return self.table.source

    @property
    def dump_id(self) -> str:
        return self.table.dump_id


# Prune touched keys older than every open chunk's L after this many new events.
_PRUNE_EVERY = 200_000


class DumpSink:
    """The fetcher's ``WindowSink`` for one buffer (see the module docstring)."""

    def __init__(self, target: MarkerSink, partition_id: int,
                 on_window: Callable[[], None] | None = None) -> None:
        self._target = target
        self._partition_id = partition_id
        self._on_window = on_window
        self._cond = threading.Condition()
        self._chunks: dict[str, Chunk] = {}  # by low and by high token, while in flight
        # Fetcher thread only.
        self._seq = 0  # events appended while a chunk was open
        self._touched: dict[int, dict[tuple[int, bytes], int]] = {}  # source id -> key -> seq
        self._pruned_at = 0
        self._scn: int | None = None
        self._watermarks = False  # the open window held a watermark
        self._controls = False  # the open window holds a marker from the fetcher's side
        self._emit: list[Chunk] = []
        self.dumped = 0  # dump rows written into the buffer (the rest came from the log)
        # The buffer's own bound method while no chunk is open: no cost per event.
        self.append: Callable[[bytes], None] = target.append

    # -- the engine's side ------------------------------------------------------------

    def offer(self, chunk: Chunk) -> None:
        """Put ``chunk`` in flight (beside any others)."""
        with self._cond:
            self._chunks[chunk.low] = chunk
            self._chunks[chunk.high] = chunk
            self._cond.notify_all()

    def set_rows(self, chunk: Chunk, rows: list[DumpRow], *, last: bool) -> None:
        """The chunk's SELECT returned (before its high watermark is written)."""
        with self._cond:
            chunk.rows = rows
            chunk.last = last

    def withdraw(self, chunk: Chunk) -> None:
        """Give up on ``chunk`` (cancel, pause, an error before it landed); waits for rows
        being written into the buffer (the condition is held while they are)."""
        with self._cond:
            if chunk.phase in ("awaiting_low", "open"):
                chunk.phase = "abandoned"
            self._forget(chunk)

    def _forget(self, chunk: Chunk) -> None:
        """(Under the condition.) ``chunk`` is no longer in flight."""
        if self._chunks.get(chunk.low) is chunk:
            del self._chunks[chunk.low]
        if self._chunks.get(chunk.high) is chunk:
            del self._chunks[chunk.high]
        if not any(c.phase == "open" for c in self._chunks.values()):
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
        self._emit = []

    def _append_touching(self, event: bytes) -> None:
        self._target.append(event)
        self._seq += 1
        source_id = int.from_bytes(event[34:36], "big", signed=True)
        keys = self._touched.get(source_id)
        if keys is None:
            keys = self._touched[source_id] = {}
        key_length = int.from_bytes(event[52:56], "big")
        keys[(event[3] & KEY_KIND_MASK, event[HEADER_SIZE:HEADER_SIZE + key_length])] = (
            self._seq)

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
            chunk = self._chunks.get(token)
            if chunk is None or chunk.phase not in ("awaiting_low", "open"):
                log.debug("watermark %s: no chunk waits for it", token)
                return
            if token == chunk.low:
                if chunk.phase == "awaiting_low":
                    chunk.phase = "open"
                    chunk.low_seq = self._seq
                    self.append = self._append_touching
                    self._cond.notify_all()
            elif chunk.phase == "open" and chunk not in self._emit:
                self._emit.append(chunk)
            else:
                log.debug("watermark %s: chunk %s not open", token, chunk.low)

    def end_window(self, timestamp_ns: int | None = None) -> int:
        scn = self._scn
        if scn is None:
            return self._target.end_window(timestamp_ns)
        if not self._emit:
            return self._end_window(scn, [], timestamp_ns)
        # Under the condition: an engine's withdraw (pause, cancel, retry) either finds
        # a chunk abandoned before its rows are written, or waits until they landed and
        # finds it emitted; never rows in the buffer of a chunk it gave up on.
        with self._cond:
            return self._end_window(scn, [c for c in self._emit if c.phase == "open"],
                                    timestamp_ns)

    def _end_window(self, scn: int, chunks: list[Chunk], timestamp_ns: int | None) -> int:
        emitted: list[tuple[Chunk, int, int]] = []
        runs: dict[int, tuple[TableRun, bool, int, int, bool]] = {}
        marked = False
        for chunk in chunks:
            run = chunk.table
            state = runs.get(id(run), (run, run.started, run.ranges_left, run.rows,
                                       run.ended))
            rows, dropped, state, marks = self._emit_rows(chunk, scn, timestamp_ns or 0,
                                                          state)
            runs[id(run)] = state
            marked = marked or marks
            emitted.append((chunk, rows, dropped))
        if (self._watermarks and not marked and not self._controls
                and self._target.window_events() == 0):
            # Watermarks only (or chunks whose rows were all touched): nothing in it for
            # consumers.
            self._target.rollback()
            result = scn
        else:
            result = self._target.end_window(timestamp_ns)
        # The window landed: the tables' counts move on.
        self.dumped += sum(rows for _, rows, _ in emitted)
        for run, started, ranges_left, rows, ended in runs.values():
            run.started, run.ranges_left, run.rows, run.ended = (started, ranges_left,
                                                                 rows, ended)
        self._reset_window()
        if self._on_window is not None:
            self._on_window()
        if chunks:
            with self._cond:
                for chunk, rows, dropped in emitted:
                    chunk.emitted_scn = scn
                    chunk.emitted_rows = rows
                    chunk.dropped_rows = dropped
                    if chunk.phase == "open":
                        chunk.phase = "emitted"
                    self._forget(chunk)
                self._cond.notify_all()
        self._prune()
        return result

    def _emit_rows(self, chunk: Chunk, scn: int, timestamp_ns: int,
                   state: tuple[TableRun, bool, int, int, bool]
                   ) -> tuple[int, int, tuple[TableRun, bool, int, int, bool], bool]:
        """Append ``chunk``'s rows (those the log did not touch after its L) and the
        table's markers; the table's new state, applied once the window landed."""
        run, started, ranges_left, total, ended = state
        rows = chunk.rows
        if rows is None:  # the engine writes H only after set_rows; defensive
            raise AssertionError("high watermark of a chunk without rows")
        partition = self._partition_id
        target = self._target
        marked = False
        if not started:
            target.append_control(encode_dump_marker(
                scn=scn, kind="start", source=run.source, dump_id=run.dump_id,
                timestamp_ns=timestamp_ns, partition_id=partition))
            started = marked = True
        kept = self._untouched(chunk, rows)
        if kept:
            target.append_many(encode_events(
                scn, [Op.UPSERT] * len(kept), [chunk.source_id] * len(kept),
                [row.key for row in kept], [row.value for row in kept],
                [row.fingerprint for row in kept], timestamp_ns=timestamp_ns,
                partition_id=partition, from_snapshot=True))
        total += len(kept)
        if chunk.last:
            ranges_left -= 1
            if ranges_left <= 0 and not ended:
                target.append_control(encode_dump_marker(
                    scn=scn, kind="end", source=run.source, dump_id=run.dump_id,
                    rows=total, timestamp_ns=timestamp_ns, partition_id=partition,
                    outcome=chunk.outcome))
                ended = marked = True
        return len(kept), len(rows) - len(kept), (run, started, ranges_left, total,
                                                   ended), marked

    def _untouched(self, chunk: Chunk, rows: list[DumpRow]) -> list[DumpRow]:
        """``rows`` minus those whose key a log event touched after the chunk's L.

        Touched keys are few (a writer's changes during one chunk), rows many: each
        touched key is decoded and looked up among the rows' keys, so no row's key is
        encoded unless it matches."""
        keys = self._touched.get(chunk.source_id)
        if not keys or not rows:
            return rows
        after = chunk.low_seq
        recent = [ident for ident, seq in keys.items() if seq > after]
        if not recent:
            return rows
        index = {_hashable(row.key): i for i, row in enumerate(rows)}
        drop: set[int] = set()
        for kind, key_bytes in recent:
            try:
                key = decode_key(KeyKind(kind), key_bytes)
            except (ValueError, EventFormatError):
                continue
            found = index.get(_hashable(key))
            # Equal as Python values (1 == 1.0 == True) is not equal as keys: confirm.
            if found is not None and key_identity(chunk.source_id, rows[found].key)[1:] == (
                    kind, key_bytes):
                drop.add(found)
        if not drop:
            return rows
        return [row for i, row in enumerate(rows) if i not in drop]

    def _prune(self) -> None:
        """Forget touched keys no open chunk can ask about (fetcher thread)."""
        if not self._touched:
            return
        with self._cond:
            lows = [c.low_seq for c in self._chunks.values() if c.phase == "open"]
        if not lows:
            self._touched.clear()
            self._pruned_at = self._seq
            return
        if self._seq - self._pruned_at < _PRUNE_EVERY:
            return
        oldest = min(lows)
        for source_id in list(self._touched):
            kept = {k: s for k, s in self._touched[source_id].items() if s > oldest}
            if kept:
                self._touched[source_id] = kept
            else:
                del self._touched[source_id]
        self._pruned_at = self._seq

    def rollback(self) -> None:
        self._target.rollback()
        self._reset_window()

    def _reset_window(self) -> None:
        self._scn = None
        self._watermarks = False
        self._controls = False
        self._emit = []


def _hashable(key: object) -> object:
    """A key as a dict key: composite keys (lists from the sources) as tuples."""
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    return key
