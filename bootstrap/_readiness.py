"""``GET /readyz`` of a bootstrap service (DESIGN section 17; docs/bootstrap.md,
"Readiness"): its producer and applier, when this process runs them, and its ZooKeeper
session in a cluster. The document, the metrics and the answer are
databus/_readiness.py's; ``components_of`` is pure: it reads a ``/v1/status`` document.

A producer or an applier does its job while it is ``running`` (it holds its fencing
token; in a cluster, its lock) or, in a cluster, ``standby`` (another service of the
cluster runs it). ``fenced`` is never ready: a newer token was taken on the same store
(a second service started by mistake, or a newer holder), and this one writes nothing
any more, for good.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import Metric

from databus._readiness import component
from databus._readiness import component_families as shared_families

__all__ = ["STATES", "component_families", "components_of"]

READY = ("running", "standby")
_PART = ("starting", "running", "retrying", "standby", "fenced", "failed", "stopped",
         "unauthorized", "forbidden")
STATES = {"producer": _PART, "applier": _PART, "zookeeper": ("connected", "disconnected")}

_WHAT = {"producer": "appends the relay's windows to the log",
         "applier": "moves the log into the snapshot"}

_FIX = {
    "starting": "wait: it is taking its fencing token and reading its position",
    "retrying": "see the message: it retries by itself once the relay (producer) or the "
                "store answers again",
    "fenced": "another process took this component's fencing token on the same store (a "
              "second bootstrap service running it, or a newer holder): stop the one that "
              "should not run it, then restart this service (docs/operations.md, "
              "\"Runbook: not ready / second instance\")",
    "failed": "fix the cause in the message, then restart the bootstrap service",
    "stopped": "the service is stopping; start it again",
    # The producer's credential, refused by the relay (DESIGN 18): it asks again every
    # 30 s, so a fix on the relay's side needs no restart; one in its config does.
    "unauthorized": "the relay refused the producer's credential: set a reader's token "
                    "(or client certificate) in [bootstrap.producer] (docs/security.md)",
    "forbidden": "the relay's reader for the producer's credential is not granted its "
                 "sources: grant them in [[relay.readers]] (docs/security.md)",
}


def components_of(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each component of a bootstrap service and whether it does its job."""
    out: list[dict[str, Any]] = []
    for name, doc in (status.get("components") or {}).items():
        state = str(doc.get("state"))
        out.append(component(
            name, state, state in READY,
            message=doc.get("last_error") or (
                f"the {name} (it {_WHAT.get(name, 'runs')}) is {state}"),
            fix=_FIX.get(state)))
    cluster = status.get("cluster")
    if cluster is not None:
        connected = bool(cluster.get("connected"))
        out.append(component(
            "zookeeper", "connected" if connected else "disconnected", connected,
            message="this bootstrap service's ZooKeeper session is not connected: it "
                    "cannot hold the producer's or the applier's lock",
            fix="check that this service reaches the ZooKeeper ensemble "
                "(bootstrap.cluster.zookeeper)"))
    return out


def component_families(components: list[dict[str, Any]]) -> Iterator[Metric]:
    """``databus_component_up`` and ``databus_component_state``, ``daemon="bootstrap"``."""
    return shared_families("bootstrap", components, STATES)
