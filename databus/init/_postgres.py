"""``databus init postgres``: a PostgreSQL source for the logical decoding fetcher.

Every check is ``databus pg setup``'s (``read_catalog`` and ``plan_setup``: wal_level,
slots, the REPLICATION attribute, each table's replica identity and SELECT, the
publication and the slot), planned as if the dump watermark table of ``databus dump
setup`` existed already, so that one block creates the watermark table, then the
publication that includes it, then the slot. The fixes that are statements (the role's
REPLICATION attribute, SELECT grants, wal_level) join the block; the rest are listed.
"""

from __future__ import annotations

import dataclasses

import psycopg2

from databus.errors import DatabusError, SourceMisconfiguredError
from databus.fetchers.postgres._setup import (
    WATERMARK_SCHEMA,
    WATERMARK_TABLE,
    TableFacts,
    plan_setup,
    quote_ident,
)
from databus.fetchers.postgres._setup_run import connect, read_catalog
from databus.fetchers.postgres._uri import parse_logical_source
from databus.init._model import Inspection, buffer_name

__all__ = ["inspect_postgres"]

_WATERMARK_DDL = (f"CREATE TABLE IF NOT EXISTS {WATERMARK_SCHEMA}.{WATERMARK_TABLE} "
                  "(id text PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now())")


def _can_write_watermark(conn: object) -> bool:
    with conn.cursor() as cur:  # type: ignore[attr-defined]
        name = f"{WATERMARK_SCHEMA}.{WATERMARK_TABLE}"
        cur.execute("SELECT has_table_privilege(current_user, %s, 'INSERT') AND "
                    "has_table_privilege(current_user, %s, 'DELETE') AND "
                    "has_table_privilege(current_user, %s, 'SELECT')", (name,) * 3)
        return bool(cur.fetchone()[0])


def inspect_postgres(uri: str, *, replica_identity_full: bool = False) -> Inspection:
    source = parse_logical_source(uri)
    found = Inspection("postgres", admin="a superuser (psql -U postgres -d DB)")
    role = quote_ident(source.user) if source.user else "<the relay's user>"
    try:
        conn = connect(source)
    except DatabusError as exc:
        if not isinstance(exc, SourceMisconfiguredError):  # not there: nothing to run
            found.error("login", str(exc), "start the server, or correct the URI's host "
                        "and port")
            return found
        found.error("login", str(exc), "create the role, or correct the URI: CREATE ROLE "
                    f"{role} LOGIN REPLICATION PASSWORD '...'")
        found.sql.append(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '<password>'")
        return found
    try:
        facts = read_catalog(conn, source)
        writable = facts.watermark is not None and _can_write_watermark(conn)
    except psycopg2.Error as exc:
        found.error("catalog", f"reading the catalog: {' '.join(str(exc).split())}")
        return found
    finally:
        conn.close()
    found.buffer = buffer_name(facts.database, "postgres")
    role = quote_ident(facts.user)
    statements: list[str] = []
    wm_name = f"{WATERMARK_SCHEMA}.{WATERMARK_TABLE}"
    own = Inspection("postgres")  # the watermark's findings, listed after the plan's
    if facts.watermark is None:
        # Planned as present: the block creates it before the publication that has it.
        statements.append(_WATERMARK_DDL)
        facts = dataclasses.replace(facts, watermark=TableFacts(
            WATERMARK_SCHEMA, WATERMARK_TABLE, primary_key=("id",)))
        own.ok("watermark", f"dump watermark table {wm_name} will be created")
    elif writable or facts.superuser:
        own.ok("watermark", f"dump watermark table {wm_name} exists and {facts.user} "
                 "can write it")
    else:
        own.error("watermark", f"{facts.user} cannot write the dump watermark table "
                    f"{wm_name}", f"GRANT SELECT, INSERT, DELETE ON {wm_name} TO {role}")
    if not (writable or facts.superuser):
        statements.append(f"GRANT SELECT, INSERT, DELETE ON {wm_name} TO {role}")
    plan = plan_setup(source, facts, replica_identity_full=replica_identity_full)
    for check in plan.checks:
        if check.name == "privileges" and "may not run these statements" in check.message:
            continue  # the administrator runs them, not the relay's user
        if check.verdict == "ok":
            found.ok(check.name, check.message)
        elif check.verdict == "warning":
            found.warn(check.name, check.message, check.fix)
        else:
            found.error(check.name, check.message, check.fix)
            if check.name == "replication_role":
                statements.append(f"ALTER ROLE {role} REPLICATION")
            elif check.name == "select" and check.subject:
                statements.append(f"GRANT SELECT ON {_qualified(check.subject)} TO {role}")
            elif check.name == "wal_level":
                statements.append("ALTER SYSTEM SET wal_level = logical   -- then restart "
                                  "PostgreSQL")
    found.findings.extend(own.findings)
    # Then the plan's statements (replica identity, heartbeat, publication, slot), in
    # the order databus pg setup runs them.
    found.sql = statements + list(plan.statements)
    found.tables = [str(t) for t in plan.tables]
    return found


def _qualified(name: str) -> str:
    schema, _, table = name.partition(".")
    return f"{quote_ident(schema)}.{quote_ident(table)}"
