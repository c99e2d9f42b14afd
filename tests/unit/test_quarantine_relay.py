"""Per-source quarantine on a relay with a real source (SQLite TxLog, DESIGN 17): the
other tables keep flowing, the quarantine is visible (/v1/sources, /v1/status,
/readyz, /metrics) and survives a restart; "stop" fails the fetcher instead."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from databus.relay._fetcher_host import FetcherHost
from tests.quarantine_support import FIX, REASON, use_poison_fetcher
from tests.relay_harness import RunningRelay, relay_config, running_relay, stream_all
from tests.unit.test_txlog_support import BUFFER, SqliteSource
from tests.waiting import async_wait_until

TABLES = "items,tags"
DDL = ("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
       "CREATE TABLE tags (word TEXT PRIMARY KEY, n INTEGER)")


def item(key: int, name: str) -> str:
    return f"INSERT INTO items (id, name) VALUES ({key}, '{name}')"


def tag(word: str, n: int) -> str:
    return f"INSERT INTO tags (word, n) VALUES ('{word}', {n})"


def _source(tmp_path: Path) -> SqliteSource:
    db = SqliteSource(tmp_path / "shop.db", *DDL)
    db.install(TABLES)
    return db


async def _names_in_stream(r: RunningRelay, **params: Any) -> dict[str, list[object]]:
    windows, _ = await stream_all(r, **params)
    names = {s.id: s.name for s in r.relay.catalog.sources()}
    out: dict[str, list[object]] = {}
    for w in windows:
        for source_id, key, _value in w.events:
            out.setdefault(names[source_id], []).append(key)
    return out


async def _quarantined(r: RunningRelay) -> list[dict[str, Any]]:
    return list((await r.json("/v1/status"))["buffers"][BUFFER]["quarantined"])


def test_a_poisoned_table_is_quarantined_and_the_others_flow(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    use_poison_fetcher(monkeypatch)
    db = _source(tmp_path)
    config = relay_config(tmp_path, {BUFFER: db.uri(TABLES)})

    async def first_run() -> None:
        async with running_relay(config) as r:
            db.txn(item(1, "a"), tag("x", 1))
            db.txn(item(666, "bad"), item(2, "b"),
                   tag("y", 2))
            db.txn(item(3, "c"), tag("z", 3))

            async def seen() -> bool:
                return "z" in (await _names_in_stream(r)).get("shop.tags", [])

            await async_wait_until(seen, "tag z served", 20, max_interval=0.05)
            served = await _names_in_stream(r, quarantine="pass")
            assert served["shop.tags"] == ["x", "y", "z"]  # the other table goes on
            assert served["shop.items"] == [1]  # nothing of items from the poisoned window
            (q,) = await _quarantined(r)
            assert (q["source"], q["reason"], q["fix"]) == ("shop.items", REASON, FIX)
            sources = {s["name"]: s["state"] for s in
                       (await r.json("/v1/sources"))["sources"]}
            assert sources == {"shop.items": "quarantined", "shop.tags": "active"}
            async with await r.get("/readyz") as resp:
                assert resp.status == 503
                doc = await resp.json()
            (component,) = [c for c in doc["components"] if c["component"] == "source"]
            assert component["source"] == "shop.items" and component["state"] == "quarantined"
            assert component["error"] == "source_quarantined" and component["fix"] == FIX
            async with await r.get("/metrics") as resp:
                text = await resp.text()
            assert ('databus_component_up{buffer="src",component="source:shop.items",'
                    'daemon="relay"} 0.0') in text
            db.txn(item(4, "d"), tag("w", 4))

            async def seen_w() -> bool:
                return "w" in (await _names_in_stream(r, quarantine="pass")).get("shop.tags", [])

            await async_wait_until(seen_w, "tag w served", 20, max_interval=0.05)
            assert (await _names_in_stream(r, quarantine="pass"))["shop.items"] == [1]

    async def second_run() -> None:
        async with running_relay(config) as r:
            (q,) = await _quarantined(r)  # kept across the restart
            assert q["source"] == "shop.items"
            db.txn(item(5, "e"), tag("v", 5))

            async def seen_v() -> bool:
                return "v" in (await _names_in_stream(r, quarantine="pass")).get("shop.tags", [])

            await async_wait_until(seen_v, "tag v served", 20, max_interval=0.05)
            assert (await _names_in_stream(r, quarantine="pass"))["shop.items"] == [1]

    asyncio.run(first_run())
    asyncio.run(second_run())


def test_stop_mode_fails_the_fetcher_with_the_fix(tmp_path: Path, monkeypatch: Any) -> None:
    use_poison_fetcher(monkeypatch)
    db = _source(tmp_path)
    config = relay_config(tmp_path, {BUFFER: db.uri(TABLES)})
    config = dataclasses.replace(config, buffers=(dataclasses.replace(
        config.buffers[0], on_source_error="stop"),))

    async def main() -> None:
        async with running_relay(config) as r:
            db.txn(item(666, "bad"), tag("y", 2))

            async def failed() -> bool:
                fetcher = (await r.json("/v1/status"))["buffers"][BUFFER]["fetcher"]
                return bool(fetcher["state"] == "failed")

            await async_wait_until(failed, "fetcher failed", 20, max_interval=0.05)
            status = (await r.json("/v1/status"))["buffers"][BUFFER]
            assert status["quarantined"] == []
            assert "SourceQuarantinedError" in status["fetcher"]["last_error"]
            assert FIX in status["fetcher"]["last_error"]
            assert (await _names_in_stream(r)).get("shop.tags", []) == []

    asyncio.run(main())


def test_config_refuses_an_unknown_on_source_error(tmp_path: Path) -> None:
    from databus.config import BufferConfig
    from databus.config._checks import ConfigFieldError

    with pytest.raises(ConfigFieldError, match="on_source_error"):
        BufferConfig(name="b", capacity_mb=1, source="synthetic://", on_source_error="skip")
    assert FetcherHost  # the host module imports with the quarantine parts
