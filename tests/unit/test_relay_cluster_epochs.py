"""The pure parts of relay clusters: epoch histories and the leader's lease."""

from __future__ import annotations

from pathlib import Path

import pytest

from databus.coordination import Lease
from databus.errors import DatabusError
from databus.relay.cluster import EpochEntry, EpochHistory, StaleEpochError


def test_epoch_of_each_scn_and_persistence(tmp_path: Path) -> None:
    path = tmp_path / "src.epochs.json"
    history = EpochHistory.load(path)
    assert history.current == 0 and history.epoch_of(5) == 0
    history.append(1, None)
    history.append(2, 100)
    history.append(2, 150)  # the same term again: nothing changes
    history.append(5, 300)
    assert [history.epoch_of(s) for s in (1, 100, 101, 300, 301)] == [1, 1, 2, 2, 5]
    again = EpochHistory.load(path)
    assert again.entries == history.entries and again.current == 5


def test_an_older_epoch_is_refused_fencing() -> None:
    history = EpochHistory([EpochEntry(3, 50)])
    with pytest.raises(StaleEpochError, match="fenced leader"):
        history.append(2, 60)
    with pytest.raises(DatabusError, match="before epoch 3"):
        history.append(4, 40)  # a term cannot start before the previous one did


def test_a_follower_takes_its_leaders_history_whole() -> None:
    upstream = [EpochEntry(1, None), EpochEntry(2, 500), EpochEntry(3, 900)]
    # Behind its leader: the windows it will copy get the leader's epochs.
    behind = EpochHistory([EpochEntry(1, None)])
    assert behind.follow(upstream, 300) is None  # none of its windows changed epoch
    assert behind.to_json() == [[1, None], [2, 500], [3, 900]]
    # It copied the windows up to 700 with a stale epoch (through a member that was not
    # the leader), or held them from a term of its own that the leader read again:
    # the leader's epoch of each window wins, and the change is reported.
    ahead = EpochHistory([EpochEntry(1, None)])
    assert ahead.follow(upstream, 700) == (500, 700)
    assert ahead.to_json() == [[1, None], [2, 500], [3, 900]]
    assert [ahead.epoch_of(s) for s in (500, 501, 900, 901)] == [1, 2, 2, 3]
    empty = EpochHistory()
    assert empty.follow(upstream, None) is None
    assert empty.to_json() == [[1, None], [2, 500], [3, 900]]


def test_a_follower_never_takes_an_older_history() -> None:
    """A member that is not (yet) the leader, with an older newest epoch: refused, and
    so is an empty history; a history out of order is an error."""
    history = EpochHistory([EpochEntry(1, None), EpochEntry(4, 800)])
    assert history.follow([EpochEntry(1, None), EpochEntry(3, 500)], 900) is None
    assert history.follow([], 900) is None
    assert history.to_json() == [[1, None], [4, 800]]
    with pytest.raises(StaleEpochError):
        history.follow([EpochEntry(5, None), EpochEntry(4, 900)], 900)
    # The same newest epoch, another start: the leader's wins.
    assert history.follow([EpochEntry(1, None), EpochEntry(4, 600)], 900) == (600, 900)


def test_a_damaged_history_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "src.epochs.json"
    path.write_text("[[1, ")
    with pytest.raises(DatabusError, match="damaged"):
        EpochHistory.load(path)


def test_the_lease_runs_from_the_send_time_and_ends_for_good_when_revoked() -> None:
    now = [100.0]
    lease = Lease(1.0, clock=lambda: now[0])
    assert not lease.valid()  # nothing confirmed yet
    lease.confirm(100.0)
    now[0] = 100.9
    assert lease.valid()
    now[0] = 101.0
    assert not lease.valid()  # a pause past the lease: no commit until confirmed again
    lease.confirm(99.9)  # the answer to an older request does not extend it
    assert not lease.valid()
    lease.confirm(100.8)
    assert lease.valid() and lease.remaining() == pytest.approx(0.8)
    lease.revoke()
    lease.confirm(101.0)
    assert not lease.valid()
