# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of ``databus.batch._python``: the same functions, the same
results, the same errors (offset, reason and message), with the per-event loops in C.

Every check is restated here from ``databus.event`` (the layout diagram is there);
when one fails, the error itself is built by the Python twin's code for that event,
so messages cannot drift apart. Lengths are compared in 64 bits before any byte is
read: a length field pointing past the end (or claiming 2 GiB) only ever yields an
error, never a read outside the buffer.
"""

from cpython.array cimport array, clone, resize, resize_smart
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.object cimport PyObject

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object op)
from libc.stdint cimport int16_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from array import array as _pyarray
from io import BytesIO

from databus._hashing import stable_key_hash as _py_stable_key_hash
from databus.batch import _python, _windows_python
from databus.batch._scan import LogCopy, Scan, WindowFrames
from databus.errors import EventFormatError
from databus.event import _OPS, _pack, encode_key

IMPLEMENTATION = "native"

cdef extern from "zlib.h":
    unsigned long zlib_crc32 "crc32"(unsigned long crc, const unsigned char *buf,
                                     unsigned int len) nogil

cdef extern from "_wire.h":
    uint16_t db_be16(const unsigned char *p) nogil
    uint32_t db_be32(const unsigned char *p) nogil
    uint64_t db_be64(const unsigned char *p) nogil
    void db_put16(unsigned char *p, uint16_t v) nogil
    void db_put32(unsigned char *p, uint32_t v) nogil
    void db_put64(unsigned char *p, uint64_t v) nogil
    int64_t db_stable_key_hash(const unsigned char *data, size_t length) nogil
    uint32_t db_crc32(uint32_t crc, const unsigned char *p, size_t n) nogil

DEF HEADER_SIZE = 56
DEF MAGIC = 0xDB
DEF VERSION = 1
DEF KNOWN_FLAGS = 0x07
DEF EOW = -2

cdef array _Q = _pyarray("q")
cdef array _UQ = _pyarray("Q")
cdef array _B = _pyarray("B")
cdef array _H = _pyarray("h")
cdef array _I = _pyarray("I")


cdef inline uint32_t _crc(uint32_t crc, const unsigned char *p, int64_t n) noexcept nogil:
    # zlib takes an unsigned int length: feed it in pieces below 4 GiB.
    while n > 0x40000000:
        crc = db_crc32(crc, p, 0x40000000)
        p += 0x40000000
        n -= 0x40000000
    return db_crc32(crc, p, <size_t>n)


def crc32(data, unsigned int value=0):
    """``zlib.crc32`` as the compiled core computes it (carry-less multiplication
    where the CPU has it): for the tests that hold it equal to zlib's."""
    cdef const unsigned char[::1] view = _bytes_view(data)
    if view.shape[0] == 0:
        return value
    return _crc(value, &view[0], view.shape[0])


cdef inline uint32_t _header_crc(const unsigned char *p) noexcept nogil:
    return zlib_crc32(zlib_crc32(0, p, 4), p + 8, HEADER_SIZE - 8)


cdef inline uint32_t _crc_u32(uint32_t crc, uint32_t value) noexcept nogil:
    cdef unsigned char b[4]
    db_put32(b, value)
    return zlib_crc32(crc, b, 4)


cdef inline int _check_event(const unsigned char *base, int64_t pos, int64_t end,
                             bint verify_body) noexcept nogil:
    """0 when the event at ``pos`` is good (as decode_header + _check_body), else 1."""
    cdef const unsigned char *p = base + pos
    cdef uint8_t op, flags
    cdef int64_t total, key_len
    cdef int16_t source_id
    if end - pos < HEADER_SIZE:
        return 1
    if p[0] != MAGIC or p[1] != VERSION:
        return 1
    if _header_crc(p) != db_be32(p + 4):
        return 1
    op = p[2]
    flags = p[3]
    if op > 2 or (flags & ~KNOWN_FLAGS):
        return 1
    total = db_be32(p + 12)
    key_len = db_be32(p + 52)
    if total < HEADER_SIZE + key_len:
        return 1
    source_id = <int16_t>db_be16(p + 34)
    if (source_id < 0) != (op == 0):
        return 1
    if total > end - pos:
        return 1
    if verify_body and _crc(0, p + HEADER_SIZE, total - HEADER_SIZE) != db_be32(p + 8):
        return 1
    return 0


def scan(buf, Py_ssize_t start=0, stop=None, *, bint verify_body=True):
    """See ``databus.batch._python.scan``."""
    cdef const unsigned char[::1] data = _bytes_view(buf)
    cdef int64_t n = data.shape[0]
    cdef int64_t end = n if stop is None else <int64_t>stop
    if not (0 <= start <= end <= n):
        raise ValueError(f"scan range [{start}, {stop}) is outside the {n} bytes")
    cdef Py_ssize_t cap = min((end - start) // HEADER_SIZE + 1, 1024)
    cdef array a_off = clone(_Q, cap, False), a_len = clone(_Q, cap, False)
    cdef array a_scn = clone(_Q, cap, False), a_ts = clone(_Q, cap, False)
    cdef array a_op = clone(_B, cap, False), a_flags = clone(_B, cap, False)
    cdef array a_pid = clone(_H, cap, False), a_sid = clone(_H, cap, False)
    cdef array a_pkey = clone(_Q, cap, False), a_klen = clone(_Q, cap, False)
    cdef array a_fp = clone(_UQ, cap, False)
    cdef array a_hcrc = clone(_I, cap, False), a_bcrc = clone(_I, cap, False)
    cdef tuple arrays = (a_off, a_len, a_scn, a_ts, a_op, a_flags, a_pid, a_sid, a_pkey,
                         a_klen, a_fp, a_hcrc, a_bcrc)
    cdef Py_ssize_t count = 0
    cdef int64_t pos = start, total
    cdef const unsigned char *base = &data[0] if n else NULL
    cdef const unsigned char *p
    cdef bint bad = False
    while pos < end:
        if _check_event(base, pos, end, verify_body):
            bad = True
            break
        if count == cap:
            # Grown by doubling: a worst-case allocation (a 56-byte event per 56 bytes)
            # would cost 1.4 times the body in arrays.
            cap *= 2
            for arr in arrays:
                resize(arr, cap)
        p = base + pos
        total = db_be32(p + 12)
        a_off.data.as_longlongs[count] = pos
        a_len.data.as_longlongs[count] = total
        a_scn.data.as_longlongs[count] = <int64_t>db_be64(p + 16)
        a_ts.data.as_longlongs[count] = <int64_t>db_be64(p + 24)
        a_op.data.as_uchars[count] = p[2]
        a_flags.data.as_uchars[count] = p[3]
        a_pid.data.as_shorts[count] = <int16_t>db_be16(p + 32)
        a_sid.data.as_shorts[count] = <int16_t>db_be16(p + 34)
        a_pkey.data.as_longlongs[count] = <int64_t>db_be64(p + 36)
        a_fp.data.as_ulonglongs[count] = db_be64(p + 44)
        a_klen.data.as_longlongs[count] = db_be32(p + 52)
        a_hcrc.data.as_uints[count] = db_be32(p + 4)
        a_bcrc.data.as_uints[count] = db_be32(p + 8)
        count += 1
        pos += total
    out = Scan.__new__(Scan)
    for arr in arrays:
        resize(arr, count)
    out.offset, out.length, out.scn, out.timestamp = a_off, a_len, a_scn, a_ts
    out.op, out.flags, out.partition_id, out.source_id = a_op, a_flags, a_pid, a_sid
    out.partition_key, out.key_length, out.fingerprint = a_pkey, a_klen, a_fp
    out.header_crc, out.body_crc = a_hcrc, a_bcrc
    out.count = count
    out.end = pos
    out.error = _python.event_error(buf, pos, end, verify_body) if bad else None
    return out


cdef const unsigned char[::1] _bytes_view(object buf):
    # bytes, bytearray, mmap and memoryviews of them; a view of another shape is
    # flattened to bytes first (as the twin's cast does).
    try:
        return buf
    except (ValueError, TypeError):
        return memoryview(buf).cast("B")


def frame_windows(s, window=None, int64_t count=0, uint32_t crc=0):
    """See ``databus.batch._python.frame_windows``."""
    cdef Py_ssize_t n = s.count, i
    cdef const long long[::1] scns = s.scn if n else _Q
    cdef const short[::1] sids = s.source_id if n else _H
    cdef const unsigned int[::1] hcrcs = s.header_crc if n else _I
    cdef array eows = clone(_Q, n, False), counts = clone(_Q, n, False)
    cdef array crcs = clone(_I, n, False), controls = clone(_Q, n, False)
    cdef Py_ssize_t k = 0, c = 0
    cdef Py_ssize_t broken = -1
    cdef bint open_ = window is not None
    cdef int64_t win = window if open_ else 0
    cdef int64_t scn
    cdef int16_t sid
    with nogil:
        for i in range(n):
            scn = scns[i]
            if not open_ or scn != win:
                if open_ and count:
                    broken = i
                    break
                open_, win, count, crc = True, scn, 0, 0
            sid = sids[i]
            if sid >= 0:
                count += 1
                crc = _crc_u32(crc, hcrcs[i])
                continue
            controls.data.as_longlongs[c] = i
            c += 1
            if sid == EOW:
                eows.data.as_longlongs[k] = i
                counts.data.as_longlongs[k] = count
                crcs.data.as_uints[k] = crc
                k += 1
                open_, count, crc = False, 0, 0
        if broken >= 0:
            for i in range(broken, n):
                if sids[i] < 0:
                    controls.data.as_longlongs[c] = i
                    c += 1
    resize(eows, k)
    resize(counts, k)
    resize(crcs, k)
    resize(controls, c)
    return WindowFrames(controls, eows, counts, crcs, broken, win if open_ else None, count,
                        crc)


def window_checksum(s, Py_ssize_t first=0, stop=None, int64_t count=0, uint32_t crc=0):
    """See ``databus.batch._python.window_checksum``."""
    cdef Py_ssize_t last = s.count if stop is None else stop, i
    if last <= first:
        return count, crc
    cdef const short[::1] sids = s.source_id
    cdef const unsigned int[::1] hcrcs = s.header_crc
    with nogil:
        for i in range(first, last):
            if sids[i] >= 0:
                count += 1
                crc = _crc_u32(crc, hcrcs[i])
    return count, crc


def decode_events(bytes buf, s, Py_ssize_t first, Py_ssize_t stop, names, value_decoder,
                  make_event, bint from_bootstrap, make_lazy=None):
    """See ``databus.batch._python.decode_events``."""
    cdef list out = []
    if stop <= first:
        return out
    cdef const unsigned char *base = <const unsigned char *>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t nbuf = len(buf)
    cdef const long long[::1] offs = s.offset, lens = s.length, scns = s.scn
    cdef const long long[::1] tss = s.timestamp, pkeys = s.partition_key, klens = s.key_length
    cdef const unsigned char[::1] ops = s.op, flags = s.flags
    cdef const short[::1] sids = s.source_id
    cdef const unsigned long long[::1] fps = s.fingerprint
    cdef Py_ssize_t i
    cdef int64_t off, klen, total, pkey, ikey, vstart
    cdef int kind, verdict
    cdef int last_sid = -1
    cdef uint64_t last_fp = 0
    cdef const unsigned char *kp
    cdef object source = None, decode = None, schema = None, key, value, raw, program
    cdef const int[::1] prog
    cdef bint lazy = False
    cdef int sid
    for i in range(first, stop):
        sid = sids[i]
        if sid < 0:
            continue
        off = offs[i]
        total = lens[i]
        klen = klens[i]
        pkey = pkeys[i]
        if off < 0 or off + total > nbuf:
            raise ValueError("decode_events: the scan is not of this buffer")
        if sid != last_sid:
            source = names.get(sid)
            if source is None:
                raise EventFormatError(f"unknown source id {sid}", offset=off,
                                       reason="unknown source")
            last_sid = sid
            decode = None
        kind = flags[i] & 3
        kp = base + off + HEADER_SIZE
        if kind == 1 and klen == 8 and <int64_t>db_be64(kp) == pkey:
            key = pkey
        elif kind == 2 and db_stable_key_hash(kp, klen) == pkey:
            try:
                key = kp[:klen].decode("utf-8")
            except UnicodeDecodeError:
                key = _python.data_key(buf, s, i)  # raises the twin's error
        elif kind == 0 and db_stable_key_hash(kp, klen) == pkey:
            key = kp[:klen]
        else:
            key = _python.data_key(buf, s, i)  # composite keys; raises bad ones
        if decode is None or fps[i] != last_fp:
            last_fp = fps[i]
            decode, schema, program = value_decoder(sid, last_fp)
            lazy = program is not None and make_lazy is not None
            if lazy:
                prog = program
                lazy = prog.shape[0] > 0
        vstart = off + HEADER_SIZE + klen
        if total > HEADER_SIZE + klen:
            raw = PyBytes_FromStringAndSize(<const char *>base + vstart,
                                            off + total - vstart)
            if lazy:
                verdict = _ck_value(&prog[0], prog.shape[0], base, vstart, off + total)
                if verdict == 0:
                    out.append(make_lazy(scns[i], source, _OPS[ops[i]], key, raw, decode,
                                         tss[i], schema, pkey, from_bootstrap,
                                         bool(flags[i] & 4)))
                    continue
                if verdict == 1:
                    raise _python.bad_value(off)
            value = decode(raw)
        else:
            value = None
        out.append(make_event(scns[i], source, _OPS[ops[i]], key, value, tss[i], schema,
                              pkey, from_bootstrap, bool(flags[i] & 4)))
    return out


include "_check.pxi"
include "_windows.pxi"


def stable_key_hash(key):
    """``databus._hashing.stable_key_hash`` in C."""
    cdef const unsigned char[::1] data = _bytes_view(key)
    if data.shape[0] == 0:
        return db_stable_key_hash(NULL, 0)
    return db_stable_key_hash(&data[0], data.shape[0])


def key_hashes(buf, s, Py_ssize_t first=0, stop=None):
    """See ``databus.batch._python.key_hashes``."""
    cdef const unsigned char[::1] data = _bytes_view(buf)
    cdef Py_ssize_t last = s.count if stop is None else stop, i, k = 0
    cdef array out = clone(_Q, max(last - first, 0), False)
    if last <= first:
        return out
    cdef const long long[::1] offs = s.offset, klens = s.key_length
    cdef const short[::1] sids = s.source_id
    cdef int64_t n = data.shape[0]
    for i in range(first, last):
        if offs[i] < 0 or offs[i] + HEADER_SIZE + klens[i] > n:
            raise ValueError("key_hashes: the scan is not of this buffer")
    with nogil:
        for i in range(first, last):
            if sids[i] < 0:
                out.data.as_longlongs[k] = 0
            else:
                out.data.as_longlongs[k] = db_stable_key_hash(
                    &data[offs[i] + HEADER_SIZE], klens[i])
            k += 1
    return out


cdef bytes _encode(int64_t scn, int op, int source_id, bytes key_bytes, int kind,
                   int64_t pkey, const unsigned char[::1] value, uint64_t fp,
                   int64_t ts, int16_t partition_id, bint from_snapshot):
    cdef Py_ssize_t klen = len(key_bytes), vlen = value.shape[0]
    cdef Py_ssize_t total = HEADER_SIZE + klen + vlen
    if total > 0xFFFFFFFF or klen > 0xFFFFFFFF:
        _pack(op, kind, scn, ts, partition_id, source_id, pkey, fp, key_bytes,
              bytes(value))  # raises the twin's error
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *p = <unsigned char *>PyBytes_AS_STRING(out)
    cdef const unsigned char *k = <const unsigned char *>PyBytes_AS_STRING(key_bytes)
    p[0] = MAGIC
    p[1] = VERSION
    p[2] = op
    p[3] = kind | (4 if from_snapshot else 0)
    db_put32(p + 12, <uint32_t>total)
    db_put64(p + 16, <uint64_t>scn)
    db_put64(p + 24, <uint64_t>ts)
    db_put16(p + 32, <uint16_t>partition_id)
    db_put16(p + 34, <uint16_t>source_id)
    db_put64(p + 36, <uint64_t>pkey)
    db_put64(p + 44, fp)
    db_put32(p + 52, <uint32_t>klen)
    if klen:
        memcpy(p + HEADER_SIZE, k, klen)
    if vlen:
        memcpy(p + HEADER_SIZE + klen, &value[0], vlen)
    db_put32(p + 8, _crc(0, p + HEADER_SIZE, klen + vlen))
    db_put32(p + 4, _header_crc(p))
    return out


def encode_event(scn, op, source_id, key, value, fingerprint=0, timestamp_ns=0,
                 partition_id=0, from_snapshot=False):
    """See ``databus.batch._python.encode_event``."""
    cdef int64_t c_scn, c_ts, pkey
    cdef uint64_t c_fp
    cdef int c_op, c_sid, c_pid, kind
    cdef bytes key_bytes
    try:
        # C conversions check the ranges (OverflowError) and the types (TypeError).
        c_scn, c_ts, c_fp = scn, timestamp_ns, fingerprint
        c_op, c_sid, c_pid = op, source_id, partition_id
        if c_sid < 0 or c_sid > 0x7FFF or c_pid < -0x8000 or c_pid > 0x7FFF or (
                c_op != 1 and c_op != 2):
            raise TypeError
        tkey = type(key)
        if tkey is int:
            pkey = key
            key_bytes = PyBytes_FromStringAndSize(NULL, 8)
            db_put64(<unsigned char *>PyBytes_AS_STRING(key_bytes), <uint64_t>pkey)
            kind = 1
        elif tkey is str:
            key_bytes = (<str>key).encode("utf-8")
            pkey = db_stable_key_hash(<const unsigned char *>PyBytes_AS_STRING(key_bytes),
                                      len(key_bytes))
            kind = 2
        elif tkey is bytes:
            key_bytes = key
            pkey = db_stable_key_hash(<const unsigned char *>PyBytes_AS_STRING(key_bytes),
                                      len(key_bytes))
            kind = 0
        else:
            raise TypeError
        return _encode(c_scn, c_op, c_sid, key_bytes, kind, pkey,
                       value if type(value) is bytes else bytes(value), c_fp, c_ts,
                       <int16_t>c_pid, from_snapshot)
    except (TypeError, UnicodeEncodeError, OverflowError):
        # Composite keys, subclasses, out-of-range fields: the twin encodes or raises.
        return _python.encode_event(scn, op, source_id, key, value, fingerprint,
                                    timestamp_ns, partition_id, from_snapshot)


def encode_events(scn, ops, source_ids, keys, values, fingerprints, *, timestamp_ns=0,
                  partition_id=0, from_snapshot=False):
    """See ``databus.batch._python.encode_events``."""
    cdef Py_ssize_t n = len(ops), i
    if not len(source_ids) == len(keys) == len(values) == len(fingerprints) == n:
        raise ValueError("encode_events: the columns differ in length")
    return [encode_event(scn, ops[i], source_ids[i], keys[i], values[i], fingerprints[i],
                         timestamp_ns, partition_id, from_snapshot) for i in range(n)]


def restamp(buf, Py_ssize_t offset, Py_ssize_t length, int source_id):
    """See ``databus.batch._python.restamp``."""
    cdef const unsigned char[::1] data = _bytes_view(buf)
    if offset < 0 or length < HEADER_SIZE or offset + length > data.shape[0]:
        return _python.restamp(buf, offset, length, source_id)
    cdef bytes out = PyBytes_FromStringAndSize(<const char *>&data[offset], length)
    cdef unsigned char *p = <unsigned char *>PyBytes_AS_STRING(out)
    db_put16(p + 34, <uint16_t><int16_t>source_id)
    db_put32(p + 4, _header_crc(p))
    return out


# -- the relay's read rules ------------------------------------------------------------

DEF F_ALL = 0
DEF F_REJECT = 1
DEF F_MOD = 2
DEF F_HASH = 3
DEF F_RANGE = 4
DEF F_INTERVAL = 5
DEF F_PY = 6


cdef class _Rule:
    """One source's decision, ready for C: pass all, reject, or one filter's numbers."""
    cdef int kind
    cdef int64_t n, lo, hi
    cdef bint no_hi
    cdef array los, his
    cdef object py


cdef bint _in_ranges(_Rule r, int64_t v) noexcept:
    # Sorted disjoint inclusive ranges: the last one starting at or before v.
    cdef Py_ssize_t a = 0, b = len(r.los), m
    cdef const long long *los = r.los.data.as_longlongs
    while a < b:
        m = (a + b) // 2
        if los[m] <= v:
            a = m + 1
        else:
            b = m
    return a > 0 and v <= r.his.data.as_longlongs[a - 1]


cdef _Rule _make_rule(bint wanted, object f):
    cdef _Rule r = _Rule()
    if not wanted:
        r.kind = F_REJECT
        return r
    if f is None:
        r.kind = F_ALL
        return r
    name = type(f).__name__
    ranges = None
    if name in ("ModFilter", "HashFilter"):
        r.kind = F_MOD if name == "ModFilter" else F_HASH
        r.n = f.n
        ranges = f.buckets.ranges
    elif name == "RangeFilter":
        r.kind = F_RANGE
        r.n = f.size
        ranges = f.ids.ranges
    elif name == "IntervalFilter":
        r.kind = F_INTERVAL
        r.lo = f.lo
        r.no_hi = f.hi > 0x7FFFFFFFFFFFFFFF
        r.hi = 0 if r.no_hi else f.hi
    else:
        r.kind = F_PY
        r.py = f
    if ranges is not None:
        r.los = _pyarray("q", [lo for lo, _ in ranges])
        r.his = _pyarray("q", [hi for _, hi in ranges])
    return r


cdef class CompiledFilter:
    """See ``databus.batch._python.CompiledFilter``."""
    cdef public object plan
    cdef public bint needs_key
    cdef dict _rules
    cdef object _predicate
    cdef int _last_id
    cdef _Rule _last

    def __init__(self, plan):
        self.plan = plan
        self._predicate = plan.predicate
        self.needs_key = plan.needs_key
        self._rules = {}
        self._last_id = -1
        self._last = None

    cdef _Rule rule(self, int source_id):
        # Events come in runs of one source: the last rule answers most lookups.
        if source_id == self._last_id:
            return self._last
        r = self._rules.get(source_id)
        if r is None:
            plan = self.plan
            wanted = plan.wanted
            if (plan.resolve is None or source_id in plan.filters
                    or (wanted is not None and source_id in wanted)):
                decision = (wanted is None or source_id in wanted,
                            plan.filters.get(source_id))
            else:
                decision = plan.resolve(source_id)
            r = _make_rule(decision[0], decision[1])
            self._rules[source_id] = r
        self._last_id = source_id
        self._last = <_Rule>r
        return self._last

    cdef bint passes_c(self, int source_id, int64_t pkey, const unsigned char *key,
                       int64_t key_len) except -1:
        cdef _Rule r = self.rule(source_id)
        cdef uint64_t mag
        cdef bint ok
        if r.kind == F_REJECT:
            return False
        if r.kind == F_ALL:
            ok = True
        elif r.kind == F_MOD:
            mag = <uint64_t>(-pkey) if pkey < 0 else <uint64_t>pkey  # abs(-2**63) too
            ok = _in_ranges(r, <int64_t>(mag % <uint64_t>r.n))
        elif r.kind == F_HASH:
            ok = _in_ranges(r, db_stable_key_hash(key, key_len) % r.n)
        elif r.kind == F_RANGE:
            ok = pkey >= 0 and _in_ranges(r, pkey // r.n)
        elif r.kind == F_INTERVAL:
            ok = r.lo <= pkey and (r.no_hi or pkey < r.hi)
        else:
            ok = bool(r.py.passes(pkey, key[:key_len] if key_len and self.needs_key else b""))
        if ok and self._predicate is not None:
            ok = bool(self._predicate(source_id, pkey,
                                      key[:key_len] if key_len and self.needs_key else b""))
        return ok

    def passes(self, source_id, pkey, key):
        cdef const unsigned char[::1] data = _bytes_view(key)
        return self.passes_c(source_id, pkey, &data[0] if data.shape[0] else NULL,
                             data.shape[0])


def compile_filter(plan):
    return CompiledFilter(plan)


cdef int _add_run(array runs, int64_t start, int64_t end) except -1:
    cdef Py_ssize_t n = len(runs)
    resize_smart(runs, n + 2)
    runs.data.as_longlongs[n] = start
    runs.data.as_longlongs[n + 1] = end
    return 0


def gather(buf, array runs, Py_ssize_t limit):
    """See ``databus.batch._python.gather``: one allocation, one memcpy per run."""
    cdef const unsigned char[::1] data = _bytes_view(buf)
    cdef Py_ssize_t k, n = len(runs), total = 0, left = limit, start, end
    cdef const long long *r = runs.data.as_longlongs
    for k in range(0, n, 2):
        if left <= 0:
            break
        start, end = r[k], r[k + 1]
        if not (0 <= start <= end <= data.shape[0]):
            raise ValueError("gather: a run outside the buffer")
        end = min(end, start + left)
        total += end - start
        left -= end - start
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *p = <unsigned char *>PyBytes_AS_STRING(out)
    left = total
    for k in range(0, n, 2):
        if left <= 0:
            break
        start, end = r[k], r[k + 1]
        end = min(end, start + left)
        memcpy(p, &data[start], end - start)
        p += end - start
        left -= end - start
    return out


def select_events(buf, Py_ssize_t pos, Py_ssize_t stop, st, CompiledFilter flt):
    """See ``databus.batch._python.select_events``."""
    cdef const unsigned char[::1] data = _bytes_view(buf)
    if not (0 <= pos <= stop <= data.shape[0]):
        raise ValueError("select_events: range outside the buffer")
    cdef const unsigned char *base = &data[0] if data.shape[0] else NULL
    cdef const unsigned char *p
    cdef int64_t after = st.after, max_bytes = st.max_bytes
    cdef bint has_partial = st.partial_scn is not None
    cdef int64_t partial_scn = st.partial_scn if has_partial else 0
    cdef int64_t skip_events = st.skip_events
    cdef bint has_win = st.win_scn is not None
    cdef int64_t win_scn = st.win_scn if has_win else 0
    cdef int64_t win_seen = st.win_seen, skip = st.skip, size = st.size
    cdef int64_t events = st.events, windows = st.windows
    cdef int64_t cp_scn = st.cp_scn, cp_offset = st.cp_offset, cp_size = st.cp_size
    cdef bint has_first = st.first is not None
    cdef int64_t first = st.first if has_first else 0
    cdef array runs = st.runs
    cdef int64_t run_start = -1, run_end = -1
    cdef int64_t total, scn, pkey, key_len
    cdef int source_id
    cdef bint full = False
    cdef object pending = None
    while pos < stop:
        p = base + pos
        if stop - pos < HEADER_SIZE or p[0] != MAGIC:
            break
        total = db_be32(p + 12)
        key_len = db_be32(p + 52)
        if total < HEADER_SIZE + key_len or total > stop - pos:
            break
        scn = <int64_t>db_be64(p + 16)
        if scn <= after:
            pos += total
            continue
        source_id = <int16_t>db_be16(p + 34)
        if not has_win or scn != win_scn:
            has_win, win_scn, win_seen = True, scn, 0
            skip = skip_events if has_partial and scn == partial_scn else 0
        if source_id >= 0:
            if flt is not None:
                pkey = <int64_t>db_be64(p + 36)
                if not flt.passes_c(source_id, pkey, p + HEADER_SIZE, key_len):
                    pos += total
                    continue
            if win_seen < skip:
                win_seen += 1
                pos += total
                continue
        elif win_seen < skip and source_id != EOW:
            pos += total
            continue
        if size + total > max_bytes:
            if cp_size == 0:
                pending = size + total
            full = True
            break
        if not has_first:
            has_first, first = True, pos
        if pos != run_end:
            if run_start >= 0:
                _add_run(runs, run_start, run_end)
            run_start = pos
        run_end = pos + total
        size += total
        pos += total
        if source_id == EOW:
            windows += 1
            cp_scn, cp_offset, cp_size = scn, -1, size
        elif source_id >= 0:
            win_seen += 1
            events += 1
            cp_scn, cp_offset, cp_size = scn, win_seen, size
    if run_start >= 0:
        _add_run(runs, run_start, run_end)
    st.win_scn = win_scn if has_win else None
    st.win_seen, st.skip, st.size = win_seen, skip, size
    st.events, st.windows = events, windows
    st.cp_scn, st.cp_offset, st.cp_size = cp_scn, cp_offset, cp_size
    st.first = first if has_first else None
    if full:
        st.full = True
        if pending is not None:
            st.pending = pending
    return pos


# -- the bootstrap log's binary COPY rows ---------------------------------------------


def copy_rows(buf, s, indexes, scns, seqs, key_hashes, int source_id):
    """See ``databus.batch._python.copy_rows``."""
    cdef const unsigned char[::1] data = _bytes_view(buf)
    cdef Py_ssize_t n = len(indexes), k, i, total = 0
    if not len(scns) == len(seqs) == n:
        raise ValueError("copy_rows: the columns differ in length")
    if n == 0:
        return b""
    cdef const long long[::1] idx = _as_q(indexes), scn = _as_q(scns), seq = _as_q(seqs)
    cdef const long long[::1] hashes = _as_q(key_hashes) if key_hashes is not None else None
    cdef const long long[::1] offs = s.offset, lens = s.length, pkeys = s.partition_key
    cdef const long long[::1] klens = s.key_length
    cdef const unsigned char[::1] ops = s.op
    cdef const short[::1] sids = s.source_id
    for k in range(n):
        i = idx[k]
        if not (0 <= i < s.count) or offs[i] + lens[i] > data.shape[0] or (
                hashes is not None and i >= hashes.shape[0]):
            raise ValueError("copy_rows: an index outside the scan or its buffer")
        total += 2 + 12 + 8 + 6 + 12 + 12 + 4 + klens[i] + 4 + lens[i]
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *p = <unsigned char *>PyBytes_AS_STRING(out)
    cdef const unsigned char *ev
    for k in range(n):
        i = idx[k]
        ev = &data[offs[i]]
        db_put16(p, 7)
        db_put32(p + 2, 8)
        db_put64(p + 6, <uint64_t>scn[k])
        db_put32(p + 14, 4)
        db_put32(p + 18, <uint32_t>seq[k])
        db_put32(p + 22, 2)
        db_put16(p + 26, ops[i])
        db_put32(p + 28, 8)
        db_put64(p + 32, <uint64_t>pkeys[i])
        db_put32(p + 40, 8)
        db_put64(p + 44, <uint64_t>(hashes[i] if hashes is not None else 0))
        db_put32(p + 52, <uint32_t>klens[i])
        p += 56
        memcpy(p, ev + HEADER_SIZE, klens[i])
        p += klens[i]
        db_put32(p, <uint32_t>lens[i])
        p += 4
        memcpy(p, ev, lens[i])
        if sids[i] != source_id:  # stored under the store's own source id
            db_put16(p + 34, <uint16_t><int16_t>source_id)
            db_put32(p + 4, _header_crc(p))
        p += lens[i]
    return out


cdef object _as_q(object values):
    # An int64 array as is; any other sequence of ints copied into one.
    if isinstance(values, array) and (<array>values).ob_descr.typecode == b"q":
        return values
    return _pyarray("q", values)


def group_rows(s, firsts, stops, scns, owner):
    """See ``databus.batch._python.group_rows``."""
    cdef const long long[::1] f = _as_q(firsts), t = _as_q(stops), w = _as_q(scns)
    cdef Py_ssize_t nw = f.shape[0], k, i
    if not t.shape[0] == w.shape[0] == nw:
        raise ValueError("group_rows: the columns differ in length")
    if nw == 0:
        return {}, []
    cdef const short[::1] sids = s.source_id
    cdef const long long[::1] lengths = s.length
    cdef Py_ssize_t n = sids.shape[0]
    cdef dict groups = {}
    cdef list windows = []
    cdef int last_sid = -1, sid
    cdef array g_idx = None, g_scn = None, g_seq = None
    cdef int64_t seq, size, scn
    for k in range(nw):
        if not (0 <= f[k] <= t[k] <= n):
            raise ValueError("group_rows: a window outside the scan")
        scn = w[k]
        seq = size = 0
        for i in range(f[k], t[k]):
            sid = sids[i]
            if sid < 0:
                continue
            if sid != last_sid:
                target = owner[sid]
                group = groups.get(target)
                if group is None:
                    group = groups[target] = (_pyarray("q"), _pyarray("q"), _pyarray("q"))
                g_idx, g_scn, g_seq = group
                last_sid = sid
            _push(g_idx, i)
            _push(g_scn, scn)
            _push(g_seq, seq)
            seq += 1
            size += lengths[i]
        if seq:
            windows.append((k, seq, size))
    return groups, windows


cdef inline int _push(array a, long long v) except -1:
    cdef Py_ssize_t n = len(a)
    resize_smart(a, n + 1)
    a.data.as_longlongs[n] = v
    return 0


# -- a response's whole windows: their EOW checks and their log rows -------------------

DEF COPY_HEADER_SIZE = 19
DEF COPY_ROW_FIXED = 60  # a log row without its key and event bytes
DEF COPY_WINDOW_ROW = 46
cdef bytes _COPY_HEADER = _python.COPY_HEADER
cdef bytes _COPY_TRAILER = _python.COPY_TRAILER


def check_windows(buf, s, frames):
    """See ``databus.batch._python.check_windows``."""
    cdef const unsigned char[::1] data = _bytes_view(buf)
    cdef const long long[::1] eows = _as_q(frames.eows)
    cdef Py_ssize_t ne = eows.shape[0], k, e
    if ne == 0:
        return None
    cdef const long long[::1] counts = _as_q(frames.counts)
    cdef const unsigned int[::1] crcs = frames.crcs
    cdef const long long[::1] offs = s.offset, lens = s.length, klens = s.key_length
    cdef Py_ssize_t n = s.count, nbuf = data.shape[0]
    cdef const unsigned char *p
    if counts.shape[0] < ne or crcs.shape[0] < ne:
        raise ValueError("check_windows: the frames' columns differ in length")
    for k in range(ne):
        e = eows[k]
        if not (0 <= e < n) or offs[e] < 0 or offs[e] + lens[e] > nbuf:
            raise ValueError("check_windows: an EOW outside the scan or its buffer")
        if lens[e] != HEADER_SIZE + 8 or klens[e] != 0:
            _python._check_eow(buf, s, frames, k)  # raises the twin's error
        p = &data[offs[e] + HEADER_SIZE]
        if <int64_t>db_be32(p) != counts[k] or db_be32(p + 4) != crcs[k]:
            _python._check_eow(buf, s, frames, k)
            raise AssertionError("the twins disagree on an EOW")  # a bug, not input
    return None


def log_copy(buf, s, frames, owner, bint key_hash=True):
    """See ``databus.batch._python.log_copy``."""
    cdef const unsigned char[::1] data = _bytes_view(buf)
    cdef const long long[::1] eows = _as_q(frames.eows)
    cdef Py_ssize_t ne = eows.shape[0], n = s.count, nbuf = data.shape[0]
    cdef Py_ssize_t k, i, e, first, last = -1
    for k in range(ne):
        e = eows[k]
        if not (last < e < n):
            raise ValueError("log_copy: the EOWs are not of this scan, in order")
        last = e
    if ne == 0:
        return LogCopy({}, {}, _COPY_HEADER + _COPY_TRAILER, 0, 0, -1, -1, None)
    cdef const long long[::1] offs = s.offset, lens = s.length, scns = s.scn
    cdef const long long[::1] tss = s.timestamp, pkeys = s.partition_key
    cdef const long long[::1] klens = s.key_length
    cdef const unsigned char[::1] ops = s.op
    cdef const short[::1] sids = s.source_id
    if offs[last] + lens[last] > nbuf:
        raise ValueError("log_copy: the scan is not of this buffer")
    cdef int16_t sid, maxsid = -1
    for i in range(last):
        if sids[i] > maxsid:
            maxsid = sids[i]
    cdef Py_ssize_t width = <Py_ssize_t>maxsid + 1
    # Per relay source id: its slot (-1: not met yet); per slot: bytes, first and last
    # SCN, store source id, write position.
    cdef array scratch = clone(_Q, 5 * width + 1, False)
    cdef long long *slot_of = scratch.data.as_longlongs
    cdef long long *sizes = slot_of + width
    cdef long long *firsts = sizes + width
    cdef long long *lasts = firsts + width
    cdef long long *tgts = lasts + width
    for i in range(width):
        slot_of[i] = -1
    cdef Py_ssize_t nslots = 0, slot
    cdef dict target_slot = {}
    cdef list targets = []
    cdef int64_t scn, seq, size, stored = 0, events = 0, first_scn = -1, last_scn = -1
    cdef object unordered = None, target, got
    first = 0
    for k in range(ne):
        e = eows[k]
        scn = scns[e]
        seq = 0
        for i in range(first, e):
            sid = sids[i]
            if sid < 0:
                continue
            if offs[i] < 0 or offs[i] + lens[i] > nbuf:
                raise ValueError("log_copy: the scan is not of this buffer")
            slot = slot_of[sid]
            if slot < 0:
                target = owner[sid]
                if not 0 <= target <= 0x7FFF:
                    raise ValueError("log_copy: a store source id outside 0..32767")
                got = target_slot.get(target)
                if got is None:
                    slot = nslots
                    nslots += 1
                    target_slot[target] = slot
                    targets.append(target)
                    sizes[slot] = 0
                    firsts[slot] = scn
                    tgts[slot] = target
                else:
                    slot = got
                slot_of[sid] = slot
            sizes[slot] += COPY_ROW_FIXED + klens[i] + lens[i]
            lasts[slot] = scn
            seq += 1
        if seq:
            if stored and scn <= last_scn and unordered is None:
                unordered = (scn, last_scn)
            if not stored:
                first_scn = scn
            last_scn = scn
            stored += 1
            events += seq
        first = e + 1
    cdef list outs = []
    cdef bytes out, windows
    cdef unsigned char **ptrs = <unsigned char **>malloc((nslots + 1) * sizeof(unsigned char *))
    if ptrs == NULL:
        raise MemoryError()
    cdef unsigned char *p
    cdef unsigned char *wp
    cdef const unsigned char *base = &data[0]
    cdef const unsigned char *ev
    cdef int64_t klen, total
    try:
        for slot in range(nslots):
            out = PyBytes_FromStringAndSize(NULL, COPY_HEADER_SIZE + sizes[slot] + 2)
            outs.append(out)
            p = <unsigned char *>PyBytes_AS_STRING(out)
            memcpy(p, <const char *>_COPY_HEADER, COPY_HEADER_SIZE)
            ptrs[slot] = p + COPY_HEADER_SIZE
        windows = PyBytes_FromStringAndSize(NULL, COPY_HEADER_SIZE + stored * COPY_WINDOW_ROW + 2)
        wp = <unsigned char *>PyBytes_AS_STRING(windows)
        memcpy(wp, <const char *>_COPY_HEADER, COPY_HEADER_SIZE)
        wp += COPY_HEADER_SIZE
        with nogil:
            first = 0
            for k in range(ne):
                e = eows[k]
                scn = scns[e]
                seq = size = 0
                for i in range(first, e):
                    sid = sids[i]
                    if sid < 0:
                        continue
                    slot = slot_of[sid]
                    p = ptrs[slot]
                    ev = base + offs[i]
                    klen = klens[i]
                    total = lens[i]
                    db_put16(p, 7)
                    db_put32(p + 2, 8)
                    db_put64(p + 6, <uint64_t>scn)
                    db_put32(p + 14, 4)
                    db_put32(p + 18, <uint32_t>seq)
                    db_put32(p + 22, 2)
                    db_put16(p + 26, ops[i])
                    db_put32(p + 28, 8)
                    db_put64(p + 32, <uint64_t>pkeys[i])
                    db_put32(p + 40, 8)
                    db_put64(p + 44, <uint64_t>(db_stable_key_hash(ev + HEADER_SIZE, klen)
                                                 if key_hash else 0))
                    db_put32(p + 52, <uint32_t>klen)
                    p += 56
                    memcpy(p, ev + HEADER_SIZE, klen)
                    p += klen
                    db_put32(p, <uint32_t>total)
                    p += 4
                    memcpy(p, ev, total)
                    if sid != tgts[slot]:  # stored under the store's own source id
                        db_put16(p + 34, <uint16_t><int16_t>tgts[slot])
                        db_put32(p + 4, _header_crc(p))
                    ptrs[slot] = p + total
                    seq += 1
                    size += total
                if seq:
                    db_put16(wp, 4)
                    db_put32(wp + 2, 8)
                    db_put64(wp + 6, <uint64_t>scn)
                    db_put32(wp + 14, 8)
                    db_put64(wp + 18, <uint64_t>tss[e])
                    db_put32(wp + 26, 4)
                    db_put32(wp + 30, <uint32_t>seq)
                    db_put32(wp + 34, 8)
                    db_put64(wp + 38, <uint64_t>size)
                    wp += COPY_WINDOW_ROW
                first = e + 1
            for slot in range(nslots):
                db_put16(ptrs[slot], 0xFFFF)
            db_put16(wp, 0xFFFF)
    finally:
        free(ptrs)
    return LogCopy({targets[slot]: outs[slot] for slot in range(nslots)},
                   {targets[slot]: (firsts[slot], lasts[slot]) for slot in range(nslots)},
                   windows, stored, events, first_scn, last_scn, unordered)


# -- flat Avro records ----------------------------------------------------------------

DEF A_LONG = 1
DEF A_INT = 2
DEF A_DOUBLE = 3
DEF A_BOOLEAN = 4
DEF A_STRING = 5
DEF A_BYTES = 6
DEF A_NULLABLE = 16


cdef inline Py_ssize_t _put_zigzag(unsigned char *p, int64_t v) noexcept nogil:
    cdef uint64_t z = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    cdef Py_ssize_t n = 0
    while z > 0x7F:
        p[n] = <unsigned char>((z & 0x7F) | 0x80)
        z >>= 7
        n += 1
    p[n] = <unsigned char>z
    return n + 1


def encode_flat_record(values, codes):
    """See ``databus.batch._python.encode_flat_record``."""
    cdef Py_ssize_t n = len(values), i, size = 0, k
    cdef const unsigned char[::1] c
    if n != len(codes):
        return None
    if n == 0:
        return b""
    c = codes if isinstance(codes, bytes) else bytes(codes)
    cdef list parts = [None] * n  # the encoded str/bytes payloads, to size the record
    cdef int kind
    cdef int64_t lv
    # Pass 1: check every value and size the record (10 bytes for any varint).
    for i in range(n):
        value = values[i]
        kind = c[i] & ~A_NULLABLE
        if value is None:
            if not c[i] & A_NULLABLE:
                return None
            size += 1
            continue
        size += 1 if c[i] & A_NULLABLE else 0
        t = type(value)
        if kind == A_LONG or kind == A_INT:
            if t is not int:
                return None
            try:
                lv = value
            except OverflowError:
                return None
            if kind == A_INT and not (-0x80000000 <= lv <= 0x7FFFFFFF):
                return None
            size += 10
        elif kind == A_DOUBLE:
            if t is not float:
                return None
            size += 8
        elif kind == A_BOOLEAN:
            if t is not bool:
                return None
            size += 1
        elif kind == A_STRING:
            if t is not str:
                return None
            try:
                data = (<str>value).encode("utf-8")
            except UnicodeEncodeError:
                return None
            parts[i] = data
            size += 10 + len(<bytes>data)
        elif kind == A_BYTES:
            if t is not bytes:
                return None
            parts[i] = value
            size += 10 + len(<bytes>value)
        else:
            return None
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef unsigned char *base = <unsigned char *>PyBytes_AS_STRING(out)
    cdef unsigned char *p = base
    cdef double d
    cdef bytes b
    # Pass 2: write.
    for i in range(n):
        value = values[i]
        kind = c[i] & ~A_NULLABLE
        if value is None:
            p[0] = 0
            p += 1
            continue
        if c[i] & A_NULLABLE:
            p[0] = 2
            p += 1
        if kind == A_LONG or kind == A_INT:
            p += _put_zigzag(p, <int64_t>value)
        elif kind == A_DOUBLE:
            d = value
            memcpy(p, &d, 8)  # x86-64 and aarch64 are little-endian, as Avro is
            p += 8
        elif kind == A_BOOLEAN:
            p[0] = 1 if value else 0
            p += 1
        else:
            b = <bytes>parts[i]
            k = len(b)
            p += _put_zigzag(p, k)
            memcpy(p, PyBytes_AS_STRING(b), k)
            p += k
    return out[:p - base]
