"""``databus status --zookeeper``'s pure half (databus/_status_topology.py) on plain
dicts: the keys it adds, the exit status, the terminal rendering; and the error entry
when ZooKeeper does not answer."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import pytest
from rich.console import Console

from databus._status_topology import (
    add_topology,
    read_topology,
    topology_ok,
    topology_parts,
)
from databus._status_view import build_document, exit_status, render
from databus.cli import build_parser
from databus.client.group._cli import summarize as summarize_group
from databus.relay.cluster._cli import summarize as summarize_clusters
from tests.relay_harness import free_port

NOW = 1_000_000.0


def relay_snapshot(leader: str | None = "http://r1:11190") -> dict[str, Any]:
    member = {"url": "http://r1:11190", "mode": "leader-follower", "updated_at": NOW - 2,
              "buffers": {"src": {"role": "leader", "epoch": 3, "max_scn": 42}}}
    return {"relays": {"shop": {
        "members": [{"node": "member-0000000001", "data": json.dumps(member)}],
        "buffers": {"src": {"contenders": [leader] if leader else [], "epoch": "3"}}}},
        "bootstrap": {"shop-boot": {
            "locks": {"stores/s1/producer": ["http://b1:11191", "http://b2:11191"]},
            "members": [{"node": "member-0000000000", "data": json.dumps(
                {"url": "http://b1:11191", "runs": {"producer": ["shop.orders"]}})}]}}}


def group_doc(ok: bool = True) -> dict[str, Any]:
    snapshot: dict[str, Any] = {
        "group": "indexer",
        "members": [{"node": "member-0000000000", "data": json.dumps(
            {"member": "m1", "client_id": "indexer-a", "lag_seconds": 0.4,
             "consumer_scn": 40, "relay_max_scn": 42})}],
        "contenders": [b"m1"],
        "assignment": json.dumps({"generation": 2, "partitions": 2,
                                  "owners": {"m1": [0, 1]}}).encode(),
        "owners": {"0": json.dumps({"member": "m1", "generation": 2}).encode(),
                   **({"1": json.dumps({"member": "m1", "generation": 2}).encode()}
                      if ok else {})},
        "checkpoints": {},
    }
    return summarize_group(snapshot)


def topology(leader: str | None = "http://r1:11190", group_ok: bool = True
             ) -> dict[str, Any]:
    clusters = summarize_clusters(relay_snapshot(leader), now=NOW)
    clusters["zookeeper"] = "digest:ops:***@zk1:2181/databus"
    return {"clusters": clusters,
            "groups": [group_doc(group_ok), {"group": "locked", "error": "not authorized"}]}


def test_the_document_gains_clusters_and_groups_only_with_zookeeper() -> None:
    doc = build_document([], [], NOW)
    before = dict(doc)
    add_topology(doc, None)
    assert doc == before  # no --zookeeper: the document as it always was
    add_topology(doc, topology())
    assert set(doc) - set(before) == {"clusters", "groups"}
    [cluster] = doc["clusters"]["clusters"]
    assert cluster["name"] == "shop" and cluster["mode"] == "leader-follower"
    [buffer] = cluster["buffers"]
    assert (buffer["leader"], buffer["epoch"]) == ("http://r1:11190", 3)
    assert buffer["members"] == [{"url": "http://r1:11190", "role": "leader", "epoch": 3,
                                  "max_scn": 42}]
    [boot] = doc["clusters"]["bootstrap"]
    assert boot["locks"][0]["holder"] == "http://b1:11191"
    assert boot["locks"][0]["waiting"] == ["http://b2:11191"]
    group, locked = doc["groups"]
    assert (group["group"], group["generation"], group["leader"]) == ("indexer", 2, "m1")
    assert group["members"][0]["lag_seconds"] == 0.4
    assert locked == {"group": "locked", "error": "not authorized"}


@pytest.mark.parametrize(("change", "ok"), [
    (lambda t: None, True),
    (lambda t: t["clusters"].update(ok=False), False),  # a buffer without leader
    (lambda t: t["groups"][0].update(ok=False), False),  # a partition without holder
    (lambda t: t["groups"].append({"group": "x", "error": "no"}), False),
    (lambda t: t.update(clusters={"zookeeper": "zk:2181", "error": "unreachable"}), False),
])
def test_the_exit_status_also_speaks_of_the_topology(change: Any, ok: bool) -> None:
    doc = build_document([], [], NOW)
    assert topology_ok(doc) and exit_status(doc) == 0  # not asked: not a reason
    data = topology()
    data["groups"] = data["groups"][:1]
    change(data)
    add_topology(doc, data)
    assert topology_ok(doc) is ok
    assert exit_status(doc) == (0 if ok else 1)


def test_no_leader_and_a_partition_without_holder_come_from_the_summaries() -> None:
    data = topology(leader=None, group_ok=False)
    assert data["clusters"]["ok"] is False
    assert data["clusters"]["clusters"][0]["problems"] == ["buffer src has no leader"]
    assert data["groups"][0]["ok"] is False


def text_of(parts: list[Any]) -> str:
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    for part in parts:
        console.print(part)
    return out.getvalue()


def test_the_terminal_shows_clusters_and_groups_with_their_renderers() -> None:
    doc = build_document([], [], NOW)
    assert topology_parts(doc) == []
    add_topology(doc, topology())
    text = text_of(topology_parts(doc))
    assert "Clusters (ZooKeeper digest:ops:***@zk1:2181/databus)" in text
    assert "relay cluster shop (leader-follower), 1 member" in text
    assert "buffer src: leader http://r1:11190, epoch 3" in text
    assert "bootstrap cluster shop-boot" in text
    assert "Consumer groups (2)" in text
    assert "group indexer: generation 2, 2 partitions, leader m1" in text
    assert "group locked: not authorized" in text
    # and inside the whole status rendering
    assert "relay cluster shop" in text_of([render(doc)])
    doc["clusters"] = {"zookeeper": "zk:2181", "error": "cannot reach ZooKeeper"}
    assert "ZooKeeper zk:2181: cannot reach ZooKeeper" in text_of(topology_parts(doc))


def test_zookeeper_that_does_not_answer_is_the_clusters_error() -> None:
    started = time.monotonic()
    data = read_topology(f"127.0.0.1:{free_port()}", timeout=0.5)
    assert time.monotonic() - started < 10
    assert data["groups"] == []
    assert data["clusters"]["zookeeper"].startswith("127.0.0.1:")
    assert "cannot reach ZooKeeper" in data["clusters"]["error"]


def test_the_flag_refuses_a_connect_string_without_showing_its_password(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["status", "--zookeeper", "zk1:2181,zk2:2181/databus"])
    assert args.zookeeper == "zk1:2181,zk2:2181/databus" and args.relay == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["status", "--zookeeper", "ops:hunter2-pw@zk1:2181"])
    assert "hunter2-pw" not in capsys.readouterr().err
