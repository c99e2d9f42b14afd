"""The schema registry: every version of every source's schema, by fingerprint, forever.

Fetchers register the schema they infer for a table; a DDL change gives a new version
with a new fingerprint while old events keep theirs (DESIGN section 5). Consumers look
writer schemas up by the fingerprint in each event header. ``SchemaRegistry`` is the
interface; ``MemorySchemaRegistry`` is the in-memory implementation (relay, tests); a
PostgreSQL-backed one (bootstrap) implements the same interface.
"""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

from databus.errors import SchemaError, UnknownSchemaError
from databus.schemas._canonical import Schema, SchemaLike, as_schema


@runtime_checkable
class SchemaRegistry(Protocol):
    """Schemas by fingerprint, and each source's versions in registration order.

    Semantics every implementation must keep:

    - ``register`` is idempotent: registering a schema whose fingerprint the source
      already has adds no version. It makes that schema the source's latest, so a DDL
      that reverts a table to an older shape makes the older version current again.
    - ``versions`` lists each distinct fingerprint once, oldest first.
    - A fingerprint maps to one ``Schema`` (the first registered with it) for all
      sources; schemas with equal fingerprints encode values identically.
    - Nothing is ever removed.
    """

    def register(self, source: str, schema: SchemaLike) -> Schema:
        """Add ``schema`` as the latest version of ``source``; return the stored schema."""
        ...

    def get(self, fingerprint: int) -> Schema:
        """The schema with this fingerprint; ``UnknownSchemaError`` if none.

        The fingerprint is unsigned; its signed 64-bit form (as stored in a SQL BIGINT)
        is accepted too.
        """
        ...

    def latest(self, source: str) -> Schema:
        """The source's current schema; ``UnknownSchemaError`` if it has none."""
        ...

    def versions(self, source: str) -> list[Schema]:
        """The source's schemas, oldest first; empty for an unknown source."""
        ...

    def sources(self) -> list[str]:
        """The sources with at least one schema, sorted."""
        ...


class MemorySchemaRegistry:
    """An in-memory, thread-safe ``SchemaRegistry`` that keeps every version forever."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_fingerprint: dict[int, Schema] = {}
        self._versions: dict[str, list[Schema]] = {}
        self._latest: dict[str, Schema] = {}

    def register(self, source: str, schema: SchemaLike) -> Schema:
        if not isinstance(source, str) or not source:
            raise SchemaError(f"a schema needs a source name, got {source!r}")
        new = as_schema(schema)  # validate outside the lock
        with self._lock:
            stored = self._by_fingerprint.setdefault(new.fingerprint, new)
            versions = self._versions.setdefault(source, [])
            if all(v.fingerprint != stored.fingerprint for v in versions):
                versions.append(stored)
            self._latest[source] = stored
            return stored

    def get(self, fingerprint: int) -> Schema:
        if isinstance(fingerprint, int) and -(1 << 63) <= fingerprint < 0:
            fingerprint += 1 << 64
        with self._lock:
            schema = self._by_fingerprint.get(fingerprint)
        if schema is None:
            raise UnknownSchemaError(f"no schema with fingerprint {_format(fingerprint)}")
        return schema

    def latest(self, source: str) -> Schema:
        with self._lock:
            schema = self._latest.get(source)
        if schema is None:
            raise UnknownSchemaError(f"no schema registered for source {source!r}")
        return schema

    def versions(self, source: str) -> list[Schema]:
        with self._lock:
            return list(self._versions.get(source, ()))

    def sources(self) -> list[str]:
        with self._lock:
            return sorted(self._versions)

    def __len__(self) -> int:
        """The number of distinct schemas."""
        with self._lock:
            return len(self._by_fingerprint)


def _format(fingerprint: object) -> str:
    if isinstance(fingerprint, int) and not isinstance(fingerprint, bool):
        return f"0x{fingerprint & 0xFFFFFFFFFFFFFFFF:016x} ({fingerprint})"
    return repr(fingerprint)
