"""The ``databus`` entry point: version, help, subcommand registration, error exit codes."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import databus
from databus import cli


def test_version_from_installed_entry_point() -> None:
    exe = Path(sys.executable).with_name("databus")
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    from databus import batch

    line = out.stdout.strip()
    assert line.startswith(f"databus {databus.__version__} (event core: ")
    # It names the core this interpreter runs (the child inherits DATABUS_PURE_PYTHON).
    assert f"(event core: {batch.IMPLEMENTATION}" in line


def test_version_says_when_the_twin_is_forced() -> None:
    import os

    exe = Path(sys.executable).with_name("databus")
    env = {**os.environ, "DATABUS_PURE_PYTHON": "1"}
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True,
                         env=env)
    assert "(event core: python; DATABUS_PURE_PYTHON is set)" in out.stdout


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_registered_module_adds_a_subcommand(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []

    def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        p = subparsers.add_parser("hello")
        p.add_argument("name")
        p.set_defaults(handler=lambda args: calls.append(args.name) or 0)

    module = type(sys)("databus_test_hello")
    module.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "databus_test_hello", module)
    monkeypatch.setattr(cli, "BUILTIN_COMMAND_MODULES", [*cli.BUILTIN_COMMAND_MODULES,
                                                        "databus_test_hello"])
    assert cli.main(["hello", "world"]) == 0
    assert calls == ["world"]


def test_databus_error_becomes_exit_code_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        "[relay]\ndata_dir = '/tmp/x'\nport = 'eleven'\n"
        "[[relay.buffers]]\nname = 'a'\ncapacity_mb = 1\nsource = 'synthetic://'\n"
    )
    assert cli.main(["check-config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.toml" in err and "relay.port" in err


def test_check_config_hides_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABUS_ADMIN_TOKEN", "tok-s3cret")
    monkeypatch.setenv("MYSQL_PASSWORD", "pw-s3cret")
    example = Path(__file__).resolve().parents[2] / "deploy" / "relay.toml"
    assert cli.main(["check-config", str(example)]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out
    assert '"name": "shop"' in out and "repl:***@127.0.0.1" in out
