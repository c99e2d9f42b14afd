"""Consumer groups (docs/client.md "Consumer groups"): a stream's
partitions shared by the members of a group, assigned on ZooKeeper, each partition
checkpointed on its own.

- ``_assignment``: the pure part (``assign``, ``partition_of``, ``member_filter``);
- ``_coordinator``: membership, the leader's assignment and partition ownership on
  ZooKeeper (``GroupCoordinator``);
- ``_checkpoints``: the per-partition checkpoints;
- ``_member``: what ``DatabusClient(group=...)`` runs: the rebalance protocol on the
  client's pull loop;
- ``_cli``: ``databus group status``.
"""

from databus.client.group._assignment import assign, member_filter, partition_of
from databus.client.group._coordinator import (
    GroupAssignment,
    GroupCoordinator,
    decode_assignment,
    group_root,
)
from databus.client.group._member import ZooKeeperCoordinator

__all__ = [
    "GroupAssignment",
    "GroupCoordinator",
    "ZooKeeperCoordinator",
    "assign",
    "decode_assignment",
    "group_root",
    "member_filter",
    "partition_of",
]
