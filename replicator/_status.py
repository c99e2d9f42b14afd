"""The replicator's status: a JSON document (``/v1/status``) and Prometheus metrics
(``/metrics``) over the live state, served on ``replicate.metrics_port`` when set
(127.0.0.1 unless ``metrics_host`` says otherwise).

Per table: rows applied and rows per second (over the last minute of batches); for the
replication: the SCN applied (recorded in the target), the relay's newest SCN, the lag
in SCN and in milliseconds (the client's: how far the consumer is behind the relay's
newest window), batches applied, errors, the last error's text (status only: an error
text is no metric label).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ReplicationStats", "status_document"]

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
        self.state = "starting"

    def applied(self, rows_by_table: dict[str, int], scn: int) -> None:
        now = self._clock()
        with self._lock:
            for table, n in rows_by_table.items():
                self.rows[table] += n
                self._recent.append((now, table, n))
            self.batches += 1
            self.applied_scn = scn
            self._trim(now)

    def failed(self, error: str) -> None:
        with self._lock:
            self.errors += 1
            self.last_error = error

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
                    lag_ms: float | None, target: str) -> dict[str, Any]:
    rates = stats.rates()
    lag_scn = (None if relay_max_scn is None or stats.applied_scn is None
               else max(0, relay_max_scn - stats.applied_scn))
    return {
        "replication": stats.name,
        "state": stats.state,
        "target": target,
        "applied_scn": stats.applied_scn,
        "relay_max_scn": relay_max_scn,
        "lag_scn": lag_scn,
        "lag_ms": lag_ms,
        "batches": stats.batches,
        "errors": stats.errors,
        "last_error": stats.last_error,
        "tables": {t: {"rows_applied": stats.rows[t], "rows_per_second": round(rates[t], 1)}
                   for t in sorted(stats.rows)},
    }


class _Collector(Collector):
    def __init__(self, document: Any) -> None:
        self._document = document

    def collect(self) -> Iterator[Metric]:
        doc = self._document()
        name = doc["replication"]
        rows = CounterMetricFamily(f"{P}rows_applied_total", "Rows applied to the target",
                                   labels=["replication", "table"])
        rate = GaugeMetricFamily(f"{P}rows_per_second", "Rows applied per second (last "
                                 "minute)", labels=["replication", "table"])
        for table, t in doc["tables"].items():
            rows.add_metric([name, table], t["rows_applied"])
            rate.add_metric([name, table], t["rows_per_second"])
        yield rows
        yield rate
        for key, kind, text in [
            ("applied_scn", GaugeMetricFamily, "SCN recorded in the target with the last batch"),
            ("lag_scn", GaugeMetricFamily, "Relay newest SCN minus the applied SCN"),
            ("lag_ms", GaugeMetricFamily, "Milliseconds behind the relay's newest window"),
            ("batches", CounterMetricFamily, "Target transactions applied"),
            ("errors", CounterMetricFamily, "Target errors (retried or not)"),
        ]:
            family = kind(f"{P}{key}", text, labels=["replication"])
            family.add_metric([name], float(doc[key] or 0))
            yield family


def metrics_page(document: Any) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(document))
    return generate_latest(registry)
