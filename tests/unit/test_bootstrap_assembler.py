"""The bootstrap producer's assembler: response bodies -> whole windows (LogBatch)."""

from __future__ import annotations

import pytest

from databus.bootstrap._producer import _Assembler
from databus.errors import EventFormatError
from databus.event import Op, WindowChecksum, encode_eow, encode_event

pytestmark = pytest.mark.twin("databus.batch")


def _window(scn: int, source_id: int, keys: list[int]) -> list[bytes]:
    events = [encode_event(scn=scn, source_id=source_id, op=Op.UPSERT, key=k, value=b"v")
              for k in keys]
    check = WindowChecksum()
    for e in events:
        check.add_event(e)
    return [*events, encode_eow(scn=scn, event_count=check.count, checksum=check.crc)]


def test_a_cut_window_is_held_until_its_eow() -> None:
    a = _Assembler(key_hash=True)
    w1, w2 = _window(1, 1, [1, 2]), _window(2, 1, [3, 4, 5])
    first = a.feed(b"".join(w1 + w2[:2]), {1: "db.t"})
    assert list(first.scns) == [1] and first.events == 2
    second = a.feed(b"".join(w2[2:]), {1: "db.t"})
    assert list(second.scns) == [2] and second.events == 3
    rows, windows = second.split({"db.t": 7})
    assert windows == [(2, 0, 3, sum(len(e) for e in w2[:3]))]
    assert [t[0:2] for t in rows[7].tuples()] == [(2, 0), (2, 1), (2, 2)]


def test_a_held_window_follows_the_source_ids_of_the_next_relay() -> None:
    """Source ids are per relay: after a failover the rest of a window comes with other
    ids; the held part is renumbered by name, so the window stays one source's."""
    a = _Assembler(key_hash=False)
    part1 = _window(3, 1, [1, 2])  # relay A calls db.t 1
    part2 = _window(3, 4, [1, 2])  # relay B calls it 4 (same events)
    a.feed(part1[0], {1: "db.t"})
    out = a.feed(b"".join(part2[1:]), {4: "db.t", 1: "db.other"})
    rows, _ = out.split({"db.t": 9, "db.other": 10})
    assert list(rows) == [9] and len(rows[9]) == 2
    with pytest.raises(EventFormatError):
        b = _Assembler(key_hash=False)
        b.feed(part1[0], {1: "db.t"})
        b.feed(b"".join(part2[1:]), {4: "db.renamed"})


def test_a_torn_window_is_refused() -> None:
    a = _Assembler(key_hash=False)
    w1, w2 = _window(1, 1, [1]), _window(2, 1, [2])
    with pytest.raises(EventFormatError) as info:
        a.feed(w1[0] + b"".join(w2), {1: "db.t"})
    assert info.value.reason == "missing eow"


def test_a_window_whose_eow_does_not_match_is_refused_whole() -> None:
    """Every source pulled: an event missing from a window (or reordered) fails its EOW
    check, and the body gives nothing; without the checks (a filtered pull) it passes."""
    w1, w2 = _window(1, 1, [1, 2]), _window(2, 1, [3, 4])
    missing = b"".join(w1 + w2[1:])
    reordered = b"".join([*w1, w2[1], w2[0], w2[2]])
    for body in (missing, reordered):
        with pytest.raises(EventFormatError) as info:
            _Assembler(key_hash=True, verify_windows=True).feed(body, {1: "db.t"})
        assert info.value.reason == "window checksum"
        out = _Assembler(key_hash=True, verify_windows=False).feed(body, {1: "db.t"})
        assert list(out.scns) == [1, 2]


def test_a_window_cut_across_bodies_is_checked_whole() -> None:
    a = _Assembler(key_hash=False, verify_windows=True)
    w1, w2 = _window(1, 1, [1, 2]), _window(2, 1, [3, 4, 5])
    assert len(a.feed(b"".join(w1 + w2[:2]), {1: "db.t"})) == 1
    assert list(a.feed(b"".join(w2[2:]), {1: "db.t"}).scns) == [2]
    b = _Assembler(key_hash=False, verify_windows=True)
    b.feed(b"".join(w1 + w2[:1]), {1: "db.t"})
    with pytest.raises(EventFormatError) as info:  # the held part lost an event
        b.feed(b"".join(w2[2:]), {1: "db.t"})
    assert info.value.reason == "window checksum"


def test_a_renumbered_held_window_is_taken_on_its_crcs_and_the_rest_checked() -> None:
    a = _Assembler(key_hash=False, verify_windows=True)
    part1, part2 = _window(3, 1, [1, 2]), _window(3, 4, [1, 2])
    a.feed(part1[0], {1: "db.t"})
    w4 = _window(4, 4, [7])
    out = a.feed(b"".join(part2[1:] + w4), {4: "db.t"})
    assert list(out.scns) == [3, 4]
    b = _Assembler(key_hash=False, verify_windows=True)
    b.feed(part1[0], {1: "db.t"})
    with pytest.raises(EventFormatError):  # a later window of that body is still checked
        b.feed(b"".join(part2[1:] + w4[1:]), {4: "db.t"})


def test_the_log_copy_of_a_batch_is_its_split() -> None:
    """The PostgreSQL path (log_copy) and the row path (split, SQLite) give the same
    rows and windows."""
    from databus.batch import copy_rows
    from databus.bootstrap._postgres import _COPY_HEADER, _COPY_TRAILER, _COPY_WINDOW

    a = _Assembler(key_hash=True, verify_windows=True)
    body = b"".join(_window(1, 1, [1, 2]) + _window(2, 2, [3]) + _window(5, 1, [4, 5, 6]))
    batch = a.feed(body, {1: "db.t", 2: "db.u"})
    ids = {"db.t": 7, "db.u": 2}
    copy = batch.log_copy(ids)
    rows, windows = batch.split(ids)
    assert copy.logs == {
        target: _COPY_HEADER + copy_rows(r.body, r.scan, r.indexes, r.scns, r.seqs,
                                         r.key_hashes, r.source_id) + _COPY_TRAILER
        for target, r in rows.items()}
    assert copy.windows == _COPY_HEADER + b"".join(
        _COPY_WINDOW.pack(4, 8, scn, 8, ts, 4, n, 8, size) for scn, ts, n, size in windows
    ) + _COPY_TRAILER
    assert (copy.stored, copy.events, copy.spans) == (3, 6, {7: (1, 5), 2: (2, 2)})
