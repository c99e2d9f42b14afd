"""``GET /readyz`` of a relay (DESIGN section 17; docs/relay.md, "Readiness").

200 only when every component does its job, else 503; both with the same document::

    {"ready": false, "error": "not_ready", "message": "fetcher of buffer src: backoff",
     "components": [{"component": "fetcher", "buffer": "src", "ready": false,
                     "state": "backoff", "error": "fetcher_backoff",
                     "message": "...", "fix": "..."}, ...]}

(``error`` and ``message`` at the top only when not ready.) Components: each buffer's
fetcher (ready when ``running``), each quarantined source (never ready: component
``source``, state ``quarantined``, error ``source_quarantined``), the ZooKeeper
session of a cluster member (ready when connected), each worker process (ready when
``running``), and, answered by a worker itself, the main process (not ready when it
stopped answering: relay/_liveness.py).
``components_of`` is pure: it reads a ``/v1/status`` document.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily, Metric

from databus._http import json_response

__all__ = ["STATES", "component_families", "components_of", "readiness_response"]

# Every state of each kind of component, for the one-hot ``databus_component_state``.
STATES = {
    "fetcher": ("starting", "running", "backoff", "standby", "stopped", "failed"),
    "zookeeper": ("connected", "disconnected"),
    "worker": ("starting", "running", "restarting", "stopped"),
    "source": ("quarantined",),
}

_FETCHER_FIX = {
    "starting": "wait: the fetcher is connecting to its source",
    "backoff": "see the message (the source's last error); the fetcher retries by itself "
               "once the source is reachable again",
    "failed": "fix the cause in the message, then restart the relay",
    "standby": "wait for the cluster's election, or check that this member reaches "
               "ZooKeeper and the leader (docs/clusters.md)",
    "stopped": "the relay is stopping; start it again",
}


def _component(component: str, state: str, ready: bool, *, message: str | None = None,
               fix: str | None = None, **where: Any) -> dict[str, Any]:
    return {"component": component, **where, "ready": ready, "state": state,
            "error": None if ready else f"{component}_{state}",
            "message": None if ready else message, "fix": None if ready else fix}


def components_of(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each component of a relay and whether it does its job, from its status."""
    out: list[dict[str, Any]] = []
    connected: bool | None = None
    for name, buffer in status.get("buffers", {}).items():
        fetcher = buffer.get("fetcher")
        if fetcher is not None:
            state = str(fetcher["state"])
            out.append(_component(
                "fetcher", state, state == "running", buffer=name,
                message=fetcher.get("last_error") or f"the fetcher of buffer {name} is {state}",
                fix=_FETCHER_FIX.get(state)))
        for q in buffer.get("quarantined", []):
            # A source set aside (DESIGN 17): listed only while quarantined.
            out.append(_component(
                "source", "quarantined", False, buffer=name, source=q["source"],
                message=f"source {q['source']} is quarantined at SCN {q['scn']}: "
                        f"{q['reason']}",
                fix=q.get("fix") or "fix the cause, then: databus relay heal --relay URL "
                                    f"--source {q['source']}"))
        cluster = buffer.get("cluster")
        if cluster is not None:
            connected = bool(cluster.get("connected")) and connected is not False
    if connected is not None:
        out.append(_component(
            "zookeeper", "connected" if connected else "disconnected", connected,
            message="this relay's ZooKeeper session is not connected: it cannot lead, "
                    "and a leader's lease runs out",
            fix="check that this relay reaches the ZooKeeper ensemble (relay.cluster.zookeeper)"))
    for i, worker in enumerate(status.get("workers", [])):
        state = str(worker["state"])
        out.append(_component(
            "worker", state, state == "running", index=i, pid=worker.get("pid"),
            message=f"relay worker {i} is {state}",
            fix="wait: the relay starts its workers again by itself; see its log"))
    return out


def component_families(components: list[dict[str, Any]]) -> Iterator[Metric]:
    """``databus_component_up{daemon,component,buffer}`` (1/0) and the one-hot
    ``databus_component_state{daemon,component,buffer,state}`` of a relay's components
    (DESIGN 17). A worker is ``worker_<index>`` (no buffer), so that each has series of
    its own; a quarantined source is ``source:<name>``."""
    up = GaugeMetricFamily("databus_component_up", "1 when the component does its job",
                           labels=["daemon", "component", "buffer"])
    state = GaugeMetricFamily("databus_component_state", "The component's state (one-hot)",
                              labels=["daemon", "component", "buffer", "state"])
    for c in components:
        name = c["component"] + (f"_{c['index']}" if "index" in c else "") + (
            f":{c['source']}" if c["component"] == "source" else "")
        buffer = str(c.get("buffer", ""))
        up.add_metric(["relay", name, buffer], 1.0 if c["ready"] else 0.0)
        known = STATES.get(c["component"], ())
        for each in (*known, *(() if c["state"] in known else (c["state"],))):
            state.add_metric(["relay", name, buffer, each], float(each == c["state"]))
    yield up
    yield state


def readiness_response(components: list[dict[str, Any]]) -> web.Response:
    """200 with the components when all are ready, else 503 naming those that are not."""
    down = [c for c in components if not c["ready"]]
    doc: dict[str, Any] = {"ready": not down}
    if down:
        doc["error"] = "not_ready"
        doc["message"] = "; ".join(
            f"{c['component']}" + (f" {c['source']}" if c["component"] == "source" else "")
            + (f" of buffer {c['buffer']}" if "buffer" in c else "")
            + f": {c['state']}" for c in down)
    doc["components"] = components
    return json_response(doc, status=503 if down else 200)
