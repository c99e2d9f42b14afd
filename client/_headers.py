"""Stream response headers, parsed as answers that may come from a buggy or hostile
server: anything missing or garbage is a bad answer, failed over and asked again like a
body that fails its CRC, never an exception that stops the client."""

from __future__ import annotations

from collections.abc import Mapping

from databus.checkpoint import Checkpoint
from databus.errors import CheckpointError, EventFormatError


def bad_answer(message: str) -> EventFormatError:
    """A response that cannot be decoded: failed over and asked again like a CRC
    failure (retriable), never raised to the consumer."""
    error = EventFormatError(message, reason="bad header")
    error.retriable = True
    return error


def parse_stream_headers(
    headers: Mapping[str, str], server: str
) -> tuple[Checkpoint, int | None, int | None]:
    """(checkpoint, max SCN, pending event size) of a stream response; a missing or
    garbage header is a bad answer (``bad_answer``)."""
    try:
        checkpoint = Checkpoint.loads(headers["X-Databus-Checkpoint"])
        max_scn = header_int(headers, "X-Databus-Max-Scn")
        pending = header_int(headers, "X-Databus-Pending-Event-Size")
    except (KeyError, ValueError, TypeError, CheckpointError) as exc:
        raise bad_answer(f"{server} sent a bad stream header: {exc}") from None
    if pending is not None and pending <= 0:
        raise bad_answer(f"{server} sent a pending event size of {pending}")
    return checkpoint, max_scn, pending


def header_int(headers: Mapping[str, str], name: str) -> int | None:
    text = headers.get(name)
    if not text:
        return None
    if len(text) > 20:  # more digits than any int64: refuse before int() parses them
        raise ValueError(f"{name} is not a 64-bit integer")
    value = int(text)
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"{name} is not a 64-bit integer")
    return value
