"""JDBC coordinates for the bootstrap store (PostgreSQL) and for MariaDB/MySQL sources.

The jobs take the same URLs as the rest of databus (``postgresql://...?schema=name`` for
the store, ``mysql://...`` for a source) and derive the JDBC URL and properties from
them. Passwords go in the properties, never in the JDBC URL, so they do not show up in
Spark's plans, UI or error messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from databus.config import redact_uri
from databus.errors import ConfigError
from databus.spark_jobs._common import MARIADB_DRIVER, POSTGRES_DRIVER

# The store's own URL parameters; anything else is passed on to both drivers.
_STORE_PARAMS = ("schema", "log_partition_span")
# libpq parameters pgjdbc understands under the same name.
_JDBC_PASSTHROUGH = ("sslmode", "sslrootcert", "sslcert", "sslkey", "application_name")


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class StoreLocation:
    """A PostgreSQL bootstrap store: DSN for psycopg2 (driver side), JDBC for Spark."""

    dsn: str = field(repr=False)
    jdbc_url: str
    user: str
    password: str = field(repr=False)
    schema: str
    where: str  # the URL without its password, for messages
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, url: str) -> StoreLocation:
        shown = redact_uri(url)
        try:
            parts = urlsplit(url)
            port = parts.port or 5432
        except ValueError as exc:
            raise ConfigError(f"bootstrap store {shown}: malformed URL ({exc})") from None
        if parts.scheme == "sqlite":
            raise ConfigError(
                f"the Spark jobs need the PostgreSQL bootstrap store (JDBC); {shown} is "
                "SQLite, which the applier handles on its own"
            )
        if parts.scheme not in ("postgresql", "postgres"):
            raise ConfigError(
                f"bootstrap store URL must look like postgresql://user:pass@host:5432/db"
                f"?schema=name, got {shown}"
            )
        if not parts.hostname:
            raise ConfigError(f"bootstrap store {shown}: no host")
        database = unquote(parts.path.lstrip("/"))
        if not database:
            raise ConfigError(f"bootstrap store {shown}: no database (.../dbname?schema=...)")
        query = dict(parse_qsl(parts.query))
        schema = query.get("schema", "databus")
        dsn_query = {k: v for k, v in query.items() if k not in _STORE_PARAMS}
        jdbc_query = {k: v for k, v in dsn_query.items() if k in _JDBC_PASSTHROUGH}
        jdbc = f"jdbc:postgresql://{_host(parts.hostname)}:{port}/{database}"
        if jdbc_query:
            jdbc += "?" + urlencode(jdbc_query)
        return cls(
            dsn=urlunsplit(parts._replace(query=urlencode(dsn_query))),
            jdbc_url=jdbc,
            user=unquote(parts.username or ""),
            password=unquote(parts.password or ""),
            schema=schema,
            where=shown,
        )

    def properties(self, **extra: str) -> dict[str, str]:
        """JDBC properties for Spark's reader and writer."""
        props = {"driver": POSTGRES_DRIVER, "user": self.user}
        if self.password:
            props["password"] = self.password
        props.update(extra)
        return props

    def table(self, name: str) -> str:
        return f"{self.schema}.{name}"


def mysql_jdbc(host: str, port: int, user: str, password: str) -> tuple[str, dict[str, str]]:
    """JDBC URL and properties for a MariaDB/MySQL server, read with Debian's MariaDB
    driver. The URL says ``jdbc:mysql:`` on purpose: Spark picks its MySQL dialect (backtick
    quoting) from that prefix, and MariaDB Connector/J 2.x accepts it."""
    url = f"jdbc:mysql://{_host(host)}:{port}/"
    props = {"driver": MARIADB_DRIVER, "user": user,
             # TIMESTAMP values are read as UTC epoch numbers; the session zone must not
             # shift them (DST gaps would make some ambiguous).
             "sessionInitStatement": "SET time_zone = '+00:00'"}
    if password:
        props["password"] = password
    return url, props
