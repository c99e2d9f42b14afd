# cython: boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of ``_rows_python``: dump rows as mysqlclient returns them without
conversion (numbers and temporals as ASCII text, ``CAST(.. AS CHAR)`` columns as str)
straight to the event key and the Avro body, one call per chunk. See ``_rows`` for the
column codes and what each accepts; anything else declines the row (its value is None
in the result) and the caller encodes that row with the reference twin.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_Check
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport strtod
from libc.string cimport memcpy

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object, Py_ssize_t *) except NULL
    bint PyBytes_Check(object)

IMPLEMENTATION = "native"

# Column codes (kept equal to _rows.py's).
DEF C_LONG = 1
DEF C_BOOL = 2
DEF C_DOUBLE = 3
DEF C_FLOAT = 4
DEF C_DECIMAL = 5
DEF C_UINT64 = 6
DEF C_DATE = 7
DEF C_DATETIME = 8
DEF C_TIMESTAMP = 9
DEF C_TIME = 10
DEF C_STRING = 11
DEF C_BYTES = 12
DEF C_PY = 13
DEF K_INT = 1
DEF MAX_COLUMNS = 4096
cdef int64_t US_PER_DAY = 86400000000

cdef inline int text_of(object v, const char **s, Py_ssize_t *n) except -1:
    """The bytes of an ASCII text value (bytes or str); 0 when it is neither."""
    if PyBytes_Check(v):
        s[0] = PyBytes_AS_STRING(v)
        n[0] = PyBytes_GET_SIZE(v)
        return 1
    if PyUnicode_Check(v):
        s[0] = PyUnicode_AsUTF8AndSize(v, n)
        return 1
    return 0

cdef inline bint is_digit(char c) noexcept nogil:
    return c'0' <= c <= c'9'

cdef inline int parse_long(const char *s, Py_ssize_t n, int64_t *out) noexcept nogil:
    """-?[0-9]{1,19} within int64; 0 when not."""
    cdef Py_ssize_t i = 0
    cdef bint neg = False
    cdef uint64_t m = 0
    if n > 0 and s[0] == c'-':
        neg = True
        i = 1
    if i >= n or n - i > 19:
        return 0
    while i < n:
        if not is_digit(s[i]):
            return 0
        m = m * 10 + <uint64_t>(s[i] - c'0')
        i += 1
    if neg:
        if m > <uint64_t>9223372036854775807 + 1:
            return 0
        out[0] = <int64_t>(0 - m)
    else:
        if m > <uint64_t>9223372036854775807:
            return 0
        out[0] = <int64_t>m
    return 1

cdef inline int parse_uint64(const char *s, Py_ssize_t n, uint64_t *out) noexcept nogil:
    cdef Py_ssize_t i = 0
    cdef uint64_t m = 0, d
    if n < 1 or n > 20:
        return 0
    while i < n:
        if not is_digit(s[i]):
            return 0
        d = <uint64_t>(s[i] - c'0')
        if m > (<uint64_t>18446744073709551615 - d) // 10:
            return 0
        m = m * 10 + d
        i += 1
    out[0] = m
    return 1

cdef inline int digits(const char *s, Py_ssize_t at, Py_ssize_t count, int *out) noexcept nogil:
    cdef int v = 0
    cdef Py_ssize_t i
    for i in range(at, at + count):
        if not is_digit(s[i]):
            return 0
        v = v * 10 + (s[i] - c'0')
    out[0] = v
    return 1

cdef inline int fraction(const char *s, Py_ssize_t at, Py_ssize_t n, int64_t *micros) noexcept nogil:
    """``.f{1,6}`` from ``at`` to ``n`` (or nothing): microseconds; 0 when malformed."""
    cdef Py_ssize_t k
    cdef int64_t v = 0, scale = 100000
    micros[0] = 0
    if at == n:
        return 1
    if s[at] != c'.' or n - at - 1 < 1 or n - at - 1 > 6:
        return 0
    for k in range(at + 1, n):
        if not is_digit(s[k]):
            return 0
        v += (s[k] - c'0') * scale
        scale //= 10
    micros[0] = v
    return 1

cdef inline int64_t days_from_civil(int64_t y, int64_t m, int64_t d) noexcept nogil:
    cdef int64_t era, yoe, doy, doe
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468

cdef inline bint valid_date(int y, int m, int d) noexcept nogil:
    """What Python's ``datetime.date`` accepts (the reference's test)."""
    cdef int last
    if y < 1 or y > 9999 or m < 1 or m > 12 or d < 1:
        return False
    if m == 2:
        last = 29 if (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)) else 28
    elif m == 4 or m == 6 or m == 9 or m == 11:
        last = 30
    else:
        last = 31
    return d <= last

cdef inline int parse_date(const char *s, Py_ssize_t n, int64_t *days) noexcept nogil:
    cdef int y, mo, d
    if n != 10 or s[4] != c'-' or s[7] != c'-':
        return 0
    if not (digits(s, 0, 4, &y) and digits(s, 5, 2, &mo) and digits(s, 8, 2, &d)):
        return 0
    if not valid_date(y, mo, d):
        return 0
    days[0] = days_from_civil(y, mo, d)
    return 1

cdef inline int parse_datetime(const char *s, Py_ssize_t n, int64_t *micros) noexcept nogil:
    cdef int64_t days, frac
    cdef int h, mi, se
    if n < 19 or s[10] != c' ' or s[13] != c':' or s[16] != c':':
        return 0
    if not parse_date(s, 10, &days):
        return 0
    if not (digits(s, 11, 2, &h) and digits(s, 14, 2, &mi) and digits(s, 17, 2, &se)):
        return 0
    if not fraction(s, 19, n, &frac):
        return 0
    micros[0] = days * US_PER_DAY + ((h * 60 + mi) * 60 + se) * <int64_t>1000000 + frac
    return 1

cdef inline int parse_time(const char *s, Py_ssize_t n, int64_t *micros) noexcept nogil:
    """``-?H+:MM:SS[.f]`` (hours up to 838 in MySQL): signed microseconds."""
    cdef Py_ssize_t i = 0, start, colon
    cdef bint neg = False
    cdef int64_t h = 0, frac
    cdef int mi, se
    if n > 0 and s[0] == c'-':
        neg = True
        i = 1
    start = i
    while i < n and is_digit(s[i]):
        h = h * 10 + (s[i] - c'0')
        i += 1
        if i - start > 6:
            return 0
    if i == start or i + 6 > n or s[i] != c':' or s[i + 3] != c':':
        return 0
    if not (digits(s, i + 1, 2, &mi) and digits(s, i + 4, 2, &se)):
        return 0
    if not fraction(s, i + 6, n, &frac):
        return 0
    micros[0] = ((h * 60 + mi) * 60 + se) * <int64_t>1000000 + frac
    if neg:
        micros[0] = -micros[0]
    return 1

cdef inline int parse_timestamp(const char *s, Py_ssize_t n, int64_t *micros) noexcept nogil:
    """``UNIX_TIMESTAMP`` text: ``[0-9]+(.[0-9]{1,6})?``."""
    cdef Py_ssize_t i = 0
    cdef int64_t whole = 0, frac
    while i < n and is_digit(s[i]):
        whole = whole * 10 + (s[i] - c'0')
        i += 1
        if i > 12:
            return 0
    if i == 0:
        return 0
    if not fraction(s, i, n, &frac):
        return 0
    micros[0] = whole * 1000000 + frac
    return 1

cdef inline int parse_decimal(const char *s, Py_ssize_t n, int scale, int64_t *unscaled) noexcept nogil:
    """``-?[0-9]+(.[0-9]{1,scale})?`` of at most 18 digits: the unscaled value."""
    cdef Py_ssize_t i = 0
    cdef bint neg = False
    cdef int64_t v = 0
    cdef int count = 0, frac = 0
    cdef bint dot = False
    if n > 0 and s[0] == c'-':
        neg = True
        i = 1
    if i >= n or not is_digit(s[i]):
        return 0
    while i < n:
        if s[i] == c'.':
            if dot or i + 1 >= n:
                return 0
            dot = True
        elif is_digit(s[i]):
            count += 1
            if count > 18:
                return 0
            v = v * 10 + (s[i] - c'0')
            if dot:
                frac += 1
        else:
            return 0
        i += 1
    if frac > scale:
        return 0
    while frac < scale:
        if count >= 18:
            return 0
        v *= 10
        frac += 1
        count += 1
    unscaled[0] = -v if neg else v
    return 1

cdef inline bint float_text(const char *s, Py_ssize_t n) noexcept nogil:
    """Only what MySQL prints for a DOUBLE (no inf, nan, hex or spaces for strtod)."""
    cdef Py_ssize_t i
    for i in range(n):
        if not (is_digit(s[i]) or s[i] == c'.' or s[i] == c'-' or s[i] == c'+'
                or s[i] == c'e' or s[i] == c'E'):
            return False
    return True

cdef inline bint fits(int64_t v, int size) noexcept nogil:
    """Does ``v`` fit ``size`` bytes of two's complement (else the reference raises)?"""
    if size >= 8:
        return True
    return -(<int64_t>1 << (8 * size - 1)) <= v < (<int64_t>1 << (8 * size - 1))

cdef inline Py_ssize_t put_long(unsigned char *p, int64_t v) noexcept nogil:
    cdef uint64_t z = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    cdef Py_ssize_t k = 0
    while z > 0x7F:
        p[k] = <unsigned char>((z & 0x7F) | 0x80)
        z >>= 7
        k += 1
    p[k] = <unsigned char>z
    return k + 1

cdef inline void put_fixed(unsigned char *p, int64_t v, int size) noexcept nogil:
    """``size`` bytes, big-endian two's complement (sign-extended)."""
    cdef int k
    cdef int64_t x = v
    for k in range(size - 1, -1, -1):
        if k >= size - 8:
            p[k] = <unsigned char>(x & 0xFF)
            x >>= 8
        else:
            p[k] = 0xFF if v < 0 else 0

cdef class Plan:
    """A table's prepared column codes (``_rows.RowPlan.native``)."""
    cdef int ncols
    cdef unsigned char codes[MAX_COLUMNS]
    cdef unsigned char nullable[MAX_COLUMNS]
    cdef unsigned char either[MAX_COLUMNS]  # DATE/DATETIME: the number branch's index
    cdef int scales[MAX_COLUMNS]
    cdef int sizes[MAX_COLUMNS]
    cdef object py_encoders  # per column: None, or callable(raw) -> the field's bytes
    cdef int key_code
    cdef Py_ssize_t key_at

def prepare(bytes codes, bytes nullable, bytes either, tuple scales, tuple sizes,
            tuple py_encoders, int key_code, Py_ssize_t key_at):
    cdef Plan p = Plan()
    cdef int i
    if len(codes) > MAX_COLUMNS:
        return None
    p.ncols = len(codes)
    for i in range(p.ncols):
        p.codes[i] = codes[i]
        p.nullable[i] = nullable[i]
        p.either[i] = either[i]
        p.scales[i] = scales[i]
        p.sizes[i] = sizes[i]
    p.py_encoders = py_encoders
    p.key_code = key_code
    p.key_at = key_at
    return p

cdef object encode_one(Plan p, tuple row, bytearray buf):
    """The row's Avro body, or None to decline."""
    cdef Py_ssize_t i, n, need, at = 0
    cdef const char *s
    cdef int code
    cdef int64_t lv
    cdef uint64_t uv
    cdef double dv
    cdef float fv
    cdef unsigned char *out
    cdef bytes field
    cdef char tmp[64]
    if len(row) < p.ncols:
        return None
    for i in range(p.ncols):
        v = row[i]
        code = p.codes[i]
        need = at + 64
        if v is not None and (code == C_STRING or code == C_BYTES):
            need += 16 + len(v) * 4
        if need > len(buf):
            buf.extend(bytes(need - len(buf) + 4096))
        out = <unsigned char *>(<char *>buf)
        if v is None:
            if not p.nullable[i]:
                return None
            out[at] = 0
            at += 1
            continue
        if code == C_PY:
            field = p.py_encoders[i](v)
            n = len(field)
            if at + n > len(buf):
                buf.extend(bytes(at + n - len(buf) + 4096))
                out = <unsigned char *>(<char *>buf)
            memcpy(out + at, PyBytes_AS_STRING(field), n)
            at += n
            continue
        if code == C_DATE or code == C_DATETIME:
            if not text_of(v, &s, &n):
                return None
            if code == C_DATE:
                if not parse_date(s, n, &lv):
                    return None
            elif not parse_datetime(s, n, &lv):
                return None
            at += put_long(out + at, p.either[i])
            at += put_long(out + at, lv)
            continue
        if p.nullable[i]:
            out[at] = 2
            at += 1
        if code == C_STRING:
            if not PyUnicode_Check(v):
                return None
            s = PyUnicode_AsUTF8AndSize(v, &n)
            at += put_long(out + at, n)
            memcpy(out + at, s, n)
            at += n
            continue
        if code == C_BYTES:
            if not PyBytes_Check(v):
                return None
            n = PyBytes_GET_SIZE(v)
            at += put_long(out + at, n)
            memcpy(out + at, PyBytes_AS_STRING(v), n)
            at += n
            continue
        if not text_of(v, &s, &n):
            return None
        if code == C_LONG:
            if not parse_long(s, n, &lv):
                return None
            at += put_long(out + at, lv)
        elif code == C_BOOL:
            if not parse_long(s, n, &lv):
                return None
            out[at] = 1 if lv != 0 else 0
            at += 1
        elif code == C_DOUBLE or code == C_FLOAT:
            if n < 1 or n > 60 or not float_text(s, n):
                return None
            memcpy(tmp, s, n)
            tmp[n] = 0
            dv = strtod(tmp, &s)
            if s != tmp + n or dv != dv:  # all of it, and not NaN
                return None
            if code == C_DOUBLE:
                memcpy(out + at, &dv, 8)
                at += 8
            else:
                if dv > 3.4028234663852886e38 or dv < -3.4028234663852886e38:
                    return None  # the reference refuses it (OverflowError)
                fv = <float>dv
                memcpy(out + at, &fv, 4)
                at += 4
        elif code == C_DECIMAL:
            if not parse_decimal(s, n, p.scales[i], &lv) or not fits(lv, p.sizes[i]):
                return None
            put_fixed(out + at, lv, p.sizes[i])
            at += p.sizes[i]
        elif code == C_UINT64:
            if not parse_uint64(s, n, &uv):
                return None
            if p.sizes[i] < 9:
                return None
            put_fixed(out + at, 0, p.sizes[i] - 8)
            for k in range(8):
                out[at + p.sizes[i] - 1 - k] = <unsigned char>((uv >> (8 * k)) & 0xFF)
            at += p.sizes[i]
        elif code == C_TIMESTAMP:
            if not parse_timestamp(s, n, &lv):
                return None
            at += put_long(out + at, lv)
        elif code == C_TIME:
            if not parse_time(s, n, &lv):
                return None
            at += put_long(out + at, lv)
        else:
            return None
    return PyBytes_FromStringAndSize(<char *>buf, at)

def encode_rows(list rows, Plan p):
    """(keys, values) of ``rows``: a declined row has None for both; a key the plan
    does not compute (not a single integer column) is None beside its value."""
    cdef Py_ssize_t i, count = len(rows), n
    cdef list keys = [None] * count
    cdef list values = [None] * count
    cdef bytearray buf = bytearray(4096)
    cdef const char *s
    cdef int64_t lv
    cdef tuple row
    for i in range(count):
        row = <tuple>rows[i]
        value = encode_one(p, row, buf)
        if value is None:
            continue
        if p.key_code == K_INT:
            k = row[p.key_at]
            if k is None or not text_of(k, &s, &n) or not parse_long(s, n, &lv):
                continue
            keys[i] = lv
        values[i] = value  # a key left None: the caller keys the row
    return keys, values


cdef extern from "Python.h":
    ctypedef struct PyTypeObject
    object PyType_GenericAlloc(PyTypeObject *, Py_ssize_t)
    int PyObject_GenericSetAttr(object, object, object) except -1
    void PyObject_GC_UnTrack(object)


def make_rows(list keys, list values, object fingerprint, type row_type):
    """``[row_type(key, value, fingerprint), ...]`` for a class of those three slots (the
    frozen ``DumpRow``): the same objects, without the cost of its ``__init__``."""
    cdef Py_ssize_t i, n = len(keys)
    cdef list out = [None] * n
    if getattr(row_type, "__slots__", None) != ("key", "value", "fingerprint"):
        raise TypeError("row_type: a class of the slots key, value, fingerprint")
    for i in range(n):
        row = PyType_GenericAlloc(<PyTypeObject *>row_type, 0)
        PyObject_GenericSetAttr(row, "key", keys[i])
        PyObject_GenericSetAttr(row, "value", values[i])
        PyObject_GenericSetAttr(row, "fingerprint", fingerprint)
        # A key, bytes and an int cannot lead back to the row: untracked, so that a
        # chunk's rows do not make the cycle collector run (full collections).
        PyObject_GC_UnTrack(row)
        out[i] = row
    return out
