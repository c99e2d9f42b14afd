"""Relay chaining (DESIGN 15, issue 16 item 1): real relays fed by real relays.

The upstream is the cheapest source there is: the synthetic generator (two logical
sources, three events per window), or two independent relays over one SQLite database
with triggers (they serve the same windows byte for byte: same SCNs, timestamps and
ids), for failover. Chained relays run in this process (``running_relay``, each
fetcher in its own thread and event loop); upstreams that get ``kill -9`` run as
``databus relay`` processes (``RelayProcess``).
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from databus.event import decode_eow, decode_event, iter_events
from tests.relay_harness import (
    RelayProcess,
    RunningRelay,
    relay_config,
    running_relay,
    stream_body,
    stream_body_at,
)
from tests.unit.test_txlog_support import SqliteSource
from tests.waiting import async_wait_until

SOURCES = "shop.items,shop.orders"


def synthetic(limit: int, *, rate: int = 0, event_bytes: int = 300) -> str:
    return (f"synthetic://?rate={rate}&limit={limit}&events_per_window=3&keys=400"
            f"&event_bytes={event_bytes}&update_ratio=0.5&seed=16&source={SOURCES}")


def chained(*upstreams: str, sources: str = SOURCES, **params: str) -> str:
    hosts = ",".join(u.removeprefix("http://") for u in upstreams)
    query = urllib.parse.urlencode({"sources": sources, **params}, safe=",")
    return f"relay+http://{hosts}/?{query}"


def config(tmp: Path, name: str, buffers: dict[str, str], capacity_mb: int = 4) -> Any:
    return relay_config(tmp / name, buffers, capacity_mb=capacity_mb, workers=1)


async def wait_status(relay: RunningRelay, buffer: str, check: Any, timeout: float = 20) -> Any:
    async def matching() -> Any:
        doc = (await relay.json("/v1/status"))["buffers"][buffer]
        return doc if check(doc) else None

    return await async_wait_until(matching, f"buffer {buffer}'s status to match", timeout,
                                  max_interval=0.05)


async def read(session: aiohttp.ClientSession, url: str, checkpoint: str | None,
               *, max_bytes: int, requests: int | None = None,
               **params: str) -> tuple[bytes, str]:
    """Stream bytes from ``url`` after ``checkpoint``: ``requests`` responses, or until
    nothing is new; returns them and the checkpoint after them."""
    out, cp, n = b"", checkpoint, 0
    while requests is None or n < requests:
        query = {"max_bytes": str(max_bytes), **params}
        if cp is not None:
            query["checkpoint"] = cp
        async with session.get(url + "/v1/stream", params=query) as resp:
            assert resp.status == 200, await resp.text()
            chunk = await resp.read()
            new_cp = resp.headers["X-Databus-Checkpoint"]
        n += 1
        if not chunk:
            break
        out, cp = out + chunk, new_cp
    assert cp is not None
    return out, cp


def windows_of(body: bytes) -> list[int]:
    """The SCNs of the windows of a body, each once; checks that every window is whole."""
    scns: list[int] = []
    open_scn: int | None = None
    for _, header in iter_events(body):
        if open_scn is None:
            open_scn = header.scn
        assert header.scn == open_scn, "a window without its EOW"
        if header.is_eow:
            scns.append(header.scn)
            open_scn = None
    assert open_scn is None
    return scns


# -- byte identity -----------------------------------------------------------------------


@pytest.mark.parametrize("follow", ["true", "false"])
def test_windows_and_schemas_are_byte_identical(tmp_path: Path, follow: str) -> None:
    async def main() -> None:
        async with running_relay(config(tmp_path, "up", {"src": synthetic(200)})) as up:
            await up.wait_for_scn("src", 100)  # still writing while the copy starts
            down_config = config(tmp_path, "down", {"copy": chained(up.url, follow=follow)})
            async with running_relay(down_config) as down:
                await up.wait_for_scn("src", 200)
                await down.wait_for_scn("copy", 200)
                upstream, copy = await stream_body(up), await stream_body(down)
                assert copy == upstream  # every byte: events, EOWs, timestamps, ids
                assert windows_of(copy) == list(range(1, 201))
                # The schemas: same fingerprints, same versions, same current one.
                up_sources = (await up.json("/v1/sources"))["sources"]
                down_sources = (await down.json("/v1/sources"))["sources"]
                assert [(s["name"], s["id"], s["schema_fingerprint"], s["state"])
                        for s in down_sources] == [
                    (s["name"], s["id"], s["schema_fingerprint"], s["state"])
                    for s in up_sources]
                for name in SOURCES.split(","):
                    assert (await down.json("/v1/schemas", source=name)) == (
                        await up.json("/v1/schemas", source=name))
                    fp = next(s["schema_fingerprint"] for s in up_sources if s["name"] == name)
                    assert (await down.json(f"/v1/schemas/{fp}")) == (
                        await up.json(f"/v1/schemas/{fp}"))
                status = (await down.json("/v1/status"))["buffers"]["copy"]
                up_status = (await up.json("/v1/status"))["buffers"]["src"]
                assert status["prev_scn"] == up_status["prev_scn"]
                assert status["fetcher"]["state"] == "running"
                assert status["fetcher"]["restarts"] == 0
                assert status["fetcher"]["lag_scn"] == 0
                # It read the upstream as a consumer: streaming when asked to.
                consumers = [c for c in (await up.json("/v1/consumers"))["consumers"]
                             if c["client_id"].startswith("relay-chain:copy@")]
                assert [c["streaming"] for c in consumers] == [follow == "true"]
                assert consumers[0]["checkpoint_scn"] == 200

    asyncio.run(main())


def test_checkpoints_move_between_chained_relay_and_upstream(tmp_path: Path) -> None:
    """A consumer reads part of the stream from one relay, then goes on from the other
    with the same checkpoint (whole-window and mid-window ones), both ways: what it
    gets is the upstream's whole stream, no gap, no repeat."""

    async def main() -> None:
        async with running_relay(config(tmp_path, "up", {"src": synthetic(150)})) as up:
            down_config = config(tmp_path, "down", {"copy": chained(up.url)})
            async with running_relay(down_config) as down:
                await up.wait_for_scn("src", 150)
                await down.wait_for_scn("copy", 150)
                whole = await stream_body(up)
                session = up.session
                for first, second in ((up, down), (down, up)):
                    # 1000 bytes a response: responses end inside windows too.
                    for requests in (1, 7, 40):
                        part, cp = await read(session, first.url, None, max_bytes=1000,
                                              requests=requests)
                        rest, _ = await read(session, second.url, cp, max_bytes=1 << 20)
                        assert part + rest == whole, (first.url, requests, cp)
                # A checkpoint at every window boundary, from a consumer of the copy.
                body, cp = b"", None
                for _ in range(5):
                    part, cp = await read(session, down.url, cp, max_bytes=4000, requests=1)
                    body += part
                    rest, _ = await read(session, up.url, cp, max_bytes=1 << 20)
                    assert body + rest == whole

    asyncio.run(main())


def test_source_ids_are_remapped_by_name(tmp_path: Path) -> None:
    """A chained relay holding one of the upstream's two sources gives it its own id:
    every event keeps its bytes but the source id, with a valid header CRC."""

    async def main() -> None:
        async with running_relay(config(tmp_path, "up", {"src": synthetic(60)})) as up:
            down_config = config(tmp_path, "down", {"copy": chained(up.url,
                                                                    sources="shop.orders")})
            async with running_relay(down_config) as down:
                await up.wait_for_scn("src", 60)
                await down.wait_for_scn("copy", 60)
                up_ids = {s["name"]: s["id"] for s in (await up.json("/v1/sources"))["sources"]}
                down_ids = {s["name"]: s["id"]
                            for s in (await down.json("/v1/sources"))["sources"]}
                assert up_ids["shop.orders"] != down_ids["shop.orders"]  # 2 there, 1 here
                upstream = await stream_body(up)
                copy = await stream_body(down)
        want = [decode_event(upstream, off) for off, h in iter_events(upstream)
                if h.source_id == up_ids["shop.orders"]]
        got = [decode_event(copy, off) for off, h in iter_events(copy) if not h.is_control]
        assert len(got) == len(want) > 0
        for g, w in zip(got, want, strict=True):
            assert g.header.source_id == down_ids["shop.orders"]
            assert g.header._replace(source_id=0, header_crc=0) == w.header._replace(
                source_id=0, header_crc=0)
            assert (g.key_bytes, g.value) == (w.key_bytes, w.value)
        # Every window is there, with its EOW counting the events this relay holds.
        counts: dict[int, int] = {}
        for off, h in iter_events(copy):
            if h.is_eow:
                counts[h.scn] = decode_eow(decode_event(copy, off)).event_count
        assert sorted(counts) == list(range(1, 61))
        assert sum(counts.values()) == len(got)

    asyncio.run(main())


def test_a_filtered_chain_holds_one_partition(tmp_path: Path) -> None:
    """Two chained relays with mod filters 0 and 1 of 2 together hold every event of
    the upstream once, and each has every window (an EOW for each SCN)."""

    def mod(bucket: int) -> str:
        one = {"type": "mod", "n": 2, "buckets": f"[{bucket}]"}
        return json.dumps({"shop.orders": one, "shop.items": one})

    async def main() -> None:
        async with running_relay(config(tmp_path, "up", {"src": synthetic(80)})) as up:
            await up.wait_for_scn("src", 80)
            bodies = []
            for bucket in (0, 1):
                part_config = config(tmp_path, f"part{bucket}",
                                     {"part": chained(up.url, filter=mod(bucket))})
                async with running_relay(part_config) as part:
                    await part.wait_for_scn("part", 80)
                    bodies.append(await stream_body(part))
                    # What the partition serves is what the upstream serves with the
                    # same filter, event for event.
                    filtered, _ = await read(up.session, up.url, None, max_bytes=1 << 20,
                                             filter=mod(bucket))
                    assert [e for e in _data(bodies[-1])] == [e for e in _data(filtered)]
            whole = await stream_body(up)
        for body in bodies:
            assert windows_of(body) == list(range(1, 81))
        keys = [sorted(_data(b)) for b in bodies]
        assert not set(keys[0]) & set(keys[1])
        assert sorted(keys[0] + keys[1]) == sorted(_data(whole))
        for bucket, body in enumerate(bodies):
            assert all(abs(h.partition_key) % 2 == bucket
                       for _, h in iter_events(body) if not h.is_control)

    asyncio.run(main())


def _data(body: bytes) -> list[tuple[int, int, bytes]]:
    """(SCN, source id, bytes after the header CRC) of every data event."""
    return [(h.scn, h.source_id, body[off + 8:off + h.total_length])
            for off, h in iter_events(body) if not h.is_control]


# -- failures ----------------------------------------------------------------------------


def test_failover_between_two_upstreams(tmp_path: Path) -> None:
    """Two independent relays over one SQLite source serve the same windows; a relay
    chained from both (``relay+http://a,b/``) reads the first, which is killed (-9)
    while transactions go on; it goes on from the second: no gap, no repeat, and its
    stream is the second upstream's, byte for byte."""
    db = SqliteSource(tmp_path / "shop.db",
                      "CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL)")
    db.install("orders")
    source = db.uri("orders").replace("poll_ms=10", "poll_ms=20")
    (tmp_path / "a").mkdir()
    a = RelayProcess(tmp_path / "a", {"shop": source}, workers=1)
    a.start()

    def commit(n: int, start: int) -> None:
        for i in range(start, start + n):
            db.txn(f"INSERT INTO orders (id, tag) VALUES ({i}, 't{i}')",
                   f"INSERT INTO orders (id, tag) VALUES ({i + 100_000}, 'u{i}')")

    async def main() -> None:
        try:
            async with running_relay(config(tmp_path, "b", {"shop": source})) as b:
                name = (await b.json("/v1/sources"))["sources"][0]["name"]
                down_config = config(tmp_path, "down",
                                     {"copy": chained(a.url, b.url, sources=name)})
                async with running_relay(down_config) as down:
                    commit(20, 0)
                    scn_a = await _max_scn_holding(b, "shop", 20)
                    await down.wait_for_scn("copy", scn_a)
                    consumers_a = _consumers(a)
                    assert any(c.startswith("relay-chain:copy@") for c in consumers_a)
                    a.kill()  # kill -9 of the preferred upstream
                    commit(20, 20)
                    scn_b = await _max_scn_holding(b, "shop", 40)
                    assert scn_b > scn_a
                    await down.wait_for_scn("copy", scn_b)
                    copy, upstream_b = await stream_body(down), await stream_body(b)
                    assert copy == upstream_b
                    assert len(windows_of(copy)) == 40
                    status = (await down.json("/v1/status"))["buffers"]["copy"]
                    assert status["fetcher"]["state"] == "running"
        finally:
            if a.proc is not None and a.proc.poll() is None:
                a.kill()

    asyncio.run(main())
    db.close()


def _consumers(relay: RelayProcess) -> list[str]:
    import urllib.request

    with urllib.request.urlopen(relay.url + "/v1/consumers", timeout=5) as resp:
        return [c["client_id"] for c in json.loads(resp.read())["consumers"]]


async def _max_scn_holding(relay: RunningRelay, buffer: str, windows: int) -> int:
    """The buffer's max SCN once it holds ``windows`` windows (one per transaction the
    test committed). Not "once it stopped growing for a moment": on a busy machine the
    reader can pause longer than any such moment while transactions remain."""

    async def held() -> int | None:
        doc = (await relay.json("/v1/status"))["buffers"][buffer]
        return int(doc["max_scn"]) if (doc["windows"] or 0) >= windows else None

    return await async_wait_until(held, f"{windows} windows in buffer {buffer}", 30)


def test_upstream_killed_and_restarted(tmp_path: Path) -> None:
    """kill -9 of the upstream relay process while it writes and serves, then a restart
    on the same port and data dir: the chained relay reconnects (backoff) and goes on,
    no gap, no repeat, every window whole, byte-identical to the upstream."""
    up = RelayProcess(tmp_path, {"src": synthetic(900, rate=900)}, workers=1)
    up.start()

    async def main() -> None:
        try:
            down_config = config(tmp_path, "down", {"copy": chained(up.url)})
            async with running_relay(down_config) as down:
                await down.wait_for_scn("copy", 60)
                up.kill()  # in the middle of the stream: the upstream writes 300 windows/s
                killed_at = (await down.json("/v1/status"))["buffers"]["copy"]["max_scn"]
                assert killed_at < 900
                await asyncio.sleep(0.3)  # the chained relay retries meanwhile
                up.start()
                await down.wait_for_scn("copy", 900, timeout=30)
                copy = await stream_body(down)
                upstream = await stream_body_at(down.session, up.url)
                assert copy == upstream
                assert windows_of(copy) == list(range(1, 901))
                status = (await down.json("/v1/status"))["buffers"]["copy"]["fetcher"]
                # The puller reconnected by itself: the fetcher never failed.
                assert status["state"] == "running" and status["restarts"] == 0
        finally:
            if up.proc is not None and up.proc.poll() is None:
                up.kill()

    asyncio.run(main())


def test_fell_off_the_upstream(tmp_path: Path) -> None:
    """A chained relay stopped while its upstream went on and evicted the windows it
    needs next: restarted with that upstream alone, its fetcher fails with an error that
    names both SCNs; restarted with another upstream that still holds them listed
    after it, it goes on from that one.

    The source is a SQLite table the test writes to, so that the eviction happens at
    the test's pace (the relay that keeps everything is waited for after every batch),
    not at a rate a busy machine may not keep up with."""
    db = SqliteSource(tmp_path / "shop.db",
                      "CREATE TABLE orders (id INTEGER PRIMARY KEY, tag TEXT NOT NULL)")
    db.install("orders")
    pad = "x" * 900  # ~1 KB windows in a 1 MB upstream buffer: it holds about 1000

    def commit(start: int, n: int) -> None:
        for i in range(start, start + n):
            db.txn(f"INSERT INTO orders (id, tag) VALUES ({i}, '{pad}{i}')")

    async def main() -> None:
        up_config = config(tmp_path, "up", {"src": db.uri("orders")}, capacity_mb=1)
        async with running_relay(up_config) as up:
            name = (await up.json("/v1/sources"))["sources"][0]["name"]
            keep_config = config(tmp_path, "keep", {"all": chained(up.url, sources=name)},
                                 capacity_mb=8)
            down_config = config(tmp_path, "down", {"copy": chained(up.url, sources=name)},
                                 capacity_mb=8)
            async with running_relay(keep_config) as keep:
                async with running_relay(down_config) as down:
                    commit(0, 50)
                    await _max_scn_holding(down, "copy", 50)
                held = 50
                while True:
                    commit(held, 100)
                    held += 100
                    await _max_scn_holding(keep, "all", held)
                    status = (await up.json("/v1/status"))["buffers"]["src"]
                    if status["windows"] < held - 200:
                        break  # the windows right after the stopped copy are gone
                up_min = (await up.json("/v1/status"))["buffers"]["src"]["min_scn"]
                async with running_relay(down_config) as down:
                    doc = await wait_status(down, "copy",
                                            lambda d: d["fetcher"]["state"] == "failed")
                    down_max = doc["max_scn"]
                    assert down_max is not None and down_max < up_min
                    error = doc["fetcher"]["last_error"]
                    assert "UpstreamFellOffError" in error
                    assert f"after SCN {down_max}" in error
                    assert f"SCN {up_min}" in error
                    assert doc["max_scn"] == down_max  # nothing stored after the error
                # The same buffer, the relay that still holds everything listed second.
                retry_config = config(tmp_path, "down", {"copy": chained(
                    up.url, keep.url, sources=name)}, capacity_mb=8)
                keep_max = await _max_scn_holding(keep, "all", held)
                async with running_relay(retry_config) as down:
                    await down.wait_for_scn("copy", keep_max)
                    assert await stream_body(down) == await stream_body(keep)

    asyncio.run(main())
    db.close()


def test_a_window_cut_by_the_connection_is_read_again_whole(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Responses of 1 KB end inside the 3 KB windows; a TCP proxy in front of the
    upstream cuts every fifth response in its middle. The chained relay drops the
    window it was reading and reads it again from its start: whole windows, byte for
    byte the upstream's."""
    from aiohttp import web

    caplog.set_level("INFO", logger="databus.fetchers.relay")

    async def main() -> None:
        source = synthetic(40, event_bytes=1000)
        async with running_relay(config(tmp_path, "up", {"src": source})) as up:
            await up.wait_for_scn("src", 40)
            served = 0

            async def proxy(request: web.Request) -> web.StreamResponse:
                nonlocal served
                query = {k: v for k, v in request.query.items() if k != "follow"}
                async with up.session.get(up.url + request.path, params=query) as resp:
                    body = await resp.read()
                    headers = {k: v for k, v in resp.headers.items()
                               if k.lower().startswith("x-databus-")
                               and k.lower() != "x-databus-streaming"}
                    status = resp.status
                out = web.StreamResponse(status=status, headers=headers)
                out.content_length = len(body)
                out.content_type = "application/octet-stream"
                await out.prepare(request)
                cut = request.path == "/v1/stream" and len(body) > 200
                if cut:
                    served += 1
                if cut and served % 5 == 0:
                    await out.write(body[:len(body) // 2])
                    assert request.transport is not None
                    request.transport.close()
                    return out
                await out.write(body)
                await out.write_eof()
                return out

            app = web.Application()
            app.router.add_get("/{tail:.*}", proxy)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            proxy_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            try:
                down_config = config(tmp_path, "down", {"copy": chained(
                    proxy_url, max_bytes="1024", backoff_max_s="0.05", wait_ms="200")})
                async with running_relay(down_config) as down:
                    await down.wait_for_scn("copy", 40)
                    copy = await stream_body(down)
                    assert copy == await stream_body(up)
                    assert windows_of(copy) == list(range(1, 41))
            finally:
                await runner.cleanup()
        assert served >= 40  # each window took several responses
        assert sum("reading it again from its start" in r.getMessage()
                   for r in caplog.records) >= 5

    asyncio.run(main())
