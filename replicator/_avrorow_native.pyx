# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of ``_avrorow_python.row``: an event's Avro bytes straight to the
replicator's row tuple (``_avrorow.py`` has the plan and the rules)."""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.datetime cimport date_new, datetime_new, import_datetime, time_new
from libc.stdint cimport int64_t, uint64_t, int32_t
from libc.string cimport memchr, memcpy

import datetime as dt
import decimal

import_datetime()

IMPLEMENTATION = "native"

cdef object _UTC = dt.UTC
cdef object _EXACT = decimal.Context(prec=decimal.MAX_PREC)
cdef object _Decimal = decimal.Decimal
cdef dict _CONTEXTS = {}

cdef enum:
    K_BOOL = 1
    K_LONG = 2
    K_FLOAT = 3
    K_DOUBLE = 4
    K_STRING = 5
    K_BYTES = 6
    K_FIXED = 7
    K_DEC_BYTES = 8
    K_DEC_FIXED = 9
    K_DATE = 10
    K_TS = 11
    K_LOCAL_TS = 12
    K_TIME = 13
    K_ZERO_TEXT = 14


cdef class _Reader:
    cdef const unsigned char* p
    cdef Py_ssize_t n
    cdef Py_ssize_t i
    cdef bint bad

    cdef inline int64_t varint(self) noexcept:
        cdef uint64_t acc = 0
        cdef int shift = 0
        cdef unsigned char b
        while True:
            if self.i >= self.n or shift > 63:
                self.bad = True
                return 0
            b = self.p[self.i]
            self.i += 1
            acc |= (<uint64_t>(b & 0x7F)) << shift
            if not (b & 0x80):
                break
            shift += 7
        return <int64_t>((acc >> 1) ^ (-(acc & 1)))

    cdef inline const unsigned char* take(self, Py_ssize_t size) noexcept:
        cdef const unsigned char* at
        if size < 0 or size > self.n - self.i:
            self.bad = True
            return NULL
        at = self.p + self.i
        self.i += size
        return at


cdef void _civil(int64_t days, int* y, int* m, int* d) noexcept:
    """Days since 1970-01-01 -> (y, m, d), proleptic Gregorian."""
    cdef int64_t z = days + 719468
    cdef int64_t era = (z if z >= 0 else z - 146096) // 146097
    cdef int64_t doe = z - era * 146097
    cdef int64_t yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    cdef int64_t yy = yoe + era * 400
    cdef int64_t doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    cdef int64_t mp = (5 * doy + 2) // 153
    d[0] = <int>(doy - (153 * mp + 2) // 5 + 1)
    m[0] = <int>(mp + 3 if mp < 10 else mp - 9)
    y[0] = <int>(yy + (1 if m[0] <= 2 else 0))


# Days from 1970-01-01 to 0001-01-01 and to 10000-01-01.
cdef int64_t _MIN_DAYS = -719162
cdef int64_t _MAX_DAYS = 2932897


cdef object _instant(int64_t micros, bint aware):
    cdef int64_t days = micros // 86400000000
    cdef int64_t rest = micros - days * 86400000000
    cdef int y, m, d
    if days < _MIN_DAYS or days >= _MAX_DAYS:
        return None
    _civil(days, &y, &m, &d)
    return datetime_new(y, m, d, <int>(rest // 3600000000), <int>(rest // 60000000 % 60),
                        <int>(rest // 1000000 % 60), <int>(rest % 1000000),
                        _UTC if aware else None)


cdef object _decimal(const unsigned char* data, Py_ssize_t size, int scale, int precision):
    unscaled = int.from_bytes(PyBytes_FromStringAndSize(<const char*>data, size), "big",
                              signed=True)
    ctx = _CONTEXTS.get(precision)
    if ctx is None:
        ctx = _CONTEXTS[precision] = decimal.Context(prec=precision)
    return ctx.create_decimal(unscaled).scaleb(-scale, ctx)


def row(data, plan):
    """The row of ``data`` (an Avro record of the plan's writer schema), or None."""
    cdef tuple steps = plan.steps
    cdef Py_ssize_t width = plan.width
    cdef const unsigned char[::1] view = data
    cdef _Reader r = _Reader.__new__(_Reader)
    cdef list out = [None] * width
    cdef tuple step
    cdef int kind, col, size, scale, precision
    cdef bint nul_check
    cdef int64_t v, branch
    cdef const unsigned char* at
    cdef float f4
    cdef double f8
    cdef int y, m, d
    r.n = view.shape[0]
    r.p = &view[0] if r.n else NULL
    r.i = 0
    r.bad = False
    for step in steps:
        kind = step[1]
        col = step[2]
        branches = step[6]
        if branches is not None:
            branch = r.varint()
            if r.bad or branch < 0 or branch >= len(<tuple>branches):
                return None
            kind = (<tuple>branches)[branch]
            if kind == 0:
                continue  # NULL (the slot holds None already)
            if kind == K_ZERO_TEXT:  # a text the converter makes NULL: read past it
                v = r.varint()
                if not r.bad:
                    r.take(<Py_ssize_t>v)
                if r.bad:
                    return None
                continue
        value = None
        if kind == K_LONG:
            v = r.varint()
            if r.bad:
                return None
            value = v
        elif kind == K_STRING:
            v = r.varint()
            at = r.take(<Py_ssize_t>v) if not r.bad else NULL
            if r.bad:
                return None
            if step[3] and v and memchr(at, 0, <size_t>v) != NULL:
                return None  # the converter refuses a NUL: the reference says so
            try:
                value = (<const char*>at)[:v].decode("utf-8")
            except UnicodeDecodeError:
                return None
        elif kind == K_BYTES:
            v = r.varint()
            at = r.take(<Py_ssize_t>v) if not r.bad else NULL
            if r.bad:
                return None
            value = PyBytes_FromStringAndSize(<const char*>at, <Py_ssize_t>v)
        elif kind == K_DOUBLE:
            at = r.take(8)
            if r.bad:
                return None
            memcpy(&f8, at, 8)
            value = f8
        elif kind == K_TS or kind == K_LOCAL_TS:
            v = r.varint()
            if r.bad:
                return None
            value = _instant(v, kind == K_TS)
            if value is None:
                return None
        elif kind == K_DATE:
            v = r.varint()
            if r.bad or v < _MIN_DAYS or v >= _MAX_DAYS:
                return None
            _civil(v, &y, &m, &d)
            value = date_new(y, m, d)
        elif kind == K_BOOL:
            at = r.take(1)
            if r.bad or at[0] > 1:
                return None
            value = at[0] == 1
        elif kind == K_FLOAT:
            at = r.take(4)
            if r.bad:
                return None
            memcpy(&f4, at, 4)
            value = <double>f4
        elif kind == K_DEC_BYTES or kind == K_DEC_FIXED:
            scale = step[4]
            precision = step[5]
            if kind == K_DEC_BYTES:
                v = r.varint()
            else:
                v = step[3]
            at = r.take(<Py_ssize_t>v) if not r.bad else NULL
            if r.bad or v == 0:
                return None
            value = _decimal(at, <Py_ssize_t>v, scale, precision)
        elif kind == K_FIXED:
            size = step[3]
            at = r.take(size)
            if r.bad:
                return None
            value = PyBytes_FromStringAndSize(<const char*>at, size)
        elif kind == K_TIME:
            v = r.varint()
            if r.bad or v < 0 or v >= 86400000000:
                return None
            value = time_new(<int>(v // 3600000000), <int>(v // 60000000 % 60),
                             <int>(v // 1000000 % 60), <int>(v % 1000000), None)
        else:
            return None
        if col >= 0:
            out[col] = value
    if r.i != r.n:
        return None
    return tuple(out)
