"""Folding windows into batches: the latest change per key, whole windows only.

Pure: no I/O, no clock. The replicator's consumer calls ``start_window``, ``add`` for
each data event, then ``end_window``; only ``end_window`` moves the window's events
into the batch, so a rollback of the client (``rollback``) drops exactly the window in
progress and a batch always holds whole windows. ``materialize`` turns the batch's
surviving events into changes (rows for the target) before it is applied; ``take``
hands the batch over and starts the next.

Within a batch a later change of a key replaces the earlier one: an upsert carries the
whole row, a delete the key, so the latest change alone gives the target the state the
source had after the batch's last window. Key values are the target's (converted), so
two source keys the target cannot tell apart (e.g. case in a case-insensitive
collation) fold together, as the target would store them.

Fold before decode (issue 30). An event's key is in its header (``event.key``: the
source's key columns, in key order, the form a delete without its old row carries); only
the key is converted as the event arrives (the table's key converters, cheap), and the
*event* is kept per converted key until the batch is applied. ``materialize`` reads
``event.value`` (a lazy decode in the client) and converts the row of the survivors only
(or, when the compiled reader has a plan for the table, reads the row straight from the
event's Avro bytes: ``_avrorow.py``): a key updated a hundred times in a batch costs one
decode and one row conversion, not a hundred. The events of the batch are kept in order
beside it, so that when an event key turns out not to be the row's key (a table map
whose ``key`` is not the source's primary key, or key columns in another order, or an
event key the key converters refuse) the table's batch is folded again the old way
(every event decoded, folded on the key its row holds) and that table stays on the old
way for the rest of the run: the result never depends on which way was taken.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from databus.errors import DatabusError
from databus.replicator import _avrorow
from databus.replicator._model import Batch, Change, TableMap

__all__ = ["Folder", "TableFold", "UnusableEventError"]

Converter = Callable[[Any], Any]


class UnusableEventError(DatabusError):
    """An event the replicator cannot turn into a row (a delete without its key, a value
    the target column cannot hold). Not retriable: it names the source, key and SCN."""

    code = "unusable_event"


_CONVERT_ERRORS = (TypeError, ValueError, ArithmeticError)
_NO_PLAN_YET: Any = object()


def _plain(conv: Converter) -> tuple[Converter | None, bool]:
    """(the function to call on a value that is not None or None for identity, whether
    the None test is done by the caller): ``converter``'s wrapper is skipped."""
    from databus.replicator._types import is_identity

    if is_identity(conv):
        return None, True
    inner = getattr(conv, "__wrapped__", None)
    if inner is not None:
        return inner, True
    return conv, False


class TableFold:
    """How one source's events become changes of its target table: the table map and
    a converter per column (``databus.replicator._types.converter``)."""

    def __init__(self, table: TableMap, converters: Sequence[Converter]) -> None:
        if len(converters) != len(table.columns):
            raise ValueError("one converter per column")
        self.table = table
        self._columns = [(c.source, conv) for c, conv in zip(table.columns, converters,
                                                            strict=True)]
        self._converters = list(converters)
        # Writer schema fingerprint -> its plan for rows straight from Avro bytes.
        self._plans: dict[int, Any] = {}
        self._names = [c.source for c in table.columns]
        # (index, function, whether None skips it) of every column that is not identity.
        self._convert: list[tuple[int, Converter, bool]] = []
        for i, conv in enumerate(converters):
            plain, none_skips = _plain(conv)
            if plain is not None:
                self._convert.append((i, plain, none_skips))
        self.key_indexes = table.key_indexes
        self._key_sources = [table.columns[i].source for i in self.key_indexes]
        self._key_converters = [converters[i] for i in self.key_indexes]
        self._single_key = len(self.key_indexes) == 1
        from databus.replicator._types import is_identity

        # A one-column key whose converter gives values back as they are (ints): the
        # event key is the fold key as it is.
        self._key_as_is = self._single_key and is_identity(self._key_converters[0])
        # Whether event keys are folded on before the values are decoded (module
        # docstring); False once an event key did not match its row's key.
        self.by_event_key = True

    def row(self, value: Mapping[str, Any], key: Any, scn: int) -> tuple[Any, ...]:
        """The converted row of an upsert's value (every column, in table order)."""
        get = value.get
        row = [get(name) for name in self._names]
        try:
            for i, conv, none_skips in self._convert:
                v = row[i]
                if v is not None or not none_skips:
                    row[i] = conv(v)
        except _CONVERT_ERRORS as exc:
            raise UnusableEventError(
                f"{self.table.source}: the row of key {key!r} (SCN {scn}) does not fit "
                f"the target table {self.table.table}: {exc}") from None
        return tuple(row)

    def row_of(self, event: Any) -> tuple[Any, ...]:
        """The converted row of an upsert event: straight from its Avro bytes when the
        compiled reader has a plan for its writer schema (``_avrorow.py``), else from
        ``event.value`` (decoded by the client) through ``row``. Both give the same."""
        if _avrorow.native is not None:
            data = getattr(event, "value_bytes", None)
            schema = getattr(event, "schema", None)
            if data is not None and schema is not None:
                plan = self._plans.get(schema.fingerprint, _NO_PLAN_YET)
                if plan is _NO_PLAN_YET:
                    plan = self._plans[schema.fingerprint] = _avrorow.plan_for(
                        schema.schema, self._names, self._converters)
                if plan is not None:
                    row: tuple[Any, ...] | None = _avrorow.native.row(data, plan)
                    if row is not None:
                        return row
        value = event.value
        if value is None:
            raise UnusableEventError(f"{self.table.source}: an upsert without a row "
                                     f"(key {event.key!r}, SCN {event.scn})")
        return self.row(value, event.key, event.scn)

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
            row = self.row(value, key, scn)
            return Change(tuple([row[i] for i in self.key_indexes]), row, scn)
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
        except _CONVERT_ERRORS as exc:
            raise UnusableEventError(f"{self.table.source}: the key {key!r} (SCN {scn}) "
                                     f"does not fit the target: {exc}") from None
        return Change(converted, None, scn)

    def event_key(self, key: Any) -> tuple[Any, ...] | None:
        """The target key an event key stands for (converted), or None when it cannot
        say (a tuple of another length, a value the key converters refuse)."""
        if self._key_as_is and type(key) is not tuple:
            return (key,)
        if self._single_key:
            if isinstance(key, tuple):
                if len(key) != 1:
                    return None
                key = key[0]
            try:
                return (self._key_converters[0](key),)
            except _CONVERT_ERRORS:
                return None
        if not isinstance(key, tuple) or len(key) != len(self._key_converters):
            return None
        try:
            return tuple([conv(v) for conv, v in zip(self._key_converters, key,
                                                     strict=True)])
        except _CONVERT_ERRORS:
            return None


@dataclass(slots=True)
class _Given:
    """An event given by its parts (``Folder.event``): what ``add`` reads of one."""

    source: str
    is_delete: bool
    key: Any
    value: Mapping[str, Any] | None
    scn: int


class _Pending:
    """One source's part of the batch before ``materialize``: the latest event per
    converted event key, and every event of the batch in order (for a fold again)."""

    __slots__ = ("events", "latest")

    def __init__(self) -> None:
        self.latest: dict[tuple[Any, ...], Any] = {}
        self.events: list[Any] = []


class Folder:
    """Whole windows folded into a ``Batch`` (module docstring)."""

    def __init__(self, folds: Mapping[str, TableFold]) -> None:
        self.folds = dict(folds)
        self.batch = Batch()
        self._pending: dict[str, _Pending] = {}
        # The window in progress: (source, fold key or None, event).
        self._window: list[tuple[str, tuple[Any, ...] | None, Any]] = []
        self._in_window = False
        self.skipped = 0  # events of sources no table map names
        # Rows read from values (``event.value`` and its conversion): for tests, metrics.
        self.decoded = 0

    @property
    def pending_rows(self) -> int:
        return self.batch.rows + sum(len(p.latest) for p in self._pending.values())

    @property
    def in_window(self) -> bool:
        return self._in_window

    def start_window(self) -> None:
        self._window.clear()
        self._in_window = True

    def add(self, event: Any) -> None:
        """One data event of the window in progress (``DataEvent``: ``source``, ``key``,
        ``is_delete``, ``scn``, ``value`` read only at ``materialize``)."""
        fold = self.folds.get(event.source)
        if fold is None:
            self.skipped += 1
            return
        if fold.by_event_key:
            fkey = fold.event_key(event.key)
            if fkey is None:
                self._refold(event.source, fold)  # the old way from now on
            self._window.append((event.source, fkey, event))
        else:
            self._window.append((event.source, None, self._change(fold, event)))

    def event(self, source: str, *, delete: bool, key: Any, value: Mapping[str, Any] | None,
              scn: int) -> None:
        """``add`` of an event given by its parts."""
        self.add(_Given(source, delete, key, value, scn))

    def _change(self, fold: TableFold, event: Any) -> Change:
        self.decoded += 1
        return fold.change(delete=event.is_delete, key=event.key, value=event.value,
                           scn=event.scn)

    def end_window(self, scn: int) -> None:
        """The window is whole: its events join the batch (the latest per key wins)."""
        changes = self.batch.changes
        pending = self._pending
        for source, fkey, item in self._window:
            if fkey is None or not self.folds[source].by_event_key:
                if isinstance(item, Change):
                    changes.setdefault(source, {})[item.key] = item
                else:  # the table went the old way within this window
                    change = self._change(self.folds[source], item)
                    changes.setdefault(source, {})[change.key] = change
                continue
            p = pending.get(source)
            if p is None:
                p = pending[source] = _Pending()
            p.latest[fkey] = item
            p.events.append(item)
        self.batch.scn = scn
        self.batch.windows += 1
        self.batch.events += len(self._window)
        self._window.clear()
        self._in_window = False

    def rollback(self) -> None:
        """Drop the window in progress (the client replays it)."""
        self._window.clear()
        self._in_window = False

    def _refold(self, source: str, fold: TableFold) -> None:
        """Leave folding on event keys for ``source``: its events of the batch and of
        the window in progress become changes now, folded on their rows' keys."""
        fold.by_event_key = False
        p = self._pending.pop(source, None)
        if p is not None:
            changes = self.batch.changes.setdefault(source, {})
            for event in p.events:
                change = self._change(fold, event)
                changes[change.key] = change
        self._window = [(s, None, self._change(fold, item)) if s == source
                        and not isinstance(item, Change) else (s, k, item)
                        for s, k, item in self._window]

    def materialize(self) -> Batch:
        """The batch with every surviving event's change in ``batch.changes`` (values
        decoded and converted now). Raises ``UnusableEventError`` for a survivor that
        cannot become a row; may be called again (nothing is left to do then)."""
        pending, self._pending = self._pending, {}
        # No cyclic collection while the rows are made: every row, key and value is a
        # new container the collector would count and scan, and none holds a cycle (a
        # batch of 20,000 rows spent a fifth of its time in collections).
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._materialize(pending)
        finally:
            if collecting:
                gc.enable()
        return self.batch

    def _materialize(self, pending: dict[str, _Pending]) -> None:
        for source, p in pending.items():
            fold = self.folds[source]
            out = self.batch.changes.setdefault(source, {})
            if fold.by_event_key:
                done = self._survivors(fold, p, out)
                if done:
                    continue
                # An event key that is not its row's key: the old way for this table.
                fold.by_event_key = False
            for event in p.events:
                change = self._change(fold, event)
                out[change.key] = change

    def _survivors(self, fold: TableFold, p: _Pending,
                   out: dict[tuple[Any, ...], Change]) -> bool:
        """The changes of the latest event per key into ``out``; False (``out`` left
        as it was) when an event's row has another key than its event key."""
        made: list[Change] = []
        key_indexes = fold.key_indexes
        for fkey, event in p.latest.items():
            self.decoded += 1
            if event.is_delete:
                change = fold.change(delete=True, key=event.key, value=event.value,
                                     scn=event.scn)
            else:
                row = fold.row_of(event)
                change = Change(tuple([row[i] for i in key_indexes]), row, event.scn)
            if change.key != fkey:
                return False
            made.append(change)
        for change in made:
            out[change.key] = change
        return True

    def take(self) -> Batch:
        """The batch so far (whole windows, ``materialize``d), and a new empty one."""
        batch = self.materialize()
        self.batch = Batch()
        return batch

    def replace(self, source: str, fold: TableFold) -> None:
        """A new table map for ``source`` (a schema change): call with an empty batch."""
        if self.batch.changes.get(source) or source in self._pending:
            raise RuntimeError("flush the batch before its table map changes")
        self.folds[source] = fold
