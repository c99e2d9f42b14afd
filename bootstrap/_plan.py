"""Algorithm 1 (paper 000 section 3.5) as pure checkpoint transitions.

The server is stateless: everything it needs to continue a bootstrap travels in the
consumer's checkpoint (DESIGN section 3). These functions take a checkpoint and what the
store reported and return the next checkpoint; ``_serve.py`` does the reading.

    online T / full (-1) --start--> snapshot(source 0, since T, start S = applied SCN)
    snapshot(i) --batches by key, last short--> catch-up(sources 0..i, S -> target)
    catch-up(i) --log exhausted--> snapshot(i + 1, start = target)  or  done (online at target)

For a consumer with state (T >= 0) the server may skip the snapshot and replay the log
from T: ``choose_replay`` decides from the measured ratio of updates to existing keys
(paper Figure 16: the consolidated snapshot delta wins above about half).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from databus.checkpoint import FLEXIBLE_SCN, INT64_MAX, Checkpoint, Mode
from databus.errors import BootstrapTooOldError, CheckpointError, StorageUnavailableError

Strategy = Literal["auto", "snapshot", "log"]

# What after_snapshot_batch writes: hex of a key, or "scn:hex" for a delta. Strict, so
# that int() never sees thousands of digits, signs, spaces or non-ASCII digits.
_LAST_KEY = re.compile(r"(?:(0|[1-9][0-9]{0,18}):)?((?:[0-9a-f]{2})*)", re.ASCII)


@dataclass(frozen=True, slots=True)
class StoreFacts:
    """The store's positions, read at the time of the decision."""

    applied_scn: int | None
    producer_scn: int | None
    log_floor_scn: int | None


def choose_replay(
    strategy: Strategy, *, rows: int, distinct_keys: int, breakeven_ratio: float
) -> bool:
    """True to replay the log, False for the snapshot delta (then catch-up)."""
    if strategy != "auto":
        return strategy == "log"
    if rows == 0:
        return True  # nothing after T in the log: replay is an empty read
    update_ratio = 1.0 - distinct_keys / rows
    return update_ratio < breakeven_ratio


def start(checkpoint: Checkpoint, facts: StoreFacts, n_sources: int, *, replay: bool
          ) -> Checkpoint:
    """The first bootstrap checkpoint for an online one (T = its window SCN).

    ``replay`` is the strategy's answer for a consumer with state; ignored for a full
    snapshot. Raises ``BootstrapTooOldError`` when the log no longer reaches back to T.
    """
    if checkpoint.mode is not Mode.ONLINE:
        raise CheckpointError("only an online checkpoint starts a bootstrap")
    # A partly consumed window is replayed whole (from just before it): repeating its
    # first events is at-least-once; skipping the rest would lose them.
    partial = checkpoint.window_offset >= 0
    since = checkpoint.window_scn - 1 if partial else checkpoint.window_scn
    if n_sources < 1:
        raise CheckpointError("a bootstrap needs at least one source")
    last = n_sources - 1
    if since < 0:
        if since != FLEXIBLE_SCN:
            raise CheckpointError(f"cannot bootstrap from window_scn {since}")
        # Full snapshot as of the applier's SCN (or, before the first apply, the floor).
        if facts.applied_scn is None and facts.log_floor_scn is None:
            # Nothing says where the store's history starts: a snapshot "as of 0" would
            # send the consumer back to the relay at SCN 0, long evicted there, and from
            # there to a bootstrap "too old" for the floor the producer writes next.
            raise StorageUnavailableError(
                "the bootstrap store holds no log yet (its producer has not written "
                "anything)"
            )
        begin = _first_defined(facts.applied_scn, facts.log_floor_scn)
        return Checkpoint(FLEXIBLE_SCN, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=begin,
                          bootstrap_source_index=0)
    if facts.log_floor_scn is None:
        raise StorageUnavailableError(
            "the bootstrap store holds no log yet (its producer has not written anything)"
        )
    if since < facts.log_floor_scn:
        raise BootstrapTooOldError(
            f"SCN {since} is older than the bootstrap log, which starts after "
            f"{facts.log_floor_scn}: the changes in between are gone. Clear the consumer's "
            "state and checkpoint to start again from a full snapshot.",
            log_floor_scn=facts.log_floor_scn,
        )
    applied = facts.applied_scn
    if replay or applied is None or since >= applied:
        # Replay everything after T (an applier behind T makes the snapshot useless).
        target = max(since, facts.producer_scn if facts.producer_scn is not None else since)
        return Checkpoint(since, mode=Mode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=since,
                          bootstrap_target_scn=target, bootstrap_source_index=last,
                          bootstrap_since_scn=since)
    return Checkpoint(since, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=applied,
                      bootstrap_source_index=0, bootstrap_since_scn=since)


def _first_defined_or_none(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _first_defined(*values: int | None) -> int:
    for value in values:
        if value is not None:
            return value
    return 0  # an empty store: there is nothing before SCN 0 to read


def after_snapshot_batch(checkpoint: Checkpoint, *, last_key: bytes | None, exhausted: bool,
                         facts: StoreFacts | None, n_sources: int,
                         last_scn: int | None = None) -> Checkpoint:
    """After serving a snapshot batch: more of this source, or its catch-up.

    ``facts`` must be read after the batch. The rows served reflect changes applied up
    to then, so catch-up must reach the applied SCN at least. The next source's snapshot
    starts at this target, so for every source but the last the target is exactly the
    applied SCN (a later snapshot read reflects at least that much; the producer's SCN
    may be ahead of what the snapshot holds). The last source's catch-up goes on to the
    producer's SCN, the newest the log has, to hand over to the relay as late as can be.
    """
    _require(checkpoint, Mode.BOOTSTRAP_SNAPSHOT)
    start_scn, index = checkpoint.bootstrap_start_scn, checkpoint.bootstrap_source_index
    assert start_scn is not None and index is not None
    if not exhausted:
        if last_key is None:
            raise ValueError("a snapshot batch that is not the last must have a last key")
        if checkpoint.bootstrap_since_scn is None:
            return _replace(checkpoint, bootstrap_last_key=last_key.hex())
        # A delta is read in (scn, key) order: its position is the pair.
        if last_scn is None:
            raise ValueError("a delta batch that is not the last must have a last SCN")
        return _replace(checkpoint, bootstrap_last_key=f"{last_scn}:{last_key.hex()}")
    if facts is None:
        raise ValueError("the end of a source's snapshot needs the store's positions")
    last = index + 1 >= n_sources
    reached = facts.producer_scn if last else facts.applied_scn
    target = max(start_scn, reached if reached is not None else start_scn)
    return Checkpoint(start_scn, mode=Mode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=start_scn,
                      bootstrap_target_scn=target, bootstrap_source_index=index,
                      bootstrap_since_scn=checkpoint.bootstrap_since_scn)


def after_catchup_batch(checkpoint: Checkpoint, *, last_scn: int | None, exhausted: bool,
                        n_sources: int) -> Checkpoint:
    """After serving catch-up windows up to ``last_scn``: more catch-up, the next
    source's snapshot, or done (an online checkpoint at the target)."""
    _require(checkpoint, Mode.BOOTSTRAP_CATCHUP)
    target = checkpoint.bootstrap_target_scn
    index = checkpoint.bootstrap_source_index
    assert target is not None and index is not None
    if not exhausted:
        if last_scn is None:
            raise ValueError("a catch-up batch that is not the last must end at a window")
        return _replace(checkpoint, window_scn=last_scn)
    if index + 1 < n_sources:
        since = checkpoint.bootstrap_since_scn
        return Checkpoint(since if since is not None else FLEXIBLE_SCN,
                          mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=target,
                          bootstrap_source_index=index + 1, bootstrap_since_scn=since)
    return Checkpoint(target)


def snapshot_after_key(checkpoint: Checkpoint) -> tuple[int | None, bytes | None]:
    """Where the snapshot read resumes: (None, key) for a full snapshot, (scn, key) for
    a delta, (None, None) at the start of a source."""
    text = checkpoint.bootstrap_last_key
    if text is None:
        return None, None
    match = _LAST_KEY.fullmatch(text)
    if match is None:
        raise CheckpointError("bootstrap_last_key is not what the server sent")
    scn_text, key_hex = match.groups()
    key = bytes.fromhex(key_hex)
    scn = int(scn_text) if scn_text is not None else None
    if scn is not None and scn > INT64_MAX:
        # It goes into SQL next, where it would overflow the BIGINT column.
        raise CheckpointError("bootstrap_last_key: its SCN is beyond the signed 64-bit range")
    if (scn is None) != (checkpoint.bootstrap_since_scn is None):
        raise CheckpointError("bootstrap_last_key does not match the kind of snapshot read")
    return scn, key


def check_sources(checkpoint: Checkpoint, n_sources: int) -> None:
    index = checkpoint.bootstrap_source_index
    if index is not None and index >= n_sources:
        raise CheckpointError(
            f"bootstrap_source_index {index} is beyond the {n_sources} source(s) requested: "
            "continue a bootstrap with the same sources it began with"
        )


def store_behind(checkpoint: Checkpoint, facts: StoreFacts) -> str | None:
    """Why the store cannot go on with this bootstrap yet, or None when it can.

    A snapshot in progress promises rows reflecting at least its start SCN (the catch-up
    starts there); a catch-up promises the log up to its target. A store that lost
    recent commits (a crash with ``synchronous_commit = off``, a failover to a lagging
    replica, a restore) would serve older rows or a shorter log, and the changes in
    between would never reach the consumer: a silent gap. So the server serves nothing
    and hands the same checkpoint back until the producer and the applier have written
    them again, as a relay does for an SCN it does not hold yet (a checkpoint naming a
    future SCN gets the same answer: it is waited for, never an error).
    """
    # What the store's snapshot reflects and where its log ends: before the first
    # apply (or the first append) that is the log's floor, where its history starts.
    if checkpoint.mode is Mode.BOOTSTRAP_SNAPSHOT:
        need, what = checkpoint.bootstrap_start_scn, "applied"
        have = _first_defined_or_none(facts.applied_scn, facts.log_floor_scn)
    elif checkpoint.mode is Mode.BOOTSTRAP_CATCHUP:
        need, what = checkpoint.bootstrap_target_scn, "logged"
        have = _first_defined_or_none(facts.producer_scn, facts.log_floor_scn)
        if need is not None and need <= checkpoint.window_scn:
            return None  # nothing left to read
    else:
        return None
    if need is not None and need >= 0 and (have is None or have < need):
        return (f"the bootstrap store has {what} up to SCN {have}, behind this bootstrap's "
                f"SCN {need}")
    return None


def _require(checkpoint: Checkpoint, mode: Mode) -> None:
    if checkpoint.mode is not mode:
        raise CheckpointError(f"expected a {mode.value} checkpoint, got {checkpoint.mode.value}")


def _replace(checkpoint: Checkpoint, **changes: object) -> Checkpoint:
    fields = checkpoint.to_json()
    fields.update(changes)
    return Checkpoint.from_json(fields)
