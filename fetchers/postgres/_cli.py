"""``databus pg setup|teardown``: prepare a PostgreSQL database for the ``postgresql://``
fetcher, or remove what it needs (docs/postgres-logical-setup.md).

::

    databus pg setup    --source URI [--dry-run] [--json] [--replica-identity-full]
    databus pg teardown --source URI [--dry-run] [--json]

``--source`` is the relay buffer's URI (``postgresql://user@host/db?slot=&publication=
&tables=...``; leave the password out to let libpq read ``PGPASSWORD`` or
``~/.pgpass``). Setup checks the server (``wal_level``, slots, the role's privileges,
each table's REPLICA IDENTITY) and then, only when no check failed, creates or extends
the publication and creates the slot. Teardown drops the slot (refused while a process
streams it) and the publication.

The text output is an SQL script: the checks are ``--`` comments and the statements are
SQL, so ``--dry-run`` output can be reviewed and run with ``psql`` by someone else;
statements that cannot run yet (a check failed) are commented out too. ``--json``
prints the checks and the statements as one JSON object.

Exit status: 0 when every check passed (warnings allowed), 1 when a check failed (then
nothing was changed) or the server could not be reached, 2 for bad arguments (a bad URI
included).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from databus._json import dumps as dumps_json
from databus._redact import redact, register_secret, register_uri
from databus.errors import ConfigError, DatabusError
from databus.fetchers.postgres._setup_run import Outcome, run_setup, run_teardown
from databus.fetchers.postgres._uri import LogicalSource, parse_logical_source

__all__ = ["format_outcome", "register"]

_LABELS = {"ok": "ok", "warning": "warning", "error": "ERROR"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "pg", help="set up (or remove) PostgreSQL logical decoding for a postgresql:// "
        "source: checks, publication, slot",
        description="Check a PostgreSQL database for the logical decoding fetcher and "
        "create its publication and replication slot (setup), or drop them (teardown); "
        "see docs/postgres-logical-setup.md.")
    actions = parser.add_subparsers(dest="pg_action", metavar="ACTION", required=True)
    setup = actions.add_parser("setup", help="check the server, then create the "
                               "publication and the slot")
    teardown = actions.add_parser("teardown", help="drop the slot and the publication")
    for action in (setup, teardown):
        action.add_argument("--source", required=True, help="the relay buffer's source URI, "
                            "postgresql://USER[:PW]@HOST[:PORT]/DB?slot=S&publication=P"
                            "&tables=schema.t,...")
        action.add_argument("--dry-run", action="store_true",
                            help="check and print the SQL; change nothing")
        action.add_argument("--json", action="store_true",
                            help="print the checks and statements as JSON")
    setup.add_argument("--replica-identity-full", action="store_true",
                       help="also ALTER TABLE ... REPLICA IDENTITY FULL the tables that "
                       "need it (TOASTable columns, or no key)")
    setup.set_defaults(handler=_setup)
    teardown.set_defaults(handler=_teardown)


def _source(text: str) -> LogicalSource:
    register_uri(text)  # before anything can echo it
    source = parse_logical_source(text)
    if source.password:
        register_secret(source.password, fragments=True)
    return source


def _run(args: argparse.Namespace, action: str) -> int:
    where = f"databus pg {action}"
    try:
        source = _source(args.source)
    except ConfigError as exc:
        print(redact(f"{where}: error: {exc}"), file=sys.stderr)
        return 2
    try:
        if action == "setup":
            outcome = run_setup(source, dry_run=args.dry_run,
                                replica_identity_full=args.replica_identity_full)
        else:
            outcome = run_teardown(source, dry_run=args.dry_run)
    except DatabusError as exc:
        print(redact(f"{where}: error: {exc}"), file=sys.stderr)
        return 1
    if args.json:
        print(redact(dumps_json(outcome_json(outcome, source), indent=2)))
    else:
        format_outcome(outcome, source, sys.stdout)
    return 0 if outcome.plan.ok else 1


def _setup(args: argparse.Namespace) -> int:
    return _run(args, "setup")


def _teardown(args: argparse.Namespace) -> int:
    return _run(args, "teardown")


def outcome_json(outcome: Outcome, source: LogicalSource) -> dict[str, object]:
    plan = outcome.plan
    return {
        "action": plan.action,
        "source": source.redacted,
        "ok": plan.ok,
        "dry_run": outcome.dry_run,
        "tables": [str(t) for t in plan.tables],
        "checks": [c.to_json() for c in plan.checks],
        "statements": list(plan.statements),
        "executed": list(outcome.executed),
    }


def format_outcome(outcome: Outcome, source: LogicalSource, out: TextIO) -> None:
    """The outcome as an SQL script: checks as comments, then the statements."""
    plan = outcome.plan
    lines = [f"-- databus pg {plan.action} {source.redacted}"]
    for check in plan.checks:
        lines.append(f"-- {_LABELS[check.verdict]:<8} {check.name:<22} {check.message}")
        if check.fix and check.verdict != "ok":
            lines.append(f"-- {'':<8} {'':<22} fix: {check.fix}")
    errors, warnings = len(plan.errors), len(plan.warnings)
    for statement in plan.statements:
        lines.append(("-- " if errors else "") + statement + ";")
    note = f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else ""
    if errors:
        lines.append(f"-- {errors} check{'s' if errors != 1 else ''} failed: nothing was "
                     "changed" + (" (the statements above were not run)"
                                  if plan.statements else "") + note)
    elif not plan.statements:
        done = "set up" if plan.action == "setup" else "removed"
        lines.append(f"-- nothing to do: already {done}{note}")
    elif outcome.dry_run:
        lines.append(f"-- dry run: nothing was changed{note}")
    else:
        lines.append(f"-- done: ran {len(outcome.executed)} statement"
                     f"{'s' if len(outcome.executed) != 1 else ''}{note}")
    out.write(redact("\n".join(lines)) + "\n")
