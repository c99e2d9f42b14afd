"""TOML config files loaded into frozen, validated dataclasses.

How a file maps onto the dataclasses (the supported hints, ``${NAME}`` interpolation,
error messages, what never reaches a log) is in ``_loader``'s docstring. The code:
``_loader`` (the generic TOML-to-dataclass loader), ``_secrets`` (``Secret``,
``redact_uri``), ``_checks`` (validation helpers), ``_relay`` and ``_bootstrap`` (each
component's options); a whole file is a ``DatabusConfig``, read by ``load_config``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from databus._redact import redact
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
from databus.config._cluster import RelayClusterConfig, check_zookeeper_hosts
from databus.config._loader import from_mapping, load_toml
from databus.config._relay import BufferConfig, RelayConfig
from databus.config._replicate import ReplicateConfig, ReplicatedTableConfig
from databus.config._secrets import _URI_RE, Secret, redact_uri
from databus.config._security import ReaderConfig, TLSConfig

__all__ = [
    "ApplierConfig",
    "BootstrapConfig",
    "BootstrapServerConfig",
    "BufferConfig",
    "ConfigFieldError",
    "DatabusConfig",
    "ProducerConfig",
    "ReaderConfig",
    "RelayClusterConfig",
    "RelayConfig",
    "ReplicateConfig",
    "ReplicatedTableConfig",
    "RetentionConfig",
    "Secret",
    "ServingLimitsConfig",
    "TLSConfig",
    "check_name",
    "check_range",
    "check_serving_limits",
    "check_zookeeper_hosts",
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
    replicate: ReplicateConfig | None = None


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
        # redact(): a registered secret outside a URI too (a ZooKeeper digest password).
        return redact(redact_uri(value) if _URI_RE.match(value) else value)
    if isinstance(value, Path):
        return str(value)
    return value


def load_config(
    path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
) -> DatabusConfig:
    """Load and validate a databus TOML file; ``env`` defaults to ``os.environ``."""
    return load_toml(path, DatabusConfig, env=env)

