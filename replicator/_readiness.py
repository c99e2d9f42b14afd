"""``GET /readyz`` of the replicator's status server (DESIGN section 17;
docs/replicator.md, "Status"): its one component, ready while it applies. The document,
the metrics and the answer are databus/_readiness.py's; ``components_of`` is pure: it
reads the replicator's ``/v1/status`` (``databus status --replicator`` applies it too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from databus._readiness import component

__all__ = ["STATES", "components_of"]

STATES = {"replicator": ("starting", "running", "retrying", "stopped", "exited", "failed")}
_FIX = {
    "starting": "wait: it is reading its position from the target and the relay's schemas",
    "retrying": "see the message: the target does not take the batch; it retries by "
                "itself once the target answers again",
    "failed": "fix the cause in the message, then start the replicator again",
    "stopped": "fix the cause in the message, then start the replicator again",
    "exited": "the replicator was asked to stop; start it again",
}


def components_of(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The replicator's one component (pure, from its ``/v1/status``): ready while it
    applies (``running``)."""
    state = str(status.get("state"))
    # A stop on an error it must not pass carries its own message and fix.
    return [component("replicator", state, state == "running",
                      message=status.get("message") or status.get("last_error")
                      or f"replication {status.get('replication')} is {state}",
                      fix=status.get("fix") or _FIX.get(state))]
