"""Per-source quarantine on a relay with a real source (SQLite TxLog, DESIGN 17): the
other tables keep flowing, the quarantine is visible (/v1/sources, /v1/status,
/readyz, /metrics) and survives a restart; "stop" fails the fetcher instead."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from databus.errors import NotLeaderError
from databus.event import (
    DUMP_END_SOURCE_ID,
    ERROR_SOURCE_ID,
    QUARANTINE_SOURCE_ID,
    decode_event,
    iter_events,
)
from databus.relay._fetcher_host import FetcherHost
from databus.schemas import AvroCodec
from tests.quarantine_support import FIX, REASON, TABLES, shop_source, use_poison_fetcher
from tests.relay_harness import (
    ADMIN_TOKEN,
    RunningRelay,
    relay_config,
    running_relay,
    stream_all,
    stream_bytes,
)
from tests.unit.test_txlog_support import BUFFER, SqliteSource
from tests.waiting import async_wait_until


def item(key: int, name: str) -> str:
    return f"INSERT INTO items (id, name) VALUES ({key}, '{name}')"


def tag(word: str, n: int) -> str:
    return f"INSERT INTO tags (word, n) VALUES ('{word}', {n})"


def _source(tmp_path: Path) -> SqliteSource:
    return shop_source(tmp_path, dumpable=False)


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
                return "z" in (await _names_in_stream(r, quarantine="pass")).get("shop.tags", [])

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
            # No watermark table (databus dump setup): the heal's dump could not run, so
            # nothing is lifted.
            async with r.session.post(r.url + "/v1/admin/sources/shop.items/heal",
                                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
                                      ) as resp:
                assert resp.status == 409
                doc = await resp.json()
            assert doc["error"] == "dump_setup" and "databus dump setup" in doc["message"]
            assert [q["source"] for q in await _quarantined(r)] == ["shop.items"]

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


# -- the in-band error, and healing ----------------------------------------------------


async def _poll_until_error(r: RunningRelay, **params: Any
                            ) -> tuple[list[int], int, dict[str, Any] | None]:
    """Poll from the start until an error or nothing new: (window SCNs served, the last
    status, its JSON error)."""
    scns: list[int] = []
    cp: str | None = None
    while True:
        query = dict(params)
        if cp is not None:
            query["checkpoint"] = cp
        async with await r.get("/v1/stream", **query) as resp:
            if resp.status != 200:
                return scns, resp.status, await resp.json()
            body = await resp.read()
            cp = resp.headers["X-Databus-Checkpoint"]
        if not body:
            return scns, 200, None
        scns += [h.scn for _, h in iter_events(body) if h.is_eow]


async def _follow_until_end(r: RunningRelay, **params: Any
                            ) -> tuple[list[int], dict[str, Any] | None]:
    """A streaming subscription from the start, read until the relay ends it (or 3 s of
    nothing but heartbeats): (window SCNs served, the in-band error)."""
    body = b""
    async with await r.get("/v1/stream", follow="true", heartbeat_ms="100", **params) as resp:
        assert resp.status == 200
        try:
            async with asyncio.timeout(3):
                async for chunk in resp.content.iter_any():
                    body += chunk
        except TimeoutError:
            pass
    scns, error = [], None
    for offset, header in iter_events(body):
        if header.is_eow:
            scns.append(header.scn)
        elif header.source_id == ERROR_SOURCE_ID:
            error = json.loads(bytes(decode_event(body, offset).value))
    return scns, error


def _markers(body: bytes) -> list[tuple[int, dict[str, Any]]]:
    return [(h.scn, json.loads(bytes(decode_event(body, off).value)))
            for off, h in iter_events(body) if h.source_id == QUARANTINE_SOURCE_ID]


def test_subscribers_of_the_source_get_the_error_at_its_scn_then_heal_converges(
        tmp_path: Path, monkeypatch: Any) -> None:
    use_poison_fetcher(monkeypatch)
    db = shop_source(tmp_path)
    config = relay_config(tmp_path, {BUFFER: db.uri(TABLES)})

    async def main() -> None:
        async with running_relay(config) as r:
            db.txn(item(1, "a"), item(3, "c"), tag("x", 1))
            db.txn(item(666, "bad"), item(2, "b"), tag("y", 2))
            db.txn(item(4, "d"), tag("z", 3))
            await async_wait_until(lambda: _has_tag(r, "z"), "tag z", 20, max_interval=0.05)
            (q,) = await _quarantined(r)
            x = q["scn"]
            body = await _body(r, quarantine="pass")
            assert [m for _, m in _markers(body)] == [{
                "fix": FIX, "reason": REASON, "scn": x, "source": "shop.items",
                "state": "quarantined"}]
            assert _markers(body)[0][0] == x  # in the window where it was met
            everything = [h.scn for _, h in iter_events(body) if h.is_eow]
            before = [s for s in everything if s < x]
            for params in ({"sources": "shop.items"}, {}, {"sources": "shop.items,shop.tags"}):
                scns, status, error = await _poll_until_error(r, **params)
                assert (scns, status) == (before, 409), params
                assert error is not None and error["error"] == "source_quarantined"
                assert (error["source"], error["scn"], error["fix"]) == ("shop.items", x, FIX)
                streamed, in_band = await _follow_until_end(r, **params)
                assert streamed == before and in_band == error, params
            # Consumers of the other table: nothing changes.
            scns, status, error = await _poll_until_error(r, sources="shop.tags")
            assert status == 200 and error is None and scns[-1] == everything[-1]
            streamed, in_band = await _follow_until_end(r, sources="shop.tags")
            assert in_band is None and streamed == scns
            # The relay's own readers pass (chained relays, the bootstrap producer).
            scns, status, _ = await _poll_until_error(r, quarantine="pass")
            assert status == 200 and scns == everything
            # Admin errors of the heal endpoint.
            heal = r.url + "/v1/admin/sources/{}/heal"
            auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with r.session.post(heal.format("shop.items")) as resp:
                assert resp.status == 401
                assert (await resp.json())["error"] == "unauthorized"
            async with r.session.post(heal.format("shop.nothing"), headers=auth) as resp:
                assert (resp.status, (await resp.json())["error"]) == (404, "unknown_source")
            async with r.session.post(heal.format("shop.tags"), headers=auth) as resp:
                assert (resp.status, (await resp.json())["error"]) == (409, "not_quarantined")
            async with await r.get("/readyz") as resp:
                assert resp.status == 503
            # A cluster member that does not lead the buffer refuses (its followers copy
            # the leader's windows: a dump of its own would make them differ).
            r.relay.cluster = _Follower()  # type: ignore[assignment]
            try:
                with pytest.raises(NotLeaderError, match="heal at its leader"):
                    r.relay.heal("shop.items")
            finally:
                r.relay.cluster = None
            # The operator fixes the cause (row 666 goes) while more changes are missed,
            # then heals: the consumer's copy converges through the heal's dump.
            db.txn("DELETE FROM items WHERE id = 666", "DELETE FROM items WHERE id = 1",
                   "UPDATE items SET name = 'c2' WHERE id = 3", item(5, "e"))
            async with r.session.post(heal.format("shop.items"), headers=auth) as resp:
                assert resp.status == 200, await resp.text()
                healed = await resp.json()
            assert healed["healed"] and healed["quarantined_scn"] == x
            assert healed["dump"]["reason"] == "heal"
            await _wait_dump(r, healed["dump"]["id"])
            assert await _quarantined(r) == []
            async with await r.get("/readyz") as resp:
                assert resp.status == 200, await resp.text()
            db.txn(item(7, "g"), tag("end", 9))
            await async_wait_until(lambda: _has_tag(r, "end"), "tag end", 20,
                                   max_interval=0.05)
            # After the heal the subscriber goes on past X and ends with the source's rows.
            scns, status, error = await _poll_until_error(r, sources="shop.items")
            assert status == 200 and error is None and scns[-1] > x
            body = await _body(r)  # no quarantine left: no stop
            assert ("shop.items", "healed") in [(m["source"], m["state"])
                                               for _, m in _markers(body)]
            replica = _replica(r, body, "shop.items", x)
            assert replica == {row["id"]: row["name"] for row in db.rows("items")}

    asyncio.run(main())


class _Follower:
    def buffer_status(self, buffer: str) -> dict[str, Any]:
        return {"role": "follower", "leader": "http://leader:11190"}


async def _body(r: RunningRelay, **params: Any) -> bytes:
    return (await stream_bytes(r, **params))[0]


async def _has_tag(r: RunningRelay, word: str) -> bool:
    return word in (await _names_in_stream(r, quarantine="pass")).get("shop.tags", [])


async def _wait_dump(r: RunningRelay, dump_id: str) -> None:
    async def done() -> bool:
        return bool(r.relay.dumps.get(dump_id)["state"] == "done")

    await async_wait_until(done, f"dump {dump_id} done", 30, max_interval=0.05)


def _replica(r: RunningRelay, body: bytes, source: str, x: int) -> dict[Any, Any]:
    """``source``'s rows as a consumer applying the stream keeps them. At the end of a
    dump of it, a row whose last change is older than the quarantine SCN ``x`` was not
    brought by the dump: deleted while quarantined, it is dropped (docs/client.md,
    "Quarantined sources")."""
    names = {s.id: s.name for s in r.relay.catalog.sources()}
    codec = AvroCodec(r.relay.catalog.registry)
    rows: dict[Any, Any] = {}
    last: dict[Any, int] = {}
    for offset, header in iter_events(body):
        event = decode_event(body, offset)
        if header.source_id == DUMP_END_SOURCE_ID:
            if json.loads(bytes(event.value))["source"] == source:
                rows = {k: v for k, v in rows.items() if last[k] >= x}
            continue
        if header.source_id < 0 or names[header.source_id] != source:
            continue
        last[event.key] = header.scn
        if header.op == 2:
            rows.pop(event.key, None)
        else:
            rows[event.key] = codec.decode(event.value, header.schema_fingerprint)["name"]
    return rows


def test_a_heal_cut_short_by_a_crash_is_finished_at_start(tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    """The heal marked the record healing, then the relay died before it recorded its
    dump: the restarted relay dumps the source and drops the record."""
    use_poison_fetcher(monkeypatch)
    db = shop_source(tmp_path)
    db.txn(item(1, "a"), item(2, "b"), tag("x", 1))
    config = relay_config(tmp_path, {BUFFER: db.uri(TABLES)})
    config.data_dir.mkdir(parents=True)
    (config.data_dir / "quarantine.json").write_text(json.dumps({"version": 1, "quarantined": [
        {"buffer": BUFFER, "source": "shop.items", "scn": 1, "reason": REASON, "fix": FIX,
         "since": 0.0, "marker_scn": 1, "healing": True}]}))

    async def main() -> None:
        async with running_relay(config) as r:
            assert await _quarantined(r) == []  # lifted: captured, served
            (dump,) = r.relay.dumps.list_dumps()
            assert (dump["reason"], dump["sources"]) == ("heal", ["shop.items"])
            await _wait_dump(r, dump["id"])
            body = await _body(r, sources="shop.items")
            assert _replica(r, body, "shop.items", 1) == {1: "a", 2: "b"}
            # Its heal marker too (a chained relay lifts the quarantine by it); then the
            # record goes.
            assert [m for _, m in _markers(body)] == [{"source": "shop.items",
                                                       "state": "healed"}]
            assert r.relay.quarantines.healing() == []

    asyncio.run(main())
