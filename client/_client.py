"""``DatabusClient``: pulls windows from relays and drives the consumers.

Three parts, each owning one job:

- the **pull loop** (an asyncio task) long-polls a relay from the *fetch position*,
  decodes and checks each body, and hands it to the runner; it asks only for as many
  bytes as the local buffer can still hold (flow control). On ``scn_not_found`` (or with
  no checkpoint at all) it holds the bootstrap conversation instead, then goes back to
  the relay at the online checkpoint the bootstrap ends at;
- the **runner** (a thread, ``_runner.py``) feeds the pure ``Dispatcher`` and calls
  the consumers, reporting commits, rollbacks and fatal errors;
- the **checkpoint writer** (a thread, ``_flow.py``) persists the newest committed checkpoint,
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
import operator
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from databus._http import MAX_CLIENT_ID
from databus._limited_log import limited
from databus._redact import register_uri
from databus.checkpoint import FLEXIBLE_SCN, Checkpoint, Mode
from databus.client._batches import WindowCollector
from databus.client._bootstrap_puller import BootstrapError, BootstrapPuller
from databus.client._checkpoint_store import CheckpointStore
from databus.client._consumer import Consumer
from databus.client._decode import WINDOW_FAILURES, Framing, ResponseDecoder
from databus.client._discovery import RelayDiscovery, validate_discovery
from databus.client._dispatcher import Dispatcher, checkpoint_scn
from databus.client._events import (
    BootstrapMark,
    DataEvent,
    EndOfWindow,
    Item,
    Window,
)
from databus.client._flow import ByteBudget, CheckpointWriter
from databus.client._metrics import ClientMetrics
from databus.client._relay_puller import FellOffRelay, RelayPuller
from databus.client._runner import Outcome, Runner
from databus.client.group._member import GroupRun, Segment, ZooKeeperCoordinator
from databus.errors import ConfigError, DatabusError, EventFormatError, UnknownSchemaError
from databus.filters import FilterSpec
from databus.schemas import AvroCodec, Schema
from databus.security import ClientCredentials, client_session

log = logging.getLogger("databus.client")


class RetryBudgetExhausted(DatabusError):
    """The same failure kept coming back after ``retry_budget`` rollbacks."""

    code = "retry_budget_exhausted"


class _ReplayFromCommitted(DatabusError):
    """The pull loop cannot go on from where it is: roll back and replay (not a
    consumer failure, so it costs no retry)."""


@dataclass(frozen=True, slots=True)
class _Pullers:
    """What a pull task works with."""

    relay: RelayPuller
    bootstrap: BootstrapPuller | None
    decoder: ResponseDecoder
    codec: AvroCodec
    runner: Runner
    budget: ByteBudget




def default_client_id(name: str, *, group: bool = False) -> str:
    """The client id a ``DatabusClient`` sends when none is given: ``name@host``, so a
    restarted app is the same consumer to the relays (one row in ``/v1/consumers``,
    one metrics series), not a new one per process.

    Two processes of one app on one host then share that id: the relay lists them as
    one consumer. Give each its own ``client_id=`` when they must be told apart. A
    consumer group member keeps ``name@host:pid``: its id is its member node in
    ZooKeeper, which must be unique among the group's live members (two members with
    one id would hold one node), and a restarted member joins as a new member anyway.
    """
    host = socket.gethostname()
    return f"{name}@{host}:{os.getpid()}" if group else f"{name}@{host}"


class DatabusClient:
    """A Databus consumer client; see ``docs/client.md``.

    ``start_from`` says where a client with no stored checkpoint begins: "earliest"
    (everything the relay holds) or "latest" (only new windows). ``client_id`` names
    the client to relays (``GET /v1/consumers``, 1 to 256 characters); by default
    ``"{name}@{hostname}"``, the same across restarts of the app (``default_client_id``:
    a group member's adds ``:{pid}``). ``bootstrap=None`` is no bootstrap service.

    ``group``, ``coordinator`` and ``partitions`` make the client one member of a
    consumer group (``databus.client.group``, docs/client.md "Consumer groups").

    ``ca_file``, ``cert_file``/``key_file`` and ``token`` are what the client presents
    to ``https://`` relays and bootstrap services with readers (docs/security.md):
    the CA their certificates are verified against (default: the system's), a client
    certificate for mutual TLS, and a reader token.

    ``stop_at_scn`` makes ``run``/``windows`` end on their own once the client's
    position is an online checkpoint at or past that SCN (a read of a bounded range:
    the Spark source's input partitions). Nothing after the window that reaches it is
    delivered; windows whose events were all filtered out count too, since the relay
    still sends their end. It needs a checkpoint after every window
    (``checkpoint_every=1``) and consumers that do not answer ``SKIP_CHECKPOINT``.
    """

    def __init__(
        self,
        relays: Sequence[str] = (),
        *,
        sources: Sequence[str] = (),
        checkpoint_store: CheckpointStore | None = None,
        bootstrap: Sequence[str] | None = (),
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
        streaming: bool = True,
        client_id: str | None = None,
        zookeeper: str | None = None,
        cluster: str | None = None,
        zookeeper_timeout: float = 10.0,
        group: str | None = None,
        coordinator: ZooKeeperCoordinator | None = None,
        partitions: int | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        token: str | None = None,
        stop_at_scn: int | None = None,
    ) -> None:
        # Relay discovery (docs/clusters.md, "Discovery"): the members of a relay
        # cluster on ZooKeeper instead of a list of URLs.
        if zookeeper is not None or cluster is not None:
            if relays:
                raise ConfigError("DatabusClient takes either relays=[...] or zookeeper= "
                                  "and cluster= (relay discovery), not both")
            if zookeeper is None or cluster is None:
                raise ConfigError("relay discovery needs both zookeeper= (the connect "
                                  "string) and cluster= (the relay cluster's name)")
            validate_discovery(zookeeper, cluster, zookeeper_timeout)
        elif not relays:
            raise ValueError("DatabusClient needs at least one relay URL (or zookeeper= "
                             "and cluster= to discover them)")
        if isinstance(relays, str):
            raise ConfigError("relays is a list of URLs, not one string")
        self.zookeeper = zookeeper
        self.cluster = cluster
        self.zookeeper_timeout = zookeeper_timeout
        if start_from not in ("earliest", "latest"):
            raise ValueError("start_from is 'earliest' or 'latest'")
        # With discovery: the cluster's members, kept up to date while the client runs.
        self.relays = list(relays)
        self.sources = list(sources)
        self.checkpoint_store = checkpoint_store
        # With bootstrap URLs, scn_not_found (and a start without a checkpoint) goes
        # to the bootstrap service; without (None or no URL), scn_not_found raises
        # FellOffRelay.
        if isinstance(bootstrap, str):
            raise ConfigError("bootstrap is a list of URLs, not one string")
        self.bootstrap = list(bootstrap) if bootstrap is not None else []
        # Credentials written into a relay or bootstrap URL never reach a log line or
        # an error message (DESIGN section 12; databus/_redact.py).
        for url in (*self.relays, *self.bootstrap):
            register_uri(url)
        # https:// relays and bootstrap services (docs/security.md): the CA their
        # certificates are checked against, a client certificate for mutual TLS, and
        # the reader token sent with every request.
        self.credentials = ClientCredentials.of(
            ca_file=os.fspath(ca_file) if ca_file is not None else None,
            cert_file=os.fspath(cert_file) if cert_file is not None else None,
            key_file=os.fspath(key_file) if key_file is not None else None, token=token)
        if any(u.lower().startswith("https://") for u in (*self.relays, *self.bootstrap)):
            self.credentials.ssl_context()  # a wrong file fails here, in one line
        spec = FilterSpec.parse(filter) if filter is not None else FilterSpec()
        self.filter = spec
        self._active_filter = spec  # a group member's stream has a filter of its own
        # Consumer groups (docs/client.md "Consumer groups"): the partitions of the
        # sources shared by the members, each with its own checkpoint.
        self.group = group
        self.coordinator = coordinator
        self.partitions = partitions
        self.reader_schemas = {
            name_: s if isinstance(s, Schema) else Schema(s)
            for name_, s in (reader_schemas or {}).items()
        }
        self.checkpoint_every = checkpoint_every
        if stop_at_scn is not None:
            if type(stop_at_scn) is not int or stop_at_scn < 0:
                raise ValueError("stop_at_scn is an SCN: an int >= 0")
            if checkpoint_every != 1:
                raise ValueError("stop_at_scn needs checkpoint_every=1")
            if group is not None:
                raise ValueError("stop_at_scn is not for consumer group members")
        self.stop_at_scn = stop_at_scn
        # With stop_at_scn: items after the window that reaches it are cut off
        # (``_submit``); ``_cut_bootstrapping`` follows the bootstrap marks handed on.
        self._cut = False
        self._cut_bootstrapping = False
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
        # Streaming subscriptions where the relay offers them (docs/client.md); False:
        # long polls only.
        self.streaming = streaming
        # Sent with every pull so that relays can list this consumer and its lag
        # (GET /v1/consumers, docs/client.md, "Client id").
        if client_id is None:
            client_id = default_client_id(name, group=group is not None)
        if not 0 < len(client_id) <= MAX_CLIENT_ID:
            raise ValueError(f"client_id must be 1 to {MAX_CLIENT_ID} characters")
        self.client_id = client_id
        if group is not None or coordinator is not None or partitions is not None:
            GroupRun.validate(self, checkpoint_store)
        self.metrics = ClientMetrics()
        self._consumers: list[Consumer] = []
        self._stop_requested = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._segment: Segment | None = None  # the group member's current stream
        self.group_run: GroupRun | None = None

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
        """Run until ``stop()``, SIGINT or SIGTERM (when called in the main thread: one
        log line, then it returns, so the application ends with status 0), or a fatal
        error (raised here)."""
        asyncio.run(self._run_until_signalled())

    async def _run_until_signalled(self) -> None:
        from databus._signals import stop_on_signals

        remove = stop_on_signals(self.stop, f"databus client {self.name}", log)
        try:
            await self.run_async()
        finally:
            remove()

    # -- relay discovery ----------------------------------------------------------------

    async def _start_discovery(self) -> RelayDiscovery | None:
        """With ``zookeeper=``/``cluster=``: connect and read the members (a clear
        ``ZooKeeperUnreachable`` after ``zookeeper_timeout`` seconds, raised by
        ``run``), or None for a client given its relays."""
        if self.zookeeper is None or self.cluster is None:
            return None
        discovery = RelayDiscovery(self.zookeeper, self.cluster,
                                   timeout=self.zookeeper_timeout)
        self.relays = await asyncio.to_thread(discovery.start)
        return discovery

    def _follow_discovery(self, discovery: RelayDiscovery, puller: RelayPuller,
                          loop: asyncio.AbstractEventLoop) -> None:
        """Membership changes reach the puller in its loop; ``self.relays`` shows them."""
        puller.empty_reason = f"the {discovery.where} has no members"

        def changed(urls: list[str]) -> None:  # the discovery thread
            self.relays = urls
            if not loop.is_closed():
                loop.call_soon_threadsafe(puller.set_urls, urls)

        discovery.subscribe(changed)
        # A change between the first read and the subscription is not lost.
        if discovery.urls != puller.urls:
            changed(list(discovery.urls))

    # -- the async core ---------------------------------------------------------------

    async def run_async(self) -> None:
        if not self._consumers:
            raise ValueError("register a Consumer before running the client")
        loop = asyncio.get_running_loop()
        # First, so that an unreachable ZooKeeper stops the client before anything runs.
        discovery = await self._start_discovery()
        try:
            if self.group is not None:
                self.group_run = GroupRun(self, self._start_segment)
                await self.group_run.run(loop, discovery)
            else:
                await self._run_with(loop, discovery)
        finally:
            if discovery is not None:
                await asyncio.to_thread(discovery.close)

    async def _start_segment(self, loop: asyncio.AbstractEventLoop,
                             discovery: RelayDiscovery | None, segment: Segment) -> None:
        """One stream of a group member: its filter, store and fence (``GroupRun``)."""
        self._segment = segment
        try:
            await self._run_with(loop, discovery, segment)
        finally:
            self._segment = None

    def end_segment(self) -> None:
        """End the group member's current stream (thread-safe): the window in progress
        finishes and commits, then ``_run_with`` returns."""
        segment, loop, wake = self._segment, self._loop, self._wake
        if segment is not None:
            segment.over.set()
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def _run_with(self, loop: asyncio.AbstractEventLoop,
                        discovery: RelayDiscovery | None,
                        segment: Segment | None = None) -> None:
        self._loop = loop
        self._wake = asyncio.Event()
        outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        store = segment.store if segment is not None else self.checkpoint_store
        spec = segment.spec if segment is not None else self.filter
        self._active_filter = spec
        stored = await asyncio.to_thread(store.load) if store is not None else None
        if stored is not None and stored.mode is not Mode.ONLINE and not self.bootstrap:
            raise BootstrapError(
                f"the stored checkpoint is in the middle of a bootstrap ({stored.dumps()}): "
                "configure the bootstrap service (DatabusClient(bootstrap=[...])) to finish it"
            )
        committed = checkpoint_scn(stored) if stored is not None else None
        stop_at = self.stop_at_scn
        if stop_at is not None and stored is not None and _reaches(stored, stop_at):
            return  # already there: nothing to read
        self._cut = self._cut_bootstrapping = False
        start = stored or (Checkpoint.flexible() if self.start_from == "earliest"
                           else Checkpoint.latest())
        if segment is None or not self.metrics.started_at:
            self.metrics = ClientMetrics(started_at=time.monotonic())
        # A group member's metrics go on across its streams; its position is the new one's.
        self.metrics.committed_scn = self.metrics.consumer_scn = committed
        writer = CheckpointWriter(store)
        budget = ByteBudget(self.max_buffered_bytes)
        dispatcher = Dispatcher(committed=stored, checkpoint_every=self.checkpoint_every)
        metrics = self.metrics

        def report(outcome: Outcome) -> None:  # runs in the runner thread
            # Per-window news is handled right here; only what the loop must act on
            # crosses threads (a wake-up per window would cost more than the window).
            kind = outcome.kind
            if kind == "window":
                metrics.windows += outcome.windows
                metrics.consumer_scn = outcome.scn
            elif kind == "commit":
                assert outcome.scn is not None and outcome.checkpoint is not None
                metrics.committed_scn = outcome.scn
                metrics.consumer_scn = max(metrics.consumer_scn or 0, outcome.scn)
                # Straight to the writer: a commit must not wait in the loop's queue.
                writer.submit(outcome.checkpoint)
                if stop_at is not None and _reaches(outcome.checkpoint, stop_at):
                    self.stop()  # thread-safe; nothing after this window was handed on
            else:
                # A runner thread may outlive the client's loop by one report (the loop
                # closed while its last batch ran): nothing is waiting for it then.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._on_outcome, outcome, outcomes, budget)

        runner = Runner(self._consumers, dispatcher, report,
                        callback_timeout=self.callback_timeout, parallelism=self.parallelism,
                        fence=segment.fence if segment is not None else None)
        codec = AvroCodec()
        decoder = ResponseDecoder(codec, reader_schemas=self.reader_schemas)
        # Batch consumers take whole windows as the decoder builds them (a group
        # member's segment filters events one by one: not for it).
        decoder.whole_windows = runner.batch_mode and segment is None
        error: BaseException | None = None
        retries = 0
        commits_at_failure = -1
        fenced_scn: int | None = None  # where a fenced group stream rolls back to
        position = start
        filter_json = None if spec.is_empty else spec.to_json_text()
        async with client_session(self.credentials, limit=4) as session:
            pullers = _Pullers(
                RelayPuller(self.relays, self.sources, session, filter_json=filter_json,
                            backoff_initial=self.backoff_initial, backoff_max=self.backoff_max,
                            streaming=self.streaming, allow_empty=discovery is not None),
                BootstrapPuller(self.bootstrap, self.sources, session, filter_json=filter_json,
                                backoff_initial=self.backoff_initial,
                                backoff_max=self.backoff_max) if self.bootstrap else None,
                decoder, codec, runner, budget,
            )
            # The puller keeps the per-source states up to date; the metrics show them.
            metrics.source_states = pullers.relay.source_states
            metrics.quarantined = pullers.relay.quarantined
            pullers.relay.client_id = self.client_id
            if pullers.bootstrap is not None:
                pullers.bootstrap.client_id = self.client_id
            if discovery is not None:
                self._follow_discovery(discovery, pullers.relay, loop)
            gen = runner.start()
            try:
                while not self._stop_requested.is_set() and not (
                        segment is not None and segment.over.is_set()):
                    pull = asyncio.create_task(self._pull(pullers, gen, position))
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
                    metrics.failovers = pullers.relay.failovers
                    if pull in done and isinstance(pull.exception(), _ReplayFromCommitted):
                        # Not a consumer failure: no error, no retry counted.
                        await asyncio.to_thread(runner.abandon)
                        outcome = Outcome("rollback", error=pull.exception())
                    elif pull in done and pull.exception() is not None:
                        error = pull.exception()
                        break
                    elif next_outcome not in done or next_outcome.cancelled():
                        continue  # stop requested
                    else:
                        outcome = next_outcome.result()
                        if outcome.kind == "fenced":
                            # The member's lease ran out (group): the window in progress
                            # is neither finished nor committed; its partitions may be
                            # another member's already. on_rollback comes as the stream
                            # ends (below), once the checkpoint writer is done.
                            await asyncio.to_thread(runner.abandon)
                            fenced_scn, _ = runner.rollback_dispatcher()
                            assert segment is not None
                            segment.fenced = True
                            break
                        if outcome.kind == "fatal":
                            error = outcome.error or DatabusError(
                                "a consumer answered ERROR_FATAL")
                            break
                        if outcome.kind == "writer":
                            error = outcome.error
                            break
                        # A consumer failure: replay from the last committed checkpoint,
                        # within the budget of rollbacks without a commit in between.
                        metrics.errors += 1
                        if dispatcher.commits > commits_at_failure:
                            retries = 0
                        commits_at_failure = dispatcher.commits
                        retries += 1
                        if retries > self.retry_budget:
                            metrics.rollbacks += 1
                            error = RetryBudgetExhausted(
                                f"gave up after {self.retry_budget} rollbacks; last error: "
                                f"{outcome.error}"
                            )
                            error.__cause__ = outcome.error
                            break
                    metrics.rollbacks += 1
                    replay_scn, replay_from = runner.rollback_dispatcher()
                    budget.reset()
                    position = replay_from or start
                    decoder.reset()
                    # (stop_at_scn) the replay is cut afresh; a bootstrap says so again.
                    self._cut = self._cut_bootstrapping = False
                    limited(log).warning("rolling back to %s after: %s (retry %d of %d)",
                                         position.dumps(), outcome.error, retries,
                                         self.retry_budget)
                    await asyncio.sleep(min(self.backoff_max,
                                            self.backoff_initial * 2 ** max(0, retries - 1)))
                    gen = runner.start(rollback_to=replay_scn, announce_rollback=True)
            finally:
                await pullers.relay.close_stream()
                runner.stop()
                # The store belongs to the caller, who closes it; it may be reused.
                await asyncio.to_thread(writer.flush_and_close)
                if segment is not None and error is None:
                    # A group member's stream was fenced, or ended inside a window,
                    # after windows not yet committed, or after windows whose
                    # checkpoints the store could not write (ZooKeeper unreachable):
                    # their events will come again, here or at the partitions' next
                    # owner. Say so first, from the earliest of those.
                    unwritten = segment.store.replay_from()
                    if (segment.fenced or unwritten is not None or dispatcher.in_window
                            or dispatcher.done_scn != dispatcher.committed_scn):
                        last = fenced_scn if segment.fenced else dispatcher.committed_scn
                        known = [scn for scn in (last, unwritten) if scn is not None]
                        runner.call_quietly("on_rollback", min(known, default=-1))
                self._loop = self._wake = None
        if error is not None:
            metrics.errors += 1
            await asyncio.to_thread(runner.call_quietly, "on_error", error)
            raise error

    def _on_outcome(
        self,
        outcome: Outcome,
        outcomes: asyncio.Queue[Outcome],
        budget: ByteBudget,
    ) -> None:
        """Runs on the loop for the runner reports the loop must act on."""
        if outcome.kind == "batch_done":
            budget.release(outcome.nbytes)
        else:
            outcomes.put_nowait(outcome)

    async def _next_failure(
        self, outcomes: asyncio.Queue[Outcome], writer: CheckpointWriter
    ) -> Outcome:
        while True:
            try:
                async with asyncio.timeout(0.2):  # not wait_for: it can lose a cancel
                    return await outcomes.get()
            except TimeoutError:
                if writer.error is not None:
                    return Outcome("writer", error=writer.error)

    async def _watch(self, runner: Runner) -> None:
        interval = min(0.1, self.callback_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            runner.check_timeouts()

    async def _pull(self, p: _Pullers, gen: int, position: Checkpoint) -> None:
        """Relay and bootstrap in turn: a bootstrap ends at an online checkpoint the
        relay serves from, and falling off the relay starts a bootstrap."""
        fell_off = position.mode is not Mode.ONLINE or position.window_scn == FLEXIBLE_SCN
        while True:
            if fell_off and p.bootstrap is not None:
                position = await self._pull_bootstrap(p, p.bootstrap, gen, position)
            position = await self._pull_relay(p, gen, position)
            fell_off = True  # the relay loop returns only then

    async def _pull_relay(self, p: _Pullers, gen: int, position: Checkpoint) -> Checkpoint:
        """Pull from the relays until the position falls off them; then return it
        (whole windows) for a bootstrap, or raise ``FellOffRelay`` if there is none.

        A window split over responses is held by the decoder until its EOW checks out
        (docs/client.md, "Windows split over responses"); its bytes count against the
        buffer. A held window that fills the buffer alone is released unverified, and
        if its check then fails the consumer is rolled back to the last checkpoint."""
        metrics = self.metrics
        puller, decoder, codec, budget = p.relay, p.decoder, p.codec, p.budget
        decoder.reset(at_window_start=position.window_offset < 0)
        decoder.verify_windows = await self._can_verify_windows(puller)
        min_request = 64 * 1024
        want = self.max_request_bytes
        oversize = False  # ``want`` is one event bigger than a request would be
        # Where the window the decoder holds began: asked for again from there when the
        # window's check fails (nothing of it was delivered).
        window_start = position
        warned_spill = False
        while True:
            need = want if oversize else min(min_request, want)
            await budget.wait_for(need, pinned=decoder.held_bytes)
            if budget.free < need and decoder.held_bytes:
                # Only the held window is left in the buffer and it still does not
                # fit: deliver it unverified (progress over holding it forever).
                held = decoder.held_bytes
                log.log(logging.DEBUG if warned_spill else logging.WARNING,
                        "window of SCN %s is larger than the buffer (max_buffered_bytes="
                        "%d): delivering it before its EOW check (logged once)",
                        decoder.window_scn, budget.limit)
                warned_spill = True
                self._submit(p, gen, decoder.release_held(), held, taken=True)
                continue
            # Alone in an empty buffer, one event may be bigger than the buffer.
            max_bytes = max(min(want, budget.free), 1) if budget.free >= need else want
            try:
                batch = await puller.next_batch(position, max_bytes=max_bytes,
                                                wait_ms=self.poll_wait_ms,
                                                stream_bytes=self.max_request_bytes)
            except FellOffRelay as exc:
                if p.bootstrap is None:
                    raise
                if decoder.spilled or window_start.window_offset >= 0:
                    # Part of that window was delivered already: undo it with a
                    # rollback, and bootstrap from the last committed window instead.
                    raise _ReplayFromCommitted(str(exc)) from exc
                # A held window was never delivered: bootstrap from before it.
                budget.release(decoder.held_bytes)
                position = window_start
                limited(log).warning("fell off the relay at SCN %d (its oldest window is %s): "
                                     "bootstrapping", position.window_scn, exc.min_scn)
                return position
            if batch.max_scn is not None:
                metrics.relay_max_scn = batch.max_scn
            if batch.pending_event_size is not None:
                if batch.pending_event_size <= max_bytes:
                    # It would fit in what was asked for: asking again cannot help.
                    await puller.failed(EventFormatError(
                        f"pending event of {batch.pending_event_size} bytes within "
                        f"max_bytes={max_bytes}", reason="bad header"))
                    continue
                # One event larger than the request: ask for exactly that much once.
                want, oversize = batch.pending_event_size, True
                continue
            want, oversize = self.max_request_bytes, False
            metrics.caught_up = not batch.body and budget.used == 0
            if not batch.body:
                position = batch.checkpoint  # checked by the puller: it moves nothing
                continue
            held_before = decoder.held_bytes
            was_in_window = decoder.in_window
            try:
                for fp in decoder.missing_fingerprints(batch.body, batch.scan):
                    try:
                        codec.add(await puller.schema(fp))
                    except UnknownSchemaError as exc:  # a fingerprint no relay knows
                        raise EventFormatError(str(exc), reason="unknown schema") from exc
                items = decoder.decode(batch.body, batch.source_names, batch.scan)
            except EventFormatError as exc:
                limited(log).warning("relay %s sent a bad body (%s); asking again", batch.relay,
                                     exc, kind=batch.relay)
                await puller.failed(exc)
                if exc.reason in WINDOW_FAILURES and decoder.verify_windows:
                    # The buffer may have gained a source since the checks were turned
                    # on (a table created under a tables=db.* pattern): its events are
                    # filtered out of our windows but counted by their EOWs. Decide
                    # again on the next relay's fresh catalog; a genuinely bad window
                    # still fails there.
                    decoder.verify_windows = await self._can_verify_windows(puller)
                if exc.reason in WINDOW_FAILURES and decoder.in_window:
                    # The window's earlier part, from an earlier response, may be the
                    # bad one: ask for the whole window again, from its start.
                    if decoder.spilled or window_start.window_offset >= 0:
                        raise _ReplayFromCommitted(
                            f"window {position.window_scn} failed its check: {exc}") from exc
                    budget.release(decoder.held_bytes)
                    decoder.discard_window()
                    position = window_start
                continue
            nbytes = len(batch.body)
            budget.take(nbytes)
            # What the decoder holds stays counted until it is handed over.
            handed = nbytes + held_before - decoder.held_bytes
            if items or handed:
                self._submit(p, gen, items, handed, taken=True)
            if not decoder.in_window:
                window_start = batch.checkpoint
            elif not was_in_window:
                ends = [i.scn for i in items if isinstance(i, EndOfWindow)]
                if ends:
                    window_start = Checkpoint(ends[-1])
            position = batch.checkpoint

    async def _pull_bootstrap(
        self, p: _Pullers, puller: BootstrapPuller, gen: int, position: Checkpoint
    ) -> Checkpoint:
        """One bootstrap conversation, from ``position`` (online: a snapshot or delta
        since it; bootstrap: resumed) to the online checkpoint it ends at."""
        metrics = self.metrics
        decoder, codec = p.decoder, p.codec
        metrics.bootstraps += 1
        metrics.bootstrapping = True
        metrics.caught_up = False
        log.info("bootstrapping from %s", position.dumps())
        # A source the relays do not have is a mistake to report now; one only the
        # bootstrap store lacks is waited for (the puller retries).
        await p.relay.catalog()
        decoder.reset()
        p.runner.submit([BootstrapMark(end=False)], gen, 0)
        self._cut_bootstrapping = True  # (stop_at_scn) its windows' SCNs are not positions
        want = self.max_request_bytes
        waiting_for: str | None = None  # the store-behind reason last logged
        while True:
            await p.budget.wait_for(min(64 * 1024, want))
            batch = await puller.fetch(position, max_bytes=max(min(want, p.budget.free), 1))
            if batch.pending_event_size is not None:
                want = batch.pending_event_size
                continue
            want = self.max_request_bytes
            done = batch.phase == "done"
            if not decoder.in_window:
                decoder.framing = (Framing.CATCHUP if _only_catchup(position, batch.checkpoint)
                                   else Framing.SNAPSHOT)
            items: list[Item] = []
            try:
                if batch.body:
                    for fp in decoder.missing_fingerprints(batch.body):
                        try:
                            codec.add(await puller.schema(fp))
                        except UnknownSchemaError as exc:  # a fingerprint no server knows
                            raise EventFormatError(str(exc), reason="unknown schema") from exc
                    items = decoder.decode(batch.body, batch.source_names)
            except EventFormatError as exc:
                limited(log).warning("bootstrap service %s sent a bad body (%s); asking again",
                                     batch.server, exc, kind=batch.server)
                await puller.failed(exc)
                continue
            if done and decoder.in_window:
                raise BootstrapError(f"bootstrap service {batch.server} ended the bootstrap "
                                     "inside a window (no EOW after its last events)")
            checkpoint = batch.checkpoint
            if not decoder.in_window:
                # The response's checkpoint is committed after its last window; an
                # answer without one still moves the committed checkpoint on.
                if items and isinstance(items[-1], EndOfWindow):
                    items[-1].checkpoint = checkpoint
                elif checkpoint != position or done:
                    scn = checkpoint_scn(checkpoint)
                    if scn is not None:
                        items.append(EndOfWindow(scn, 0, 0, checkpoint))
            if done:
                items.append(BootstrapMark(end=True))
                metrics.bootstrapping = False
                metrics.bootstrap_phase = None
            else:
                metrics.bootstrap_phase = batch.phase
            if items:
                self._submit(p, gen, items, len(batch.body))
            if checkpoint == position and not done and not batch.body:
                if batch.waiting is not None and batch.waiting != waiting_for:
                    log.warning("bootstrap service %s: %s; waiting for it", batch.server,
                                batch.waiting)
                waiting_for = batch.waiting
                await asyncio.sleep(self.backoff_initial)  # nothing yet: do not spin
            position = checkpoint
            if done:
                log.info("bootstrap done at %s; back to the relay", position.dumps())
                return position

    def _submit(self, p: _Pullers, gen: int, items: list[Item], nbytes: int,
                *, taken: bool = False) -> None:
        """Hand ``items`` to the runner; ``nbytes`` are released once dispatched
        (``taken``: already counted in the buffer)."""
        segment = self._segment
        if segment is not None and segment.skip:
            items = segment.skip_items(items)
        if self.stop_at_scn is not None:
            if self._cut:  # past the stop: handed on to nobody
                if taken:
                    p.budget.release(nbytes)
                return
            items, self._cut, self._cut_bootstrapping = _cut_at(
                items, self.stop_at_scn, self._cut_bootstrapping)
        metrics = self.metrics
        kinds = list(map(type, items))
        metrics.events += operator.countOf(kinds, DataEvent)  # C speed
        if Window in kinds:  # whole windows from the decoder (batch consumers)
            metrics.events += sum(len(i.events) for i in cast(list[Any], items)
                                  if type(i) is Window)
        for item in reversed(items):
            if isinstance(item, EndOfWindow) and item.timestamp_ns:
                metrics.last_window_timestamp_ns = item.timestamp_ns
                break
        if not taken:
            p.budget.take(nbytes)
        p.runner.submit(items, gen, nbytes)

    async def _can_verify_windows(self, puller: RelayPuller) -> bool:
        """Window checksums can be checked only when every event of a window arrives:
        no filter, and every source of the buffer subscribed."""
        if not self._active_filter.is_empty:
            return False
        return await puller.sees_whole_windows(self.sources)

    # -- iterator style -------------------------------------------------------------

    async def windows(self) -> AsyncIterator[Window]:
        """Yield whole windows; a window's checkpoint is committed once the loop body
        that received it has finished (windows are handed over a response's worth at a
        time, and committed when the bodies of that batch have finished).

        Leave the loop early only inside ``contextlib.aclosing(client.windows())``: an
        abandoned async generator is closed (and the client stopped, its checkpoint
        flushed) only when it is garbage collected."""
        handoff: asyncio.Queue[list[Window] | None] = asyncio.Queue(maxsize=1)
        loop = asyncio.get_running_loop()
        collector = WindowCollector(loop, handoff)
        self.register(collector)
        task = asyncio.create_task(self.run_async())
        task.add_done_callback(lambda _: handoff.put_nowait(None)
                               if handoff.empty() else None)
        finished = 0
        try:
            while True:
                windows = await handoff.get()
                if windows is None:
                    break
                finished = 0
                for window in windows:
                    yield window
                    finished += 1
                collector.release(finished)
                finished = 0
        finally:
            self.stop()
            collector.release(finished)
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._consumers.remove(collector)


def _reaches(checkpoint: Checkpoint, stop_at: int) -> bool:
    """Whether ``checkpoint`` stands after a whole window at or past ``stop_at``."""
    return (checkpoint.mode is Mode.ONLINE and checkpoint.window_offset < 0
            and checkpoint.window_scn >= stop_at)


def _cut_at(items: list[Item], stop_at: int, bootstrapping: bool
            ) -> tuple[list[Item], bool, bool]:
    """``items`` up to the end of the window whose checkpoint reaches ``stop_at`` (and
    the bootstrap's end mark right after it); whether it was there; whether the items
    handed on leave a bootstrap open. A bootstrap window's end counts only with the
    checkpoint it carries (its SCN alone is the snapshot's, not a position)."""
    for i, item in enumerate(items):
        if isinstance(item, BootstrapMark):
            bootstrapping = not item.end
        elif isinstance(item, EndOfWindow):
            checkpoint = item.checkpoint
            if checkpoint is None:
                if bootstrapping:
                    continue
                checkpoint = Checkpoint(item.scn)
            if _reaches(checkpoint, stop_at):
                end = i + 1
                while end < len(items) and isinstance(items[end], BootstrapMark):
                    bootstrapping = not cast(BootstrapMark, items[end]).end
                    end += 1
                return items[:end], True, bootstrapping
    return items, False, bootstrapping


def _only_catchup(sent: Checkpoint, got: Checkpoint) -> bool:
    """True when a bootstrap response can hold only catch-up windows: it began and
    ended in the catch-up of the same sources. A response may cross phases (the end of
    one source's catch-up, the next source's snapshot), and snapshot framing frames
    catch-up windows right too, so it is the one used whenever in doubt."""
    return (sent.mode is Mode.BOOTSTRAP_CATCHUP and got.mode is Mode.BOOTSTRAP_CATCHUP
            and sent.bootstrap_source_index == got.bootstrap_source_index
            and sent.bootstrap_start_scn == got.bootstrap_start_scn)
