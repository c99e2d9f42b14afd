"""The generated SQL of each dialect, as text (pure).

SQLite's and PostgreSQL's statements also run in the end-to-end tests; Oracle's are
only ever checked here: no Oracle server or driver exists in this environment, so these
tests pin the paper's scheme (section 4.1) to the text we generate.
"""

from __future__ import annotations

import re

import pytest

from databus.errors import ConfigError
from databus.fetchers.txlog._cli import format_script
from databus.fetchers.txlog._dialects import (
    ORACLE_INFINITY,
    OracleDialect,
    PostgresDialect,
    SqliteDialect,
    dialect_for,
)
from databus.fetchers.txlog._model import Column, TableRef, TableShape, object_name
from databus.fetchers.txlog._session import shapes_from_specs
from databus.fetchers.txlog._uri import TableSpec
from tests.unit.test_txlog_support import cli

ORDERS = TableShape(
    TableRef("public", "orders"),
    (Column("id", "integer", False), Column("note", "text"), Column("u", "uuid")),
    ("id",),
)
LINES = TableShape(
    TableRef("sales", "order lines"),
    (Column("order_id", "integer", False), Column("line", "integer", False),
     Column("sku", "text")),
    ("order_id", "line"),
    has_txn_column=True,
)


def squash(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip()


# -- names --------------------------------------------------------------------------------


def test_generated_names_are_plain_distinct_and_short_enough() -> None:
    assert object_name("deleted", "orders") == "databus_deleted_orders"
    odd = object_name("deleted", "order lines")
    assert re.fullmatch(r"databus_deleted_order_lines_[0-9a-f]{8}", odd)
    assert odd != object_name("deleted", "order_lines") != object_name("deleted", "order-lines")
    long = object_name("deleted", "x" * 80, max_len=63, suffix="_txn")
    assert len(long) == 63 and long.endswith("_txn")
    assert OracleDialect("SHOP").delete_log(TableRef("SHOP", "ORDERS")).name == \
        "DATABUS_DELETED_ORDERS"


def test_identifiers_are_quoted() -> None:
    d = PostgresDialect()
    assert d.table(TableRef('we"ird', "t t")) == '"we""ird"."t t"'
    assert SqliteDialect().table(TableRef("main", 'a"b')) == '"a""b"'


# -- SQLite -------------------------------------------------------------------------------


def test_sqlite_install_creates_the_txlog_column_delete_log_and_three_triggers() -> None:
    shape = TableShape(TableRef("main", "orders"), (Column("id", "INTEGER", False),), ("id",))
    sql = SqliteDialect().install_sql([shape])
    text = "\n".join(sql)
    assert sql[0].startswith('CREATE TABLE IF NOT EXISTS "databus_txlog" (txn INTEGER PRIMARY '
                             "KEY AUTOINCREMENT, scn INTEGER UNIQUE")
    assert 'ALTER TABLE "orders" ADD COLUMN "databus_txn" INTEGER' in sql
    assert 'CREATE TABLE IF NOT EXISTS "databus_deleted_orders" ("databus_txn" INTEGER NOT ' \
           'NULL, "id" INTEGER)' in sql
    for kind in ("INSERT", "UPDATE", "DELETE"):
        assert f'AFTER {kind} ON "orders" FOR EACH ROW' in text
    # The open TxLog row is found by scn IS NULL and created when missing.
    assert text.count("WHERE NOT EXISTS (SELECT 1 FROM \"databus_txlog\" WHERE scn IS NULL)") \
        == 3
    assert SqliteDialect.SEAL_SQL == "UPDATE databus_txlog SET scn = txn WHERE scn IS NULL"
    # An installed table keeps its column; re-running install only replaces triggers.
    again = SqliteDialect().install_sql([TableShape(shape.ref, shape.columns, shape.key, True)])
    assert not any(s.startswith("ALTER TABLE") for s in again)


def test_sqlite_pull_queries() -> None:
    d = SqliteDialect()
    shape = TableShape(TableRef("main", "t"), (Column("a", "TEXT"), Column("b", "INT")), ("a",))
    assert squash(d.rows_sql(shape)) == (
        'SELECT tl.scn, t."a", t."b" FROM "databus_txlog" tl JOIN "t" t ON t."databus_txn" = '
        "tl.txn WHERE tl.scn > :last AND tl.scn <= :upto ORDER BY 1, t.\"a\""
    )
    deletes = squash(d.deletes_sql(shape))
    assert 'JOIN "databus_deleted_t" d ON d."databus_txn" = tl.txn' in deletes
    # Suppressed when the key exists now with an SCN not after the delete (null-safe IS).
    assert 'WHERE t."a" IS d."a" AND tl2.scn <= tl.scn) ORDER BY 1, 2' in deletes
    assert d.batch_sql().endswith("WHERE tl.scn > :last ORDER BY tl.scn LIMIT :limit")


# -- PostgreSQL ---------------------------------------------------------------------------


def test_postgres_install_uses_txid_current_once_per_transaction() -> None:
    d = PostgresDialect("public")
    text = "\n".join(d.install_sql([ORDERS, LINES]))
    assert "current_txn bigint := txid_current();" in text
    assert "current_setting('databus.txlog_txn', true)" in text
    assert "set_config('databus.txlog_txn', current_txn::text, true)" in text  # txn-local
    assert 'CREATE INDEX IF NOT EXISTS "databus_txlog_unassigned" ON "public"."databus_txlog" ' \
           "(txn) WHERE scn IS NULL" in text
    assert 'ALTER TABLE "public"."orders" ADD COLUMN IF NOT EXISTS "databus_txn" bigint' in text
    assert 'CREATE TABLE IF NOT EXISTS "public"."databus_deleted_orders" ("databus_txn" bigint ' \
           'NOT NULL, "id" integer NOT NULL)' in text
    assert 'CREATE OR REPLACE TRIGGER "databus_stamp" BEFORE INSERT OR UPDATE ON ' \
           '"public"."orders"' in text
    assert 'CREATE OR REPLACE TRIGGER "databus_deleted" AFTER DELETE ON "public"."orders"' in text
    assert 'AFTER UPDATE ON "sales"."order lines" FOR EACH ROW WHEN ((OLD."order_id", ' \
           'OLD."line") IS DISTINCT FROM (NEW."order_id", NEW."line"))' in text
    assert d.triggers(ORDERS.ref) == ("databus_stamp", "databus_deleted", "databus_rekeyed")


def test_postgres_assignment_is_serialised_and_numbers_committed_rows_in_txid_order() -> None:
    plan = PostgresDialect("dbz").assign_plan()
    assert plan.lock == 'SELECT last_scn FROM "dbz"."databus_txlog_state" WHERE id = 1 FOR UPDATE'
    (statement,) = plan.statements
    assert "row_number() OVER (ORDER BY txn)" in statement
    assert "FROM \"dbz\".\"databus_txlog\" WHERE scn IS NULL" in statement
    assert "SET scn = %(last)s + todo.n" in statement
    assert "AND tl.scn IS NULL RETURNING tl.scn" in statement
    assert "GREATEST(last_scn, (SELECT max(scn) FROM assigned))" in statement


def test_postgres_pull_queries_cast_other_types_to_text() -> None:
    d = PostgresDialect()
    rows = squash(d.rows_sql(ORDERS))
    assert rows.startswith('SELECT tl.scn, t."id", t."note", t."u"::text FROM '
                           '"public"."databus_txlog" tl JOIN "public"."orders" t')
    assert "tl.scn > %(last)s AND tl.scn <= %(upto)s" in rows
    deletes = squash(d.deletes_sql(LINES))
    assert 'SELECT DISTINCT tl.scn, d."order_id", d."line" FROM' in deletes
    assert 't."order_id" = d."order_id" AND t."line" = d."line" AND tl2.scn <= tl.scn' in deletes
    assert d.position_sql() == ('SELECT last_scn, pruned_before FROM '
                                '"public"."databus_txlog_state" WHERE id = 1')
    assert "(extract(epoch FROM tl.ts) * 1000000000)::bigint" in d.batch_sql()


def test_prune_and_uninstall() -> None:
    d = PostgresDialect()
    prune = d.prune_sql([d.delete_log(ORDERS.ref)])
    assert prune == [
        'DELETE FROM "public"."databus_deleted_orders" AS d USING "public"."databus_txlog" AS tl '
        'WHERE d."databus_txn" = tl.txn AND tl.scn < %(before)s',
        'DELETE FROM "public"."databus_txlog" WHERE scn < %(before)s',
        'UPDATE "public"."databus_txlog_state" SET pruned_before = GREATEST(pruned_before, '
        "%(before)s) WHERE id = 1",
    ]
    assert SqliteDialect().prune_sql([])[-1] == (
        'UPDATE "databus_txlog_state" SET pruned_before = max(pruned_before, :before) '
        "WHERE id = 1"
    )
    down = d.uninstall_sql([LINES], drop_txlog=True)
    assert down[:3] == [f'DROP TRIGGER IF EXISTS "{t}" ON "sales"."order lines"'
                        for t in d.TRIGGERS]
    assert 'ALTER TABLE "sales"."order lines" DROP COLUMN IF EXISTS "databus_txn"' in down
    assert down[-1] == 'DROP TABLE IF EXISTS "public"."databus_txlog_state"'
    assert not any("databus_txlog" in s for s in d.uninstall_sql([LINES], drop_txlog=False)
                   if "DROP TABLE" in s and "deleted" not in s)


# -- Oracle: the paper's scheme, as text --------------------------------------------------

ORA = TableShape(
    TableRef("SHOP", "ORDERS"),
    (Column("ID", "NUMBER(10,0)", False), Column("NAME", "VARCHAR2")),
    ("ID",),
)


def test_oracle_txlog_has_scn_infinity_and_row_dependencies() -> None:
    sql = OracleDialect("SHOP").install_sql([ORA])
    txlog = next(s for s in sql if s.startswith('CREATE TABLE "SHOP"."DATABUS_TXLOG" '))
    assert f"SCN NUMBER(19) DEFAULT {ORACLE_INFINITY} NOT NULL" in txlog
    assert txlog.endswith("ROWDEPENDENCIES")  # ora_rowscn per row, not per block
    assert 'CREATE INDEX "SHOP"."DATABUS_TXLOG_SCN" ON "SHOP"."DATABUS_TXLOG" (SCN)' in sql
    assert 'CREATE SEQUENCE "SHOP"."DATABUS_TXN_SEQ" CACHE 1000' in sql


def test_oracle_trigger_allocates_txn_from_a_sequence_and_records_it() -> None:
    text = "\n".join(OracleDialect("SHOP").install_sql([ORA]))
    # "a trigger that allocates txn from a sequence and adds an entry to the TxLog table"
    assert "DBMS_TRANSACTION.LOCAL_TRANSACTION_ID(TRUE)" in text
    assert 'g_txn := "SHOP"."DATABUS_TXN_SEQ".NEXTVAL;' in text
    assert 'INSERT INTO "SHOP"."DATABUS_TXLOG" (TXN) VALUES (g_txn);' in text
    assert 'ALTER TABLE "SHOP"."ORDERS" ADD ("DATABUS_TXN" NUMBER(19))' in text
    assert ('CREATE OR REPLACE TRIGGER "SHOP"."DATABUS_CAPTURE_ORDERS"\n'
            '  BEFORE INSERT OR UPDATE OR DELETE ON "SHOP"."ORDERS" FOR EACH ROW') in text
    assert ':NEW."DATABUS_TXN" := "SHOP"."DATABUS_TXLOG_PKG".current_txn;' in text
    assert ('INSERT INTO "SHOP"."DATABUS_DELETED_ORDERS" ("DATABUS_TXN", "ID") VALUES '
            '("SHOP"."DATABUS_TXLOG_PKG".current_txn, :OLD."ID");') in text
    assert ('CREATE TABLE "SHOP"."DATABUS_DELETED_ORDERS" AS SELECT CAST(NULL AS NUMBER(19)) AS '
            '"DATABUS_TXN", "ID" FROM "SHOP"."ORDERS" WHERE 1 = 0') in text


def test_oracle_periodic_update_and_pull_query_are_the_papers() -> None:
    d = OracleDialect("SHOP")
    # update T set scn = ora_rowscn where scn = infinity;
    assert d.assign_plan().statements == (
        f'UPDATE "SHOP"."DATABUS_TXLOG" SET SCN = ORA_ROWSCN WHERE SCN = {ORACLE_INFINITY}',
    )
    assert d.assign_plan().lock is None
    # select src.* from T src, TxLog where scn > lastScn AND ora_rowscn > lastScn
    #   AND src.txn = TxLog.txn;
    rows = squash(d.rows_sql(ORA))
    assert rows == (
        'SELECT LEAST(tl.SCN, tl.ORA_ROWSCN) AS DATABUS_SCN, src."ID", src."NAME" '
        'FROM "SHOP"."ORDERS" src, "SHOP"."DATABUS_TXLOG" tl '
        "WHERE tl.SCN > :last AND tl.ORA_ROWSCN > :last "
        "AND LEAST(tl.SCN, tl.ORA_ROWSCN) <= :upto "
        'AND src."DATABUS_TXN" = tl.TXN ORDER BY 1, src."ID"'
    )
    batch = squash(d.batch_sql())
    assert "WHERE tl.SCN > :last AND tl.ORA_ROWSCN > :last ORDER BY 1) WHERE ROWNUM <= :limit" \
        in batch
    deletes = squash(d.deletes_sql(ORA))
    assert 'FROM "SHOP"."DATABUS_DELETED_ORDERS" d, "SHOP"."DATABUS_TXLOG" tl' in deletes
    assert "LEAST(tl2.SCN, tl2.ORA_ROWSCN) <= LEAST(tl.SCN, tl.ORA_ROWSCN)" in deletes
    assert d.pending_sql() == (f'SELECT 1 FROM "SHOP"."DATABUS_TXLOG" WHERE SCN = '
                               f"{ORACLE_INFINITY} AND ROWNUM = 1")


def test_oracle_uninstall_and_catalog_queries() -> None:
    d = OracleDialect("SHOP")
    down = d.uninstall_sql([ORA], drop_txlog=True)
    assert down == [
        'DROP TRIGGER "SHOP"."DATABUS_CAPTURE_ORDERS"',
        'DROP TABLE "SHOP"."DATABUS_DELETED_ORDERS" PURGE',
        'DROP INDEX "SHOP"."DATABUS_TXN_ORDERS"',
        'ALTER TABLE "SHOP"."ORDERS" DROP ("DATABUS_TXN")',
        'DROP PACKAGE "SHOP"."DATABUS_TXLOG_PKG"',
        'DROP TABLE "SHOP"."DATABUS_TXLOG" PURGE',
        'DROP TABLE "SHOP"."DATABUS_TXLOG_STATE" PURGE',
        'DROP SEQUENCE "SHOP"."DATABUS_TXN_SEQ"',
    ]
    assert "ALL_CONSTRAINTS" in d.columns_sql() and "CONSTRAINT_TYPE = 'P'" in d.columns_sql()
    assert "STATUS = 'ENABLED'" in d.triggers_sql()
    assert d.ddl_token_sql(2).endswith(
        "AND ((OWNER = :owner0 AND OBJECT_NAME = :table0) OR "
        "(OWNER = :owner1 AND OBJECT_NAME = :table1))")


def test_scripts_end_plsql_with_a_slash() -> None:
    d = OracleDialect("SHOP")
    script = format_script(d, d.install_sql(shapes_from_specs(
        [TableSpec(TableRef("SHOP", "ORDERS"), ("ID",))])))
    assert "END DATABUS_TXLOG_PKG;\n/" in script
    assert "END;\n/" in script
    assert "CACHE 1000;\n" in script
    assert format_script(SqliteDialect(), ["SELECT 1"]) == "SELECT 1;\n"
    with pytest.raises(ConfigError, match="key columns must be given"):
        shapes_from_specs([TableSpec(TableRef("SHOP", "ORDERS"))])


def test_oracle_dry_run_works_without_a_driver(capsys: pytest.CaptureFixture[str]) -> None:
    uri = "oracle+txlog://shop:pw@db.example/ORCL?tables=ORDERS(ID),LINES(ORDER_ID,LINE)"
    assert cli("install", "--source", uri, "--dry-run") == 0
    out = capsys.readouterr().out
    assert out.startswith("-- databus txlog install for oracle+txlog://shop:***@db.example")
    assert 'ON "SHOP"."LINES" FOR EACH ROW' in out
    assert cli("uninstall", "--source", uri, "--dry-run", "--drop-txlog") == 0
    assert 'DROP TRIGGER "SHOP"."DATABUS_CAPTURE_LINES";' in capsys.readouterr().out
    assert cli("prune", "--source", uri, "--dry-run", "--before-scn", "10") == 0
    out = capsys.readouterr().out
    assert "(before = 10)" in out and "WHERE scn < :before;" in out
    # Without --dry-run the driver is needed.
    assert cli("install", "--source", uri) == 1
    assert "pip install oracledb" in capsys.readouterr().err


def test_dialect_for() -> None:
    assert isinstance(dialect_for("sqlite"), SqliteDialect)
    assert dialect_for("postgresql").txlog == '"public"."databus_txlog"'
    assert dialect_for("oracle", "SHOP").txlog == '"SHOP"."DATABUS_TXLOG"'
