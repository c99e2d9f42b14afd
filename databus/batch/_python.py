"""The pure-Python twin of the batch APIs: the reference the compiled ``_native``
module must equal, result for result and error for error (same offset, same reason,
same message). It is written with the one-event functions of ``databus.event``, so
the per-event rules exist once in Python; ``_native.pyx`` restates them in C.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from databus._hashing import stable_key_hash
from databus.batch._check_python import check_value
from databus.batch._scan import LogCopy, Scan, WindowFrames
from databus.batch._select import FilterPlan, ReadState
from databus.batch._windows_python import (
    EventBase,
    decode_relay_body,
    eow_order,
    set_undecoded,
)
from databus.errors import EventFormatError
from databus.event import (
    _EOW_VALUE,
    _OPS,
    _U32,
    EOW_SOURCE_ID,
    FLAG_FROM_SNAPSHOT,
    HEADER_SIZE,
    Buffer,
    EventHeader,
    Key,
    _check_body,
    _pack,
    decode_data_key,
    decode_header,
    encode_key,
    restamp_source_id,
)
from databus.schemas._program import BAD, GOOD

IMPLEMENTATION = "python"


def scan(buf: Buffer, start: int = 0, stop: int | None = None, *,
         verify_body: bool = True) -> Scan:
    """Every event of ``buf[start:stop]`` in one pass: header checks and CRC, framing,
    and (``verify_body``) the body CRC. Stops at the first bad or cut-off event."""
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    end = len(view) if stop is None else stop
    if not 0 <= start <= end <= len(view):
        raise ValueError(f"scan range [{start}, {stop}) is outside the {len(view)} bytes")
    view = view[:end]
    out = Scan()
    o_off, o_len, o_scn, o_ts = out.offset, out.length, out.scn, out.timestamp
    o_op, o_flags, o_pid, o_sid = out.op, out.flags, out.partition_id, out.source_id
    o_pkey, o_klen, o_fp, o_hcrc, o_bcrc = (out.partition_key, out.key_length,
                                            out.fingerprint, out.header_crc, out.body_crc)
    pos = start
    try:
        while pos < end:
            h = _checked_header(view, pos, end, verify_body)
            o_off.append(pos)
            o_len.append(h.total_length)
            o_scn.append(h.scn)
            o_ts.append(h.timestamp_ns)
            o_op.append(h.op)
            o_flags.append(h.flags)
            o_pid.append(h.partition_id)
            o_sid.append(h.source_id)
            o_pkey.append(h.partition_key)
            o_klen.append(h.key_length)
            o_fp.append(h.schema_fingerprint)
            o_hcrc.append(h.header_crc)
            o_bcrc.append(h.body_crc)
            pos += h.total_length
    except EventFormatError as exc:
        # Without its traceback: the frames would pin a view of ``buf`` (an mmap'd
        # ring cannot be closed while one exists).
        out.error = exc.with_traceback(None)
    out.count = len(o_off)
    out.end = pos
    return out


def _checked_header(view: memoryview, pos: int, end: int, verify_body: bool) -> EventHeader:
    header = decode_header(view, pos)
    if verify_body:
        _check_body(view, pos, header)
    elif pos + header.total_length > end:
        raise EventFormatError("truncated event", offset=pos, reason="truncated")
    return header


def event_error(buf: Buffer, pos: int, end: int, verify_body: bool) -> EventFormatError:
    """The error ``scan`` gives for the bad event at ``pos`` (the compiled twin finds
    the event, this builds its error: one wording for both)."""
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    try:
        _checked_header(view[:end], pos, end, verify_body)
    except EventFormatError as exc:
        return exc.with_traceback(None)
    raise AssertionError(f"the twins disagree on the event at {pos}")  # a bug, not input


def data_key(buf: bytes, s: Scan, i: int) -> Key:
    """The checked key of data event ``i`` of a scan (``decode_data_key``)."""
    start, end = s.key_span(i)
    return decode_data_key(s.header(i), buf[start:end], s.offset[i])


def frame_windows(s: Scan, window: int | None = None, count: int = 0,
                  crc: int = 0) -> WindowFrames:
    """Window framing over a scan: each EOW's count and checksum of the data events
    before it, and the first torn window (an SCN change before the open window's EOW,
    once it holds a data event). ``window``/``count``/``crc`` carry an open window
    over from the previous body."""
    controls, eows, counts, crcs = array("q"), array("q"), array("q"), array("I")
    broken = -1
    scns, sids, hcrcs = s.scn, s.source_id, s.header_crc
    pack = _U32.pack
    for i in range(s.count):
        scn = scns[i]
        if scn != window:
            if window is not None and count:
                broken = i
                break
            window, count, crc = scn, 0, 0
        sid = sids[i]
        if sid >= 0:
            count += 1
            crc = zlib.crc32(pack(hcrcs[i]), crc)
            continue
        controls.append(i)
        if sid == EOW_SOURCE_ID:
            eows.append(i)
            counts.append(count)
            crcs.append(crc)
            window, count, crc = None, 0, 0
    for i in range(broken if broken >= 0 else s.count, s.count):
        if sids[i] < 0:
            controls.append(i)
    return WindowFrames(controls, eows, counts, crcs, broken, window, count, crc)


def window_checksum(s: Scan, first: int = 0, stop: int | None = None, count: int = 0,
                    crc: int = 0) -> tuple[int, int]:
    """(count, checksum) of the data events ``first..stop`` of a scan, carried on."""
    sids, hcrcs = s.source_id, s.header_crc
    pack = _U32.pack
    for i in range(first, s.count if stop is None else stop):
        if sids[i] >= 0:
            count += 1
            crc = zlib.crc32(pack(hcrcs[i]), crc)
    return count, crc


def decode_events(
    buf: bytes, s: Scan, first: int, stop: int, names: Mapping[int, str],
    value_decoder: Callable[[int, int], tuple[Callable[[bytes], Any], Any, Any]],
    make_event: Callable[..., Any], from_bootstrap: bool,
    make_lazy: Callable[..., Any] | None = None,
) -> list[Any]:
    """The data events ``first..stop`` of a scan of ``buf`` (control events are
    skipped), each as ``make_event(scn, source, op, key, value, timestamp_ns, schema,
    partition_key, from_bootstrap, from_dump)``.

    Keys are decoded and checked against the partition key (``decode_data_key``).
    ``value_decoder(source_id, fingerprint)`` gives ``(decode, schema, program)`` and is
    asked again only when the source or fingerprint changes from the previous event.
    With a check ``program`` (``databus.schemas._program``) and ``make_lazy``, a value is
    only checked (``check_value``): GOOD bytes make ``make_lazy(scn, source, op, key,
    value_bytes, decode, timestamp_ns, schema, partition_key, from_bootstrap,
    from_dump)``, BAD ones an ``EventFormatError`` (reason "bad value"), and UNSURE ones
    are decoded at once. Without, ``decode(value_bytes)`` is called once per event with
    a non-empty value (else the value is None). An unknown source id is an
    ``EventFormatError``."""
    out: list[Any] = []
    append = out.append
    last: tuple[int, int] | None = None
    decode: Callable[[bytes], Any] | None = None
    schema: Any = None
    program: Any = None
    for i in range(first, stop):
        sid = s.source_id[i]
        if sid < 0:
            continue
        offset = s.offset[i]
        source = names.get(sid)
        if source is None:
            raise EventFormatError(f"unknown source id {sid}", offset=offset,
                                   reason="unknown source")
        key = data_key(buf, s, i)
        fp = s.fingerprint[i]
        if last != (sid, fp):
            last = (sid, fp)
            decode, schema, program = value_decoder(sid, fp)
        assert decode is not None
        value_start, end = s.value_span(i)
        value: Any = None
        if end > value_start:
            raw = buf[value_start:end]
            if program is not None and make_lazy is not None:
                verdict = check_value(program, raw)
                if verdict == GOOD:
                    append(make_lazy(s.scn[i], source, _OPS[s.op[i]], key, raw, decode,
                                     s.timestamp[i], schema, s.partition_key[i],
                                     from_bootstrap, bool(s.flags[i] & FLAG_FROM_SNAPSHOT)))
                    continue
                if verdict == BAD:
                    raise bad_value(offset)
            value = decode(raw)
        append(make_event(s.scn[i], source, _OPS[s.op[i]], key, value, s.timestamp[i],
                          schema, s.partition_key[i], from_bootstrap,
                          bool(s.flags[i] & FLAG_FROM_SNAPSHOT)))
    return out


def bad_value(offset: int) -> EventFormatError:
    """The error of a value whose bytes its schema's check refused."""
    return EventFormatError("event value: its bytes do not fit its writer schema "
                            "(truncated, an index out of range, bad UTF-8 or trailing "
                            "bytes)", offset=offset, reason="bad value")


def encode_events(
    scn: int, ops: Sequence[int], source_ids: Sequence[int], keys: Sequence[Key],
    values: Sequence[bytes], fingerprints: Sequence[int], *, timestamp_ns: int = 0,
    partition_id: int = 0, from_snapshot: bool = False,
) -> list[bytes]:
    """The events of one window (header and both CRCs), one per row of the columns."""
    n = len(ops)
    if not len(source_ids) == len(keys) == len(values) == len(fingerprints) == n:
        raise ValueError("encode_events: the columns differ in length")
    return [encode_event(scn, ops[i], source_ids[i], keys[i], values[i], fingerprints[i],
                         timestamp_ns, partition_id, from_snapshot) for i in range(n)]


def encode_event(scn: int, op: int, source_id: int, key: Key, value: bytes,
                 fingerprint: int = 0, timestamp_ns: int = 0, partition_id: int = 0,
                 from_snapshot: bool = False) -> bytes:
    """One data event, as ``databus.event.encode_event`` with positional arguments."""
    if source_id < 0:
        raise EventFormatError("data events need a source id >= 0", reason="bad field")
    if op not in (1, 2):
        raise EventFormatError("data events cannot have the control opcode"
                               if op == 0 else f"unknown opcode {op}", reason="bad field")
    kind, key_bytes, partition_key = encode_key(key)
    flags = int(kind) | (FLAG_FROM_SNAPSHOT if from_snapshot else 0)
    return _pack(op, flags, scn, timestamp_ns, partition_id, source_id, partition_key,
                 fingerprint, key_bytes, bytes(value))


def key_hashes(buf: Buffer, s: Scan, first: int = 0, stop: int | None = None) -> array[int]:
    """``stable_key_hash`` of each event's key bytes (0 for control events)."""
    view = memoryview(buf)
    out = array("q")
    for i in range(first, s.count if stop is None else stop):
        if s.source_id[i] < 0:
            out.append(0)
            continue
        start = s.offset[i] + HEADER_SIZE
        out.append(stable_key_hash(bytes(view[start:start + s.key_length[i]])))
    return out


def restamp(buf: Buffer, offset: int, length: int, source_id: int) -> bytes:
    """The event at ``offset`` with its source id replaced and its header CRC redone."""
    return restamp_source_id(memoryview(buf)[offset:offset + length], source_id)




# -- the relay's read rules ------------------------------------------------------------

# What the read rules need of a header: total length, SCN, source id, partition key,
# key length (the ring's events were checked when they were written).
_READ_FIELDS = struct.Struct(">12xIq10xhq8xI")
_MAGIC = 0xDB


class CompiledFilter:
    """A ``FilterPlan`` made ready for ``select_events`` (decisions cached per id)."""

    __slots__ = ("_known", "needs_key", "plan")

    def __init__(self, plan: FilterPlan) -> None:
        self.plan = plan
        self.needs_key = plan.needs_key
        self._known: dict[int, tuple[bool, Any]] = {}

    def _decide(self, source_id: int) -> tuple[bool, Any]:
        plan = self.plan
        wanted = plan.wanted
        if (plan.resolve is None or source_id in plan.filters
                or (wanted is not None and source_id in wanted)):
            decision = (wanted is None or source_id in wanted, plan.filters.get(source_id))
        else:
            decision = plan.resolve(source_id)
        self._known[source_id] = decision
        return decision

    def passes(self, source_id: int, pkey: int, key: bytes) -> bool:
        decision = self._known.get(source_id)
        wanted, f = decision if decision is not None else self._decide(source_id)
        if not wanted or (f is not None and not f.passes(pkey, key)):
            return False
        predicate = self.plan.predicate
        return predicate is None or predicate(source_id, pkey, key)


def compile_filter(plan: FilterPlan) -> CompiledFilter:
    return CompiledFilter(plan)


def select_events(buf: Buffer, pos: int, stop: int, st: ReadState,
                  flt: CompiledFilter | None) -> int:
    """Apply the read rules (``_select``) to the events in ``buf[pos:stop]``.

    Returns where it stopped: ``stop``; the event that did not fit (``st.full``); or
    bytes that are not an event start (a first byte other than the magic, or lengths
    that do not fit before ``stop``), which the caller tells apart (padding, damage)."""
    unpack = _READ_FIELDS.unpack_from
    view = memoryview(buf)
    needs_key = flt is not None and flt.needs_key
    after, partial_scn, skip_events = st.after, st.partial_scn, st.skip_events
    max_bytes = st.max_bytes
    runs = st.runs
    run_start = run_end = -1  # the run of consecutive passing events in progress
    while pos < stop:
        if stop - pos < HEADER_SIZE or buf[pos] != _MAGIC:
            break
        total, scn, source_id, pkey, key_len = unpack(buf, pos)
        if total < HEADER_SIZE + key_len or total > stop - pos:
            break
        if scn <= after:
            pos += total
            continue
        if scn != st.win_scn:
            st.win_scn, st.win_seen = scn, 0
            st.skip = skip_events if scn == partial_scn else 0
        if source_id >= 0:
            if flt is not None:
                key = (bytes(view[pos + HEADER_SIZE:pos + HEADER_SIZE + key_len])
                       if key_len and needs_key else b"")
                if not flt.passes(source_id, pkey, key):
                    pos += total
                    continue
            if st.win_seen < st.skip:
                st.win_seen += 1
                pos += total
                continue
        elif st.win_seen < st.skip and source_id != EOW_SOURCE_ID:
            pos += total
            continue
        if st.size + total > max_bytes:
            if st.cp_size == 0:
                st.pending = st.size + total
            st.full = True
            break
        if st.first is None:
            st.first = pos
        if pos != run_end:
            if run_start >= 0:
                runs.extend((run_start, run_end))
            run_start = pos
        run_end = pos + total
        st.size += total
        pos += total
        if source_id == EOW_SOURCE_ID:
            st.windows += 1
            st.cp_scn, st.cp_offset, st.cp_size = scn, -1, st.size
        elif source_id >= 0:
            st.win_seen += 1
            st.events += 1
            st.cp_scn, st.cp_offset, st.cp_size = scn, st.win_seen, st.size
    if run_start >= 0:
        runs.extend((run_start, run_end))
    return pos


def gather(buf: Buffer, runs: array[int], limit: int) -> bytes:
    """The bytes of ``runs`` (flat start/end pairs of ``buf``), the first ``limit``."""
    view = memoryview(buf)
    parts: list[bytes | memoryview] = []
    left = limit
    for k in range(0, len(runs), 2):
        if left <= 0:
            break
        start, end = runs[k], runs[k + 1]
        if not 0 <= start <= end <= len(view):
            raise ValueError("gather: a run outside the buffer")
        end = min(end, start + left)
        parts.append(view[start:end])
        left -= end - start
    return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)




# -- the bootstrap log's binary COPY rows ---------------------------------------------

# PostgreSQL binary COPY, one log row: 7 fields, each a length and its bytes: scn int8,
# seq int4, op int2, pkey int8, key_hash int8, key bytea, event bytea.
_COPY_ROW = struct.Struct(">h iq ii ih iq iq")
_COPY_LEN = struct.Struct(">i")


def copy_rows(buf: Buffer, s: Scan, indexes: Sequence[int], scns: Sequence[int],
              seqs: Sequence[int], key_hashes: Sequence[int] | None,
              source_id: int) -> bytes:
    """The binary COPY rows (no header, no trailer) of the log table of ``source_id``
    for events ``indexes`` of a scan of ``buf``, each stored at (``scns[k]``,
    ``seqs[k]``) with its key hash (``key_hashes`` by event index; None: 0). An event
    whose source id differs is stored restamped (``restamp``)."""
    view = memoryview(buf)
    out = bytearray()
    pack, length = _COPY_ROW.pack, _COPY_LEN.pack
    for k, i in enumerate(indexes):
        offset, total = s.offset[i], s.length[i]
        key_start = offset + HEADER_SIZE
        key = view[key_start:key_start + s.key_length[i]]
        event = (view[offset:offset + total] if s.source_id[i] == source_id
                 else restamp(buf, offset, total, source_id))
        out += pack(7, 8, scns[k], 4, seqs[k], 2, s.op[i], 8, s.partition_key[i], 8,
                    key_hashes[i] if key_hashes is not None else 0)
        out += length(len(key))
        out += key
        out += length(total)
        out += event
    return bytes(out)




def group_rows(s: Scan, firsts: Sequence[int], stops: Sequence[int], scns: Sequence[int],
               owner: Mapping[int, int]
               ) -> tuple[dict[int, tuple[array[int], array[int], array[int]]],
                          list[tuple[int, int, int]]]:
    """The data events of windows ``firsts[k]..stops[k]`` (stored at ``scns[k]``)
    grouped by ``owner[source id]``: per owner, (event indexes, SCNs, seqs, a seq
    counting a window's data events in order); and per window with a data event,
    (k, its data events, their bytes). A source id without an owner is a KeyError."""
    groups: dict[int, tuple[array[int], array[int], array[int]]] = {}
    windows: list[tuple[int, int, int]] = []
    sids, lengths = s.source_id, s.length
    for k in range(len(firsts)):
        scn = scns[k]
        seq = size = 0
        for i in range(firsts[k], stops[k]):
            sid = sids[i]
            if sid < 0:
                continue
            target = owner[sid]
            group = groups.get(target)
            if group is None:
                group = groups[target] = (array("q"), array("q"), array("q"))
            group[0].append(i)
            group[1].append(scn)
            group[2].append(seq)
            seq += 1
            size += lengths[i]
        if seq:
            windows.append((k, seq, size))
    return groups, windows




# -- a response's whole windows: their EOW checks and their log rows -------------------

# The reason of a window whose EOW count or checksum is not its events' (as the client's).
WINDOW_CHECK = "window checksum"


def check_windows(buf: Buffer, s: Scan, frames: WindowFrames) -> None:
    """Each EOW of ``frames`` (a framing of a scan of ``buf`` begun at a window start)
    must carry the count and checksum of its window's data events: an
    ``EventFormatError`` for the first that does not ("bad length": not an 8-byte
    payload; "window checksum": other numbers)."""
    for k in range(len(frames.eows)):
        _check_eow(buf, s, frames, k)


def _check_eow(buf: Buffer, s: Scan, frames: WindowFrames, k: int) -> None:
    eow = frames.eows[k]
    offset = s.offset[eow]
    if s.length[eow] != HEADER_SIZE + _EOW_VALUE.size or s.key_length[eow]:
        raise EventFormatError("EOW payload is not 8 bytes", offset=offset,
                               reason="bad length")
    count, checksum = _EOW_VALUE.unpack_from(buf, offset + HEADER_SIZE)
    if count != frames.counts[k] or checksum != frames.crcs[k]:
        raise EventFormatError(
            f"window {s.scn[eow]}: {frames.counts[k]} events and checksum "
            f"{frames.crcs[k]:08x}, EOW says {count} and {checksum:08x}",
            offset=offset, reason=WINDOW_CHECK)


# PostgreSQL binary COPY: signature, flags, header extension length; rows; trailer.
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
COPY_TRAILER = b"\xff\xff"
# One dbus_windows row: 4 fields, scn int8, timestamp_ns int8, events int4, bytes int8.
_COPY_WINDOW = struct.Struct(">h iq iq ii iq")


def log_copy(buf: Buffer, s: Scan, frames: WindowFrames, owner: Mapping[int, int],
             key_hash: bool = True) -> LogCopy:
    """The log rows of the whole windows of a scan of ``buf`` (``frames.eows``: each
    window runs from the previous EOW, or the scan's start, to its EOW), as the binary
    COPY streams of each store source's log table and of ``dbus_windows``.

    A data event is stored in the log of ``owner[its source id]`` (none: KeyError) at
    its window's SCN and its seq (a count of the window's data events, in order), with
    ``stable_key_hash`` of its key (``key_hash`` false: 0); restamped to the store's
    source id when that differs (``restamp``). Control events are not stored; a window
    without a data event has no ``dbus_windows`` row. The rows are those ``copy_rows``
    and ``group_rows`` give, the windows' what ``copy_windows`` writes."""
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    eows = frames.eows
    last = -1
    for eow in eows:
        if not last < eow < s.count:
            raise ValueError("log_copy: the EOWs are not of this scan, in order")
        last = eow
    sids, offsets, lengths, klens = s.source_id, s.offset, s.length, s.key_length
    if len(eows) and offsets[last] + lengths[last] > len(view):
        raise ValueError("log_copy: the scan is not of this buffer")
    logs: dict[int, bytearray] = {}
    spans: dict[int, tuple[int, int]] = {}
    windows = bytearray(COPY_HEADER)
    pack, length = _COPY_ROW.pack, _COPY_LEN.pack
    stored = events = 0
    first_scn = last_scn = -1
    unordered: tuple[int, int] | None = None
    first = 0
    for eow in eows:
        scn = s.scn[eow]
        seq = size = 0
        for i in range(first, eow):
            sid = sids[i]
            if sid < 0:
                continue
            offset, total = offsets[i], lengths[i]
            if offset < 0 or offset + total > len(view):
                raise ValueError("log_copy: the scan is not of this buffer")
            target = owner[sid]
            if not 0 <= target <= 0x7FFF:
                raise ValueError("log_copy: a store source id outside 0..32767")
            out = logs.get(target)
            if out is None:
                out = logs[target] = bytearray(COPY_HEADER)
                spans[target] = (scn, scn)
            else:
                spans[target] = (spans[target][0], scn)
            key = view[offset + HEADER_SIZE:offset + HEADER_SIZE + klens[i]]
            event = (view[offset:offset + total] if sid == target
                     else restamp(view, offset, total, target))
            out += pack(7, 8, scn, 4, seq, 2, s.op[i], 8, s.partition_key[i], 8,
                        stable_key_hash(bytes(key)) if key_hash else 0)
            out += length(len(key))
            out += key
            out += length(total)
            out += event
            seq += 1
            size += total
        if seq:
            windows += _COPY_WINDOW.pack(4, 8, scn, 8, s.timestamp[eow], 4, seq, 8, size)
            if stored and scn <= last_scn and unordered is None:
                unordered = (scn, last_scn)
            if not stored:
                first_scn = scn
            last_scn = scn
            stored += 1
            events += seq
        first = eow + 1
    windows += COPY_TRAILER
    return LogCopy({target: bytes(out + COPY_TRAILER) for target, out in logs.items()},
                   spans, bytes(windows), stored, events, first_scn, last_scn, unordered)



# -- flat Avro records ----------------------------------------------------------------

# Field codes of ``encode_flat_record``: the Avro type of a field, plus NULLABLE for a
# ["null", type] union (branch 0 null, branch 1 the type).
AVRO_LONG, AVRO_INT, AVRO_DOUBLE, AVRO_BOOLEAN, AVRO_STRING, AVRO_BYTES = 1, 2, 3, 4, 5, 6
NULLABLE = 16
_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_LE_DOUBLE = struct.Struct("<d")


def _zigzag(value: int, out: bytearray) -> None:
    z = (value << 1) ^ (value >> 63)
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


def encode_flat_record(values: Sequence[Any], codes: Sequence[int]) -> bytes | None:
    """The Avro binary of a record of primitive fields (``codes``), as fastavro writes
    it; None when a value is not exactly of its field's Python type (an int for a
    double, a bool for a long, a long out of range...): the caller then lets fastavro
    decide, so both give the same bytes or the same error."""
    if len(values) != len(codes):
        return None
    out = bytearray()
    for value, code in zip(values, codes, strict=True):
        kind = code & ~NULLABLE
        if value is None:
            if not code & NULLABLE:
                return None
            out.append(0)
            continue
        if code & NULLABLE:
            out.append(2)  # branch 1, zigzag
        t = type(value)
        if kind in (AVRO_LONG, AVRO_INT):
            lo, hi = _INT64 if kind == AVRO_LONG else _INT32
            if t is not int or not lo <= value <= hi:
                return None
            _zigzag(value, out)
        elif kind == AVRO_DOUBLE:
            if t is not float:
                return None
            out += _LE_DOUBLE.pack(value)
        elif kind == AVRO_BOOLEAN:
            if t is not bool:
                return None
            out.append(1 if value else 0)
        elif kind in (AVRO_STRING, AVRO_BYTES):
            if kind == AVRO_STRING:
                if t is not str:
                    return None
                try:
                    data = value.encode("utf-8")
                except UnicodeEncodeError:
                    return None
            elif t is bytes:
                data = value
            else:
                return None
            _zigzag(len(data), out)
            out += data
        else:
            return None
    return bytes(out)


__all__ = [
    "COPY_HEADER",
    "COPY_TRAILER",
    "IMPLEMENTATION",
    "WINDOW_CHECK",
    "CompiledFilter",
    "EventBase",
    "bad_value",
    "check_value",
    "check_windows",
    "compile_filter",
    "copy_rows",
    "data_key",
    "decode_events",
    "decode_relay_body",
    "encode_event",
    "encode_events",
    "encode_flat_record",
    "eow_order",
    "event_error",
    "frame_windows",
    "gather",
    "group_rows",
    "key_hashes",
    "log_copy",
    "restamp",
    "scan",
    "select_events",
    "set_undecoded",
    "stable_key_hash",
    "window_checksum",
]
