"""Whether windows can still come (relay/_liveness.py; docs/relay.md, "When the main
process stops answering"): the rules as pure functions, the stamp file, the readiness
document, and a relay out of its ZooKeeper session serving what it holds but promising
nothing more."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from databus.checkpoint import Checkpoint
from databus.client._relay_stream import StreamFramer
from databus.coordination import ZooKeeperMember
from databus.relay._liveness import (
    SESSION_LOST,
    STALE_S,
    MainUnavailable,
    SessionLostError,
    Stamp,
    StampReader,
    StampWriter,
    judge,
    session_judge,
    stale_after_s,
)
from databus.relay._readiness import component_families, components_of, readiness_response
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_relay_streaming import LIMIT, LOAD, frames_until, open_stream

S = 1_000_000_000  # ns


# -- the rules ---------------------------------------------------------------------------


def test_a_stamp_is_trusted_up_to_its_bound_and_not_a_moment_longer() -> None:
    fresh = Stamp(pid=7, monotonic_ns=100 * S, stale_after_s=3.0)
    assert judge(fresh, now_ns=100 * S, main_pid=7, stale_after_s=3.0) is None
    assert judge(fresh, now_ns=103 * S, main_pid=7, stale_after_s=3.0) is None
    stale = judge(fresh, now_ns=103 * S + 1_000_000, main_pid=7, stale_after_s=3.0)
    assert isinstance(stale, MainUnavailable)
    assert stale.retriable and stale.http_status == 503 and stale.code == "unavailable"
    assert "pid 7" in stale.message and "3.0 s" in stale.message


def test_no_stamp_or_another_process_stamp_is_not_an_answer() -> None:
    assert isinstance(judge(None, now_ns=0, main_pid=7, stale_after_s=3.0), MainUnavailable)
    other = Stamp(pid=8, monotonic_ns=100 * S, stale_after_s=3.0)
    assert isinstance(judge(other, now_ns=100 * S, main_pid=7, stale_after_s=3.0),
                      MainUnavailable)


def test_the_session_flag_of_a_fresh_stamp_is_the_main_process_verdict() -> None:
    lost = Stamp(pid=7, monotonic_ns=100 * S, stale_after_s=3.0, flags=SESSION_LOST)
    verdict = judge(lost, now_ns=100 * S, main_pid=7, stale_after_s=3.0)
    assert isinstance(verdict, SessionLostError)
    assert verdict.code == "session_lost" and verdict.http_status == 503 and verdict.retriable
    # Stale first: a stopped process's last verdict is not news.
    assert isinstance(judge(lost, now_ns=110 * S, main_pid=7, stale_after_s=3.0),
                      MainUnavailable)


def test_the_bound_is_half_the_session_between_one_and_three_seconds() -> None:
    assert stale_after_s(None) == STALE_S == 3.0
    assert stale_after_s(10.0) == 3.0
    assert stale_after_s(3.0) == 1.5
    assert stale_after_s(0.5) == 1.0


def test_out_of_session_only_past_the_session_timeout() -> None:
    assert session_judge(0.0, 2.0) is None
    assert session_judge(2.0, 2.0) is None  # a reconnect within it keeps the session
    lost = session_judge(2.5, 2.0)
    assert isinstance(lost, SessionLostError) and "2.5 s" in lost.message


def test_a_member_counts_the_time_since_its_connection_was_lost() -> None:
    from kazoo.client import KazooState

    class Client:
        client_id = (42, b"")

    member = ZooKeeperMember("127.0.0.1:1", 2.0, "/m", "setting", "http://x")
    member.client = Client()
    assert member.disconnected_for() == 0.0  # never connected yet: not "lost"
    member._state_changed(KazooState.CONNECTED)
    assert member.disconnected_for() == 0.0
    member._state_changed(KazooState.SUSPENDED)
    since = member._disconnected_at
    assert since is not None
    assert member.disconnected_for(now=since + 5) == 5
    member._state_changed(KazooState.LOST)  # still counted from the first loss
    assert member.disconnected_for(now=since + 6) == 6
    member._state_changed(KazooState.CONNECTED)
    assert member.disconnected_for(now=since + 7) == 0.0


# -- the stamp file ----------------------------------------------------------------------


def test_the_stamp_goes_from_writer_to_reader(tmp_path: Path) -> None:
    reader = StampReader(tmp_path)
    assert reader.read() is None  # no file yet: no stamp
    writer = StampWriter(tmp_path, 1.5)
    try:
        stamp = reader.read()
        assert stamp is not None and stamp.pid == os.getpid() and stamp.flags == 0
        assert stamp.stale_after_s == 1.5
        writer.stamp(SESSION_LOST, now_ns=123 * S)
        assert reader.read() == Stamp(os.getpid(), 123 * S, 1.5, SESSION_LOST)
        writer.stamp()
        assert judge(reader.read(), now_ns=time.monotonic_ns(),
                     main_pid=os.getpid(), stale_after_s=1.5) is None
    finally:
        writer.close()
        reader.close()


def test_a_file_that_is_not_a_stamp_is_none(tmp_path: Path) -> None:
    (tmp_path / "relay.live").write_bytes(b"x" * 64)
    assert StampReader(tmp_path).read() is None


# -- readiness ---------------------------------------------------------------------------


def _status(fetcher: str, *, connected: bool = True, worker: str = "running") -> dict[str, object]:
    return {"buffers": {"src": {
        "fetcher": {"state": fetcher, "last_error": "ConnectionLostError: gone"
                    if fetcher != "running" else None},
        "cluster": {"connected": connected}}},
        "workers": [{"pid": 11, "state": worker, "restarts": 0}]}


def test_ready_only_when_every_component_is() -> None:
    components = components_of(_status("running"))
    assert [c["component"] for c in components] == ["fetcher", "zookeeper", "worker"]
    assert all(c["ready"] and c["error"] is None for c in components)
    answer = readiness_response(components)
    assert answer.status == 200
    assert answer.text is not None and json.loads(answer.text)["ready"] is True
    for status in (_status("backoff"), _status("running", connected=False),
                   _status("running", worker="restarting")):
        answer = readiness_response(components_of(status))
        assert answer.status == 503
        assert answer.text is not None
        doc = json.loads(answer.text)
        assert doc["ready"] is False and doc["error"] == "not_ready" and doc["message"]
        down = [c for c in doc["components"] if not c["ready"]]
        assert len(down) == 1 and down[0]["error"] and down[0]["fix"]
    [fetcher] = [c for c in components_of(_status("backoff")) if c["component"] == "fetcher"]
    assert fetcher == {"component": "fetcher", "buffer": "src", "ready": False,
                       "state": "backoff", "error": "fetcher_backoff",
                       "message": "ConnectionLostError: gone", "fix": fetcher["fix"]}


# -- a relay out of its session ------------------------------------------------------------


class OutOfSession:
    """What ``Relay.session_down`` asks of its cluster member: one long disconnected."""

    session_timeout_s = 2.0

    def disconnected_for(self) -> float:
        return 9.0


def test_out_of_session_a_relay_serves_what_it_holds_and_promises_nothing(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", LIMIT)
            top = LIMIT  # the synthetic source's last SCN
            r.relay.cluster = OutOfSession()  # type: ignore[assignment]
            try:
                # Still alive (liveness), though it promises nothing.
                resp = await r.get("/healthz")
                assert resp.status == 200 and (await resp.json())["status"] == "ok"
                # A poll: what it holds.
                resp = await r.get("/v1/stream", max_bytes=1 << 20)
                assert resp.status == 200 and await resp.read()
                # A long poll at the tail: not an empty answer after the wait, a 503.
                resp = await r.get("/v1/stream", checkpoint=Checkpoint(top).dumps(),
                                   wait_ms=20_000)
                assert resp.status == 503
                assert (await resp.json())["error"] == "session_lost"
                # A stream: every window, then the error instead of heartbeats.
                stream = await open_stream(r, heartbeat_ms=100)
                framer = StreamFramer()
                frames = await frames_until(stream, framer,
                                            lambda fs: any(f.kind == "error" for f in fs))
                assert [f.kind for f in frames if f.kind != "write"] == ["error"]
                assert frames[-1].error is not None
                assert frames[-1].error["error"] == "session_lost"
                assert frames[-2].checkpoint is not None
                assert frames[-2].checkpoint.window_scn == top
                assert await stream.content.read() == b""
            finally:
                r.relay.cluster = None
            # Back in session: heartbeats again.
            stream = await open_stream(r, heartbeat_ms=100,
                                       checkpoint=Checkpoint(top).dumps())
            frames = await frames_until(stream, StreamFramer(),
                                        lambda fs: any(f.kind == "heartbeat" for f in fs))
            assert not [f for f in frames if f.kind == "error"]
            stream.close()

    asyncio.run(main())


def test_components_in_prometheus_up_and_one_hot_state() -> None:
    families = {f.name: f for f in component_families(components_of(
        _status("backoff", worker="restarting")))}
    up = {(s.labels["component"], s.labels["buffer"]): s.value
          for s in families["databus_component_up"].samples}
    assert up == {("fetcher", "src"): 0.0, ("zookeeper", ""): 1.0, ("worker_0", ""): 0.0}
    states = [s for s in families["databus_component_state"].samples
              if s.labels["component"] == "fetcher"]
    assert {s.labels["state"] for s in states} == {
        "starting", "running", "backoff", "standby", "stopped", "failed"}
    assert [s.labels["state"] for s in states if s.value == 1.0] == ["backoff"]
    assert all(s.labels["daemon"] == "relay" for s in states)


def test_the_relay_metrics_page_shows_its_components(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", LIMIT)
            async with await r.get("/metrics") as resp:
                text = await resp.text()
            assert ('databus_component_up{buffer="load",component="fetcher",daemon="relay"} '
                    '1.0') in text
            assert ('databus_component_state{buffer="load",component="fetcher",'
                    'daemon="relay",state="running"} 1.0') in text
            async with await r.get("/readyz") as resp:
                assert resp.status == 200 and (await resp.json())["ready"] is True

    asyncio.run(main())
