"""The relay's config: ``[relay]`` and its ``[[relay.buffers]]`` (docs/relay.md)."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path
from typing import Literal

from databus._redact import register_uri
from databus.config._checks import (
    _MIB,
    ConfigFieldError,
    check_name,
    check_range,
    check_serving_limits,
)
from databus.config._cluster import RelayClusterConfig
from databus.config._secrets import _URI_RE, Secret, redact_uri
from databus.config._security import ReaderConfig, TLSConfig, check_readers

# --- the relay -------------------------------------------------------------------------

# Serving processes of one relay at most (``[relay] workers``).
MAX_WORKERS = 256


def x86_64() -> bool:
    """Is this an x86-64 machine (whose stores reach other cores in program order)?"""
    return platform.machine().lower() in ("x86_64", "amd64")



@dataclasses.dataclass(frozen=True)
class BufferConfig:
    """One ``[[relay.buffers]]``: an event buffer fed by one physical source.

    ``source`` is a URI (``mysql://``, ``sqlite:///path.db?tables=...``,
    ``postgresql+txlog://``, ``oracle+txlog://``, ``synthetic://``, ``relay+http://``);
    the fetcher host checks the scheme. A password in it must be percent-encoded if it
    holds ``@ : / ? #``. The repr shows the source redacted.
    """

    name: str
    capacity_mb: int
    source: str
    # An SCN index entry every this many bytes of the buffer (DESIGN section 7).
    index_every_bytes: int = 64 * 1024
    # Dumps (DESIGN 8.1, docs/dumps.md): dump every configured table once the fetcher
    # runs, the first time this buffer starts; and what to do when the source no longer
    # has the log position the buffer needs: "error" (stop, the default) or "dump"
    # (start at the source's current position and dump every table).
    initial_dump: bool = False
    on_source_gap: str = "error"
    # A failure that belongs to one logical source (DESIGN 17): "quarantine" (the
    # default) sets that source aside and keeps capturing the others; "stop" fails the
    # fetcher, as before quarantines existed.
    on_source_error: str = "quarantine"
    # Rows per dump chunk, pause between chunks and chunk readers at once (0: the
    # relay's cores) for the dumps above.
    dump_chunk_rows: int = 10_000
    dump_delay_ms: int = 0
    dump_parallelism: int = 0

    def __post_init__(self) -> None:
        register_uri(self.source)
        check_name(self.name, "name")
        if self.on_source_gap not in ("error", "dump"):
            raise ConfigFieldError("on_source_gap", 'must be "error" or "dump"')
        if self.on_source_error not in ("quarantine", "stop"):
            raise ConfigFieldError("on_source_error", 'must be "quarantine" or "stop"')
        check_range(self.dump_chunk_rows, "dump_chunk_rows", min=1, max=1_000_000)
        check_range(self.dump_delay_ms, "dump_delay_ms", min=0, max=3_600_000)
        check_range(self.dump_parallelism, "dump_parallelism", min=0, max=64)
        check_range(self.capacity_mb, "capacity_mb", min=1, max=1 << 20)
        check_range(self.index_every_bytes, "index_every_bytes", min=1024)
        if self.index_every_bytes >= self.capacity_bytes:
            raise ConfigFieldError(
                "index_every_bytes", "must be smaller than the buffer (capacity_mb)"
            )
        if not _URI_RE.match(self.source):
            # The value is not quoted: it may hold a password.
            raise ConfigFieldError(
                "source", "expected a URI such as mysql://user:pass@host:3306/?tables=db.t"
            )

    @property
    def capacity_bytes(self) -> int:
        """``capacity_mb`` in bytes."""
        return self.capacity_mb * _MIB

    def __repr__(self) -> str:
        return (
            f"BufferConfig(name={self.name!r}, capacity_mb={self.capacity_mb!r}, "
            f"source={redact_uri(self.source)!r}, index_every_bytes={self.index_every_bytes!r}, "
            f"initial_dump={self.initial_dump!r}, on_source_gap={self.on_source_gap!r}, "
            f"on_source_error={self.on_source_error!r})"
        )


@dataclasses.dataclass(frozen=True)
class RelayConfig:
    """``[relay]``: where the relay listens, keeps its files, and which buffers it runs."""

    data_dir: Path
    buffers: tuple[BufferConfig, ...]
    host: str = "127.0.0.1"
    port: int = 11190
    # The asyncio event loop: "auto" runs uvloop when it is installed (the "fast" extra),
    # "uvloop" requires it, "asyncio" never uses it; DATABUS_EVENT_LOOP overrides this
    # (databus/_event_loop.py, docs/relay.md "Event loop").
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # Bearer token for POST /v1/admin/...; without one the admin endpoints are disabled.
    admin_token: Secret | None = None
    # Upper bound on a /v1/stream request's max_bytes, whatever the client asks for.
    max_bytes_cap: int = 8 * _MIB
    # Upper bound on a long poll's wait_ms.
    max_wait_ms: int = 60_000
    # Processes serving HTTP, the main one included (docs/relay.md, "Workers"): 1 is a
    # single process; N > 1 adds N - 1 worker processes that map the buffers read-only
    # (the fetchers and the writers stay in the main one); 0 = one per core.
    workers: int = 0
    # Connection limits (docs/relay.md, "Limits"): open connections served at once; a
    # request head (line and headers) must arrive within header_timeout_s of its first
    # byte (of the connection, for the first request); a keep-alive connection may idle
    # idle_timeout_s between requests; a response that makes no progress for
    # write_timeout_s (a client that stopped reading) is cut and its memory freed.
    max_connections: int = 1000
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    write_timeout_s: float = 30.0
    # All stream response bodies held at once beyond 64 KiB each; a request is served
    # less than its max_bytes when this is used up (docs/relay.md, "Memory").
    max_stream_memory_mb: int = 128
    # Consumers seen on /v1/stream, listed by GET /v1/consumers and exported per client
    # id to /metrics (docs/relay.md, "Consumers"): at most this many (the least recently
    # seen is evicted; 0 tracks none), each dropped after consumer_expiry_s without a
    # request. Both bound the memory and the Prometheus label cardinality.
    max_tracked_consumers: int = 1000
    consumer_expiry_s: float = 300.0
    # A streaming subscription (follow=true) with nothing new writes a heartbeat this
    # often, unless the request asks for another interval (heartbeat_ms).
    stream_heartbeat_ms: int = 1000
    # [relay.cluster]: membership of a relay cluster on ZooKeeper (docs/clusters.md).
    cluster: RelayClusterConfig | None = None
    # Security (docs/security.md): [relay.tls] serves HTTPS; [[relay.readers]] are
    # who may read which sources (none: anyone who reaches the port, which beyond
    # loopback needs allow_anonymous_readers = true); metrics_token guards /metrics.
    tls: TLSConfig | None = None
    readers: tuple[ReaderConfig, ...] = ()
    allow_anonymous_readers: bool = False
    metrics_token: Secret | None = None

    def __post_init__(self) -> None:
        check_serving_limits(self)
        check_range(self.max_tracked_consumers, "max_tracked_consumers", min=0,
                    max=1_000_000)
        if not 0 < self.consumer_expiry_s <= 7 * 86400:
            raise ConfigFieldError("consumer_expiry_s", "must be > 0 and at most 604800 "
                                   f"(a week), got {self.consumer_expiry_s}")
        if not str(self.data_dir):
            raise ConfigFieldError("data_dir", "must not be empty")
        if not self.host or any(c.isspace() for c in self.host):
            raise ConfigFieldError("host", "must be a non-empty host name or address")
        # 0 asks the OS for a free port (tests do that).
        check_range(self.port, "port", min=0, max=65535)
        if self.admin_token is not None and not self.admin_token:
            raise ConfigFieldError("admin_token", "must not be empty (omit it to disable admin)")
        check_readers(host=self.host, tls=self.tls, readers=self.readers,
                      allow_anonymous_readers=self.allow_anonymous_readers,
                      metrics_token=self.metrics_token)
        check_range(self.max_bytes_cap, "max_bytes_cap", min=1024)
        check_range(self.max_wait_ms, "max_wait_ms", min=0, max=3_600_000)
        check_range(self.workers, "workers", min=0, max=MAX_WORKERS)
        check_range(self.stream_heartbeat_ms, "stream_heartbeat_ms", min=50, max=60_000)
        if not self.buffers:
            raise ConfigFieldError("buffers", "a relay needs at least one [[relay.buffers]]")
        if self.cluster is not None and not self.cluster.advertise_url and (
                self.port == 0 or self.host in ("0.0.0.0", "::", "")):
            raise ConfigFieldError("cluster.advertise_url", "needed when the relay listens "
                                   "on port 0 or on every address: members and clients "
                                   "must know where to reach it")
        seen: set[str] = set()
        for index, buffer in enumerate(self.buffers):
            if buffer.name in seen:
                raise ConfigFieldError(
                    f"buffers[{index}].name", f"duplicate buffer name {buffer.name!r}"
                )
            seen.add(buffer.name)

    def buffer(self, name: str) -> BufferConfig | None:
        """The buffer called ``name``, if any."""
        return next((b for b in self.buffers if b.name == name), None)

    @property
    def serving_processes(self) -> int:
        """How many processes serve HTTP: ``workers``, or for 0 the cores this process
        may run on (its CPU affinity, which a container's cpuset narrows). For 0 on a
        CPU other than x86-64, one: workers read the rings written by the main process
        relying on x86-64's store order (relay/_buffer.py, docs/relay.md "Workers")."""
        if self.workers:
            return self.workers
        if not x86_64():
            return 1
        affinity = getattr(os, "sched_getaffinity", None)
        cores = len(affinity(0)) if affinity is not None else os.cpu_count()
        return min(max(1, cores or 1), MAX_WORKERS)
