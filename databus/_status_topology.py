"""``databus status --zookeeper HOSTS``: the topology ZooKeeper holds, in the status
document beside what the services answer.

::

    databus status ... --zookeeper HOSTS     # host:port[,...][/chroot], or
                                             # digest:user:${PASSWORD_VAR}@host:port/chroot

Two keys of the status document (``databus._status_view``), there only with
``--zookeeper`` (without it the document is what it always was):

- ``"clusters"``: exactly what ``databus cluster status --json`` prints for every relay
  and bootstrap cluster under the chroot (``relay/cluster/_cli.py``: ``read_snapshot``
  and ``summarize``): ``{"zookeeper", "clusters": [relay cluster: name, mode, members,
  per buffer its leader, epoch and each member's role, epoch and max SCN, problems],
  "bootstrap": [bootstrap cluster: name, members, locks with holder and standbys],
  "ok"}``; ``{"zookeeper", "error"}`` when ZooKeeper could not be read;
- ``"groups"``: one entry per consumer group under ``/databus/groups``, exactly what
  ``databus group status --json`` prints for it (``client/group/_cli.py``): group,
  generation, leader, members with their lag, partitions with holder and checkpoint,
  problems, ``ok``; ``{"group", "error"}`` for a group that could not be read (a group
  created with digest credentials needs them: its nodes are readable by them only);
  ``[]`` when ZooKeeper could not be read (the error is in ``"clusters"``).

Readiness is unchanged (``ok``, ``ready`` and the counts speak of the services); the
exit status is also 1 when, with ``--zookeeper``, ZooKeeper could not be read, a buffer
of a leader-follower cluster has no leader, or a group has a problem
(``topology_ok``).

The reads are kazoo's blocking calls: ``read_topology`` runs in a thread of its own
(``collect`` awaits it beside the HTTP requests). ``topology_parts`` renders both keys
for the terminal with the renderers of ``databus cluster status`` and ``databus group
status``. Nothing here creates a node; no password is shown (the connect string is
displayed as ``digest:user:***@hosts``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Mapping
from typing import Any

from databus._redact import redact
from databus.errors import DatabusError
from databus.security._zookeeper import parse_zookeeper

__all__ = ["add_topology", "add_topology_args", "collect_topology", "read_topology",
           "topology_ok", "topology_parts"]


def add_topology_args(parser: argparse.ArgumentParser) -> None:
    """``--zookeeper HOSTS`` (checked when parsed: a bad one is a usage error)."""
    parser.add_argument("--zookeeper", metavar="HOSTS", type=_zookeeper_arg, default=None,
                        help="also show the relay and bootstrap clusters and the consumer "
                             "groups registered there: host:port[,host:port...][/chroot], "
                             "or digest:user:${PASSWORD_VAR}@host:port/chroot")


def _zookeeper_arg(text: str) -> str:
    try:
        parse_zookeeper(text, "--zookeeper")
    except DatabusError as exc:
        raise argparse.ArgumentTypeError(redact(str(exc))) from None
    return text


def read_topology(zookeeper: str, timeout: float, now: float | None = None
                  ) -> dict[str, Any]:
    """``{"clusters": ..., "groups": [...]}`` (module docstring), read now (blocking)."""
    from databus.client.group._cli import GROUPS_ROOT
    from databus.client.group._cli import read_snapshot as read_group
    from databus.client.group._cli import summarize as summarize_group
    from databus.coordination import read_only_session
    from databus.relay.cluster._cli import read_snapshot as read_clusters
    from databus.relay.cluster._cli import summarize as summarize_clusters

    display = parse_zookeeper(zookeeper).display
    try:
        snapshot = read_clusters(zookeeper, None, timeout=timeout)
        with read_only_session(zookeeper, timeout, "the consumer groups") as reader:
            names = reader.children(GROUPS_ROOT)
    except DatabusError as exc:
        return {"clusters": {"zookeeper": display, "error": redact(str(exc))}, "groups": []}
    clusters = summarize_clusters(snapshot, now=time.time() if now is None else now)
    clusters["zookeeper"] = display
    groups: list[dict[str, Any]] = []
    for name in names:
        try:
            group = summarize_group(read_group(zookeeper, name, timeout=timeout))
        except DatabusError as exc:
            groups.append({"group": name, "error": redact(str(exc))})
            continue
        group["coordinator"] = display
        groups.append(group)
    return {"clusters": clusters, "groups": groups}


async def collect_topology(zookeeper: str | None, timeout: float) -> dict[str, Any] | None:
    """``read_topology`` in a thread, or None without a connect string."""
    if zookeeper is None:
        return None
    return await asyncio.to_thread(read_topology, zookeeper, timeout)


def add_topology(document: dict[str, Any], topology: Mapping[str, Any] | None) -> None:
    """The document's ``clusters`` and ``groups`` (left out without ``--zookeeper``)."""
    if topology is not None:
        document["clusters"] = topology["clusters"]
        document["groups"] = list(topology["groups"])


def topology_ok(document: Mapping[str, Any]) -> bool:
    """False when ZooKeeper was asked and could not be read, a leader-follower buffer
    has no leader, or a group could not be read or has a problem."""
    clusters = document.get("clusters")
    if clusters is None:
        return True
    if "error" in clusters or not clusters.get("ok", True):
        return False
    return all("error" not in g and g.get("ok", True) for g in document.get("groups") or ())


def topology_parts(document: Mapping[str, Any]) -> list[Any]:
    """Rich renderables of ``clusters`` and ``groups`` (empty without them): the text
    tables of ``databus cluster status`` and ``databus group status``."""
    from rich.text import Text

    from databus._tables import ALERT
    from databus.client.group._cli import render as render_group
    from databus.relay.cluster._cli import render as render_clusters

    clusters = document.get("clusters")
    if clusters is None:
        return []
    where = f"ZooKeeper {clusters.get('zookeeper')}"
    if "error" in clusters:
        return [Text(f"{where}: {clusters['error']}", style=ALERT)]
    parts: list[Any] = [Text(f"Clusters ({where})", style="bold"),
                        Text(render_clusters(clusters).rstrip("\n"))]
    groups = document.get("groups") or []
    parts.append(Text(f"Consumer groups ({len(groups)})", style="bold"))
    for group in groups:
        if "error" in group:
            parts.append(Text(f"group {group['group']}: {group['error']}", style=ALERT))
        else:
            parts.append(Text(render_group(group).rstrip("\n")))
    return parts
