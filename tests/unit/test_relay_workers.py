"""The pieces of relay workers that need no process (relay/_workers.py, relay/_worker.py;
tests/integration/test_relay_workers.py runs the processes): the listening sockets and
the probe that keeps a second relay off the port, the worker's catalog reloads, its view
of the relay, the hello's configured sources, the consumer reports."""

from __future__ import annotations

import json
import logging
import socket
import sys
from pathlib import Path

import pytest

from databus._serving import ListenError
from databus.checkpoint import Checkpoint
from databus.config import BufferConfig, RelayConfig
from databus.errors import ConfigError, UnknownSourceError
from databus.fetchers._api import ConfiguredSources
from databus.relay._catalog import FollowerCatalog, RelayCatalog
from databus.relay._relay import Relay
from databus.relay._worker import ForwardingConsumers, WorkerRelay
from databus.relay._workers import (
    Listeners,
    configured_from_json,
    configured_to_json,
    worker_sockets,
)
from databus.schemas import Schema

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="SO_REUSEPORT groups are Linux's")


@linux_only
def test_listeners_share_the_port_with_workers_but_not_with_a_second_relay() -> None:
    listeners = Listeners("127.0.0.1", 0, retry_s=0)
    try:
        port = listeners.main[0].getsockname()[1]
        assert port != 0
        spec = json.loads(json.dumps(listeners.spec()))  # as the worker gets it
        theirs = worker_sockets(spec)
        assert [s.getsockname()[1] for s in theirs] == [port]
        # Another relay on the same port: its probe fails, after its retries.
        with pytest.raises(ListenError, match="Address already in use"):  # one line
            Listeners("127.0.0.1", port, retry_s=0.2)
        # So does anything binding it the ordinary way.
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        # Connections reach both processes' sockets.
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
        counts = []
        for sock in [*listeners.main, *theirs]:
            n = 0
            while True:
                try:
                    sock.accept()[0].close()
                    n += 1
                except BlockingIOError:
                    break
            counts.append(n)
        assert sum(counts) == 40 and min(counts) > 0, counts
        for c in clients:
            c.close()
        for s in theirs:
            s.close()
    finally:
        for s in listeners.main:
            s.close()


def test_listeners_on_a_port_in_use_fail_after_the_retry() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{port}: "
                           "Address already in use"):
            Listeners("127.0.0.1", port, retry_s=0.2)


def test_configured_sources_travel_in_the_hello() -> None:
    configured = ConfiguredSources(names=frozenset({"a.b", "a.c"}), databases=frozenset({"x"}),
                                   everything=False, excluded_databases=frozenset({"mysql"}))
    doc = json.loads(json.dumps(configured_to_json(configured)))
    assert configured_from_json(doc) == configured
    assert configured_from_json(configured_to_json(None)) is None


SCHEMA = {"type": "record", "name": "t", "fields": [{"name": "id", "type": "long"}]}
SCHEMA2 = {"type": "record", "name": "t", "fields": [{"name": "id", "type": "long"},
                                                     {"name": "x", "type": "string"}]}


def test_follower_catalog_reads_what_the_main_process_wrote_since(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "catalog.json"
    main = RelayCatalog(path)
    shop = main.for_buffer("shop", 0)
    first = shop.source_id("db.orders")
    follower = FollowerCatalog(path)
    assert [e.name for e in follower.sources()] == ["db.orders"]
    # A source, an id and a schema the main process adds later: found on first use.
    second = shop.source_id("db.items")
    assert follower.source("db.items").id == second
    third = shop.source_id("db.users")
    assert follower.by_id(third).name == "db.users"
    stored = shop.register_schema("db.orders", Schema(SCHEMA2))
    assert follower.registry.get(stored.fingerprint).fingerprint == stored.fingerprint
    assert follower.source("db.orders").fingerprint == stored.fingerprint
    with pytest.raises(UnknownSourceError):
        follower.source("db.nope")
    with pytest.raises(UnknownSourceError):
        follower.by_id(999)
    assert follower.refresh() is False  # nothing changed since
    # A file that does not parse (never what the main process renames into place):
    # the follower keeps what it had.
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="databus.relay.catalog"):
        assert follower.refresh() is False
    assert follower.by_id(first).name == "db.orders"
    assert "not reloaded" in caplog.text


def test_worker_view_of_a_relay_and_its_checks(tmp_path: Path) -> None:
    config = RelayConfig(
        data_dir=tmp_path / "relay",
        buffers=(BufferConfig(name="load", capacity_mb=1, source="synthetic://?rate=0&limit=5"),),
        port=0, workers=2)
    relay = Relay(config)
    try:
        hello = {"main_pid": 1, "buffers": {"load": {
            "capacity": 1 << 20, "partition_id": 0,
            "configured": configured_to_json(ConfiguredSources(names=frozenset({"a.b"})))}}}
        view = WorkerRelay(config, hello)
        try:
            assert view.fetchers.configured_buffer("a.b") == "load"
            assert view.fetchers.configured_buffer("a.c") is None
            assert view.buffers["load"].state() == relay.buffers["load"].state()
            relay.buffers["load"].start_after(41)
            view.refresh()
            assert view.buffers["load"].state().prev_scn == 41
        finally:
            view.close()
        # A config file edited since the main process read it: the worker refuses.
        other = dict(hello["buffers"]["load"], capacity=2 << 20)
        with pytest.raises(ConfigError, match="restart the relay"):
            WorkerRelay(config, {"main_pid": 1, "buffers": {"load": other}})
    finally:
        relay.close()


def test_serving_processes_default_to_the_cores(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def config(workers: int) -> RelayConfig:
        return RelayConfig(data_dir=tmp_path, buffers=(
            BufferConfig(name="b", capacity_mb=1, source="synthetic://?rate=0"),),
            workers=workers)

    assert config(1).serving_processes == 1
    assert config(3).serving_processes == 3
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert config(0).serving_processes == 4
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert config(0).serving_processes == 1  # workers rely on x86-64's store order
    with pytest.raises(ConfigError):
        config(-1)
    with pytest.raises(ConfigError):
        config(10_000)


def test_forwarded_consumers_are_summed_per_client_and_buffer() -> None:
    registry = ForwardingConsumers()
    for i in range(3):
        registry.observe("c1", buffer="b", checkpoint=Checkpoint(10 + i), events=2, nbytes=100,
                         filter_json=None, sources=("a.b",), address="1.2.3.4:5",
                         streaming=True)
    registry.observe("c2", buffer="b", checkpoint=Checkpoint(3), events=1, nbytes=7,
                     filter_json='{"x": 1}', sources=(), address=None, streaming=False)
    taken = {d["client_id"]: d for d in registry.take()}
    assert taken["c1"]["events"] == 6 and taken["c1"]["nbytes"] == 300
    assert Checkpoint.loads(taken["c1"]["checkpoint"]) == Checkpoint(12)
    assert taken["c2"]["filter_json"] == '{"x": 1}'
    assert registry.take() == []
    assert len(registry) == 0  # nothing kept in the worker


def test_forwarded_streams_open_and_close_the_main_process_entries() -> None:
    from databus.relay._consumers import ConsumerRegistry
    from databus.relay._workers import WorkerPool, _Worker

    worker_side = ForwardingConsumers()
    worker_side.stream_opened("s", buffer="b")
    worker_side.observe("s", buffer="b", checkpoint=Checkpoint(4), events=1, nbytes=9,
                        filter_json=None, sources=(), address=None, streaming=True)
    worker_side.stream_opened("t", buffer="b")
    worker_side.stream_closed("t", buffer="b")  # opened and closed within one report
    main = ConsumerRegistry()
    for seen in worker_side.take():
        main.observe(seen["client_id"], buffer=seen["buffer"],
                     checkpoint=Checkpoint.loads(seen["checkpoint"]), events=seen["events"],
                     nbytes=seen["nbytes"], filter_json=None, sources=(), address=None,
                     streaming=True)
    worker = _Worker.__new__(_Worker)
    worker.streams = {}
    for change in worker_side.take_streams():
        WorkerPool._streams_changed(worker, main, change)
    assert worker_side.take_streams() == []
    assert [d["client_id"] for d in main.snapshot({"b": 4})] == ["s"]
    assert worker.streams == {("anonymous", "s", "b"): 1} and main.open_streams() == 1
    # The stream closes: gone from the main process too.
    worker_side.stream_closed("s", buffer="b")
    for change in worker_side.take_streams():
        WorkerPool._streams_changed(worker, main, change)
    assert main.snapshot({"b": 4}) == [] and worker.streams == {}
