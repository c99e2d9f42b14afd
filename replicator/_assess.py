"""``databus replicate assess``: what would block a replication, found before anything
is written (paper 002's assessment): per table, the key, every column's target type,
the target table if it exists (and whether its shape fits; "will be created" when not),
the privileges to create and write tables, and the rows the bootstrap service holds for
it. It writes nothing to the target: not a table, not the replication's state table
(the privileges are probed in a transaction rolled back, replicator/targets/_probe.py).

``assess_table`` is pure (a table map against the target's columns); ``assess`` asks
the relays and the target. A finding is ``blocking`` when replication cannot start with
it (exit status 1), else a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from databus.config import ReplicateConfig
from databus.errors import DatabusError
from databus.replicator._model import Dialect, TableMap
from databus.schemas import Schema

__all__ = ["Finding", "TableReport", "assess", "assess_table"]


@dataclass(frozen=True)
class Finding:
    what: str
    blocking: bool


@dataclass
class TableReport:
    source: str
    target: str = ""
    key: tuple[str, ...] = ()
    columns: int = 0
    target_exists: bool | None = None
    estimated_rows: int | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def blocking(self) -> bool:
        return any(f.blocking for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "key": list(self.key),
                "columns": self.columns, "target_exists": self.target_exists,
                "estimated_rows": self.estimated_rows, "blocking": self.blocking,
                "findings": [{"what": f.what, "blocking": f.blocking}
                             for f in self.findings]}


def _norm_type(text: str) -> str:
    return " ".join(text.lower().replace(" ,", ",").split())


def assess_table(table: TableMap, dialect: Dialect,
                 existing: Mapping[str, str] | None,
                 nullable: Mapping[str, bool] | None = None) -> list[Finding]:
    """Findings for one table map: unmappable types, and, when the target table exists
    (``existing``: column -> type from its catalog; ``nullable``: column -> allows
    NULL), columns missing, of another type, or NOT NULL where the source sends NULLs."""
    from databus.replicator._types import unmappable

    findings: list[Finding] = []
    for column in table.columns:
        reason = unmappable(column.avro_type, dialect, key=column.target in table.key)
        if reason is not None:
            findings.append(Finding(f"column {column.target}: {reason}", True))
    if existing is not None:
        have = {k.lower(): v for k, v in existing.items()}
        for column in table.columns:
            found = have.get(column.target.lower())
            if found is None:
                findings.append(Finding(f"target table has no column {column.target} "
                                        f"({column.target_type})", True))
            elif _norm_type(found) != _norm_type(column.target_type):
                findings.append(Finding(
                    f"column {column.target} is {found} in the target, the mapping gives "
                    f"{column.target_type}", False))
        allows = {k.lower(): v for k, v in (nullable or {}).items()}
        for column in table.columns:
            if column.nullable and allows.get(column.target.lower()) is False:
                findings.append(Finding(
                    f"column {column.target} is NOT NULL in the target, but the source "
                    "sends NULLs for it", True))
        extra = sorted(set(have) - {c.target.lower() for c in table.columns})
        if extra:
            findings.append(Finding(f"target columns not replicated (left as they are, "
                                    f"must allow NULL or have a default): "
                                    f"{', '.join(extra)}", False))
    return findings


async def assess(config: ReplicateConfig, target: Any,
                 bootstrap_rows: Mapping[str, int] | None = None) -> list[TableReport]:
    """Every table of ``config`` against the relays' schemas and the target;
    ``bootstrap_rows``: rows per source the bootstrap snapshot holds, for the reports'
    ``estimated_rows`` (``databus replicate assess`` reads them with
    ``_status.bootstrap_rows``, the count the initial copy's progress measures against)."""
    import asyncio

    from databus.replicator._mapping import MappingError, table_map
    from databus.replicator._replicator import fetch_schemas, relay_urls

    reports: list[TableReport] = []
    try:
        schemas: dict[str, Schema] = await fetch_schemas(
            await relay_urls(config), [t.source for t in config.tables],
            credentials=config.credentials)
    except DatabusError as exc:
        return [TableReport(t.source, findings=[Finding(f"no schema from the relays: {exc}",
                                                        True)]) for t in config.tables]
    await asyncio.to_thread(target.open)
    try:
        privileges = await asyncio.to_thread(_check_privileges, target)
        for cfg in config.tables:
            report = TableReport(cfg.source)
            reports.append(report)
            if bootstrap_rows is not None:
                report.estimated_rows = bootstrap_rows.get(cfg.source)
            try:
                table = table_map(cfg, schemas[cfg.source], target.dialect,
                                  target_schema=config.target_schema or None)
            except (MappingError, KeyError) as exc:
                report.findings.append(Finding(str(exc), True))
                continue
            report.target = f"{table.schema}.{table.table}" if table.schema else table.table
            report.key = table.key
            report.columns = len(table.columns)
            exists = await asyncio.to_thread(target.table_exists, table)
            report.target_exists = exists
            existing = await asyncio.to_thread(target.table_columns, table) if exists else None
            nullable = (await asyncio.to_thread(target.table_nullable, table) if exists
                        else None)
            report.findings += assess_table(table, target.dialect, existing, nullable)
            if privileges is not None:
                report.findings.append(privileges)
    finally:
        await asyncio.to_thread(target.close)
    return reports


def _check_privileges(target: Any) -> Finding | None:
    """None when the target will let the replication keep its state table (create
    it, write it); else a finding (creating tables is checked the same way). Writes
    nothing: replicator/targets/_probe.py."""
    from databus.replicator.targets._probe import probe_state

    probe = probe_state(target)
    if probe.refused is not None:
        return Finding(probe.refused, True)
    if probe.unsure is not None:
        return Finding(probe.unsure, False)
    return None


def render(reports: Sequence[TableReport]) -> str:
    lines = []
    for r in reports:
        state = "BLOCKED" if r.blocking else "ok"
        head = f"{r.source} -> {r.target or '?'}: {state}"
        if r.key:
            head += f" (key {', '.join(r.key)}; {r.columns} columns"
            head += ("; target table exists)" if r.target_exists
                     else "; target table will be created)")
        if r.estimated_rows is not None:
            head += f"; about {r.estimated_rows:,} rows"
        lines.append(head)
        lines += [f"  {'BLOCKING' if f.blocking else 'warning'}: {f.what}" for f in r.findings]
    return "\n".join(lines)
