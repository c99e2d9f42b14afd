"""The reference twin of ``_transcode`` (see there): the fetcher's general path itself,
declining (None) wherever that path would not give a plain upsert of the new row, so
that the caller's general path then raises the error or does the special case."""

from __future__ import annotations

from typing import TYPE_CHECKING

from databus.errors import DatabusError
from databus.event import Key
from databus.fetchers.postgres._pgoutput import (
    UNCHANGED_TOAST,
    Insert,
    PgOutputError,
    Update,
    decode,
)

if TYPE_CHECKING:
    from databus.fetchers.postgres._transcode import RowPlan

__all__ = ["IMPLEMENTATION", "transcode_change"]

IMPLEMENTATION = "python"


def transcode_change(payload: bytes, plan: RowPlan) -> tuple[Key, bytes] | None:
    """``(key, avro body)`` of an Insert, or an Update without an old tuple, of the
    plan's table; None to leave the message to the general path."""
    try:
        message = decode(payload)
    except PgOutputError:
        return None
    kind = type(message)
    if kind is Insert or (kind is Update and message.old is None):  # type: ignore[union-attr]
        new = message.new  # type: ignore[union-attr]
    else:
        return None
    codec = plan.codec
    if len(new) != len(plan.codes) or any(
            v is UNCHANGED_TOAST or isinstance(v, bytes) for v in new):
        return None
    try:
        row = codec.convert(new, None)
        if any(row[i] is None for i in codec.not_null_positions):
            return None  # a NOT NULL column NULL in the log: a schema version of its own
        return codec.key(row), codec.encode(row)
    except DatabusError:
        return None
