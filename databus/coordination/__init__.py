"""Coordination on ZooKeeper (kazoo), shared by relay clusters and bootstrap failover
(docs/clusters.md).

- ``_lease``: the holder's lease, which fences a paused or cut-off holder (pure);
- ``_member``: a process's session and its ephemeral member node;
- ``_contender``: waiting in a kazoo Lock and holding it, one thread;
- ``_readonly``: read-only looks for the status commands;
- ``_client``: ``kazoo_client``, the one place a ``KazooClient`` is built (digest
  credentials and ACLs, docs/security.md).
"""

from databus.coordination._client import ZooKeeperNotAuthorized, kazoo_client, not_authorized
from databus.coordination._contender import LockContender
from databus.coordination._lease import Lease
from databus.coordination._member import ZooKeeperMember
from databus.coordination._readonly import (
    ReadOnlyZooKeeper,
    ZooKeeperUnreachable,
    lock_order,
    read_only_session,
)

__all__ = [
    "Lease",
    "LockContender",
    "ReadOnlyZooKeeper",
    "ZooKeeperMember",
    "ZooKeeperNotAuthorized",
    "ZooKeeperUnreachable",
    "kazoo_client",
    "lock_order",
    "not_authorized",
    "read_only_session",
]
