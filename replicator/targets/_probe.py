"""Whether a target would let a replication keep its state, found without writing
anything (``databus replicate assess``).

A replication creates ``databus_replication_state`` and ``databus_replication_schemas``
when they are missing and writes a row with every batch. ``probe_state`` finds out
whether that will be allowed and leaves the target as it was:

- PostgreSQL and SQLite: schema changes are transactional, so the very statements the
  replicator runs (the schema when missing, both tables, a state row) run in one
  transaction that is then rolled back: the answer is the server's own;
- MySQL/MariaDB commit a CREATE TABLE by themselves: the user's privileges are read
  from ``information_schema`` instead (CREATE and INSERT on the database, or global);
  privileges that come only through a role are not seen there, so "not found" is a
  warning, not a refusal.
"""

from __future__ import annotations

from typing import Any

from databus.errors import DatabusError
from databus.replicator.targets._base import SqlTarget
from databus.replicator.targets._sql import STATE_TABLE

__all__ = ["Probe", "probe_state"]

PROBE_REPLICATION = "databus-assess-probe"


class _RollBack(Exception):
    """Ends the probe's transaction: ``SqlTarget._tx`` rolls back on any exception."""


class Probe:
    """What ``probe_state`` found: ``refused`` (replication cannot keep its state:
    blocking), ``unsure`` (could not confirm: a warning), both None when it can;
    ``state_exists``: the state table is there already (nothing will be created)."""

    def __init__(self, state_exists: bool, refused: str | None = None,
                 unsure: str | None = None) -> None:
        self.state_exists = state_exists
        self.refused = refused
        self.unsure = unsure


def probe_state(target: Any) -> Probe:
    """Probe ``target`` (a ``SqlTarget``; any other target is taken as able)."""
    if not isinstance(target, SqlTarget):
        return Probe(state_exists=False)
    try:
        exists = _state_exists(target)
        if target.dialect == "mysql":
            return _mysql_privileges(target, exists)
        _rolled_back(target)
    except _RollBack:
        return Probe(exists)
    except DatabusError as exc:
        return Probe(False, refused=f"the target refused the replication state table: {exc}")
    return Probe(exists)  # pragma: no cover - _rolled_back always raises


def _state_exists(target: SqlTarget) -> bool:
    with target._lock, target._tx("reading the catalog") as cur:
        return target._table_exists(cur, target.default_schema, STATE_TABLE)


def _rolled_back(target: SqlTarget) -> None:
    """``ensure_state`` and a state row, in a transaction rolled back (raises
    ``_RollBack`` when all of it was allowed, ``TargetError`` when not)."""
    with (target._lock,
          target._tx("checking the replication state table", write=True) as cur,
          target._serialized_ddl(cur)):
        target._ensure_schema(cur, target.default_schema)
        suffix = target._table_suffix(cur)
        cur.execute(target.sql.create_state_table(target._state_qname, suffix=suffix), ())
        cur.execute(target.sql.create_schema_table(target._schema_qname, suffix=suffix), ())
        cur.execute(target.sql.save_state(target._state_qname), (PROBE_REPLICATION, 0, None))
        raise _RollBack


_MYSQL_PRIVILEGES = (
    "SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = %s "
    "UNION SELECT PRIVILEGE_TYPE FROM information_schema.SCHEMA_PRIVILEGES "
    "WHERE GRANTEE = %s AND %s LIKE TABLE_SCHEMA")


def _mysql_privileges(target: SqlTarget, exists: bool) -> Probe:
    """CREATE (unless the state table exists) and INSERT on the target's database,
    granted to the current user globally or on that database (grant patterns match
    as LIKE), read from ``information_schema``: nothing is created."""
    with target._lock, target._tx("reading the user's privileges") as cur:
        cur.execute("SELECT CURRENT_USER()")
        row = cur.fetchone()
        user, _, host = str(row[0] if row else "").rpartition("@")
        grantee = f"'{user}'@'{host}'"
        cur.execute(_MYSQL_PRIVILEGES, (grantee, grantee, target.default_schema))
        have = {str(p[0]).upper() for p in cur.fetchall()}
    if "ALL PRIVILEGES" in have:
        return Probe(exists)
    missing = [p for p in (("INSERT",) if exists else ("CREATE", "INSERT"))
               if p not in have]
    if not missing:
        return Probe(exists)
    return Probe(exists, unsure=(
        f"could not confirm that {user}@{host} may {' and '.join(missing)} in "
        f"{target.default_schema} (the replication state table); privileges given "
        "through a role are not checked"))
