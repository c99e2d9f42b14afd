# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of ``_pgcopy_python.copy_binary`` (its docstring has the format).

Same signature, same bytes: each value's encoder is looked up as in the reference (the
column's dict, by the value's exact type); the common encoders are done here in C
(int2/4/8, float4/8, bool, text/json/jsonb, bytes into bytea, date, a naive or UTC
datetime into timestamp/timestamptz), any other through the reference's own function.
A value the reference refuses (None answered) is refused here too: an int beyond the
column's range, a float beyond a float4, a str that is not valid UTF-8.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.datetime cimport (
    PyDateTime_DATE_GET_HOUR,
    PyDateTime_DATE_GET_MICROSECOND,
    PyDateTime_DATE_GET_MINUTE,
    PyDateTime_DATE_GET_SECOND,
    PyDateTime_GET_DAY,
    PyDateTime_GET_MONTH,
    PyDateTime_GET_YEAR,
    import_datetime,
)
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.math cimport isinf
from libc.stdint cimport int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

import datetime as dt
import struct
from decimal import Decimal

from databus.replicator.targets import _pgcopy_python as ref

import_datetime()

IMPLEMENTATION = "native"

cdef object _INT2 = ref._int2
cdef object _INT4 = ref._int4
cdef object _INT8 = ref._int8
cdef object _FLOAT4 = ref._float4
cdef object _FLOAT8 = ref._float8
cdef object _BOOL = ref._bool
cdef object _TEXT = ref._text
cdef object _JSONB = ref._jsonb
cdef object _BYTEA = ref._bytea
cdef object _DATE = ref._date
cdef object _TIMESTAMP = ref._timestamp
cdef object _TIMESTAMPTZ = ref._timestamptz
cdef object _NUMERIC = ref._numeric
cdef object _DECIMAL = Decimal
cdef object _UTC = dt.UTC
cdef bytes _HEADER = ref.HEADER

# Days from 0001-01-01 (ordinal 1) to 2000-01-01.
cdef int64_t _EPOCH_ORDINAL = 730120


cdef inline int64_t _ordinal(int y, int m, int d) noexcept:
    """date(y, m, d).toordinal(), by the civil-from-days formula."""
    cdef int64_t yy = y - (1 if m <= 2 else 0)
    cdef int64_t era = (yy if yy >= 0 else yy - 399) // 400
    cdef int64_t yoe = yy - era * 400
    cdef int64_t mp = (m + 9) % 12
    cdef int64_t doy = (153 * mp + 2) // 5 + d - 1
    cdef int64_t doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    # days since 0000-03-01, then to ordinal (0001-01-01 is 1): 306 days Mar..Dec of year 0
    return era * 146097 + doe - 305


cdef class _Out:
    cdef char* p
    cdef Py_ssize_t n
    cdef Py_ssize_t cap

    def __cinit__(self, Py_ssize_t cap):
        self.p = <char*>PyMem_Malloc(cap)
        if self.p == NULL:
            raise MemoryError()
        self.n = 0
        self.cap = cap

    def __dealloc__(self):
        PyMem_Free(self.p)

    cdef int room(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t want = self.n + extra
        cdef Py_ssize_t cap = self.cap
        cdef char* grown
        if want <= cap:
            return 0
        while cap < want:
            cap *= 2
        grown = <char*>PyMem_Realloc(self.p, cap)
        if grown == NULL:
            raise MemoryError()
        self.p = grown
        self.cap = cap
        return 0

    cdef inline void u16(self, uint32_t v) noexcept:
        self.p[self.n] = <char>((v >> 8) & 0xFF)
        self.p[self.n + 1] = <char>(v & 0xFF)
        self.n += 2

    cdef inline void u32(self, uint32_t v) noexcept:
        self.p[self.n] = <char>((v >> 24) & 0xFF)
        self.p[self.n + 1] = <char>((v >> 16) & 0xFF)
        self.p[self.n + 2] = <char>((v >> 8) & 0xFF)
        self.p[self.n + 3] = <char>(v & 0xFF)
        self.n += 4

    cdef inline void u64(self, uint64_t v) noexcept:
        self.u32(<uint32_t>(v >> 32))
        self.u32(<uint32_t>(v & 0xFFFFFFFF))

    cdef int raw(self, const char* data, Py_ssize_t size) except -1:
        self.room(size)
        memcpy(self.p + self.n, data, size)
        self.n += size
        return 0

    cdef int field(self, const char* data, Py_ssize_t size) except -1:
        if size > 0x7FFFFFFF:
            raise OverflowError("a value beyond 2 GiB")
        self.room(size + 4)
        self.u32(<uint32_t>size)
        memcpy(self.p + self.n, data, size)
        self.n += size
        return 0


cdef inline int64_t _micros(object v) noexcept:
    cdef int64_t days = _ordinal(PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v),
                                 PyDateTime_GET_DAY(v)) - _EPOCH_ORDINAL
    return ((days * 24 + PyDateTime_DATE_GET_HOUR(v)) * 60 + PyDateTime_DATE_GET_MINUTE(v)) \
        * 60000000 + <int64_t>PyDateTime_DATE_GET_SECOND(v) * 1000000 \
        + PyDateTime_DATE_GET_MICROSECOND(v)


cdef int _put(_Out out, object v, object enc) except -1:
    """Write one value; 1 when the reference would refuse it (the caller answers None)."""
    cdef long long i
    cdef double d
    cdef float f
    cdef Py_ssize_t size
    cdef const char* utf8
    cdef uint64_t bits
    cdef uint32_t bits4
    if enc is _INT8:
        try:
            i = v
        except OverflowError:
            return 1
        out.room(12)
        out.u32(8)
        out.u64(<uint64_t>i)
    elif enc is _INT4:
        try:
            i = v
        except OverflowError:
            return 1
        if i < -2147483648 or i > 2147483647:
            return 1
        out.room(8)
        out.u32(4)
        out.u32(<uint32_t><int32_t>i)
    elif enc is _TEXT or enc is _JSONB:
        try:
            utf8 = _utf8(v, &size)
        except UnicodeEncodeError:
            return 1
        if enc is _JSONB:
            out.room(size + 5)
            out.u32(<uint32_t>(size + 1))
            out.p[out.n] = 1
            out.n += 1
            out.raw(utf8, size)
        else:
            out.field(utf8, size)
    elif enc is _BYTEA and type(v) is bytes:
        out.field(PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))
    elif enc is _FLOAT8:
        d = v
        memcpy(&bits, &d, 8)
        out.room(12)
        out.u32(8)
        out.u64(bits)
    elif enc is _TIMESTAMP or enc is _TIMESTAMPTZ:
        tz = v.tzinfo
        if tz is not None and tz is not _UTC:
            return _put_python(out, v, enc)
        out.room(12)
        out.u32(8)
        out.u64(<uint64_t>_micros(v))
    elif enc is _DATE:
        out.room(8)
        out.u32(4)
        out.u32(<uint32_t><int32_t>(_ordinal(PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v),
                                              PyDateTime_GET_DAY(v)) - _EPOCH_ORDINAL))
    elif enc is _NUMERIC and type(v) is _DECIMAL:
        return _put_numeric(out, v, enc)
    elif enc is _BOOL:
        out.room(5)
        out.u32(1)
        out.p[out.n] = 1 if v else 0
        out.n += 1
    elif enc is _INT2:
        try:
            i = v
        except OverflowError:
            return 1
        if i < -32768 or i > 32767:
            return 1
        out.room(6)
        out.u32(2)
        out.u16(<uint32_t><uint16_t>i)
    elif enc is _FLOAT4:
        d = v
        f = <float>d
        if isinf(f) and not isinf(d):
            return 1
        memcpy(&bits4, &f, 4)
        out.room(8)
        out.u32(4)
        out.u32(bits4)
    else:
        return _put_python(out, v, enc)
    return 0



cdef inline int64_t _floor4(int64_t p) noexcept:
    return p // 4 if p >= 0 else -((-p + 3) // 4)


cdef int _put_numeric(_Out out, object v, object enc) except -1:
    """A finite Decimal of at most 256 digits: its base-10000 digits from its decimal
    ones; anything else through the reference."""
    cdef uint16_t groups[72]
    cdef int64_t exp, p, g, gmax, gmin, first, last, k, nd, dscale, weight, n, q
    cdef int digit
    cdef tuple digits
    t = v.as_tuple()
    e = t[2]
    if type(e) is not int:
        return _put_python(out, v, enc)
    digits = <tuple>t[1]
    nd = len(digits)
    if nd > 256:
        return _put_python(out, v, enc)
    exp = e
    if exp < -100000 or exp > 100000:
        return _put_python(out, v, enc)
    dscale = -exp if exp < 0 else 0
    gmax = _floor4(nd - 1 + exp)
    gmin = _floor4(exp)
    n = gmax - gmin + 1
    for k in range(n):
        groups[k] = 0
    for k in range(nd):
        digit = <int>digits[k]
        p = nd - 1 - k + exp
        g = _floor4(p)
        q = p - 4 * g
        groups[gmax - g] += <uint16_t>(digit * (1 if q == 0 else 10 if q == 1 else
                                                100 if q == 2 else 1000))
    first = 0
    while first < n and groups[first] == 0:
        first += 1
    if first == n:
        out.room(12)
        out.u32(8)
        out.u16(0)
        out.u16(0)
        out.u16(0)
        out.u16(<uint32_t>dscale)
        return 0
    last = n - 1
    while groups[last] == 0:
        last -= 1
    weight = gmax - first
    if weight < -32768 or weight > 32767 or dscale > 0x3FFF:
        return _put_python(out, v, enc)
    out.room(12 + 2 * (last - first + 1))
    out.u32(<uint32_t>(8 + 2 * (last - first + 1)))
    out.u16(<uint32_t>(last - first + 1))
    out.u16(<uint32_t><uint16_t><int16_t>weight)
    out.u16(0x4000 if t[0] else 0)
    out.u16(<uint32_t>dscale)
    for k in range(first, last + 1):
        out.u16(groups[k])
    return 0


cdef int _put_python(_Out out, object v, object enc) except -1:
    try:
        b = enc(v)
    except (KeyError, struct.error, OverflowError, ValueError):
        return 1
    out.raw(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
    return 0


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL


cdef inline const char* _utf8(object v, Py_ssize_t* size) except NULL:
    return PyUnicode_AsUTF8AndSize(v, size)


def copy_binary(rows, encoders):
    """``rows`` in COPY's binary format, or None (``_pgcopy_python.copy_binary``)."""
    cdef list encs = list(encoders)
    cdef Py_ssize_t width = len(encs)
    cdef Py_ssize_t j
    cdef _Out out = _Out(1 << 16)
    cdef dict column
    out.raw(_HEADER, len(_HEADER))
    for row in rows:
        if len(row) != width:
            raise ValueError(f"a row of {len(row)} values for {width} columns")
        out.room(2)
        out.u16(<uint32_t>width)
        for j in range(width):
            v = row[j]
            if v is None:
                out.room(4)
                out.u32(0xFFFFFFFF)
                continue
            column = <dict>encs[j]
            enc = column.get(type(v))
            if enc is None:
                return None
            if _put(out, v, enc):
                return None
    out.room(2)
    out.u16(0xFFFF)
    return PyBytes_FromStringAndSize(out.p, out.n)
