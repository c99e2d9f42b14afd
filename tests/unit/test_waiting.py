"""tests/waiting.py, the suite's one waiting helper: answers, backoff, failure messages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.waiting import async_wait_until, wait_until


def test_returns_the_first_truthy_answer() -> None:
    answers: Iterator[object] = iter([None, 0, [], "ready"])
    assert wait_until(lambda: next(answers), "ready", 5, interval=0.001) == "ready"


def test_the_pause_doubles_up_to_max_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr("tests.waiting.time.sleep", pauses.append)
    calls = iter(range(7))
    wait_until(lambda: next(calls) == 6, "seven calls", 5, interval=0.01, max_interval=0.04)
    assert pauses == [0.01, 0.02, 0.04, 0.04, 0.04, 0.04]


def test_the_last_check_is_at_the_deadline() -> None:
    calls: list[float] = []
    started = time.monotonic()
    with pytest.raises(AssertionError):
        wait_until(lambda: calls.append(time.monotonic()), "never", 0.3, interval=0.2)
    assert calls[-1] - started >= 0.3
    assert len(calls) >= 2  # at once, (after 0.2 s,) at the deadline


def test_a_timeout_names_what_was_awaited_the_last_answer_and_the_diagnosis() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError) as info:
        wait_until(lambda: [], "the fetcher running", 0.2,
                   diagnose=lambda: "status: starting")
    # At its own 0.2 s deadline, not the 30 s default (nor never): slack for a busy machine.
    assert 0.2 <= time.monotonic() - started < 10
    assert str(info.value) == ("timed out after 0.2 s waiting for the fetcher running; "
                               "last answer: []\nstatus: starting")


def test_ignored_exceptions_are_not_yet_and_named_at_the_timeout() -> None:
    answers = iter([ConnectionRefusedError("refused"), None])

    def check() -> int | None:
        answer = next(answers, 7)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_until(check, "a server", 5, interval=0.001, ignore=(OSError,)) == 7

    def refused() -> bool:
        raise ConnectionRefusedError("refused")

    with pytest.raises(AssertionError, match="raised ConnectionRefusedError: refused") as info:
        wait_until(refused, "a server", 0.05, ignore=(OSError,))
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_other_exceptions_propagate_at_once() -> None:
    def broken() -> bool:
        raise KeyError("state")

    with pytest.raises(KeyError):
        wait_until(broken, "a state", 30, ignore=(OSError,))


def test_a_failing_diagnosis_does_not_hide_the_timeout() -> None:
    def diagnose() -> str:
        raise OSError("no log")

    with pytest.raises(AssertionError, match=r"(?s)waiting for x.*diagnose raised OSError"):
        wait_until(lambda: False, "x", 0.05, diagnose=diagnose)


def test_a_coroutine_check_is_refused_by_the_sync_helper() -> None:
    async def check() -> bool:
        return True

    with pytest.raises(TypeError, match="async_wait_until"):
        _ = wait_until(check, "a coroutine", 1)


def test_async_with_a_plain_and_an_async_check() -> None:
    async def main() -> None:
        answers = iter([False, False, True])
        assert await async_wait_until(lambda: next(answers), "plain", 5, interval=0.001)
        count = 0

        async def check() -> int:
            nonlocal count
            count += 1
            if count == 1:
                raise ConnectionResetError("reset")
            return count if count >= 3 else 0

        assert await async_wait_until(check, "awaited", 5, interval=0.001,
                                      ignore=(OSError,)) == 3
        with pytest.raises(AssertionError, match="waiting for never; last answer: 0"):
            await async_wait_until(lambda: 0, "never", 0.05)

    asyncio.run(main())
