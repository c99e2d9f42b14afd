"""Leadership epochs kept with a buffer (pure, plus one small file).

A relay cluster in leader-follower mode numbers each leadership term of a buffer: the
epoch, one more than the last, taken in ZooKeeper by the member that won the buffer's
election (``_member``). The buffer keeps its **epoch history**: the list of
``(epoch, after_scn)``, meaning "the windows after ``after_scn`` were written in
``epoch``" (``after_scn`` None: from the buffer's start), ordered by both. It answers
"which term wrote the window at SCN s" and it travels with the windows: a follower
copies its upstream's entries for the windows it copies, so every member agrees on
the epoch of every SCN it holds (Kafka's leader-epoch cache is the same idea).

The file (``<data_dir>/<buffer>.epochs.json``) is written atomically (temp file,
fsync, rename) before the term writes its first window: a crash between the two leaves
an entry with no window after it, which is harmless.

Fencing is checked against it: no entry may have a smaller epoch than the one before
(``append`` refuses), so a window of an old term can never follow one of a newer term
in the same buffer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from databus.errors import DatabusError

__all__ = ["EpochEntry", "EpochHistory", "StaleEpochError"]


class StaleEpochError(DatabusError):
    """A term older than the buffer's newest tried to write (fencing)."""

    code = "stale_epoch"


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    after_scn: int | None  # the windows after this SCN (None: from the start)

    def to_json(self) -> list[int | None]:
        return [self.epoch, self.after_scn]


class EpochHistory:
    """A buffer's epoch history (module docstring); ``path`` None keeps it in memory."""

    def __init__(self, entries: Iterable[EpochEntry] = (), path: Path | None = None) -> None:
        self.path = path
        self._entries: list[EpochEntry] = []
        for entry in entries:
            self._check(entry)
            self._entries.append(entry)

    @classmethod
    def load(cls, path: Path) -> EpochHistory:
        """The history in ``path``; empty when the file does not exist."""
        try:
            raw = json.loads(path.read_text())
            entries = [EpochEntry(int(e), None if a is None else int(a)) for e, a in raw]
        except FileNotFoundError:
            entries = []
        except (ValueError, TypeError) as exc:
            raise DatabusError(f"epoch history {path} is damaged: {exc}") from None
        return cls(entries, path)

    @property
    def entries(self) -> Sequence[EpochEntry]:
        return tuple(self._entries)

    @property
    def current(self) -> int:
        """The newest epoch (0: none yet, a buffer that never had a leader)."""
        return self._entries[-1].epoch if self._entries else 0

    def epoch_of(self, scn: int) -> int:
        """The epoch that wrote the window at ``scn`` (0 before any entry)."""
        found = 0
        for entry in self._entries:
            if entry.after_scn is None or scn > entry.after_scn:
                found = entry.epoch
            else:
                break
        return found

    def _check(self, entry: EpochEntry) -> None:
        if not self._entries:
            return
        last = self._entries[-1]
        if entry.epoch < last.epoch:
            raise StaleEpochError(f"epoch {entry.epoch} is older than the buffer's epoch "
                                  f"{last.epoch}: a fenced leader may not write")
        if (entry.after_scn is not None and last.after_scn is not None
                and entry.after_scn < last.after_scn) or (
                entry.after_scn is None and last.after_scn is not None):
            raise DatabusError(f"epoch {entry.epoch} starts after SCN {entry.after_scn}, "
                               f"before epoch {last.epoch}'s {last.after_scn}")

    def append(self, epoch: int, after_scn: int | None) -> None:
        """A new term from the windows after ``after_scn`` on; saved before it returns.
        The same epoch again (a follower copying what it has) changes nothing."""
        if self._entries and self._entries[-1].epoch == epoch:
            return
        entry = EpochEntry(epoch, after_scn)
        self._check(entry)
        self._entries.append(entry)
        self._save()

    def adopt(self, upstream: Sequence[EpochEntry], after_scn: int | None) -> None:
        """A follower about to copy the windows after ``after_scn`` from an upstream
        with history ``upstream``: take the upstream's epoch of the first window it
        will copy and every newer entry."""
        for entry in upstream:
            if entry.epoch <= self.current:
                continue
            start = entry.after_scn
            if after_scn is not None and (start is None or start < after_scn):
                start = after_scn
            self.append(entry.epoch, start)

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump([e.to_json() for e in self._entries], f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def to_json(self) -> list[list[int | None]]:
        return [e.to_json() for e in self._entries]
