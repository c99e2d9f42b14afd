"""What the catalog adds to a Relation message (the fetcher's stream and the dump read it
the same way, so their rows are encoded alike): the primary key, the NOT NULL columns and
each column's type mapping."""

from __future__ import annotations

from typing import Any

from databus.fetchers.postgres._changes import TableInfo
from databus.fetchers.postgres._pgoutput import Relation
from databus.fetchers.postgres._types import column_mapping, load_types

__all__ = ["read_table_info"]

_PRIMARY_KEY_SQL = (
    "SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY "
    "AS k(attnum, ord) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = "
    "k.attnum WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord")
_NOT_NULL_SQL = ("SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
                 "AND NOT attisdropped AND attnotnull")


def read_table_info(cur: Any, relation: Relation) -> TableInfo:
    """The table's catalog details as of now (``relation`` has the columns and types as
    of the change; a column dropped since is simply nullable)."""
    cur.execute(_PRIMARY_KEY_SQL, (relation.oid,))
    primary_key = tuple(r[0] for r in cur.fetchall())
    cur.execute(_NOT_NULL_SQL, (relation.oid,))
    not_null = frozenset(r[0] for r in cur.fetchall())
    types = load_types(cur, {c.type_oid for c in relation.columns})
    mappings = tuple(column_mapping(c.type_oid, c.type_modifier, types)
                     for c in relation.columns)
    return TableInfo(primary_key, not_null, mappings)
