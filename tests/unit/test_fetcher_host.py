"""The fetcher host: restarts with backoff from the buffer's max SCN, status, stop, and
a relay restart that resumes without a gap or a repeat."""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

import pytest

from databus.config import BufferConfig, RelayConfig
from databus.errors import ConfigError, DatabusError, SourceError
from databus.event import decode_event
from databus.fetchers._api import Fetcher, FetcherContext, WindowSink
from databus.fetchers.synthetic import SyntheticFetcher
from databus.relay._buffer import BufferState, EventBuffer
from databus.relay._catalog import RelayCatalog
from databus.relay._fetcher_host import Backoff, FetcherHost, resume_point
from tests.unit.test_synthetic_fetcher import content, generator, read_windows
from tests.waiting import wait_until

CAPACITY = 4 << 20
LOAD = "rate=0&keys=500&event_bytes=120&events_per_window=3&update_ratio=0.5&seed=5"


class FlakyFetcher(SyntheticFetcher):
    """The synthetic fetcher, failing in the middle of a window every few windows."""

    scheme: ClassVar[str] = "flaky"
    fail_after_appends: ClassVar[int] = 10  # the 4th window of every run, mid-window
    runs: ClassVar[list[tuple[float, int | None]]] = []  # (monotonic, start_after_scn)

    def __init__(self, uri: str, context: FetcherContext) -> None:
        super().__init__(uri.replace("flaky://", "synthetic://", 1), context)

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        FlakyFetcher.runs.append((time.monotonic(), start_after_scn))
        super().run(FailingSink(sink, self.fail_after_appends), start_after_scn, stop)


class FailingSink:
    """Passes windows on to ``sink`` and raises at the n-th append, mid-window."""

    def __init__(self, sink: WindowSink, fail_at: int) -> None:
        self.start_window = sink.start_window
        self.end_window = sink.end_window
        self.rollback = sink.rollback
        self._append = sink.append
        self._left = fail_at

    def append(self, event: bytes) -> None:
        self._append(event)  # half a window is in the buffer, unpublished
        self._left -= 1
        if self._left == 0:
            raise SourceError("flaky failure: connection reset")


class LeakyFetcher(Fetcher):
    """Fails at once with its URI (and so its password) in the message."""

    scheme: ClassVar[str] = "leaky"

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        raise RuntimeError(f"cannot connect to {self.uri}")


class BrokenFetcher(Fetcher):
    """Fails with an error that retrying cannot fix."""

    scheme: ClassVar[str] = "broken"
    runs: ClassVar[int] = 0

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        BrokenFetcher.runs += 1
        raise ConfigError("table shop.gone does not exist")


class QuitterFetcher(Fetcher):
    """Returns from run() without being asked to stop."""

    scheme: ClassVar[str] = "quitter"
    runs: ClassVar[int] = 0

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        QuitterFetcher.runs += 1


class StallingFetcher(Fetcher):
    """Fails its first try; every later try hangs without reading or reporting (a
    source that black-holes the connection, or an idle one that says nothing)."""

    scheme: ClassVar[str] = "stalling"
    runs: ClassVar[int] = 0

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        StallingFetcher.runs += 1
        if StallingFetcher.runs == 1:
            raise SourceError("connection reset by the source")
        stop.wait()


class PositionedFetcher(SyntheticFetcher):
    """A synthetic source whose 'current position' is SCN 1000."""

    scheme: ClassVar[str] = "positioned"

    def __init__(self, uri: str, context: FetcherContext) -> None:
        super().__init__(uri.replace("positioned://", "synthetic://", 1), context)

    def initial_scn(self) -> int | None:
        return 1000


FETCHERS: dict[str, type[Fetcher]] = {
    cls.scheme: cls
    for cls in (SyntheticFetcher, FlakyFetcher, LeakyFetcher, BrokenFetcher, QuitterFetcher,
                PositionedFetcher, StallingFetcher)
}


def resolve(uri: str) -> type[Fetcher]:
    return FETCHERS[urlsplit(uri).scheme]


class Relay:
    """Buffers, catalog and host as the relay wires them, on files in ``data_dir``."""

    def __init__(self, data_dir: Path, sources: dict[str, str], **host_options: float) -> None:
        self.config = RelayConfig(
            data_dir=data_dir,
            buffers=tuple(BufferConfig(n, 4, s) for n, s in sources.items()),
        )
        self.buffers = {
            n: EventBuffer(data_dir / f"{n}.buf", CAPACITY, partition_id=i)
            for i, n in enumerate(sources)
        }
        self.catalog = RelayCatalog(data_dir / "catalog.json")
        options = {"backoff_initial": 0.01, "backoff_max": 0.04, **host_options}
        self.host = FetcherHost(self.config, self.buffers, self.catalog, resolve=resolve,
                                **options)

    def __enter__(self) -> Relay:
        self.host.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.host.stop()
        for buffer in self.buffers.values():
            buffer.close()


@pytest.fixture(autouse=True)
def _reset_counters() -> None:
    FlakyFetcher.runs = []
    BrokenFetcher.runs = 0
    StallingFetcher.runs = 0
    QuitterFetcher.runs = 0


def expected(uri: str, scns: range) -> list[tuple[object, ...]]:
    gen = generator(uri)
    return content([(s, [decode_event(e) for e in gen.window(s)]) for s in scns])


# -- pure pieces --------------------------------------------------------------------------


def test_resume_point() -> None:
    def state(prev: int, lo: int | None, hi: int | None) -> BufferState:
        return BufferState(prev, lo, hi, 0, 0, 1 << 20, 0, 0)

    assert resume_point(state(-1, None, None)) is None  # never started
    assert resume_point(state(1000, None, None)) == 1000  # started after 1000, empty
    assert resume_point(state(-1, 1, 40)) == 40
    assert resume_point(state(17, 18, 40)) == 40


def test_backoff_doubles_to_the_max_and_resets_after_a_healthy_run() -> None:
    backoff = Backoff(0.1, 1.0, healthy_after=60)
    assert [backoff.failed(0.5) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.failed(60) == 0.1
    assert backoff.failed(1) == 0.2
    with pytest.raises(ValueError):
        Backoff(0, 1, 1)


def test_backoff_counts_from_the_last_success_and_starts_over_on_reset() -> None:
    backoff = Backoff(0.1, 5.0, healthy_after=60)
    assert [backoff.failed(0.1) for _ in range(3)] == [0.1, 0.2, 0.4]
    # An attempt that wrote a window was a success, however short: a source restarted
    # again and again is retried after the first delay each time (not 3.2, then 6.4 s).
    assert [backoff.failed(0.5, progressed=True) for _ in range(5)] == [0.1] * 5
    assert [backoff.failed(0.1) for _ in range(8)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    backoff.reset()  # a role change: the previous role's failures say nothing
    assert backoff.failed(0.1) == 0.1


# -- the host -----------------------------------------------------------------------------


def test_a_failing_fetcher_restarts_from_the_max_scn_without_gap_or_repeat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"flaky://?{LOAD}&limit=60"
    with Relay(tmp_path, {"load": uri}) as relay:
        buffer = relay.buffers["load"]
        wait_until(lambda: buffer.state().max_scn == 60, "the buffer at SCN 60", 20)
        status = relay.host.status()["load"]
        windows = read_windows(buffer)
    assert [scn for scn, _ in windows] == list(range(1, 61))
    assert content(windows) == expected(f"synthetic://?{LOAD}", range(1, 61))
    # Three whole windows per run, then a failure mid-window: 20 runs.
    starts = [after for _, after in FlakyFetcher.runs]
    assert starts == [None, *range(3, 58, 3)]
    assert status.restarts >= 19
    assert status.last_error == "SourceError: flaky failure: connection reset"
    # Each restart waited its backoff, the first one every time: each run wrote
    # windows before it failed (a success), so the delays never grew.
    times = [t for t, _ in FlakyFetcher.runs]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.009
    delays = set(re.findall(r"restarting in ([0-9.]+) s", caplog.text))
    assert delays == {"0.01"}, delays


def test_status_reports_state_restarts_error_and_lag(tmp_path: Path) -> None:
    with Relay(tmp_path, {"load": f"flaky://?{LOAD}&limit=30"}) as relay:
        initial = relay.host.status()["load"]
        assert initial.state in {"starting", "running", "backoff"}
        wait_until(lambda: relay.buffers["load"].state().max_scn == 30, "buffer load at SCN 30", 20)
        wait_until(lambda: relay.host.status()["load"].state == "running", "fetcher load running",
                   20)
        status = relay.host.status()["load"]
    assert status.buffer == "load" and status.source.startswith("flaky://")
    assert status.restarts == 9 and status.last_error is not None
    assert status.last_error_at is not None and status.last_error_at <= time.time()
    assert status.source_scn == 30 and status.buffer_max_scn == 30 and status.lag_scn == 0
    assert status.last_window_at is not None
    doc = status.to_json()
    assert doc["state"] == "running" and doc["restarts"] == 9 and doc["lag_scn"] == 0
    assert relay.host.status()["load"].state == "stopped"


def test_a_retry_is_not_running_until_it_reads(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failure, the next try is "starting" (not ready) until it reads: a source
    that refuses or black-holes every try never shows "running" while one is under way.
    A try that lasts UNCONFIRMED_S without failing is "running" though it said nothing
    (an idle source whose fetcher reports nothing)."""
    from databus.relay import _fetcher_host

    monkeypatch.setattr(_fetcher_host, "UNCONFIRMED_S", 3600.0)
    with Relay(tmp_path, {"s": "stalling://source"}) as relay:
        wait_until(lambda: StallingFetcher.runs >= 2, "the second try", 20)
        time.sleep(0.2)
        status = relay.host.status()["s"]
        assert status.state == "starting", status
        assert "connection reset by the source" in (status.last_error or "")
        monkeypatch.setattr(_fetcher_host, "UNCONFIRMED_S", 0.0)
        assert relay.host.status()["s"].state == "running"
    # A retry that reads is "running" at once: FlakyFetcher's tries land windows
    # (test_status_reports_state_restarts_error_and_lag).


def test_passwords_never_reach_logs_or_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = "leaky://repl:s3cr%40t@db.example:3306/?tables=shop.orders&token=t0ken"
    caplog.set_level(logging.DEBUG)
    with Relay(tmp_path, {"shop": uri}) as relay:
        wait_until(lambda: relay.host.status()["shop"].restarts >= 2, "two restarts", 20)
        status = relay.host.status()["shop"]
    assert status.last_error is not None and "cannot connect" in status.last_error
    text = caplog.text + repr(status) + str(status.to_json())
    for secret in ("s3cr%40t", "s3cr@t", "t0ken"):
        assert secret not in text
    assert "repl:***@db.example" in status.source
    assert "cannot connect" in caplog.text and "RuntimeError" in caplog.text


def test_an_unrecoverable_error_marks_the_fetcher_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Relay(tmp_path, {"shop": "broken://db/"}) as relay:
        wait_until(lambda: relay.host.status()["shop"].state == "failed", "fetcher shop failed", 20)
        time.sleep(0.1)
        status = relay.host.status()["shop"]
    assert BrokenFetcher.runs == 1 and status.restarts == 0
    assert status.last_error == "ConfigError: table shop.gone does not exist"
    assert "cannot recover by retrying" in caplog.text


def test_a_fetcher_returning_early_is_restarted(tmp_path: Path) -> None:
    with Relay(tmp_path, {"q": "quitter://x/"}) as relay:
        wait_until(lambda: QuitterFetcher.runs >= 3, "three runs", 20)
        status = relay.host.status()["q"]
    assert status.last_error is not None and "returned" in status.last_error


def test_stop_is_prompt(tmp_path: Path) -> None:
    sources = {
        # Sleeping on the stop event between windows, 20 s apart.
        "slow": "synthetic://?rate=0.05",
        "waiting": "leaky://x/",  # sleeping out a long backoff
        # Done, idling until stopped (a source feeds one buffer: its own name).
        "idle": "synthetic://?rate=0&limit=3&source=idle.events",
    }
    with Relay(tmp_path, sources, backoff_initial=20, backoff_max=20) as relay:
        wait_until(lambda: relay.buffers["slow"].state().max_scn == 1, "buffer slow at SCN 1", 20)
        wait_until(lambda: relay.buffers["idle"].state().max_scn == 3, "buffer idle at SCN 3", 20)
        wait_until(lambda: relay.host.status()["waiting"].state == "backoff",
                   "fetcher waiting in backoff", 20)
        started = time.monotonic()
        relay.host.stop()
        # Not after the 20 s backoff nor at the next slow window (20 s): half of that is
        # slack for a busy machine.
        assert time.monotonic() - started < 10
        assert {s.state for s in relay.host.status().values()} == {"stopped"}
        assert not fetcher_threads()


def fetcher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("databus-fetcher")]


def test_an_empty_buffer_starts_after_the_sources_position(tmp_path: Path) -> None:
    uri = f"positioned://?{LOAD}&limit=1010"
    with Relay(tmp_path, {"load": uri}) as relay:
        buffer = relay.buffers["load"]
        wait_until(lambda: buffer.state().max_scn == 1010, "the buffer at SCN 1010", 20)
        state = buffer.state()
    assert (state.prev_scn, state.min_scn, state.windows) == (1000, 1001, 10)


def test_a_restarted_relay_resumes_after_its_max_scn(tmp_path: Path) -> None:
    first = f"synthetic://?{LOAD}&limit=30"
    with Relay(tmp_path, {"load": first}) as relay:
        wait_until(lambda: relay.buffers["load"].state().max_scn == 30, "buffer load at SCN 30", 20)
        ids = relay.catalog.sources()

    # A new process: the buffer file, the catalog file and a new host. The stream goes
    # on (a higher limit) after SCN 30, with the same source ids.
    relay = Relay(tmp_path, {"load": f"flaky://?{LOAD}&limit=70"})
    buffer = relay.buffers["load"]
    assert buffer.state().max_scn == 30
    with relay:
        wait_until(lambda: buffer.state().max_scn == 70, "the buffer at SCN 70", 20)
        assert relay.catalog.sources() == ids
        windows = read_windows(buffer)
    assert FlakyFetcher.runs[0][1] == 30
    assert [scn for scn, _ in windows] == list(range(1, 71))
    assert content(windows) == expected(f"synthetic://?{LOAD}", range(1, 71))


def test_bad_sources_fail_at_start(tmp_path: Path) -> None:
    for source in ("synthetic://?rate=-1", "nosuch://x/"):
        relay = Relay(tmp_path / source[:5], {"load": source})
        if source.startswith("nosuch"):
            relay.host = FetcherHost(relay.config, relay.buffers, relay.catalog)
        with pytest.raises(ConfigError):
            relay.host.start()
        relay.host.stop()
        assert not fetcher_threads()
        for buffer in relay.buffers.values():
            buffer.close()


def test_every_configured_buffer_needs_an_event_buffer(tmp_path: Path) -> None:
    config = RelayConfig(data_dir=tmp_path, buffers=(BufferConfig("load", 4, "synthetic://"),))
    with pytest.raises(ConfigError, match="load"):
        FetcherHost(config, {}, RelayCatalog(tmp_path / "catalog.json"))


def test_errors_are_databus_errors_with_a_retriable_flag() -> None:
    # The host's restart policy rests on this flag; keep the two error kinds it uses apart.
    assert SourceError("x").retriable and not ConfigError("x").retriable
    assert issubclass(SourceError, DatabusError)

