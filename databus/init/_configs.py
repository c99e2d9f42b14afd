"""The three files ``databus init`` writes: ``relay.toml``, ``bootstrap.toml`` and
``replicate.toml``, filled in from the templates in ``databus.deploy``'s ``init/``
(``relay.toml.in`` and so on: ``@name@`` placeholders; every value a TOML string or
number made here).

Passwords never reach a file: each URI's password becomes ``${NAME}`` and the caller
says which variable to set. A file that exists is left alone unless ``force``; one that
already holds exactly what would be written counts as written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from databus.config._secrets import redact_uri
from databus.errors import ConfigError
from databus.init._model import SOURCE_PASSWORD_ENV, Inspection, password_to_reference

__all__ = ["ADMIN_TOKEN_ENV", "FILES", "ConfigSet", "render", "write"]

FILES = ("relay.toml", "bootstrap.toml", "replicate.toml")
ADMIN_TOKEN_ENV = "DATABUS_ADMIN_TOKEN"
BOOTSTRAP_PASSWORD_ENV = "DATABUS_BOOTSTRAP_PASSWORD"
TARGET_PASSWORD_ENV = "DATABUS_TARGET_PASSWORD"
_PLACEHOLDER = re.compile(r"@([a-z_]+)@")


def toml_str(text: str) -> str:
    """``text`` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text, ensure_ascii=False)


@dataclass
class ConfigSet:
    """The rendered files (name -> text) and the variables they need (name -> what)."""

    files: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)


def _template(name: str) -> str:
    return resources.files("databus.deploy").joinpath("init", f"{name}.in").read_text("utf-8")


def _fill(template: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"init template: no value for @{key}@")
        return values[key]
    return _PLACEHOLDER.sub(one, template)


def _table_blocks(tables: list[str]) -> str:
    """``[[replicate.tables]]`` per source; a target named ``schema_table`` where two
    sources share a table name."""
    short = [t.split(".", 1)[1] for t in tables]
    blocks = []
    for source, table in zip(tables, short, strict=True):
        lines = ["", "[[replicate.tables]]", f"source = {toml_str(source)}"]
        if short.count(table) > 1:
            lines.append(f"target = {toml_str(source.replace('.', '_'))}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def render(inspection: Inspection, source_uri: str, directory: Path, *,
           relay_port: int, bootstrap_port: int, bootstrap_storage: str | None,
           target: str | None, capacity_mb: int = 256) -> ConfigSet:
    """The three files for ``inspection``'s source (``directory`` absolute)."""
    if not inspection.tables:
        raise ConfigError("no table to capture: nothing to write")
    env: dict[str, str] = {}
    needs: dict[str, list[str]] = {name: [] for name in FILES}
    source, had = password_to_reference(source_uri, SOURCE_PASSWORD_ENV)
    if had:
        env[SOURCE_PASSWORD_ENV] = ("the source user's password (percent-encoded if it "
                                    "holds @ : / ? # or %)")
        needs["relay.toml"].append(SOURCE_PASSWORD_ENV)
    env[ADMIN_TOKEN_ENV] = ("a secret of your choice, the relay's and the bootstrap "
                            "service's admin token (e.g. openssl rand -hex 16)")
    needs["relay.toml"].append(ADMIN_TOKEN_ENV)
    needs["bootstrap.toml"].append(ADMIN_TOKEN_ENV)
    storage = bootstrap_storage or f"sqlite://{directory / 'bootstrap-data' / 'bootstrap.db'}"
    storage, had = password_to_reference(storage, BOOTSTRAP_PASSWORD_ENV)
    if had:
        env[BOOTSTRAP_PASSWORD_ENV] = "the bootstrap store's password"
        needs["bootstrap.toml"].append(BOOTSTRAP_PASSWORD_ENV)
    target_uri = target or f"sqlite://{directory / 'replica.db'}"
    target_uri, had = password_to_reference(target_uri, TARGET_PASSWORD_ENV)
    if had:
        env[TARGET_PASSWORD_ENV] = "the replication target's password"
        needs["replicate.toml"].append(TARGET_PASSWORD_ENV)
    relay_url = f"http://127.0.0.1:{relay_port}"
    common = {
        "kind": inspection.kind,
        "shown": redact_uri(source_uri),
        "relay_url": toml_str(relay_url),
    }
    values = {
        "relay.toml": {
            "relay_port": str(relay_port),
            "data_dir": toml_str(str(directory / "relay-data")),
            "buffer": toml_str(inspection.buffer),
            "capacity_mb": str(capacity_mb),
            "source": toml_str(source),
        },
        "bootstrap.toml": {
            "bootstrap_port": str(bootstrap_port),
            "storage": toml_str(storage),
        },
        "replicate.toml": {
            "name": toml_str(f"{inspection.buffer}-replica"),
            "bootstrap_url": toml_str(f"http://127.0.0.1:{bootstrap_port}"),
            "target": toml_str(target_uri),
            "tables": _table_blocks(inspection.tables),
        },
    }
    files = {}
    for name in FILES:
        own = {**common, **values[name], "path": str(directory / name),
               "env": ", ".join(needs[name]) or "nothing"}
        files[name] = _fill(_template(name), own)
    return ConfigSet(files, env)


def write(configs: ConfigSet, directory: Path, *, force: bool) -> tuple[list[str], list[str]]:
    """Write the files; (written, refused): a file that exists with other contents is
    refused without ``force``, and then nothing is written."""
    refused = []
    for name, text in configs.files.items():
        path = directory / name
        if path.exists() and not force and path.read_text("utf-8") != text:
            refused.append(name)
    if refused:
        return [], refused
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in configs.files.items():
        path = directory / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text, "utf-8")
        tmp.replace(path)
    return list(configs.files), []
