"""``databus group status`` (client/group/_cli.py), the pure parts: ``summarize`` and
``render`` on hand-built snapshots, the connect string's parsing, the exit status and
the command line's argument errors. The ZooKeeper side is in
tests/integration/test_group_status.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from databus.checkpoint import Checkpoint, Mode
from databus.cli import main
from databus.client._checkpoint_envelope import encode_envelope
from databus.client.group._cli import (
    exit_status,
    lock_order,
    parse_coordinator,
    ranges,
    render,
    summarize,
)
from databus.client.group._coordinator import GroupAssignment, encode_assignment
from databus.errors import ConfigError


def member(name: str, **fields: Any) -> dict[str, Any]:
    return {"node": f"member-{name}",
            "data": json.dumps({"member": name, **fields}).encode()}


def owner(name: str, generation: int = 1) -> bytes:
    return json.dumps({"member": name, "generation": generation}).encode()


def envelope(scn: int) -> bytes:
    return encode_envelope(Checkpoint(scn))


def healthy() -> dict[str, Any]:
    """Two members on 4 partitions, everything held as assigned, checkpoints 100+p."""
    return {
        "group": "g",
        "members": [member("b", client_id="cb", partitions=[2, 3], relay_max_scn=150,
                           consumer_scn=120, lag_ms=12.5, lag_seconds=0.013),
                    member("a", client_id="ca", partitions=[0, 1], relay_max_scn=140,
                           consumer_scn=None, lag_ms=None)],
        "contenders": [b"a", b"b"],
        "assignment": encode_assignment(GroupAssignment(5, 4, {"a": (0, 1), "b": (2, 3)})),
        "owners": {"0": owner("a"), "1": owner("a"), "2": owner("b"), "3": owner("b")},
        "checkpoints": {str(p): envelope(100 + p) for p in range(4)},
    }


def by_partition(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {row["partition"]: row for row in doc["partitions"]}


def test_a_healthy_group() -> None:
    doc = summarize(healthy())
    assert doc["group"] == "g" and doc["generation"] == 5 and doc["partition_count"] == 4
    assert doc["leader"] == "a" and doc["leader_waiting"] == ["b"]
    assert doc["relay_max_scn"] == 150  # the largest any member reports
    assert [(m["member"], m["client_id"], m["assigned"], m["held"], m["running"],
             m["relay_max_scn"], m["consumer_scn"], m["lag_ms"]) for m in doc["members"]] == [
        ("a", "ca", [0, 1], [0, 1], [0, 1], 140, None, None),
        ("b", "cb", [2, 3], [2, 3], [2, 3], 150, 120, 12.5)]
    assert [(r["partition"], r["assigned"], r["holder"], r["holder_generation"], r["state"],
             r["checkpoint_scn"], r["checkpoint_mode"], r["lag_scn"])
            for r in doc["partitions"]] == [
        (p, "a" if p < 2 else "b", "a" if p < 2 else "b", 1, "held", 100 + p, "online",
         50 - p) for p in range(4)]
    assert doc["problems"] == [] and doc["warnings"] == [] and doc["ok"] is True
    assert exit_status(doc) == 0
    # --json prints exactly this document: it must be JSON as it is
    assert json.loads(json.dumps(doc, sort_keys=True)) == doc


def test_render_a_healthy_group() -> None:
    text = render(summarize(healthy()))
    lines = text.splitlines()
    assert lines[0] == "group g: generation 5, 4 partitions, leader a"
    assert lines[1] == "members (2):"
    assert lines[2].split() == ["MEMBER", "CLIENT", "ASSIGNED", "HELD", "RELAY", "MAX",
                                "SCN", "CONSUMER", "SCN", "LAG", "MS", "LAG", "S"]
    # A member that reports no lag in seconds: unknown, never 0 (DESIGN 17).
    assert lines[3].split() == ["a", "ca", "0-1", "0-1", "140", "-", "-", "unknown"]
    assert lines[4].split() == ["b", "cb", "2-3", "2-3", "150", "120", "12.5", "0.013"]
    assert lines[5] == "partitions:"
    assert lines[7].split() == ["0", "a", "a", "held", "100", "50"]
    assert lines[10].split() == ["3", "b", "b", "held", "103", "47"]
    assert len(lines) == 11  # no problem, no warning


def test_a_partition_without_holder_is_moving_or_unowned_and_exits_1() -> None:
    snap = healthy()
    # partition 1: reassigned to b, released by a, not yet taken by b (moving);
    # partition 3: assigned to c, which has no member node (unowned);
    # partition 2: b still holds it, the assignment gives it to a (moving, held).
    snap["assignment"] = encode_assignment(GroupAssignment(
        6, 4, {"a": (0, 2), "b": (1,), "c": (3,)}))
    del snap["owners"]["1"], snap["owners"]["3"]
    doc = summarize(snap)
    rows = by_partition(doc)
    assert [(rows[p]["assigned"], rows[p]["holder"], rows[p]["state"]) for p in range(4)] == [
        ("a", "a", "held"), ("b", None, "moving"), ("a", "b", "moving"), ("c", None, "unowned")]
    assert doc["problems"] == ["partition 1 has no holder (moving to b)",
                               "partition 3 has no holder (assigned to c, which has no "
                               "member node)"]
    assert doc["ok"] is False and exit_status(doc) == 1
    text = render(doc)
    assert "problem: partition 1 has no holder (moving to b)" in text
    row = next(line for line in text.splitlines() if line.split()[:2] == ["1", "b"])
    assert row.split() == ["1", "b", "-", "moving", "101", "49"]


def test_a_group_whose_members_all_left_has_every_partition_unowned() -> None:
    snap = healthy()
    snap["members"], snap["contenders"], snap["owners"] = [], [], {}
    doc = summarize(snap)
    assert {r["state"] for r in doc["partitions"]} == {"unowned"}
    assert len(doc["problems"]) == 4 and exit_status(doc) == 1
    assert doc["warnings"] == ["no members"]
    assert doc["leader"] is None and doc["relay_max_scn"] is None
    assert all(r["lag_scn"] is None and r["checkpoint_scn"] == 100 + r["partition"]
               for r in doc["partitions"])  # SCNs known, lag not: nobody reports one


def test_a_damaged_assignment_is_reported_not_raised() -> None:
    snap = healthy()
    snap["assignment"] = b'{"generation": 0, "partitions": 4, "owners": {}}'
    doc = summarize(snap)
    assert doc["generation"] is None and doc["partition_count"] is None
    assert "bad generation 0" in doc["assignment_error"]
    assert "/databus/groups/g/assignment" in doc["assignment_error"]
    assert doc["problems"] == [f"the assignment is damaged: {doc['assignment_error']}"]
    assert exit_status(doc) == 1
    # the holders and checkpoints are still shown, with no assigned owner
    assert [(r["partition"], r["assigned"], r["holder"], r["checkpoint_scn"])
            for r in doc["partitions"]] == [
        (0, None, "a", 100), (1, None, "a", 101), (2, None, "b", 102), (3, None, "b", 103)]
    assert all(m["assigned"] is None for m in doc["members"])
    text = render(doc)
    assert text.startswith("group g: assignment DAMAGED, leader a\n")
    assert "problem: the assignment is damaged: " in text


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]",
                                 b'{"generation": 2, "partitions": 4, "owners": '
                                 b'{"a": [0, 0]}}', b"\xff\xfe"])
def test_every_kind_of_damaged_assignment(raw: bytes) -> None:
    snap = healthy()
    snap["assignment"] = raw
    doc = summarize(snap)
    assert doc["assignment_error"] and exit_status(doc) == 1


def test_a_damaged_checkpoint_is_shown_as_damaged() -> None:
    snap = healthy()
    good = snap["checkpoints"]["2"]
    snap["checkpoints"]["2"] = good.replace(b"102", b"109")  # the CRC no longer matches
    snap["checkpoints"]["3"] = b"\x00\x00\x00"
    doc = summarize(snap)
    rows = by_partition(doc)
    assert rows[2]["checkpoint_scn"] is None and rows[2]["lag_scn"] is None
    assert "checksum does not match" in rows[2]["checkpoint_error"]
    assert "/databus/groups/g/checkpoints/2" in rows[2]["checkpoint_error"]
    assert "only NUL bytes" in rows[3]["checkpoint_error"]
    assert rows[1]["checkpoint_error"] is None and rows[1]["checkpoint_scn"] == 101
    assert [w.split(":")[0] for w in doc["warnings"]] == ["partition 2", "partition 3"]
    assert exit_status(doc) == 0  # every partition held: a damaged checkpoint is a warning
    text = render(doc)
    assert [line.split()[:5] for line in text.splitlines()
            if line.split()[:1] in (["2"], ["3"])] == [
        ["2", "b", "b", "held", "DAMAGED"], ["3", "b", "b", "held", "DAMAGED"]]
    assert "warning: partition 2: the checkpoint is damaged: " in text


def test_bootstrap_and_special_checkpoints_show_their_mode() -> None:
    snap = healthy()
    snap["checkpoints"]["0"] = encode_envelope(Checkpoint(
        -1, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=90, bootstrap_source_index=0))
    snap["checkpoints"]["1"] = encode_envelope(Checkpoint(
        -1, mode=Mode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=90, bootstrap_target_scn=95,
        bootstrap_source_index=1))
    snap["checkpoints"]["2"] = encode_envelope(Checkpoint.flexible())
    del snap["checkpoints"]["3"]
    doc = summarize(snap)
    rows = by_partition(doc)
    got = [(rows[p]["checkpoint_mode"], rows[p]["checkpoint_scn"], rows[p]["lag_scn"])
           for p in range(4)]
    assert got == [("bootstrap_snapshot", 90, 60),  # the snapshot's SCN
                   ("bootstrap_catchup", None, None),
                   ("online", None, None),  # flexible: no SCN yet
                   (None, None, None)]  # no checkpoint at all
    cells = {line.split()[0]: re.split(r"\s{2,}", line.strip())[4:]
             for line in render(doc).splitlines()
             if line.split()[:1] in (["0"], ["1"], ["2"], ["3"])}
    assert cells == {"0": ["90 (bootstrap_snapshot)", "60"],
                     "1": ["- (bootstrap_catchup)", "-"], "2": ["- (online)", "-"],
                     "3": ["-", "-"]}


def test_members_with_garbage_fields_show_what_is_valid() -> None:
    snap = healthy()
    snap["members"] = [
        member("a", client_id=7, partitions="0,1", relay_max_scn="150", consumer_scn=True,
               lag_ms="fast"),
        member("b", client_id=None, partitions=[2, "3"], relay_max_scn=True,
               consumer_scn=3.5, lag_ms=[1]),
        {"node": "member-0000000009", "data": b"{not json"},
        {"node": "member-0000000010", "data": b'{"member": 42, "relay_max_scn": 999}'},
        {"node": "member-0000000011", "data": b'["a list"]'},
    ]
    doc = summarize(snap)
    rows = {m["node"]: m for m in doc["members"]}
    a, b = doc["members"][0], doc["members"][1]
    assert (a["member"], b["member"]) == ("a", "b")
    for m in (a, b):
        assert (m["client_id"], m["running"], m["relay_max_scn"], m["consumer_scn"],
                m["lag_ms"]) == (None, None, None, None, None)
    assert a["held"] == [0, 1] and b["held"] == [2, 3]  # from owners/, not the member
    nameless = rows["member-0000000010"]
    assert nameless["member"] is None and nameless["held"] == []
    assert nameless["assigned"] is None
    assert nameless["relay_max_scn"] == 999  # its valid field is still shown ...
    assert doc["relay_max_scn"] == 999  # ... and counts for the lag
    assert by_partition(doc)[0]["lag_scn"] == 899
    assert [m["node"] for m in doc["members"][2:]] == [
        "member-0000000009", "member-0000000010", "member-0000000011"]
    assert doc["warnings"] == [
        "member node member-0000000009 is not a JSON object",
        "member node member-0000000009 has no member id",
        "member node member-0000000010 has no member id",
        "member node member-0000000011 is not a JSON object",
        "member node member-0000000011 has no member id"]
    assert exit_status(doc) == 0  # garbage is warned about; every partition is held
    text = render(doc)
    assert "? (member-0000000009)" in text
    assert json.loads(json.dumps(doc)) == doc


def test_a_non_finite_lag_is_unknown() -> None:
    snap = healthy()
    snap["members"] = [member("a", lag_ms=None), member("b", lag_ms=0)]
    snap["members"][0]["data"] = b'{"member": "a", "lag_ms": NaN}'
    doc = summarize(snap)
    assert [m["lag_ms"] for m in doc["members"]] == [None, 0]


def test_an_owner_node_naming_nobody_is_a_problem() -> None:
    snap = healthy()
    snap["owners"]["1"] = b"garbage"
    doc = summarize(snap)
    row = by_partition(doc)[1]
    assert (row["holder"], row["state"]) == (None, "unreadable")
    assert doc["problems"] == ["partition 1: its owner node names no member"]
    assert "owner node of partition 1 does not name a member" in doc["warnings"]
    assert exit_status(doc) == 1


def test_stray_children_are_warned_about_not_taken_for_partitions() -> None:
    snap = healthy()
    snap["owners"]["007"] = owner("a")
    snap["checkpoints"]["x"] = envelope(1)
    snap["checkpoints"]["9"] = envelope(1)  # beyond P = 4
    doc = summarize(snap)
    assert [r["partition"] for r in doc["partitions"]] == [0, 1, 2, 3, 9]
    assert by_partition(doc)[9]["state"] == "unowned"
    assert doc["warnings"] == [
        "owner node /databus/groups/g/owners/007 is not a partition number",
        "checkpoint node /databus/groups/g/checkpoints/x is not a partition number",
        "partition 9 is beyond the assignment's 4 partitions"]
    assert exit_status(doc) == 0  # partition 9 was never assigned


def test_an_empty_group() -> None:
    doc = summarize({"group": "g", "members": [], "contenders": [], "assignment": None,
                     "owners": {}, "checkpoints": {}})
    assert (doc["generation"], doc["partition_count"], doc["leader"]) == (None, None, None)
    assert doc["members"] == [] and doc["partitions"] == []
    assert doc["problems"] == [] and doc["warnings"] == ["no members"]
    assert exit_status(doc) == 0
    assert render(doc) == ("group g: no assignment, leader NONE\nmembers (0):\n"
                           "warning: no members\n")


def test_members_without_an_assignment_yet_exit_1() -> None:
    snap = healthy()
    snap["assignment"], snap["owners"] = None, {}
    doc = summarize(snap)
    assert doc["problems"] == ["no assignment yet: the leader has not written one"]
    assert [r["state"] for r in doc["partitions"]] == ["unowned"] * 4  # checkpoints only
    assert exit_status(doc) == 1


def test_lock_order_and_ranges() -> None:
    assert lock_order(["x__lock__0000000012", "junk", "y__lock__0000000003"]) == [
        "y__lock__0000000003", "x__lock__0000000012"]
    assert ranges([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert ranges([]) == "none" and ranges(None) is None and ranges([4]) == "4"


@pytest.mark.parametrize(("text", "hosts"), [
    ("zk1:2181,zk2:2181/chroot", "zk1:2181,zk2:2181/chroot"),
    ("zookeeper://zk1:2181,zk2:2181/a/b", "zk1:2181,zk2:2181/a/b"),
    ("ZooKeeper://127.0.0.1:2181", "127.0.0.1:2181"),
])
def test_parse_coordinator(text: str, hosts: str) -> None:
    assert parse_coordinator(text) == hosts


@pytest.mark.parametrize("text", ["zk1:2181;zk2", "", "http://zk1:2181", "zk1:99999"])
def test_parse_coordinator_refuses_what_is_no_connect_string(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_coordinator(text)


def test_credentials_are_refused_and_never_printed(capsys: pytest.CaptureFixture[str]
                                                  ) -> None:
    for text in ("zookeeper://admin:s3cret-pw@zk1:2181/c", "admin:s3cret-pw@zk1:2181"):
        with pytest.raises(ConfigError) as caught:
            parse_coordinator(text)
        assert "credentials" in str(caught.value) and "s3cret-pw" not in str(caught.value)
        with pytest.raises(SystemExit) as ended:
            main(["group", "status", "--coordinator", text, "--group", "g"])
        assert ended.value.code == 2
        out, err = capsys.readouterr()
        assert "credentials do not go in the connect string" in err
        assert "s3cret-pw" not in out + err


@pytest.mark.parametrize(("args", "expect"), [
    (["--coordinator", "zk1:2181"], "the following arguments are required: --group"),
    (["--group", "g"], "the following arguments are required: --coordinator"),
    (["--coordinator", "zk1:2181;zk2", "--group", "g"], "expected host:port"),
    (["--coordinator", "zk1:2181", "--group", ".."], "argument --group: group name"),
    (["--coordinator", "zk1:2181", "--group", "g", "--timeout", "0"],
     "argument --timeout: must be between 0 and 600 s"),
])
def test_argument_errors_exit_2(args: list[str], expect: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["group", "status", *args])
    assert ended.value.code == 2
    assert expect in capsys.readouterr().err


def test_a_checkpoint_past_the_reported_relay_max_scn_has_lag_0() -> None:
    snap = healthy()  # relay max SCN 150 (member b)
    snap["checkpoints"]["0"] = envelope(170)  # b's report is older than this checkpoint
    rows = by_partition(summarize(snap))
    assert (rows[0]["checkpoint_scn"], rows[0]["lag_scn"]) == (170, 0)
    assert (rows[1]["checkpoint_scn"], rows[1]["lag_scn"]) == (101, 49)
