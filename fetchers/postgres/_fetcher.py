"""The PostgreSQL logical decoding fetcher's I/O shell (``postgresql://``, docs/postgres-
logical.md): a replication connection streaming the slot through ``pgoutput``, a second
plain connection for the catalog, heartbeats and slot statistics. The protocol steps
are ``_changes.ChangeStream``; this module only moves bytes and time.

Resume. The relay starts the fetcher after its buffer's max SCN (a commit LSN); the
stream is asked to start just after it and any transaction at or before it is skipped
again by ``ChangeStream``, so a restart never repeats or loses a window.

Confirmation. Every ``status_interval_s`` the fetcher reports to the server, as flushed,
the end LSN of the last transaction it has handled (written to the buffer, or nothing
to capture), after msyncing the buffer (``FetcherContext.flush_buffer``): the slot never
moves past a window the relay could lose, even in a machine crash. Transactions in
progress are never confirmed: the server streams whole transactions at their commit.

Heartbeats. With nothing captured for ``heartbeat_s`` (an idle database, or one busy
only with tables not captured, whose transactions PostgreSQL 15 does not even send), no
transaction end moves the confirmed LSN. psycopg2 confirms the position of the server's
keepalives when nothing is pending since the last confirmed LSN (which follows such
writes, tested); not to depend on that, the fetcher also writes a heartbeat (a
non-transactional ``pg_logical_emit_message``, or an update of the ``databus_heartbeat``
table), which comes back through the slot and is confirmed. The slot's retained WAL is
reported as ``slot_lag_bytes`` in ``/v1/status`` and ``/metrics``.

Lag in seconds (DESIGN 17): the heartbeat message carries the server's clock when it was
written; once it comes back through the slot, everything committed before it has been
read, so the fetcher reports that time as read through (and every commit's time as it
goes). With ``heartbeat = "off"`` nothing says so on an idle database: the lag is then
unknown once windows stop.
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
import time
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

from databus._redact import redact, register_secret
from databus.errors import ConnectionLostError, SourceError, SourceMisconfiguredError
from databus.fetchers._api import ConfiguredSources, Fetcher, FetcherContext, WindowSink
from databus.fetchers._failures import healed_since, remember_quarantined
from databus.fetchers.postgres._catalog import read_table_info
from databus.fetchers.postgres._changes import HEARTBEAT_PREFIX, ChangeStream, TableInfo
from databus.fetchers.postgres._dump import LogicalDumpSource
from databus.fetchers.postgres._pgoutput import Relation, format_lsn, parse_lsn
from databus.fetchers.postgres._uri import LogicalSource, parse_logical_source

__all__ = ["LogicalFetcher"]

log = logging.getLogger("databus.fetchers.postgres")

_HEALED = "pg_quarantine_read"  # FetcherContext.memory key (fetchers/_failures.py)
_SLOT_BUSY_WAIT_S = 10.0  # a slot still held by a walsender of a process just killed
_CLOCK_EVERY = 256  # messages read without a pause between two looks at the clock

# What a refused login says when retrying cannot help (the server's words, PostgreSQL
# 15); anything else (refused, timed out, starting up, shutting down) is retried.
_LOGIN_REFUSED = ("password authentication failed", "no pg_hba.conf entry",
                  "must be superuser or replication role", "does not exist",
                  "permission denied for database", "no password supplied")
# SQLSTATEs the server answers that retrying cannot heal: 42704 undefined_object (the
# slot or publication is gone), 55000 object_not_in_prerequisite_state (a slot of
# another database, or invalidated because max_slot_wal_keep_size removed its WAL),
# 55006 object_in_use (the slot is used by another process), 42501 insufficient_
# privilege, 28000/28P01 invalid authorization / password.
_NOT_RETRIABLE = frozenset({"42704", "55000", "55006", "42501", "28000", "28P01"})


class LogicalFetcher(Fetcher):
    """See the module docstring."""

    scheme = "postgresql"

    def __init__(self, uri: str, context: FetcherContext) -> None:
        super().__init__(uri, context)
        self.source: LogicalSource = parse_logical_source(uri)
        if self.source.password:
            register_secret(self.source.password)
        self._side: Any = None
        self._repl: Any = None

    # -- what the relay asks ----------------------------------------------------------

    def configured_sources(self) -> ConfiguredSources:
        return ConfiguredSources(
            names=frozenset(str(t) for t in self.source.tables if not t.is_pattern),
            databases=frozenset(t.schema for t in self.source.tables if t.is_pattern))

    def initial_scn(self) -> int | None:
        if self.source.start != "latest":
            return None  # everything the slot still holds
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_current_wal_lsn()::text")
                row = cur.fetchone()
            return parse_lsn(row[0])
        finally:
            conn.close()

    def open_dump_source(self) -> LogicalDumpSource:
        return LogicalDumpSource(self.source, self.context, self._connect)

    def close(self) -> None:
        for conn in (self._repl, self._side):
            if conn is not None:
                with contextlib.suppress(psycopg2.Error):
                    conn.close()
        self._repl = self._side = None

    # -- connections ------------------------------------------------------------------

    def _connect(self, *, replication: bool = False) -> Any:
        kwargs = self.source.connect_kwargs()
        if replication:
            kwargs["connection_factory"] = psycopg2.extras.LogicalReplicationConnection
        try:
            conn = psycopg2.connect(**kwargs)
        except psycopg2.OperationalError as exc:
            text = redact(" ".join(str(exc).split()))
            if any(phrase in text for phrase in _LOGIN_REFUSED):
                raise SourceMisconfiguredError(
                    f"PostgreSQL {self.source.redacted}: {text}") from None
            raise ConnectionLostError(f"cannot connect to PostgreSQL {self.source.redacted}: "
                                      f"{text}") from None
        if not replication:
            conn.autocommit = True
        return conn

    def _preflight(self, side: Any, start_after_scn: int | None = None) -> None:
        """The clear, non-retriable errors: logical WAL, the slot, the publication.
        ``start_after_scn`` is where the relay's buffer ends (None: it never read)."""
        src = self.source
        with side.cursor() as cur:
            cur.execute("SHOW wal_level")
            wal_level = cur.fetchone()[0]
            if wal_level != "logical":
                raise SourceMisconfiguredError(
                    f"PostgreSQL {src.redacted}: wal_level is {wal_level!r}, logical "
                    "decoding needs 'logical' (ALTER SYSTEM SET wal_level = logical; then "
                    "restart the server)")
            cur.execute("SELECT plugin, database, active_pid FROM pg_replication_slots "
                        "WHERE slot_name = %s", (src.slot,))
            slot = cur.fetchone()
            if slot is None:
                if start_after_scn is not None:
                    # The buffer has windows from this slot: it was dropped under the
                    # relay. A new slot starts at the server's current position.
                    raise SourceMisconfiguredError(
                        f"PostgreSQL {src.redacted}: replication slot {src.slot!r} does "
                        "not exist any more: it was dropped after this relay had read up "
                        f"to LSN {format_lsn(start_after_scn)}. A new slot starts at the "
                        "server's current position, so the changes in between are lost to "
                        "this relay: create the slot again (databus pg setup --source ...), "
                        "restart the relay, and dump the tables (databus dump) so that "
                        "consumers get their current rows")
                raise SourceMisconfiguredError(
                    f"PostgreSQL {src.redacted}: replication slot {src.slot!r} does not "
                    f"exist: run databus pg setup --source ... to create it")
            plugin, database, _active = slot
            if plugin != "pgoutput" or database != src.dbname:
                raise SourceMisconfiguredError(
                    f"PostgreSQL {src.redacted}: slot {src.slot!r} is a {plugin!r} slot of "
                    f"database {database!r}; this fetcher needs a pgoutput slot of "
                    f"{src.dbname!r}")
            cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                        (src.publication,))
            if cur.fetchone() is None:
                raise SourceMisconfiguredError(
                    f"PostgreSQL {src.redacted}: publication {src.publication!r} does not "
                    "exist: run databus pg setup --source ... to create it")
            cur.execute("SELECT schemaname, tablename FROM pg_publication_tables "
                        "WHERE pubname = %s", (src.publication,))
            published = {(s, t) for s, t in cur.fetchall()}
            missing = [str(t) for t in src.tables
                       if not t.is_pattern and (t.schema, t.table) not in published]
            if missing:
                raise SourceMisconfiguredError(
                    f"PostgreSQL {src.redacted}: publication {src.publication!r} does not "
                    f"publish {', '.join(missing)}: ALTER PUBLICATION {src.publication} "
                    f"ADD TABLE {', '.join(missing)} (or run databus pg setup)")
        self._wait_slot_free(side)

    def _wait_slot_free(self, side: Any) -> None:
        deadline = time.monotonic() + _SLOT_BUSY_WAIT_S
        while True:
            with side.cursor() as cur:
                cur.execute("SELECT s.active_pid, host(a.client_addr), a.application_name "
                            "FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON "
                            "a.pid = s.active_pid WHERE s.slot_name = %s", (self.source.slot,))
                row = cur.fetchone()
            if row is None or row[0] is None:
                return
            if time.monotonic() >= deadline:
                raise SourceMisconfiguredError(
                    f"PostgreSQL {self.source.redacted}: replication slot "
                    f"{self.source.slot!r} is in use by process {row[0]} "
                    f"({row[2] or 'unknown application'} from {row[1] or 'local'}): one "
                    "slot serves one relay; give this relay a slot of its own")
            time.sleep(0.2)

    # -- the stream -------------------------------------------------------------------

    def run(self, sink: WindowSink, start_after_scn: int | None,
            stop: threading.Event) -> None:
        src = self.source
        self._side = side = self._connect()
        options = {"proto_version": "1", "publication_names": src.publication,
                   "messages": "true"}
        start_lsn = start_after_scn + 1 if start_after_scn is not None else 0
        try:
            self._preflight(side, start_after_scn)
            self._repl = repl = self._connect(replication=True)
            cur = repl.cursor()
            # psycopg2's own feedback (its replies to the server's keepalives) has a
            # 1 s floor; the fetcher confirms every status_interval_s itself.
            cur.start_replication(slot_name=src.slot, decode=False, start_lsn=start_lsn,
                                  options=options,
                                  status_interval=max(1.0, src.status_interval_s))
        except psycopg2.Error as exc:
            raise self._stream_error(exc, "starting replication") from None
        log.info("streaming slot %s of %s from %s", src.slot, src.redacted,
                 format_lsn(start_lsn) if start_lsn else "its confirmed position")
        quarantined = self.context.quarantined()
        stream = ChangeStream(sink, self.context.catalog, self.context.partition_id,
                              src.matches, self._table_info, start_after_scn,
                              quarantine=self.context.quarantine, quarantined=quarantined,
                              healed=healed_since(self.context, _HEALED, quarantined))
        confirmed = 0
        last_confirm = last_stats = time.monotonic()
        last_progress = time.monotonic()
        progress_lsn: int | None = None
        read_through: int | None = None
        unchecked = 0
        try:
            while not stop.is_set():
                msg = cur.read_message()
                if msg is not None:
                    stream.feed_payload(msg.payload, msg.data_start)
                    # A stream that never pauses (a catch-up after an outage, a fetcher
                    # slower than the server) must still confirm and report as it goes.
                    unchecked += 1
                    if unchecked < _CLOCK_EVERY:
                        continue
                unchecked = 0
                now = time.monotonic()
                target = stream.confirmable
                if target is not None and target != progress_lsn:
                    progress_lsn, last_progress = target, now
                if stream.read_through_ns is not None and \
                        stream.read_through_ns != read_through:
                    read_through = stream.read_through_ns
                    self.context.report_read_through(read_through,
                                                     2 * src.heartbeat_s + 1.0)
                if (target is not None and target > confirmed
                        and now - last_confirm >= src.status_interval_s):
                    # What the buffer holds must survive a machine crash before the slot
                    # forgets it.
                    self.context.flush_buffer()
                    cur.send_feedback(write_lsn=target, flush_lsn=target, apply_lsn=target)
                    confirmed, last_confirm = target, now
                if (src.heartbeat != "off" and not stream.in_transaction
                        and now - last_progress >= src.heartbeat_s):
                    self._heartbeat(side)
                    last_progress = now
                if now - last_stats >= min(src.heartbeat_s, 5.0):
                    self._report_slot(side)
                    last_stats = now
                if msg is None:
                    select.select([repl], [], [], min(src.status_interval_s, 0.5))
        except psycopg2.Error as exc:
            raise self._stream_error(exc, "replication stream ended") from None
        finally:
            remember_quarantined(self.context, _HEALED, stream.quarantined, stream.healed,
                                 stream.read_lsn)
            if confirmed and stream.confirmable and stream.confirmable > confirmed:
                try:
                    self.context.flush_buffer()
                    cur.send_feedback(write_lsn=stream.confirmable,
                                      flush_lsn=stream.confirmable, force=True)
                except psycopg2.Error:
                    pass

    def _stream_error(self, exc: psycopg2.Error, what: str) -> Exception:
        """The error ``run`` raises for a psycopg2 error: what the server says cannot
        change by retrying (a missing or invalidated slot or publication, a slot in use)
        is not retriable; a lost connection or a server shutting down is."""
        src = self.source
        text = redact(" ".join(str(exc).split())) or type(exc).__name__
        code = getattr(exc, "pgcode", None)
        if code in _NOT_RETRIABLE:
            return SourceMisconfiguredError(f"PostgreSQL {src.redacted}: {what}: {text}")
        if code is None or isinstance(exc, psycopg2.OperationalError) or code.startswith(
                ("08", "57")):
            # No SQLSTATE: libpq's own report of a stream the server ended ("no COPY in
            # progress" after a clean shutdown, "error with status PGRES_COPY_BOTH" after
            # a crash); 08: connection exceptions; 57: shutdown, crash, recovery.
            return ConnectionLostError(
                f"PostgreSQL {src.redacted}: {what}: the connection was lost or the "
                f"server shut down or restarted ({text}); retrying")
        return SourceError(f"PostgreSQL {src.redacted}: {what}: {text}")

    def _table_info(self, relation: Relation) -> TableInfo:
        with self._side.cursor() as cur:
            return read_table_info(cur, relation)

    def _heartbeat(self, side: Any) -> None:
        with side.cursor() as cur:
            if self.source.heartbeat == "message":
                # The server's clock in microseconds since the epoch (lag in seconds).
                cur.execute("SELECT pg_logical_emit_message(false, %s, (extract(epoch "
                            "FROM clock_timestamp()) * 1000000)::bigint::text)",
                            (HEARTBEAT_PREFIX,))
            else:
                cur.execute("INSERT INTO databus_heartbeat (id, beat) VALUES (1, now()) "
                            "ON CONFLICT (id) DO UPDATE SET beat = excluded.beat")

    def _report_slot(self, side: Any) -> None:
        with side.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text, "
                        "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
                        "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                        "confirmed_flush_lsn::text FROM pg_replication_slots "
                        "WHERE slot_name = %s", (self.source.slot,))
            row = cur.fetchone()
        if row is None:
            raise SourceMisconfiguredError(
                f"PostgreSQL {self.source.redacted}: replication slot "
                f"{self.source.slot!r} was dropped while the relay ran")
        current, lag, retained, confirmed = row
        # Not reported as the source SCN: WAL moves with every write, captured or not,
        # so "behind" would be the distance to any write; the slot's lag says it right.
        self.context.report_details({
            "server_lsn": current,
            "slot_lag_bytes": int(lag or 0), "slot_retained_bytes": int(retained or 0),
            "slot_confirmed_lsn": confirmed})
