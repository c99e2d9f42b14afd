"""The in-memory schema registry: versioning, lookups, errors and thread safety."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from databus.errors import SchemaError
from databus.schemas import (
    MemorySchemaRegistry,
    Schema,
    SchemaRegistry,
    UnknownSchemaError,
    to_signed64,
)


def orders(*extra: dict[str, Any], doc: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "record",
        "name": "orders",
        "namespace": "shop",
        "fields": [{"name": "id", "type": "long"}, *extra],
    }
    if doc is not None:
        schema["doc"] = doc
    return schema


V2_FIELD = {"name": "note", "type": ["null", "string"], "default": None}
V3_FIELD = {"name": "qty", "type": "int", "default": 0}


@pytest.fixture
def registry() -> MemorySchemaRegistry:
    return MemorySchemaRegistry()


def test_is_a_schema_registry(registry: MemorySchemaRegistry) -> None:
    assert isinstance(registry, SchemaRegistry)


def test_register_is_idempotent(registry: MemorySchemaRegistry) -> None:
    first = registry.register("shop.orders", orders())
    again = registry.register("shop.orders", Schema(orders()))
    same_shape = registry.register("shop.orders", orders(doc="only the doc differs"))
    assert again is first and same_shape is first
    assert registry.versions("shop.orders") == [first]
    assert len(registry) == 1


def test_new_fingerprint_is_a_new_version(registry: MemorySchemaRegistry) -> None:
    v1 = registry.register("shop.orders", orders())
    v2 = registry.register("shop.orders", orders(V2_FIELD))
    v3 = registry.register("shop.orders", orders(V2_FIELD, V3_FIELD))
    assert len({v1.fingerprint, v2.fingerprint, v3.fingerprint}) == 3
    assert registry.versions("shop.orders") == [v1, v2, v3]
    assert registry.latest("shop.orders") is v3
    for schema in (v1, v2, v3):
        assert registry.get(schema.fingerprint) is schema  # old versions are kept


def test_reverting_makes_the_old_version_current(registry: MemorySchemaRegistry) -> None:
    v1 = registry.register("shop.orders", orders())
    v2 = registry.register("shop.orders", orders(V2_FIELD))
    assert registry.register("shop.orders", orders()) is v1
    assert registry.latest("shop.orders") is v1
    assert registry.versions("shop.orders") == [v1, v2]  # no duplicate version


def test_sources(registry: MemorySchemaRegistry) -> None:
    assert registry.sources() == []
    shared = registry.register("shop.orders", orders())
    assert registry.register("archive.orders", orders()) is shared
    registry.register("shop.items", {"type": "record", "name": "items", "fields": []})
    assert registry.sources() == ["archive.orders", "shop.items", "shop.orders"]
    assert registry.versions("archive.orders") == [shared]
    assert registry.versions("nowhere") == []


def test_get_accepts_the_signed_form(registry: MemorySchemaRegistry) -> None:
    for schema in (registry.register("a.b", orders()), registry.register("a.b", "long")):
        assert registry.get(to_signed64(schema.fingerprint)) is schema


def test_unknown_fingerprint_and_source(registry: MemorySchemaRegistry) -> None:
    with pytest.raises(UnknownSchemaError, match="0x00000000000004d2") as info:
        registry.get(1234)
    error = info.value
    assert isinstance(error, SchemaError) and isinstance(error, KeyError)
    assert str(error) == "no schema with fingerprint 0x00000000000004d2 (1234)"
    assert error.to_json() == {"error": "unknown_schema", "message": str(error)}
    assert error.http_status == 404 and not error.retriable
    with pytest.raises(KeyError):
        registry.latest("shop.orders")
    with pytest.raises(UnknownSchemaError, match=r"'shop\.orders'"):
        registry.latest("shop.orders")


@pytest.mark.parametrize("source", ["", None, 5])
def test_bad_source(registry: MemorySchemaRegistry, source: Any) -> None:
    with pytest.raises(SchemaError, match="source name"):
        registry.register(source, orders())


def test_invalid_schema_registers_nothing(registry: MemorySchemaRegistry) -> None:
    with pytest.raises(SchemaError, match="invalid Avro schema"):
        registry.register("shop.orders", {"type": "record", "name": "orders"})
    assert registry.sources() == []


def test_concurrent_registration(registry: MemorySchemaRegistry) -> None:
    # Many threads register overlapping versions; the result must be consistent.
    schemas = [
        Schema(orders(*({"name": f"c{j}", "type": "int", "default": 0} for j in range(i))))
        for i in range(20)
    ]
    barrier = threading.Barrier(8)
    results: list[list[Schema]] = []

    def work() -> None:
        barrier.wait()
        results.append([registry.register("shop.orders", s) for s in schemas])

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = registry.versions("shop.orders")
    assert sorted(s.fingerprint for s in versions) == sorted(s.fingerprint for s in schemas)
    assert len(registry) == 20
    for returned in results:
        assert [registry.get(s.fingerprint) for s in returned] == returned
