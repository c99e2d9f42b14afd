"""Bootstrap failover's pure parts (docs/clusters.md "Bootstrap failover"): the fencing
token kept in the store and checked inside each write's transaction, the lease guard
run before the commit, the store id the members find the locks by, and the
``[bootstrap.cluster]`` config. On a SQLite store (server-free); the PostgreSQL store
runs the same SQL and is exercised by tests/integration/test_bootstrap_cluster.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from databus.bootstrap import open_storage
from databus.bootstrap._applier import LogApplier
from databus.bootstrap._cluster import LeaseExpiredError, root_path
from databus.bootstrap._storage import BootstrapStorage, Fence, FencedError, LogWindow, stored_event
from databus.checkpoint import Checkpoint
from databus.config import ConfigFieldError, from_mapping
from databus.config._bootstrap import BootstrapClusterConfig, BootstrapConfig
from databus.errors import ConfigError
from databus.event import Op, encode_event

SOURCE = "shop.items"


def _window(scn: int) -> LogWindow:
    return LogWindow(scn, scn * 1000, [
        stored_event(SOURCE, encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=scn % 5,
                                          value=b"v", timestamp_ns=scn))])


@pytest.fixture
def store(tmp_path: Path) -> BootstrapStorage:
    return open_storage(f"sqlite:///{tmp_path / 'b.db'}")


def test_tokens_grow_per_component_and_the_store_id_stays(store: BootstrapStorage,
                                                           tmp_path: Path) -> None:
    assert store.fence_tokens() == {}
    assert [store.take_fence("producer") for _ in range(3)] == [1, 2, 3]
    assert store.take_fence("applier") == 1
    assert store.fence_tokens() == {"producer": 3, "applier": 1}
    with pytest.raises(ValueError):
        store.take_fence("server")
    first = store.store_id()
    assert first == store.store_id()
    other = open_storage(f"sqlite:///{tmp_path / 'b.db'}")  # another service, same file
    assert other.store_id() == first
    assert other.take_fence("producer") == 4


def test_an_older_token_writes_nothing(store: BootstrapStorage) -> None:
    old = Fence("producer", store.take_fence("producer"))
    store.append([_window(1)], Checkpoint(1), log_floor_scn=0, fence=old)
    new = Fence("producer", store.take_fence("producer"))  # a standby took over
    with pytest.raises(FencedError, match="no longer the store's"):
        store.append([_window(2)], Checkpoint(2), fence=old)
    assert store.producer_checkpoint() == Checkpoint(1)
    assert store.positions()[1] == 1
    store.append([_window(2)], Checkpoint(2), fence=new)  # the new holder goes on
    assert store.positions()[1] == 2

    applier_old = Fence("applier", store.take_fence("applier"))
    assert store.apply(max_rows=1, fence=applier_old) is not None
    applier_new = Fence("applier", store.take_fence("applier"))
    with pytest.raises(FencedError):
        store.apply(max_rows=10, fence=applier_old)
    with pytest.raises(FencedError):
        store.retain(cut_scn=10, fence=applier_old)
    assert store.positions()[0] == 1
    assert store.apply(max_rows=10, fence=applier_new) is not None
    assert store.positions()[0] == 2


def test_a_guard_that_raises_rolls_the_write_back(store: BootstrapStorage) -> None:
    def expired() -> None:
        raise LeaseExpiredError("the lease ran out")

    token = store.take_fence("producer")
    with pytest.raises(LeaseExpiredError):
        store.append([_window(1)], Checkpoint(1), log_floor_scn=0,
                     fence=Fence("producer", token, expired))
    assert store.producer_checkpoint() is None
    assert store.positions() == (None, None, None)
    store.append([_window(1)], Checkpoint(1), log_floor_scn=0,
                 fence=Fence("producer", token, lambda: None))
    assert store.positions()[1] == 1


def test_a_component_started_later_fences_the_running_one(store: BootstrapStorage) -> None:
    store.append([_window(scn) for scn in range(1, 4)], Checkpoint(3), log_floor_scn=0)

    async def run() -> None:
        first = LogApplier(store, batch_rows=1, poll_interval=0.01)
        first.start()
        while first.status.applied_scn != 3:
            await asyncio.sleep(0.01)
        second = LogApplier(store, batch_rows=1, poll_interval=0.01)
        second.start()
        while second.fence is None:
            await asyncio.sleep(0.01)
        store.append([_window(4)], Checkpoint(4))  # something to apply: the first tries
        while first.running:
            await asyncio.sleep(0.01)
        assert first.status.state == "fenced"
        while second.status.applied_scn != 4:
            await asyncio.sleep(0.01)
        assert second.fence.token == first.fence.token + 1  # type: ignore[union-attr]
        await second.close()
        with pytest.raises(FencedError):
            await first.close()  # close() says how the task ended

    asyncio.run(run())


def test_cluster_config() -> None:
    cfg = BootstrapClusterConfig(zookeeper="zk1:2181,zk2:2181/databus", name="boot")
    assert cfg.session_timeout_s == 10.0
    assert root_path(cfg.name) == "/databus/bootstrap/boot"
    for kwargs, field in (({"zookeeper": "zk1:2181;zk2"}, "zookeeper"),
                          ({"zookeeper": "u:p@zk1:2181"}, "zookeeper"),
                          ({"name": "a b"}, "name"),
                          ({"session_timeout_s": 0.1}, "session_timeout_s"),
                          ({"advertise_url": "ftp://x"}, "advertise_url")):
        args = {"zookeeper": "zk1:2181", "name": "boot", **kwargs}
        with pytest.raises(ConfigFieldError, match=field):
            BootstrapClusterConfig(**args)  # type: ignore[arg-type]
    loaded = from_mapping(BootstrapConfig, {
        "storage": "postgresql://u@db/x", "run": ["applier", "server"],
        "cluster": {"zookeeper": "127.0.0.1:2181/c", "name": "boot",
                    "session_timeout_s": 3}})
    assert loaded.cluster == BootstrapClusterConfig("127.0.0.1:2181/c", "boot", 3.0)
    with pytest.raises(ConfigError, match=r"cluster\.advertise_url: needed"):
        from_mapping(BootstrapConfig, {
            "storage": "sqlite:///x.db", "port": 0, "run": ["server"],
            "cluster": {"zookeeper": "127.0.0.1:2181", "name": "boot"}})
