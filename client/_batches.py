"""The batch API's delivery: whole windows in one call each (``Consumer.on_window``), or
the events of a response's whole windows in one call (``Consumer.on_events``).

The runner (``_runner.py``) uses it when every registered consumer overrides a batch
callback; a consumer of the paper's callbacks registered beside one turns the client back
to per-event delivery, and the batch consumer is then served through ``WindowAdapter``.

Per window the cost is one Python call and a ``Window`` object, whatever the number of
events; the dispatcher's end-of-window rules (``Dispatcher.end_window``) give the
checkpoint, and a checkpoint is *committed* in memory per window (so a rollback replays
from the last window that succeeded) but *reported* to the checkpoint writer once per
batch: the store sees the newest committed window of each response.

One ``BatchDelivery`` per runner generation: a generation abandoned by the watchdog
keeps its own state, so nothing it does after its callback returns reaches the next.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from databus.client._consumer import CallbackResult, Consumer
from databus.client._dispatcher import Call, Step
from databus.client._events import (
    DataEvent,
    DumpMarker,
    EndOfWindow,
    Item,
    StartOfWindow,
    Window,
)
from databus.client._runner import Outcome

if TYPE_CHECKING:
    from databus.client._runner import Runner


def is_batch_consumer(consumer: Consumer) -> bool:
    """True when ``consumer`` overrides ``on_window`` or ``on_events``."""
    kind = type(consumer)
    return (kind.on_window is not Consumer.on_window
            or kind.on_events is not Consumer.on_events
            or isinstance(consumer, WindowCollector))


class BatchDelivery:
    """Delivers items to batch consumers for one runner generation."""

    def __init__(self, runner: Runner, gen: int) -> None:
        self.runner = runner
        self.gen = gen
        consumers = runner.consumers
        kinds = [type(c) for c in consumers]
        # Whole windows one by one; the rest take lists (on_events, and the internal
        # ``on_windows`` of ``DatabusClient.windows``).
        self.per_window = any(k.on_window is not Consumer.on_window for k in kinds)
        self.per_batch = any(k.on_window is Consumer.on_window for k in kinds)
        self.collectors = [c for c in consumers if isinstance(c, WindowCollector)]
        # No consumer is offered checkpoints: a run of windows answering SUCCESS ends
        # in one step (``Dispatcher.end_windows``).
        self.quiet_commits = all(k.on_checkpoint is Consumer.on_checkpoint for k in kinds)
        self.window: Window | None = None  # open: its EOW has not come yet
        # Whole windows not delivered yet: (its EOW, the window, or None when it held
        # nothing for the consumer).
        self.pending: list[tuple[EndOfWindow, Window | None]] = []
        self.windows = 0  # windows finished since the last report
        self.last_scn: int | None = None
        self.commit: Call | None = None  # the newest commit not reported yet

    def dispatch(self, items: list[Item], gen: int) -> bool:
        """Deliver ``items``; False when this generation must stop (the report said why)."""
        runner = self.runner
        stopping = runner._stopping
        pending = self.pending
        item: Any  # the hot loop tells kinds apart by ``type(...) is`` (no isinstance)
        for item in items:
            kind = type(item)
            if kind is DataEvent:
                window = self.window
                if window is None:
                    if stopping.is_set():  # never begin another window
                        self._flush(gen)  # the whole windows before it end as usual
                        return self._done(False)
                    window = self.window = Window(item.scn, item.timestamp_ns, [], [],
                                                  item.from_bootstrap)
                window.events.append(item)
            elif kind is Window:  # whole, from the decoder's fast path; its EOW follows
                self.window = item
            elif kind is EndOfWindow:
                window, self.window = self.window, None
                if window is not None and item.timestamp_ns:
                    window.timestamp_ns = item.timestamp_ns
                pending.append((item, window))
            elif kind is DumpMarker:
                if self.window is None:
                    self.window = Window(item.scn, 0)
                self.window.markers.append(item)
            elif kind is StartOfWindow:
                self.window = Window(item.scn, 0, [], [], True)
            else:  # BootstrapMark: between windows, after every window before it
                if not self._flush(gen):
                    return self._done(False)
                pending = self.pending  # the flush started a new list
                for call in runner.dispatcher.feed(item):
                    if not runner._run(call, gen):
                        return self._done(False)
        return self._done(self._flush(gen))

    # -- internals --------------------------------------------------------------------

    def _flush(self, gen: int) -> bool:
        """Deliver the pending whole windows, then end them in order."""
        pending, self.pending = self.pending, []
        if not pending:
            return True
        runner = self.runner
        success, error = CallbackResult.SUCCESS, CallbackResult.ERROR
        results = [success] * len(pending)
        fenced = False
        if self.per_window:
            fence = runner._fence
            if fence is None:
                delivered = [(i, w) for i, (_, w) in enumerate(pending) if w is not None]
                answers = runner._invoke_each("on_window", [w for _, w in delivered], gen)
                if answers is None:
                    return False  # abandoned by the watchdog
                for (index, _), answer in zip(delivered, answers, strict=False):
                    results[index] = answer
                if answers and answers[-1] >= error:  # answers stop at the first error
                    del pending[delivered[len(answers) - 1][0] + 1:]  # replayed later
            else:
                for index, (_eow, window) in enumerate(pending):
                    if window is None:
                        continue
                    if not fence():
                        del pending[index:]  # nothing more is delivered or ended
                        fenced = True
                        break
                    said = runner._invoke_all("on_window", (window,), gen)
                    if said is None:
                        return False  # abandoned by the watchdog
                    results[index] = said
                    if said >= error:
                        del pending[index + 1:]  # replayed after the rollback
                        break
        batch_result = success
        windows = [w for _, w in pending if w is not None]
        taken = len(windows)
        if self.per_batch and windows:
            events = [e for w in windows for e in w.events]
            if events:
                said_all = runner._invoke_all("on_events", (events,), gen)
                if said_all is None:
                    return False
                batch_result = said_all
            for collector in self.collectors:
                # ``DatabusClient.windows``: the windows its loop bodies have finished
                # (fewer when the loop was left): only those may be committed.
                taken = min(taken, collector.on_windows(windows))
        if (batch_result is success and taken == len(windows) and self.quiet_commits
                and runner.dispatcher.plain and all(r is success for r in results)):
            # The common case: every window answered SUCCESS; they end in one step.
            return self._end_run([eow for eow, _ in pending], gen)
        seen = 0
        run: list[EndOfWindow] = []
        for index, (eow, window) in enumerate(pending):
            if window is not None:
                seen += 1
                if seen > taken:
                    return self._end_run(run, gen) and False  # not finished: no commit
            result = max(batch_result, results[index])
            if result is success and self.quiet_commits and runner.dispatcher.plain:
                run.append(eow)
                continue
            if not self._end_run(run, gen):
                return False
            run = []
            if not self._end(eow, result, window is not None, gen):
                return False
        if not self._end_run(run, gen):
            return False
        if fenced:
            runner._report(_outcome("fenced", pending[-1][0].scn if pending else -1, gen))
            return False
        return True

    def _end_run(self, run: list[EndOfWindow], gen: int) -> bool:
        """End a run of windows that all answered SUCCESS, in one step."""
        if not run:
            return True
        runner = self.runner
        with runner._lock:
            if gen != runner.generation:
                return False
            call = runner.dispatcher.end_windows(run)
        self.windows += len(run)
        self.last_scn = run[-1].scn
        if call is not None:
            self.commit = call
        return True

    def _end(self, eow: EndOfWindow, result: CallbackResult, delivered: bool, gen: int
             ) -> bool:
        runner = self.runner
        dispatcher = runner.dispatcher
        with runner._lock:
            if gen != runner.generation:
                return False
            step, follow = dispatcher.end_window(eow, result, delivered=delivered)
        if step is not Step.CONTINUE:
            self._report()  # what committed before it reaches the store first
            kind = "rollback" if step is Step.ROLLBACK else "fatal"
            runner._report(_outcome(kind, eow.scn, gen, runner.last_error))
            return False
        self.windows += 1
        self.last_scn = eow.scn
        for call in follow:  # the due CHECKPOINT, offered to the consumers unless quiet
            answer = CallbackResult.SUCCESS if call.quiet else runner._invoke(call, gen)
            if answer is None:
                return False
            with runner._lock:
                if gen != runner.generation:
                    return False
                step, _ = dispatcher.result(call, answer)
            if step is Step.COMMIT:
                self.commit = call
            elif step is not Step.CONTINUE:
                self._report()
                kind = "rollback" if step is Step.ROLLBACK else "fatal"
                runner._report(_outcome(kind, call.scn, gen, runner.last_error))
                return False
        return True

    def _done(self, ok: bool) -> bool:
        self._report()
        return ok

    def _report(self) -> None:
        """Windows and the newest commit since the last report, in one report each."""
        runner = self.runner
        if self.windows:
            runner._report(Outcome("window", scn=self.last_scn, generation=self.gen,
                                   windows=self.windows))
            self.windows = 0
        commit, self.commit = self.commit, None
        if commit is not None:
            runner._report(Outcome("commit", scn=commit.scn, checkpoint=commit.checkpoint,
                                   generation=self.gen))


def _outcome(kind: str, scn: int, gen: int, error: BaseException | None = None) -> Outcome:
    return Outcome(kind, scn=scn, error=error, generation=gen)


class WindowAdapter(Consumer):
    """A batch consumer served by per-event delivery (registered beside a consumer of
    the paper's callbacks): its windows are gathered from the callbacks and handed over
    at each window's end; ``on_events`` then gets one window's events per call."""

    def __init__(self, inner: Consumer) -> None:
        self.inner = inner
        self._window: Window | None = None
        kind = type(inner)
        self._per_window = kind.on_window is not Consumer.on_window

    def on_start_data_event_sequence(self, scn: int) -> CallbackResult:
        self._window = Window(scn, 0)
        return CallbackResult.SUCCESS

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        window = self._window
        assert window is not None
        if not window.events:
            window.from_bootstrap = event.from_bootstrap
        window.events.append(event)
        window.timestamp_ns = event.timestamp_ns
        return CallbackResult.SUCCESS

    def on_dump_start(self, source: str) -> CallbackResult:
        return self._marker(source, start=True)

    def on_dump_end(self, source: str, outcome: str = "done") -> CallbackResult:
        return self._marker(source, start=False, outcome=outcome)

    def _marker(self, source: str, *, start: bool, outcome: str | None = None
                ) -> CallbackResult:
        window = self._window
        assert window is not None
        window.markers.append(DumpMarker(window.scn, source, None, start, outcome=outcome))
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult | None:
        window, self._window = self._window, None
        if window is None:
            return CallbackResult.SUCCESS
        if self._per_window:
            return self.inner.on_window(window)
        return self.inner.on_events(window.events) if window.events else None

    def on_rollback(self, scn: int) -> CallbackResult | None:
        self._window = None
        return self.inner.on_rollback(scn)

    def on_checkpoint(self, scn: int) -> CallbackResult | None:
        return self.inner.on_checkpoint(scn)

    def on_error(self, error: BaseException) -> CallbackResult | None:
        return self.inner.on_error(error)

    def on_start_bootstrap(self) -> CallbackResult | None:
        return self.inner.on_start_bootstrap()

    def on_end_bootstrap(self) -> CallbackResult | None:
        return self.inner.on_end_bootstrap()

    def on_partitions_assigned(self, partitions: tuple[int, ...]) -> None:
        self.inner.on_partitions_assigned(partitions)

    def on_partitions_revoked(self, partitions: tuple[int, ...]) -> None:
        self.inner.on_partitions_revoked(partitions)


class WindowCollector(Consumer):
    """Hands whole windows to ``DatabusClient.windows`` (an async generator on the
    client's event loop): one hand-over per batch of windows, not per window.

    ``on_windows`` (called by the runner's thread) passes the list to the loop and
    waits until the generator's loop bodies have finished them, or the loop was left;
    it answers how many were finished, and only those are committed.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 handoff: asyncio.Queue[list[Window] | None]) -> None:
        self._loop = loop
        self._handoff = handoff
        self._done = threading.Event()
        self.finished = 0

    def on_windows(self, windows: list[Window]) -> int:
        self._done.clear()
        self.finished = 0
        try:
            asyncio.run_coroutine_threadsafe(self._handoff.put(windows), self._loop).result()
        except RuntimeError:  # the loop is closed: nothing was handed over
            return 0
        self._done.wait()
        return self.finished

    def release(self, finished: int) -> None:
        """The generator finished ``finished`` windows of the list it was handed."""
        self.finished = finished
        self._done.set()
