"""Validation helpers for the config dataclasses' ``__post_init__``."""

from __future__ import annotations

import re
import typing

from databus.errors import ConfigError

# --- validation helpers for __post_init__ ----------------------------------------------


_MIB = 1 << 20


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


