"""A connection to a TxLog source, and the operations the fetcher and the CLI share.

``DbSession`` is the thin I/O shell each dialect implements (``_sqlite``, ``_postgres``,
``_oracle``): connect, transactions, run a statement, read the catalog, and classify the
driver's exceptions as retriable or not. Everything else is written once here (loading
and checking the captured tables, install, uninstall, prune, the source's position) or
in ``_fetcher`` (the pull loop), on top of the SQL from ``_dialects``.

Transactions: ``read`` is one consistent snapshot (SQLite: a deferred transaction in
WAL mode; PostgreSQL: REPEATABLE READ READ ONLY; Oracle: SET TRANSACTION READ ONLY);
``write`` takes the write lock up front where that matters (SQLite: BEGIN IMMEDIATE).
Outside a transaction every statement commits on its own.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from databus.errors import ConfigError, DatabusError
from databus.fetchers.txlog._dialects import SqlDialect, dialect_for
from databus.fetchers.txlog._errors import TxlogNotInstalledError
from databus.fetchers.txlog._model import TableRef, TableShape
from databus.fetchers.txlog._uri import FETCHER_SCHEMES, TableSpec, TxlogSource

__all__ = [
    "DbSession",
    "Installed",
    "Position",
    "TableInfo",
    "check_table",
    "load_shapes",
    "missing_objects",
]

Params = Mapping[str, Any] | None
Mode = Literal["read", "write"]


@dataclass(frozen=True, slots=True)
class Installed:
    """Which capture objects a table has."""

    txlog: bool
    delete_log: bool
    triggers: frozenset[str]


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A table as the catalog shows it; ``shape`` is None when there is no such table."""

    shape: TableShape | None
    installed: Installed


@dataclass(frozen=True, slots=True)
class Position:
    """Where the source is: the newest SCN assigned (0: none yet) and the first SCN the
    TxLog may still hold (``pruned_before``; 0 when never pruned)."""

    newest: int
    pruned_before: int

    @property
    def earliest(self) -> int:
        """The SCN a reader of everything the TxLog holds starts after."""
        return max(self.pruned_before - 1, 0)


class DbSession(ABC):
    """One connection to a TxLog source (see the module docstring)."""

    #: The driver's exception base classes; ``translate`` turns them into ours.
    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, source: TxlogSource) -> None:
        self.source = source
        self.dialect: SqlDialect = dialect_for(source.dialect, source.txlog_schema)

    # -- the shell each dialect implements ------------------------------------------

    @abstractmethod
    def connect(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def begin(self, mode: Mode) -> None: ...

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def rollback(self) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        """Run ``sql``; its rows (an empty list for statements without a result)."""

    @abstractmethod
    def describe(self, ref: TableRef) -> TableInfo:
        """The table's columns, primary key and capture objects."""

    @abstractmethod
    def ddl_token(self, refs: Sequence[TableRef]) -> object:
        """A value that changes whenever the columns or triggers of ``refs`` change."""

    @abstractmethod
    def delete_logs(self) -> list[TableRef]:
        """Every delete log in the database (prune cleans them all)."""

    @abstractmethod
    def captured_tables(self) -> list[TableRef]:
        """Every table that has capture triggers."""

    @abstractmethod
    def translate(self, exc: BaseException) -> DatabusError:
        """A driver exception as a ``SourceError`` (retriable when retrying can help)."""

    def prepare_install(self) -> None:  # noqa: B027 - most dialects need nothing
        """Run before the install transaction (SQLite switches to WAL here)."""

    # -- built on the shell -------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, mode: Mode) -> Iterator[None]:
        """``begin``, then ``commit``, or ``rollback`` on any error."""
        self.begin(mode)
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self.rollback()
            raise
        self.commit()

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Driver exceptions inside become ``DatabusError``s (``translate``)."""
        try:
            yield
        except self.errors as exc:
            raise self.translate(exc) from exc

    def position(self) -> Position:
        (newest, pruned_before), = self.query(self.dialect.position_sql())
        return Position(max(int(newest or 0), int(pruned_before) - 1, 0), int(pruned_before))

    def assign(self) -> bool:
        """Give committed transactions their SCNs (one write transaction). Returns
        False when the source was too busy to do it now (SQLite's write lock)."""
        plan = self.dialect.assign_plan()
        with self.transaction("write"):
            params: dict[str, Any] = {}
            if plan.lock is not None:
                (last,), = self.query(plan.lock)
                params["last"] = int(last)
            for statement in plan.statements:
                self.query(statement, params or None)
        return True

    def run_script(self, statements: Sequence[str], params: Params = None) -> None:
        """``statements`` in one write transaction, after the dialect's schema-setup lock
        (two installs at once on PostgreSQL: ``databus/_ddl.py``)."""
        with self.transaction("write"):
            for statement in self.dialect.ddl_lock_sql():
                self.query(statement)
            for statement in statements:
                self.query(statement, params)


def missing_objects(session: DbSession, info: TableInfo) -> list[str]:
    """What the capture of a described table lacks (empty when fully installed)."""
    assert info.shape is not None
    dialect = session.dialect
    ref = info.shape.ref
    missing = []
    if not info.installed.txlog:
        missing.append(f"the TxLog table {dialect.txlog}")
    if not info.shape.has_txn_column:
        missing.append(f"the column {dialect.txn_column}")
    if not info.installed.delete_log:
        missing.append(f"the delete log {dialect.table(dialect.delete_log(ref))}")
    absent = [t for t in dialect.triggers(ref) if t not in info.installed.triggers]
    if absent:
        missing.append(f"the trigger(s) {', '.join(absent)} (absent or disabled)")
    return missing


def load_shapes(
    session: DbSession, specs: Sequence[TableSpec], *, installed: bool
) -> list[TableShape]:
    """The shapes of ``specs``' tables, checked: each exists and has a primary key, and
    with ``installed`` its capture objects are all there (else a non-retriable error)."""
    shapes = []
    for spec in specs:
        info = session.describe(spec.ref)
        if info.shape is None:
            raise ConfigError(f"txlog source {session.source.redacted}: no table {spec.ref}")
        shapes.append(check_table(session, spec, info, installed=installed))
    return shapes


def check_table(session: DbSession, spec: TableSpec, info: TableInfo, *, installed: bool
                ) -> TableShape:
    """The shape of an existing table, checked as ``load_shapes`` describes."""
    ref = spec.ref
    shape = info.shape
    assert shape is not None
    if not shape.key:
        raise ConfigError(
            f"table {ref} has no primary key: the TxLog fetcher needs one, because "
            "deletes are recorded by key and consumers apply changes by key. Add a "
            "primary key (or capture a view of it that has one in another table)"
        )
    if spec.key is not None and spec.key != shape.key:
        raise ConfigError(f"table {ref}: the key given, {spec.key}, is not its primary "
                          f"key {shape.key}")
    if installed:
        missing = missing_objects(session, info)
        if missing:
            scheme = FETCHER_SCHEMES[session.source.dialect]
            raise TxlogNotInstalledError(
                f"table {ref} is not set up for capture: missing {'; '.join(missing)}. "
                f"Run: databus txlog install --source '{session.source.redacted}' "
                f"--tables {ref} (source scheme {scheme}://)"
            )
    return shape


def shapes_from_specs(specs: Sequence[TableSpec]) -> list[TableShape]:
    """Shapes from the command line alone (Oracle ``--dry-run``: no catalog to read):
    only the keys are known, which is all the Oracle DDL needs."""
    shapes = []
    for spec in specs:
        if not spec.key:
            raise ConfigError(
                f"table {spec.ref}: without a connection the key columns must be given, "
                f"e.g. --tables '{spec.ref}(ID)'"
            )
        shapes.append(TableShape(spec.ref, (), spec.key, has_txn_column=False))
    return shapes


def with_txn_column(shapes: Sequence[TableShape]) -> list[TableShape]:
    """``shapes`` as they are once installed (for uninstall scripts printed offline)."""
    return [replace(s, has_txn_column=True) for s in shapes]
