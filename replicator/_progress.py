"""The progress of a copy through the bootstrap service: the lines ``databus replicate``
prints on stderr while its client bootstraps, and the numbers ``/v1/status`` and
``/metrics`` show (docs/replicator.md, "Progress of the initial copy").

Pure: a ``CopyView`` is one reading of the copy (``ReplicationStats.copy_view`` takes
it), the functions below format it, and ``ProgressPrinter`` decides what to write and
when; the clock, the stream and whether it is a terminal are handed in by the shell
(``_cli.py``).

What is counted: rows the target committed during the copy (per table, the changes of
each applied batch), not rows received: a row waiting in a batch is not copied yet. The
estimate is the bootstrap service's count of live rows in its snapshot when the copy
began (its ``/v1/status`` ``snapshot_rows``), known only for a copy that starts from an
empty position (a full snapshot from its first row): a resumed copy has copied an
unknown share already, and a delta since an SCN is some part of the table.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from databus.checkpoint import Checkpoint, Mode

__all__ = [
    "CopyView",
    "ProgressPrinter",
    "Start",
    "final_line",
    "format_duration",
    "progress_line",
    "start_kind",
    "status_fields",
]

# How a copy began: from no position ("empty", a full snapshot), from a position in the
# middle of a full snapshot ("resumed", after a restart), or from an SCN ("delta": the
# replicator fell off the relay, or resumed such a catch-up).
Start = Literal["empty", "resumed", "delta"]


def start_kind(checkpoint: Checkpoint | None) -> Start:
    """How a bootstrap from ``checkpoint`` (what the client resumes from) begins."""
    if checkpoint is None:
        return "empty"
    if checkpoint.mode is Mode.ONLINE:
        # -1 (flexible) or -2 (latest): the client has no state, a full snapshot.
        return "empty" if checkpoint.window_scn < 0 else "delta"
    # A bootstrap checkpoint carries the SCN its delta started from; a full snapshot
    # has none (docs/bootstrap.md, "The conversation").
    return "resumed" if checkpoint.bootstrap_since_scn is None else "delta"


@dataclass(frozen=True)
class CopyView:
    """One reading of the copy. ``copy`` numbers the copies of this process (0: none
    yet); ``rows`` and ``estimated`` have every replicated source, in config order."""

    copy: int = 0
    state: Literal["running", "done"] | None = None
    start: Start | None = None
    rows: Mapping[str, int] | None = None
    estimated: Mapping[str, int | None] | None = None
    elapsed_s: float = 0.0

    @property
    def tables(self) -> Mapping[str, int]:
        return self.rows or {}

    def estimate(self, source: str) -> int | None:
        return (self.estimated or {}).get(source)

    @property
    def total_rows(self) -> int:
        return sum(self.tables.values())

    @property
    def total_estimated(self) -> int | None:
        """The sum of the estimates, None unless every table has one."""
        ests = [self.estimate(s) for s in self.tables]
        if not ests or any(e is None for e in ests):
            return None
        return sum(e for e in ests if e is not None)

    @property
    def rows_per_second(self) -> float | None:
        """Rows copied per second since the copy began (an average: a copy's rate is
        steady enough, and an average does not jump with each batch)."""
        if self.state is None or self.elapsed_s <= 0:
            return None
        return self.total_rows / self.elapsed_s

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the average rate, while running with every estimate known."""
        total, rate = self.total_estimated, self.rows_per_second
        if self.state != "running" or total is None or not rate:
            return None
        return max(0, total - self.total_rows) / rate


def format_duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def _percent(rows: int, estimate: int) -> str:
    # Floor, so that 100% means every estimated row is there; a copy may exceed its
    # estimate (rows added meanwhile, the catch-up's changes).
    if estimate <= 0:
        return "100%"
    return f"{min(100, rows * 100 // estimate)}%"


def _rows(n: int) -> str:
    return "1 row" if n == 1 else f"{n:,} rows"


def _count(rows: int, estimate: int | None) -> str:
    if estimate is None:
        return _rows(rows)
    return f"{rows:,} of ~{_rows(estimate)} ({_percent(rows, estimate)})"


def _label(view: CopyView) -> str:
    if view.start == "delta":
        return "bootstrap catch-up"
    if view.start == "resumed":
        return "initial copy (resumed)"
    return "initial copy"


def _rate(view: CopyView) -> str | None:
    rate = view.rows_per_second
    return None if rate is None else f"{rate:,.0f} rows/s"


def progress_line(view: CopyView) -> str:
    """``initial copy: shop.orders 1,200 of ~4,000 rows (30%); 950 rows/s; 1 s
    elapsed, ETA 3 s`` (one line, no newline)."""
    parts = [f"{source} {_count(rows, view.estimate(source))}"
             for source, rows in view.tables.items()]
    text = f"{_label(view)}: " + ", ".join(parts)
    if len(parts) > 1:
        text += f"; total {_count(view.total_rows, view.total_estimated)}"
    rate = _rate(view)
    if rate is not None:
        text += f"; {rate}"
    text += f"; {format_duration(view.elapsed_s)} elapsed"
    eta = view.eta_s
    if eta is not None:
        text += f", ETA {format_duration(eta)}"
    return text


def final_line(view: CopyView, *, stopped: bool = False) -> str:
    """``initial copy done in 4 s: shop.orders 4,000 rows; 1,000 rows/s``; with
    ``stopped``, the line of a copy the process left unfinished."""
    how = "stopped after" if stopped else "done in"
    # A stopped copy says how far it got against its estimate; a finished one its rows.
    parts = [f"{source} " + (_count(rows, view.estimate(source)) if stopped
                             else _rows(rows))
             for source, rows in view.tables.items()]
    text = f"{_label(view)} {how} {format_duration(view.elapsed_s)}: " + ", ".join(parts)
    rate = _rate(view)
    if rate is not None:
        text += f"; {rate}"
    return text


def status_fields(view: CopyView) -> dict[str, Any]:
    """``/v1/status``'s ``initial_copy``: ``state`` null until a copy begins in this
    process."""
    rate, eta = view.rows_per_second, view.eta_s
    return {
        "state": view.state,
        "start": view.start,
        "elapsed_s": round(view.elapsed_s, 1) if view.state is not None else None,
        "rows": view.total_rows,
        "estimated_rows": view.total_estimated,
        "rows_per_second": None if rate is None else round(rate, 1),
        "eta_s": None if eta is None else round(eta, 1),
        "tables": {source: {"rows": rows, "estimated_rows": view.estimate(source)}
                   for source, rows in view.tables.items()},
    }


class ProgressPrinter:
    """Writes a copy's progress: on a terminal one line redrawn in place (``\\r``) at
    every ``update``; elsewhere (a log file, CI) a plain line at most every
    ``interval_s`` seconds of a running copy. Either way a final line when the copy
    ends, and one when the process stops in the middle of a copy (``finish``).

    ``write`` gets the text to write as is (the shell flushes it). Thread-safe: a log
    line from another thread may ``clear`` the terminal line first.
    """

    def __init__(self, write: Callable[[str], object], *, tty: bool, interval_s: float = 5.0,
                 width: int | None = None) -> None:
        self._write = write
        self.tty = tty
        self.interval_s = interval_s
        # A redrawn line longer than the terminal wraps, and \r then redraws only its
        # last part: cut to the width.
        self.width = width
        self._lock = threading.Lock()
        self._copy = 0
        self._finished = 0
        self._last_line: float | None = None
        self._drawn = 0

    def update(self, view: CopyView, now: float) -> None:
        with self._lock:
            if view.copy == 0 or view.state is None:
                return
            if view.copy != self._copy:
                self._copy = view.copy
                # A plain line only once the copy ran ``interval_s``: a short copy
                # writes just its final line.
                self._last_line = now
            if view.state == "done":
                if self._finished != view.copy:
                    self._end(final_line(view))
                    self._finished = view.copy
                return
            if self.tty:
                self._draw(progress_line(view))
            elif self._last_line is None or now - self._last_line >= self.interval_s:
                self._write(progress_line(view) + "\n")
                self._last_line = now

    def finish(self, view: CopyView | None) -> None:
        """The process stops: a copy still running gets its "stopped" line, a copy that
        ended since the last ``update`` its final line."""
        with self._lock:
            if view is None or view.copy == 0 or view.state is None:
                return
            if self._finished == view.copy:
                return
            self._end(final_line(view, stopped=view.state == "running"))
            self._finished = view.copy

    def clear(self) -> None:
        """Erase the terminal line (another line is about to be written to the same
        stream); the next ``update`` draws it again."""
        with self._lock:
            if self.tty and self._drawn:
                self._write("\r" + " " * self._drawn + "\r")
                self._drawn = 0

    def _draw(self, text: str) -> None:
        if self.width is not None and self.width > 1:
            text = text[: self.width - 1]
        pad = " " * max(0, self._drawn - len(text))
        self._write("\r" + text + pad)
        self._drawn = len(text)

    def _end(self, text: str) -> None:
        if self.tty:
            self._draw(text)
            self._write("\n")
            self._drawn = 0
        else:
            self._write(text + "\n")
