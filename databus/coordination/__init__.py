"""Coordination on ZooKeeper (kazoo), shared by relay clusters and bootstrap failover
(DESIGN 15, docs/clusters.md).

- ``_lease``: the holder's lease, which fences a paused or cut-off holder (pure);
- ``_member``: a process's session and its ephemeral member node;
- ``_contender``: waiting in a kazoo Lock and holding it, one thread.
"""

from databus.coordination._contender import LockContender
from databus.coordination._lease import Lease
from databus.coordination._member import ZooKeeperMember

__all__ = ["Lease", "LockContender", "ZooKeeperMember"]
