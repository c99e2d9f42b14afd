"""Relay clusters on ZooKeeper (docs/clusters.md).

- ``_epochs``: a buffer's leadership epochs, kept with it (pure, one small file);
- ``_member``: election, roles and fencing of each buffer, on the session and lock
  recipes of ``databus.coordination`` (its ``Lease`` fences a paused leader);
- ``_setup``: wiring a member into a relay.
"""

from databus.relay.cluster._epochs import EpochEntry, EpochHistory, StaleEpochError
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
           "FencedSink", "Seat", "StaleEpochError", "epochs_path", "join_cluster",
           "member_url"]
