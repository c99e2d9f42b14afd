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


def test_a_follower_adopts_its_upstreams_epochs_for_what_it_copies() -> None:
    upstream = [EpochEntry(1, None), EpochEntry(2, 500), EpochEntry(3, 900)]
    follower = EpochHistory([EpochEntry(1, None)])
    follower.adopt(upstream, 700)  # it holds up to 700 and copies after it
    assert follower.to_json() == [[1, None], [2, 700], [3, 900]]
    behind = EpochHistory([EpochEntry(1, None)])
    behind.adopt(upstream, 300)
    assert behind.to_json() == [[1, None], [2, 500], [3, 900]]
    empty = EpochHistory()
    empty.adopt(upstream, None)
    assert empty.to_json() == [[1, None], [2, 500], [3, 900]]


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
