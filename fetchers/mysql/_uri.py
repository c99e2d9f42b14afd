"""The ``mysql://`` (alias ``mariadb://``) source URI.

::

    mysql://USER[:PASSWORD]@HOST[:PORT][/DATABASE]?server_id=1001&tables=shop.orders,shop.items

=================  ========  ============================================================
part               default   meaning
=================  ========  ============================================================
USER, PASSWORD               the replication user (percent-encoded in the URI); the
                             password is never logged or put in an error message
HOST, PORT         -, 3306   the server (IPv6 literals in brackets)
/DATABASE          none      default database: unqualified names in ``tables`` belong
                             to it, and without ``tables`` every table of it is captured
tables             all       comma-separated ``db.table`` names or ``db.*``; without it
                             (and without /DATABASE) every table outside the system
                             databases (mysql, sys, information_schema,
                             performance_schema)
server_id          random    the replica id this reader registers with; every reader
                             of one server needs its own, so give relay replicas
                             different ids. Default: a random id in [2**31, 2**32 - 1),
                             far from ids people assign by hand
heartbeat_ms       500       how often an idle server sends a heartbeat (lag 0 while
                             idle, and how fast a stop request is noticed)
connect_timeout_s  10        TCP connect and login timeout
read_timeout_s     30        a stream silent this long (heartbeats included) counts
                             as a lost connection
watermark_table    databus.  the dump watermark table (``databus dump setup`` creates
                   databus_  it; docs/dumps.md): its rows are watermarks, never events
                   watermark
=================  ========  ============================================================

Parsing is pure; ``BinlogSourceConfig.from_uri`` raises ``ConfigError`` naming the bad
part, never quoting the password.
"""

from __future__ import annotations

import difflib
import random
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from databus.config import redact_uri
from databus.errors import ConfigError

__all__ = ["SYSTEM_DATABASES", "BinlogSourceConfig", "TableSelector"]

SCHEMES = ("mysql", "mariadb")
SYSTEM_DATABASES = frozenset({"mysql", "sys", "information_schema", "performance_schema"})
_KNOWN = ("tables", "server_id", "heartbeat_ms", "connect_timeout_s", "read_timeout_s",
          "watermark_table")
DEFAULT_WATERMARK_TABLE = ("databus", "databus_watermark")
_DEFAULT_PORT = 3306
_MAX_SERVER_ID = (1 << 32) - 1
# MySQL identifiers: at most 64 characters, no NUL; dots and commas separate our list.
_IDENT_RE = re.compile(r"[^\x00.,\s]{1,64}")


@dataclass(frozen=True, slots=True)
class TableSelector:
    """Which tables a fetcher captures: exact ``db.table`` names and whole databases."""

    tables: frozenset[tuple[str, str]] = frozenset()
    databases: frozenset[str] = frozenset()
    everything: bool = False  # every table outside SYSTEM_DATABASES

    def matches(self, database: str, table: str) -> bool:
        if self.everything:
            return database not in SYSTEM_DATABASES
        return database in self.databases or (database, table) in self.tables

    def schemas(self) -> list[str] | None:
        """The databases involved (a cheap pre-filter for the binlog reader), None = all."""
        if self.everything:
            return None
        return sorted(self.databases | {db for db, _ in self.tables})

    def describe(self) -> str:
        if self.everything:
            return "all tables outside the system databases"
        parts = [f"{db}.*" for db in sorted(self.databases)]
        parts += [f"{db}.{t}" for db, t in sorted(self.tables)]
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class BinlogSourceConfig:
    """A parsed ``mysql://`` URI (see the module docstring)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    selector: TableSelector
    server_id: int
    heartbeat_s: float = 0.5
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    uri: str = field(default="", repr=False)
    watermark_table: tuple[str, str] = DEFAULT_WATERMARK_TABLE

    def binlog_schemas(self) -> list[str] | None:
        """The databases the binlog reader keeps: the captured ones and the watermark's."""
        schemas = self.selector.schemas()
        if schemas is None:
            return None
        return sorted({*schemas, self.watermark_table[0]})

    @property
    def redacted_uri(self) -> str:
        return redact_uri(self.uri)

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def connect_kwargs(self) -> dict[str, object]:
        """Keyword arguments for ``pymysql.connect``."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "connect_timeout": self.connect_timeout_s,
            "read_timeout": self.read_timeout_s,
            "write_timeout": self.read_timeout_s,
            "charset": "utf8mb4",
        }

    @classmethod
    def from_uri(cls, uri: str, *, rng: random.Random | None = None) -> BinlogSourceConfig:
        """Parse and validate ``uri``; ``ConfigError`` naming the bad part."""
        shown = redact_uri(uri)
        try:
            parts = urlsplit(uri)
            port = parts.port
        except ValueError:
            # Not quoting the ValueError: urllib quotes the "port", which may be a piece of a
            # password holding an unencoded '/'.
            raise ConfigError(f"mysql source {shown}: malformed URI (bad port, or a password "
                              "holding an unencoded / ? or # : percent-encode it)") from None
        if parts.scheme not in SCHEMES:
            raise ConfigError(f"not a mysql:// URI: {shown}")
        if parts.fragment:
            raise ConfigError(f"mysql source {shown}: a fragment (#...) is not allowed")
        host = parts.hostname
        if not host:
            raise ConfigError(f"mysql source {shown}: no host (mysql://user:pw@host:3306/)")
        if parts.username is None or not unquote(parts.username):
            raise ConfigError(f"mysql source {shown}: no user (mysql://user:pw@host:3306/)")
        user = unquote(parts.username)
        password = unquote(parts.password or "")
        path = unquote(parts.path).strip("/")
        if path and not _IDENT_RE.fullmatch(path):
            raise ConfigError(f"mysql source {shown}: bad database name in the path")
        params = _params(parts.query, shown)
        selector = _selector(params.get("tables"), path or None, shown)
        if "server_id" in params:
            server_id = _int(params, "server_id", shown, lo=1, hi=_MAX_SERVER_ID)
        else:
            server_id = (rng or random.SystemRandom()).randrange(1 << 31, _MAX_SERVER_ID)
        heartbeat_ms = _int(params, "heartbeat_ms", shown, lo=10, hi=60_000, default=500)
        connect_timeout = _int(params, "connect_timeout_s", shown, lo=1, hi=3600, default=10)
        read_timeout = _int(params, "read_timeout_s", shown, lo=1, hi=86_400, default=30)
        if read_timeout * 1000 < 2 * heartbeat_ms:
            raise ConfigError(
                f"mysql source {shown}: read_timeout_s must be at least two heartbeats "
                f"({2 * heartbeat_ms} ms), or an idle stream looks dead"
            )
        watermark = DEFAULT_WATERMARK_TABLE
        if "watermark_table" in params:
            db, dot, table = params["watermark_table"].strip().partition(".")
            if not dot or not _IDENT_RE.fullmatch(db) or not _IDENT_RE.fullmatch(table):
                raise ConfigError(f"mysql source {shown}: watermark_table must be db.table")
            watermark = (db, table)
        return cls(
            watermark_table=watermark,
            host=host,
            port=_DEFAULT_PORT if port is None else port,
            user=user,
            password=password,
            selector=selector,
            server_id=server_id,
            heartbeat_s=heartbeat_ms / 1000,
            connect_timeout_s=float(connect_timeout),
            read_timeout_s=float(read_timeout),
            uri=uri,
        )


def _params(query: str, shown: str) -> dict[str, str]:
    raw: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in _KNOWN:
            close = difflib.get_close_matches(name, _KNOWN, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"mysql source {shown}: unknown parameter {name!r}{hint}; "
                f"known: {', '.join(_KNOWN)}"
            )
        if name in raw:
            raise ConfigError(f"mysql source {shown}: parameter {name!r} is given twice")
        raw[name] = value
    return raw


def _int(
    params: dict[str, str], name: str, shown: str, *, lo: int, hi: int, default: int = 0
) -> int:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(
            f"mysql source {shown}: {name} must be an integer, got {text!r}"
        ) from None
    if not lo <= value <= hi:
        raise ConfigError(f"mysql source {shown}: {name} must be in [{lo}, {hi}], got {value}")
    return value


def _selector(text: str | None, default_db: str | None, shown: str) -> TableSelector:
    if text is None:
        if default_db is None:
            return TableSelector(everything=True)
        return TableSelector(databases=frozenset({default_db}))
    tables: set[tuple[str, str]] = set()
    databases: set[str] = set()
    for item in (t.strip() for t in text.split(",")):
        if not item:
            raise ConfigError(
                f"mysql source {shown}: tables must be comma-separated db.table or db.* "
                "names, without empty ones"
            )
        db, dot, table = item.rpartition(".")
        if not dot:
            db = default_db or ""
        if not db:
            raise ConfigError(
                f"mysql source {shown}: table {item!r} needs a database (db.table), "
                "or give a default database in the URI path"
            )
        if not _IDENT_RE.fullmatch(db) or not (table == "*" or _IDENT_RE.fullmatch(table)):
            raise ConfigError(
                f"mysql source {shown}: tables must be comma-separated db.table or db.* "
                f"names, got {item!r}"
            )
        if table == "*":
            databases.add(db)
        else:
            tables.add((db, table))
    return TableSelector(frozenset(tables), frozenset(databases))
