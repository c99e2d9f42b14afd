"""Reconciliation of a target table with the schema version about to be applied
(replicator/_reconcile.py, pure): the catalog decides what is left to do."""

from __future__ import annotations

from databus.replicator._model import ColumnMap, TableMap
from databus.replicator._reconcile import applicable, reconcile, same_type


def table(columns: list[tuple[str, str, bool]], fp: int = 1) -> TableMap:
    return TableMap("shop.orders", None, "orders", ("id",),
                    tuple(ColumnMap(n, n, "long", t, nullable) for n, t, nullable in columns),
                    fp)


OLD = table([("id", "bigint", False), ("qty", "bigint", True), ("note", "text", True)])
CATALOG = [("id", "bigint", False), ("qty", "bigint", True), ("note", "text", True)]


def test_a_column_added_while_down_is_pending_until_the_catalog_has_it() -> None:
    new = table([*((c.target, c.target_type, c.nullable) for c in OLD.columns),
                 ("y", "text", True)], fp=2)
    for recorded in (OLD, None):  # with the record, and for a table made without one
        rec = reconcile(new, recorded, CATALOG, "postgresql", table="orders")
        assert [c.target for c in rec.pending.added] == ["y"] and not rec.problems
        # After a crash between the ALTER and the checkpoint: nothing left to do.
        done = reconcile(new, recorded, [*CATALOG, ("y", "text", True)], "postgresql",
                         table="orders")
        assert not done.pending.changes and not done.problems


def test_problems_name_the_column_and_the_fix_and_go_once_the_fix_is_applied() -> None:
    not_null = table([*((c.target, c.target_type, c.nullable) for c in OLD.columns),
                      ("x", "text", False)], fp=2)
    rec = reconcile(not_null, OLD, CATALOG, "postgresql", table="public.orders")
    assert [(p.column, str(p)) for p in rec.problems] == [("x", "new column x is NOT NULL")]
    assert "ALTER TABLE public.orders ADD COLUMN x text NOT NULL DEFAULT" in rec.problems[0].fix
    fixed = reconcile(not_null, OLD, [*CATALOG, ("x", "text", False)], "postgresql",
                      table="public.orders")
    assert not fixed.problems and not fixed.pending.changes

    renamed = table([("id", "bigint", False), ("qty", "bigint", True),
                     ("memo", "text", True)], fp=3)
    rec = reconcile(renamed, OLD, CATALOG, "postgresql", table="orders")
    assert [str(p) for p in rec.problems] == [
        "column note is gone and memo (text) is new in its place (renamed, or dropped and "
        "added)"]
    after = [("id", "bigint", False), ("qty", "bigint", True), ("memo", "text", True)]
    assert not reconcile(renamed, OLD, after, "postgresql", table="orders").problems

    retyped = table([("id", "bigint", False), ("qty", "text", True), ("note", "text", True)],
                    fp=4)
    rec = reconcile(retyped, OLD, CATALOG, "postgresql", table="orders")
    assert [str(p) for p in rec.problems] == ["column qty changed from bigint to text"]
    converted = [("id", "bigint", False), ("qty", "text", True), ("note", "text", True)]
    assert not reconcile(retyped, OLD, converted, "postgresql", table="orders").problems


def test_without_a_record_extra_columns_are_left_unless_not_null() -> None:
    new = table([("id", "bigint", False), ("qty", "bigint", True)], fp=2)
    rec = reconcile(new, None, CATALOG, "postgresql", table="orders")
    assert rec.left == ["note"] and not rec.problems and not rec.pending.changes
    strict = [("id", "bigint", False), ("qty", "bigint", True), ("note", "text", False)]
    rec = reconcile(new, None, strict, "postgresql", table="orders")
    assert [p.column for p in rec.problems] == ["note"]
    # With the record the same column is a drop.
    rec = reconcile(new, OLD, CATALOG, "postgresql", table="orders")
    assert rec.pending.dropped == ["note"] and not rec.problems
    assert [c.target for c in applicable(new, [("id", "bigint", False)]).columns] == ["id"]


def test_catalog_spellings_of_the_mapping_types() -> None:
    assert same_type("character varying(5)", "VARCHAR(5)", "postgresql")
    assert same_type("timestamp with time zone", "timestamptz", "postgresql")
    assert same_type("bigint(20)", "BIGINT", "mysql")
    assert same_type("longtext", "LONGTEXT CHARACTER SET utf8mb4", "mysql")
    assert same_type("tinyint(1)", "BOOLEAN", "mysql")
    assert same_type("decimal(10,2)", "DECIMAL(10, 2)", "mysql")
    assert not same_type("int(11)", "BIGINT", "mysql")
    assert not same_type("TEXT", "INTEGER", "sqlite")
