"""The batch APIs (databus.batch): both twins, the same results and the same errors.

``core`` runs each test against the pure-Python twin and the compiled one; in CI (the
``CI`` variable set) a missing compiled module fails instead of skipping, since the
build is part of ``make test``. The differential tests feed both twins the same valid,
mutated and hostile bodies and compare every field, error offset, reason and message.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from array import array
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from databus import batch
from databus._hashing import stable_key_hash
from databus.batch import FIELDS, Scan
from databus.errors import EventFormatError
from databus.event import (
    EOW_SOURCE_ID,
    HEADER_SIZE,
    WindowChecksum,
    decode_data_key,
    encode_control,
    encode_eow,
    encode_event,
    iter_events,
    restamp_source_id,
)
from databus.event import Op as EventOp
from tests.event_forging import forge, reseal

pytestmark = pytest.mark.twin("databus.batch")


def _native_or_skip() -> ModuleType:
    try:
        return batch.twin("native")
    except ImportError:
        if os.environ.get("CI"):
            raise  # CI builds the module: its absence is a failure
        pytest.skip("the compiled batch module is not built")


@pytest.fixture(params=["python", "native"])
def core(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "native":
        return _native_or_skip()
    return batch.twin("python")


@pytest.fixture
def both() -> tuple[ModuleType, ModuleType]:
    return batch.twin("python"), _native_or_skip()


def _window(scn: int, rows: list[tuple[object, bytes]], source_id: int = 1) -> list[bytes]:
    events = [encode_event(scn=scn, source_id=source_id, op=EventOp.UPSERT, key=k,  # type: ignore[arg-type]
                           value=v, timestamp_ns=scn * 10, schema_fingerprint=0xF00D)
              for k, v in rows]
    check = WindowChecksum()
    for e in events:
        check.add_event(e)
    return [*events, encode_eow(scn=scn, event_count=check.count, checksum=check.crc)]


KEYS: list[object] = [1, -5, 2**63 - 1, -(2**63), "abc", "", "é✓", b"", b"\x00\xff",
                      (1, "a"), ()]


def _body() -> bytes:
    out: list[bytes] = []
    for scn in range(10, 14):
        out += _window(scn, [(k, b"v" * i) for i, k in enumerate(KEYS)])
    return b"".join(out)


def _as_tuple(s: Scan) -> tuple[Any, ...]:
    err = s.error
    return (s.count, s.end, *(list(getattr(s, name)) for name, _ in FIELDS),
            None if err is None else (err.offset, err.reason, str(err)))


def test_the_active_core_is_the_native_one_unless_forced() -> None:
    forced = os.environ.get("DATABUS_PURE_PYTHON", "") not in ("", "0")
    if forced:
        assert batch.IMPLEMENTATION == "python"
    elif batch.native_available():
        assert batch.IMPLEMENTATION == "native" and batch.WHY_PURE is None


def test_scan_gives_what_iter_events_gives(core: ModuleType) -> None:
    body = _body()
    s = core.scan(body).check()
    headers = list(iter_events(body))
    assert s.count == len(headers) and s.end == len(body) and s.error is None
    for i, (offset, header) in enumerate(headers):
        assert s.offset[i] == offset
        assert s.header(i) == header


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_scan_takes_any_buffer_and_a_range(core: ModuleType, kind: type) -> None:
    body = _body()
    events = list(iter_events(body))
    second, fourth = events[1][0], events[3][0]
    s = core.scan(kind(body), second, fourth).check()
    assert list(s.offset) == [second, events[2][0]] and s.end == fourth
    with pytest.raises(ValueError):
        core.scan(body, 10, 5)
    with pytest.raises(ValueError):
        core.scan(body, 0, len(body) + 1)


def test_scan_of_an_mmap(core: ModuleType, tmp_path: Any) -> None:
    import mmap

    body = _body()
    path = tmp_path / "ring"
    path.write_bytes(body)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        s = core.scan(mm)
        assert s.check().count == len(list(iter_events(body)))
        mm[100] ^= 0xFF
        damaged = core.scan(memoryview(mm)[:])
        assert damaged.error is not None  # and it pins no view: the mmap closes below
        del s


def test_empty_body(core: ModuleType) -> None:
    s = core.scan(b"")
    assert (s.count, s.end, s.error) == (0, 0, None)
    frames = core.frame_windows(s)
    assert list(frames.eows) == [] and frames.broken == -1 and frames.window is None


# -- the same errors ---------------------------------------------------------------------


def test_every_truncation_gives_the_same_error(both: tuple[ModuleType, ModuleType]) -> None:
    py, nat = both
    body = _body()[:900]
    for cut in range(len(body) + 1):
        for verify in (True, False):
            assert _as_tuple(py.scan(body[:cut], verify_body=verify)) == \
                _as_tuple(nat.scan(body[:cut], verify_body=verify)), cut


def test_every_bit_flip_gives_the_same_error(both: tuple[ModuleType, ModuleType]) -> None:
    py, nat = both
    body = bytearray(_body()[:700])
    for i in range(len(body)):
        for bit in (0x01, 0x80):
            body[i] ^= bit
            a, b = py.scan(body), nat.scan(body)
            assert a.error is not None  # every byte is covered by a CRC or a check
            assert _as_tuple(a) == _as_tuple(b), i
            body[i] ^= bit


def _one() -> bytes:
    return encode_event(scn=7, source_id=1, op=EventOp.UPSERT, key="k", value=b"value")


HOSTILE: dict[str, bytes] = {
    "length past the end": forge(_one(), total_length=10_000),
    "a claimed 2 GiB length": forge(_one(), total_length=2**31),
    "the largest u32 length": forge(_one(), total_length=2**32 - 1),
    "key longer than the event": forge(_one(), key_length=2**32 - 1),
    "zero-length key": forge(_one(), key=b""),
    "total shorter than the header": forge(_one(), total_length=10),
    "slice ending mid-header": _one()[:30],
    "a body that is not a multiple of anything": b"\xdb\x01\x00",
    "zeros": bytes(200),
    "control opcode on a data source": forge(_one(), op=0),
    "unknown flags": forge(_one(), flags=0x80),
    "unknown opcode": forge(_one(), op=9),
    "unknown version": reseal(bytes([0xDB, 2]) + _one()[2:]),
    "bad magic": reseal(bytes([0xDC]) + _one()[1:]),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_input_gives_the_same_error(both: tuple[ModuleType, ModuleType],
                                            name: str) -> None:
    py, nat = both
    body = _one() + HOSTILE[name]
    for verify in (True, False):
        a, b = py.scan(body, verify_body=verify), nat.scan(body, verify_body=verify)
        assert _as_tuple(a) == _as_tuple(b)
        if name != "zero-length key":
            assert a.error is not None and a.error.offset == len(_one()) and a.count == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_differential_random_and_mutated_bodies(data: st.DataObject) -> None:
    py, nat = batch.twin("python"), _native_or_skip()
    base = data.draw(st.sampled_from([_body()[:400], _body()[:1500], b""]))
    body = bytearray(base)
    for _ in range(data.draw(st.integers(0, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "garbage"]))
        if action == "flip" and body:
            i = data.draw(st.integers(0, len(body) - 1))
            body[i] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "cut":
            del body[data.draw(st.integers(0, len(body))):]
        elif action == "insert":
            i = data.draw(st.integers(0, len(body)))
            body[i:i] = data.draw(st.binary(max_size=60))
        else:
            body += data.draw(st.binary(max_size=120))
    if data.draw(st.booleans()) and len(body) > HEADER_SIZE:
        body[:] = reseal(body)  # CRCs that check out over whatever it holds
    verify = data.draw(st.booleans())
    assert _as_tuple(py.scan(bytes(body), verify_body=verify)) == \
        _as_tuple(nat.scan(bytes(body), verify_body=verify))


# -- window framing ----------------------------------------------------------------------


def test_frame_windows_counts_every_window(core: ModuleType) -> None:
    body = _body()
    frames = core.frame_windows(core.scan(body))
    expected = [(i, (count, checksum)) for i, (off, h) in enumerate(iter_events(body))
                if h.source_id == EOW_SOURCE_ID
                for count, checksum in [struct.unpack_from(">II", body, off + HEADER_SIZE)]]
    assert list(frames.eows) == [i for i, _ in expected]
    assert list(zip(frames.counts, frames.crcs, strict=True)) == [c for _, c in expected]
    assert frames.broken == -1 and frames.window is None


def test_frame_windows_carries_an_open_window(core: ModuleType) -> None:
    events = _window(20, [(1, b"a"), (2, b"b"), (3, b"c")])
    first = core.frame_windows(core.scan(b"".join(events[:2])))
    assert (first.window, first.count) == (20, 2) and list(first.eows) == []
    rest = core.frame_windows(core.scan(b"".join(events[2:])), first.window, first.count,
                              first.crc)
    count, checksum = struct.unpack_from(">II", events[-1], HEADER_SIZE)
    assert (list(rest.counts), list(rest.crcs)) == ([count], [checksum])
    assert core.window_checksum(core.scan(b"".join(events))) == (count, checksum)


def test_frame_windows_finds_a_torn_window(core: ModuleType) -> None:
    a, b = _window(30, [(1, b"x"), (2, b"y")]), _window(31, [(3, b"z")])
    body = b"".join([a[0], *b])  # window 30 never ended
    frames = core.frame_windows(core.scan(body))
    assert frames.broken == 1
    # A control event alone does not open a window that can tear.
    marker = encode_control(scn=29, source_id=-5)
    assert core.frame_windows(core.scan(marker + b"".join(b))).broken == -1


# -- keys, hashes, decoding ------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(key=st.binary(max_size=600))
def test_stable_key_hash_is_blake2b(key: bytes) -> None:
    nat = _native_or_skip()
    assert nat.stable_key_hash(key) == stable_key_hash(key)
    digest = hashlib.blake2b(key, digest_size=8).digest()
    assert nat.stable_key_hash(key) == int.from_bytes(digest, "big") & ((1 << 63) - 1)


def test_key_hashes(core: ModuleType) -> None:
    body = _body()
    s = core.scan(body)
    hashes = core.key_hashes(body, s)
    for i in range(s.count):
        start, end = s.key_span(i)
        want = stable_key_hash(body[start:end]) if s.source_id[i] >= 0 else 0
        assert hashes[i] == want


def _decoder(sid: int, fp: int) -> tuple[Any, Any, Any]:
    return (lambda data: ("decoded", sid, fp, data)), ("schema", fp), None


def test_decode_events_gives_checked_keys_and_values(core: ModuleType) -> None:
    body = _body()
    s = core.scan(body)
    events = core.decode_events(body, s, 0, s.count, {1: "db.t"}, _decoder, lambda *a: a,
                                False)
    data = [(off, h) for off, h in iter_events(body) if h.source_id >= 0]
    assert len(events) == len(data)
    for (off, h), ev in zip(data, events, strict=True):
        key = decode_data_key(h, body[off + HEADER_SIZE:off + HEADER_SIZE + h.key_length])
        value_bytes = body[off + HEADER_SIZE + h.key_length:off + h.total_length]
        value = ("decoded", 1, 0xF00D, value_bytes) if value_bytes else None
        assert ev == (h.scn, "db.t", h.op, key, value, h.timestamp_ns, ("schema", 0xF00D),
                      h.partition_key, False, False)
        assert type(ev[3]) is type(key)


@pytest.mark.parametrize("change", [
    {"key": b"\xff\xfe", "flags": 2},  # a string key that is not UTF-8
    {"key": b"[1, 2]", "flags": 3},  # composite JSON, not canonical
    {"key": b"1234567", "flags": 1},  # an int key of 7 bytes
    {"partition_key": 12345},  # a partition key that is not the key's
    {"source_id": 9},  # a source nobody named
])
def test_decode_events_rejects_forged_keys_alike(
        both: tuple[ModuleType, ModuleType], change: dict[str, Any]) -> None:
    event = encode_event(scn=3, source_id=1, op=EventOp.DELETE, key="abc", value=b"")
    body = _window(3, [(5, b"ok")])[0] + forge(event, **change)
    errors = []
    for twin in both:
        s = twin.scan(body).check()
        with pytest.raises(EventFormatError) as info:
            twin.decode_events(body, s, 0, s.count, {1: "db.t"}, _decoder, lambda *a: a,
                               False)
        errors.append((info.value.offset, info.value.reason, str(info.value)))
    assert errors[0] == errors[1] and errors[0][0] > 0


# -- encoding ------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_encode_event_is_byte_identical(core: ModuleType, key: object) -> None:
    want = encode_event(scn=-4, source_id=300, op=EventOp.DELETE, key=key, value=b"v" * 70,  # type: ignore[arg-type]
                        timestamp_ns=2**62, partition_id=-3, schema_fingerprint=2**64 - 1,
                        from_snapshot=True)
    assert core.encode_event(-4, 2, 300, key, b"v" * 70, 2**64 - 1, 2**62, -3, True) == want
    batch_out = core.encode_events(9, [1, 2], [1, 1], [key, key], [b"a", memoryview(b"b")],
                                   [0, 1], timestamp_ns=5)
    assert batch_out == [
        encode_event(scn=9, source_id=1, op=EventOp.UPSERT, key=key, value=b"a",  # type: ignore[arg-type]
                     timestamp_ns=5),
        encode_event(scn=9, source_id=1, op=EventOp.DELETE, key=key, value=b"b",  # type: ignore[arg-type]
                     timestamp_ns=5, schema_fingerprint=1),
    ]


@pytest.mark.parametrize("args", [
    (1, 1, 1, True, b""),  # a bool key
    (1, 1, 1, "\ud800", b""),  # a lone surrogate
    (1, 1, 1, 2**64, b""),  # an int key beyond int64
    (1, 1, 1, 1.5, b""),  # an unsupported key type
    (2**63, 1, 1, 1, b""),  # an SCN beyond int64
    (1, 1, 40_000, 1, b""),  # a source id beyond int16
    (1, 1, -1, 1, b""),  # a negative source id
    (1, 0, 1, 1, b""),  # the control opcode
])
def test_encode_event_errors_alike(both: tuple[ModuleType, ModuleType],
                                   args: tuple[Any, ...]) -> None:
    messages = []
    for twin in both:
        with pytest.raises(EventFormatError) as info:
            twin.encode_event(*args)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    with pytest.raises(ValueError):
        both[1].encode_events(1, [1], [1, 2], [1], [b""], [0])


def test_restamp_is_restamp_source_id(core: ModuleType) -> None:
    body = _body()
    s = core.scan(body)
    for i in range(s.count):
        event = body[s.offset[i]:s.offset[i] + s.length[i]]
        assert core.restamp(body, s.offset[i], s.length[i], 77) == \
            restamp_source_id(event, 77)
    assert zlib.crc32(b"") == 0


# -- the relay's read rules (select_events, gather) -------------------------------------


def _ring_body() -> bytes:
    """Windows 1..40 of three sources with int, string and bytes keys (a dump marker in
    some), as an event buffer's ring holds them."""
    from databus.event import encode_dump_marker

    out: list[bytes] = []
    for scn in range(1, 41):
        rows = [(scn * 7 + j - 60, b"x" * j) for j in range(scn % 4)]
        events = []
        for j, (k, v) in enumerate(rows):
            key: object = k if j % 3 == 0 else (f"k{k}" if j % 3 == 1 else str(k).encode())
            events.append(encode_event(scn=scn, source_id=j % 3, op=EventOp.UPSERT,
                                       key=key, value=v))  # type: ignore[arg-type]
        if scn % 9 == 0:
            events.insert(1, encode_dump_marker(scn=scn, kind="start", source="s", dump_id="d"))
        check = WindowChecksum()
        for e in events:
            if e[34:36] != b"\xff\xfa":
                check.add_event(e)
        events.append(encode_eow(scn=scn, event_count=check.count, checksum=check.crc))
        out += events
    return b"".join(out)


def _plans() -> list[Any]:
    from databus.batch import FilterPlan
    from databus.filters import BucketSet, HashFilter, IntervalFilter, ModFilter, RangeFilter

    return [
        None,
        FilterPlan(),
        FilterPlan(wanted=frozenset({1})),
        FilterPlan(filters={0: ModFilter(3, BucketSet.of([0, 2]))}),
        FilterPlan(wanted=frozenset({0, 2}), filters={2: HashFilter(4, BucketSet.of([1]))},
                   needs_key=True),
        FilterPlan(filters={0: RangeFilter(50, BucketSet.of([(0, 2)]))}),
        FilterPlan(filters={0: IntervalFilter(-10, 2**63)}),
        FilterPlan(filters={1: IntervalFilter(-(2**63), 200)}),
        FilterPlan(resolve=lambda sid: (sid != 2, None)),
        FilterPlan(predicate=lambda sid, pkey, key: (pkey + len(key)) % 2 == 0,
                   needs_key=True),
    ]


def _select(twin: ModuleType, body: bytes, plan: Any, after: int, partial: int | None,
            skip: int, max_bytes: int, cut: int) -> tuple[Any, ...]:
    from databus.batch import ReadState

    st = ReadState(after, max_bytes, partial, skip, cp_scn=after, cp_offset=-1)
    flt = None if plan is None else twin.compile_filter(plan)
    # Two runs, as a ring that wrapped: the first stops at an event boundary.
    end1 = twin.select_events(body, 0, cut, st, flt)
    end2 = twin.select_events(body, end1, len(body), st, flt) if not st.full else end1
    data = twin.gather(body, st.runs, st.cp_size)
    return (end1, end2, st.size, st.events, st.windows, st.cp_scn, st.cp_offset, st.cp_size,
            st.pending, st.full, st.first, st.win_scn, st.win_seen, st.skip, data)


@settings(max_examples=200, deadline=None)
@given(plan=st.sampled_from(range(len(_plans()))), after=st.integers(-1, 41),
       partial=st.one_of(st.none(), st.integers(1, 40)), skip=st.integers(0, 3),
       max_bytes=st.sampled_from([1, 60, 300, 2000, 1 << 20]), cut_at=st.integers(0, 200))
def test_select_events_twins_agree(plan: int, after: int, partial: int | None, skip: int,
                                   max_bytes: int, cut_at: int) -> None:
    py, nat = batch.twin("python"), _native_or_skip()
    body = _ring_body()
    offsets = [*py.scan(body).check().offset, len(body)]
    cut = offsets[min(cut_at, len(offsets) - 1)]
    assert _select(py, body, _plans()[plan], after, partial, skip, max_bytes, cut) == \
        _select(nat, body, _plans()[plan], after, partial, skip, max_bytes, cut)


@pytest.mark.parametrize("plan", range(len(_plans())))
def test_select_events_serves_what_the_filters_pass(core: ModuleType, plan: int) -> None:
    body = _ring_body()
    chosen = _plans()[plan]
    got = _select(core, body, chosen, 0, None, 0, 1 << 30, len(body))
    data = got[-1]
    served = [(h.source_id, h.partition_key, data[o + HEADER_SIZE:o + HEADER_SIZE
                                                   + h.key_length])
              for o, h in iter_events(data) if h.source_id >= 0]
    expected = []
    for o, h in iter_events(body):
        if h.source_id < 0:
            continue
        key = body[o + HEADER_SIZE:o + HEADER_SIZE + h.key_length]
        if chosen is None or batch.twin("python").compile_filter(chosen).passes(
                h.source_id, h.partition_key, key if chosen.needs_key else b""):
            expected.append((h.source_id, h.partition_key, key))
    assert served == expected
    eows = [h for _, h in iter_events(data) if h.source_id == EOW_SOURCE_ID]
    assert len(eows) == 40  # EOWs always pass


def test_select_events_stops_at_bytes_that_are_not_an_event(core: ModuleType) -> None:
    from databus.batch import ReadState

    body = _ring_body()
    s = core.scan(body)
    first = s.offset[3]
    damaged = body[:first] + b"\x00" * 20 + body[first + 20:]
    st = ReadState(0, 1 << 20)
    assert core.select_events(damaged, 0, len(damaged), st, None) == first
    liar = body[:first] + forge(body[first:first + s.length[3]], total_length=10**6)
    st = ReadState(0, 1 << 20)
    assert core.select_events(liar + body[first + s.length[3]:], 0, len(liar), st,
                              None) == first
    with pytest.raises(ValueError):
        core.gather(body, __import__("array").array("q", [0, len(body) + 1]), 10)


# -- the bootstrap log's COPY rows ---------------------------------------------------------


@pytest.mark.parametrize("own", [1, 42])
def test_copy_rows_is_the_producers_copy_encoding(both: tuple[ModuleType, ModuleType],
                                                  own: int) -> None:
    from databus.bootstrap import stored_event
    from databus.bootstrap._postgres import _COPY_HEADER, _COPY_TRAILER, encode_copy

    body = _body()
    py, nat = both
    s = py.scan(body)
    data = [i for i in range(s.count) if s.source_id[i] >= 0][:20]
    scns = [1000 + k for k in range(len(data))]
    seqs = [k % 3 for k in range(len(data))]
    hashes = py.key_hashes(body, s)
    got = [twin.copy_rows(body, s, data, scns, seqs, hashes, own) for twin in both]
    assert got[0] == got[1]
    expected_rows = [(scns[k], seqs[k], stored_event(
        "s", restamp_source_id(body[s.offset[i]:s.offset[i] + s.length[i]], own)))
        for k, i in enumerate(data)]
    stream = encode_copy(expected_rows).getvalue()
    assert _COPY_HEADER + got[0] + _COPY_TRAILER == stream
    assert nat.copy_rows(body, s, [], [], [], None, own) == b""
    with pytest.raises(ValueError):
        nat.copy_rows(body, s, [s.count], [1], [0], None, own)


def test_group_rows_twins_agree(both: tuple[ModuleType, ModuleType]) -> None:
    body = _ring_body()
    py, nat = both
    s = py.scan(body)
    frames = py.frame_windows(s)
    firsts = [0, *[e + 1 for e in frames.eows[:-1]]]
    stops = list(frames.eows)
    scns = [s.scn[e] for e in stops]
    owner = {0: 10, 1: 11, 2: 10}
    a, b = (twin.group_rows(s, firsts, stops, scns, owner) for twin in both)
    assert {k: tuple(map(list, v)) for k, v in a[0].items()} == \
        {k: tuple(map(list, v)) for k, v in b[0].items()}
    assert a[1] == b[1] and sum(c for _, c, _ in a[1]) == sum(
        1 for i in range(s.count) if s.source_id[i] >= 0)
    with pytest.raises(KeyError):
        nat.group_rows(s, firsts, stops, scns, {0: 1})



# -- a response's whole windows: EOW checks and the log's COPY streams -------------------


def _log_copy_reference(body: bytes, owner: dict[int, int], key_hash: bool
                        ) -> tuple[dict[int, bytes], bytes, int]:
    """What the producer wrote before ``log_copy``: ``group_rows`` + ``copy_rows`` per
    store source, and the ``dbus_windows`` rows as ``copy_windows`` encodes them."""
    from databus.bootstrap._postgres import _COPY_HEADER, _COPY_TRAILER, _COPY_WINDOW

    py = batch.twin("python")
    s = py.scan(body).check()
    frames = py.frame_windows(s)
    firsts = [0, *[e + 1 for e in frames.eows[:-1]]]
    stops = list(frames.eows)
    scns = [s.scn[e] for e in stops]
    groups, counted = py.group_rows(s, firsts, stops, scns, owner)
    hashes = py.key_hashes(body, s) if key_hash else None
    logs = {target: _COPY_HEADER + py.copy_rows(body, s, *columns, hashes, target)
            + _COPY_TRAILER for target, columns in groups.items()}
    windows = _COPY_HEADER + b"".join(
        _COPY_WINDOW.pack(4, 8, scns[k], 8, s.timestamp[stops[k]], 4, count, 8, size)
        for k, count, size in counted) + _COPY_TRAILER
    return logs, windows, len(counted)


def _log_copy_of(core: ModuleType, body: bytes, owner: dict[int, int],
                 key_hash: bool = True, verify: bool = True) -> Any:
    """The producer's path over one body: scan, framing, EOW checks, COPY streams;
    the result or the error (type, offset, reason, message) it ends with."""
    try:
        s = core.scan(body).check()
        frames = core.frame_windows(s)
        if frames.broken >= 0:
            return ("broken", frames.broken)
        if verify:
            core.check_windows(body, s, frames)
        return core.log_copy(body, s, frames, owner, key_hash)
    except EventFormatError as exc:
        return (type(exc), exc.offset, exc.reason, str(exc))
    except (KeyError, ValueError) as exc:
        return (type(exc), str(exc))


@pytest.mark.parametrize("key_hash", [True, False])
@pytest.mark.parametrize("owner", [{0: 10, 1: 11, 2: 10}, {0: 0, 1: 1, 2: 2}])
@pytest.mark.parametrize("make", [_ring_body, _body])
def test_log_copy_is_what_group_rows_and_copy_rows_give(
        both: tuple[ModuleType, ModuleType], key_hash: bool, owner: dict[int, int],
        make: Any) -> None:
    body = make()  # three sources, markers; every kind of key (empty ones too)
    a, b = (_log_copy_of(twin, body, owner, key_hash) for twin in both)
    assert a == b
    logs, windows, stored = _log_copy_reference(body, owner, key_hash)
    assert a.logs == logs and a.windows == windows and a.stored == stored
    s = batch.twin("python").scan(body)
    data = [i for i in range(s.count) if s.source_id[i] >= 0]
    assert a.events == len(data)
    assert a.spans == {t: (min(s.scn[i] for i in data if owner[s.source_id[i]] == t),
                           max(s.scn[i] for i in data if owner[s.source_id[i]] == t))
                       for t in {owner[s.source_id[i]] for i in data}}
    assert (a.first_scn, a.last_scn, a.unordered) == (s.scn[data[0]], s.scn[data[-1]], None)


def test_log_copy_of_nothing_and_of_marker_windows(core: ModuleType) -> None:
    empty = _log_copy_of(core, b"", {})
    assert (empty.logs, empty.stored, empty.events, empty.first_scn) == ({}, 0, 0, -1)
    assert empty.windows == batch.twin("python").COPY_HEADER + b"\xff\xff"
    markers = b"".join([encode_eow(scn=5, event_count=0, checksum=0),
                        encode_control(scn=6, source_id=-5),
                        encode_eow(scn=6, event_count=0, checksum=0)])
    out = _log_copy_of(core, markers, {})
    assert (out.logs, out.stored, out.events, out.unordered) == ({}, 0, 0, None)


def test_log_copy_says_where_scns_go_back(both: tuple[ModuleType, ModuleType]) -> None:
    body = b"".join(_window(9, [(1, b"a")]) + _window(7, [(2, b"b")])
                    + _window(8, [(3, b"c")]))
    a, b = (_log_copy_of(twin, body, {1: 1}) for twin in both)
    assert a == b and a.unordered == (7, 9) and (a.first_scn, a.last_scn) == (9, 8)


def test_log_copy_refuses_alike(both: tuple[ModuleType, ModuleType]) -> None:
    body = _ring_body()
    py = both[0]
    s = py.scan(body)
    frames = py.frame_windows(s)
    for owner in ({0: 10, 1: 11}, {0: 1, 1: 2, 2: 40_000}):
        a, b = (_log_copy_of(twin, body, owner) for twin in both)
        assert a == b and a[0] in (KeyError, ValueError), a
    backwards = py.frame_windows(s)
    backwards.eows = array("q", reversed(frames.eows))
    for twin in both:
        with pytest.raises(ValueError, match="in order"):
            twin.log_copy(body, s, backwards, {0: 1, 1: 1, 2: 1})
        with pytest.raises(ValueError, match="not of this buffer"):
            twin.log_copy(body[:len(body) // 2], s, frames, {0: 1, 1: 1, 2: 1})


def _forged_windows() -> dict[str, bytes]:
    w1, w2 = _window(1, [(1, b"a"), (2, b"b")]), _window(2, [(3, b"c"), (4, b"d")])
    eow = w2[-1]
    count, crc = struct.unpack(">II", eow[HEADER_SIZE:])
    return {
        "an event missing": b"".join(w1 + w2[1:]),
        "events reordered": b"".join([*w1, w2[1], w2[0], w2[2]]),
        "EOW count off by one": b"".join(w1 + w2[:2] + [forge(eow, value=struct.pack(
            ">II", count + 1, crc))]),
        "EOW checksum forged": b"".join(w1 + w2[:2] + [forge(eow, value=struct.pack(
            ">II", count, crc ^ 1))]),
        "EOW payload of 9 bytes": b"".join(w1 + w2[:2] + [forge(eow, value=bytes(9))]),
        "EOW with a key": b"".join(w1 + w2[:2] + [forge(eow, key=b"k")]),
        "an event of another window inside": b"".join(w1[:1] + w2[:1] + w1[1:] + w2[1:]),
        "a window without its EOW": b"".join(w1[:-1] + w2),
        "truncated": b"".join(w1 + w2)[:-3],
        "bad body CRC": b"".join(w1) + bytes([w2[0][0]]) + w2[0][1:-1] + bytes(
            [w2[0][-1] ^ 1]) + b"".join(w2[1:]),
    }


@pytest.mark.parametrize("name", sorted(_forged_windows()))
def test_a_forged_or_damaged_response_gives_no_rows_alike(
        both: tuple[ModuleType, ModuleType], name: str) -> None:
    body = _forged_windows()[name]
    a, b = (_log_copy_of(twin, body, {1: 1}) for twin in both)
    assert a == b
    assert isinstance(a, tuple), f"{name}: rows were made"
    if name not in ("a window without its EOW", "an event of another window inside"):
        assert a[0] is EventFormatError


def test_check_windows_passes_every_whole_window(core: ModuleType) -> None:
    body = _ring_body()
    s = core.scan(body)
    core.check_windows(body, s, core.frame_windows(s))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_log_copy_twins_agree_on_mutated_bodies(data: st.DataObject) -> None:
    """Bytes changed anywhere (CRCs resealed or not), windows cut or dropped: the
    producer's path gives the same rows or the same error on both twins."""
    py, nat = batch.twin("python"), _native_or_skip()
    events: list[bytes] = []
    for scn in range(1, data.draw(st.integers(1, 6)) + 1):
        rows: list[tuple[object, bytes]] = [
            (data.draw(st.integers(-5, 5)), b"v" * data.draw(st.integers(0, 9)))
            for _ in range(data.draw(st.integers(0, 3)))]
        events += _window(scn, rows, source_id=data.draw(st.integers(0, 2)))
    drop, swap, damage = (data.draw(st.booleans()) for _ in range(3))
    if events and drop:
        del events[data.draw(st.integers(0, len(events) - 1))]
    if len(events) > 1 and swap:
        i = data.draw(st.integers(0, len(events) - 2))
        events[i], events[i + 1] = events[i + 1], events[i]
    if events and damage:
        i = data.draw(st.integers(0, len(events) - 1))
        e = bytearray(events[i])
        j = data.draw(st.integers(0, len(e) - 1))
        e[j] ^= data.draw(st.integers(1, 255))
        events[i] = reseal(e) if data.draw(st.booleans()) else bytes(e)
    body = b"".join(events)
    owner = {0: 3, 1: 4, 2: 3} if data.draw(st.booleans()) else {0: 3}
    verify = data.draw(st.booleans())
    assert _log_copy_of(py, body, owner, verify=verify) == \
        _log_copy_of(nat, body, owner, verify=verify)

@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=5000), start=st.integers(0, 2**32 - 1),
       offset=st.integers(0, 15))
def test_native_crc32_is_zlibs(data: bytes, start: int, offset: int) -> None:
    """The compiled core folds with carry-less multiplication where the CPU has it;
    every length (below, at and above the 64-byte fold) and alignment gives zlib's."""
    nat = _native_or_skip()
    view = memoryview(b"\x00" * offset + data)[offset:]
    assert nat.crc32(view, start) == zlib.crc32(data, start)


def test_native_crc32_of_a_large_buffer() -> None:
    nat = _native_or_skip()
    data = bytes(range(256)) * 40_000 + b"tail"
    assert nat.crc32(data) == zlib.crc32(data)


# -- flat Avro records ----------------------------------------------------------------

_FLAT_TYPES = {1: "long", 2: "int", 3: "double", 4: "boolean", 5: "string", 6: "bytes"}
_FLAT_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False),
    st.text(), st.binary(max_size=300), st.just("\ud800"), st.just(float("inf")),
)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_flat_records_are_fastavros(data: st.DataObject) -> None:
    """Where a twin encodes a record (it may decline: None), the bytes are fastavro's;
    both twins decline the same values."""
    import io

    from fastavro import parse_schema, schemaless_writer

    py, nat = batch.twin("python"), _native_or_skip()
    codes = data.draw(st.lists(st.sampled_from([1, 2, 3, 4, 5, 6, 17, 18, 19, 20, 21, 22]),
                               min_size=1, max_size=6))
    fields = [{"name": f"f{i}", "type": (["null", _FLAT_TYPES[c & 15]] if c & 16
                                         else _FLAT_TYPES[c])} for i, c in enumerate(codes)]
    schema = parse_schema({"type": "record", "name": "r", "fields": fields})
    values = [data.draw(_FLAT_VALUES) for _ in codes]
    ours = py.encode_flat_record(values, codes)
    assert nat.encode_flat_record(values, bytes(codes)) == ours
    if ours is not None:
        out = io.BytesIO()
        schemaless_writer(out, schema, {f"f{i}": v for i, v in enumerate(values)})
        assert out.getvalue() == ours


def test_flat_record_declines_what_it_cannot_say_alike(core: ModuleType) -> None:
    assert core.encode_flat_record([True], bytes([1])) is None  # a bool for a long
    assert core.encode_flat_record([1], bytes([3])) is None  # an int for a double
    assert core.encode_flat_record([2**31], bytes([2])) is None  # beyond an int
    assert core.encode_flat_record([None], bytes([5])) is None  # null, not nullable
    assert core.encode_flat_record([1, 2], bytes([1])) is None  # a column too many
    assert core.encode_flat_record([-1, None, "é"], bytes([1, 21, 5])) == \
        b"\x01\x00\x04\xc3\xa9"


def test_twins_agree_on_mutated_bodies_for_a_while() -> None:
    """A mutation fuzz of scan and frame_windows, both twins, for
    ``DATABUS_FUZZ_SECONDS`` (2 s by default; 60 s ran 640,000 bodies clean)."""
    import random
    import time

    from tests.event_forging import reseal

    py, nat = batch.twin("python"), _native_or_skip()
    seconds = float(os.environ.get("DATABUS_FUZZ_SECONDS", "2"))
    rnd = random.Random(int(os.environ.get("DATABUS_FUZZ_SEED", "14")))
    bases = [_body()[:600], _body()[:2000], _ring_body()[:3000], b""]
    deadline = time.monotonic() + seconds
    count = 0
    while time.monotonic() < deadline:
        body = bytearray(rnd.choice(bases))
        for _ in range(rnd.randint(0, 6)):
            action = rnd.random()
            if action < 0.4 and body:
                body[rnd.randrange(len(body))] ^= 1 << rnd.randrange(8)
            elif action < 0.55:
                del body[rnd.randint(0, len(body)):]
            elif action < 0.7 and body:
                body[rnd.randrange(len(body))] = rnd.choice([0, 0xDB, 0xFF, 0x7F, 1])
            elif action < 0.85:
                at = rnd.randint(0, len(body))
                body[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 60)))
            elif len(body) > HEADER_SIZE:
                body[:] = reseal(body)
        data = bytes(body)
        for verify in (True, False):
            a, b = py.scan(data, verify_body=verify), nat.scan(data, verify_body=verify)
            assert _as_tuple(a) == _as_tuple(b), data.hex()
        fa, fb = py.frame_windows(a), nat.frame_windows(b)
        assert (list(fa.controls), list(fa.eows), list(fa.counts), list(fa.crcs), fa.broken,
                fa.window, fa.count, fa.crc) == (list(fb.controls), list(fb.eows),
                                                 list(fb.counts), list(fb.crcs), fb.broken,
                                                 fb.window, fb.count, fb.crc), data.hex()
        count += 1
    assert count > 0
