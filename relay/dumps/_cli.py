"""``databus dump``: set up a source for dumps, and start, watch and steer them.

::

    databus dump setup  --source URI [--dry-run | --check] [--relay-user NAME]
    databus dump start  --relay URL [--sources a,b] [--buffer B] [--keys JSON]
                        [--chunk-rows N] [--delay-ms M] [--parallelism P] [--wait]
    databus dump status --relay URL [ID] [--sources a,b] [--wait] [--json]
    databus dump pause|resume|cancel --relay URL [ID] [--sources a,b]

``setup`` talks to the source (the URI a relay's buffer uses): it creates the watermark
table, checks that the URI's user can write it, and prints the SQL in two parts: what
was run (the table, made by a user allowed to create tables) and the one GRANT block an
administrator runs for the relay's user (``--relay-user``, default the URI's). The
others talk to a relay's HTTP API (docs/dumps.md). The admin commands (start, pause,
resume, cancel) need the relay's admin token: ``DATABUS_ADMIN_TOKEN`` in the
environment, or ``--token`` (visible to other users in ``ps``: prefer the variable).
pause, resume and cancel act on the dump ``ID``, or on the one active dump that covers
``--sources``, or on the only active dump.

TLS and readers (DESIGN 18): every command but ``setup`` takes ``--ca-file``,
``--cert-file``/``--key-file`` for ``https://`` relays; ``status`` takes the reader
token as ``--token`` (or ``DATABUS_TOKEN``), the admin commands take it as
``--reader-token`` for their reads (``--token`` stays the admin token there, and is
sent with the reads when no reader token is given). ``--wait`` follows a dump with a
progress bar until it ends; the exit status is 0 when it is done, 1 when it failed or
was cancelled.

The relay's JSON errors are printed as ``relay answered <status> <code>: <message>``;
an unreachable relay is one line, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from databus._tables import Col, FitTable
from databus.errors import ConfigError
from databus.relay.dumps._admin_client import TOKEN_ENV, RelayAdmin
from databus.schemas import Schema
from databus.security._client_tools import add_client_args, credentials_from

__all__ = ["register"]

FINISHED = frozenset({"done", "failed", "cancelled"})
ACTIVE = frozenset({"queued", "running", "paused"})


# -- argument parsing ------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dump", help="dumps: set up a source, start, watch, pause, resume, cancel",
        description="Dumps bring the rows that exist in a source's tables into a relay's "
        "stream without locks (docs/dumps.md).")
    actions = parser.add_subparsers(dest="dump_action", metavar="ACTION", required=True)

    setup = actions.add_parser("setup", help="create the watermark table in a source")
    setup.add_argument("--source", required=True, help="the source URI a relay buffer "
                       "uses (mysql://..., sqlite:///..., postgresql+txlog://...)")
    mode = setup.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the SQL only")
    mode.add_argument("--check", action="store_true", help="change nothing; check that "
                      "the table exists and the URI's user can write it")
    setup.add_argument("--relay-user", metavar="NAME", help="the user in the relay's "
                       "source URI, named in the printed GRANT (default: this URI's user; "
                       "give it when an administrator runs setup with their own URI)")
    setup.set_defaults(handler=_setup)

    def relay_args(p: argparse.ArgumentParser, *, admin: bool) -> None:
        p.add_argument("--relay", required=True, help="relay URL, e.g. http://127.0.0.1:11190")
        if admin:
            p.add_argument("--token", help=f"admin token (default: ${TOKEN_ENV})")
        add_client_args(p, admin=admin)

    start = actions.add_parser("start", help="start a dump on a relay")
    relay_args(start, admin=True)
    start.add_argument("--sources", help="comma-separated sources (default: every table "
                       "of the buffer)")
    start.add_argument("--buffer", help="the buffer, when no sources are given and the "
                       "relay has several")
    start.add_argument("--keys", help="JSON array of keys of one source (composite keys "
                       "as arrays), e.g. '[1, 2]' or '[[\"a\", 1]]'")
    start.add_argument("--chunk-rows", type=int, help="rows per chunk (default 10000)")
    start.add_argument("--delay-ms", type=int, help="pause between chunks (default 0)")
    start.add_argument("--parallelism", type=int,
                       help="chunk readers at once, each on its own connection, across "
                            "tables and key ranges of a large table (default: the relay's "
                            "cores; 1 reads one chunk at a time)")
    start.add_argument("--wait", action="store_true", help="follow it until it ends")
    start.set_defaults(handler=_start)

    status = actions.add_parser("status", help="list dumps, or show one")
    relay_args(status, admin=False)
    status.add_argument("id", nargs="?", help="a dump id (default: every dump)")
    status.add_argument("--sources", help="only dumps of these sources")
    status.add_argument("--json", action="store_true", help="print the relay's JSON")
    status.add_argument("--wait", action="store_true", help="follow the dump until it ends")
    status.set_defaults(handler=_status)

    for action, text in (("pause", "pause a dump (between chunks)"),
                         ("resume", "resume a paused dump"),
                         ("cancel", "cancel a dump")):
        p = actions.add_parser(action, help=text)
        relay_args(p, admin=True)
        p.add_argument("id", nargs="?", help="the dump id (default: the active dump of "
                       "--sources, or the only active dump)")
        p.add_argument("--sources", help="pick the active dump covering these sources")
        p.set_defaults(handler=_control, action=action)


def _sources(text: str | None) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def _admin(args: argparse.Namespace) -> RelayAdmin:
    """The relay's client for an admin command: ``--token`` is the admin token."""
    token = getattr(args, "token", None) or os.environ.get(TOKEN_ENV) or None
    return RelayAdmin(args.relay, token, credentials=credentials_from(args))


# -- setup -----------------------------------------------------------------------------


class _ScratchCatalog:
    """Setup reads no rows, so the schema versions a fetcher registers go nowhere."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def source_id(self, name: str) -> int:
        return self._ids.setdefault(name, len(self._ids) + 1)

    def register_schema(self, name: str, schema: Schema) -> Schema:
        return schema


def _setup(args: argparse.Namespace) -> int:
    from databus.fetchers._api import FetcherContext, fetcher_class

    cls = fetcher_class(args.source)
    fetcher = cls(args.source, FetcherContext("dump-setup", 0, _ScratchCatalog()))
    try:
        source = fetcher.open_dump_source()
        if source is None:
            raise ConfigError(f"{cls.scheme}:// sources cannot be dumped")
        try:
            if args.check:
                source.check()
                print("ok: the watermark table exists and this user can write it")
                return 0
            statements = source.setup(dry_run=args.dry_run)
            user = args.relay_user or _uri_user(args.source)
            grants = source.grant_statements(user) if user else []
            sys.stdout.write(setup_script(statements, grants, user, ran=not args.dry_run))
            if not args.dry_run and not args.relay_user:
                source.check()
                print("ok: the watermark table is ready; a relay reading this source with "
                      "this user can dump its tables", file=sys.stderr)
            elif not args.dry_run:
                print(f"ok: the watermark table is ready; once {user} has the grant above, "
                      f"check with `databus dump setup --check --source <the relay's URI>`",
                      file=sys.stderr)
        finally:
            source.close()
    finally:
        fetcher.close()
    return 0


def _uri_user(uri: str) -> str:
    import urllib.parse

    return urllib.parse.unquote(urllib.parse.urlsplit(uri).username or "")


def setup_script(statements: list[str], grants: list[str], user: str, *, ran: bool) -> str:
    """What ``dump setup`` prints: runnable SQL, two parts with one comment each. The
    watermark table is made once per source by a user allowed to create tables (an
    administrator, or the URI's user when it may: then setup just ran it); the relay
    reads with its own user, who only needs one grant block to write watermarks."""
    lines = [f"-- 1. The watermark table, made once per source by a user allowed to "
             f"create tables ({'done just now, with this URI' if ran else 'not run: --dry-run'}):"]
    lines += [sql.rstrip().rstrip(";") + ";" for sql in statements]
    if grants:
        lines.append(f"-- 2. The relay's user ({user}) writes watermarks: an administrator "
                     "grants, once (besides SELECT on the tables to dump, which the relay "
                     "reads already):")
        lines += [sql.rstrip().rstrip(";") + ";" for sql in grants]
    elif user:
        lines.append("-- 2. No grant: the relay's user writes the watermark table with the "
                     "database file's permissions.")
    return "".join(line + "\n" for line in lines)


# -- start, status, control -------------------------------------------------------------


def _start(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if sources := _sources(args.sources):
        body["sources"] = sources
    if args.buffer:
        body["buffer"] = args.buffer
    if args.keys is not None:
        try:
            keys = json.loads(args.keys)
        except ValueError as exc:
            raise ConfigError(f"--keys is not JSON: {exc}") from None
        body["keys"] = keys if isinstance(keys, list) else [keys]
    if args.chunk_rows is not None:
        body["chunk_rows"] = args.chunk_rows
    if args.delay_ms is not None:
        body["delay_ms"] = args.delay_ms
    if args.parallelism is not None:
        body["parallelism"] = args.parallelism
    admin = _admin(args)
    dump = admin.start(body)
    print(f"dump {dump['id']} {dump['state']} on buffer {dump['buffer']}: "
          f"{', '.join(dump['sources'])}")
    if not args.wait:
        return 0
    return _follow(admin, dump["id"])


def _status(args: argparse.Namespace) -> int:
    admin = RelayAdmin(args.relay, credentials=credentials_from(args))
    if args.wait:
        ident = args.id or _pick(admin.dumps(), _sources(args.sources), "follow")["id"]
        return _follow(admin, ident)
    if args.id:
        dump = admin.dump(args.id)
        if args.json:
            print(json.dumps(dump, indent=2, sort_keys=True))
        else:
            _print_dumps([dump], sys.stdout)
            _print_tables(dump, sys.stdout)
        return 0
    dumps = admin.dumps()
    wanted = set(_sources(args.sources))
    if wanted:
        dumps = [d for d in dumps if wanted & set(d["sources"])]
    if args.json:
        print(json.dumps({"dumps": dumps}, indent=2, sort_keys=True))
    else:
        _print_dumps(dumps, sys.stdout)
    return 0


def _pick(dumps: list[dict[str, Any]], sources: list[str], verb: str) -> dict[str, Any]:
    """The one active dump (covering ``sources`` when given); a clear error otherwise."""
    active = [d for d in dumps if d["state"] in ACTIVE]
    if sources:
        active = [d for d in active if set(sources) <= set(d["sources"])]
    if len(active) == 1:
        return active[0]
    what = f" of {', '.join(sources)}" if sources else ""
    if not active:
        raise ConfigError(f"no active dump{what} to {verb}")
    ids = ", ".join(f"{d['id']} ({', '.join(d['sources'])})" for d in active)
    raise ConfigError(f"several active dumps{what}: name one of {ids}")


def _control(args: argparse.Namespace) -> int:
    admin = _admin(args)
    ident = args.id or _pick(admin.dumps(), _sources(args.sources), args.action)["id"]
    dump = admin.control(ident, args.action)
    print(f"dump {dump['id']}: {dump['state']}")
    return 0


# -- display ----------------------------------------------------------------------------


def _fmt_rate(dump: dict[str, Any]) -> str:
    rate = dump["progress"].get("rows_per_second") or 0
    return f"{rate:,.0f}/s" if rate else "-"


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


# The dump tables (databus/_tables.py, shared by the status commands): numbers never cut,
# the least needed columns hidden first on a narrow terminal.
DUMP_COLUMNS = (Col("id"), Col("buffer", priority=2), Col("state"),
                Col("reason", priority=3), Col("table", "text"), Col("rows", "num"),
                Col("%", "num"), Col("rate", "num", 1), Col("eta", "num", 1),
                Col("error", "text", 1, below=True))
TABLE_COLUMNS = (Col("source", "text"), Col("state"), Col("ranges", "num", 2),
                 Col("chunks", "num", 3), Col("rows", "num"), Col("overtaken", "num", 3),
                 Col("%", "num"), Col("last scn", "num", 1),
                 Col("error", "text", 1, below=True))


WIDER = "a wider terminal shows them"


def _console(out: TextIO) -> Any:
    """The terminal's width on a terminal; 160 columns into a file or a pipe."""
    from rich.console import Console

    return Console(file=out, width=None if out.isatty() else 160)


def _print_dumps(dumps: list[dict[str, Any]], out: TextIO) -> None:
    rows = []
    for d in dumps:
        p = d["progress"]
        percent = "-" if p["percent"] is None else f"{p['percent']:.1f}"
        count = f"{p['rows']:,}" + (f" / {p['estimate']:,}" if p["estimate"] else "")
        rows.append((d["id"], d["buffer"], d["state"], d["reason"],
                     p["table"] or ", ".join(d["sources"]), count, percent, _fmt_rate(d),
                     _fmt_eta(p["eta_seconds"]), d["error"] or ""))
    _console(out).print(FitTable("dumps", DUMP_COLUMNS, rows, hint=WIDER))


def _print_tables(dump: dict[str, Any], out: TextIO) -> None:
    rows = []
    for t in dump["tables"]:
        ranges = t.get("ranges") or []
        rows.append((t["source"], t["state"],
                     f"{sum(r['done'] for r in ranges)}/{len(ranges)}" if ranges else "-",
                     str(t["chunks"]), f"{t['rows']:,}",
                     str(t["overtaken"]), "-" if t["percent"] is None else str(t["percent"]),
                     "-" if t["last_scn"] is None else str(t["last_scn"]), t["error"] or ""))
    _console(out).print(FitTable(f"tables of dump {dump['id']}", TABLE_COLUMNS, rows,
                                 hint=WIDER))


def _follow(admin: RelayAdmin, ident: str, *, interval: float = 0.5,
            sleep: Callable[[float], None] = time.sleep) -> int:
    """A progress bar (a line every few seconds when not on a terminal) until the dump
    ends; 0 when it is done."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True)
    dump = admin.dump(ident)
    if console.is_terminal:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[rate]}  eta {task.fields[eta]}"),
                   TimeElapsedColumn())
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task(ident, total=None, rate="-", eta="-")
            while True:
                p = dump["progress"]
                bar.update(task, completed=p["rows"], total=p["estimate"] or None,
                           description=f"dump {ident} {dump['state']} {p['table'] or ''}",
                           rate=_fmt_rate(dump), eta=_fmt_eta(p["eta_seconds"]))
                if dump["state"] in FINISHED:
                    break
                sleep(interval)
                dump = admin.dump(ident)
    else:
        last = 0.0
        while True:
            now = time.monotonic()
            if dump["state"] in FINISHED or now - last >= 5:
                last = now
                p = dump["progress"]
                percent = "?" if p["percent"] is None else f"{p['percent']}%"
                print(f"dump {ident} {dump['state']}: {p['rows']} rows ({percent}) "
                      f"{_fmt_rate(dump)} eta {_fmt_eta(p['eta_seconds'])}",
                      file=sys.stderr, flush=True)
            if dump["state"] in FINISHED:
                break
            sleep(interval)
            dump = admin.dump(ident)
    _print_dumps([dump], sys.stdout)
    if dump["state"] != "done":
        failed = [t for t in dump["tables"] if t["state"] == "failed"]
        for t in failed:
            print(f"{t['source']}: {t['error']}", file=sys.stderr)
        if not failed and dump["error"]:
            print(f"dump {ident} {dump['state']}: {dump['error']}", file=sys.stderr)
        return 1
    return 0
