"""``databus pg setup|teardown``, the I/O shell of ``_setup``'s planner (thin):
``read_catalog(conn, source)`` collects the facts with psycopg2, and ``run_setup`` /
``run_teardown`` connect (autocommit), plan, and run the statements only when no check
failed: a blocking check changes nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from databus._ddl import serialized_ddl
from databus._redact import redact
from databus.errors import SourceError, SourceMisconfiguredError
from databus.fetchers.postgres._setup import (
    HEARTBEAT_TABLE,
    LOCK_TIMEOUT_S,
    PARTITION_ROOT_VERSION,
    WATERMARK_SCHEMA,
    WATERMARK_TABLE,
    CatalogFacts,
    Plan,
    PublicationFacts,
    SlotFacts,
    TableFacts,
    plan_setup,
    plan_teardown,
)
from databus.fetchers.postgres._uri import LogicalSource, TableName

__all__ = ["Outcome", "connect", "read_catalog", "run_setup", "run_teardown"]

def _one_line(exc: BaseException) -> str:
    return redact(" ".join(str(exc).split()))


def connect(source: LogicalSource) -> Any:
    """An autocommit connection, or a ``SourceError`` of one line without the password
    (``SourceMisconfiguredError`` for refused credentials)."""
    import psycopg2

    kwargs: dict[str, Any] = dict(source.connect_kwargs())
    kwargs["application_name"] = "databus-pg-setup"
    try:
        conn = psycopg2.connect(**kwargs)
    except psycopg2.Error as exc:
        text = _one_line(exc)
        if "authentication failed" in text or "pg_hba.conf" in text \
                or "password" in text:
            raise SourceMisconfiguredError(
                f"PostgreSQL {source.redacted} refused the login: {text}") from None
        raise SourceError(f"cannot connect to PostgreSQL {source.redacted}: {text}",
                          retriable=False) from None
    conn.autocommit = True
    return conn


_TABLE_COLUMNS = """
    c.oid, n.nspname, c.relname, c.relkind, c.relreplident, c.relispartition,
    ARRAY(SELECT a.attname::text FROM pg_index i
          CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
          WHERE i.indrelid = c.oid AND i.indisprimary ORDER BY k.ord),
    (SELECT ic.relname::text FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
     WHERE i.indrelid = c.oid AND i.indisreplident LIMIT 1),
    ARRAY(SELECT a.attname::text FROM pg_index i
          CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
          WHERE i.indrelid = c.oid AND i.indisreplident ORDER BY k.ord),
    ARRAY(SELECT a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod)
          FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0
          AND NOT a.attisdropped AND a.attstorage IN ('x', 'e') ORDER BY a.attnum),
    has_table_privilege(c.oid, 'SELECT'),
    has_table_privilege(c.oid, 'INSERT') AND has_table_privilege(c.oid, 'UPDATE'),
    pg_has_role(c.relowner, 'USAGE')
"""


def _tables(cur: Any, where: str, params: Sequence[Any]) -> list[tuple[int, TableFacts]]:
    cur.execute(f"SELECT {_TABLE_COLUMNS} FROM pg_class c JOIN pg_namespace n "
                f"ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND ({where}) "
                "ORDER BY n.nspname, c.relname", params)
    out = []
    for (oid, schema, table, kind, ident, is_partition, pk, index, index_columns, toast,
         can_select, can_write, owned) in cur.fetchall():
        out.append((oid, TableFacts(
            schema, table, kind=kind, replica_identity=ident, primary_key=tuple(pk),
            identity_index=index, identity_columns=tuple(index_columns),
            toast_columns=tuple((n, ty) for n, _, ty in (c.partition(" ") for c in toast)),
            is_partition=is_partition, can_select=can_select, can_write=can_write,
            owned=owned)))
    return out


def read_catalog(conn: Any, source: LogicalSource) -> CatalogFacts:
    """The facts ``plan_setup`` and ``plan_teardown`` need, in a few catalog queries."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT current_setting('server_version_num')::int, "
            "current_setting('server_version'), current_database(), current_user, "
            "r.rolsuper, r.rolreplication, current_setting('wal_level'), "
            "current_setting('max_replication_slots')::int, "
            "current_setting('max_wal_senders')::int, "
            "has_database_privilege(current_database(), 'CREATE'), current_schema(), "
            "COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false) "
            "FROM pg_roles r WHERE r.rolname = current_user")
        (version_num, version, database, user, superuser, replication, wal_level,
         max_slots, max_senders, can_create_db, current_schema,
         can_create_schema) = cur.fetchone()
        cur.execute("SELECT s.slot_name::text, s.slot_type, s.plugin::text, "
                    "s.database::text, s.active_pid, "
                    "COALESCE(a.application_name, '') || ' from ' || "
                    "COALESCE(host(a.client_addr), 'local') "
                    "FROM pg_replication_slots s LEFT JOIN pg_stat_activity a "
                    "ON a.pid = s.active_pid ORDER BY s.slot_name")
        slots = tuple(SlotFacts(name, slot_type, plugin, db, pid, client if pid else None)
                      for name, slot_type, plugin, db, pid, client in cur.fetchall())
        wanted_schemas = sorted({t.schema for t in source.tables})
        cur.execute("SELECT nspname::text FROM pg_namespace WHERE nspname = ANY(%s)",
                    (wanted_schemas,))
        schemas = frozenset(r[0] for r in cur.fetchall())
        rows = _tables(cur, "n.nspname = ANY(%s) AND c.relname NOT IN (%s, %s)",
                       (wanted_schemas, HEARTBEAT_TABLE, WATERMARK_TABLE))
        tables: list[TableFacts] = []
        for oid, table in rows:
            if table.kind == "p":
                leaves = _tables(cur, "c.oid IN (SELECT relid FROM pg_partition_tree(%s) "
                                 "WHERE isleaf)", (oid,))
                table = TableFacts(**{**_fields(table),
                                      "partitions": tuple(t for _, t in leaves)})
            tables.append(table)
        heartbeat = None
        if current_schema is not None:
            found = _tables(cur, "n.nspname = %s AND c.relname = %s",
                            (current_schema, HEARTBEAT_TABLE))
            heartbeat = found[0][1] if found else None
        found = _tables(cur, "n.nspname = %s AND c.relname = %s",
                        (WATERMARK_SCHEMA, WATERMARK_TABLE))
        watermark = found[0][1] if found else None
        publication = _publication(cur, source.publication, version_num)
    return CatalogFacts(
        version_num=version_num, version=version.split(" ", 1)[0],  # not "(Debian ...)"
        database=database, user=user,
        superuser=superuser, replication=replication, wal_level=wal_level,
        max_replication_slots=max_slots, max_wal_senders=max_senders, slots=slots,
        can_create_in_database=can_create_db, current_schema=current_schema,
        can_create_in_schema=can_create_schema, schemas=schemas, tables=tuple(tables),
        heartbeat=heartbeat, watermark=watermark, publication=publication)


def _fields(table: TableFacts) -> dict[str, Any]:
    return {name: getattr(table, name) for name in TableFacts.__dataclass_fields__}


def _publication(cur: Any, name: str, version_num: int) -> PublicationFacts | None:
    via_root = "p.pubviaroot" if version_num >= PARTITION_ROOT_VERSION else "false"
    cur.execute(f"SELECT p.oid, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, "
                f"p.pubtruncate, {via_root}, pg_has_role(p.pubowner, 'USAGE') "
                "FROM pg_publication p WHERE p.pubname = %s", (name,))
    row = cur.fetchone()
    if row is None:
        return None
    oid, all_tables, insert, update, delete, truncate, via_root_value, owned = row
    # Tables added by name (a partitioned table is listed as itself), plus what the view
    # expands (FOR TABLES IN SCHEMA, partitions).
    cur.execute("SELECT n.nspname::text, c.relname::text FROM pg_publication_rel pr "
                "JOIN pg_class c ON c.oid = pr.prrelid JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE pr.prpubid = %s "
                "UNION SELECT schemaname::text, tablename::text FROM pg_publication_tables "
                "WHERE pubname = %s", (oid, name))
    tables = frozenset(TableName(s, t) for s, t in cur.fetchall())
    return PublicationFacts(name, all_tables, insert, update, delete, truncate,
                            via_root_value, owned, tables)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What ``run_setup``/``run_teardown`` did: the plan, and the statements run (none
    with ``dry_run`` or when a check failed)."""

    plan: Plan
    executed: tuple[str, ...]
    dry_run: bool


def _execute(conn: Any, source: LogicalSource, statements: Iterable[str]) -> tuple[str, ...]:
    import psycopg2

    done: list[str] = []
    with conn.cursor() as cur:
        cur.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'")
        for statement in statements:
            try:
                cur.execute(statement)
            except psycopg2.Error as exc:
                ran = (f"; already run: {'; '.join(done)}" if done else
                       "; nothing was changed")
                raise SourceError(f"PostgreSQL {source.redacted}: {statement}: "
                                  f"{_one_line(exc)}{ran}", retriable=False) from None
            done.append(statement)
    return tuple(done)


def run_setup(source: LogicalSource, *, dry_run: bool = False,
              replica_identity_full: bool = False) -> Outcome:
    """Check, then (when every check passed and not ``dry_run``) run the statements,
    then check again that nothing is left to do."""
    import psycopg2

    conn = connect(source)
    try:
        try:
            # Two setups at once would plan the same statements and the second
            # would fail on objects the first created: they take turns.
            with conn.cursor() as cur, serialized_ddl(cur, "postgresql",
                                                      "logical-setup"):
                plan = plan_setup(source, read_catalog(conn, source),
                                  replica_identity_full=replica_identity_full)
                if dry_run or not plan.ok or not plan.statements:
                    return Outcome(plan, (), dry_run)
                executed = _execute(conn, source, plan.statements)
                after = plan_setup(source, read_catalog(conn, source),
                                   replica_identity_full=replica_identity_full)
        except psycopg2.Error as exc:
            raise SourceError(f"PostgreSQL {source.redacted}: {_one_line(exc)}",
                              retriable=False) from None
        if after.statements or not after.ok:
            left = [c.message for c in after.errors] + list(after.statements)
            raise SourceError(f"PostgreSQL {source.redacted}: setup ran "
                              f"{len(executed)} statement(s), yet still needs: "
                              f"{'; '.join(left)}", retriable=False)
        return Outcome(plan, executed, dry_run)
    finally:
        conn.close()


def run_teardown(source: LogicalSource, *, dry_run: bool = False) -> Outcome:
    import psycopg2

    conn = connect(source)
    try:
        try:
            # Two setups at once would plan the same statements and the second
            # would fail on objects the first created: they take turns.
            with conn.cursor() as cur, serialized_ddl(cur, "postgresql",
                                                      "logical-setup"):
                plan = plan_teardown(source, read_catalog(conn, source))
                if dry_run or not plan.ok or not plan.statements:
                    return Outcome(plan, (), dry_run)
                return Outcome(plan, _execute(conn, source, plan.statements), dry_run)
        except psycopg2.Error as exc:
            raise SourceError(f"PostgreSQL {source.redacted}: {_one_line(exc)}",
                              retriable=False) from None
    finally:
        conn.close()
