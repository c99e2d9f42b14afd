"""Folding windows into batches: the latest change per key, whole windows only.

Pure: no I/O, no clock. The replicator's consumer calls ``start_window``, ``event`` for
each data event, then ``end_window``; only ``end_window`` moves the window's changes
into the batch, so a rollback of the client (``rollback``) drops exactly the window in
progress and a batch always holds whole windows. ``take`` hands the batch over to be
applied and starts the next.

Within a batch a later change of a key replaces the earlier one: an upsert carries the
whole row, a delete the key, so the latest change alone gives the target the state the
source had after the batch's last window. Key values are the target's (converted), so
two source keys the target cannot tell apart (e.g. case in a case-insensitive
collation) fold together, as the target would store them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from databus.errors import DatabusError
from databus.replicator._model import Batch, Change, TableMap

__all__ = ["Folder", "TableFold", "UnusableEventError"]

Converter = Callable[[Any], Any]


class UnusableEventError(DatabusError):
    """An event the replicator cannot turn into a row (a delete without its key, a value
    the target column cannot hold). Not retriable: it names the source, key and SCN."""

    code = "unusable_event"


class TableFold:
    """How one source's events become changes of its target table: the table map and
    a converter per column (``databus.replicator._types.converter``)."""

    def __init__(self, table: TableMap, converters: Sequence[Converter]) -> None:
        if len(converters) != len(table.columns):
            raise ValueError("one converter per column")
        self.table = table
        self._columns = [(c.source, conv) for c, conv in zip(table.columns, converters,
                                                            strict=True)]
        self._key_indexes = table.key_indexes
        self._key_sources = [table.columns[i].source for i in self._key_indexes]
        self._key_converters = [converters[i] for i in self._key_indexes]

    def change(self, *, delete: bool, key: Any, value: Mapping[str, Any] | None,
               scn: int) -> Change:
        """The change an event makes: the converted row (upsert), or the key (delete).

        A delete's key comes from its value when the source sent the old row (the
        binlog's full row image), else from the event key (one value, or a tuple in key
        column order)."""
        if not delete:
            if value is None:
                raise UnusableEventError(f"{self.table.source}: an upsert without a row "
                                         f"(key {key!r}, SCN {scn})")
            try:
                row = tuple(conv(value.get(name)) for name, conv in self._columns)
            except (TypeError, ValueError, ArithmeticError) as exc:
                raise UnusableEventError(
                    f"{self.table.source}: the row of key {key!r} (SCN {scn}) does not fit "
                    f"the target table {self.table.table}: {exc}") from None
            return Change(tuple(row[i] for i in self._key_indexes), row, scn)
        if value is not None and all(name in value for name in self._key_sources):
            raw = [value[name] for name in self._key_sources]
        else:
            raw = list(key) if isinstance(key, tuple) else [key]
            if len(raw) != len(self._key_sources):
                raise UnusableEventError(
                    f"{self.table.source}: a delete whose key {key!r} (SCN {scn}) does not "
                    f"match the key columns {', '.join(self.table.key)}")
        try:
            converted = tuple(conv(v) for conv, v in zip(self._key_converters, raw,
                                                         strict=True))
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise UnusableEventError(f"{self.table.source}: the key {key!r} (SCN {scn}) "
                                     f"does not fit the target: {exc}") from None
        return Change(converted, None, scn)


class Folder:
    """Whole windows folded into a ``Batch`` (module docstring)."""

    def __init__(self, folds: Mapping[str, TableFold]) -> None:
        self.folds = dict(folds)
        self.batch = Batch()
        self._window: list[tuple[str, Change]] = []
        self._window_events = 0
        self._in_window = False
        self.skipped = 0  # events of sources no table map names

    @property
    def pending_rows(self) -> int:
        return self.batch.rows

    @property
    def in_window(self) -> bool:
        return self._in_window

    def start_window(self) -> None:
        self._window.clear()
        self._window_events = 0
        self._in_window = True

    def event(self, source: str, *, delete: bool, key: Any, value: Mapping[str, Any] | None,
              scn: int) -> None:
        fold = self.folds.get(source)
        if fold is None:
            self.skipped += 1
            return
        self._window.append((source, fold.change(delete=delete, key=key, value=value,
                                                 scn=scn)))
        self._window_events += 1

    def end_window(self, scn: int) -> None:
        """The window is whole: its changes join the batch (the latest per key wins)."""
        changes = self.batch.changes
        for source, change in self._window:
            changes.setdefault(source, {})[change.key] = change
        self.batch.scn = scn
        self.batch.windows += 1
        self.batch.events += self._window_events
        self._window.clear()
        self._window_events = 0
        self._in_window = False

    def rollback(self) -> None:
        """Drop the window in progress (the client replays it)."""
        self._window.clear()
        self._window_events = 0
        self._in_window = False

    def take(self) -> Batch:
        """The batch so far (whole windows), and a new empty one."""
        batch, self.batch = self.batch, Batch()
        return batch

    def replace(self, source: str, fold: TableFold) -> None:
        """A new table map for ``source`` (a schema change): call with an empty batch."""
        if self.batch.changes.get(source):
            raise RuntimeError("flush the batch before its table map changes")
        self.folds[source] = fold
