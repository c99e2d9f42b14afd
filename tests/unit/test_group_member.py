"""Consumer groups, the pure parts of a member's stream (issue 17): where a stream
over several partition checkpoints starts (``plan_start``), what each partition skips
(``skip_items``, ``Segment``), the runner's fence, and the arguments of a member."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from databus.checkpoint import Checkpoint, Mode
from databus.client import (
    CallbackResult,
    Consumer,
    DatabusClient,
    MemoryCheckpointStore,
    ZooKeeperCoordinator,
)
from databus.client._dispatcher import Dispatcher
from databus.client._events import DataEvent, EndOfWindow, Item
from databus.client._runner import Outcome, Runner
from databus.client.group._checkpoints import (
    GroupCheckpointStore,
    StartPlan,
    plan_start,
    skip_items,
)
from databus.client.group._member import Segment
from databus.errors import ConfigError, ConnectionLostError
from databus.event import Op
from databus.filters import FilterSpec

P = 4


def event(scn: int, pkey: int, *, bootstrap: bool = False) -> DataEvent:
    return DataEvent(scn, "s.t", Op.UPSERT, pkey, {"id": pkey}, 0, None, partition_key=pkey,
                     from_bootstrap=bootstrap)


def window(scn: int, *pkeys: int) -> list[Item]:
    return [*(event(scn, k) for k in pkeys), EndOfWindow(scn, 0, len(pkeys))]


# -- plan_start ------------------------------------------------------------------------


def test_the_stream_starts_at_the_earliest_partition_and_the_others_skip() -> None:
    plan = plan_start({0: Checkpoint(100), 1: Checkpoint(40), 2: Checkpoint(100),
                       3: Checkpoint(70)}, "earliest")
    assert plan.start == Checkpoint(40)
    assert plan.skip == {0: 100, 2: 100, 3: 70}


def test_equal_checkpoints_skip_nothing() -> None:
    plan = plan_start({0: Checkpoint(9), 1: Checkpoint(9)}, "earliest")
    assert plan == StartPlan(Checkpoint(9), {})


def test_no_checkpoint_at_all_starts_like_a_new_consumer() -> None:
    assert plan_start({0: None, 1: None}, "earliest") == StartPlan(None, {})
    assert plan_start({0: None, 1: None}, "latest") == StartPlan(None, {})


def test_a_new_partition_starts_at_the_earliest_when_start_from_is_earliest() -> None:
    plan = plan_start({0: Checkpoint(50), 1: None}, "earliest")
    assert plan.start is None  # the relay's earliest (or a bootstrap)
    assert plan.skip == {0: 50}


def test_a_new_partition_follows_the_others_when_start_from_is_latest() -> None:
    plan = plan_start({0: Checkpoint(50), 1: None}, "latest")
    assert plan == StartPlan(Checkpoint(50), {})


def test_partitions_in_a_bootstrap_resume_it_only_when_they_agree() -> None:
    mid = Checkpoint(-1, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=500,
                     bootstrap_source_index=0, bootstrap_last_key="04")
    other = Checkpoint(-1, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=500,
                       bootstrap_source_index=0, bootstrap_last_key="09")
    assert plan_start({0: mid, 1: mid, 2: Checkpoint(700)}, "earliest") == StartPlan(
        mid, {2: 700})
    assert plan_start({0: mid, 1: other}, "earliest") == StartPlan(None, {})


@given(st.dictionaries(st.integers(0, 7), st.integers(0, 10_000), min_size=1))
def test_the_start_is_never_after_any_partition(scns: dict[int, int]) -> None:
    plan = plan_start({p: Checkpoint(s) for p, s in scns.items()}, "earliest")
    assert plan.start is not None
    low = plan.start.window_scn
    assert low == min(scns.values())
    # Each partition gets every window after its own checkpoint, and none before.
    for p, scn in scns.items():
        assert plan.skip.get(p, low) == scn


# -- skipping --------------------------------------------------------------------------


def test_skip_items_drops_only_windows_a_partition_already_has() -> None:
    items = window(50, 0, 1, 2) + window(60, 1, 5)  # pkey 5 is partition 1
    kept = skip_items(items, {1: 50}, P)
    assert [(i.scn, i.partition_key) for i in kept if isinstance(i, DataEvent)] == [
        (50, 0), (50, 2), (60, 1), (60, 5)]
    assert [i.scn for i in kept if isinstance(i, EndOfWindow)] == [50, 60]


def test_bootstrap_rows_are_never_skipped() -> None:
    items: list[Item] = [event(50, 1, bootstrap=True)]
    assert skip_items(items, {1: 99}, P) == items


def test_negative_partition_keys_use_the_relays_bucket() -> None:
    assert skip_items([event(10, -5)], {1: 10}, P) == []  # abs(-5) % 4 == 1


def test_a_segment_drops_its_skip_table_once_past_it() -> None:
    segment = Segment((0, 1), P, FilterSpec(), store=None,  # type: ignore[arg-type]
                      fence=lambda: True, skip={1: 60}, over=threading.Event())
    assert len(segment.skip_items(window(50, 1, 2))) == 2  # event of p2 + EOW
    assert segment.skip == {1: 60}
    segment.skip_items(window(60, 1))
    assert segment.skip == {}


# -- the runner's fence ----------------------------------------------------------------


class _Recorder(Consumer):
    def __init__(self) -> None:
        self.events: list[int] = []

    def on_data_event(self, e: DataEvent) -> CallbackResult:
        self.events.append(e.partition_key)
        return CallbackResult.SUCCESS


def _run(items: list[Item], fence_after: int) -> tuple[list[int], list[Outcome]]:
    """Run ``items``; the fence fails after ``fence_after`` checks."""
    outcomes: list[Outcome] = []
    done = threading.Event()
    checks = 0

    def fence() -> bool:
        nonlocal checks
        checks += 1
        return checks <= fence_after

    def report(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if outcome.kind in ("fenced", "batch_done"):
            done.set()

    consumer = _Recorder()
    runner = Runner([consumer], Dispatcher(), report, callback_timeout=5, fence=fence)
    gen = runner.start()
    runner.submit(items, gen, 0)
    assert done.wait(5)
    runner.stop()
    return consumer.events, outcomes


def test_a_valid_fence_lets_every_window_through() -> None:
    events, outcomes = _run(window(1, 1, 2, 3) + window(2, 4), fence_after=10**6)
    assert events == [1, 2, 3, 4]
    assert [o.scn for o in outcomes if o.kind == "commit"] == [1, 2]


def test_a_lease_that_runs_out_mid_window_stops_before_the_next_event() -> None:
    events, outcomes = _run(window(1, 1, 2, 3, 4), fence_after=2)
    assert len(events) < 4
    assert any(o.kind == "fenced" for o in outcomes)
    assert not any(o.kind == "commit" for o in outcomes)


def test_a_lease_that_runs_out_before_a_window_starts_delivers_nothing() -> None:
    events, outcomes = _run(window(1, 1), fence_after=0)
    assert events == []
    assert [o.kind for o in outcomes if o.kind != "batch_done"] == ["fenced"]


# -- arguments -------------------------------------------------------------------------


def _member(**kwargs: object) -> DatabusClient:
    args: dict[str, object] = dict(sources=["s.t"], group="g", partitions=8,
                                   coordinator=ZooKeeperCoordinator("127.0.0.1:2181"))
    args.update(kwargs)
    return DatabusClient(["http://127.0.0.1:1"], **args)  # type: ignore[arg-type]


def test_a_member_is_accepted_with_group_coordinator_and_partitions() -> None:
    client = _member()
    assert (client.group, client.partitions) == ("g", 8)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"coordinator": None}, "together"),
    ({"partitions": None}, "together"),
    ({"group": None}, "together"),
    ({"partitions": 0}, "partitions must be in"),
    ({"partitions": True}, "integer"),
    ({"group": "a/b"}, "group name"),
    ({"sources": []}, "sources"),
    ({"filter": {"s.t": {"type": "mod", "n": 2, "buckets": [0]}}}, "filter"),
    ({"checkpoint_store": MemoryCheckpointStore()}, "one checkpoint per partition"),
    ({"client_id": "x/y"}, "'/'"),
    ({"coordinator": "127.0.0.1:2181"}, "ZooKeeperCoordinator"),
])
def test_bad_member_arguments_are_clear_errors(kwargs: dict[str, object], message: str
                                               ) -> None:
    with pytest.raises(ConfigError, match=message):
        _member(**kwargs)


@pytest.mark.parametrize("timeout", [0, -1, 601, "10", True])
def test_the_coordinators_session_timeout_is_checked(timeout: object) -> None:
    with pytest.raises(ConfigError, match="session_timeout"):
        ZooKeeperCoordinator("127.0.0.1:2181", session_timeout=timeout)  # type: ignore[arg-type]


def test_the_coordinator_accepts_a_zookeeper_uri() -> None:
    assert ZooKeeperCoordinator("zookeeper://h:1,h:2/chroot").hosts == "h:1,h:2/chroot"
    with pytest.raises(ConfigError):
        ZooKeeperCoordinator("  ")


# -- what a stream that ends must announce: GroupCheckpointStore.replay_from -----------


class _Backend:
    """Partition checkpoints that are written, or cannot be (ZooKeeper unreachable)."""

    where = "a fake backend"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.written: list[tuple[tuple[int, ...], int | None]] = []

    def load(self, partitions: list[int]) -> dict[int, Checkpoint | None]:
        return dict.fromkeys(partitions)

    def write(self, partitions: list[int], checkpoint: Checkpoint) -> None:
        if self.fail:
            raise ConnectionLostError("ZooKeeper unreachable")
        self.written.append((tuple(partitions), checkpoint.window_scn))


def test_a_checkpoint_the_store_could_not_write_is_where_windows_come_again() -> None:
    """The CI failure of test_quorum_lost_during_a_rebalance: windows committed while
    ZooKeeper could not take their checkpoints came again in the next stream with no
    on_rollback before them. replay_from says from where they come again."""
    ended: list[int] = []
    backend = _Backend()
    store = GroupCheckpointStore(backend, [1, 2], StartPlan(Checkpoint(100), {}),
                                 lambda: False, lambda: ended.append(1))
    assert store.replay_from() is None
    store.store(Checkpoint(120))
    assert store.replay_from() is None and backend.written == [((1, 2), 120)]
    backend.fail = True
    store.store(Checkpoint(130))
    assert store.replay_from() == 120 and ended == [1]  # and the stream was ended
    backend.fail = False
    store.store(Checkpoint(140))
    assert store.replay_from() is None


def test_a_fenced_store_writes_nothing_and_replays_from_the_start() -> None:
    backend = _Backend()
    store = GroupCheckpointStore(backend, [1], StartPlan(Checkpoint(100), {}),
                                 lambda: True, lambda: None)
    store.store(Checkpoint(150))
    assert backend.written == [] and store.replay_from() == 100
    fresh = GroupCheckpointStore(_Backend(fail=True), [1], StartPlan(None, {}),
                                 lambda: False, lambda: None)
    fresh.store(Checkpoint(5))
    assert fresh.replay_from() == -1


def test_a_window_every_partition_already_has_needs_no_write() -> None:
    backend = _Backend(fail=True)
    store = GroupCheckpointStore(backend, [1, 2], StartPlan(Checkpoint(90), {1: 100, 2: 110}),
                                 lambda: False, lambda: None)
    store.store(Checkpoint(95))  # both partitions are past it: nothing to write
    assert store.replay_from() is None
