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
- A dump marker (``DumpMarker``, inside a window) makes ``on_dump_start`` /
  ``on_dump_end`` in stream order; like an event, it opens the window if it is the
  first item of it, and it leaves the current source run alone.
- The batch API hands whole windows over in one call each (``end_window``): the same
  end-of-window rules apply to that call's answer.
- Bootstrap (``BootstrapMark`` items, between windows only) makes ``on_start_bootstrap``
  and ``on_end_bootstrap``. A snapshot window is opened by ``StartOfWindow`` and its
  events keep their own SCNs. While bootstrapping, only a window whose EOW carries a
  checkpoint (the last of a response) can be committed, and that checkpoint is the one
  committed; CHECKPOINT / SKIP_CHECKPOINT answers wait for that window.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

from databus.checkpoint import Checkpoint, Mode
from databus.client._consumer import CallbackResult
from databus.client._events import DataEvent, DumpMarker, EndOfWindow, Item, StartOfWindow
from databus.schemas import Schema


class CallKind(Enum):
    # Hashed by identity (members are singletons): Enum's own __hash__ is Python code,
    # and the runner looks kinds up several times per window.
    __hash__ = object.__hash__

    START_WINDOW = auto()
    START_SOURCE = auto()
    DATA = auto()
    END_SOURCE = auto()
    END_WINDOW = auto()
    CHECKPOINT = auto()
    START_BOOTSTRAP = auto()
    END_BOOTSTRAP = auto()
    DUMP_START = auto()
    DUMP_END = auto()


def checkpoint_scn(checkpoint: Checkpoint) -> int | None:
    """The SCN a checkpoint stands for: the last whole window, or for a snapshot in
    progress the snapshot's SCN; None before anything."""
    if checkpoint.mode is Mode.BOOTSTRAP_SNAPSHOT:
        return checkpoint.bootstrap_start_scn
    return checkpoint.window_scn if checkpoint.window_scn >= 0 else None


@dataclass(slots=True)
class Call:
    """One callback to make: ``kind`` with its argument (an SCN, a source, an event).
    A CHECKPOINT call carries the checkpoint to commit; an END_WINDOW call the one its
    EOW carried, if any."""

    kind: CallKind
    scn: int
    source: str | None = None
    event: DataEvent | None = None
    schema: Schema | None = None
    # A checkpoint after a window that delivered nothing: committed without asking
    # the consumer (the runner answers SUCCESS for it without calling anyone).
    quiet: bool = False
    checkpoint: Checkpoint | None = None
    outcome: str | None = None  # DUMP_END: "done", "failed" or "cancelled"


class Step(Enum):
    CONTINUE = auto()
    COMMIT = auto()  # persist the call's checkpoint, then continue
    ROLLBACK = auto()  # roll back to ``committed_scn`` and replay from there
    FATAL = auto()


class Dispatcher:
    """The state machine. ``committed`` is the last committed checkpoint (the replay
    point) and ``committed_scn`` its SCN; ``done_scn`` is the last window completely and
    successfully delivered; ``None`` means "before anything" for all three. ``commits``
    counts commits, so the client can tell progress when SCNs stand still (a snapshot's
    windows all share one)."""

    def __init__(
        self,
        *,
        committed_scn: int | None = None,
        checkpoint_every: int = 1,
        committed: Checkpoint | None = None,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be >= 1")
        if committed is not None and committed_scn is None:
            committed_scn = checkpoint_scn(committed)
        elif committed is None and committed_scn is not None:
            committed = Checkpoint(committed_scn)
        self.checkpoint_every = checkpoint_every
        self.committed = committed
        self.committed_scn = committed_scn
        self.done_scn = committed_scn
        self.commits = 0
        self._window: int | None = None
        self._loose = False  # the open window's events keep SCNs of their own
        self._source: str | None = None
        self._force = False
        self._skip = False
        self._offer = False  # a bootstrap window delivered events since the last commit
        self._since_checkpoint = 0
        self._bootstrapping = False

    @property
    def in_window(self) -> bool:
        return self._window is not None

    @property
    def bootstrapping(self) -> bool:
        return self._bootstrapping

    def continues(self, event: DataEvent) -> bool:
        """True when ``event`` only continues the open window's current source run:
        ``feed`` would give just its DATA call, and a SUCCESS answer changes nothing
        (the runner's fast path calls the consumer without building calls)."""
        return event.scn == self._window and event.source == self._source

    def feed(self, item: Item) -> list[Call]:
        """The calls to make for one incoming item."""
        calls: list[Call] = []
        if isinstance(item, DataEvent):
            if self._window is None:
                self._window = item.scn
                calls.append(Call(CallKind.START_WINDOW, item.scn))
            elif item.scn != self._window and not self._loose:
                raise ValueError(f"event of window {item.scn} inside window {self._window}")
            if item.source != self._source:
                if self._source is not None:
                    calls.append(Call(CallKind.END_SOURCE, item.scn, self._source))
                self._source = item.source
                calls.append(Call(CallKind.START_SOURCE, item.scn, item.source,
                                  schema=item.schema))
            calls.append(Call(CallKind.DATA, item.scn, item.source, item))
            return calls
        if isinstance(item, DumpMarker):
            if self._window is None:
                self._window = item.scn
                calls.append(Call(CallKind.START_WINDOW, item.scn))
            elif item.scn != self._window and not self._loose:
                raise ValueError(f"marker of window {item.scn} inside window {self._window}")
            kind = CallKind.DUMP_START if item.start else CallKind.DUMP_END
            calls.append(Call(kind, item.scn, item.source, outcome=item.outcome))
            return calls
        if isinstance(item, EndOfWindow):
            if self._window is None:
                # Nothing of this window was delivered: no callbacks, but the position moves.
                self._finish_window(item.scn)
                return self._due_checkpoint(item.scn, item.checkpoint, offer=False)
            if item.scn != self._window:
                raise ValueError(f"end of window {item.scn} inside window {self._window}")
            if self._source is not None:
                calls.append(Call(CallKind.END_SOURCE, item.scn, self._source))
            calls.append(Call(CallKind.END_WINDOW, item.scn, checkpoint=item.checkpoint))
            return calls
        if self._window is not None:
            raise ValueError(f"{type(item).__name__} inside window {self._window}")
        if isinstance(item, StartOfWindow):
            self._window = item.scn
            self._loose = True
            return [Call(CallKind.START_WINDOW, item.scn)]
        scn = self.done_scn if self.done_scn is not None else -1
        if item.end:
            return [Call(CallKind.END_BOOTSTRAP, scn)]
        self._bootstrapping = True
        return [Call(CallKind.START_BOOTSTRAP, scn)]

    def result(self, call: Call, result: CallbackResult) -> tuple[Step, list[Call]]:
        """What to do after ``call`` answered ``result``: a step and follow-up calls."""
        if result is CallbackResult.ERROR_FATAL:
            return Step.FATAL, []
        if result is CallbackResult.ERROR:
            return Step.ROLLBACK, []
        kind = call.kind
        if kind is CallKind.CHECKPOINT:
            if result is CallbackResult.SKIP_CHECKPOINT:
                return Step.CONTINUE, []
            self._commit(call)
            return Step.COMMIT, []
        if kind is CallKind.START_BOOTSTRAP or kind is CallKind.END_BOOTSTRAP:
            if kind is CallKind.END_BOOTSTRAP:
                self._bootstrapping = self._offer = False
            return Step.CONTINUE, []  # no window to checkpoint: CHECKPOINT/SKIP mean nothing
        if result is CallbackResult.CHECKPOINT:
            self._force = True
        elif result is CallbackResult.SKIP_CHECKPOINT:
            self._skip = True
        if kind is CallKind.END_WINDOW:
            self._window = self._source = None
            self._loose = False
            self._finish_window(call.scn)
            return Step.CONTINUE, self._due_checkpoint(call.scn, call.checkpoint, offer=True)
        return Step.CONTINUE, []

    def end_window(self, eow: EndOfWindow, result: CallbackResult, *, delivered: bool = True
                   ) -> tuple[Step, list[Call]]:
        """The batch API (``Consumer.on_window`` / ``on_events``): window ``eow.scn`` was
        delivered whole in one call that answered ``result`` (``delivered`` False: the
        window held nothing for the consumer, as ``feed`` of a lone EOW). Same rules as
        the END_WINDOW of a window delivered call by call: a step, and the CHECKPOINT
        call when one is due."""
        if self._window is not None:
            raise ValueError(f"a whole window {eow.scn} inside window {self._window}")
        if result is CallbackResult.ERROR_FATAL:
            return Step.FATAL, []
        if result is CallbackResult.ERROR:
            return Step.ROLLBACK, []
        if result is CallbackResult.CHECKPOINT:
            self._force = True
        elif result is CallbackResult.SKIP_CHECKPOINT:
            self._skip = True
        self._finish_window(eow.scn)
        return Step.CONTINUE, self._due_checkpoint(eow.scn, eow.checkpoint, offer=delivered)

    @property
    def plain(self) -> bool:
        """True between windows when nothing pending bends the checkpoint rules (no
        CHECKPOINT / SKIP_CHECKPOINT answer waiting, not bootstrapping): a run of
        windows that all answer SUCCESS may then be ended at once (``end_windows``)."""
        return (self._window is None and not self._bootstrapping and not self._force
                and not self._skip and not self._offer)

    def end_windows(self, eows: list[EndOfWindow]) -> Call | None:
        """The batch API's common case in one step: the windows ``eows`` (in order) each
        answered SUCCESS, no consumer is offered checkpoints (none overrides
        ``on_checkpoint``), and ``plain`` holds. The same as ``end_window`` of each in
        turn with every due checkpoint committed, except that only the last due one is
        committed (the ones before it would be replaced at once): it is returned (or
        None when none was due)."""
        if not self.plain:
            raise ValueError("end_windows needs plain state")
        n = len(eows)
        if not n:
            return None
        every, since = self.checkpoint_every, self._since_checkpoint
        self.done_scn = eows[-1].scn
        first = 1 if since >= every else every - since  # 1-based index of the first due
        if n < first:
            self._since_checkpoint = since + n
            return None
        last = n if since >= every else first + ((n - first) // every) * every
        eow = eows[last - 1]
        call = Call(CallKind.CHECKPOINT, eow.scn, quiet=True,
                    checkpoint=eow.checkpoint if eow.checkpoint is not None
                    else Checkpoint(eow.scn))
        self._commit(call)
        self._since_checkpoint = n - last
        return call

    def rollback(self) -> int | None:
        """Forget the window in progress; replay starts after ``committed_scn`` (from
        ``committed``), and a replay into bootstrap announces it again."""
        self._window = self._source = None
        self._loose = self._force = self._skip = self._offer = False
        self._bootstrapping = False
        self._since_checkpoint = 0
        self.done_scn = self.committed_scn
        return self.committed_scn

    # -- internals ------------------------------------------------------------------

    def _finish_window(self, scn: int) -> None:
        self.done_scn = scn
        self._since_checkpoint += 1

    def _due_checkpoint(self, scn: int, checkpoint: Checkpoint | None, *, offer: bool
                        ) -> list[Call]:
        if checkpoint is None and self._bootstrapping:
            # Only a bootstrap response's last window knows its checkpoint: answers
            # and the consumer's work wait for that one.
            self._offer = self._offer or offer
            return []
        offer = offer or self._offer
        skip, force = self._skip, self._force
        self._skip = self._force = self._offer = False
        if skip or not (force or self._since_checkpoint >= self.checkpoint_every):
            return []
        return [Call(CallKind.CHECKPOINT, scn, quiet=not offer,
                     checkpoint=checkpoint if checkpoint is not None else Checkpoint(scn))]

    def _commit(self, call: Call) -> None:
        self.committed_scn = call.scn
        self.committed = call.checkpoint if call.checkpoint is not None else Checkpoint(call.scn)
        self.commits += 1
        self._since_checkpoint = 0
