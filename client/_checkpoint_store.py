"""Checkpoint stores: where a consumer keeps its checkpoint between runs (DESIGN 3 and 10).

Servers keep no consumer state, so a consumer's checkpoint is the only record of how far
it got. Every store implements ``CheckpointStore``:

- ``load()`` returns the stored checkpoint, ``None`` when nothing was ever stored, and
  raises ``CheckpointError`` when what is stored is unreadable. It never turns damage
  into ``None``: that would restart the consumer from its start position without
  anybody noticing.
- ``store(checkpoint)`` is durable when it returns.
- ``close()`` releases connections. It is idempotent. Any other call after it raises
  ``DatabusError``.

The methods block and are thread-safe. The async client calls them through
``asyncio.to_thread``.

The file and ZooKeeper stores, and the PostgreSQL store's ``checkpoint`` column, hold the
same JSON *envelope*. ``encode_envelope`` writes it as one line of ASCII, and
``decode_envelope`` reads it back in any JSON layout::

    {"format":1,"checkpoint":{"window_scn":1234,"window_offset":-1,"mode":"online"},
     "crc32":1326147160,"written_at":"2025-01-31T12:00:00.000+00:00"}

``crc32`` is the CRC-32 of the canonical JSON of ``checkpoint``: sorted keys, no
whitespace, ASCII only. This is what ``Checkpoint.dumps`` writes. A flipped byte that
still parses as JSON, such as one digit of ``window_scn``, is therefore caught.
``written_at`` is for people reading the file and is not covered by the CRC.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

import psycopg2
import psycopg2.errors
from psycopg2 import sql
from psycopg2.extensions import parse_dsn

from databus._fileio import write_atomically
from databus._redact import redact, register_secret, register_uri, split_password
from databus.checkpoint import Checkpoint
from databus.errors import CheckpointError, ConfigError, ConnectionLostError, DatabusError

if TYPE_CHECKING:
    from psycopg2.extensions import connection as PgConnection

__all__ = [
    "ENVELOPE_FORMAT",
    "MAX_ENVELOPE_BYTES",
    "CheckpointStore",
    "FileCheckpointStore",
    "MemoryCheckpointStore",
    "PostgresCheckpointStore",
    "ZooKeeperCheckpointStore",
    "decode_envelope",
    "encode_envelope",
]

log = logging.getLogger("databus.client.checkpoint")

_T = TypeVar("_T")

# --------------------------------------------------------------------------------------
# The envelope, shared by every store that persists bytes
# --------------------------------------------------------------------------------------

ENVELOPE_FORMAT: Final = 1
# A real envelope is well under 1 KB. The cap keeps a huge or wrong file from being read
# into memory, and it matches ZooKeeper's default znode size limit (jute.maxbuffer).
MAX_ENVELOPE_BYTES: Final = 1 << 20
_ENVELOPE_FIELDS: Final = ("format", "checkpoint", "crc32", "written_at")


def _canonical_crc(body: object) -> int:
    """CRC-32 of the canonical JSON of ``body``.

    This is the same text ``Checkpoint.dumps`` writes, and it does not depend on how the
    bytes were laid out. PostgreSQL's jsonb reorders keys and adds spaces, and an envelope
    stored in a jsonb column must still verify.
    """
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return zlib.crc32(text.encode("ascii"))


def encode_envelope(checkpoint: Checkpoint, *, written_at: datetime | None = None) -> bytes:
    """The envelope of ``checkpoint``: one line of ASCII JSON, newline-terminated."""
    body = checkpoint.to_json()
    when = (written_at or datetime.now(UTC)).isoformat(timespec="milliseconds")
    envelope = {
        "format": ENVELOPE_FORMAT,
        "checkpoint": body,
        "crc32": _canonical_crc(body),
        "written_at": when,
    }
    text = json.dumps(envelope, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return (text + "\n").encode("ascii")


class _Corrupt(Exception):
    """Internal: what is wrong with an envelope. ``decode_envelope`` adds where and how to fix."""


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads silently keeps the last duplicate key. A writer of ours never repeats a
    # key, so a repeated key means the bytes were altered.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Corrupt(f"the JSON repeats the key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise _Corrupt(f"the JSON holds {name}, which no checkpoint contains")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_envelope(raw: bytes) -> Checkpoint:
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise _Corrupt(f"it is more than {MAX_ENVELOPE_BYTES} bytes, far more than any "
                       "checkpoint envelope")
    if not raw.strip():
        raise _Corrupt("it is empty" if not raw else "it holds only whitespace")
    if not raw.strip(b"\x00"):
        # What some filesystems show after a power cut lost a write that was not fsynced.
        raise _Corrupt(f"it holds only NUL bytes ({len(raw)} of them)")
    try:
        # Our writer emits ASCII (non-ASCII is \u-escaped), but UTF-8 is accepted: a jsonb
        # column gives the envelope back with the escapes decoded.
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Corrupt(f"it is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                       f"{exc.start})") from None
    try:
        doc = json.loads(text, object_pairs_hook=_reject_duplicates,
                         parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        # An envelope starts with "{" and ends with "}". When the start is there and the
        # parser ran out of input, or the closing brace is missing, the likeliest story
        # is a cut-off write.
        stripped = text.strip()
        at_end = exc.pos >= len(text.rstrip())
        if stripped.startswith("{") and (at_end or not stripped.endswith("}")):
            raise _Corrupt(f"it looks truncated: the JSON stops after {len(raw)} bytes "
                           f"without its closing brace ({exc.msg} at byte {exc.pos})") from None
        raise _Corrupt(f"it is not valid JSON: {exc.msg} at byte {exc.pos}") from None
    if not isinstance(doc, dict):
        raise _Corrupt(f"it holds a JSON {type(doc).__name__}, not an envelope object")
    # The format is checked first: a newer format may use fields this version does not
    # know, and "written by a newer databus" is then the useful message.
    if "format" not in doc:
        raise _Corrupt("it has no 'format' field, so it is not a databus checkpoint envelope")
    fmt = doc["format"]
    if not _is_int(fmt) or fmt != ENVELOPE_FORMAT:
        raise _Corrupt(f"it has envelope format {fmt!r}, and this version of databus reads "
                       f"only format {ENVELOPE_FORMAT} (was it written by another version?)")
    missing = [name for name in _ENVELOPE_FIELDS if name not in doc]
    if missing:
        raise _Corrupt(f"it lacks the field(s) {', '.join(missing)}")
    unknown = sorted(set(doc) - set(_ENVELOPE_FIELDS))
    if unknown:
        raise _Corrupt(f"it has unknown field(s) {', '.join(unknown)}")
    body, crc, written_at = doc["checkpoint"], doc["crc32"], doc["written_at"]
    if not isinstance(body, dict):
        raise _Corrupt(f"its 'checkpoint' is a JSON {type(body).__name__}, not an object")
    if not _is_int(crc) or not 0 <= crc <= 0xFFFFFFFF:
        raise _Corrupt(f"its crc32 {crc!r} is not a 32-bit unsigned integer")
    if not isinstance(written_at, str):
        raise _Corrupt(f"its written_at {written_at!r} is not a string")
    try:
        datetime.fromisoformat(written_at)
    except ValueError:
        raise _Corrupt(f"its written_at {written_at!r} is not an ISO 8601 timestamp") from None
    actual = _canonical_crc(body)
    if actual != crc:
        raise _Corrupt(f"its checksum does not match: stored crc32 {crc}, content {actual} "
                       "(the checkpoint was altered or damaged)")
    try:
        return Checkpoint.from_json(body)
    except CheckpointError as exc:
        raise _Corrupt(f"it holds an impossible checkpoint: {exc.message}") from None
    except TypeError as exc:  # cannot happen after from_json's checks; belt and braces
        raise _Corrupt(f"it holds an impossible checkpoint: {exc}") from None


def decode_envelope(raw: bytes, *, where: str, recovery: str) -> Checkpoint:
    """Parse and verify an envelope. Raises ``CheckpointError`` if it is damaged in any way.

    ``where`` names the stored object, e.g. ``checkpoint file /var/lib/x.json``.
    ``recovery`` tells the user what to do about it. Both go into the error message.
    """
    try:
        return _parse_envelope(raw)
    except _Corrupt as exc:
        raise CheckpointError(f"{where} is unreadable: {exc}. {recovery}") from None


# --------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------


class CheckpointStore(ABC):
    """Where a consumer's checkpoint lives between runs. Blocking, thread-safe."""

    _closed: bool = False

    @abstractmethod
    def load(self) -> Checkpoint | None:
        """The stored checkpoint, or ``None`` if none was ever stored.

        Raises ``CheckpointError`` if what is stored is damaged or unreadable (never
        ``None``), and ``ConnectionLostError`` (retriable) if the store's server is
        unreachable.
        """

    @abstractmethod
    def store(self, checkpoint: Checkpoint) -> None:
        """Replace the stored checkpoint. Durable when it returns.

        On failure the previous checkpoint is still there.
        """

    def close(self) -> None:
        """Release connections. Idempotent. The store is unusable afterwards."""
        self._closed = True

    def _check_open(self) -> None:
        # The same rule for every store. Otherwise a test run on MemoryCheckpointStore
        # would let through a use-after-close that fails with the PostgreSQL store.
        if self._closed:
            raise DatabusError(f"{self!r} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _require_checkpoint(checkpoint: object) -> None:
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"store() takes a Checkpoint, got {type(checkpoint).__name__}")


# --------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------


class MemoryCheckpointStore(CheckpointStore):
    """In-process only, for tests and examples. ``initial`` is what ``load`` first returns."""

    def __init__(self, initial: Checkpoint | None = None) -> None:
        if initial is not None:
            _require_checkpoint(initial)
        self._lock = threading.Lock()
        self._checkpoint = initial
        self.stores = 0
        """How many times ``store`` was called. Tests use it to check the checkpoint cadence."""

    def load(self) -> Checkpoint | None:
        with self._lock:
            self._check_open()
            return self._checkpoint

    def store(self, checkpoint: Checkpoint) -> None:
        _require_checkpoint(checkpoint)
        with self._lock:
            self._check_open()
            self._checkpoint = checkpoint
            self.stores += 1

    def close(self) -> None:
        with self._lock:
            super().close()

    def __repr__(self) -> str:
        return f"MemoryCheckpointStore({self._checkpoint!r})"


# --------------------------------------------------------------------------------------
# File
# --------------------------------------------------------------------------------------

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
# errnos after which trying again later cannot help. Anything else (ENOSPC, EIO,
# EDQUOT...) may clear up, so the error is marked retriable.
_PERMANENT_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG,
     errno.ELOOP}
)


def _os_error(message: str, exc: OSError) -> CheckpointError:
    return CheckpointError(f"{message}: {exc.strerror or exc}",
                           retriable=exc.errno not in _PERMANENT_ERRNOS)


class FileCheckpointStore(CheckpointStore):
    """The checkpoint in ``<directory>/<name>.json``. The directory is created if missing.

    A write goes to a fresh temp file in the same directory. The file is flushed and
    fsynced, renamed over the old one with ``os.replace`` (atomic on POSIX), and then the
    directory is fsynced so that the rename itself survives a power cut. A crash at any
    point leaves either the previous checkpoint or the new one, never a mix. A crash
    before the rename also leaves a temp file, ``.<name>.json.<16 hex>.tmp``, which
    ``load`` ignores and the next store instance deletes.

    Writers take an exclusive ``flock`` on ``.<name>.json.lock``. Threads and processes
    sharing the file are therefore serialized. The cleanup also holds that lock, so it can
    only delete temp files whose writer is gone: the kernel drops the lock of a killed
    process. Nothing depends on pids or file ages.
    """

    def __init__(self, directory: str | os.PathLike[str], name: str = "checkpoint") -> None:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ConfigError(
                f"checkpoint name {name!r} must be 1-200 characters from A-Z a-z 0-9 _ . - "
                "and start with a letter or digit (it becomes a file name)"
            )
        self.directory = Path(directory)
        self.name = name
        self.path = self.directory / f"{name}.json"
        self._lock_path = self.directory / f".{name}.json.lock"
        self._temp_re = re.compile(rf"\.{re.escape(name)}\.json\.[0-9a-f]{{16}}\.tmp")
        self._lock = threading.Lock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error(f"cannot create checkpoint directory {self.directory}", exc) from None
        self._remove_stale_temp_files()

    def __repr__(self) -> str:
        return f"FileCheckpointStore({str(self.path)!r})"

    @property
    def _recovery(self) -> str:
        return (
            f"Restore {self.path} from a backup, or delete it to deliberately start without "
            "a checkpoint. The consumer will not start over on its own."
        )

    def load(self) -> Checkpoint | None:
        self._check_open()
        # No lock needed: os.replace swaps the whole file atomically, so a reader always
        # sees one complete version.
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_ENVELOPE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error(f"cannot read checkpoint file {self.path}", exc) from None
        return decode_envelope(raw, where=f"checkpoint file {self.path}",
                               recovery=self._recovery)

    def store(self, checkpoint: Checkpoint) -> None:
        _require_checkpoint(checkpoint)
        data = encode_envelope(checkpoint)
        with self._lock:
            self._check_open()
            try:
                with self._exclusive():
                    write_atomically(self.path, data)
            except OSError as exc:
                raise _os_error(f"cannot write checkpoint file {self.path}", exc) from None

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the cross-process lock on ``.<name>.json.lock``.

        The kernel releases the lock when the holder dies, even by SIGKILL.
        """
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _remove_stale_temp_files(self) -> None:
        try:
            with self._lock, self._exclusive():
                # While we hold the lock no writer is between creating and renaming its
                # temp file, so every temp file present belongs to an interrupted write.
                stale = [p for p in self.directory.iterdir() if self._temp_re.fullmatch(p.name)]
                for path in stale:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
        except OSError as exc:
            raise _os_error(f"cannot clean up checkpoint directory {self.directory}",
                            exc) from None
        if stale:
            log.info("%s: removed %d temp file(s) left by an interrupted write",
                     self.directory, len(stale))


# --------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------

_SQL_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_DSN_SECRET_RE = re.compile(r"(password|passwd|pwd)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)",
                            re.IGNORECASE)
_DEFAULT_CONNECT_TIMEOUT = 10


def _table_identifier(table: str) -> sql.Identifier:
    """``table`` or ``schema.table`` as a quoted identifier. Anything else is rejected.

    The name is checked against a strict pattern and then quoted by psycopg2. Either one
    alone prevents SQL injection. Quoting makes the name case-sensitive.
    """
    parts = table.split(".") if isinstance(table, str) else []
    if not 1 <= len(parts) <= 2 or not all(_SQL_IDENT_RE.fullmatch(p) for p in parts):
        raise ConfigError(
            f"checkpoint table {table!r} must be 'name' or 'schema.name', each part a letter "
            "or underscore followed by up to 62 letters, digits or underscores"
        )
    return sql.Identifier(*parts)


def _require_consumer(consumer: object) -> str:
    if not isinstance(consumer, str) or not consumer or "\x00" in consumer:
        raise ConfigError(f"consumer name {consumer!r} must be a non-empty string without NUL")
    return consumer


class PostgresCheckpointStore(CheckpointStore):
    """One row per consumer in a PostgreSQL table, created if missing::

        CREATE TABLE databus_checkpoints (
            consumer   text PRIMARY KEY,
            checkpoint text NOT NULL,          -- the JSON envelope (as the file store)
            updated_at timestamptz NOT NULL DEFAULT now()
        )

    The column is ``text`` so that it holds the envelope byte for byte. jsonb would
    re-serialize it and rejects ``\\u0000`` in strings. ``checkpoint::jsonb`` still
    works in queries. A table created beforehand with a jsonb column is also accepted.

    ``store`` is one upsert in a transaction with ``synchronous_commit = on``. It is
    durable when ``commit`` returns, whatever the server's default. The connection is
    opened on first use. A connection found dead (server restarted, network cut) is
    reopened once and the operation retried, which is safe because both operations are
    idempotent. If the server cannot be reached, ``ConnectionLostError`` (retriable) is
    raised.

    The DSN's password never appears in an error message, a log line or the repr.
    """

    def __init__(self, dsn: str, consumer: str, table: str = "databus_checkpoints") -> None:
        self.consumer = _require_consumer(consumer)
        self.table = table
        self._table = _table_identifier(table)
        self._connect_kwargs: dict[str, Any] = {}
        register_uri(dsn)
        if dsn.startswith(("postgresql://", "postgres://")):
            # libpq gets a URL's password as its own argument: its URL parser fails on
            # an unencoded '%' (or splits at an '@' or '/') in a password and quotes it.
            dsn, password = split_password(dsn)
            if password is not None:
                self._connect_kwargs["password"] = password
        try:
            params = parse_dsn(dsn)
        except psycopg2.ProgrammingError:
            # libpq's message quotes pieces of the DSN, which may be the password.
            raise ConfigError("invalid PostgreSQL DSN (details withheld: the DSN may hold a "
                              "password)") from None
        self._dsn = dsn
        self._secrets = sorted({v for k, v in params.items() if "password" in k and v}
                               | set(self._connect_kwargs.values()), key=len, reverse=True)
        for secret in self._secrets:
            register_secret(secret)
        if "connect_timeout" not in params:
            # libpq waits forever by default. A checkpoint store must fail instead.
            self._connect_kwargs["connect_timeout"] = _DEFAULT_CONNECT_TIMEOUT
        if "application_name" not in params:
            self._connect_kwargs["application_name"] = "databus-checkpoint-store"
        host = params.get("host") or params.get("hostaddr") or "localhost"
        port = params.get("port") or "5432"
        user = f"{params['user']}@" if params.get("user") else ""
        dbname = params.get("dbname", "")
        self.server = f"postgresql://{user}{host}:{port}/{dbname}"
        self._lock = threading.Lock()
        self._conn: PgConnection | None = None

    def __repr__(self) -> str:
        return (f"PostgresCheckpointStore({self.server!r}, consumer={self.consumer!r}, "
                f"table={self.table!r})")

    @property
    def _where(self) -> str:
        return f"checkpoint of consumer {self.consumer!r} in table {self.table} on {self.server}"

    def _scrub(self, text: str) -> str:
        """``text`` with every password removed, even one only a server message echoes."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return redact(_DSN_SECRET_RE.sub(lambda m: f"{m.group(1)}=***", text))

    def _describe(self, exc: BaseException) -> str:
        return self._scrub(" ".join(str(exc).split()) or type(exc).__name__)

    # -- operations -------------------------------------------------------------------

    def load(self) -> Checkpoint | None:
        query = sql.SQL("SELECT checkpoint::text FROM {} WHERE consumer = %s").format(
            self._table)

        def select(conn: PgConnection) -> tuple[Any, ...] | None:
            with conn.cursor() as cur:
                cur.execute(query, (self.consumer,))
                return cur.fetchone()

        row = self._run("read", select)
        if row is None:
            return None
        where = self._where
        recovery = (
            f"Restore the row, or delete it to deliberately start without a checkpoint "
            f"(DELETE FROM {self.table} WHERE consumer = <consumer>). The consumer will "
            "not start over on its own."
        )
        if row[0] is None:
            raise CheckpointError(f"{where} is unreadable: the checkpoint column is NULL. "
                                  f"{recovery}")
        return decode_envelope(row[0].encode("utf-8"), where=where, recovery=recovery)

    def store(self, checkpoint: Checkpoint) -> None:
        _require_checkpoint(checkpoint)
        text = encode_envelope(checkpoint).decode("ascii").rstrip("\n")
        upsert = sql.SQL(
            "INSERT INTO {} (consumer, checkpoint, updated_at) VALUES (%s, %s, now()) "
            "ON CONFLICT (consumer) DO UPDATE "
            "SET checkpoint = EXCLUDED.checkpoint, updated_at = EXCLUDED.updated_at"
        ).format(self._table)

        def write(conn: PgConnection) -> None:
            # `with conn` is a transaction even on an autocommit connection (psycopg2
            # >= 2.9). It commits on success and rolls back on error.
            with conn, conn.cursor() as cur:
                # The server may run with synchronous_commit=off (our test fixture does).
                # The store must be durable when it returns, so force it on here.
                cur.execute("SET LOCAL synchronous_commit = on")
                cur.execute(upsert, (self.consumer, text))

        self._run("write", write)

    def close(self) -> None:
        with self._lock:
            super().close()
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    # -- connection handling ----------------------------------------------------------

    def _run(self, what: str, op: Callable[[PgConnection], _T]) -> _T:
        """Run ``op`` on the connection. Reconnect once if the connection is found dead."""
        with self._lock:
            self._check_open()
            for attempt in (1, 2):
                conn = self._conn if self._conn is not None else self._connect()
                self._conn = conn
                try:
                    return op(conn)
                except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
                    if not conn.closed:
                        # The connection is fine, so the server refused this statement
                        # (disk full, statement timeout...). It may pass later.
                        raise CheckpointError(
                            f"cannot {what} the {self._where}: {self._describe(exc)}",
                            retriable=True,
                        ) from None
                    self._drop_connection()
                    if attempt == 2:
                        raise ConnectionLostError(
                            f"lost the connection to {self.server} twice while trying to "
                            f"{what} the checkpoint of {self.consumer!r}: "
                            f"{self._describe(exc)}"
                        ) from None
                    log.warning("connection to %s lost (%s); reconnecting once", self.server,
                                self._describe(exc))
                except psycopg2.Error as exc:
                    # A problem with the table itself (dropped, wrong columns, no
                    # privilege). Trying again will not help.
                    raise CheckpointError(
                        f"cannot {what} the {self._where}: {self._describe(exc)}"
                    ) from None
            raise AssertionError("unreachable")  # pragma: no cover

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    def _connect(self) -> PgConnection:
        try:
            conn: PgConnection = psycopg2.connect(self._dsn, **self._connect_kwargs)
        except psycopg2.Error as exc:
            # `from None`: the original exception would carry libpq's unscrubbed text.
            raise ConnectionLostError(
                f"cannot connect to {self.server}: {self._describe(exc)}"
            ) from None
        try:
            conn.autocommit = True
            self._create_table(conn)
        except psycopg2.Error as exc:
            with contextlib.suppress(psycopg2.Error):
                conn.close()
            if conn.closed and isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError):
                raise ConnectionLostError(
                    f"lost the connection to {self.server} while preparing table "
                    f"{self.table}: {self._describe(exc)}"
                ) from None
            raise CheckpointError(
                f"cannot prepare checkpoint table {self.table} on {self.server}: "
                f"{self._describe(exc)}"
            ) from None
        return conn

    def _create_table(self, conn: PgConnection) -> None:
        with conn.cursor() as cur:
            # Look before creating: CREATE TABLE IF NOT EXISTS still needs the CREATE
            # privilege on the schema, and a role that may only use an existing table
            # does not have it.
            cur.execute("SELECT to_regclass(%s)", (self._table.as_string(conn),))
            row = cur.fetchone()
            if row is not None and row[0] is not None:
                return
            try:
                cur.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ("
                    "consumer text PRIMARY KEY, "
                    "checkpoint text NOT NULL, "
                    "updated_at timestamptz NOT NULL DEFAULT now())"
                ).format(self._table))
                log.info("created checkpoint table %s on %s", self.table, self.server)
            except (psycopg2.errors.UniqueViolation, psycopg2.errors.DuplicateTable):
                # Two stores racing to create the table: IF NOT EXISTS does not cover a
                # concurrent CREATE, whose pg_type row collides. Theirs won, which is fine.
                pass


# --------------------------------------------------------------------------------------
# ZooKeeper
# --------------------------------------------------------------------------------------

_ZNODE_PART_RE = re.compile(r"[^/\x00-\x1f\x7f]+")


def _znode_root(root: str) -> str:
    if not isinstance(root, str) or not root.startswith("/"):
        raise ConfigError(f"ZooKeeper root {root!r} must be an absolute path such as "
                          "/databus/checkpoints")
    stripped = root.rstrip("/")
    for part in stripped.split("/")[1:]:
        if part in (".", "..") or not _ZNODE_PART_RE.fullmatch(part):
            raise ConfigError(f"ZooKeeper root {root!r} has an invalid component {part!r}")
    return stripped  # "" for "/"


def _znode_name(consumer: object) -> str:
    if (not isinstance(consumer, str) or consumer in (".", "..")
            or not _ZNODE_PART_RE.fullmatch(consumer)):
        raise ConfigError(f"consumer name {consumer!r} must be a non-empty string without '/' "
                          "or control characters, and not '.' or '..' (it becomes a znode)")
    return consumer


class ZooKeeperCheckpointStore(CheckpointStore):
    """The checkpoint in the persistent znode ``<root>/<consumer>``, as the JSON envelope.

    The parents are created with ``ensure_path``. The znode itself is created together
    with its data, never empty. An empty znode can therefore only be damage, and it is
    reported rather than read as "no checkpoint". ``store`` sets the data, and ZooKeeper
    acknowledges a write only once it is logged on a quorum. ``load`` first calls
    ``sync``, so a new session connected to a lagging follower still reads the latest
    write.

    The session is opened on first use and reconnects by itself. Every operation goes
    through a ``KazooRetry`` that waits out connection loss with backoff for at most
    ``timeout`` seconds. Past that, it raises ``ConnectionLostError`` (retriable).
    ``timeout`` is also the session timeout asked for. ``close`` stops and closes the
    client.
    """

    def __init__(self, hosts: str, consumer: str, root: str = "/databus/checkpoints",
                 timeout: float = 10.0) -> None:
        # Imported here: kazoo takes ~40 ms to import, and most consumers never use it.
        from kazoo.hosts import collect_hosts
        from kazoo.retry import KazooRetry

        self.consumer = _znode_name(consumer)
        self.root = _znode_root(root)
        self.path = f"{self.root}/{self.consumer}"
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigError(f"ZooKeeper timeout must be a positive number, got {timeout!r}")
        if isinstance(hosts, str) and "@" in hosts:
            # kazoo takes credentials through auth_data, not in hosts; one written as
            # user:password@host must still never be printed.
            register_uri(f"zookeeper://{hosts}")
        try:
            collect_hosts(hosts)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"invalid ZooKeeper hosts {hosts!r}: {exc}") from None
        self.hosts = hosts
        self.timeout = float(timeout)
        self._retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0,
                                 deadline=self.timeout, ignore_expire=True)
        self._lock = threading.Lock()
        self._client: Any = None  # a started KazooClient, or None

    def __repr__(self) -> str:
        return f"ZooKeeperCheckpointStore({self.hosts!r}, path={self.path!r})"

    @property
    def _where(self) -> str:
        return f"checkpoint znode {self.path} on ZooKeeper {self.hosts}"

    def load(self) -> Checkpoint | None:
        from kazoo.exceptions import NoNodeError

        def read(client: Any, deadline: float) -> bytes | None:
            self._wait(client.sync_async(self.path), deadline)
            try:
                data, _stat = self._wait(client.get_async(self.path), deadline)
            except NoNodeError:
                return None
            return bytes(data or b"")

        raw = self._run("read", read)
        if raw is None:
            return None
        recovery = (
            f"Restore the znode's data, or delete the znode to deliberately start without a "
            f"checkpoint (zkCli.sh delete {self.path}). The consumer will not start over on "
            "its own."
        )
        return decode_envelope(raw, where=self._where, recovery=recovery)

    def store(self, checkpoint: Checkpoint) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        _require_checkpoint(checkpoint)
        data = encode_envelope(checkpoint)

        def write(client: Any, deadline: float) -> None:
            # Try set first: after the first store the znode exists, so one round trip.
            try:
                self._wait(client.set_async(self.path, data), deadline)
                return
            except NoNodeError:
                pass
            if self.root:
                self._wait(client.ensure_path_async(self.root), deadline)
            try:
                self._wait(client.create_async(self.path, data), deadline)
            except NodeExistsError:
                # Created meanwhile, or by our own earlier attempt whose answer was lost.
                self._wait(client.set_async(self.path, data), deadline)

        self._run("write", write)

    def close(self) -> None:
        with self._lock:
            super().close()
            client, self._client = self._client, None
        if client is not None:
            self._shut(client)

    # -- plumbing ---------------------------------------------------------------------

    @staticmethod
    def _shut(client: Any) -> None:
        try:
            client.stop()
            client.close()
        except Exception as exc:  # best effort: the session expires on the server anyway
            log.debug("stopping the ZooKeeper client: %r", exc)

    def _wait(self, async_result: Any, deadline: float) -> Any:
        """The result of a kazoo async call, waiting no longer than ``deadline``.

        kazoo's blocking calls wait without a timeout. While the client is reconnecting,
        requests are queued and would wait for as long as the server is down.
        """
        from kazoo.exceptions import OperationTimeoutError
        from kazoo.handlers.threading import KazooTimeoutError

        timeout = max(deadline - time.monotonic(), 0.01)
        try:
            return async_result.get(timeout=timeout)
        except KazooTimeoutError as exc:
            raise OperationTimeoutError(f"no answer within {timeout:.1f} s") from exc

    def _started_client(self) -> Any:
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError
        from kazoo.retry import KazooRetry

        if self._client is not None:
            return self._client
        # Retries are unlimited because the operations have their own deadline. The delay
        # between reconnect attempts is capped well below that deadline. Otherwise, after a
        # long outage, the next attempt could come after an operation already gave up on a
        # server that is back.
        max_delay = min(2.0, self.timeout / 4)
        client = KazooClient(
            hosts=self.hosts,
            timeout=self.timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2,
                                        max_delay=max_delay),
        )
        try:
            client.start(timeout=self.timeout)
        except KazooTimeoutError:
            # start() has already stopped and closed the client.
            raise ConnectionLostError(
                f"cannot connect to ZooKeeper {self.hosts} within {self.timeout:g} s"
            ) from None
        except BaseException:
            self._shut(client)
            raise
        self._client = client
        return client

    def _run(self, what: str, op: Callable[[Any, float], _T]) -> _T:
        from kazoo.exceptions import (
            ConnectionClosedError,
            ConnectionLoss,
            KazooException,
            OperationTimeoutError,
            SessionExpiredError,
        )
        from kazoo.retry import RetryFailedError

        with self._lock:
            self._check_open()
            client = self._started_client()
            deadline = time.monotonic() + self.timeout

            def attempt() -> _T:
                # A request queued while disconnected waits for the reconnect. Failing fast
                # lets KazooRetry do the waiting, with backoff and up to its deadline.
                if not client.connected:
                    raise ConnectionLoss("not connected")
                return op(client, deadline)

            try:
                result: _T = self._retry.copy()(attempt)  # copy: KazooRetry has per-call state
                return result
            except (RetryFailedError, ConnectionLoss, OperationTimeoutError,
                    SessionExpiredError, ConnectionClosedError) as exc:
                raise ConnectionLostError(
                    f"cannot {what} the {self._where}: no working connection within "
                    f"{self.timeout:g} s ({type(exc).__name__}: {exc})"
                ) from None
            except KazooException as exc:
                # NoAuth, bad arguments...: retrying does not help.
                raise CheckpointError(
                    f"cannot {what} the {self._where}: {type(exc).__name__}: {exc}"
                ) from None
