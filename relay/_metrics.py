"""The relay's ``/metrics`` page: prometheus-client collectors over the live state.

Each app gets its own ``CollectorRegistry`` (never the process-global one: tests and
embedders run several relays in one process). The collectors read the relay, the HTTP
counters and the consumer registry when scraped, so nothing is updated twice. Metric
names are the ones the relay always had; prometheus-client writes a counter's samples and
its ``# TYPE`` line with the ``_total`` the names already end in. Label values are
escaped by prometheus-client: a client id can hold any text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from databus._http import HttpStats, http_requests_family
from databus.checkpoint import LATEST_SCN, WHOLE_WINDOW
from databus.relay._consumers import ConsumerRegistry
from databus.relay._readiness import component_families, components_of
from databus.relay._relay import Relay

_BUFFER_FIELDS = [
    ("min_scn", "Oldest window SCN held"),
    ("max_scn", "Newest window SCN held"),
    ("used_bytes", "Bytes of the ring in use"),
    ("capacity_bytes", "Ring capacity"),
    ("events", "Data events held"),
    ("windows", "Windows held"),
    ("input_bytes_per_second", "Average write rate since start"),
]
_DUMP_FAMILIES = [
    ("dumps_active", "Dumps queued, running or paused"),
    ("dump_rows_total", "Rows dumped into the buffer (all dumps)"),
    ("dumps_failed_total", "Dumps that failed (kept in the relay's dump state: alert on "
     "an increase; GET /v1/dumps says why)"),
    ("dump_rows", "Rows dumped so far by an active dump"),
    ("dump_estimated_rows", "Rows the source estimated for an active dump"),
    ("dump_rows_per_second", "Rows per second of an active dump while running"),
]
_CONSUMER_GAUGES = [
    ("lag_seconds", "Seconds between now and the source commit time of the window at the "
     "consumer's checkpoint, 0 when it has the newest window (alert on this; absent when "
     "unknown)"),
    ("lag_ms", "Milliseconds the oldest window the consumer was not served has waited"),
    ("lag_scn", "Buffer max SCN minus the consumer's checkpoint SCN (a byte distance for "
     "a binlog source: not for alerts)"),
    ("events_per_second", "Data events per second served to the consumer (last 10 s)"),
]
P = "databus_relay_"


class RelayCollector(Collector):
    """Buffers, fetchers, HTTP counters, dumps and consumers of one relay."""

    def __init__(self, relay: Relay, stats: HttpStats, consumers: ConsumerRegistry) -> None:
        self.relay = relay
        self.stats = stats
        self.consumers = consumers

    def collect(self) -> Iterator[Metric]:
        status = self.relay.status()
        buffers: dict[str, dict[str, Any]] = status["buffers"]
        yield from component_families(components_of(status))
        for name, text in _BUFFER_FIELDS:
            gauge = GaugeMetricFamily(f"{P}buffer_{name}", text, labels=["buffer"])
            for buffer, doc in buffers.items():
                gauge.add_metric([buffer], float(doc[name] or 0))
            yield gauge
        # A counter of window bytes written, for rate() (input_bytes_per_second above
        # is an average since the relay started).
        written = CounterMetricFamily(f"{P}buffer_input_bytes_total", "Window bytes "
                                      "written into the buffer", labels=["buffer"])
        for buffer in buffers:
            held = self.relay.buffers.get(buffer)
            if held is not None:
                written.add_metric([buffer], float(held.bytes_in))
        yield written
        yield from _cluster_families(buffers)
        fetchers = {n: doc.get("fetcher") or {} for n, doc in buffers.items()}
        restarts = CounterMetricFamily(f"{P}fetcher_restarts_total",
                                       "Fetcher restarts after an error", labels=["buffer"])
        lag = GaugeMetricFamily(f"{P}fetcher_lag_scn", "Source SCN minus buffer max SCN (a "
                                "byte distance for a binlog source: not for alerts)",
                                labels=["buffer"])
        # DESIGN 17: the figure to alert on. No sample while unknown (the fetcher is not
        # running, or the source has been silent): absent, never 0.
        seconds = GaugeMetricFamily(
            f"{P}fetcher_lag_seconds", "Seconds between now and the source time the "
            "fetcher has read through (absent while unknown: source unreachable or silent)",
            labels=["buffer"])
        for buffer, fetcher in fetchers.items():
            restarts.add_metric([buffer], float(fetcher.get("restarts", 0)))
            lag.add_metric([buffer], float(fetcher.get("lag_scn") or 0))
            if fetcher.get("lag_seconds") is not None:
                seconds.add_metric([buffer], float(fetcher["lag_seconds"]))
        yield restarts
        yield lag
        yield seconds
        # A fetcher's own numbers (FetcherContext.report_details), one gauge per name.
        details: dict[str, GaugeMetricFamily] = {}
        for buffer, fetcher in fetchers.items():
            for key, value in sorted((fetcher.get("details") or {}).items()):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                if key not in details:
                    details[key] = GaugeMetricFamily(
                        f"{P}fetcher_{key}", f"Fetcher detail {key} (see /v1/status)",
                        labels=["buffer"])
                details[key].add_metric([buffer], float(value))
        yield from details.values()
        stats = self.stats
        yield http_requests_family("databus_relay", stats)
        yield CounterMetricFamily(f"{P}stream_bytes_total", "Event bytes served",
                                  value=float(stats.bytes_served))
        yield CounterMetricFamily(f"{P}stream_events_total", "Data events served",
                                  value=float(stats.events_served))
        yield GaugeMetricFamily(f"{P}long_polls", "Long polls waiting now",
                                value=float(stats.long_polls))
        # getattr: streaming subscriptions (relay/_streaming.py) count themselves here.
        yield GaugeMetricFamily(f"{P}streams", "Streaming subscriptions open now",
                                value=float(getattr(stats, "streams", 0)))
        yield from self._dumps()
        yield from self._consumers({n: doc.get("max_scn") for n, doc in buffers.items()},
                                   {n: doc.get("min_scn") for n, doc in buffers.items()})

    def _dumps(self) -> Iterator[Metric]:
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for name, labels, value in self.relay.dumps.metrics():
            samples.setdefault(name.removeprefix(P), []).append((labels, value))
        for name, text in _DUMP_FAMILIES:
            rows = samples.get(name, [])
            # Every sample of a family has the same label names (buffer, or buffer and
            # dump); the family is written with no samples when there are none.
            keys = sorted(rows[0][0]) if rows else []
            family: Metric
            if name.endswith("_total"):
                family = CounterMetricFamily(f"{P}{name}", text, labels=keys)
            else:
                family = GaugeMetricFamily(f"{P}{name}", text, labels=keys)
            for labels, value in rows:
                family.add_metric([labels[k] for k in keys], value)
            yield family

    def _consumers(self, max_scns: dict[str, int | None], min_scns: dict[str, int | None]
                   ) -> Iterator[Metric]:
        # One series per tracked (client id, buffer): bounded by max_tracked_consumers
        # and by expiry, so a client inventing ids cannot grow the page without limit.
        consumers = self.consumers.snapshot(max_scns, self.relay.window_time, min_scns)
        for name, text in _CONSUMER_GAUGES:
            gauge = GaugeMetricFamily(f"{P}consumer_{name}", text,
                                      labels=["client_id", "buffer", "reader"])
            for c in consumers:
                if c[name] is not None:  # lag_seconds: absent while unknown
                    gauge.add_metric([c["client_id"], c["buffer"], c["reader"]],
                                     float(c[name]))
            yield gauge
        yield self._headroom(consumers)
        yield GaugeMetricFamily(f"{P}consumers_tracked", "Consumers tracked now",
                                value=float(len(consumers)))
        yield CounterMetricFamily(f"{P}consumers_evicted_total",
                                  "Consumers evicted because max_tracked_consumers were "
                                  "tracked", value=float(self.consumers.evicted_total))

    def _headroom(self, consumers: list[dict[str, Any]]) -> Metric:
        """Per consumer, the bytes its buffer can still take before the window it needs
        next is evicted (then it gets ``scn_not_found`` and must bootstrap): capacity
        minus the bytes from that window to the newest. Over the buffer's input rate,
        the time left (deploy/prometheus). Absent when it cannot be told."""
        gauge = GaugeMetricFamily(
            f"{P}consumer_eviction_headroom_bytes", "Bytes the buffer can still take "
            "before the window the consumer needs next is evicted (capacity minus the "
            "bytes from that window to the newest)", labels=["client_id", "buffer", "reader"])
        for c in consumers:
            held = self.relay.buffers.get(c["buffer"])
            scn = int(c["checkpoint_scn"])
            if held is None or scn == LATEST_SCN:
                continue
            # A partial window is needed again from its start; a whole one is done.
            behind = held.bytes_from(max(scn, 0) if c["window_offset"] != WHOLE_WINDOW
                                     else max(scn + 1, 0))
            if behind is not None:
                gauge.add_metric([c["client_id"], c["buffer"], c["reader"]],
                                 float(max(0, held.capacity - behind)))
        return gauge


# Roles of a buffer's seat in a leader-follower cluster (relay/cluster/_member.py), and
# of a member of an independent cluster: the one-hot states of cluster_role.
_LEADER_FOLLOWER_ROLES = ("leader", "follower", "waiting")


def _cluster_families(buffers: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    """``cluster_role{buffer,cluster,role}`` (one-hot; leader-follower members have a
    series for each of leader, follower and waiting, so that "no member of the cluster
    leads this buffer" is a sum, 0) and ``cluster_epoch{buffer,cluster}``, for buffers
    of a relay in a cluster (none otherwise)."""
    role = GaugeMetricFamily(f"{P}cluster_role", "This relay's role for the buffer in "
                             "its cluster (one-hot)", labels=["buffer", "cluster", "role"])
    epoch = GaugeMetricFamily(f"{P}cluster_epoch", "The buffer's current leadership "
                              "epoch", labels=["buffer", "cluster"])
    for buffer, doc in buffers.items():
        cluster = doc.get("cluster")
        if not cluster:
            continue
        name, current = str(cluster.get("name", "")), str(cluster.get("role"))
        roles = _LEADER_FOLLOWER_ROLES if cluster.get("mode") == "leader-follower" else ()
        for each in (*roles, *(() if current in roles else (current,))):
            role.add_metric([buffer, name, each], float(each == current))
        if cluster.get("epoch") is not None:
            epoch.add_metric([buffer, name], float(cluster["epoch"]))
    yield role
    yield epoch


def relay_metrics(relay: Relay, stats: HttpStats, consumers: ConsumerRegistry
                  ) -> CollectorRegistry:
    """A registry of its own for one relay app, holding its collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(relay, stats, consumers))
    return registry
