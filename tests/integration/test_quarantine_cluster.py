"""A relay cluster (leader-follower, real processes and the ZooKeeper ensemble) with a
quarantined source (DESIGN 17): the follower copies the leader's windows byte for byte,
the leader's quarantine marker included (it writes none of its own), records the
quarantine from it and answers its consumers the same error; a heal is refused by the
follower (``not_leader``) and done at the leader, which the follower follows.

Both members start with the record (``quarantine.json``) of a quarantine whose marker
never landed: the leader writes it into its first window and leaves the source's
events out; the follower, which has the record too, must not write its own."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.event import QUARANTINE_SOURCE_ID, iter_events
from tests.fixtures.servers import EnsembleChroot
from tests.integration.cluster_support import cluster_toml, get_json, wait_for
from tests.quarantine_support import shop_source
from tests.relay_harness import RelayProcess
from tests.unit.test_quarantine_relay import TABLES, item, tag
from tests.unit.test_txlog_support import BUFFER, SqliteSource

pytestmark = pytest.mark.integration

TOKEN = "cluster-admin-token"


def _record(home: Path) -> None:
    (home / "relay").mkdir(parents=True)
    (home / "relay" / "quarantine.json").write_text(json.dumps({"version": 1, "quarantined": [
        {"buffer": BUFFER, "source": "shop.items", "scn": 1, "reason": "a bad row",
         "fix": "heal it", "since": time.time(), "marker_scn": None, "healing": False}]}))


@pytest.fixture
def members(tmp_path: Path, zookeeper_chroot: EnsembleChroot
            ) -> Iterator[tuple[SqliteSource, list[RelayProcess]]]:
    db = shop_source(tmp_path)
    relays = []
    for i in range(2):
        home = tmp_path / f"member{i}"
        _record(home)
        relays.append(RelayProcess(home, {BUFFER: db.uri(TABLES)}, workers=1,
                                   admin_token=TOKEN, extra_toml=cluster_toml(zookeeper_chroot)))
    for relay in relays:
        relay.start()
    try:
        yield db, relays
    finally:
        for relay in relays:
            if relay.proc is not None and relay.proc.poll() is None:
                relay.kill()


def _status(relay: RelayProcess) -> dict[str, Any]:
    doc: dict[str, Any] = relay.status()["buffers"][BUFFER]
    return doc


def _body(relay: RelayProcess, **params: str) -> tuple[int, bytes, dict[str, Any] | None]:
    body, cp = b"", None
    while True:
        query = {"max_bytes": str(8 << 20), **params}
        if cp is not None:
            query["checkpoint"] = cp
        url = f"{relay.url}/v1/stream?{urllib.parse.urlencode(query)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                chunk = resp.read()
                cp = resp.headers["X-Databus-Checkpoint"]
        except urllib.error.HTTPError as exc:
            return exc.code, body, json.loads(exc.read())
        if not chunk:
            return 200, body, None
        body += chunk


def _heal(relay: RelayProcess) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{relay.url}/v1/admin/sources/shop.items/heal", data=b"{}", method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _same_windows(relays: list[RelayProcess]) -> bytes:
    def same() -> bytes | None:
        tops = {_status(r)["max_scn"] for r in relays}
        if len(tops) != 1 or None in tops:
            return None
        bodies = {_body(r, quarantine="pass")[1] for r in relays}
        return bodies.pop() if len(bodies) == 1 else None

    found: bytes = wait_for(same, "the members hold the same windows", 30)
    return found


def test_a_follower_copies_the_quarantine_and_follows_the_leaders_heal(
        members: tuple[SqliteSource, list[RelayProcess]]) -> None:
    db, relays = members
    leader = wait_for(lambda: next((r for r in relays
                                    if _status(r)["cluster"]["role"] == "leader"), None),
                      "a leader", 30)
    (follower,) = [r for r in relays if r is not leader]
    wait_for(lambda: _status(follower)["fetcher"]["state"] == "running", "the follower chains")
    db.txn(item(1, "a"), tag("x", 1))
    db.txn(tag("y", 2))
    wait_for(lambda: b"y" in _body(follower, sources="shop.tags")[1], "tag y copied", 30)
    body = _same_windows(relays)  # byte for byte: the leader's marker only
    assert [h.scn for _, h in iter_events(body) if h.source_id == QUARANTINE_SOURCE_ID]
    assert len([1 for _, h in iter_events(body) if h.source_id == QUARANTINE_SOURCE_ID]) == 1
    for relay in relays:
        assert [q["source"] for q in _status(relay)["quarantined"]] == ["shop.items"]
        status, _, error = _body(relay, sources="shop.items")
        assert status == 409 and error is not None and error["error"] == "source_quarantined"
        assert _body(relay, sources="shop.tags")[0] == 200
    status, doc = _heal(follower)
    assert (status, doc["error"]) == (409, "not_leader") and leader.url in doc["message"]
    status, doc = _heal(leader)
    assert status == 200, doc
    wait_for(lambda: get_json(f"{leader.url}/v1/dumps/{doc['dump']['id']}")["state"] == "done",
             "the heal's dump", 30)
    db.txn(tag("end", 3))
    wait_for(lambda: b"end" in _body(follower, sources="shop.tags")[1], "tag end copied", 30)
    wait_for(lambda: _status(follower)["quarantined"] == [], "the follower lifts it", 30)
    _same_windows(relays)
    for relay in relays:
        status, body, _ = _body(relay, sources="shop.items")
        assert status == 200 and b"a" in body  # item 1 came with the heal's dump
