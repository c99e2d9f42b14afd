"""A chained relay and an upstream's quarantine (DESIGN 17): the chain keeps copying
every window (quarantine=pass), records the quarantine from the marker that travels
in its window, serves its own consumers the in-band error at the same SCN, and lifts
it when the upstream is healed (the upstream's dump follows, so a consumer of the
chain converges too). A chained relay cannot heal by itself (dump_unsupported)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.quarantine_support import FIX, REASON, shop_source, use_poison_fetcher
from tests.relay_harness import ADMIN_TOKEN, RunningRelay, relay_config, running_relay
from tests.unit.test_quarantine_relay import (
    TABLES,
    _body,
    _has_tag,
    _poll_until_error,
    _quarantined,
    _replica,
    _wait_dump,
    item,
    tag,
)
from tests.unit.test_txlog_support import BUFFER, SqliteSource
from tests.waiting import async_wait_until


def test_a_chained_relay_mirrors_the_quarantine_and_its_heal(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    use_poison_fetcher(monkeypatch)
    db = shop_source(tmp_path)
    up_config = relay_config(tmp_path / "up", {BUFFER: db.uri(TABLES)})

    async def main() -> None:
        async with running_relay(up_config) as up:
            chain = f"relay+{up.url}/?sources=shop.items,shop.tags&heartbeat_ms=100"
            tags_only = f"relay+{up.url}/?sources=shop.tags&heartbeat_ms=100"
            async with running_relay(relay_config(tmp_path / "down",
                                                  {BUFFER: chain})) as down, \
                    running_relay(relay_config(tmp_path / "tags",
                                               {BUFFER: tags_only})) as tags:
                await _scenario(db, up, down, tags)

    asyncio.run(main())


async def _scenario(db: SqliteSource, up: RunningRelay, down: RunningRelay,
                    tags: RunningRelay) -> None:
    db.txn(item(1, "a"), item(3, "c"), tag("x", 1))
    db.txn(item(666, "bad"), item(2, "b"), tag("y", 2))
    db.txn(item(4, "d"), tag("z", 3))
    await async_wait_until(lambda: _has_tag(down, "z"), "the chain copies tag z", 20,
                           max_interval=0.05)
    (q_up,) = await _quarantined(up)
    (q_down,) = await _quarantined(down)  # recorded from the marker in its window
    assert {k: q_down[k] for k in ("source", "scn", "reason", "fix")} == {
        "source": "shop.items", "scn": q_up["scn"], "reason": REASON, "fix": FIX}
    x = q_up["scn"]
    # A chained relay that does not copy the quarantined source: not its quarantine
    # (the marker is stored there, as every marker, and ignored).
    await async_wait_until(lambda: _has_tag(tags, "z"), "the tags-only chain copies z", 20,
                           max_interval=0.05)
    assert await _quarantined(tags) == []
    async with await tags.get("/readyz") as resp:
        assert resp.status == 200
    async with await down.get("/readyz") as resp:
        assert resp.status == 503
    # The chain's consumers: the same windows before X and the same error as upstream's.
    up_scns, up_status, up_error = await _poll_until_error(up, sources="shop.items")
    down_scns, down_status, down_error = await _poll_until_error(down, sources="shop.items")
    assert (down_scns, down_status, down_error) == (up_scns, up_status, up_error)
    assert down_status == 409 and all(s < x for s in down_scns)
    scns, status, _ = await _poll_until_error(down, sources="shop.tags")
    assert status == 200 and scns == (await _poll_until_error(up, sources="shop.tags"))[0]
    # Healed where the database is read, not here.
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    heal = "/v1/admin/sources/shop.items/heal"
    async with down.session.post(down.url + heal, headers=auth) as resp:
        assert (resp.status, (await resp.json())["error"]) == (409, "dump_unsupported")
    db.txn("DELETE FROM items WHERE id = 666", "DELETE FROM items WHERE id = 1",
           "UPDATE items SET name = 'c2' WHERE id = 3", item(5, "e"))
    async with up.session.post(up.url + heal, headers=auth) as resp:
        assert resp.status == 200, await resp.text()
        dump = (await resp.json())["dump"]["id"]
    await _wait_dump(up, dump)
    db.txn(item(7, "g"), tag("end", 9))  # after the dump: the chain has it all then
    await async_wait_until(lambda: _has_tag(down, "end"), "the chain copies tag end", 30,
                           max_interval=0.05)

    async def lifted() -> bool:
        return await _quarantined(down) == []

    await async_wait_until(lifted, "the chain lifts the quarantine", 20, max_interval=0.05)
    async with await down.get("/readyz") as resp:
        assert resp.status == 200, await resp.text()
    body = await _body(down, sources="shop.items")
    assert _replica(down, body, "shop.items", x) == {
        row["id"]: row["name"] for row in db.rows("items")}
