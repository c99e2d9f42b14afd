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
