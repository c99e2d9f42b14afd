"""Runs the dispatcher against the consumers in a thread of its own.

Consumer callbacks are plain (blocking) functions, so they run in the runner's thread,
never on the event loop, and cost a direct call each (no executor hop per event).
Per-callback time budgets are enforced two ways: a callback that returns late counts as
ERROR, and a watchdog (``check_timeouts``, called from the event loop) abandons a
callback that does not return at all: it bumps the *generation*, so the stuck thread
finds on return that its work no longer counts and exits, and a new thread takes over
the replay. Python cannot kill a thread; abandoning it is the safe equivalent.

With ``parallelism`` > 1, a window's data events go to that many worker threads by key
(so each key's events stay in order) and every non-data callback (end of source, end of
window, checkpoint) waits until the workers have finished the events before it.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from databus._limited_log import limited
from databus.checkpoint import Checkpoint
from databus.client._consumer import CallbackResult, Consumer
from databus.client._dispatcher import Call, CallKind, Dispatcher, Step
from databus.client._events import DataEvent, Item
from databus.errors import DatabusError

log = logging.getLogger("databus.client")


class CallbackTimeout(DatabusError):
    """A consumer callback ran past the client's time budget."""

    code = "callback_timeout"
    retriable = True


class ConsumerError(DatabusError):
    """A consumer callback raised or answered ERROR / ERROR_FATAL."""

    code = "consumer_error"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the runner reports to the client loop (from the runner thread)."""

    kind: str  # "commit", "window", "rollback", "fatal", "batch_done", "fenced"
    scn: int | None = None
    checkpoint: Checkpoint | None = None  # what a "commit" persists
    error: BaseException | None = None
    generation: int = 0
    nbytes: int = 0
    timestamp_ns: int = 0
    events: int = 0
    windows: int = 1  # a "window" report of the batch API counts several


# (generation, items, bytes they came in); None tells the thread to stop.
_Batch = tuple[int, list[Item], int]

_METHODS = {
    CallKind.START_WINDOW: "on_start_data_event_sequence",
    CallKind.START_SOURCE: "on_start_source",
    CallKind.DATA: "on_data_event",
    CallKind.END_SOURCE: "on_end_source",
    CallKind.END_WINDOW: "on_end_data_event_sequence",
    CallKind.CHECKPOINT: "on_checkpoint",
    CallKind.START_BOOTSTRAP: "on_start_bootstrap",
    CallKind.END_BOOTSTRAP: "on_end_bootstrap",
    CallKind.DUMP_START: "on_dump_start",
    CallKind.DUMP_END: "on_dump_end",
}
_NO_ARGS = (CallKind.START_BOOTSTRAP, CallKind.END_BOOTSTRAP)
# Calls whose SUCCESS answer changes nothing in the dispatcher (``Dispatcher.result``
# returns CONTINUE with no follow-up): the runner does not report it.
_PLAIN_KINDS = frozenset({CallKind.START_WINDOW, CallKind.START_SOURCE, CallKind.DATA,
                          CallKind.END_SOURCE, CallKind.DUMP_START, CallKind.DUMP_END})


# Where a group member's fence is checked: once the member's lease has run out no window
# begins, no event is delivered, no window ends and none commits. (Every data event on
# the fast path is checked too: a clock read.)
_FENCED_KINDS = frozenset({CallKind.START_WINDOW, CallKind.DATA, CallKind.END_WINDOW,
                           CallKind.CHECKPOINT})


def _args(call: Call) -> tuple[object, ...]:
    if call.kind is CallKind.DATA:
        return (call.event,)
    if call.kind is CallKind.START_SOURCE:
        return (call.source, call.schema)
    if call.kind is CallKind.DUMP_END:
        return (call.source, call.outcome or "done")
    if call.kind in (CallKind.END_SOURCE, CallKind.DUMP_START):
        return (call.source,)
    if call.kind in _NO_ARGS:
        return ()
    return (call.scn,)


def _with_outcome(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``on_dump_end`` as the runner calls it, ``(source, outcome)``: a consumer written
    before outcomes existed (``on_dump_end(self, source)``) is called with the source
    alone, as before."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return fn
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params):
        return fn

    def source_only(source: str, outcome: str) -> Any:
        return fn(source)

    return source_only


def normalize(result: object, where: str) -> CallbackResult:
    if result is None:
        return CallbackResult.SUCCESS
    if isinstance(result, CallbackResult):
        return result
    limited(log).error("%s returned %r, not a CallbackResult: treated as ERROR", where, result,
                       kind=where)
    return CallbackResult.ERROR


class Runner:
    """One dispatch thread per generation; see the module docstring."""

    def __init__(
        self,
        consumers: Sequence[Consumer],
        dispatcher: Dispatcher,
        report: Callable[[Outcome], None],
        *,
        callback_timeout: float,
        parallelism: int = 1,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        from databus.client._batches import WindowAdapter, is_batch_consumer

        batch = [is_batch_consumer(c) for c in consumers]
        # Every consumer takes whole windows: the batch delivery (``_batches.py``).
        # Mixed with consumers of the paper's callbacks: per-event delivery for all,
        # the batch consumers served through an adapter.
        self.batch_mode = bool(batch) and all(batch)
        self.consumers = [WindowAdapter(c) if b and not self.batch_mode else c
                          for c, b in zip(consumers, batch, strict=True)]
        self.dispatcher = dispatcher
        self._report = report
        # A group member's lease (``client.group``): checked before each window starts
        # and before each commit; False stops the generation with a "fenced" report.
        self._fence = fence
        self.callback_timeout = callback_timeout
        self.parallelism = parallelism
        self.generation = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Batch | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._running: dict[int, float] = {}  # thread id -> start of the current callback
        self._workers: list[ThreadPoolExecutor] = []
        self._stopping = threading.Event()
        self._targets: dict[str, list[Callable[..., object]]] = {}
        self.last_error: BaseException | None = None

    # -- control (event loop side) --------------------------------------------------

    def start(self, *, rollback_to: int | None = None, announce_rollback: bool = False) -> int:
        """Start a new generation (abandoning the previous one); returns its number."""
        with self._lock:
            self.generation += 1
            gen = self.generation
            self._running.clear()
        self._queue = queue.Queue()
        for pool in self._workers:
            pool.shutdown(wait=False, cancel_futures=True)
        self._workers = [
            ThreadPoolExecutor(1, thread_name_prefix=f"databus-worker-{i}")
            for i in range(self.parallelism if self.parallelism > 1 else 0)
        ]
        q = self._queue
        self._thread = threading.Thread(
            target=self._main, args=(gen, q, rollback_to, announce_rollback),
            name=f"databus-dispatch-{gen}", daemon=True,
        )
        self._thread.start()
        return gen

    def submit(self, items: list[Item], generation: int, nbytes: int) -> None:
        if generation == self.generation:
            self._queue.put((generation, items, nbytes))

    def stop(self, timeout: float = 5.0) -> None:
        """Let the window in progress finish (and its checkpoint commit), then stop;
        abandon it if that takes longer than ``timeout``."""
        self._stopping.set()
        self._queue.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with self._lock:
            self.generation += 1
        for pool in self._workers:
            pool.shutdown(wait=False, cancel_futures=True)

    def abandon(self) -> None:
        """End the current generation where it is and wait for its thread, so that no
        late ``feed`` races the rollback that follows (blocking: call it off the loop)."""
        with self._lock:
            self.generation += 1
        self._queue.put(None)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.callback_timeout)

    def rollback_dispatcher(self) -> tuple[int | None, Checkpoint | None]:
        """Reset the dispatcher for a replay; returns the committed SCN (for
        ``on_rollback``) and checkpoint (to replay from)."""
        with self._lock:  # the runner thread applies results under the same lock
            return self.dispatcher.rollback(), self.dispatcher.committed

    def check_timeouts(self) -> bool:
        """Abandon the generation if a callback has run past its budget (watchdog)."""
        now = time.monotonic()
        with self._lock:
            late = [t for t in list(self._running.values()) if now - t > self.callback_timeout]
            if not late:
                return False
            gen = self.generation
            self.generation += 1
            self._running.clear()
        error = CallbackTimeout(
            f"a consumer callback is still running after {self.callback_timeout:.3g} s"
        )
        self.last_error = error
        self._report(Outcome("rollback", error=error, generation=gen))
        return True

    def call_quietly(self, method: str, *args: object) -> CallbackResult:
        """Call one callback of every consumer outside dispatch (on_error at stop)."""
        worst = CallbackResult.SUCCESS
        for consumer in self.consumers:
            try:
                worst = max(worst, normalize(getattr(consumer, method)(*args), method))
            except Exception:
                log.exception("%s raised", method)
                worst = CallbackResult.ERROR
        return worst

    # -- the dispatch thread --------------------------------------------------------

    def _main(
        self, gen: int, q: queue.Queue[_Batch | None], rollback_to: int | None, announce: bool
    ) -> None:
        from databus.client._batches import BatchDelivery

        delivery = BatchDelivery(self, gen) if self.batch_mode else None
        if announce:
            result = self._invoke_all("on_rollback", (rollback_to if rollback_to is not None
                                                      else -1,), gen)
            if result is None:
                return
            if result is CallbackResult.ERROR_FATAL:
                self._report(Outcome("fatal", error=self.last_error, generation=gen))
                return
        while True:
            batch = q.get()
            if batch is None or gen != self.generation:
                return
            _, items, nbytes = batch
            ok = (self._dispatch(items, gen) if delivery is None
                  else delivery.dispatch(items, gen))
            self._report(Outcome("batch_done", generation=gen, nbytes=nbytes))
            if not ok:
                return

    def _dispatch(self, items: list[Item], gen: int) -> bool:
        dispatcher = self.dispatcher
        pending: list[tuple[Call, Future[CallbackResult | None]]] = []
        fast = not self._workers
        success = CallbackResult.SUCCESS
        fence = self._fence
        for item in items:
            if fast and type(item) is DataEvent and dispatcher.continues(item):
                if fence is not None and not fence():
                    self._report(Outcome("fenced", scn=item.scn, generation=gen))
                    return False
                # The hot path: an event inside the open window's source run. Only an
                # answer other than SUCCESS needs the dispatcher (``Dispatcher.result``
                # of a DATA call with SUCCESS changes nothing).
                result = self._invoke_all("on_data_event", (item,), gen)
                if result is success:
                    continue
                if self._apply(Call(CallKind.DATA, item.scn, item.source, item), result,
                               gen) is None:
                    return False
                continue
            if self._stopping.is_set() and not dispatcher.in_window:
                return False  # stopping: never begin another window
            for call in dispatcher.feed(item):
                if call.kind is CallKind.DATA and self._workers:
                    assert call.event is not None
                    pool = self._workers[call.event.partition_key % len(self._workers)]
                    pending.append((call, pool.submit(self._invoke, call, gen)))
                    continue
                if pending:
                    if not self._drain(pending, gen):
                        return False
                    pending = []
                if not self._run(call, gen):
                    return False
        return not pending or self._drain(pending, gen)

    def _drain(self, pending: list[tuple[Call, Future[CallbackResult | None]]], gen: int) -> bool:
        futures = [f for _, f in pending]
        while True:
            _, not_done = wait_futures(futures, timeout=0.1)
            if gen != self.generation:
                return False
            if not not_done:
                break
        return all(self._apply(call, future.result(), gen) is not None
                   for call, future in pending)

    def _run(self, call: Call, gen: int) -> bool:
        calls = [call]
        while calls:
            current = calls.pop(0)
            if (self._fence is not None and current.kind in _FENCED_KINDS
                    and not self._fence()):
                self._report(Outcome("fenced", scn=current.scn, generation=gen))
                return False
            result = (CallbackResult.SUCCESS if current.quiet
                      else self._invoke(current, gen))
            if result is CallbackResult.SUCCESS and current.kind in _PLAIN_KINDS:
                continue  # the dispatcher's answer is known: CONTINUE, nothing to follow
            follow = self._apply(current, result, gen)
            if follow is None:
                return False
            if current.kind is CallKind.END_WINDOW:
                self._report(Outcome("window", scn=current.scn, generation=gen))
            calls[0:0] = follow
        return True

    def _apply(self, call: Call, result: CallbackResult | None, gen: int) -> list[Call] | None:
        """Feed ``result`` to the dispatcher; the follow-up calls, or None to stop."""
        if result is None:
            return None  # abandoned by the watchdog
        with self._lock:
            if gen != self.generation:
                return None
            step, follow = self.dispatcher.result(call, result)
        if step is Step.COMMIT:
            self._report(Outcome("commit", scn=call.scn, checkpoint=call.checkpoint,
                                 generation=gen))
        elif step is Step.ROLLBACK:
            self._report(Outcome("rollback", scn=call.scn, error=self.last_error,
                                 generation=gen))
            return None
        elif step is Step.FATAL:
            self._report(Outcome("fatal", scn=call.scn, error=self.last_error,
                                 generation=gen))
            return None
        return follow

    def _invoke(self, call: Call, gen: int) -> CallbackResult | None:
        method = _METHODS[call.kind]
        if not self._targets.get(method, True):
            # No consumer overrides it: Consumer's default answers SUCCESS.
            return CallbackResult.SUCCESS if gen == self.generation else None
        return self._invoke_all(method, _args(call), gen)

    def _invoke_each(self, method: str, arguments: list[Any], gen: int
                     ) -> list[CallbackResult] | None:
        """``method(argument)`` of every consumer for each argument in turn (the batch
        API's ``on_window`` over a response's windows): the answers, cut after the first
        ERROR or worse; None when abandoned. The same rules as ``_invoke_all`` (time
        budget, exceptions, the watchdog), in one loop when one consumer takes them."""
        targets = self._targets_of(method)
        answers: list[CallbackResult] = []
        error = CallbackResult.ERROR
        if len(targets) != 1:
            for argument in arguments:
                answer = self._invoke_all(method, (argument,), gen)
                if answer is None:
                    return None
                answers.append(answer)
                if answer >= error:
                    break
            return answers
        fn = targets[0]
        running = self._running
        ident = threading.get_ident()
        timeout = self.callback_timeout
        monotonic = time.monotonic
        success = CallbackResult.SUCCESS
        for argument in arguments:
            if gen != self.generation:
                return None
            start = running[ident] = monotonic()
            try:
                got = fn(argument)
            except Exception as exc:  # a consumer bug: roll back and replay
                result = self._raised(method, exc)
            else:
                result = success if got is None else self._answered(method, got)
            finally:
                running.pop(ident, None)
            if monotonic() - start > timeout:
                result = self._late(method, result)
            answers.append(result)
            if result >= error:
                break
        return answers

    def _answered(self, method: str, answer: object) -> CallbackResult:
        result = answer if type(answer) is CallbackResult else normalize(answer, method)
        if result >= CallbackResult.ERROR:
            self.last_error = ConsumerError(f"{method} answered {result.name}")
        return result

    def _raised(self, method: str, exc: Exception) -> CallbackResult:
        limited(log).warning("%s raised %s: %s", method, type(exc).__name__, exc,
                             kind=method)
        self.last_error = exc
        return CallbackResult.ERROR

    def _late(self, method: str, result: CallbackResult) -> CallbackResult:
        timeout = self.callback_timeout
        self.last_error = CallbackTimeout(f"{method} took longer than {timeout:.3g} s")
        return max(result, CallbackResult.ERROR)

    def _targets_of(self, method: str) -> list[Callable[..., object]]:
        """The consumers' ``method``s, of those that override it (a method left as
        Consumer's default is known to answer SUCCESS and is not called)."""
        targets = self._targets.get(method)
        if targets is None:
            base = getattr(Consumer, method, None)
            targets = self._targets[method] = [
                _with_outcome(getattr(c, method)) if method == "on_dump_end"
                else getattr(c, method) for c in self.consumers
                if getattr(type(c), method, base) is not base
            ]
        return targets

    def _invoke_all(self, method: str, args: tuple[object, ...], gen: int
                    ) -> CallbackResult | None:
        # The hot path: a direct call per consumer that overrides ``method``.
        # ``_running`` is written without the lock: single dict stores are atomic and
        # the watchdog copies the values before it reads them.
        targets = self._targets_of(method)
        if gen != self.generation:
            return None
        worst = CallbackResult.SUCCESS
        running = self._running
        ident = threading.get_ident()
        timeout = self.callback_timeout
        monotonic = time.monotonic
        for fn in targets:
            start = running[ident] = monotonic()
            try:
                answer = fn(*args)
            except Exception as exc:  # a consumer bug: roll back and replay
                result = self._raised(method, exc)
            else:
                result = (CallbackResult.SUCCESS if answer is None
                          else self._answered(method, answer))
            finally:
                running.pop(ident, None)
            if monotonic() - start > timeout:
                result = self._late(method, result)
            if result > worst:
                worst = result
        return worst
