"""The metrics the shipped alert rules need (deploy/prometheus): a consumer's eviction
headroom, the buffer's input byte counter, a relay's cluster role and epoch, and failed
dumps. Each is checked on a real in-process relay's ``/metrics`` or on the buffer's
bytes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from databus.event import Op, encode_event
from databus.relay._buffer import EventBuffer
from databus.relay._metrics import _cluster_families
from tests.relay_harness import RunningRelay, relay_config, running_relay, stream_all
from tests.unit.test_relay_consumers import metric_families

LOAD = "synthetic://?rate=0&keys=1000&event_bytes=300&events_per_window=3&limit=40&seed=1"


def ev(scn: int, key: int) -> bytes:
    return encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=key, value=b"v" * 200,
                        timestamp_ns=scn * 1000)


def test_bytes_from_measures_from_the_window_a_consumer_needs_to_the_newest(
        tmp_path: Path) -> None:
    buf = EventBuffer(tmp_path / "b.buf", 16 * 1024, index_every_bytes=512)
    assert buf.bytes_from(1) == 0  # empty
    sizes = {}
    for scn in range(10, 60, 10):
        before = buf.state().tail
        buf.append_window(scn, [ev(scn, scn + i) for i in range(3)])
        sizes[scn] = buf.state().tail - before
    state = buf.state()
    assert buf.bytes_in == state.tail == sum(sizes.values())
    assert buf.bytes_from(10) == buf.bytes_from(5) == state.used_bytes
    # A consumer at SCN 30 needs 40 next: the bytes of windows 40 and 50.
    assert buf.bytes_from(31) == buf.bytes_from(40) == sizes[40] + sizes[50]
    assert buf.bytes_from(50) == sizes[50]
    assert buf.bytes_from(51) == 0
    # Past eviction the measure still runs from the window asked for.
    for scn in range(60, 400, 10):
        buf.append_window(scn, [ev(scn, scn + i) for i in range(3)])
    state = buf.state()
    assert state.min_scn is not None and state.min_scn > 50
    assert state.max_scn is not None
    assert buf.bytes_from(state.max_scn) == sizes[50]  # same event sizes
    assert buf.bytes_from(state.min_scn - 100) == state.used_bytes
    buf.close()


def test_cluster_role_is_one_hot_over_the_leader_follower_roles() -> None:
    buffers: dict[str, dict[str, Any]] = {
        "a": {"cluster": {"name": "c1", "mode": "leader-follower", "role": "follower",
                          "epoch": 7}},
        "b": {"cluster": {"name": "c2", "mode": "independent", "role": "independent",
                          "epoch": None}},
        "c": {},
    }
    role, epoch = list(_cluster_families(buffers))
    assert {(s.labels["buffer"], s.labels["role"]): s.value for s in role.samples} == {
        ("a", "leader"): 0.0, ("a", "follower"): 1.0, ("a", "waiting"): 0.0,
        ("b", "independent"): 1.0}
    assert [(s.labels, s.value) for s in epoch.samples] == [
        ({"buffer": "a", "cluster": "c1"}, 7.0)]


def test_the_relay_exports_headroom_input_bytes_and_failed_dumps(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            await stream_all(r, client_id="caught-up")
            await stream_all(r, client_id="behind", checkpoint=json.dumps({"window_scn": 10}))
            families = await metric_families(r)
            state = r.relay.buffers["load"].state()
            written = families["databus_relay_buffer_input_bytes"].samples
            assert [(s.labels, s.value) for s in written] == [({"buffer": "load"},
                                                               float(state.tail))]
            room = {s.labels["client_id"]: s.value for s in
                    families["databus_relay_consumer_eviction_headroom_bytes"].samples}
            # "behind" has been served through SCN 40 by stream_all: pull it back to 10.
            assert room["caught-up"] == state.capacity
            assert room["behind"] == state.capacity
            await pull_once(r, "behind", 10)
            families = await metric_families(r)
            room = {s.labels["client_id"]: s.value for s in
                    families["databus_relay_consumer_eviction_headroom_bytes"].samples}
            assert room["behind"] == state.capacity - r.relay.buffers["load"].bytes_from(11)
            assert 0 < room["behind"] < state.capacity
            failed = families["databus_relay_dumps_failed"].samples
            assert [(s.labels, s.value) for s in failed] == [({"buffer": "load"}, 0.0)]
            assert "databus_relay_cluster_role" in families  # declared, no sample here
            assert families["databus_relay_cluster_role"].samples == []

    asyncio.run(main())


async def pull_once(r: RunningRelay, client_id: str, scn: int) -> None:
    """One request that serves nothing new past ``scn``'s window (max_bytes too small
    for the next event): the registry records the consumer at ``scn``."""
    async with await r.get("/v1/stream", client_id=client_id, max_bytes=1,
                           checkpoint=json.dumps({"window_scn": scn})) as resp:
        assert resp.status == 200
        await resp.read()


def test_bootstrap_cluster_role_is_one_hot_per_component() -> None:
    from databus.bootstrap._server import _cluster_role

    assert _cluster_role(None).samples == []
    family = _cluster_role({"name": "bs", "components": {
        "producer": {"role": "holder"}, "applier": {"role": "standby"}}})
    assert {(s.labels["component"], s.labels["role"]): s.value for s in family.samples} == {
        ("applier", "holder"): 0.0, ("applier", "standby"): 1.0,
        ("producer", "holder"): 1.0, ("producer", "standby"): 0.0}
    assert {s.labels["cluster"] for s in family.samples} == {"bs"}
