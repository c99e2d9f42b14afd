"""Safe start (DESIGN 17): a file lock that says "this process runs it".

A daemon takes it after its config is valid and its ports are bound, and before it
takes any fencing token, slot or lease or writes anything (docs/operations.md, "Safe
start"): a second instance started by mistake then fails in one line
(``AlreadyRunningError``, naming the holder's pid) and changes nothing of the first.

``flock`` on ``path``, held by an open file description for the life of the process:
the kernel releases it when the process ends, however it ends (a SIGKILL included), so
a stale lock never needs deleting. The file holds the holder's pid (informational).
The descriptor is not inherited by child processes (a relay's workers), so it is the
main process's alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from databus.errors import AlreadyRunningError

__all__ = ["Hold", "hold"]


class Hold:
    """A held lock file; ``release()`` (or the process's end) lets it go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def hold(path: Path, what: str, fix: str) -> Hold:
    """Take the lock on ``path`` or raise ``AlreadyRunningError``: "``what`` is held by
    process N; ``fix``"."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = os.pread(fd, 32, 0).decode().strip()
        os.close(fd)
        by = f"process {holder}" if holder.isdigit() else "another process"
        raise AlreadyRunningError(f"{what} is held by {by} ({path}); {fix}") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return Hold(path, fd)
