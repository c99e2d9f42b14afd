"""Crash-safe file replacement, shared by every component that keeps a small state file
(the relay's catalog, the client's file checkpoint store)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path


def temp_name(path: Path) -> Path:
    """A unique temp file next to ``path``: ``.<name>.<16 hex>.tmp``."""
    return path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")


def write_atomically(path: Path, data: bytes, *, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data`` so that a crash at any point leaves either the old
    or the new content: write a temp file, fsync, rename over, fsync the directory.
    ``mode`` is filtered by the umask, as with ``open()``."""
    while True:
        tmp = temp_name(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            break
        except FileExistsError:  # 64 random bits: in practice never
            continue
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # Also on KeyboardInterrupt: never leave our own temp file behind.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems cannot fsync a directory; they order the rename themselves.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)
