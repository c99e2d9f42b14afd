"""Algorithm 1's checkpoint transitions (bootstrap/_plan.py), without a store."""

from __future__ import annotations

import pytest

from databus.bootstrap import _plan
from databus.bootstrap._plan import StoreFacts
from databus.checkpoint import Checkpoint, Mode
from databus.errors import BootstrapTooOldError, CheckpointError, StorageUnavailableError

FACTS = StoreFacts(applied_scn=500, producer_scn=700, log_floor_scn=100)


def test_a_consumer_without_state_gets_a_full_snapshot_from_the_applied_scn() -> None:
    cp = _plan.start(Checkpoint.flexible(), FACTS, 2, replay=True)
    assert cp.mode is Mode.BOOTSTRAP_SNAPSHOT
    assert (cp.window_scn, cp.bootstrap_start_scn, cp.bootstrap_source_index) == (-1, 500, 0)
    assert cp.bootstrap_since_scn is None and cp.bootstrap_last_key is None


def test_a_consumer_with_state_gets_a_delta_or_a_replay() -> None:
    delta = _plan.start(Checkpoint(300), FACTS, 2, replay=False)
    assert delta.mode is Mode.BOOTSTRAP_SNAPSHOT
    assert (delta.window_scn, delta.bootstrap_start_scn, delta.bootstrap_since_scn) == (300, 500,
                                                                                      300)
    replay = _plan.start(Checkpoint(300), FACTS, 2, replay=True)
    assert replay.mode is Mode.BOOTSTRAP_CATCHUP
    assert (replay.window_scn, replay.bootstrap_start_scn, replay.bootstrap_target_scn,
            replay.bootstrap_source_index) == (300, 300, 700, 1)
    # An applier behind the consumer makes the snapshot useless: replay regardless.
    ahead = _plan.start(Checkpoint(600), FACTS, 2, replay=False)
    assert ahead.mode is Mode.BOOTSTRAP_CATCHUP
    # A partly consumed window is replayed whole.
    partial = _plan.start(Checkpoint(300, 2), FACTS, 1, replay=True)
    assert partial.window_scn == 299


def test_too_old_and_empty_store_errors() -> None:
    with pytest.raises(BootstrapTooOldError) as info:
        _plan.start(Checkpoint(99), FACTS, 1, replay=True)
    assert info.value.log_floor_scn == 100 and info.value.http_status == 410
    assert _plan.start(Checkpoint(100), FACTS, 1, replay=True).mode is Mode.BOOTSTRAP_CATCHUP
    with pytest.raises(StorageUnavailableError):
        _plan.start(Checkpoint(5), StoreFacts(None, None, None), 1, replay=True)
    # A full snapshot of a store whose producer has not written yet is not "as of 0":
    # that sent a new consumer to the relay at SCN 0 (evicted), then to a bootstrap
    # "too old" for the floor written next, a fatal error (seen in CI). 503, retried.
    with pytest.raises(StorageUnavailableError):
        _plan.start(Checkpoint.flexible(), StoreFacts(None, None, None), 1, replay=False)
    assert _plan.start(Checkpoint.flexible(), StoreFacts(None, None, 40), 1,
                       replay=False).bootstrap_start_scn == 40
    with pytest.raises(CheckpointError):
        _plan.start(Checkpoint(5, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=5,
                               bootstrap_source_index=0), FACTS, 1, replay=True)


def test_algorithm_1_walks_every_source_then_hands_over_at_the_last_target() -> None:
    cp = _plan.start(Checkpoint(300), FACTS, 2, replay=False)
    cp = _plan.after_snapshot_batch(cp, last_key=b"\x00k", exhausted=False, facts=None,
                                    n_sources=2, last_scn=420)
    # A delta resumes after an (scn, key) pair.
    assert cp.bootstrap_last_key == "420:006b"
    assert _plan.snapshot_after_key(cp) == (420, b"\x00k")
    # The end of source 0's snapshot: catch-up to the applied SCN (not the producer's,
    # which the next snapshot may not reflect yet).
    cp = _plan.after_snapshot_batch(cp, last_key=None, exhausted=True,
                                    facts=StoreFacts(550, 800, 100), n_sources=2)
    assert cp.mode is Mode.BOOTSTRAP_CATCHUP
    assert (cp.window_scn, cp.bootstrap_start_scn, cp.bootstrap_target_scn) == (500, 500, 550)
    cp = _plan.after_catchup_batch(cp, last_scn=520, exhausted=False, n_sources=2)
    assert cp.window_scn == 520
    cp = _plan.after_catchup_batch(cp, last_scn=None, exhausted=True, n_sources=2)
    assert cp.mode is Mode.BOOTSTRAP_SNAPSHOT
    assert (cp.bootstrap_source_index, cp.bootstrap_start_scn, cp.window_scn,
            cp.bootstrap_since_scn) == (1, 550, 300, 300)
    # The last source's catch-up runs to the producer's SCN.
    cp = _plan.after_snapshot_batch(cp, last_key=None, exhausted=True,
                                    facts=StoreFacts(600, 900, 100), n_sources=2)
    assert (cp.bootstrap_start_scn, cp.bootstrap_target_scn, cp.bootstrap_source_index) == (
        550, 900, 1)
    done = _plan.after_catchup_batch(cp, last_scn=None, exhausted=True, n_sources=2)
    assert done == Checkpoint(900)
    # Round trip through JSON, as the client sends it back.
    assert Checkpoint.loads(cp.dumps()) == cp


def test_the_update_ratio_picks_the_strategy() -> None:
    choose = _plan.choose_replay
    assert choose("auto", rows=100, distinct_keys=90, breakeven_ratio=0.5) is True  # 10%
    assert choose("auto", rows=100, distinct_keys=40, breakeven_ratio=0.5) is False  # 60%
    assert choose("auto", rows=0, distinct_keys=0, breakeven_ratio=0.5) is True
    assert choose("log", rows=100, distinct_keys=1, breakeven_ratio=0.5) is True
    assert choose("snapshot", rows=100, distinct_keys=100, breakeven_ratio=0.5) is False


def test_a_full_snapshot_resumes_by_key_alone() -> None:
    cp = _plan.start(Checkpoint.flexible(), FACTS, 1, replay=True)
    cp = _plan.after_snapshot_batch(cp, last_key=b"ab", exhausted=False, facts=None,
                                    n_sources=1, last_scn=7)
    assert cp.bootstrap_last_key == "6162"
    assert _plan.snapshot_after_key(cp) == (None, b"ab")
    assert _plan.snapshot_after_key(_plan.start(Checkpoint.flexible(), FACTS, 1,
                                                replay=True)) == (None, None)
    mixed = Checkpoint(-1, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=5,
                       bootstrap_source_index=0, bootstrap_last_key="9:6162")
    with pytest.raises(CheckpointError, match="kind"):
        _plan.snapshot_after_key(mixed)


def test_a_checkpoint_for_other_sources_or_with_a_bad_key_is_refused() -> None:
    cp = Checkpoint(-1, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=5,
                    bootstrap_source_index=2, bootstrap_last_key="zz")
    with pytest.raises(CheckpointError, match="beyond"):
        _plan.check_sources(cp, 2)
    with pytest.raises(CheckpointError, match="what the server sent"):
        _plan.snapshot_after_key(cp)


def test_a_store_that_went_back_in_time_is_waited_for_not_served() -> None:
    """A store that lost recent commits (a crash with synchronous_commit off, a lagging
    replica): a snapshot must not go on with rows older than its start SCN, nor a
    catch-up end before its target; the server waits until the store is back."""
    snapshot = Checkpoint(-1, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=300,
                          bootstrap_source_index=0)
    catchup = Checkpoint(250, mode=Mode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=250,
                         bootstrap_target_scn=300, bootstrap_source_index=0)
    behind = StoreFacts(applied_scn=280, producer_scn=290, log_floor_scn=0)
    caught_up = StoreFacts(applied_scn=300, producer_scn=310, log_floor_scn=0)
    assert "applied up to SCN 280" in (_plan.store_behind(snapshot, behind) or "")
    assert "logged up to SCN 290" in (_plan.store_behind(catchup, behind) or "")
    assert _plan.store_behind(snapshot, caught_up) is None
    assert _plan.store_behind(catchup, caught_up) is None
    # Before the first apply the snapshot is the log's floor (empty): no wait for it.
    fresh = Checkpoint(-1, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=5,
                       bootstrap_source_index=0)
    assert _plan.store_behind(fresh, StoreFacts(applied_scn=None, producer_scn=None,
                                                log_floor_scn=5)) is None
    # A catch-up with nothing left to read does not wait; an online checkpoint never.
    done = Checkpoint(300, mode=Mode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=250,
                      bootstrap_target_scn=300, bootstrap_source_index=0)
    assert _plan.store_behind(done, behind) is None
    assert _plan.store_behind(Checkpoint(10**6), behind) is None
