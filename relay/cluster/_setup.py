"""Wiring a ``ClusterMember`` into a relay (``[relay.cluster]``)."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from databus._limited_log import limited
from databus.relay.cluster._epochs import EpochHistory
from databus.relay.cluster._member import ClusterMember, Seat, epochs_path

if TYPE_CHECKING:
    from databus.relay._relay import Relay

__all__ = ["join_cluster", "member_url"]

log = logging.getLogger("databus.relay.cluster")


def member_url(relay: Relay) -> str:
    """Where other members and clients reach this relay."""
    cfg = relay.config
    assert cfg.cluster is not None
    scheme = "https" if cfg.tls is not None else "http"
    return cfg.cluster.advertise_url.rstrip("/") or f"{scheme}://{cfg.host}:{cfg.port}"


def join_cluster(relay: Relay) -> ClusterMember:
    """The member of ``relay``'s cluster, its seats given to the fetcher host (before
    the host starts: a follower must never read the source first)."""
    cfg = relay.config
    assert cfg.cluster is not None
    member = ClusterMember(cfg.cluster, member_url(relay))
    histories: dict[str, EpochHistory] = {}
    if cfg.cluster.mode == "leader-follower":
        for buffer_config in cfg.buffers:
            name = buffer_config.name
            history = EpochHistory.load(epochs_path(cfg.data_dir, name))
            histories[name] = history
            seat = Seat(member, name, buffer_config.source, relay.buffers[name], history,
                        functools.partial(_chain_sources, relay, member, name))
            member.add_seat(seat)
        relay.fetchers.seats = member.seats

    def buffers_status() -> dict[str, Any]:  # the member node's "buffers"
        out: dict[str, Any] = {}
        for name, buffer in relay.buffers.items():
            doc = member.buffer_status(name)
            out[name] = {"max_scn": buffer.state().max_scn, "role": doc["role"],
                         "epoch": doc["epoch"]}
        return out

    member.status_of = buffers_status
    member.histories = histories
    return member


def _chain_sources(relay: Relay, member: ClusterMember, buffer: str) -> list[str]:
    """The sources a follower asks its leader for: the names its configuration gives,
    or, for a ``db.*`` or all-tables configuration, the leader's sources of the buffer."""
    configured = relay.fetchers.configured_sources().get(buffer)
    if configured is not None and not configured.databases and not configured.everything:
        return sorted(configured.names)
    seat = member.seats[buffer]
    leader = seat.leader_url
    if leader is None:
        return []
    try:
        doc = member.http_json(f"{leader}/v1/sources")
    except (OSError, ValueError) as exc:
        limited(log).warning("buffer %s: the leader's sources cannot be read: %s", buffer,
                             exc, kind=buffer)
        return []
    return sorted(s["name"] for s in doc["sources"] if s.get("buffer") == buffer
                  and (configured is None or configured.matches(s["name"])))
