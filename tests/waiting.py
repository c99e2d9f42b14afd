"""The one waiting helper of the test suite.

A test that waits for something to become true (a status field, a log line, a row, a server
answering) calls :func:`wait_until`, or :func:`async_wait_until` in a coroutine. It polls the
condition with exponential backoff until a deadline and then fails with a message naming what
was awaited, the condition's last answer (or the last exception it raised) and whatever
``diagnose`` adds (a log tail, a status document)::

    top = wait_until(lambda: relay.status()["max_scn"], "the relay's first window", 20,
                     ignore=(OSError,), diagnose=relay.log_tail)

Don't write another polling loop: a helper that knows more about what it waits for (that a
process must stay alive, which log to show) is a thin wrapper that calls this one with
``ignore=`` and ``diagnose=``. A fixed sleep is for when time passing is the point (a
process kept paused, proof that nothing more happens, a rate), not for waiting on a
condition.

Nothing here imports pytest: the fixtures use it too.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

__all__ = ["async_wait_until", "wait_until"]

T = TypeVar("T")

# How much of the condition's last answer a failure message shows.
_REPR_CHARS = 2000


class _Poll:
    """Deadline, backoff and the last answer: what the sync and async loops share."""

    def __init__(self, what: str, timeout: float, interval: float, max_interval: float,
                 ignore: tuple[type[BaseException], ...],
                 diagnose: Callable[[], str] | None) -> None:
        if interval <= 0 or max_interval < interval:
            raise ValueError(f"need 0 < interval <= max_interval, got {interval}, "
                             f"{max_interval}")
        self.what = what
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.delay = interval
        self.max_interval = max_interval
        self.ignore = ignore
        self.diagnose = diagnose
        self.answered = False
        self.last: object = None
        self.error: BaseException | None = None  # the last exception counted as not yet
        self.failed_last = False  # whether the latest check raised (``error``)

    def answer(self, value: object) -> None:
        self.answered, self.last, self.failed_last = True, value, False

    def raised(self, exc: BaseException) -> None:
        self.error, self.failed_last = exc, True

    def next_delay(self) -> float:
        """How long to sleep before the next check; once the deadline has passed, the
        failure is raised (the last exception counted as not yet chained as its cause).

        The last sleep ends at the deadline, so there is one check at the deadline."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self.failure() from self.error
        delay = min(self.delay, remaining)
        self.delay = min(self.delay * 2, self.max_interval)
        return delay

    def failure(self) -> AssertionError:
        message = f"timed out after {self.timeout:g} s waiting for {self.what}"
        if self.failed_last:
            message += f"; the last check raised {_describe(self.error)}"
        elif self.answered:
            message += f"; last answer: {_short(repr(self.last))}"
            if self.error is not None:
                message += f" (an earlier check raised {_describe(self.error)})"
        if self.diagnose is not None:
            try:
                message += "\n" + self.diagnose()
            except Exception as exc:  # a diagnosis must not hide the timeout
                message += f"\n(diagnose raised {_describe(exc)})"
        return AssertionError(message)


def _describe(exc: BaseException | None) -> str:
    return f"{type(exc).__name__}: {_short(str(exc))}"


def _short(text: str) -> str:
    return text if len(text) <= _REPR_CHARS else text[:_REPR_CHARS] + "..."


def wait_until(check: Callable[[], T], what: str, timeout: float = 30.0, *,
               interval: float = 0.02, max_interval: float = 0.5,
               ignore: tuple[type[BaseException], ...] = (),
               diagnose: Callable[[], str] | None = None) -> T:
    """``check()``'s first truthy answer, polled until ``timeout`` seconds have passed.

    The first check is at once, then after ``interval`` seconds, the pause doubling up to
    ``max_interval``; the last check is at the deadline. An exception of a type in
    ``ignore`` (say ``OSError`` while a server starts) counts as "not yet"; any other
    exception propagates at once. At the deadline raises ``AssertionError("timed out after
    {timeout} s waiting for {what}")`` with ``check``'s last answer or the last exception it
    raised (chained as the cause), then ``diagnose()``'s text on a line of its own.

    ``check`` must not be a coroutine function: use :func:`async_wait_until`.
    """
    poll = _Poll(what, timeout, interval, max_interval, ignore, diagnose)
    while True:
        try:
            value = check()
        except ignore as exc:
            poll.raised(exc)
        else:
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()  # no "never awaited" warning on top of this error
                raise TypeError(f"the check for {what} returned an awaitable: "
                                "use async_wait_until")
            if value:
                return value
            poll.answer(value)
        time.sleep(poll.next_delay())


@overload
async def async_wait_until(check: Callable[[], Awaitable[T]], what: str,
                           timeout: float = 30.0, *, interval: float = 0.02,
                           max_interval: float = 0.5,
                           ignore: tuple[type[BaseException], ...] = (),
                           diagnose: Callable[[], str] | None = None) -> T: ...


@overload
async def async_wait_until(check: Callable[[], T], what: str, timeout: float = 30.0, *,
                           interval: float = 0.02, max_interval: float = 0.5,
                           ignore: tuple[type[BaseException], ...] = (),
                           diagnose: Callable[[], str] | None = None) -> T: ...


async def async_wait_until(check: Callable[[], Awaitable[T] | T], what: str,
                           timeout: float = 30.0, *, interval: float = 0.02,
                           max_interval: float = 0.5,
                           ignore: tuple[type[BaseException], ...] = (),
                           diagnose: Callable[[], str] | None = None) -> T:
    """:func:`wait_until` in a coroutine: the same semantics, sleeping with
    :func:`asyncio.sleep`. ``check`` is a plain callable or one returning an awaitable
    (an ``async def`` function); an exception of a type in ``ignore`` raised while
    awaiting it counts as "not yet" too."""
    poll = _Poll(what, timeout, interval, max_interval, ignore, diagnose)
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except ignore as exc:
            poll.raised(exc)
        else:
            if value:
                return value
            poll.answer(value)
        await asyncio.sleep(poll.next_delay())
