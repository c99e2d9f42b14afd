"""The pure decoder of pgoutput messages (DESIGN section 8, issue 18): the bytes of one
XLogData payload of a logical replication stream started with ``plugin pgoutput``, or of
one ``data`` value of ``pg_logical_slot_peek_binary_changes``. Bytes in; a frozen
dataclass or a ``PgOutputError`` out. No I/O and no state: what needs state (the Relation
a tuple belongs to, whether a Begin was seen) is the fetcher's job.

Layout (PostgreSQL docs, "Logical Replication Message Formats"). Integers are big-endian;
``String`` is UTF-8 text ended by a NUL byte; "u" types are unsigned, "i" signed::

    message   type  fields after the type byte
    --------  ----  --------------------------------------------------------------------
    Begin     'B'   final_lsn u64 | commit_time i64 | xid u32                 (21 bytes)
    Commit    'C'   flags u8 (always 0) | commit_lsn u64 | end_lsn u64
                    | commit_time i64                                        (26 bytes)
    Origin    'O'   commit_lsn u64 | name String
    Relation  'R'   oid u32 | namespace String | name String | replica_identity u8
                    | ncols u16 | ncols x Column
      Column        flags u8 (bit 0: part of the replica identity) | name String
                    | type_oid u32 | type_modifier i32
    Type      'Y'   oid u32 | namespace String | name String
    Insert    'I'   relation_oid u32 | 'N' TupleData
    Update    'U'   relation_oid u32 | ['K' TupleData | 'O' TupleData] | 'N' TupleData
    Delete    'D'   relation_oid u32 | ('K' | 'O') TupleData
    Truncate  'T'   nrelations i32 | options u8 (bit 0 CASCADE, bit 1 RESTART IDENTITY)
                    | nrelations x relation_oid u32
    Message   'M'   flags u8 (bit 0: transactional) | lsn u64 | prefix String
                    | length i32 | content (length bytes)

    TupleData       ncols u16 | ncols x Value
      Value         'n'                        NULL                    -> None
                    'u'                        unchanged TOASTed value -> UNCHANGED_TOAST
                    't' length i32 | bytes     text form (UTF-8)       -> str
                    'b' length i32 | bytes     binary form (binary on) -> bytes

- Times are microseconds since 2000-01-01 UTC (PostgreSQL's epoch), kept as sent;
  ``pg_timestamp_to_unix_ns`` converts.
- ``replica_identity`` is ``relreplident``: ``d`` default (the primary key), ``n``
  nothing, ``f`` full, ``i`` an index. Update's old tuple is the key ('K': key columns
  set, the others NULL) or, under ``f``, the whole old row ('O'); without a key change
  under ``d``/``i`` there is no old tuple at all.
- A namespace sent as the empty string means ``pg_catalog`` (pgoutput saves the bytes);
  it is decoded as ``"pg_catalog"``, as PostgreSQL's own reader does. No schema is named
  "", so nothing is lost.

Protocol versions 1 and 2. Version 2 adds the streaming of in-progress transactions:
Stream Start ('S'), Stream Stop ('E'), Stream Commit ('c'), Stream Abort ('A'), and
inside a stream block an ``xid u32`` right after the type byte of R, Y, I, U, D, T and
M. Databus starts replication with streaming off, so that a window is one whole
transaction: the server then never sends those, and the xid is absent in version 2
exactly as in version 1. A stream message is therefore *refused* (``PgOutputError``),
not decoded: it means the server streams, so every data message after it carries an xid
this decoder would read as a relation oid. The two-phase messages of version 3 ('b',
'P', 'K', 'r', 'p'; two_phase off) are refused the same way.

Every malformed input raises ``PgOutputError`` naming the message and the byte offset:
truncation anywhere, an unknown type or value kind, a String without its NUL, text that
is not UTF-8, bytes left after a complete message, a count that the bytes cannot hold.
Error messages never quote row values, only positions and type bytes. A tuple's column
count is not checked against its Relation here (no state): the fetcher does that.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeAlias, final

from databus.errors import DatabusError

__all__ = [
    "UNCHANGED_TOAST",
    "Begin",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Origin",
    "PgOutputError",
    "PgOutputMessage",
    "Relation",
    "Truncate",
    "TupleValue",
    "TypeMessage",
    "Update",
    "decode",
    "format_lsn",
    "parse_lsn",
    "pg_timestamp_to_unix_ns",
]

PROTOCOL_VERSIONS = (1, 2)

# pgoutput never sends more columns than a tuple descriptor can hold
# (MaxTupleAttributeNumber); a larger count is garbage, refused before any allocation.
MAX_COLUMNS = 1664

# 2000-01-01T00:00:00Z in Unix seconds: PostgreSQL's epoch.
PG_EPOCH_UNIX_S = 946_684_800

TRUNCATE_CASCADE = 0x01
TRUNCATE_RESTART_IDENTITY = 0x02
_TRUNCATE_OPTIONS = TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY
_COLUMN_IS_KEY = 0x01
_MESSAGE_TRANSACTIONAL = 0x01
_REPLICA_IDENTITIES = frozenset("dnfi")

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_RELATION_TAIL = struct.Struct(">BH")  # replica identity, column count
_COLUMN_TAIL = struct.Struct(">Ii")  # type oid, type modifier
_TRUNCATE_HEAD = struct.Struct(">iB")  # relation count, options
_MESSAGE_HEAD = struct.Struct(">BQ")  # flags, LSN
# The smallest Relation column: flags, an empty name's NUL, type oid, type modifier.
_MIN_COLUMN_BYTES = 1 + 1 + _COLUMN_TAIL.size

# Type and tuple marker bytes, as ints (indexing bytes gives ints).
_BEGIN_T, _COMMIT_T, _ORIGIN_T, _RELATION_T, _TYPE_T = 0x42, 0x43, 0x4F, 0x52, 0x59
_INSERT_T, _UPDATE_T, _DELETE_T, _TRUNCATE_T, _MESSAGE_T = 0x49, 0x55, 0x44, 0x54, 0x4D
_NEW, _KEY, _OLD = 0x4E, 0x4B, 0x4F  # 'N' 'K' 'O'

_NAMES = {
    _BEGIN_T: "Begin", _COMMIT_T: "Commit", _ORIGIN_T: "Origin", _RELATION_T: "Relation",
    _TYPE_T: "Type", _INSERT_T: "Insert", _UPDATE_T: "Update", _DELETE_T: "Delete",
    _TRUNCATE_T: "Truncate", _MESSAGE_T: "Message",
}
# Known to the protocol, refused on purpose (module docstring).
_STREAMING = {0x53: "Stream Start", 0x45: "Stream Stop", 0x63: "Stream Commit",
              0x41: "Stream Abort"}
_TWO_PHASE = {0x62: "Begin Prepare", 0x50: "Prepare", 0x4B: "Commit Prepared",
              0x72: "Rollback Prepared", 0x70: "Stream Prepare"}


class PgOutputError(DatabusError):
    """Bytes that are not a pgoutput message this decoder accepts. Never retriable: the
    same bytes fail the same way. ``offset`` is where in the message the problem is."""

    code = "pgoutput_decode"
    retriable = False

    def __init__(self, message: str, *, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset


@final
class _Unchanged:
    """The type of ``UNCHANGED_TOAST``: a column whose TOASTed value the update did not
    touch, so pgoutput did not send it (the 'u' kind). It is not NULL: the row still has
    its old value, which only a previous image can supply. Under REPLICA IDENTITY FULL
    the new row still says 'u' (PostgreSQL 15, tested), but the old row ('O') then
    carries the value."""

    __slots__ = ()
    _instance: ClassVar[_Unchanged | None] = None

    def __new__(cls) -> _Unchanged:
        # One instance per process, so that ``value is UNCHANGED_TOAST`` always works.
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        # pickle and copy give back the module's singleton, not a second instance.
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = _Unchanged()

TupleValue: TypeAlias = str | bytes | _Unchanged | None


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_time_us: int  # microseconds since 2000-01-01 UTC
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int  # always 0 (anything else is refused, as PostgreSQL refuses it)
    commit_lsn: int  # the LSN of the commit record; equals Begin.final_lsn
    end_lsn: int  # the end of the commit record: where the next transaction may start
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int  # the commit's LSN on the origin server
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    is_key: bool  # part of the replica identity (every column under REPLICA IDENTITY FULL)
    name: str
    type_oid: int
    type_modifier: int  # atttypmod, -1 when the type has none


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # "d", "n", "f" or "i"
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class TypeMessage:
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    new: tuple[TupleValue, ...]
    old: tuple[TupleValue, ...] | None  # None: no key change and not REPLICA IDENTITY FULL
    old_is_key: bool  # old holds the key columns only ('K'), the others are None


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old: tuple[TupleValue, ...]
    old_is_key: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int  # TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY
    relation_oids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


PgOutputMessage: TypeAlias = (
    Begin | Commit | Origin | Relation | TypeMessage | Insert | Update | Delete | Truncate
    | LogicalMessage
)

_Decoded: TypeAlias = tuple[PgOutputMessage, int]  # the message, the offset after it


def decode(data: bytes | bytearray | memoryview,
           protocol_version: int = 1) -> PgOutputMessage:
    """The message in ``data``, which must hold exactly one message (module docstring)."""
    if protocol_version not in PROTOCOL_VERSIONS:
        raise PgOutputError(
            f"pgoutput protocol version {protocol_version!r} is not supported "
            f"(supported: {', '.join(map(str, PROTOCOL_VERSIONS))})")
    if type(data) is not bytes:
        # One copy of the message; then slicing gives the bytes and str values directly.
        data = bytes(data)
    if not data:
        raise PgOutputError("pgoutput message, byte offset 0: empty (no type byte)", offset=0)
    kind = data[0]
    reader = _READERS.get(kind)
    if reader is None:
        raise _unknown_type(kind, protocol_version)
    message, end = reader(data)
    if end != len(data):
        raise _error(kind, end, f"{len(data) - end} trailing byte(s) after the complete message")
    return message


def pg_timestamp_to_unix_ns(us_since_2000: int) -> int:
    """A PostgreSQL timestamp (microseconds since 2000-01-01 UTC) in ns since 1970."""
    return (us_since_2000 + PG_EPOCH_UNIX_S * 1_000_000) * 1000


def format_lsn(lsn: int) -> str:
    """PostgreSQL's text form of an LSN: the high and low 32 bits in upper-case hex,
    ``16/B374D848``. ``ValueError`` when ``lsn`` is not an unsigned 64-bit integer (a bug
    in the caller, not bad input from a server)."""
    if not 0 <= lsn < 1 << 64:
        raise ValueError(f"an LSN is an unsigned 64-bit integer, not {lsn!r}")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# As pg_lsn's input function: 1 to 8 hex digits on each side of the slash, nothing else.
_LSN_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def parse_lsn(text: str) -> int:
    """The inverse of ``format_lsn``; ``PgOutputError`` for anything pg_lsn would refuse."""
    match = _LSN_TEXT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        shown = repr(text)
        if len(shown) > 40:
            shown = shown[:37] + "..."
        raise PgOutputError(f"not an LSN (hex 'high/low' such as '16/B374D848'): {shown}")
    return int(match[1], 16) << 32 | int(match[2], 16)


# -- errors ----------------------------------------------------------------------------


def _error(kind: int, offset: int, problem: str) -> PgOutputError:
    return PgOutputError(
        f"pgoutput {_NAMES[kind]} ({chr(kind)!r}) message, byte offset {offset}: {problem}",
        offset=offset)


def _truncated(kind: int, offset: int, what: str, needed: int, size: int) -> PgOutputError:
    return _error(kind, offset, f"truncated: {what} needs {needed} byte(s), "
                                f"{max(size - offset, 0)} left")


def _unknown_type(kind: int, protocol_version: int) -> PgOutputError:
    byte = f"{bytes([kind])!r} (0x{kind:02X})"
    if kind in _STREAMING:
        if protocol_version < 2:
            why = "a protocol version 2 message in a version 1 stream"
        else:
            why = ("the server streams in-progress transactions, which databus does not "
                   "support (replication must start with streaming off so that a window is "
                   "a whole transaction); the data messages of a stream carry an xid this "
                   "decoder would misread")
        problem = f"{_STREAMING[kind]} message {byte}: {why}"
    elif kind in _TWO_PHASE:
        problem = (f"{_TWO_PHASE[kind]} message {byte}: two-phase decoding (protocol "
                   f"version 3, two_phase on) is not supported")
    else:
        problem = f"unknown message type {byte} (protocol version {protocol_version})"
    return PgOutputError(f"pgoutput message, byte offset 0: {problem}", offset=0)


# -- fields ----------------------------------------------------------------------------


def _fixed(data: bytes, pos: int, layout: struct.Struct, kind: int, what: str) -> None:
    """Check that ``layout`` fits at ``pos``, so that ``unpack_from`` cannot fail."""
    if pos + layout.size > len(data):
        raise _truncated(kind, pos, what, layout.size, len(data))


def _string(data: bytes, pos: int, kind: int, what: str) -> tuple[str, int]:
    end = data.find(b"\0", pos)
    if end < 0:
        raise _error(kind, pos, f"truncated: {what} has no NUL terminator")
    try:
        return data[pos:end].decode(), end + 1
    except UnicodeDecodeError as exc:
        raise _error(kind, pos + exc.start, f"{what} is not valid UTF-8") from None


def _namespace(data: bytes, pos: int, kind: int) -> tuple[str, int]:
    name, pos = _string(data, pos, kind, "the namespace")
    return name or "pg_catalog", pos


def _tuple(data: bytes, pos: int, kind: int,
           what: str) -> tuple[tuple[TupleValue, ...], int]:
    """TupleData at ``pos``: the values and the offset after them. This is the per-row
    hot path: one loop iteration per column, slicing for values, no per-byte work."""
    size = len(data)
    if pos + 2 > size:
        raise _truncated(kind, pos, f"the column count of the {what}", 2, size)
    (ncols,) = _U16.unpack_from(data, pos)
    # Every value takes at least its kind byte: a count the bytes cannot hold is refused
    # before the loop (and before a huge allocation).
    if ncols > MAX_COLUMNS:
        raise _error(kind, pos, f"the {what} claims {ncols} columns, more than a row can "
                                f"have ({MAX_COLUMNS})")
    if ncols > size - pos - 2:
        raise _error(kind, pos, f"truncated or a bad count: the {what} claims {ncols} "
                                f"columns but only {size - pos - 2} byte(s) follow")
    pos += 2
    values: list[TupleValue] = []
    append = values.append
    unpack_length = _I32.unpack_from
    unchanged = UNCHANGED_TOAST
    column = start = 0
    try:
        for column in range(1, ncols + 1):
            if pos >= size:
                raise _truncated(kind, pos, f"column {column} of the {what}", 1, size)
            # Literal ints, not the module's names: a global lookup per column costs more
            # than the rest of a short value's decoding.
            marker = data[pos]
            if marker == 0x74 or marker == 0x62:  # 't' text, 'b' binary
                start = pos + 5
                if start > size:
                    raise _truncated(kind, pos + 1, f"the length of column {column} of the "
                                                    f"{what}", 4, size)
                (length,) = unpack_length(data, pos + 1)
                if length < 0:
                    raise _error(kind, pos + 1, f"column {column} of the {what} has a "
                                                f"negative length {length}")
                pos = start + length
                if pos > size:
                    raise _truncated(kind, start, f"column {column} of the {what}", length,
                                     size)
                append(data[start:pos].decode() if marker == 0x74 else data[start:pos])
            elif marker == 0x6E:  # 'n' NULL
                append(None)
                pos += 1
            elif marker == 0x75:  # 'u' unchanged TOASTed value
                append(unchanged)
                pos += 1
            else:
                raise _error(kind, pos, f"column {column} of the {what} has unknown kind "
                                        f"{bytes([marker])!r} (expected n, u, t or b)")
    except UnicodeDecodeError as exc:
        raise _error(kind, start + exc.start,
                     f"column {column} of the {what} is not valid UTF-8") from None
    return tuple(values), pos


def _marker(data: bytes, pos: int, kind: int, what: str) -> int:
    if pos >= len(data):
        raise _truncated(kind, pos, what, 1, len(data))
    return data[pos]


def _bad_marker(kind: int, pos: int, marker: int, expected: str) -> PgOutputError:
    return _error(kind, pos, f"tuple marker {bytes([marker])!r} where {expected} belongs")


# -- messages --------------------------------------------------------------------------


def _begin(data: bytes) -> _Decoded:
    _fixed(data, 1, _BEGIN, _BEGIN_T, "final LSN, commit time and xid")
    final_lsn, commit_time, xid = _BEGIN.unpack_from(data, 1)
    if final_lsn == 0:
        # The fetcher's SCN: an invalid LSN here would make a window without a position.
        raise _error(_BEGIN_T, 1, "final LSN is 0/0 (invalid)")
    return Begin(final_lsn, commit_time, xid), 1 + _BEGIN.size


def _commit(data: bytes) -> _Decoded:
    _fixed(data, 1, _COMMIT, _COMMIT_T, "flags, commit LSN, end LSN and commit time")
    flags, commit_lsn, end_lsn, commit_time = _COMMIT.unpack_from(data, 1)
    if flags != 0:
        # Unused so far; PostgreSQL's own reader refuses other values too, since a flag we
        # do not know could change what the commit means.
        raise _error(_COMMIT_T, 1, f"unknown flags 0x{flags:02X}")
    if commit_lsn == 0:
        raise _error(_COMMIT_T, 2, "commit LSN is 0/0 (invalid)")
    return Commit(flags, commit_lsn, end_lsn, commit_time), 1 + _COMMIT.size


def _origin(data: bytes) -> _Decoded:
    _fixed(data, 1, _U64, _ORIGIN_T, "the origin commit LSN")
    (commit_lsn,) = _U64.unpack_from(data, 1)
    name, pos = _string(data, 9, _ORIGIN_T, "the origin name")
    return Origin(commit_lsn, name), pos


def _relation(data: bytes) -> _Decoded:
    k = _RELATION_T
    _fixed(data, 1, _U32, k, "the relation oid")
    (oid,) = _U32.unpack_from(data, 1)
    namespace, pos = _namespace(data, 5, k)
    name, pos = _string(data, pos, k, "the relation name")
    _fixed(data, pos, _RELATION_TAIL, k, "replica identity and column count")
    identity_byte, ncols = _RELATION_TAIL.unpack_from(data, pos)
    identity = chr(identity_byte)
    if identity not in _REPLICA_IDENTITIES:
        raise _error(k, pos, f"unknown replica identity {bytes([identity_byte])!r} "
                             f"(expected d, n, f or i)")
    pos += _RELATION_TAIL.size
    left = len(data) - pos
    if ncols > MAX_COLUMNS:
        raise _error(k, pos - 2, f"claims {ncols} columns, more than a table can have "
                                 f"({MAX_COLUMNS})")
    if ncols * _MIN_COLUMN_BYTES > left:
        raise _error(k, pos - 2, f"truncated or a bad count: claims {ncols} columns "
                                 f"(at least {_MIN_COLUMN_BYTES} bytes each) but only "
                                 f"{left} byte(s) follow")
    columns = []
    for column in range(1, ncols + 1):
        # The count check above guarantees the flags byte is there.
        flags = data[pos]
        if flags & ~_COLUMN_IS_KEY:
            # Only bit 0 is defined; an unknown bit could mean something we would drop.
            raise _error(k, pos, f"unknown flags 0x{flags:02X} of column {column}")
        column_name, pos = _string(data, pos + 1, k, f"the name of column {column}")
        _fixed(data, pos, _COLUMN_TAIL, k, f"type oid and modifier of column {column}")
        type_oid, type_modifier = _COLUMN_TAIL.unpack_from(data, pos)
        pos += _COLUMN_TAIL.size
        columns.append(Column(flags == _COLUMN_IS_KEY, column_name, type_oid, type_modifier))
    return Relation(oid, namespace, name, identity, tuple(columns)), pos


def _type(data: bytes) -> _Decoded:
    _fixed(data, 1, _U32, _TYPE_T, "the type oid")
    (oid,) = _U32.unpack_from(data, 1)
    namespace, pos = _namespace(data, 5, _TYPE_T)
    name, pos = _string(data, pos, _TYPE_T, "the type name")
    return TypeMessage(oid, namespace, name), pos


def _insert(data: bytes) -> _Decoded:
    _fixed(data, 1, _U32, _INSERT_T, "the relation oid")
    (relation_oid,) = _U32.unpack_from(data, 1)
    marker = _marker(data, 5, _INSERT_T, "the new tuple marker")
    if marker != _NEW:
        raise _bad_marker(_INSERT_T, 5, marker, "'N' (new tuple)")
    new, pos = _tuple(data, 6, _INSERT_T, "new tuple")
    return Insert(relation_oid, new), pos


def _update(data: bytes) -> _Decoded:
    _fixed(data, 1, _U32, _UPDATE_T, "the relation oid")
    (relation_oid,) = _U32.unpack_from(data, 1)
    marker = _marker(data, 5, _UPDATE_T, "the tuple marker")
    pos = 5
    old: tuple[TupleValue, ...] | None = None
    if marker in (_KEY, _OLD):
        old, pos = _tuple(data, 6, _UPDATE_T, "old key" if marker == _KEY else "old tuple")
        new_marker = _marker(data, pos, _UPDATE_T, "the new tuple marker")
        if new_marker != _NEW:
            raise _bad_marker(_UPDATE_T, pos, new_marker, "'N' (new tuple)")
    elif marker != _NEW:
        raise _bad_marker(_UPDATE_T, 5, marker, "'K', 'O' or 'N'")
    new, pos = _tuple(data, pos + 1, _UPDATE_T, "new tuple")
    return Update(relation_oid, new, old, marker == _KEY), pos


def _delete(data: bytes) -> _Decoded:
    _fixed(data, 1, _U32, _DELETE_T, "the relation oid")
    (relation_oid,) = _U32.unpack_from(data, 1)
    marker = _marker(data, 5, _DELETE_T, "the old tuple marker")
    if marker not in (_KEY, _OLD):
        raise _bad_marker(_DELETE_T, 5, marker, "'K' (old key) or 'O' (old tuple)")
    old, pos = _tuple(data, 6, _DELETE_T, "old key" if marker == _KEY else "old tuple")
    return Delete(relation_oid, old, marker == _KEY), pos


def _truncate(data: bytes) -> _Decoded:
    k = _TRUNCATE_T
    _fixed(data, 1, _TRUNCATE_HEAD, k, "relation count and options")
    count, options = _TRUNCATE_HEAD.unpack_from(data, 1)
    if count < 0:
        raise _error(k, 1, f"negative relation count {count}")
    if options & ~_TRUNCATE_OPTIONS:
        raise _error(k, 5, f"unknown options 0x{options:02X}")
    pos = 1 + _TRUNCATE_HEAD.size
    if pos + 4 * count > len(data):
        raise _truncated(k, pos, f"{count} relation oid(s)", 4 * count, len(data))
    oids = struct.unpack_from(f">{count}I", data, pos)
    return Truncate(options, oids), pos + 4 * count


def _message(data: bytes) -> _Decoded:
    k = _MESSAGE_T
    _fixed(data, 1, _MESSAGE_HEAD, k, "flags and LSN")
    flags, lsn = _MESSAGE_HEAD.unpack_from(data, 1)
    if flags & ~_MESSAGE_TRANSACTIONAL:
        raise _error(k, 1, f"unknown flags 0x{flags:02X}")
    prefix, pos = _string(data, 1 + _MESSAGE_HEAD.size, k, "the prefix")
    _fixed(data, pos, _I32, k, "the content length")
    (length,) = _I32.unpack_from(data, pos)
    if length < 0:
        raise _error(k, pos, f"negative content length {length}")
    pos += 4
    if pos + length > len(data):
        raise _truncated(k, pos, "the content", length, len(data))
    return LogicalMessage(flags == _MESSAGE_TRANSACTIONAL, lsn, prefix,
                          data[pos:pos + length]), pos + length


_READERS: dict[int, Callable[[bytes], _Decoded]] = {
    _BEGIN_T: _begin, _COMMIT_T: _commit, _ORIGIN_T: _origin, _RELATION_T: _relation,
    _TYPE_T: _type, _INSERT_T: _insert, _UPDATE_T: _update, _DELETE_T: _delete,
    _TRUNCATE_T: _truncate, _MESSAGE_T: _message,
}
