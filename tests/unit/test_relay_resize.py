"""``databus relay resize`` (issue 28 item 4, DESIGN 17): a buffer's capacity changed
offline, keeping every window byte for byte, both ways; a shrink that would lose a
window refused with the capacity that keeps them all; a crashed resize's leftover copy
harmless; a window larger than the buffer says the capacity it needs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from databus.checkpoint import Checkpoint
from databus.config import load_config
from databus.event import Op, encode_dump_marker, encode_event
from databus.relay._buffer import EventBuffer, WindowTooLargeError
from databus.relay._relay import buffer_path
from databus.relay._resize import ResizeError, resize_buffer

pytestmark = pytest.mark.twin("databus.batch")

MIB = 1 << 20


def _config(tmp_path: Path, capacity_mb: int) -> Path:
    path = tmp_path / "relay.toml"
    path.write_text(f"""
[relay]
data_dir = "{tmp_path / 'data'}"

[[relay.buffers]]
name = "shop"
capacity_mb = {capacity_mb}
source = "synthetic://?rate=1"
""")
    return path


def _fill(buffer: EventBuffer, windows: int, rng: random.Random) -> None:
    buffer.start_after(99)
    for i in range(windows):
        scn = 100 + i * 3
        buffer.start_window(scn)
        for k in range(rng.randint(1, 5)):
            buffer.append(encode_event(scn=scn, source_id=1 + k % 2, op=Op.UPSERT,
                                       key=i * 10 + k, value=rng.randbytes(rng.randint(10, 3000)),
                                       timestamp_ns=1_700_000_000_000_000_000 + scn))
        if i % 50 == 7:
            buffer.append_control(encode_dump_marker(
                scn=scn, kind="start", source="shop.a", dump_id=f"d{i}"))
        buffer.end_window(1_700_000_000_000_000_000 + scn)


def _everything(buffer: EventBuffer) -> tuple[bytes, list[int], int, int | None, int | None]:
    """Every byte served from the start, each window's SCN, prev/min/max SCN."""
    state = buffer.state()
    data, position, scns = b"", Checkpoint(state.prev_scn), []
    while True:
        result = buffer.read(position, max_bytes=4 * MIB)
        if not result.data:
            break
        data += bytes(result.data)
        position = result.checkpoint
    from databus.event import iter_events

    scns = [h.scn for _, h in iter_events(data) if h.source_id == -2]
    return data, scns, state.prev_scn, state.min_scn, state.max_scn


def _lookups(buffer: EventBuffer, scns: list[int]) -> list[bytes]:
    """What a consumer at each SCN is served next (the SCN index at work)."""
    return [bytes(buffer.read(Checkpoint(s), max_bytes=20_000).data) for s in scns[::37]]


@pytest.mark.parametrize("new_mb", [4, 2])
def test_resize_up_and_down_keeps_every_window_byte_for_byte(tmp_path: Path,
                                                             new_mb: int) -> None:
    config = load_config(_config(tmp_path, 3)).relay
    assert config is not None
    path = buffer_path(config.data_dir, "shop")
    with EventBuffer(path, 3 * MIB) as buffer:
        _fill(buffer, 250, random.Random(7))  # about 1.4 MiB: fits in 2 MiB too
        before = _everything(buffer)
        lookups = _lookups(buffer, before[1])
    assert len(before[1]) == 250
    done = resize_buffer(config, "shop", new_mb)
    assert (done.windows, done.min_scn, done.max_scn) == (250, 100, 100 + 249 * 3)
    assert path.stat().st_size == 4096 + new_mb * MIB
    with EventBuffer(path, new_mb * MIB) as buffer:
        assert _everything(buffer) == before
        assert _lookups(buffer, before[1]) == lookups
        # The fetcher goes on from its max SCN.
        buffer.append_window(2000, [encode_event(scn=2000, source_id=1, op=Op.UPSERT, key=1,
                                                 value=b"after")])
        assert buffer.state().max_scn == 2000 and buffer.state().min_scn == 100
    # The old capacity is now refused, and the message says how to change it.
    with pytest.raises(Exception, match="databus relay resize"):
        EventBuffer(path, 3 * MIB)


def test_a_shrink_that_would_lose_windows_is_refused_with_the_capacity_that_keeps_them(
        tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, 4)).relay
    assert config is not None
    path = buffer_path(config.data_dir, "shop")
    with EventBuffer(path, 4 * MIB) as buffer:
        _fill(buffer, 500, random.Random(3))  # about 2.7 MiB
        before = _everything(buffer)
    with pytest.raises(ResizeError, match=r"smallest capacity that keeps every window is "
                                          r"\d+ MiB") as info:
        resize_buffer(config, "shop", 1)
    needed = int(str(info.value).split("keeps every window is ")[1].split(" MiB")[0])
    assert 2 <= needed <= 4
    assert not path.with_name("shop.buf.resize").exists()
    with EventBuffer(path, 4 * MIB) as buffer:  # untouched
        assert _everything(buffer) == before
    resize_buffer(config, "shop", needed)  # the capacity it named does keep them all
    with EventBuffer(path, needed * MIB) as buffer:
        assert _everything(buffer) == before


def test_a_crashed_resizes_leftover_copy_is_harmless(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, 2)).relay
    assert config is not None
    path = buffer_path(config.data_dir, "shop")
    with EventBuffer(path, 2 * MIB) as buffer:
        _fill(buffer, 20, random.Random(1))
        before = _everything(buffer)
    path.with_name("shop.buf.resize").write_bytes(b"half a copy")
    resize_buffer(config, "shop", 3)
    assert not path.with_name("shop.buf.resize").exists()
    with EventBuffer(path, 3 * MIB) as buffer:
        assert _everything(buffer) == before


def test_unknown_buffer_and_missing_file_are_clear(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, 2)).relay
    assert config is not None
    with pytest.raises(Exception, match="no buffer 'nope'"):
        resize_buffer(config, "nope", 2)
    with pytest.raises(ResizeError, match="no file yet"):
        resize_buffer(config, "shop", 2)


def test_a_window_larger_than_the_buffer_names_the_capacity_it_needs(tmp_path: Path) -> None:
    with EventBuffer(tmp_path / "b.buf", MIB) as buffer:
        events = [encode_event(scn=5, source_id=1, op=Op.UPSERT, key=k, value=b"v" * 60_000)
                  for k in range(40)]  # about 2.3 MiB
        with pytest.raises(WindowTooLargeError) as info:
            buffer.append_window(5, events)
        assert info.value.needed_mb == 3
        assert "capacity_mb >= 3" in str(info.value)
        assert "databus relay resize" in str(info.value)
        assert buffer.state().max_scn is None  # nothing of it kept
    with EventBuffer(tmp_path / "c.buf", info.value.needed_mb * MIB) as bigger:
        bigger.append_window(5, events)  # the capacity it named holds it
        assert bigger.state().max_scn == 5
