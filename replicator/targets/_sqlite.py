"""The SQLite target (the embedded default): ``sqlite:///path/replica.db``.

As everywhere in databus, the path is what follows ``sqlite://`` (so
``sqlite:///var/lib/replica.db`` is absolute); its directory is created if missing.
A file only: a replica in ``:memory:`` would vanish with the process and its state.

One schema, ``main``: a table map naming another schema is refused. Write
transactions are ``BEGIN IMMEDIATE`` (the write lock taken up front, so a batch never
fails half way on a reader upgrading its lock), in WAL mode so that readers (a check,
the demo's comparison) run beside the replicator. ``synchronous = NORMAL``: a power
loss may take back the last batches committed, but only ever whole batches with
their recorded SCN, so the replica stays consistent and resumes from what it has.

Upserts: multi-row ``INSERT ... VALUES (...), (...) ON CONFLICT (key) DO UPDATE`` (up
to 500 rows a statement, within SQLite's bound-parameter limit), inside the batch's
transaction; deletes by key through ``executemany``. ``widen_column`` does nothing:
SQLite stores any value in any column.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

from databus._hold import hold
from databus.errors import ConfigError
from databus.replicator._model import ColumnMap, Dialect, TableMap
from databus.replicator.targets._base import Held, SqlTarget, TableWork
from databus.replicator.targets._sql import SqlDialect, dialect_sql

__all__ = ["SqliteTarget"]

# Bound parameters per statement: SQLITE_MAX_VARIABLE_NUMBER's default (999 before
# SQLite 3.32); rows per multi-row INSERT, at most.
_MAX_PARAMS = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
_ROWS_PER_INSERT = 500

# Primary result codes of a database that is busy or that the system failed (lock,
# I/O, disk full, cannot open): the same transaction may pass later.
_RETRIABLE_CODES = frozenset({
    sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL,
})


class SqliteTarget(SqlTarget):
    dialect: Dialect = "sqlite"
    sql: ClassVar[SqlDialect] = dialect_sql("sqlite")
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.Error,)

    def __init__(self, url: str, *, busy_timeout: float = 30.0) -> None:
        super().__init__(url)
        parts = urlsplit(url)
        path = unquote(parts.path)
        if parts.netloc or not path or path in ("/:memory:", ":memory:"):
            raise ConfigError(f"the SQLite target needs a file: sqlite:///path/replica.db, "
                              f"got {self.where!r}")
        self.path = Path(path)
        self._busy_timeout = busy_timeout

    def _connect(self) -> Any:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise sqlite3.OperationalError(f"cannot create {self.path.parent}: {exc}") \
                from None
        # isolation_level None: the module starts no transaction behind our back; we
        # BEGIN IMMEDIATE ourselves. check_same_thread off: the replicator calls from
        # several threads, one at a time (the target's lock).
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    def hold(self, replication: str) -> Held:
        """A lock file beside the database (databus/_hold.py)."""
        return hold(Path(f"{self.path}.{replication}.lock"),
                    f"replication {replication} on target {self.where}",
                    "stop that one first, or give this one another replicate.name")

    def _retriable(self, exc: BaseException) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in _RETRIABLE_CODES

    def _connect_retriable(self, exc: BaseException) -> bool:
        # A file that cannot be opened now (its directory not mounted yet, locked)
        # may open later; a file that is not a database never will.
        return self._retriable(exc)

    def _begin(self, cur: Any, *, write: bool) -> None:
        if write:
            cur.execute("BEGIN IMMEDIATE")

    def _schema_of(self, t: TableMap) -> str | None:
        if t.schema not in (None, "", "main"):
            raise ConfigError(f"table {t.schema}.{t.table}: an SQLite target has one schema, "
                              "main (leave target_schema empty)")
        return None

    # -- catalog ---------------------------------------------------------------------------

    def _table_exists(self, cur: Any, schema: str | None, table: str) -> bool:
        # SQLite's names are case-insensitive, as its catalog lookups are.
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                    "name = ? COLLATE NOCASE", (table,))
        return cur.fetchone() is not None

    def _table_columns(self, cur: Any, schema: str | None,
                       table: str) -> list[tuple[str, str, bool]]:
        cur.execute('SELECT name, type, "notnull", pk FROM pragma_table_info(?) ORDER BY cid',
                    (table,))
        # A primary key column is NOT NULL in the tables we create (and should be).
        return [(str(name), str(type_), not notnull and not pk)
                for name, type_, notnull, pk in cur.fetchall()]

    def _table_key(self, cur: Any, schema: str | None, table: str) -> tuple[str, ...]:
        cur.execute("SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk",
                    (table,))
        return tuple(str(name) for (name,) in cur.fetchall())

    # -- DDL and rows ------------------------------------------------------------------------

    def widen_column(self, t: TableMap, column: ColumnMap) -> None:
        """Nothing: an SQLite column holds any value whatever its declared type."""
        self._schema_of(t)

    def _delete(self, cur: Any, work: TableWork) -> None:
        cur.executemany(self.sql.delete_one(work.qname, work.table),
                        [c.key for c in work.deletes])

    def _upsert(self, cur: Any, work: TableWork) -> None:
        # Multi-row INSERTs: measured 2-3 times faster than executemany of the one-row
        # statement (one step of the VM per statement, not per row); full chunks share
        # one SQL text, so the module's statement cache prepares it once.
        t = work.table
        width = len(t.columns)
        per = max(1, min(_ROWS_PER_INSERT, _MAX_PARAMS // width))
        names = self.sql.columns([c.target for c in t.columns])
        head = f"INSERT INTO {work.qname} ({names}) VALUES "
        one = self.sql.placeholders(width)
        tail = self.sql.upsert_tail(t)
        rows = [c.row for c in work.upserts if c.row is not None]
        full = head + ",".join([one] * per) + tail
        for start in range(0, len(rows), per):
            chunk = rows[start:start + per]
            sql = full if len(chunk) == per else head + ",".join([one] * len(chunk)) + tail
            cur.execute(sql, [v for row in chunk for v in row])
