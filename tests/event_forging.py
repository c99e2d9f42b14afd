"""Forging events as a buggy or hostile relay would: fields changed, CRCs recomputed.

The client must not trust a CRC to mean "well-formed": a relay can compute CRCs over
any bytes. These helpers build such bytes for the client's decoder tests.
"""

from __future__ import annotations

import struct
import zlib

from databus.event import (
    EOW_SOURCE_ID,
    HEADER,
    HEADER_SIZE,
    WindowChecksum,
    decode_header,
)

_FIELDS = ("magic", "version", "op", "flags", "header_crc", "body_crc", "total_length",
           "scn", "timestamp_ns", "partition_id", "source_id", "partition_key",
           "schema_fingerprint", "key_length")


def fields(event: bytes) -> dict[str, int]:
    """The raw header fields of ``event`` (no checks)."""
    return dict(zip(_FIELDS, HEADER.unpack_from(event, 0), strict=True))


def reseal(event: bytes | bytearray) -> bytes:
    """``event`` with its body CRC and header CRC recomputed over whatever it holds
    (total_length is left as it is: it may be a lie on purpose)."""
    out = bytearray(event)
    if len(out) < HEADER_SIZE:
        return bytes(out)
    struct.pack_into(">I", out, 8, zlib.crc32(bytes(out[HEADER_SIZE:])))
    crc = zlib.crc32(bytes(out[8:HEADER_SIZE]), zlib.crc32(bytes(out[:4])))
    struct.pack_into(">I", out, 4, crc)
    return bytes(out)


def forge(event: bytes, *, key: bytes | None = None, value: bytes | None = None,
          **changes: int) -> bytes:
    """``event`` with header fields, key or value replaced; lengths and CRCs made to
    match (``total_length``/``key_length`` given explicitly win)."""
    f = fields(event)
    start = HEADER_SIZE
    key_bytes = event[start:start + f["key_length"]]
    value_bytes = event[start + f["key_length"]:f["total_length"]]
    if key is not None:
        key_bytes = key
    if value is not None:
        value_bytes = value
    f["key_length"] = len(key_bytes)
    f["total_length"] = HEADER_SIZE + len(key_bytes) + len(value_bytes)
    f.update(changes)
    header = HEADER.pack(*(f[name] for name in _FIELDS))
    return reseal(header + key_bytes + value_bytes)


def split_events(body: bytes) -> list[bytes]:
    """The events of a well-formed body."""
    out = []
    offset = 0
    while offset < len(body):
        total = decode_header(body, offset).total_length
        out.append(body[offset:offset + total])
        offset += total
    return out


def fix_windows(events: list[bytes]) -> list[bytes]:
    """Recompute every EOW's count and checksum over the data events before it, so a
    forged event passes the window check too (the deepest decode paths are reached)."""
    out = []
    check = WindowChecksum()
    for event in events:
        f = fields(event)
        if f["source_id"] == EOW_SOURCE_ID and f["total_length"] == HEADER_SIZE + 8:
            event = forge(event, value=struct.pack(">II", check.count, check.crc))
            check = WindowChecksum()
        elif f["source_id"] >= 0 and len(event) >= HEADER_SIZE:
            check.add(f["header_crc"])
        out.append(event)
    return out
