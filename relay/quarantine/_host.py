"""One buffer's quarantine as the fetcher host runs it (DESIGN 17): what its fetcher's
``FetcherContext.quarantine`` and ``.quarantined`` do, and the sink step in front of
its buffer (relay/quarantine/_sink.py). The record and its file: relay/quarantine/_record.py.

``BufferQuarantine.attach`` fills a new fetcher's context: with ``on_source_error =
"quarantine"``, ``quarantine`` records the failure durably (before it returns), logs
one ERROR line (what, the SCN, the fix) and writes the marker into the open window (or
the next one); with ``"stop"`` it raises a non-retriable ``SourceQuarantinedError``
whose message holds the SCN and the fix, which fails the fetcher. A quarantine marker
the fetcher copies from an upstream relay is recorded (or lifted) here too, for a
source this buffer copies.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from databus.errors import ConfigError, SourceQuarantinedError
from databus.fetchers._api import ConfiguredSources, FetcherContext, SourceCatalog, SourceFailure
from databus.relay.dumps import DumpSink
from databus.relay.quarantine._record import Quarantine, QuarantineMarker, QuarantineStore
from databus.relay.quarantine._sink import QuarantineSink

__all__ = ["BufferQuarantine"]

log = logging.getLogger("databus.relay.fetchers")


def _marker(record: Quarantine) -> QuarantineMarker:
    return QuarantineMarker(record.source, "quarantined", record.scn, record.reason,
                            record.fix)


def _stop(failure: SourceFailure) -> None:
    """``on_source_error = "stop"``: the fetcher fails (not retried), saying what and how
    to fix it."""
    raise SourceQuarantinedError(
        f"source {failure.source} failed at SCN {failure.scn}: {failure.reason}. Fix: "
        f"{failure.fix} (on_source_error = \"stop\" stops the whole buffer; "
        f"\"quarantine\" would set this source aside and keep the others going)",
        source=failure.source, scn=failure.scn, reason=failure.reason, fix=failure.fix,
        retriable=False)


class BufferQuarantine:
    """See the module docstring. ``catalog`` gives source ids (to drop events);
    ``configured`` what the buffer's fetcher configuration names (None: cannot say)."""

    def __init__(self, name: str, store: QuarantineStore, mode: str, target: DumpSink,
                 partition_id: int, catalog: Callable[[], SourceCatalog],
                 configured: Callable[[], ConfiguredSources | None]) -> None:
        self.name = name
        self.store = store
        self.mode = mode
        self._catalog = catalog
        self._configured = configured
        self._dropped: tuple[int, frozenset[int]] = (-1, frozenset())
        self.sink = QuarantineSink(target, partition_id, dropped_ids=self._dropped_ids,
                                   on_marked=self._marked, on_upstream=self._upstream)
        for record in store.unmarked(name):  # set aside just before a crash
            self.sink.queue(_marker(record))

    def attach(self, context: FetcherContext) -> None:
        context.quarantined = self.quarantined
        context.quarantine = self.quarantine if self.mode == "quarantine" else _stop

    def quarantined(self) -> frozenset[str]:
        """``FetcherContext.quarantined``: the sources of this buffer set aside now."""
        return frozenset(self.store.active(self.name))

    def quarantine(self, failure: SourceFailure) -> None:
        """``FetcherContext.quarantine``: record durably, log one line, mark the stream."""
        record = self.store.add(self.name, failure)
        if record is None:
            return  # set aside already: the first failure stands
        log.error("%s", record.log_line())
        self.sink.mark_now(_marker(record))

    def _dropped_ids(self) -> frozenset[int]:
        generation, ids = self._dropped
        if generation != self.store.generation:
            catalog = self._catalog()
            found: set[int] = set()
            for source in self.store.active(self.name):
                # A name the relay cannot serve (a space) has no id, and no events.
                with contextlib.suppress(ConfigError):
                    found.add(catalog.source_id(source))
            ids = frozenset(found)
            self._dropped = (self.store.generation, ids)
        return ids

    def _marked(self, marker: QuarantineMarker, scn: int) -> None:
        if marker.state == "quarantined":
            self.store.marked(self.name, marker.source, scn)
        else:
            self.store.heal_step(self.name, marker.source, marked=True)

    def _upstream(self, marker: QuarantineMarker, scn: int) -> None:
        """A quarantine marker copied from an upstream relay: record it here too (a
        chained relay, a cluster follower), or lift it when the upstream healed."""
        configured = self._configured()
        if configured is not None and not configured.matches(marker.source):
            return  # a source this relay does not copy (markers pass every filter)
        store = self.store
        if marker.state == "healed":
            if marker.source in store.active(self.name):
                store.remove(self.name, marker.source)
                log.warning("buffer %s: source %s healed upstream; out of quarantine here "
                            "too (the upstream's dump follows)", self.name, marker.source)
            return
        record = store.add(self.name, SourceFailure(
            marker.source, marker.scn if marker.scn is not None else scn,
            marker.reason, marker.fix), marker_scn=scn)
        if record is not None:
            log.error("%s (as the upstream relay says)", record.log_line())
