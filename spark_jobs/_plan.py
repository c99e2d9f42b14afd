"""What a compaction or a seed will do, decided before Spark starts (pure).

The bootstrap store has ONE applied SCN for all its sources: the snapshot tables
together are the state at that SCN. So a job that moves it to a target T must bring
every source with log rows in (applied, T] to T, and a job may only touch a subset of
sources when the others have nothing in that range. Refusals happen here, quickly and
with the reason, never after an hour of Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from databus.spark_jobs._common import JobRefused
from databus.spark_jobs._store import StoreState, SwapPlan

LogRows = Callable[[int, "int | None", int], int]
"""(source id, after SCN or None for the log's start, up to SCN) -> log rows."""


@dataclass(frozen=True)
class SourceJob:
    """One snapshot table to rebuild: a base (the current snapshot, a dump, or nothing)
    merged with the source's log rows in (``log_after``, target]."""

    name: str
    source_id: int
    base: str  # "snapshot", "dump" or "none"
    log_after: int | None  # None: from the log's start
    log_rows: int


@dataclass(frozen=True)
class JobPlan:
    target_scn: int
    sources: tuple[SourceJob, ...]
    swap: SwapPlan
    notes: tuple[str, ...] = ()


def _scn_range(after: int | None, upto: int) -> str:
    return f"(start, {upto}]" if after is None else f"({after}, {upto}]"


def plan_compaction(
    state: StoreState,
    log_rows: LogRows,
    *,
    target_scn: int | None = None,
    sources: Sequence[str] | None = None,
    rebuild: bool = False,
) -> JobPlan:
    """Compaction to ``target_scn`` (default: the log's end).

    Default mode merges the current snapshot with the log after the applied SCN (what
    the applier would do, in one pass). ``rebuild`` ignores the snapshot and rebuilds
    from the whole log, which is only possible while the log is complete.
    """
    end = state.log_end_scn
    if end is None:
        raise JobRefused("the bootstrap log is empty (no window, no producer position): "
                         "nothing to compact")
    target = end if target_scn is None else target_scn
    if target > end:
        raise JobRefused(
            f"target SCN {target} is beyond the log's end {end}: a snapshot can only be "
            "built from windows the log holds (wait for the producer, or pick an SCN "
            f"<= {end})"
        )
    applied = state.applied_scn
    if applied is not None and target < applied:
        raise JobRefused(
            f"target SCN {target} is older than the applied SCN {applied}: the snapshot "
            "already holds later changes, and compaction never moves a snapshot back"
        )
    known = state.sources
    chosen = list(known) if not sources else list(dict.fromkeys(sources))
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise JobRefused(f"the store has no source {', '.join(unknown)} "
                         f"(it has: {', '.join(known) or 'none'})")
    floor = state.log_floor_scn
    if rebuild and floor is not None:
        raise JobRefused(
            f"the log only holds windows after SCN {floor} (retention, or a seeded start): "
            "a rebuild from the log alone would lose every key last changed at or before "
            "it. Compact without --rebuild: it merges the current snapshot with the log"
        )
    # Rows that move the applied SCN: every source that has some must come along.
    moving = {name: log_rows(known[name], applied, target) for name in known}
    left_out = [f"{n} ({moving[n]} rows)" for n in known if n not in chosen and moving[n]]
    if left_out:
        raise JobRefused(
            "the applied SCN is shared by all sources of the store, so every source with "
            f"log rows in {_scn_range(applied, target)} must be compacted together; "
            f"{', '.join(left_out)} {'is' if len(left_out) == 1 else 'are'} left out "
            "(drop --source, or add them)"
        )
    after = None if rebuild else applied
    jobs = tuple(
        SourceJob(name, known[name], "none" if rebuild else "snapshot", after,
                  log_rows(known[name], None, target) if rebuild else moving[name])
        for name in chosen if rebuild or moving[name]
    )
    notes: list[str] = []
    if not jobs:
        notes.append(f"no log rows in {_scn_range(after, target)}: no table to rewrite")
    swap = SwapPlan(
        target_scn=target,
        replace={j.source_id: j.name for j in jobs},
        applied_at_plan=applied,
        reads_log=bool(jobs),
        log_after=after,
        floor_at_plan=floor,
    )
    return JobPlan(target, jobs, swap, tuple(notes))


def plan_seed(state: StoreState, log_rows: LogRows, *, source: str, dump_scn: int) -> JobPlan:
    """A seed of ``source`` from a dump consistent at ``dump_scn`` (S).

    - An empty store (no window, nothing applied): the snapshot is the dump, applied and
      log floor become S, and a producer without a checkpoint starts right after S.
    - A store with a log: the log must reach S and hold everything after it (floor <=
      S). The snapshot becomes dump + the source's log in (S, T], T = max(applied, S);
      other sources with log rows in (applied, T] are compacted to T in the same swap.
      The floor becomes at least S: consolidated deltas since earlier SCNs would miss
      the deletes the dump cannot show.
    """
    if source not in state.sources:
        raise JobRefused(f"source {source!r} is not registered in the store")
    source_id = state.sources[source]
    applied = state.applied_scn
    if state.newest_window_scn is None and applied is None:
        producer = state.producer_scn
        if producer is not None and producer > dump_scn:
            raise JobRefused(
                f"the producer is already past the dump (at SCN {producer} > {dump_scn}) but "
                "the log holds none of the changes in between: take a new dump"
            )
        job = SourceJob(source, source_id, "dump", dump_scn, 0)
        swap = SwapPlan(target_scn=dump_scn, replace={source_id: source}, applied_at_plan=None,
                        reads_log=False, log_after=dump_scn, new_floor=dump_scn,
                        producer_start=dump_scn)
        return JobPlan(dump_scn, (job,), swap,
                       (f"empty store: the log will start after SCN {dump_scn}",))
    end = state.log_end_scn
    assert end is not None  # windows or an applied SCN exist
    if dump_scn > end:
        raise JobRefused(
            f"the dump was taken at SCN {dump_scn}, after the log's end {end}: wait until the "
            "producer has passed it, so that the log covers every change after the dump"
        )
    floor = state.log_floor_scn
    if floor is not None and floor > dump_scn:
        raise JobRefused(
            f"the log only holds windows after SCN {floor}, later than the dump's SCN "
            f"{dump_scn}: the changes in between are gone; take a newer dump"
        )
    target = dump_scn if applied is None else max(applied, dump_scn)
    jobs = [SourceJob(source, source_id, "dump", dump_scn,
                      log_rows(source_id, dump_scn, target))]
    for name, sid in state.sources.items():
        if name != source:
            rows = log_rows(sid, applied, target)
            if rows:
                jobs.append(SourceJob(name, sid, "snapshot", applied, rows))
    afters = [j.log_after for j in jobs]
    log_after = None if None in afters else min(a for a in afters if a is not None)
    swap = SwapPlan(
        target_scn=target,
        replace={j.source_id: j.name for j in jobs},
        applied_at_plan=applied,
        reads_log=True,
        log_after=log_after,
        floor_at_plan=floor,
        new_floor=dump_scn,
    )
    notes = []
    if target > dump_scn:
        notes.append(f"the log's changes in ({dump_scn}, {target}] are merged on top of the "
                     "dump")
    if len(jobs) > 1:
        notes.append(f"{len(jobs) - 1} other source(s) compacted to {target} as well")
    return JobPlan(target, tuple(jobs), swap, tuple(notes))
