"""The client's bootstrap switch-over.

Pure parts first (decoder framing, dispatcher carrying checkpoints, rollback to a
bootstrap checkpoint, error mapping), then the whole client against a real relay and
the real bootstrap service on SQLite, in-process.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from databus.bootstrap._service import build_app, open_configured_storage
from databus.checkpoint import Checkpoint, Mode
from databus.client import (
    CallbackResult,
    ClientMetrics,
    Consumer,
    DatabusClient,
    MemoryCheckpointStore,
)
from databus.client._bootstrap_puller import BootstrapError, BootstrapPuller, BootstrapTooOld
from databus.client._client import _only_catchup
from databus.client._decode import Framing, ResponseDecoder
from databus.client._dispatcher import CallKind, Dispatcher, Step, checkpoint_scn
from databus.client._events import (
    BootstrapMark,
    DataEvent,
    EndOfWindow,
    Item,
    StartOfWindow,
    Window,
)
from databus.client._relay_puller import RelayPuller
from databus.client._runner import Outcome, Runner
from databus.config import BootstrapConfig, from_mapping
from databus.errors import EventFormatError, ScnNotFoundError, UnknownSourceError
from databus.event import Op, WindowChecksum, encode_eow, encode_event
from databus.schemas import AvroCodec
from tests.relay_harness import RunningRelay, relay_config, running_relay

R = CallbackResult
NAMES = {1: "db.a", 2: "db.b"}


def snap_cp(start: int, key: str | None = None, index: int = 0, since: int = -1) -> Checkpoint:
    return Checkpoint(since, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=start,
                      bootstrap_source_index=index, bootstrap_last_key=key)


def catchup_cp(at: int, start: int, target: int, index: int = 0) -> Checkpoint:
    return Checkpoint(at, mode=Mode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=start,
                      bootstrap_target_scn=target, bootstrap_source_index=index)


# -- decoder ------------------------------------------------------------------------


def raw(scn: int, key: int, source_id: int = 1) -> bytes:
    return encode_event(scn=scn, source_id=source_id, op=Op.UPSERT, key=key, value=b"")


def window(eow_scn: int, *events: bytes, count: int | None = None) -> bytes:
    check = WindowChecksum()
    for e in events:
        check.add_event(e)
    eow = encode_eow(scn=eow_scn, event_count=check.count if count is None else count,
                     checksum=check.crc)
    return b"".join(events) + eow


def shape(items: Sequence[Item]) -> list[tuple[str, int, Any]]:
    out: list[tuple[str, int, Any]] = []
    for i in items:
        if isinstance(i, DataEvent):
            out.append(("data", i.scn, (i.key, i.from_bootstrap)))
        elif isinstance(i, StartOfWindow):
            out.append(("start", i.scn, None))
        elif isinstance(i, EndOfWindow):
            out.append(("eow", i.scn, i.event_count))
        else:
            out.append(("mark", 0, i.end))
    return out


def decoder(framing: Framing) -> ResponseDecoder:
    d = ResponseDecoder(AvroCodec())
    d.reset(framing=framing)
    return d


def test_snapshot_framing_ends_windows_at_the_eow_only() -> None:
    # A snapshot batch: rows keep their own SCNs, the EOW carries the snapshot's SCN.
    body = window(12, raw(5, 1), raw(9, 2), raw(3, 3, source_id=2))
    items = decoder(Framing.SNAPSHOT).decode(body, NAMES)
    assert shape(items) == [("start", 12, None), ("data", 5, (1, True)),
                            ("data", 9, (2, True)), ("data", 3, (3, True)), ("eow", 12, 3)]
    # The same bytes from a relay are a torn stream.
    with pytest.raises(EventFormatError, match="without its EOW"):
        decoder(Framing.RELAY).decode(body, NAMES)


def test_snapshot_window_across_bodies_and_a_bad_body_in_between() -> None:
    d = decoder(Framing.SNAPSHOT)
    body = window(12, raw(5, 1), raw(9, 2), raw(3, 3))
    cut = len(raw(5, 1)) + len(raw(9, 2))
    assert d.decode(body[:cut], NAMES) == [] and d.in_window
    bad = bytearray(body[cut:])
    bad[20] ^= 0xFF
    with pytest.raises(EventFormatError):
        d.decode(bytes(bad), NAMES)
    assert d.in_window  # the held events survive a rejected body
    items = d.decode(body[cut:], NAMES)
    assert [s[:2] for s in shape(items)] == [("start", 12), ("data", 5), ("data", 9),
                                            ("data", 3), ("eow", 12)]
    assert not d.in_window


def test_empty_snapshot_window_makes_no_start() -> None:
    items = decoder(Framing.SNAPSHOT).decode(window(12), NAMES)
    assert shape(items) == [("eow", 12, 0)]


def test_catchup_framing_is_the_relays_without_eow_checks() -> None:
    # EOW counts are not checked for bootstrap bodies (the server rebuilds windows).
    body = window(7, raw(7, 1), raw(7, 2), count=5) + window(8, raw(8, 1))
    items = decoder(Framing.CATCHUP).decode(body, NAMES)
    assert shape(items) == [("data", 7, (1, True)), ("data", 7, (2, True)), ("eow", 7, 5),
                            ("data", 8, (1, True)), ("eow", 8, 1)]
    relay = decoder(Framing.RELAY)
    with pytest.raises(EventFormatError, match="checksum"):
        relay.decode(body, NAMES)
    # Relay events are not from bootstrap.
    assert shape(relay.decode(window(8, raw(8, 1)), NAMES))[0] == ("data", 8, (1, False))
    with pytest.raises(EventFormatError, match="without its EOW"):
        decoder(Framing.CATCHUP).decode(raw(7, 1) + window(8, raw(8, 2)), NAMES)


# -- dispatcher ---------------------------------------------------------------------


def ev(scn: int, key: int = 1, source: str = "db.a") -> DataEvent:
    return DataEvent(scn, source, Op.UPSERT, key, {"k": key}, 0, None, key, True)


def eow(scn: int, cp: Checkpoint | None = None) -> EndOfWindow:
    return EndOfWindow(scn, 0, 0, cp)


Trace = list[tuple[str, Any, str, Checkpoint | None]]


def drive(d: Dispatcher, items: Sequence[Item],
          answers: dict[CallKind, R] | None = None) -> Trace:
    """Feed items, answer every call, and trace (call, argument, step, checkpoint)."""
    trace: Trace = []
    for item in items:
        queue = d.feed(item)
        while queue:
            call = queue.pop(0)
            step, follow = d.result(call, (answers or {}).get(call.kind, R.SUCCESS))
            name = call.kind.name + ("(quiet)" if call.quiet else "")
            arg = call.source if call.kind in (CallKind.START_SOURCE, CallKind.END_SOURCE) \
                else call.scn
            trace.append((name, arg, step.name,
                          call.checkpoint if call.kind is CallKind.CHECKPOINT else None))
            if step in (Step.ROLLBACK, Step.FATAL):
                return trace
            queue[0:0] = follow
    return trace


def snapshot_window(scn: int, keys: Sequence[int], cp: Checkpoint | None = None
                    ) -> list[Item]:
    return [StartOfWindow(scn), *(ev(100 + k, k) for k in keys), eow(scn, cp)]


def test_a_bootstrap_makes_its_callbacks_and_commits_only_response_checkpoints() -> None:
    d = Dispatcher(committed_scn=50)
    cp1, cp2, done = snap_cp(400, "02", since=50), catchup_cp(405, 400, 410), Checkpoint(410)
    items: list[Item] = [
        BootstrapMark(end=False),
        # One response: two snapshot batches, its checkpoint on the last one.
        *snapshot_window(400, [1]), *snapshot_window(400, [2], cp1),
        # The next: a catch-up window (whole transaction), then the done answer's.
        ev(405, 7), eow(405, cp2), eow(410, done),
        BootstrapMark(end=True),
        ev(411, 8), eow(411),
    ]
    trace = drive(d, items)
    a = ("START_SOURCE", "db.a"), ("DATA", None), ("END_SOURCE", "db.a")
    assert [(t[0], None if t[0] == "DATA" else t[1]) for t in trace] == [
        ("START_BOOTSTRAP", 50),
        ("START_WINDOW", 400), *a, ("END_WINDOW", 400),  # no checkpoint: response goes on
        ("START_WINDOW", 400), *a, ("END_WINDOW", 400), ("CHECKPOINT", 400),
        ("START_WINDOW", 405), *a, ("END_WINDOW", 405), ("CHECKPOINT", 405),
        ("CHECKPOINT(quiet)", 410),
        ("END_BOOTSTRAP", 410),
        ("START_WINDOW", 411), *a, ("END_WINDOW", 411), ("CHECKPOINT", 411),
    ]
    # Snapshot rows keep their own SCNs.
    assert [t[1] for t in trace if t[0] == "DATA"] == [101, 102, 405, 411]
    assert [t[3] for t in trace if t[0].startswith("CHECKPOINT")] == [
        cp1, cp2, done, Checkpoint(411)]
    assert d.committed == Checkpoint(411) and d.commits == 4 and not d.bootstrapping


def test_answers_wait_for_the_responses_last_window() -> None:
    d = Dispatcher(checkpoint_every=100)
    cp = snap_cp(400, "03")
    answers = {CallKind.DATA: R.CHECKPOINT}
    trace = drive(d, [BootstrapMark(end=False), *snapshot_window(400, [1]),
                      *snapshot_window(400, [2]), eow(400, cp)], answers)
    # Forced by a window in the middle, taken at the end; offered (not quiet), since
    # earlier windows of the response delivered events.
    assert trace[-1] == ("CHECKPOINT", 400, "COMMIT", cp)
    d2 = Dispatcher()
    trace = drive(d2, [BootstrapMark(end=False), *snapshot_window(400, [1]),
                       *snapshot_window(400, [2], cp)],
                  {CallKind.END_WINDOW: R.SKIP_CHECKPOINT})
    assert all(not t[0].startswith("CHECKPOINT") for t in trace)
    assert d2.committed is None


def test_bootstrap_marks_and_starts_inside_a_window_are_torn_input() -> None:
    for item in (BootstrapMark(end=False), BootstrapMark(end=True), StartOfWindow(3)):
        d = Dispatcher()
        d.feed(ev(2))
        with pytest.raises(ValueError):
            d.feed(item)
    d = Dispatcher()
    d.feed(StartOfWindow(9))
    d.feed(ev(3))
    d.feed(ev(7))  # a snapshot window's events keep their SCNs
    with pytest.raises(ValueError):
        d.feed(eow(8))


def test_rollback_mid_bootstrap_replays_from_the_bootstrap_checkpoint() -> None:
    d = Dispatcher(committed_scn=50)
    cp1 = snap_cp(400, "01", since=50)
    drive(d, [BootstrapMark(end=False), *snapshot_window(400, [1], cp1)])
    assert d.committed == cp1 and d.committed_scn == 400
    trace = drive(d, snapshot_window(400, [2, 3]), {CallKind.DATA: R.ERROR})
    assert trace[-1][2] == "ROLLBACK"
    assert d.rollback() == 400 and d.committed == cp1
    assert not d.bootstrapping and not d.in_window
    # The replay announces the bootstrap again and goes on from the checkpoint.
    cp2 = snap_cp(400, "03", since=50)
    trace = drive(d, [BootstrapMark(end=False), *snapshot_window(400, [2, 3], cp2)])
    assert trace[0][0] == "START_BOOTSTRAP" and trace[-1][3] == cp2


def test_a_stored_bootstrap_checkpoint_is_the_replay_point() -> None:
    cp = catchup_cp(420, 400, 450, index=1)
    d = Dispatcher(committed=cp)
    assert d.committed_scn == 420 and d.rollback() == 420 and d.committed == cp
    assert checkpoint_scn(snap_cp(400, since=50)) == 400
    assert checkpoint_scn(Checkpoint.flexible()) is None
    assert Dispatcher(committed_scn=7).committed == Checkpoint(7)


class _Scripted(Consumer):
    """Fails the first time it sees key 3; records what it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.failed = False

    def on_start_bootstrap(self) -> CallbackResult:
        self.calls.append(("start_bootstrap", None))
        return R.SUCCESS

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        self.calls.append(("data", event.key))
        if event.key == 3 and not self.failed:
            self.failed = True
            raise RuntimeError("consumer bug")
        return R.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        self.calls.append(("rollback", scn))
        return R.SUCCESS


class _Reports:
    """What a runner reports, and a wait for a kind of report."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.seen = threading.Condition()

    def report(self, outcome: Outcome) -> None:
        with self.seen:
            self.outcomes.append(outcome)
            self.seen.notify_all()

    def wait_for(self, kind: str) -> Outcome:
        with self.seen:
            assert self.seen.wait_for(
                lambda: any(o.kind == kind for o in self.outcomes), 5)
            return next(o for o in self.outcomes if o.kind == kind)


def _reports() -> tuple[list[Outcome], Callable[[Outcome], None], Callable[[str], Outcome]]:
    r = _Reports()
    return r.outcomes, r.report, r.wait_for


def test_runner_commits_bootstrap_checkpoints_and_rolls_back_to_them() -> None:
    outcomes, report, wait_for = _reports()
    consumer = _Scripted()
    d = Dispatcher(committed_scn=50)
    runner = Runner([consumer], d, report, callback_timeout=5)
    cp1 = snap_cp(400, "02", since=50)
    gen = runner.start()
    runner.submit([BootstrapMark(end=False), *snapshot_window(400, [1, 2], cp1),
                   *snapshot_window(400, [3, 4])], gen, 0)
    commit = wait_for("commit")
    assert commit.checkpoint == cp1 and commit.scn == 400
    assert wait_for("rollback").error is not None
    scn, replay_from = runner.rollback_dispatcher()
    assert (scn, replay_from) == (400, cp1)
    outcomes.clear()
    gen = runner.start(rollback_to=scn, announce_rollback=True)
    cp2 = snap_cp(400, "04", since=50)
    runner.submit([BootstrapMark(end=False), *snapshot_window(400, [3, 4], cp2)], gen, 0)
    assert wait_for("commit").checkpoint == cp2
    runner.stop()
    assert consumer.calls == [
        ("start_bootstrap", None), ("data", 1), ("data", 2), ("data", 3),
        ("rollback", 400), ("start_bootstrap", None), ("data", 3), ("data", 4),
    ]


# -- framing choice, errors, metrics -------------------------------------------------


def test_catchup_framing_only_within_one_sources_catchup() -> None:
    c = catchup_cp(405, 400, 410)
    assert _only_catchup(c, catchup_cp(408, 400, 410))
    assert not _only_catchup(c, snap_cp(410, index=1))  # next source's snapshot began
    assert not _only_catchup(c, catchup_cp(412, 410, 420, index=1))  # ... and ended
    assert not _only_catchup(c, Checkpoint(410))  # done: may have crossed sources
    assert not _only_catchup(Checkpoint(50), catchup_cp(60, 50, 90))  # delta or replay
    assert not _only_catchup(snap_cp(400), catchup_cp(400, 400, 410))


def test_bootstrap_errors() -> None:
    puller = BootstrapPuller(["http://b"], [], None)  # type: ignore[arg-type]
    too_old = puller.json_error(410, {"error": "bootstrap_too_old", "message": "gone",
                                      "log_floor_scn": 300})
    assert isinstance(too_old, BootstrapTooOld) and too_old.log_floor_scn == 300
    assert "Clear the consumer's state" in str(too_old) and "full snapshot" in str(too_old)
    # A source the store lacks is waited for (its log writer has not written it yet).
    missing = puller.json_error(404, {"error": "unknown_source", "message": "x"})
    assert isinstance(missing, UnknownSourceError) and missing.retriable
    other = puller.json_error(400, {"error": "filter_not_pushable", "message": "no SQL"})
    assert isinstance(other, BootstrapError) and not other.retriable
    assert "filter_not_pushable" in str(other) and "no SQL" in str(other)
    # A relay's 410 stays a fall-off, whatever it says.
    relay = RelayPuller(["http://r"], [], None)  # type: ignore[arg-type]
    assert isinstance(relay.json_error(410, {"error": "gone"}), ScnNotFoundError)


def test_metrics_show_the_bootstrap() -> None:
    m = ClientMetrics(bootstraps=2, bootstrapping=True, bootstrap_phase="catchup")
    text = m.prometheus_text("c")
    assert 'databus_client_bootstraps_total{client="c"} 2' in text
    assert 'databus_client_bootstrapping{client="c"} 1' in text
    assert 'databus_client_bootstrap_phase{client="c",phase="catchup"} 1' in text
    assert 'databus_client_bootstrap_phase{client="c",phase="snapshot"} 0' in text


# -- the whole client against a real relay and the real bootstrap service -------------
#
# Relay A holds the whole stream and feeds the bootstrap store (SQLite) up to BOOT_SCN;
# relay B, the consumers', serves the same deterministic stream up to LAST_SCN from a
# buffer too small to still hold its start. So a consumer with an old checkpoint falls
# off B, bootstraps up to BOOT_SCN, and goes back to B for the rest.

SOURCES = ["shop.a", "shop.b"]
BOOT_SCN = 300
LAST_SCN = 500


def synthetic(limit: int) -> str:
    query = {"rate": 0, "keys": 120, "event_bytes": 2000, "events_per_window": 2,
             "update_ratio": 0.6, "delete_ratio": 0.1, "seed": 3, "limit": limit,
             "source": ",".join(SOURCES)}
    return "synthetic://?" + "&".join(f"{k}={v}" for k, v in query.items())


@dataclass
class Pipeline:
    a: RunningRelay  # everything; feeds the bootstrap store
    b: RunningRelay  # the consumers' relay
    boot: str
    b_prev_scn: int


@asynccontextmanager
async def pipeline(tmp_path: Path, **bootstrap: Any) -> AsyncIterator[Pipeline]:
    async with running_relay(relay_config(tmp_path / "a", {"shop": synthetic(BOOT_SCN)},
                                          capacity_mb=16)) as a, \
            running_relay(relay_config(tmp_path / "b", {"shop": synthetic(LAST_SCN)},
                                       capacity_mb=1)) as b:
        await a.wait_for_scn("shop", BOOT_SCN)
        await b.wait_for_scn("shop", LAST_SCN)
        data: dict[str, Any] = {
            "storage": f"sqlite:///{tmp_path / 'bootstrap.db'}", "port": 0,
            "producer": {"relays": [a.url], "poll_wait_ms": 100, "max_bytes": 64 * 1024},
            "applier": {"batch_rows": 97, "poll_interval_ms": 20},
            "server": {"batch_rows": 40},
        }
        for key, value in bootstrap.items():
            data[key].update(value)
        config = from_mapping(BootstrapConfig, data)
        runner = web.AppRunner(build_app(config, open_configured_storage(config)))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        boot = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            for _ in range(1000):
                async with a.session.get(boot + "/v1/status") as resp:
                    if (await resp.json())["applied_scn"] == BOOT_SCN:
                        break
                await asyncio.sleep(0.02)
            else:
                raise TimeoutError("the bootstrap applier did not reach BOOT_SCN")
            prev = (await b.json("/v1/status"))["buffers"]["shop"]["prev_scn"]
            # The setup this file relies on: B has dropped the start, kept BOOT_SCN on.
            assert 100 < prev < BOOT_SCN, prev
            yield Pipeline(a, b, boot, prev)
        finally:
            await runner.cleanup()


class Replica(Consumer):
    """Keeps (source, key) -> seq of the live rows, and a trace of the callbacks."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, object], int] = {}
        self.trace: list[tuple[str, Any]] = []
        self.fail_at_bootstrap_event: int | None = None  # raise once, at this count
        self.stop_after_bootstrap_events: int | None = None
        self.client: DatabusClient | None = None
        self.errors: list[BaseException] = []
        self.upto: int | None = None  # ignore relay windows after this SCN
        self._ignore = False

    def on_start_data_event_sequence(self, scn: int) -> CallbackResult:
        self._ignore = self.upto is not None and scn > self.upto
        return R.SUCCESS

    def on_start_bootstrap(self) -> CallbackResult:
        self.trace.append(("start_bootstrap", None))
        return R.SUCCESS

    def on_end_bootstrap(self) -> CallbackResult:
        self.trace.append(("end_bootstrap", None))
        return R.SUCCESS

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        if self._ignore:
            return R.SUCCESS
        self.trace.append(("data", event.from_bootstrap))
        n = sum(1 for name, boot in self.trace if name == "data" and boot)
        if event.from_bootstrap and n == self.fail_at_bootstrap_event:
            self.fail_at_bootstrap_event = None
            raise RuntimeError("consumer bug")
        if event.from_bootstrap and n == self.stop_after_bootstrap_events:
            assert self.client is not None
            self.client.stop()
        assert event.value is not None
        if event.is_delete:
            self.rows.pop((event.source, event.key), None)
        else:
            self.rows[(event.source, event.key)] = event.value["seq"]
        return R.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        self.trace.append(("rollback", scn))
        return R.SUCCESS

    def on_error(self, error: BaseException) -> CallbackResult:
        self.errors.append(error)
        return R.SUCCESS


class RecordingStore(MemoryCheckpointStore):
    def __init__(self) -> None:
        super().__init__()
        self.history: list[Checkpoint] = []

    def store(self, checkpoint: Checkpoint) -> None:
        self.history.append(checkpoint)
        super().store(checkpoint)


async def consume(relays: list[str], replica: Replica, until_scn: int, **kw: Any
                  ) -> DatabusClient:
    """Run a client until it has committed ``until_scn`` (or stopped by itself)."""
    kw.setdefault("backoff_initial", 0.02)
    kw.setdefault("backoff_max", 0.2)
    client = DatabusClient(relays, sources=SOURCES, poll_wait_ms=100, **kw)
    replica.client = client
    client.register(replica)

    async def watch() -> None:
        m = client.metrics
        while not ((m.committed_scn or 0) >= until_scn and not m.bootstrapping):
            await asyncio.sleep(0.01)
            m = client.metrics
        client.stop()

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(client.run_async(), 60)
    finally:
        watcher.cancel()
    return client


async def source_state(p: Pipeline, upto: int, replica: Replica | None = None) -> Replica:
    """The oracle: the rows after window ``upto``, read from the relays alone."""
    replica = replica or Replica()
    replica.upto = upto
    store = MemoryCheckpointStore()
    await consume([p.a.url], replica, min(upto, BOOT_SCN), checkpoint_store=store)
    if upto > BOOT_SCN:
        store.store(Checkpoint(BOOT_SCN))
        await consume([p.b.url], replica, upto, checkpoint_store=store)
    replica.upto = None
    return replica


def test_no_checkpoint_starts_from_a_full_snapshot_then_the_relay(tmp_path: Path) -> None:
    async def main() -> None:
        async with pipeline(tmp_path) as p:
            expected = (await source_state(p, LAST_SCN)).rows
            replica, store = Replica(), RecordingStore()
            client = await consume([p.b.url], replica, LAST_SCN, bootstrap=[p.boot],
                                   checkpoint_store=store, max_request_bytes=16 * 1024)
            assert replica.rows == expected
            names = [name for name, _ in replica.trace]
            assert names[0] == "start_bootstrap" and names.count("end_bootstrap") == 1
            end = names.index("end_bootstrap")
            flags = [(i < end, boot) for i, (name, boot) in enumerate(replica.trace)
                     if name == "data"]
            assert all(before == boot for before, boot in flags)  # bootstrap, then relay
            assert sum(1 for before, _ in flags if not before) > 0
            # (The writer coalesces: not every committed checkpoint is stored.)
            modes = {cp.mode for cp in store.history}
            assert {Mode.BOOTSTRAP_SNAPSHOT, Mode.ONLINE} <= modes
            assert store.load() == Checkpoint(LAST_SCN)
            m = client.metrics
            assert m.bootstraps == 1 and not m.bootstrapping and m.rollbacks == 0

    asyncio.run(main())


@pytest.mark.parametrize("strategy", ["snapshot", "log"])
def test_falling_off_the_relay_bootstraps_and_a_rollback_resumes_it(
        tmp_path: Path, strategy: str) -> None:
    async def main() -> None:
        async with pipeline(tmp_path, server={"strategy": strategy}) as p:
            expected = (await source_state(p, LAST_SCN)).rows
            # A consumer whose state and checkpoint are at SCN 100, long evicted from B.
            replica = await source_state(p, 100)
            replica.trace.clear()
            store = RecordingStore()
            store.store(Checkpoint(100))
            replica.fail_at_bootstrap_event = 30  # past the first committed response
            client = await consume([p.b.url], replica, LAST_SCN, bootstrap=[p.boot],
                                   checkpoint_store=store, max_request_bytes=16 * 1024)
            assert replica.rows == expected
            assert client.metrics.rollbacks == 1 and client.metrics.bootstraps == 2
            names = [name for name, _ in replica.trace]
            rollback = names.index("rollback")
            assert names[0] == "start_bootstrap" and names[rollback + 1] == "start_bootstrap"
            # Rolled back to a bootstrap checkpoint, not to the online one at 100.
            assert replica.trace[rollback][1] > 100
            assert any(cp.mode is not Mode.ONLINE for cp in store.history)
            assert names.count("end_bootstrap") == 1
            assert store.load() == Checkpoint(LAST_SCN)

    asyncio.run(main())


def test_a_client_stopped_mid_bootstrap_resumes_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with pipeline(tmp_path) as p:
            expected = (await source_state(p, LAST_SCN)).rows
            replica, store = Replica(), RecordingStore()
            replica.stop_after_bootstrap_events = 50
            await consume([p.b.url], replica, LAST_SCN, bootstrap=[p.boot],
                          checkpoint_store=store, max_request_bytes=16 * 1024)
            stopped_at = store.load()
            assert stopped_at is not None and stopped_at.mode is not Mode.ONLINE
            first = len(replica.trace)
            replica.stop_after_bootstrap_events = None
            client = await consume([p.b.url], replica, LAST_SCN, bootstrap=[p.boot],
                                   checkpoint_store=store, max_request_bytes=16 * 1024)
            assert replica.rows == expected
            assert replica.trace[first] == ("start_bootstrap", None)
            assert client.metrics.bootstraps == 1 and store.load() == Checkpoint(LAST_SCN)

    asyncio.run(main())


def test_state_older_than_the_bootstrap_log_is_a_clear_fatal_error(tmp_path: Path) -> None:
    async def main() -> None:
        async with pipeline(tmp_path, producer={"start_scn": 150}) as p:
            replica, store = Replica(), MemoryCheckpointStore()
            store.store(Checkpoint(20))
            with pytest.raises(BootstrapTooOld, match="Clear the consumer's state") as info:
                await consume([p.b.url], replica, LAST_SCN, bootstrap=[p.boot],
                              checkpoint_store=store)
            assert info.value.scn == 20 and info.value.log_floor_scn == 150
            assert replica.errors == [info.value]
            assert store.load() == Checkpoint(20)

    asyncio.run(main())


def test_a_source_the_relay_lacks_is_an_error_before_any_bootstrap(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"shop": synthetic(10)})) as r:
            client = DatabusClient([r.url], sources=["shop.typo"],
                                   bootstrap=["http://127.0.0.1:9"])  # never asked
            client.register(Replica())
            with pytest.raises(UnknownSourceError, match=r"shop\.typo"):
                await asyncio.wait_for(client.run_async(), 30)

    asyncio.run(main())


class _ScriptedWindows(Consumer):
    """The batch API through a bootstrap: fails the first window holding key 3 once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.failed = False

    def on_start_bootstrap(self) -> CallbackResult:
        self.calls.append(("start_bootstrap", None))
        return R.SUCCESS

    def on_window(self, window: Window) -> CallbackResult:
        keys = [e.key for e in window.events]
        if 3 in keys and not self.failed:
            self.failed = True
            return R.ERROR
        assert window.from_bootstrap and all(e.from_bootstrap for e in window.events)
        self.calls.append(("window", (window.scn, keys)))
        return R.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        self.calls.append(("rollback", scn))
        return R.SUCCESS


def test_batch_api_commits_bootstrap_checkpoints_and_rolls_back_to_them() -> None:
    outcomes, report, wait_for = _reports()
    consumer = _ScriptedWindows()
    d = Dispatcher(committed_scn=50)
    runner = Runner([consumer], d, report, callback_timeout=5)
    assert runner.batch_mode
    cp1 = snap_cp(400, "02", since=50)
    gen = runner.start()
    # Only the window whose EOW carries the response's checkpoint may commit.
    runner.submit([BootstrapMark(end=False), *snapshot_window(400, [1, 2], cp1),
                   *snapshot_window(400, [3, 4])], gen, 0)
    commit = wait_for("commit")
    assert commit.checkpoint == cp1 and commit.scn == 400
    assert wait_for("rollback").error is not None
    scn, replay_from = runner.rollback_dispatcher()
    assert (scn, replay_from) == (400, cp1)
    outcomes.clear()
    gen = runner.start(rollback_to=scn, announce_rollback=True)
    cp2 = snap_cp(400, "04", since=50)
    runner.submit([BootstrapMark(end=False), *snapshot_window(400, [3, 4], cp2)], gen, 0)
    assert wait_for("commit").checkpoint == cp2
    runner.stop()
    assert consumer.calls == [
        ("start_bootstrap", None), ("window", (400, [1, 2])),
        ("rollback", 400), ("start_bootstrap", None), ("window", (400, [3, 4])),
    ]
