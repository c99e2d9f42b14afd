"""Table maps: which Avro field of a source schema goes to which target column, under
what type (``[[replicate.tables]]``: target name, key, include/exclude, rename).

Columns are named by their *source* SQL name in the config: a field whose name had to
be changed for Avro keeps its SQL name in a ``sql_name`` attribute (the binlog fetcher
does that), which is the name used here and, unless renamed, in the target.

The key (the target table's primary key), in order of precedence: the config's ``key``;
the target table's own primary key when it exists; the source schema's key hint (a
``key`` attribute on the record: a list of column names). A table with none of these
cannot be replicated (``assess`` says so): updates and deletes need the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from databus.config import ReplicatedTableConfig
from databus.errors import ConfigError
from databus.replicator._model import ColumnMap, Dialect, TableMap
from databus.schemas import Schema

__all__ = ["MappingError", "source_columns", "table_map"]


class MappingError(ConfigError):
    """A table map that cannot be made: a key column that does not exist, no key at all,
    a column named twice."""

    code = "mapping_error"


def source_columns(schema: Schema) -> list[tuple[str, dict[str, Any]]]:
    """(SQL name, Avro field) of every field of ``schema``, in order."""
    return [(str(f.get("sql_name", f["name"])), f) for f in schema.fields]


def _sql_type(field: dict[str, Any]) -> str | None:
    hint = field.get("sql_type")
    return hint if isinstance(hint, str) else None


def schema_key_hint(schema: Schema) -> tuple[str, ...]:
    """The key columns a source schema names (a ``key`` attribute), if any."""
    hint = schema.schema.get("key") if isinstance(schema.schema, dict) else None
    if isinstance(hint, list) and all(isinstance(k, str) for k in hint):
        return tuple(hint)
    return ()


def table_map(cfg: ReplicatedTableConfig, schema: Schema, dialect: Dialect, *,
              target_schema: str | None = None, target_key: Sequence[str] = ()) -> TableMap:
    """The map of ``cfg``'s table for source schema ``schema`` on a ``dialect`` target.

    ``target_key``: the existing target table's primary key columns (target names)."""
    from databus.replicator._types import column_type, nullable

    fields = source_columns(schema)
    known = {name for name, _ in fields}
    for name in (*cfg.include, *cfg.exclude, *cfg.key, *cfg.rename):
        if name not in known:
            raise MappingError(f"{cfg.source}: no column {name!r} in the source "
                               f"(columns: {', '.join(sorted(known))})")
    chosen = [(name, f) for name, f in fields
              if (not cfg.include or name in cfg.include) and name not in cfg.exclude]
    target_names = [cfg.rename.get(name, name) for name, _ in chosen]
    if len(set(n.lower() for n in target_names)) != len(target_names):
        raise MappingError(f"{cfg.source}: two columns map to one target column name")
    by_target = dict(zip(target_names, (name for name, _ in chosen), strict=True))
    if cfg.key:
        key = tuple(cfg.rename.get(k, k) for k in cfg.key)
    elif target_key:
        key = tuple(target_key)
    else:
        key = tuple(cfg.rename.get(k, k) for k in schema_key_hint(schema))
    if not key:
        raise MappingError(
            f"{cfg.source}: no key: give key = [...] in its [[replicate.tables]] (the "
            "source's primary key columns), or create the target table with a primary key")
    missing = [k for k in key if k not in by_target]
    if missing:
        raise MappingError(f"{cfg.source}: key column(s) {', '.join(missing)} not replicated")
    columns = tuple(
        ColumnMap(source=str(f["name"]), target=target, avro_type=f["type"],
                  target_type=column_type(f["type"], dialect, key=target in key,
                                          sql_type=_sql_type(f)),
                  nullable=target not in key and nullable(f["type"], dialect),
                  sql_type=_sql_type(f))
        for (name, f), target in zip(chosen, target_names, strict=True)
    )
    table = cfg.target or cfg.source_table
    schema_name: str | None = target_schema or None
    if "." in table:
        schema_name, table = table.split(".", 1)
    return TableMap(source=cfg.source, schema=schema_name, table=table, key=key,
                    columns=columns, fingerprint=schema.fingerprint)
