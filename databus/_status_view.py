"""``databus status``: one view of relays, bootstrap services, fetchers and consumers.

::

    databus status --relay URL [URL ...] [--bootstrap URL [URL ...]]
                   [--replicator URL [URL ...]] [--zookeeper HOSTS]
                   [--json | --watch [SECONDS]] [--wide] [--timeout SECONDS]
                   [--ca-file PEM] [--cert-file PEM --key-file PEM] [--token TOKEN]

``https://`` services are verified against ``--ca-file`` (default: the system's CAs);
the reader token (``--token``, or ``DATABUS_TOKEN``) goes with every request
(DESIGN 18). A service that refuses it (401, 403) or whose certificate does not verify
is shown as that service's error, like one that does not answer.

Two halves. The pure half turns the JSON documents the services answer (a relay's
``/v1/status`` and ``/v1/consumers``, a bootstrap service's ``/v1/status``) into this
command's own JSON document (``relay_entry``, ``bootstrap_entry``, ``build_document``)
and that document into rich tables (``render``); it is tested on plain dicts. The
shell (``fetch_answer``, ``collect``, ``run``) fetches the documents with aiohttp, every
service at once and each request bounded by ``--timeout``, and prints once, as JSON, or
refreshed in place.

The JSON document (``--json``; keys are stable, documented in docs/operations.md)::

    {"version": 1, "generated_at": <unix time>, "ok": <every service answered>,
     "down": <services that did not>,
     "ready": <every service answered and every component is ready>,
     "not_ready": <components not ready, all services together>,
     "relays": [<relay entry> | {"url": ..., "error": ...}],
     "bootstraps": [<bootstrap entry> | {"url": ..., "error": ...}],
     "replicators": [<replicator entry> | {"url": ..., "error": ...}],
     "clusters": <what `databus cluster status --json` prints>,
     "groups": [<what `databus group status --json` prints, per group>]}

``clusters`` and ``groups`` are there only with ``--zookeeper``
(databus/_status_topology.py reads them and documents them).

Each entry of a service that answered has ``"ready"`` and ``"not_ready"`` (the entries
of its ``/readyz``: component, state, error, message, fix), computed from its
``/v1/status`` by the very function its ``/readyz`` applies (``relay/_readiness.py``,
``bootstrap/_readiness.py``, ``replicator/_readiness.py``): status and ``/readyz``
never disagree.

A relay whose ``/v1/consumers`` answers 404 (a relay older than the consumer registry)
gets ``"consumers": null, "consumers_error": "not available"``: it is up, only that
part of the view is missing. URLs are printed with their password replaced by ``***``
and every error message goes through ``databus._redact``.

The tables fit the terminal's width (databus/_status_render.py, databus/_tables.py:
numbers, SCNs and URLs never cut; URLs as host:port and the least needed columns hidden
when needed); ``--wide`` lays them out on an unlimited width, everything shown. With
``--watch`` a service that stops answering keeps its last rows, marked stale.

Exit status: 0 when every named service answered its ``/v1/status`` and every
component it shows is ready (what its ``/readyz`` would answer 200 for); 1 when any
service did not answer or anything is not ready (a failed or backing-off fetcher, a
fenced producer, a replicator not applying, a quarantined source...), or on a bad
argument such as a URL that is not http(s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from databus._json import dumps as dumps_json
from databus._redact import redact, register_uri

# The rows and the width rules of the tables (re-exported: the command's pure half).
from databus._status_render import (
    _int,
    _number,
    bootstrap_rows,
    buffer_rows,
    consumer_rows,
    dump_cells,
    dump_rows,
    fetcher_rows,
    keep_last_answers,
    lag_text,
    quarantine_rows,
    status_table,
)
from databus._status_render import service_rows as _service_rows
from databus._tables import ALERT, Styled
from databus.config import redact_uri
from databus.errors import ConfigError

if TYPE_CHECKING:
    import aiohttp
    from rich.console import Console, Group

__all__ = [
    "ALERT",
    "DOCUMENT_VERSION",
    "Answer",
    "Styled",
    "add_service_args",
    "bootstrap_entry",
    "bootstrap_rows",
    "buffer_rows",
    "build_document",
    "collect",
    "consumer_rows",
    "dump_cells",
    "dump_rows",
    "fetcher_rows",
    "lag_text",
    "quarantine_rows",
    "register",
    "relay_entry",
    "render",
]

DOCUMENT_VERSION = 1
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_WATCH_S = 2.0
# What a consumer entry carries, in this order, whatever else a relay adds: the JSON
# document's keys stay the same across relay versions (a missing one is null).
CONSUMER_KEYS = (
    "client_id", "buffer", "address", "filter", "sources", "streaming", "checkpoint_scn",
    "window_offset", "lag_scn", "lag_ms", "lag_seconds", "events_per_second",
    "bytes_per_second",
    "events_total", "bytes_total", "first_seen", "last_seen", "idle_s",
)
REGISTRY_KEYS = ("tracked", "max_tracked", "expiry_s", "evicted_total")
NOT_AVAILABLE = "not available"
# A document bigger than this is not a status document (and must not eat the memory of
# a command that watches for hours).
MAX_DOCUMENT_BYTES = 16 << 20


# -- the pure half: documents in, entries out -------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One GET: the decoded JSON document, or why there is none (``status`` is the HTTP
    status when one came back, so a 404 can be told from a dead relay)."""

    doc: Any = None
    error: str | None = None
    status: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def display_url(url: str) -> str:
    """``url`` as printed: its password (and secret-looking query values) masked."""
    return redact(redact_uri(url))


def _fetcher(doc: Any, now: float) -> dict[str, Any] | None:
    if not isinstance(doc, Mapping):
        return None
    last_window_at = _number(doc.get("last_window_at"))
    last_error = doc.get("last_error")
    return {
        "state": str(doc.get("state")) if doc.get("state") is not None else None,
        "source_scn": _int(doc.get("source_scn")),
        "lag_scn": _int(doc.get("lag_scn")),
        # DESIGN 17: the figure to alert on; None is "unknown" (never shown as 0).
        "lag_seconds": _number(doc.get("lag_seconds")),
        # The relay reports wall-clock times; the view wants "how long ago".
        "last_window_age_s": None if last_window_at is None
        else round(max(0.0, now - last_window_at), 1),
        "restarts": _int(doc.get("restarts")),
        "last_error": redact(str(last_error)) if last_error is not None else None,
    }


def dump_entry(doc: Any) -> dict[str, Any] | None:
    """A dump as ``/v1/status`` or ``/v1/dumps`` lists it, flattened for the view."""
    if not isinstance(doc, Mapping):
        return None
    progress = doc.get("progress")
    progress = progress if isinstance(progress, Mapping) else {}
    return {
        "id": str(doc.get("id")),
        "state": str(doc.get("state")),
        "reason": doc.get("reason"),
        "rows": _int(progress.get("rows")),
        "estimate": _int(progress.get("estimate")),
        "percent": _number(progress.get("percent")),
        "rows_per_second": _number(progress.get("rows_per_second")),
        "table": progress.get("table"),
    }


def _buffer(name: str, doc: Mapping[str, Any], now: float) -> dict[str, Any]:
    used, capacity = _int(doc.get("used_bytes")), _int(doc.get("capacity_bytes"))
    fill = round(used / capacity, 4) if used is not None and capacity else None
    dumps = doc.get("dumps")
    return {
        "name": name,
        "partition_id": _int(doc.get("partition_id")),
        "min_scn": _int(doc.get("min_scn")),
        "prev_scn": _int(doc.get("prev_scn")),
        "max_scn": _int(doc.get("max_scn")),
        "used_bytes": used,
        "capacity_bytes": capacity,
        "fill": fill,
        "input_bytes_per_second": _number(doc.get("input_bytes_per_second")),
        "windows": _int(doc.get("windows")),
        "events": _int(doc.get("events")),
        "fetcher": _fetcher(doc.get("fetcher"), now),
        "dumps": [d for d in (dump_entry(x) for x in dumps) if d is not None]
        if isinstance(dumps, list) else [],
        "quarantined": _quarantined(doc.get("quarantined"), now),
    }


def _quarantined(items: Any, now: float) -> list[dict[str, Any]]:
    """A buffer's quarantined sources (DESIGN 17): never ready."""
    if not isinstance(items, list):
        return []
    out = []
    for q in items:
        if not isinstance(q, Mapping) or not isinstance(q.get("source"), str):
            continue
        since = _number(q.get("since"))
        out.append({"source": q["source"], "scn": _int(q.get("scn")),
                    "reason": redact(str(q.get("reason") or "")),
                    "fix": redact(str(q.get("fix") or "")),
                    "since": since, "age_s": None if since is None else max(0.0, now - since),
                    "state": "quarantined", "ready": False})
    return out


def _down(url: str, error: str) -> dict[str, Any]:
    return {"url": display_url(url), "error": redact(error)}


def _event_loop(doc: Mapping[str, Any]) -> str | None:
    loop = doc.get("event_loop")
    return loop if isinstance(loop, str) else None


def _workers(doc: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The relay's serving processes beside the main one (``relay.workers``); None
    from a relay that does not report them."""
    workers = doc.get("workers")
    if not isinstance(workers, list):
        return None
    return [{"pid": _int(w.get("pid")), "state": str(w.get("state", "")),
             "restarts": _int(w.get("restarts"))}
            for w in workers if isinstance(w, Mapping)]


def relay_entry(url: str, status: Answer, consumers: Answer,
                now: float | None = None) -> dict[str, Any]:
    """A relay's entry of the document, from its ``/v1/status`` and ``/v1/consumers``
    answers; ``{"url", "error"}`` when the status did not come."""
    now = time.time() if now is None else now
    if not status.ok:
        return _down(url, status.error or "no answer")
    doc = status.doc
    buffers = doc.get("buffers") if isinstance(doc, Mapping) else None
    if not isinstance(buffers, Mapping):
        return _down(url, "/v1/status is not a relay's status document (no buffers)")
    from databus._status_services import readiness_fields
    entry: dict[str, Any] = {
        "url": display_url(url),
        "event_loop": _event_loop(doc),
        "workers": _workers(doc),
        "buffers": [_buffer(str(name), b, now) for name, b in buffers.items()
                    if isinstance(b, Mapping)],
        "consumers": None,
        "consumers_error": None,
        "consumer_registry": None,
        **readiness_fields("relay", doc),
    }
    cdoc = consumers.doc
    if consumers.status == 404:
        entry["consumers_error"] = NOT_AVAILABLE
    elif not consumers.ok:
        entry["consumers_error"] = redact(consumers.error or "no answer")
    elif not (isinstance(cdoc, Mapping) and isinstance(cdoc.get("consumers"), list)):
        entry["consumers_error"] = "/v1/consumers is not a consumer list"
    else:
        entry["consumers"] = [
            {key: c.get(key) for key in CONSUMER_KEYS}
            for c in cdoc["consumers"] if isinstance(c, Mapping)
        ]
        entry["consumer_registry"] = {key: cdoc.get(key) for key in REGISTRY_KEYS}
    return entry


def bootstrap_entry(url: str, status: Answer) -> dict[str, Any]:
    """A bootstrap service's entry of the document, from its ``/v1/status`` answer."""
    if not status.ok:
        return _down(url, status.error or "no answer")
    doc = status.doc
    if not isinstance(doc, Mapping) or "applied_scn" not in doc:
        return _down(url, "/v1/status is not a bootstrap service's status document")
    rows = doc.get("snapshot_rows")
    components = doc.get("components")
    from databus._status_services import readiness_fields
    return {
        "url": display_url(url),
        "event_loop": _event_loop(doc),
        "storage": redact(str(doc["storage"])) if doc.get("storage") is not None else None,
        # producer_scn: the newest window in the log (what the log writer has written).
        "log_scn": _int(doc.get("producer_scn")),
        "applied_scn": _int(doc.get("applied_scn")),
        "applier_lag_scn": _int(doc.get("applier_lag_scn")),
        "applier_lag_seconds": _number(doc.get("applier_lag_seconds")),
        "producer_lag_seconds": _number(doc.get("producer_lag_seconds")),
        "log_floor_scn": _int(doc.get("log_floor_scn")),
        "log_windows": _int(doc.get("log_windows")),
        "log_bytes": _int(doc.get("log_bytes")),
        "snapshot_rows": sum(n for n in (_int(v) for v in rows.values()) if n is not None)
        if isinstance(rows, Mapping) else None,
        "update_ratio": _number(doc.get("update_ratio")),
        "components": {
            str(name): {
                "state": c.get("state"),
                "errors": _int(c.get("errors")),
                "last_error": redact(str(c["last_error"])) if c.get("last_error") else None,
            }
            for name, c in components.items() if isinstance(c, Mapping)
        } if isinstance(components, Mapping) else {},
        **readiness_fields("bootstrap", doc),
    }


def build_document(relays: Sequence[dict[str, Any]], bootstraps: Sequence[dict[str, Any]],
                   now: float | None = None,
                   replicators: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The command's JSON document from the entries (in the order the URLs were given)."""
    entries = [*relays, *bootstraps, *replicators]
    down = sum("error" in entry for entry in entries)
    not_ready = sum(len(entry.get("not_ready") or ()) for entry in entries)
    return {
        "version": DOCUMENT_VERSION,
        "generated_at": round(time.time() if now is None else now, 3),
        "ok": down == 0,
        "down": down,
        "ready": down == 0 and not_ready == 0,
        "not_ready": not_ready,
        "relays": list(relays),
        "bootstraps": list(bootstraps),
        "replicators": list(replicators),
    }


def exit_status(document: Mapping[str, Any]) -> int:
    """0 when every service answered and everything it shows is ready, else 1."""
    from databus._status_topology import topology_ok

    return 0 if document["ok"] and document.get("ready", True) and topology_ok(document) else 1


def render(document: Mapping[str, Any]) -> Group:
    """The document as rich tables: services, buffers, fetchers, consumers, bootstrap
    services, and active dumps when there are any."""
    from rich.console import Group
    from rich.text import Text

    from databus._status_services import not_ready_rows, replicator_rows

    table = status_table  # fits the width it is printed at (databus/_status_render.py)

    when = time.strftime("%H:%M:%S", time.localtime(document["generated_at"]))
    if not document["ok"]:
        verdict = f"[bold red]{document['down']} service(s) down[/]"
    elif not document.get("ready", True):
        verdict = f"[bold red]{document['not_ready']} component(s) not ready[/]"
    else:
        verdict = "[green]all services up and ready[/]"
    parts: list[Any] = [
        Text.from_markup(f"[bold]databus status[/] at {when}: {verdict}"),
        table("Services", ("kind", "url", "state", "detail"), _service_rows(document)),
    ]
    # A table with no row (every relay down, no dump running) is left out.
    for title, columns, rows, right in (
        ("Not ready", ("service", "url", "component", "state", "error", "message", "fix"),
         not_ready_rows(document), ()),
        ("Buffers", ("relay", "buffer", "SCN min..max", "fill", "input", "windows",
                     "events"), buffer_rows(document), (2, 3, 4, 5, 6)),
        ("Fetchers", ("relay", "buffer", "state", "lag", "source SCN", "lag SCN",
                      "last window", "restarts", "last error"), fetcher_rows(document),
         (3, 4, 5, 7)),
        ("Quarantined sources", ("relay", "buffer", "source", "state", "SCN", "since",
                                 "reason", "fix"), quarantine_rows(document), (4,)),
        ("Consumers", ("relay", "client id", "buffer", "SCN", "lag SCN", "lag", "events/s",
                       "last seen", "mode"), consumer_rows(document), (3, 4, 5, 6)),
        ("Dumps", ("relay", "buffer", "dump", "progress"), dump_rows(document), ()),
        ("Bootstrap services", ("url", "log SCN", "applied SCN", "applier lag", "log",
                                "snapshot rows", "components"), bootstrap_rows(document),
         (1, 2, 3, 5)),
        ("Replicators", ("url", "replication", "state", "applied SCN", "lag SCN", "lag",
                         "batches", "errors", "last error"), replicator_rows(document),
         (3, 4, 5, 6, 7)),
    ):
        if rows:
            parts.append(table(title, columns, rows, right))
    from databus._status_topology import topology_parts

    parts.extend(topology_parts(document))  # --zookeeper: clusters and groups
    return Group(*parts)


# -- the shell: fetching ----------------------------------------------------------------


def normalize_url(url: str) -> str:
    """``url`` as a base for request paths: scheme added when missing, query and
    fragment dropped; ConfigError unless http(s) with a host."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"not an http(s) URL: {display_url(url)!r} "
                          "(e.g. http://127.0.0.1:11190)")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "",
                                    ""))


async def fetch_answer(session: aiohttp.ClientSession, base: str, path: str,
                       timeout: float) -> Answer:
    """GET ``base + path`` as JSON within ``timeout`` seconds; never raises for what
    the network or the server does (the error is the answer)."""
    import aiohttp

    try:
        async with asyncio.timeout(timeout):
            async with session.get(base + path, headers={"Accept": "application/json"},
                                   allow_redirects=False) as resp:
                body = await resp.content.read(MAX_DOCUMENT_BYTES + 1)
                if len(body) > MAX_DOCUMENT_BYTES:
                    return Answer(error=f"{path} answered more than "
                                  f"{MAX_DOCUMENT_BYTES >> 20} MiB", status=resp.status)
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = None
                if resp.status != 200:
                    return Answer(error=_http_error(resp.status, path, doc), status=resp.status)
                if doc is None:
                    return Answer(error=f"{path} did not answer JSON", status=resp.status)
                return Answer(doc=doc, status=resp.status)
    except TimeoutError:
        return Answer(error=f"no answer to {path} within {timeout:g} s")
    except (aiohttp.ClientError, OSError) as exc:
        from databus.security._client_tools import connection_problem

        problem = connection_problem(base, exc)
        if problem is not None:
            return Answer(error=problem)
        if isinstance(exc, aiohttp.ClientConnectorError):
            return Answer(error=f"cannot connect: {exc.os_error.strerror or exc.os_error}")
        return Answer(error=f"{path}: {type(exc).__name__}: {exc}")


def _http_error(status: int, path: str, doc: Any) -> str:
    if isinstance(doc, Mapping) and "error" in doc:
        return f"{path} answered {status} {doc['error']}: {doc.get('message', '')}"
    return f"{path} answered HTTP {status}"


async def collect(session: aiohttp.ClientSession, relays: Sequence[str],
                  bootstraps: Sequence[str], timeout: float,
                  replicators: Sequence[str] = (), zookeeper: str | None = None
                  ) -> dict[str, Any]:
    """Fetch every document at once (and, with ``zookeeper``, read the topology:
    databus._status_topology) and build the command's document."""
    from databus._status_topology import add_topology, collect_topology

    topology = asyncio.ensure_future(collect_topology(zookeeper, timeout))
    relay_answers = [
        asyncio.gather(fetch_answer(session, url, "/v1/status", timeout),
                       fetch_answer(session, url, "/v1/consumers", timeout))
        for url in relays
    ]
    boot_answers = [fetch_answer(session, url, "/v1/status", timeout) for url in bootstraps]
    from databus._status_services import replicator_entry

    repl_answers = [fetch_answer(session, url, "/v1/status", timeout) for url in replicators]
    answered = await asyncio.gather(*relay_answers)
    boot_answered = await asyncio.gather(*boot_answers)
    repl_answered = await asyncio.gather(*repl_answers)
    now = time.time()
    document = build_document(
        [relay_entry(url, s, c, now) for url, (s, c) in zip(relays, answered, strict=True)],
        [bootstrap_entry(url, a) for url, a in zip(bootstraps, boot_answered, strict=True)],
        now,
        [replicator_entry(url, a) for url, a in zip(replicators, repl_answered,
                                                    strict=True)])
    add_topology(document, await topology)
    return document


# -- the command ------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status", help="one view of relays, bootstrap services, fetchers and consumers",
        description="Fetch /v1/status (and a relay's /v1/consumers) from every service "
        "named and show buffers, fetchers, consumers, bootstrap services and "
        "replicators. Exit status 0 when every service answered and everything it shows "
        "is ready, 1 when any is down or anything is not ready (docs/operations.md).")
    add_service_args(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true",
                      help="print one JSON document (stable keys) and exit")
    mode.add_argument("--watch", nargs="?", type=float, const=DEFAULT_WATCH_S,
                      metavar="SECONDS", help="refresh in place every SECONDS "
                      f"(default {DEFAULT_WATCH_S:g}) until Ctrl-C")
    parser.add_argument("--wide", action="store_true", help="show every column and "
                        "full URLs whatever the terminal's width (lines may be longer "
                        "than the terminal)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        metavar="SECONDS", help="per request (default %(default)g)")
    parser.set_defaults(handler=run)


def add_service_args(parser: argparse.ArgumentParser) -> None:
    """The services a view shows (``databus status``, ``databus dashboard``): relays,
    bootstrap services, replicators, ZooKeeper, and the client credentials."""
    from databus._status_topology import add_topology_args
    from databus.security._client_tools import add_client_args

    parser.add_argument("--relay", nargs="+", action="extend", default=[], metavar="URL",
                        help="relay URL(s), e.g. http://127.0.0.1:11190")
    parser.add_argument("--bootstrap", nargs="+", action="extend", default=[],
                        metavar="URL", help="bootstrap service URL(s)")
    parser.add_argument("--replicator", nargs="+", action="extend", default=[],
                        metavar="URL", help="replicator status server URL(s) "
                        "(replicate.metrics_port)")
    add_client_args(parser)
    add_topology_args(parser)


# --wide: the tables are laid out for this many columns (everything fits: nothing is
# hidden or shortened); the terminal wraps what is longer than itself.
WIDE_COLUMNS = 10_000


def status_console(args: argparse.Namespace) -> Console:
    """The console the view prints on: the terminal's width (``COLUMNS``, or 80 when
    not a terminal), or an unlimited one with ``--wide``."""
    from rich.console import Console

    if getattr(args, "wide", False):
        return Console(width=WIDE_COLUMNS)
    return Console()


def run(args: argparse.Namespace) -> int:
    replicators_given = getattr(args, "replicator", None) or []
    if not (args.relay or args.bootstrap or replicators_given
            or getattr(args, "zookeeper", None)):
        raise ConfigError("name at least one service: --relay URL, --bootstrap URL, "
                          "--replicator URL or --zookeeper HOSTS")
    if args.timeout <= 0 or (args.watch is not None and args.watch <= 0):
        raise ConfigError("--timeout and --watch take a number of seconds > 0")
    for url in [*args.relay, *args.bootstrap, *replicators_given]:
        register_uri(url)  # before anything can print it
    relays = [normalize_url(u) for u in args.relay]
    bootstraps = [normalize_url(u) for u in args.bootstrap]
    replicators = [normalize_url(u) for u in replicators_given]
    from databus.security._client_tools import check_files, credentials_from

    credentials = credentials_from(args)
    check_files(credentials, [*relays, *bootstraps, *replicators])
    args.credentials = credentials
    last = [1]  # the watch's exit status so far (Ctrl-C ends it inside asyncio.run)
    try:
        return asyncio.run(_main(relays, bootstraps, args, last, replicators))
    except KeyboardInterrupt:
        return last[0]


async def _main(relays: Sequence[str], bootstraps: Sequence[str], args: argparse.Namespace,
                last: list[int], replicators: Sequence[str] = ()) -> int:
    import aiohttp

    from databus.security import NO_CREDENTIALS, client_session

    # Requests are bounded by fetch_answer's own timeout; aiohttp takes Basic auth from
    # URLs that carry user:password. The session presents the credentials (TLS, token).
    credentials = getattr(args, "credentials", NO_CREDENTIALS)
    async with client_session(credentials, limit=100,
                              timeout=aiohttp.ClientTimeout(total=None)) as session:
        if args.json:
            document = await collect(session, relays, bootstraps, args.timeout,
                                     replicators, getattr(args, "zookeeper", None))
            sys.stdout.write(dumps_json(document, indent=2) + "\n")
            return exit_status(document)
        console = status_console(args)
        if args.watch is None:
            document = await collect(session, relays, bootstraps, args.timeout,
                                     replicators, getattr(args, "zookeeper", None))
            console.print(render(document))
            return exit_status(document)
        from rich.live import Live

        answers: dict[Any, Any] = {}

        with Live(console=console, auto_refresh=False) as live:
            while True:
                started = time.monotonic()
                document = await collect(session, relays, bootstraps, args.timeout,
                                     replicators, getattr(args, "zookeeper", None))
                last[0] = exit_status(document)
                keep_last_answers(document, answers)  # a service gone: its old rows, marked
                live.update(render(document), refresh=True)
                await asyncio.sleep(max(0.0, args.watch - (time.monotonic() - started)))
