"""The relay's source catalog: stable ids, schema versions kept forever, persistence."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from databus.errors import ConfigError, UnknownSourceError
from databus.fetchers._api import SourceCatalog
from databus.relay._catalog import CatalogError, RelayCatalog, SourceEntry
from databus.schemas import Schema


def orders(*extra: dict[str, Any]) -> Schema:
    return Schema({
        "type": "record", "name": "orders", "namespace": "shop",
        "fields": [{"name": "id", "type": "long"}, *extra],
    })


V1 = orders()
V2 = orders({"name": "note", "type": ["null", "string"], "default": None})
V3 = orders({"name": "qty", "type": "int", "default": 0})


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "relay" / "catalog.json"


def test_ids_start_at_one_and_are_stable(path: Path) -> None:
    catalog = RelayCatalog(path)
    view: SourceCatalog = catalog.for_buffer("shop", 0)
    assert view.source_id("shop.orders") == 1
    assert view.source_id("shop.items") == 2
    assert view.source_id("shop.orders") == 1
    assert catalog.for_buffer("load", 1).source_id("synthetic.events") == 3
    assert catalog.sources() == [
        SourceEntry("shop.orders", 1, "shop", 0, None),
        SourceEntry("shop.items", 2, "shop", 0, None),
        SourceEntry("synthetic.events", 3, "load", 1, None),
    ]
    assert catalog.source("shop.items") == SourceEntry("shop.items", 2, "shop", 0, None)
    assert catalog.by_id(3).name == "synthetic.events"


def test_unknown_source_is_a_404(path: Path) -> None:
    catalog = RelayCatalog(path)
    catalog.for_buffer("shop", 0).source_id("shop.orders")
    with pytest.raises(UnknownSourceError) as info:
        catalog.source("shop.nope")
    assert info.value.http_status == 404 and info.value.code == "unknown_source"
    assert "shop.nope" in str(info.value)
    with pytest.raises(UnknownSourceError):
        catalog.by_id(2)


def test_a_source_belongs_to_one_buffer(path: Path) -> None:
    catalog = RelayCatalog(path)
    catalog.for_buffer("shop", 0).source_id("shop.orders")
    with pytest.raises(ConfigError, match=r"shop\.orders.*buffer 'shop'"):
        catalog.for_buffer("other", 1).source_id("shop.orders")
    with pytest.raises(ConfigError):
        catalog.for_buffer("other", 1).register_schema("shop.orders", V1)
    assert catalog.source("shop.orders").buffer == "shop"


@pytest.mark.parametrize("name", ["", "a,b", "shop orders", "tab\there", "x" * 256])
def test_bad_source_names_are_rejected(path: Path, name: str) -> None:
    with pytest.raises(ConfigError):
        RelayCatalog(path).for_buffer("shop", 0).source_id(name)


def test_ids_and_schemas_survive_a_reopen(path: Path) -> None:
    catalog = RelayCatalog(path)
    shop = catalog.for_buffer("shop", 0)
    assert shop.register_schema("shop.orders", V1) == V1
    shop.register_schema("shop.orders", V2)
    shop.source_id("shop.items")

    again = RelayCatalog(path)
    assert again.sources() == catalog.sources()
    assert again.source("shop.orders").fingerprint == V2.fingerprint
    assert [s.fingerprint for s in again.registry.versions("shop.orders")] == [
        V1.fingerprint, V2.fingerprint,
    ]
    # Old events still find their writer schema.
    assert again.registry.get(V1.fingerprint) == V1
    assert again.registry.latest("shop.orders") == V2
    # Ids are never reused: the next one follows the highest.
    assert again.for_buffer("load", 1).source_id("synthetic.events") == 3
    assert RelayCatalog(path).source("synthetic.events").id == 3


def test_schema_versions_are_kept_and_a_revert_makes_an_old_one_current(path: Path) -> None:
    catalog = RelayCatalog(path)
    shop = catalog.for_buffer("shop", 0)
    for schema in (V1, V2, V3, V1):
        shop.register_schema("shop.orders", schema)
    fps = [V1.fingerprint, V2.fingerprint, V3.fingerprint]
    assert [s.fingerprint for s in catalog.registry.versions("shop.orders")] == fps
    assert catalog.source("shop.orders").fingerprint == V1.fingerprint
    again = RelayCatalog(path)
    assert [s.fingerprint for s in again.registry.versions("shop.orders")] == fps
    assert again.source("shop.orders").fingerprint == V1.fingerprint
    assert again.registry.latest("shop.orders") == V1


def test_the_same_schema_for_two_sources_is_stored_once(path: Path) -> None:
    catalog = RelayCatalog(path)
    shop = catalog.for_buffer("shop", 0)
    shop.register_schema("shop.orders", V1)
    shop.register_schema("shop.orders_copy", V1)
    doc = json.loads(path.read_text())
    assert list(doc["schemas"]) == [f"{V1.fingerprint:016x}"]
    assert [s["latest"] for s in doc["sources"]] == [f"{V1.fingerprint:016x}"] * 2


def test_registering_a_known_current_schema_does_not_rewrite_the_file(path: Path) -> None:
    catalog = RelayCatalog(path)
    shop = catalog.for_buffer("shop", 0)
    shop.register_schema("shop.orders", V1)
    before = path.stat()
    shop.register_schema("shop.orders", V1)  # every fetcher restart does this
    shop.source_id("shop.orders")
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_the_file_is_replaced_atomically(path: Path) -> None:
    catalog = RelayCatalog(path)
    catalog.for_buffer("shop", 0).register_schema("shop.orders", V1)
    assert [p.name for p in path.parent.iterdir()] == ["catalog.json"]  # no temp file left
    doc = json.loads(path.read_text())
    assert doc["format"] == "databus-relay-catalog" and doc["version"] == 1
    assert doc["sources"][0]["name"] == "shop.orders"


def test_a_failed_write_changes_nothing(path: Path) -> None:
    catalog = RelayCatalog(path)
    shop = catalog.for_buffer("shop", 0)
    shop.source_id("shop.orders")
    saved = path.read_bytes()
    path.unlink()
    path.mkdir()  # a non-empty directory cannot be renamed over (works as root too)
    (path / "blocker").touch()
    with pytest.raises(OSError):
        shop.source_id("shop.items")
    with pytest.raises(OSError):
        shop.register_schema("shop.orders", V1)
    with pytest.raises(UnknownSourceError):
        catalog.source("shop.items")
    assert catalog.source("shop.orders").fingerprint is None
    assert catalog.registry.versions("shop.orders") == []
    (path / "blocker").unlink()
    path.rmdir()
    path.write_bytes(saved)
    # The id that was not persisted was not handed out either.
    assert shop.source_id("shop.items") == 2
    assert RelayCatalog(path).source("shop.items").id == 2


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"format": "something-else", "version": 1, "sources": [], "schemas": {}}',
        '{"format": "databus-relay-catalog", "version": 99, "sources": [], "schemas": {}}',
        '{"format": "databus-relay-catalog", "version": 1, "sources": [{"name": "a"}], '
        '"schemas": {}}',
        '{"format": "databus-relay-catalog", "version": 1, "sources": [], "schemas": []}',
    ],
)
def test_a_broken_file_stops_the_relay(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(CatalogError, match=r"catalog\.json"):
        RelayCatalog(path)


def test_inconsistent_contents_are_detected(path: Path) -> None:
    catalog = RelayCatalog(path)
    catalog.for_buffer("shop", 0).register_schema("shop.orders", V1)
    catalog.for_buffer("shop", 0).source_id("shop.items")
    good = json.loads(path.read_text())

    def broken(change: Any) -> None:
        doc = json.loads(json.dumps(good))
        change(doc)
        path.write_text(json.dumps(doc))
        with pytest.raises(CatalogError):
            RelayCatalog(path)

    fp = f"{V1.fingerprint:016x}"
    # A schema stored under another fingerprint than its own.
    broken(lambda d: d["schemas"].update({fp: V2.schema}))
    # A version that the file does not hold.
    broken(lambda d: d["sources"][0].update(versions=["0000000000000001"]))
    # Two sources with one id.
    broken(lambda d: d["sources"][1].update(id=1))
    # An id out of the int16 range of the wire format.
    broken(lambda d: d["sources"][1].update(id=1 << 15))


def test_concurrent_allocation_gives_unique_dense_ids(path: Path) -> None:
    catalog = RelayCatalog(path)
    names = [f"db.t{i}" for i in range(40)]
    got: list[dict[str, int]] = []
    barrier = threading.Barrier(8)

    def worker(seed: int) -> None:
        view = catalog.for_buffer("shop", 0)
        barrier.wait()
        order = names[seed:] + names[:seed]
        got.append({n: view.source_id(n) for n in order})
        for n in order[:5]:
            view.register_schema(n, V1)
            catalog.sources()
            catalog.registry.versions(n)

    threads = [threading.Thread(target=worker, args=(i * 5,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g == got[0] for g in got)
    assert sorted(got[0].values()) == list(range(1, 41))
    assert RelayCatalog(path).sources() == catalog.sources()
