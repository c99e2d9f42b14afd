# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of ``databus.batch._python``: the same functions, the same
results, the same errors (offset, reason and message), with the per-event loops in C.

Every check is restated here from ``databus.event`` (the layout diagram is there);
when one fails, the error itself is built by the Python twin's code for that event,
so messages cannot drift apart. Lengths are compared in 64 bits before any byte is
read: a length field pointing past the end (or claiming 2 GiB) only ever yields an
error, never a read outside the buffer.
"""

from cpython.array cimport array, clone, resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int16_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from array import array as _pyarray
from io import BytesIO

from databus._hashing import stable_key_hash as _py_stable_key_hash
from databus.batch import _python
from databus.batch._scan import Scan, WindowFrames
from databus.errors import EventFormatError
from databus.event import _OPS, _pack, encode_key

IMPLEMENTATION = "native"

cdef extern from "zlib.h":
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len) nogil

cdef extern from "_wire.h":
    uint16_t db_be16(const unsigned char *p) nogil
    uint32_t db_be32(const unsigned char *p) nogil
    uint64_t db_be64(const unsigned char *p) nogil
    void db_put16(unsigned char *p, uint16_t v) nogil
    void db_put32(unsigned char *p, uint32_t v) nogil
    void db_put64(unsigned char *p, uint64_t v) nogil
    int64_t db_stable_key_hash(const unsigned char *data, size_t length) nogil

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
        crc = crc32(crc, p, 0x40000000)
        p += 0x40000000
        n -= 0x40000000
    return crc32(crc, p, <unsigned int>n)


cdef inline uint32_t _header_crc(const unsigned char *p) noexcept nogil:
    return crc32(crc32(0, p, 4), p + 8, HEADER_SIZE - 8)


cdef inline uint32_t _crc_u32(uint32_t crc, uint32_t value) noexcept nogil:
    cdef unsigned char b[4]
    db_put32(b, value)
    return crc32(crc, b, 4)


cdef int _check_event(const unsigned char *base, int64_t pos, int64_t end,
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
                  make_event, bint from_bootstrap):
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
    cdef int64_t off, klen, total, pkey, ikey
    cdef int kind
    cdef int last_sid = -1
    cdef uint64_t last_fp = 0
    cdef const unsigned char *kp
    cdef object source = None, decode = None, schema = None, key, value
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
            decode, schema = value_decoder(sid, last_fp)
        if total > HEADER_SIZE + klen:
            value = decode(buf[off + HEADER_SIZE + klen:off + total])
        else:
            value = None
        out.append(make_event(scns[i], source, _OPS[ops[i]], key, value, tss[i], schema,
                              pkey, from_bootstrap, bool(flags[i] & 4)))
    return out


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
    cdef int64_t pkey
    cdef int kind
    cdef bytes key_bytes
    if source_id < 0 or op not in (1, 2):
        return _python.encode_event(scn, op, source_id, key, value, fingerprint,
                                    timestamp_ns, partition_id, from_snapshot)
    tkey = type(key)
    try:
        if tkey is int and -0x8000000000000000 <= key <= 0x7FFFFFFFFFFFFFFF:
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
        if not (-0x8000 <= partition_id <= 0x7FFF and source_id <= 0x7FFF
                and 0 <= fingerprint <= 0xFFFFFFFFFFFFFFFF
                and -0x8000000000000000 <= scn <= 0x7FFFFFFFFFFFFFFF
                and -0x8000000000000000 <= timestamp_ns <= 0x7FFFFFFFFFFFFFFF):
            raise TypeError
        return _encode(scn, op, source_id, key_bytes, kind, pkey,
                       value if type(value) is bytes else bytes(value), fingerprint,
                       timestamp_ns, partition_id, from_snapshot)
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
