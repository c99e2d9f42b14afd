"""Consumer groups and the bootstrap service (issue 17 item 4): members that start
without checkpoints, on a relay that has dropped the stream's start, bootstrap each
with its own partition filter pushed down to the bootstrap service, then go on from
the relay. Two members in one process apply into one shared replica, as consumers of a
group writing to one database would; it must equal the source. A member joins while
the first one is bootstrapping, so partitions move in the middle of a bootstrap.

The pipeline (two relays on the synthetic source, a bootstrap service fed by the
first) is the one of ``tests/unit/test_client_bootstrap.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from databus.client import CallbackResult, Consumer, DatabusClient, DataEvent, ZooKeeperCoordinator
from databus.client.group import partition_of
from tests.fixtures.servers import EnsembleChroot
from tests.unit.test_client_bootstrap import LAST_SCN, SOURCES, pipeline, source_state

pytestmark = pytest.mark.integration

P = 4


class SharedReplica(Consumer):
    """Applies into ``rows`` (shared by the members); remembers each bootstrap row's
    partition and whether this member held it then."""

    def __init__(self, rows: dict[tuple[str, object], int], lock: threading.Lock) -> None:
        self.rows = rows
        self.lock = lock
        self.held: set[int] = set()
        self.bootstrap_partitions: list[tuple[int, bool]] = []
        self.assigned: list[tuple[int, ...]] = []

    def on_partitions_assigned(self, partitions: tuple[int, ...]) -> None:
        self.held |= set(partitions)
        self.assigned.append(partitions)

    def on_partitions_revoked(self, partitions: tuple[int, ...]) -> None:
        self.held -= set(partitions)

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        part = partition_of(event.partition_key, P)
        if event.from_bootstrap:
            self.bootstrap_partitions.append((part, part in self.held))
            time.sleep(0.005)  # slow enough that the other member joins meanwhile
        assert event.value is not None
        with self.lock:
            if event.is_delete:
                self.rows.pop((event.source, event.key), None)
            else:
                self.rows[(event.source, event.key)] = event.value["seq"]
        return CallbackResult.SUCCESS


def test_members_bootstrap_their_own_partitions(tmp_path: Path,
                                                zookeeper_chroot: EnsembleChroot) -> None:
    async def main() -> None:
        async with pipeline(tmp_path) as p:
            expected = (await source_state(p, LAST_SCN)).rows
            rows: dict[tuple[str, object], int] = {}
            lock = threading.Lock()
            replicas = [SharedReplica(rows, lock) for _ in range(2)]
            clients = []
            for i, replica in enumerate(replicas):
                client = DatabusClient(
                    [p.b.url], sources=SOURCES, bootstrap=[p.boot], poll_wait_ms=100,
                    group="boot", partitions=P, client_id=f"member-{i}",
                    coordinator=ZooKeeperCoordinator(zookeeper_chroot.hosts,
                                                     session_timeout=4.0),
                    max_request_bytes=8 * 1024, backoff_initial=0.02, backoff_max=0.2)
                client.register(replica)
                clients.append(client)
            tasks = [asyncio.create_task(clients[0].run_async())]
            # The second member joins while the first is bootstrapping.
            for _ in range(500):
                if replicas[0].bootstrap_partitions:
                    break
                await asyncio.sleep(0.01)
            tasks.append(asyncio.create_task(clients[1].run_async()))
            try:
                for _ in range(3000):
                    with lock:
                        if rows == expected:
                            break
                    for task in tasks:
                        if task.done():
                            task.result()
                    await asyncio.sleep(0.02)
                for _ in range(1000):  # the final assignment: each holds its half
                    held = [set(r.held) for r in replicas]
                    if all(held) and not held[0] & held[1] and held[0] | held[1] == set(
                            range(P)):
                        break
                    await asyncio.sleep(0.02)
                for i, client in enumerate(clients):
                    assert set(client.metrics.group_partitions) == held[i]
                    text = client.metrics.prometheus_text(f"member-{i}")
                    assert (f'databus_client_group_partitions{{client="member-{i}"}} '
                            f"{float(len(held[i]))}") in text
                assert clients[0].metrics.rebalances >= 1  # the second member's arrival
            finally:
                for client in clients:
                    client.stop()
                await asyncio.gather(*tasks, return_exceptions=True)
            with lock:
                assert rows == expected
            for replica in replicas:
                # Pushed down: a member got bootstrap rows of its own partitions only.
                assert replica.bootstrap_partitions
                assert all(held for _, held in replica.bootstrap_partitions)
            assert all(held) and not held[0] & held[1]
            assert held[0] | held[1] == set(range(P))
            assert all(c.metrics.bootstraps >= 1 for c in clients)

    asyncio.run(main())
