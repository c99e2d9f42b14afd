"""Relay clusters on ZooKeeper (DESIGN 15, docs/clusters.md).

- ``_epochs``: a buffer's leadership epochs, kept with it (pure, one small file);
- ``_lease``: the leader's lease, which fences a paused or cut-off leader (pure);
- ``_member``: the ZooKeeper session, registration, election and roles (kazoo);
- ``_setup``: wiring a member into a relay.
"""

from databus.relay.cluster._epochs import EpochEntry, EpochHistory, StaleEpochError
from databus.relay.cluster._lease import Lease
from databus.relay.cluster._member import (
    Assignment,
    ClusterMember,
    FencedError,
    FencedSink,
    Seat,
    epochs_path,
)
from databus.relay.cluster._setup import join_cluster, member_url

__all__ = ["Assignment", "ClusterMember", "EpochEntry", "EpochHistory", "FencedError",
           "FencedSink", "Lease", "Seat", "StaleEpochError", "epochs_path", "join_cluster",
           "member_url"]
