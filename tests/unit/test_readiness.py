"""Readiness of the bootstrap service and the replicator (DESIGN 17): the pure functions
on status documents, the shared document shape and metrics, and the bootstrap's
``/readyz`` through its real HTTP app. (The relay's: tests/unit/test_relay_liveness.py;
the daemons as processes: tests/integration/test_safe_start.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from databus._readiness import component_families, readiness_document
from databus.bootstrap import _readiness as boot
from databus.bootstrap._serve import Bootstrapper, ServePolicy
from databus.bootstrap._server import ServiceInfo, create_app
from databus.bootstrap._storage import open_storage
from databus.relay import _readiness as relay
from databus.replicator import _readiness as repl
from databus.replicator._status import ReplicationStats, metrics_page, status_document


def _boot(producer: str, applier: str, cluster: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    return {"components": {"producer": {"state": producer, "last_error": None},
                           "applier": {"state": applier, "last_error": "token gone"}},
            "cluster": cluster}


@pytest.mark.parametrize(("state", "ready"), [
    ("running", True), ("standby", True), ("starting", False), ("retrying", False),
    ("fenced", False), ("failed", False), ("stopped", False)])
def test_bootstrap_components_ready_only_holding_or_standing_by(state: str,
                                                               ready: bool) -> None:
    producer, applier = boot.components_of(_boot("running", state))
    assert producer["ready"] and applier["ready"] is ready
    if not ready:
        assert applier["error"] == f"applier_{state}"
        assert applier["message"] == "token gone" and applier["fix"]


def test_a_fenced_component_says_who_to_stop() -> None:
    doc = readiness_document(boot.components_of(_boot("fenced", "running")))
    assert doc["ready"] is False and doc["error"] == "not_ready"
    assert doc["message"] == "producer: fenced"
    [fenced] = [c for c in doc["components"] if not c["ready"]]
    assert "fencing token" in fenced["fix"] and "second instance" in fenced["fix"]


def test_a_bootstrap_cluster_member_out_of_zookeeper_is_not_ready() -> None:
    components = boot.components_of(_boot("standby", "standby", {"connected": False}))
    assert [(c["component"], c["ready"]) for c in components] == [
        ("producer", True), ("applier", True), ("zookeeper", False)]


def test_the_replicator_is_ready_while_it_applies() -> None:
    stats = ReplicationStats("copy")
    doc = status_document(stats, relay_max_scn=None, lag_ms=None, target="sqlite:///t")
    assert doc["ready"] is False and doc["not_ready"][0]["error"] == "replicator_starting"
    stats.state = "running"
    doc = status_document(stats, relay_max_scn=10, lag_ms=0.0, target="sqlite:///t")
    assert doc["ready"] is True and doc["not_ready"] == []
    stats.failed("target down")
    stats.state = "retrying"
    [down] = repl.components_of(status_document(stats, relay_max_scn=10, lag_ms=0.0,
                                                target="sqlite:///t"))
    assert (down["ready"], down["message"]) == (False, "target down")
    stats.applied({"t": 1}, 11)  # the target answers again
    assert stats.state == "running"
    page = metrics_page(lambda: status_document(stats, relay_max_scn=11, lag_ms=0.0,
                                                target="sqlite:///t")).decode()
    assert ('databus_component_up{buffer="",component="replicator",daemon="replicator"} 1.0'
            in page)


def test_one_metric_shape_for_every_daemon() -> None:
    for daemon, components, states in (
            ("bootstrap", boot.components_of(_boot("running", "fenced")), boot.STATES),
            ("relay", relay.components_of({"buffers": {"b": {"fetcher": {
                "state": "caught_up"}}}}), relay.STATES)):
        up, state = component_families(daemon, components, states)
        assert {s.labels["daemon"] for s in up.samples} == {daemon}
        for c in components:
            values = [s.value for s in state.samples
                      if s.labels["component"] == c["component"]]
            assert sum(values) == 1.0  # one-hot
    # caught_up counts as doing its job (DESIGN 17).
    [fetcher] = relay.components_of({"buffers": {"b": {"fetcher": {"state": "caught_up"}}}})
    assert fetcher["ready"]


def test_a_misconfigured_source_says_it_is_fixed_at_the_source() -> None:
    [fetcher] = relay.components_of({"buffers": {"b": {"fetcher": {
        "state": "failed", "last_error": "SourceMisconfiguredError: access denied"}}}})
    assert "no restart needed" in fetcher["fix"]
    [other] = relay.components_of({"buffers": {"b": {"fetcher": {
        "state": "failed", "last_error": "ScnNotAvailableError: purged"}}}})
    assert "restart the relay" in other["fix"]


def test_bootstrap_readyz_over_http(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'b.db'}")
    info = ServiceInfo()
    app = create_app(Bootstrapper(storage, ServePolicy()), info)

    async def main() -> None:
        async with TestClient(TestServer(app)) as client:
            async with client.get("/readyz") as resp:  # a server alone: ready
                assert resp.status == 200 and (await resp.json())["ready"] is True
            info.components["producer"] = lambda: {"state": "fenced", "errors": 0,
                                                   "last_error": "token 1 is not 2"}
            async with client.get("/readyz") as resp:
                doc = await resp.json()
                assert resp.status == 503
                assert doc["components"][0]["error"] == "producer_fenced"
            async with client.get("/healthz") as resp:
                assert resp.status == 200  # alive, not ready
            async with client.get("/v1/status") as resp:
                status = await resp.json()
                assert status["ready"] is False
                assert status["not_ready"][0]["message"] == "token 1 is not 2"
            async with client.get("/metrics") as resp:
                page = await resp.text()
                assert ('databus_component_up{buffer="",component="producer",'
                        'daemon="bootstrap"} 0.0') in page

    try:
        asyncio.run(main())
    finally:
        storage.close()
