"""``databus status``: what each service's ``/readyz`` would say, and the replicators
(``--replicator URL``: its status server). The pure half of these parts of the view,
beside databus/_status_view.py's (which imports this module where it uses it).

Readiness is computed from each service's ``/v1/status`` by the very function its
``/readyz`` applies (relay/_readiness.py, bootstrap/_readiness.py,
replicator/_readiness.py), so ``databus status`` and ``/readyz`` never disagree; a
quarantined source, a failed fetcher, a fenced producer or a replicator not applying
is "not ready", and the command then exits 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from databus._redact import redact
from databus._status_render import _count, _int, _number, where
from databus._status_view import Answer, _down, display_url
from databus._tables import ALERT, Styled

__all__ = ["not_ready_rows", "readiness_fields", "replicator_entry", "replicator_rows",
           "replicator_service_rows", "up_cell"]


def readiness_fields(kind: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    """``ready`` and ``not_ready`` of a service's entry: the components its ``/readyz``
    would report as not ready, by the same pure function, from its ``/v1/status``."""
    from databus._readiness import not_ready

    if kind == "relay":
        from databus.relay._readiness import components_of
    elif kind == "bootstrap":
        from databus.bootstrap._readiness import components_of
    else:
        from databus.replicator._readiness import components_of
    down = [{key: redact(str(v)) if key in ("message", "fix") and v is not None else v
             for key, v in c.items()} for c in not_ready(components_of(doc))]
    return {"ready": not down, "not_ready": down}


def replicator_entry(url: str, status: Answer) -> dict[str, Any]:
    """A replicator's entry (its status server's ``/v1/status``, ``metrics_port``)."""
    if not status.ok:
        return _down(url, status.error or "no answer")
    doc = status.doc
    if not isinstance(doc, Mapping) or "replication" not in doc:
        return _down(url, "/v1/status is not a replicator's status document")
    tables = doc.get("tables")
    return {
        "url": display_url(url),
        "replication": str(doc["replication"]),
        "state": str(doc.get("state")),
        "target": redact(str(doc["target"])) if doc.get("target") is not None else None,
        "applied_scn": _int(doc.get("applied_scn")),
        "relay_max_scn": _int(doc.get("relay_max_scn")),
        "lag_scn": _int(doc.get("lag_scn")),
        "lag_ms": _number(doc.get("lag_ms")),
        "lag_seconds": _number(doc.get("lag_seconds")),
        "batches": _int(doc.get("batches")),
        "errors": _int(doc.get("errors")),
        "last_error": redact(str(doc["last_error"])) if doc.get("last_error") else None,
        "tables": len(tables) if isinstance(tables, Mapping) else None,
        **readiness_fields("replicator", doc),
    }


def up_cell(entry: Mapping[str, Any]) -> str:
    if entry.get("ready", True):
        return Styled("up", "green")
    return Styled("NOT READY", ALERT)


def replicator_service_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The services table's rows of the replicators."""
    from databus._status_render import down_row

    rows: list[tuple[str, ...]] = []
    for entry in document.get("replicators", ()):
        down = down_row("replicator", entry)
        if down is not None:
            rows.append(down)
        else:
            rows.append(("replicator", entry["url"], up_cell(entry),
                         f"replication {entry['replication']}, {entry['state']}"))
    return rows


def not_ready_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(service, url, component, state, error, message, fix) per component not ready:
    what each service's /readyz names, and why."""
    rows: list[tuple[str, ...]] = []
    for kind, key in (("relay", "relays"), ("bootstrap", "bootstraps"),
                      ("replicator", "replicators")):
        for entry in document.get(key, ()):
            for c in entry.get("not_ready") or ():
                at = c.get("buffer") or c.get("source") or c.get("index")
                name = str(c["component"]) + ("" if at is None else f" {at}")
                rows.append((kind, where(entry), name, Styled(str(c["state"]), ALERT),
                             str(c.get("error") or ""), str(c.get("message") or ""),
                             str(c.get("fix") or "")))
    return rows


def replicator_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(url, replication, state, applied SCN, lag SCN, lag, batches, errors, last error)."""
    rows: list[tuple[str, ...]] = []
    for r in document.get("replicators", ()):
        if "error" in r:
            continue
        lag_s = r.get("lag_seconds")
        state = r["state"] if r["ready"] else Styled(r["state"], ALERT)
        rows.append((where(r), r["replication"], state, _count(r["applied_scn"]),
                     _count(r["lag_scn"]), "unknown" if lag_s is None else f"{lag_s:,.1f} s",
                     _count(r["batches"]), _count(r["errors"]), r["last_error"] or ""))
    return rows
