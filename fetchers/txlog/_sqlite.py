"""The SQLite session: the embedded default source (``sqlite:///path.db?tables=...``).

The file is opened with ``mode=rw``, so a missing file is an error (retriable: a volume
may come back) rather than a new empty database. Reads are deferred transactions: in
WAL mode (``databus txlog install`` switches the database to it) they never block the
writer nor wait for it. Sealing takes the write lock (``BEGIN IMMEDIATE``) for a moment;
when a writer holds it longer than ``busy_timeout_ms`` the seal is skipped for that poll
instead of failing the fetcher.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.request import pathname2url

from databus.errors import DatabusError, SourceError
from databus.fetchers.txlog._model import TXLOG_TABLE, TXN_COLUMN, Column, TableRef, TableShape
from databus.fetchers.txlog._session import DbSession, Installed, Mode, Params, TableInfo

__all__ = ["SqliteSession"]

# Messages of errors that go away by themselves (a writer holding the lock, a missing or
# unreadable file); everything else (corruption, a dropped table) does not.
_TRANSIENT = ("locked", "busy", "unable to open", "disk i/o", "readonly database")


class SqliteSession(DbSession):
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    conn: sqlite3.Connection | None = None
    _owner: int | None = None  # the thread that connected, and uses the connection

    def connect(self) -> None:
        path = self.source.path
        assert path is not None
        if not path.is_file():
            raise SourceError(f"SQLite database {path} does not exist (or is not a file)",
                              retriable=True)
        try:
            self.conn = sqlite3.connect(
                f"file:{pathname2url(str(path))}?mode=rw", uri=True, isolation_level=None,
                timeout=self.source.busy_timeout_s, check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise self.translate(exc) from exc
        self._owner = threading.get_ident()

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if self._owner is not None and threading.get_ident() != self._owner:
            # From another thread (the relay stopping a fetcher that did not stop in
            # time): sqlite3 does not guard a connection shared across threads, and
            # closing it under a running statement can crash the process. interrupt() is
            # the call that is safe from another thread: a statement in progress fails
            # ("interrupted") in its own thread; the connection goes with its last
            # reference.
            conn.interrupt()
            return
        conn.close()

    @property
    def _conn(self) -> sqlite3.Connection:
        if self.conn is None:
            raise SourceError("the SQLite session is closed", retriable=True)
        return self.conn

    def begin(self, mode: Mode) -> None:
        self._conn.execute("BEGIN IMMEDIATE" if mode == "write" else "BEGIN")

    def commit(self) -> None:
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def query(self, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, dict(params or {})).fetchall()

    def prepare_install(self) -> None:
        # Readers (the fetcher) must not block writers: WAL. It persists in the file.
        self.query("PRAGMA journal_mode=WAL")

    def assign(self) -> bool:
        try:
            return super().assign()
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return False  # a writer holds the lock: seal at the next poll
            raise

    def describe(self, ref: TableRef) -> TableInfo:
        rows = self.query(
            'SELECT name, type, "notnull", pk, hidden FROM pragma_table_xinfo(:t)',
            {"t": ref.name},
        )
        objects = {
            (kind, name) for kind, name in self.query(
                "SELECT type, name FROM sqlite_master WHERE type = 'table' "
                "OR (type = 'trigger' AND tbl_name = :t)", {"t": ref.name})
        }
        installed = Installed(
            txlog=("table", TXLOG_TABLE) in objects,
            delete_log=("table", self.dialect.delete_log(ref).name) in objects,
            triggers=frozenset(name for kind, name in objects if kind == "trigger"),
        )
        if not rows:
            return TableInfo(None, installed)
        # hidden: 1 = a virtual table's hidden column (not readable as a column).
        visible = [r for r in rows if r[4] != 1]
        key = tuple(name for name, *_ in sorted((r for r in visible if r[3]), key=lambda r: r[3]))
        columns = []
        for name, decl, notnull, pk, _hidden in visible:
            if name == TXN_COLUMN:
                continue
            # An INTEGER PRIMARY KEY is the rowid: never NULL although not declared so.
            rowid = len(key) == 1 and pk == 1 and str(decl).upper() == "INTEGER"
            columns.append(Column(name, str(decl or ""), nullable=not (notnull or rowid)))
        has_txn = any(r[0] == TXN_COLUMN for r in visible)
        return TableInfo(TableShape(ref, tuple(columns), key, has_txn), installed)

    def ddl_token(self, refs: Sequence[TableRef]) -> object:
        # Changes with every schema change of the file, in this read's snapshot.
        return self.query("PRAGMA schema_version")[0][0]

    def delete_logs(self) -> list[TableRef]:
        rows = self.query(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name LIKE 'databus\\_deleted\\_%' ESCAPE '\\' ORDER BY name"
        )
        return [TableRef("main", name) for (name,) in rows]

    def captured_tables(self) -> list[TableRef]:
        rows = self.query("SELECT tbl_name, name FROM sqlite_master WHERE type = 'trigger'")
        return sorted({
            TableRef("main", table) for table, name in rows
            if name == self.dialect.triggers(TableRef("main", table))[0]
        })

    def translate(self, exc: BaseException) -> DatabusError:
        message = str(exc)
        path = self.source.path or Path("?")
        retriable = isinstance(exc, sqlite3.OperationalError) and any(
            word in message.lower() for word in _TRANSIENT
        )
        return SourceError(f"SQLite {path}: {type(exc).__name__}: {message}",
                           retriable=retriable)
