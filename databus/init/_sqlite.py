"""``databus init sqlite``: a SQLite database captured by triggers (the TxLog fetcher).

The checks are ``databus txlog install``'s (each table exists and has a primary key,
``check_table``; what its capture lacks, ``missing_objects``) and ``databus dump
setup --check``'s (the watermark table, ``TxlogDumpSource.check``); the SQL is what
those two commands would run (``install_sql`` and ``setup(dry_run=True)``).
"""

from __future__ import annotations

from databus.errors import ConfigError, DatabusError
from databus.fetchers._api import FetcherContext
from databus.fetchers.txlog._dialects import dialect_for
from databus.fetchers.txlog._fetcher import SqliteTxlogFetcher
from databus.fetchers.txlog._session import check_table, missing_objects
from databus.fetchers.txlog._sqlite import SqliteSession
from databus.fetchers.txlog._uri import parse_source
from databus.init._model import Inspection, buffer_name
from databus.relay.dumps._cli import _ScratchCatalog

__all__ = ["inspect_sqlite"]


def inspect_sqlite(uri: str) -> Inspection:
    source = parse_source(uri, expect="sqlite", require_tables=False)
    found = Inspection("sqlite", buffer=buffer_name(source.database, "sqlite"),
                       admin="the database's owner (sqlite3 FILE), or run databus txlog "
                       "install and databus dump setup with this --source")
    if not source.tables:
        found.error("tables", "the URI names no table", "add ?tables=orders,items")
        return found
    if source.path is None or not source.path.exists():
        found.error("database", f"no database file {source.path}",
                    "correct the path (sqlite:///abs/path/shop.db: the path is absolute)")
        return found
    dialect = dialect_for(source.dialect, source.txlog_schema)
    session = SqliteSession(source)
    session.connect()
    to_install = []
    try:
        with session.guard(), session.transaction("read"):
            for spec in source.tables:
                info = session.describe(spec.ref)
                name = source.source_name(spec.ref)
                if info.shape is None:
                    found.error("table", f"no table {spec.ref} in {source.path}",
                                "create it, or correct the URI's tables=")
                    continue
                try:
                    shape = check_table(session, spec, info, installed=False)
                except ConfigError as exc:
                    found.error("primary_key", str(exc))
                    continue
                missing = missing_objects(session, info)
                if missing:
                    found.error("capture", f"{name} is not captured yet: missing "
                                f"{'; '.join(missing)}", "databus txlog install")
                    to_install.append(shape)
                else:
                    found.ok("capture", f"{name}: primary key and capture triggers in place")
                found.tables.append(name)
    finally:
        session.close()
    if to_install:
        found.sql.append("PRAGMA journal_mode = WAL")
        found.sql.extend(dialect.install_sql(to_install))
    _watermark(found, uri)
    return found


def _watermark(found: Inspection, uri: str) -> None:
    """The dump watermark table, as ``databus dump setup --check`` sees it."""
    fetcher = SqliteTxlogFetcher(uri, FetcherContext("init", 0, _ScratchCatalog()))
    try:
        source = fetcher.open_dump_source()
        assert source is not None
        try:
            try:
                source.check()
                found.ok("watermark", "dump watermark table exists and is captured")
            except DatabusError as exc:
                found.error("watermark", str(exc), "databus dump setup")
                found.sql.extend(source.setup(dry_run=True))
        finally:
            source.close()
    finally:
        fetcher.close()
