# Included by _native.pyx: the compiled twin of databus.batch._check_python (see there
# and databus.schemas._program for programs and verdicts). Every position is checked
# against the value's end before a byte is read.

DEF CK_GOOD = 0
DEF CK_BAD = -1
DEF CK_UNSURE = -2
DEF CK_MAX_DEPTH = 64
DEF CK_DECIMAL_BYTES_MAX = 64
DEF CK_DATE_MIN = -719162
DEF CK_DATE_MAX = 2932896
DEF CK_MILLIS_MIN = -62135596800000 + 86400000
DEF CK_MILLIS_MAX = 253402300799999 - 86400000
DEF CK_DAY_MILLIS = 86400000
DEF CK_DAY_MICROS = 86400000000


cdef inline int64_t _ck_varint(const unsigned char *p, int64_t pos, int64_t stop,
                               int64_t *value) noexcept nogil:
    """The next position, or CK_BAD / CK_UNSURE; the zigzag-decoded value in *value."""
    cdef uint64_t raw = 0
    cdef int shift = 0
    cdef int n
    cdef unsigned char b
    for n in range(10):
        if pos >= stop:
            return CK_BAD
        b = p[pos]
        pos += 1
        raw |= (<uint64_t>(b & 0x7F)) << shift
        shift += 7
        if not (b & 0x80):
            if n == 9 and b > 1:
                return CK_UNSURE
            value[0] = <int64_t>((raw >> 1) ^ (0 - (raw & 1)))
            return pos
    return CK_UNSURE


cdef inline int64_t _ck_range(const unsigned char *p, int64_t pos, int64_t stop,
                              int64_t low, int64_t high) noexcept nogil:
    cdef int64_t value = 0
    pos = _ck_varint(p, pos, stop, &value)
    if pos < 0:
        return pos
    if value < low or value > high:
        return CK_UNSURE
    return pos


cdef inline int64_t _ck_length(const unsigned char *p, int64_t pos, int64_t stop,
                               int64_t *size) noexcept nogil:
    """The position after the length's bytes (the payload starts there)."""
    pos = _ck_varint(p, pos, stop, size)
    if pos < 0:
        return pos
    if size[0] < 0:
        return CK_UNSURE
    if size[0] > stop - pos:
        return CK_BAD
    return pos


cdef inline bint _ck_utf8(const unsigned char *s, int64_t n) noexcept nogil:
    """Strict UTF-8 as Python's decoder takes it (RFC 3629: no overlong form, no
    surrogate, nothing past U+10FFFF)."""
    cdef int64_t i = 0
    cdef unsigned char c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2:
            return False
        if c < 0xE0:
            if i + 1 >= n or (s[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
            continue
        if c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = s[i + 1]
            if (c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return False
            i += 3
            continue
        if c < 0xF5:
            if i + 3 >= n:
                return False
            c1 = s[i + 1]
            if ((c1 & 0xC0) != 0x80 or (s[i + 2] & 0xC0) != 0x80
                    or (s[i + 3] & 0xC0) != 0x80):
                return False
            if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
                return False
            i += 4
            continue
        return False
    return True


cdef inline bint _ck_hex(unsigned char c) noexcept nogil:
    return (48 <= c <= 57) or (65 <= c <= 70) or (97 <= c <= 102)


cdef int64_t _ck_node(const int *prog, Py_ssize_t nprog, int node,
                      const unsigned char *p, int64_t pos, int64_t stop,
                      int depth) noexcept nogil:
    cdef int op, i, n
    cdef int64_t size = 0, count = 0, j
    if depth > CK_MAX_DEPTH or node < 0 or node >= nprog:
        return CK_UNSURE
    op = prog[node]
    if op == 0:  # NULL
        return pos
    if op == 1:  # BOOLEAN
        if pos >= stop:
            return CK_BAD
        if p[pos] > 1:
            return CK_UNSURE
        return pos + 1
    if op == 2:  # INT
        return _ck_range(p, pos, stop, -2147483648, 2147483647)
    if op == 3:  # LONG
        return _ck_varint(p, pos, stop, &size)
    if op == 4 or op == 5:  # FLOAT, DOUBLE
        n = 4 if op == 4 else 8
        if stop - pos < n:
            return CK_BAD
        return pos + n
    if op == 6:  # BYTES
        pos = _ck_length(p, pos, stop, &size)
        return pos if pos < 0 else pos + size
    if op == 7:  # STRING
        pos = _ck_length(p, pos, stop, &size)
        if pos < 0:
            return pos
        if not _ck_utf8(p + pos, size):
            return CK_BAD
        return pos + size
    if op == 8 or op == 21:  # FIXED, DECIMAL_FIXED
        if node + 1 >= nprog:
            return CK_UNSURE
        size = prog[node + 1]
        if stop - pos < size:
            return CK_BAD
        if op == 21 and size > CK_DECIMAL_BYTES_MAX:
            return CK_UNSURE
        return pos + size
    if op == 9 or op == 12:  # ENUM, UNION
        if node + 1 >= nprog:
            return CK_UNSURE
        pos = _ck_varint(p, pos, stop, &count)
        if pos < 0:
            return pos
        if count < 0:
            return CK_UNSURE
        if count >= prog[node + 1]:
            return CK_BAD
        if op == 9:
            return pos
        if node + 2 + count >= nprog:
            return CK_UNSURE
        return _ck_node(prog, nprog, prog[node + 2 + count], p, pos, stop, depth + 1)
    if op == 10 or op == 11:  # ARRAY, MAP
        if node + 1 >= nprog:
            return CK_UNSURE
        while True:
            pos = _ck_varint(p, pos, stop, &count)
            if pos < 0:
                return pos
            if count == 0:
                return pos
            if count < 0:
                return CK_UNSURE
            if count > stop - pos:
                # Only items that may take no byte (null, fixed, record) can be there.
                n = prog[prog[node + 1]] if 0 <= prog[node + 1] < nprog else -1
                if op == 11 or not (n == 0 or n == 8 or n == 21 or n == 13):
                    return CK_BAD
                return CK_UNSURE
            j = 0
            while j < count:
                if op == 11:
                    pos = _ck_length(p, pos, stop, &size)
                    if pos < 0:
                        return pos
                    if not _ck_utf8(p + pos, size):
                        return CK_BAD
                    pos += size
                pos = _ck_node(prog, nprog, prog[node + 1], p, pos, stop, depth + 1)
                if pos < 0:
                    return pos
                j += 1
    if op == 13:  # RECORD
        if node + 1 >= nprog:
            return CK_UNSURE
        n = prog[node + 1]
        if node + 2 + n > nprog:
            return CK_UNSURE
        for i in range(n):
            pos = _ck_node(prog, nprog, prog[node + 2 + i], p, pos, stop, depth + 1)
            if pos < 0:
                return pos
        return pos
    if op == 14:  # DATE
        return _ck_range(p, pos, stop, CK_DATE_MIN, CK_DATE_MAX)
    if op == 15:  # TIME_MILLIS
        return _ck_range(p, pos, stop, 0, CK_DAY_MILLIS - 1)
    if op == 16:  # TIME_MICROS
        return _ck_range(p, pos, stop, 0, CK_DAY_MICROS - 1)
    if op == 17:  # TIMESTAMP_MILLIS
        return _ck_range(p, pos, stop, CK_MILLIS_MIN, CK_MILLIS_MAX)
    if op == 18:  # TIMESTAMP_MICROS
        return _ck_range(p, pos, stop, CK_MILLIS_MIN * 1000, CK_MILLIS_MAX * 1000)
    if op == 19:  # UUID
        pos = _ck_length(p, pos, stop, &size)
        if pos < 0:
            return pos
        if size == 36 and p[pos + 8] == 45 and p[pos + 13] == 45 and p[pos + 18] == 45 \
                and p[pos + 23] == 45:
            for i in range(36):
                if i != 8 and i != 13 and i != 18 and i != 23 and not _ck_hex(p[pos + i]):
                    break
            else:
                return pos + size
        if not _ck_utf8(p + pos, size):
            return CK_BAD
        return CK_UNSURE
    if op == 20:  # DECIMAL_BYTES
        pos = _ck_length(p, pos, stop, &size)
        if pos < 0:
            return pos
        if size > CK_DECIMAL_BYTES_MAX:
            return CK_UNSURE
        return pos + size
    return CK_UNSURE


cdef inline int _ck_value(const int *prog, Py_ssize_t nprog, const unsigned char *p,
                          int64_t start, int64_t stop) noexcept nogil:
    """0 GOOD, 1 BAD, 2 UNSURE (the verdicts of databus.schemas._program)."""
    cdef int64_t end = _ck_node(prog, nprog, 0, p, start, stop, 0)
    if end == CK_UNSURE:
        return 2
    if end < 0 or end != stop:
        return 1
    return 0


def check_value(program, data, Py_ssize_t start=0, end=None):
    """See ``databus.batch._check_python.check_value``."""
    cdef const int[::1] prog = program
    cdef const unsigned char[::1] view = _bytes_view(data)
    cdef int64_t n = view.shape[0]
    cdef int64_t stop = n if end is None else <int64_t>end
    if not (0 <= start <= stop <= n):
        raise ValueError(f"check_value range [{start}, {end}) is outside the {n} bytes")
    if prog.shape[0] == 0:
        return 2
    if n == 0:
        return _ck_value(&prog[0], prog.shape[0], <const unsigned char *>"", 0, 0)
    return _ck_value(&prog[0], prog.shape[0], &view[0], start, stop)
