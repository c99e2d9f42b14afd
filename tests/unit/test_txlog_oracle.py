"""The Oracle fetcher without a driver: it says so plainly and is not retried.

No Oracle server or driver exists here; its SQL is tested as text in
``test_txlog_sql.py``. These tests pin what a relay configured with an Oracle source
does instead of pretending to work.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path

import pytest

from databus.fetchers._api import FetcherContext
from databus.fetchers.txlog import OracleTxlogFetcher
from databus.fetchers.txlog._errors import DriverMissingError
from databus.relay._buffer import EventBuffer
from databus.relay._catalog import RelayCatalog
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_txlog_support import BUFFER, wait_status

URI = "oracle+txlog://shop:pw@db.example:1521/ORCL?tables=ORDERS"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("oracledb") is not None,
                                reason="oracledb is installed: these test its absence")


def test_run_raises_a_non_retriable_driver_error(tmp_path: Path) -> None:
    catalog = RelayCatalog(tmp_path / "c.json")
    fetcher = OracleTxlogFetcher(URI, FetcherContext(BUFFER, 0, catalog.for_buffer(BUFFER, 0)))
    with EventBuffer(tmp_path / "b.buf", 1 << 16) as buffer, \
            pytest.raises(DriverMissingError) as info:
        fetcher.run(buffer, 0, threading.Event())
    assert info.value.retriable is False
    assert "pip install oracledb" in info.value.message
    assert "never run against a live Oracle" in info.value.message
    with pytest.raises(DriverMissingError):
        fetcher.initial_scn()


def test_a_relay_marks_the_oracle_fetcher_failed_with_the_reason(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: URI})) as r:
            doc = await wait_status(r, lambda s: s["fetcher"]["state"] == "failed",
                                    what="failed")
            assert doc["fetcher"]["restarts"] == 0
            assert doc["fetcher"]["last_error"].startswith("DriverMissingError: the Oracle")
            assert "pw@" not in doc["fetcher"]["source"]

    asyncio.run(scenario())
