"""``DatabusClient``: pulls windows from relays and drives the consumers.

Three parts, each owning one job:

- the **pull loop** (an asyncio task) long-polls a relay from the *fetch position*,
  decodes and checks each body, and hands it to the runner; it asks only for as many
  bytes as the local buffer can still hold (flow control);
- the **runner** (a thread, ``_runner.py``) feeds the pure ``Dispatcher`` and calls
  the consumers, reporting commits, rollbacks and fatal errors;
- the **checkpoint writer** (a thread) persists the newest committed checkpoint,
  coalescing when the store is slower than the windows arrive.

A rollback (a callback error, exception or timeout) stops the pull loop, drops what is
buffered, calls ``on_rollback`` and pulls again from the last committed checkpoint,
within a retry budget. A fatal error or a spent budget stops the client and calls
``on_error``. ``run()`` raises the error that stopped the client; a clean ``stop()``
returns normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from databus.checkpoint import Checkpoint
from databus.client._checkpoint_store import CheckpointStore
from databus.client._consumer import CallbackResult, Consumer
from databus.client._decode import ResponseDecoder
from databus.client._dispatcher import Dispatcher
from databus.client._events import DataEvent, Window
from databus.client._relay_puller import RelayPuller
from databus.client._runner import Outcome, Runner
from databus.errors import DatabusError, EventFormatError
from databus.filters import FilterSpec
from databus.schemas import AvroCodec, Schema

log = logging.getLogger("databus.client")


class RetryBudgetExhausted(DatabusError):
    """The same failure kept coming back after ``retry_budget`` rollbacks."""

    code = "retry_budget_exhausted"


@dataclass
class ClientMetrics:
    """Counters and gauges of one client (see also ``prometheus_text``)."""

    events: int = 0
    windows: int = 0
    rollbacks: int = 0
    errors: int = 0
    failovers: int = 0
    consumer_scn: int | None = None
    committed_scn: int | None = None
    relay_max_scn: int | None = None
    last_window_timestamp_ns: int = 0
    started_at: float = 0.0
    # True when the last poll found nothing new and everything fetched was dispatched.
    caught_up: bool = False

    @property
    def lag_scn(self) -> int | None:
        if self.relay_max_scn is None:
            return None
        return max(0, self.relay_max_scn - (self.consumer_scn or 0))

    @property
    def lag_ms(self) -> float | None:
        """How far behind the relay's newest window the consumer is, in time: 0 when it
        has consumed the newest window, else the age of the last window it consumed."""
        lag = self.lag_scn
        if lag is None:
            return None
        if lag == 0:
            return 0.0
        if not self.last_window_timestamp_ns:
            return None
        return max(0.0, (time.time_ns() - self.last_window_timestamp_ns) / 1e6)

    @property
    def events_per_second(self) -> float:
        elapsed = time.monotonic() - self.started_at if self.started_at else 0.0
        return self.events / elapsed if elapsed > 0 else 0.0

    def prometheus_text(self, client: str = "databus-client") -> str:
        label = f'{{client="{client}"}}'
        rows = [
            ("events_total", "counter", self.events),
            ("windows_total", "counter", self.windows),
            ("rollbacks_total", "counter", self.rollbacks),
            ("errors_total", "counter", self.errors),
            ("relay_failovers_total", "counter", self.failovers),
            ("lag_scn", "gauge", self.lag_scn or 0),
            ("lag_ms", "gauge", self.lag_ms or 0),
            ("events_per_second", "gauge", round(self.events_per_second, 3)),
        ]
        out = []
        for name, kind, value in rows:
            out += [f"# TYPE databus_client_{name} {kind}",
                    f"databus_client_{name}{label} {value}"]
        return "\n".join(out) + "\n"


class _CheckpointWriter:
    """Persists the newest committed checkpoint from a thread of its own."""

    def __init__(self, store: CheckpointStore | None) -> None:
        self.store = store
        self._cond = threading.Condition()
        self._latest: Checkpoint | None = None
        self._written: Checkpoint | None = None
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="databus-checkpoint",
                                        daemon=True)
        if store is not None:
            self._thread.start()

    def submit(self, checkpoint: Checkpoint) -> None:
        with self._cond:
            self._latest = checkpoint
            self._cond.notify()

    def _main(self) -> None:
        assert self.store is not None
        while True:
            with self._cond:
                while self._latest is self._written and not self._closed:
                    self._cond.wait()
                if self._latest is self._written:
                    return
                # Windows committed while a write is in progress coalesce: the next
                # write takes only the newest checkpoint.
                checkpoint = self._latest
            try:
                if checkpoint is not None:
                    self.store.store(checkpoint)
            except Exception as exc:  # reported to the client loop, which stops
                log.error("checkpoint store failed: %s", exc)
                self.error = exc
            with self._cond:
                self._written = checkpoint
                self._cond.notify_all()

    def flush_and_close(self, timeout: float = 10.0) -> None:
        if self.store is None:
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)


class _ByteBudget:
    """Flow control: bytes handed to the runner and not yet dispatched."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)

    def take(self, n: int) -> None:
        self.used += n

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)
        self._freed.set()

    def reset(self) -> None:
        self.used = 0
        self._freed.set()

    async def wait_for(self, n: int) -> None:
        while self.free < n and self.used > 0:
            self._freed.clear()
            await self._freed.wait()


class DatabusClient:
    """A Databus consumer client; see DESIGN section 10 and ``docs/client.md``.

    ``start_from`` says where a client with no stored checkpoint begins: "earliest"
    (everything the relay holds) or "latest" (only new windows).
    """

    def __init__(
        self,
        relays: Sequence[str],
        *,
        sources: Sequence[str] = (),
        checkpoint_store: CheckpointStore | None = None,
        bootstrap: Sequence[str] = (),
        filter: FilterSpec | str | Mapping[str, object] | None = None,
        reader_schemas: Mapping[str, Schema | str | Mapping[str, Any]] | None = None,
        checkpoint_every: int = 1,
        callback_timeout: float = 30.0,
        retry_budget: int = 5,
        parallelism: int = 1,
        max_buffered_bytes: int = 8 << 20,
        max_request_bytes: int = 1 << 20,
        poll_wait_ms: int = 1000,
        start_from: Literal["earliest", "latest"] = "earliest",
        name: str = "databus-client",
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        if not relays:
            raise ValueError("DatabusClient needs at least one relay URL")
        if start_from not in ("earliest", "latest"):
            raise ValueError("start_from is 'earliest' or 'latest'")
        self.relays = list(relays)
        self.sources = list(sources)
        self.checkpoint_store = checkpoint_store
        # The switch-over to a bootstrap service on scn_not_found arrives with the
        # bootstrap service; until then a fall-off is a FellOffRelay error either way.
        self.bootstrap = list(bootstrap)
        spec = FilterSpec.parse(filter) if filter is not None else FilterSpec()
        self.filter = spec
        self.reader_schemas = {
            name_: s if isinstance(s, Schema) else Schema(s)
            for name_, s in (reader_schemas or {}).items()
        }
        self.checkpoint_every = checkpoint_every
        self.callback_timeout = callback_timeout
        self.retry_budget = retry_budget
        self.parallelism = parallelism
        self.max_buffered_bytes = max_buffered_bytes
        self.max_request_bytes = max_request_bytes
        self.poll_wait_ms = poll_wait_ms
        self.start_from = start_from
        self.name = name
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.metrics = ClientMetrics()
        self._consumers: list[Consumer] = []
        self._stop_requested = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    def register(self, consumer: Consumer) -> None:
        """Add a consumer; every registered consumer gets every callback."""
        self._consumers.append(consumer)

    def stop(self) -> None:
        """Ask a running client to stop (thread-safe); ``run`` then returns."""
        self._stop_requested.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            loop.call_soon_threadsafe(wake.set)

    def run(self) -> None:
        """Run until ``stop()`` or a fatal error (raised here)."""
        asyncio.run(self.run_async())

    # -- the async core ---------------------------------------------------------------

    async def run_async(self) -> None:
        if not self._consumers:
            raise ValueError("register a Consumer before running the client")
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._wake = asyncio.Event()
        outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        store = self.checkpoint_store
        stored = await asyncio.to_thread(store.load) if store is not None else None
        committed = stored.window_scn if stored is not None and stored.window_scn >= 0 else None
        start = stored or (Checkpoint.flexible() if self.start_from == "earliest"
                           else Checkpoint.latest())
        self.metrics = ClientMetrics(started_at=time.monotonic(), committed_scn=committed,
                                     consumer_scn=committed)
        writer = _CheckpointWriter(store)
        budget = _ByteBudget(self.max_buffered_bytes)
        dispatcher = Dispatcher(committed_scn=committed, checkpoint_every=self.checkpoint_every)
        metrics = self.metrics

        def report(outcome: Outcome) -> None:  # runs in the runner thread
            # Per-window news is handled right here; only what the loop must act on
            # crosses threads (a wake-up per window would cost more than the window).
            kind = outcome.kind
            if kind == "window":
                metrics.windows += 1
                metrics.consumer_scn = outcome.scn
            elif kind == "commit":
                assert outcome.scn is not None
                metrics.committed_scn = outcome.scn
                metrics.consumer_scn = max(metrics.consumer_scn or 0, outcome.scn)
                # Straight to the writer: a commit must not wait in the loop's queue.
                writer.submit(Checkpoint(outcome.scn))
            else:
                loop.call_soon_threadsafe(self._on_outcome, outcome, outcomes, budget)

        runner = Runner(self._consumers, dispatcher, report,
                        callback_timeout=self.callback_timeout, parallelism=self.parallelism)
        codec = AvroCodec()
        decoder = ResponseDecoder(codec, reader_schemas=self.reader_schemas)
        error: BaseException | None = None
        retries = 0
        failed_at: int | None = None
        position = start
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as session:
            puller = RelayPuller(
                self.relays, self.sources, session,
                filter_json=None if self.filter.is_empty else self.filter.to_json_text(),
                backoff_initial=self.backoff_initial, backoff_max=self.backoff_max,
            )
            gen = runner.start()
            try:
                while not self._stop_requested.is_set():
                    pull = asyncio.create_task(
                        self._pull(puller, decoder, codec, runner, gen, position, budget)
                    )
                    watchdog = asyncio.create_task(self._watch(runner))
                    stop_wait = asyncio.create_task(self._wake.wait())
                    next_outcome = asyncio.create_task(self._next_failure(outcomes, writer))
                    done, _ = await asyncio.wait(
                        {pull, stop_wait, next_outcome}, return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in (pull, watchdog, stop_wait, next_outcome):
                        task.cancel()
                    for task in (pull, watchdog, stop_wait, next_outcome):
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
                    metrics.failovers = puller.failovers
                    if pull in done and pull.exception() is not None:
                        error = pull.exception()
                        break
                    if next_outcome not in done or next_outcome.cancelled():
                        continue  # stop requested
                    outcome = next_outcome.result()
                    if outcome.kind == "fatal":
                        error = outcome.error or DatabusError("a consumer answered ERROR_FATAL")
                        break
                    if outcome.kind == "writer":
                        error = outcome.error
                        break
                    # Rollback: replay from the last committed checkpoint.
                    metrics.rollbacks += 1
                    metrics.errors += 1
                    if failed_at is not None and (dispatcher.committed_scn or -1) > failed_at:
                        retries = 0
                    failed_at = outcome.scn if outcome.scn is not None else failed_at
                    retries += 1
                    if retries > self.retry_budget:
                        error = RetryBudgetExhausted(
                            f"gave up after {self.retry_budget} rollbacks; last error: "
                            f"{outcome.error}"
                        )
                        error.__cause__ = outcome.error
                        break
                    replay_from = runner.rollback_dispatcher()
                    budget.reset()
                    position = Checkpoint(replay_from) if replay_from is not None else start
                    decoder.reset()
                    log.warning("rolling back to SCN %s after: %s (retry %d of %d)",
                                replay_from, outcome.error, retries, self.retry_budget)
                    await asyncio.sleep(min(self.backoff_max,
                                            self.backoff_initial * 2 ** (retries - 1)))
                    gen = runner.start(rollback_to=replay_from, announce_rollback=True)
            finally:
                runner.stop()
                # The store belongs to the caller, who closes it; it may be reused.
                await asyncio.to_thread(writer.flush_and_close)
                self._loop = self._wake = None
        if error is not None:
            metrics.errors += 1
            await asyncio.to_thread(runner.call_quietly, "on_error", error)
            raise error

    def _on_outcome(
        self,
        outcome: Outcome,
        outcomes: asyncio.Queue[Outcome],
        budget: _ByteBudget,
    ) -> None:
        """Runs on the loop for the runner reports the loop must act on."""
        if outcome.kind == "batch_done":
            budget.release(outcome.nbytes)
        else:
            outcomes.put_nowait(outcome)

    async def _next_failure(
        self, outcomes: asyncio.Queue[Outcome], writer: _CheckpointWriter
    ) -> Outcome:
        while True:
            try:
                return await asyncio.wait_for(outcomes.get(), 0.2)
            except TimeoutError:
                if writer.error is not None:
                    return Outcome("writer", error=writer.error)

    async def _watch(self, runner: Runner) -> None:
        interval = min(0.1, self.callback_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            runner.check_timeouts()

    async def _pull(
        self,
        puller: RelayPuller,
        decoder: ResponseDecoder,
        codec: AvroCodec,
        runner: Runner,
        gen: int,
        position: Checkpoint,
        budget: _ByteBudget,
    ) -> None:
        metrics = self.metrics
        decoder.reset(at_window_start=position.window_offset < 0)
        decoder.verify_windows = await self._can_verify_windows(puller)
        min_request = 64 * 1024
        want = self.max_request_bytes
        while True:
            await budget.wait_for(min(min_request, want))
            max_bytes = max(min(want, budget.free), 1)
            batch = await puller.fetch(position, max_bytes=max_bytes,
                                       wait_ms=self.poll_wait_ms)
            if batch.max_scn is not None:
                metrics.relay_max_scn = batch.max_scn
            if batch.pending_event_size is not None:
                # One event larger than the request: ask for exactly that much once.
                want = batch.pending_event_size
                continue
            want = self.max_request_bytes
            metrics.caught_up = not batch.body and budget.used == 0
            if not batch.body:
                position = batch.checkpoint
                continue
            try:
                for fp in decoder.missing_fingerprints(batch.body):
                    codec.add(await puller.schema(fp))
                items = decoder.decode(batch.body, batch.source_names)
            except EventFormatError as exc:
                log.warning("relay %s sent a bad body (%s); asking again", batch.relay, exc)
                await puller.failed(exc)
                continue
            metrics.events += sum(1 for i in items if isinstance(i, DataEvent))
            for item in reversed(items):
                if not isinstance(item, DataEvent):
                    metrics.last_window_timestamp_ns = item.timestamp_ns
                    break
            budget.take(len(batch.body))
            runner.submit(items, gen, len(batch.body))
            position = batch.checkpoint

    async def _can_verify_windows(self, puller: RelayPuller) -> bool:
        """Window checksums can be checked only when every event of a window arrives:
        no filter, and every source of the buffer subscribed."""
        if not self.filter.is_empty:
            return False
        await puller.catalog()
        if not self.sources:
            return True
        wanted = set(self.sources)
        return any(wanted >= names for names in puller.buffer_sources.values()
                   if names & wanted)

    # -- iterator style -------------------------------------------------------------

    async def windows(self) -> AsyncIterator[Window]:
        """Yield whole windows; a window's checkpoint is committed once the loop body
        that received it has finished (when the next window is asked for).

        Leave the loop early only inside ``contextlib.aclosing(client.windows())``: an
        abandoned async generator is closed (and the client stopped, its checkpoint
        flushed) only when it is garbage collected."""
        handoff: asyncio.Queue[Window | None] = asyncio.Queue(maxsize=1)
        loop = asyncio.get_running_loop()
        collector = _WindowCollector(loop, handoff)
        self.register(collector)
        task = asyncio.create_task(self.run_async())
        task.add_done_callback(lambda _: handoff.put_nowait(None)
                               if handoff.empty() else None)
        try:
            while True:
                window = await handoff.get()
                if window is None:
                    break
                yield window
                collector.release()
        finally:
            self.stop()
            collector.release()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._consumers.remove(collector)


class _WindowCollector(Consumer):
    """Turns callbacks into whole windows for ``DatabusClient.windows``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, handoff: asyncio.Queue[Window | None]
                 ) -> None:
        self._loop = loop
        self._handoff = handoff
        self._window: Window | None = None
        self._done = threading.Event()

    def on_start_data_event_sequence(self, scn: int) -> CallbackResult:
        self._window = Window(scn, 0)
        return CallbackResult.SUCCESS

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        assert self._window is not None
        self._window.events.append(event)
        self._window.timestamp_ns = event.timestamp_ns
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        window, self._window = self._window, None
        if window is None:
            return CallbackResult.SUCCESS
        self._done.clear()
        asyncio.run_coroutine_threadsafe(self._handoff.put(window), self._loop).result()
        self._done.wait()
        return CallbackResult.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        self._window = None
        return CallbackResult.SUCCESS

    def release(self) -> None:
        self._done.set()

