"""One run of the binlog fetcher (``_fetcher.BinlogFetcher.run``): the state it keeps
(position, table layouts, the open transaction) and what it does with each binlog
event; see ``_fetcher``'s docstring for the whole. Per-source failures (DESIGN 17) are
set aside here (``Capture.fail``) and quarantined when their transaction's window is
written."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
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

from databus._limited_log import limited
from databus.batch import encode_event
from databus.errors import ConfigError, DatabusError, SourceError
from databus.event import Key, Op
from databus.fetchers._api import SourceFailure, WindowSink
from databus.fetchers._failures import (
    catalog_refusal,
    heal_fix,
    healed_since,
    remember_quarantined,
)
from databus.fetchers.mysql._avro_writers import encode_row
from databus.fetchers.mysql._binlog_values import RowDecoder
from databus.fetchers.mysql._errors import SourceMisconfiguredError
from databus.fetchers.mysql._keys import KeyOf, row_key_function
from databus.fetchers.mysql._schema import (
    QueryKind,
    TableShape,
    classify_query,
    dml_target,
    shape_from_table_map,
    truncate_target,
)
from databus.fetchers.mysql._scn import BinlogPosition, binlog_file_number, make_scn
from databus.fetchers.mysql._server import current_shapes, source_error, unlisted_databases
from databus.fetchers.mysql._uri import TableSelector
from databus.schemas import Schema

if TYPE_CHECKING:
    from databus.fetchers.mysql._fetcher import BinlogFetcher

__all__ = ["Capture"]

log = logging.getLogger("databus.fetchers.mysql")
_MARIADB_FL_STANDALONE = 0x01
# The source id of watermark rows in a transaction (never written as an event).
_WATERMARK = -1
_NO_SCHEMA = Schema({"type": "record", "name": "databus_watermark", "fields": []})


def _no_key(values: Any, encoded: bytes) -> Key:
    return b""

_POLL_INTERVAL_S = 1.0
_HEALED = "binlog_quarantine_read"  # FetcherContext.memory key (healed_since)


# -- tables ---------------------------------------------------------------------------

@dataclass(slots=True)
class _Table:
    """A captured table in one layout: how to decode, key and label its rows."""

    shape: TableShape
    source_id: int
    schema: Schema
    decoder: RowDecoder
    key_of: KeyOf
    has_pk: bool
    present: bytes  # the columns-present bitmap of a FULL row image


@dataclass(slots=True)
class _Txn:
    """The transaction being read: its rows, as (source id, op, key, value, fingerprint)."""

    standalone: bool = False  # MariaDB: a single statement with no COMMIT (DDL)
    rows: list[tuple[int, Op, Key, bytes, int]] = field(default_factory=list)
    # Sources set aside in this transaction: name -> (reason, fix), quarantined when
    # its window (SCN) is written.
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)


class Capture:
    """The state of one run: position, table layouts, the open transaction."""

    def __init__(self, fetcher: BinlogFetcher, sink: WindowSink, start: BinlogPosition,
                 start_after_scn: int, stop: threading.Event) -> None:
        self.fetcher = fetcher
        self.config = fetcher.config
        self.context = fetcher.context
        self.sink = sink
        self.stop = stop
        self.file = start.file
        self.file_number = binlog_file_number(start.file)
        self.position = start.position  # the end of the last event read
        self.last_scn = start_after_scn  # the newest window written (or the start)
        self.read_scn = start_after_scn  # the end of the newest transaction read
        self.txn: _Txn | None = None
        self.tables: dict[tuple[str, str], _Table] = {}
        self.by_table_id: dict[int, _Table | None] = {}
        self.schemas: dict[tuple[Any, ...], Schema] = {}
        self.source_ids: dict[str, int] = {}
        # Sources whose schema this run registered: a DDL makes the fetcher look for
        # captured tables not among them (created after the relay started).
        self.registered: set[str] = set()
        self.next_poll = time.monotonic() + _POLL_INTERVAL_S
        self.table_map: dict[int, Any] | None = None
        # Sources in quarantine (the host's, read once per run: a heal restarts the
        # fetcher) and those set aside by this run, even before their window is written.
        self.quarantined: set[str] = set(self.context.quarantined())
        if self.quarantined:
            log.warning("not capturing quarantined source(s) %s (databus relay heal)",
                        ", ".join(sorted(self.quarantined)))
        # Sources healed since the last run: what the last run had read of them (up to
        # that SCN) after the buffer's end is skipped, since the heal's dump brings it;
        # else a failure it met there would set the source aside again.
        self.healed = healed_since(self.context, _HEALED, self.quarantined)

    # -- schemas ----------------------------------------------------------------------

    def _source_id(self, name: str) -> int:
        source_id = self.source_ids.get(name)
        if source_id is None:
            source_id = self.source_ids[name] = self.context.catalog.source_id(name)
        return source_id

    def _schema(self, shape: TableShape) -> Schema:
        signature = shape.schema_signature()
        schema = self.schemas.get(signature)
        if schema is None:
            schema = self.context.catalog.register_schema(shape.source_name, shape.avro_schema())
            self.schemas[signature] = schema
            self.registered.add(shape.source_name)
            log.info("source %s: schema version %016x (%d columns)", shape.source_name,
                     schema.fingerprint, len(shape.columns))
        return schema

    def register_current_schemas(self, conn: pymysql.Connection[Any]) -> None:
        """Make every captured table known before its first row (best effort)."""
        try:
            shapes = current_shapes(conn, self.config, self.config.selector)
            unlisted = unlisted_databases(conn, self.config, self.config.selector)
        except SourceError as exc:
            if not exc.retriable:
                raise
            limited(log).warning("could not read information_schema of %s: %s", self.config.address,
                                 exc)
            return
        self.context.report_unlisted(unlisted)
        if unlisted:
            log.warning("the relay's user cannot see database(s) %s at %s (no privilege on "
                        "them, or they do not exist): their tables are captured from their "
                        "first change, but consumers waiting for them cannot be told whether "
                        "they exist; to list them, GRANT SELECT ON <db>.* to the relay's user",
                        ", ".join(sorted(unlisted)), self.config.address)
        for shape in shapes:
            if shape.source_name in self.quarantined:
                continue
            try:
                self._source_id(shape.source_name)
            except ConfigError:
                continue  # set aside at its first change (_table_map)
            self._schema(shape)

    def discover_new_tables(self) -> None:
        """After DDL: register captured tables this run has not seen yet (a CREATE TABLE
        or RENAME of a configured table), so the relay lists them as soon as they exist
        rather than at their first row. Best effort, like ``register_current_schemas``:
        the first row registers the table anyway."""
        selector = self.config.selector
        unseen = frozenset(t for t in selector.tables if f"{t[0]}.{t[1]}" not in self.registered)
        if not unseen and not selector.databases and not selector.everything:
            return  # every configured table is known: the common case costs nothing
        narrowed = TableSelector(unseen, selector.databases, selector.everything)
        try:
            shapes = current_shapes(self.fetcher._connection(), self.config, narrowed)
        except SourceError as exc:
            if not exc.retriable:
                raise
            limited(log).warning("could not read information_schema of %s after DDL: %s",
                                 self.config.address, exc)
            return
        for shape in shapes:
            if shape.source_name not in self.registered and (
                    shape.source_name not in self.quarantined):
                try:
                    self._source_id(shape.source_name)
                except ConfigError:
                    continue  # set aside at its first change (_table_map)
                self._schema(shape)
                log.info("source %s: table created, now listed by the relay", shape.source_name)

    def _table(self, shape: TableShape) -> _Table:
        key = (shape.database, shape.table)
        table = self.tables.get(key)
        if table is not None and table.shape == shape:
            return table
        n = len(shape.columns)
        table = _Table(
            shape=shape,
            source_id=self._source_id(shape.source_name),
            schema=self._schema(shape),
            decoder=RowDecoder(shape.columns),
            key_of=row_key_function(shape.columns, shape.primary_key),
            has_pk=bool(shape.primary_key),
            present=((1 << n) - 1).to_bytes((n + 7) // 8, "little"),
        )
        if not shape.primary_key:
            log.warning("table %s has no primary key: its rows are keyed by a hash of the "
                        "whole row and updates become delete + insert", shape.source_name)
        self.tables[key] = table
        return table

    def _forget_layouts(self) -> None:
        """After DDL or a file change: table ids and layouts must be read again."""
        self.by_table_id.clear()
        if self.table_map is not None:
            self.table_map.clear()

    # -- lag --------------------------------------------------------------------------

    def report_position(self, *, caught_up: bool) -> None:
        """Tell the host the source's newest SCN: ours when nothing newer is there."""
        report = self.context.report_source_scn
        asked = time.time_ns()
        if caught_up:
            report(self.last_scn)
            self.read_through(asked)
            return
        position = self.fetcher.poll_position()
        if position is None:
            return
        try:
            scn = position.scn
        except ValueError:
            return
        report(self.last_scn if scn <= self.read_scn else scn)
        if scn <= self.read_scn:
            self.read_through(asked)  # nothing unread when the position was asked

    def read_through(self, time_ns: int) -> None:
        """``FetcherContext.report_read_through``: silence past two heartbeats and a
        second makes the lag unknown."""
        self.context.report_read_through(time_ns, 2 * self.config.heartbeat_s + 1.0)

    # -- the loop ---------------------------------------------------------------------

    def follow(self, stream: BinLogStreamReader) -> None:
        self.table_map = stream.table_map
        stop = self.stop
        config = self.config
        while not stop.is_set():
            try:
                event = stream.fetchone()
            except DatabusError:
                raise
            except Exception as exc:
                if stop.is_set():
                    return  # close() from the host broke the socket on purpose
                raise source_error(exc, config, "reading the binlog") from exc
            if event is None:
                if stop.is_set():
                    return
                raise SourceError(f"the binlog stream of {config.address} ended")
            # The library swaps its table map dict on a real rotation: follow it.
            self.table_map = stream.table_map
            self.handle(event)
            if time.monotonic() >= self.next_poll:
                self.next_poll = time.monotonic() + _POLL_INTERVAL_S
                self.report_position(caught_up=False)

    def handle(self, event: Any) -> None:
        position = event.packet.log_pos
        if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
            if isinstance(event, PartialUpdateRowsEvent):
                table = self.by_table_id.get(event.table_id)
                if table is not None and table.source_id != _WATERMARK:
                    self.fail(table.shape.source_name,
                              f"a partial JSON update at {self.file}:{position} does not "
                              "hold the whole row",
                              "set binlog_row_value_options='' on the server and in "
                              "every session")
                return
            self._rows(event)
        elif isinstance(event, TableMapEvent):
            self._table_map(event)
        elif isinstance(event, XidEvent):
            self._commit(position, event.timestamp)
        elif isinstance(event, (MariadbGtidEvent, GtidEvent)):
            self._begin(event, standalone=isinstance(event, MariadbGtidEvent)
                        and bool(event.flags & _MARIADB_FL_STANDALONE))
        elif isinstance(event, QueryEvent):
            self._query(event, position)
        elif isinstance(event, HeartbeatLogEvent):
            self.report_position(caught_up=True)
        elif isinstance(event, RotateEvent):
            self._rotate(event)
            return
        elif isinstance(event, XAPrepareEvent):
            raise SourceMisconfiguredError(
                f"XA transaction at {self.file}:{position}: XA PREPARE/COMMIT is not "
                "supported by the binlog fetcher"
            )
        if position:
            self.position = position

    def _rotate(self, event: RotateEvent) -> None:
        name = event.next_binlog
        if name != self.file:
            if self.txn is not None and self.txn.rows:
                limited(log).warning("binlog %s ended inside a transaction (server crash?): its "
                                     "%d rows were never committed", self.file, len(self.txn.rows))
            self._drop_txn()
            self.file = name
            self.file_number = binlog_file_number(name)
            self._forget_layouts()
        self.position = event.position

    def _begin(self, event: Any, *, standalone: bool) -> None:
        if self.txn is not None and (self.txn.rows or self.txn.failures):
            # A group with rows but no XID/COMMIT (not written by MariaDB or MySQL as far
            # as we know): it ended where this one starts.
            self._commit(self.position, event.timestamp)
        self.txn = _Txn(standalone=standalone)

    def _query(self, event: QueryEvent, position: int) -> None:
        kind = classify_query(event.query)
        if kind is QueryKind.BEGIN:
            if self.txn is None:
                self.txn = _Txn()
        elif kind is QueryKind.COMMIT:
            self._commit(position, event.timestamp)
        elif kind is QueryKind.ROLLBACK:
            if self.txn is not None and self.txn.rows:
                limited(log).warning("transaction ending at %s:%d was rolled back: its %d rows "
                                     "(non-transactional tables) are not captured", self.file,
                                     position, len(self.txn.rows))
            self._drop_txn()
        elif kind is QueryKind.XA:
            raise SourceMisconfiguredError(
                f"XA transaction at {self.file}:{position}: XA PREPARE/COMMIT is not "
                "supported by the binlog fetcher"
            )
        elif kind is QueryKind.DML:
            self._statement_dml(event, position)
        elif kind is QueryKind.OTHER:
            self._forget_layouts()
            log.info("DDL at %s:%d: %s", self.file, position, _shorten(event.query))
            self._truncate(event, position)
            self.discover_new_tables()
            if self.txn is not None and self.txn.standalone:
                self._commit(position, event.timestamp)

    def _truncate(self, event: QueryEvent, position: int) -> None:
        """A TRUNCATE of a captured table deletes its rows with no row event: consumers
        would keep them. The table is set aside; the heal's dump re-sends what exists."""
        target = truncate_target(event.query, _default_database(event))
        if target is not None and self.config.selector.matches(*target):
            if self.txn is None:
                self.txn = _Txn(standalone=True)
            self.fail(f"{target[0]}.{target[1]}",
                      f"TRUNCATE TABLE at {self.file}:{position} deleted its rows with no "
                      "row event, so consumers would keep them",
                      "nothing to change at the source (use DELETE FROM to keep a table "
                      "captured); the heal's dump re-sends the rows that exist")

    def _statement_dml(self, event: QueryEvent, position: int) -> None:
        default_db = _default_database(event)
        target = dml_target(event.query, default_db)
        if target is None:
            limited(log).warning("statement-format change at %s:%d not captured: %s", self.file,
                                 position, _shorten(event.query))
        elif self.config.selector.matches(*target):
            source = f"{target[0]}.{target[1]}"
            self.fail(source,
                      f"a change to it was logged as a statement at {self.file}:{position} "
                      "(a session used binlog_format=STATEMENT or MIXED): its rows are not "
                      "in the binlog and cannot be captured",
                      "make every session that writes it log rows (binlog_format=ROW; "
                      "no SET SESSION binlog_format=STATEMENT or MIXED)")

    # -- per-source failures (DESIGN 17) ------------------------------------------------

    def _drop_txn(self) -> None:
        """Forget the open transaction (rolled back, or cut by a crash): a failure met in
        it concerned a change that did not happen."""
        txn, self.txn = self.txn, None
        if txn is not None and txn.failures:
            self.quarantined.difference_update(txn.failures)
            self._forget_layouts()  # their table ids map to None: read them again

    def remember(self) -> None:
        """At the end of the run: what a heal must skip (``healed_since``)."""
        remember_quarantined(self.context, _HEALED, self.quarantined, self.healed,
                             self.read_scn)

    def _skips_healed(self, source: str, position: int) -> bool:
        """Whether ``source`` was healed and this event was read before the heal."""
        through = self.healed.get(source)
        if through is None:
            return False
        if make_scn(self.file_number, position) <= through:
            return True
        del self.healed[source]
        return False

    def fail(self, source: str, reason: str, first_fix: str) -> None:
        """Set ``source`` aside from the open transaction on: its rows are left out, and
        it is quarantined when the transaction's window is written (its SCN)."""
        if source in self.quarantined or self._skips_healed(source, self.position):
            return
        self.quarantined.add(source)
        txn = self.txn
        if txn is None:
            txn = self.txn = _Txn()
        txn.failures[source] = (reason, heal_fix(source, first_fix))
        limited(log).error("source %s: %s; it is set aside, the other tables go on",
                           source, reason, kind=f"fail {source}")
        for table_id, table in list(self.by_table_id.items()):
            if table is not None and table.shape.source_name == source:
                self.by_table_id[table_id] = None

    def _table_map(self, event: TableMapEvent) -> None:
        if (event.schema, event.table) == self.config.watermark_table:
            self.by_table_id[event.table_id] = self._watermark_table(event)
            return
        source = f"{event.schema}.{event.table}"
        if not self.config.selector.matches(event.schema, event.table) or (
                source in self.quarantined) or (
                self.healed and self._skips_healed(source, event.packet.log_pos)):
            self.by_table_id[event.table_id] = None
            return
        try:
            table = self._table(shape_from_table_map(event))
        except SourceMisconfiguredError:
            raise  # binlog_row_metadata changed on the server: every table is concerned
        except ConfigError as exc:
            self.by_table_id[event.table_id] = None
            self.fail(source, *catalog_refusal(source, exc))
            return
        except SourceError as exc:
            self.by_table_id[event.table_id] = None
            self.fail(source, f"its layout in the binlog at {self.file}:"
                      f"{event.packet.log_pos} cannot be read: {exc}",
                      "change the column to a supported type (docs/binlog-fetcher.md)")
            return
        self.by_table_id[event.table_id] = table

    def _watermark_table(self, event: TableMapEvent) -> _Table:
        """The dump watermark table: its rows become ``sink.watermark`` calls (DESIGN 8.1),
        never events, and it is not a source (no id, no schema in the catalog)."""
        shape = shape_from_table_map(event)
        n = len(shape.columns)
        return _Table(shape=shape, source_id=_WATERMARK, schema=_NO_SCHEMA,
                      decoder=RowDecoder(shape.columns), key_of=_no_key, has_pk=True,
                      present=((1 << n) - 1).to_bytes((n + 7) // 8, "little"))

    def _watermark_rows(self, table: _Table, event: Any, txn: _Txn) -> None:
        if isinstance(event, DeleteRowsEvent):
            return  # the dump engine cleaning up
        packet = event.packet
        body = packet.read(event.event_size - packet.read_bytes)
        images = 2 if isinstance(event, UpdateRowsEvent) else 1
        names = [c.name for c in table.shape.columns]
        if "id" not in names:
            limited(log).warning("watermark table %s.%s has no id column: not a "
                                 "databus_watermark table (databus dump setup)",
                                 *self.config.watermark_table)
            return
        at = names.index("id")
        for images_of_row in table.decoder.read_rows(body, images):
            token = images_of_row[-1][at]
            if isinstance(token, str):
                txn.rows.append((_WATERMARK, Op.CONTROL, token, b"", 0))

    def _rows(self, event: Any) -> None:
        table = self.by_table_id.get(event.table_id)
        if table is None:
            return
        txn = self.txn
        if txn is None:
            # Rows outside BEGIN/GTID .. COMMIT/XID do not occur in a ROW binlog.
            txn = self.txn = _Txn()
        if table.source_id == _WATERMARK:
            self._watermark_rows(table, event, txn)
            return
        update = isinstance(event, UpdateRowsEvent)
        where = f"{self.file}:{event.packet.log_pos}"
        source = table.shape.source_name
        if event.number_of_columns != len(table.shape.columns):
            self.fail(source, f"a rows event at {where} has {event.number_of_columns} "
                      f"columns, its table map {len(table.shape.columns)}",
                      "check the table's definition and the server's binlog settings")
            return
        if event.columns_present_bitmap != table.present or (
            update and event.columns_present_bitmap2 != table.present
        ):
            self.fail(source, f"a rows event at {where} lacks columns: a session wrote it "
                      "with binlog_row_image other than FULL",
                      "make every session that writes it log full rows "
                      "(binlog_row_image=FULL)")
            return
        try:
            self._decode_rows(event, table, txn, update)
        except Exception as exc:
            # The values are not in the reason (they are a row's): only what failed.
            self.fail(source, f"a rows event at {where} cannot be decoded with the "
                      f"table's layout ({type(exc).__name__})",
                      "check the table's definition against what the binlog holds "
                      "(docs/binlog-fetcher.md, supported types)")

    def _decode_rows(self, event: Any, table: _Table, txn: _Txn, update: bool) -> None:
        packet = event.packet
        body = packet.read(event.event_size - packet.read_bytes)
        decoder = table.decoder
        writers = decoder.writers
        key_of = table.key_of
        source_id = table.source_id
        fp = table.schema.fingerprint
        append = txn.rows.append
        if isinstance(event, WriteRowsEvent):
            for (after,) in decoder.read_rows(body, 1):
                value = encode_row(writers, after)
                append((source_id, Op.UPSERT, key_of(after, value), value, fp))
        elif isinstance(event, DeleteRowsEvent):
            for (before,) in decoder.read_rows(body, 1):
                value = encode_row(writers, before)
                append((source_id, Op.DELETE, key_of(before, value), value, fp))
        else:
            for before, after in decoder.read_rows(body, 2):
                value = encode_row(writers, after)
                key = key_of(after, value)
                old_value = encode_row(writers, before) if not table.has_pk else b""
                old_key = key_of(before, old_value)
                if old_key != key:
                    # A changed primary key (or any change of a keyless row): the old key
                    # is gone, or consumers would keep it forever.
                    old_value = old_value or encode_row(writers, before)
                    append((source_id, Op.DELETE, old_key, old_value, fp))
                append((source_id, Op.UPSERT, key, value, fp))

    def _commit(self, position: int, timestamp: int) -> None:
        txn, self.txn = self.txn, None
        if not position:
            return
        scn = make_scn(self.file_number, position)
        if txn is not None and (txn.rows or txn.failures):
            if scn <= self.last_scn:
                limited(log).warning("skipping the transaction ending at %s:%d: SCN %d is not "
                                     "after %d, already written", self.file, position, scn,
                                     self.last_scn)
            else:
                self._write(scn, timestamp * 1_000_000_000, txn)
                self.last_scn = scn
        elif timestamp > 0:
            self.read_through(timestamp * 1_000_000_000)  # nothing captured in it
        self.read_scn = max(self.read_scn, scn)

    def _write(self, scn: int, timestamp_ns: int, txn: _Txn) -> None:
        sink = self.sink
        partition = self.context.partition_id
        sink.start_window(scn)
        rows = txn.rows
        if txn.failures:
            # In the open window, so the quarantine is recorded at its SCN; the source's
            # rows read before the failure are left out with the rest.
            for source, (reason, fix) in txn.failures.items():
                self.context.quarantine(SourceFailure(source, scn, reason, fix))
            dropped = {self.source_ids[s] for s in txn.failures if s in self.source_ids}
            rows = [row for row in rows if row[0] not in dropped]
        append = sink.append
        for source_id, op, key, value, fp in rows:
            if source_id == _WATERMARK:
                sink.watermark(str(key))
                append = sink.append  # the dump engine may track this window's keys now
                continue
            append(encode_event(scn, op, source_id, key, value, fp, timestamp_ns, partition))
        sink.end_window(timestamp_ns)


def _default_database(event: QueryEvent) -> str:
    schema = event.schema
    return schema.decode("utf-8", "replace") if isinstance(schema, bytes) else str(schema)


def _shorten(query: str, limit: int = 200) -> str:
    text = " ".join(query.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
