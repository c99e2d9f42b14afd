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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from databus._limited_log import limited
from databus.batch import encode_event
from databus.errors import DatabusError, SchemaError
from databus.event import Key, Op
from databus.fetchers._api import SourceCatalog, WindowSink
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

__all__ = ["CaptureError", "ChangeStream", "TableCodec", "TableInfo"]

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
        self.not_null_positions: list[int] = []  # NOT NULL columns outside the key
        for column, name, mapping, avro in zip(relation.columns, self.field_names,
                                               info.mappings, avro_types, strict=True):
            field: dict[str, Any] = {"name": name}
            if column.name in key or column.name in info.not_null:
                if column.name not in key:
                    self.not_null_positions.append(len(fields))
                field["type"] = avro
            else:
                branches = avro if isinstance(avro, list) else [avro]
                field["type"] = ["null", *branches]
                field["default"] = None
            field["sql_name"] = column.name
            field["sql_type"] = mapping.sql_type
            fields.append(field)
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
                    raise CaptureError(
                        f"{self.source_name}: an UPDATE left the large (TOASTed) column "
                        f"{self.relation.columns[i].name!r} unchanged, and PostgreSQL "
                        "does not send such a value unless the table's old rows are "
                        f"logged whole: run ALTER TABLE {self.source_name} REPLICA "
                        "IDENTITY FULL (databus pg setup reports these tables), then "
                        "restart the relay; until then the table cannot be captured whole")
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
            raise SchemaError(f"{self.source_name}.{self.relation.columns[i].name}: {exc}"
                              ) from None

    def check_old_key(self, key_values: Sequence[Any], what: str) -> None:
        """Refuse an old tuple whose key columns (``key_values``) lack the primary key
        the events are keyed by (its table is ``REPLICA IDENTITY USING INDEX`` of other
        columns): a made-up key would leave the consumers' row in place."""
        if self.keyed_by_primary_key and any(v is None for v in key_values):
            identity = [c.name for c in self.relation.columns if c.is_key]
            raise CaptureError(
                f"{self.source_name}: a {what} carries the replica identity's columns "
                f"({', '.join(identity)}), not the primary key "
                f"({', '.join(self.key_names)}) its events are keyed by, so the row it "
                f"changed cannot be named: ALTER TABLE {self.source_name} REPLICA "
                "IDENTITY DEFAULT (or FULL), then restart the relay (databus pg setup "
                "warns about such tables)")

    def key(self, row: Sequence[Any]) -> Key:
        values = [row[i] for i in self.key_positions]
        if not values:
            raise CaptureError(
                f"{self.source_name} has no primary key and no replica identity index: "
                f"its changes have no key. Add a primary key, or ALTER TABLE "
                f"{self.source_name} REPLICA IDENTITY FULL")
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
    """

    def __init__(self, sink: WindowSink, catalog: SourceCatalog, partition_id: int,
                 wanted: Callable[[str, str], bool],
                 table_info: Callable[[Relation], TableInfo],
                 skip_through: int | None) -> None:
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
        if (_FAST_PATH and txn is not None and not self.skipping and len(payload) > 5
                and (payload[0] == 0x49 or payload[0] == 0x55)):  # 'I', 'U'
            found = self.fast.get(int.from_bytes(payload[1:5], "big"))
            if found is not None:
                fast = transcode_change(payload, found[0])
                if fast is not None:
                    if not self.window_open:
                        self._open_window()
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
        self.confirmable = commit.end_lsn
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
        elif relation.name == HEARTBEAT_TABLE or not self.wanted(relation.namespace,
                                                                   relation.name):
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
        if oid in self.watermark_oids:
            if isinstance(change, Insert):
                self._watermark(oid, change.new)
            return
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
        if not values or any(v is None or v is UNCHANGED_TOAST for v in values):
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
                    and o not in self.watermark_oids]
        if captured:
            names = ", ".join(f"{r.namespace}.{r.name}" for r in captured)
            raise CaptureError(
                f"TRUNCATE of {names} in the transaction committed at LSN "
                f"{self.txn.final_lsn if self.txn else '?'}: a truncate is not a row change "
                "and is not captured. Publish only row changes (ALTER PUBLICATION ... SET "
                "(publish = 'insert, update, delete'), as databus pg setup does), then "
                "restart the relay and re-dump the table (databus dump) so consumers "
                "see its rows again")


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

