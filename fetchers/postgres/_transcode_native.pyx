# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of ``_transcode`` (see there for the layout and the grammar of each
column code): a pgoutput Insert, or an Update without an old tuple, read once from its
bytes into the Avro body and the event key. Anything outside the grammar is declined
(None), never judged: the general path then gives the event or the error."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.math cimport isinf
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy

from databus.fetchers.postgres._transcode_python import reference_row

cdef extern from "Python.h":
    double PyOS_string_to_double(const char *s, char **endptr,
                                 PyObject *overflow_exception) except? -1.0
    ctypedef struct PyTypeObject:
        pass
    object PyType_GenericAlloc(PyTypeObject *type, Py_ssize_t nitems)
    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    void PyObject_GC_UnTrack(object o)
    unsigned long PyType_GetFlags(PyTypeObject *type)
    unsigned long Py_TPFLAGS_HAVE_GC

IMPLEMENTATION = "native"

# The codes and flags of _transcode (kept equal by tests/unit/test_pg_transcode.py).
DEF C_INT2 = 1
DEF C_INT4 = 2
DEF C_INT8 = 3
DEF C_OID = 4
DEF C_FLOAT4 = 5
DEF C_FLOAT8 = 6
DEF C_BOOLEAN = 7
DEF C_STRING = 8
DEF C_NUMERIC_TEXT = 9
DEF C_DECIMAL = 10
DEF C_BYTES = 11
DEF C_DATE = 12
DEF C_TIME = 13
DEF C_TIMESTAMP = 14
DEF C_TIMESTAMPTZ = 15
DEF F_NULLABLE = 0x40
DEF F_UNION = 0x20
DEF CODE_MASK = 0x1F

DEF MAX_COLUMNS = 1664  # PostgreSQL's MaxTupleAttributeNumber
DEF FLOAT_TEXT = 64  # longer float texts are declined (PostgreSQL's are < 30)
DEF USEC_PER_DAY = 86400000000
# Days from 1970-01-01 of 0001-01-01 and of 10000-01-01: datetime's range.
DEF DAYS_MIN = -719162
DEF DAYS_END = 2932897


cdef class Prepared:
    """A RowPlan's columns as C arrays."""

    cdef int ncols
    cdef uint8_t codes[MAX_COLUMNS]
    cdef uint8_t sizes[MAX_COLUMNS]
    cdef uint8_t scales[MAX_COLUMNS]  # a DECIMAL column's scale
    cdef uint8_t int_digits[MAX_COLUMNS]  # and its integer digits (precision - scale)
    cdef int nkeys
    cdef int keys[32]  # PostgreSQL's INDEX_MAX_KEYS


def prepare(bytes codes, tuple scales, tuple int_digits, tuple sizes,
            tuple key_positions):
    """The compiled form of a RowPlan (``_transcode.row_plan`` builds it once)."""
    cdef Prepared p = Prepared()
    cdef int i
    if len(codes) > MAX_COLUMNS or len(key_positions) > 32 or not key_positions:
        raise ValueError("a plan of more columns or keys than PostgreSQL allows")
    p.ncols = len(codes)
    for i in range(p.ncols):
        p.codes[i] = codes[i]
        if not (0 <= scales[i] and 0 <= int_digits[i] and scales[i] + int_digits[i] <= 18
                and 0 <= sizes[i] <= 8):
            raise ValueError("a DECIMAL beyond 18 digits or 8 bytes")
        p.scales[i] = scales[i]
        p.int_digits[i] = int_digits[i]
        p.sizes[i] = sizes[i]
    p.nkeys = len(key_positions)
    for i in range(p.nkeys):
        if not 0 <= key_positions[i] < p.ncols:
            raise ValueError("a key position outside the row")
        p.keys[i] = key_positions[i]
    return p


# -- output ------------------------------------------------------------------------------

cdef inline uint8_t *put_long(uint8_t *out, int64_t value) noexcept:
    cdef uint64_t z = (<uint64_t>value << 1) ^ <uint64_t>(value >> 63)
    while z > 0x7F:
        out[0] = <uint8_t>((z & 0x7F) | 0x80)
        out += 1
        z >>= 7
    out[0] = <uint8_t>z
    return out + 1


cdef inline bint digit(uint8_t c) noexcept:
    return 48 <= c <= 57


# -- text grammars (each: 1 and the value, or 0 to decline) --------------------------------

cdef inline int parse_int(const uint8_t *s, Py_ssize_t n, int64_t lo, int64_t hi,
                          int64_t *value) noexcept:
    """-?[0-9]{1,19}, within [lo, hi]."""
    cdef Py_ssize_t i = 0
    cdef bint negative = False
    cdef uint64_t magnitude = 0
    if n > 0 and s[0] == 45:  # '-'
        negative = True
        i = 1
    if n - i < 1 or n - i > 19:
        return 0
    while i < n:
        if not digit(s[i]):
            return 0
        magnitude = magnitude * 10 + (s[i] - 48)
        i += 1
    if negative:
        if magnitude > <uint64_t>9223372036854775807ULL + 1:
            return 0
        value[0] = <int64_t>(0 - magnitude)
    else:
        if magnitude > <uint64_t>9223372036854775807ULL:
            return 0
        value[0] = <int64_t>magnitude
    return lo <= value[0] <= hi


cdef inline Py_ssize_t digits(const uint8_t *s, Py_ssize_t i, Py_ssize_t n) noexcept:
    """The index after the run of digits at i."""
    while i < n and digit(s[i]):
        i += 1
    return i


cdef int parse_double(const uint8_t *s, Py_ssize_t n, double *value) except -1:
    """-?(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:e[+-]?[0-9]+)? parsed as float() parses it;
    NaN and Infinity are left to the general path."""
    cdef Py_ssize_t i = 0, j
    cdef char text[FLOAT_TEXT + 1]
    cdef char *end
    if n < 1 or n > FLOAT_TEXT:
        return 0
    if s[0] == 45:
        i = 1
    j = digits(s, i, n)
    if j > i:  # [0-9]+ \.? [0-9]*
        i = j
        if i < n and s[i] == 46:  # '.'
            i = digits(s, i + 1, n)
    elif i < n and s[i] == 46:  # \. [0-9]+
        j = digits(s, i + 1, n)
        if j == i + 1:
            return 0
        i = j
    else:
        return 0
    if i < n and s[i] == 101:  # 'e'
        i += 1
        if i < n and (s[i] == 43 or s[i] == 45):
            i += 1
        j = digits(s, i, n)
        if j == i:
            return 0
        i = j
    if i != n:
        return 0
    if exact_double(s, n, value):
        return 1
    memcpy(text, s, n)
    text[n] = 0
    value[0] = PyOS_string_to_double(text, &end, NULL)
    return end == text + n


# 10**0 .. 10**22: every one an exact double (filled at import from Python ints).
cdef double POW10[23]
for _k in range(23):
    POW10[_k] = float(10 ** _k)


cdef inline int exact_double(const uint8_t *s, Py_ssize_t n, double *value) noexcept:
    """Clinger's fast path of a text of parse_double's grammar: when its significant
    digits make an integer of at most 2**53 and its decimal exponent is within +-22,
    the digits and the power of ten are exact doubles, so one IEEE multiplication or
    division gives the correctly rounded value, the one float() gives; 0 (not done)
    otherwise."""
    cdef Py_ssize_t i = 0
    cdef uint64_t w = 0
    cdef int significant = 0, fraction = 0, exponent = 0, exponent_digits = 0
    cdef int e
    cdef bint negative = False, dot = False, exponent_negative = False
    cdef uint8_t c
    cdef double d
    if s[0] == 45:
        negative = True
        i = 1
    while i < n:
        c = s[i]
        if digit(c):
            if w != 0 or c != 48:
                significant += 1
                if significant > 16:  # 10**16 > 2**53: not exact
                    return 0
                w = w * 10 + (c - 48)
            if dot:
                fraction += 1
        elif c == 46:
            dot = True
        else:  # 'e': the grammar has checked its sign and digits
            i += 1
            if s[i] == 43 or s[i] == 45:
                exponent_negative = s[i] == 45
                i += 1
            while i < n:
                if exponent != 0 or s[i] != 48:
                    exponent_digits += 1
                    if exponent_digits > 3:
                        return 0
                    exponent = exponent * 10 + (s[i] - 48)
                i += 1
            break
        i += 1
    if w == 0:
        value[0] = -0.0 if negative else 0.0
        return 1
    e = (-exponent if exponent_negative else exponent) - fraction
    if e < -22 or e > 22 or w > 9007199254740992ULL:  # 2**53
        return 0
    d = <double>w
    if e >= 0:
        d = d * POW10[e]
    else:
        d = d / POW10[-e]
    value[0] = -d if negative else d
    return 1


cdef inline int numeric_grammar(const uint8_t *s, Py_ssize_t n, Py_ssize_t *int_start,
                                Py_ssize_t *dot) noexcept:
    """-?[0-9]+(?:\\.[0-9]+)?: where the integer digits start and the '.' (or n)."""
    cdef Py_ssize_t i = 0, j
    if n > 0 and s[0] == 45:
        i = 1
    int_start[0] = i
    j = digits(s, i, n)
    if j == i:
        return 0
    dot[0] = j
    if j == n:
        return 1
    if s[j] != 46:
        return 0
    i = digits(s, j + 1, n)
    return i > j + 1 and i == n


cdef inline int parse_decimal(const uint8_t *s, Py_ssize_t n, int precision_left,
                              int scale, int64_t *value) noexcept:
    """The unscaled value of a numeric(p,s) text, as _types._decimal_parser accepts it
    (at most s fraction digits, at most p - s integer digits past leading zeros)."""
    cdef Py_ssize_t start, dot, i
    cdef int int_digits, frac_digits
    cdef int64_t unscaled = 0
    if not numeric_grammar(s, n, &start, &dot):
        return 0
    i = start
    while i < dot and s[i] == 48:  # leading zeros
        i += 1
    int_digits = <int>(dot - i)
    frac_digits = <int>(n - dot - 1) if dot < n else 0
    if frac_digits > scale or int_digits > precision_left:
        return 0
    while i < dot:
        unscaled = unscaled * 10 + (s[i] - 48)
        i += 1
    i = dot + 1
    while i < n:
        unscaled = unscaled * 10 + (s[i] - 48)
        i += 1
    while frac_digits < scale:
        unscaled *= 10
        frac_digits += 1
    if start == 1:  # negative
        if unscaled == 0:
            return 0  # fastavro writes a negative zero its own way: the general path
        unscaled = -unscaled
    value[0] = unscaled
    return 1


cdef inline int two(const uint8_t *s) noexcept:
    if not (digit(s[0]) and digit(s[1])):
        return -1
    return (s[0] - 48) * 10 + (s[1] - 48)


cdef inline int64_t days_from_civil(int64_t y, int64_t m, int64_t d) noexcept:
    """Days from 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    cdef int64_t era, yoe, doy, doe
    if m <= 2:
        y -= 1
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


cdef inline int month_days(int y, int m) noexcept:
    if m == 2:
        return 29 if (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)) else 28
    if m == 4 or m == 6 or m == 9 or m == 11:
        return 30
    return 31


cdef inline int parse_date(const uint8_t *s, Py_ssize_t n, int64_t *days) noexcept:
    """YYYY-MM-DD, a valid date of years 0001..9999 (the first 10 bytes of s)."""
    cdef int y1, y2, m, d, y
    if n < 10 or s[4] != 45 or s[7] != 45:
        return 0
    y1 = two(s)
    y2 = two(s + 2)
    m = two(s + 5)
    d = two(s + 8)
    if y1 < 0 or y2 < 0 or m < 1 or m > 12 or d < 1:
        return 0
    y = y1 * 100 + y2
    if y < 1 or d > month_days(y, m):
        return 0
    days[0] = days_from_civil(y, m, d)
    return 1


cdef inline int parse_clock(const uint8_t *s, Py_ssize_t n, Py_ssize_t *used,
                            int64_t *usec) noexcept:
    """HH:MM:SS[.f{1,6}] at the start of s, hours below 24: microseconds of the day."""
    cdef int h, mi, sec
    cdef Py_ssize_t i, j, k
    cdef int64_t fraction = 0
    if n < 8 or s[2] != 58 or s[5] != 58:
        return 0
    h = two(s)
    mi = two(s + 3)
    sec = two(s + 6)
    if h < 0 or h > 23 or mi < 0 or mi > 59 or sec < 0 or sec > 59:
        return 0
    i = 8
    if i < n and s[i] == 46:
        j = digits(s, i + 1, n)
        if j == i + 1 or j - i - 1 > 6:
            return 0
        for k in range(i + 1, j):
            fraction = fraction * 10 + (s[k] - 48)
        for k in range(j - i - 1, 6):
            fraction *= 10
        i = j
    used[0] = i
    usec[0] = ((h * 60 + mi) * 60 + sec) * <int64_t>1000000 + fraction
    return 1


cdef inline int parse_offset(const uint8_t *s, Py_ssize_t n, int64_t *seconds) noexcept:
    """[+-]HH[:MM[:SS]], each part below 24/60/60, the whole of s."""
    cdef int h, m = 0, sec = 0
    if n != 3 and n != 6 and n != 9:
        return 0
    if s[0] != 43 and s[0] != 45:
        return 0
    h = two(s + 1)
    if h < 0 or h > 23:
        return 0
    if n >= 6:
        if s[3] != 58:
            return 0
        m = two(s + 4)
        if m < 0 or m > 59:
            return 0
    if n == 9:
        if s[6] != 58:
            return 0
        sec = two(s + 7)
        if sec < 0 or sec > 59:
            return 0
    seconds[0] = (h * 3600 + m * 60 + sec) * (-1 if s[0] == 45 else 1)
    return 1


cdef inline int parse_timestamp(const uint8_t *s, Py_ssize_t n, bint zoned,
                                int64_t *usec) noexcept:
    cdef int64_t days, clock, offset = 0
    cdef Py_ssize_t used
    if n < 19 or s[10] != 32 or not parse_date(s, n, &days):
        return 0
    if not parse_clock(s + 11, n - 11, &used, &clock):
        return 0
    used += 11
    if zoned:
        if not parse_offset(s + used, n - used, &offset):
            return 0
    elif used != n:
        return 0
    usec[0] = days * USEC_PER_DAY + clock - offset * 1000000
    # At UTC the instant must stay a datetime; beyond, the general path writes text.
    return DAYS_MIN * USEC_PER_DAY <= usec[0] < DAYS_END * USEC_PER_DAY


cdef inline int hex_value(uint8_t c) noexcept:
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


cdef inline Py_ssize_t utf8_valid(const uint8_t *s, Py_ssize_t n) noexcept:
    """1 if s is valid UTF-8 as Python's strict decoder sees it (no overlong forms, no
    surrogates, nothing above U+10FFFF), else 0."""
    cdef Py_ssize_t i = 0
    cdef uint8_t c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2 or c > 0xF4:
            return 0
        if c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return 0
            i += 2
        elif c < 0xF0:
            if i + 2 >= n:
                return 0
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80:
                return 0
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return 0
            i += 3
        else:
            if i + 3 >= n:
                return 0
            c1 = s[i + 1]
            if ((c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80
                    or (s[i + 3] & 0xC0) != 0x80):
                return 0
            if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
                return 0
            i += 4
    return 1


# -- the row -------------------------------------------------------------------------------

cdef inline uint32_t be32(const uint8_t *p) noexcept:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline int numeric_text(const uint8_t *s, Py_ssize_t n) noexcept:
    cdef Py_ssize_t a, b
    if numeric_grammar(s, n, &a, &b):
        return 1
    return ((n == 3 and s[0] == 78 and s[1] == 97 and s[2] == 78)  # NaN
            or (n == 8 and memcmp(s, b"Infinity", 8) == 0)
            or (n == 9 and memcmp(s, b"-Infinity", 9) == 0))


cdef Py_ssize_t put_value(uint8_t *out, const uint8_t *s, Py_ssize_t n, uint8_t code,
                          Prepared p, int column, int64_t *as_int) except -2:
    """Writes the Avro of one non-NULL text value (without its union branch) at out:
    the bytes written, or -1 to decline."""
    cdef int64_t v = 0
    cdef double d
    cdef float f
    cdef uint32_t bits32
    cdef uint64_t bits64
    cdef int ok, size, hi, lo
    cdef Py_ssize_t used, k
    cdef uint8_t *at
    if code == C_INT2 or code == C_INT4 or code == C_INT8 or code == C_OID:
        if code == C_INT2:
            ok = parse_int(s, n, -32768, 32767, &v)
        elif code == C_INT4:
            ok = parse_int(s, n, -2147483648, 2147483647, &v)
        elif code == C_INT8:
            ok = parse_int(s, n, -9223372036854775807 - 1, 9223372036854775807, &v)
        else:
            ok = parse_int(s, n, 0, 4294967295, &v)
        if not ok:
            return -1
        as_int[0] = v
        return put_long(out, v) - out
    if code == C_STRING or code == C_NUMERIC_TEXT:
        if code == C_STRING:
            if not utf8_valid(s, n):
                return -1
        elif not numeric_text(s, n):
            return -1
        at = put_long(out, n)
        memcpy(at, s, n)
        return at + n - out
    if code == C_FLOAT8 or code == C_FLOAT4:
        if not parse_double(s, n, &d):
            return -1
        if code == C_FLOAT8:
            memcpy(&bits64, &d, 8)
            for k in range(8):
                out[k] = <uint8_t>(bits64 >> (8 * k))
            return 8
        f = <float>d
        if isinf(f) and not isinf(d):
            return -1  # beyond real's range: the general path's error
        memcpy(&bits32, &f, 4)
        for k in range(4):
            out[k] = <uint8_t>(bits32 >> (8 * k))
        return 4
    if code == C_BOOLEAN:
        if n != 1 or (s[0] != 116 and s[0] != 102):  # t, f
            return -1
        out[0] = 1 if s[0] == 116 else 0
        return 1
    if code == C_DECIMAL:
        if not parse_decimal(s, n, p.int_digits[column], p.scales[column], &v):
            return -1
        size = p.sizes[column]
        for k in range(size):
            out[k] = <uint8_t>((v >> (8 * (size - 1 - k))) & 0xFF)
        return size
    if code == C_BYTES:
        if n < 2 or s[0] != 92 or s[1] != 120 or (n - 2) % 2:  # \x, an even count
            return -1
        at = put_long(out, (n - 2) // 2)
        for k in range(2, n, 2):
            hi = hex_value(s[k])
            lo = hex_value(s[k + 1])
            if hi < 0 or lo < 0:
                return -1
            at[0] = <uint8_t>(hi * 16 + lo)
            at += 1
        return at - out
    if code == C_DATE:
        if n != 10 or not parse_date(s, n, &v):
            return -1
        return put_long(out, v) - out
    if code == C_TIME:
        if not parse_clock(s, n, &used, &v) or used != n:
            return -1
        return put_long(out, v) - out
    if code == C_TIMESTAMP or code == C_TIMESTAMPTZ:
        if not parse_timestamp(s, n, code == C_TIMESTAMPTZ, &v):
            return -1
        return put_long(out, v) - out
    return -1


cdef inline Py_ssize_t put_field(uint8_t *at, const uint8_t *value, Py_ssize_t n,
                                 uint8_t code, Prepared p, int column,
                                 int64_t *as_int) except -2:
    """One non-NULL column of a row: its union branch (a nullable column's 1, a union's
    number branch 0) and its value: the bytes written, or -1 to decline. The pgoutput
    and the COPY paths both write a column with it."""
    cdef Py_ssize_t head = 0, written
    if code & F_NULLABLE:
        at[0] = 2
        head = 1
    elif code & F_UNION:
        at[0] = 0
        head = 1
    as_int[0] = 0
    written = put_value(at + head, value, n, code & CODE_MASK, p, column, as_int)
    if written < 0:
        return -1
    return head + written


def transcode_change(payload, plan):
    """``(key, avro body)`` of an Insert, or an Update without an old tuple, of the
    plan's table; None to leave the message to the general path."""
    cdef Prepared p = plan.native
    cdef const uint8_t *data
    cdef Py_ssize_t size, pos, n, written, bound
    cdef uint8_t *out = NULL
    cdef uint8_t *at
    cdef uint8_t kind, marker, code
    cdef int ncols, column, k, key_index
    cdef int32_t length
    cdef int64_t as_int
    cdef Py_ssize_t key_start[32]
    cdef Py_ssize_t key_length[32]
    cdef int64_t key_int[32]
    if p is None or type(payload) is not bytes:
        return None
    data = <const uint8_t *>PyBytes_AS_STRING(payload)
    size = PyBytes_GET_SIZE(payload)
    if size < 8:
        return None
    kind = data[0]
    if (kind != 73 and kind != 85) or data[5] != 78:  # 'I' or 'U', then 'N'
        return None
    ncols = (data[6] << 8) | data[7]
    if ncols != p.ncols:
        return None
    # Every column's Avro is at most its text + 11 bytes (a varint and a branch), and
    # a NULL's one byte is at most its marker.
    bound = size + 12 * <Py_ssize_t>ncols
    out = <uint8_t *>PyMem_Malloc(bound)
    if out == NULL:
        raise MemoryError()
    try:
        at = out
        pos = 8
        key_index = 0
        for column in range(ncols):
            if pos >= size:
                return None
            marker = data[pos]
            code = p.codes[column]
            if marker == 110:  # 'n'
                if not code & F_NULLABLE:
                    return None  # NOT NULL (or key) column NULL in the log
                at[0] = 0
                at += 1
                pos += 1
                continue
            if marker != 116 or pos + 5 > size:  # not 't': 'u' unchanged TOAST, 'b'
                return None
            length = <int32_t>be32(data + pos + 1)
            pos += 5
            if length < 0 or length > size - pos:
                return None
            n = length
            written = put_field(at, data + pos, n, code, p, column, &as_int)
            if written < 0:
                return None
            at += written
            for k in range(p.nkeys):
                if p.keys[k] == column:
                    key_start[k] = pos
                    key_length[k] = n
                    key_int[k] = as_int
            pos += n
        if pos != size:
            return None  # bytes after the message: the decoder's error
        body = PyBytes_FromStringAndSize(<char *>out, at - out)
    finally:
        PyMem_Free(out)
    return _key(p, data, key_start, key_length, key_int), body


cdef object _key(Prepared p, const uint8_t *data, Py_ssize_t *start, Py_ssize_t *length,
                 int64_t *as_int):
    """normalize_key of the key columns: ints and strs as they are, a tuple of them for
    a composite key."""
    cdef int k
    parts = []
    for k in range(p.nkeys):
        if (p.codes[p.keys[k]] & CODE_MASK) == C_STRING:
            parts.append(PyUnicode_DecodeUTF8(<const char *>data + start[k], length[k],
                                              NULL))
        else:
            parts.append(as_int[k])
    if p.nkeys == 1:
        return parts[0]
    return tuple(parts)


# -- a dump chunk: COPY ... TO STDOUT (text format) ------------------------------------------


cdef inline int unescape_byte(uint8_t c) noexcept:
    """The byte of a one-letter COPY escape, or -1 (the letter stands for itself)."""
    if c == 98:  # b
        return 8
    if c == 102:  # f
        return 12
    if c == 110:  # n
        return 10
    if c == 114:  # r
        return 13
    if c == 116:  # t
        return 9
    if c == 118:  # v
        return 11
    return -1


cdef Py_ssize_t field_end(const uint8_t *line, Py_ssize_t i, Py_ssize_t n,
                          bint *escaped) noexcept:
    """The index of the tab (or n) that ends the field starting at i; -1 when a
    backslash ends the line. A backslash escapes the next byte, a tab too."""
    escaped[0] = False
    while i < n:
        if line[i] == 9:
            return i
        if line[i] == 92:
            escaped[0] = True
            if i + 1 >= n:
                return -1
            i += 2
        else:
            i += 1
    return n


cdef Py_ssize_t unescape(const uint8_t *s, Py_ssize_t n, uint8_t *out) noexcept:
    """COPY FROM's reading of a text field's escapes (the field has no raw tab and does
    not end in a backslash): \\b \\f \\n \\r \\t \\v, \\ooo octal, \\xh[h] hex, any other
    escaped byte itself. The bytes written."""
    cdef Py_ssize_t i = 0, k = 0, m
    cdef int c, value, h
    while i < n:
        c = s[i]
        if c != 92:
            out[k] = <uint8_t>c
            k += 1
            i += 1
            continue
        c = s[i + 1]
        i += 2
        if 48 <= c <= 55:  # octal, up to 3 digits
            value = c - 48
            m = 1
            while m < 3 and i < n and 48 <= s[i] <= 55:
                value = value * 8 + (s[i] - 48)
                i += 1
                m += 1
            out[k] = <uint8_t>(value & 0xFF)
        elif c == 120 and i < n and hex_value(s[i]) >= 0:  # x, 1 or 2 hex digits
            value = hex_value(s[i])
            i += 1
            if i < n:
                h = hex_value(s[i])
                if h >= 0:
                    value = value * 16 + h
                    i += 1
            out[k] = <uint8_t>value
        else:
            value = unescape_byte(<uint8_t>c)
            out[k] = <uint8_t>(c if value < 0 else value)
        k += 1
    return k


cdef tuple line_texts(const uint8_t *line, Py_ssize_t n, int ncols, uint8_t *scratch):
    """The text values of one COPY row (None for \\N), as the reference twin reads it;
    ValueError for a row that is not ``ncols`` fields."""
    cdef Py_ssize_t i = 0, j, m
    cdef bint escaped
    cdef int column = 0
    values = []
    while True:
        j = field_end(line, i, n, &escaped)
        if j < 0:
            raise ValueError("a COPY row ends in a backslash")
        if j - i == 2 and line[i] == 92 and line[i + 1] == 78:  # \N
            values.append(None)
        elif escaped:
            m = unescape(line + i, j - i, scratch)
            values.append(PyUnicode_DecodeUTF8(<const char *>scratch, m, NULL))
        else:
            values.append(PyUnicode_DecodeUTF8(<const char *>line + i, j - i, NULL))
        column += 1
        if j >= n:
            break
        i = j + 1
    if column != ncols:
        raise ValueError(f"a COPY row of {column} fields, the table has {ncols} columns")
    return tuple(values)


cdef Py_ssize_t encode_line(Prepared p, const uint8_t *line, Py_ssize_t n,
                            uint8_t *scratch, uint8_t *out, const uint8_t **key_at,
                            Py_ssize_t *key_length, int64_t *key_int) except -2:
    """The Avro body of one COPY row at out (its length), or -1 to decline; the key
    columns' values (unescaped) in key_at/key_length/key_int."""
    cdef Py_ssize_t i = 0, j, m, written
    cdef bint escaped
    cdef int column, k
    cdef uint8_t code
    cdef uint8_t *at = out
    cdef const uint8_t *value
    cdef int64_t as_int
    for column in range(p.ncols):
        if i > n:
            return -1  # fewer fields than columns
        j = field_end(line, i, n, &escaped)
        if j < 0:
            return -1
        if (j < n) != (column < p.ncols - 1):
            return -1  # more or fewer fields than columns
        code = p.codes[column]
        m = j - i
        if m == 2 and line[i] == 92 and line[i + 1] == 78:  # \N
            if not code & F_NULLABLE:
                return -1
            at[0] = 0
            at += 1
            i = j + 1
            continue
        if escaped:
            m = unescape(line + i, m, scratch)
            value = scratch
            scratch += m
        else:
            value = line + i
        written = put_field(at, value, m, code, p, column, &as_int)
        if written < 0:
            return -1
        at += written
        for k in range(p.nkeys):
            if p.keys[k] == column:
                key_at[k] = value
                key_length[k] = m
                key_int[k] = as_int
        i = j + 1
    return at - out


cdef object line_key(Prepared p, const uint8_t **at, Py_ssize_t *length, int64_t *as_int):
    cdef int k
    parts = []
    for k in range(p.nkeys):
        if (p.codes[p.keys[k]] & CODE_MASK) == C_STRING:
            parts.append(PyUnicode_DecodeUTF8(<const char *>at[k], length[k], NULL))
        else:
            parts.append(as_int[k])
    if p.nkeys == 1:
        return parts[0]
    return tuple(parts)


cdef object new_row(object row_type, object key, object body, object fingerprint):
    """``row_type(key, body, fingerprint)`` of a class of those three slots (a frozen
    dataclass): the same object, without the cost of its ``__init__``."""
    row = PyType_GenericAlloc(<PyTypeObject *>row_type, 0)
    PyObject_GenericSetAttr(row, "key", key)
    PyObject_GenericSetAttr(row, "value", body)
    PyObject_GenericSetAttr(row, "fingerprint", fingerprint)
    if PyType_GetFlags(<PyTypeObject *>row_type) & Py_TPFLAGS_HAVE_GC:
        # Its key (an int, a str or a tuple of them), bytes and int can never lead
        # back to it, so the cycle collector need not walk it (as CPython untracks a
        # tuple of atoms): a chunk of 10,000 rows otherwise costs collections that
        # walk every object of the process (about 10% of a dump's time).
        PyObject_GC_UnTrack(row)
    return row


def transcode_copy_rows(data, codec, row_type=None):
    """The rows of ``COPY (...) TO STDOUT`` (text format, UTF-8) of ``codec``'s table as
    ``(key, avro body)`` (or ``row_type(key, body, codec.fingerprint)``), and the last
    row's key columns as text (None without rows). A row the fast path declines (or
    every row, when the table has no plan) takes the reference path
    (``_transcode_python.reference_row``), which gives its event or raises its error."""
    cdef Prepared p = None
    cdef const uint8_t *base
    cdef const uint8_t *line
    cdef const uint8_t *end
    cdef Py_ssize_t size, pos = 0, n, written, last = -1, last_n = 0
    cdef int ncols
    cdef uint8_t *out = NULL
    cdef uint8_t *scratch = NULL
    cdef const uint8_t *key_at[32]
    cdef Py_ssize_t key_length[32]
    cdef int64_t key_int[32]
    if type(data) is not bytes:
        data = bytes(data)
    if row_type is not None and not (isinstance(row_type, type) and getattr(
            row_type, "__slots__", None) == ("key", "value", "fingerprint")):
        raise TypeError("row_type: a class of the slots key, value, fingerprint")
    fingerprint = codec.fingerprint
    plan = codec.plan
    if plan is not None and plan.native is not None:
        p = plan.native
    ncols = len(codec.relation.columns)
    base = <const uint8_t *>PyBytes_AS_STRING(data)
    size = PyBytes_GET_SIZE(data)
    rows = []
    # A row's body is at most its text + 12 bytes a column; its unescaped values at
    # most its text.
    out = <uint8_t *>PyMem_Malloc(size + 12 * <Py_ssize_t>ncols + 1)
    scratch = <uint8_t *>PyMem_Malloc(size + 1)
    if out == NULL or scratch == NULL:
        PyMem_Free(out)
        PyMem_Free(scratch)
        raise MemoryError()
    try:
        while pos < size:
            line = base + pos
            end = <const uint8_t *>memchr(line, 10, size - pos)
            if end == NULL:
                raise ValueError("a COPY row without its newline")
            n = end - line
            written = -1
            if p is not None:
                written = encode_line(p, line, n, scratch, out, key_at, key_length,
                                      key_int)
            if written >= 0:
                key = line_key(p, key_at, key_length, key_int)
                body = PyBytes_FromStringAndSize(<char *>out, written)
            else:
                key, body = reference_row(line_texts(line, n, ncols, scratch), codec)
            if row_type is None:
                rows.append((key, body))
            else:
                rows.append(new_row(row_type, key, body, fingerprint))
            last = pos
            last_n = n
            pos += n + 1
        cursor = None
        if last >= 0:
            texts = line_texts(base + last, last_n, ncols, scratch)
            cursor = [texts[i] for i in codec.key_positions]
    finally:
        PyMem_Free(out)
        PyMem_Free(scratch)
    return rows, cursor
