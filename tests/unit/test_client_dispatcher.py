"""The dispatcher state machine, without threads or I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from databus.client import CallbackResult
from databus.client._dispatcher import Call, CallKind, Dispatcher, Step
from databus.client._events import DataEvent, EndOfWindow
from databus.event import Op

R = CallbackResult


def ev(scn: int, source: str = "db.a", key: int = 1) -> DataEvent:
    return DataEvent(scn, source, Op.UPSERT, key, {"k": key}, 0, None)


def eow(scn: int) -> EndOfWindow:
    return EndOfWindow(scn, 0, 0)


def drive(d: Dispatcher, items: list[DataEvent | EndOfWindow],
          answers: dict[CallKind, R] | None = None) -> list[tuple[str, int | str | None, str]]:
    """Feed items, answer every call (SUCCESS unless ``answers`` says otherwise), and
    return a trace of (call kind, argument, step)."""
    trace = []
    for item in items:
        queue = d.feed(item)
        while queue:
            call = queue.pop(0)
            answer = (answers or {}).get(call.kind, R.SUCCESS)
            step, follow = d.result(call, answer)
            arg = call.source if call.kind in (CallKind.START_SOURCE, CallKind.END_SOURCE) \
                else call.scn
            trace.append((call.kind.name + ("(quiet)" if call.quiet else ""), arg, step.name))
            if step in (Step.ROLLBACK, Step.FATAL):
                return trace
            queue[0:0] = follow
    return trace


def test_window_with_two_sources_makes_the_paper_callback_sequence() -> None:
    d = Dispatcher()
    trace = drive(d, [ev(5, "db.a", 1), ev(5, "db.a", 2), ev(5, "db.b", 3), eow(5)])
    assert trace == [
        ("START_WINDOW", 5, "CONTINUE"),
        ("START_SOURCE", "db.a", "CONTINUE"),
        ("DATA", 5, "CONTINUE"),
        ("DATA", 5, "CONTINUE"),
        ("END_SOURCE", "db.a", "CONTINUE"),
        ("START_SOURCE", "db.b", "CONTINUE"),
        ("DATA", 5, "CONTINUE"),
        ("END_SOURCE", "db.b", "CONTINUE"),
        ("END_WINDOW", 5, "CONTINUE"),
        ("CHECKPOINT", 5, "COMMIT"),
    ]
    assert d.committed_scn == 5 and d.done_scn == 5 and not d.in_window


def test_source_runs_restart_in_each_window() -> None:
    d = Dispatcher()
    trace = drive(d, [ev(1), eow(1), ev(2), eow(2)])
    assert [t[0] for t in trace].count("START_SOURCE") == 2


def test_checkpoint_every_n_windows() -> None:
    d = Dispatcher(checkpoint_every=3)
    trace = drive(d, [x for scn in range(1, 8) for x in (ev(scn), eow(scn))])
    assert [t[1] for t in trace if t[0] == "CHECKPOINT"] == [3, 6]
    assert d.committed_scn == 6 and d.done_scn == 7


def test_checkpoint_result_forces_and_skip_vetoes() -> None:
    d = Dispatcher(checkpoint_every=100)
    trace = drive(d, [ev(1), eow(1)], {CallKind.DATA: R.CHECKPOINT})
    assert trace[-1] == ("CHECKPOINT", 1, "COMMIT")
    trace = drive(d, [ev(2), eow(2)], {CallKind.END_WINDOW: R.SKIP_CHECKPOINT})
    assert all(t[0] != "CHECKPOINT" for t in trace)
    d2 = Dispatcher()
    trace = drive(d2, [ev(3), eow(3)], {CallKind.CHECKPOINT: R.SKIP_CHECKPOINT})
    assert trace[-1] == ("CHECKPOINT", 3, "CONTINUE") and d2.committed_scn is None


def test_empty_window_commits_quietly() -> None:
    d = Dispatcher()
    trace = drive(d, [eow(4)])
    assert trace == [("CHECKPOINT(quiet)", 4, "COMMIT")]
    assert d.committed_scn == 4


@pytest.mark.parametrize("kind", [CallKind.START_WINDOW, CallKind.START_SOURCE, CallKind.DATA,
                                  CallKind.END_SOURCE, CallKind.END_WINDOW, CallKind.CHECKPOINT])
def test_error_anywhere_rolls_back_to_the_last_commit(kind: CallKind) -> None:
    d = Dispatcher(committed_scn=10)
    drive(d, [ev(11), eow(11)])
    assert d.committed_scn == 11
    trace = drive(d, [ev(12), ev(12, key=2), eow(12)], {kind: R.ERROR})
    assert trace[-1][2] == "ROLLBACK"
    assert d.rollback() == 11
    assert d.done_scn == 11 and not d.in_window
    # The replay goes through from the start of window 12.
    trace = drive(d, [ev(12), ev(12, key=2), eow(12)])
    assert trace[0] == ("START_WINDOW", 12, "CONTINUE")
    assert d.committed_scn == 12


def test_fatal_stops() -> None:
    d = Dispatcher()
    trace = drive(d, [ev(1), eow(1)], {CallKind.DATA: R.ERROR_FATAL})
    assert trace[-1] == ("DATA", 1, "FATAL")


def test_window_spanning_several_batches() -> None:
    d = Dispatcher()
    first = drive(d, [ev(7), ev(7, key=2)])
    assert d.in_window and first[-1][0] == "DATA"
    rest = drive(d, [ev(7, key=3), eow(7)])
    assert [t[0] for t in rest] == ["DATA", "END_SOURCE", "END_WINDOW", "CHECKPOINT"]


def test_torn_input_is_a_bug_not_a_silent_merge() -> None:
    d = Dispatcher()
    d.feed(ev(1))
    with pytest.raises(ValueError):
        d.feed(ev(2))
    with pytest.raises(ValueError):
        d.feed(eow(2))


def test_call_is_plain_data() -> None:
    assert Call(CallKind.DATA, 1).quiet is False


# -- the batch API's steps (issue 30) -------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(every=st.integers(1, 6), before=st.integers(0, 12), run=st.integers(0, 30))
def test_end_windows_equals_ending_each_window_and_committing_every_due_one(
        every: int, before: int, run: int) -> None:
    one, bulk = Dispatcher(checkpoint_every=every), Dispatcher(checkpoint_every=every)
    for d in (one, bulk):  # some windows first, so runs start anywhere in the period
        for scn in range(1, before + 1):
            for call in d.end_window(EndOfWindow(scn, 0, 1), CallbackResult.SUCCESS)[1]:
                d.result(call, CallbackResult.SUCCESS)
    eows = [EndOfWindow(scn, 0, 1) for scn in range(before + 1, before + run + 1)]
    last_due = None
    for eow in eows:
        step, calls = one.end_window(eow, CallbackResult.SUCCESS)
        assert step is Step.CONTINUE
        for call in calls:
            assert one.result(call, CallbackResult.SUCCESS)[0] is Step.COMMIT
            last_due = call.scn
    call = bulk.end_windows(eows)
    assert (call.scn if call is not None else None) == last_due
    assert (bulk.committed, bulk.committed_scn, bulk.done_scn) == (
        one.committed, one.committed_scn, one.done_scn)
    # The next window behaves alike (the count since the last commit carried over).
    nxt = EndOfWindow(before + run + 1, 0, 1)
    assert [c.scn for c in one.end_window(nxt, CallbackResult.SUCCESS)[1]] == \
        [c.scn for c in bulk.end_window(nxt, CallbackResult.SUCCESS)[1]]


def test_end_windows_refuses_state_that_bends_the_rules() -> None:
    d = Dispatcher()
    d.feed(DataEvent(1, "db.t", Op.UPSERT, 1, None, 0, None))  # a window is open
    assert not d.plain
    with pytest.raises(ValueError):
        d.end_windows([EndOfWindow(2, 0, 1)])
    with pytest.raises(ValueError):
        d.end_window(EndOfWindow(2, 0, 1), CallbackResult.SUCCESS)
