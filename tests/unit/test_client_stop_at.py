"""``DatabusClient(stop_at_scn=N)``: a bounded read that ends on its own once the
client's position reaches window N, also when window N (or the windows before it) had
no event passing the filter: the relay still sends their ends, and the checkpoint moves
past them (the Spark source's input partitions read so)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from databus.checkpoint import Checkpoint
from databus.client import DatabusClient, MemoryCheckpointStore
from tests.relay_harness import relay_config, running_relay, stream_all

pytestmark = pytest.mark.twin("databus.batch")

LIMIT = 30
SOURCE = f"synthetic://?rate=0&keys=50&event_bytes=200&events_per_window=3&limit={LIMIT}&seed=5"
N = 4  # mod buckets


def _bucket(key: object) -> int:
    assert isinstance(key, int)
    return abs(key) % N


async def _read(url: str, store: MemoryCheckpointStore, stop: int, bucket: int
                ) -> dict[int, list[object]]:
    client = DatabusClient([url], sources=["synthetic.events"], checkpoint_store=store,
                           filter={"synthetic.events": {"type": "mod", "n": N,
                                                        "buckets": [bucket]}},
                           stop_at_scn=stop, poll_wait_ms=200, backoff_initial=0.02)
    got: dict[int, list[object]] = {}

    async def consume() -> None:
        async with contextlib.aclosing(client.windows()) as windows:
            async for window in windows:
                got[window.scn] = [e.key for e in window.events]

    await asyncio.wait_for(consume(), 30)  # ends on its own: no stop() anywhere
    return got


def test_stop_at_scn_ends_the_read_at_that_window_with_a_filter(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            await r.wait_for_scn("load", LIMIT)
            windows, _ = await stream_all(r)
            per_bucket = {b: {w.scn: [k for _, k, _ in w.events if _bucket(k) == b]
                              for w in windows} for b in range(N)}
            # A stop at a window with no event of the bucket: still reached.
            bucket, stop = next((b, s) for s in range(10, LIMIT)
                                for b in range(N) if not per_bucket[b][s])
            store = MemoryCheckpointStore()
            got = await _read(r.url, store, stop, bucket)
            want = {s: keys for s, keys in per_bucket[bucket].items() if keys and s <= stop}
            assert got == want
            assert store.load() == Checkpoint(stop)
            # Every bucket, from there to a later stop: the rest, nothing twice.
            union: list[object] = []
            for b in range(N):
                part = await _read(r.url, MemoryCheckpointStore(Checkpoint(stop)),
                                   LIMIT, b)
                assert min(part, default=LIMIT) > stop
                union += [k for s in sorted(part) for k in part[s]]
            assert sorted(map(str, union)) == sorted(
                str(k) for w in windows if w.scn > stop for _, k, _ in w.events)

    asyncio.run(main())


def test_stop_at_scn_already_reached_reads_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as r:
            await r.wait_for_scn("load", LIMIT)
            store = MemoryCheckpointStore(Checkpoint(25))
            assert await _read(r.url, store, 20, 0) == {}
            assert store.load() == Checkpoint(25) and store.stores == 0

    asyncio.run(main())


def test_stop_at_scn_is_checked() -> None:
    with pytest.raises(ValueError, match="stop_at_scn"):
        DatabusClient(["http://127.0.0.1:1"], stop_at_scn=-3)
    with pytest.raises(ValueError, match="checkpoint_every=1"):
        DatabusClient(["http://127.0.0.1:1"], stop_at_scn=3, checkpoint_every=2)


def test_stop_below_the_snapshot_ends_with_the_bootstrap(tmp_path: Path) -> None:
    """Snapshot windows carry the snapshot's SCN, not a position: a stop below it ends
    once the bootstrap is done (its online checkpoint at the target), not at the first
    snapshot batch."""
    from tests.unit.test_client_bootstrap import BOOT_SCN, SOURCES, pipeline, source_state

    async def main() -> None:
        async with pipeline(tmp_path) as p:
            expected = (await source_state(p, BOOT_SCN)).rows
            store = MemoryCheckpointStore()
            client = DatabusClient([p.b.url], bootstrap=[p.boot], sources=SOURCES,
                                   checkpoint_store=store, stop_at_scn=0,
                                   max_request_bytes=16 * 1024)
            rows: dict[tuple[str, object], int] = {}

            async def consume() -> None:
                async with contextlib.aclosing(client.windows()) as windows:
                    async for window in windows:
                        for e in window.events:
                            if e.is_delete:
                                rows.pop((e.source, e.key), None)
                            else:
                                assert e.value is not None
                                rows[(e.source, e.key)] = e.value["seq"]

            await asyncio.wait_for(consume(), 60)
            assert rows == expected
            assert store.load() == Checkpoint(BOOT_SCN)

    asyncio.run(main())
