"""databus._limited_log: repeated log lines become one line per interval with a count
(issue 27, item 12), on an injected clock."""

from __future__ import annotations

import logging
import threading

import pytest

from databus._limited_log import LimitedLog, limited


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logger(caplog: pytest.LogCaptureFixture) -> logging.Logger:
    caplog.set_level(logging.INFO, logger="test.limited")
    return logging.getLogger("test.limited")


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    out = [r.getMessage() for r in caplog.records if r.name == "test.limited"]
    caplog.clear()
    return out


def test_a_flood_is_one_line_per_interval_with_its_count(
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = LimitedLog(logger, interval_s=10, clock=clock)
    assert log.warning("window %d served again", 1) is True
    for i in range(2, 6_001):  # 6,000 in 6 s
        clock.now += 0.001
        assert log.warning("window %d served again", i) is False
    assert lines(caplog) == ["window 1 served again"]
    clock.now = 1010.0
    assert log.warning("window %d served again", 7_000) is True
    assert lines(caplog) == ["window 7000 served again (repeated 6,000 times in the last 10 s)"]
    assert log.suppressed == 5_999


def test_kinds_are_counted_apart(logger: logging.Logger,
                                 caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = LimitedLog(logger, interval_s=10, clock=clock)
    for _ in range(3):
        log.warning("buffer %s: bad body", "a", kind="a")
        log.warning("buffer %s: bad body", "b", kind="b")
        log.warning("other %s", "x")
    assert lines(caplog) == ["buffer a: bad body", "buffer b: bad body", "other x"]


def test_a_condition_that_stops_gets_its_count_later(
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = LimitedLog(logger, interval_s=10, clock=clock)
    for i in range(5):
        log.warning("retry %d", i)
    assert lines(caplog) == ["retry 0"]
    clock.now += 3
    log.warning("something else")
    assert lines(caplog) == ["something else"]  # retry's interval is not over yet
    clock.now += 8
    log.warning("something else")  # counted; retry's interval is over: its count goes out
    assert lines(caplog) == ["retry 4 (repeated 4 times in the last 11 s)"]
    clock.now += 1
    log.flush()
    assert lines(caplog) == ["something else (repeated once in the last 9 s)"]
    log.flush()
    assert lines(caplog) == []


def test_levels_args_with_percent_and_disabled_levels(
        logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = LimitedLog(logger, interval_s=1, clock=clock)
    log.error("%s at 100%%", "load")
    log.error("%s at 100%%", "load")
    clock.now += 1
    log.error("%s at 100%%", "load")
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.ERROR]
    assert lines(caplog) == ["load at 100%", "load at 100% (repeated 2 times in the last 1 s)"]
    logger.setLevel(logging.ERROR)
    try:
        assert log.warning("hidden") is False
        assert log.suppressed == 1  # only the error's repeat: a disabled level costs nothing
    finally:
        logger.setLevel(logging.NOTSET)


def test_kinds_are_bounded(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = LimitedLog(logger, interval_s=10, clock=clock, max_kinds=4)
    log.warning("k %s", 0, kind=0)
    log.warning("k %s", 0, kind=0)
    for k in range(1, 5):
        log.warning("k %s", k, kind=k)
    # The fifth kind pushed the first out, with its count.
    assert lines(caplog) == ["k 0", "k 1", "k 2", "k 3", "k 4",
                             "k 0 (repeated once in the last 0 s)"]
    assert len(log._kinds) == 4


def test_threads_lose_no_count(logger: logging.Logger,
                               caplog: pytest.LogCaptureFixture) -> None:
    log = LimitedLog(logger, interval_s=3600)

    def flood() -> None:
        for _ in range(2_000):
            log.warning("flood")

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.flush()
    out = lines(caplog)
    assert out[0] == "flood" and len(out) == 2
    assert out[1].startswith("flood (repeated 7,999 times")


def test_one_limiter_per_logger(logger: logging.Logger) -> None:
    assert limited(logger) is limited(logging.getLogger("test.limited"))
    assert limited(logger) is not limited(logging.getLogger("test.other"))


def test_a_bug_hit_by_every_request_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """The relay's and the bootstrap server's JSON error middleware: 200 requests that
    each hit the same bug answer 200 times 500 ``internal_error`` and log one line with
    its traceback (the count follows with the next line after the interval)."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from databus._http import STATS, HttpStats, json_errors

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    async def main() -> list[int]:
        app = web.Application(middlewares=[json_errors])
        app[STATS] = HttpStats()
        app.router.add_get("/broken", broken)
        async with TestClient(TestServer(app)) as client:
            statuses = []
            for _ in range(200):
                async with client.get("/broken") as resp:
                    assert (await resp.json())["error"] == "internal_error"
                    statuses.append(resp.status)
            return statuses

    caplog.set_level(logging.WARNING, logger="databus.http")
    assert asyncio.run(main()) == [500] * 200
    lines = [r for r in caplog.records if "unhandled error serving" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is not None
    assert limited(logging.getLogger("databus.http")).suppressed == 199
