"""The dispatcher: a pure state machine from a stream of events to consumer callbacks.

It never calls anything itself. ``feed(item)`` turns an incoming data event or
end-of-window into the callbacks to make, in order; ``result(call, result)`` takes what
the consumer answered and says what happens next. The runner (``_runner.py``) does the
calling, the timing and the I/O, so every rule here is tested without threads.

States: IDLE (between windows) and IN_WINDOW (a window's events are being delivered;
it may span several relay responses). Rules:

- The first event of a window opens it (``on_start_data_event_sequence``); a change of
  logical source inside a window closes the previous run (``on_end_source``) and opens
  the next (``on_start_source``); EOW closes the source run and the window.
- A window that delivered no event (filtered out, or only other sources) makes no
  callback but still advances the checkpoint.
- After a window ends successfully a checkpoint is due every ``checkpoint_every``
  windows, or at once if any callback of the window answered CHECKPOINT; any
  SKIP_CHECKPOINT in the window skips it. A due checkpoint is offered to the consumer
  (``on_checkpoint``), which may veto it with SKIP_CHECKPOINT, then committed.
- ERROR (or an exception, or a blown time budget) from any callback: ROLLBACK to the
  last committed checkpoint; ERROR_FATAL: FATAL.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

from databus.client._consumer import CallbackResult
from databus.client._events import DataEvent, EndOfWindow
from databus.schemas import Schema


class CallKind(Enum):
    START_WINDOW = auto()
    START_SOURCE = auto()
    DATA = auto()
    END_SOURCE = auto()
    END_WINDOW = auto()
    CHECKPOINT = auto()


@dataclass(slots=True)
class Call:
    """One callback to make: ``kind`` with its argument (an SCN, a source, an event)."""

    kind: CallKind
    scn: int
    source: str | None = None
    event: DataEvent | None = None
    schema: Schema | None = None
    # A checkpoint after a window that delivered nothing: committed without asking
    # the consumer (the runner answers SUCCESS for it without calling anyone).
    quiet: bool = False


class Step(Enum):
    CONTINUE = auto()
    COMMIT = auto()  # persist a checkpoint at the SCN of the call, then continue
    ROLLBACK = auto()  # roll back to ``committed_scn`` and replay from there
    FATAL = auto()


class Dispatcher:
    """The state machine. ``committed_scn`` is the SCN of the last committed checkpoint
    (the replay point); ``done_scn`` the last window completely and successfully
    delivered; ``None`` means "before anything" for both."""

    def __init__(self, *, committed_scn: int | None = None, checkpoint_every: int = 1) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be >= 1")
        self.checkpoint_every = checkpoint_every
        self.committed_scn = committed_scn
        self.done_scn = committed_scn
        self._window: int | None = None
        self._source: str | None = None
        self._force = False
        self._skip = False
        self._since_checkpoint = 0

    @property
    def in_window(self) -> bool:
        return self._window is not None

    def feed(self, item: DataEvent | EndOfWindow) -> list[Call]:
        """The calls to make for one incoming item."""
        calls: list[Call] = []
        if isinstance(item, DataEvent):
            if self._window is None:
                self._window = item.scn
                self._force = self._skip = False
                calls.append(Call(CallKind.START_WINDOW, item.scn))
            elif item.scn != self._window:
                raise ValueError(f"event of window {item.scn} inside window {self._window}")
            if item.source != self._source:
                if self._source is not None:
                    calls.append(Call(CallKind.END_SOURCE, item.scn, self._source))
                self._source = item.source
                calls.append(Call(CallKind.START_SOURCE, item.scn, item.source,
                                  schema=item.schema))
            calls.append(Call(CallKind.DATA, item.scn, item.source, item))
            return calls
        # End of window.
        if self._window is None:
            # Nothing of this window was delivered: no callbacks, but the position moves.
            self._finish_window(item.scn)
            return self._due_checkpoint(item.scn, offer=False)
        if item.scn != self._window:
            raise ValueError(f"end of window {item.scn} inside window {self._window}")
        if self._source is not None:
            calls.append(Call(CallKind.END_SOURCE, item.scn, self._source))
        calls.append(Call(CallKind.END_WINDOW, item.scn))
        return calls

    def result(self, call: Call, result: CallbackResult) -> tuple[Step, list[Call]]:
        """What to do after ``call`` answered ``result``: a step and follow-up calls."""
        if result is CallbackResult.ERROR_FATAL:
            return Step.FATAL, []
        if result is CallbackResult.ERROR:
            return Step.ROLLBACK, []
        if call.kind is CallKind.CHECKPOINT:
            if result is CallbackResult.SKIP_CHECKPOINT:
                return Step.CONTINUE, []
            self._commit(call.scn)
            return Step.COMMIT, []
        if result is CallbackResult.CHECKPOINT:
            self._force = True
        elif result is CallbackResult.SKIP_CHECKPOINT:
            self._skip = True
        if call.kind is CallKind.END_WINDOW:
            self._window = self._source = None
            self._finish_window(call.scn)
            return Step.CONTINUE, self._due_checkpoint(call.scn, offer=True)
        return Step.CONTINUE, []

    def rollback(self) -> int | None:
        """Forget the window in progress; replay starts after ``committed_scn``."""
        self._window = self._source = None
        self._force = self._skip = False
        self._since_checkpoint = 0
        self.done_scn = self.committed_scn
        return self.committed_scn

    # -- internals ------------------------------------------------------------------

    def _finish_window(self, scn: int) -> None:
        self.done_scn = scn
        self._since_checkpoint += 1

    def _due_checkpoint(self, scn: int, *, offer: bool) -> list[Call]:
        skip, force = self._skip, self._force
        self._skip = self._force = False
        if skip or not (force or self._since_checkpoint >= self.checkpoint_every):
            return []
        return [Call(CallKind.CHECKPOINT, scn, quiet=not offer)]

    def _commit(self, scn: int) -> None:
        self.committed_scn = scn
        self._since_checkpoint = 0
