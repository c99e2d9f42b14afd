"""``databus txlog install|uninstall|prune``: set up, remove or trim trigger capture.

::

    databus txlog install   --source URI [--tables T1,T2] [--dry-run]
    databus txlog uninstall --source URI [--tables T1,T2] [--drop-txlog] [--dry-run]
    databus txlog prune     --source URI --before-scn N [--dry-run]

``--source`` is the fetcher's URI (``sqlite:///...``, ``postgresql+txlog://...``, also
plain ``postgresql://``, ``oracle+txlog://...``); ``--tables`` overrides its ``tables=``.
``--dry-run`` prints the SQL and changes nothing. Install and uninstall run in one
transaction (SQLite and PostgreSQL DDL is transactional); install first switches a
SQLite database to WAL. ``--drop-txlog`` also drops the shared TxLog tables, and is
refused while other tables are still captured.

Prune deletes the TxLog rows (and delete-log rows) of the transactions with SCN < N
and records N, so that a fetcher that would need them fails clearly instead of missing
changes. It is safe while fetchers run: it takes the same lock as the SCN assignment
and a reader's snapshot is not affected. Choose N at most one more than the smallest
SCN every reader (relay replicas, bootstrap producer) has reached. N may not exceed the
newest SCN + 1. On Oracle the statements can only be printed (``--dry-run``) unless
``oracledb`` is installed; without a connection the key columns must be given as
``--tables 'OWNER.TABLE(ID)'``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from databus.errors import ConfigError
from databus.fetchers.txlog._dialects import SqlDialect, dialect_for
from databus.fetchers.txlog._session import (
    DbSession,
    load_shapes,
    shapes_from_specs,
    with_txn_column,
)
from databus.fetchers.txlog._uri import TxlogSource, parse_source, parse_tables

__all__ = ["format_script", "register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "txlog", help="install, remove or prune trigger/TxLog capture on a SQL database",
        description="Set up (install), remove (uninstall) or trim (prune) trigger/TxLog "
        "capture on a SQLite, PostgreSQL or Oracle database; see docs/txlog-fetcher.md.",
    )
    actions = parser.add_subparsers(dest="txlog_action", metavar="ACTION", required=True)
    specs = [
        ("install", "add the TxLog, the databus_txn column, delete logs and triggers", _install),
        ("uninstall", "remove what install added", _uninstall),
        ("prune", "forget the transactions before an SCN", _prune),
    ]
    for name, help_text, handler in specs:
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--source", required=True, help="the source URI, e.g. "
                            "sqlite:///data/shop.db or postgresql+txlog://u@host/db")
        if name != "prune":
            action.add_argument("--tables", help="comma-separated tables (default: the URI's "
                                "tables=)")
        if name == "uninstall":
            action.add_argument("--drop-txlog", action="store_true",
                                help="also drop the shared TxLog tables")
        if name == "prune":
            action.add_argument("--before-scn", type=int, required=True, metavar="N",
                                help="forget transactions with SCN < N")
        action.add_argument("--dry-run", action="store_true", help="print the SQL only")
        action.set_defaults(handler=handler)


def format_script(dialect: SqlDialect, statements: Sequence[str]) -> str:
    """Statements as a script for the dialect's shell (Oracle PL/SQL ends with ``/``)."""
    out = []
    for statement in statements:
        if dialect.name == "oracle" and statement.rstrip().endswith(";"):
            out.append(statement.rstrip() + "\n/")
        else:
            out.append(statement.rstrip() + ";")
    return "\n\n".join(out) + "\n"


def _source(args: argparse.Namespace) -> TxlogSource:
    source = parse_source(args.source, require_tables=False)
    tables_text = getattr(args, "tables", None)
    if tables_text:
        default = "main" if source.dialect == "sqlite" else (
            "public" if source.dialect == "postgresql" else source.user.upper())
        source = source.with_tables(parse_tables(tables_text, source.dialect, default))
    if not source.tables and args.txlog_action != "prune":
        raise ConfigError("name the tables: --tables T1,T2 or tables= in the source URI")
    return source


def _session(source: TxlogSource) -> DbSession:
    session: DbSession
    if source.dialect == "sqlite":
        from databus.fetchers.txlog._sqlite import SqliteSession

        session = SqliteSession(source)
    elif source.dialect == "postgresql":
        from databus.fetchers.txlog._postgres import PostgresSession

        session = PostgresSession(source)
    else:
        from databus.fetchers.txlog._oracle import OracleSession

        session = OracleSession(source)  # DriverMissingError without oracledb
    session.connect()
    return session


def _offline(source: TxlogSource, args: argparse.Namespace) -> bool:
    """Oracle --dry-run without a driver: generate from the command line alone."""
    if source.dialect != "oracle" or not args.dry_run:
        return False
    from databus.fetchers.txlog._errors import DriverMissingError
    from databus.fetchers.txlog._oracle import load_driver

    try:
        load_driver()
    except DriverMissingError:
        return True
    return False


def _print(source: TxlogSource, action: str, dialect: SqlDialect, statements: list[str],
           note: str = "") -> None:
    print(f"-- databus txlog {action} for {source.redacted}{note}")
    sys.stdout.write(format_script(dialect, statements))


def _install(args: argparse.Namespace) -> int:
    source = _source(args)
    dialect = dialect_for(source.dialect, source.txlog_schema)
    if _offline(source, args):
        _print(source, "install", dialect, dialect.install_sql(shapes_from_specs(source.tables)))
        return 0
    session = _session(source)
    try:
        with session.guard():
            with session.transaction("read"):
                shapes = load_shapes(session, source.tables, installed=False)
            statements = dialect.install_sql(shapes)
            if args.dry_run:
                _print(source, "install", dialect, statements)
                return 0
            session.prepare_install()
            session.run_script(statements)
    finally:
        session.close()
    print(f"capture installed on {', '.join(str(s.ref) for s in shapes)} "
          f"({source.redacted})")
    return 0


def _uninstall(args: argparse.Namespace) -> int:
    source = _source(args)
    dialect = dialect_for(source.dialect, source.txlog_schema)
    if _offline(source, args):
        statements = dialect.uninstall_sql(with_txn_column(shapes_from_specs(source.tables)),
                                           drop_txlog=args.drop_txlog)
        _print(source, "uninstall", dialect, statements)
        return 0
    session = _session(source)
    try:
        with session.guard():
            with session.transaction("read"):
                shapes = load_shapes(session, source.tables, installed=False)
                others = sorted(set(session.captured_tables()) - set(source.refs))
            if args.drop_txlog and others:
                raise ConfigError(
                    "--drop-txlog: other tables are still captured: "
                    f"{', '.join(map(str, others))}; uninstall them too, or keep the TxLog"
                )
            statements = dialect.uninstall_sql(shapes, drop_txlog=args.drop_txlog)
            if args.dry_run:
                _print(source, "uninstall", dialect, statements)
                return 0
            session.run_script(statements)
    finally:
        session.close()
    print(f"capture removed from {', '.join(str(s.ref) for s in shapes)} ({source.redacted})")
    return 0


def _prune(args: argparse.Namespace) -> int:
    source = _source(args)
    before = args.before_scn
    if before < 1:
        raise ConfigError(f"--before-scn must be at least 1, got {before}")
    dialect = dialect_for(source.dialect, source.txlog_schema)
    note = f" (before = {before})"
    if _offline(source, args):
        logs = [dialect.delete_log(spec.ref) for spec in source.tables]
        _print(source, "prune", dialect, dialect.prune_sql(logs), note)
        return 0
    session = _session(source)
    try:
        with session.guard():
            with session.transaction("read"):
                position = session.position()
                logs = session.delete_logs()
            if before > position.newest + 1:
                raise ConfigError(
                    f"--before-scn {before}: the newest SCN is {position.newest}; transactions "
                    "without an SCN cannot be pruned"
                )
            statements = dialect.prune_sql(logs)
            if args.dry_run:
                _print(source, "prune", dialect, statements, note)
                return 0
            plan = dialect.assign_plan()
            with session.transaction("write"):
                if plan.lock is not None:
                    session.query(plan.lock)  # wait for a running assignment, then block it
                for statement in statements:
                    session.query(statement, {"before": before})
    finally:
        session.close()
    print(f"pruned the TxLog before SCN {before} ({source.redacted})")
    return 0
