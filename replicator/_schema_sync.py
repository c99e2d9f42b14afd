"""Bringing each target table to the source schema version about to be applied: at start
and at each schema change in the stream (the I/O around ``_reconcile``; docs/replicator.md,
"Reconciliation").

Order, for a crash at any point: the ALTERs (each idempotent: it reads the catalog
first), then the record of the schema the table now follows, then (later, with the
batch) the checkpoint. A crash after an ALTER leaves the column in the catalog: the
next start has nothing left to do for it. A crash after the record leaves windows of
the older version to replay: they are folded with the newer map (``is_older``), never
taken back to the older shape.
"""

from __future__ import annotations

import json
import logging

from databus.config import ReplicateConfig, ReplicatedTableConfig
from databus.errors import DatabusError
from databus.replicator._model import TableMap
from databus.replicator._reconcile import (
    Reconciliation,
    SchemaChangeStopped,
    applicable,
    reconcile,
)
from databus.replicator.targets import Target
from databus.schemas import Schema

__all__ = ["SchemaSync"]

log = logging.getLogger("databus.replicator")


class SchemaSync:
    """Reconciles the target tables of one replication with source schema versions."""

    def __init__(self, config: ReplicateConfig, target: Target) -> None:
        self.config = config
        self.target = target
        # Per source, its schema versions' fingerprints, oldest first, as the relay
        # listed them at start (a version not listed is newer than every listed one).
        self.versions: dict[str, list[int]] = {}

    def _table_config(self, source: str) -> ReplicatedTableConfig:
        return next(t for t in self.config.tables if t.source == source)

    def _map(self, source: str, schema: Schema, key: tuple[str, ...] = ()) -> TableMap:
        from databus.replicator._mapping import table_map

        return table_map(self._table_config(source), schema, self.target.dialect,
                         target_schema=self.config.target_schema or None, target_key=key)

    def is_older(self, source: str, fingerprint: int, than: int) -> bool:
        """Is version ``fingerprint`` of ``source`` older than version ``than``?"""
        order = self.versions.get(source, [])
        if fingerprint not in order or than not in order:
            return False
        return order.index(fingerprint) < order.index(than)

    def first_map(self, source: str, schema: Schema) -> TableMap:
        """At start: the table map for ``schema`` (the newest version), the target
        table created or reconciled with it."""
        cfg = self._table_config(source)
        probe = self._map(source, schema)
        if self.target.table_exists(probe):
            if not cfg.key:
                # An existing table's own primary key is the one to merge on.
                key = self.target.table_key(probe)
                if key:
                    probe = self._map(source, schema, key)
            return self.follow(source, schema, probe.key)
        self.target.create_table(probe)
        log.info("created target table %s for %s", self.target.shown(probe), source)
        self._record(source, schema)
        return probe

    def follow(self, source: str, schema: Schema, key: tuple[str, ...]) -> TableMap:
        """The map for ``schema`` after the target table was made to follow it (per
        ``on_ddl``); raises ``SchemaChangeStopped`` on a change it must not apply."""
        new = self._map(source, schema, key)
        table = self.target.shown(new)
        recorded = self._recorded(source, key)
        catalog = self.target.catalog(new)
        rec = reconcile(new, recorded, catalog, self.target.dialect, table=table)
        on_ddl = self.config.on_ddl
        if on_ddl == "ignore":
            if rec.problems or rec.pending.changes:
                log.warning("%s: the source schema changed (%s) and on_ddl = \"ignore\": "
                            "target table %s stays as it is", source,
                            "; ".join([*map(str, rec.problems), *rec.pending.describe()]),
                            table)
            return applicable(new, catalog)
        if rec.problems:
            raise SchemaChangeStopped(
                f"{source}: target table {table} cannot follow the source schema: "
                + "; ".join(str(p) for p in rec.problems)
                + " (fix: " + "; ".join(p.fix for p in rec.problems) + ")",
                "; ".join(p.fix for p in rec.problems))
        if on_ddl == "stop" and rec.pending.changes:
            changes = "; ".join(rec.pending.describe())
            raise SchemaChangeStopped(
                f"{source}: the source schema changed ({changes}) and on_ddl = \"stop\": "
                f"target table {table} is left as it is (fix: make the change in the "
                "target yourself, or set on_ddl = \"apply\", then restart)",
                f"make the change in {table} yourself ({changes}), or set on_ddl = "
                "\"apply\", then restart")
        self._apply(new, rec)
        if rec.left:
            log.info("%s: target columns %s of %s are not in the source schema; left as "
                     "they are (they allow NULL)", source, ", ".join(rec.left), table)
        if recorded is None or recorded.fingerprint != new.fingerprint:
            self._record(source, schema)
            if rec.changes or recorded is not None:
                added = [c.target for c in rec.plan.added]
                log.info("%s: schema version %016x applied to %s (%s)%s", source,
                         schema.fingerprint, table,
                         "; ".join(rec.changes) or "no column change",
                         f"; rows already there read NULL in {', '.join(added)} (a "
                         "source DEFAULT is not in its schema: to refill them, dump the "
                         f"table: databus dump start --relay URL --sources {source})"
                         if added else "")
        return new

    def _apply(self, new: TableMap, rec: Reconciliation) -> None:
        for column in rec.pending.added:
            self.target.add_column(new, column)
        for name in rec.pending.dropped:
            self.target.drop_column(new, name)
        for column in rec.pending.widened:
            self.target.widen_column(new, column)

    def _recorded(self, source: str, key: tuple[str, ...]) -> TableMap | None:
        text = self.target.load_schema(self.config.name, source)
        if text is None:
            return None
        try:
            return self._map(source, Schema(json.loads(text)), key)
        except (DatabusError, ValueError) as exc:
            log.warning("%s: the recorded source schema is not usable (%s); comparing "
                        "the target table by column name only", source, exc)
            return None

    def _record(self, source: str, schema: Schema) -> None:
        self.target.save_schema(self.config.name, source, schema.fingerprint,
                                json.dumps(schema.schema, sort_keys=True))
