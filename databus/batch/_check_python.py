"""Checking an Avro value's bytes against a check program, without decoding them: the
reference twin of ``_check.pxi`` (compiled into ``databus.batch._native``).

Programs and verdicts are described in ``databus.schemas._program``. The walk reads
each varint, length and index, and answers GOOD, BAD or UNSURE; it never builds a value.
"""

from __future__ import annotations

from collections.abc import Sequence

from databus.schemas._program import (
    ARRAY,
    BAD,
    BOOLEAN,
    BYTES,
    DATE,
    DECIMAL_BYTES,
    DECIMAL_FIXED,
    DOUBLE,
    ENUM,
    FIXED,
    FLOAT,
    GOOD,
    INT,
    LONG,
    MAP,
    NULL,
    RECORD,
    STRING,
    TIME_MICROS,
    TIME_MILLIS,
    TIMESTAMP_MICROS,
    TIMESTAMP_MILLIS,
    UNION,
    UNSURE,
    UUID,
)

# Values every Python type of fastavro's logical readers holds (datetime years 1-9999,
# with a day of margin at each end; time of day): outside them, UNSURE.
DATE_MIN, DATE_MAX = -719162, 2932896
MILLIS_MIN, MILLIS_MAX = -62135596800000 + 86400000, 253402300799999 - 86400000
MICROS_MIN, MICROS_MAX = MILLIS_MIN * 1000, MILLIS_MAX * 1000
DAY_MILLIS, DAY_MICROS = 86400000, 86400000000
# A decimal's unscaled bytes fastavro surely turns into a Decimal (its context's
# exponent limit is far above 64 bytes, about 154 digits).
DECIMAL_BYTES_MAX = 64
MAX_DEPTH = 64  # nesting beyond this (arrays of arrays of ...): UNSURE
_HEX = frozenset(b"0123456789abcdefABCDEF")
_MAYBE_EMPTY = frozenset({NULL, FIXED, DECIMAL_FIXED, RECORD})


class _Unsure(Exception):
    pass


class _Bad(Exception):
    pass


def check_value(program: Sequence[int], data: bytes, start: int = 0,
                end: int | None = None) -> int:
    """The verdict on ``data[start:end]`` as one value of ``program``'s schema."""
    stop = len(data) if end is None else end
    if not 0 <= start <= stop <= len(data):
        raise ValueError(f"check_value range [{start}, {end}) is outside the {len(data)} bytes")
    if not program:
        return UNSURE
    try:
        pos = _node(program, 0, data, start, stop, 0)
    except _Bad:
        return BAD
    except _Unsure:
        return UNSURE
    return GOOD if pos == stop else BAD  # trailing bytes


def _varint(data: bytes, pos: int, stop: int) -> tuple[int, int]:
    """(zigzag-decoded value, next position); BAD when the bytes end inside it, UNSURE
    when it is longer than 10 bytes."""
    shift = 0
    raw = 0
    for n in range(10):
        if pos >= stop:
            raise _Bad
        b = data[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            if n == 9 and b > 1:
                raise _Unsure  # past 64 bits
            return (raw >> 1) ^ -(raw & 1), pos
    raise _Unsure


def _int(data: bytes, pos: int, stop: int, low: int, high: int) -> int:
    value, pos = _varint(data, pos, stop)
    if not low <= value <= high:
        raise _Unsure
    return pos


def _length(data: bytes, pos: int, stop: int) -> tuple[int, int]:
    size, pos = _varint(data, pos, stop)
    if size < 0:
        raise _Unsure
    if size > stop - pos:
        raise _Bad
    return size, pos + size


def _utf8(data: bytes, start: int, end: int) -> None:
    try:
        data[start:end].decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad from None


def _node(prog: Sequence[int], node: int, data: bytes, pos: int, stop: int,
          depth: int) -> int:
    if depth > MAX_DEPTH:
        raise _Unsure
    op = prog[node]
    if op == NULL:
        return pos
    if op == BOOLEAN:
        if pos >= stop:
            raise _Bad
        if data[pos] > 1:
            raise _Unsure
        return pos + 1
    if op == INT:
        return _int(data, pos, stop, -(1 << 31), (1 << 31) - 1)
    if op == LONG:
        return _varint(data, pos, stop)[1]
    if op in (FLOAT, DOUBLE):
        width = 4 if op == FLOAT else 8
        if stop - pos < width:
            raise _Bad
        return pos + width
    if op == BYTES:
        return _length(data, pos, stop)[1]
    if op == STRING:
        size, end = _length(data, pos, stop)
        _utf8(data, end - size, end)
        return end
    if op in (FIXED, DECIMAL_FIXED):
        size = prog[node + 1]
        if stop - pos < size:
            raise _Bad
        if op == DECIMAL_FIXED and size > DECIMAL_BYTES_MAX:
            raise _Unsure
        return pos + size
    if op == ENUM:
        index, pos = _varint(data, pos, stop)
        if index < 0:
            raise _Unsure  # Python indexing accepts it
        if index >= prog[node + 1]:
            raise _Bad
        return pos
    if op in (ARRAY, MAP):
        child = prog[node + 1]
        while True:
            count, pos = _varint(data, pos, stop)
            if count == 0:
                return pos
            if count < 0:
                raise _Unsure  # a block with its byte size: rare, left to the decoder
            if count > stop - pos:
                # More items than bytes: only items that may take no byte (null, a
                # fixed of size 0, a record of such fields) can be there.
                if op == MAP or prog[child] not in _MAYBE_EMPTY:
                    raise _Bad
                raise _Unsure
            for _ in range(count):
                if op == MAP:
                    size, pos = _length(data, pos, stop)
                    _utf8(data, pos - size, pos)
                pos = _node(prog, child, data, pos, stop, depth + 1)
    if op == UNION:
        index, pos = _varint(data, pos, stop)
        if index < 0:
            raise _Unsure
        if index >= prog[node + 1]:
            raise _Bad
        return _node(prog, prog[node + 2 + index], data, pos, stop, depth + 1)
    if op == RECORD:
        for i in range(prog[node + 1]):
            pos = _node(prog, prog[node + 2 + i], data, pos, stop, depth + 1)
        return pos
    if op == DATE:
        return _int(data, pos, stop, DATE_MIN, DATE_MAX)
    if op == TIME_MILLIS:
        return _int(data, pos, stop, 0, DAY_MILLIS - 1)
    if op == TIME_MICROS:
        return _int(data, pos, stop, 0, DAY_MICROS - 1)
    if op == TIMESTAMP_MILLIS:
        return _int(data, pos, stop, MILLIS_MIN, MILLIS_MAX)
    if op == TIMESTAMP_MICROS:
        return _int(data, pos, stop, MICROS_MIN, MICROS_MAX)
    if op == UUID:
        size, end = _length(data, pos, stop)
        text = data[end - size:end]
        if size != 36 or any(text[i] != 0x2D for i in (8, 13, 18, 23)) or not all(
                c in _HEX for i, c in enumerate(text) if i not in (8, 13, 18, 23)):
            _utf8(data, end - size, end)
            raise _Unsure
        return end
    if op == DECIMAL_BYTES:
        size, end = _length(data, pos, stop)
        if size > DECIMAL_BYTES_MAX:
            raise _Unsure
        return end
    raise _Unsure  # an op this walk does not know
