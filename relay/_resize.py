"""``databus relay resize``: a buffer's capacity changed in place, offline, keeping every
window (DESIGN 17, "Recovery without deleting data"; docs/relay.md, "Resizing a buffer").

The relay must be stopped (its data dir is held while it runs: ``databus._hold``). The
buffer file is opened at the capacity it has (recovery checks every window's CRCs, as a
relay start does), every window is copied in order through the buffer's own writer API
into ``<buffer>.buf.resize`` at the new capacity (data events, dump and quarantine
markers, each window's EOW rebuilt from the same events and commit time, so the windows
are byte for byte the same), the copy is checked (same SCNs, same window count, same
``prev_scn``) and fsynced, then renamed over the old file. A crash before the rename
leaves the old file as it was (the next resize removes the leftover copy); the rename is
atomic. A shrink that cannot keep every window is refused, naming the smallest
``capacity_mb`` that keeps them all; so is a window that the new capacity cannot hold.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from databus.checkpoint import Checkpoint
from databus.config import RelayConfig
from databus.errors import ConfigError, DatabusError
from databus.event import EOW_SOURCE_ID, iter_events
from databus.relay._buffer import META_SIZE, EventBuffer, WindowTooLargeError, capacity_mb_for

__all__ = ["ResizeError", "ResizeResult", "resize_buffer"]

_MIB = 1 << 20
_READ_BYTES = 16 * _MIB


class ResizeError(DatabusError):
    """A resize that would lose a window, or of a buffer that is not there."""

    code = "resize_refused"


@dataclass(frozen=True, slots=True)
class ResizeResult:
    buffer: str
    old_capacity_mb: float
    new_capacity_mb: int
    windows: int
    min_scn: int | None
    max_scn: int | None
    used_bytes: int


def _copy(old: EventBuffer, new: EventBuffer) -> tuple[int, int, int]:
    """Every window of ``old`` into ``new``, in order; (windows, event bytes, largest
    window's bytes)."""
    state = old.state()
    new.start_after(state.prev_scn)
    position = Checkpoint(state.prev_scn) if state.prev_scn >= 0 else Checkpoint.flexible()
    windows = total = largest = 0
    window_bytes = 0
    open_window = False
    while True:
        result = old.read(position, max_bytes=_READ_BYTES)
        if not result.data:
            break
        data = result.data
        for offset, header in iter_events(data):
            event = bytes(data[offset:offset + header.total_length])
            if not open_window:
                new.start_window(header.scn)
                open_window, window_bytes = True, 0
            window_bytes += len(event)
            if header.source_id == EOW_SOURCE_ID:
                new.end_window(header.timestamp_ns)
                open_window = False
                windows += 1
                total += window_bytes
                largest = max(largest, window_bytes)
            elif header.source_id < 0:
                new.append_control(event)
            else:
                new.append(event)
        position = result.checkpoint
    return windows, total, largest


def resize_buffer(config: RelayConfig, name: str, capacity_mb: int) -> ResizeResult:
    """Resize buffer ``name`` of ``config``'s relay to ``capacity_mb``, keeping every
    window; the caller holds the relay's data dir (the relay is stopped)."""
    from databus.relay._relay import buffer_path

    configured = {b.name: (i, b) for i, b in enumerate(config.buffers)}
    if name not in configured:
        raise ConfigError(f"no buffer {name!r} in the config (buffers: "
                          f"{', '.join(configured) or 'none'})")
    if not 1 <= capacity_mb <= 1 << 20:
        raise ConfigError("--capacity-mb must be between 1 and 1048576")
    partition_id, buffer_config = configured[name]
    path = buffer_path(config.data_dir, name)
    if not path.exists():
        raise ResizeError(f"buffer {name} has no file yet ({path}): nothing to resize; set "
                          "capacity_mb in the config and start the relay")
    scratch = path.with_name(path.name + ".resize")
    scratch.unlink(missing_ok=True)  # a crashed resize's copy: never the buffer itself
    old_capacity = path.stat().st_size - META_SIZE
    new_capacity = capacity_mb * _MIB
    with EventBuffer(path, old_capacity, index_every_bytes=buffer_config.index_every_bytes,
                     partition_id=partition_id) as old:
        before = old.state()
        try:
            with EventBuffer(scratch, new_capacity,
                             index_every_bytes=min(buffer_config.index_every_bytes,
                                                   new_capacity // 2),
                             partition_id=partition_id) as new:
                try:
                    windows, total, largest = _copy(old, new)
                except WindowTooLargeError as exc:
                    raise ResizeError(
                        f"buffer {name}: a window of {exc.window_bytes:,} bytes does not fit "
                        f"in {capacity_mb} MiB; the smallest capacity that keeps every "
                        f"window is {capacity_mb_for(before.used_bytes, largest)} MiB") from None
                after = new.state()
                if (after.min_scn, after.max_scn, after.windows, windows) != (
                        before.min_scn, before.max_scn, before.windows, before.windows):
                    raise ResizeError(
                        f"buffer {name}: its {before.windows:,} windows ({total:,} bytes) do "
                        f"not all fit in {capacity_mb} MiB; the smallest capacity that keeps "
                        f"every window is {capacity_mb_for(total, largest)} MiB (or more)")
                new.flush()
            fd = os.open(scratch, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            scratch.unlink(missing_ok=True)
            raise
    os.replace(scratch, path)
    _fsync_dir(path.parent)
    return ResizeResult(name, old_capacity / _MIB, capacity_mb, before.windows,
                        before.min_scn, before.max_scn, total)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
