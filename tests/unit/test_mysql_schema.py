"""Table layouts -> Avro schemas, information_schema mapping, and how binlog statements
are classified (transaction boundaries, DDL, statement-format changes)."""

from __future__ import annotations

import pytest
from pymysqlreplication.constants import FIELD_TYPE

from databus.fetchers.mysql._schema import (
    QueryKind,
    TableShape,
    avro_name,
    avro_names,
    classify_query,
    dml_target,
    shape_from_information_schema,
    truncate_target,
)
from databus.fetchers.mysql._types import ColumnSpec, Kind


@pytest.mark.parametrize(
    ("name", "expected"),
    [("id", "id"), ("weird name-ü", "weird_name__"), ("1st", "_1st"), ("", "_"),
     ("_ok", "_ok"), ("a.b", "a_b")],
)
def test_avro_name(name: str, expected: str) -> None:
    assert avro_name(name) == expected


def test_avro_names_stay_distinct() -> None:
    assert avro_names(["a b", "a_b", "a-b", "a_b_2"]) == ["a_b", "a_b_2", "a_b_3", "a_b_2_2"]


def test_schema_of_a_shape() -> None:
    shape = TableShape("shop-db", "order items", (
        ColumnSpec("id", Kind.LONG, False),
        ColumnSpec("unit price", Kind.DECIMAL, True, precision=10, scale=2),
    ), (0,))
    assert shape.source_name == "shop-db.order items"
    doc = shape.schema_json()
    assert (doc["name"], doc["namespace"]) == ("order_items", "shop_db")
    assert doc["fields"][0] == {"name": "id", "type": "long"}
    price = doc["fields"][1]
    assert price["name"] == "unit_price" and price["sql_name"] == "unit price"
    assert price["default"] is None and price["type"][0] == "null"
    assert shape.avro_schema().name == "shop_db.order_items"


# information_schema.COLUMNS rows: COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE,
# NUMERIC_PRECISION, NUMERIC_SCALE, CHARACTER_SET_NAME (as MariaDB 10.11 gives them).
IS_ROWS = [
    ("id", "bigint", "bigint(20) unsigned", "NO", 20, 0, None),
    ("k", "varchar", "varchar(20)", "NO", None, None, "utf8mb4"),
    ("ti", "tinyint", "tinyint(3) unsigned", "YES", 3, 0, None),
    ("i", "int", "int(11)", "YES", 10, 0, None),
    ("iu", "int", "int(10) unsigned", "YES", 10, 0, None),
    ("bi", "bigint", "bigint(20)", "YES", 19, 0, None),
    ("f", "float", "float", "YES", 12, None, None),
    ("d", "double", "double", "YES", 22, None, None),
    ("dec", "decimal", "decimal(65,30)", "YES", 65, 30, None),
    ("b1", "bit", "bit(1)", "YES", 1, None, None),
    ("b9", "bit", "bit(9)", "YES", 9, None, None),
    ("y", "year", "year(4)", "YES", None, None, None),
    ("dt", "date", "date", "YES", None, None, None),
    ("tm", "time", "time(3)", "YES", None, None, None),
    ("dtm", "datetime", "datetime(6)", "YES", None, None, None),
    ("ts", "timestamp", "timestamp(2)", "YES", None, None, None),
    ("lt", "longtext", "longtext", "YES", None, None, "latin1"),
    ("bn", "binary", "binary(3)", "YES", None, None, None),
    ("bl", "mediumblob", "mediumblob", "YES", None, None, None),
    ("e", "enum", "enum('a','b')", "YES", None, None, "utf8mb4"),
    ("s", "set", "set('x')", "YES", None, None, "utf8mb4"),
    ("g", "point", "point", "YES", None, None, None),
    ("ip", "inet6", "inet6", "YES", None, None, None),
]
KINDS = [Kind.UINT64, Kind.TEXT, Kind.INT, Kind.INT, Kind.LONG, Kind.LONG, Kind.FLOAT,
         Kind.DOUBLE, Kind.DECIMAL, Kind.BOOL, Kind.BITS, Kind.YEAR, Kind.DATE, Kind.TIME,
         Kind.DATETIME, Kind.TIMESTAMP, Kind.TEXT, Kind.BYTES, Kind.BYTES, Kind.ENUM, Kind.SET,
         Kind.GEOMETRY, Kind.BYTES]


def test_information_schema_kinds() -> None:
    shape = shape_from_information_schema("db", "t", IS_ROWS, ["k", "id"])
    assert shape is not None
    assert [c.kind for c in shape.columns] == KINDS
    assert shape.primary_key == (1, 0)
    assert [c.nullable for c in shape.columns[:3]] == [False, False, True]
    assert (shape.columns[8].precision, shape.columns[8].scale) == (65, 30)


def test_information_schema_and_binlog_give_one_fingerprint() -> None:
    """A binlog layout carries decoding details information_schema lacks; the schema
    (and fingerprint) must not depend on them."""
    from_is = shape_from_information_schema("db", "t", IS_ROWS, ["k", "id"])
    assert from_is is not None
    from_binlog = TableShape("db", "t", tuple(
        ColumnSpec(c.name, c.kind, c.nullable, unsigned=c.unsigned,
                   precision=c.precision if c.kind is Kind.DECIMAL else 3,
                   scale=c.scale, type_code=FIELD_TYPE.BLOB, length_size=4, codec="utf-8",
                   labels=("", "a"))
        for c in from_is.columns), (1, 0))
    assert from_binlog.schema_signature() == from_is.schema_signature()
    assert from_binlog.avro_schema().fingerprint == from_is.avro_schema().fingerprint


def test_unknown_information_schema_types_defer_to_the_binlog() -> None:
    rows = [("id", "int", "int(11)", "NO", 10, 0, None), ("v", "vector", "vector(3)", "YES",
                                                           None, None, None)]
    assert shape_from_information_schema("db", "t", rows, ["id"]) is None
    assert shape_from_information_schema("db", "t", [], []) is None


@pytest.mark.parametrize(
    ("query", "kind"),
    [("BEGIN", QueryKind.BEGIN), ("  start transaction", QueryKind.BEGIN),
     ("COMMIT", QueryKind.COMMIT), ("ROLLBACK", QueryKind.ROLLBACK),
     ("ROLLBACK TO SAVEPOINT a", QueryKind.SAVEPOINT), ("SAVEPOINT a", QueryKind.SAVEPOINT),
     ("XA START 'x'", QueryKind.XA), ("insert into t values (1)", QueryKind.DML),
     ("/* c */ UPDATE t SET a = 1", QueryKind.DML), ("-- x\nDELETE FROM t", QueryKind.DML),
     ("ALTER TABLE t ADD c INT", QueryKind.OTHER), ("TRUNCATE t", QueryKind.OTHER),
     ("RENAME TABLE a TO b", QueryKind.OTHER), ("", QueryKind.OTHER),
     ("# hash comment\nCOMMIT", QueryKind.COMMIT)],
)
def test_classify_query(query: str, kind: QueryKind) -> None:
    assert classify_query(query) is kind


@pytest.mark.parametrize(
    ("query", "target"),
    [("INSERT INTO t VALUES (1)", ("db", "t")),
     ("insert ignore into `s`.`my``t` values (1)", ("s", "my`t")),
     ("REPLACE s.t SET a = 1", ("s", "t")),
     ("UPDATE LOW_PRIORITY s . t SET a = 1", ("s", "t")),
     ("DELETE QUICK FROM t WHERE 1", ("db", "t")),
     ("LOAD DATA INFILE 'f' INTO TABLE x.y", ("x", "y")),
     ("UPDATE a, b SET a.x = b.x", ("db", "a")),
     ("DELETE a FROM a JOIN b", None)],
)
def test_dml_target(query: str, target: tuple[str, str] | None) -> None:
    assert dml_target(query, "db") == target


def test_dml_target_without_default_database() -> None:
    assert dml_target("INSERT INTO t VALUES (1)", "") is None


@pytest.mark.parametrize(("query", "target"), [
    ("TRUNCATE TABLE t", ("db", "t")),
    ("truncate `other`.`a b`", ("other", "a b")),
    ("/* c */ TRUNCATE TABLE x.y;", ("x", "y")),
    ("TRUNCATE TABLE t PARTITION (p0)", None),  # not every row: not this statement
    ("CREATE TABLE truncate_log (id INT)", None),
])
def test_truncate_target(query: str, target: tuple[str, str] | None) -> None:
    assert truncate_target(query, "db") == target
