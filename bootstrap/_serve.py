"""One bootstrap stream request: read the store, build the body, say what comes next.

Blocking (the store is a DB-API connection); the HTTP shell runs ``serve`` in a thread.
The transitions are ``_plan.py``'s; this module only reads rows and frames them:

- snapshot phase: one window per batch of rows ordered by key; the events keep their own
  SCNs and the EOW carries the phase's start SCN;
- catch-up phase: the log's windows, whole, in commit order, each with its EOW.

A response holds several steps (a short snapshot batch and the start of the catch-up,
say) until it has ``max_bytes`` of events, so an empty phase costs no round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from databus.bootstrap import _plan
from databus.bootstrap._plan import StoreFacts, Strategy
from databus.bootstrap._storage import BootstrapStorage, LogRow
from databus.checkpoint import Checkpoint, Mode
from databus.errors import UnknownSourceError
from databus.event import WindowChecksum, decode_header, encode_eow
from databus.filters import FilterSpec

# Steps per response at most: bounds a request's time when many phases are empty.
log = logging.getLogger("databus.bootstrap.serve")

_MAX_STEPS = 16


@dataclass(frozen=True, slots=True)
class ServePolicy:
    strategy: Strategy = "auto"
    breakeven_ratio: float = 0.15
    ratio_sample_rows: int = 20_000
    batch_rows: int = 2000


@dataclass(slots=True)
class Served:
    body: bytearray = field(default_factory=bytearray)
    checkpoint: Checkpoint = field(default_factory=Checkpoint.flexible)
    events: int = 0
    phase: str = "snapshot"
    # How the bootstrap began, when this request began it: "snapshot" or "log".
    started_as: str | None = None
    # Why it stopped early with the store behind its checkpoint (see _plan.store_behind).
    waiting: str | None = None

    @property
    def done(self) -> bool:
        return self.checkpoint.mode is Mode.ONLINE


@dataclass
class ServeStats:
    """Counters for /metrics (updated from the request threads; ints are atomic enough)."""

    bootstraps_started: int = 0
    snapshot_starts: int = 0
    replay_starts: int = 0
    snapshot_rows_served: int = 0
    log_rows_served: int = 0
    last_update_ratio: float | None = None


class Bootstrapper:
    """Serves stream requests from one store."""

    def __init__(self, storage: BootstrapStorage, policy: ServePolicy) -> None:
        self.storage = storage
        self.policy = policy
        self.stats = ServeStats()

    def facts(self) -> StoreFacts:
        return StoreFacts(*self.storage.positions())

    def resolve_sources(self, requested: Sequence[str], spec: FilterSpec | None = None
                        ) -> list[str]:
        """The sources to serve, in order; ``unknown_source`` for a requested source, or
        a source a filter names, that the store does not have (the relay's rule: a
        filter on an unknown source is a mistake, not a filter that passes all)."""
        known = self.storage.source_ids()
        if spec is not None:
            strangers = [s for s in spec.filters if s not in known]
            if strangers:
                raise UnknownSourceError(
                    f"the filter names source(s) the bootstrap store does not have: "
                    f"{', '.join(strangers)}")
        if not requested:
            return sorted(known, key=known.__getitem__)
        unknown = [s for s in requested if s not in known]
        if unknown:
            raise UnknownSourceError(
                f"the bootstrap store has no source(s) {', '.join(unknown)}")
        return list(dict.fromkeys(requested))

    def serve(self, checkpoint: Checkpoint, sources: Sequence[str], spec: FilterSpec,
              max_bytes: int) -> Served:
        names = self.resolve_sources(sources, spec)
        out = Served(checkpoint=checkpoint)
        if checkpoint.mode is Mode.ONLINE:
            out.checkpoint = self._start(checkpoint, names)
            out.started_as = "log" if out.checkpoint.mode is Mode.BOOTSTRAP_CATCHUP else "snapshot"
        _plan.check_sources(out.checkpoint, len(names))
        for _ in range(_MAX_STEPS):
            if out.done or len(out.body) >= max_bytes:
                break
            # Before each read: a store behind this bootstrap (it lost commits, or a
            # checkpoint names its future) serves nothing yet; the client asks again.
            behind = _plan.store_behind(out.checkpoint, self.facts())
            if behind is not None:
                out.waiting = behind
                log.debug("bootstrap waits: %s", behind)
                break
            if out.checkpoint.mode is Mode.BOOTSTRAP_SNAPSHOT:
                self._snapshot_step(out, names, spec, max_bytes)
            else:
                self._catchup_step(out, names, spec, max_bytes)
        out.phase = ("done" if out.done else
                     "snapshot" if out.checkpoint.mode is Mode.BOOTSTRAP_SNAPSHOT else "catchup")
        return out

    # -- steps --------------------------------------------------------------------------

    def _read_limit(self, out: Served, max_bytes: int) -> int:
        """Rows to read for the next step: ``batch_rows``, or once this response has
        events, about as many as its remaining room holds (a read of ``batch_rows`` rows
        of which only a few fit would be thrown away and read again next request)."""
        limit = self.policy.batch_rows
        if out.events:
            per_event = len(out.body) / out.events  # EOWs included: errs towards fewer
            limit = min(limit, int((max_bytes - len(out.body)) / per_event) + 1)
        return max(1, limit)

    def _start(self, checkpoint: Checkpoint, names: list[str]) -> Checkpoint:
        policy = self.policy
        replay = False
        if checkpoint.window_scn >= 0:
            rows, distinct = self.storage.log_key_stats(
                names, after_scn=checkpoint.window_scn, sample=policy.ratio_sample_rows)
            if rows:
                self.stats.last_update_ratio = 1.0 - distinct / rows
            replay = _plan.choose_replay(policy.strategy, rows=rows, distinct_keys=distinct,
                                         breakeven_ratio=policy.breakeven_ratio)
        started = _plan.start(checkpoint, self.facts(), len(names), replay=replay)
        self.stats.bootstraps_started += 1
        if started.mode is Mode.BOOTSTRAP_CATCHUP:
            self.stats.replay_starts += 1
        else:
            self.stats.snapshot_starts += 1
        return started

    def _snapshot_step(self, out: Served, names: list[str], spec: FilterSpec,
                       max_bytes: int) -> None:
        cp = out.checkpoint
        assert cp.bootstrap_source_index is not None and cp.bootstrap_start_scn is not None
        source = names[cp.bootstrap_source_index]
        limit = self._read_limit(out, max_bytes)
        after_scn, after_key = _plan.snapshot_after_key(cp)
        rows = self.storage.snapshot_batch(
            source, after_key=after_key, after_scn=after_scn,
            since_scn=cp.bootstrap_since_scn, limit=limit, filter=spec)
        # Read after the rows: catch-up must reach every change those rows may reflect.
        facts = self.facts() if len(rows) < limit else None
        room = max_bytes - len(out.body)
        taken = 0
        check = WindowChecksum()
        start = len(out.body)
        for row in rows:
            if taken and len(out.body) - start + len(row.event) > room:
                break
            out.body += row.event
            check.add_event(row.event)
            taken += 1
        exhausted = taken == len(rows) and len(rows) < limit
        if taken:
            out.body += encode_eow(scn=cp.bootstrap_start_scn, event_count=check.count,
                                   checksum=check.crc, timestamp_ns=time.time_ns())
            out.events += taken
            self.stats.snapshot_rows_served += taken
        out.checkpoint = _plan.after_snapshot_batch(
            cp, last_key=rows[taken - 1].key if taken else None, exhausted=exhausted,
            last_scn=rows[taken - 1].scn if taken else None,
            facts=facts, n_sources=len(names))

    def _catchup_step(self, out: Served, names: list[str], spec: FilterSpec,
                      max_bytes: int) -> None:
        cp = out.checkpoint
        index, target = cp.bootstrap_source_index, cp.bootstrap_target_scn
        assert index is not None and target is not None
        rows = self.storage.log_batch(names[: index + 1], after_scn=cp.window_scn,
                                      upto_scn=target, limit=self._read_limit(out, max_bytes),
                                      filter=spec)
        if not rows:
            out.checkpoint = _plan.after_catchup_batch(cp, last_scn=None, exhausted=True,
                                                       n_sources=len(names))
            return
        room = max_bytes - len(out.body)
        last_scn: int | None = None
        used = 0
        for window in _windows(rows):
            size = sum(len(r.event) for r in window)
            if last_scn is not None and used + size > room:
                break  # whole windows only; at least one per step
            _frame_window(out.body, window)
            used += size
            out.events += len(window)
            self.stats.log_rows_served += len(window)
            last_scn = window[0].scn
        out.checkpoint = _plan.after_catchup_batch(cp, last_scn=last_scn, exhausted=False,
                                                   n_sources=len(names))


def _windows(rows: list[LogRow]) -> list[list[LogRow]]:
    out: list[list[LogRow]] = []
    for row in rows:
        if out and out[-1][0].scn == row.scn:
            out[-1].append(row)
        else:
            out.append([row])
    return out


def _frame_window(body: bytearray, window: list[LogRow]) -> None:
    check = WindowChecksum()
    for row in window:
        body += row.event
        check.add_event(row.event)
    timestamp = decode_header(window[-1].event).timestamp_ns
    body += encode_eow(scn=window[0].scn, event_count=check.count, checksum=check.crc,
                       timestamp_ns=timestamp)
