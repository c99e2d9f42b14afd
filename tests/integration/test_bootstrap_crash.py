"""kill -9 of the producer or the applier mid-batch, then restart: the log holds every
relay window exactly once, in order, and the snapshot every key's newest row once."""

from __future__ import annotations

import json
import random
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.bootstrap._storage import BootstrapStorage, open_storage
from databus.event import decode_event, iter_events
from databus.filters import FilterSpec
from tests.integration.bootstrap_support import (
    BACKENDS,
    BootstrapProcess,
    drop_schema,
    storage_url,
)
from tests.relay_harness import RelayProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

LIMIT = 3000
SOURCE = ("synthetic://?rate=900&keys=400&event_bytes=150&events_per_window=3"
          f"&update_ratio=0.6&delete_ratio=0.1&limit={LIMIT}&source=shop.a,shop.b")

Change = tuple[str, Any, int, bytes]  # source, key, op, value


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = storage_url(request.param, tmp_path, request, span=500)
    yield url
    if request.param == "postgresql":
        drop_schema(request.getfixturevalue("postgres_server"), url)


def relay_windows(relay: RelayProcess) -> list[tuple[int, list[Change]]]:
    with urllib.request.urlopen(relay.url + "/v1/sources", timeout=5) as resp:
        names = {s["id"]: s["name"] for s in json.loads(resp.read())["sources"]}
    windows: list[tuple[int, list[Change]]] = []
    cp = json.dumps({"window_scn": 0})
    while True:
        query = urllib.parse.urlencode({"checkpoint": cp, "max_bytes": 1 << 20})
        with urllib.request.urlopen(f"{relay.url}/v1/stream?{query}", timeout=10) as resp:
            body = resp.read()
            cp = resp.headers["X-Databus-Checkpoint"]
        if not body:
            return windows
        for offset, header in iter_events(body):
            if header.is_control:
                continue
            event = decode_event(body, offset)
            if not windows or windows[-1][0] != header.scn:
                windows.append((header.scn, []))
            windows[-1][1].append((names[header.source_id], event.key, int(header.op),
                                   event.value))


def log_windows(store: BootstrapStorage) -> list[tuple[int, list[Change]]]:
    names = {sid: name for name, sid in store.source_ids().items()}
    rows = store.log_batch(sorted(names.values()), after_scn=-1, upto_scn=1 << 62,
                           limit=1 << 30, filter=FilterSpec())
    windows: list[tuple[int, list[Change]]] = []
    for row in rows:
        event = decode_event(row.event)
        if not windows or windows[-1][0] != row.scn:
            windows.append((row.scn, []))
        windows[-1][1].append((names[event.source_id], event.key, int(event.op), event.value))
    return windows


def kill_repeatedly(process: BootstrapProcess, rng: random.Random, store: BootstrapStorage,
                    times: int = 3) -> list[int | None]:
    """SIGKILL (no cleanup: whatever transaction was open is lost) after a random time,
    ``times`` times; the producer's SCN after each kill."""
    positions = []
    for _ in range(times):
        process.start()
        time.sleep(rng.uniform(0.3, 1.0))
        process.kill()
        positions.append(store.state().producer_scn)
    return positions


def test_producer_and_applier_killed_mid_batch_lose_and_repeat_nothing(
        store_url: str, tmp_path: Path) -> None:
    rng = random.Random(7)
    relay = RelayProcess(tmp_path, {"shop": SOURCE})
    relay.start()
    store = open_storage(store_url)
    producer = BootstrapProcess(tmp_path, store_url, relay.url, "producer")
    applier = BootstrapProcess(tmp_path, store_url, relay.url, "applier",
                               applier={"batch_rows": 40, "poll_interval_ms": 20})
    try:
        positions = kill_repeatedly(producer, rng, store)
        # The relay writes for about 10 s: the first kills land mid-stream.
        assert any(p is not None and 0 < p < LIMIT for p in positions), positions
        producer.start()
        # The applier is killed while the producer writes, then catches up.
        kill_repeatedly(applier, rng, store)
        applier.start()
        wait_until(lambda: store.state().producer_scn == LIMIT, "producer reached the end", 90)
        wait_until(lambda: store.state().applied_scn == LIMIT, "applier reached the end", 90)
        producer.kill()
        applier.kill()

        expected = relay_windows(relay)
        assert len(expected) == LIMIT
        assert log_windows(store) == expected  # every window once, in order, whole

        latest: dict[tuple[str, Any], tuple[int, int, bytes]] = {}
        for scn, changes in expected:
            for source, key, op, value in changes:
                latest[(source, key)] = (scn, op, value)
        snapshot: dict[tuple[str, Any], tuple[int, int, bytes]] = {}
        for source in store.source_ids():
            for row in store.snapshot_batch(source, after_key=None, since_scn=-1,
                                            limit=1 << 30, filter=FilterSpec()):
                event = decode_event(row.event)
                assert (source, event.key) not in snapshot
                snapshot[(source, event.key)] = (row.scn, row.op, event.value)
        assert snapshot == latest
        state = store.state()
        # Applier counters are committed with each batch: no batch was counted twice.
        assert state.applier_rows == sum(len(c) for _, c in expected)
    finally:
        producer.kill()
        applier.kill()
        relay.kill()
        store.close()
