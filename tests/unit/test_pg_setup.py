"""``databus pg setup|teardown``'s pure planner on hand-built catalog facts: every check's
verdicts, the statements, idempotence, patterns; and the command line's output, exit
status and errors that need no server.
"""

from __future__ import annotations

import io
import json
import socket
from typing import Any

import pytest

from databus.cli import main
from databus.fetchers.postgres._cli import format_outcome, outcome_json
from databus.fetchers.postgres._setup import (
    CatalogFacts,
    Check,
    Plan,
    PublicationFacts,
    SlotFacts,
    TableFacts,
    plan_setup,
    plan_teardown,
    quote_ident,
)
from databus.fetchers.postgres._setup_run import Outcome
from databus.fetchers.postgres._uri import LogicalSource, TableName, parse_logical_source

CREATE_SLOT = "SELECT pg_create_logical_replication_slot('databus', 'pgoutput')"
ORDERS = TableFacts("public", "orders", primary_key=("id",))
ITEMS = TableFacts("public", "items", primary_key=("order_id", "line"))


def source(tables: str = "public.orders,public.items", **params: str) -> LogicalSource:
    query = "&".join(f"{k}={v}" for k, v in {"tables": tables, **params}.items())
    return parse_logical_source(f"postgresql://repl@db.example:5432/shop?{query}")


def facts(*tables: TableFacts, **kwargs: Any) -> CatalogFacts:
    kwargs.setdefault("database", "shop")
    kwargs.setdefault("user", "repl")
    kwargs.setdefault("tables", tables or (ORDERS, ITEMS))
    kwargs.setdefault("schemas", frozenset(t.schema for t in kwargs["tables"]) | {"public"})
    return CatalogFacts(**kwargs)


def only(plan: Plan, name: str, subject: str | None = None) -> Check:
    found = [c for c in plan.checks if c.name == name
             and (subject is None or c.subject == subject)]
    assert len(found) == 1, (name, subject, plan.checks)
    return found[0]


def verdicts(plan: Plan) -> dict[str, str]:
    """name (and subject) -> verdict, for the checks that are not ok."""
    return {f"{c.name}:{c.subject}" if c.subject else c.name: c.verdict
            for c in plan.checks if c.verdict != "ok"}


def published(src: LogicalSource, *tables: TableFacts, **kwargs: Any) -> PublicationFacts:
    return PublicationFacts(src.publication, tables=frozenset(t.name for t in tables),
                            **kwargs)


def set_up(src: LogicalSource, *tables: TableFacts, **kwargs: Any) -> CatalogFacts:
    """The catalog once setup has run: the publication publishes the tables and the slot
    exists."""
    tables = tables or (ORDERS, ITEMS)
    pub = kwargs.pop("publication", None) or published(src, *tables)
    return facts(*tables, publication=pub,
                 slots=(SlotFacts(src.slot, database="shop"),), **kwargs)


# -- a fresh database and idempotence ------------------------------------------------


def test_fresh_database_gets_a_publication_then_the_slot() -> None:
    plan = plan_setup(source(), facts())
    assert plan.ok and not plan.warnings
    assert plan.statements == (
        "CREATE PUBLICATION databus FOR TABLE public.orders, public.items "
        "WITH (publish = 'insert, update, delete')",
        CREATE_SLOT,
    )
    assert plan.tables == (TableName("public", "orders"), TableName("public", "items"))
    assert only(plan, "wal_level").verdict == "ok"
    assert only(plan, "slot").message == "slot databus will be created (pgoutput)"


def test_a_second_run_plans_nothing() -> None:
    src = source()
    plan = plan_setup(src, set_up(src))
    assert plan.ok and plan.statements == ()
    assert only(plan, "publication").message == \
        "publication databus exists and publishes every table"
    assert only(plan, "slot").message == "slot databus exists (pgoutput)"


def test_names_come_from_the_uri_and_are_quoted_when_needed() -> None:
    src = source("Sales.Order,public.user", slot="s1", publication="Pub")
    tables = (TableFacts("Sales", "Order", primary_key=("id",)),
              TableFacts("public", "user", primary_key=("id",)))
    plan = plan_setup(src, facts(*tables))
    assert plan.statements == (
        'CREATE PUBLICATION "Pub" FOR TABLE "Sales"."Order", public."user" '
        "WITH (publish = 'insert, update, delete')",
        "SELECT pg_create_logical_replication_slot('s1', 'pgoutput')",
    )


def test_quote_ident() -> None:
    assert quote_ident("orders") == "orders"
    assert quote_ident("order") == '"order"'
    assert quote_ident("Orders") == '"Orders"'
    assert quote_ident('a"b') == '"a""b"'
    assert quote_ident("a$1_") == "a$1_"
    assert quote_ident("1a") == '"1a"'


# -- server settings and the role --------------------------------------------------


def test_wal_level_replica_is_an_error_with_the_fix() -> None:
    plan = plan_setup(source(), facts(wal_level="replica"))
    check = only(plan, "wal_level")
    assert check.verdict == "error"
    assert "wal_level = replica" in check.message
    assert check.fix is not None and "ALTER SYSTEM SET wal_level = logical" in check.fix
    assert "restart" in check.fix
    assert not plan.ok and plan.errors == (check,)
    # The statements stay in the plan (printed, commented out), never run.
    assert plan.statements[-1] == CREATE_SLOT


def test_old_server_is_an_error() -> None:
    plan = plan_setup(source(), facts(version_num=90600, version="9.6.24"))
    assert only(plan, "server").verdict == "error"


@pytest.mark.parametrize("setting", ["max_replication_slots", "max_wal_senders"])
def test_zero_slots_or_senders_is_an_error(setting: str) -> None:
    plan = plan_setup(source(), facts(**{setting: 0}))
    check = only(plan, setting)
    assert check.verdict == "error"
    assert check.fix is not None and f"ALTER SYSTEM SET {setting}" in check.fix


def test_no_free_slot_names_the_inactive_ones() -> None:
    taken = (SlotFacts("old", database="shop"), SlotFacts("busy", database="shop",
                                                          active_pid=42))
    plan = plan_setup(source(), facts(slots=taken, max_replication_slots=2))
    check = only(plan, "slot")
    assert check.verdict == "error"
    assert "all 2 replication slots are taken (inactive: old)" in check.message
    assert CREATE_SLOT not in plan.statements


def test_a_full_server_is_fine_when_our_slot_exists() -> None:
    src = source()
    catalog = set_up(src, max_replication_slots=1)
    assert plan_setup(src, catalog).ok


@pytest.mark.parametrize(("slot", "what"), [
    (SlotFacts("databus", plugin="wal2json", database="shop"), "a wal2json slot of database shop"),
    (SlotFacts("databus", database="other"), "a pgoutput slot of database other"),
    (SlotFacts("databus", slot_type="physical", plugin=None, database=None), "a physical slot"),
])
def test_someone_elses_slot_is_an_error(slot: SlotFacts, what: str) -> None:
    plan = plan_setup(source(), facts(slots=(slot,)))
    check = only(plan, "slot")
    assert check.verdict == "error" and what in check.message
    assert check.fix is not None and "another slot= name" in check.fix
    assert CREATE_SLOT not in plan.statements


def test_an_active_slot_is_fine_for_setup() -> None:
    src = source()
    catalog = set_up(src)
    catalog = CatalogFacts(**{**_fields(catalog), "slots": (
        SlotFacts("databus", database="shop", active_pid=77, active_client="databus-x from "
                  "10.0.0.1"),)})
    plan = plan_setup(src, catalog)
    assert plan.ok
    assert "in use by process 77 (databus-x from 10.0.0.1)" in only(plan, "slot").message


def test_a_role_without_replication_is_an_error() -> None:
    plan = plan_setup(source(), facts(replication=False))
    check = only(plan, "replication_role")
    assert check.verdict == "error"
    assert check.fix == "as a superuser: ALTER ROLE repl REPLICATION"
    assert plan_setup(source(), facts(replication=False, superuser=True)).ok


# -- tables and patterns --------------------------------------------------------------


def test_a_missing_table_is_an_error() -> None:
    plan = plan_setup(source("public.orders,public.nope"), facts())
    assert verdicts(plan) == {"table:public.nope": "error"}
    assert "public.nope does not exist" in only(plan, "table", "public.nope").message
    assert plan.tables == (TableName("public", "orders"),)


def test_patterns_resolve_to_the_tables_present() -> None:
    sales = (TableFacts("sales", "b", primary_key=("id",)),
             TableFacts("sales", "a", primary_key=("id",)),
             TableFacts("sales", "a_2024", primary_key=("id",), is_partition=True),
             TableFacts("other", "x", primary_key=("id",)))
    plan = plan_setup(source("sales.*,public.orders,sales.a"), facts(ORDERS, *sales))
    assert plan.ok
    assert plan.tables == (TableName("sales", "a"), TableName("sales", "b"),
                           TableName("public", "orders"))
    assert only(plan, "table", "sales.*").message == "sales.*: 2 table(s): a, b"
    assert plan.statements[0].startswith(
        "CREATE PUBLICATION databus FOR TABLE sales.a, sales.b, public.orders WITH")


def test_a_pattern_never_takes_databus_own_tables() -> None:
    own = (TableFacts("public", "databus_heartbeat", primary_key=("id",)),
           TableFacts("public", "databus_watermark", primary_key=("id",)))
    plan = plan_setup(source("public.*"), facts(ORDERS, *own))
    assert plan.tables == (TableName("public", "orders"),)


def test_a_pattern_of_a_missing_schema_is_an_error_an_empty_one_a_warning() -> None:
    plan = plan_setup(source("nope.*,public.orders"), facts())
    assert verdicts(plan) == {"table:nope.*": "error"}
    plan = plan_setup(source("empty.*,public.orders"),
                      facts(schemas=frozenset({"public", "empty"})))
    assert verdicts(plan) == {"table:empty.*": "warning"}
    assert "runs again" in (only(plan, "table", "empty.*").fix or "")


def test_a_table_the_role_cannot_select_is_an_error() -> None:
    plan = plan_setup(source(), facts(ORDERS, TableFacts("public", "items",
                                                         primary_key=("id",),
                                                         can_select=False)))
    check = only(plan, "select", "public.items")
    assert check.verdict == "error"
    assert check.fix == "GRANT SELECT ON public.items TO <the source URI's user>"


# -- REPLICA IDENTITY and TOAST ----------------------------------------------------------


def identity(table: TableFacts, **kwargs: Any) -> Plan:
    return plan_setup(source("public.t"), facts(table), **kwargs)


def test_default_with_a_primary_key_is_ok() -> None:
    plan = identity(TableFacts("public", "t", primary_key=("a", "b")))
    assert only(plan, "replica_identity").message == \
        "public.t: REPLICA IDENTITY DEFAULT, primary key (a, b)"
    assert plan.ok


@pytest.mark.parametrize(("table", "what"), [
    (TableFacts("public", "t"), "REPLICA IDENTITY DEFAULT and no primary key"),
    (TableFacts("public", "t", replica_identity="n", primary_key=("id",)),
     "REPLICA IDENTITY NOTHING"),
    (TableFacts("public", "t", replica_identity="i"),
     "REPLICA IDENTITY USING INDEX, but that index is gone"),
])
def test_a_table_whose_deletes_have_no_key_is_an_error(table: TableFacts, what: str) -> None:
    plan = identity(table)
    check = only(plan, "replica_identity")
    assert check.verdict == "error"
    assert check.message.startswith(f"public.t: {what}: its deletes and updates cannot "
                                    "give their key")
    assert check.fix is not None
    assert "ALTER TABLE public.t ADD PRIMARY KEY" in check.fix
    assert "ALTER TABLE public.t REPLICA IDENTITY FULL" in check.fix
    assert "USING INDEX" in check.fix
    assert not plan.ok


def test_using_index_and_full_are_ok() -> None:
    plan = identity(TableFacts("public", "t", replica_identity="i", identity_index="t_uq",
                               identity_columns=("code",)))
    assert only(plan, "replica_identity").verdict == "ok"
    plan = identity(TableFacts("public", "t", replica_identity="i", identity_index="t_pkey",
                               identity_columns=("id",), primary_key=("id",)))
    assert only(plan, "replica_identity").verdict == "ok"
    plan = identity(TableFacts("public", "t", replica_identity="f", primary_key=("id",),
                               toast_columns=(("body", "text"),)))
    assert only(plan, "replica_identity").message == "public.t: REPLICA IDENTITY FULL"
    assert plan.ok and not plan.warnings
    plan = identity(TableFacts("public", "t", replica_identity="f"))
    assert "every column is the key" in only(plan, "replica_identity").message


def test_using_an_index_other_than_the_primary_key_is_a_warning() -> None:
    plan = identity(TableFacts("public", "t", replica_identity="i", identity_index="t_code",
                               identity_columns=("code",), primary_key=("id",)))
    check = only(plan, "replica_identity")
    assert check.verdict == "warning" and plan.ok
    assert check.fix == "ALTER TABLE public.t REPLICA IDENTITY DEFAULT"


def test_toastable_columns_without_full_are_a_warning() -> None:
    table = TableFacts("public", "t", primary_key=("id",),
                       toast_columns=(("body", "text"), ("doc", "jsonb")))
    plan = identity(table)
    check = only(plan, "toast")
    assert check.verdict == "warning" and plan.ok  # exit status 0
    assert check.message == (
        "public.t: TOASTable columns body (text), doc (jsonb): an UPDATE that leaves such "
        "a column unchanged quarantines the table (pgoutput sends no value for it)")
    assert check.fix == ("ALTER TABLE public.t REPLICA IDENTITY FULL (databus pg setup "
                         "--replica-identity-full)")
    assert not any("REPLICA IDENTITY" in s for s in plan.statements)


def test_replica_identity_full_option_alters_the_tables_first() -> None:
    toast = TableFacts("public", "docs", primary_key=("id",), toast_columns=(("b", "bytea"),))
    keyless = TableFacts("public", "log")
    plan = plan_setup(source("public.orders,public.docs,public.log"),
                      facts(ORDERS, toast, keyless), replica_identity_full=True)
    assert plan.ok
    assert plan.statements == (
        "ALTER TABLE public.docs REPLICA IDENTITY FULL",
        "ALTER TABLE public.log REPLICA IDENTITY FULL",
        "CREATE PUBLICATION databus FOR TABLE public.orders, public.docs, public.log "
        "WITH (publish = 'insert, update, delete')",
        CREATE_SLOT,
    )
    assert only(plan, "toast").verdict == "ok"
    # Without a primary key FULL makes every column the key: allowed, but said.
    check = only(plan, "replica_identity", "public.log")
    assert check.verdict == "warning" and "every column becomes the key" in check.message


def test_replica_identity_full_is_idempotent() -> None:
    src = source("public.docs")
    docs = TableFacts("public", "docs", replica_identity="f", primary_key=("id",),
                      toast_columns=(("b", "text"),))
    plan = plan_setup(src, set_up(src, docs), replica_identity_full=True)
    assert plan.ok and plan.statements == ()


def test_partitioned_tables_are_checked_on_their_leaves_and_published_via_the_root() -> None:
    leaves = (TableFacts("public", "m_1", primary_key=("id",), is_partition=True),
              TableFacts("public", "m_2", is_partition=True))
    root = TableFacts("public", "m", kind="p", primary_key=("id",), partitions=leaves)
    plan = plan_setup(source("public.*"), facts(root, *leaves))
    assert plan.tables == (TableName("public", "m"),)
    assert verdicts(plan) == {"replica_identity:public.m_2": "error"}
    assert "(partition of public.m)" in only(plan, "replica_identity", "public.m_2").message
    assert plan.statements[0] == ("CREATE PUBLICATION databus FOR TABLE public.m WITH "
                                  "(publish = 'insert, update, delete', "
                                  "publish_via_partition_root = true)")
    plan = plan_setup(source("public.*"), facts(root, *leaves), replica_identity_full=True)
    assert plan.statements[:2] == ("ALTER TABLE public.m_2 REPLICA IDENTITY FULL",
                                   "ALTER TABLE public.m REPLICA IDENTITY FULL")


# -- an existing publication ------------------------------------------------------------


def test_an_existing_publication_is_extended_never_shrunk() -> None:
    src = source()
    mine = TableFacts("public", "mine", primary_key=("id",))
    pub = published(src, ORDERS, mine)  # someone added public.mine
    plan = plan_setup(src, facts(ORDERS, ITEMS, mine, publication=pub))
    assert plan.statements == ("ALTER PUBLICATION databus ADD TABLE public.items",
                               CREATE_SLOT)
    assert not any("DROP" in s for s in plan.statements)


def test_a_publication_for_all_tables_needs_no_table() -> None:
    src = source()
    pub = PublicationFacts("databus", all_tables=True)
    plan = plan_setup(src, facts(publication=pub))
    assert plan.statements == (CREATE_SLOT,)


def test_a_publication_missing_an_operation_is_an_error_truncate_a_warning() -> None:
    src = source()
    plan = plan_setup(src, set_up(src, publication=published(src, ORDERS, ITEMS,
                                                             delete=False)))
    (check,) = plan.errors
    assert check.name == "publication" and "does not publish delete" in check.message
    assert check.fix == "ALTER PUBLICATION databus SET (publish = 'insert, update, delete')"
    plan = plan_setup(src, set_up(src, publication=published(src, ORDERS, ITEMS,
                                                             truncate=True)))
    assert plan.ok
    warning = plan.warnings[0]
    assert "publishes TRUNCATE" in warning.message and "quarantines it" in warning.message


def test_partitioned_tables_need_publish_via_partition_root() -> None:
    src = source("public.m")
    leaf = TableFacts("public", "m_1", primary_key=("id",), is_partition=True)
    root = TableFacts("public", "m", kind="p", primary_key=("id",), partitions=(leaf,))
    plan = plan_setup(src, set_up(src, root, leaf, publication=published(src, root)))
    assert not plan.ok
    assert "publish_via_partition_root = true" in (plan.errors[0].fix or "")
    plan = plan_setup(src, set_up(src, root, leaf,
                                  publication=published(src, root, via_root=True)))
    assert plan.ok and plan.statements == ()


# -- heartbeat and watermark tables -------------------------------------------------------


def test_heartbeat_table_is_created_and_published() -> None:
    plan = plan_setup(source(heartbeat="table"), facts())
    assert plan.ok
    assert plan.statements == (
        "CREATE TABLE IF NOT EXISTS public.databus_heartbeat (id int PRIMARY KEY, beat "
        "timestamptz NOT NULL)",
        "CREATE PUBLICATION databus FOR TABLE public.orders, public.items, "
        "public.databus_heartbeat WITH (publish = 'insert, update, delete')",
        CREATE_SLOT,
    )


def test_heartbeat_table_is_left_alone_with_heartbeat_message() -> None:
    plan = plan_setup(source(), facts())
    assert not any("databus_heartbeat" in s for s in plan.statements)


def test_an_existing_heartbeat_table_is_added_to_the_publication() -> None:
    src = source(heartbeat="table")
    hb = TableFacts("app", "databus_heartbeat", primary_key=("id",))
    catalog = set_up(src, current_schema="app", heartbeat=hb)
    assert plan_setup(src, catalog).statements == (
        "ALTER PUBLICATION databus ADD TABLE app.databus_heartbeat",)
    catalog = set_up(src, current_schema="app", heartbeat=hb,
                     publication=published(src, ORDERS, ITEMS, hb))
    assert plan_setup(src, catalog).statements == ()


def test_heartbeat_table_problems() -> None:
    src = source(heartbeat="table")
    plan = plan_setup(src, facts(current_schema=None))
    assert only(plan, "heartbeat").verdict == "error"
    plan = plan_setup(src, facts(can_create_in_schema=False))
    assert only(plan, "privileges", "public.databus_heartbeat").verdict == "error"
    hb = TableFacts("public", "databus_heartbeat", primary_key=("id",), can_write=False)
    plan = plan_setup(src, facts(heartbeat=hb))
    check = only(plan, "heartbeat")
    assert check.verdict == "error"
    assert check.fix == "GRANT INSERT, UPDATE ON public.databus_heartbeat TO repl"


def test_the_dump_watermark_table_is_published_too() -> None:
    src = source()
    wm = TableFacts("public", "databus_watermark", primary_key=("id",))
    plan = plan_setup(src, facts(watermark=wm))
    assert "public.items, public.databus_watermark WITH" in plan.statements[0]
    plan = plan_setup(src, set_up(src, watermark=wm))
    assert plan.statements == ("ALTER PUBLICATION databus ADD TABLE public.databus_watermark",)
    keyless = TableFacts("public", "databus_watermark")
    plan = plan_setup(src, facts(watermark=keyless))
    assert only(plan, "watermark").verdict == "warning"
    assert "databus_watermark" not in plan.statements[0]


# -- privileges for the statements --------------------------------------------------------


def test_statements_the_role_may_not_run_are_an_error() -> None:
    src = source()
    theirs = TableFacts("public", "items", primary_key=("id",), owned=False)
    plan = plan_setup(src, facts(ORDERS, theirs))
    check = only(plan, "privileges")
    assert check.verdict == "error"
    assert "publishing a table needs its owner: public.items" in check.message
    assert plan_setup(src, facts(ORDERS, theirs, superuser=True)).ok
    # Nothing to run, nothing to own.
    assert plan_setup(src, set_up(src, ORDERS, theirs)).ok


def test_create_publication_needs_create_on_the_database() -> None:
    plan = plan_setup(source(), facts(can_create_in_database=False))
    assert "CREATE privilege on database shop" in only(plan, "privileges").message


def test_someone_elses_publication_cannot_be_extended() -> None:
    src = source()
    pub = published(src, ORDERS, owned=False)
    plan = plan_setup(src, facts(publication=pub))
    assert "ALTER PUBLICATION needs the owner" in only(plan, "privileges").message


def test_alter_replica_identity_needs_the_owner() -> None:
    src = source("public.docs")
    docs = TableFacts("public", "docs", primary_key=("id",), toast_columns=(("b", "text"),),
                      owned=False)
    plan = plan_setup(src, set_up(src, docs), replica_identity_full=True)
    assert "REPLICA IDENTITY needs the table's owner: public.docs" in \
        only(plan, "privileges").message


# -- teardown -------------------------------------------------------------------------


def test_teardown_drops_the_slot_then_the_publication() -> None:
    src = source()
    plan = plan_teardown(src, set_up(src))
    assert plan.ok
    assert plan.statements == ("SELECT pg_drop_replication_slot('databus')",
                               "DROP PUBLICATION IF EXISTS databus")
    assert plan_teardown(src, facts()).statements == ()


def test_teardown_refuses_an_active_slot_and_names_its_pid() -> None:
    src = source()
    catalog = CatalogFacts(**{**_fields(set_up(src)), "slots": (
        SlotFacts("databus", database="shop", active_pid=4242, active_client="databus-databus "
                  "from 10.1.2.3"),)})
    plan = plan_teardown(src, catalog)
    check = only(plan, "slot")
    assert check.verdict == "error"
    assert check.message == ("slot databus is in use by process 4242 (databus-databus from "
                             "10.1.2.3)")
    assert "pg_terminate_backend(4242)" in (check.fix or "")
    assert not plan.ok  # and so neither statement runs


def test_teardown_refuses_someone_elses_slot_and_publication() -> None:
    src = source()
    catalog = facts(slots=(SlotFacts("databus", plugin="test_decoding", database="shop"),),
                    publication=published(src, ORDERS, owned=False))
    plan = plan_teardown(src, catalog)
    assert verdicts(plan) == {"slot:databus": "error", "publication:databus": "error"}
    plan = plan_teardown(src, set_up(src, replication=False))
    assert only(plan, "replication_role").verdict == "error"


def test_teardown_warns_about_tables_it_did_not_publish() -> None:
    src = source()
    mine = TableFacts("public", "mine", primary_key=("id",))
    plan = plan_teardown(src, set_up(src, publication=published(src, ORDERS, ITEMS, mine)))
    assert plan.ok
    assert "(public.mine)" in plan.warnings[0].message


def _fields(catalog: CatalogFacts) -> dict[str, Any]:
    return {name: getattr(catalog, name) for name in CatalogFacts.__dataclass_fields__}


# -- the command line -------------------------------------------------------------------


def test_text_output_is_a_script_whose_blocked_statements_are_comments() -> None:
    src = source()
    plan = plan_setup(src, facts(wal_level="replica"))
    out = io.StringIO()
    format_outcome(Outcome(plan, (), False), src, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"-- databus pg setup {src.redacted}"
    assert all(line.startswith("-- ") for line in lines)
    assert "-- CREATE PUBLICATION databus FOR TABLE" in out.getvalue()
    assert lines[-1] == ("-- 1 check failed: nothing was changed (the statements above "
                         "were not run)")
    plan = plan_setup(src, facts())
    out = io.StringIO()
    format_outcome(Outcome(plan, (), True), src, out)
    assert f"{CREATE_SLOT};" in out.getvalue().splitlines()
    assert out.getvalue().splitlines()[-1] == "-- dry run: nothing was changed"


def test_json_output() -> None:
    src = source()
    plan = plan_setup(src, facts())
    body = json.loads(json.dumps(outcome_json(Outcome(plan, plan.statements, False), src)))
    assert body["ok"] is True and body["action"] == "setup"
    assert body["statements"] == body["executed"] == list(plan.statements)
    assert body["tables"] == ["public.orders", "public.items"]
    assert {"name", "verdict", "message", "fix", "subject"} <= set(body["checks"][0])


def test_argument_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["pg", "setup"])
    assert exc.value.code == 2
    code = main(["pg", "setup", "--source", "postgresql://u:Sup3r-Secret@h/db?tables=a&x=1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown parameter 'x'" in err and "Sup3r-Secret" not in err
    assert main(["pg", "teardown", "--source", "postgresql+txlog://u@h/db?tables=a"]) == 2


def test_an_unreachable_server_is_one_line_without_the_password(
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"postgresql://repl:Hush-7x%40y@127.0.0.1:{port}/shop?tables=a&connect_timeout_s=2"
    code = main(["pg", "setup", "--source", uri])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("databus pg setup: error: cannot connect")
    for form in ("Hush-7x", "Hush-7x@y", "Hush-7x%40y"):
        assert form not in captured.err
