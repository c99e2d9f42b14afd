"""One lock around schema setup, shared by every component that creates its own objects.

``CREATE ... IF NOT EXISTS`` is not safe against a concurrent ``CREATE`` of the same
object on PostgreSQL: both statements find nothing, both insert the catalog row, and the
one that commits second fails with a ``UniqueViolation`` on ``pg_namespace`` or
``pg_type`` (``CREATE OR REPLACE FUNCTION`` fails with "tuple concurrently updated").
Two bootstrap services, relays, replicators or checkpoint stores started together on a
fresh database would then see one of them die at start. The cure is the same
everywhere: whoever sets up a schema first takes one named lock, so the setups run one
after the other and the later ones find everything there.

- PostgreSQL: an advisory lock keyed by the name. Inside a transaction it is the
  transaction-level ``pg_advisory_xact_lock``, released by the commit that makes the
  DDL visible (a session lock released before the commit would let the next setup in
  while the objects are still invisible to it). On an autocommit connection every
  statement commits by itself, so a session lock is taken and released around them.
- MySQL/MariaDB: ``GET_LOCK`` (DDL commits implicitly, so the lock is released right
  after it), waiting at most ``timeout`` seconds.
- SQLite (and anything else): nothing; SQLite serializes writers itself.

The lock must be the first thing a transaction does, before any other lock is held, so
that it can never be part of a deadlock with the objects it protects.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any, Literal

from databus.errors import DdlLockTimeoutError

DdlDialect = Literal["postgresql", "mysql", "sqlite"]

# How long a MySQL/MariaDB setup waits for another one's (PostgreSQL waits without end:
# its lock is released by the holder's commit, rollback or lost connection).
DEFAULT_TIMEOUT_S = 60.0


def ddl_lock_key(name: str) -> int:
    """The signed 64-bit advisory lock key of ``name`` (stable across processes)."""
    digest = hashlib.blake2b(f"databus-ddl:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def mysql_lock_name(name: str) -> str:
    """A ``GET_LOCK`` name for ``name`` (MySQL allows 64 characters)."""
    return "databus_ddl_" + hashlib.blake2b(name.encode(), digest_size=16).hexdigest()


def pg_xact_lock_sql(name: str) -> str:
    """The statement that takes ``name``'s lock until the end of the transaction; a
    literal, so that it can head an SQL script printed for an administrator too."""
    return f"SELECT pg_advisory_xact_lock({ddl_lock_key(name)})"


def _autocommit(cur: Any) -> bool:
    return bool(getattr(getattr(cur, "connection", None), "autocommit", False))


@contextlib.contextmanager
def serialized_ddl(cur: Any, dialect: DdlDialect, name: str, *,
                   timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    """Run the block's DDL under ``name``'s lock (see the module docstring). ``cur`` is a
    DB-API cursor of a psycopg2 or PyMySQL connection."""
    if dialect == "postgresql":
        if not _autocommit(cur):
            cur.execute(pg_xact_lock_sql(name))
            yield
            return
        key = ddl_lock_key(name)
        cur.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # a lost connection frees it anyway
                cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
        return
    if dialect == "mysql":
        lock = mysql_lock_name(name)
        cur.execute("SELECT GET_LOCK(%s, %s)", (lock, timeout))
        row = cur.fetchone()
        if row is None or row[0] != 1:
            raise DdlLockTimeoutError(
                f"another setup held the schema lock for {name} longer than {timeout:g} s "
                "(a setup stopped half-way? it is released when its connection ends)")
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                cur.execute("SELECT RELEASE_LOCK(%s)", (lock,))
                cur.fetchall()
        return
    yield
