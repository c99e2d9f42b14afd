"""The checkpoint *envelope*: the bytes the file and ZooKeeper stores, and the
PostgreSQL store's ``checkpoint`` column, hold (DESIGN 3 and 10).

``encode_envelope`` writes it as one line of ASCII, and ``decode_envelope`` reads it back
in any JSON layout::

    {"format":1,"checkpoint":{"window_scn":1234,"window_offset":-1,"mode":"online"},
     "crc32":1326147160,"written_at":"2025-01-31T12:00:00.000+00:00"}

``crc32`` is the CRC-32 of the canonical JSON of ``checkpoint``: sorted keys, no
whitespace, ASCII only. This is what ``Checkpoint.dumps`` writes. A flipped byte that
still parses as JSON, such as one digit of ``window_scn``, is therefore caught.
``written_at`` is for people reading the file and is not covered by the CRC.
"""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime
from typing import Any, Final

from databus.checkpoint import Checkpoint
from databus.errors import CheckpointError

__all__ = ["ENVELOPE_FORMAT", "MAX_ENVELOPE_BYTES", "decode_envelope", "encode_envelope"]




ENVELOPE_FORMAT: Final = 1
# A real envelope is well under 1 KB. The cap keeps a huge or wrong file from being read
# into memory, and it matches ZooKeeper's default znode size limit (jute.maxbuffer).
MAX_ENVELOPE_BYTES: Final = 1 << 20
_ENVELOPE_FIELDS: Final = ("format", "checkpoint", "crc32", "written_at")


def _canonical_crc(body: object) -> int:
    """CRC-32 of the canonical JSON of ``body``.

    This is the same text ``Checkpoint.dumps`` writes, and it does not depend on how the
    bytes were laid out. PostgreSQL's jsonb reorders keys and adds spaces, and an envelope
    stored in a jsonb column must still verify.
    """
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return zlib.crc32(text.encode("ascii"))


def encode_envelope(checkpoint: Checkpoint, *, written_at: datetime | None = None) -> bytes:
    """The envelope of ``checkpoint``: one line of ASCII JSON, newline-terminated."""
    body = checkpoint.to_json()
    when = (written_at or datetime.now(UTC)).isoformat(timespec="milliseconds")
    envelope = {
        "format": ENVELOPE_FORMAT,
        "checkpoint": body,
        "crc32": _canonical_crc(body),
        "written_at": when,
    }
    text = json.dumps(envelope, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return (text + "\n").encode("ascii")


class _Corrupt(Exception):
    """Internal: what is wrong with an envelope. ``decode_envelope`` adds where and how to fix."""


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads silently keeps the last duplicate key. A writer of ours never repeats a
    # key, so a repeated key means the bytes were altered.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Corrupt(f"the JSON repeats the key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise _Corrupt(f"the JSON holds {name}, which no checkpoint contains")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_envelope(raw: bytes) -> Checkpoint:
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise _Corrupt(f"it is more than {MAX_ENVELOPE_BYTES} bytes, far more than any "
                       "checkpoint envelope")
    if not raw.strip():
        raise _Corrupt("it is empty" if not raw else "it holds only whitespace")
    if not raw.strip(b"\x00"):
        # What some filesystems show after a power cut lost a write that was not fsynced.
        raise _Corrupt(f"it holds only NUL bytes ({len(raw)} of them)")
    try:
        # Our writer emits ASCII (non-ASCII is \u-escaped), but UTF-8 is accepted: a jsonb
        # column gives the envelope back with the escapes decoded.
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Corrupt(f"it is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                       f"{exc.start})") from None
    try:
        doc = json.loads(text, object_pairs_hook=_reject_duplicates,
                         parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        # An envelope starts with "{" and ends with "}". When the start is there and the
        # parser ran out of input, or the closing brace is missing, the likeliest story
        # is a cut-off write.
        stripped = text.strip()
        at_end = exc.pos >= len(text.rstrip())
        if stripped.startswith("{") and (at_end or not stripped.endswith("}")):
            raise _Corrupt(f"it looks truncated: the JSON stops after {len(raw)} bytes "
                           f"without its closing brace ({exc.msg} at byte {exc.pos})") from None
        raise _Corrupt(f"it is not valid JSON: {exc.msg} at byte {exc.pos}") from None
    if not isinstance(doc, dict):
        raise _Corrupt(f"it holds a JSON {type(doc).__name__}, not an envelope object")
    # The format is checked first: a newer format may use fields this version does not
    # know, and "written by a newer databus" is then the useful message.
    if "format" not in doc:
        raise _Corrupt("it has no 'format' field, so it is not a databus checkpoint envelope")
    fmt = doc["format"]
    if not _is_int(fmt) or fmt != ENVELOPE_FORMAT:
        raise _Corrupt(f"it has envelope format {fmt!r}, and this version of databus reads "
                       f"only format {ENVELOPE_FORMAT} (was it written by another version?)")
    missing = [name for name in _ENVELOPE_FIELDS if name not in doc]
    if missing:
        raise _Corrupt(f"it lacks the field(s) {', '.join(missing)}")
    unknown = sorted(set(doc) - set(_ENVELOPE_FIELDS))
    if unknown:
        raise _Corrupt(f"it has unknown field(s) {', '.join(unknown)}")
    body, crc, written_at = doc["checkpoint"], doc["crc32"], doc["written_at"]
    if not isinstance(body, dict):
        raise _Corrupt(f"its 'checkpoint' is a JSON {type(body).__name__}, not an object")
    if not _is_int(crc) or not 0 <= crc <= 0xFFFFFFFF:
        raise _Corrupt(f"its crc32 {crc!r} is not a 32-bit unsigned integer")
    if not isinstance(written_at, str):
        raise _Corrupt(f"its written_at {written_at!r} is not a string")
    try:
        datetime.fromisoformat(written_at)
    except ValueError:
        raise _Corrupt(f"its written_at {written_at!r} is not an ISO 8601 timestamp") from None
    actual = _canonical_crc(body)
    if actual != crc:
        raise _Corrupt(f"its checksum does not match: stored crc32 {crc}, content {actual} "
                       "(the checkpoint was altered or damaged)")
    try:
        return Checkpoint.from_json(body)
    except CheckpointError as exc:
        raise _Corrupt(f"it holds an impossible checkpoint: {exc.message}") from None
    except TypeError as exc:  # cannot happen after from_json's checks; belt and braces
        raise _Corrupt(f"it holds an impossible checkpoint: {exc}") from None


def decode_envelope(raw: bytes, *, where: str, recovery: str) -> Checkpoint:
    """Parse and verify an envelope. Raises ``CheckpointError`` if it is damaged in any way.

    ``where`` names the stored object, e.g. ``checkpoint file /var/lib/x.json``.
    ``recovery`` tells the user what to do about it. Both go into the error message.
    """
    try:
        return _parse_envelope(raw)
    except _Corrupt as exc:
        raise CheckpointError(f"{where} is unreadable: {exc}. {recovery}") from None


