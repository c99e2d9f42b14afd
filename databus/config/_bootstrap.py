"""The bootstrap service's config: ``[bootstrap]`` and its sections (docs/bootstrap.md)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from databus._redact import register_uri
from databus.config._checks import (
    _MIB,
    ConfigFieldError,
    check_name,
    check_range,
    check_serving_limits,
)
from databus.config._cluster import check_zookeeper_hosts
from databus.config._secrets import Secret
from databus.config._security import (
    ReaderConfig,
    TLSConfig,
    check_client_files,
    check_readers,
    client_credentials,
)

if TYPE_CHECKING:
    from databus.security import ClientCredentials


@dataclasses.dataclass(frozen=True)
class ProducerConfig:
    """``[bootstrap.producer]``: the log writer, a client of the relays."""

    # The relays to pull from (failover round-robin, like any client).
    relays: tuple[str, ...] = ()
    # Logical sources to keep; empty: every source of the relay.
    sources: tuple[str, ...] = ()
    # Start after this SCN when the store is empty (e.g. the SCN a seeded snapshot is
    # consistent at). Unset: from the oldest window the relay still holds.
    start_scn: int | None = None
    max_bytes: int = 4 * _MIB
    poll_wait_ms: int = 1000
    # Credentials for reading relays and bootstrap services (docs/security.md): the CA
    # of their https:// certificates, a client certificate (mutual TLS) and a reader
    # token.
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token: Secret | None = None

    def __post_init__(self) -> None:
        check_client_files(self)
        check_range(self.max_bytes, "max_bytes", min=1024)
        check_range(self.poll_wait_ms, "poll_wait_ms", min=0, max=60_000)
        if self.start_scn is not None:
            check_range(self.start_scn, "start_scn", min=0)

    @property
    def credentials(self) -> ClientCredentials:
        return client_credentials(self)


@dataclasses.dataclass(frozen=True)
class ApplierConfig:
    """``[bootstrap.applier]``: moves log rows into the snapshot."""

    batch_rows: int = 5000
    poll_interval_ms: int = 200

    def __post_init__(self) -> None:
        check_range(self.batch_rows, "batch_rows", min=1)
        check_range(self.poll_interval_ms, "poll_interval_ms", min=1, max=60_000)


@dataclasses.dataclass(frozen=True)
class RetentionConfig:
    """``[bootstrap.retention]``: how long the log is kept (never past the applier)."""

    hours: float | None = None
    max_log_mb: int | None = None
    interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.hours is not None and self.hours <= 0:
            raise ConfigFieldError("hours", "must be > 0 (omit it to keep the log by time)")
        if self.max_log_mb is not None:
            check_range(self.max_log_mb, "max_log_mb", min=1)
        if self.interval_s <= 0:
            raise ConfigFieldError("interval_s", "must be > 0")


@dataclasses.dataclass(frozen=True)
class BootstrapServerConfig:
    """``[bootstrap.server]``: how bootstraps are served."""

    # "auto" picks snapshot delta or log replay from the measured update ratio;
    # "snapshot" or "log" force one (paper Figure 16).
    strategy: Literal["auto", "snapshot", "log"] = "auto"
    # At or above this ratio of updates to existing keys the snapshot delta is served.
    # Measured here (benchmarks/bootstrap_breakeven.py): 0.13-0.16 for snapshots of 1x
    # and 10x the changes; the paper's hardware gave 0.5.
    breakeven_ratio: float = 0.15
    # Log rows sampled to measure that ratio.
    ratio_sample_rows: int = 20_000
    # Rows read per query; a response also stops at the client's max_bytes.
    batch_rows: int = 2000
    max_bytes_cap: int = 8 * _MIB
    # Connection limits of the bootstrap HTTP server, as in [relay] (docs/bootstrap.md).
    # They apply whenever the process serves HTTP (its status endpoints too).
    max_connections: int = 1000
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    write_timeout_s: float = 30.0
    max_stream_memory_mb: int = 128

    def __post_init__(self) -> None:
        check_serving_limits(self)
        if not 0.0 <= self.breakeven_ratio <= 1.0:
            raise ConfigFieldError("breakeven_ratio", "must be between 0 and 1")
        check_range(self.ratio_sample_rows, "ratio_sample_rows", min=1)
        check_range(self.batch_rows, "batch_rows", min=1)
        check_range(self.max_bytes_cap, "max_bytes_cap", min=1024)


@dataclasses.dataclass(frozen=True)
class BootstrapClusterConfig:
    """``[bootstrap.cluster]``: bootstrap failover (docs/clusters.md, "Bootstrap
    failover"). Services of one ``name`` on one store run its producer and applier in
    exactly one of them at a time (a kazoo Lock per store and component); all of them
    serve. ``session_timeout_s``: the ZooKeeper session, so the time a standby takes to
    take over a dead holder's work; a holder stops writing half of it after it last
    heard from ZooKeeper (its lease), and the store refuses its writes once a standby
    took over (the fencing token). ``advertise_url``: where clients reach this service
    (shown to ``databus cluster status``); default ``http://host:port``."""

    zookeeper: str
    name: str
    session_timeout_s: float = 10.0
    advertise_url: str = ""

    def __post_init__(self) -> None:
        check_zookeeper_hosts(self.zookeeper)
        check_name(self.name, "name")
        if not 0.4 <= self.session_timeout_s <= 600:
            raise ConfigFieldError("session_timeout_s", "must be between 0.4 and 600")
        if self.advertise_url and not re.fullmatch(r"https?://[^\s/?#]+/?",
                                                   self.advertise_url):
            raise ConfigFieldError("advertise_url", "expected http://host:port")


@dataclasses.dataclass(frozen=True)
class BootstrapConfig:
    """``[bootstrap]``: the store and which of producer, applier and server run here."""

    # postgresql://user:${PASSWORD}@host/db?schema=databus or sqlite:///path.db; kept
    # out of repr because it may hold a password.
    storage: str = dataclasses.field(repr=False)
    host: str = "127.0.0.1"
    port: int = 11191
    # The asyncio event loop of the whole process (producer, applier and server share
    # it), as relay.event_loop: "auto", "uvloop" or "asyncio"; DATABUS_EVENT_LOOP
    # overrides it.
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    run: tuple[Literal["producer", "applier", "server"], ...] = ("producer", "applier",
                                                                 "server")
    admin_token: Secret | None = None
    # Fill the key_hash column (needed to push hash filters down); fixed at creation.
    key_hash: bool = True
    # PostgreSQL: SCNs per log partition (retention drops whole partitions).
    log_partition_span: int | None = None
    producer: ProducerConfig = dataclasses.field(default_factory=ProducerConfig)
    applier: ApplierConfig = dataclasses.field(default_factory=ApplierConfig)
    server: BootstrapServerConfig = dataclasses.field(default_factory=BootstrapServerConfig)
    retention: RetentionConfig = dataclasses.field(default_factory=RetentionConfig)
    # [bootstrap.cluster]: failover between services on one store (docs/clusters.md).
    cluster: BootstrapClusterConfig | None = None
    # Security (docs/security.md), as the relay's: [bootstrap.tls], [[bootstrap.readers]],
    # allow_anonymous_readers, metrics_token.
    tls: TLSConfig | None = None
    readers: tuple[ReaderConfig, ...] = ()
    allow_anonymous_readers: bool = False
    metrics_token: Secret | None = None

    def __post_init__(self) -> None:
        register_uri(self.storage)
        if not self.storage.startswith(("postgresql://", "postgres://", "sqlite:///")):
            raise ConfigFieldError("storage", "must be a postgresql:// or sqlite:/// URL")
        if not self.host or any(c.isspace() for c in self.host):
            raise ConfigFieldError("host", "must be a non-empty host name or address")
        check_range(self.port, "port", min=0, max=65535)
        if not self.run:
            raise ConfigFieldError("run", "name at least one of producer, applier, server")
        if "producer" in self.run and not self.producer.relays:
            raise ConfigFieldError("producer.relays", "the producer needs at least one relay")
        if self.admin_token is not None and not self.admin_token:
            raise ConfigFieldError("admin_token", "must not be empty (omit it to disable admin)")
        if "server" in self.run:
            check_readers(host=self.host, tls=self.tls, readers=self.readers,
                          allow_anonymous_readers=self.allow_anonymous_readers,
                          metrics_token=self.metrics_token)
        if self.log_partition_span is not None:
            check_range(self.log_partition_span, "log_partition_span", min=1)
        if self.cluster is not None and not self.cluster.advertise_url and (
                self.port == 0 or self.host in ("0.0.0.0", "::", "")):
            raise ConfigFieldError("cluster.advertise_url", "needed when the service "
                                   "listens on port 0 or on every address: the other "
                                   "members must know where to reach it")
