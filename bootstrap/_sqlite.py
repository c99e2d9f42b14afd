"""The SQLite bootstrap store: the embedded default for demos and small installs.

WAL mode lets the server read while the producer and the applier write (readers never
wait on a writer). Writers take the write lock up front (``BEGIN IMMEDIATE``) so two
writers queue instead of failing half-way. Retention deletes rows: SQLite has no
partitions.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from databus._hold import hold
from databus.bootstrap._sql import Cursor, SqlStorage, log_table
from databus.bootstrap._storage import LogRows, StoredEvent, StoreHold
from databus.errors import ConfigError, StorageUnavailableError


class SqliteStorage(SqlStorage):
    paramstyle = "qmark"
    blob_type = "blob"
    for_update = ""  # BEGIN IMMEDIATE: one writer at a time already

    def __init__(self, url: str, *, busy_timeout: float = 30.0, key_hash: bool = True) -> None:
        parts = urlsplit(url)
        path = parts.path
        if parts.netloc or not path or path == "/:memory:":
            raise ConfigError(
                f"SQLite bootstrap storage needs a file: sqlite:///path/bootstrap.db, got {url!r}"
            )
        self.path = Path(path)
        self.where = f"sqlite://{self.path}"
        self._busy_timeout = busy_timeout
        self.key_hash = key_hash
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        # Connections inside a transaction now, and whether close() was called: a
        # connection is closed by the thread using it, never under it (sqlite3 does
        # not guard a connection shared across threads: closing it from another
        # thread mid-statement crashes the process). A component's thread can outlive
        # its task (a thread cannot be cancelled), so close() may come mid-apply.
        self._busy: set[sqlite3.Connection] = set()
        self._closed = False
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._transaction(write=True) as cur:
            self._create_base_tables(cur)

    def _q(self, sql: str) -> str:
        return sql.replace("%s", "?")

    def _acquire(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use and marked busy until its
        transaction ends (``close()`` leaves a busy connection to its thread)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        opened = conn is None and not self._closed
        if opened:
            try:
                conn = sqlite3.connect(self.path, timeout=self._busy_timeout,
                                       isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.Error as exc:
                raise StorageUnavailableError(f"cannot open {self.where}: {exc}") from None
            self._local.conn = conn
        with self._lock:
            if self._closed or conn is None:
                if opened and conn is not None:
                    conn.close()
                raise StorageUnavailableError(f"{self.where} is closed")
            if opened:
                self._all.append(conn)
            self._busy.add(conn)
        return conn

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Cursor]:
        conn = self._acquire()
        try:
            cur = conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.OperationalError as exc:
                raise StorageUnavailableError(f"{self.where} is busy: {exc}") from None
            try:
                yield cur
            except BaseException:
                conn.rollback()
                raise
            else:
                conn.commit()
            finally:
                cur.close()
        finally:
            with self._lock:
                self._busy.discard(conn)
                orphan = self._closed
            if orphan:  # close() came while this thread was using it
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

    def hold(self, component: str) -> StoreHold:
        """A lock file beside the database (databus/_hold.py)."""
        return hold(Path(f"{self.path}.{component}.lock"),
                    f"the {component} of bootstrap store {self.where}",
                    "another bootstrap service runs it: stop that one first, or run this "
                    f"one without the {component} (bootstrap.run)")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            # Idle connections close now; busy ones when their transaction ends.
            conns = [c for c in self._all if c not in self._busy]
            self._all = []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _create_log_table(self, cur: Cursor, source_id: int) -> None:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {log_table(source_id)} (scn bigint NOT NULL,"
            " seq integer NOT NULL, op smallint NOT NULL, pkey bigint NOT NULL,"
            " key_hash bigint NOT NULL, key blob NOT NULL, event blob NOT NULL,"
            " PRIMARY KEY (scn, seq)) WITHOUT ROWID"
        )

    def _insert_log(self, cur: Cursor, source_id: int,
                    rows: LogRows | list[tuple[int, int, StoredEvent]]) -> None:
        cur.executemany(
            f"INSERT INTO {log_table(source_id)} (scn, seq, op, pkey, key_hash, key, event)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows.tuples() if isinstance(rows, LogRows) else
            [(scn, seq, e.op, e.pkey, e.key_hash, e.key, e.event) for scn, seq, e in rows],
        )

    def _drop_log(self, source_ids: Sequence[int], cut_scn: int) -> None:
        with self._transaction(write=True) as cur:
            for source_id in source_ids:
                cur.execute(f"DELETE FROM {log_table(source_id)} WHERE scn <= ?", (cut_scn,))
