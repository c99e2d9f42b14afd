"""The replicator's status: a JSON document (``/v1/status``) and Prometheus metrics
(``/metrics``) over the live state, served on ``replicate.metrics_port`` when set
(127.0.0.1 unless ``metrics_host`` says otherwise).

Per table: rows applied and rows per second (over the last minute of batches); for the
replication: the SCN applied (recorded in the target), the relay's newest SCN, the lag
in SCN and in milliseconds (the client's: how far the consumer is behind the relay's
newest window), the lag in seconds (DESIGN 17, the figure to alert on: now minus the
source commit time of the last window consumed, 0 at the relay's newest; null and no
metric sample while unknown; the SCN lag of a binlog source is a byte distance),
batches applied, errors, the last error's text (status only: an error
text is no metric label); and the copy through the bootstrap service, while and after
it runs (``initial_copy``: rows per table of an estimate, rate, ETA; ``_progress.py``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from databus._readiness import component_families as shared_families
from databus._readiness import not_ready
from databus.checkpoint import Checkpoint
from databus.client._headers import read_json
from databus.errors import DatabusError
from databus.replicator._progress import CopyView, Start, start_kind, status_fields
from databus.replicator._readiness import STATES, components_of
from databus.security import NO_CREDENTIALS, ClientCredentials, client_session

__all__ = ["ReplicationStats", "bootstrap_rows", "estimate_copies", "status_document"]

log = logging.getLogger("databus.replicator")

P = "databus_replicator_"
_RATE_WINDOW_S = 60.0


class ReplicationStats:
    """What the consumer records as it applies batches (thread-safe)."""

    def __init__(self, name: str, clock: Any = time.monotonic) -> None:
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self.rows: collections.Counter[str] = collections.Counter()
        self._recent: collections.deque[tuple[float, str, int]] = collections.deque()
        self.batches = 0
        self.errors = 0
        self.applied_scn: int | None = None
        self.last_error: str | None = None
        # "starting" (reconciling the target tables), "running" (applying),
        # "retrying" (the target does not take a batch), "stopped" (on an error it
        # must not pass: ``stop_error`` is set), "exited" (asked to stop).
        self.state = "starting"
        self.stop_error: dict[str, str] | None = None
        # The copy through the bootstrap service (the last one of this process).
        self._copy = 0
        self._copy_state: Literal["running", "done"] | None = None
        self._copy_start: Start | None = None
        self._copy_rows: dict[str, int] = {}
        self._copy_estimated: dict[str, int | None] = {}
        self._copy_began = 0.0
        self._copy_ended: float | None = None
        self._copy_asked = 0  # the copy whose estimate was asked for

    def applied(self, rows_by_table: dict[str, int], scn: int) -> None:
        now = self._clock()
        with self._lock:
            for table, n in rows_by_table.items():
                self.rows[table] += n
                self._recent.append((now, table, n))
                if self._copy_state == "running":
                    self._copy_rows[table] = self._copy_rows.get(table, 0) + n
            self.batches += 1
            self.applied_scn = scn
            if self.state == "retrying":
                self.state = "running"  # the target answers again
            self._trim(now)

    def failed(self, error: str) -> None:
        with self._lock:
            self.errors += 1
            self.last_error = error

    def stopped(self, code: str, message: str, fix: str) -> None:
        """The replicator stopped on an error it must not pass (``state`` "stopped")."""
        with self._lock:
            self.state = "stopped"
            self.stop_error = {"code": code, "message": message, "fix": fix}

    @property
    def ready(self) -> bool:
        """Whether the replicator does its job (``/readyz``): applying, not stopped."""
        return self.state == "running"

    # -- the copy through the bootstrap service ----------------------------------------

    def copy_started(self, sources: Sequence[str], start: Checkpoint | None) -> None:
        """The client began a bootstrap (``on_start_bootstrap``) resuming from ``start``
        (None: no position at all). Called again before ``copy_done`` (the client
        bootstraps again from its last checkpoint after a rollback), the same copy goes
        on."""
        with self._lock:
            if self._copy_state == "running":
                return
            self._copy += 1
            self._copy_state = "running"
            self._copy_start = start_kind(start)
            self._copy_rows = dict.fromkeys(sources, 0)
            self._copy_estimated = dict.fromkeys(sources)
            self._copy_began = self._clock()
            self._copy_ended = None

    def copy_done(self) -> None:
        """The bootstrap ended and its last rows are in the target."""
        with self._lock:
            if self._copy_state == "running":
                self._copy_state = "done"
                self._copy_ended = self._clock()

    def copy_to_estimate(self) -> int | None:
        """The running copy whose estimate is to be asked for (once): one that starts
        from empty, the only kind a snapshot's row count says the size of."""
        with self._lock:
            if (self._copy_state != "running" or self._copy_asked == self._copy
                    or self._copy_start != "empty"):
                return None
            self._copy_asked = self._copy
            return self._copy

    def copy_estimate_failed(self, copy: int) -> None:
        """Ask again later (the bootstrap service may be starting, as the client's
        pulls find too)."""
        with self._lock:
            if self._copy_asked == copy:
                self._copy_asked = 0

    def set_copy_estimates(self, copy: int, rows: Mapping[str, int]) -> None:
        with self._lock:
            if copy == self._copy:
                for source in self._copy_estimated:
                    self._copy_estimated[source] = rows.get(source)

    def copy_view(self) -> CopyView:
        with self._lock:
            if self._copy_state is None:
                return CopyView()
            end = self._copy_ended if self._copy_ended is not None else self._clock()
            return CopyView(copy=self._copy, state=self._copy_state,
                            start=self._copy_start, rows=dict(self._copy_rows),
                            estimated=dict(self._copy_estimated),
                            elapsed_s=max(0.0, end - self._copy_began))

    def _trim(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] > _RATE_WINDOW_S:
            self._recent.popleft()

    def rates(self) -> dict[str, float]:
        """Rows per second per table over the last minute."""
        now = self._clock()
        with self._lock:
            self._trim(now)
            if not self._recent:
                return {t: 0.0 for t in self.rows}
            span = max(now - self._recent[0][0], 1.0)
            out = {t: 0.0 for t in self.rows}
            for _, table, n in self._recent:
                out[table] += n / span
            return out


def status_document(stats: ReplicationStats, *, relay_max_scn: int | None,
                    lag_ms: float | None, target: str,
                    lag_seconds: float | None = None) -> dict[str, Any]:
    rates = stats.rates()
    lag_scn = (None if relay_max_scn is None or stats.applied_scn is None
               else max(0, relay_max_scn - stats.applied_scn))
    doc = _document(stats, rates, relay_max_scn=relay_max_scn, lag_scn=lag_scn,
                    lag_ms=lag_ms, target=target, lag_seconds=lag_seconds)
    down = not_ready(components_of(doc))
    doc["ready"] = not down
    doc["not_ready"] = down
    return doc


def _document(stats: ReplicationStats, rates: dict[str, float], *,
              relay_max_scn: int | None, lag_scn: int | None, lag_ms: float | None,
              target: str, lag_seconds: float | None) -> dict[str, Any]:
    return {
        "replication": stats.name,
        "state": stats.state,
        "ready": stats.ready,
        # Set in state "stopped": the error code, its one-line message and the fix.
        "error": None if stats.stop_error is None else stats.stop_error["code"],
        "message": None if stats.stop_error is None else stats.stop_error["message"],
        "fix": None if stats.stop_error is None else stats.stop_error["fix"],
        "target": target,
        "applied_scn": stats.applied_scn,
        "relay_max_scn": relay_max_scn,
        "lag_scn": lag_scn,
        "lag_ms": lag_ms,
        "lag_seconds": lag_seconds,
        "batches": stats.batches,
        "errors": stats.errors,
        "last_error": stats.last_error,
        "tables": {t: {"rows_applied": stats.rows[t], "rows_per_second": round(rates[t], 1)}
                   for t in sorted(stats.rows)},
        "initial_copy": status_fields(stats.copy_view()),
    }


class _Collector(Collector):
    def __init__(self, document: Any) -> None:
        self._document = document

    def collect(self) -> Iterator[Metric]:
        doc = self._document()
        name = doc["replication"]
        yield from shared_families("replicator", components_of(doc), STATES)
        rows = CounterMetricFamily(f"{P}rows_applied_total", "Rows applied to the target",
                                   labels=["replication", "table"])
        rate = GaugeMetricFamily(f"{P}rows_per_second", "Rows applied per second (last "
                                 "minute)", labels=["replication", "table"])
        for table, t in doc["tables"].items():
            rows.add_metric([name, table], t["rows_applied"])
            rate.add_metric([name, table], t["rows_per_second"])
        yield rows
        yield rate
        yield from _copy_metrics(name, doc["initial_copy"])
        for key, kind, text in [
            ("applied_scn", GaugeMetricFamily, "SCN recorded in the target with the last batch"),
            ("lag_scn", GaugeMetricFamily, "Relay newest SCN minus the applied SCN (a "
             "byte distance for a binlog source: alert on lag_seconds)"),
            ("lag_ms", GaugeMetricFamily, "Milliseconds behind the relay's newest window"),
            ("batches", CounterMetricFamily, "Target transactions applied"),
            ("errors", CounterMetricFamily, "Target errors (retried or not)"),
        ]:
            family = kind(f"{P}{key}", text, labels=["replication"])
            family.add_metric([name], float(doc[key] or 0))
            yield family
        seconds = GaugeMetricFamily(
            f"{P}lag_seconds", "Seconds between now and the source commit time of the last "
            "window consumed, 0 at the relay's newest (absent while unknown)",
            labels=["replication"])
        if doc.get("lag_seconds") is not None:
            seconds.add_metric([name], float(doc["lag_seconds"]))
        yield seconds


def _copy_metrics(name: str, copy: dict[str, Any]) -> Iterator[Metric]:
    running = GaugeMetricFamily(f"{P}initial_copy_running", "1 while a copy through the "
                                "bootstrap service runs", labels=["replication"])
    running.add_metric([name], float(copy["state"] == "running"))
    yield running
    rows = GaugeMetricFamily(f"{P}initial_copy_rows", "Rows copied by the current or last "
                             "copy through the bootstrap service", labels=["replication", "table"])
    estimated = GaugeMetricFamily(f"{P}initial_copy_estimated_rows", "Rows the bootstrap "
                                  "snapshot held when the copy began (a copy from empty)",
                                  labels=["replication", "table"])
    for table, t in copy["tables"].items():
        rows.add_metric([name, table], float(t["rows"]))
        if t["estimated_rows"] is not None:
            estimated.add_metric([name, table], float(t["estimated_rows"]))
    yield rows
    yield estimated
    # No sample while unknown: a 0 would read as "done now".
    eta = GaugeMetricFamily(f"{P}initial_copy_eta_seconds", "Seconds the running copy "
                            "needs at its average rate", labels=["replication"])
    if copy["eta_s"] is not None:
        eta.add_metric([name], float(copy["eta_s"]))
    yield eta


# -- the copy's estimate, from the bootstrap service --------------------------------------


async def bootstrap_rows(urls: Sequence[str], *, timeout_s: float = 10.0,
                         credentials: ClientCredentials = NO_CREDENTIALS
                         ) -> dict[str, int] | None:
    """Live rows per source in the bootstrap snapshot, from the first bootstrap service
    that answers its ``/v1/status`` (``snapshot_rows``: the store counts them, one
    query per source, docs/bootstrap.md); None when none answers. No new endpoint is
    needed, and nothing is written. ``credentials``: the replicator's, presented to each
    (a bootstrap service with a metrics token takes a reader's credential there)."""
    import aiohttp

    from databus.config import redact_uri

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with client_session(credentials, timeout=timeout) as session:
        for url in urls:
            try:
                async with session.get(f"{url.rstrip('/')}/v1/status") as resp:
                    doc: Any = await read_json(resp, url)
                if resp.status != 200 or not isinstance(doc.get("snapshot_rows"), dict):
                    raise ValueError(f"answered {resp.status} without snapshot_rows")
                return {str(k): int(v) for k, v in doc["snapshot_rows"].items()}
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError, TypeError,
                    AttributeError, DatabusError) as exc:
                log.debug("bootstrap service %s gave no row count: %s", redact_uri(url), exc)
    return None


async def estimate_copies(stats: ReplicationStats, urls: Sequence[str], *,
                          poll_s: float = 0.2, retry_s: float = 2.0,
                          credentials: ClientCredentials = NO_CREDENTIALS) -> None:
    """Runs beside the client: gives each copy from empty its estimate, asked when the
    copy begins (the client's callbacks run in its runner thread, so they are polled
    rather than awaited)."""
    while True:
        await asyncio.sleep(poll_s)
        copy = stats.copy_to_estimate()
        if copy is None:
            continue
        rows = await bootstrap_rows(urls, credentials=credentials)
        if rows is None:
            stats.copy_estimate_failed(copy)
            await asyncio.sleep(retry_s)
        else:
            stats.set_copy_estimates(copy, rows)


def metrics_page(document: Any) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(document))
    return generate_latest(registry)
