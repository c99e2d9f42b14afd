"""Checkpoint stores: where a consumer keeps its checkpoint between runs (DESIGN 3 and 10).

Servers keep no consumer state, so a consumer's checkpoint is the only record of how far
it got. Every store implements ``CheckpointStore``:

- ``load()`` returns the stored checkpoint, ``None`` when nothing was ever stored, and
  raises ``CheckpointError`` when what is stored is unreadable. It never turns damage
  into ``None``: that would restart the consumer from its start position without
  anybody noticing.
- ``store(checkpoint)`` is durable when it returns.
- ``close()`` releases connections. It is idempotent. Any other call after it raises
  ``DatabusError``.

The methods block and are thread-safe. The async client calls them through
``asyncio.to_thread``. This module has the interface and the memory and file stores;
``_checkpoint_postgres`` and ``_checkpoint_zookeeper`` the server-backed ones, and
``_checkpoint_envelope`` the bytes the file, PostgreSQL and ZooKeeper stores keep.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

from databus._fileio import write_atomically
from databus.checkpoint import Checkpoint
from databus.client._checkpoint_envelope import MAX_ENVELOPE_BYTES, decode_envelope, encode_envelope
from databus.errors import CheckpointError, ConfigError, DatabusError

__all__ = ["CheckpointStore", "FileCheckpointStore", "MemoryCheckpointStore"]

log = logging.getLogger("databus.client.checkpoint")


# --------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------


class CheckpointStore(ABC):
    """Where a consumer's checkpoint lives between runs. Blocking, thread-safe."""

    _closed: bool = False

    @abstractmethod
    def load(self) -> Checkpoint | None:
        """The stored checkpoint, or ``None`` if none was ever stored.

        Raises ``CheckpointError`` if what is stored is damaged or unreadable (never
        ``None``), and ``ConnectionLostError`` (retriable) if the store's server is
        unreachable.
        """

    @abstractmethod
    def store(self, checkpoint: Checkpoint) -> None:
        """Replace the stored checkpoint. Durable when it returns.

        On failure the previous checkpoint is still there.
        """

    def close(self) -> None:
        """Release connections. Idempotent. The store is unusable afterwards."""
        self._closed = True

    def _check_open(self) -> None:
        # The same rule for every store. Otherwise a test run on MemoryCheckpointStore
        # would let through a use-after-close that fails with the PostgreSQL store.
        if self._closed:
            raise DatabusError(f"{self!r} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _require_checkpoint(checkpoint: object) -> None:
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"store() takes a Checkpoint, got {type(checkpoint).__name__}")


# --------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------


class MemoryCheckpointStore(CheckpointStore):
    """In-process only, for tests and examples. ``initial`` is what ``load`` first returns."""

    def __init__(self, initial: Checkpoint | None = None) -> None:
        if initial is not None:
            _require_checkpoint(initial)
        self._lock = threading.Lock()
        self._checkpoint = initial
        self.stores = 0
        """How many times ``store`` was called. Tests use it to check the checkpoint cadence."""

    def load(self) -> Checkpoint | None:
        with self._lock:
            self._check_open()
            return self._checkpoint

    def store(self, checkpoint: Checkpoint) -> None:
        _require_checkpoint(checkpoint)
        with self._lock:
            self._check_open()
            self._checkpoint = checkpoint
            self.stores += 1

    def close(self) -> None:
        with self._lock:
            super().close()

    def __repr__(self) -> str:
        return f"MemoryCheckpointStore({self._checkpoint!r})"


# --------------------------------------------------------------------------------------
# File
# --------------------------------------------------------------------------------------

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
# errnos after which trying again later cannot help. Anything else (ENOSPC, EIO,
# EDQUOT...) may clear up, so the error is marked retriable.
_PERMANENT_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG,
     errno.ELOOP}
)


def _os_error(message: str, exc: OSError) -> CheckpointError:
    return CheckpointError(f"{message}: {exc.strerror or exc}",
                           retriable=exc.errno not in _PERMANENT_ERRNOS)


class FileCheckpointStore(CheckpointStore):
    """The checkpoint in ``<directory>/<name>.json``. The directory is created if missing.

    A write goes to a fresh temp file in the same directory. The file is flushed and
    fsynced, renamed over the old one with ``os.replace`` (atomic on POSIX), and then the
    directory is fsynced so that the rename itself survives a power cut. A crash at any
    point leaves either the previous checkpoint or the new one, never a mix. A crash
    before the rename also leaves a temp file, ``.<name>.json.<16 hex>.tmp``, which
    ``load`` ignores and the next store instance deletes.

    Writers take an exclusive ``flock`` on ``.<name>.json.lock``. Threads and processes
    sharing the file are therefore serialized. The cleanup also holds that lock, so it can
    only delete temp files whose writer is gone: the kernel drops the lock of a killed
    process. Nothing depends on pids or file ages.
    """

    def __init__(self, directory: str | os.PathLike[str], name: str = "checkpoint") -> None:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ConfigError(
                f"checkpoint name {name!r} must be 1-200 characters from A-Z a-z 0-9 _ . - "
                "and start with a letter or digit (it becomes a file name)"
            )
        self.directory = Path(directory)
        self.name = name
        self.path = self.directory / f"{name}.json"
        self._lock_path = self.directory / f".{name}.json.lock"
        self._temp_re = re.compile(rf"\.{re.escape(name)}\.json\.[0-9a-f]{{16}}\.tmp")
        self._lock = threading.Lock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error(f"cannot create checkpoint directory {self.directory}", exc) from None
        self._remove_stale_temp_files()

    def __repr__(self) -> str:
        return f"FileCheckpointStore({str(self.path)!r})"

    @property
    def _recovery(self) -> str:
        return (
            f"Restore {self.path} from a backup, or delete it to deliberately start without "
            "a checkpoint. The consumer will not start over on its own."
        )

    def load(self) -> Checkpoint | None:
        self._check_open()
        # No lock needed: os.replace swaps the whole file atomically, so a reader always
        # sees one complete version.
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_ENVELOPE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error(f"cannot read checkpoint file {self.path}", exc) from None
        return decode_envelope(raw, where=f"checkpoint file {self.path}",
                               recovery=self._recovery)

    def store(self, checkpoint: Checkpoint) -> None:
        _require_checkpoint(checkpoint)
        data = encode_envelope(checkpoint)
        with self._lock:
            self._check_open()
            try:
                with self._exclusive():
                    write_atomically(self.path, data)
            except OSError as exc:
                raise _os_error(f"cannot write checkpoint file {self.path}", exc) from None

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the cross-process lock on ``.<name>.json.lock``.

        The kernel releases the lock when the holder dies, even by SIGKILL.
        """
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _remove_stale_temp_files(self) -> None:
        try:
            with self._lock, self._exclusive():
                # While we hold the lock no writer is between creating and renaming its
                # temp file, so every temp file present belongs to an interrupted write.
                stale = [p for p in self.directory.iterdir() if self._temp_re.fullmatch(p.name)]
                for path in stale:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
        except OSError as exc:
            raise _os_error(f"cannot clean up checkpoint directory {self.directory}",
                            exc) from None
        if stale:
            log.info("%s: removed %d temp file(s) left by an interrupted write",
                     self.directory, len(stale))


