"""The PostgreSQL target's binary COPY rows (``replicator/targets/_pgcopy.py``) against
its text COPY rows (``copy_text``, the format used before issue 30): for every column
type the type mapping produces, as a value column and as a key column, the converted
edge values of ``test_replicator_types.CASES`` are loaded both ways, in a session in
UTC as the target's; the two tables read back identical (the server's own text of each
value, and the value's bytes for ``bytea``). Both twins of ``copy_binary`` (the compiled
one when it is built) write the same bytes for every row."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from databus.replicator import column_type, converter
from databus.replicator.targets import _pgcopy
from databus.replicator.targets._pgcopy import Encoders, binary_encoders, twin
from databus.replicator.targets._postgres import copy_text
from tests.fixtures.servers import PostgresServer
from tests.integration.test_replicator_types import CASES, KEY_CASES, Case, _nullable_type

pytestmark = [pytest.mark.integration, pytest.mark.twin("databus.replicator.targets._pgcopy")]

TWINS = ["python"] + (["native"] if _pgcopy.IMPLEMENTATION == "native" else [])


def copy_binary(rows: list[tuple[Any, ...]], encoders: Encoders) -> bytes | None:
    """What every twin writes: the same bytes (or None) from each."""
    out = [twin(name).copy_binary(rows, encoders) for name in TWINS]
    assert all(o == out[0] for o in out), f"the twins differ on {rows!r}"
    result: bytes | None = out[0]
    return result

SCHEMA = "repl_pgcopy"
# Values the binary format leaves to the text format (copy_binary answers None): a str
# for a numeric column (numeric carried as text), and lists (the text format has none
# either: execute_values).
TEXT_ONLY = {"numeric_text", "set", "set_hint"}


@pytest.fixture(scope="module")
def conn(postgres_server: PostgresServer) -> Iterator[Any]:
    c = psycopg2.connect(**postgres_server.connect_kwargs(),
                         options="-c TimeZone=UTC -c client_encoding=UTF8")
    c.autocommit = True
    with c.cursor() as cur:
        cur.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        cur.execute(f"CREATE SCHEMA {SCHEMA}")
    try:
        yield c
    finally:
        with c.cursor() as cur:
            cur.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        c.close()


def typnames(cur: Any, table: str) -> list[str]:
    cur.execute("SELECT t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
                " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped"
                " ORDER BY a.attnum", (table,))
    return [r[0] for r in cur.fetchall()]


def load_both(conn: Any, name: str, ddl: str, rows: list[tuple[Any, ...]], *,
              key: bool) -> tuple[list[Any], list[Any]] | None:
    """Rows loaded through text and binary COPY, read back; None when the binary
    format leaves them to the text format."""
    out = []
    with conn.cursor() as cur:
        for fmt in ("text", "binary"):
            table = f"{SCHEMA}.{name}_{fmt}"
            cur.execute(f"DROP TABLE IF EXISTS {table}")
            constraint = "NOT NULL UNIQUE" if key else "NULL"
            cur.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, v {ddl} {constraint})")
            if fmt == "text":
                text = copy_text(rows)
                if text is None:
                    return None
                cur.copy_expert(f"COPY {table} (id, v) FROM STDIN",
                                io.BytesIO(text.encode("utf-8")))
            else:
                encoders = binary_encoders(typnames(cur, table))
                assert encoders is not None, f"{ddl}: no binary encoders"
                data = copy_binary(rows, encoders)
                if data is None:
                    return None
                cur.copy_expert(f"COPY {table} (id, v) FROM STDIN (FORMAT binary)",
                                io.BytesIO(data))
            cur.execute(f"SELECT id, v::text, pg_typeof(v)::text = 'bytea' AND v IS NOT NULL,"
                        f" v IS NULL FROM {table} ORDER BY id")
            out.append(cur.fetchall())
    return out[0], out[1]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_binary_copy_rows_equal_the_text_ones(conn: Any, case: Case) -> None:
    avro = _nullable_type(case.avro)
    ddl = column_type(avro, "postgresql", sql_type=case.sql_type)
    convert = converter(avro, "postgresql", sql_type=case.sql_type)
    values = [*case.values, *case.extra.get("postgresql", [])]
    rows = [(i, convert(v)) for i, v in enumerate(values)]
    got = load_both(conn, f"v_{case.name}", ddl, rows, key=False)
    if case.name in TEXT_ONLY:
        assert got is None
        return
    assert got is not None, f"{case.name}: the binary format refused {rows!r}"
    text, binary = got
    assert binary == text and len(text) == len(values)


@pytest.mark.parametrize("case", KEY_CASES, ids=[c.name for c in KEY_CASES])
def test_binary_copy_keys_equal_the_text_ones(conn: Any, case: Case) -> None:
    assert case.key_values is not None
    ddl = column_type(case.avro, "postgresql", key=True, sql_type=case.sql_type)
    convert = converter(case.avro, "postgresql", key=True, sql_type=case.sql_type)
    rows = [(i, convert(v)) for i, v in enumerate(case.key_values)]
    got = load_both(conn, f"k_{case.name}", ddl, rows, key=True)
    if case.name in TEXT_ONLY:
        assert got is None
        return
    assert got is not None, f"{case.name}: the binary format refused {rows!r}"
    assert got[1] == got[0]


def test_values_without_a_binary_encoder_go_the_text_way() -> None:
    import datetime as dt
    from decimal import Decimal

    ints = binary_encoders(["int8"])
    assert ints is not None
    assert copy_binary([(True,)], ints) is None  # a bool for a bigint
    assert copy_binary([(2**63,)], ints) is None  # beyond the column's range
    assert copy_binary([("1",)], binary_encoders(["numeric"]) or []) is None
    assert copy_binary([(Decimal("sNaN"),)], binary_encoders(["numeric"]) or []) is None
    assert copy_binary([("a\udc80",)], binary_encoders(["text"]) or []) is None
    assert binary_encoders(["int8", "_text"]) is None  # an array column: text format
    assert copy_binary([(dt.datetime(2020, 1, 1),)],
                       binary_encoders(["date"]) or []) is None


def test_numeric_edge_values_equal_the_text_ones(conn: Any) -> None:
    from decimal import Decimal

    values = ["0", "-0", "0.000", "-0.00", "1", "-1", "10000", "9999.9999", "0.0001",
              "0.00001", "123456789.123456789", "1E+5", "-1E-7", "1.10", "100000000",
              "0.1000", "NaN", "Infinity", "-Infinity", "12345678901234567890123456789"]
    rows = [(i, Decimal(v)) for i, v in enumerate(values)]
    for ddl in ("numeric", "numeric(40,10)"):
        some = rows if ddl == "numeric" else [r for r in rows if r[1].is_finite()]
        got = load_both(conn, "numeric_edges", ddl, some, key=False)
        assert got is not None
        assert got[1] == got[0], ddl
