"""The relay's catalog of logical sources: stable ids and every schema version, on disk.

Events in a buffer file carry a logical source id and a schema fingerprint, and both
must still mean the same thing after a restart: ids are therefore allocated once and
never reused, and every schema version ever registered stays servable
(``/v1/schemas/{fingerprint}`` answers for the oldest event still held). The catalog
lives in one JSON file in the relay's data dir (``catalog.json``)::

    {"format": "databus-relay-catalog", "version": 1,
     "sources": [{"name": "shop.orders", "id": 1, "buffer": "shop", "partition_id": 0,
                  "versions": ["<16 hex digits>", ...], "latest": "<16 hex digits>"}],
     "schemas": {"<16 hex digits>": {...the Avro schema JSON...}}}

Fingerprints are 16 lowercase hex digits, as ``/v1/sources`` prints them. Each change
(a new source, a new schema version, another version made current) rewrites the file
atomically: a temporary file, fsync, rename over the old one, fsync of the directory.
A change is applied in memory only after it is on disk, so an id is never handed to a
fetcher (and written into events) unless a restart will find it again.

A logical source belongs to one buffer: its id is in that buffer's events, so binding
it to a second buffer is a ``ConfigError``.

Thread-safe: fetcher threads allocate ids and register schemas, HTTP handlers read.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from databus._fileio import write_atomically
from databus._limited_log import limited
from databus.errors import ConfigError, DatabusError, SchemaError, UnknownSourceError
from databus.schemas import MemorySchemaRegistry, Schema, SchemaLike, SchemaRegistry, as_schema

__all__ = [
    "CATALOG_FILENAME",
    "MAX_SOURCE_ID",
    "BufferCatalog",
    "CatalogError",
    "FollowerCatalog",
    "RelayCatalog",
    "SourceEntry",
]

log = logging.getLogger("databus.relay.catalog")

CATALOG_FILENAME = "catalog.json"
_FORMAT = "databus-relay-catalog"
_VERSION = 1
# Logical source ids travel as a signed 16-bit header field; negatives are control ids.
MAX_SOURCE_ID = (1 << 15) - 1
_MAX_NAME = 255
# What a malformed (hand-edited, truncated) file makes the loader raise.
# RecursionError: a deeply nested (still valid) JSON document, in the file or a schema.
_LOAD_ERRORS = (AttributeError, KeyError, TypeError, ValueError, RecursionError, SchemaError,
                ConfigError)


class CatalogError(DatabusError):
    """The catalog file is unreadable or inconsistent (the relay must not guess ids)."""

    code = "catalog_error"


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """A logical source as the relay knows it."""

    name: str
    id: int
    buffer: str
    partition_id: int
    # The fingerprint of the current schema version, None before one is registered.
    fingerprint: int | None

    @property
    def state(self) -> str:
        """``active`` once the fetcher has seen the table (its schema is registered);
        ``pending`` for a source the configuration names whose table does not exist
        yet: its id is reserved, consumers may subscribe and wait for it."""
        return "pending" if self.fingerprint is None else "active"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean a.b or a.c?)`` for the known names closest to ``name`` (a typo's
    suggestion in an ``unknown_source`` message), or an empty string. Compared
    case-insensitively, so ``Shop.Orders`` finds ``shop.orders``."""
    by_lower = {k.lower(): k for k in known if k != name}
    close = get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.75)
    if not close:
        return ""
    names = [by_lower[c] for c in close]
    return " (did you mean " + (names[0] if len(names) == 1 else
                                ", ".join(names[:-1]) + " or " + names[-1]) + "?)"


@dataclass(frozen=True, slots=True)
class _Record:
    """A source's persisted state: its entry plus its schema history."""

    name: str
    id: int
    buffer: str
    partition_id: int
    versions: tuple[int, ...] = ()  # fingerprints, oldest first
    latest: int | None = None

    def entry(self) -> SourceEntry:
        return SourceEntry(self.name, self.id, self.buffer, self.partition_id, self.latest)


def _fp_text(fp: int) -> str:
    return f"{fp:016x}"


def _check_source_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a logical source needs a non-empty name, got {name!r}")
    # Names are listed comma-separated in /v1/stream?sources=..., and shown in logs.
    if len(name) > _MAX_NAME or "," in name or any(c.isspace() or not c.isprintable()
                                                  for c in name):
        raise ConfigError(
            f"invalid logical source name {name!r}: at most {_MAX_NAME} printable "
            "characters, no commas or whitespace"
        )
    return name


class RelayCatalog:
    """Logical sources (ids, buffer, schema versions) of one relay, persisted at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._records: dict[str, _Record] = {}
        self._by_id: dict[int, _Record] = {}
        self._schemas: dict[int, Schema] = {}
        self._registry = MemorySchemaRegistry()
        if self.path.exists():
            self._load()

    # -- reading --------------------------------------------------------------------

    @property
    def registry(self) -> SchemaRegistry:
        """Every schema version ever registered, by fingerprint and by source."""
        return self._registry

    def sources(self) -> list[SourceEntry]:
        """All logical sources, by id."""
        with self._lock:
            return [r.entry() for r in sorted(self._records.values(), key=lambda r: r.id)]

    def source(self, name: str) -> SourceEntry:
        """The source called ``name``; ``UnknownSourceError`` (404) if there is none."""
        with self._lock:
            record = self._records.get(name)
        if record is None:
            raise UnknownSourceError(f"unknown source {name!r}")
        return record.entry()

    def by_id(self, source_id: int) -> SourceEntry:
        """The source with this id; ``UnknownSourceError`` if there is none."""
        with self._lock:
            record = self._by_id.get(source_id)
        if record is None:
            raise UnknownSourceError(f"unknown source id {source_id}")
        return record.entry()

    def check_buffer_events(self, buffer_name: str, found: dict[int, set[int]]) -> None:
        """Check the source ids and schema fingerprints found in a buffer's file.

        A hand-edited or swapped ``catalog.json`` that still parses would make the relay
        serve events under the wrong name (a consumer naming the source gets nothing
        while its checkpoint moves past them): refuse to start instead.
        """
        with self._lock:
            problems = []
            for source_id, fingerprints in sorted(found.items()):
                record = self._by_id.get(source_id)
                if record is None:
                    problems.append(f"source id {source_id} is not in the catalog")
                elif record.buffer != buffer_name:
                    problems.append(
                        f"source id {source_id} ({record.name}) belongs to buffer "
                        f"{record.buffer!r} in the catalog"
                    )
                else:
                    unknown = sorted(fp for fp in fingerprints if fp not in record.versions)
                    if unknown:
                        problems.append(
                            f"source id {source_id} ({record.name}) has events with schema "
                            f"{', '.join(_fp_text(fp) for fp in unknown[:3])} that the "
                            "catalog does not list for it"
                        )
        if problems:
            raise CatalogError(
                f"relay catalog {self.path} does not match buffer {buffer_name!r}: "
                f"{'; '.join(problems[:5])}. The buffer's events would be served under "
                "the wrong source: restore the catalog, or move it away together with the "
                "*.buf files"
            )

    def for_buffer(self, buffer_name: str, partition_id: int) -> BufferCatalog:
        """The ``SourceCatalog`` a fetcher of buffer ``buffer_name`` gets."""
        return BufferCatalog(self, buffer_name, partition_id)

    # -- changes (called through BufferCatalog) -------------------------------------

    def _bind(self, name: str, buffer: str, partition_id: int) -> _Record:
        """The record of ``name``, created (and persisted) if new. Caller holds the lock."""
        record = self._records.get(name)
        if record is None:
            next_id = max(self._by_id, default=0) + 1
            if next_id > MAX_SOURCE_ID:
                raise CatalogError(f"no source id left for {name!r} (max {MAX_SOURCE_ID})")
            record = _Record(name, next_id, buffer, partition_id)
        elif record.buffer != buffer:
            raise ConfigError(
                f"source {name!r} belongs to buffer {record.buffer!r} (its events there carry "
                f"id {record.id}); buffer {buffer!r} cannot feed it too"
            )
        elif record.partition_id != partition_id:
            # The buffer's partition id comes from the config order; follow it.
            log.info("source %s: partition id %d -> %d", name, record.partition_id, partition_id)
            record = replace(record, partition_id=partition_id)
        else:
            return record
        self._commit(record)
        return record

    def _source_id(self, name: str, buffer: str, partition_id: int) -> int:
        name = _check_source_name(name)
        with self._lock:
            return self._bind(name, buffer, partition_id).id

    def _register(self, name: str, schema: SchemaLike, buffer: str, partition_id: int) -> Schema:
        name = _check_source_name(name)
        new = as_schema(schema)  # validate outside the lock
        with self._lock:
            record = self._bind(name, buffer, partition_id)
            fp = new.fingerprint
            # The first schema stored under a fingerprint wins, as in the registry.
            stored = self._schemas.get(fp, new)
            if record.latest == fp:
                return stored
            versions = record.versions if fp in record.versions else (*record.versions, fp)
            self._commit(replace(record, versions=versions, latest=fp), stored)
            return stored

    def _commit(self, record: _Record, schema: Schema | None = None) -> None:
        """Persist ``record`` (and a possibly new ``schema``), then apply it in memory."""
        records = {**self._records, record.name: record}
        schemas = self._schemas
        if schema is not None and schema.fingerprint not in schemas:
            schemas = {**schemas, schema.fingerprint: schema}
        self._write(records, schemas)
        self._records = records
        self._schemas = schemas
        self._by_id[record.id] = record
        if schema is not None and record.latest is not None:
            self._registry.register(record.name, schema)

    # -- the file -------------------------------------------------------------------

    def _write(self, records: dict[str, _Record], schemas: dict[int, Schema]) -> None:
        doc = {
            "format": _FORMAT,
            "version": _VERSION,
            "sources": [
                {
                    "name": r.name,
                    "id": r.id,
                    "buffer": r.buffer,
                    "partition_id": r.partition_id,
                    "versions": [_fp_text(fp) for fp in r.versions],
                    "latest": None if r.latest is None else _fp_text(r.latest),
                }
                for r in sorted(records.values(), key=lambda r: r.id)
            ],
            "schemas": {_fp_text(fp): s.schema for fp, s in sorted(schemas.items())},
        }
        data = json.dumps(doc, indent=1, sort_keys=False).encode() + b"\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, data, mode=0o600)

    def _load(self) -> None:
        try:
            doc = json.loads(self.path.read_bytes())
        except (OSError, ValueError, RecursionError) as exc:
            raise self._corrupt(f"cannot read it: {exc}") from exc
        try:
            self._load_doc(doc)
        except _LOAD_ERRORS as exc:
            raise self._corrupt(f"{type(exc).__name__}: {exc}") from exc
        log.info("catalog %s: %d sources, %d schemas", self.path, len(self._records),
                 len(self._schemas))

    def _corrupt(self, reason: str) -> CatalogError:
        return CatalogError(
            f"relay catalog {self.path} is unusable ({reason}); the buffer files' source "
            "ids depend on it: restore it, or move it away together with the *.buf files"
        )

    def _load_doc(self, doc: Any) -> None:
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise ValueError("not a relay catalog")
        if doc.get("version") != _VERSION:
            raise ValueError(f"unknown catalog version {doc.get('version')!r}")
        for text, raw in doc["schemas"].items():
            schema = Schema(raw)
            if _fp_text(schema.fingerprint) != text:
                raise ValueError(f"schema {text} has fingerprint {_fp_text(schema.fingerprint)}")
            self._schemas[schema.fingerprint] = schema
        for item in doc["sources"]:
            name = _check_source_name(item["name"])
            source_id, buffer, partition_id = item["id"], item["buffer"], item["partition_id"]
            if not (isinstance(source_id, int) and 1 <= source_id <= MAX_SOURCE_ID):
                raise ValueError(f"source {name!r} has a bad id {source_id!r}")
            if not isinstance(buffer, str) or not isinstance(partition_id, int):
                raise ValueError(f"source {name!r} has a bad buffer or partition id")
            if name in self._records or source_id in self._by_id:
                raise ValueError(f"source {name!r} or id {source_id} appears twice")
            versions = tuple(int(fp, 16) for fp in item["versions"])
            latest = None if item["latest"] is None else int(item["latest"], 16)
            if any(fp not in self._schemas for fp in versions) or (
                latest is not None and latest not in versions
            ):
                raise ValueError(f"source {name!r} names a schema the file does not hold")
            record = _Record(name, source_id, buffer, partition_id, versions, latest)
            self._records[name] = self._by_id[source_id] = record
            # Replaying the history in order, then the current version last, gives the
            # registry the same versions list and latest schema as before the restart.
            for fp in versions:
                self._registry.register(name, self._schemas[fp])
            if latest is not None:
                self._registry.register(name, self._schemas[latest])


class BufferCatalog:
    """The catalog as one buffer's fetcher sees it (the ``SourceCatalog`` protocol)."""

    def __init__(self, catalog: RelayCatalog, buffer_name: str, partition_id: int) -> None:
        self.catalog = catalog
        self.buffer_name = buffer_name
        self.partition_id = partition_id

    def source_id(self, name: str) -> int:
        """The id of logical source ``name``, allocated (and bound to this buffer) if new."""
        return self.catalog._source_id(name, self.buffer_name, self.partition_id)

    def register_schema(self, name: str, schema: Schema) -> Schema:
        """Make ``schema`` the current version of ``name``; returns the stored schema."""
        return self.catalog._register(name, schema, self.buffer_name, self.partition_id)


class FollowerCatalog:
    """The catalog as a relay worker sees it (docs/relay.md, "Workers"): ``catalog.json``
    read, never written, and read again once the main process has replaced it (an
    atomic rename: another inode). ``refresh`` checks the file (one ``stat``); it runs
    on each wake-up from the main process, before ``sources()`` and ``registry``
    (requests that list what exists), and when a source, id or fingerprint is not
    found, so a name the main process just gave an id is found on first use. The main
    process writes the file before any event carries a new id or fingerprint."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp = self._stat()
        self._catalog = RelayCatalog(self.path)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def refresh(self) -> bool:
        """Read the file again if it changed; True when it did."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        try:
            catalog = RelayCatalog(self.path)
        except CatalogError as exc:
            # The main process renames whole files into place; keep serving what we had.
            limited(log).warning("catalog %s: not reloaded (%s)", self.path, exc,
                                 kind=self.path)
            return False
        self._catalog, self._stamp = catalog, stamp
        return True

    @property
    def registry(self) -> SchemaRegistry:
        self.refresh()
        return self._catalog.registry

    def sources(self) -> list[SourceEntry]:
        self.refresh()
        return self._catalog.sources()

    def source(self, name: str) -> SourceEntry:
        try:
            return self._catalog.source(name)
        except UnknownSourceError:
            if not self.refresh():
                raise
        return self._catalog.source(name)

    def by_id(self, source_id: int) -> SourceEntry:
        try:
            return self._catalog.by_id(source_id)
        except UnknownSourceError:
            if not self.refresh():
                raise
        return self._catalog.by_id(source_id)
