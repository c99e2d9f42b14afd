"""Leadership epochs kept with a buffer (pure, plus one small file).

A relay cluster in leader-follower mode numbers each leadership term of a buffer: the
epoch, one more than the last, taken in ZooKeeper by the member that won the buffer's
election (``_member``). The buffer keeps its **epoch history**: the list of
``(epoch, after_scn)``, meaning "the windows after ``after_scn`` were written in
``epoch``" (``after_scn`` None: from the buffer's start), ordered by both. It answers
"which term wrote the window at SCN s" and it travels with the windows: a follower
takes its leader's history whole (``follow``), so every member agrees on the epoch of
every SCN it holds, also for windows that reached it through a member that was not
the leader, or that it wrote itself in an older term and the leader read again
(Kafka's leader-epoch cache is the same idea).

The file (``<data_dir>/<buffer>.epochs.json``) is written atomically (temp file,
fsync, rename) before the term writes its first window: a crash between the two leaves
an entry with no window after it, which is harmless.

Fencing is checked against it: no entry may have a smaller epoch than the one before
(``append`` refuses), so a window of an old term can never follow one of a newer term
in the same buffer.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
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
        # The leader's term starts in the contender thread, a follower takes its
        # leader's history in the fetcher and the watcher threads.
        self._lock = threading.Lock()
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
        return _epoch_of(self._entries, scn)

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
        with self._lock:
            if self._entries and self._entries[-1].epoch == epoch:
                return
            entry = EpochEntry(epoch, after_scn)
            self._check(entry)
            # A new list, never changed in place: readers take the reference whole.
            self._entries = [*self._entries, entry]
            self._save()

    def follow(self, upstream: Sequence[EpochEntry],
               held: int | None) -> tuple[int | None, int] | None:
        """A follower takes its leader's history whole: the leader's says which term
        wrote each window, for the windows this member copied from it (through any
        member in between) and for those it holds from a term of its own that the
        leader read again from the source, with the same SCNs, in a newer term. So every
        member agrees on the epoch of every window.

        Refused (nothing changes, None) when ``upstream`` is empty or its newest epoch
        is older than this history's (a member that is not, or not yet, the leader: a
        history never goes back to an older epoch). Returns, when windows held here (up
        to SCN ``held``) changed epoch, the range ``(after, up_to)`` of their SCNs."""
        entries = list(upstream)
        for before, after in itertools.pairwise(entries):
            EpochHistory([before])._check(after)
        with self._lock:
            if not entries or entries[-1].epoch < self.current or entries == self._entries:
                return None
            mine = self._entries
            self._entries = entries
            self._save()
        if held is None:
            return None
        moved = [s for s in _starts(mine, entries) if s is None or s < held]
        changed = [s for s in moved
                   if _epoch_in(mine, s) != _epoch_in(entries, s)]
        if not changed:
            return None
        low = None if None in changed else min(s for s in changed if s is not None)
        return low, held

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


def _epoch_of(entries: Sequence[EpochEntry], scn: int) -> int:
    found = 0
    for entry in entries:
        if entry.after_scn is None or scn > entry.after_scn:
            found = entry.epoch
        else:
            break
    return found


def _epoch_in(entries: Sequence[EpochEntry], after: int | None) -> int:
    """The epoch of the windows just after ``after`` (None: the first window)."""
    if after is None:
        return entries[0].epoch if entries and entries[0].after_scn is None else 0
    return _epoch_of(entries, after + 1)


def _starts(*histories: Sequence[EpochEntry]) -> set[int | None]:
    """Every SCN after which some history's epoch changes."""
    return {e.after_scn for entries in histories for e in entries}
