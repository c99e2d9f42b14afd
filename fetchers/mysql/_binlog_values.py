"""The row-image decoder: a binlog row's bytes to values in the fetcher's Avro-native
form (see ``_types`` for the mapping). Pure."""

from __future__ import annotations

import codecs
import datetime as _dt
import json
import struct
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.json_binary import parse_json

from databus.errors import SourceError
from databus.fetchers.mysql._avro_writers import _DOUBLE, _FLOAT, row_writers
from databus.fetchers.mysql._keys import _EPOCH_ORDINAL, _US_PER_DAY
from databus.fetchers.mysql._types import (
    ColumnSpec,
    Kind,
    Native,
    Reader,
)

__all__ = ["RowDecoder", "python_codec"]

# -- the row-image decoder ------------------------------------------------------------

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_S8 = struct.Struct("<b")
_S16 = struct.Struct("<h")
_S32 = struct.Struct("<i")
_S64 = struct.Struct("<q")
_U8 = struct.Struct("<B")
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_TIMEF_INT_OFS = 0x800000
_TIMEF_OFS = 0x800000000000
_DATETIMEF_INT_OFS = 0x8000000000

# MySQL charset names whose Python codec has another name. latin1 is really cp1252
# (with 5 holes that MySQL maps like ISO-8859-1: see _latin1_holes).
_CODECS = {
    "utf8": "utf-8",
    "utf8mb3": "utf-8",
    "utf8mb4": "utf-8",
    "latin1": "cp1252",
    "ucs2": "utf-16-be",
    "utf16": "utf-16-be",
    "utf16le": "utf-16-le",
    "utf32": "utf-32-be",
    "ujis": "euc_jp",
    "eucjpms": "euc_jp",
    "euckr": "euc_kr",
    "tis620": "tis_620",
    "greek": "iso8859_7",
    "hebrew": "iso8859_8",
    "latin2": "iso8859_2",
    "latin5": "iso8859_9",
    "latin7": "iso8859_13",
    "macce": "mac_latin2",
    "macroman": "mac_roman",
    "koi8r": "koi8_r",
    "koi8u": "koi8_u",
}
_ERRORS = "databus_mysql_text"


def _text_errors(exc: UnicodeError) -> tuple[str, int]:
    """Bytes a codec cannot map: as ISO-8859-1 characters (exactly MySQL's latin1 for
    cp1252's five holes), so text never fails to decode and nothing is dropped."""
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    return exc.object[exc.start : exc.end].decode("latin-1"), exc.end


codecs.register_error(_ERRORS, _text_errors)


def python_codec(charset: str | None) -> str:
    """The Python codec for a MySQL charset (or the library's encoding name for it).

    A charset Python has no codec for (swe7, dec8, hp8, keybcs2, armscii8, geostd8) is
    read as ISO-8859-1: ASCII stays right, other bytes come through one per character.
    """
    if charset is None:
        return "utf-8"
    name = _CODECS.get(charset.lower(), charset.lower())
    try:
        codecs.lookup(name)
    except LookupError:
        return "latin-1"
    return name


def _int_reader(size: int, unsigned: bool) -> Reader:
    if size == 3:
        if unsigned:
            return lambda buf, pos: (int.from_bytes(buf[pos : pos + 3], "little"), pos + 3)
        return lambda buf, pos: (
            int.from_bytes(buf[pos : pos + 3], "little", signed=True),
            pos + 3,
        )
    st = {
        (1, False): _S8, (1, True): _U8, (2, False): _S16, (2, True): _U16,
        (4, False): _S32, (4, True): _U32, (8, False): _S64, (8, True): _U64,
    }[(size, unsigned)]
    unpack = st.unpack_from

    def read(buf: bytes, pos: int) -> tuple[int, int]:
        return unpack(buf, pos)[0], pos + size

    return read


def _decimal_reader(precision: int, scale: int) -> Reader:
    intg = precision - scale
    intg0, intg0x = divmod(intg, 9)
    frac0, frac0x = divmod(scale, 9)
    head = _DIG2BYTES[intg0x]
    tail = _DIG2BYTES[frac0x]
    size = head + 4 * intg0 + 4 * frac0 + tail
    tail_scale = 10**frac0x

    def read(buf: bytes, pos: int) -> tuple[int, int]:
        data = bytearray(buf[pos : pos + size])
        negative = not data[0] & 0x80
        data[0] ^= 0x80
        if negative:
            data = bytearray(b ^ 0xFF for b in data)
        off = 0
        value = 0
        if head:
            value = int.from_bytes(data[:head], "big")
            off = head
        for _ in range(intg0 + frac0):
            value = value * 1_000_000_000 + int.from_bytes(data[off : off + 4], "big")
            off += 4
        if tail:
            value = value * tail_scale + int.from_bytes(data[off : off + tail], "big")
        return (-value if negative else value), pos + size

    return read


def _fsp_bytes(fsp: int) -> int:
    return (fsp + 1) // 2


def _frac_micros(data: bytes, fsp: int, *, signed: bool) -> int:
    """The fractional part of a TIME2/DATETIME2/TIMESTAMP2 in microseconds."""
    n = _fsp_bytes(fsp)
    if n == 0:
        return 0
    value = int.from_bytes(data, "big", signed=signed)
    return value * (10_000, 100, 1)[n - 1]


def _date_value(year: int, month: int, day: int) -> int | str:
    try:
        return _dt.date(year, month, day).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return f"{year:04d}-{month:02d}-{day:02d}"


def _datetime_value(
    year: int, month: int, day: int, hour: int, minute: int, second: int, micros: int, fsp: int
) -> int | str:
    try:
        days = _dt.date(year, month, day).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        text = f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
        if fsp:
            text += "." + f"{micros:06d}"[:fsp]
        return text
    return days * _US_PER_DAY + ((hour * 60 + minute) * 60 + second) * 1_000_000 + micros


def _read_date(buf: bytes, pos: int) -> tuple[int | str, int]:
    v = int.from_bytes(buf[pos : pos + 3], "little")
    return _date_value(v >> 9, (v >> 5) & 15, v & 31), pos + 3


def _time2_reader(fsp: int) -> Reader:
    n = _fsp_bytes(fsp)

    def read(buf: bytes, pos: int) -> tuple[int, int]:
        if n == 3:
            packed = int.from_bytes(buf[pos : pos + 6], "big") - _TIMEF_OFS
        else:
            intpart = int.from_bytes(buf[pos : pos + 3], "big") - _TIMEF_INT_OFS
            frac = int.from_bytes(buf[pos + 3 : pos + 3 + n], "big") if n else 0
            if intpart < 0 and frac:
                # Negative times store the fraction counted down from the next second.
                intpart += 1
                frac -= 1 << (8 * n)
            packed = (intpart << 24) + frac * (10_000, 100)[n - 1] if n else intpart << 24
        negative = packed < 0
        if negative:
            packed = -packed
        hms = packed >> 24
        micros = (
            ((((hms >> 12) & 0x3FF) * 60 + ((hms >> 6) & 0x3F)) * 60 + (hms & 0x3F)) * 1_000_000
            + (packed & 0xFFFFFF)
        )
        return (-micros if negative else micros), pos + 3 + n

    return read


def _datetime2_reader(fsp: int) -> Reader:
    n = _fsp_bytes(fsp)

    def read(buf: bytes, pos: int) -> tuple[int | str, int]:
        intpart = int.from_bytes(buf[pos : pos + 5], "big") - _DATETIMEF_INT_OFS
        micros = _frac_micros(buf[pos + 5 : pos + 5 + n], fsp, signed=True)
        if intpart < 0:
            # Not produced by MySQL for DATETIME; keep the raw number rather than guess.
            raise SourceError(f"negative DATETIME2 value {intpart} in the binlog")
        ymd, hms = intpart >> 17, intpart & 0x1FFFF
        ym = ymd >> 5
        value = _datetime_value(
            ym // 13, ym % 13, ymd & 31, hms >> 12, (hms >> 6) & 0x3F, hms & 0x3F, micros, fsp
        )
        return value, pos + 5 + n

    return read


def _timestamp2_reader(fsp: int) -> Reader:
    n = _fsp_bytes(fsp)

    def read(buf: bytes, pos: int) -> tuple[int, int]:
        seconds = int.from_bytes(buf[pos : pos + 4], "big")
        micros = _frac_micros(buf[pos + 4 : pos + 4 + n], fsp, signed=False)
        return seconds * 1_000_000 + micros, pos + 4 + n

    return read


def _read_old_time(buf: bytes, pos: int) -> tuple[int, int]:
    v = int.from_bytes(buf[pos : pos + 3], "little", signed=True)
    sign = -1 if v < 0 else 1
    v = abs(v)
    seconds = (v // 10000) * 3600 + (v // 100 % 100) * 60 + v % 100
    return sign * seconds * 1_000_000, pos + 3


def _read_old_datetime(buf: bytes, pos: int) -> tuple[int | str, int]:
    v = _U64.unpack_from(buf, pos)[0]
    d, t = divmod(v, 1_000_000)
    value = _datetime_value(
        d // 10000, d // 100 % 100, d % 100, t // 10000, t // 100 % 100, t % 100, 0, 0
    )
    return value, pos + 8


def _read_old_timestamp(buf: bytes, pos: int) -> tuple[int, int]:
    return _U32.unpack_from(buf, pos)[0] * 1_000_000, pos + 4


def _read_year(buf: bytes, pos: int) -> tuple[int, int]:
    v = buf[pos]
    return (1900 + v if v else 0), pos + 1


def _read_float(buf: bytes, pos: int) -> tuple[float, int]:
    return _FLOAT.unpack_from(buf, pos)[0], pos + 4


def _read_double(buf: bytes, pos: int) -> tuple[float, int]:
    return _DOUBLE.unpack_from(buf, pos)[0], pos + 8


def _length_reader(size: int) -> Callable[[bytes, int], tuple[int, int]]:
    if size == 1:
        return lambda buf, pos: (buf[pos], pos + 1)
    return lambda buf, pos: (int.from_bytes(buf[pos : pos + size], "little"), pos + size)


def _blob_reader(size: int) -> Reader:
    length_of = _length_reader(size)

    def read(buf: bytes, pos: int) -> tuple[bytes, int]:
        length, pos = length_of(buf, pos)
        end = pos + length
        return buf[pos:end], end

    return read


def _text_reader(size: int, codec: str) -> Reader:
    length_of = _length_reader(size)

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        length, pos = length_of(buf, pos)
        end = pos + length
        return buf[pos:end].decode(codec, _ERRORS), end

    return read


def _padded_reader(size: int, fixed_length: int) -> Reader:
    """BINARY(n): MySQL strips trailing NULs in row images; SELECT returns n bytes."""
    read_raw = _blob_reader(size)

    def read(buf: bytes, pos: int) -> tuple[bytes, int]:
        data, pos = read_raw(buf, pos)
        return data.ljust(fixed_length, b"\x00"), pos

    return read


def _enum_reader(size: int, labels: tuple[str, ...]) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[str, int]:
        index = int.from_bytes(buf[pos : pos + size], "little")
        if index >= len(labels):
            raise SourceError(f"ENUM index {index} beyond its {len(labels) - 1} labels")
        return labels[index], pos + size

    return read


def _set_reader(size: int, labels: tuple[str, ...]) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[list[str], int]:
        mask = int.from_bytes(buf[pos : pos + size], "little")
        return [label for i, label in enumerate(labels) if mask >> i & 1], pos + size

    return read


def _bits_reader(width: int) -> Reader:
    size = (width + 7) // 8

    def read(buf: bytes, pos: int) -> tuple[bytes, int]:
        return buf[pos : pos + size], pos + size

    return read


def _read_bool(buf: bytes, pos: int) -> tuple[bool, int]:
    return buf[pos] != 0, pos + 1


def _json_text(value: Any) -> Any:
    """The library's parse of MySQL binary JSON, made ``json.dumps``-able."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_json_text(k): _json_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_text(v) for v in value]
    if isinstance(value, Decimal):
        return float(value) if value != value.to_integral_value() else int(value)
    if isinstance(value, _dt.date | _dt.datetime | _dt.time | _dt.timedelta):
        return str(value)
    return value


def _json_reader(size: int) -> Reader:
    read_raw = _blob_reader(size)

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        data, pos = read_raw(buf, pos)
        if not data:
            return "null", pos
        doc = _json_text(parse_json(data[0], data[1:]))
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")), pos

    return read


def _reader(column: ColumnSpec) -> Reader:
    """How to read one non-NULL value of ``column`` from a row image."""
    t = column.type_code
    kind = column.kind
    int_sizes = {FIELD_TYPE.TINY: 1, FIELD_TYPE.SHORT: 2, FIELD_TYPE.INT24: 3,
                 FIELD_TYPE.LONG: 4, FIELD_TYPE.LONGLONG: 8}
    if t in int_sizes:
        return _int_reader(int_sizes[t], column.unsigned)
    if t == FIELD_TYPE.FLOAT:
        return _read_float
    if t == FIELD_TYPE.DOUBLE:
        return _read_double
    if t == FIELD_TYPE.NEWDECIMAL:
        return _decimal_reader(column.precision, column.scale)
    if t == FIELD_TYPE.YEAR:
        return _read_year
    if t == FIELD_TYPE.DATE:
        return _read_date
    if t == FIELD_TYPE.TIME2:
        return _time2_reader(column.precision)
    if t == FIELD_TYPE.DATETIME2:
        return _datetime2_reader(column.precision)
    if t == FIELD_TYPE.TIMESTAMP2:
        return _timestamp2_reader(column.precision)
    if t == FIELD_TYPE.TIME:
        return _read_old_time
    if t == FIELD_TYPE.DATETIME:
        return _read_old_datetime
    if t == FIELD_TYPE.TIMESTAMP:
        return _read_old_timestamp
    if t == FIELD_TYPE.BIT:
        return _read_bool if kind is Kind.BOOL else _bits_reader(column.precision)
    if t == FIELD_TYPE.ENUM:
        return _enum_reader(column.length_size, column.labels)
    if t == FIELD_TYPE.SET:
        return _set_reader(column.length_size, column.labels)
    if t == FIELD_TYPE.JSON:
        return _json_reader(column.length_size)
    if t in (FIELD_TYPE.STRING, FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.BLOB,
             FIELD_TYPE.GEOMETRY):
        if column.codec is not None:
            return _text_reader(column.length_size, column.codec)
        if column.fixed_length:
            return _padded_reader(column.length_size, column.fixed_length)
        return _blob_reader(column.length_size)
    raise SourceError(
        f"column {column.name!r}: binlog field type {t} is not supported "
        "(old pre-5.6 temporal or decimal formats: rebuild the table with ALTER TABLE ... FORCE)"
    )


class RowDecoder:
    """Reads the row images of one table layout out of a rows event's body.

    A row image is a NULL bitmap (one bit per column present in the event, here always
    all of them: FULL row image) followed by the non-NULL values in column order.
    """

    __slots__ = ("_readers", "columns", "null_bytes", "writers")

    def __init__(self, columns: Sequence[ColumnSpec]) -> None:
        self.columns = tuple(columns)
        self._readers = tuple(_reader(c) for c in self.columns)
        self.writers = row_writers(self.columns)
        self.null_bytes = (len(self.columns) + 7) // 8

    def read_row(self, buf: bytes, pos: int) -> tuple[list[Native], int]:
        """The values of the row image at ``pos`` and the position after it."""
        nulls = buf[pos : pos + self.null_bytes]
        if len(nulls) < self.null_bytes:
            raise SourceError("truncated row image in the binlog")
        pos += self.null_bytes
        values: list[Native] = []
        append = values.append
        for i, read in enumerate(self._readers):
            if nulls[i >> 3] >> (i & 7) & 1:
                append(None)
            else:
                value, pos = read(buf, pos)
                append(value)
        if pos > len(buf):
            raise SourceError("truncated row image in the binlog")
        return values, pos

    def read_rows(self, buf: bytes, images_per_row: int) -> list[list[list[Native]]]:
        """Every row of an event body: ``images_per_row`` is 2 for updates (before,
        after), 1 for inserts and deletes."""
        rows = []
        pos, end = 0, len(buf)
        while pos < end:
            images = []
            for _ in range(images_per_row):
                values, pos = self.read_row(buf, pos)
                images.append(values)
            rows.append(images)
        return rows

