"""The pure parts of the group coordinator: the diff a member acts on, and the
assignment znode's codec."""

from __future__ import annotations

import pytest

from databus.client.group._coordinator import (
    GroupAssignment,
    PartitionDiff,
    decode_assignment,
    diff_partitions,
    encode_assignment,
)
from databus.errors import ConfigError


def test_diff_revokes_what_is_no_longer_assigned_and_takes_what_is_new() -> None:
    assert diff_partitions([3, 1, 2], [2, 4, 3]) == PartitionDiff(revoke=(1,), take=(4,))


def test_no_change_is_an_empty_diff() -> None:
    diff = diff_partitions([0, 5], (5, 0))
    assert diff == PartitionDiff((), ())
    assert not diff


def test_a_new_member_takes_all_and_a_departing_one_revokes_all() -> None:
    assert diff_partitions([], [2, 0]) == PartitionDiff((), (0, 2))
    assert diff_partitions([7, 6], []) == PartitionDiff((6, 7), ())


def test_assignment_round_trip() -> None:
    a = GroupAssignment(3, 8, {"b": (4, 5, 6, 7), "a": (0, 1, 2, 3)})
    raw = encode_assignment(a)
    assert raw.startswith(b'{"generation":3,"owners":{"a":[0,1,2,3]')
    assert decode_assignment(raw, "x") == a


@pytest.mark.parametrize("raw", [
    b"not json", b"[]", b'{"generation":0,"partitions":4,"owners":{}}',
    b'{"generation":1,"partitions":0,"owners":{}}',
    b'{"generation":1,"partitions":4,"owners":{"a":[4]}}',
    b'{"generation":1,"partitions":4,"owners":{"a":[1],"b":[1]}}',
    b'{"generation":1,"partitions":4,"owners":{"a":1}}',
])
def test_a_damaged_assignment_is_refused(raw: bytes) -> None:
    with pytest.raises(ConfigError, match="znode"):
        decode_assignment(raw, "assignment znode /g")
