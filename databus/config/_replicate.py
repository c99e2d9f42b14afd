"""The replicator's config: ``[replicate]`` and its ``[[replicate.tables]]``
(docs/replicator.md).

```toml
[replicate]
name = "shop-to-warehouse"            # the row in the target's databus_replication_state
relays = ["http://127.0.0.1:11190"]   # or zookeeper = "zk:2181/databus" and cluster = "shop"
bootstrap = ["http://127.0.0.1:11191"]  # optional: the initial copy and falling off
target = "postgresql://repl:${PG_PASSWORD}@127.0.0.1:5432/warehouse"
target_schema = "public"
batch_rows = 5000
batch_ms = 500
on_ddl = "apply"
initial_copy = "auto"                 # or "dump": the relay dumps the tables first
relay_admin_token = "${RELAY_ADMIN_TOKEN}"  # needed by initial_copy = "dump"

[[replicate.tables]]
source = "shop.orders"
target = "orders"                     # default: the source's table name
key = ["id"]                          # default: the target table's primary key
exclude = ["internal_note"]
rename = { customer = "customer_id" }
```
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from databus._redact import register_uri
from databus.config._checks import ConfigFieldError, check_name, check_range
from databus.config._cluster import check_zookeeper_hosts
from databus.config._secrets import Secret, redact_uri
from databus.config._security import TLSConfig, check_client_files, client_credentials

if TYPE_CHECKING:
    from databus.security import ClientCredentials

__all__ = ["ReplicateConfig", "ReplicatedTableConfig"]

_TARGET_SCHEMES = ("postgresql://", "postgres://", "mysql://", "mariadb://", "sqlite:///")


@dataclasses.dataclass(frozen=True)
class ReplicatedTableConfig:
    """One ``[[replicate.tables]]``: a source table and where its rows go.

    ``target`` is ``table`` or ``schema.table`` (default: the source's table name in
    ``replicate.target_schema``); ``key`` the primary key columns by *source* name
    (default: the target table's primary key when it exists, else the source schema's
    key hint); ``include``/``exclude`` choose columns by source name (not both);
    ``rename`` maps source column names to target names."""

    source: str
    target: str = ""
    key: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    rename: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source.count(".") != 1 or not all(self.source.split(".")):
            raise ConfigFieldError("source", f"must be db.table, got {self.source!r}")
        if self.include and self.exclude:
            raise ConfigFieldError("include", "give include or exclude, not both")
        for name in self.key:
            if self.include and name not in self.include:
                raise ConfigFieldError("key", f"key column {name!r} is not included")
            if name in self.exclude:
                raise ConfigFieldError("key", f"key column {name!r} is excluded")
        if len(set(self.rename.values())) != len(self.rename):
            raise ConfigFieldError("rename", "two columns renamed to one name")

    @property
    def source_table(self) -> str:
        return self.source.split(".", 1)[1]


@dataclasses.dataclass(frozen=True)
class ReplicateConfig:
    """``[replicate]``: one replication, from relays (and a bootstrap service) into one
    target database.

    ``name`` identifies it in the target's ``databus_replication_state`` (several
    replications may share a target). ``batch_rows``/``batch_ms`` bound a target
    transaction: whole windows are folded until either is reached (a window is never
    split). ``on_ddl``: what a new source schema version does to the target table
    ("apply" compatible changes and stop on others, "stop" on any, "ignore" them).
    ``retry_initial_s``/``retry_max_s``: the backoff while the target is down."""

    name: str
    target: str
    tables: tuple[ReplicatedTableConfig, ...]
    relays: tuple[str, ...] = ()
    bootstrap: tuple[str, ...] = ()
    target_schema: str = ""
    batch_rows: int = 5000
    batch_ms: int = 500
    on_ddl: Literal["apply", "stop", "ignore"] = "apply"
    max_request_bytes: int = 1 << 20
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    # Where the replicator serves /metrics and /v1/status (0: not at all).
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    # How the rows that exist before the first start get there: "auto" leaves it to
    # the client (a bootstrap snapshot when a bootstrap service is configured, else
    # what the relay holds); "dump" asks the relay for a dump of the tables (DESIGN
    # 8.1), read from the relay's newest SCN at that moment, which needs the relay's
    # admin token.
    initial_copy: Literal["auto", "dump"] = "auto"
    relay_admin_token: Secret | None = None
    # Instead of relays: the members of a relay cluster on ZooKeeper (docs/clusters.md,
    # "Discovery"), followed while the replicator runs.
    zookeeper: str = ""
    cluster: str = ""
    # Credentials for reading relays and bootstrap services (docs/security.md): the CA
    # of their https:// certificates, a client certificate (mutual TLS) and a reader
    # token.
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token: Secret | None = None
    # [replicate.tls]: HTTPS for the status server (metrics_port); metrics_token
    # guards its /metrics and /v1/status.
    tls: TLSConfig | None = None
    metrics_token: Secret | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "name")
        check_client_files(self)
        if self.metrics_token is not None and not self.metrics_token:
            raise ConfigFieldError("metrics_token", "must not be empty")
        if self.zookeeper or self.cluster:
            if self.relays:
                raise ConfigFieldError("relays", "give relays, or zookeeper and cluster "
                                       "(relay discovery), not both")
            if not (self.zookeeper and self.cluster):
                raise ConfigFieldError("zookeeper", "relay discovery needs both zookeeper "
                                       "and cluster")
            check_zookeeper_hosts(self.zookeeper)
            check_name(self.cluster, "cluster")
        elif not self.relays:
            raise ConfigFieldError("relays", "name at least one relay URL (or zookeeper "
                                   "and cluster)")
        if not self.target.startswith(_TARGET_SCHEMES):
            raise ConfigFieldError(
                "target", f"must be a postgresql://, mysql:// or sqlite:/// URL, got "
                f"{redact_uri(self.target)!r}")
        register_uri(self.target)
        for url in (*self.relays, *self.bootstrap):
            register_uri(url)
        if not self.tables:
            raise ConfigFieldError("tables", "name at least one [[replicate.tables]]")
        sources = [t.source for t in self.tables]
        if len(set(sources)) != len(sources):
            raise ConfigFieldError("tables", "a source is listed twice")
        check_range(self.batch_rows, "batch_rows", min=1, max=10_000_000)
        check_range(self.batch_ms, "batch_ms", min=0, max=3_600_000)
        check_range(self.max_request_bytes, "max_request_bytes", min=1024, max=1 << 30)
        check_range(self.metrics_port, "metrics_port", min=0, max=65535)
        if not 0 < self.retry_initial_s <= self.retry_max_s:
            raise ConfigFieldError("retry_initial_s", "must be > 0 and <= retry_max_s")
        if self.initial_copy not in ("auto", "dump"):
            raise ConfigFieldError("initial_copy", "must be \"auto\" or \"dump\"")
        if self.initial_copy == "dump" and not self.relay_admin_token:
            raise ConfigFieldError("relay_admin_token",
                                   "initial_copy = \"dump\" needs the relays' admin token")

    @property
    def credentials(self) -> ClientCredentials:
        return client_credentials(self)

    def __repr__(self) -> str:
        return (f"ReplicateConfig(name={self.name!r}, relays={self.relays!r}, "
                f"target={redact_uri(self.target)!r}, tables={len(self.tables)})")
