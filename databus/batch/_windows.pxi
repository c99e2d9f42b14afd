# Included by _native.pyx: the compiled twin of databus.batch._windows_python (the
# client's fast path over a relay body; see there). Same answers, None included.


cdef class EventBase:
    """See ``databus.batch._windows_python.EventBase``."""

    cdef public object scn, source, op, key, _value, _raw, _decode, timestamp_ns
    cdef public object schema, partition_key, from_bootstrap, from_dump


cdef object _UNDECODED = None  # set by set_undecoded: DataEvent's marker of a lazy value


def set_undecoded(marker):
    """The marker ``DataEvent`` keeps in ``_value`` until the value is decoded."""
    global _UNDECODED
    _UNDECODED = marker


cdef inline object _lazy(type cls, object scn, object source, object op, object key,
                         object raw, object decode, object ts, object schema,
                         object pkey, bint from_dump):
    cdef EventBase ev = EventBase.__new__(cls)
    ev.scn = scn
    ev.source = source
    ev.op = op
    ev.key = key
    ev._value = _UNDECODED
    ev._raw = raw
    ev._decode = decode
    ev.timestamp_ns = ts
    ev.schema = schema
    ev.partition_key = pkey
    ev.from_bootstrap = False
    ev.from_dump = from_dump
    # Not tracked by the cycle collector: an event refers to no container that could
    # lead back to it (its value is decoded on access into a fresh dict), and tracking
    # tens of thousands per response made the collector two thirds of the client's
    # cost per window (measured: 2.8 -> 0.9 us of batch delivery per one-event window
    # with collection off).
    PyObject_GC_UnTrack(ev)
    return ev


def decode_relay_body(bytes buf, s, names, value_decoder, make_event, make_lazy, make_eow,
                      window, int64_t count, uint32_t crc, bint whole, bint verify,
                      make_window=None):
    """See ``databus.batch._windows_python.decode_relay_body``."""
    cdef Py_ssize_t n = s.count, i
    cdef list items = []
    if n == 0:
        return items, 0, 0, window, count, crc, whole, 0
    cdef const unsigned char *base = <const unsigned char *>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t nbuf = len(buf)
    cdef const long long[::1] offs = s.offset, lens = s.length, scns = s.scn
    cdef const long long[::1] tss = s.timestamp, pkeys = s.partition_key, klens = s.key_length
    cdef const unsigned char[::1] ops = s.op, flags = s.flags
    cdef const short[::1] sids = s.source_id
    cdef const unsigned long long[::1] fps = s.fingerprint
    cdef const unsigned int[::1] hcrcs = s.header_crc
    cdef bint open_ = window is not None
    cdef int64_t win = window if open_ else 0
    cdef int64_t scn, off, total, klen, pkey, vstart
    cdef Py_ssize_t held_from = 0, eows = 0, begun = -1
    cdef int64_t held_bytes = 0
    cdef int kind, sid
    cdef int last_sid = -1
    cdef uint64_t last_fp = 0
    cdef bint have_decoder = False, lazy = False
    cdef const unsigned char *kp
    cdef const int[::1] prog
    cdef object source = None, decode = None, schema = None, program, key, raw, op
    cdef uint32_t said_count, said_crc
    # make_lazy may be a subclass of EventBase (DataEvent): its events are filled here.
    cdef bint direct = (isinstance(make_lazy, type) and issubclass(make_lazy, EventBase)
                        and _UNDECODED is not None)
    # Another class: filled field by field by the twin's code.
    cdef bint filled = isinstance(make_lazy, type) and not direct
    cdef object fill = _windows_python.fill_event
    for i in range(n):
        scn = scns[i]
        sid = sids[i]
        off = offs[i]
        total = lens[i]
        if off < 0 or off + total > nbuf:
            raise ValueError("decode_relay_body: the scan is not of this buffer")
        if not open_ or scn != win:
            if open_ and count:
                return None
            open_, win, count, crc = True, scn, 0, 0
            # A window that begins in this body: with make_window, it is handed over
            # whole, as one item before its EOW.
            begun = len(items) if i > 0 or window is None else -1
        if sid >= 0:
            if sid != last_sid:
                source = names.get(sid)
                if source is None:
                    return None
                last_sid = sid
                have_decoder = False
            klen = klens[i]
            pkey = pkeys[i]
            kind = flags[i] & 3
            kp = base + off + HEADER_SIZE
            if kind == 1:
                if klen != 8 or <int64_t>db_be64(kp) != pkey:
                    return None
                key = pkey
            elif kind == 2 or kind == 0:
                if db_stable_key_hash(kp, klen) != pkey:
                    return None
                if kind == 2:
                    try:
                        key = kp[:klen].decode("utf-8")
                    except UnicodeDecodeError:
                        return None
                else:
                    key = kp[:klen]
            else:
                return None  # composite: the reference path reads it
            count += 1
            crc = _crc_u32(crc, hcrcs[i])
            if not have_decoder or fps[i] != last_fp:
                last_fp = fps[i]
                decode, schema, program = value_decoder(sid, last_fp)
                have_decoder = True
                lazy = program is not None
                if lazy:
                    prog = program
                    lazy = prog.shape[0] > 0
            op = _OPS[ops[i]]
            vstart = off + HEADER_SIZE + klen
            if total > HEADER_SIZE + klen:
                if not lazy or _ck_value(&prog[0], prog.shape[0], base, vstart,
                                         off + total) != 0:
                    return None
                raw = PyBytes_FromStringAndSize(<const char *>base + vstart,
                                                off + total - vstart)
                if direct:
                    items.append(_lazy(<type>make_lazy, scn, source, op, key, raw, decode,
                                       tss[i], schema, pkey, (flags[i] & 4) != 0))
                elif filled:
                    items.append(fill(make_lazy, scn, source, op, key, raw, decode, tss[i],
                                      schema, pkey, bool(flags[i] & 4)))
                else:
                    items.append(make_lazy(scn, source, op, key, raw, decode, tss[i],
                                           schema, pkey, False, bool(flags[i] & 4)))
            else:
                items.append(make_event(scn, source, op, key, None, tss[i], schema, pkey,
                                        False, bool(flags[i] & 4)))
            held_bytes += total
            continue
        if flags[i] or klens[i] or pkeys[i] or fps[i]:
            return None
        if sid != EOW:
            if sid == -5:  # a heartbeat
                continue
            return None
        if total - HEADER_SIZE != 8:
            return None
        said_count = db_be32(base + off + HEADER_SIZE)
        said_crc = db_be32(base + off + HEADER_SIZE + 4)
        if verify and whole and (said_count != count or said_crc != crc):
            return None
        if make_window is not None and begun >= 0 and len(items) > begun:
            events = items[begun:]
            del items[begun:]
            # The EOW's commit time, or the first event's when the EOW has none.
            whole_window = make_window(scn, tss[i] if tss[i] else events[0].timestamp_ns,
                                       events, [], False)
            PyObject_GC_UnTrack(events)
            PyObject_GC_UnTrack(whole_window)
            items.append(whole_window)
        items.append(make_eow(scn, tss[i], said_count))
        eows += 1
        held_from = len(items)
        held_bytes = 0
        open_, count, crc, whole = False, 0, 0, True
    return (items, held_from, eows, win if open_ else None, count, crc, whole, held_bytes)


def eow_order(s, eows):
    """See ``databus.batch._windows_python.eow_order``."""
    cdef Py_ssize_t n = len(eows), k
    if n == 0:
        return -1, None, 0
    cdef const long long[::1] scns = s.scn
    cdef const long long[::1] at = eows
    cdef int64_t previous = 0, scn, start = 0
    cdef bint seen = False
    for k in range(n):
        scn = scns[at[k]]
        if (seen and scn <= previous) or scns[start] != scn:
            return k, (previous if seen else None), start
        previous = scn
        seen = True
        start = at[k] + 1
    return -1, previous, start
