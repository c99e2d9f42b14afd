"""``databus group status``: a consumer group as ZooKeeper sees it (DESIGN 15, issue 17;
docs/clusters.md "``databus group status``").

::

    databus group status --coordinator HOSTS --group NAME [--json] [--timeout S]

``HOSTS`` is a ZooKeeper connect string, ``host:port[,host:port...][/chroot]``, also
accepted as ``zookeeper://host:port,.../chroot``; a group created with digest credentials
is read with them, ``digest:user:password@host:port/chroot`` (the password may be written
``${ENV_VAR}``, docs/clusters.md). It reads ZooKeeper only (no member is
asked anything), under the chroot (layout: ``_coordinator``'s docstring)::

    /databus/groups/<group>/members/member-<seq>  each member's JSON: "member" (its id);
                                                  optional "client_id", "partitions",
                                                  "relay_max_scn", "consumer_scn", "lag_ms",
                                                  "lag_seconds"
    /databus/groups/<group>/leader/...            kazoo Lock: the first contender leads
    /databus/groups/<group>/assignment            {"generation", "partitions", "owners"}
    /databus/groups/<group>/owners/<p>            who holds partition p now
    /databus/groups/<group>/checkpoints/<p>       partition p's checkpoint envelope

Three parts, as ``databus cluster status`` (``relay/cluster/_cli.py``): ``read_snapshot``
(kazoo, imported lazily; read-only, it creates no node), ``summarize`` (pure: the raw
snapshot -> the document ``--json`` prints) and ``render`` (pure: that document -> the
small tables printed otherwise).

Every field a member writes besides ``member`` is optional and may be of any type: a
value of the wrong type is shown as unknown (``null``), never an error. A damaged
assignment or checkpoint is shown as damaged, with the decoder's message.

Exit status: 0 when every partition of the assignment is held (its owner node exists);
1 when some partition has no holder (its owner left, or it is moving: revoked by the old
owner and not yet taken by the new one), when the assignment is damaged, when the group
has members but no assignment yet, when the group does not exist or ZooKeeper does not
answer within ``--timeout``; 2 for a wrong command line (argparse), which includes a
connect string that is not one, or one with credentials in it (refused; the password is
never printed) and a group name that cannot be a znode.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from databus._json import dumps as dumps_json
from databus._redact import redact
from databus._tables import text_table
from databus.coordination import lock_order, read_only_session
from databus.errors import ConfigError, DatabusError
from databus.security._zookeeper import parse_zookeeper

__all__ = [
    "exit_status",
    "parse_coordinator",
    "read_snapshot",
    "register",
    "render",
    "status",
    "summarize",
]

GROUPS_ROOT = "/databus/groups"
_SCHEME = "zookeeper://"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "group", help="consumer groups on ZooKeeper: status",
        description="Consumer groups as registered in ZooKeeper (docs/clusters.md).")
    actions = parser.add_subparsers(dest="group_action", metavar="ACTION", required=True)
    status_parser = actions.add_parser(
        "status", help="generation, leader, members, who holds each partition, checkpoints",
        description="Exit status 0, or 1 when an assigned partition has no holder (moving "
        "or unowned), the assignment is damaged or missing while members exist, the group "
        "does not exist, or ZooKeeper does not answer; 2 for a wrong command line.")
    status_parser.add_argument(
        "--coordinator", required=True, metavar="HOSTS", type=_coordinator_arg,
        help="ZooKeeper connect string, host:port[,host:port...][/chroot] (or "
             "zookeeper://host:port,.../chroot); a group with ACLs needs "
             "digest:user:${PASSWORD_VAR}@host:port/chroot")
    status_parser.add_argument("--group", required=True, metavar="NAME", type=_group_arg,
                               help="the consumer group")
    status_parser.add_argument("--json", action="store_true",
                               help="print JSON instead of tables")
    status_parser.add_argument("--timeout", type=_timeout_arg, default=10.0, metavar="S",
                               help="give up when ZooKeeper does not answer within S "
                                    "seconds (default 10)")
    status_parser.set_defaults(handler=_status)


def _coordinator_arg(text: str) -> str:
    try:
        return parse_coordinator(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _group_arg(text: str) -> str:
    from databus.client.group._coordinator import group_root

    try:
        group_root(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def _timeout_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}"
                                         ) from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 600 s, got {text}")
    return value


def parse_coordinator(text: str) -> str:
    """The kazoo connect string of ``--coordinator``: the ``zookeeper://`` scheme is
    stripped; ``ConfigError`` for anything else than ``host:port[,...][/chroot]``,
    optionally after ``digest:user:password@`` (the credentials that may read the
    group, docs/clusters.md). Other credentials are refused; a password is registered
    first, so that no message ever shows it."""
    if not isinstance(text, str):
        raise ConfigError(f"expected a connect string, got {type(text).__name__}")
    hosts = text[len(_SCHEME):] if text.lower().startswith(_SCHEME) else text
    try:
        parse_zookeeper(hosts, "coordinator")
    except ConfigError as exc:
        raise ConfigError(redact(exc.message)) from None
    return hosts


def _status(args: argparse.Namespace) -> int:
    return status(args.coordinator, args.group, as_json=args.json, timeout=args.timeout,
                  out=sys.stdout)


def status(coordinator: str, group: str, *, as_json: bool = False, timeout: float = 10.0,
           out: TextIO = sys.stdout) -> int:
    """Print the status of consumer group ``group`` and return the exit status. Raises
    ``DatabusError`` (the command line prints it, exit 1) when the group does not exist
    or ZooKeeper cannot be read, ``ConfigError`` for a wrong connect string or name."""
    from databus.client.group._coordinator import group_root

    hosts = parse_coordinator(coordinator)
    group_root(group)  # a clear ConfigError for a name that cannot be a znode
    snapshot = read_snapshot(hosts, group, timeout=timeout)
    doc = summarize(snapshot)
    doc["coordinator"] = parse_zookeeper(hosts).display
    if as_json:
        out.write(dumps_json(doc, indent=2, sort_keys=True) + "\n")
    else:
        out.write(render(doc))
    out.flush()
    return exit_status(doc)


# -- reading ZooKeeper ----------------------------------------------------------------


def read_snapshot(hosts: str, group: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """What ZooKeeper holds for ``group``, raw: ``{"group", "members": [{"node", "data"}],
    "contenders": [data of each leader-lock contender, in lock order], "assignment":
    data | None, "owners": {child: data}, "checkpoints": {child: data}}`` (data: bytes).
    ``ZooKeeperUnreachable`` when no server answers within ``timeout``; ``ConfigError``
    when the group does not exist; ``DatabusError`` when a read fails."""
    from databus.client.group._coordinator import group_root

    root = group_root(group)
    with read_only_session(hosts, timeout, f"consumer group {group!r}") as reader:
        if reader.data(root) is None:
            groups = reader.children(GROUPS_ROOT)
            raise ConfigError(
                f"no consumer group {group!r} in ZooKeeper {parse_zookeeper(hosts)} (no "
                f"node {root}; "
                f"groups: {', '.join(groups) or 'none'})")
        members = [{"node": node, "data": data}
                   for node, data in reader.datas(f"{root}/members",
                                                  reader.children(f"{root}/members"))]
        lock = f"{root}/leader"
        contenders = [data for _node, data in
                      reader.datas(lock, lock_order(reader.children(lock)))]
        return {
            "group": group,
            "members": members,
            "contenders": contenders,
            "assignment": reader.data(f"{root}/assignment"),
            "owners": dict(reader.datas(f"{root}/owners",
                                        reader.children(f"{root}/owners"))),
            "checkpoints": dict(reader.datas(f"{root}/checkpoints",
                                             reader.children(f"{root}/checkpoints"))),
        }


# -- the document -----------------------------------------------------------------------


def _object(raw: bytes | str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list):
        return None
    ints = [_int(v) for v in value]
    return sorted(v for v in ints if v is not None) if None not in ints else None


def _partition_of(child: str) -> int | None:
    """``owners/<p>`` and ``checkpoints/<p>``: the partition number, or None when the
    child's name is not one (``"007"`` is not: the coordinator writes ``str(p)``)."""
    return int(child) if child.isdigit() and str(int(child)) == child else None


def _bytes(raw: Any) -> bytes:
    if isinstance(raw, bytes):
        return raw
    return str(raw).encode("utf-8", "surrogatepass")


def summarize(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The status document (pure): the assignment's generation and partition count, the
    leader, the members with their assigned and held partitions and what they report,
    per partition its assigned owner, holder, state, checkpoint and lag in SCN, the
    problems (each makes the exit status 1) and warnings; ``ok`` is false when there is
    a problem."""
    from databus.client._checkpoint_envelope import decode_envelope
    from databus.client._dispatcher import checkpoint_scn
    from databus.client.group._coordinator import decode_assignment, group_root

    group = str(snapshot.get("group", ""))
    root = group_root(group) if group else GROUPS_ROOT + "/?"
    problems: list[str] = []
    warnings: list[str] = []

    # the assignment
    generation: int | None = None
    count: int | None = None
    owners: dict[str, tuple[int, ...]] | None = None
    assignment_error: str | None = None
    raw_assignment = snapshot.get("assignment")
    if raw_assignment is not None:
        try:
            assignment = decode_assignment(_bytes(raw_assignment),
                                           f"assignment znode {root}/assignment")
        except ConfigError as exc:
            assignment_error = exc.message
            problems.append(f"the assignment is damaged: {exc.message}")
        else:
            generation, count, owners = (assignment.generation, assignment.partitions,
                                         dict(assignment.owners))
    assigned_to = {p: m for m, parts in (owners or {}).items() for p in parts}

    # who holds what
    holders: dict[int, tuple[str | None, int | None]] = {}
    for child, raw in sorted(snapshot.get("owners", {}).items()):
        p = _partition_of(child)
        if p is None:
            warnings.append(f"owner node {root}/owners/{child} is not a partition number")
            continue
        body = _object(raw)
        member = _text(body.get("member")) if body is not None else None
        if member is None:
            warnings.append(f"owner node of partition {p} does not name a member")
        holders[p] = (member, _int(body.get("generation")) if body is not None else None)

    # the members
    members: list[dict[str, Any]] = []
    for m in snapshot.get("members", []):
        node = str(m.get("node"))
        body = _object(m.get("data"))
        if body is None:
            warnings.append(f"member node {node} is not a JSON object")
            body = {}
        member = _text(body.get("member"))
        if member is None:
            warnings.append(f"member node {node} has no member id")
        members.append({
            "node": node,
            "member": member,
            "client_id": _text(body.get("client_id")),
            "assigned": (None if owners is None or member is None
                         else list(owners.get(member, ()))),
            "held": sorted(p for p, (who, _gen) in holders.items()
                           if member is not None and who == member),
            "running": _int_list(body.get("partitions")),
            "relay_max_scn": _int(body.get("relay_max_scn")),
            "consumer_scn": _int(body.get("consumer_scn")),
            "lag_ms": _number(body.get("lag_ms")),
            # DESIGN 17: the alert figure (None: unknown, e.g. no relay answered yet).
            "lag_seconds": _number(body.get("lag_seconds")),
        })
    members.sort(key=lambda row: (row["member"] is None, row["member"] or "", row["node"]))
    live = {row["member"] for row in members if row["member"] is not None}
    reported = [row["relay_max_scn"] for row in members if row["relay_max_scn"] is not None]
    relay_max_scn = max(reported) if reported else None
    if not members:
        warnings.append("no members")
    if raw_assignment is None and members:
        problems.append("no assignment yet: the leader has not written one")

    # the leader
    contenders = [_bytes(c).decode("utf-8", "replace") for c in snapshot.get("contenders", [])]
    leader = contenders[0] if contenders else None
    if leader is None and members:
        warnings.append("no leader: no member holds the leader lock")

    # the partitions
    checkpoints: dict[int, Any] = {}
    for child, raw in snapshot.get("checkpoints", {}).items():
        p = _partition_of(child)
        if p is None:
            warnings.append(f"checkpoint node {root}/checkpoints/{child} is not a "
                            "partition number")
            continue
        checkpoints[p] = raw
    numbers = set(range(count)) if count is not None else set()
    numbers |= set(holders) | set(checkpoints)
    partitions: list[dict[str, Any]] = []
    for p in sorted(numbers):
        assigned = assigned_to.get(p)
        holder, holder_generation = holders.get(p, (None, None))
        held = p in holders
        if count is not None and p >= count:
            warnings.append(f"partition {p} is beyond the assignment's {count} partitions")
        if held and holder is not None and holder == assigned:
            state = "held"
        elif held and holder is None:
            state = "unreadable"
            problems.append(f"partition {p}: its owner node names no member")
        elif held:
            state = "moving"  # the old owner still holds it
        elif assigned is not None and assigned in live:
            state = "moving"  # revoked, not yet taken by its new owner
            problems.append(f"partition {p} has no holder (moving to {assigned})")
        elif count is not None and p < count:
            state = "unowned"
            whom = (f"assigned to {assigned}, which has no member node" if assigned
                    else "assigned to nobody")
            problems.append(f"partition {p} has no holder ({whom})")
        else:
            state = "unowned"  # no (readable) assignment: nothing says it should be held
        row: dict[str, Any] = {
            "partition": p, "assigned": assigned, "holder": holder,
            "holder_generation": holder_generation, "state": state,
            "checkpoint_scn": None, "checkpoint_mode": None, "checkpoint_error": None,
            "lag_scn": None,
        }
        if p in checkpoints:
            where = f"checkpoint znode {root}/checkpoints/{p}"
            try:
                checkpoint = decode_envelope(
                    _bytes(checkpoints[p]), where=where,
                    recovery=f"Restore the znode's data, or delete it to start the partition "
                             f"without a checkpoint (zkCli.sh delete {root}/checkpoints/{p}).")
            except DatabusError as exc:
                row["checkpoint_error"] = exc.message
                warnings.append(f"partition {p}: the checkpoint is damaged: {exc.message}")
            else:
                row["checkpoint_mode"] = checkpoint.mode.value
                row["checkpoint_scn"] = scn = checkpoint_scn(checkpoint)
                if scn is not None and relay_max_scn is not None:
                    row["lag_scn"] = max(0, relay_max_scn - scn)
        partitions.append(row)

    return {
        "group": group,
        "generation": generation,
        "partition_count": count,
        "assignment_error": assignment_error,
        "leader": leader,
        "leader_waiting": contenders[1:],
        "relay_max_scn": relay_max_scn,
        "members": members,
        "partitions": partitions,
        "problems": problems,
        "warnings": warnings,
        "ok": not problems,
    }


def exit_status(doc: Mapping[str, Any]) -> int:
    """1 when the document has a problem (an assigned partition without holder, a
    damaged or missing assignment), else 0."""
    return 0 if doc.get("ok", True) else 1


# -- the tables -----------------------------------------------------------------------------


def ranges(parts: Iterable[int] | None) -> str | None:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8``; ``[]`` -> ``none``; None -> None."""
    if parts is None:
        return None
    out: list[str] = []
    run: list[int] = []
    for p in sorted(set(parts)):
        if run and p == run[-1] + 1:
            run.append(p)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [p]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out) or "none"


def render(doc: Mapping[str, Any]) -> str:
    """The document as small text tables (pure)."""
    out: list[str] = []
    if doc.get("assignment_error"):
        head = "assignment DAMAGED"
    elif doc.get("generation") is None:
        head = "no assignment"
    else:
        count = doc.get("partition_count")
        head = (f"generation {doc['generation']}, {count} partition"
                f"{'' if count == 1 else 's'}")
    out.append(f"group {doc.get('group')}: {head}, leader {doc.get('leader') or 'NONE'}\n")
    members = doc.get("members", [])
    out.append(f"members ({len(members)}):\n")
    if members:
        out.append(text_table(
            ["MEMBER", "CLIENT", "ASSIGNED", "HELD", "RELAY MAX SCN", "CONSUMER SCN",
             "LAG MS", "LAG S"],
            [[m["member"] if m["member"] is not None else f"? ({m['node']})", m["client_id"],
              ranges(m["assigned"]), ranges(m["held"]), m["relay_max_scn"],
              m["consumer_scn"], m["lag_ms"],
              "unknown" if m.get("lag_seconds") is None else m["lag_seconds"]]
             for m in members]))
    partitions = doc.get("partitions", [])
    if partitions:
        out.append("partitions:\n")
        out.append(text_table(
            ["PARTITION", "ASSIGNED", "HOLDER", "STATE", "CHECKPOINT SCN", "LAG SCN"],
            [[r["partition"], r["assigned"], r["holder"], r["state"], _checkpoint_cell(r),
              r["lag_scn"]] for r in partitions]))
    for problem in doc.get("problems", []):
        out.append(f"problem: {problem}\n")
    for warning in doc.get("warnings", []):
        out.append(f"warning: {warning}\n")
    return "".join(out)


def _checkpoint_cell(row: Mapping[str, Any]) -> str | None:
    if row.get("checkpoint_error"):
        return "DAMAGED"
    mode, scn = row.get("checkpoint_mode"), row.get("checkpoint_scn")
    if mode is None:
        return None
    if mode == "online":
        return "- (online)" if scn is None else str(scn)
    return f"- ({mode})" if scn is None else f"{scn} ({mode})"
