"""Checkpoint value object and the serving rules of DESIGN section 3."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from databus.checkpoint import (
    FLEXIBLE_SCN,
    LATEST_SCN,
    Checkpoint,
    Mode,
    NothingNew,
    ServeFrom,
    decide,
)
from databus.errors import CheckpointError, ScnNotFoundError

scns = st.integers(0, (1 << 63) - 1)


@st.composite
def checkpoints(draw: st.DrawFn) -> Checkpoint:
    mode = draw(st.sampled_from(list(Mode)))
    if mode is Mode.ONLINE:
        scn = draw(st.one_of(scns, st.sampled_from([FLEXIBLE_SCN, LATEST_SCN])))
        offset = draw(st.integers(-1, 10_000)) if scn >= 0 else -1
        return Checkpoint(scn, offset)
    start = draw(scns)
    target = draw(st.one_of(st.none(), st.integers(start, (1 << 63) - 1)))
    if mode is Mode.BOOTSTRAP_CATCHUP and target is None:
        target = start
    return Checkpoint(
        draw(scns), draw(st.integers(-1, 100)), mode,
        bootstrap_start_scn=start, bootstrap_target_scn=target,
        bootstrap_source_index=draw(st.integers(0, 20)),
        bootstrap_last_key=draw(st.one_of(st.none(), st.text(max_size=20))),
    )


@given(checkpoints())
def test_json_round_trip(cp: Checkpoint) -> None:
    assert Checkpoint.loads(cp.dumps()) == cp
    assert Checkpoint.from_json(cp.to_json()) == cp


def test_defaults_mode_and_offset() -> None:
    cp = Checkpoint.loads('{"window_scn": 5}')
    assert cp == Checkpoint(5, -1, Mode.ONLINE)
    assert cp.to_json() == {"mode": "online", "window_scn": 5, "window_offset": -1}


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        '"online"',
        "{}",
        '{"window_scn": "12"}',
        '{"window_scn": 1.5}',
        '{"window_scn": true}',
        '{"window_scn": -3}',
        '{"window_scn": 5, "window_offset": -2}',
        '{"window_scn": -1, "window_offset": 0}',
        '{"window_scn": 5, "mode": "sideways"}',
        '{"window_scn": 5, "windw_offset": 1}',
        '{"window_scn": 5, "bootstrap_start_scn": 1}',
        '{"window_scn": 5, "mode": "bootstrap_snapshot"}',
        '{"window_scn": 5, "mode": "bootstrap_catchup", "bootstrap_start_scn": 1,'
        ' "bootstrap_source_index": 0}',
        '{"window_scn": 5, "mode": "bootstrap_catchup", "bootstrap_start_scn": 10,'
        ' "bootstrap_source_index": 0, "bootstrap_target_scn": 9}',
        '{"window_scn": 5, "mode": "bootstrap_snapshot", "bootstrap_start_scn": 1,'
        ' "bootstrap_source_index": -1}',
        b'\xff\xfe',
        # Issue 12: beyond int64, nested, huge, duplicated, non-JSON constants.
        '{"window_scn": 18446744073709551616}',
        '{"window_scn": 9223372036854775808}',
        '{"window_scn": 1000000000000000000000000000000}',
        '{"window_scn": 5, "window_offset": 18446744073709551616}',
        '{"window_scn": -1, "mode": "bootstrap_snapshot",'
        ' "bootstrap_start_scn": 18446744073709551616, "bootstrap_source_index": 0}',
        '{"window_scn": 5, "mode": "bootstrap_catchup", "bootstrap_start_scn": 1,'
        ' "bootstrap_source_index": 0, "bootstrap_target_scn": 18446744073709551616}',
        '{"window_scn": 5, "mode": "bootstrap_snapshot", "bootstrap_start_scn": 1,'
        ' "bootstrap_source_index": 0, "bootstrap_since_scn": 9223372036854775808}',
        '{"window_scn": 5, "mode": "bootstrap_snapshot", "bootstrap_start_scn": 1,'
        ' "bootstrap_source_index": 1180591620717411303424}',
        "[" * 1500,
        '{"a":' * 1000 + "1" + "}" * 1000,
        '{"window_scn": ' + "9" * 5000 + "}",
        '{"window_scn": 1, "window_scn": 2}',
        '{"window_scn": NaN}',
        '{"window_scn": Infinity}',
        '{"window_scn": 1, "mode": {"x": [1]}}',
        "x" * 70_000,
    ],
)
def test_malformed_or_impossible_checkpoints(text: str | bytes) -> None:
    with pytest.raises(CheckpointError):
        Checkpoint.loads(text)


def test_the_int64_edges_are_valid() -> None:
    top = (1 << 63) - 1
    cp = Checkpoint.loads(f'{{"window_scn": {top}, "window_offset": {top}}}')
    assert (cp.window_scn, cp.window_offset) == (top, top)
    catchup = Checkpoint(top, mode=Mode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=top,
                         bootstrap_target_scn=top, bootstrap_source_index=top,
                         bootstrap_since_scn=top)
    assert Checkpoint.loads(catchup.dumps()) == catchup


def test_a_message_never_repeats_a_huge_value() -> None:
    with pytest.raises(CheckpointError) as info:
        Checkpoint.loads('{"window_scn": ' + "7" * 4000 + "}")
    assert "7" * 50 not in info.value.message


# Buffer holding windows 10, 20, 30 after evicting up to 5.
BUF = dict(prev_scn=5, min_scn=10, max_scn=30)


def test_at_max_is_nothing_new() -> None:
    assert decide(Checkpoint(30), **BUF) == NothingNew(30)


def test_ahead_of_relay_waits() -> None:
    assert decide(Checkpoint(99), **BUF) == NothingNew(99)


@pytest.mark.parametrize("since", [5, 10, 15, 20, 29])
def test_serves_from_next_window(since: int) -> None:
    assert decide(Checkpoint(since), **BUF) == ServeFrom(since)


def test_below_prev_is_scn_not_found_with_min() -> None:
    with pytest.raises(ScnNotFoundError) as info:
        decide(Checkpoint(4), **BUF)
    assert info.value.min_scn == 10
    assert info.value.to_json()["error"] == "scn_not_found"


def test_partial_window_held() -> None:
    assert decide(Checkpoint(20, 3), **BUF) == ServeFrom(19, 20, 3)


def test_partial_window_evicted() -> None:
    with pytest.raises(ScnNotFoundError):
        decide(Checkpoint(5, 0), **BUF)


def test_partial_window_not_yet_arrived_waits_for_it() -> None:
    assert decide(Checkpoint(40, 2), **BUF) == ServeFrom(39, 40, 2)


def test_empty_buffer_is_not_an_error() -> None:
    empty = dict(prev_scn=100, min_scn=None, max_scn=None)
    assert decide(Checkpoint(100), **empty) == NothingNew(100)
    assert decide(Checkpoint.flexible(), **empty) == NothingNew(100)
    assert decide(Checkpoint.latest(), **empty) == NothingNew(100)
    with pytest.raises(ScnNotFoundError) as info:
        decide(Checkpoint(99), **empty)
    assert info.value.min_scn == 100


def test_flexible_serves_everything_held() -> None:
    assert decide(Checkpoint.flexible(), **BUF) == ServeFrom(5)


def test_latest_serves_only_after_max() -> None:
    assert decide(Checkpoint.latest(), **BUF) == NothingNew(30)


def test_inconsistent_buffer_state_is_a_bug() -> None:
    with pytest.raises(ValueError):
        decide(Checkpoint(1), prev_scn=10, min_scn=5, max_scn=30)
    with pytest.raises(ValueError):
        decide(Checkpoint(1), prev_scn=1, min_scn=5, max_scn=None)


@given(
    prev=st.integers(0, 1000), gaps=st.lists(st.integers(1, 50), max_size=10),
    since=st.integers(-2, 2000), offset=st.integers(-1, 5),
)
def test_rules_agree_with_a_window_list(
    prev: int, gaps: list[int], since: int, offset: int
) -> None:
    """The decision, applied to an explicit list of windows, serves exactly what the
    rules in DESIGN section 3 say."""
    windows, scn = [], prev
    for g in gaps:
        scn += g
        windows.append(scn)
    if since < 0:
        offset = -1
    cp = Checkpoint(since, offset)
    state = dict(prev_scn=prev, min_scn=windows[0] if windows else None,
                 max_scn=windows[-1] if windows else None)
    evicted = since >= 0 and (since <= prev if offset >= 0 else since < prev)
    if evicted:
        with pytest.raises(ScnNotFoundError):
            decide(cp, **state)
        return
    d = decide(cp, **state)
    served = [w for w in windows if w > d.after_scn] if isinstance(d, ServeFrom) else []
    if since == LATEST_SCN:
        assert served == []
    elif since == FLEXIBLE_SCN:
        assert served == windows
    elif offset >= 0:
        assert served == [w for w in windows if w >= since]
        assert isinstance(d, ServeFrom) and d.partial_scn == since and d.skip_events == offset
    else:
        assert served == [w for w in windows if w > since]
