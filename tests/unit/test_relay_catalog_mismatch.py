"""A catalog.json that still parses but no longer matches the buffer files.

The defect (issue 12): a changed source id in catalog.json made the relay serve events
whose source id was not in its catalog; a consumer naming the source got 0 events
while its checkpoint advanced past them. On restart every source id (and schema
fingerprint) found in a buffer is now checked against the catalog, and the relay
refuses to start with a message that says what to do.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from databus.config import BufferConfig, RelayConfig
from databus.event import Op, encode_event
from databus.relay._catalog import CatalogError
from databus.relay._relay import Relay
from databus.schemas import Schema

ORDERS = Schema({"type": "record", "name": "orders",
                 "fields": [{"name": "id", "type": "long"}]})
ITEMS = Schema({"type": "record", "name": "items",
                "fields": [{"name": "id", "type": "long"}, {"name": "sku", "type": "string"}]})


def _config(tmp_path: Path) -> RelayConfig:
    # A source URI no fetcher is started for: these relays are never start()ed.
    return RelayConfig(data_dir=tmp_path / "relay",
                       buffers=(BufferConfig("shop", 1, "synthetic://"),))


def _relay_with_windows(tmp_path: Path) -> None:
    relay = Relay(_config(tmp_path))
    try:
        catalog = relay.catalog.for_buffer("shop", 0)
        orders = catalog.source_id("shop.orders")
        items = catalog.source_id("shop.items")
        catalog.register_schema("shop.orders", ORDERS)
        catalog.register_schema("shop.items", ITEMS)
        buffer = relay.buffers["shop"]
        for scn in range(10, 20):
            buffer.append_window(scn, [
                encode_event(scn=scn, source_id=orders, op=Op.UPSERT, key=scn,
                             value=b"\x02", schema_fingerprint=ORDERS.fingerprint),
                encode_event(scn=scn, source_id=items, op=Op.UPSERT, key=scn,
                             value=b"\x02\x00", schema_fingerprint=ITEMS.fingerprint),
            ])
    finally:
        relay.close()


def _edit_catalog(tmp_path: Path, change: object) -> None:
    path = tmp_path / "relay" / "catalog.json"
    doc = json.loads(path.read_text())
    change(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))


def test_unchanged_catalog_reopens(tmp_path: Path) -> None:
    _relay_with_windows(tmp_path)
    relay = Relay(_config(tmp_path))
    try:
        assert relay.buffers["shop"].state().windows == 10
        assert sorted(relay.buffers["shop"].recovered_sources) == [1, 2]
    finally:
        relay.close()


def test_changed_source_id_refuses_to_start(tmp_path: Path) -> None:
    _relay_with_windows(tmp_path)

    def renumber(doc: dict) -> None:  # type: ignore[type-arg]
        doc["sources"][0]["id"] = 7

    _edit_catalog(tmp_path, renumber)
    with pytest.raises(CatalogError, match=r"source id 1 is not in the catalog.*restore"):
        Relay(_config(tmp_path))


def test_swapped_source_ids_refuse_to_start(tmp_path: Path) -> None:
    # Both ids still exist, but each now names the other table: the schemas tell.
    _relay_with_windows(tmp_path)

    def swap(doc: dict) -> None:  # type: ignore[type-arg]
        a, b = doc["sources"]
        a["id"], b["id"] = b["id"], a["id"]

    _edit_catalog(tmp_path, swap)
    with pytest.raises(CatalogError, match="does not list for it"):
        Relay(_config(tmp_path))


def test_source_moved_to_another_buffer_refuses_to_start(tmp_path: Path) -> None:
    _relay_with_windows(tmp_path)

    def move(doc: dict) -> None:  # type: ignore[type-arg]
        doc["sources"][1]["buffer"] = "other"

    _edit_catalog(tmp_path, move)
    with pytest.raises(CatalogError, match="belongs to buffer 'other'"):
        Relay(_config(tmp_path))


def test_deeply_nested_catalog_is_unusable_not_a_recursion_error(tmp_path: Path) -> None:
    _relay_with_windows(tmp_path)
    path = tmp_path / "relay" / "catalog.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CatalogError, match="is unusable"):
        Relay(_config(tmp_path))
    # Valid on the outside, nested deep inside a schema.
    doc = {"format": "databus-relay-catalog", "version": 1, "sources": [],
           "schemas": {"0000000000000000": None}}
    path.write_text(json.dumps(doc).replace("null", "[" * 50_000 + "]" * 50_000))
    with pytest.raises(CatalogError, match="is unusable"):
        Relay(_config(tmp_path))


def test_databus_relay_exits_with_the_message(tmp_path: Path) -> None:
    _relay_with_windows(tmp_path)

    def renumber(doc: dict) -> None:  # type: ignore[type-arg]
        doc["sources"][0]["id"] = 9

    _edit_catalog(tmp_path, renumber)
    config = tmp_path / "relay.toml"
    config.write_text(
        f'[relay]\ndata_dir = "{tmp_path / "relay"}"\nport = 0\n'
        '[[relay.buffers]]\nname = "shop"\ncapacity_mb = 1\nsource = "synthetic://"\n'
    )
    exe = Path(sys.executable).with_name("databus")
    done = subprocess.run([str(exe), "relay", "--config", str(config)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "does not match buffer 'shop'" in output
    assert "Traceback" not in output
