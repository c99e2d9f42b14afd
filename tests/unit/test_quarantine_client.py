"""The client and a quarantined source (DESIGN 17, docs/client.md "Quarantined
sources"): a consumer of it gets every window before the quarantine SCN and nothing
after while it lasts, without failing (it retries with backoff, one log line, the
state in its metrics); after ``heal`` it gets the heal's dump and its copy converges.
A consumer of another source sees nothing change. Streaming and polling alike."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from databus._limited_log import forget_all
from databus.client import Consumer, DatabusClient, DataEvent
from databus.client._consumer import CallbackResult
from tests.quarantine_support import FIX, shop_source, use_poison_fetcher
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_quarantine_relay import TABLES, item, tag
from tests.unit.test_txlog_support import BUFFER
from tests.waiting import async_wait_until


class Copy(Consumer):
    """A consumer's copy of its sources: key -> name (items) or n (tags). At the end of
    a heal's dump, a row whose last change is older than the quarantine SCN was not
    brought by the dump: it was deleted while the source was quarantined, and is
    dropped (docs/client.md, "Quarantined sources")."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[Any, Any]] = {}
        self.last: dict[tuple[str, Any], int] = {}  # (source, key) -> SCN of its last change
        self.quarantine_scn: dict[str, int] = {}  # from the client's metrics
        self.scns: list[int] = []
        self.dumps: list[tuple[str, str]] = []
        self.errors: list[BaseException] = []

    def on_data_event(self, event: DataEvent) -> CallbackResult | None:
        rows = self.rows.setdefault(event.source, {})
        if event.is_delete:
            rows.pop(event.key, None)
        else:
            assert event.value is not None
            rows[event.key] = event.value.get("name", event.value.get("n"))
        self.last[(event.source, event.key)] = event.scn
        return None

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult | None:
        self.scns.append(scn)
        return None

    def on_dump_start(self, source: str) -> CallbackResult | None:
        self.dumps.append((source, "start"))
        return None

    def on_dump_end(self, source: str, outcome: str = "done") -> CallbackResult | None:
        self.dumps.append((source, outcome))
        x = self.quarantine_scn.get(source)
        if outcome == "done" and x is not None:
            rows = self.rows.setdefault(source, {})
            self.rows[source] = {k: v for k, v in rows.items()
                                 if self.last[(source, k)] >= x}
        return None

    def on_error(self, error: BaseException) -> CallbackResult | None:
        self.errors.append(error)
        return None


@pytest.mark.parametrize("streaming", [True, False], ids=["follow", "poll"])
def test_a_consumer_waits_out_the_quarantine_and_converges_after_heal(
        tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture,
        streaming: bool) -> None:
    use_poison_fetcher(monkeypatch)
    forget_all(flush=False)
    db = shop_source(tmp_path)

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: db.uri(TABLES)})) as r:
            clients: list[tuple[DatabusClient, Copy]] = []
            for sources in (["shop.items"], ["shop.tags"]):
                copy = Copy()
                client = DatabusClient([r.url], sources=sources, streaming=streaming,
                                       backoff_initial=0.02, backoff_max=0.2)
                client.register(copy)
                clients.append((client, copy))
            (items_client, items), (_, tags) = clients
            tasks = [asyncio.create_task(c.run_async()) for c, _ in clients]
            try:
                db.txn(item(1, "a"), item(3, "c"), tag("x", 1))
                db.txn(item(666, "bad"), item(2, "b"), tag("y", 2))
                db.txn(item(4, "d"), tag("z", 3))

                async def quarantined() -> bool:
                    return "shop.items" in items_client.metrics.quarantined

                await async_wait_until(quarantined, "the client sees the quarantine", 20,
                                       max_interval=0.05)
                await async_wait_until(lambda: _async(tags.rows.get("shop.tags", {})
                                                      .get("z") == 3), "tag z", 20,
                                       max_interval=0.05)
                x = r.relay.quarantines.active(BUFFER)["shop.items"].scn
                seen = items_client.metrics.quarantined["shop.items"]
                assert (seen["scn"], seen["fix"]) == (x, FIX)
                items.quarantine_scn["shop.items"] = x
                assert items_client.metrics.source_states["shop.items"] == "quarantined"
                await asyncio.sleep(0.5)  # a few retries: still nothing after X, no error
                assert items.rows["shop.items"] == {1: "a", 3: "c"}
                assert all(s < x for s in items.scns) and not items.errors
                assert items_client.metrics.failovers == 0  # a pause, not a relay failure
                lines = [rec for rec in caplog.records if "quarantined at the relay"
                         in rec.getMessage()]
                assert len(lines) == 1 and FIX in lines[0].getMessage()
                assert lines[0].levelno == logging.ERROR
                # Fixed, with changes missed meanwhile; then healed.
                db.txn("DELETE FROM items WHERE id = 666", "DELETE FROM items WHERE id = 1",
                       "UPDATE items SET name = 'c2' WHERE id = 3", item(5, "e"))
                await asyncio.to_thread(r.relay.heal, "shop.items")
                db.txn(item(7, "g"), tag("end", 9))

                async def converged() -> bool:
                    want = {row["id"]: row["name"] for row in db.rows("items")}
                    return items.rows.get("shop.items") == want and 7 in want

                try:
                    await async_wait_until(converged, "the copy equals the source", 30,
                                           max_interval=0.05)
                except AssertionError:
                    raise AssertionError(
                        f"copy {items.rows} dumps {items.dumps} source {db.rows('items')} "
                        f"metrics {items_client.metrics.quarantined} "
                        f"{items_client.metrics.source_states} dumps "
                        f"{r.relay.dumps.list_dumps()} status "
                        f"{r.relay.status()['buffers'][BUFFER]['fetcher']}") from None
                assert items.dumps == [("shop.items", "start"), ("shop.items", "done")]
                assert items_client.metrics.quarantined == {}
                assert items_client.metrics.source_states.get("shop.items") != "quarantined"
                assert not items.errors and not tags.errors
                assert tags.rows["shop.tags"] == {"x": 1, "y": 2, "z": 3, "end": 9}
                # Dump markers pass every filter (docs/dumps.md): no row of items.
                assert tags.rows.get("shop.items", {}) == {}
            finally:
                for client, _ in clients:
                    client.stop()
                await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


async def _async(value: bool) -> bool:
    return value
