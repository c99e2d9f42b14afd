"""pgoutput's text values -> Python values (pure): the parsers of each type's text output
that ``_types.column_mapping`` puts behind a column's mapping. Each parser takes the
output of its type (PostgreSQL 15, the fetcher's session settings: ``CONNECTION_OPTIONS``
of ``_types``) and returns the value fastavro writes for the column's Avro type; any other
text raises ``PgValueError`` through ``guarded`` (never another exception).

``_types`` has the table of types, Avro types and values, and the decisions (unions with a
string branch for infinity, BC, years past 9999 and ``24:00:00``; intervals as ISO 8601;
arrays of any dimension).
"""

from __future__ import annotations

import datetime as dt
import re
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from databus.errors import SchemaError

__all__ = [
    "MAX_DIMENSIONS",
    "Converter",
    "PgValueError",
    "as_is",
    "bad_value",
    "decimal_parser",
    "guarded",
    "int_parser",
    "parse_array",
    "parse_bool",
    "parse_bytea",
    "parse_date",
    "parse_double",
    "parse_interval",
    "parse_numeric_text",
    "parse_real",
    "parse_time",
    "parse_timestamp",
    "parse_timestamptz",
]

Converter = Callable[[str], Any]

MAX_DIMENSIONS = 6  # PostgreSQL's MAXDIM
_VALUE_CHARS = 60  # of a bad value, in an error message


class PgValueError(SchemaError):
    """A text value that is not a valid output of its column's type (or, for
    ``numeric(p,s)``, NaN, which no Avro decimal holds). Names the type and the value
    (truncated)."""

    code = "bad_source_value"


def bad_value(sql_type: str, text: object, why: str = "") -> PgValueError:
    shown = text if isinstance(text, str) else repr(text)
    if len(shown) > _VALUE_CHARS:
        shown = shown[:_VALUE_CHARS] + "..."
    message = f"{sql_type} value {shown!r} is not PostgreSQL output of its type"
    return PgValueError(f"{message}: {why}" if why else message)


def guarded(sql_type: str, parse: Callable[[str], Any]) -> Converter:
    def convert(text: str) -> Any:
        if text is None:
            return None
        try:
            return parse(text)
        except PgValueError:
            raise
        except (ValueError, TypeError, ArithmeticError, IndexError, KeyError,
                AttributeError) as exc:
            raise bad_value(sql_type, text, str(exc) or type(exc).__name__) from None

    return convert


def as_is(text: str) -> Any:
    return text


_INT = re.compile(r"-?[0-9]{1,19}\Z")


def int_parser(low: int, high: int) -> Callable[[str], Any]:
    """Integer output within [low, high] (the column type's range)."""

    def parse(text: str) -> Any:
        if not _INT.match(text):
            raise ValueError("not an integer")
        value = int(text)
        if not low <= value <= high:
            raise ValueError("out of range")
        return value

    return parse


_FLOAT = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?\Z|NaN\Z|-?Infinity\Z")
_FLOAT32 = struct.Struct("<f")


def parse_double(text: str) -> Any:
    if not _FLOAT.match(text):
        raise ValueError("not a float")
    return float(text)


def parse_real(text: str) -> Any:
    value = parse_double(text)
    _FLOAT32.pack(value)  # OverflowError beyond real's range (shortest texts round)
    return value


def parse_bool(text: str) -> Any:
    if text == "t":
        return True
    if text == "f":
        return False
    raise ValueError("not t or f")


_NUMERIC = re.compile(r"-?[0-9]+(?:\.[0-9]+)?\Z")


def parse_numeric_text(text: str) -> Any:
    if _NUMERIC.match(text) or text in ("NaN", "Infinity", "-Infinity"):
        return text
    raise ValueError("not a number")


_DECIMAL = re.compile(r"-?0*([0-9]*?)(?:\.([0-9]+))?\Z")


def decimal_parser(sql_type: str, precision: int, scale: int) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        m = _DECIMAL.match(text) if _NUMERIC.match(text) else None
        if m is None:
            if text in ("NaN", "Infinity", "-Infinity"):
                raise PgValueError(
                    f"{sql_type} value {text!r}: an Avro decimal cannot hold it; declare "
                    "the column numeric (no precision and scale) to capture it, as text")
            raise ValueError("not a number")
        # Digits of the unscaled value: the integer part's (no leading zeros) + scale.
        if len(m[2] or "") > scale or len(m[1]) + scale > precision:
            raise ValueError(f"does not fit decimal({precision},{scale})")
        value = Decimal(text)
        # A negative zero ("-0", "-0.00"; PostgreSQL itself prints none) is zero: the
        # Avro writer would encode its sign as a unit of the last place (-0.01).
        return value if value else value.copy_abs()

    return parse


_BYTEA_ESCAPE = re.compile(r"\\(\\|[0-3][0-7][0-7])")


def parse_bytea(text: str) -> Any:
    if text.startswith("\\x"):
        digits = text[2:]
        if digits and not (digits.isascii() and digits.isalnum()):  # fromhex skips spaces
            raise ValueError("bad hex format")
        return bytes.fromhex(digits)  # ValueError: odd length, not hex digits
    # bytea_output = escape: printable ASCII as is, \\ for a backslash, \ooo otherwise.
    if "\\" not in text:
        return text.encode("ascii")
    parts = _BYTEA_ESCAPE.split(text)
    out = bytearray()
    for i, part in enumerate(parts):
        if i % 2:
            out.append(92 if part == "\\" else int(part, 8))
        elif "\\" in part:
            raise ValueError("bad escape format")
        else:
            out += part.encode("ascii")
    return bytes(out)


# -- dates and times ---------------------------------------------------------------

UTC = dt.UTC
_DATE = re.compile(r"([0-9]{4,7})-([0-9]{2})-([0-9]{2})( BC)?\Z")
_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?\Z")
_TIMESTAMP = re.compile(
    r"([0-9]{4,7})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]{1,6}))?"
    r"(?:([+-])([0-9]{2})(?::([0-9]{2}))?(?::([0-9]{2}))?)?( BC)?\Z")
_INFINITIES = ("infinity", "-infinity")
_USEC_PER_DAY = 86_400_000_000
_STYLE = "not DateStyle ISO output (the fetcher's connection sets DateStyle=ISO)"


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date; ``year`` astronomical
    (1 BC = 0), as PostgreSQL counts."""
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (month <= 2), month, day


def _check_date(year: int, month: int, day: int) -> None:
    if not 1 <= month <= 12:
        raise ValueError("month out of range")
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]
    if not 1 <= day <= days:
        raise ValueError("day out of range")


def _date_text(year: int, month: int, day: int) -> tuple[str, bool]:
    """PostgreSQL's ISO text of a date (astronomical year) without " BC", and whether
    it is BC."""
    bc = year <= 0
    return f"{1 - year if bc else year:04d}-{month:02d}-{day:02d}", bc


def _fraction(usec: int) -> str:
    return f".{usec:06d}".rstrip("0") if usec else ""


def _timestamp_text(usec: int, zone: str) -> str:
    """PostgreSQL's ISO text of microseconds since the epoch, ``zone`` ('' or '+00')."""
    days, rest = divmod(usec, _USEC_PER_DAY)
    date, bc = _date_text(*_civil_from_days(days))
    seconds, micro = divmod(rest, 1_000_000)
    hh, rem = divmod(seconds, 3600)
    mm, ss = divmod(rem, 60)
    return (f"{date} {hh:02d}:{mm:02d}:{ss:02d}{_fraction(micro)}{zone}"
            + (" BC" if bc else ""))


def _year(digits: str, bc: str | None) -> int:
    """The astronomical year of ISO output's year and BC marker (1 BC is year 0)."""
    year = int(digits)
    if year == 0:
        raise ValueError("no year 0 (1 BC precedes 0001)")
    return 1 - year if bc else year


def parse_date(text: str) -> Any:
    m = _DATE.match(text)
    if m is None:
        if text in _INFINITIES:
            return ("string", text)
        raise ValueError(_STYLE)
    year, month, day = _year(m[1], m[4]), int(m[2]), int(m[3])
    if 1 <= year <= 9999:
        return dt.date(year, month, day)
    _check_date(year, month, day)
    date, bc = _date_text(year, month, day)
    return ("string", date + (" BC" if bc else ""))


def _usec(text: str | None) -> int:
    return int(text.ljust(6, "0")) if text else 0


def parse_time(text: str) -> Any:
    m = _TIME.match(text)
    if m is None:
        raise ValueError("not hh:mm:ss[.ffffff]")
    hh, mm, ss, usec = int(m[1]), int(m[2]), int(m[3]), _usec(m[4])
    if hh == 24 and mm == ss == usec == 0:
        return ("string", "24:00:00")
    return dt.time(hh, mm, ss, usec)


def _timestamp_usec(text: str, with_zone: bool) -> int:
    """Microseconds since the epoch (UTC with a zone, else on the wall clock), for any
    year PostgreSQL has."""
    m = _TIMESTAMP.match(text)
    if m is None or bool(m[8]) != with_zone:
        raise ValueError(_STYLE)
    year, month, day = _year(m[1], m[12]), int(m[2]), int(m[3])
    _check_date(year, month, day)
    hh, mi, ss = int(m[4]), int(m[5]), int(m[6])
    if hh > 23 or mi > 59 or ss > 59:
        raise ValueError("time out of range")
    offset = 0
    if with_zone:
        offset = int(m[9]) * 3600 + int(m[10] or 0) * 60 + int(m[11] or 0)
        if m[8] == "-":
            offset = -offset
    return ((_days_from_civil(year, month, day) * 86400 + hh * 3600 + mi * 60 + ss - offset)
            * 1_000_000 + _usec(m[7]))


_DATETIME_MIN = _days_from_civil(1, 1, 1) * _USEC_PER_DAY
_DATETIME_END = _days_from_civil(10000, 1, 1) * _USEC_PER_DAY
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=UTC)


def parse_timestamp(text: str) -> Any:
    m = _TIMESTAMP.match(text)
    if m is not None and not m[8] and not m[12] and len(m[1]) == 4:
        # Years 1000..9999, nearly every value: datetime parses the validated text.
        return dt.datetime.fromisoformat(text)
    if text in _INFINITIES:
        return ("string", text)
    usec = _timestamp_usec(text, False)
    if _DATETIME_MIN <= usec < _DATETIME_END:
        return _EPOCH + dt.timedelta(microseconds=usec)
    return ("string", _timestamp_text(usec, ""))


def parse_timestamptz(text: str) -> Any:
    m = _TIMESTAMP.match(text)
    if m is not None and m[8] and not m[12] and len(m[1]) == 4:
        try:
            return dt.datetime.fromisoformat(text).astimezone(UTC)
        except OverflowError:
            pass  # beyond 9999-12-31 or before 0001-01-01 at UTC: the exact path
    if text in _INFINITIES:
        return ("string", text)
    usec = _timestamp_usec(text, True)
    if _DATETIME_MIN <= usec < _DATETIME_END:
        return _EPOCH_UTC + dt.timedelta(microseconds=usec)
    return ("string", _timestamp_text(usec, "+00"))


# -- intervals ---------------------------------------------------------------------

_INTERVAL_POSTGRES = re.compile(
    r"(?:([+-]?[0-9]+) years?(?: |\Z))?"
    r"(?:([+-]?[0-9]+) mons?(?: |\Z))?"
    r"(?:([+-]?[0-9]+) days?(?: |\Z))?"
    r"(?:([+-]?)([0-9]+):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?)?\Z")
_INTERVAL_ISO = re.compile(
    r"P(?:(-?[0-9]+)Y)?(?:(-?[0-9]+)M)?(?:(-?[0-9]+)D)?"
    r"(?:T(?:(-?[0-9]+)H)?(?:(-?[0-9]+)M)?(?:(-?)([0-9]+)(?:\.([0-9]{1,6}))?S)?)?\Z")
_INT32 = 2**31
_INT64 = 2**63
_USEC_PER_HOUR = 3_600_000_000
_USEC_PER_MINUTE = 60_000_000


def _n(text: str | None) -> int:
    return int(text) if text else 0


def _trunc_divmod(a: int, b: int) -> tuple[int, int]:
    """C's division: the quotient truncated toward zero, the remainder of a's sign."""
    q = abs(a) // b
    q = -q if a < 0 else q
    return q, a - q * b


def _iso_part(value: int, unit: str) -> str:
    return f"{value}{unit}" if value else ""


def parse_interval(text: str) -> Any:
    if text.startswith("P"):
        m = _INTERVAL_ISO.match(text)
        if m is None or text == "P" or text.endswith("T"):
            raise ValueError("not an interval in the postgres or iso_8601 IntervalStyle")
        months = _n(m[1]) * 12 + _n(m[2])
        days = _n(m[3])
        seconds = _n(m[7]) * 1_000_000 + _usec(m[8])
        usec = (_n(m[4]) * _USEC_PER_HOUR + _n(m[5]) * _USEC_PER_MINUTE
                + (-seconds if m[6] else seconds))
    else:
        m = _INTERVAL_POSTGRES.match(text)
        if m is None or not text or text.endswith(" "):
            raise ValueError("not an interval in the postgres or iso_8601 IntervalStyle")
        months = _n(m[1]) * 12 + _n(m[2])
        days = _n(m[3])
        usec = 0
        if m[5] is not None:
            usec = (int(m[5]) * _USEC_PER_HOUR + int(m[6]) * _USEC_PER_MINUTE
                    + int(m[7]) * 1_000_000 + _usec(m[8]))
            if m[4] == "-":
                usec = -usec
    if not (-_INT32 <= months < _INT32 and -_INT32 <= days < _INT32
            and -_INT64 <= usec < _INT64):
        raise ValueError("out of range")
    return _iso_interval(months, days, usec)


def _iso_interval(months: int, days: int, usec: int) -> str:
    """PostgreSQL's ``IntervalStyle = iso_8601`` text (EncodeInterval)."""
    if not months and not days and not usec:
        return "PT0S"
    year, mon = _trunc_divmod(months, 12)
    hour, rest = _trunc_divmod(usec, _USEC_PER_HOUR)
    minute, rest = _trunc_divmod(rest, _USEC_PER_MINUTE)
    sec, fsec = _trunc_divmod(rest, 1_000_000)
    out = ["P", _iso_part(year, "Y"), _iso_part(mon, "M"), _iso_part(days, "D")]
    if usec:
        out += ["T", _iso_part(hour, "H"), _iso_part(minute, "M")]
        if sec or fsec:
            out.append(f"{'-' if sec < 0 or fsec < 0 else ''}{abs(sec)}"
                       f"{_fraction(abs(fsec))}S")
    return "".join(out)


# -- arrays --------------------------------------------------------------------------

_DIMS = re.compile(r"(?:\[-?[0-9]+:-?[0-9]+\]){1,6}=")
_NEEDS_SCAN = re.compile(r'["\\]')
# array_out quotes an element with these (array_isspace: ASCII white space only).
_UNQUOTED_BAD = re.compile(r'["\\{ \t\n\r\v\f]')


def parse_array(text: str, convert: Converter = as_is, delimiter: str = ",") -> list[Any]:
    """PostgreSQL's array output (array_out) -> nested lists; elements are ``convert``ed
    (``NULL`` -> None). Dimension decorations (``[0:1]={1,2}``) are dropped. Raises
    ``ValueError`` for anything array_out cannot print."""
    pos = 0
    if text.startswith("["):
        m = _DIMS.match(text)
        if m is None:
            raise ValueError("bad array dimensions")
        pos = m.end()
    if text.startswith("{}", pos) and pos + 2 == len(text):
        return []
    value, pos = _parse_level(text, pos, convert, delimiter, 1)
    if pos != len(text):
        raise ValueError("text after the array")
    return value


def _parse_level(text: str, pos: int, convert: Converter, delim: str, depth: int
                 ) -> tuple[list[Any], int]:
    if depth > MAX_DIMENSIONS:
        raise ValueError(f"more than {MAX_DIMENSIONS} dimensions")
    if text[pos] != "{":
        raise ValueError("expected '{'")
    pos += 1
    out: list[Any] = []
    nested = text[pos] == "{"
    while True:
        c = text[pos]
        if c == "{":
            if not nested:
                raise ValueError("mixed elements and sub-arrays")
            sub, pos = _parse_level(text, pos, convert, delim, depth + 1)
            out.append(sub)
        elif nested:
            raise ValueError("mixed elements and sub-arrays")
        elif c == '"':
            chars: list[str] = []
            pos += 1
            while True:
                special = _NEEDS_SCAN.search(text, pos)
                if special is None:
                    raise ValueError("unterminated quoted element")
                chars.append(text[pos:special.start()])
                pos = special.start()
                if text[pos] == '"':
                    pos += 1
                    break
                chars.append(text[pos + 1])  # a backslash escapes the next character
                pos += 2
            out.append(convert("".join(chars)))
        else:
            end = pos
            n = len(text)
            while end < n and text[end] != delim and text[end] != "}":
                end += 1
            token = text[pos:end]
            if not token or _UNQUOTED_BAD.search(token):
                raise ValueError("bad unquoted element")
            out.append(None if token == "NULL" else convert(token))
            pos = end
        c = text[pos]
        pos += 1
        if c == "}":
            return out, pos
        if c != delim:
            raise ValueError(f"expected {delim!r} or '}}'")
