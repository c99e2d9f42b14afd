"""``databus cluster status``: relay clusters (and bootstrap clusters) as ZooKeeper sees
them (DESIGN 15, docs/clusters.md "``databus cluster status``").

::

    databus cluster status --zookeeper HOSTS [--cluster NAME ...] [--json] [--timeout S]
                           [--probe [--ca-file PEM] [--cert-file PEM --key-file PEM]
                            [--token TOKEN]]

It reads ZooKeeper only (no relay is asked anything, unless ``--probe``), under the
connect string's chroot:

    /databus/relays/<cluster>/members/member-<seq>     each member's JSON: url, mode,
                                                       per buffer role, epoch, max SCN
    /databus/relays/<cluster>/buffers/<buffer>/lock    the election: first contender leads
    /databus/relays/<cluster>/buffers/<buffer>/epoch   the buffer's newest epoch
    /databus/bootstrap/<cluster>/members/member-<seq>  each bootstrap service's JSON:
                                                       url, what it runs ("runs")
    /databus/bootstrap/<cluster>/stores/<id>/producer  kazoo Lock: who runs the producer
    /databus/bootstrap/<cluster>/stores/<id>/applier   kazoo Lock: who runs the applier

Three parts: ``read_snapshot`` (kazoo, imported lazily; read-only, it creates no node),
``summarize`` (pure: the raw snapshot -> the document ``--json`` prints) and
``render`` (pure: that document -> the small tables printed otherwise). The exit status
is 0, or 1 when a buffer of a leader-follower cluster has no leader (or a cluster
asked for does not exist; ZooKeeper unreachable is an error, also 1). ``--cluster``
names relay or bootstrap clusters (they have names of their own), repeatable.

``--probe`` also asks every relay member's URL (as it registered it, ``http://`` or
``https://``) for ``/readyz``, presenting the TLS and token flags (DESIGN 18;
databus.security._client_tools), and shows each answer in a ``PROBE`` column:
``ready``, ``not ready``, or why it could not be asked (a certificate that does not
verify, a refused connection), one line each; it does not change the exit status.

Bootstrap clusters (``[bootstrap.cluster]``, ``bootstrap/_cluster.py``) are read
without depending on that module: every node under ``/databus/bootstrap/<cluster>/``
whose children are kazoo lock contenders (``...__lock__<seq>``) is a lock, shown with
its holder (the first contender's identifier: a member URL) and the standbys; a lock at
``stores/<id>/<component>`` is shown as that store's producer or applier. The member
nodes (under ``members``) are listed with what each says it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from databus._json import dumps as dumps_json
from databus._tables import text_table
from databus.coordination import ReadOnlyZooKeeper, lock_order, read_only_session
from databus.errors import ConfigError
from databus.security import ClientCredentials
from databus.security._client_tools import (
    add_client_args,
    check_files,
    connection_problem,
    credentials_from,
)
from databus.security._zookeeper import parse_zookeeper

__all__ = ["exit_status", "lock_order", "read_snapshot", "register", "render", "summarize"]

RELAYS_ROOT = "/databus/relays"
BOOTSTRAP_ROOT = "/databus/bootstrap"
_MAX_WALK_NODES = 2000  # bounds the generic walk of a bootstrap cluster's tree
_MAX_WALK_DEPTH = 6


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cluster", help="relay clusters on ZooKeeper: status",
        description="Relay clusters (and bootstrap clusters) as registered in ZooKeeper "
        "(docs/clusters.md).")
    actions = parser.add_subparsers(dest="cluster_action", metavar="ACTION", required=True)
    status = actions.add_parser(
        "status", help="members, leaders, epochs, max SCNs; who runs which producer/applier",
        description="Exit status 0, or 1 when a buffer of a leader-follower cluster has "
        "no leader.")
    status.add_argument("--zookeeper", required=True, metavar="HOSTS",
                        help="connect string, host:port[,host:port...][/chroot], or "
                             "digest:user:${PASSWORD_VAR}@host:port/chroot")
    status.add_argument("--cluster", metavar="NAME", action="append",
                        help="only this relay or bootstrap cluster (repeatable; default: "
                             "every cluster found)")
    status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    status.add_argument("--timeout", type=float, default=10.0, metavar="S",
                        help="give up when ZooKeeper does not answer within S seconds "
                             "(default 10)")
    status.add_argument("--probe", action="store_true",
                        help="also ask each relay member's /readyz (with the TLS and token "
                             "flags below)")
    add_client_args(status)
    status.set_defaults(handler=_status)


def _status(args: argparse.Namespace) -> int:
    credentials = credentials_from(args) if args.probe else None
    return status(args.zookeeper, args.cluster, as_json=args.json, timeout=args.timeout,
                  out=sys.stdout, probe=credentials)


def status(zookeeper: str, clusters: str | Sequence[str] | None, *, as_json: bool = False,
           timeout: float = 10.0, out: TextIO = sys.stdout,
           probe: ClientCredentials | None = None) -> int:
    """Print the status of ``clusters`` (names of relay or bootstrap clusters; None:
    every one) and return the exit status."""
    from databus.client._discovery import validate_discovery

    names = [clusters] if isinstance(clusters, str) else clusters
    for name in names or ["any"]:
        validate_discovery(zookeeper, name, timeout)
    snapshot = read_snapshot(zookeeper, names, timeout=timeout)
    doc = summarize(snapshot, now=time.time())
    doc["zookeeper"] = parse_zookeeper(zookeeper).display  # never the password
    if probe is not None:
        probe_members(doc, probe, timeout=timeout)
    if as_json:
        out.write(dumps_json(doc, indent=2, sort_keys=True) + "\n")
    else:
        out.write(render(doc))
    out.flush()
    return exit_status(doc)


# -- probing the members ----------------------------------------------------------------


def probe_url(url: str, credentials: ClientCredentials, timeout: float) -> str:
    """``ready``, ``not ready (HTTP <status>)``, or why ``url``'s ``/readyz`` could not
    be asked, in one line (never a token)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{url.rstrip('/')}/readyz",
                                     headers=credentials.headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout,
                                    context=credentials.ssl_for(url)) as resp:
            resp.read(1 << 16)
            return "ready" if resp.status == 200 else f"not ready (HTTP {resp.status})"
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return f"refused (HTTP {exc.code}): check --token"
        return f"not ready (HTTP {exc.code})"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        problem = connection_problem(url, exc)
        if problem is not None:
            return problem
        return f"cannot ask: {getattr(exc, 'reason', None) or exc}"


def probe_members(doc: dict[str, Any], credentials: ClientCredentials, *,
                  timeout: float) -> None:
    """Add ``probe`` (``probe_url``'s answer) to every relay member of ``doc`` with a
    URL, all asked at once."""
    from concurrent.futures import ThreadPoolExecutor

    members = [m for c in doc.get("clusters", []) for m in c["members"]
               if isinstance(m.get("url"), str) and m["url"].startswith(("http://",
                                                                          "https://"))]
    check_files(credentials, [m["url"] for m in members])
    if not members:
        return
    with ThreadPoolExecutor(max_workers=min(16, len(members))) as pool:
        answers = list(pool.map(lambda m: probe_url(m["url"], credentials, timeout),
                                members))
    for member, answer in zip(members, answers, strict=True):
        member["probe"] = answer


# -- reading ZooKeeper ----------------------------------------------------------------


def read_snapshot(zookeeper: str, clusters: Sequence[str] | None, *,
                  timeout: float = 10.0) -> dict[str, Any]:
    """What ZooKeeper holds for the relay and bootstrap clusters named ``clusters``
    (every one: None), raw: ``{"relays": {name: {"members": [{"node", "data"}],
    "buffers": {buffer: {"contenders": [...], "epoch": text}}}}, "bootstrap": {name:
    {"locks": {path: [contenders]}, "members": [{"node", "data"}]}}}``."""
    with read_only_session(zookeeper, timeout, "the clusters") as session:
        reader = _Reader(session.client, session.timeout)
        relays = reader.children(RELAYS_ROOT)
        boot = reader.children(BOOTSTRAP_ROOT)
        if clusters:
            for name in clusters:
                if name not in relays and name not in boot:
                    raise ConfigError(
                        f"no relay cluster {name!r} in ZooKeeper "
                        f"{parse_zookeeper(zookeeper)} (relay "
                        f"clusters: {', '.join(relays) or 'none'}; bootstrap clusters: "
                        f"{', '.join(boot) or 'none'})")
            relays = [c for c in relays if c in clusters]
            boot = [c for c in boot if c in clusters]
        snapshot: dict[str, Any] = {"relays": {}, "bootstrap": {}}
        for name in relays:
            snapshot["relays"][name] = reader.relay_cluster(f"{RELAYS_ROOT}/{name}")
        for name in boot:
            snapshot["bootstrap"][name] = reader.bootstrap_cluster(f"{BOOTSTRAP_ROOT}/{name}")
        return snapshot


class _Reader(ReadOnlyZooKeeper):
    """The relay and bootstrap cluster trees."""

    def text(self, path: str) -> str | None:
        data = self.data(path)
        return None if data is None else data.decode("utf-8", "replace")

    def contenders(self, lock_path: str) -> list[str]:
        out = []
        for node in lock_order(self.children(lock_path)):
            ident = self.text(f"{lock_path}/{node}")
            if ident is not None:
                out.append(ident)
        return out

    def relay_cluster(self, root: str) -> dict[str, Any]:
        members = [{"node": node, "data": self.text(f"{root}/members/{node}")}
                   for node in self.children(f"{root}/members")]
        buffers = {}
        for buffer in self.children(f"{root}/buffers"):
            base = f"{root}/buffers/{buffer}"
            buffers[buffer] = {"contenders": self.contenders(f"{base}/lock"),
                               "epoch": self.text(f"{base}/epoch")}
        return {"members": [m for m in members if m["data"] is not None],
                "buffers": buffers}

    def bootstrap_cluster(self, root: str) -> dict[str, Any]:
        """The generic hook (module docstring): locks and their contenders, members."""
        locks: dict[str, list[str]] = {}
        members: list[dict[str, Any]] = []
        todo: list[tuple[str, int]] = [(root, 0)]
        seen = 0
        while todo and seen < _MAX_WALK_NODES:
            path, depth = todo.pop()
            kids = self.children(path)
            seen += 1 + len(kids)
            rel = path[len(root) + 1:]
            parts = rel.split("/")
            if lock_order(kids) or (len(parts) == 3 and parts[0] == "stores"):
                locks[rel or "."] = self.contenders(path)  # held, or (no children) not
                continue
            if path.rsplit("/", 1)[-1] == "members":
                for kid in kids:
                    data = self.text(f"{path}/{kid}")
                    if data is not None:
                        members.append({"node": kid, "data": data})
                continue
            if depth < _MAX_WALK_DEPTH:
                todo.extend((f"{path}/{kid}", depth + 1) for kid in reversed(kids))
        return {"locks": dict(sorted(locks.items())), "members": members}


# -- the document -----------------------------------------------------------------------


def _json(text: str | None) -> dict[str, Any]:
    try:
        doc = json.loads(text or "")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _int(text: Any) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def summarize(snapshot: Mapping[str, Any], *, now: float) -> dict[str, Any]:
    """The status document (pure). Per relay cluster: its mode, members (url, mode,
    updated_at and its age), per buffer the leader (the election's first contender),
    the epoch, each member's role, epoch and max SCN, and the problems found; then the
    bootstrap clusters' locks and holders; ``ok`` is false when a problem was found."""
    clusters = []
    for name, raw in sorted(snapshot.get("relays", {}).items()):
        members = []
        for m in raw.get("members", []):
            doc = _json(m.get("data"))
            updated = doc.get("updated_at")
            updated = float(updated) if isinstance(updated, int | float) else None
            members.append({
                "node": m.get("node"), "url": doc.get("url"), "mode": doc.get("mode"),
                "updated_at": updated,
                "age_s": None if updated is None else round(max(0.0, now - updated), 1),
                "buffers": doc.get("buffers") if isinstance(doc.get("buffers"), dict) else {},
            })
        modes = sorted({str(m["mode"]) for m in members if m["mode"]})
        elections = raw.get("buffers", {})
        mode = (modes[0] if len(modes) == 1 else "mixed" if modes
                else "leader-follower" if elections else "unknown")
        names = sorted({*elections, *(b for m in members for b in m["buffers"])})
        buffers, problems = [], []
        for buffer in names:
            election = elections.get(buffer, {})
            contenders = list(election.get("contenders", []))
            leader = contenders[0] if contenders else None
            rows = []
            for m in members:
                info = m["buffers"].get(buffer)
                if not isinstance(info, dict):
                    continue
                rows.append({"url": m["url"], "role": info.get("role"),
                             "epoch": info.get("epoch"), "max_scn": info.get("max_scn")})
            elected = bool(election) or any(m["mode"] == "leader-follower" and buffer in
                                            m["buffers"] for m in members)
            if elected and leader is None:
                problems.append(f"buffer {buffer} has no leader")
            buffers.append({"name": buffer, "leader_follower": elected, "leader": leader,
                            "waiting": contenders[1:], "epoch": _int(election.get("epoch")),
                            "members": rows})
        if not members:
            problems.append("no members")
        clusters.append({"name": name, "mode": mode,
                         "members": [{k: v for k, v in m.items() if k != "buffers"}
                                     for m in members],
                         "buffers": buffers, "problems": problems})
    bootstrap = []
    for name, raw in sorted(snapshot.get("bootstrap", {}).items()):
        locks = []
        for path, holders in raw.get("locks", {}).items():
            parts = path.split("/")
            store, component = ((parts[1], parts[2]) if len(parts) == 3
                                and parts[0] == "stores" else (None, None))
            locks.append({"lock": path, "store": store, "component": component,
                          "holder": holders[0] if holders else None,
                          "waiting": holders[1:]})
        members = []
        for m in raw.get("members", []):
            doc = _json(m.get("data"))
            updated = doc.get("updated_at")
            age = (round(max(0.0, now - float(updated)), 1)
                   if isinstance(updated, int | float) else None)
            members.append({"node": m.get("node"), **doc, "age_s": age})
        bootstrap.append({"name": name, "locks": locks, "members": members})
    leaderless = any(p.endswith("has no leader") for c in clusters for p in c["problems"])
    return {"clusters": clusters, "bootstrap": bootstrap, "ok": not leaderless}


def exit_status(doc: Mapping[str, Any]) -> int:
    """1 when a buffer of a leader-follower cluster has no leader, else 0."""
    return 0 if doc.get("ok", True) else 1


# -- the tables -----------------------------------------------------------------------------


def render(doc: Mapping[str, Any]) -> str:
    """The document as small text tables (pure)."""
    out: list[str] = []
    if not doc.get("clusters") and not doc.get("bootstrap"):
        out.append(f"no relay clusters under {RELAYS_ROOT}\n")
    for c in doc.get("clusters", []):
        count = len(c["members"])
        out.append(f"relay cluster {c['name']} ({c['mode']}), {count} member"
                   f"{'' if count == 1 else 's'}\n")
        if c["members"]:
            probed = any("probe" in m for m in c["members"])
            out.append(text_table(["MEMBER", "MODE", "UPDATED"] + (["PROBE"] if probed else []), [
                [m["url"], m["mode"], None if m["age_s"] is None else f"{m['age_s']:.1f} s ago"]
                + ([m.get("probe")] if probed else [])
                for m in c["members"]]))
        for b in c["buffers"]:
            if b["leader_follower"]:
                epoch = "" if b["epoch"] is None else f", epoch {b['epoch']}"
                out.append(f"  buffer {b['name']}: leader {b['leader'] or 'NONE'}{epoch}\n")
            else:
                out.append(f"  buffer {b['name']}: independent (every member reads the "
                           "source)\n")
            if b["members"]:
                out.append(text_table(["MEMBER", "ROLE", "EPOCH", "MAX SCN"], [
                    [r["url"], r["role"], r["epoch"], r["max_scn"]] for r in b["members"]],
                    indent="    "))
        for problem in c["problems"]:
            out.append(f"  problem: {problem}\n")
    for bc in doc.get("bootstrap", []):
        count = len(bc["members"])
        out.append(f"bootstrap cluster {bc['name']}, {count} member"
                   f"{'' if count == 1 else 's'}\n")
        if bc["members"]:
            out.append(text_table(["MEMBER", "RUNS", "UPDATED"], [
                [m.get("url"), _runs(m.get("runs")),
                 None if m["age_s"] is None else f"{m['age_s']:.1f} s ago"]
                for m in bc["members"]]))
        if bc["locks"]:
            out.append(text_table(["STORE", "RUNS", "HELD BY", "STANDBY"], [
                [lk["store"] or lk["lock"], lk["component"] or "lock", lk["holder"] or "NONE",
                 ", ".join(lk["waiting"]) or None] for lk in bc["locks"]]))
    return "".join(out)


def _runs(runs: Any) -> str:
    """``{"producer": [sources], "applier": []}`` -> ``producer (2 sources)``."""
    if not isinstance(runs, dict):
        return "-"
    parts = [f"{component} ({len(sources)} source{'' if len(sources) == 1 else 's'})"
             for component, sources in sorted(runs.items())
             if isinstance(sources, list) and sources]
    return ", ".join(parts) or "standby"
