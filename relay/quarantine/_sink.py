"""The quarantine step between a fetcher and its buffer (DESIGN 17; relay/quarantine/_record.py).

``QuarantineSink`` is the ``WindowSink`` a fetcher writes to (in front of the dump
step, ``relay.dumps.DumpSink``):

- it writes each pending quarantine marker into the next window (or into the open one,
  when a fetcher quarantines a source mid-window), and tells the host once a window
  holding it was published (``on_marked``); a window rolled back takes its markers
  with it and they stay pending;
- it drops a data event of a quarantined source that a fetcher still appends
  (defensive: a fetcher leaves them out itself), one rate-limited warning per source;
- a quarantine marker a fetcher copies from an upstream relay (relay chaining, cluster
  followers) is stored as it came and reported to the host (``on_upstream``), which
  records (or lifts) the quarantine here too.

Fetcher thread only, except ``queue`` (a heal, from the HTTP side): under a lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from databus._limited_log import limited
from databus.errors import EventFormatError
from databus.event import QUARANTINE_SOURCE_ID, decode_event
from databus.relay.dumps import DumpSink
from databus.relay.quarantine._record import (
    QuarantineMarker,
    decode_quarantine_marker,
    encode_quarantine_marker,
)

__all__ = ["QuarantineSink"]

log = logging.getLogger("databus.relay.quarantine")


class QuarantineSink:
    """See the module docstring."""

    def __init__(self, target: DumpSink, partition_id: int, *,
                 dropped_ids: Callable[[], frozenset[int]],
                 on_marked: Callable[[QuarantineMarker, int], None],
                 on_upstream: Callable[[QuarantineMarker, int], None]) -> None:
        self._target = target
        self._partition_id = partition_id
        self._dropped_ids = dropped_ids
        self._on_marked = on_marked
        self._on_upstream = on_upstream
        self._lock = threading.Lock()
        self._pending: list[QuarantineMarker] = []
        self._in_window: list[QuarantineMarker] = []
        self._scn: int | None = None
        self.dropped = 0  # data events of quarantined sources left out
        # False while this buffer copies another relay's windows as a cluster follower:
        # its windows stay byte-identical to the leader's, whose markers it copies.
        self.own_markers = True

    # -- the host's side --------------------------------------------------------------

    def queue(self, marker: QuarantineMarker) -> None:
        """Write ``marker`` in the next window (any thread)."""
        with self._lock:
            if marker not in self._pending:
                self._pending.append(marker)

    def mark_now(self, marker: QuarantineMarker) -> None:
        """Write ``marker`` in the open window if there is one (the fetcher thread,
        from ``FetcherContext.quarantine``), else in the next one."""
        self.queue(marker)
        if self._scn is not None:
            self._write_pending()

    # -- the fetcher's side (WindowSink) ----------------------------------------------

    def start_window(self, scn: int) -> None:
        self._target.start_window(scn)
        self._scn = scn
        self._in_window = []
        self._write_pending()

    def _write_pending(self) -> None:
        scn = self._scn
        assert scn is not None
        if not self.own_markers:
            return
        with self._lock:
            todo = [m for m in self._pending if m not in self._in_window]
        for marker in todo:
            self._target.append_control(encode_quarantine_marker(
                window_scn=scn, marker=marker, partition_id=self._partition_id))
            self._in_window.append(marker)

    def append(self, event: bytes) -> None:
        ids = self._dropped_ids()
        if ids and int.from_bytes(event[34:36], "big", signed=True) in ids:
            self.dropped += 1
            source_id = int.from_bytes(event[34:36], "big", signed=True)
            limited(log).warning("the fetcher appended an event of quarantined source id %d; "
                                 "left out", source_id, kind=f"dropped {source_id}")
            return
        self._target.append(event)

    def append_control(self, event: bytes) -> None:
        """A marker copied from an upstream relay: stored as it came; a quarantine
        marker is reported to the host too."""
        decoded = decode_event(event)
        if decoded.header.source_id == QUARANTINE_SOURCE_ID:
            try:
                marker = decode_quarantine_marker(decoded.header, decoded.value)
            except EventFormatError as exc:
                # A bad answer of the upstream: roll back, ask again (maybe elsewhere).
                exc.retriable = True
                raise
            assert self._scn is not None
            self._on_upstream(marker, self._scn)
            with self._lock:
                # The upstream's marker says it: ours (the same) would be a second copy.
                if marker in self._pending:
                    self._in_window.append(marker)
        self._target.append_control(event)

    def watermark(self, token: str) -> None:
        self._target.watermark(token)

    def window_events(self) -> int:
        return self._target.window_events() if hasattr(self._target, "window_events") else 0

    def end_window(self, timestamp_ns: int | None = None) -> int:
        scn = self._target.end_window(timestamp_ns)
        landed, self._in_window, self._scn = self._in_window, [], None
        if landed:
            with self._lock:
                self._pending = [m for m in self._pending if m not in landed]
            for marker in landed:
                self._on_marked(marker, scn)
        return scn

    def rollback(self) -> None:
        self._target.rollback()
        self._in_window, self._scn = [], None
