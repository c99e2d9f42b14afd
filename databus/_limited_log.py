"""Rate-limited log lines: a condition that repeats per event, answer or connection
logs one line per interval with a count, not one line per repeat (DESIGN 17, "Logs").

    from databus._limited_log import limited

    log = logging.getLogger("databus.something")
    warn = limited(log).warning
    ...
    warn("buffer %s: upstream %s sent a bad body (%s)", name, url, reason, kind=name)

Lines are grouped by **kind**: the message's format string unless ``kind=`` says more
(a buffer or a URL, so that one noisy subject does not hide another's first line). For
each kind:

- the first line goes out at once;
- repeats within ``interval_s`` of the last line that went out are counted, not logged;
- the next repeat after that goes out with the count, and the interval starts again:
  ``... (repeated 1,234 times in the last 10 s)`` (the count includes that line);
- a kind that stopped repeating gets its last line with its count when any later call of
  the same limiter finds its interval over, or on ``flush()``: nothing is silently lost.

A logger's ``limited(...)`` is shared by every caller of that logger, safe from threads,
and remembers at most ``MAX_KINDS`` kinds (the oldest is flushed and forgotten).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_INTERVAL_S", "MAX_KINDS", "LimitedLog", "forget_all", "limited"]

# One line per kind per this many seconds at most.
DEFAULT_INTERVAL_S = 10.0
# Kinds remembered per logger (a kind per buffer or URL; never per event).
MAX_KINDS = 256


@dataclass
class _Kind:
    opened_at: float  # when the last line of this kind went out
    repeats: int = 0  # counted since then, not logged
    level: int = logging.WARNING
    msg: str = ""
    args: tuple[Any, ...] = ()


class LimitedLog:
    """``logger``'s lines, at most one per kind per ``interval_s`` (module docstring)."""

    def __init__(self, logger: logging.Logger, *, interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 max_kinds: int = MAX_KINDS) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._max_kinds = max_kinds
        self._kinds: collections.OrderedDict[Hashable, _Kind] = collections.OrderedDict()
        self._lock = threading.Lock()
        # The earliest end of an interval with repeats counted (the kinds are scanned
        # only then, not on every call of a flood).
        self._next_due = float("inf")
        self.suppressed = 0  # lines counted and not logged, in all (for tests and metrics)

    def warning(self, msg: str, *args: Any, kind: Hashable = None,
                exc_info: BaseException | None = None) -> bool:
        return self.log(logging.WARNING, msg, *args, kind=kind, exc_info=exc_info)

    def error(self, msg: str, *args: Any, kind: Hashable = None,
              exc_info: BaseException | None = None) -> bool:
        return self.log(logging.ERROR, msg, *args, kind=kind, exc_info=exc_info)

    def info(self, msg: str, *args: Any, kind: Hashable = None) -> bool:
        return self.log(logging.INFO, msg, *args, kind=kind)

    def log(self, level: int, msg: str, *args: Any, kind: Hashable = None,
            exc_info: BaseException | None = None) -> bool:
        """Log ``msg % args`` now, or count it; whether it went out."""
        if not self.logger.isEnabledFor(level):
            return False
        key: Hashable = (msg, kind)
        now = self._clock()
        out: list[tuple[int, str, tuple[Any, ...], BaseException | None]] = []
        with self._lock:
            out.extend(self._due(now, skip=key))
            seen = self._kinds.get(key)
            if seen is not None and now - seen.opened_at < self.interval_s:
                seen.repeats += 1
                seen.level, seen.msg, seen.args = level, msg, args
                self.suppressed += 1
                self._next_due = min(self._next_due, seen.opened_at + self.interval_s)
                logged = False
            else:
                if seen is not None and seen.repeats:
                    out.append((level, msg + self._count(seen.repeats + 1, now - seen.opened_at),
                                args, exc_info))
                else:
                    out.append((level, msg, args, exc_info))
                self._kinds[key] = _Kind(opened_at=now)
                self._kinds.move_to_end(key)
                while len(self._kinds) > self._max_kinds:
                    _, oldest = self._kinds.popitem(last=False)
                    out.extend(self._summary(oldest, now))
                logged = True
        for line_level, line, line_args, line_exc in out:
            self.logger.log(line_level, line, *line_args, exc_info=line_exc)
        return logged

    def flush(self) -> None:
        """Log the count of every kind with repeats not logged yet (at a stop)."""
        now = self._clock()
        with self._lock:
            out = [line for kind in self._kinds.values() for line in self._summary(kind, now)]
            self._next_due = float("inf")
        for level, line, args, exc in out:
            self.logger.log(level, line, *args, exc_info=exc)

    def _due(self, now: float, skip: Hashable
             ) -> list[tuple[int, str, tuple[Any, ...], BaseException | None]]:
        """Summaries of the kinds (other than ``skip``) whose interval is over with
        repeats counted: the last of them, with the count."""
        out: list[tuple[int, str, tuple[Any, ...], BaseException | None]] = []
        if now < self._next_due:
            return out
        self._next_due = float("inf")
        for key, kind in self._kinds.items():
            if not kind.repeats:
                continue
            if key != skip and now - kind.opened_at >= self.interval_s:
                out.extend(self._summary(kind, now))
            else:
                self._next_due = min(self._next_due, kind.opened_at + self.interval_s)
        return out

    def _summary(self, kind: _Kind, now: float
                 ) -> list[tuple[int, str, tuple[Any, ...], BaseException | None]]:
        if not kind.repeats:
            return []
        line = (kind.level, kind.msg + self._count(kind.repeats, now - kind.opened_at),
                kind.args, None)
        kind.repeats = 0
        kind.opened_at = now
        return [line]

    def _count(self, times: int, seconds: float) -> str:
        # %-escaped: the result is a format string (the caller's args follow).
        what = "once" if times == 1 else f"{times:,} times"
        return f" (repeated {what} in the last {seconds:.0f} s)".replace("%", "%%")


_LIMITERS: dict[str, LimitedLog] = {}
_LIMITERS_LOCK = threading.Lock()


def limited(logger: logging.Logger) -> LimitedLog:
    """The one ``LimitedLog`` of ``logger`` (shared by every module logging to it)."""
    with _LIMITERS_LOCK:
        found = _LIMITERS.get(logger.name)
        if found is None or found.logger is not logger:
            found = _LIMITERS[logger.name] = LimitedLog(logger)
        return found


def forget_all(*, flush: bool = True) -> None:
    """Forget every logger's kinds (their pending counts logged first, unless not
    ``flush``): for tests, which each expect the first line of a kind to go out."""
    with _LIMITERS_LOCK:
        limiters = list(_LIMITERS.values())
        _LIMITERS.clear()
    if flush:
        for limiter in limiters:
            limiter.flush()
