"""The PostgreSQL bootstrap store (production).

Log tables are ``PARTITION BY RANGE (scn)`` with partitions of ``log_partition_span``
SCNs, created as SCNs reach them, so retention drops whole partitions instead of
deleting rows. The producer loads the log with binary ``COPY``. Every thread gets its
own connection (the server runs queries in a thread pool); a lost connection is
dropped and reported as ``StorageUnavailableError`` so callers retry.
"""

from __future__ import annotations

import contextlib
import io
import re
import struct
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg2
import psycopg2.extensions

from databus._ddl import ddl_lock_key, pg_xact_lock_sql
from databus._redact import redact, register_uri, split_password
from databus.batch import LogCopy
from databus.bootstrap._sql import (
    LOG_FLOOR_SCN,
    PRODUCER_CHECKPOINT,
    Cursor,
    SqlStorage,
    _check_order,
    fence_state,
    log_table,
)
from databus.bootstrap._storage import Fence, LogRows, StoredEvent, StoreHold
from databus.checkpoint import Checkpoint
from databus.config import redact_uri
from databus.errors import AlreadyRunningError, ConfigError, StorageUnavailableError

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_LOST = (psycopg2.OperationalError, psycopg2.InterfaceError)
DEFAULT_PARTITION_SPAN = 1 << 32  # one MySQL binlog file per partition

# Binary COPY: signature, flags, header extension length; rows; trailer.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
# 8 fields: scn, seq, op, pkey, key_hash (fixed width), then key and event (bytea).
_COPY_FIXED = struct.Struct(">h iq ii ih iq iq")
_LEN = struct.Struct(">i")
# dbus_windows: scn, timestamp_ns (bigint), events (integer), bytes (bigint).
_COPY_WINDOW = struct.Struct(">h iq iq ii iq")
_LOG_COLUMNS = "scn, seq, op, pkey, key_hash, key, event"
_WINDOW_COLUMNS = "scn, timestamp_ns, events, bytes"


# How long a write transaction may sit idle before the server ends it (see _transaction).
_WRITE_IDLE_LIMIT = "10s"

class PostgresStorage(SqlStorage):
    paramstyle = "format"
    blob_type = "bytea"
    copies_log = True

    def __init__(self, url: str, *, log_partition_span: int | None = None,
                 connect_timeout: float = 5.0, key_hash: bool = True) -> None:
        register_uri(url)
        # libpq gets the password as its own argument, never inside the URL: a URL
        # parser fails on an unencoded '%' (or splits at an '@' or '/') in a password
        # and quotes it back in its error message.
        url_without_password, self._password = split_password(url)
        parts = urlsplit(url_without_password)
        query = dict(parse_qsl(parts.query))
        self.schema_name = query.pop("schema", "databus")
        if not _SCHEMA_RE.fullmatch(self.schema_name):
            raise ConfigError(f"bootstrap storage schema name {self.schema_name!r} is not a "
                              "plain lower-case SQL identifier")
        span = query.pop("log_partition_span", None)
        self.partition_span = int(span) if span else (log_partition_span
                                                      or DEFAULT_PARTITION_SPAN)
        if self.partition_span < 1:
            raise ConfigError("log_partition_span must be >= 1")
        self._dsn = urlunsplit(parts._replace(query=urlencode(query)))
        self._connect_timeout = max(1, round(connect_timeout))
        self.where = redact_uri(url)
        self.key_hash = key_hash
        self._local = threading.local()
        self._all: list[psycopg2.extensions.connection] = []
        self._lock = threading.Lock()
        self._partitions: set[tuple[int, int]] = set()
        self._generation = 0
        with self._transaction(write=True) as cur:
            # Two services starting on a fresh store: without the lock, one of them dies
            # on CREATE SCHEMA's duplicate catalog row (databus/_ddl.py).
            self._lock_ddl(cur)
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema_name}")
            cur.execute(f"SET LOCAL search_path TO {self.schema_name}")
            self._create_base_tables(cur)

    # -- connections ------------------------------------------------------------------

    def _connection(self) -> psycopg2.extensions.connection:
        conn: psycopg2.extensions.connection | None = getattr(self._local, "conn", None)
        # A connection older than the last loss any thread saw is likely dead too (a
        # server restart drops them all): replace it instead of failing one request more.
        if conn is not None and not conn.closed and self._local.generation == self._generation:
            return conn
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()
        try:
            conn = psycopg2.connect(
                self._dsn, connect_timeout=self._connect_timeout,
                application_name="databus-bootstrap",
                # synchronous_commit on whatever the server's default: a reader may be
                # served rows the moment they commit, so a commit a crash could still
                # take back (off: up to 3 x wal_writer_delay) would leave that reader
                # with a snapshot newer than the store it resumes from.
                options=f"-c search_path={self.schema_name} -c synchronous_commit=on",
                keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                **self._password_kwargs(),
            )
        except psycopg2.Error as exc:
            raise StorageUnavailableError(
                f"cannot connect to the bootstrap database {self.where}: {_first_line(exc)}"
            ) from None
        self._local.conn = conn
        self._local.generation = self._generation
        with self._lock:
            self._all.append(conn)
        return conn

    def _password_kwargs(self) -> dict[str, Any]:
        return {} if self._password is None else {"password": self._password}

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Cursor]:
        conn = self._connection()
        try:
            with conn, conn.cursor() as cur:
                if write:
                    # A writer stopped mid-transaction (SIGSTOP, a frozen VM) keeps its
                    # row locks, among them the fencing token's: a standby taking the
                    # component over would wait for them until the writer resumed. The
                    # server ends such a transaction instead; a live writer is never
                    # idle inside one for that long.
                    cur.execute("SET LOCAL idle_in_transaction_session_timeout = "
                                f"'{_WRITE_IDLE_LIMIT}'")
                yield cur
        except psycopg2.Error as exc:
            self._failed(exc, conn)

    def _failed(self, exc: psycopg2.Error, conn: psycopg2.extensions.connection) -> NoReturn:
        """After a failed statement: partitions made in the transaction are gone; a lost
        connection is dropped and said as ``StorageUnavailableError``."""
        self._partitions.clear()  # partitions created in the lost transaction are gone
        if isinstance(exc, _LOST):
            self._generation += 1
            self._drop_connection()
            raise StorageUnavailableError(
                f"lost the bootstrap database {self.where}: {_first_line(exc)}"
            ) from None
        if conn.closed:
            self._drop_connection()
        raise exc

    def hold(self, component: str) -> StoreHold:
        """A session advisory lock on a connection of its own, kept open: the server
        releases it when this process (or its connection) ends."""
        key = ddl_lock_key(f"bootstrap-run:{self.schema_name}:{component}")
        try:
            conn = psycopg2.connect(
                self._dsn, connect_timeout=self._connect_timeout,
                application_name=f"databus-bootstrap-{component}",
                keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                **self._password_kwargs())
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_lock(%s), (SELECT pid FROM pg_locks"
                            " WHERE locktype = 'advisory' AND granted AND objid ="
                            " (%s::bigint & 4294967295)::oid LIMIT 1)", (key, key))
                row = cur.fetchone()
        except psycopg2.Error as exc:
            raise StorageUnavailableError(
                f"cannot connect to the bootstrap database {self.where}: {_first_line(exc)}"
            ) from None
        if row is None or not row[0]:
            conn.close()
            holder = f"server pid {row[1]}" if row is not None and row[1] else "another"
            raise AlreadyRunningError(
                f"the {component} of bootstrap store {self.where} is held by another "
                f"process (its connection: {holder}); another bootstrap service runs it: "
                f"stop that one first, or run this one without the {component} "
                "(bootstrap.run)")
        return _PgHold(conn)

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    # -- DDL ------------------------------------------------------------------------

    def _lock_ddl(self, cur: Cursor) -> None:
        cur.execute(pg_xact_lock_sql(f"bootstrap:{self.schema_name}"))

    def _create_log_table(self, cur: Cursor, source_id: int) -> None:
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {log_table(source_id)} (scn bigint NOT NULL,"
            " seq integer NOT NULL, op smallint NOT NULL, pkey bigint NOT NULL,"
            " key_hash bigint NOT NULL, key bytea NOT NULL, event bytea NOT NULL,"
            " PRIMARY KEY (scn, seq)) PARTITION BY RANGE (scn)"
        )

    def _prepare_append(self, rows: dict[int, list[int]]) -> None:
        span = self.partition_span
        for source_id, scns in rows.items():
            # The partition after the last one needed too: crossing a boundary then
            # never waits for DDL in the middle of a burst.
            # Every partition from the first SCN's to the last one's (the SCNs given may
            # be just the first and the last), and the one after.
            for index in range(min(scns) // span, max(scns) // span + 2):
                if (source_id, index) in self._partitions:
                    continue
                parent = log_table(source_id)
                # Its own transaction: CREATE ... PARTITION OF locks the parent, and a
                # reader must wait for one short statement only, never for an append.
                with self._transaction(write=True) as cur:
                    self._lock_ddl(cur)
                    cur.execute(
                        f"CREATE TABLE IF NOT EXISTS {parent}_p{index} PARTITION OF {parent}"
                        f" FOR VALUES FROM ({index * span}) TO ({(index + 1) * span})"
                    )
                self._partitions.add((source_id, index))

    def _partitions_of(self, cur: Cursor, source_id: int) -> list[int]:
        cur.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent"
            " JOIN pg_namespace n ON n.oid = p.relnamespace"
            " WHERE p.relname = %s AND n.nspname = %s",
            (log_table(source_id), self.schema_name),
        )
        prefix = f"{log_table(source_id)}_p"
        return sorted(int(name[len(prefix):]) for (name,) in cur.fetchall()
                      if name.startswith(prefix))

    # -- log writes ---------------------------------------------------------------------

    def _insert_log(self, cur: Cursor, source_id: int,
                    rows: LogRows | list[tuple[int, int, StoredEvent]]) -> None:
        copy_into(cur, log_table(source_id), rows)

    def _append_copy(self, copy: LogCopy, checkpoint: Checkpoint, *, first_scn: int | None,
                     unordered: tuple[int, int] | None, log_floor_scn: int | None,
                     fence: Fence | None) -> None:
        """The producer's response in one transaction of few round trips: BEGIN, the
        fence and the log's end in one statement; a COPY of each binary stream (each
        log table's, then ``dbus_windows``'), made in one call from the response body;
        the checkpoint (and the floor) with the COMMIT in one statement. The driver is
        in autocommit meanwhile, so that it sends no BEGIN and COMMIT of its own."""
        conn = self._connection()
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                try:
                    fenced = "NULL" if fence is None else (
                        "(SELECT value FROM dbus_state WHERE name = %s FOR UPDATE)")
                    cur.execute(
                        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = "
                        f"'{_WRITE_IDLE_LIMIT}'; SELECT {fenced}, (SELECT max(scn) FROM"
                        " dbus_windows)",
                        None if fence is None else (fence_state(fence.component),))
                    row = cur.fetchone()
                    token, end = (None, None) if row is None else row
                    if fence is not None:
                        self._check_token(fence, token)
                    _check_order(end, first_scn, unordered)
                    for source_id, stream in copy.logs.items():
                        copy_stream(cur, f"COPY {log_table(source_id)} ({_LOG_COLUMNS})"
                                    " FROM STDIN WITH (FORMAT binary)", stream)
                    if copy.stored:
                        copy_stream(cur, f"COPY dbus_windows ({_WINDOW_COLUMNS}) FROM STDIN"
                                    " WITH (FORMAT binary)", copy.windows)
                    self._before_commit(fence)
                    sql = ("INSERT INTO dbus_state (name, value) VALUES (%s, %s) ON CONFLICT"
                           " (name) DO UPDATE SET value = excluded.value")
                    params: tuple[object, ...] = (PRODUCER_CHECKPOINT, checkpoint.dumps())
                    if log_floor_scn is not None:
                        sql += ("; INSERT INTO dbus_state (name, value) VALUES (%s, %s)"
                                " ON CONFLICT (name) DO NOTHING")
                        params += (LOG_FLOOR_SCN, str(log_floor_scn))
                    cur.execute(sql + "; COMMIT", params)
                except BaseException:
                    if not conn.closed:
                        with contextlib.suppress(psycopg2.Error):
                            cur.execute("ROLLBACK")
                    raise
        except psycopg2.Error as exc:
            self._failed(exc, conn)
        finally:
            if not conn.closed:
                try:
                    conn.autocommit = False
                except psycopg2.Error:
                    # Never hand the next transaction a connection left in autocommit.
                    self._drop_connection()

    def _insert_windows(self, cur: Cursor, rows: list[tuple[int, int, int, int]]) -> None:
        # COPY too: executemany is one round trip per window, which bounded a producer
        # that was behind to a few thousand one-event windows per second.
        copy_windows(cur, rows)

    def _log_cut(self, cut_scn: int) -> int:
        """Whole partitions only: the top of the highest partition lying at or below
        ``cut_scn`` (-1 when none does)."""
        span = self.partition_span
        return ((cut_scn + 1) // span) * span - 1

    def _drop_log(self, source_ids: Sequence[int], cut_scn: int) -> None:
        last_whole = (cut_scn + 1) // self.partition_span - 1
        for source_id in source_ids:
            with self._transaction(write=False) as cur:
                indexes = self._partitions_of(cur, source_id)
            for index in indexes:
                if index <= last_whole:
                    # One partition per transaction: the parent's lock is held briefly.
                    with self._transaction(write=True) as cur:
                        cur.execute(f"DROP TABLE IF EXISTS {log_table(source_id)}_p{index}")
                    self._partitions.discard((source_id, index))


class _PgHold:
    def __init__(self, conn: psycopg2.extensions.connection) -> None:
        self._conn = conn

    def release(self) -> None:
        # Unlock before closing: a closed connection's lock goes only when its server
        # process has exited, after close() returns, so a hold taken again at once (a
        # component restarted in this process) could be refused by our own old hold.
        with contextlib.suppress(psycopg2.Error), self._conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock_all()")
        with contextlib.suppress(psycopg2.Error):
            self._conn.close()


def _first_line(exc: BaseException) -> str:
    """The first line of a driver's message, every configured secret cut out."""
    text = str(exc).strip()
    return redact(text.splitlines()[0]) if text else type(exc).__name__


def encode_copy(rows: Sequence[tuple[int, int, StoredEvent]]) -> io.BytesIO:
    """(scn, seq, event) rows as a binary COPY stream for a log table (also the
    reference the ingest benchmark measures the producer against)."""
    out = io.BytesIO()
    write = out.write
    pack = _COPY_FIXED.pack
    length = _LEN.pack
    write(_COPY_HEADER)
    for scn, seq, event in rows:
        write(pack(7, 8, scn, 4, seq, 2, event.op, 8, event.pkey, 8, event.key_hash))
        write(length(len(event.key)))
        write(event.key)
        write(length(len(event.event)))
        write(event.event)
    write(_COPY_TRAILER)
    out.seek(0)
    return out


def copy_stream(cur: Any, sql: str, stream: bytes) -> None:
    """``COPY ... FROM STDIN`` of a whole stream handed to the driver in one piece:
    psycopg2 reads its file ``size`` bytes at a time and takes the GIL back for each
    piece (8 KiB by default: 500 times for a 4 MiB response)."""
    cur.copy_expert(sql, io.BytesIO(stream), size=max(8192, min(len(stream), 1 << 26)))


def copy_into(cur: Any, table: str,
              rows: LogRows | Sequence[tuple[int, int, StoredEvent]]) -> None:
    if isinstance(rows, LogRows):
        # The producer's rows: encoded straight from the relay response's scan.
        stream = io.BytesIO(b"".join((_COPY_HEADER, rows.copy_data(), _COPY_TRAILER)))
    else:
        stream = encode_copy(rows)
    cur.copy_expert(f"COPY {table} (scn, seq, op, pkey, key_hash, key, event)"
                    " FROM STDIN WITH (FORMAT binary)", stream)


def copy_windows(cur: Any, rows: Sequence[tuple[int, int, int, int]]) -> None:
    """(scn, timestamp_ns, events, bytes) rows into ``dbus_windows`` by binary COPY."""
    out = io.BytesIO()
    out.write(_COPY_HEADER)
    pack = _COPY_WINDOW.pack
    for scn, timestamp_ns, events, size in rows:
        out.write(pack(4, 8, scn, 8, timestamp_ns, 4, events, 8, size))
    out.write(_COPY_TRAILER)
    out.seek(0)
    cur.copy_expert("COPY dbus_windows (scn, timestamp_ns, events, bytes)"
                    " FROM STDIN WITH (FORMAT binary)", out)
