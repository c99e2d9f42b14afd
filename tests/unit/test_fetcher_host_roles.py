"""The fetcher host of a cluster member (issue 27, item 5): a role change cuts a retry
delay short and starts the delays over; conditions of a role's normal life (fenced, a
leader gone) are not failures. The seat is a stand-in with the ``Seat`` surface the
host uses (``assignment()``, ``on_change``); the cluster itself is tested on a real
ensemble in tests/integration/test_relay_cluster_roles.py."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest

from databus.errors import SourceError
from databus.fetchers._api import Fetcher, WindowSink
from databus.relay.cluster import Assignment, FencedError
from tests.unit.test_fetcher_host import FETCHERS, Relay
from tests.waiting import wait_until

SOURCE = "synthetic://?rate=0&keys=50&event_bytes=40&events_per_window=2&limit=5"


class StandInSeat:
    """What the host asks a seat: the assignment now, and where to say it changed."""

    def __init__(self, first: Assignment | None) -> None:
        self.current = first
        self.on_change = lambda: None

    def assignment(self) -> Assignment | None:
        return self.current

    def change(self, assignment: Assignment | None) -> float:
        """A new role, as the seat's election threads set it; when it was set."""
        self.current = assignment
        at = time.monotonic()
        self.on_change()
        return at


class DownFetcher(Fetcher):
    """An upstream or source that keeps failing (not a condition any role expects)."""

    scheme: ClassVar[str] = "down"
    runs: ClassVar[int] = 0

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        DownFetcher.runs += 1
        raise SourceError("connection refused")


class FencedFetcher(Fetcher):
    """A leader whose lease ran out (a pause): every window refused."""

    scheme: ClassVar[str] = "fenced"
    runs: ClassVar[int] = 0

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        FencedFetcher.runs += 1
        raise FencedError("the lease of epoch 3 ran out: not writing")


FETCHERS.update({"down": DownFetcher, "fenced": FencedFetcher})


@pytest.fixture(autouse=True)
def _reset_counters() -> None:
    DownFetcher.runs = FencedFetcher.runs = 0


def _member(tmp_path: Path, seat: StandInSeat, **options: float) -> Relay:
    relay = Relay(tmp_path, {"src": SOURCE}, **options)
    relay.host.seats = {"src": seat}  # type: ignore[dict-item]
    return relay


def test_a_promotion_reads_the_source_at_once_though_the_retry_delay_is_at_its_maximum(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The promise: a member promoted while it waits out a retry delay at its maximum
    (here 20 s, the first delay already the maximum) reads the source within 1 s of the
    promotion, not when the delay would have expired."""
    seat = StandInSeat(Assignment("follower", "down://leader/", 2))
    with _member(tmp_path, seat, backoff_initial=20, backoff_max=20) as relay:
        wait_until(lambda: "restarting in 20.00 s" in caplog.text,
                   "the follower waiting out its 20 s retry delay", 20)
        assert "(down://leader/)" in caplog.text  # what it read, not the config's source
        promoted = seat.change(Assignment("leader", SOURCE, 3))
        buffer = relay.buffers["src"]
        wait_until(lambda: buffer.state().max_scn == 5, "the leader read the source", 20)
        assert time.monotonic() - promoted < 1.0
        assert DownFetcher.runs == 1


def test_a_role_change_starts_the_delays_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seat = StandInSeat(Assignment("leader", "down://source/", 3))
    with _member(tmp_path, seat, backoff_initial=0.05, backoff_max=20) as relay:
        # Delays 0.05, 0.1, 0.2, 0.4, 0.8 (the log says the first; repeats are counted).
        wait_until(lambda: relay.host.status()["src"].restarts >= 5, "the delay grown", 20)
        caplog.clear()
        seat.change(Assignment("follower", "down://leader/", 4))
        wait_until(lambda: "restarting in" in caplog.text, "the follower's first failure", 20)
        # The follower's first delay is the first one again, not 1.6 s.
        assert re.findall(r"restarting in ([0-9.]+) s", caplog.text)[0] == "0.05"
        assert relay.host.status()["src"].state in {"backoff", "starting", "running"}


def test_fenced_is_no_failure_and_the_next_term_reads_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A leader fenced after a pause waits for the cluster (state standby), its delays
    not grown and nothing logged as an error; its next role starts at once."""
    seat = StandInSeat(Assignment("leader", "fenced://source/", 3,
                                  expected=(FencedError,)))
    with _member(tmp_path, seat, backoff_initial=20, backoff_max=20) as relay:
        wait_until(lambda: FencedFetcher.runs >= 3, "fenced attempts, asked again", 20)
        status = relay.host.status()["src"]
        assert status.state == "standby" and status.restarts == 0
        assert status.last_error is not None and "lease of epoch 3" in status.last_error
        assert "restarting in" not in caplog.text  # not a failure: no retry delay
        promoted = seat.change(Assignment("leader", SOURCE, 5))
        buffer = relay.buffers["src"]
        wait_until(lambda: buffer.state().max_scn == 5, "the next term read the source", 20)
        assert time.monotonic() - promoted < 1.0


def test_an_attempt_whose_role_changed_meanwhile_is_no_failure(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The leader a follower followed is gone (its attempts fail) and the seat no
    longer names it: no failure counted, the new assignment is asked at once."""
    seat = StandInSeat(Assignment("follower", "down://gone-leader/", 2,
                                  expected=(SourceError,)))
    with _member(tmp_path, seat, backoff_initial=20, backoff_max=20) as relay:
        wait_until(lambda: DownFetcher.runs >= 2, "attempts at the gone leader", 20)
        assert "restarting in" not in caplog.text
        assert relay.host.status()["src"].state == "standby"
        seat.current = None  # the cluster has no leader for a moment
        wait_until(lambda: relay.host.status()["src"].state == "standby", "standby", 20)
        seat.change(Assignment("leader", SOURCE, 3))
        wait_until(lambda: relay.buffers["src"].state().max_scn == 5, "promoted, reading", 20)
