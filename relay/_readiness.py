"""``GET /readyz`` of a relay (DESIGN section 17; docs/relay.md, "Readiness").

200 only when every component does its job, else 503; both with the same document::

    {"ready": false, "error": "not_ready", "message": "fetcher of buffer src: backoff",
     "components": [{"component": "fetcher", "buffer": "src", "ready": false,
                     "state": "backoff", "error": "fetcher_backoff",
                     "message": "...", "fix": "..."}, ...]}

(``error`` and ``message`` at the top only when not ready.) Components: each buffer's
fetcher (ready when ``running`` or ``caught_up``), each quarantined source (never
ready: component ``source``, state ``quarantined``, error ``source_quarantined``), the
ZooKeeper session of a cluster member (ready when connected), each worker process (ready
when ``running``), and, answered by a worker itself, the main process (not ready when it
stopped answering: relay/_liveness.py).
``components_of`` is pure: it reads a ``/v1/status`` document. The document's shape,
the metrics and the answer are databus/_readiness.py's, shared by every daemon.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import Metric

from databus._readiness import component, readiness_response
from databus._readiness import component_families as shared_families

__all__ = ["FETCHER_READY", "STATES", "component_families", "components_of",
           "readiness_response"]

# A fetcher does its job while it reads its source (DESIGN 17: ``running`` or
# ``caught_up``, for a fetcher that reports being at the source's end).
FETCHER_READY = ("running", "caught_up")
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


_MISCONFIGURED_FIX = ("fix the source as the message says (its settings, the relay user's "
                      "grants or password): the fetcher tries again by itself every few "
                      "seconds, no restart needed")


def _fetcher_fix(state: str, last_error: str | None) -> str | None:
    if state == "failed" and (last_error or "").startswith("SourceMisconfiguredError:"):
        return _MISCONFIGURED_FIX
    if state == "failed" and (last_error or "").startswith("WindowTooLargeError:"):
        return _TOO_LARGE_FIX
    return _FETCHER_FIX.get(state)


_TOO_LARGE_FIX = ("stop the relay, run `databus relay resize --config FILE --buffer NAME "
                  "--capacity-mb N` with the capacity_mb the message names (it keeps every "
                  "window), set the same capacity_mb in the config and start the relay: it "
                  "reads the window again, whole (docs/operations.md, 'Runbook: a window "
                  "larger than the buffer')")


_component = component


def components_of(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each component of a relay and whether it does its job, from its status."""
    out: list[dict[str, Any]] = []
    connected: bool | None = None
    for name, buffer in status.get("buffers", {}).items():
        fetcher = buffer.get("fetcher")
        if fetcher is not None:
            state = str(fetcher["state"])
            out.append(_component(
                "fetcher", state, state in FETCHER_READY, buffer=name,
                message=fetcher.get("last_error") or f"the fetcher of buffer {name} is {state}",
                fix=_fetcher_fix(state, fetcher.get("last_error"))))
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
    """``databus_component_up`` and ``databus_component_state`` of a relay's components
    (databus/_readiness.py), ``daemon="relay"``."""
    return shared_families("relay", components, STATES)
