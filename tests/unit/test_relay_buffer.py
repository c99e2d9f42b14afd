"""The relay's mmap ring buffer, tested on bytes: windows, eviction, reads, restart."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from databus.checkpoint import Checkpoint
from databus.errors import EventFormatError, ScnNotFoundError
from databus.event import (
    DUMP_END_SOURCE_ID,
    DUMP_START_SOURCE_ID,
    Op,
    decode_eow,
    decode_event,
    encode_dump_marker,
    encode_eow,
    encode_event,
    iter_events,
)
from databus.relay._buffer import (
    META_SIZE,
    BufferError_,
    EventBuffer,
    ScnOrderError,
    WindowTooLargeError,
)

pytestmark = pytest.mark.twin("databus.batch")


def ev(scn: int, key: int, size: int = 40, source_id: int = 1) -> bytes:
    return encode_event(
        scn=scn, source_id=source_id, op=Op.UPSERT, key=key, value=bytes([key % 251]) * size,
        timestamp_ns=scn * 1000,
    )


def fill(buf: EventBuffer, scns: list[int], per_window: int = 3, size: int = 40) -> None:
    for scn in scns:
        buf.append_window(scn, [ev(scn, scn * 100 + i, size) for i in range(per_window)])


def parse(data: bytes) -> list[tuple[int, int, object]]:
    """(scn, source_id, key or EOW count) for every event, every CRC checked."""
    out = []
    for off, header in iter_events(data):
        event = decode_event(data, off)
        payload = decode_eow(event).event_count if header.is_eow else event.key
        out.append((header.scn, header.source_id, payload))
    return out


def read_all(buf: EventBuffer, cp: Checkpoint, max_bytes: int = 1 << 20,
             predicate: object = None) -> tuple[list[tuple[int, int, object]], Checkpoint]:
    events: list[tuple[int, int, object]] = []
    while True:
        result = buf.read(cp, max_bytes=max_bytes, predicate=predicate)  # type: ignore[arg-type]
        if not result.data:
            assert result.pending_event_size is None
            return events, cp
        events += parse(result.data)
        cp = result.checkpoint


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ring.buf"


def test_windows_are_served_whole_with_eow(path: Path) -> None:
    with EventBuffer(path, 1 << 16) as buf:
        fill(buf, [10, 20, 30])
        result = buf.read(Checkpoint.flexible(), max_bytes=1 << 20)
        events = parse(result.data)
        assert [e for e in events if e[1] == -2] == [(10, -2, 3), (20, -2, 3), (30, -2, 3)]
        assert [e[2] for e in events if e[1] == 1] == [1000, 1001, 1002, 2000, 2001, 2002,
                                                        3000, 3001, 3002]
        assert result.checkpoint == Checkpoint(30)
        assert (result.events, result.windows) == (9, 3)
        assert parse(buf.read(Checkpoint(20), max_bytes=1 << 20).data)[0][0] == 30
        assert parse(buf.read(Checkpoint(15), max_bytes=1 << 20).data)[0][0] == 20
        nothing = buf.read(Checkpoint(30), max_bytes=1 << 20)
        assert nothing.data == b"" and nothing.wait_after_scn == 30
        latest = buf.read(Checkpoint.latest(), max_bytes=1 << 20)
        assert latest.data == b"" and latest.wait_after_scn == 30


def test_small_max_bytes_splits_windows_and_resumes_exactly(path: Path) -> None:
    with EventBuffer(path, 1 << 16) as buf:
        fill(buf, [10, 20, 30], per_window=5)
        whole, _ = read_all(buf, Checkpoint.flexible())
        one_event = len(ev(10, 1))
        for max_bytes in (one_event, one_event + 60, 3 * one_event):
            pieces, cp = read_all(buf, Checkpoint.flexible(), max_bytes=max_bytes)
            assert pieces == whole
            assert cp == Checkpoint(30)


def test_pending_event_size_when_first_event_does_not_fit(path: Path) -> None:
    with EventBuffer(path, 1 << 16) as buf:
        fill(buf, [10], size=500)
        result = buf.read(Checkpoint.flexible(), max_bytes=100)
        assert result.data == b"" and result.pending_event_size == len(ev(10, 1, 500))
        assert result.wait_after_scn is None


def test_partial_window_checkpoint(path: Path) -> None:
    with EventBuffer(path, 1 << 16) as buf:
        fill(buf, [10, 20], per_window=4)
        events, _ = read_all(buf, Checkpoint(20, 2))
        assert [e[2] for e in events] == [2002, 2003, 4]


def test_a_marker_before_consumed_events_is_not_served_again(path: Path) -> None:
    # A dump's window: its start marker, the chunk's rows, its end marker. A consumer
    # whose checkpoint sits inside the window got the start marker with the first rows;
    # resuming must not repeat it (a second on_dump_start), and must not lose the end.
    with EventBuffer(path, 1 << 16) as buf:
        start = encode_dump_marker(scn=10, kind="start", source="db.t", dump_id="d1")
        end = encode_dump_marker(scn=10, kind="end", source="db.t", dump_id="d1", rows=3)
        buf.start_window(10)
        buf.append_control(start)
        for key in (1, 2, 3):
            buf.append(ev(10, key))
        buf.append_control(end)
        buf.end_window()
        fill(buf, [20])
        whole, _ = read_all(buf, Checkpoint.flexible())
        kinds = [e[1] for e in whole if e[0] == 10]
        assert kinds == [DUMP_START_SOURCE_ID, 1, 1, 1, DUMP_END_SOURCE_ID, -2]
        one_event = len(ev(10, 1))
        # Room for the marker but not for the event after it: nothing is served (a
        # marker alone would not move the checkpoint, and the client would ask forever);
        # the pending size says how much room the two need.
        alone = buf.read(Checkpoint.flexible(), max_bytes=one_event)
        assert alone.data == b"" and alone.pending_event_size == len(start) + one_event
        for max_bytes in (len(start) + one_event, one_event + len(end),
                          2 * one_event + len(end), 3 * one_event + len(start)):
            pieces, cp = read_all(buf, Checkpoint.flexible(), max_bytes=max_bytes)
            assert pieces == whole, max_bytes
            assert cp == Checkpoint(20)
        resumed, _ = read_all(buf, Checkpoint(10, 1))
        assert [e[1] for e in resumed if e[0] == 10] == [1, 1, DUMP_END_SOURCE_ID, -2]


def test_filter_keeps_eows(path: Path) -> None:
    with EventBuffer(path, 1 << 16) as buf:
        fill(buf, [10, 20, 30], per_window=4)
        even = lambda source_id, pkey, key: pkey % 2 == 0  # noqa: E731
        events, cp = read_all(buf, Checkpoint.flexible(), predicate=even)
        assert [e[2] for e in events if e[1] == 1] == [1000, 1002, 2000, 2002, 3000, 3002]
        assert sum(1 for e in events if e[1] == -2) == 3 and cp == Checkpoint(30)
        nothing = lambda source_id, pkey, key: False  # noqa: E731
        events, cp = read_all(buf, Checkpoint.flexible(), predicate=nothing)
        assert [e[1] for e in events] == [-2, -2, -2] and cp == Checkpoint(30)
        # Partial resume counts passing events: two of window 20 consumed -> none left.
        one = len(ev(1, 1))
        events, _ = read_all(buf, Checkpoint(20, 1), max_bytes=one, predicate=even)
        assert [e[2] for e in events if e[1] == 1] == [2002, 3000, 3002]


def test_eviction_wraps_and_reports_scn_not_found(path: Path) -> None:
    cap = 4096
    with EventBuffer(path, cap) as buf:
        fill(buf, list(range(1, 200)), per_window=2, size=100)
        state = buf.state()
        assert state.used_bytes <= cap
        assert state.max_scn == 199 and state.prev_scn == state.min_scn - 1  # type: ignore[operator]
        events, cp = read_all(buf, Checkpoint(state.prev_scn))
        scns = sorted({e[0] for e in events})
        assert scns == list(range(state.min_scn, 200))  # type: ignore[arg-type]
        assert cp == Checkpoint(199)
        with pytest.raises(ScnNotFoundError) as info:
            buf.read(Checkpoint(state.prev_scn - 1), max_bytes=1 << 20)
        assert info.value.min_scn == state.min_scn
        with pytest.raises(ScnNotFoundError):
            buf.read(Checkpoint(state.prev_scn, 0), max_bytes=1 << 20)


def test_window_too_large_is_an_error_and_buffer_stays_usable(path: Path) -> None:
    with EventBuffer(path, 2048) as buf:
        fill(buf, [1])
        events = [ev(2, i, 300) for i in range(10)]
        with pytest.raises(WindowTooLargeError) as info:
            buf.append_window(2, events)
        # The whole window's size (counted past the point where it stopped fitting,
        # with its EOW) and the capacity that holds it, in the message (issue 28).
        eow = encode_eow(scn=2, event_count=10, checksum=0, timestamp_ns=0, partition_id=0)
        size = sum(len(e) for e in events) + len(eow)
        assert info.value.window_bytes == size
        assert info.value.needed_mb == 1
        assert f"{size:,} bytes" in str(info.value) and "databus relay resize" in str(info.value)
        fill(buf, [3])
        assert buf.state().max_scn == 3
        events, _ = read_all(buf, Checkpoint.flexible())
        assert {e[0] for e in events} == {3}


def test_scn_must_increase(path: Path) -> None:
    with EventBuffer(path, 1 << 16) as buf:
        fill(buf, [10])
        with pytest.raises(ScnOrderError):
            buf.start_window(10)
        with pytest.raises(ScnOrderError):
            buf.start_window(5)
        buf.start_after  # noqa: B018 - the API exists; empty-buffer use is tested below


def test_start_after_makes_older_checkpoints_fall_off(path: Path) -> None:
    with EventBuffer(path, 1 << 16) as buf:
        buf.start_after(500)
        with pytest.raises(ScnNotFoundError):
            buf.read(Checkpoint(499), max_bytes=100)
        assert buf.read(Checkpoint(500), max_bytes=100).wait_after_scn == 500
        with pytest.raises(ScnOrderError):
            buf.start_window(500)


def test_rollback_discards_open_window(path: Path) -> None:
    with EventBuffer(path, 1 << 16) as buf:
        fill(buf, [1])
        buf.start_window(2)
        buf.append(ev(2, 1))
        buf.rollback()
        fill(buf, [3])
        events, _ = read_all(buf, Checkpoint.flexible())
        assert sorted({e[0] for e in events}) == [1, 3]


def test_restart_serves_everything_it_had(path: Path) -> None:
    buf = EventBuffer(path, 4096)
    fill(buf, list(range(1, 60)), per_window=2, size=80)
    before, _ = read_all(buf, Checkpoint.flexible())
    state = buf.state()
    buf.start_window(60)
    buf.append(ev(60, 1))  # an open window: never committed
    buf.close()
    with EventBuffer(path, 4096) as again:
        after, _ = read_all(again, Checkpoint.flexible())
        assert after == before
        assert again.state().prev_scn == state.prev_scn
        assert again.state().max_scn == 59
        fill(again, [61])


def test_capacity_change_is_refused(path: Path) -> None:
    EventBuffer(path, 4096).close()
    with pytest.raises(Exception, match="databus relay resize"):
        EventBuffer(path, 8192)


def test_flipped_byte_drops_from_the_bad_window_on(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    buf = EventBuffer(path, 1 << 16)
    fill(buf, [1, 2, 3, 4, 5], per_window=3)
    whole, _ = read_all(buf, Checkpoint.flexible())
    size_per_window = buf.state().used_bytes // 5
    buf.close()
    with open(path, "r+b") as fh:
        fh.seek(META_SIZE + 2 * size_per_window + 70)  # inside window 3
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x01]))
    with caplog.at_level(logging.ERROR), EventBuffer(path, 1 << 16) as again:
        served, _ = read_all(again, Checkpoint.flexible())
        assert served == [e for e in whole if e[0] <= 2]
        assert again.state().max_scn == 2
        assert "corrupted window" in caplog.text
        fill(again, [6])  # the fetcher resumes after 2 ... and refills from there
        assert again.state().max_scn == 6


def test_kill_9_mid_write(path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        from databus.event import Op, encode_event
        from databus.relay._buffer import EventBuffer
        buf = EventBuffer({str(path)!r}, 1 << 15)
        scn = 0
        while True:
            scn += 1
            buf.start_window(scn)
            for i in range(5):
                buf.append(encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=scn * 10 + i,
                                        value=b"v" * 200))
                if scn == 300 and i == 2:
                    print("mid-window", flush=True)
                    sys.stdin.read()  # wait here to be killed
            buf.end_window()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "mid-window"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with EventBuffer(path, 1 << 15) as buf:
        state = buf.state()
        assert state.max_scn == 299
        events, _ = read_all(buf, Checkpoint.flexible())
        windows: dict[int, list[object]] = {}
        for scn, _source_id, payload in events:
            windows.setdefault(scn, []).append(payload)
        assert sorted(windows) == list(range(state.min_scn, 300))  # type: ignore[arg-type]
        for scn, payloads in windows.items():
            assert payloads == [scn * 10 + i for i in range(5)] + [5]


def test_concurrent_readers_never_see_torn_bytes(path: Path) -> None:
    """One writer laps a small ring many times while readers copy ranges out: every
    byte a reader gets passes its CRCs and every window arrives whole, or the reader is
    told the range was overwritten."""
    cap = 16 * 1024
    stop = threading.Event()
    failures: list[BaseException] = []
    checked = [0, 0]  # windows verified, scn_not_found seen

    def writer(buf: EventBuffer) -> None:
        rng = random.Random(7)
        for scn in range(1, 4000):
            buf.append_window(scn, [ev(scn, scn * 10 + i, rng.randint(10, 400))
                                    for i in range(rng.randint(1, 6))])
        stop.set()

    def reader(buf: EventBuffer, max_bytes: int) -> None:
        cp = Checkpoint.flexible()
        try:
            while not stop.is_set():
                try:
                    result = buf.read(cp, max_bytes=max_bytes)
                except ScnNotFoundError:
                    checked[1] += 1
                    cp = Checkpoint.flexible()
                    continue
                if not result.data:
                    continue
                events = parse(result.data)
                for scn, source_id, payload in events:
                    if source_id == -2:
                        keys = [p for s, sid, p in events if s == scn and sid == 1]
                        if cp.window_scn != scn or cp.window_offset < 0:
                            assert len(keys) == payload
                        checked[0] += 1
                cp = result.checkpoint
        except BaseException as exc:
            failures.append(exc)

    with EventBuffer(path, cap) as buf:
        threads = [threading.Thread(target=reader, args=(buf, mb))
                   for mb in (300, 2000, 1 << 20)]
        for t in threads:
            t.start()
        writer(buf)
        for t in threads:
            t.join()
    assert not failures, failures[0]
    assert checked[0] > 100


@pytest.mark.parametrize("sizes", [(40, 7), (200, 3), (13, 11), (1000, 1)])
def test_append_many_writes_what_append_writes_across_the_ring_end(
        tmp_path: Path, sizes: tuple[int, int]) -> None:
    size, per_window = sizes
    one = EventBuffer(tmp_path / "one.buf", 4096)
    many = EventBuffer(tmp_path / "many.buf", 4096)
    try:
        for scn in range(1, 60):  # many laps of a 4 KiB ring: every split point happens
            events = [ev(scn, scn * 100 + i, size) for i in range(per_window)]
            one.start_window(scn)
            for event in events:
                one.append(event)
            one.end_window()
            many.start_window(scn)
            many.append_many(events)
            many.end_window()
            assert bytes(one._ring) == bytes(many._ring)
        assert read_all(one, Checkpoint.flexible()) == read_all(many, Checkpoint.flexible())
    finally:
        one.close()
        many.close()


def test_append_many_refuses_what_append_refuses(path: Path) -> None:
    with EventBuffer(path, 1 << 16) as buf:
        with pytest.raises(BufferError_):
            buf.append_many([ev(5, 1)])  # outside a window
        buf.start_window(5)
        with pytest.raises(BufferError_, match="SCN"):
            buf.append_many([ev(5, 1), ev(6, 2)])
        with pytest.raises(BufferError_, match="control"):
            buf.append_many([encode_dump_marker(scn=5, kind="start", source="db.t",
                                                dump_id="d")])
        with pytest.raises(EventFormatError):
            buf.append_many([ev(5, 1)[:-1]])
        buf.append_many([])
        buf.append_many([ev(5, 1), ev(5, 2)])
        assert buf.window_events() == 2
        buf.end_window()
        assert [e[2] for e in read_all(buf, Checkpoint.flexible())[0]] == [1, 2, 2]


def test_a_window_too_large_by_append_many_says_its_size(path: Path) -> None:
    with EventBuffer(path, 4096) as buf:
        buf.start_window(1)
        buf.append_many([ev(1, i, 300) for i in range(20)])
        with pytest.raises(WindowTooLargeError) as caught:
            buf.end_window()
        assert caught.value.window_bytes > 4096
        fill(buf, [2])  # still usable
