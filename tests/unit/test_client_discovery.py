"""The pure parts of relay discovery (client/_discovery.py), of the puller's changing
relay list (client/_failover.py) and of ``databus cluster status``
(relay/cluster/_cli.py). The ZooKeeper parts run in
tests/integration/test_cluster_discovery.py."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from databus.cli import build_parser
from databus.client import DatabusClient
from databus.client._discovery import members_path, relay_urls, validate_discovery
from databus.client._relay_puller import RelayPuller
from databus.errors import ConfigError
from databus.relay.cluster._cli import exit_status, lock_order, render, summarize


def member(url: Any, **extra: Any) -> bytes:
    return json.dumps({"url": url, "mode": "leader-follower", "buffers": {},
                       "updated_at": 1.0, **extra}).encode()


# -- members -> URLs ------------------------------------------------------------------


def test_relay_urls_in_node_order_each_once() -> None:
    datas = [member("http://a:1/"), member("http://b:2"), member("http://a:1")]
    assert relay_urls(datas) == ["http://a:1", "http://b:2"]


def test_relay_urls_skip_what_cannot_be_used() -> None:
    datas: list[bytes | str | None] = [
        None, b"", b"{not json", b"[1, 2]", json.dumps({"mode": "x"}).encode(),
        member(7), member("ftp://c:3"), member("https://d:4"), "\xff",
    ]
    assert relay_urls(datas) == ["https://d:4"]


def test_relay_urls_skip_members_that_say_they_are_disconnected() -> None:
    datas = [
        member("http://a:1", connected=False),
        member("http://b:2", buffers={"x": {"connected": False}, "y": {"connected": False}}),
        member("http://c:3", buffers={"x": {"connected": False}, "y": {"connected": True}}),
        member("http://d:4", connected=True),
        # what members write today: no "connected" at all
        member("http://e:5", buffers={"x": {"max_scn": 9, "role": "follower", "epoch": 2}}),
    ]
    assert relay_urls(datas) == ["http://c:3", "http://d:4", "http://e:5"]


def test_members_path() -> None:
    assert members_path("shop") == "/databus/relays/shop/members"


@pytest.mark.parametrize("hosts", ["zk1:2181;zk2", "", "zk1:99999", "u:p@zk1:2181",
                                   "zk1:2181/"])
def test_a_wrong_connect_string_is_a_config_error(hosts: str) -> None:
    with pytest.raises(ConfigError, match="relay discovery"):
        validate_discovery(hosts, "shop", 10)


def test_a_bad_cluster_name_or_timeout_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cluster"):
        validate_discovery("zk1:2181", "a/b", 10)
    with pytest.raises(ConfigError, match="zookeeper_timeout"):
        validate_discovery("zk1:2181,zk2:2181/chroot", "shop", 0)
    validate_discovery("zk1:2181,zk2:2181/databus/x", "shop", 5)


# -- DatabusClient's arguments -------------------------------------------------------


def test_client_takes_relays_or_zookeeper_and_cluster() -> None:
    DatabusClient(["http://r:1"])  # positional, as always
    DatabusClient(relays=["http://r:1"])
    client = DatabusClient(zookeeper="127.0.0.1:2181/x", cluster="shop")
    assert client.relays == [] and client.cluster == "shop"
    with pytest.raises(ConfigError, match="not both"):
        DatabusClient(["http://r:1"], zookeeper="127.0.0.1:2181", cluster="shop")
    with pytest.raises(ConfigError, match="needs both"):
        DatabusClient(zookeeper="127.0.0.1:2181")
    with pytest.raises(ConfigError, match="needs both"):
        DatabusClient(cluster="shop")
    with pytest.raises(ConfigError, match="expected host:port"):
        DatabusClient(zookeeper="zk1:2181;zk2", cluster="shop")
    with pytest.raises(ValueError, match="at least one relay"):
        DatabusClient()


def test_tail_takes_relay_or_zookeeper() -> None:
    parser = build_parser()
    args = parser.parse_args(["tail", "--zookeeper", "zk:2181", "--cluster", "shop"])
    assert args.zookeeper == "zk:2181" and args.relay is None
    with pytest.raises(SystemExit):
        parser.parse_args(["tail", "--zookeeper", "zk:2181", "--relay", "http://r:1"])
    with pytest.raises(SystemExit):
        parser.parse_args(["tail", "--sources", "a.b"])


# -- the puller's relay list changing ------------------------------------------------


def puller(urls: list[str], *, allow_empty: bool = False) -> RelayPuller:
    return RelayPuller(urls, [], None, rng=random.Random(1),  # type: ignore[arg-type]
                       allow_empty=allow_empty, backoff_initial=0.001, backoff_max=0.001)


def test_the_current_relay_stays_current_while_listed() -> None:
    p = puller(["http://a", "http://b"])
    current = p.url
    p.set_urls(["http://c", current, "http://d"])
    assert p.url == current
    assert p.urls == ["http://c", current, "http://d"]


def test_a_dropped_relay_is_used_until_it_fails_then_the_new_list() -> None:
    async def main() -> None:
        p = puller(["http://a"])
        p.set_urls(["http://b", "http://c"])
        assert p.url == "http://a"  # an open connection keeps going
        await p.failed(ConnectionResetError("gone"))
        assert p.url in ("http://b", "http://c")
        seen = {p.url}
        await p.failed(ConnectionResetError("x"))
        seen.add(p.url)
        assert seen == {"http://b", "http://c"}  # round-robin over the new list only
    asyncio.run(main())


def test_an_empty_list_waits_for_a_relay() -> None:
    async def main() -> None:
        p = puller([], allow_empty=True)
        with pytest.raises(LookupError, match="no relay"):
            _ = p.url
        waiter = asyncio.create_task(p.wait_for_urls())
        await asyncio.sleep(0.05)
        assert not waiter.done()
        p.set_urls(["http://a/"])
        await asyncio.wait_for(waiter, 2)
        assert p.url == "http://a"
        # The list emptied while a relay is in use: it stays in use until it fails.
        p.set_urls([])
        assert p.url == "http://a"
        await p.failed(ConnectionResetError("gone"))
        with pytest.raises(LookupError):
            _ = p.url
    asyncio.run(main())


def test_a_new_list_cuts_the_backoff_short() -> None:
    """Every relay failed and the puller backs off (20 s here); discovery brings a new
    list meanwhile (a relay joined or came back): it tries it at once."""
    async def main() -> None:
        p = RelayPuller(["http://a"], [], None, rng=random.Random(1),  # type: ignore[arg-type]
                        backoff_initial=20, backoff_max=20)
        waiting = asyncio.create_task(p.failed(ConnectionResetError("gone")))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # backing off: its only relay failed
        p.set_urls(["http://a", "http://b"])
        await asyncio.wait_for(waiting, 1.0)
    asyncio.run(main())


def test_a_fixed_list_must_not_be_empty() -> None:
    with pytest.raises(ValueError, match="at least one relay"):
        puller([])


# -- databus cluster status ------------------------------------------------------------


def test_lock_order_is_the_sequence_order() -> None:
    children = ["b1__lock__0000000003", "a9__lock__0000000001", "junk",
                "c0__rlock__0000000002"]
    assert lock_order(children) == ["a9__lock__0000000001", "c0__rlock__0000000002",
                                    "b1__lock__0000000003"]


def snapshot(contenders: list[str], *, mode: str = "leader-follower") -> dict[str, Any]:
    def node(url: str, role: str, epoch: int | None, scn: int) -> dict[str, Any]:
        return {"node": f"member-{url[-1]}", "data": json.dumps({
            "url": url, "mode": mode, "updated_at": 100.0,
            "buffers": {"src": {"max_scn": scn, "role": role, "epoch": epoch}}})}
    members = [node("http://r1", "leader", 3, 50), node("http://r2", "follower", 3, 49)]
    buffers = ({"src": {"contenders": contenders, "epoch": "3"}}
               if mode == "leader-follower" else {})
    return {"relays": {"shop": {"members": members, "buffers": buffers}},
            "bootstrap": {"shop-bootstrap": {
                "locks": {"stores/s1/producer": ["http://b1", "http://b2"],
                          "stores/s1/applier": ["http://b2", "http://b1"]},
                "members": [{"node": "member-1", "data": json.dumps({
                    "url": "http://b1", "updated_at": 101.0,
                    "runs": {"producer": ["shop.orders", "shop.items"], "applier": []}})}]}}}


def test_status_document_and_tables() -> None:
    doc = summarize(snapshot(["http://r1", "http://r2"]), now=102.5)
    [c] = doc["clusters"]
    assert c["mode"] == "leader-follower" and c["problems"] == []
    assert [(m["url"], m["age_s"]) for m in c["members"]] == [("http://r1", 2.5),
                                                              ("http://r2", 2.5)]
    [b] = c["buffers"]
    assert (b["leader"], b["epoch"], b["waiting"]) == ("http://r1", 3, ["http://r2"])
    assert b["members"] == [
        {"url": "http://r1", "role": "leader", "epoch": 3, "max_scn": 50},
        {"url": "http://r2", "role": "follower", "epoch": 3, "max_scn": 49}]
    [boot] = doc["bootstrap"]
    assert boot["locks"] == [
        {"lock": "stores/s1/producer", "store": "s1", "component": "producer",
         "holder": "http://b1", "waiting": ["http://b2"]},
        {"lock": "stores/s1/applier", "store": "s1", "component": "applier",
         "holder": "http://b2", "waiting": ["http://b1"]}]
    assert boot["members"][0]["url"] == "http://b1" and boot["members"][0]["age_s"] == 1.5
    assert exit_status(doc) == 0
    text = render(doc)
    assert "relay cluster shop (leader-follower), 2 members" in text
    assert "buffer src: leader http://r1, epoch 3" in text
    assert "2.5 s ago" in text
    assert "bootstrap cluster shop-bootstrap, 1 member" in text
    assert "producer (2 sources)" in text
    assert any(line.split() == ["s1", "producer", "http://b1", "http://b2"]
               for line in text.splitlines())
    json.dumps(doc)  # --json


def test_status_without_a_leader_exits_1() -> None:
    doc = summarize(snapshot([]), now=100)
    assert doc["clusters"][0]["problems"] == ["buffer src has no leader"]
    assert exit_status(doc) == 1
    assert "leader NONE" in render(doc)


def test_status_of_an_independent_cluster_needs_no_leader() -> None:
    doc = summarize(snapshot([], mode="independent"), now=100)
    assert exit_status(doc) == 0
    assert "independent (every member reads the source)" in render(doc)


def test_status_of_nothing() -> None:
    doc = summarize({"relays": {}, "bootstrap": {}}, now=0)
    assert exit_status(doc) == 0 and "no relay clusters" in render(doc)
