"""The MySQL/MariaDB binlog fetcher: the replication stream -> one window per transaction.

``run`` checks the server, finds the binlog position just after the SCN it must resume
after, registers today's schema of every captured table, and follows the binlog as a
replica would (mysql-replication, ``COM_BINLOG_DUMP`` by file and position: with
``is_mariadb=True`` and no GTID position the library would ignore them).

A transaction is everything from its GTID event (or ``BEGIN``) to its XID event (or
``COMMIT``); its rows, trigger-written ones included, are kept in memory in binlog order
and written as one window when the transaction ends, because the window's SCN,
``(file number << 32) | end position``, is only known then. Transactions that touch no
captured table write no window. DDL writes no window either: it invalidates the cached
table layouts, and the next table map event of a changed table registers its new schema
version (see ``_schema``).

Per-source failures (DESIGN 17): an event of one captured table that cannot be
captured (a change logged as a statement, a rows event that does not decode with the
table's layout, a table the relay cannot name or whose columns it cannot read) sets that
table aside through ``FetcherContext.quarantine``, in the window of the transaction it
was met in (a window holding only the quarantine when nothing else was captured), and
its rows are left out of that window and every later one; the other tables go on.
Settings of the whole server (at start) stay failures of the fetcher.

Failures: a lost connection the library cannot re-establish at once raises a retriable
``SourceError``; the fetcher host then starts a new fetcher after a backoff, from the
buffer's max SCN, so a half-read transaction is read again from its start and nothing is
lost or repeated. Misconfiguration, bad credentials and purged binlogs are not retriable.

Lag: while idle the server sends a heartbeat every ``heartbeat_ms``; each one tells the
host that the source has nothing newer than the last window (lag 0). While busy the
fetcher polls the server's position about once a second.

Lag in seconds (DESIGN 17): a window is read through its commit time (the binlog's, in
whole seconds); a heartbeat, or a position poll that finds nothing unread, is read
through the moment it was received (the relay's clock: the server sends a heartbeat
only once it has nothing more after our position); a transaction of no captured table
is read through its commit time. Silent for two heartbeats and a second, the host
shows the lag as unknown.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, ClassVar

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    StopEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    PartialUpdateRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from databus._redact import register_uri
from databus.errors import SourceError
from databus.fetchers._api import (
    ConfiguredSources,
    DumpSource,
    Fetcher,
    FetcherContext,
    WindowSink,
)
from databus.fetchers.mysql._capture import Capture
from databus.fetchers.mysql._scn import BinlogPosition
from databus.fetchers.mysql._server import (
    check_server,
    connect,
    current_position,
    resolve_start,
)
from databus.fetchers.mysql._uri import SYSTEM_DATABASES, BinlogSourceConfig

__all__ = ["BinlogFetcher"]

log = logging.getLogger("databus.fetchers.mysql")

_EVENTS = [
    RotateEvent, FormatDescriptionEvent, GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent,
    TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, PartialUpdateRowsEvent,
    HeartbeatLogEvent, XAPrepareEvent, StopEvent,
]


# -- the fetcher ----------------------------------------------------------------------


class BinlogFetcher(Fetcher):
    """``mysql://`` and ``mariadb://``: captures a server's binlog (see the module doc)."""

    scheme: ClassVar[str] = "mysql"

    def __init__(self, uri: str, context: FetcherContext) -> None:
        # Before anything can fail: the password is cut out of every message from here.
        register_uri(uri)
        super().__init__(uri, context)
        self.config = BinlogSourceConfig.from_uri(uri)  # config errors surface at start-up
        self._lock = threading.Lock()
        self._control: pymysql.Connection[Any] | None = None
        self._stream: BinLogStreamReader | None = None
        self._checked = False
        self._closed = False

    # -- control connection ---------------------------------------------------------

    def _connection(self) -> pymysql.Connection[Any]:
        with self._lock:
            if self._closed:
                raise SourceError("the fetcher was closed")
            conn = self._control
        if conn is None:
            conn = connect(self.config, f"connecting to {self.config.address}")
            with self._lock:
                if self._closed:
                    conn.close()
                    raise SourceError("the fetcher was closed")
                self._control = conn
        if not self._checked:
            info = check_server(conn, self.config)
            self._checked = True
            log.info("capturing %s (%s): %s", self.config.address, info.version,
                     self.config.selector.describe())
        return conn

    def _drop_connection(self) -> None:
        with self._lock:
            conn, self._control = self._control, None
        if conn is not None:
            # It may be broken already; closing is best effort.
            with contextlib.suppress(Exception):
                conn.close()

    def configured_sources(self) -> ConfiguredSources:
        """``tables=``: exact names are listed by the relay before their tables exist."""
        selector = self.config.selector
        return ConfiguredSources(
            names=frozenset(f"{db}.{table}" for db, table in selector.tables),
            databases=selector.databases,
            everything=selector.everything,
            excluded_databases=SYSTEM_DATABASES,
        )

    def open_dump_source(self) -> DumpSource:
        """Chunks and watermarks on a connection of its own (``_dump``)."""
        from databus.fetchers.mysql._dump import MysqlDumpSource

        return MysqlDumpSource(self.config, self.context)

    def initial_scn(self) -> int:
        """The server's current binlog end: a new relay starts there."""
        return current_position(self._connection(), self.config).scn

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception as exc:
                log.debug("closing the binlog stream: %s", exc)
        self._drop_connection()

    # -- run --------------------------------------------------------------------------

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        conn = self._connection()
        if start_after_scn is None:
            start = current_position(conn, self.config)
            start_after_scn = start.scn
        else:
            start = resolve_start(conn, self.config, start_after_scn)
        capture = Capture(self, sink, start, start_after_scn, stop)
        capture.register_current_schemas(conn)
        capture.report_position(caught_up=False)
        stream = BinLogStreamReader(
            connection_settings=self.config.connect_kwargs(),
            server_id=self.config.server_id,
            resume_stream=True,
            blocking=True,
            log_file=start.file,
            log_pos=start.position,
            only_events=_EVENTS,
            only_schemas=self.config.binlog_schemas(),
            # Table maps are decoded once per table id and binlog file; _Capture clears
            # the map on every DDL and file change (ids are only unique within a file).
            freeze_schema=True,
            slave_heartbeat=self.config.heartbeat_s,
            is_mariadb=False,
            enable_logging=False,
            pymysql_wrapper=_pymysql_connect,
        )
        with self._lock:
            closed = self._closed
            self._stream = stream
        try:
            if closed:
                return
            log.info("reading the binlog of %s from %s (after SCN %d)", self.config.address,
                     start, start_after_scn)
            capture.follow(stream)
        finally:
            capture.remember()
            # Also when close() ran meanwhile: the library may have reconnected after it.
            with contextlib.suppress(Exception):
                stream.close()

    def poll_position(self) -> BinlogPosition | None:
        """The server's current binlog end, or None if it cannot be read right now."""
        try:
            return current_position(self._connection(), self.config)
        except SourceError as exc:
            if not exc.retriable:
                raise
            self._drop_connection()
            return None


def _pymysql_connect(**kwargs: Any) -> pymysql.Connection[Any]:
    """``pymysql.connect`` for the library, which still passes the deprecated ``db=``."""
    if "db" in kwargs:
        kwargs["database"] = kwargs.pop("db")
    return pymysql.connect(**kwargs)
