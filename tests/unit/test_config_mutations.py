"""Bad config files (issue 27, item 9): every command that takes a config file answers a
damaged one with one line on stderr naming the file, and a non-zero exit; never a
traceback, whatever the damage (bad bytes, deep nesting, huge numbers, wrong types, an
empty file, binary garbage, a truncated file).

Each mutation of each example config goes through ``databus.cli.main`` in this process
(every command's real handler, which loads the file first), and a sample goes through
the installed ``databus`` as a subprocess.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from databus import cli
from databus.config import load_config
from databus.errors import ConfigError

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ENV = {"DATABUS_ADMIN_TOKEN": "adm1n-t0ken", "MYSQL_PASSWORD": "hunter2-very-secret",
       "PG_PASSWORD": "pg-secret", "DATABUS_BOOTSTRAP_TOKEN": "b00t-token",
       "BOOTSTRAP_DB_PASSWORD": "bdb-secret"}

# Each command that reads a config file, with the example it takes.
COMMANDS: dict[str, tuple[list[str], str]] = {
    "check-config": (["check-config"], "relay.toml"),
    "relay": (["relay", "--config"], "relay.toml"),
    "relay-worker": (["relay", "--worker", "{}", "--config"], "relay.toml"),
    "bootstrap": (["bootstrap", "--config"], "bootstrap.toml"),
    "replicate": (["replicate", "--config"], "replicate.toml"),
    "replicate-assess": (["replicate", "assess", "--config"], "replicate.toml"),
}

Mutation = Callable[[bytes], bytes]


def _insert_at_value(raw: bytes, junk: bytes) -> bytes:
    """``junk`` in the middle of the first quoted string value."""
    at = raw.index(b'"') + 2
    return raw[:at] + junk + raw[at:]


def _set(key: bytes, value: bytes) -> Mutation:
    """The first ``key = ...`` line, with ``value`` (added to the first table if absent)."""
    def mutate(raw: bytes) -> bytes:
        lines = raw.split(b"\n")
        for i, line in enumerate(lines):
            if line.split(b"=")[0].strip() == key:
                lines[i] = key + b" = " + value
                return b"\n".join(lines)
        first = next(i for i, line in enumerate(lines) if line.startswith(b"["))
        lines.insert(first + 1, key + b" = " + value)
        return b"\n".join(lines)
    return mutate


def _garbage(seed: int, size: int) -> Mutation:
    return lambda raw: random.Random(seed).randbytes(size)


MUTATIONS: dict[str, Mutation] = {
    # bad bytes
    "invalid utf-8 in a value": lambda raw: _insert_at_value(raw, b"\xff"),
    "invalid utf-8 in a comment": lambda raw: b"# caf\xe9\n" + raw,
    "utf-8 cut in the middle of a character": lambda raw: raw + b"\n# \xe2\x82",
    "a lone surrogate encoded": lambda raw: _insert_at_value(raw, b"\xed\xa0\x80"),
    "a NUL byte": lambda raw: _insert_at_value(raw, b"\x00"),
    "a UTF-16 file": lambda raw: raw.decode().encode("utf-16"),
    "a byte order mark": lambda raw: b"\xef\xbb\xbf" + raw,
    # deep nesting
    "a 2,000-deep array": _set(b"port", b"[" * 2000 + b"]" * 2000),
    "a 100,000-deep array": _set(b"port", b"[" * 100_000 + b"]" * 100_000),
    "a 2,000-deep inline table": _set(b"port", b"{a=" * 2000 + b"1" + b"}" * 2000),
    "a 40-deep array": _set(b"port", b"[" * 40 + b"]" * 40),
    "a 2,000-deep dotted table": lambda raw: raw + b"\n[" + b".".join([b"x"] * 2000) + b"]\n",
    "an unclosed array": _set(b"port", b"[" * 50),
    # huge and odd numbers
    "an integer of 5,000 digits": _set(b"port", b"9" * 5000),
    "an integer over 64 bits": _set(b"port", b"18446744073709551617"),
    "a negative integer over 64 bits": _set(b"port", b"-18446744073709551617"),
    "a float of 1e999": _set(b"port", b"1e999"),
    "inf for an int": _set(b"port", b"inf"),
    "nan for a float": _set(b"header_timeout_s", b"nan"),
    "inf for a float": _set(b"header_timeout_s", b"inf"),
    "-inf for a float": _set(b"header_timeout_s", b"-inf"),
    "a float over 64-bit ints": _set(b"header_timeout_s", b"1" + b"0" * 400),
    # wrong types
    "a string for an int": _set(b"port", b'"eleven"'),
    "a table for an int": _set(b"port", b"{ a = 1 }"),
    "an array for a string": _set(b"host", b'["a", "b"]'),
    "a bool for a float": _set(b"header_timeout_s", b"true"),
    "a date for a string": _set(b"host", b"1979-05-27T07:32:00Z"),
    "a section that is a string": lambda raw: b'relay = "x"\nbootstrap = "x"\nreplicate = 1\n',
    "an unknown key": _set(b"prot", b"1"),
    "an unset environment variable": _set(b"host", b'"${DATABUS_NOT_SET_ANYWHERE}"'),
    "a huge integer from the environment": _set(b"port", b'"${DATABUS_HUGE_NUMBER}"'),
    # empty and garbage
    "an empty file": lambda raw: b"",
    "only whitespace": lambda raw: b"\n \t\n",
    "only comments": lambda raw: b"# nothing here\n",
    "binary garbage": _garbage(1, 4096),
    "short binary garbage": _garbage(2, 16),
    "all NUL bytes": lambda raw: b"\x00" * 1024,
    "a file of 5 MiB": lambda raw: raw + b"\n#" + b"x" * (5 << 20),
    "a duplicate key": lambda raw: _set(b"port", b"1\nport = 2")(raw),
    "a duplicate table": lambda raw: raw + b"\n" + raw,
    # truncated
    "cut after the first 10 bytes": lambda raw: raw[:10],
    "cut inside a string": lambda raw: raw[:raw.index(b'"') + 3],
    "cut in the middle": lambda raw: raw[:len(raw) // 2],
    "cut one byte short": lambda raw: raw.rstrip()[:-1],
}


def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATABUS_HUGE_NUMBER", "9" * 30)
    monkeypatch.delenv("DATABUS_NOT_SET_ANYWHERE", raising=False)


def _mutated(tmp_path: Path, example: str, name: str) -> Path:
    raw = (DEPLOY / example).read_bytes()
    path = tmp_path / f"mutated-{example}"
    path.write_bytes(MUTATIONS[name](raw))
    return path


def _loads(path: Path, section: str) -> bool:
    """Whether the mutated file is still a valid config with ``section`` (a cut at a line
    end may be): such a file is not bad input."""
    try:
        return getattr(load_config(path), section) is not None
    except ConfigError:
        return False


def _section(command: str) -> str:
    return {"check-config": "relay", "relay-worker": "relay",
            "replicate-assess": "replicate"}.get(command, command)


def _check_one_line(stderr: str, path: Path, what: str) -> None:
    assert "Traceback" not in stderr, f"{what}: a traceback:\n{stderr[-3000:]}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"{what}: not one line:\n{stderr[-3000:]}"
    assert str(path) in lines[0] and "error" in lines[0], f"{what}: {lines[0]}"
    assert len(lines[0]) < 500, f"{what}: a line of {len(lines[0])} characters"


# Truncating the bootstrap example ends it after a complete line: still a valid config.
STILL_VALID = frozenset({("cut in the middle", "bootstrap"),
                         ("cut one byte short", "bootstrap")})


@pytest.mark.parametrize(("name", "command"), [
    (name, command) for name in sorted(MUTATIONS) for command in sorted(COMMANDS)
    if (name, command) not in STILL_VALID])
def test_every_command_answers_a_bad_config_in_one_line(
        command: str, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _env(monkeypatch)
    args, example = COMMANDS[command]
    path = _mutated(tmp_path, example, name)
    assert not _loads(path, _section(command)), "the mutation left a valid config"
    code = cli.main([*args, str(path)])
    captured = capsys.readouterr()
    assert code != 0, f"{name}: exit status 0"
    _check_one_line(captured.err, path, name)
    assert captured.out == ""


def test_check_config_refuses_a_file_the_daemons_refuse(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("", "# only a comment\n"):
        path = tmp_path / "empty.toml"
        path.write_text(text)
        assert cli.main(["check-config", str(path)]) == 1
        err = capsys.readouterr().err
        assert "no section to run" in err and str(path) in err


def test_messages_say_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    for text, message in [
        ("[relay]\nport = " + "9" * 5000, "an integer of thousands of digits"),
        ("[relay]\nport = 18446744073709551617", "relay.port: integer out of the signed 64"),
        ("[relay]\nport = " + "[" * 2000 + "]" * 2000, "nested deeper than 32 levels"),
        ("[relay]\ndata_dir = \"/tmp/x\"\nheader_timeout_s = nan\n[[relay.buffers]]\n"
         'name = "a"\ncapacity_mb = 1\nsource = "synthetic://"\n',
         "relay.header_timeout_s: expected a finite number, got nan"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=message) as info:
            load_config(path)
        assert "sys." not in info.value.message and "\n" not in info.value.message


def test_a_bad_byte_is_located(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_bytes(b'[relay]\nhost = "ab\xffc"\n')
    with pytest.raises(ConfigError, match=r"not UTF-8 text: byte 0xff at line 2, column 11"):
        load_config(path)


# The subprocess sample: each command with three of these, in turn, so that each
# mutation runs through at least two commands (18 processes, not 48).
SAMPLE = ["invalid utf-8 in a value", "a 2,000-deep array", "an integer of 5,000 digits",
          "nan for a float", "a string for an int", "an empty file", "binary garbage",
          "cut inside a string"]


def test_the_installed_command_answers_bad_configs_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch)
    runs: list[tuple[str, list[str], Path]] = []
    for c, (command, (args, example)) in enumerate(sorted(COMMANDS.items())):
        for i in range(3):
            name = SAMPLE[(c * 3 + i) % len(SAMPLE)]
            folder = tmp_path / f"{command}-{i}"
            folder.mkdir()
            path = _mutated(folder, example, name)
            assert not _loads(path, _section(command)), name
            runs.append((f"{command}: {name}", args, path))

    script = Path(sys.executable).with_name("databus")
    databus = [str(script)] if script.exists() else [sys.executable, "-m", "databus.cli"]

    def run(args: list[str], path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*databus, *args, str(path)],
                              capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda r: run(r[1], r[2]), runs))
    for (what, _args, path), proc in zip(runs, done, strict=True):
        assert proc.returncode not in (0, None), f"{what}: exit status {proc.returncode}"
        _check_one_line(proc.stderr, path, what)


RELAY = """[relay]
data_dir = "{data_dir}"
host = "{host}"
port = 0
workers = {workers}
[[relay.buffers]]
name = "a"
capacity_mb = 1
source = "synthetic://?rate=1"
"""


UNSERVABLE = {
    "relay, a host that does not resolve":
        RELAY.format(data_dir="{tmp}/d", host="256.0.0.1", workers=1),
    "relay with workers, a host that does not resolve":
        RELAY.format(data_dir="{tmp}/d", host="256.0.0.1", workers=2),
    "relay, a data_dir that cannot be created":
        RELAY.format(data_dir="/proc/no/such/dir", host="127.0.0.1", workers=1),
    "bootstrap, a host that does not resolve":
        '[bootstrap]\nstorage = "sqlite:///{tmp}/b.db"\nrun = ["server"]\nhost = "256.0.0.1"\n',
}


@pytest.mark.parametrize("name", sorted(UNSERVABLE))
def test_a_config_the_machine_cannot_serve_is_one_line(name: str, tmp_path: Path) -> None:
    """Valid TOML and valid values that this machine cannot serve: one line too."""
    path = tmp_path / "config.toml"
    path.write_text(UNSERVABLE[name].replace("{tmp}", str(tmp_path)))
    command = "relay" if name.startswith("relay") else "bootstrap"
    script = Path(sys.executable).with_name("databus")
    proc = subprocess.run([str(script), command, "--config", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, f"{name}: exit status {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"databus {command}: error: "), proc.stderr[-3000:]
    assert "256.0.0.1" in last or "/proc/no" in last, last
