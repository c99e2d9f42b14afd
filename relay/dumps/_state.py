"""Dump records and their file: what survives a relay restart.

``dumps.json`` in the relay's data dir holds every dump that is queued, running, paused,
and the last finished ones, each with per-table progress: the primary key of the last
row of the last *completed* chunk (its rows are in the buffer), chunks and rows so far.
It is rewritten atomically (temporary file, fsync, rename) after every completed chunk
and every state change, so a relay killed at any point resumes each dump after its last
completed chunk: a chunk cut off mid-way is read again with new watermarks, and its
rows, if some had already landed, come again whole at a later SCN.

Pure data plus ``load``/``save``; the engine (``_engine``) owns the locking.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from databus.errors import ConfigError

__all__ = ["Dump", "DumpState", "KeyRange", "TableProgress", "TableState", "load_dumps",
           "save_dumps"]

DumpState = Literal["queued", "running", "paused", "cancelled", "done", "failed"]
TableState = Literal["pending", "running", "done", "failed", "cancelled"]
# How a table's dump ended, as its end marker tells consumers (docs/dumps.md).
Outcome = Literal["done", "failed", "cancelled"]
ACTIVE: tuple[DumpState, ...] = ("queued", "running", "paused")
_FORMAT = 1
_KEEP_FINISHED = 50


@dataclass
class KeyRange:
    """One key range of a table, read by one reader at a time: keys after ``lo`` up to
    ``hi`` (both primary keys as JSON-able values; None: the table's start or end)."""

    lo: list[Any] | None = None
    hi: list[Any] | None = None
    cursor: list[Any] | None = None  # key of the last row of its last completed chunk
    done: bool = False

    @property
    def after(self) -> list[Any] | None:
        """Where its next chunk starts (exclusive)."""
        return self.cursor if self.cursor is not None else self.lo


@dataclass
class TableProgress:
    """One table of a dump. ``ranges`` is fixed when the table starts: one range, or
    several read in parallel (``Dump.parallelism``); each resumes after its own last
    completed chunk."""

    source: str
    state: TableState = "pending"
    cursor: list[Any] | None = None  # one range: key of the last row of its last chunk
    ranges: list[KeyRange] | None = None
    key_index: int = 0  # with listed keys: how many of them are done
    chunks: int = 0
    rows: int = 0  # rows emitted (not counting rows the log overtook)
    overtaken: int = 0  # chunk rows dropped because the log changed their key meanwhile
    estimate: int = 0  # rows the source said it had when the dump started
    estimated: bool = False  # ``estimate`` was read (0 is an estimate too: an empty table)
    started: bool = False  # its start marker is in the buffer
    ended: bool = False  # its end marker (with the table's outcome) is in the buffer
    last_scn: int | None = None  # the SCN of its last chunk's window
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["percent"] = self.percent
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TableProgress:
        ranges = record.pop("ranges", None)
        table = cls(**record)
        if ranges is not None:
            table.ranges = [KeyRange(**r) for r in ranges]
        return table

    @property
    def percent(self) -> float | None:
        if self.state == "done":
            return 100.0
        if self.rows == 0:
            return 0.0
        if self.estimate <= 0:
            return None
        return round(min(99.9, 100.0 * self.rows / self.estimate), 1)

    @property
    def expected_rows(self) -> int:
        """Rows this table is expected to hold in all: its rows once it is done, else
        its estimate (at least the rows emitted so far)."""
        if self.state == "done":
            return self.rows
        return max(self.estimate, self.rows)

    @property
    def owes_end(self) -> bool:
        """Consumers saw its start marker but no end: it failed or was cancelled, and
        the end marker with that outcome is still to be written."""
        return self.started and not self.ended and self.state in ("failed", "cancelled")


@dataclass
class Dump:
    """One dump: which tables of which buffer, how, and how far it got."""

    id: str
    buffer: str
    tables: list[TableProgress]
    chunk_rows: int
    delay_ms: int
    keys: list[Any] | None = None  # listed keys (one table only)
    parallelism: int = 1  # chunk readers at once (tables and key ranges of a table)
    # The default: give way to the source's writers (one paced chunk at a time while the
    # log carries writes: _readers.Gate); off when the operator chose the parallelism.
    gives_way: bool = False
    reason: str = "request"  # request | initial_dump | source_gap | heal
    state: DumpState = "queued"
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    # Rate: rows emitted while running over seconds spent running (pauses and the time
    # the relay was down excluded). Saved with every completed chunk, so that the rate
    # after a restart is still rows over the whole running time.
    run_seconds: float = 0.0

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def sources(self) -> list[str]:
        return [t.source for t in self.tables]

    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    def estimate(self) -> int:
        return sum(t.expected_rows for t in self.tables)

    @property
    def owes_ends(self) -> bool:
        return any(t.owes_end for t in self.tables)

    def settle_tables(self, state: TableState, error: str | None = None) -> None:
        """The dump ended ``state`` (failed or cancelled): every table it had not
        finished ends so too (none stays ``pending`` or ``running``)."""
        for table in self.tables:
            if table.state in ("pending", "running"):
                table.state = state
                if error is not None and table.error is None:
                    table.error = error

    def progress(self, now_running: float = 0.0) -> dict[str, Any]:
        """Rows, percent, rate (rows/s while running) and ETA (seconds) of the whole
        dump; every table's estimate is read when the dump starts, so percent and ETA
        cover the whole dump (0 % before the first row)."""
        rows = self.rows()
        seconds = self.run_seconds + now_running
        rate = rows / seconds if seconds > 0 else 0.0
        done = self.state == "done"
        estimate = self.estimate()
        if done:
            percent: float | None = 100.0
        elif rows == 0:
            percent = 0.0
        elif estimate > 0 and all(t.estimated or t.state != "pending" for t in self.tables):
            percent = round(min(99.9, 100.0 * rows / estimate), 1)
        else:
            percent = None
        eta = None
        if self.active and rate > 0:
            # 0 once the rows reached the estimates (the last chunk still to come).
            eta = round(max(0, estimate - rows) / rate, 1)
        current = next((t.source for t in self.tables if t.state == "running"), None)
        return {"rows": rows, "estimate": estimate, "percent": percent,
                "rows_per_second": round(rate, 1), "eta_seconds": eta, "table": current,
                "chunks": sum(t.chunks for t in self.tables)}

    def to_json(self, now_running: float = 0.0) -> dict[str, Any]:
        return {
            "id": self.id,
            "buffer": self.buffer,
            "state": self.state,
            "reason": self.reason,
            "sources": self.sources,
            "keys": None if self.keys is None else len(self.keys),
            "chunk_rows": self.chunk_rows,
            "delay_ms": self.delay_ms,
            "parallelism": self.parallelism,
            "gives_way": self.gives_way,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "error": self.error,
            "progress": self.progress(now_running),
            "tables": [t.to_json() for t in self.tables],
        }

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Dump:
        tables = [TableProgress.from_record(dict(t)) for t in record.pop("tables")]
        return cls(tables=tables, **record)


def load_dumps(path: Path) -> list[Dump]:
    """The dumps recorded in ``path`` (none if it does not exist); a running dump comes
    back ``running`` and is resumed by the engine after its last completed chunk."""
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return []
    try:
        data = json.loads(text)
        if data.get("format") != _FORMAT:
            raise ValueError(f"unknown format {data.get('format')!r}")
        return [Dump.from_record(dict(r)) for r in data["dumps"]]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        # A damaged state file must not silently restart dumps from zero or drop them.
        raise ConfigError(f"dump state {path} is damaged ({exc}); move it away to start "
                          "without the dumps it recorded") from None


def save_dumps(path: Path, dumps: list[Dump]) -> None:
    """Write ``dumps`` atomically (the finished ones beyond the newest 50 are dropped)."""
    finished = [d for d in dumps if not d.active]
    drop = {id(d) for d in finished[:-_KEEP_FINISHED]} if len(finished) > _KEEP_FINISHED else set()
    records = [d.to_record() for d in dumps if id(d) not in drop]
    data = json.dumps({"format": _FORMAT, "dumps": records}, separators=(",", ":"))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
