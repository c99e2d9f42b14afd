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

The code: ``_loader`` (the generic TOML-to-dataclass loader), ``_secrets`` (``Secret``,
``redact_uri``), ``_checks`` (validation helpers), ``_relay`` and ``_bootstrap`` (each
component's options); a whole file is a ``DatabusConfig``, read by ``load_config``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from databus.config._bootstrap import (
    ApplierConfig,
    BootstrapConfig,
    BootstrapServerConfig,
    ProducerConfig,
    RetentionConfig,
)
from databus.config._checks import (
    ConfigFieldError,
    ServingLimitsConfig,
    check_name,
    check_range,
    check_serving_limits,
)
from databus.config._loader import from_mapping, load_toml
from databus.config._relay import BufferConfig, RelayConfig
from databus.config._secrets import _URI_RE, Secret, redact_uri

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
    "ServingLimitsConfig",
    "check_name",
    "check_range",
    "check_serving_limits",
    "from_mapping",
    "load_config",
    "load_toml",
    "redact_uri",
]


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

