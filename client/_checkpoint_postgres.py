"""The PostgreSQL checkpoint store (one row per consumer). See ``_checkpoint_store``."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg2
import psycopg2.errors
from psycopg2 import sql
from psycopg2.extensions import parse_dsn

from databus._ddl import serialized_ddl
from databus._limited_log import limited
from databus._redact import redact, register_secret, register_uri, split_password
from databus.checkpoint import Checkpoint
from databus.client._checkpoint_envelope import decode_envelope, encode_envelope
from databus.client._checkpoint_store import CheckpointStore, _require_checkpoint
from databus.errors import CheckpointError, ConfigError, ConnectionLostError

if TYPE_CHECKING:
    from psycopg2.extensions import connection as PgConnection

log = logging.getLogger("databus.client.checkpoint")

_T = TypeVar("_T")

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

    # -- several rows (consumer-group partitions) ---------------------------------------

    def partition_name(self, partition: int) -> str:
        """The row of partition ``partition`` of a consumer group using this store:
        ``<consumer>#<partition>``."""
        return f"{self.consumer}#{partition}"

    def load_partitions(self, partitions: list[int]) -> dict[int, Checkpoint | None]:
        """The checkpoints of these partitions' rows (None where there is no row)."""
        names = [self.partition_name(p) for p in partitions]
        query = sql.SQL("SELECT consumer, checkpoint::text FROM {} WHERE consumer = ANY(%s)"
                        ).format(self._table)

        def select(conn: PgConnection) -> list[tuple[Any, ...]]:
            with conn.cursor() as cur:
                cur.execute(query, (names,))
                return cur.fetchall()

        rows = dict(self._run("read", select))
        out: dict[int, Checkpoint | None] = {}
        for p, name in zip(partitions, names, strict=True):
            text = rows.get(name)
            if name not in rows:
                out[p] = None
                continue
            where = f"checkpoint of partition {p} ({name!r}) in table {self.table} on " \
                    f"{self.server}"
            recovery = (f"Restore the row, or delete it to start partition {p} without a "
                        "checkpoint. The member will not start over on its own.")
            if text is None:
                raise CheckpointError(f"{where} is unreadable: the checkpoint column is "
                                      f"NULL. {recovery}")
            out[p] = decode_envelope(text.encode("utf-8"), where=where, recovery=recovery)
        return out

    def store_partitions(self, partitions: list[int], checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` to these partitions' rows in one transaction."""
        _require_checkpoint(checkpoint)
        text = encode_envelope(checkpoint).decode("ascii").rstrip("\n")
        names = [self.partition_name(p) for p in partitions]
        upsert = sql.SQL(
            "INSERT INTO {} (consumer, checkpoint, updated_at) "
            "SELECT name, %s, now() FROM unnest(%s::text[]) AS name "
            "ON CONFLICT (consumer) DO UPDATE "
            "SET checkpoint = EXCLUDED.checkpoint, updated_at = EXCLUDED.updated_at"
        ).format(self._table)

        def write(conn: PgConnection) -> None:
            with conn, conn.cursor() as cur:
                cur.execute("SET LOCAL synchronous_commit = on")
                cur.execute(upsert, (text, names))

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
                    limited(log).warning("connection to %s lost (%s); reconnecting once",
                                         self.server, self._describe(exc))
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
            # Two stores starting together on a fresh database: IF NOT EXISTS does not
            # cover a concurrent CREATE (the second dies on its pg_type row), so the
            # creations take turns (databus/_ddl.py; a session lock: autocommit).
            with serialized_ddl(cur, "postgresql", f"checkpoints:{self.table}"):
                cur.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ("
                    "consumer text PRIMARY KEY, "
                    "checkpoint text NOT NULL, "
                    "updated_at timestamptz NOT NULL DEFAULT now())"
                ).format(self._table))
            log.info("checkpoint table %s ready on %s", self.table, self.server)


