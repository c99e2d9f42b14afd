"""What a target raises: retriable when the database went away, not when it refused.

The replicator's core decides between backoff and stopping from ``retriable`` alone
(``databus.errors``): a lost connection, a server restarting, a deadlock or a full
disk may pass, a value the column cannot hold or a violated constraint will not.
Every message names the target by its redacted URL (``where``), never its password
(``DatabusError`` redacts registered secrets once more when it is built).
"""

from __future__ import annotations

from typing import Any

from databus.errors import ConnectionLostError, DatabusError

__all__ = ["ReplicationApplyError", "TargetError", "TargetUnavailableError", "show_key"]

_MAX_VALUE_CHARS = 64


class TargetError(DatabusError):
    """The target refused an operation and retrying cannot help: a missing privilege, a
    table that cannot be created or altered, a wrong database name."""

    code = "target_error"


class TargetUnavailableError(ConnectionLostError):
    """The target cannot be reached now (down, restarting, connection lost, deadlock
    victim): the same call may succeed later. After one from ``apply``, the batch may
    or may not have committed (the answer to COMMIT can be lost): applying it again is
    harmless, as every change sets a row to its state after the change."""

    code = "target_unavailable"


class ReplicationApplyError(TargetError):
    """A batch the target refuses: a value a column cannot hold, a violated constraint.

    ``table`` is the target table (``schema.table``), ``source`` the source it comes
    from; ``key`` and ``scn`` the refused change when it could be found (each change
    of the table tried alone), else None and the batch's SCN range
    (``first_scn``..``last_scn``) says where to look. Nothing of the batch was applied."""

    code = "replication_apply"

    def __init__(self, message: str, *, table: str | None = None, source: str | None = None,
                 key: tuple[Any, ...] | None = None, scn: int | None = None,
                 first_scn: int | None = None, last_scn: int | None = None) -> None:
        super().__init__(message)
        self.table = table
        self.source = source
        self.key = key
        self.scn = scn
        self.first_scn = first_scn
        self.last_scn = last_scn


def show_key(key: tuple[Any, ...]) -> str:
    """A key for a message: each value's repr, long ones cut (a key may be a blob)."""
    shown = []
    for value in key:
        text = repr(value)
        if len(text) > _MAX_VALUE_CHARS:
            text = text[: _MAX_VALUE_CHARS - 3] + "..."
        shown.append(text)
    return "(" + ", ".join(shown) + ")"
