"""``FollowerBuffer``: a ring file mapped read-only by another process (relay workers).

It must serve exactly what the writer's own ``read`` serves, follow the writer through
the file's live record (state, head re-checks), keep a bounded index of its own, and,
while a writer in another process laps a small ring under it, never hand out torn
bytes: every event's CRCs pass, windows come whole and in SCN order, and a reader
whose range was overwritten gets ``scn_not_found``.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from databus.checkpoint import Checkpoint
from databus.errors import ScnNotFoundError
from databus.event import Op, decode_eow, decode_event, encode_event, iter_events
from databus.relay._buffer import (
    _LIVE_OFFSET,
    META_SIZE,
    BufferError_,
    EventBuffer,
)
from databus.relay._follower import FollowerBuffer
from tests.tiers import size

STRESS_SECONDS = size("DATABUS_FOLLOWER_STRESS_SECONDS", smoke=2, full=4)


def ev(scn: int, key: int, size: int = 40) -> bytes:
    return encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=key,
                        value=bytes([scn % 251]) * size, timestamp_ns=scn * 1000)


def fill(buf: EventBuffer, scns: range | list[int], per_window: int = 3, size: int = 40) -> None:
    for scn in scns:
        buf.append_window(scn, [ev(scn, scn * 100 + i, size) for i in range(per_window)])


def windows(data: bytes) -> list[tuple[int, list[bytes], int]]:
    """(scn, event values, EOW count) per window; every CRC checked on the way."""
    out: list[tuple[int, list[bytes], int]] = []
    for off, header in iter_events(data):
        event = decode_event(data, off)
        if not out or out[-1][0] != header.scn or out[-1][2] >= 0:
            out.append((header.scn, [], -1))
        if header.is_eow:
            out[-1] = (header.scn, out[-1][1], decode_eow(event).event_count)
        else:
            out[-1][1].append(event.value)
    return out


def read_everything(buf: EventBuffer, cp: Checkpoint, max_bytes: int) -> tuple[bytes, Checkpoint]:
    body = b""
    while True:
        result = buf.read(cp, max_bytes=max_bytes)
        if not result.data:
            return body, cp
        body += result.data
        cp = result.checkpoint


def test_follower_serves_what_the_writer_serves(tmp_path: Path) -> None:
    path = tmp_path / "ring.buf"
    with EventBuffer(path, 1 << 16, index_every_bytes=1024) as writer:
        fill(writer, range(1, 200))  # laps the ring: the head is well past 0
        with FollowerBuffer(path, 1 << 16, index_every_bytes=1024) as follower:
            assert follower.state() == writer.state()
            low = writer.state().min_scn
            assert low is not None and low > 1
            for scn in [-1, low - 1, low, low + 7, 150, 199, 250]:
                for max_bytes in (300, 5000, 1 << 20):
                    cp = Checkpoint(scn)
                    assert read_everything(follower, cp, max_bytes) == \
                        read_everything(writer, cp, max_bytes)
            # A partial window, and "from the latest".
            mid = writer.read(Checkpoint(150), max_bytes=200).checkpoint
            assert mid.window_offset >= 0
            assert follower.read(mid, max_bytes=1 << 20) == writer.read(mid, max_bytes=1 << 20)
            latest = Checkpoint(-2)
            assert follower.read(latest, max_bytes=1000) == writer.read(latest, max_bytes=1000)
            with pytest.raises(ScnNotFoundError):
                follower.read(Checkpoint(1), max_bytes=1000)


def test_follower_sees_new_windows_before_it_catches_up(tmp_path: Path) -> None:
    path = tmp_path / "ring.buf"
    with EventBuffer(path, 1 << 16, index_every_bytes=1024) as writer, \
            FollowerBuffer(path, 1 << 16, index_every_bytes=1024) as follower:
        assert follower.state().max_scn is None
        assert follower.catch_up() is False  # nothing published since it opened
        fill(writer, range(1, 50))
        # State and reads come from the live record, whatever the index knows.
        assert follower.state() == writer.state()
        body, cp = read_everything(follower, Checkpoint(-1), 4096)
        assert [w[0] for w in windows(body)] == list(range(1, 50))
        assert cp.window_scn == 49
        assert follower.catch_up() is True
        assert follower.catch_up() is False
        fill(writer, range(50, 400))  # many laps: the follower's index must follow the head
        assert follower.catch_up() is True
        state = writer.state()
        index = list(follower._index.items())
        assert index and all(pos >= state.head for _, pos in index)
        assert [scn for scn, _ in index] == sorted(scn for scn, _ in index)
        assert read_everything(follower, Checkpoint(300), 1 << 20) == \
            read_everything(writer, Checkpoint(300), 1 << 20)


def test_follower_index_matches_the_writers(tmp_path: Path) -> None:
    path = tmp_path / "ring.buf"
    with EventBuffer(path, 1 << 18, index_every_bytes=2048) as writer, \
            FollowerBuffer(path, 1 << 18, index_every_bytes=2048) as follower:
        for scn in range(1, 600):
            fill(writer, [scn], per_window=1 + scn % 4, size=20 + scn % 300)
            if scn % 37 == 0:
                follower.catch_up()
        follower.catch_up()
        head = writer.state().head
        # The same rule (an entry every index_every bytes) over the same windows; the
        # follower starts later, so compare the entries past where it started.
        theirs = {scn: pos for scn, pos in writer._index.items() if pos >= head}
        ours = dict(follower._index.items())
        assert ours and set(ours).issubset(set(range(1, 600)))
        assert all(pos >= head for pos in ours.values())
        assert len(ours) >= len(theirs) - 2


def test_follower_refuses_to_write_and_a_wrong_size(tmp_path: Path) -> None:
    path = tmp_path / "ring.buf"
    with EventBuffer(path, 1 << 16) as writer:
        fill(writer, range(1, 4))
        with FollowerBuffer(path, 1 << 16) as follower:
            with pytest.raises(BufferError_):
                follower.start_window(10)
            with pytest.raises(BufferError_):
                follower.append_window(10, [ev(10, 1)])
            with pytest.raises(BufferError_):
                follower.start_after(10)
            with pytest.raises(BufferError_):
                follower.append(ev(10, 1))
            follower.flush()  # a no-op
        with pytest.raises(BufferError_, match="config says"):
            FollowerBuffer(path, 1 << 17)


def test_a_file_written_before_the_live_record_gets_one_at_open(tmp_path: Path) -> None:
    path = tmp_path / "ring.buf"
    with EventBuffer(path, 1 << 16) as writer:
        fill(writer, range(1, 20))
        state = writer.state()
    with open(path, "r+b") as f:  # what a relay of the previous version left
        f.seek(_LIVE_OFFSET)
        f.write(bytes(80))
    with EventBuffer(path, 1 << 16) as writer, FollowerBuffer(path, 1 << 16) as follower:
        assert writer.state() == state
        assert follower.state() == state


# -- a writer in another process laps a small ring under a follower ---------------------

WRITER = textwrap.dedent("""
    import sys, time
    from databus.event import Op, encode_event
    from databus.relay._buffer import EventBuffer

    path, capacity, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    buf = EventBuffer(path, capacity, index_every_bytes=1024)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    scn = 0
    while time.monotonic() < deadline:
        for _ in range(50):
            scn += 1
            n, size = 1 + scn % 4, 30 + (scn * 7919) % 700
            buf.append_window(scn, [
                encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=scn * 10 + i,
                             value=bytes([scn % 251]) * size, timestamp_ns=scn)
                for i in range(n)])
    buf.close()
    print(scn, flush=True)
""")


def expected_window(scn: int) -> tuple[list[bytes], int]:
    n, size = 1 + scn % 4, 30 + (scn * 7919) % 700
    return [bytes([scn % 251]) * size] * n, n


@pytest.mark.acceptance
def test_follower_reading_while_another_process_wraps_the_ring(tmp_path: Path) -> None:
    path = tmp_path / "ring.buf"
    capacity = 64 * 1024  # a few dozen windows: lapped many times a second
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(capacity), str(STRESS_SECONDS)],
        stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        follower = FollowerBuffer(path, capacity, index_every_bytes=1024)
        rng = random.Random(5)
        cp = Checkpoint(-1)
        seen = not_found = reads = 0
        last_scn: int | None = None
        deadline = time.monotonic() + STRESS_SECONDS + 5
        while proc.poll() is None and time.monotonic() < deadline:
            if rng.random() < 0.3:
                follower.catch_up()
            try:
                result = follower.read(cp, max_bytes=rng.choice((200, 3000, 20000, 1 << 20)))
            except ScnNotFoundError:
                # Fell off (or kept being overwritten while it read): start again at the
                # oldest window, which must come whole.
                not_found += 1
                cp, last_scn = Checkpoint(-1), None
                continue
            reads += 1
            if not result.data:
                continue
            got = windows(result.data)  # every CRC checked
            if cp.window_offset >= 0:  # the rest of a window begun in the last read
                scn, values, count = got.pop(0)
                assert scn == cp.window_scn and count in (-1, expected_window(scn)[1])
            for scn, values, count in got:
                if last_scn is not None:
                    assert scn == last_scn + 1, (scn, last_scn)
                if count >= 0:  # whole: exactly what the writer wrote
                    assert (values, count) == expected_window(scn)
                    seen += 1
                last_scn = scn
            cp = result.checkpoint
        written = int(proc.communicate(timeout=30)[0].split()[-1])
        follower.catch_up()
        follower.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert written > 1000 and reads > 100 and seen > 100, (written, reads, seen)
    print(f"writer {written} windows; follower {reads} reads, {seen} whole windows, "
          f"{not_found} scn_not_found")
    assert not_found > 0  # it did fall behind the writer (the case under test)


def test_meta_page_layout_keeps_the_live_record_clear_of_the_slots() -> None:
    assert _LIVE_OFFSET >= 64 + 52 and _LIVE_OFFSET + 80 <= META_SIZE
