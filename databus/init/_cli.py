"""``databus init mysql|postgres|sqlite --source URI [--dir DIR] [--force]``.

Prints the checks (ok, warning, ERROR with the fix), then the SQL an administrator must
still run as one block (``;``-terminated, comments as ``--``), then, when every check
passed and no SQL is left, writes the three configs into DIR and says which environment
variables they need and what to run next. Exit status: 0 when the configs are written
(or already hold exactly this), 1 when a check failed or SQL is left to run (nothing is
written then: run the SQL, then init again), or a file exists with other contents and
``--force`` was not given; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from databus._redact import redact, register_uri
from databus.config._secrets import redact_uri
from databus.errors import ConfigError
from databus.init._configs import ConfigSet, render, write
from databus.init._model import Inspection

__all__ = ["register"]

KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "mysql": (("mysql://", "mariadb://"), "mysql://USER[:PW]@HOST:3306/DB[?tables=DB.T1,DB.T2]"),
    "postgres": (("postgresql://", "postgres://"),
                 "postgresql://USER[:PW]@HOST:5432/DB?tables=public.*"),
    "sqlite": (("sqlite:///",), "sqlite:///abs/path/db.sqlite?tables=T1,T2"),
}
_LABELS = {"ok": "ok", "warning": "warning", "error": "ERROR"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "init", help="check a source, print the SQL it still needs, and write relay, "
        "bootstrap and replicate configs for it",
        description="Check a MariaDB/MySQL, PostgreSQL or SQLite source as the relay will "
        "read it (settings, grants, keys, dump watermark table, publication and slot), "
        "print the SQL an administrator must run, and once it is ready write relay.toml, "
        "bootstrap.toml and replicate.toml for it.")
    parser.add_argument("kind", choices=sorted(KINDS), help="the source's database")
    parser.add_argument("--source", required=True, help="the source URI, as the relay "
                        "will use it; " + "; ".join(f"{k}: {v[1]}" for k, v in KINDS.items()))
    parser.add_argument("--dir", default=".", help="where to write the configs "
                        "(default: the current directory)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite config files that exist with other contents")
    parser.add_argument("--relay-port", type=int, default=11190, help="default 11190")
    parser.add_argument("--bootstrap-port", type=int, default=11191, help="default 11191")
    parser.add_argument("--capacity-mb", type=int, default=256,
                        help="the relay buffer's size (default 256)")
    parser.add_argument("--bootstrap-storage", help="the bootstrap store's URI (default: "
                        "sqlite in DIR/bootstrap-data; or postgresql://USER@HOST/DB)")
    parser.add_argument("--target", help="the replica's database URI (default: sqlite "
                        "DIR/replica.db; or postgresql://, mysql://)")
    parser.add_argument("--replica-identity-full", action="store_true",
                        help="postgres: also ALTER TABLE ... REPLICA IDENTITY FULL the "
                        "tables with TOASTable columns or no key (as databus pg setup "
                        "--replica-identity-full)")
    parser.set_defaults(handler=_run)


def _inspect(args: argparse.Namespace) -> Inspection:
    if args.kind == "mysql":
        from databus.init._mysql import inspect_mysql
        return inspect_mysql(args.source)
    if args.kind == "postgres":
        from databus.init._postgres import inspect_postgres
        return inspect_postgres(args.source,
                                replica_identity_full=args.replica_identity_full)
    from databus.init._sqlite import inspect_sqlite
    return inspect_sqlite(args.source)


def _statement(text: str) -> str:
    """``text;`` (a trailing ``   -- comment`` stays after the semicolon)."""
    if text.startswith("--"):
        return text
    body, sep, comment = text.partition("   -- ")
    return body.rstrip().rstrip(";") + ";" + (f"   -- {comment}" if sep else "")


def format_report(found: Inspection, shown: str, out: TextIO) -> None:
    lines = [f"databus init {found.kind}: {shown}", "", "checks:"]
    width = max((len(f.name) for f in found.findings), default=0)
    for f in found.findings:
        lines.append(f"  {_LABELS[f.verdict]:<8} {f.name:<{width}}  {f.message}")
        if f.fix and f.verdict != "ok":
            lines.append(f"  {'':<8} {'':<{width}}  fix: {f.fix}")
    lines.append("")
    statements = [s for s in found.sql if not s.startswith("--")]
    if statements:
        lines.append(f"-- SQL to run once, as {found.admin}:")
        seen: set[str] = set()
        for s in found.sql:
            if s not in seen or s.startswith("--"):
                lines.append(_statement(s))
            seen.add(s)
    elif found.errors:
        lines.append("-- no SQL to run yet: fix what failed above first")
    else:
        lines.append("-- no SQL to run: the source is set up")
    out.write(redact("\n".join(lines)) + "\n")


def _next_steps(found: Inspection, configs: ConfigSet, directory: Path, shown: str,
                out: TextIO) -> None:
    lines = ["", "set these variables where the services run:"]
    width = max(len(n) for n in configs.env)
    for name, what in configs.env.items():
        lines.append(f"  {name:<{width}}  {what}")
    relay, boot, rep = (directory / n for n in ("relay.toml", "bootstrap.toml",
                                                 "replicate.toml"))
    source = found.tables[0]
    lines += ["", "then:",
              f"  databus check-config {relay}",
              f"  databus relay --config {relay}",
              f"  databus tail --relay http://127.0.0.1:{_port(configs)} --sources {source} "
              "--from-earliest",
              f"  databus bootstrap --config {boot}",
              f"  databus replicate --config {rep}"]
    out.write("\n".join(lines) + "\n")


def _port(configs: ConfigSet) -> str:
    for line in configs.files["relay.toml"].splitlines():
        if line.startswith("port = "):
            return line.split("=", 1)[1].strip()
    return "11190"


def _run(args: argparse.Namespace) -> int:
    register_uri(args.source)  # before anything can echo it
    for uri in (args.bootstrap_storage, args.target):
        if uri:
            register_uri(uri)
    shown = redact_uri(args.source)
    schemes, example = KINDS[args.kind]
    if not args.source.startswith(schemes):
        print(f"databus init {args.kind}: error: --source {shown} is not a {args.kind} "
              f"URI: expected {example}", file=sys.stderr)
        return 2
    directory = Path(args.dir).expanduser().resolve()
    try:
        found = _inspect(args)
    except ConfigError as exc:
        print(redact(f"databus init {args.kind}: error: {exc}"), file=sys.stderr)
        return 2
    out = sys.stdout
    format_report(found, shown, out)
    if not found.ready:
        failed = len(found.errors)
        why = (f"{failed} check{'s' if failed != 1 else ''} failed" if failed
               else "the SQL above is not run yet")
        todo = ("fix what failed" + (" and run the SQL above" if found.sql else "")
                if failed else "run the SQL above")
        out.write(f"\nno config written: {why}. {todo[0].upper()}{todo[1:]}, then run "
                  "databus init again.\n")
        return 1
    configs = render(found, args.source, directory, relay_port=args.relay_port,
                     bootstrap_port=args.bootstrap_port,
                     bootstrap_storage=args.bootstrap_storage, target=args.target,
                     capacity_mb=args.capacity_mb)
    written, refused = write(configs, directory, force=args.force)
    if refused:
        out.write(f"\nno config written: {', '.join(refused)} exist(s) in {directory} "
                  "with other contents (--force overwrites)\n")
        return 1
    if args.bootstrap_storage is None:
        (directory / "bootstrap-data").mkdir(exist_ok=True)
    out.write(f"\nwrote {', '.join(written)} in {directory}\n")
    _next_steps(found, configs, directory, shown, out)
    return 0
