"""The source URI of the PostgreSQL logical decoding fetcher (pure parsing; a
``ConfigError`` names the bad part and never the password).

::

    postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME?slot=databus&publication=databus
        &tables=public.orders,sales.items

=================  ===========  ========================================================
parameter          default      meaning
=================  ===========  ========================================================
tables             required     comma-separated ``[schema.]table`` (schema ``public`` by
                                default), or ``schema.*`` for every table of a schema
slot               ``databus``  the logical replication slot (``pgoutput``)
publication        ``databus``  the publication the slot streams
start              ``earliest`` where an empty relay buffer starts: ``earliest`` (what
                                the slot still holds) or ``latest`` (from now on)
heartbeat          ``message``  what keeps an idle or fully filtered database's slot
                                advancing: ``message`` (``pg_logical_emit_message``,
                                nothing to create), ``table`` (an update of the
                                ``databus_heartbeat`` table, which must be in the
                                publication) or ``off``
heartbeat_s        1            seconds between heartbeats while nothing is captured
status_interval_s  1            seconds between standby status updates (the slot's
                                confirmed flush LSN)
connect_timeout_s  10           TCP connect and login timeout
sslmode            -            passed to libpq
=================  ===========  ========================================================

Logical source names are ``schema.table`` (``public.orders``), as for the trigger variant
(``postgresql+txlog://``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from databus.config import redact_uri
from databus.errors import ConfigError

__all__ = ["LogicalSource", "TableName", "parse_logical_source"]

SCHEMES = ("postgresql", "postgres")
_KNOWN = ("tables", "slot", "publication", "start", "heartbeat", "heartbeat_s",
          "status_interval_s", "connect_timeout_s", "sslmode")
# PostgreSQL names: a slot is lower-case letters, digits and underscores (<= 63); we keep
# publications and tables to identifiers too, so they never need quoting in a message.
_SLOT_RE = re.compile(r"[a-z0-9_]{1,63}")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    """``schema.table``; ``table == "*"`` means every table of the schema."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def is_pattern(self) -> bool:
        return self.table == "*"


@dataclass(frozen=True, slots=True)
class LogicalSource:
    """A parsed source URI. ``dsn_uri`` is for libpq; print ``redacted``."""

    uri: str
    host: str
    port: int
    user: str
    password: str | None
    dbname: str
    tables: tuple[TableName, ...]
    slot: str = "databus"
    publication: str = "databus"
    start: Literal["earliest", "latest"] = "earliest"
    heartbeat: Literal["message", "table", "off"] = "message"
    heartbeat_s: float = 1.0
    status_interval_s: float = 1.0
    connect_timeout_s: float = 10.0
    sslmode: str | None = None

    @property
    def redacted(self) -> str:
        return redact_uri(self.uri)

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``psycopg2.connect`` (the password as its own argument:
        libpq's URL parser trips on some characters of an unencoded password)."""
        kwargs: dict[str, Any] = {
            "host": self.host, "port": self.port, "user": self.user, "dbname": self.dbname,
            "connect_timeout": max(1, round(self.connect_timeout_s)),
            "application_name": f"databus-{self.slot}",
            # The output styles the type converters parse (``_types.CONNECTION_OPTIONS``:
            # pgoutput formats values with the walsender session's settings).
            "options": "-c DateStyle=ISO -c IntervalStyle=postgres -c extra_float_digits=3",
        }
        if self.password is not None:
            kwargs["password"] = self.password
        if self.sslmode is not None:
            kwargs["sslmode"] = self.sslmode
        return kwargs

    def matches(self, schema: str, table: str) -> bool:
        """True when ``schema.table`` is one of the configured tables."""
        return any(t.schema == schema and (t.table == table or t.is_pattern)
                   for t in self.tables)


def parse_tables(text: str) -> tuple[TableName, ...]:
    names: list[TableName] = []
    for item in text.split(","):
        item = item.strip()
        schema, dot, table = item.rpartition(".")
        if not dot:
            schema, table = "public", item
        if not _NAME_RE.fullmatch(schema) or not (table == "*" or _NAME_RE.fullmatch(table)):
            raise ConfigError(f"bad table {item!r} in tables={text!r}: expected "
                              "[schema.]table or schema.* with identifier names")
        name = TableName(schema, table)
        if name in names:
            raise ConfigError(f"table {name} is listed twice in tables={text!r}")
        names.append(name)
    return tuple(names)


def _number(raw: dict[str, str], name: str, default: float, lo: float, hi: float,
            where: str) -> float:
    if name not in raw:
        return default
    try:
        value = float(raw[name])
    except ValueError:
        raise ConfigError(f"{where}: {name}={raw[name]!r} is not a number") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{where}: {name} must be in [{lo:g}, {hi:g}], got {value:g}")
    return value


def parse_logical_source(uri: str) -> LogicalSource:
    """Parse and check a ``postgresql://`` source URI (see the module docstring)."""
    where = f"postgresql source {redact_uri(uri)}"
    try:
        parts = urlsplit(uri)
        port = parts.port or 5432
    except ValueError:
        raise ConfigError(f"{where}: malformed URI (bad port, or a password holding an "
                          "unencoded / ? or # : percent-encode it)") from None
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"{where}: the scheme must be postgresql:// (postgresql+txlog:// "
                          "is the trigger-based fetcher)")
    raw: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in raw:
            raise ConfigError(f"{where}: parameter {name} is given twice")
        if name not in _KNOWN:
            raise ConfigError(f"{where}: unknown parameter {name!r}; known: "
                              f"{', '.join(_KNOWN)}")
        raw[name] = value
    if not parts.hostname:
        raise ConfigError(f"{where}: no host")
    dbname = unquote(parts.path.lstrip("/"))
    if not dbname or "/" in dbname:
        raise ConfigError(f"{where}: the path must be the database name (/DBNAME)")
    if not parts.username:
        raise ConfigError(f"{where}: no user (postgresql://USER[:PASSWORD]@HOST/DB)")
    if not raw.get("tables"):
        raise ConfigError(f"{where}: tables= is required (e.g. tables=public.orders)")
    slot = raw.get("slot", "databus")
    if not _SLOT_RE.fullmatch(slot):
        raise ConfigError(f"{where}: slot {slot!r} must be 1 to 63 lower-case letters, "
                          "digits or underscores (a PostgreSQL replication slot name)")
    publication = raw.get("publication", "databus")
    if not _NAME_RE.fullmatch(publication):
        raise ConfigError(f"{where}: publication {publication!r} must be an identifier")
    start = raw.get("start", "earliest")
    if start not in ("earliest", "latest"):
        raise ConfigError(f"{where}: start must be earliest or latest, got {start!r}")
    heartbeat = raw.get("heartbeat", "message")
    if heartbeat not in ("message", "table", "off"):
        raise ConfigError(f"{where}: heartbeat must be message, table or off, got "
                          f"{heartbeat!r}")
    try:
        tables = parse_tables(raw["tables"])
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return LogicalSource(
        uri=uri, host=parts.hostname, port=port, user=unquote(parts.username),
        password=unquote(parts.password) if parts.password is not None else None,
        dbname=dbname, tables=tables, slot=slot, publication=publication,
        start=start,  # type: ignore[arg-type]
        heartbeat=heartbeat,  # type: ignore[arg-type]
        heartbeat_s=_number(raw, "heartbeat_s", 1.0, 0.1, 3600, where),
        status_interval_s=_number(raw, "status_interval_s", 1.0, 0.05, 60, where),
        connect_timeout_s=_number(raw, "connect_timeout_s", 10.0, 1, 300, where),
        sslmode=raw.get("sslmode"))
