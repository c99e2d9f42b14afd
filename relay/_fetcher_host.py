"""The fetcher host: runs one fetcher per buffer in a thread, restarts it when it fails.

For each configured buffer the host resolves the fetcher class by the source URI's
scheme (``fetcher_class``, entry point group ``databus.fetchers``) and runs it in a
daemon thread with the buffer as its ``WindowSink``. Every (re)start resumes after the
buffer's max SCN, or after its ``prev_scn`` when it is empty but has started; a buffer
that never started asks the fetcher for ``initial_scn()`` and, if it names one, calls
``buffer.start_after`` with it so that older checkpoints get ``scn_not_found``.

When ``run`` raises, the host logs the error (the source URI redacted, the source's
password and secret query values scrubbed from the message; a traceback only for
exceptions that are not ``DatabusError``, which may be bugs), rolls back the window the fetcher
left open and starts a fresh fetcher instance after a retry delay (``Backoff``): 0.1 s
doubling to 5 s, back to 0.1 s after an attempt that wrote a window or stayed up for
``healthy_after`` seconds. In a cluster (relay/cluster) a role change ends the attempt
or the delay being waited out at once and starts the delays over, and an attempt that
ended in a condition of the role's normal life (a leader fenced after a pause, a leader
to follow that is gone) is no failure: the member asks the cluster again shortly. A
``DatabusError`` that says it is not retriable (a config error, a window larger than
the buffer, a fetcher writing SCNs backwards) cannot heal by retrying: the fetcher is
then marked ``failed`` and left stopped. A ``run`` that returns although ``stop`` was
not set is restarted like a failure.

Each attempt gets a new fetcher instance and ``close()`` runs after each ``run``, so a
fetcher never sees a half-torn-down connection from its previous attempt. Fetcher
construction errors at ``start()`` (unknown scheme, bad parameters) are raised to the
caller: a relay with a bad config must not come up.

Plain threads and a lock, no asyncio: the HTTP server calls ``status()`` from its event
loop and it only copies a few fields.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from databus._limited_log import limited
from databus._redact import redact, register_uri
from databus.config import RelayConfig, redact_uri
from databus.errors import ConfigError, DatabusError, SourceGapError, SourceMisconfiguredError
from databus.fetchers._api import (
    ConfiguredSources,
    Fetcher,
    FetcherContext,
    WindowSink,
    fetcher_class,
)
from databus.relay._buffer import BufferState, EventBuffer
from databus.relay._catalog import RelayCatalog
from databus.relay.dumps import DumpPort, DumpSink
from databus.relay.quarantine._host import BufferQuarantine
from databus.relay.quarantine._record import QUARANTINE_FILENAME, QuarantineMarker, QuarantineStore
from databus.relay.quarantine._sink import QuarantineSink

if TYPE_CHECKING:
    from databus.relay.cluster import Assignment, Seat

__all__ = ["Backoff", "FetcherHost", "FetcherState", "FetcherStatus", "configured_buffer",
           "fetcher_lag", "resume_point"]

log = logging.getLogger("databus.relay.fetchers")

# A name of FetcherContext.report_details: also the end of a metric name.
_DETAIL_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")

# "standby": a cluster member's buffer with nothing to read for now (no leader known,
# or its own lease as leader ran out: relay/cluster).
FetcherState = Literal["starting", "running", "backoff", "standby", "stopped", "failed"]

# How long a cluster member waits before asking its assignment again after an attempt
# that ended in an expected condition (its lease ran out, its leader is gone); a role
# change cuts it short.
_EXPECTED_RETRY_S = 0.25
# A retry's attempt is "starting" (not ready) until it reads (``_confirm``: a window, or
# a second report of the source's position) or has run this long without failing: a
# source that refuses, drops or black-holes every try is not shown "running" while a
# try is under way. The bound keeps a fetcher that reports nothing on an idle source
# from staying "starting" for ever.
UNCONFIRMED_S = 5.0

# Lag in seconds (DESIGN 17): how long after a window a fetcher that never said when it
# will report again (``FetcherContext.report_read_through``) is still believed; after
# that much silence its lag is unknown.
_DEFAULT_SILENCE_S = 5.0



# -- pure pieces ----------------------------------------------------------------------


def configured_buffer(configured: Mapping[str, ConfiguredSources | None],
                      source: str) -> str | None:
    """The buffer whose ``configured`` sources name ``source`` exactly, else the one
    whose patterns match it, else None; ``ConfigError`` when several patterns match."""
    exact = [n for n, c in configured.items() if c is not None and source in c.names]
    if exact:
        return exact[0]
    matching = [n for n, c in configured.items() if c is not None and c.matches(source)]
    if len(matching) > 1:
        raise ConfigError(f"source {source!r} matches the tables of several buffers "
                          f"({', '.join(matching)}); name it in one buffer's tables=")
    return matching[0] if matching else None


def resume_point(state: BufferState) -> int | None:
    """The SCN a fetcher resumes after, or None when the buffer never started.

    A fresh ``EventBuffer`` has ``prev_scn`` -1 and no windows; source SCNs are never
    negative, so a negative ``prev_scn`` means "not started".
    """
    if state.max_scn is not None:
        return state.max_scn
    return state.prev_scn if state.prev_scn >= 0 else None


class Backoff:
    """Retry delays (pure): ``initial`` doubling up to ``maximum``, counted from the
    last success.

    ``failed(ran_for, progressed)`` returns the delay before the next attempt. An
    attempt that made progress (a window landed) or lasted ``healthy_after`` seconds
    was a success: the delays start over at ``initial``, so a source that restarts
    again and again is read again within ``initial`` after each restart instead of
    within an ever longer delay. ``reset()`` starts over too: a role change in a
    cluster, after which the previous role's failures say nothing.
    """

    def __init__(self, initial: float, maximum: float, healthy_after: float) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {initial}, {maximum}")
        self.initial = initial
        self.maximum = maximum
        self.healthy_after = healthy_after
        self._next = initial

    def reset(self) -> None:
        self._next = self.initial

    def failed(self, ran_for: float, progressed: bool = False) -> float:
        if progressed or ran_for >= self.healthy_after:
            self._next = self.initial
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay


def fetcher_lag(state: FetcherState, read_through_ns: int | None, heard_until: float,
                *, now: float, monotonic: float) -> float | None:
    """A fetcher's lag in seconds (DESIGN 17, pure): ``now`` (unix seconds) minus the
    source time it has read through, never below 0; None (unknown, never 0) unless it
    is running, has read through some time in this attempt, and was heard from (a
    window or a ``report_read_through``) within the silence it announced."""
    if state != "running" or read_through_ns is None or monotonic > heard_until:
        return None
    return round(max(0.0, now - read_through_ns / 1e9), 3)


def _seat(assignment: Assignment) -> tuple[str, str, int]:
    """What a role change changes: the role, what it reads, and a leader's term (a
    follower's epoch moves with what it copies)."""
    return (assignment.role, assignment.uri,
            assignment.epoch if assignment.role == "leader" else 0)


def _ignore(*_: object) -> None:
    """No quarantine store (a host built without one): markers are nobody's business."""


# -- status ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetcherStatus:
    """What ``/v1/status`` shows about one buffer's fetcher."""

    buffer: str
    source: str  # the URI, redacted
    state: FetcherState
    restarts: int
    last_error: str | None  # "<ExceptionType>: message", secrets scrubbed
    last_error_at: float | None  # time.time() of the last error
    source_scn: int | None  # the newest SCN the source reported having
    buffer_max_scn: int | None
    lag_scn: int  # source_scn - buffer_max_scn, 0 when caught up or unknown
    last_window_at: float | None  # time.time() of the last window this host wrote
    source_gaps: int = 0  # purged resume points skipped with on_source_gap = "dump"
    details: dict[str, Any] = field(default_factory=dict)  # the fetcher's own report
    # Lag in seconds (DESIGN 17, ``fetcher_lag``): now minus the source time the fetcher
    # has read through; None (unknown) while it is not running or has been silent.
    lag_seconds: float | None = None
    read_through: float | None = None  # that source time (unix seconds), this attempt

    def to_json(self) -> dict[str, Any]:
        return {
            "buffer": self.buffer,
            "source": self.source,
            "state": self.state,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "source_scn": self.source_scn,
            "buffer_max_scn": self.buffer_max_scn,
            "lag_scn": self.lag_scn,
            "lag_seconds": self.lag_seconds,
            "read_through": self.read_through,
            "last_window_at": self.last_window_at,
            "source_gaps": self.source_gaps,
            "details": self.details,
        }


# -- one buffer's runner --------------------------------------------------------------


class _Runner:
    """Runs, watches and restarts the fetcher of one buffer (its own thread)."""

    def __init__(
        self,
        name: str,
        uri: str,
        cls: type[Fetcher],
        buffer: EventBuffer,
        catalog: RelayCatalog,
        stop: threading.Event,
        backoff: Backoff,
        on_source_gap: Callable[[str], None] | None = None,
        quarantines: QuarantineStore | None = None,
        on_source_error: str = "quarantine",
    ) -> None:
        self.name = name
        # Called (with the buffer name) after a purged resume point was skipped over.
        self.on_source_gap = on_source_gap
        self.gaps = 0  # source gaps skipped (on_source_gap = "dump")
        self.uri = uri
        self.cls = cls
        self.buffer = buffer
        self.catalog = catalog
        self.stop = stop
        self.backoff = backoff
        register_uri(uri)  # its password is cut out of every message from now on
        # The buffer behind the dump engine's watermark step (relay.dumps).
        self.sink = DumpSink(buffer, buffer.partition_id, on_window=self._window_landed)
        # Per-source failure isolation (DESIGN 17, relay/quarantine/_record.py): what the
        # fetcher writes to, in front of the dump step.
        self.quarantine = BufferQuarantine(
            name, quarantines, on_source_error, self.sink, buffer.partition_id,
            catalog=lambda: catalog.for_buffer(name, buffer.partition_id),
            configured=lambda: self.configured) if quarantines is not None else None
        self.qsink = (self.quarantine.sink if self.quarantine is not None else
                      QuarantineSink(self.sink, buffer.partition_id,
                                     dropped_ids=frozenset, on_marked=_ignore,
                                     on_upstream=_ignore))
        self.restart_requested = False  # restart(): end the attempt, start a new one
        self.attempts = 0  # attempts started (a heal waits for the one after its lift)
        self.last_window_at: float | None = None
        self.lock = threading.Lock()
        self.state: FetcherState = "starting"
        self.restarts = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        # Written by the fetcher thread, read by status(): a single int, atomic.
        self.source_scn: int | None = None
        # Lag in seconds (fetcher_lag): what this attempt has read through (source time,
        # ns), until when (monotonic) that is believed, and how long a report holds.
        self.read_through_ns: int | None = None
        self.heard_until = 0.0
        self.silence_s = _DEFAULT_SILENCE_S
        self.details: dict[str, Any] = {}  # FetcherContext.report_details, replaced whole
        self.unlisted: frozenset[str] = frozenset()  # FetcherContext.report_unlisted
        self.fetcher: Fetcher | None = None
        # What its configuration names (set by FetcherHost.start; None: it cannot say).
        self.configured: ConfiguredSources | None = None
        self.memory: dict[str, Any] = {}  # FetcherContext.memory, the same for every attempt
        # The first instance is built by start(), so config errors reach the caller.
        self.first: Fetcher | None = self.new_fetcher()
        self.thread = threading.Thread(
            target=self.loop, name=f"databus-fetcher-{name}", daemon=True
        )
        # Cluster members (relay/cluster): what to read now, asked before each attempt
        # (None: nothing yet), and the event that ends an attempt when that changes.
        self.assignments: Callable[[], Assignment | None] | None = None
        self.resolve: Callable[[str], type[Fetcher]] = fetcher_class
        self.attempt_stop = threading.Event()
        # Set by reassign (another thread), taken by the loop: start the delays over.
        self.role_changed = False
        self.windows_landed = 0  # windows the fetcher wrote (this thread's attempts)
        # Retrying after a misconfiguration: "failed" until a try reads (``_confirm``).
        self.fixing = False
        # Retrying after any other failure: "starting" until a try reads (``_confirm``)
        # or has lasted UNCONFIRMED_S (``_settle``).
        self.retrying = False
        self.attempt_started = 0.0
        self.attempt_reports = 0  # source positions and details reported this try
        self.expected_streak = 0  # attempts in a row that ended in an expected condition

    def reassign(self) -> None:
        """The assignment changed: end the current attempt, or the retry delay being
        waited out (a promotion reads the source at once); the loop asks again, with
        the delays started over."""
        self.role_changed = True
        self.attempt_stop.set()

    def new_fetcher(self, uri: str | None = None, cls: type[Fetcher] | None = None) -> Fetcher:
        context = FetcherContext(
            buffer_name=self.name,
            partition_id=self.buffer.partition_id,
            catalog=self.catalog.for_buffer(self.name, self.buffer.partition_id),
            report_source_scn=self.report_source_scn,
            report_read_through=self.report_read_through,
            memory=self.memory,
            report_details=self.report_details,
            flush_buffer=self.buffer.flush,
            report_unlisted=self.report_unlisted,
        )
        if self.quarantine is not None:
            self.quarantine.attach(context)
        return (cls or self.cls)(uri or self.uri, context)

    def restart(self) -> int:
        """End the running attempt and start a new fetcher instance at once (after a
        heal: it reloads what it caches, a table's schema included). Returns the number
        of attempts started before; ``attempts`` goes past it when the new one runs."""
        before = self.attempts
        self.restart_requested = True
        self.attempt_stop.set()
        return before

    def report_source_scn(self, scn: int) -> None:
        self.source_scn = scn
        self._reported()

    def report_read_through(self, time_ns: int, next_within_s: float) -> None:
        """``FetcherContext.report_read_through`` (the fetcher's thread)."""
        self.silence_s = max(0.1, float(next_within_s))
        self._heard(int(time_ns))

    def _heard(self, time_ns: int | None) -> None:
        if time_ns is not None and time_ns > 0 and (
                self.read_through_ns is None or time_ns > self.read_through_ns):
            self.read_through_ns = time_ns
        self.heard_until = time.monotonic() + self.silence_s

    def _forget_read_through(self) -> None:
        """A new attempt (or a failed one): nothing is known of the source until it
        speaks again."""
        self.read_through_ns = None
        self.heard_until = 0.0
        self.silence_s = _DEFAULT_SILENCE_S

    def report_unlisted(self, databases: frozenset[str]) -> None:
        """``FetcherContext.report_unlisted`` (the fetcher's thread)."""
        self.unlisted = frozenset(databases)

    def report_details(self, details: dict[str, Any]) -> None:
        self.details = {k: v for k, v in details.items()
                        if isinstance(k, str) and _DETAIL_NAME.fullmatch(k)}
        self._reported()

    def _reported(self) -> None:
        # The first report of a try may come before it reads (a binlog fetcher reports
        # the server's position, then asks for the binlog): the second one is reading.
        self.attempt_reports += 1
        if self.attempt_reports >= 2:
            self._confirm()

    def _window_landed(self) -> None:
        self.last_window_at = time.time()
        if threading.current_thread() is self.thread:
            # The fetcher's own (a dump writes chunks through the same sink, from the
            # dump engine's thread: no sign that the fetcher is healthy).
            self.windows_landed += 1
            self._heard(self.buffer.last_window_timestamp_ns)
            self._confirm()

    def _confirm(self) -> None:
        """A fetcher retried after a failure reads its source again (it lands a window
        or reports the source's position): it is "running" from now on."""
        if (self.fixing or self.retrying) and threading.current_thread() is self.thread:
            with self.lock:
                if (self.fixing and self.state == "failed") or (
                        self.retrying and self.state == "starting"):
                    self.state = "running"
                self.fixing = self.retrying = False

    def _settle(self) -> None:
        """(Under ``lock``.) A retry's attempt that has lasted UNCONFIRMED_S without
        failing is "running", though it reported nothing (an idle source)."""
        if (self.retrying and self.state == "starting"
                and time.monotonic() - self.attempt_started >= UNCONFIRMED_S):
            self.state = "running"
            self.retrying = False

    def get_state(self) -> FetcherState:
        with self.lock:
            self._settle()
            return self.state

    def set_state(self, state: FetcherState) -> None:
        with self.lock:
            self.state = state

    def loop(self) -> None:
        try:
            self._loop()
        except BaseException:
            # A bug in the host itself: say so rather than leave a stale "running".
            log.error("fetcher host thread of buffer %s died: %s", self.name,
                      redact(traceback.format_exc().rstrip()))
            self.set_state("failed")
            raise

    def _loop(self) -> None:
        while not self.stop.is_set():
            if self.role_changed:
                self.role_changed = False
                self.backoff.reset()
                self.expected_streak = 0
            started = time.monotonic()
            landed = self.windows_landed
            error: BaseException | None = None
            fetcher: Fetcher | None = None
            sink: WindowSink = self.qsink
            if self.assignments is not None:
                self.attempt_stop.clear()
                assignment = self.assignments()
                if assignment is None:
                    self.set_state("standby")
                    self.attempt_stop.wait(0.1)
                    continue
            else:
                assignment = None
            try:
                fetcher, self.first = self.first, None
                # A cluster follower copies the leader's markers and writes none.
                self.qsink.own_markers = assignment is None or assignment.role != "follower"
                if assignment is not None:
                    if fetcher is not None:
                        fetcher.close()  # built for the config checks only
                    fetcher = self.new_fetcher(assignment.uri, self.resolve(assignment.uri))
                    assignment.prepare()
                    sink = assignment.wrap(self.qsink)
                elif fetcher is None:
                    fetcher = self.new_fetcher()
                with self.lock:
                    self.fetcher = fetcher
                self._forget_read_through()
                after = resume_point(self.buffer.state())
                gap_after = self.memory.get("gap_resume_after")
                if gap_after is not None and (after is None or gap_after > after):
                    after = gap_after  # past a source gap, before any window after it
                if after is None:
                    after = fetcher.initial_scn()
                    if after is not None:
                        self.buffer.start_after(after)
                self.attempt_reports = 0
                with self.lock:
                    self.attempt_started = time.monotonic()
                    if self.fixing:
                        pass  # "failed" until it reads (``_confirm``)
                    elif self.retrying:
                        self.state = "starting"  # until it reads (``_confirm``, ``_settle``)
                    else:
                        self.state = "running"
                self.attempts += 1
                fetcher.run(sink, after, self.attempt_stop)
            except Exception as exc:
                error = exc
            finally:
                self._forget_read_through()
                # The fetcher may have died mid-window: those bytes were never published.
                self.buffer.rollback()
                if fetcher is not None:
                    self.close(fetcher)
            if self.stop.is_set():
                break
            if self.restart_requested:
                self.restart_requested = False
                if self.assignments is None:
                    self.attempt_stop.clear()
                    if self.stop.is_set():
                        break
                log.info("buffer %s: fetcher restarted (a source was healed)", self.name)
                continue
            if self.assignments is not None and self.attempt_stop.is_set():
                continue  # reassigned (relay/cluster): not a failure
            if error is None:
                error = RuntimeError("run() returned before the host asked it to stop")
            if (isinstance(error, SourceGapError) and self.on_source_gap is not None
                    and self.skip_gap(error)):
                continue
            progressed = self.windows_landed != landed
            if assignment is not None and self.expected(error, assignment):
                continue
            self.expected_streak = 0
            if not self.failed(error, time.monotonic() - started, progressed,
                               None if assignment is None else assignment.uri):
                return
        self.set_state("stopped")

    def expected(self, error: BaseException, assignment: Assignment) -> bool:
        """A cluster member's attempt that ended in a condition of its role's normal
        life (fenced after a pause, a leader that is gone), or whose assignment changed
        meanwhile: not a failure. Wait a moment (cut short by a role change) and ask
        the assignment again, the delays not grown."""
        now = self.assignments() if self.assignments is not None else None
        changed = now is None or _seat(now) != _seat(assignment)
        if not changed and not isinstance(error, assignment.expected):
            return False
        message = redact(f"{type(error).__name__}: {error}")
        with self.lock:
            self.last_error = message
            self.last_error_at = time.time()
            self.state = "standby"
        self.expected_streak += 1
        (log.info if self.expected_streak == 1 else log.debug)(
            "buffer %s: %s %s (%s); asking the cluster again", self.name,
            assignment.role, "role changed" if changed else "waits", message)
        self.attempt_stop.wait(_EXPECTED_RETRY_S)
        return True

    def failed(self, error: BaseException, ran_for: float, progressed: bool = False,
               uri: str | None = None) -> bool:
        """Record and log ``error``; wait out the backoff (cut short by a role change
        or a stop). False: give up for good."""
        message = redact(f"{type(error).__name__}: {error}")
        expected = isinstance(error, DatabusError)
        retriable = error.retriable if isinstance(error, DatabusError) else True
        # Our own errors explain themselves; anything else may be a bug: show where.
        detail = message if expected else redact(
            "".join(traceback.format_exception(error)).rstrip()
        )
        # A source misconfigured (its settings, the user's grants or password, a slot
        # or publication missing) cannot recover by retrying alone, so the fetcher is
        # "failed" (not ready, the fix is the operator's); but the fix is made at the
        # source while the relay runs, so the host keeps trying, at the backoff's pace,
        # and the fetcher stays "failed" until a try reads again (``_confirm``).
        fixable = isinstance(error, SourceMisconfiguredError) and not progressed
        with self.lock:
            self.last_error = message
            self.last_error_at = time.time()
            self.state = "backoff" if retriable else "failed"
            self.fixing = fixable
            self.retrying = retriable and not fixable
        source = redact_uri(uri or self.uri)
        if fixable:
            delay = self.backoff.failed(ran_for, progressed)
            limited(log).error("fetcher of buffer %s (%s) failed: %s; fix it at the source: "
                               "trying again every %.0f s meanwhile", self.name, source,
                               detail, delay, kind=f"{self.name} {source} misconfigured")
            if self.attempt_stop.wait(delay):
                return True
            with self.lock:
                self.restarts += 1
            return True
        if not retriable:
            log.error("fetcher of buffer %s (%s) failed and cannot recover by retrying; "
                      "fix the cause and restart the relay: %s", self.name, source, detail)
            return False
        delay = self.backoff.failed(ran_for, progressed)
        # One kind per buffer and what it reads: a role change (another source, another
        # leader) is a new condition, whose first failure is logged at once.
        limited(log).error("fetcher of buffer %s (%s) failed, restarting in %.2f s: %s",
                           self.name, source, delay, detail, kind=f"{self.name} {source}")
        # stop() sets attempt_stop too; so does a role change (reassign).
        if self.attempt_stop.wait(delay):
            return True  # the loop sees stop, or asks for its new assignment
        with self.lock:
            self.restarts += 1
            self.state = "starting"
            self.attempt_started = time.monotonic()
        return True

    def skip_gap(self, error: SourceGapError) -> bool:
        """``on_source_gap = "dump"``: resume at the source's current position and have
        every table dumped (the relay's callback). False when that fails too."""
        fetcher = self.new_fetcher()
        try:
            position = fetcher.initial_scn()
        except Exception as exc:
            log.error("buffer %s: source gap, and its current position cannot be read: %s",
                      self.name, redact(f"{type(exc).__name__}: {exc}"))
            return False
        finally:
            try:
                fetcher.close()
            except Exception as exc:
                log.debug("closing a fetcher: %s", exc)
        if position is None:
            return False
        log.warning("buffer %s: %s; on_source_gap = \"dump\": resuming at the source's "
                    "current position (SCN %d) and dumping every table. Consumers get the "
                    "tables' state from the dump; changes inside the gap are not replayed "
                    "(a row deleted there stays with consumers)", self.name,
                    redact(str(error)), position)
        with self.lock:
            self.last_error = redact(f"{type(error).__name__}: {error}")
            self.last_error_at = time.time()
            self.gaps += 1
        self.memory["gap_resume_after"] = position
        assert self.on_source_gap is not None
        self.on_source_gap(self.name)
        return True

    def close(self, fetcher: Fetcher) -> None:
        """``fetcher.close()`` once, whoever calls first (the runner, or stop())."""
        with self.lock:
            if fetcher is not self.fetcher:
                return
            self.fetcher = None
        try:
            fetcher.close()
        except Exception as exc:
            limited(log).warning("closing the fetcher of buffer %s: %s", self.name,
                                 redact(f"{type(exc).__name__}: {exc}"), kind=self.name)

    def status(self) -> FetcherStatus:
        buffer_state = self.buffer.state()
        source_scn = self.source_scn
        with self.lock:
            self._settle()
            state, restarts = self.state, self.restarts
            last_error, last_error_at = self.last_error, self.last_error_at
        # Against the resume point, so an empty buffer that started after the source's
        # position at the time is not shown "behind" by the whole SCN range.
        have = resume_point(buffer_state)
        lag = 0 if source_scn is None or have is None else max(0, source_scn - have)
        read_through = self.read_through_ns
        seconds = fetcher_lag(state, read_through, self.heard_until,
                              now=time.time(), monotonic=time.monotonic())
        return FetcherStatus(
            buffer=self.name,
            source=redact_uri(self.uri),
            state=state,
            restarts=restarts,
            last_error=last_error,
            last_error_at=last_error_at,
            source_scn=source_scn,
            buffer_max_scn=buffer_state.max_scn,
            lag_scn=lag,
            last_window_at=self.last_window_at,
            source_gaps=self.gaps,
            details=dict(self.details),
            lag_seconds=seconds,
            read_through=None if read_through is None else read_through / 1e9,
        )


# -- the host -------------------------------------------------------------------------


class FetcherHost:
    """Runs the fetcher of every configured buffer; see the module docstring.

    ``buffers`` maps every configured buffer name to its open ``EventBuffer`` (the
    partition id a fetcher gets is the buffer's). ``healthy_after`` is how long a run
    must last for the backoff to start over. ``resolve`` maps a source URI to a fetcher
    class (default: ``fetcher_class``, by entry point); tests pass their own.
    """

    def __init__(
        self,
        config: RelayConfig,
        buffers: Mapping[str, EventBuffer],
        catalog: RelayCatalog,
        *,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        healthy_after: float = 60.0,
        resolve: Callable[[str], type[Fetcher]] | None = None,
        quarantines: QuarantineStore | None = None,
    ) -> None:
        missing = [b.name for b in config.buffers if b.name not in buffers]
        if missing:
            raise ConfigError(f"no event buffer for configured buffer(s) {', '.join(missing)}")
        # Validated now rather than in a thread, where it would only be logged.
        Backoff(backoff_initial, backoff_max, healthy_after)
        self.config = config
        self.buffers = buffers
        self.catalog = catalog
        # Quarantined sources (DESIGN 17): the relay's store, else one in the data dir.
        self.quarantines = quarantines if quarantines is not None else QuarantineStore(
            config.data_dir / QUARANTINE_FILENAME)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.healthy_after = healthy_after
        # Looked up at call time so tests may monkeypatch the module's fetcher_class.
        self._resolve = resolve
        self._stop = threading.Event()
        self._runners: dict[str, _Runner] = {}
        self._started = False
        # Set by the relay in a leader-follower cluster (relay/cluster): per buffer, what
        # its fetcher reads now, and where to say that it changed.
        self.seats: Mapping[str, Seat] = {}
        # Set by the relay: queue a dump of every table of a buffer past a source gap.
        self.dump_after_gap: Callable[[str], None] | None = None

    def _source_gap(self, buffer: str) -> None:
        if self.dump_after_gap is not None:
            self.dump_after_gap(buffer)

    def start(self) -> None:
        """Build every fetcher (config errors raise here) and start their threads."""
        if self._started:
            raise RuntimeError("FetcherHost.start() called twice")
        resolve = self._resolve or fetcher_class
        runners: dict[str, _Runner] = {}
        try:
            for buffer_config in self.config.buffers:
                name = buffer_config.name
                runners[name] = _Runner(
                    name,
                    buffer_config.source,
                    resolve(buffer_config.source),
                    self.buffers[name],
                    self.catalog,
                    self._stop,
                    Backoff(self.backoff_initial, self.backoff_max, self.healthy_after),
                    on_source_gap=(self._source_gap if buffer_config.on_source_gap == "dump"
                                   else None),
                    quarantines=self.quarantines,
                    on_source_error=buffer_config.on_source_error,
                )
            self._declare(runners)
            for name, seat in self.seats.items():
                runners[name].assignments = seat.assignment
                runners[name].resolve = resolve
                seat.on_change = runners[name].reassign
        except BaseException:
            for runner in runners.values():
                if runner.first is not None:
                    runner.first.close()
            raise
        self._runners = runners
        self._started = True
        for runner in runners.values():
            runner.thread.start()
        log.info("started fetchers: %s", ", ".join(
            f"{n} ({redact_uri(r.uri)})" for n, r in runners.items()))

    def _declare(self, runners: Mapping[str, _Runner]) -> None:
        """Give every source a fetcher's configuration names exactly its id now, before
        its table exists: ``/v1/sources`` lists it (state ``pending``) and a consumer
        can subscribe to it. The id is persisted, so the events written once the table
        exists carry it, across restarts too. A name configured for two buffers is a
        config error, raised here (the relay does not come up)."""
        owners: dict[str, str] = {}
        for name, runner in runners.items():
            assert runner.first is not None
            configured = runner.first.configured_sources()
            runner.configured = configured
            if configured is None:
                continue
            for source in sorted(configured.names):
                other = owners.setdefault(source, name)
                if other != name:
                    raise ConfigError(f"source {source!r} is configured for buffers {other!r} "
                                      f"and {name!r}: a logical source feeds one buffer")
                runner.catalog.for_buffer(name, runner.buffer.partition_id).source_id(source)

    def configured_buffer(self, source: str) -> str | None:
        """The buffer whose fetcher's configuration names ``source`` (exactly, or by a
        ``db.*``/all-tables pattern), or None. Several buffers matching by pattern
        (two ``mysql://`` sources without ``tables=``) is ambiguous: ``ConfigError``."""
        return configured_buffer(self.configured_sources(), source)

    def unlisted(self, buffer: str) -> frozenset[str]:
        """The databases of ``buffer``'s configuration its source does not list to the
        relay's user (``FetcherContext.report_unlisted``)."""
        runner = self._runners.get(buffer)
        return runner.unlisted if runner is not None else frozenset()

    def configured_sources(self) -> dict[str, ConfiguredSources | None]:
        """Per buffer, the sources its fetcher's configuration names (after ``start``;
        relay workers get them from the main process)."""
        return {n: r.configured for n, r in self._runners.items()}

    def stop(self, timeout: float = 5.0) -> None:
        """Ask every fetcher to stop, wait up to ``timeout`` seconds, close them."""
        self._stop.set()
        for runner in self._runners.values():
            runner.attempt_stop.set()
        deadline = time.monotonic() + timeout
        for runner in self._runners.values():
            runner.thread.join(max(0.0, deadline - time.monotonic()))
        for runner in self._runners.values():
            if runner.thread.is_alive():
                # Closing its connection is the best chance to unblock a stuck run().
                log.warning("fetcher of buffer %s did not stop within %.1f s; closing it",
                            runner.name, timeout)
                fetcher = runner.fetcher
                if fetcher is not None:
                    runner.close(fetcher)
                runner.thread.join(1.0)
            elif runner.first is not None:
                runner.first.close()  # built by start() but never run
                runner.first = None

    def dump_ports(self) -> dict[str, DumpPort]:
        """Per buffer: what the dump engine needs of its fetcher (after ``start``)."""
        return {
            name: DumpPort(buffer=name, sink=runner.sink, new_fetcher=runner.new_fetcher,
                           fetcher_state=runner.get_state,
                           capacity_bytes=runner.buffer.capacity, flush=runner.buffer.flush,
                           log_events=_log_events(runner.buffer, runner.sink))
            for name, runner in self._runners.items()
        }

    def restart(self, buffer: str, *, wait_s: float = 10.0) -> bool:
        """Restart the fetcher of ``buffer`` (a new instance) and wait up to ``wait_s``
        for the new attempt to run; False when it did not start in time (it still
        will, once its source answers)."""
        runner = self._runners[buffer]
        before = runner.restart()
        deadline = time.monotonic() + wait_s
        while runner.attempts <= before:
            if time.monotonic() >= deadline or self._stop.is_set():
                return False
            time.sleep(0.02)
        return True

    def fetcher_class(self, buffer: str) -> type[Fetcher]:
        """The fetcher class of ``buffer`` (after ``start``)."""
        return self._runners[buffer].cls

    def new_fetcher(self, buffer: str) -> Fetcher:
        """A fresh fetcher instance of ``buffer`` (never run: for its dump source)."""
        return self._runners[buffer].new_fetcher()

    def queue_marker(self, buffer: str, marker: QuarantineMarker) -> None:
        """Write ``marker`` into the next window of ``buffer`` (a heal's)."""
        self._runners[buffer].qsink.queue(marker)

    def status(self) -> dict[str, FetcherStatus]:
        """Per buffer name: the fetcher's state, restarts, last error and lag."""
        return {name: runner.status() for name, runner in self._runners.items()}


def _log_events(buffer: EventBuffer, sink: DumpSink) -> Callable[[], int]:
    """The data events ``buffer`` got from the log (its events minus dump rows)."""
    return lambda: buffer.state().events - sink.dumped
