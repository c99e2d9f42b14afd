"""Target database writers: one per dialect, behind one ``Target`` interface.

``open_target(url)`` picks the writer by the URL's scheme:

- ``postgresql://user:pw@host:port/db[?schema=s]`` (also ``postgres://``): psycopg2;
- ``mysql://user:pw@host:port/db`` (also ``mariadb://``): MariaDB or MySQL, pymysql;
- ``sqlite:///path/replica.db``: sqlite3, the embedded default.

A target applies a ``Batch`` and records its SCN (and client checkpoint) in
``databus_replication_state`` in one transaction (``Target.apply``): a restart resumes
from the target's own record, so every batch takes effect exactly once. It also keeps
that state table, reads its catalog (for ``assess`` and DDL), creates tables and runs
the simple ALTER TABLEs a new source schema version needs.

Errors (``_errors``): ``TargetUnavailableError`` (retriable: the target went away, try
again with backoff), ``ReplicationApplyError`` (a change the target refuses, naming
the table and the key), ``TargetError`` (anything else the target refuses). No message
carries the URL's password.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol
from urllib.parse import urlsplit

from databus.config import redact_uri
from databus.errors import ConfigError
from databus.replicator._model import Batch, ColumnMap, Dialect, TableMap
from databus.replicator.targets._base import Held
from databus.replicator.targets._errors import (
    ReplicationApplyError,
    TargetError,
    TargetUnavailableError,
)
from databus.replicator.targets._sql import STATE_TABLE

__all__ = [
    "STATE_TABLE",
    "ReplicationApplyError",
    "Target",
    "TargetError",
    "TargetUnavailableError",
    "open_target",
]


class Target(Protocol):
    """A target database. Calls may come from several threads, one at a time (each
    implementation serialises them); any call connects if needed, and again after a
    lost connection."""

    dialect: Dialect
    # The URL without its password, for messages and status.
    where: str

    def open(self) -> None:
        """Connect now (and fail now: ``TargetUnavailableError`` if the target is down,
        ``TargetError`` if it refuses the credentials)."""

    def close(self) -> None: ...

    def hold(self, replication: str) -> Held:
        """Safe start (docs/operations.md): this process runs ``replication`` on this target
        until the hold is released or the process ends; ``AlreadyRunningError`` when
        another process does."""

    def ensure_state(self) -> None:
        """Create ``databus_replication_state`` if it is missing."""

    def load_state(self, replication: str) -> int | None:
        """The SCN recorded for ``replication`` (None: nothing applied yet)."""

    def load_checkpoint(self, replication: str) -> str | None:
        """The client checkpoint recorded with that SCN (``Batch.checkpoint``)."""

    def load_schema(self, replication: str, source: str) -> str | None:
        """The source schema (Avro JSON) the target table of ``source`` last followed."""

    def save_schema(self, replication: str, source: str, fingerprint: int,
                    schema_json: str) -> None:
        """Record the source schema the target table of ``source`` now follows."""

    def table_exists(self, t: TableMap) -> bool: ...

    def catalog(self, t: TableMap) -> list[tuple[str, str, bool]]:
        """(name, catalog type, NULL-able) of every column, in order (empty: no table)."""

    def shown(self, t: TableMap) -> str:
        """The target table's name as messages show it."""

    def table_columns(self, t: TableMap) -> dict[str, str]:
        """Column name -> type as the target's catalog spells it, in table order."""

    def table_nullable(self, t: TableMap) -> dict[str, bool]:
        """Column name -> whether the target column allows NULL (empty: no table)."""

    def table_key(self, t: TableMap) -> tuple[str, ...]:
        """The target table's primary key columns (empty: none, or no table)."""

    def create_table(self, t: TableMap) -> None: ...

    def add_column(self, t: TableMap, column: ColumnMap) -> None: ...

    def drop_column(self, t: TableMap, name: str) -> None: ...

    def widen_column(self, t: TableMap, column: ColumnMap) -> None: ...

    def accepts_straight_copy(self, t: TableMap) -> bool:
        """Whether an initial copy's rows may go straight into ``t``'s table (COPY, no
        merge; ``Batch.straight``): a target that can (PostgreSQL), the table empty
        and its primary key ``t.key``."""
        ...

    def apply(self, replication: str, tables: Mapping[str, TableMap], batch: Batch) -> None:
        """Every change of ``batch`` (``tables`` maps its sources) and ``batch.scn`` as
        ``replication``'s state, in one transaction."""


def open_target(url: str) -> Target:
    """The writer for ``url`` (by scheme), not yet connected: ``open()`` connects, as
    does the first call that needs the database. ``ConfigError`` for an unknown scheme
    or a malformed URL (the message shows the URL without its password)."""
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:
        scheme = ""
    if scheme in ("postgresql", "postgres"):
        from databus.replicator.targets._postgres import PostgresTarget

        return PostgresTarget(url)
    if scheme in ("mysql", "mariadb"):
        from databus.replicator.targets._mysql import MysqlTarget

        return MysqlTarget(url)
    if scheme == "sqlite":
        from databus.replicator.targets._sqlite import SqliteTarget

        return SqliteTarget(url)
    raise ConfigError(f"unknown target {redact_uri(url)!r}: use postgresql://, mysql:// "
                      "or sqlite:/// URL")
