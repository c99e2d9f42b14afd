"""The bootstrap producer and a quarantined source (DESIGN 17): it reads the relay with
``quarantine=pass``, so a quarantined source stops none of its copying: its log goes
on to the relay's newest window (the other sources' changes stored), and the heal's
dump lands in it like any window."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.integration.bootstrap_support import BootstrapProcess
from tests.quarantine_support import shop_source, use_poison_fetcher
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_quarantine_relay import TABLES, _quarantined, _wait_dump, item, tag
from tests.unit.test_txlog_support import BUFFER
from tests.waiting import async_wait_until


def test_the_bootstrap_producer_goes_on_past_a_quarantine(tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    use_poison_fetcher(monkeypatch)
    db = shop_source(tmp_path)

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: db.uri(TABLES)})) as r:
            producer = BootstrapProcess(tmp_path, f"sqlite:///{tmp_path / 'boot.db'}",
                                        r.url, "producer")
            await asyncio.to_thread(producer.start)
            try:
                db.txn(item(1, "a"), tag("x", 1))
                db.txn(item(666, "bad"), tag("y", 2))
                db.txn(tag("z", 3))
                await async_wait_until(lambda: _has_quarantine(r), "quarantined", 20,
                                       max_interval=0.05)

                async def stored_all() -> bool:
                    newest = (await r.json("/v1/status"))["buffers"][BUFFER]["max_scn"]
                    scn = (await asyncio.to_thread(producer.status))["producer_scn"]
                    return scn is not None and newest is not None and scn >= newest

                await async_wait_until(stored_all, "the producer stores every window", 20,
                                       max_interval=0.1)
                x = r.relay.quarantines.active(BUFFER)["shop.items"].scn
                assert (await r.json("/v1/status"))["buffers"][BUFFER]["max_scn"] > x
                healed = await asyncio.to_thread(r.relay.heal, "shop.items")
                await _wait_dump(r, healed["dump"]["id"])
                db.txn(tag("end", 4))
                await async_wait_until(stored_all, "the producer stores the heal", 20,
                                       max_interval=0.1)
            finally:
                await asyncio.to_thread(producer.kill)

    asyncio.run(main())


async def _has_quarantine(r: Any) -> bool:
    return bool(await _quarantined(r))
