"""Decoded pgoutput messages -> windows (the protocol steps, written once; no I/O but the
sink and two injected look-ups).

A transaction is one window whose SCN is its commit LSN (``Begin.final_lsn``, the same
as ``Commit.commit_lsn``), so windows come in commit order and a window is never split:
``start_window`` is called at the first captured change, ``end_window`` at ``Commit``,
and a transaction that touched no captured table writes nothing. After each
transaction (and each heartbeat message) the position that may be confirmed to the slot
moves to the transaction's end LSN: everything before it is in the buffer or was never
captured.

Rows:

- ``Insert`` -> an upsert event with the new row;
- ``Update`` -> an upsert; when the key changed, a delete of the old key first. A column
  pgoutput marks *unchanged TOAST* (a large value the update did not touch) takes its
  value from the old row, which only ``REPLICA IDENTITY FULL`` sends: without it the
  update cannot be captured whole and the fetcher stops with an error naming the table
  and that fix (``databus pg setup`` reports such tables);
- ``Delete`` -> a delete event with the key, from the old key (``REPLICA IDENTITY
  DEFAULT`` with a primary key, ``USING INDEX`` or ``FULL``); a table whose deletes
  carry no key (``NOTHING``, or no primary key) stops the fetcher with the fix;
- ``Truncate`` of a captured table is refused (not a row change: consumers could not
  apply it in order); the publications ``databus pg setup`` creates do not publish it;
- the dump watermark table's inserts become ``sink.watermark(token)`` (DESIGN 8.1);
- ``Relation`` (sent before a table's first change in a session and again after DDL)
  registers the table's schema: a new version whenever its columns change.

Per-source failures (DESIGN 17): a change of one captured table that cannot be captured
(a value its schema cannot hold, a name the relay cannot serve, an update or delete that
does not name its row, a truncate) sets that table aside through the ``quarantine``
callable (``FetcherContext.quarantine``), in the window of its transaction (whose SCN,
the commit LSN, is known from ``Begin``), and its changes are left out from there on;
the other tables go on. When the table already had events in the open window, the
window is rolled back and ``RereadError`` (retriable) has the host start the fetcher
again: it re-reads the transaction without that table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from databus._limited_log import limited
from databus.batch import encode_event
from databus.errors import ConfigError, DatabusError, SchemaError
from databus.event import Key, Op
from databus.fetchers._api import SourceCatalog, SourceFailure, WindowSink
from databus.fetchers._failures import catalog_refusal, heal_fix
from databus.fetchers._keys import normalize_key
from databus.fetchers.postgres._pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    PgOutputMessage,
    Relation,
    Truncate,
    TupleValue,
    Update,
    decode,
    pg_timestamp_to_unix_ns,
)
from databus.fetchers.postgres._transcode import (
    IMPLEMENTATION,
    RowPlan,
    row_plan,
    transcode_change,
)
from databus.fetchers.postgres._types import ColumnMapping, PgValueError, share_named_types
from databus.schemas import AvroCodec, Schema, avro_names

__all__ = ["CaptureError", "ChangeStream", "ColumnValueError", "RereadError", "TableCodec",
           "TableInfo"]

log = logging.getLogger("databus.fetchers.postgres")

# The reference twin of the fast path is the general path itself: on the pure-Python
# core, running it first would only decode a declined message twice.
_FAST_PATH = IMPLEMENTATION == "native"
_UPSERT = Op.UPSERT

WATERMARK_TABLE = "databus_watermark"
HEARTBEAT_TABLE = "databus_heartbeat"
HEARTBEAT_PREFIX = "databus_heartbeat"


class CaptureError(DatabusError):
    """A change the fetcher cannot capture as configured (not retriable: restarting
    reads the same change again); the message says what to change."""

    code = "capture_error"
    retriable = False


class TableCaptureError(CaptureError):
    """A change of one table that cannot be captured as the table is set up: ``reason``
    what, ``fix`` what to change at the source (the message has both)."""

    def __init__(self, source: str, reason: str, fix: str) -> None:
        super().__init__(f"{source}: {reason}: {fix}")
        self.reason = reason
        self.fix = fix


class ColumnValueError(SchemaError):
    """A value of one column its schema cannot hold (``PgValueError`` of the column's
    converter); ``column`` and ``sql_type`` say which, without the value."""

    code = "bad_source_value"

    def __init__(self, message: str, *, column: str, sql_type: str) -> None:
        super().__init__(message)
        self.column = column
        self.sql_type = sql_type


class RereadError(DatabusError):
    """A table was set aside (quarantined) after some of its changes were written into
    the open window: the window is rolled back and the fetcher started again, to read
    the transaction without that table (retriable, once per such failure)."""

    code = "reread_transaction"
    retriable = True


def _stop(failure: SourceFailure) -> None:
    raise failure.error(retriable=False)


@dataclass(frozen=True, slots=True)
class TableInfo:
    """What the catalog adds to a Relation message: the primary key's columns (in key
    order; empty when there is none) and the columns declared NOT NULL."""

    primary_key: tuple[str, ...]
    not_null: frozenset[str]
    mappings: tuple[ColumnMapping, ...]  # one per Relation column, in order


class TableCodec:
    """One version of a captured table: its Avro schema, and pgoutput tuples -> keys
    and values."""

    def __init__(self, relation: Relation, source_name: str, info: TableInfo) -> None:
        self.relation = relation
        self.source_name = source_name
        self.info = info
        names = [c.name for c in relation.columns]
        if info.primary_key and all(k in names for k in info.primary_key):
            key = list(info.primary_key)
        else:  # the replica identity's columns (USING INDEX, or FULL: every column)
            key = [c.name for c in relation.columns if c.is_key]
        self.key_names = tuple(key)
        self.key_positions = [names.index(k) for k in key]
        # Primary key columns are never NULL: a NULL one in an old tuple was not sent.
        self.keyed_by_primary_key = bool(info.primary_key) and self.key_names == tuple(
            info.primary_key)
        self.field_names = avro_names(names)
        # A named type (the decimal_P_S fixeds) is defined once per schema: later
        # fields refer to it by name.
        avro_types = share_named_types([m.avro for m in info.mappings])
        fields: list[dict[str, Any]] = []
        # Nullability follows the catalog's NOT NULL (and the primary key's columns,
        # NOT NULL by definition): not the replica identity, which under FULL on a table
        # without a primary key is every column, NULLs included.
        required = set(info.not_null) | set(info.primary_key if self.keyed_by_primary_key
                                            else ())
        self.not_null_positions: list[int] = []  # NOT NULL columns outside the key
        self.required_positions: list[int] = []  # every non-nullable field
        for column, name, mapping, avro in zip(relation.columns, self.field_names,
                                               info.mappings, avro_types, strict=True):
            field: dict[str, Any] = {"name": name}
            if column.name in required:
                if not (self.keyed_by_primary_key and column.name in key):
                    self.not_null_positions.append(len(fields))
                self.required_positions.append(len(fields))
                field["type"] = avro
            else:
                branches = avro if isinstance(avro, list) else [avro]
                field["type"] = ["null", *branches]
                field["default"] = None
            field["sql_name"] = column.name
            field["sql_type"] = mapping.sql_type
            fields.append(field)
        self.required = frozenset(self.required_positions)
        namespace, _, table = source_name.rpartition(".")
        record: dict[str, Any] = {
            "type": "record", "name": avro_names([table])[0],
            "namespace": avro_names([namespace])[0],
            "doc": f"Rows of {source_name}, captured by the databus PostgreSQL logical "
                   "decoding fetcher",
            "fields": fields,
            # The key's SQL names, for consumers that keep a copy of the table (the
            # replicator); outside Avro's canonical form, so not in the fingerprint.
            "key": list(key),
        }
        self.schema = Schema(record)
        self.fingerprint = self.schema.fingerprint
        self._codec = AvroCodec(schemas=[self.schema])
        self._converters = [m.convert for m in info.mappings]
        # The fast path of plain inserts and updates (None: every row the general way).
        self.plan: RowPlan | None = row_plan(self)

    def convert(self, values: Sequence[TupleValue], old: Sequence[TupleValue] | None
                ) -> list[Any]:
        """Python values of a new row; unchanged TOAST values from ``old`` (FULL)."""
        out: list[Any] = []
        for i, value in enumerate(values):
            if value is UNCHANGED_TOAST:
                previous = old[i] if old is not None and i < len(old) else UNCHANGED_TOAST
                if previous is UNCHANGED_TOAST:
                    raise TableCaptureError(
                        self.source_name,
                        f"an UPDATE left the large (TOASTed) column "
                        f"{self.relation.columns[i].name!r} unchanged, and PostgreSQL "
                        "does not send such a value unless the table's old rows are "
                        "logged whole",
                        f"run ALTER TABLE {self.source_name} REPLICA IDENTITY FULL "
                        "(databus pg setup reports these tables)")
                value = previous
            out.append(self._one(i, value))
        return out

    def _one(self, i: int, value: TupleValue) -> Any:
        if value is None:
            return None
        if isinstance(value, bytes):
            value = value.decode("utf-8")  # binary format is never asked for
        assert isinstance(value, str)
        try:
            return self._converters[i](value)
        except PgValueError as exc:
            column = self.relation.columns[i].name
            raise ColumnValueError(f"{self.source_name}.{column}: {exc}", column=column,
                                   sql_type=self.info.mappings[i].sql_type) from None

    def check_old_key(self, key_values: Sequence[Any], what: str) -> None:
        """Refuse an old tuple whose key columns (``key_values``) lack the primary key
        the events are keyed by (its table is ``REPLICA IDENTITY USING INDEX`` of other
        columns): a made-up key would leave the consumers' row in place."""
        if self.keyed_by_primary_key and any(v is None for v in key_values):
            identity = [c.name for c in self.relation.columns if c.is_key]
            raise TableCaptureError(
                self.source_name,
                f"a {what} carries the replica identity's columns "
                f"({', '.join(identity)}), not the primary key "
                f"({', '.join(self.key_names)}) its events are keyed by, so the row it "
                "changed cannot be named",
                f"ALTER TABLE {self.source_name} REPLICA IDENTITY DEFAULT (or FULL) "
                "(databus pg setup warns about such tables)")

    def key(self, row: Sequence[Any]) -> Key:
        values = [row[i] for i in self.key_positions]
        if not values:
            raise TableCaptureError(
                self.source_name,
                "it has no primary key and no replica identity index: its changes have "
                "no key",
                f"add a primary key, or ALTER TABLE {self.source_name} REPLICA IDENTITY "
                "FULL")
        return normalize_key(values)

    def encode(self, row: Sequence[Any]) -> bytes:
        return self._codec.encode(dict(zip(self.field_names, row, strict=True)),
                                  self.schema)


class ChangeStream:
    """The per-session state: relations seen, the open transaction, the confirmable LSN.

    ``table_info(relation)`` reads the catalog for a Relation message (primary key, NOT
    NULL, type mappings); ``wanted(schema, table)`` says whether a table is captured.
    ``skip_through`` is the buffer's max SCN: transactions committed at or before it
    are in the buffer already (a restart may see them again) and are skipped.
    ``quarantine`` sets a source aside (``FetcherContext.quarantine``; the default
    raises), ``quarantined`` the sources set aside already (their changes are skipped).
    """

    def __init__(self, sink: WindowSink, catalog: SourceCatalog, partition_id: int,
                 wanted: Callable[[str, str], bool],
                 table_info: Callable[[Relation], TableInfo],
                 skip_through: int | None, *,
                 quarantine: Callable[[SourceFailure], None] = _stop,
                 quarantined: frozenset[str] = frozenset(),
                 healed: dict[str, int] | None = None) -> None:
        self.sink = sink
        self.catalog = catalog
        self.partition_id = partition_id
        self.wanted = wanted
        self.table_info = table_info
        self.skip_through = skip_through if skip_through is not None else -1
        self.relations: dict[int, Relation] = {}
        self.codecs: dict[int, tuple[TableCodec, int]] = {}  # oid -> (codec, source id)
        # oid -> (plan, source id, fingerprint) of the codecs with a fast path plan
        self.fast: dict[int, tuple[RowPlan, int, int]] = {}
        self.versions: dict[str, Relation] = {}  # source -> relation its schema is of
        self.watermark_oids: set[int] = set()
        self.ignored_oids: set[int] = set()
        self.txn: Begin | None = None
        self.txn_ts = 0  # the open transaction's commit time, ns since the epoch
        self.skipping = False
        self.window_open = False
        self.confirmable: int | None = None  # an end LSN: all before it is handled
        # Lag in seconds (DESIGN 17): the source time everything before is handled at:
        # the newest commit time read (captured or not), or a heartbeat message's time.
        self.read_through_ns: int | None = None
        self.last_scn: int | None = None
        self.windows = 0
        self.events = 0
        self.quarantine = quarantine
        self.quarantined: set[str] = set(quarantined)
        self.window_sources: set[int] = set()  # source ids with events in the window
        # Sources healed since the last run -> the commit LSN up to which their changes
        # are skipped (fetchers/_failures.py, healed_since); those of the open txn.
        self.healed: dict[str, int] = dict(healed or {})
        self.healed_skip: frozenset[str] = frozenset()
        self.read_lsn = self.skip_through  # the newest commit read

    @property
    def in_transaction(self) -> bool:
        return self.txn is not None

    # -- dispatch ---------------------------------------------------------------------

    def feed_payload(self, payload: bytes, wal_start: int = 0) -> None:
        """One pgoutput message as the server sent it. A plain insert or update of a
        captured table whose codec is built goes the fast path (``_transcode``), which
        gives exactly the general path's event or declines; all else is decoded and
        fed."""
        txn = self.txn
        if (_FAST_PATH and txn is not None and not self.skipping and not self.healed_skip
                and len(payload) > 5
                and (payload[0] == 0x49 or payload[0] == 0x55)):  # 'I', 'U'
            found = self.fast.get(int.from_bytes(payload[1:5], "big"))
            if found is not None:
                fast = transcode_change(payload, found[0])
                if fast is not None:
                    if not self.window_open:
                        self._open_window()
                    self.window_sources.add(found[1])
                    self.sink.append(encode_event(
                        txn.final_lsn, _UPSERT, found[1], fast[0], fast[1], found[2],
                        self.txn_ts, self.partition_id))
                    self.events += 1
                    return
        self.feed(decode(payload), wal_start)

    def feed(self, message: PgOutputMessage, wal_start: int = 0) -> None:
        kind = type(message)
        if kind is Insert or kind is Update or kind is Delete:
            self._change(message)  # type: ignore[arg-type]
        elif kind is Begin:
            self._begin(message)  # type: ignore[arg-type]
        elif kind is Commit:
            self._commit(message)  # type: ignore[arg-type]
        elif kind is Relation:
            self._relation(message)  # type: ignore[arg-type]
        elif kind is Truncate:
            self._truncate(message)  # type: ignore[arg-type]
        elif kind is LogicalMessage:
            self._message(message, wal_start)  # type: ignore[arg-type]
        # Origin and Type messages need nothing: types are read from the catalog.

    # -- transactions -----------------------------------------------------------------

    def _begin(self, begin: Begin) -> None:
        if self.txn is not None:
            raise CaptureError(f"pgoutput sent Begin of {begin.final_lsn} inside the "
                               f"transaction of {self.txn.final_lsn}")
        self.txn = begin
        self.txn_ts = pg_timestamp_to_unix_ns(begin.commit_time_us)
        self.skipping = begin.final_lsn <= self.skip_through
        self.window_open = False
        self.window_sources.clear()
        if self.healed:
            self.healed = {s: t for s, t in self.healed.items() if t >= begin.final_lsn}
            self.healed_skip = frozenset(self.healed)

    def _open_window(self) -> None:
        if not self.window_open:
            assert self.txn is not None
            self.sink.start_window(self.txn.final_lsn)
            self.window_open = True

    def _commit(self, commit: Commit) -> None:
        txn = self.txn
        if txn is None:
            raise CaptureError(f"pgoutput sent Commit of {commit.commit_lsn} outside a "
                               "transaction")
        if commit.commit_lsn != txn.final_lsn:
            raise CaptureError(f"pgoutput's Commit LSN {commit.commit_lsn} differs from "
                               f"its Begin's final LSN {txn.final_lsn}")
        if self.window_open:
            self.sink.end_window(pg_timestamp_to_unix_ns(commit.commit_time_us))
            self.windows += 1
            self.last_scn = commit.commit_lsn
        self.txn = None
        self.window_open = False
        self.skipping = False
        self.healed_skip = frozenset()
        self.confirmable = commit.end_lsn
        self.read_lsn = max(self.read_lsn, commit.commit_lsn)
        self._read_through(pg_timestamp_to_unix_ns(commit.commit_time_us))

    def _read_through(self, time_ns: int) -> None:
        if self.read_through_ns is None or time_ns > self.read_through_ns:
            self.read_through_ns = time_ns

    def _message(self, message: LogicalMessage, wal_start: int) -> None:
        if not message.transactional and self.txn is None:
            # A heartbeat (or anyone's non-transactional message) between transactions:
            # nothing is pending before it.
            # Its LSN is the end of its WAL record.
            self.confirmable = max(self.confirmable or 0, message.lsn)
            if message.prefix == HEARTBEAT_PREFIX:
                # The fetcher's heartbeat carries the source's clock when it was written
                # (microseconds since the epoch): everything committed before is read.
                emitted = heartbeat_time_ns(message.content)
                if emitted is not None:
                    self._read_through(emitted)

    # -- rows ---------------------------------------------------------------------------

    def _relation(self, relation: Relation) -> None:
        self.relations[relation.oid] = relation
        self._set_codec(relation.oid, None)
        self.ignored_oids.discard(relation.oid)
        self.watermark_oids.discard(relation.oid)
        if relation.name == WATERMARK_TABLE:
            self.watermark_oids.add(relation.oid)
        elif relation.name == HEARTBEAT_TABLE or not self.wanted(
                relation.namespace, relation.name) or (
                f"{relation.namespace}.{relation.name}" in self.quarantined):
            self.ignored_oids.add(relation.oid)

    def _set_codec(self, oid: int, entry: tuple[TableCodec, int] | None) -> None:
        """The one place the codec of a relation changes, and its fast path with it."""
        self.fast.pop(oid, None)
        if entry is None:
            self.codecs.pop(oid, None)
            return
        self.codecs[oid] = entry
        codec, source_id = entry
        if codec.plan is not None:
            self.fast[oid] = (codec.plan, source_id, codec.fingerprint)

    def _codec(self, oid: int) -> tuple[TableCodec, int]:
        found = self.codecs.get(oid)
        if found is not None:
            return found
        relation = self.relations.get(oid)
        if relation is None:
            raise CaptureError(f"pgoutput sent a change of relation {oid} before its "
                               "Relation message")
        name = f"{relation.namespace}.{relation.name}"
        codec = TableCodec(relation, name, self.table_info(relation))
        source_id = self.catalog.source_id(name)
        self.catalog.register_schema(name, codec.schema)
        self._set_codec(oid, (codec, source_id))
        return codec, source_id

    def _change(self, change: Insert | Update | Delete) -> None:
        if self.txn is None:
            raise CaptureError("pgoutput sent a row change outside a transaction")
        oid = change.relation_oid
        if self.skipping or oid in self.ignored_oids:
            return
        if self.healed_skip and self._healed_now(oid):
            return
        if oid in self.watermark_oids:
            if isinstance(change, Insert):
                self._watermark(oid, change.new)
            return
        try:
            self._capture_change(oid, change)
        except ColumnValueError as exc:
            self._set_aside(oid, f"a value of column {exc.column!r} ({exc.sql_type}) cannot "
                            "be held by its schema", "change the value, or the column's type "
                            "to one that holds it (a numeric(p,s) holds no NaN: declare it "
                            "numeric)")
        except TableCaptureError as exc:
            self._set_aside(oid, exc.reason, exc.fix)
        except ConfigError as exc:
            relation = self.relations[oid]
            self._set_aside(oid, *catalog_refusal(f"{relation.namespace}.{relation.name}",
                                                  exc))

    def _capture_change(self, oid: int, change: Insert | Update | Delete) -> None:
        assert self.txn is not None
        codec, source_id = self._codec(oid)
        self._open_window()
        scn = self.txn.final_lsn
        ts = self.txn_ts
        events: list[bytes] = []
        if isinstance(change, Delete):
            old = codec.convert(_fill(change.old, len(codec.relation.columns)), None)
            codec.check_old_key([old[i] for i in codec.key_positions], "DELETE")
            events.append(encode_event(scn, Op.DELETE, source_id, codec.key(old), b"",
                                       codec.fingerprint, ts, self.partition_id))
        else:
            old_values = change.old if isinstance(change, Update) else None
            full_old = (old_values if old_values is not None and isinstance(change, Update)
                        and not change.old_is_key else None)
            row = codec.convert(change.new, full_old)
            if any(row[i] is None for i in codec.not_null_positions):
                codec, source_id = self._nullable(oid, codec, row)
            key = codec.key(row)
            old_key = self._old_key(codec, old_values)
            if old_key is not None and old_key != key:  # the key changed: old row gone
                events.append(encode_event(scn, Op.DELETE, source_id, old_key, b"",
                                           codec.fingerprint, ts, self.partition_id))
            events.append(encode_event(scn, Op.UPSERT, source_id, key, codec.encode(row),
                                       codec.fingerprint, ts, self.partition_id))
        for event in events:
            self.sink.append(event)
        self.events += len(events)
        self.window_sources.add(source_id)

    # -- per-source failures (DESIGN 17) ------------------------------------------------

    def _healed_now(self, oid: int) -> bool:
        """Whether the open transaction's change of ``oid`` is one of a source healed
        since the last run, read by it before the heal (its dump brings it)."""
        relation = self.relations.get(oid)
        return relation is not None and (
            f"{relation.namespace}.{relation.name}" in self.healed_skip)

    def _set_aside(self, oid: int, reason: str, first_fix: str) -> None:
        """Quarantine the table of ``oid`` in the open transaction's window and skip its
        changes from now on (module docstring)."""
        relation = self.relations[oid]
        source = f"{relation.namespace}.{relation.name}"
        self.ignored_oids.add(oid)
        self._set_codec(oid, None)
        if source in self.quarantined:
            return
        self.quarantined.add(source)
        txn = self.txn
        assert txn is not None
        self._open_window()
        self.quarantine(SourceFailure(source, txn.final_lsn, reason,
                                      heal_fix(source, first_fix)))
        limited(log).error("source %s set aside at LSN %d: %s; the other tables go on",
                           source, txn.final_lsn, reason, kind=f"set aside {source}")
        try:
            source_id: int | None = self.catalog.source_id(source)
        except ConfigError:
            source_id = None
        if source_id is not None and source_id in self.window_sources:
            self.sink.rollback()
            self.window_open = False
            raise RereadError(
                f"source {source} was set aside after its first changes of the transaction "
                f"committed at LSN {txn.final_lsn}: reading that transaction again without it")

    def _nullable(self, oid: int, codec: TableCodec, row: Sequence[Any]
                  ) -> tuple[TableCodec, int]:
        """A version of ``codec`` whose columns that are NULL in ``row`` are nullable.

        NOT NULL is read from the catalog as it is now, the row from the log as it was:
        a relay catching up across ``ALTER COLUMN ... SET NOT NULL`` meets rows the
        column was still allowed to be NULL in (pgoutput's Relation message does not
        say). They get a schema version of their own instead of stopping the fetcher.
        """
        nulls = {codec.relation.columns[i].name for i in codec.not_null_positions
                 if row[i] is None}
        info = codec.info
        relaxed = TableInfo(info.primary_key, info.not_null - nulls, info.mappings)
        new = TableCodec(codec.relation, codec.source_name, relaxed)
        source_id = self.catalog.source_id(codec.source_name)
        self.catalog.register_schema(codec.source_name, new.schema)
        self._set_codec(oid, (new, source_id))
        limited(log).warning("%s: column(s) %s NULL in the log although NOT NULL in the "
                             "catalog now (SET NOT NULL after the change): a schema version "
                             "with them nullable", codec.source_name, ", ".join(sorted(nulls)))
        return new, source_id

    @staticmethod
    def _old_key(codec: TableCodec, old: Sequence[TupleValue] | None) -> Key | None:
        """The key of an update's old row, when pgoutput sent one that has every key
        column (it sends the old key only when the key changed, or the whole old row
        with REPLICA IDENTITY FULL)."""
        if old is None:
            return None
        values = [old[i] if i < len(old) else None for i in codec.key_positions]
        codec.check_old_key(values, "UPDATE of the replica identity's columns")
        # NULL in a nullable key column (FULL without a primary key) is a value; in a
        # NOT NULL one it means "not sent".
        required = codec.required
        if not values or any(v is UNCHANGED_TOAST or (v is None and i in required)
                             for i, v in zip(codec.key_positions, values, strict=True)):
            return None
        row = [None] * len(codec.relation.columns)
        for i, v in zip(codec.key_positions, values, strict=True):
            row[i] = codec._one(i, v)
        return codec.key(row)

    def _watermark(self, oid: int, values: Sequence[TupleValue]) -> None:
        relation = self.relations[oid]
        names = [c.name for c in relation.columns]
        token = values[names.index("id")] if "id" in names else values[0]
        if isinstance(token, bytes):
            token = token.decode("utf-8")
        if isinstance(token, str):
            self._open_window()
            self.sink.watermark(token)

    def _truncate(self, truncate: Truncate) -> None:
        if self.skipping:
            return
        captured = [self.relations[o] for o in truncate.relation_oids
                    if o in self.relations and o not in self.ignored_oids
                    and o not in self.watermark_oids
                    and not (self.healed_skip and self._healed_now(o))]
        if captured and self.txn is None:
            raise CaptureError("pgoutput sent a Truncate outside a transaction")
        for relation in captured:
            self._set_aside(
                relation.oid, "a TRUNCATE of it was published: a truncate is not a row "
                "change and is not captured",
                "publish only row changes (ALTER PUBLICATION ... SET (publish = 'insert, "
                "update, delete'), as databus pg setup does)")


def heartbeat_time_ns(content: bytes) -> int | None:
    """The time in a heartbeat message (decimal microseconds since the epoch, as the
    fetcher writes it) in ns; None for anything else (an older relay's empty one)."""
    text = content.strip()
    if not text.isdigit() or len(text) > 20:
        return None
    return int(text) * 1000


def _fill(values: Sequence[TupleValue], width: int) -> list[TupleValue]:
    """A key-only old tuple has NULLs for the other columns; pad defensively."""
    out = list(values)
    return out + [None] * (width - len(out))

