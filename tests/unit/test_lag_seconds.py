"""Lag in seconds (DESIGN 17), the pure pieces: the fetcher's figure and when it is
unknown, a window's commit time read back from the buffer, the consumer's figure, the
PostgreSQL heartbeat's time. The servers' side is tests/integration/test_lag_seconds.py."""

from __future__ import annotations

import time
from pathlib import Path

from databus.batch import encode_event
from databus.checkpoint import Checkpoint
from databus.event import Op
from databus.fetchers.postgres._changes import heartbeat_time_ns
from databus.relay._buffer import EventBuffer
from databus.relay._consumers import ConsumerRegistry
from databus.relay._fetcher_host import fetcher_lag

S = 1_000_000_000


def test_fetcher_lag_is_now_minus_what_was_read_through() -> None:
    assert fetcher_lag("running", 100 * S, 50.0, now=103.5, monotonic=49.0) == 3.5
    # A source clock ahead of the relay's: never negative.
    assert fetcher_lag("running", 105 * S, 50.0, now=103.0, monotonic=49.0) == 0.0


def test_fetcher_lag_is_unknown_never_zero_when_nothing_says_it() -> None:
    # Silent past what the fetcher announced (a blocked source, no heartbeat).
    assert fetcher_lag("running", 100 * S, 50.0, now=100.0, monotonic=50.1) is None
    # Nothing read through in this attempt yet.
    assert fetcher_lag("running", None, 50.0, now=100.0, monotonic=49.0) is None
    # Not running: the source is unreachable, or the fetcher failed or waits.
    for state in ("starting", "backoff", "standby", "stopped", "failed"):
        assert fetcher_lag(state, 100 * S, 50.0, now=100.0, monotonic=49.0) is None


def _window(buf: EventBuffer, scn: int, ts: int, events: int = 3) -> None:
    buf.start_window(scn)
    for i in range(events):
        buf.append(encode_event(scn, Op.UPSERT, 1, scn * 10 + i, b"v" * 200, 0, ts, 0))
    buf.end_window(ts)


def test_the_buffer_gives_back_each_windows_commit_time(tmp_path: Path) -> None:
    # Small index steps and a small ring: lookups cross index entries and laps.
    with EventBuffer(tmp_path / "b", 1 << 14, index_every_bytes=1024) as buf:
        assert buf.window_timestamp_ns(1) is None
        for scn in range(1, 200):
            _window(buf, scn * 3, scn * S + 7)
        assert buf.last_window_timestamp_ns == 199 * S + 7
        state = buf.state()
        assert state.min_scn is not None and state.min_scn > 3  # older windows evicted
        for scn in range(state.min_scn, 600, 3):
            assert buf.window_timestamp_ns(scn) == (scn // 3) * S + 7
        assert buf.window_timestamp_ns(3) is None  # evicted
        assert buf.window_timestamp_ns(state.min_scn + 1) is None  # no such window
        assert buf.window_timestamp_ns(600) is None  # not written yet


def test_consumer_lag_is_now_minus_its_checkpoints_commit_time() -> None:
    wall = [1000.0]
    reg = ConsumerRegistry(clock=lambda: 5.0, wall_clock=lambda: wall[0])
    times = {10: 900 * S, 20: 950 * S, 30: 990 * S}

    def window_time(buffer: str, scn: int) -> int | None:
        return times.get(scn) if buffer == "b" else None

    for client, scn in (("newest", 30), ("stale", 10), ("gone", 5), ("latest", -2)):
        reg.observe(client, buffer="b", checkpoint=Checkpoint(scn), events=0, nbytes=0,
                    filter_json=None, sources=(), address=None, streaming=False)
    docs = {d["client_id"]: d for d in reg.snapshot({"b": 30}, window_time, {"b": 10})}
    assert docs["newest"]["lag_seconds"] == 0.0  # at the newest window
    assert docs["stale"]["lag_seconds"] == 100.0  # 1000 - 900
    # Older than every window held: at least as old as the oldest one.
    assert docs["gone"]["lag_seconds"] == 100.0
    assert docs["latest"]["lag_seconds"] == 0.0
    # The SCN lag of a binlog source is a byte distance; seconds are what alerts use.
    assert docs["stale"]["lag_scn"] == 20
    wall[0] = 1010.0  # a stale consumer's lag grows with the clock (cached commit time)
    docs = {d["client_id"]: d for d in reg.snapshot({"b": 30}, window_time, {"b": 10})}
    assert docs["stale"]["lag_seconds"] == 110.0
    # Without a way to read commit times, a consumer behind is unknown, not 0.
    docs = {d["client_id"]: d for d in reg.snapshot({"b": 30})}
    assert docs["stale"]["lag_seconds"] is None and docs["newest"]["lag_seconds"] == 0.0


def test_a_partial_window_is_not_caught_up() -> None:
    reg = ConsumerRegistry(clock=lambda: 5.0, wall_clock=lambda: 1000.0)
    reg.observe("p", buffer="b", checkpoint=Checkpoint(30, 2), events=0, nbytes=0,
                filter_json=None, sources=(), address=None, streaming=False)
    [doc] = reg.snapshot({"b": 30}, lambda b, scn: 997 * S if scn == 30 else None)
    assert doc["lag_seconds"] == 3.0


def test_the_heartbeat_message_carries_the_servers_clock() -> None:
    assert heartbeat_time_ns(b"1700000000123456") == 1_700_000_000_123_456_000
    assert heartbeat_time_ns(b"") is None  # an older relay's heartbeat
    assert heartbeat_time_ns(b"-5") is None
    assert heartbeat_time_ns(b"nope") is None


def test_the_clients_lag_in_seconds_is_its_last_windows_age_and_absent_when_unknown(
        ) -> None:
    from databus.client import ClientMetrics

    m = ClientMetrics()
    assert m.lag_seconds is None  # no relay answered yet
    assert "databus_client_lag_seconds{" not in m.prometheus_text("c")
    m.relay_max_scn, m.consumer_scn = 50, 50
    assert m.lag_seconds == 0.0  # at the relay's newest window
    assert 'databus_client_lag_seconds{client="c"} 0.0' in m.prometheus_text("c")
    m.relay_max_scn = 90
    m.last_window_timestamp_ns = time.time_ns() - 30 * S
    lag = m.lag_seconds
    assert lag is not None and 30 <= lag < 40


def test_the_bootstrap_appliers_lag_in_seconds() -> None:
    from databus.bootstrap._server import applier_lag_seconds

    assert applier_lag_seconds(None, None, None, 1000.0) == 0.0  # an empty log
    assert applier_lag_seconds(50, 50, 900 * S, 1000.0) == 0.0  # at the log's newest
    assert applier_lag_seconds(50, 20, 900 * S, 1000.0) == 100.0
    assert applier_lag_seconds(50, None, 990 * S, 1000.0) == 10.0  # nothing applied yet
    assert applier_lag_seconds(50, 20, None, 1000.0) is None  # not in the log: unknown


def test_the_bootstrap_producers_lag_in_seconds() -> None:
    from databus.bootstrap._producer import ProducerStatus

    status = ProducerStatus()
    assert status.lag_seconds is None  # starting: unknown
    status.state = "running"
    assert status.lag_seconds is None  # nothing logged, not caught up: unknown
    status.last_timestamp_ns = time.time_ns() - 20 * S
    lag = status.lag_seconds
    assert lag is not None and 20 <= lag < 30
    status.caught_up = True
    assert status.lag_seconds == 0.0 and status.to_json()["lag_seconds"] == 0.0
    status.state = "retrying"  # the relay is unreachable
    assert status.lag_seconds is None


def test_the_replicators_lag_in_seconds_is_shown_and_absent_when_unknown() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from databus.replicator._status import ReplicationStats, metrics_page, status_document

    stats = ReplicationStats("r")
    for lag, expected in ((2.5, 2.5), (None, None)):
        doc = status_document(stats, relay_max_scn=20, lag_ms=None, target="sqlite:///x",
                              lag_seconds=lag)
        assert doc["lag_seconds"] == expected
        page = metrics_page(lambda doc=doc: doc).decode()  # type: ignore[misc]
        samples = {s.name: s.value for f in text_string_to_metric_families(page)
                   for s in f.samples}
        assert samples.get("databus_replicator_lag_seconds") == expected


def test_a_chained_buffer_reads_through_what_its_upstream_did_once_it_holds_its_max() -> None:
    from databus.fetchers.relay._fetcher import upstream_read_through

    doc = {"max_scn": 40, "fetcher": {"read_through": 1000.5, "lag_seconds": 0.2}}
    assert upstream_read_through(doc, 40) == 1_000_500_000_000
    assert upstream_read_through(doc, 39) is None  # behind the upstream: not yet
    assert upstream_read_through(doc, None) is None
    unknown = {"max_scn": 40, "fetcher": {"read_through": 1000.5, "lag_seconds": None}}
    assert upstream_read_through(unknown, 40) is None  # the upstream cannot say
    assert upstream_read_through({"max_scn": 40, "fetcher": None}, 40) is None


def test_a_client_pulling_a_bootstrap_snapshot_has_an_unknown_lag_not_zero() -> None:
    from databus.client import ClientMetrics

    # A snapshot window carries the bootstrap service's clock: its age says nothing.
    m = ClientMetrics(relay_max_scn=90, consumer_scn=50, bootstrapping=True,
                      bootstrap_phase="snapshot", last_window_timestamp_ns=time.time_ns())
    assert m.lag_seconds is None
    m.bootstrap_phase = "catchup"  # catch-up windows are the log's: their commit times
    assert m.lag_seconds is not None


def test_a_synthetic_source_at_its_limit_keeps_its_lag_known(tmp_path: Path) -> None:
    import asyncio

    from tests.relay_harness import relay_config, running_relay
    from tests.waiting import async_wait_until

    uri = "synthetic://?rate=0&limit=5&events_per_window=1"

    async def scenario() -> None:
        async with running_relay(relay_config(tmp_path, {"s": uri})) as r:
            await r.wait_for_scn("s", 5)
            idle_since = time.time()

            async def moved_on() -> bool:
                fetcher = (await r.json("/v1/status"))["buffers"]["s"]["fetcher"]
                return bool((fetcher["read_through"] or 0) > idle_since + 0.3
                            and fetcher["lag_seconds"] is not None)

            await async_wait_until(moved_on, "read through past the idle start", 10)

    asyncio.run(scenario())
