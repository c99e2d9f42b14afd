"""TOML config files loaded into frozen, validated dataclasses (DESIGN section 12).

Components declare their config as frozen dataclasses with type hints and validate in
``__post_init__``; ``from_mapping``/``load_toml`` map TOML tables and arrays of tables onto
them by those hints, so no component writes parsing code. Supported hints: ``int``,
``float`` (an int is accepted), ``str``, ``bool``, ``Secret``, ``pathlib.Path``, enums (by
value), ``Literal[...]``, ``X | None``, unions (the first option that fits),
``list[X]``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[str, X]``/``Mapping[str, X]`` and
nested dataclasses. Prefer tuples to lists: a frozen dataclass holding a list is not
really frozen.

Every error is a ``ConfigError`` naming the file and the dotted key path, for example
``relay.toml: relay.buffers[1].capacity_mb: expected int, got str``. Unknown keys are
errors (typos must fail loudly), and so are missing keys without a default.

String values may use ``${NAME}`` (the environment variable must be set) and
``${NAME:-default}`` (the default when NAME is unset or empty, as in the shell); ``$${``
is a literal ``${``. Interpolation happens in string values only, never in keys. A string
that used interpolation may fill an int, float or bool field (``port = "${PORT}"``).

Secrets never reach logs: ``Secret`` prints as ``***``, ``redact_uri`` hides the password
of a URI, ``BufferConfig``'s repr shows its source redacted, and error messages name keys
and types but do not quote values (the one exception: a wrong choice for a ``Literal`` or
enum field is quoted when it was written literally in the file, not taken from the
environment).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hmac
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from databus._redact import register_secret, register_uri
from databus.errors import ConfigError

__all__ = [
    "ApplierConfig",
    "BootstrapConfig",
    "BootstrapServerConfig",
    "BufferConfig",
    "ConfigFieldError",
    "DatabusConfig",
    "ProducerConfig",
    "RelayConfig",
    "RetentionConfig",
    "Secret",
    "check_name",
    "check_range",
    "check_serving_limits",
    "from_mapping",
    "load_config",
    "load_toml",
    "redact_uri",
]

T = TypeVar("T")


# --- secrets ---------------------------------------------------------------------------


class Secret:
    """A secret string that prints as ``***``; ``reveal()`` gives the value.

    Deliberately not a ``str`` subclass: a str subclass leaks through concatenation,
    slicing, ``json.dumps`` and format specs even when ``__str__`` is overridden.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"Secret wraps a str, got {type(value).__name__}")
        self._value = value
        # From now on the value is cut out of every log line and error message of the
        # process, whoever prints it (databus._redact).
        register_secret(value)

    def reveal(self) -> str:
        """The secret value. Call it only where the value is used, never to log it."""
        return self._value

    def __repr__(self) -> str:
        return "***"

    def __str__(self) -> str:
        return "***"

    def __format__(self, format_spec: str) -> str:
        return format("***", format_spec)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        # Constant time: tokens are compared against what clients send. surrogatepass:
        # a header that was not UTF-8 reaches us with lone surrogates; it must compare
        # unequal, not raise.
        return hmac.compare_digest(self._value.encode("utf-8", "surrogatepass"),
                                   other._value.encode("utf-8", "surrogatepass"))

    def __hash__(self) -> int:
        return hash((Secret, self._value))


# user:password@ with everything up to the LAST '@' taken as the password, so that an
# unencoded '@', '/', '?' or '#' in a password can never leak (at worst we redact more).
_URI_PASSWORD_RE = re.compile(
    r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:@/?#]*):(?P<password>.*)@(?P<tail>[^@]*)$",
    re.DOTALL,
)
_QUERY_SECRET_RE = re.compile(
    r"(?P<key>[?&](?:password|passwd|pwd|secret|token|access_token|api_key|apikey)=)[^&#]*",
    re.IGNORECASE,
)


def redact_uri(uri: str) -> str:
    """``uri`` with its password (and secret-looking query values) replaced by ``***``.

    ``mysql://repl:pw@host/db`` -> ``mysql://repl:***@host/db``; ``?password=x`` ->
    ``?password=***``. URIs without a password come back unchanged. Everything from the
    first ``:`` of the authority to the last ``@`` counts as the password, so a password
    with unencoded ``@ / ? #`` is still hidden; the price is over-redaction of the rare
    URI that has an ``@`` in its query.
    """
    match = _URI_PASSWORD_RE.match(uri)
    if match is not None and match.group("password"):
        uri = f"{match.group('head')}:***@{match.group('tail')}"
    return _QUERY_SECRET_RE.sub(lambda m: m.group("key") + "***", uri)


# --- validation helpers for __post_init__ ----------------------------------------------


class ConfigFieldError(ConfigError):
    """A value rejected by a config dataclass's ``__post_init__``.

    ``field`` is relative to the dataclass (``"port"``, ``"buffers[1].name"``); the loader
    prefixes the file and the path of the table, so messages point at the exact key.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def check_range(
    value: float, field: str, *, min: float | None = None, max: float | None = None
) -> None:
    """Raise ``ConfigFieldError`` unless ``min <= value <= max`` (either bound optional)."""
    if min is not None and value < min:
        raise ConfigFieldError(field, f"must be at least {min}, got {value}")
    if max is not None and value > max:
        raise ConfigFieldError(field, f"must be at most {max}, got {value}")


def check_name(value: str, field: str) -> None:
    """Raise unless ``value`` is a non-empty name of letters, digits, ``_``, ``.``, ``-``.

    Names end up in URLs, file names and metric labels, hence the narrow alphabet.
    """
    if not value:
        raise ConfigFieldError(field, "must not be empty")
    if not _NAME_RE.fullmatch(value):
        raise ConfigFieldError(
            field, f"{value!r} is not a valid name (letters, digits, '_', '.', '-')"
        )


class ServingLimitsConfig(typing.Protocol):
    """The connection-limit options of a server section ([relay], [bootstrap.server])."""

    @property
    def max_connections(self) -> int: ...
    @property
    def header_timeout_s(self) -> float: ...
    @property
    def idle_timeout_s(self) -> float: ...
    @property
    def write_timeout_s(self) -> float: ...
    @property
    def max_stream_memory_mb(self) -> int: ...


def check_serving_limits(cfg: ServingLimitsConfig) -> None:
    """The connection limits the relay and the bootstrap server share (databus._serving)."""
    check_range(cfg.max_connections, "max_connections", min=1, max=1_000_000)
    for name in ("header_timeout_s", "idle_timeout_s", "write_timeout_s"):
        value = getattr(cfg, name)
        if not 0 < value <= 3600:
            raise ConfigFieldError(name, f"must be > 0 and at most 3600, got {value}")
    check_range(cfg.max_stream_memory_mb, "max_stream_memory_mb", min=1, max=1 << 20)


# --- the relay -------------------------------------------------------------------------

_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_MIB = 1 << 20


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
    # Rows per dump chunk and pause between chunks for the dumps above.
    dump_chunk_rows: int = 10_000
    dump_delay_ms: int = 0

    def __post_init__(self) -> None:
        register_uri(self.source)
        check_name(self.name, "name")
        if self.on_source_gap not in ("error", "dump"):
            raise ConfigFieldError("on_source_gap", 'must be "error" or "dump"')
        check_range(self.dump_chunk_rows, "dump_chunk_rows", min=1, max=1_000_000)
        check_range(self.dump_delay_ms, "dump_delay_ms", min=0, max=3_600_000)
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
            f"initial_dump={self.initial_dump!r}, on_source_gap={self.on_source_gap!r})"
        )


@dataclasses.dataclass(frozen=True)
class RelayConfig:
    """``[relay]``: where the relay listens, keeps its files, and which buffers it runs."""

    data_dir: Path
    buffers: tuple[BufferConfig, ...]
    host: str = "127.0.0.1"
    port: int = 11190
    # Bearer token for POST /v1/admin/...; without one the admin endpoints are disabled.
    admin_token: Secret | None = None
    # Upper bound on a /v1/stream request's max_bytes, whatever the client asks for.
    max_bytes_cap: int = 8 * _MIB
    # Upper bound on a long poll's wait_ms.
    max_wait_ms: int = 60_000
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

    def __post_init__(self) -> None:
        check_serving_limits(self)
        if not str(self.data_dir):
            raise ConfigFieldError("data_dir", "must not be empty")
        if not self.host or any(c.isspace() for c in self.host):
            raise ConfigFieldError("host", "must be a non-empty host name or address")
        # 0 asks the OS for a free port (tests do that).
        check_range(self.port, "port", min=0, max=65535)
        if self.admin_token is not None and not self.admin_token:
            raise ConfigFieldError("admin_token", "must not be empty (omit it to disable admin)")
        check_range(self.max_bytes_cap, "max_bytes_cap", min=1024)
        check_range(self.max_wait_ms, "max_wait_ms", min=0, max=3_600_000)
        if not self.buffers:
            raise ConfigFieldError("buffers", "a relay needs at least one [[relay.buffers]]")
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

    def __post_init__(self) -> None:
        check_range(self.max_bytes, "max_bytes", min=1024)
        check_range(self.poll_wait_ms, "poll_wait_ms", min=0, max=60_000)
        if self.start_scn is not None:
            check_range(self.start_scn, "start_scn", min=0)


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
class BootstrapConfig:
    """``[bootstrap]``: the store and which of producer, applier and server run here."""

    # postgresql://user:${PASSWORD}@host/db?schema=databus or sqlite:///path.db; kept
    # out of repr because it may hold a password.
    storage: str = dataclasses.field(repr=False)
    host: str = "127.0.0.1"
    port: int = 11191
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
        if self.log_partition_span is not None:
            check_range(self.log_partition_span, "log_partition_span", min=1)


@dataclasses.dataclass(frozen=True)
class DatabusConfig:
    """A whole config file: one optional section per component."""

    relay: RelayConfig | None = None
    bootstrap: BootstrapConfig | None = None


def describe(value: object) -> object:
    """A JSON-able view of a config for printing: secrets as "***", URIs redacted."""
    if isinstance(value, Secret):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: describe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [describe(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): describe(v) for k, v in value.items()}
    if isinstance(value, str):
        return redact_uri(value) if _URI_RE.match(value) else value
    if isinstance(value, Path):
        return str(value)
    return value


def load_config(
    path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
) -> DatabusConfig:
    """Load and validate a databus TOML file; ``env`` defaults to ``os.environ``."""
    return load_toml(path, DatabusConfig, env=env)


# --- the generic loader ----------------------------------------------------------------


def load_toml(
    path: str | os.PathLike[str], cls: type[T], *, env: Mapping[str, str] | None = None
) -> T:
    """Read the TOML file at ``path`` into the dataclass ``cls``."""
    origin = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{origin}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: invalid TOML: {exc}") from None
    return from_mapping(cls, data, origin=origin, env=env)


def from_mapping(
    cls: type[T],
    data: Mapping[str, object],
    *,
    origin: str = "<config>",
    env: Mapping[str, str] | None = None,
) -> T:
    """Build the dataclass ``cls`` from decoded TOML (or any nested dict/list data).

    ``origin`` names the file in error messages; ``env`` (default ``os.environ``) feeds
    ``${NAME}`` interpolation.
    """
    loader = _Loader(origin, os.environ if env is None else env)
    return cast(T, loader.dataclass(cls, data, ""))


_INTERPOLATION_RE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_REFERENCE_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)
_NONE_TYPE = type(None)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _got(value: object) -> str:
    """The TOML name of a value's type, for "expected X, got Y"."""
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _expected(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(a) for a in typing.get_args(tp) if a is not _NONE_TYPE)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return "array"
    if origin in (dict, Mapping) or dataclasses.is_dataclass(tp):
        return "table"
    if tp in (Secret, Path):
        return "str"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    return getattr(tp, "__name__", str(tp))


def _quote(value: object, interpolated: bool) -> str:
    """A rejected choice, quoted unless it came from the environment (may be a secret)."""
    return _got(value) if interpolated else repr(value)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class _InterpolationError(ConfigError):
    """A bad or unresolvable ``${...}``: reported as is, never masked by a union's retry."""


class _Loader:
    def __init__(self, origin: str, env: Mapping[str, str]) -> None:
        self.origin = origin
        self.env = env

    def error(self, path: str, reason: str, cls: type[ConfigError] = ConfigError) -> ConfigError:
        return cls(f"{self.origin}: {path}: {reason}" if path else f"{self.origin}: {reason}")

    def wrong_type(
        self, tp: Any, value: object, path: str, interpolated: bool = False
    ) -> ConfigError:
        suffix = " (after ${...} interpolation)" if interpolated else ""
        return self.error(path, f"expected {_expected(tp)}, got {_got(value)}{suffix}")

    def interpolate(self, text: str, path: str) -> tuple[str, bool]:
        """``text`` with ``${...}`` expanded, and whether a variable was expanded."""
        if "${" not in text:
            return text, False
        if "${" in _INTERPOLATION_RE.sub("", text):
            raise self.error(
                path, "unterminated ${ (write $${ for a literal ${)", _InterpolationError
            )
        expanded_any = False

        def expand(match: re.Match[str]) -> str:
            nonlocal expanded_any
            if match.group(1) is None:
                return "${"
            reference = _REFERENCE_RE.fullmatch(match.group(1))
            if reference is None:
                # Not quoted: the string may be a secret that merely contains "${".
                raise self.error(
                    path,
                    "invalid ${...} reference (use ${NAME}, ${NAME:-default}, or $${)",
                    _InterpolationError,
                )
            name, default = reference.group(1), reference.group(2)
            value = self.env.get(name)
            expanded_any = True
            if default is not None:
                return value if value else default
            if value is None:
                raise self.error(
                    path,
                    f"environment variable {name} is not set "
                    f"(set it, or write ${{{name}:-default}})",
                    _InterpolationError,
                )
            return value

        return _INTERPOLATION_RE.sub(expand, text), expanded_any

    def convert(self, tp: Any, value: object, path: str) -> object:
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if tp is Any or tp is object:
            return self.plain(value, path)
        if origin in (typing.Union, types.UnionType):
            return self.union(tp, args, value, path)
        if origin is Literal:
            interpolated = False
            if isinstance(value, str):
                value, interpolated = self.interpolate(value, path)
            for allowed in args:
                if type(allowed) is type(value) and allowed == value:
                    return value
            raise self.error(path, f"expected {_expected(tp)}, got {_quote(value, interpolated)}")
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return self.dataclass(tp, value, path)
        if origin in (list, tuple):
            return self.sequence(tp, origin, args, value, path)
        if origin in (dict, Mapping):
            return self.table(tp, args, value, path)
        if isinstance(tp, type):
            return self.scalar(tp, value, path)
        raise TypeError(f"config loader: unsupported type hint {tp!r} at {path}")

    def plain(self, value: object, path: str) -> object:
        """An untyped value: interpolate strings, recurse into tables and arrays."""
        if isinstance(value, str):
            return self.interpolate(value, path)[0]
        if isinstance(value, list):
            return [self.plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: self.plain(v, _join(path, k)) for k, v in value.items()}
        return value

    def union(self, tp: Any, args: tuple[Any, ...], value: object, path: str) -> object:
        options = [a for a in args if a is not _NONE_TYPE]
        if value is None and len(options) < len(args):
            return None
        if len(options) == 1:
            return self.convert(options[0], value, path)
        for option in options:
            try:
                return self.convert(option, value, path)
            except _InterpolationError:
                raise
            except ConfigError:
                pass
        raise self.wrong_type(tp, value, path)

    def scalar(self, tp: type, value: object, path: str) -> object:
        interpolated = False
        if isinstance(value, str):
            value, interpolated = self.interpolate(value, path)
        if tp is str:
            if isinstance(value, str):
                if _URI_RE.match(value):
                    register_uri(value)  # any URI of any component may hold a password
                return value
        elif tp is Secret:
            if isinstance(value, str):
                return Secret(value)
        elif tp is Path:
            if isinstance(value, str):
                if not value:
                    # Path("") is ".", which would silently mean the working directory.
                    raise self.error(path, "must not be empty")
                return Path(value)
        elif tp is bool:
            if isinstance(value, bool):
                return value
            if interpolated and isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
        elif tp is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if interpolated and isinstance(value, str):
                try:
                    return int(value.strip())
                except ValueError:
                    pass
        elif tp is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            if interpolated and isinstance(value, str):
                try:
                    return float(value.strip())
                except ValueError:
                    pass
        elif issubclass(tp, enum.Enum):
            for member in tp:
                if type(member.value) is type(value) and member.value == value:
                    return member
            raise self.error(path, f"expected {_expected(tp)}, got {_quote(value, interpolated)}")
        else:
            raise TypeError(f"config loader: unsupported type {tp.__name__} at {path}")
        raise self.wrong_type(tp, value, path, interpolated)

    def sequence(
        self, tp: Any, origin: type, args: tuple[Any, ...], value: object, path: str
    ) -> object:
        if not isinstance(value, list):
            raise self.wrong_type(tp, value, path)
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            item_type = args[0] if args else Any
            items = [self.convert(item_type, v, f"{path}[{i}]") for i, v in enumerate(value)]
            return items if origin is list else tuple(items)
        if not args:
            return tuple(self.plain(v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise self.error(path, f"expected an array of {len(args)} items, got {len(value)}")
        return tuple(
            self.convert(a, v, f"{path}[{i}]")
            for i, (a, v) in enumerate(zip(args, value, strict=True))
        )

    def table(self, tp: Any, args: tuple[Any, ...], value: object, path: str) -> object:
        if not isinstance(value, dict):
            raise self.wrong_type(tp, value, path)
        value_type = args[1] if len(args) == 2 else Any
        out = {k: self.convert(value_type, v, _join(path, k)) for k, v in value.items()}
        return out if typing.get_origin(tp) is dict else types.MappingProxyType(out)

    def dataclass(self, cls: type, value: object, path: str) -> object:
        if not isinstance(value, dict):
            raise self.wrong_type(cls, value, path)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        for key in value:
            if key not in fields:
                close = difflib.get_close_matches(key, list(fields), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise self.error(
                    _join(path, key),
                    f"unknown key ({hint}expected one of: {', '.join(fields)})",
                )
        hints = _hints(cls)
        kwargs: dict[str, object] = {}
        for name, field in fields.items():
            if name in value:
                kwargs[name] = self.convert(hints[name], value[name], _join(path, name))
            elif (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise self.error(_join(path, name), "missing required key")
        try:
            return cls(**kwargs)
        except ConfigFieldError as exc:
            raise self.error(_join(path, exc.field), exc.reason) from None
        except ConfigError as exc:
            raise self.error(path, exc.message) from None
        except (ValueError, TypeError) as exc:
            raise self.error(path, str(exc)) from None
