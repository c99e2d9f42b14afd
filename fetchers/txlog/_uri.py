"""Source URIs of the TxLog fetchers (pure parsing; ``ConfigError`` names the bad part).

::

    sqlite:///abs/path/shop.db?tables=orders,main.items
    postgresql+txlog://USER[:PASSWORD]@HOST[:PORT]/DBNAME?tables=public.orders,sales.items
    oracle+txlog://USER[:PASSWORD]@HOST[:PORT]/SERVICE?tables=SHOP.ORDERS

``databus txlog`` also accepts ``postgresql://``, ``postgres://`` and ``oracle://``.

=================  =========  ==========================================================
parameter          default    meaning
=================  =========  ==========================================================
tables             required   comma-separated tables: ``[schema.]table``; SQLite takes
                              ``table`` or ``main.table``, PostgreSQL defaults to
                              ``public``, Oracle to the user. ``table(k1,k2)`` names the
                              key columns (only needed for ``--dry-run`` on Oracle,
                              where no catalog can be read)
batch              500        at most this many source transactions per poll
poll_ms            100        pause between polls when the fetcher has caught up
start              earliest   where an empty relay buffer starts: ``earliest`` (every
                              transaction the TxLog still holds) or ``latest`` (only
                              transactions committed from now on)
database           file stem  SQLite only: the first part of the logical source names
busy_timeout_ms    5000       SQLite only: how long to wait for the write lock
connect_timeout_s  10         PostgreSQL / Oracle: TCP connect and login timeout
txlog_schema       see text   PostgreSQL / Oracle: where ``databus_txlog`` lives
                              (``public``; Oracle: the user's schema)
sslmode            -          PostgreSQL only: passed to libpq
=================  =========  ==========================================================

Logical source names are ``database.table``: for SQLite ``database`` is the file's stem
(``shop.db`` -> ``shop.orders``) unless ``database=`` says otherwise; for PostgreSQL and
Oracle it is the table's schema (``public.orders``, ``SHOP.ORDERS``). The SQLite path is
absolute (``sqlite:///`` followed by it) and the file must exist: it is opened without
being created.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from databus.config import redact_uri
from databus.errors import ConfigError
from databus.fetchers.txlog._model import TableRef

__all__ = ["Dialect", "TableSpec", "TxlogSource", "parse_source", "parse_tables"]

Dialect = Literal["sqlite", "postgresql", "oracle"]

SCHEMES: dict[str, Dialect] = {
    "sqlite": "sqlite",
    "postgresql+txlog": "postgresql",
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "oracle+txlog": "oracle",
    "oracle": "oracle",
}
# What the relay's fetcher registry (entry points) knows each dialect by.
FETCHER_SCHEMES: dict[Dialect, str] = {
    "sqlite": "sqlite",
    "postgresql": "postgresql+txlog",
    "oracle": "oracle+txlog",
}
_COMMON = ("tables", "batch", "poll_ms", "start")
_KNOWN: dict[Dialect, tuple[str, ...]] = {
    "sqlite": (*_COMMON, "database", "busy_timeout_ms"),
    "postgresql": (*_COMMON, "connect_timeout_s", "txlog_schema", "sslmode"),
    "oracle": (*_COMMON, "connect_timeout_s", "txlog_schema"),
}
_DEFAULT_PORTS: dict[Dialect, int] = {"sqlite": 0, "postgresql": 5432, "oracle": 1521}
# One table: [schema.]name[(key, ...)]; names are anything but separators.
_TABLE_RE = re.compile(
    r"\s*(?:(?P<schema>[^.,()\s]+)\.)?(?P<name>[^.,()\s]+)\s*(?:\((?P<key>[^()]*)\))?\s*\Z"
)
_SOURCE_PART_RE = re.compile(r"[^\s,]+")


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A table named in a URI or on the command line, with its key if given."""

    ref: TableRef
    key: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class TxlogSource:
    """A parsed TxLog source URI. ``uri`` is kept for the driver; print ``redacted``."""

    dialect: Dialect
    uri: str
    tables: tuple[TableSpec, ...]
    batch: int = 500
    poll_s: float = 0.1
    start: Literal["earliest", "latest"] = "earliest"
    # SQLite
    path: Path | None = None
    database: str = ""
    busy_timeout_s: float = 5.0
    # PostgreSQL / Oracle
    host: str = ""
    port: int = 0
    user: str = ""
    password: str | None = None
    dbname: str = ""
    connect_timeout_s: float = 10.0
    txlog_schema: str = ""
    sslmode: str | None = None

    @property
    def redacted(self) -> str:
        return redact_uri(self.uri)

    @property
    def refs(self) -> tuple[TableRef, ...]:
        return tuple(t.ref for t in self.tables)

    def source_name(self, ref: TableRef) -> str:
        """The logical source name of ``ref`` (``database.table``)."""
        first = self.database if self.dialect == "sqlite" else ref.schema
        return f"{first}.{ref.name}"

    def with_tables(self, tables: tuple[TableSpec, ...]) -> TxlogSource:
        return replace(self, tables=tables)


def parse_tables(text: str, dialect: Dialect, default_schema: str) -> tuple[TableSpec, ...]:
    """``a, s.b, c(k1,k2)`` -> table specs; ``ConfigError`` on a malformed or repeated one."""
    specs: list[TableSpec] = []
    for item in _split_outside_parens(text):
        match = _TABLE_RE.match(item)
        if not item.strip() or match is None:
            raise ConfigError(f"txlog source: bad table {item.strip()!r} in tables={text!r}; "
                              "expected [schema.]table or [schema.]table(key, ...)")
        schema = match.group("schema") or default_schema
        if dialect == "sqlite" and schema != "main":
            raise ConfigError(f"txlog source: SQLite tables live in schema 'main', got {item!r}")
        key = None
        if match.group("key") is not None:
            key = tuple(k.strip() for k in match.group("key").split(","))
            if not all(key):
                raise ConfigError(f"txlog source: empty key column in {item.strip()!r}")
        spec = TableSpec(TableRef(schema, match.group("name")), key)
        if any(s.ref == spec.ref for s in specs):
            raise ConfigError(f"txlog source: table {spec.ref} is listed twice")
        specs.append(spec)
    if not specs:
        raise ConfigError("txlog source: tables= names no table")
    return tuple(specs)


def _split_outside_parens(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_source(
    uri: str, *, expect: Dialect | None = None, require_tables: bool = True
) -> TxlogSource:
    """Parse and validate a TxLog source URI (see the module docstring)."""
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        # Not quoting the ValueError: urllib quotes the "port", which may be a piece of
        # a password holding an unencoded '/'.
        raise ConfigError(f"txlog source {redact_uri(uri)}: malformed URI (bad port, or a "
                          "password holding an unencoded / ? or # : percent-encode it)"
                          ) from None
    dialect = SCHEMES.get(parts.scheme)
    if dialect is None:
        raise ConfigError(
            f"txlog source {redact_uri(uri)}: unknown scheme {parts.scheme!r}; expected one of "
            f"{', '.join(SCHEMES)}"
        )
    if expect is not None and dialect != expect:
        raise ConfigError(f"txlog source {redact_uri(uri)}: a {expect} URI was expected")
    where = f"txlog source {redact_uri(uri)}"
    raw: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in raw:
            raise ConfigError(f"{where}: parameter {name!r} is given twice")
        raw[name] = value
    known = _KNOWN[dialect]
    for name in raw:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown parameter {name!r}{hint}; known: "
                              f"{', '.join(known)}")
    if parts.fragment:
        raise ConfigError(f"{where}: a fragment (#...) is not allowed")
    batch = _int(raw, "batch", 500, 1, 1_000_000, where)
    poll_s = _int(raw, "poll_ms", 100, 1, 3_600_000, where) / 1000
    start = _start(raw.get("start", "earliest"), where)
    if dialect == "sqlite":
        if parts.netloc:
            raise ConfigError(f"{where}: write sqlite:/// followed by the absolute path "
                              f"(got host {parts.netloc!r})")
        path = Path(unquote(parts.path))
        if not parts.path.startswith("/") or path.name in ("", ".", ".."):
            raise ConfigError(f"{where}: the path must be absolute and name a file")
        database = raw.get("database", path.stem)
        if not _SOURCE_PART_RE.fullmatch(database) or "." in database:
            raise ConfigError(
                f"{where}: {database!r} cannot be the first part of a source name (no dots, "
                "commas or whitespace): set database=NAME"
            )
        tables = _tables(raw, dialect, "main", require_tables, where)
        return TxlogSource(
            dialect, uri, tables, path=path, database=database,
            busy_timeout_s=_int(raw, "busy_timeout_ms", 5000, 0, 3_600_000, where) / 1000,
            batch=batch, poll_s=poll_s, start=start,
        )
    if not parts.hostname:
        raise ConfigError(f"{where}: no host")
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname or "/" in dbname:
        raise ConfigError(f"{where}: the path must be /DBNAME (PostgreSQL) or /SERVICE (Oracle)")
    user = unquote(parts.username or "")
    if not user:
        raise ConfigError(f"{where}: no user")
    default_schema = "public" if dialect == "postgresql" else user.upper()
    return TxlogSource(
        dialect, uri, _tables(raw, dialect, default_schema, require_tables, where),
        host=parts.hostname, port=port or _DEFAULT_PORTS[dialect], user=user,
        password=None if parts.password is None else unquote(parts.password),
        dbname=dbname,
        connect_timeout_s=float(_int(raw, "connect_timeout_s", 10, 1, 3600, where)),
        txlog_schema=raw.get("txlog_schema", default_schema),
        sslmode=raw.get("sslmode"),
        batch=batch, poll_s=poll_s, start=start,
    )


def _tables(raw: dict[str, str], dialect: Dialect, default_schema: str, required: bool,
            where: str) -> tuple[TableSpec, ...]:
    text = raw.get("tables")
    if text is None:
        if required:
            raise ConfigError(f"{where}: tables= is required (e.g. tables=orders,items)")
        return ()
    try:
        return parse_tables(text, dialect, default_schema)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message.removeprefix('txlog source: ')}") from None


def _int(raw: dict[str, str], name: str, default: int, lo: int, hi: int, where: str) -> int:
    text = raw.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{where}: {name} must be an integer, got {text!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{where}: {name} must be in [{lo}, {hi}], got {value}")
    return value


def _start(text: str, where: str) -> Literal["earliest", "latest"]:
    if text == "earliest":
        return "earliest"
    if text == "latest":
        return "latest"
    raise ConfigError(f"{where}: start must be 'earliest' or 'latest', got {text!r}")
