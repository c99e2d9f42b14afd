"""Shared by the streaming source's tests: an in-process relay on a SQLite TxLog source,
run on a thread of its own (Spark's calls block the test's thread), and a query runner
that collects every micro-batch's rows through ``foreachBatch``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tests.relay_harness import RunningRelay
from tests.unit.test_txlog_support import BUFFER, CapturedWindow, SqliteSource, relay_windows

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession

T = TypeVar("T")


class ServerThread:
    """An async context manager (``running_relay(...)``, a hostile server) entered on a
    loop in a thread of its own; ``value`` is what it yields."""

    def __init__(self, context: AbstractAsyncContextManager[Any]) -> None:
        self.context = context
        self.loop = asyncio.new_event_loop()
        self.value: Any = None
        self._done: asyncio.Event | None = None
        self._ready: Future[None] = Future()
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._done = asyncio.Event()
        try:
            async with self.context as value:
                self.value = value
                self._ready.set_result(None)
                await self._done.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    def __enter__(self) -> ServerThread:
        self.thread.start()
        self._ready.result(30)
        return self

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __exit__(self, *exc: object) -> None:
        done = self._done
        if done is not None:
            self.loop.call_soon_threadsafe(done.set)
        self.thread.join(30)


# The shop source of the streaming source's tests: ``items`` and ``tags`` captured by
# triggers (tests/unit/test_txlog_support.py).
SHOP_DDL = ("CREATE TABLE items (id INTEGER PRIMARY KEY, sku TEXT, qty INTEGER)",
            "CREATE TABLE tags (name TEXT PRIMARY KEY, n INTEGER)")


def shop_source(tmp_path: Path) -> SqliteSource:
    """The shop source in ``tmp_path``, both tables captured."""
    source = SqliteSource(tmp_path / "shop.db", *SHOP_DDL)
    source.install("items,tags")
    return source


def captured(relay: ServerThread, checkpoint: str | None = None) -> list[CapturedWindow]:
    r: RunningRelay = relay.value
    return relay.call(relay_windows(r, checkpoint))


def newest_scn(relay: ServerThread) -> int | None:
    r: RunningRelay = relay.value
    doc = relay.call(r.json("/v1/status"))
    scn = doc["buffers"][BUFFER]["max_scn"]
    return int(scn) if scn is not None else None


def run_query(spark: SparkSession, checkpoint: Path, options: dict[str, object],
              progress: list[dict[str, Any]] | None = None) -> list[Row]:
    """Run a ``databus`` query until it has read everything available, then stop it;
    the rows of every micro-batch, in batch order (``progress``: gets the query's
    progress reports)."""
    got: list[Row] = []

    def batch(df: Any, batch_id: int) -> None:
        got.extend(df.collect())

    reader = spark.readStream.format("databus")
    for name, value in options.items():
        reader = reader.option(name, str(value))
    query = (reader.load().writeStream.option("checkpointLocation", str(checkpoint))
             .foreachBatch(batch).trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
        if progress is not None:
            progress.extend(query.recentProgress)
    finally:
        query.stop()
    return got
