"""A client's metrics: ``ClientMetrics`` (what ``DatabusClient.metrics`` holds) and its
Prometheus collector (``databus_client_*``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ClientMetrics"]

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
    # Bootstrap conversations started, and whether one is being pulled (with its phase:
    # "snapshot" or "catchup"); the consumer may still be behind the pull.
    bootstraps: int = 0
    bootstrapping: bool = False
    bootstrap_phase: str | None = None
    # Per subscribed source: "active", or "pending" while the relay is configured for it
    # but its table does not exist yet (the client waits for it).
    source_states: dict[str, str] = field(default_factory=dict)
    # Per subscribed source quarantined at the relay (DESIGN 17): its source_quarantined
    # error (source, scn, reason, fix); the client retries until it is healed.
    quarantined: dict[str, dict[str, object]] = field(default_factory=dict)
    # Consumer groups: the partitions this member runs, and its rebalances so far.
    group_partitions: tuple[int, ...] = ()
    rebalances: int = 0

    @property
    def waiting_for_sources(self) -> list[str]:
        """The subscribed sources whose tables do not exist yet (the client waits)."""
        return sorted(n for n, state in self.source_states.items() if state == "pending")

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
    def lag_seconds(self) -> float | None:
        """DESIGN 17, the figure to alert on: now minus the source commit time of the
        last window consumed, 0 when it is the relay's newest; None (unknown) before
        the first answer from a relay, and while a bootstrap snapshot is pulled (its
        windows carry the service's clock, not a commit time: the consumer is behind by
        more than any figure says). ``lag_scn`` is only a position distance (bytes
        across binlog files for a binlog source)."""
        if self.bootstrapping and self.bootstrap_phase == "snapshot":
            return None
        lag = self.lag_ms
        return None if lag is None else round(lag / 1000, 3)

    @property
    def events_per_second(self) -> float:
        elapsed = time.monotonic() - self.started_at if self.started_at else 0.0
        return self.events / elapsed if elapsed > 0 else 0.0

    def collector(self, client: str = "databus-client") -> Collector:
        """A prometheus-client collector over these metrics, labelled ``client``:
        register it in your own ``CollectorRegistry`` to serve them from your
        ``/metrics``."""
        return _ClientCollector(self, client)

    def prometheus_text(self, client: str = "databus-client") -> str:
        """These metrics in the Prometheus text format, labelled ``client``."""
        registry = CollectorRegistry(auto_describe=False)  # never the global registry
        registry.register(self.collector(client))
        return generate_latest(registry).decode("utf-8")


class _ClientCollector(Collector):
    """``databus_client_*`` over one client's live ``ClientMetrics``."""

    _ROWS: ClassVar[list[tuple[str, str, str]]] = [
        ("events_total", "counter", "Data events dispatched"),
        ("windows_total", "counter", "Windows dispatched"),
        ("rollbacks_total", "counter", "Rollbacks to the last checkpoint"),
        ("errors_total", "counter", "Errors (callback failures, fatal errors)"),
        ("relay_failovers_total", "counter", "Moves to another relay"),
        ("bootstraps_total", "counter", "Bootstrap conversations started"),
        ("bootstrapping", "gauge", "1 while a bootstrap is being pulled"),
        ("lag_scn", "gauge", "Relay max SCN minus the consumer's SCN (a byte distance for "
         "a binlog source: not for alerts)"),
        ("lag_ms", "gauge", "Milliseconds behind the relay's newest window"),
        ("events_per_second", "gauge", "Data events dispatched per second since start"),
        ("group_partitions", "gauge", "Consumer group: partitions this member runs"),
        ("group_rebalances_total", "counter", "Consumer group: rebalances seen"),
    ]

    def __init__(self, metrics: ClientMetrics, client: str) -> None:
        self.metrics = metrics
        self.client = client

    def collect(self) -> Iterator[Metric]:
        m, client = self.metrics, self.client
        values = {
            "events_total": m.events, "windows_total": m.windows,
            "rollbacks_total": m.rollbacks, "errors_total": m.errors,
            "relay_failovers_total": m.failovers, "bootstraps_total": m.bootstraps,
            "bootstrapping": int(m.bootstrapping), "lag_scn": m.lag_scn or 0,
            "lag_ms": m.lag_ms or 0, "events_per_second": round(m.events_per_second, 3),
            "group_partitions": len(m.group_partitions),
            "group_rebalances_total": m.rebalances,
        }
        for name, kind, text in self._ROWS:
            family: Metric
            if kind == "counter":
                family = CounterMetricFamily(f"databus_client_{name}", text,
                                             labels=["client"])
            else:
                family = GaugeMetricFamily(f"databus_client_{name}", text,
                                           labels=["client"])
            family.add_metric([client], float(values[name]))
            yield family
        # The figure to alert on (DESIGN 17); no sample while unknown, never 0.
        seconds = GaugeMetricFamily(
            "databus_client_lag_seconds", "Seconds between now and the source commit time "
            "of the last window consumed, 0 at the relay's newest (absent while unknown)",
            labels=["client"])
        if m.lag_seconds is not None:
            seconds.add_metric([client], m.lag_seconds)
        yield seconds
        phase = GaugeMetricFamily("databus_client_bootstrap_phase",
                                  "1 for the bootstrap phase being pulled",
                                  labels=["client", "phase"])
        for name in ("snapshot", "catchup"):
            phase.add_metric([client, name], float(m.bootstrap_phase == name))
        yield phase
        # One series per subscribed source and state (bounded by the client's config).
        states = GaugeMetricFamily("databus_client_source_state",
                                   "1 for a subscribed source's current state",
                                   labels=["client", "source", "state"])
        for source, current in sorted(m.source_states.items()):
            for state in ("pending", "active", "quarantined"):
                states.add_metric([client, source, state], float(current == state))
        yield states
