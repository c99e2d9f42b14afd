"""Response headers and bodies, read as answers that may come from a buggy or hostile
server: anything missing or garbage is a bad answer, failed over and asked again like a
body that fails its CRC, never an exception that stops the client; a body is never read
past what was asked for (a stream body: ``max_bytes``; a JSON document:
``MAX_JSON_BYTES``), so a server cannot make a reader hold more than that."""

from __future__ import annotations

import json
from collections.abc import Mapping

import aiohttp

from databus.checkpoint import Checkpoint
from databus.client._answers import OVERSIZE, refused
from databus.errors import CheckpointError, EventFormatError

# The largest JSON document a server answers (source lists, schemas, status): far above
# any real one (a schema history of thousands of versions), far below a memory problem.
MAX_JSON_BYTES = 16 << 20


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


async def read_body(resp: aiohttp.ClientResponse, limit: int, server: str) -> bytes:
    """A response body of at most ``limit`` bytes (what was asked for); a longer one is
    refused as it arrives, before more than ``limit`` bytes of it are held."""
    length = resp.content_length
    if length is not None and length > limit:
        raise refused(f"{server} announced a body of {length} bytes in answer to "
                      f"max_bytes={limit}", OVERSIZE)
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise refused(f"{server} sent more than the {limit} bytes asked for "
                          "(max_bytes)", OVERSIZE)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(resp: aiohttp.ClientResponse, server: str) -> object:
    """A JSON document of at most ``MAX_JSON_BYTES`` (``ValueError`` when it is not
    JSON, or too deeply nested to parse)."""
    raw = await read_body(resp, MAX_JSON_BYTES, server)
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"{server} answered a JSON document nested too deeply") from None
