"""``databus pg setup|teardown``: what a ``postgresql://`` source needs on the server
(docs/postgres-logical-setup.md, issue 18 item 3).

Two halves:

- **planning**, pure: ``plan_setup(source, facts)`` and ``plan_teardown(source, facts)``
  take what the catalog says (``CatalogFacts``, built by hand in the unit tests) and
  return a ``Plan``: every check with its verdict (``ok``, ``warning``, ``error``), its
  message and its fix, and the SQL statements that would bring the server to the wanted
  state. Statements are only those still needed, so a plan of a server that is set up
  has none (idempotence is a property of the planner, not of ``IF NOT EXISTS``).
- **I/O**, thin, in ``_setup_run``: ``read_catalog(conn, source)`` collects the facts
  with psycopg2, and ``run_setup`` / ``run_teardown`` connect (autocommit), plan, and
  run the statements only when no check failed: a blocking check changes nothing.

Decisions (the doc explains them to operators):

- The publication publishes ``insert, update, delete``, never ``truncate``: the fetcher
  refuses a TRUNCATE of a captured table (it is not a row change a consumer could apply
  in order), so publishing it would only turn a TRUNCATE into a quarantined table.
- A table whose UPDATE may leave a TOASTable column (``attstorage`` ``x`` or ``e``:
  text, varchar, bytea, json(b), arrays, ...) unchanged is a *warning* unless it is
  ``REPLICA IDENTITY FULL``: pgoutput then sends no value for that column, and the
  fetcher quarantines the table at such an update rather than invent one.
  ``--replica-identity-full`` makes setup run the ``ALTER TABLE ... REPLICA IDENTITY
  FULL`` statements (also for tables whose deletes carry no key).
- Patterns (``schema.*``) are resolved to the tables present now (partitions excluded:
  a partitioned table is published through its root, ``publish_via_partition_root``);
  a table created later joins the publication when setup runs again.
- A table whose name the relay cannot serve (whitespace, a comma, over 255 characters:
  ``fetchers/_failures.servable_name``) is an error, also under a pattern: nothing is
  published (issue 28: it used to be published and then stop the relay's buffer).
- An existing publication is only ever extended (``ALTER PUBLICATION ... ADD TABLE``):
  tables someone else added stay, and its options are reported, not changed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from databus.fetchers._failures import UNSERVABLE_NAME, servable_name
from databus.fetchers.postgres._uri import LogicalSource, TableName

__all__ = [
    "HEARTBEAT_TABLE",
    "WATERMARK_TABLE",
    "CatalogFacts",
    "Check",
    "Plan",
    "PublicationFacts",
    "SlotFacts",
    "TableFacts",
    "plan_setup",
    "plan_teardown",
    "quote_ident",
]

Verdict = Literal["ok", "warning", "error"]

HEARTBEAT_TABLE = "databus_heartbeat"
WATERMARK_TABLE = "databus_watermark"
WATERMARK_SCHEMA = "public"  # where ``databus dump setup`` creates it for this source
PUBLISH = "insert, update, delete"
PLUGIN = "pgoutput"
MIN_VERSION = 100000  # logical replication and pgoutput: PostgreSQL 10
PARTITION_ROOT_VERSION = 130000  # publish_via_partition_root: PostgreSQL 13
# attstorage of columns whose values can be stored out of line (TOAST): 'x' extended,
# 'e' external. ('m', main, is numeric's: moved out of line only as a last resort.)
TOAST_STORAGE = frozenset({"x", "e"})
# Seconds a DDL statement of setup may wait for a lock before giving up, so that a long
# transaction on a table never queues the application's queries behind setup's ALTER.
LOCK_TIMEOUT_S = 10

# PostgreSQL 15's reserved keywords (pg_get_keywords() catcode R and T): a name equal to
# one of them must be quoted even when it is lower case.
_RESERVED_WORDS = """
all analyse analyze and any array as asc asymmetric authorization binary both case cast
check collate collation column concurrently constraint create cross current_catalog
current_date current_role current_schema current_time current_timestamp current_user
default deferrable desc distinct do else end except false fetch for foreign freeze from
full grant group having ilike in initially inner intersect into is isnull join lateral
leading left like limit localtime localtimestamp natural not notnull null offset on only
or order outer overlaps placing primary references returning right select session_user
similar some symmetric table tablesample then to trailing true union unique user using
variadic verbose when where window with
"""
_RESERVED = frozenset(_RESERVED_WORDS.split())
_BARE_RE = re.compile(r"[a-z_][a-z0-9_$]*")


def quote_ident(name: str) -> str:
    """``name`` as an SQL identifier: bare when PostgreSQL would read it back unchanged
    (lower case, not reserved), double-quoted otherwise."""
    if _BARE_RE.fullmatch(name) and name not in _RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, table: str) -> str:
    return f"{quote_ident(schema)}.{quote_ident(table)}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# -- the facts ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableFacts:
    """One table as the catalog describes it, for the role setup connects as.

    ``replica_identity`` is ``pg_class.relreplident``: ``d`` default, ``n`` nothing,
    ``f`` full, ``i`` using ``identity_index``. ``kind`` is ``r`` (a table) or ``p`` (a
    partitioned table, whose rows live in ``partitions``, its leaves). ``toast_columns``
    are ``(name, type)`` of the columns with ``attstorage`` in ``TOAST_STORAGE``.
    """

    schema: str
    table: str
    kind: Literal["r", "p"] = "r"
    replica_identity: Literal["d", "n", "f", "i"] = "d"
    primary_key: tuple[str, ...] = ()
    identity_index: str | None = None
    identity_columns: tuple[str, ...] = ()
    toast_columns: tuple[tuple[str, str], ...] = ()
    is_partition: bool = False
    partitions: tuple[TableFacts, ...] = ()
    can_select: bool = True
    can_write: bool = True  # INSERT and UPDATE (the heartbeat table)
    owned: bool = True  # the role is a member of the owner: it may ALTER it, publish it

    @property
    def name(self) -> TableName:
        return TableName(self.schema, self.table)

    @property
    def sql(self) -> str:
        return qualified(self.schema, self.table)


@dataclass(frozen=True, slots=True)
class SlotFacts:
    """A row of ``pg_replication_slots`` (``plugin`` and ``database`` None: physical)."""

    name: str
    slot_type: str = "logical"
    plugin: str | None = PLUGIN
    database: str | None = None
    active_pid: int | None = None
    active_client: str | None = None  # "application_name from address"


@dataclass(frozen=True, slots=True)
class PublicationFacts:
    name: str
    all_tables: bool = False
    insert: bool = True
    update: bool = True
    delete: bool = True
    truncate: bool = False
    via_root: bool = False
    owned: bool = True
    tables: frozenset[TableName] = frozenset()


@dataclass(frozen=True, slots=True)
class CatalogFacts:
    """What ``read_catalog`` learns; every field has a harmless default so that a unit
    test writes only what it is about."""

    version_num: int = 150000
    version: str = "15"
    database: str = "test"
    user: str = "databus"
    superuser: bool = False
    replication: bool = True
    wal_level: str = "logical"
    max_replication_slots: int = 10
    max_wal_senders: int = 10
    slots: tuple[SlotFacts, ...] = ()  # every slot of the server
    can_create_in_database: bool = True  # CREATE PUBLICATION
    current_schema: str | None = "public"  # where the heartbeat table goes
    can_create_in_schema: bool = True
    schemas: frozenset[str] = frozenset({"public"})  # the configured schemas that exist
    # Every table (kind r or p) of the configured schemas, with the leaves of the
    # partitioned ones; the heartbeat table in current_schema and the dumps' watermark
    # table (public.databus_watermark) when they exist.
    tables: tuple[TableFacts, ...] = ()
    heartbeat: TableFacts | None = None
    watermark: TableFacts | None = None
    publication: PublicationFacts | None = None

    def slot(self, name: str) -> SlotFacts | None:
        return next((s for s in self.slots if s.name == name), None)


# -- the plan -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Check:
    """One verdict. ``subject`` is the table (or slot, publication) it is about."""

    name: str
    verdict: Verdict
    message: str
    fix: str | None = None
    subject: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Plan:
    action: Literal["setup", "teardown"]
    checks: tuple[Check, ...]
    statements: tuple[str, ...]
    tables: tuple[TableName, ...] = ()  # the configured tables, patterns resolved

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.verdict == "error")

    @property
    def warnings(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.verdict == "warning")


@dataclass
class _Builder:
    checks: list[Check] = field(default_factory=list)

    def ok(self, name: str, message: str, subject: str | None = None) -> None:
        self.checks.append(Check(name, "ok", message, None, subject))

    def warn(self, name: str, message: str, fix: str | None = None,
             subject: str | None = None) -> None:
        self.checks.append(Check(name, "warning", message, fix, subject))

    def error(self, name: str, message: str, fix: str | None = None,
              subject: str | None = None) -> None:
        self.checks.append(Check(name, "error", message, fix, subject))


def _restart_fix(setting: str, value: str) -> str:
    return (f"ALTER SYSTEM SET {setting} = {value}; then restart PostgreSQL (a managed "
            "service sets it in its parameter group, e.g. rds.logical_replication = 1)")


def _server_checks(b: _Builder, source: LogicalSource, facts: CatalogFacts) -> None:
    if facts.version_num < MIN_VERSION:
        b.error("server", f"PostgreSQL {facts.version} has no logical replication with "
                "pgoutput", "PostgreSQL 10 or later")
    else:
        b.ok("server", f"PostgreSQL {facts.version}, database {facts.database}, "
             f"user {facts.user}")
    if facts.wal_level == "logical":
        b.ok("wal_level", "wal_level = logical")
    else:
        b.error("wal_level", f"wal_level = {facts.wal_level}: logical decoding needs "
                "'logical'", _restart_fix("wal_level", "logical"))
    if facts.max_wal_senders > 0:
        b.ok("max_wal_senders", f"max_wal_senders = {facts.max_wal_senders}")
    else:
        b.error("max_wal_senders", "max_wal_senders = 0: no replication connection is "
                "allowed", _restart_fix("max_wal_senders", "10"))
    if facts.superuser:
        b.ok("replication_role", f"{facts.user} is a superuser")
    elif facts.replication:
        b.ok("replication_role", f"{facts.user} has the REPLICATION attribute")
    else:
        b.error("replication_role", f"{facts.user} may not replicate (neither REPLICATION "
                "nor superuser): it can neither create the slot nor stream it",
                f"as a superuser: ALTER ROLE {quote_ident(facts.user)} REPLICATION")


def _slot_check(b: _Builder, source: LogicalSource, facts: CatalogFacts) -> bool:
    """The slot's checks; True when it must be created."""
    slot = facts.slot(source.slot)
    used = len(facts.slots)
    if facts.max_replication_slots <= 0:
        b.error("max_replication_slots", "max_replication_slots = 0: no slot can be "
                "created", _restart_fix("max_replication_slots", "10"))
    else:
        b.ok("max_replication_slots", f"max_replication_slots = "
             f"{facts.max_replication_slots} ({used} in use)")
    if slot is not None:
        if slot.slot_type != "logical" or slot.plugin != PLUGIN \
                or slot.database != facts.database:
            what = ("a physical slot" if slot.slot_type != "logical" else
                    f"a {slot.plugin} slot of database {slot.database}")
            b.error("slot", f"slot {source.slot} exists and is {what}; the fetcher needs "
                    f"a {PLUGIN} slot of database {facts.database}",
                    f"give this source another slot= name, or drop that slot if nothing "
                    f"uses it: SELECT pg_drop_replication_slot({_literal(source.slot)})",
                    source.slot)
        elif slot.active_pid is not None:
            b.ok("slot", f"slot {source.slot} exists ({PLUGIN}), in use by process "
                 f"{slot.active_pid}" + (f" ({slot.active_client})" if slot.active_client
                                         else ""), source.slot)
        else:
            b.ok("slot", f"slot {source.slot} exists ({PLUGIN})", source.slot)
        return False
    if facts.max_replication_slots > 0 and used >= facts.max_replication_slots:
        idle = [s.name for s in facts.slots if s.active_pid is None]
        b.error("slot", f"slot {source.slot} is missing and all {used} replication slots "
                "are taken" + (f" (inactive: {', '.join(idle)})" if idle else ""),
                "drop a slot nothing uses (SELECT pg_drop_replication_slot('name')), or "
                "raise max_replication_slots: "
                + _restart_fix("max_replication_slots", str(used + 4)), source.slot)
        return False
    b.ok("slot", f"slot {source.slot} will be created ({PLUGIN})", source.slot)
    return True


def _resolve_tables(b: _Builder, source: LogicalSource, facts: CatalogFacts
                    ) -> list[TableFacts]:
    """The configured tables as catalog facts, patterns expanded, in configured order."""
    by_name = {t.name: t for t in facts.tables}
    special = {HEARTBEAT_TABLE, WATERMARK_TABLE}
    out: list[TableFacts] = []
    for wanted in source.tables:
        if wanted.is_pattern:
            if wanted.schema not in facts.schemas:
                b.error("table", f"{wanted}: schema {wanted.schema} does not exist",
                        "create the schema, or correct tables= in the source URI",
                        str(wanted))
                continue
            found = sorted((t for t in facts.tables
                            if t.schema == wanted.schema and not t.is_partition
                            and t.table not in special), key=lambda t: t.table)
            if found:
                b.ok("table", f"{wanted}: {len(found)} table(s): "
                     f"{', '.join(t.table for t in found)}", str(wanted))
            else:
                b.warn("table", f"{wanted}: schema {wanted.schema} has no table yet",
                       "a table created later is published when databus pg setup runs "
                       "again", str(wanted))
            out.extend(t for t in found if t not in out)
            continue
        table = by_name.get(wanted)
        if table is None:
            b.error("table", f"{wanted} does not exist (or is not a table)",
                    "create it, or correct tables= in the source URI", str(wanted))
        elif table not in out:
            b.ok("table", f"{wanted} exists" + (" (partitioned)" if table.kind == "p"
                                               else ""), str(wanted))
            out.append(table)
    servable = [t for t in out if servable_name(str(t.name))]
    for t in out:
        if t not in servable:
            # Refused before anything is published (issue 28): the relay could not serve
            # its changes, and at runtime it would be quarantined at its first change.
            b.error("name", f"{t.sql}: the relay cannot serve a source named "
                    f"{t.name!s}: {UNSERVABLE_NAME}",
                    f"rename it (ALTER TABLE {t.sql} RENAME TO <a name without "
                    "whitespace or commas>), or name the other tables in tables= one "
                    "by one instead of a pattern", str(t.name))
    return servable


def _leaves(table: TableFacts) -> tuple[TableFacts, ...]:
    """The tables whose rows (and replica identity) the changes come from."""
    return table.partitions if table.kind == "p" else (table,)


def _identity_checks(b: _Builder, tables: Sequence[TableFacts], full: bool
                     ) -> list[TableFacts]:
    """REPLICA IDENTITY and TOAST verdicts; the tables to ALTER ... REPLICA IDENTITY FULL
    (only when ``full``, the ``--replica-identity-full`` option)."""
    alter: list[TableFacts] = []
    for root in tables:
        leaves = _leaves(root)
        for t in leaves:
            # A partition reports as itself; its root's name is what is captured.
            label = str(t.name) if t is root else f"{t.name} (partition of {root.name})"
            subject = str(t.name)
            ri = t.replica_identity
            keyless: str | None = None
            if ri == "d" and t.primary_key:
                b.ok("replica_identity", f"{label}: REPLICA IDENTITY DEFAULT, primary key "
                     f"({', '.join(t.primary_key)})", subject)
            elif ri == "d":
                keyless = "REPLICA IDENTITY DEFAULT and no primary key"
            elif ri == "n":
                keyless = "REPLICA IDENTITY NOTHING"
            elif ri == "i" and t.identity_index is None:
                keyless = "REPLICA IDENTITY USING INDEX, but that index is gone"
            elif ri == "i":
                if t.primary_key and set(t.identity_columns) != set(t.primary_key):
                    b.warn("replica_identity", f"{label}: REPLICA IDENTITY USING INDEX "
                           f"{t.identity_index} ({', '.join(t.identity_columns)}): its "
                           "deletes carry those columns, not the primary key "
                           f"({', '.join(t.primary_key)}) the events are keyed by",
                           f"ALTER TABLE {t.sql} REPLICA IDENTITY DEFAULT", subject)
                else:
                    b.ok("replica_identity", f"{label}: REPLICA IDENTITY USING INDEX "
                         f"{t.identity_index}", subject)
            else:
                b.ok("replica_identity", f"{label}: REPLICA IDENTITY FULL" + (
                    "" if t.primary_key else " (no primary key: every column is the key "
                    "of its events)"), subject)
            if keyless is not None:
                if full:
                    b.warn("replica_identity", f"{label}: {keyless}; --replica-identity-"
                           "full sets REPLICA IDENTITY FULL: every column becomes the "
                           "key of its events",
                           f"a primary key is a better key: ALTER TABLE {t.sql} ADD "
                           "PRIMARY KEY (...)", subject)
                    alter.append(t)
                else:
                    b.error("replica_identity", f"{label}: {keyless}: its deletes and "
                            "updates cannot give their key (and once it is published, "
                            "PostgreSQL refuses its UPDATEs and DELETEs)",
                            f"add a primary key (ALTER TABLE {t.sql} ADD PRIMARY KEY "
                            f"(...)), or ALTER TABLE {t.sql} REPLICA IDENTITY FULL (databus "
                            "pg setup --replica-identity-full), or REPLICA IDENTITY USING "
                            "INDEX <a unique index on NOT NULL columns>", subject)
                continue
            if ri != "f" and t.toast_columns:
                columns = ", ".join(f"{n} ({ty})" for n, ty in t.toast_columns)
                if full:
                    b.ok("toast", f"{label}: REPLICA IDENTITY FULL will be set "
                         f"(TOASTable columns: {columns})", subject)
                    alter.append(t)
                else:
                    b.warn("toast", f"{label}: TOASTable columns {columns}: an UPDATE "
                           "that leaves such a column unchanged quarantines the table "
                           "(pgoutput sends no value for it)",
                           f"ALTER TABLE {t.sql} REPLICA IDENTITY FULL (databus pg setup "
                           "--replica-identity-full)", subject)
        if full and root.kind == "p" and root.replica_identity != "f" \
                and any(leaf in alter for leaf in leaves):
            alter.append(root)  # for consistency; only the leaves' setting counts
    return alter


def _privilege_checks(b: _Builder, tables: Sequence[TableFacts]) -> None:
    for t in tables:
        if not t.can_select:
            b.error("select", f"{t.name}: the role cannot SELECT it (the dumps and the "
                    "bootstrap seed read it)", f"GRANT SELECT ON {t.sql} TO <the source "
                    "URI's user>", str(t.name))


def _publication_plan(b: _Builder, source: LogicalSource, facts: CatalogFacts,
                      wanted: Sequence[TableFacts]) -> tuple[list[str], list[TableFacts]]:
    """Statements creating or extending the publication, and the tables they name."""
    pub = facts.publication
    name = quote_ident(source.publication)
    partitioned = any(t.kind == "p" for t in wanted)
    if pub is None:
        options = f"publish = {_literal(PUBLISH)}"
        if partitioned:
            options += ", publish_via_partition_root = true"
        tables = ", ".join(t.sql for t in wanted)
        for_tables = f" FOR TABLE {tables}" if tables else ""
        b.ok("publication", f"publication {source.publication} will be created for "
             f"{len(wanted)} table(s)", source.publication)
        return [f"CREATE PUBLICATION {name}{for_tables} WITH ({options})"], list(wanted)
    published = [t for t in wanted if pub.all_tables or t.name in pub.tables]
    missing = [t for t in wanted if t not in published]
    if pub.all_tables:
        b.ok("publication", f"publication {source.publication} exists (FOR ALL TABLES)",
             source.publication)
    elif missing:
        b.ok("publication", f"publication {source.publication} exists; will add "
             f"{', '.join(str(t.name) for t in missing)}", source.publication)
    else:
        b.ok("publication", f"publication {source.publication} exists and publishes every "
             "table", source.publication)
    fix = f"ALTER PUBLICATION {name} SET (publish = {_literal(PUBLISH)})"
    lacking = [op for op, on in (("insert", pub.insert), ("update", pub.update),
                                 ("delete", pub.delete)) if not on]
    if lacking:
        b.error("publication", f"publication {source.publication} does not publish "
                f"{', '.join(lacking)}: those changes would be missing from the stream",
                fix, source.publication)
    if pub.truncate:
        b.warn("publication", f"publication {source.publication} publishes TRUNCATE: a "
               "TRUNCATE of a captured table quarantines it (it is not captured)", fix,
               source.publication)
    if partitioned and not pub.via_root:
        b.error("publication", f"publication {source.publication} publishes partitioned "
                "tables' changes under their partitions' names, which are not captured",
                f"ALTER PUBLICATION {name} SET (publish_via_partition_root = true)",
                source.publication)
    if not missing:
        return [], []
    return [f"ALTER PUBLICATION {name} ADD TABLE {', '.join(t.sql for t in missing)}"], \
        missing


def _heartbeat_plan(b: _Builder, source: LogicalSource, facts: CatalogFacts
                    ) -> tuple[list[str], TableFacts | None]:
    """``heartbeat=table``: the statements creating the table, and the table to
    publish (None when the source does not use it or it cannot be made)."""
    if source.heartbeat != "table":
        return [], None
    if facts.heartbeat is not None:
        hb = facts.heartbeat
        if not hb.can_write:
            b.error("heartbeat", f"{hb.name} exists but {facts.user} cannot INSERT and "
                    "UPDATE it", f"GRANT INSERT, UPDATE ON {hb.sql} TO "
                    f"{quote_ident(facts.user)}", str(hb.name))
        else:
            b.ok("heartbeat", f"heartbeat table {hb.name} exists", str(hb.name))
        return [], hb
    if facts.current_schema is None:
        b.error("heartbeat", f"heartbeat=table: no schema of {facts.user}'s search_path "
                f"exists to create {HEARTBEAT_TABLE} in",
                f"ALTER ROLE {quote_ident(facts.user)} SET search_path = public (or "
                "create the schema), or heartbeat=message", HEARTBEAT_TABLE)
        return [], None
    hb = TableFacts(facts.current_schema, HEARTBEAT_TABLE, primary_key=("id",))
    b.ok("heartbeat", f"heartbeat table {hb.name} will be created", str(hb.name))
    if not facts.can_create_in_schema and not facts.superuser:
        b.error("privileges", f"{facts.user} cannot create tables in schema "
                f"{facts.current_schema} (for {hb.name})",
                f"GRANT CREATE ON SCHEMA {quote_ident(facts.current_schema)} TO "
                f"{quote_ident(facts.user)}, or create it as its owner: "
                f"{_heartbeat_ddl(hb)}", str(hb.name))
    return [_heartbeat_ddl(hb)], hb


def _heartbeat_ddl(hb: TableFacts) -> str:
    return (f"CREATE TABLE IF NOT EXISTS {hb.sql} (id int PRIMARY KEY, beat timestamptz "
            "NOT NULL)")


def _ownership_check(b: _Builder, facts: CatalogFacts, statements: Sequence[str],
                     publish: Sequence[TableFacts], alter: Sequence[TableFacts]) -> None:
    """Statements the role may not run: an error before anything runs."""
    if facts.superuser or not statements:
        return
    pub = facts.publication
    problems: list[str] = []
    if pub is None and not facts.can_create_in_database:
        problems.append(f"CREATE PUBLICATION needs the CREATE privilege on database "
                        f"{facts.database}")
    if pub is not None and publish and not pub.owned:
        problems.append(f"ALTER PUBLICATION needs the owner of publication {pub.name}")
    # A table setup creates (the heartbeat) is the role's own.
    not_owned = [str(t.name) for t in publish if not t.owned]
    if not_owned:
        problems.append(f"publishing a table needs its owner: {', '.join(not_owned)}")
    not_owned = [str(t.name) for t in alter if not t.owned]
    if not_owned:
        problems.append("ALTER TABLE ... REPLICA IDENTITY needs the table's owner: "
                        + ", ".join(not_owned))
    if problems:
        b.error("privileges", f"{facts.user} may not run these statements: "
                + "; ".join(problems),
                "run them as the owner or a superuser (databus pg setup --dry-run prints "
                "them), or run databus pg setup with such a user's URI (same slot, "
                "publication and tables)")


def plan_setup(source: LogicalSource, facts: CatalogFacts, *,
               replica_identity_full: bool = False) -> Plan:
    """The checks and the statements of ``databus pg setup`` (see the module docstring).

    Statement order: REPLICA IDENTITY first (the slot must never see a change logged
    without it), the heartbeat table, the publication, the slot last (a slot created
    before its publication cannot decode the changes made in between).
    """
    b = _Builder()
    _server_checks(b, source, facts)
    create_slot = _slot_check(b, source, facts)
    tables = _resolve_tables(b, source, facts)
    alter = _identity_checks(b, tables, replica_identity_full)
    _privilege_checks(b, tables)
    hb_statements, heartbeat = _heartbeat_plan(b, source, facts)
    publish = list(tables)
    if heartbeat is not None:
        publish.append(heartbeat)
    wm = facts.watermark
    if wm is not None:
        if wm.replica_identity == "f" or (wm.replica_identity == "d" and wm.primary_key) \
                or (wm.replica_identity == "i" and wm.identity_index is not None):
            b.ok("watermark", f"dump watermark table {wm.name} is published too",
                 str(wm.name))
            publish.append(wm)
        else:
            b.warn("watermark", f"dump watermark table {wm.name} has no replica identity "
                   "(no primary key): not published, since PostgreSQL would then refuse "
                   "the DELETEs of dumps", f"DROP TABLE {wm.sql}, then databus dump "
                   "setup, then databus pg setup again", str(wm.name))
    pub_statements, added = _publication_plan(b, source, facts, publish)
    statements = [f"ALTER TABLE {t.sql} REPLICA IDENTITY FULL" for t in alter]
    statements += hb_statements + pub_statements
    if create_slot:
        statements.append(f"SELECT pg_create_logical_replication_slot("
                          f"{_literal(source.slot)}, {_literal(PLUGIN)})")
    _ownership_check(b, facts, statements, added, alter)
    return Plan("setup", tuple(b.checks), tuple(statements), tuple(t.name for t in tables))


def plan_teardown(source: LogicalSource, facts: CatalogFacts) -> Plan:
    """Drop the slot (refused while a process streams it) and the publication."""
    b = _Builder()
    statements: list[str] = []
    slot = facts.slot(source.slot)
    if slot is None:
        b.ok("slot", f"slot {source.slot} does not exist", source.slot)
    elif slot.slot_type != "logical" or slot.plugin != PLUGIN \
            or slot.database != facts.database:
        b.error("slot", f"slot {source.slot} is not this source's: it is a "
                + ("physical slot" if slot.slot_type != "logical" else
                   f"{slot.plugin} slot of database {slot.database}"),
                "drop it by hand if it is really unused: SELECT pg_drop_replication_slot("
                f"{_literal(source.slot)})", source.slot)
    elif slot.active_pid is not None:
        who = f" ({slot.active_client})" if slot.active_client else ""
        b.error("slot", f"slot {source.slot} is in use by process {slot.active_pid}{who}",
                "stop the relay that reads it first (or, if it is stuck: SELECT "
                f"pg_terminate_backend({slot.active_pid}))", source.slot)
    elif not (facts.superuser or facts.replication):
        b.error("replication_role", f"{facts.user} may not drop replication slots",
                f"as a superuser: ALTER ROLE {quote_ident(facts.user)} REPLICATION, or "
                "run teardown as a superuser", source.slot)
    else:
        b.ok("slot", f"slot {source.slot} will be dropped (the WAL it holds is released)",
             source.slot)
        statements.append(f"SELECT pg_drop_replication_slot({_literal(source.slot)})")
    pub = facts.publication
    if pub is None:
        b.ok("publication", f"publication {source.publication} does not exist",
             source.publication)
    elif not pub.owned and not facts.superuser:
        b.error("publication", f"{facts.user} does not own publication {pub.name}",
                f"run as its owner: DROP PUBLICATION {quote_ident(pub.name)}", pub.name)
    else:
        others = sorted(str(t) for t in pub.tables
                        if not source.matches(t.schema, t.table)
                        and t.table not in (HEARTBEAT_TABLE, WATERMARK_TABLE))
        if others:
            b.warn("publication", f"publication {pub.name} also publishes tables this "
                   f"source does not capture ({', '.join(others)}); it is dropped all the "
                   "same", None, pub.name)
        else:
            b.ok("publication", f"publication {pub.name} will be dropped", pub.name)
        statements.append(f"DROP PUBLICATION IF EXISTS {quote_ident(pub.name)}")
    if facts.heartbeat is not None:
        b.ok("heartbeat", f"heartbeat table {facts.heartbeat.name} is kept (another source "
             "may use it): DROP TABLE it by hand when nothing does", str(facts.heartbeat.name))
    return Plan("teardown", tuple(b.checks), tuple(statements))
