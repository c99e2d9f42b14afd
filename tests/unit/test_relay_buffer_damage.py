"""Ring-file damage: what a torn write, a zeroed page or a flipped bit does to a restart.

Every case closes a buffer that has wrapped several times (so it holds end-of-lap
padding), damages ``<buffer>.buf`` the way a machine crash or a bad disk would, reopens
it and checks the one rule (DESIGN section 7, issue 12): the relay serves only verified
windows, contiguous from the oldest it kept and byte-identical to what was written, or
refuses to start with a message. Never a gap, and never a silent drop: losing windows
is logged at ERROR.
"""

from __future__ import annotations

import logging
import random
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from databus.checkpoint import Checkpoint
from databus.event import HEADER_SIZE, iter_events
from databus.relay._buffer import (
    _PAD_MARKER,
    _SLOT,
    _SLOT_OFFSETS,
    META_SIZE,
    BufferCorruptedError,
    BufferError_,
    EventBuffer,
)
from tests.unit.test_relay_buffer import ev

pytestmark = pytest.mark.twin("databus.batch")

CAPACITY = 1 << 15  # 32 KiB: a few hundred windows wrap it several times


@dataclass
class Written:
    """What was written: every window's bytes as served, by SCN, in order."""

    windows: dict[int, bytes]
    head: int
    tail: int


def _write_laps(path: Path, seed: int = 7, windows: int = 400) -> Written:
    rng = random.Random(seed)
    with EventBuffer(path, CAPACITY, index_every_bytes=2048) as buf:
        for i in range(windows):
            scn = 1000 + i * 3
            count = rng.randint(1, 4)
            buf.append_window(
                scn, [ev(scn, scn * 10 + k, rng.randint(10, 700)) for k in range(count)]
            )
        state = buf.state()
        served = _serve_all(buf)
    return Written(served, state.head, state.tail)


def _serve_all(buf: EventBuffer) -> dict[int, bytes]:
    """Every window served from the start, split at EOWs (each CRC checked)."""
    cp = Checkpoint.flexible()
    data = b""
    while True:
        result = buf.read(cp, max_bytes=1 << 20)
        if not result.data:
            break
        data += result.data
        cp = result.checkpoint
    out: dict[int, bytes] = {}
    start = 0
    for off, header in iter_events(data):
        if header.is_eow:
            out[header.scn] = data[start : off + header.total_length]
            start = off + header.total_length
    assert start == len(data)
    return out


def _window_starts(path: Path, written: Written) -> list[tuple[int, int]]:
    """(absolute position, SCN) of every window held, found by walking the file."""
    return [(start, scn) for start, _end, scn in _window_spans(path, written)]


def _window_holding(path: Path, written: Written, pos: int) -> int:
    """The SCN of the first window whose bytes reach past ``pos`` (padding included:
    a window that starts with padding holds it)."""
    return next(scn for _start, end, scn in _window_spans(path, written) if end > pos)


def _window_spans(path: Path, written: Written) -> list[tuple[int, int, int]]:
    """(first event position, end position, SCN) of every window held."""
    ring = path.read_bytes()[META_SIZE:]
    starts = []
    pos = written.head
    for scn, body in written.windows.items():
        phys = pos % CAPACITY
        if CAPACITY - phys < HEADER_SIZE or ring[phys] == 0:
            pos += CAPACITY - phys
            phys = 0
        assert ring[phys] == 0xDB
        start = pos
        # A window's events are contiguous within a lap unless padding cuts them.
        for _off, header in iter_events(body):
            phys = pos % CAPACITY
            if CAPACITY - phys < HEADER_SIZE or ring[phys] == 0:
                pos += CAPACITY - phys
            pos += header.total_length
        starts.append((start, pos, scn))
    assert pos == written.tail
    return starts


def _pad_positions(path: Path, written: Written) -> list[int]:
    """Absolute positions of the pad markers between head and tail."""
    ring = path.read_bytes()[META_SIZE:]
    lap_ends = range((written.head // CAPACITY + 1) * CAPACITY, written.tail, CAPACITY)
    found = []
    for end in lap_ends:
        for phys in range(CAPACITY - HEADER_SIZE, CAPACITY - 3000, -1):
            pos = end - CAPACITY + phys
            # Stale markers of older laps may lie further on: the position tells.
            if ring[phys : phys + 12] == struct.pack(">B3sQ", 0, b"PAD", pos):
                found.append(pos)
                break
    return found


def _poke(path: Path, pos: int, data: bytes) -> None:
    """Overwrite ring bytes at absolute position ``pos`` (wrapping like the ring)."""
    with path.open("r+b") as f:
        for i, byte in enumerate(data):
            f.seek(META_SIZE + (pos + i) % CAPACITY)
            f.write(bytes([byte]))


def _reopen_and_check(path: Path, written: Written, caplog: pytest.LogCaptureFixture,
                      *, damaged_scn: int | None) -> dict[int, bytes]:
    """Reopen, serve everything, and check the rule; returns what was served."""
    caplog.clear()
    with (caplog.at_level(logging.INFO, logger="databus.relay.buffer"),
          EventBuffer(path, CAPACITY, index_every_bytes=2048) as buf):
        served = _serve_all(buf)
        state = buf.state()
    original = list(written.windows)
    kept = list(served)
    # Contiguous from the oldest window held, byte-identical.
    assert kept == original[: len(kept)], "the recovered windows are not a prefix"
    for scn in kept:
        assert served[scn] == written.windows[scn], f"window {scn} changed"
    if damaged_scn is None:
        assert kept == original
    else:
        # The damaged window and everything after it are gone, nothing before it.
        assert kept == original[: original.index(damaged_scn)]
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors, "windows were dropped without an ERROR"
        assert "dropping it and everything after it" in errors[0].getMessage()
    # No gap for a consumer: the buffer's range starts where it did.
    if kept:
        assert state.min_scn == original[0]
        assert state.max_scn == kept[-1]
    return served


@pytest.fixture
def ring(tmp_path: Path) -> tuple[Path, Written]:
    path = tmp_path / "ring.buf"
    # The ring holds about one lap, so one end-of-lap padding at most. Pick a workload
    # whose padding is long enough for a marker (shorter padding needs none) and falls
    # between two windows: then a damaged window before it, taken for padding, would
    # make recovery resume at the next lap on whole windows, a gap (the defect).
    for seed in range(200):
        path.unlink(missing_ok=True)
        written = _write_laps(path, seed=seed)
        pads = _pad_positions(path, written)
        if pads and any(end == pads[0] for _s, end, _scn in _window_spans(path, written)):
            break
    else:
        raise AssertionError("no workload put its padding between two windows")
    assert len(written.windows) > 20
    assert written.tail - written.head > CAPACITY // 2
    assert written.tail > 3 * CAPACITY  # wrapped: there is padding to confuse with damage
    return path, written


def test_undamaged_file_is_served_whole(ring: tuple[Path, Written],
                                        caplog: pytest.LogCaptureFixture) -> None:
    path, written = ring
    assert _pad_positions(path, written), "the ring holds no pad marker to test against"
    _reopen_and_check(path, written, caplog, damaged_scn=None)


@pytest.mark.parametrize("which", [1, 3, "middle", -2])
def test_zero_byte_at_a_window_start_drops_from_that_window(
    ring: tuple[Path, Written], caplog: pytest.LogCaptureFixture, which: int | str
) -> None:
    # The defect: a 0x00 at a window start was taken for end-of-lap padding, recovery
    # said "recovered N windows" at INFO and the relay served an SCN gap.
    path, written = ring
    starts = _window_starts(path, written)
    index = len(starts) // 2 if which == "middle" else int(which)
    pos, scn = starts[index]
    _poke(path, pos, b"\x00")
    _reopen_and_check(path, written, caplog, damaged_scn=scn)


def test_zeroed_page_from_an_event_boundary(ring: tuple[Path, Written],
                                             caplog: pytest.LogCaptureFixture) -> None:
    # What a torn write after a machine crash looks like: a whole 4 KiB page of zeros.
    path, written = ring
    starts = _window_starts(path, written)
    pos, scn = starts[len(starts) // 3]
    _poke(path, pos, bytes(4096))
    _reopen_and_check(path, written, caplog, damaged_scn=scn)


def test_zeroed_page_aligned_to_the_file(ring: tuple[Path, Written],
                                         caplog: pytest.LogCaptureFixture) -> None:
    # A page-aligned hole in the file; the first window it touches and all after go.
    path, written = ring
    starts = _window_starts(path, written)
    pos0, _ = starts[len(starts) // 4]
    page_pos = pos0 + (-(pos0 + META_SIZE)) % 4096  # next file-page boundary
    touched = [scn for (p, scn), nxt in zip(starts, [*starts[1:], (written.tail, 0)],
                                            strict=True)
               if p < page_pos + 4096 and nxt[0] > page_pos]
    _poke(path, page_pos, bytes(4096))
    _reopen_and_check(path, written, caplog, damaged_scn=touched[0])


def test_zeroed_pad_marker_is_damage(ring: tuple[Path, Written],
                                     caplog: pytest.LogCaptureFixture) -> None:
    path, written = ring
    pads = _pad_positions(path, written)
    pad = pads[0]
    _poke(path, pad, bytes(_PAD_MARKER.size))
    damaged = _window_holding(path, written, pad)
    _reopen_and_check(path, written, caplog, damaged_scn=damaged)


def test_pad_marker_of_another_lap_is_damage(ring: tuple[Path, Written],
                                             caplog: pytest.LogCaptureFixture) -> None:
    # A stale marker (right magic and CRC, position of an older lap) proves nothing.
    path, written = ring
    pad = _pad_positions(path, written)[0]
    stale = pad - CAPACITY
    crc = __import__("zlib").crc32(struct.pack(">B3sQ", 0, b"PAD", stale))
    _poke(path, pad, _PAD_MARKER.pack(0, b"PAD", stale, crc))
    damaged = _window_holding(path, written, pad)
    _reopen_and_check(path, written, caplog, damaged_scn=damaged)


@pytest.mark.parametrize("field_offset", [12, 13, 14, 15, 52, 55])
def test_bit_flips_in_lengths(ring: tuple[Path, Written], caplog: pytest.LogCaptureFixture,
                              field_offset: int) -> None:
    # total_length (12..15) and key_length (52..55): the header CRC catches them before
    # a length is trusted.
    path, written = ring
    starts = _window_starts(path, written)
    pos, scn = starts[5]
    raw = path.read_bytes()[META_SIZE + (pos + field_offset) % CAPACITY]
    _poke(path, pos + field_offset, bytes([raw ^ 0x40]))
    _reopen_and_check(path, written, caplog, damaged_scn=scn)


def test_random_bit_flips_never_give_a_gap(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(11)
    for trial in range(12):
        path = tmp_path / f"ring{trial}.buf"
        written = _write_laps(path, seed=trial, windows=300)
        data = bytearray(path.read_bytes())
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(written.head, written.tail)
            data[META_SIZE + pos % CAPACITY] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        caplog.clear()
        with (caplog.at_level(logging.INFO, logger="databus.relay.buffer"),
              EventBuffer(path, CAPACITY, index_every_bytes=2048) as buf):
            served = _serve_all(buf)
        original = list(written.windows)
        assert list(served) == original[: len(served)]
        assert all(served[s] == written.windows[s] for s in served)
        if len(served) < len(original):
            assert any(r.levelno >= logging.ERROR for r in caplog.records)


def test_one_torn_metadata_slot_falls_back_to_the_other(
    ring: tuple[Path, Written], caplog: pytest.LogCaptureFixture
) -> None:
    path, written = ring
    with path.open("r+b") as f:
        slots = []
        for off in _SLOT_OFFSETS:
            f.seek(off)
            slots.append(_SLOT.unpack(f.read(_SLOT.size)))
        newest = max(range(2), key=lambda i: slots[i][3])
        f.seek(_SLOT_OFFSETS[newest] + 20)
        f.write(b"\xff\xff\xff\xff")
    caplog.clear()
    with EventBuffer(path, CAPACITY, index_every_bytes=2048) as buf:
        served = _serve_all(buf)
    original = list(written.windows)
    # The older slot is at most one window behind: a prefix, nothing invented.
    assert list(served) == original[: len(served)]
    assert len(served) >= len(original) - 1


def test_both_metadata_slots_torn_starts_empty_not_from_a_guess(
    ring: tuple[Path, Written], caplog: pytest.LogCaptureFixture
) -> None:
    path, _written = ring
    with path.open("r+b") as f:
        for off in _SLOT_OFFSETS:
            f.seek(off + 8)
            f.write(b"\x00" * 8)
    with (caplog.at_level(logging.WARNING, logger="databus.relay.buffer"),
          EventBuffer(path, CAPACITY) as buf):
        state = buf.state()
        assert state.max_scn is None and state.windows == 0
        # Not started: the fetcher sets where it starts, older checkpoints fall off.
        assert state.prev_scn == -1
    assert any("no valid metadata" in r.getMessage() for r in caplog.records)


def test_truncated_file_is_refused(ring: tuple[Path, Written]) -> None:
    path, _written = ring
    with path.open("r+b") as f:
        f.truncate(META_SIZE + CAPACITY // 2)
    with pytest.raises(BufferError_, match="databus relay resize"):
        EventBuffer(path, CAPACITY)


def test_tail_window_cut_by_truncated_ring_bytes(ring: tuple[Path, Written],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # The last window's bytes zeroed (never reached the disk): it alone is dropped.
    path, written = ring
    pos, scn = _window_starts(path, written)[-1]
    _poke(path, pos, bytes(written.tail - pos))
    _reopen_and_check(path, written, caplog, damaged_scn=scn)


def test_version_1_file_is_refused_not_guessed(ring: tuple[Path, Written]) -> None:
    path, _written = ring
    with path.open("r+b") as f:
        for off in _SLOT_OFFSETS:
            f.seek(off)
            fields = list(_SLOT.unpack(f.read(_SLOT.size)))
            fields[1] = 1
            body = _SLOT.pack(*fields)[:-4]
            f.seek(off)
            f.write(body + struct.pack(">I", __import__("zlib").crc32(body)))
    with pytest.raises(BufferError_, match="format version 1"):
        EventBuffer(path, CAPACITY)


@pytest.mark.parametrize("damage", [
    # A 0x00 without a pad marker: the read path once skipped it as padding (recovery
    # had the same rule); damage under a running relay is an error, never a silent gap.
    b"\x00",
    b"\x41",  # a byte that is neither an event's magic nor a pad marker's
    b"\xdb\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10",  # total 16 < header
    b"\xdb\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x7f\xff\xff\xff",  # total 2 GiB
])
def test_reader_refuses_any_bytes_that_are_not_an_event_start(
        tmp_path: Path, damage: bytes) -> None:
    """The read path stops where the bytes cannot start an event (a first byte other
    than the magic, a length shorter than a header or past the tail): what precedes is
    served, the damage is an error, never a skip or a read past the end."""
    path = tmp_path / "ring.buf"
    with EventBuffer(path, CAPACITY) as buf:
        for i in range(5):
            buf.append_window(100 + i, [ev(100 + i, i, 100)])
        state = buf.state()
        before = _serve_all(buf)
        first_scn, first = next(iter(before.items()))
        at = (state.head + len(first)) % CAPACITY
        buf._ring[at:at + len(damage)] = damage  # damage under a running relay
        # What precedes the damage is served; the damage itself is an error.
        result = buf.read(Checkpoint.flexible(), max_bytes=1 << 20)
        assert result.data == first and result.checkpoint == Checkpoint(first_scn)
        with pytest.raises(BufferCorruptedError):
            buf.read(result.checkpoint, max_bytes=1 << 20)


@pytest.mark.parametrize("value_bytes", range(0, 48, 3))
def test_recovery_crosses_an_end_of_lap_gap_shorter_than_a_header(
        tmp_path: Path, value_bytes: int) -> None:
    """Where less than a header's bytes are left before the end of the ring, the rest
    of the lap is padding by geometry alone, whatever old bytes it holds: recovery
    passes it like the writer did, and keeps every window after it."""
    gaps = 0
    for capacity in range(1000, 1100, 7):
        path = tmp_path / f"ring-{value_bytes}-{capacity}.buf"
        with EventBuffer(path, capacity) as buf:
            for i in range(40):
                buf.append_window(10 + i, [ev(10 + i, i, value_bytes)])
                phys = buf.state().tail % capacity
                gaps += 0 < capacity - phys < HEADER_SIZE
            before = _serve_all(buf)
        with EventBuffer(path, capacity) as again:
            assert _serve_all(again) == before
    assert gaps  # the geometry case happened at least once
