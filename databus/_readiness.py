"""``GET /readyz`` of every daemon (DESIGN section 17; docs/operations.md, "Readiness").

One document shape for the relay, the bootstrap service and the replicator's status
server. 200 only when every component does its job, else 503; both with::

    {"ready": false, "error": "not_ready", "message": "fetcher of buffer src: backoff",
     "components": [{"component": "fetcher", "buffer": "src", "ready": false,
                     "state": "backoff", "error": "fetcher_backoff",
                     "message": "...", "fix": "..."}, ...]}

(``error`` and ``message`` at the top only when not ready.) Each daemon says which
components it runs and what each state means (relay/_readiness.py,
bootstrap/_readiness.py, replicator/_status.py); this module holds what they share: a
component's entry, the Prometheus families ``databus_component_up{daemon,component,
buffer}`` (1/0) and the one-hot ``databus_component_state{...,state}``, the HTTP
answer, and ``not_ready``, which ``databus status`` applies to the same documents.
All pure except the response.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily, Metric

from databus._http import json_response

__all__ = ["component", "component_families", "not_ready", "readiness_document",
           "readiness_response"]


def component(name: str, state: str, ready: bool, *, message: str | None = None,
              fix: str | None = None, **where: Any) -> dict[str, Any]:
    """One component's entry: where it is (``buffer``, ``index``...), whether it does its
    job, its state, and when it does not, the error code ``<component>_<state>``, the
    message and the fix."""
    return {"component": name, **where, "ready": ready, "state": state,
            "error": None if ready else f"{name}_{state}",
            "message": None if ready else message, "fix": None if ready else fix}


def not_ready(components: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The components that do not do their job."""
    return [c for c in components if not c.get("ready")]


def _where(c: Mapping[str, Any]) -> str:
    if c.get("buffer") and c.get("source"):  # a relay's quarantined source
        return f" {c['source']} of buffer {c['buffer']}"
    if c.get("buffer"):
        return f" of buffer {c['buffer']}"
    if c.get("source"):
        return f" of source {c['source']}"
    return ""


def readiness_document(components: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``/readyz`` document of these components."""
    down = not_ready(components)
    doc: dict[str, Any] = {"ready": not down}
    if down:
        doc["error"] = "not_ready"
        doc["message"] = "; ".join(f"{c['component']}{_where(c)}: {c['state']}" for c in down)
    doc["components"] = components
    return doc


def readiness_response(components: list[dict[str, Any]]) -> web.Response:
    """200 with the components when all are ready, else 503 naming those that are not."""
    doc = readiness_document(components)
    return json_response(doc, status=200 if doc["ready"] else 503)


def component_families(daemon: str, components: list[dict[str, Any]],
                       states: Mapping[str, tuple[str, ...]]) -> Iterator[Metric]:
    """``databus_component_up{daemon,component,buffer}`` (1/0) and the one-hot
    ``databus_component_state{daemon,component,buffer,state}``: one series per state
    ``states`` lists for the kind of component (and the current one if it is not
    listed). A component with an ``index`` (a relay's worker) is ``<component>_<index>``
    and a relay's quarantined source ``source:<name>``, so that each has series of its
    own; ``buffer`` is the buffer, or empty."""
    up = GaugeMetricFamily("databus_component_up", "1 when the component does its job",
                           labels=["daemon", "component", "buffer"])
    state = GaugeMetricFamily("databus_component_state", "The component's state (one-hot)",
                              labels=["daemon", "component", "buffer", "state"])
    for c in components:
        name = c["component"] + (f"_{c['index']}" if "index" in c else "") + (
            f":{c['source']}" if c["component"] == "source" and "source" in c else "")
        buffer = str(c.get("buffer", ""))
        up.add_metric([daemon, name, buffer], 1.0 if c["ready"] else 0.0)
        known = states.get(c["component"], ())
        for each in (*known, *(() if c["state"] in known else (c["state"],))):
            state.add_metric([daemon, name, buffer, each], float(each == c["state"]))
    yield up
    yield state
