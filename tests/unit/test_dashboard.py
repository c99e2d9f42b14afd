"""``databus dashboard``'s pure parts and its server on stubbed samples: the history
ring, the JSON endpoints, the long poll, the static files and the headers. The page
itself runs in a browser against real processes in
tests/integration/test_dashboard_browser.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from databus._json import dumps as dumps_json
from databus.cli import build_parser, main
from databus.dashboard._history import History, samples, series_key
from databus.dashboard._server import Sampler, make_app


def document(t: float, *, lag: float | None = 1.5, consumer: str = "app-1",
             max_scn: int = 10) -> dict[str, Any]:
    return {
        "version": 1, "generated_at": t, "ok": True, "down": 0, "ready": True,
        "not_ready": 0,
        "relays": [
            {"url": "http://r1:11190", "buffers": [
                {"name": "src", "max_scn": max_scn, "input_bytes_per_second": 100.0,
                 "fetcher": {"lag_seconds": lag}}],
             "consumers": [{"client_id": consumer, "buffer": "src", "lag_seconds": 0.5,
                            "events_per_second": 3, "checkpoint_scn": 9}]},
            {"url": "http://r2:11190", "error": "cannot connect"},
        ],
        "bootstraps": [{"url": "http://b1:11191", "applier_lag_seconds": 2.0}],
        "replicators": [{"url": "http://p1:9000", "lag_seconds": float("nan")}],
        "groups": [{"group": "g", "members": [{"member": "m1", "lag_seconds": 4}]},
                   {"group": "locked", "error": "not authorized"}],
    }


# -- the history ------------------------------------------------------------------------


def test_series_keys_are_what_the_page_computes() -> None:
    # JSON.stringify(["buffer", "http://r1:11190", "src", "lag_seconds"]) in the page.
    assert series_key("buffer", "http://r1:11190", "src", "lag_seconds") == \
        '["buffer","http://r1:11190","src","lag_seconds"]'
    assert series_key("consumer", "u", "é", None, "x") == '["consumer","u","é","None","x"]'
    got = dict(samples(document(100.0)))
    assert got == {
        series_key("buffer", "http://r1:11190", "src", "input_bytes_per_second"): 100.0,
        series_key("buffer", "http://r1:11190", "src", "lag_seconds"): 1.5,
        series_key("buffer", "http://r1:11190", "src", "max_scn"): 10.0,
        series_key("consumer", "http://r1:11190", "app-1", "src", "lag_seconds"): 0.5,
        series_key("consumer", "http://r1:11190", "app-1", "src", "events_per_second"): 3.0,
        series_key("consumer", "http://r1:11190", "app-1", "src", "checkpoint_scn"): 9.0,
        series_key("bootstrap", "http://b1:11191", "applier_lag_seconds"): 2.0,
        # NaN is unknown: a gap, never a number the line would draw
        series_key("replicator", "http://p1:9000", "lag_seconds"): None,
        series_key("group", "g", "m1", "lag_seconds"): 4.0,
    }


def test_history_keeps_the_window_and_answers_what_is_new() -> None:
    history = History(window_s=10, max_points=100)
    for t in range(0, 30):
        history.add(document(1000.0 + t, lag=None if t == 25 else float(t)))
    lag = series_key("buffer", "http://r1:11190", "src", "lag_seconds")
    points = history.since(0)["series"][lag]
    assert [p[0] for p in points] == [1000.0 + t for t in range(19, 30)]  # 10 s back
    assert points[6] == [1025.0, None]  # unknown then: kept as a gap
    assert history.since(1027.0)["series"][lag] == [[1028.0, 28.0], [1029.0, 29.0]]
    assert history.since(1029.0)["series"] == {}  # nothing newer
    assert history.since(0)["window_s"] == 10


def test_history_drops_series_that_stopped_and_bounds_their_number() -> None:
    history = History(window_s=5, max_points=3, max_series=12)
    history.add(document(100.0, consumer="gone"))
    for t in range(1, 8):
        history.add(document(100.0 + t, consumer="stays"))
    keys = set(history.since(0)["series"])
    assert not any('"gone"' in k for k in keys)  # no point left in the window
    assert any('"stays"' in k for k in keys)
    # max_points: the newest 3 of each series
    lag = series_key("buffer", "http://r1:11190", "src", "lag_seconds")
    assert [p[0] for p in history.since(0)["series"][lag]] == [105.0, 106.0, 107.0]
    # max_series: the least recently updated go first
    history.add(document(108.0, consumer="new-one"))
    assert len(history) <= 12
    assert any('"new-one"' in k for k in history.since(0)["series"])


def test_history_replaces_a_repeated_sample_and_restarts_when_the_clock_goes_back() -> None:
    history = History(window_s=60)
    history.add(document(50.0, max_scn=1))
    history.add(document(50.0, max_scn=2))
    scn = series_key("buffer", "http://r1:11190", "src", "max_scn")
    assert history.since(0)["series"][scn] == [[50.0, 2.0]]
    history.add(document(40.0, max_scn=3))
    assert history.since(0)["series"][scn] == [[40.0, 3.0]]
    history.add({"generated_at": "soon"})  # not a sample: ignored
    with pytest.raises(ValueError):
        History(window_s=0)


# -- the server -------------------------------------------------------------------------


def serve(sampler: Sampler, check: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def main_() -> None:
        async with TestClient(TestServer(make_app(sampler, run_sampler=False))) as client:
            await check(client)

    asyncio.run(main_())


def counting_sampler(interval_s: float = 0.2) -> tuple[Sampler, list[int]]:
    calls = [0]

    async def collect() -> dict[str, Any]:
        calls[0] += 1
        return document(1000.0 + calls[0], max_scn=calls[0])

    return Sampler(collect, interval_s=interval_s, timeout_s=0.5), calls


def test_the_json_endpoints_serve_the_newest_document_and_the_history() -> None:
    sampler, _calls = counting_sampler()

    async def check(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/v1/status")
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert (await client.get("/healthz")).status == 503
        for _ in range(3):
            await sampler.sample()
        resp = await client.get("/v1/status")
        assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
        status = await resp.json()
        # what `databus status --json` prints of the same document
        assert status == json.loads(dumps_json(sampler.latest))
        assert status["generated_at"] == 1003.0
        resp = await client.get("/v1/dashboard", params={"since": "1001.5"})
        body = await resp.json()
        assert body["status"] == status and body["interval_s"] == 0.2
        scn = series_key("buffer", "http://r1:11190", "src", "max_scn")
        assert body["history"]["series"][scn] == [[1002.0, 2.0], [1003.0, 3.0]]
        health = await (await client.get("/healthz")).json()
        assert health["ok"] is True and health["sample_age_s"] < 5
        assert (await client.get("/v1/dashboard", params={"since": "x"})).status == 400
        assert (await client.get("/v1/dashboard", params={"after": "nan"})).status == 400

    serve(sampler, check)


def test_the_long_poll_answers_as_soon_as_a_newer_sample_is_taken() -> None:
    sampler, _calls = counting_sampler(interval_s=5.0)

    async def check(client: TestClient[Any, Any]) -> None:
        await sampler.sample()
        waiting = asyncio.ensure_future(client.get("/v1/dashboard",
                                                   params={"after": "1001"}))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # nothing newer than 1001 yet: it waits
        loop = asyncio.get_running_loop()
        took = loop.time()
        await sampler.sample()
        body = await (await waiting).json()
        assert body["status"]["generated_at"] == 1002.0
        assert loop.time() - took < 2.5  # woken by the sample, not by the 10 s wait
        # already newer: at once
        body = await (await client.get("/v1/dashboard", params={"after": "0"})).json()
        assert body["status"]["generated_at"] == 1002.0

    serve(sampler, check)


def test_the_page_and_its_assets_and_nothing_else() -> None:
    sampler, _ = counting_sampler()

    async def check(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/")
        page = await resp.text()
        assert resp.status == 200 and resp.content_type == "text/html"
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
        assert resp.headers["X-Frame-Options"] == "DENY"
        assert '<script src="/static/dashboard.js"></script>' in page
        for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css"),
                           ("index.html", "text/html")):
            resp = await client.get(f"/static/{name}")
            assert resp.status == 200 and resp.content_type == kind, name
            text = await resp.text()
            assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and \
                "https://" not in text, f"{name} fetches nothing from elsewhere"
        for bad in ("/static/..%2f_cli.py", "/static/_cli.py", "/static/.hidden.js",
                    "/static/nothing.js", "/static/%2e%2e%2fdashboard%2f_server.py"):
            assert (await client.get(bad)).status == 404, bad

    serve(sampler, check)


def test_a_failed_sample_is_logged_and_the_sampler_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    attempts = [0]

    async def collect() -> dict[str, Any]:
        attempts[0] += 1
        if attempts[0] == 1:
            raise RuntimeError("boom with pa55word-xyz")
        return document(2000.0 + attempts[0])

    from databus._redact import register_secret

    register_secret("pa55word-xyz")
    sampler = Sampler(collect, interval_s=0.05)

    async def main_() -> None:
        task = asyncio.create_task(sampler.run())
        while sampler.latest is None:
            await asyncio.sleep(0.02)
        task.cancel()

    asyncio.run(main_())
    assert attempts[0] >= 2
    assert "sampling failed: RuntimeError: boom" in caplog.text
    assert "pa55word-xyz" not in caplog.text


def test_the_command_checks_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard"]) == 1
    assert "name at least one service" in capsys.readouterr().err
    assert main(["dashboard", "--relay", "ftp://x"]) == 1
    assert main(["dashboard", "--relay", "http://x", "--interval", "0"]) == 1
    assert main(["dashboard", "--relay", "http://x", "--history", "5"]) == 1
    args = build_parser().parse_args(["dashboard", "--relay", "http://r:1"])
    assert (args.host, args.port, args.interval, args.zookeeper) == ("127.0.0.1", 11195,
                                                                     1.0, None)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dashboard", "--zookeeper", "ops:secret99@zk:2181"])
    assert "secret99" not in capsys.readouterr().err
