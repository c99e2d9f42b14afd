"""The reference twin of ``_transcode`` (see there): the fetcher's general path itself,
declining (None) wherever that path would not give a plain upsert of the new row, so
that the caller's general path then raises the error or does the special case."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
    from databus.fetchers.postgres._changes import TableCodec
    from databus.fetchers.postgres._transcode import RowPlan

__all__ = ["IMPLEMENTATION", "copy_row_texts", "reference_row", "transcode_change",
           "transcode_copy_rows"]

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


# -- a dump chunk: COPY ... TO STDOUT (text format) -----------------------------------------

_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.DOTALL)
_LETTERS = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}


def _unescaped(match: re.Match[bytes]) -> bytes:
    octal, hexa, other = match.groups()
    if octal is not None:
        return bytes([int(octal, 8) & 0xFF])
    if hexa is not None:
        return bytes([int(hexa, 16)])
    return _LETTERS.get(other, other)


def _fields(line: bytes) -> list[bytes]:
    """A COPY row's fields, still escaped: split at the tabs no backslash escapes."""
    if b"\\" not in line:
        return line.split(b"\t")
    fields: list[bytes] = []
    start = i = 0
    while i < len(line):
        c = line[i]
        if c == 0x5C:  # a backslash escapes the next byte, a tab too
            if i + 1 >= len(line):
                raise ValueError("a COPY row ends in a backslash")
            i += 2
            continue
        if c == 0x09:
            fields.append(line[start:i])
            start = i + 1
        i += 1
    fields.append(line[start:])
    return fields


def copy_row_texts(line: bytes, ncols: int) -> tuple[str | None, ...]:
    """The text values of one COPY text-format row (without its newline) as COPY FROM
    reads them: ``\\N`` is NULL; \\b \\f \\n \\r \\t \\v, \\ooo octal,
    \\xh[h] hex and any other escaped byte itself; then UTF-8."""
    values: list[str | None] = []
    for field in _fields(line):
        if field == b"\\N":
            values.append(None)
        elif b"\\" in field:
            values.append(_ESCAPE.sub(_unescaped, field).decode("utf-8"))
        else:
            values.append(field.decode("utf-8"))
    if len(values) != ncols:
        raise ValueError(f"a COPY row of {len(values)} fields, the table has {ncols} columns")
    return tuple(values)


def reference_row(texts: Sequence[str | None], codec: TableCodec) -> tuple[Key, bytes]:
    """The general path of one dumped row's text values: its key and Avro body (or the
    converter's error)."""
    row = codec.convert(texts, None)
    return codec.key(row), codec.encode(row)


def transcode_copy_rows(data: bytes, codec: TableCodec, row_type: Any = None
                        ) -> tuple[list[Any], list[str | None] | None]:
    """The rows of ``COPY (...) TO STDOUT`` (text format, UTF-8) of ``codec``'s table as
    ``(key, avro body)`` (or ``row_type(key, body, codec.fingerprint)``), and the last
    row's key columns as text (None without rows)."""
    if row_type is not None and not (isinstance(row_type, type) and getattr(
            row_type, "__slots__", None) == ("key", "value", "fingerprint")):
        raise TypeError("row_type: a class of the slots key, value, fingerprint")
    ncols = len(codec.relation.columns)
    lines = data.split(b"\n")
    incomplete = lines.pop()  # b"" after the last row's newline
    rows: list[Any] = []
    texts: tuple[str | None, ...] = ()
    for line in lines:  # row by row: the first error is the native twin's first error
        texts = copy_row_texts(line, ncols)
        key, body = reference_row(texts, codec)
        rows.append((key, body) if row_type is None
                    else row_type(key, body, codec.fingerprint))
    if incomplete:
        raise ValueError("a COPY row without its newline")
    return rows, ([texts[i] for i in codec.key_positions] if rows else None)
