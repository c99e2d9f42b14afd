"""deploy/systemd: the units pass ``systemd-analyze verify`` (systemd 252, no systemd
running: the tests check copies whose ExecStart names this venv's ``databus``, since
verify refuses a binary that does not exist), their hardening scores "OK" in
``systemd-analyze security --offline``, their ExecStart command lines parse with the
real ``databus`` argument parser, the example configs they name pass the config check
with the example secret files, and the sysusers/tmpfiles snippets create the user and
its directories in a scratch root. A unit with a typo fails (checked by mutating one).
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from databus.cli import build_parser
from databus.config import load_config
from tests.fixtures._procs import in_ci

ROOT = Path(__file__).resolve().parents[2]
UNITS_DIR = ROOT / "deploy" / "systemd"
UNITS = sorted(UNITS_DIR.glob("*.service"))
INSTALLED = "/opt/databus/bin/databus"
DATABUS = str(Path(sys.executable).with_name("databus"))
# What each unit reads: its config (deploy/*.toml is what goes to /etc/databus) and
# its example secrets.
CONFIGS = {"databus-relay.service": "relay", "databus-bootstrap.service": "bootstrap",
           "databus-replicate.service": "replicate"}


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        message = f"{name} not found (Debian packages systemd, strace)"
        if in_ci():
            pytest.fail(f"{message} (CI=true: a missing prerequisite is a failure)")
        pytest.skip(message)
    return found


def local_copies(tmp_path: Path, units: list[Path] = UNITS) -> list[Path]:
    """The units with ExecStart naming this venv's ``databus``."""
    out = []
    for unit in units:
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace(INSTALLED, DATABUS))
        out.append(copy)
    return out


def verify(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("systemd-analyze"), "verify", *map(str, paths)],
                          capture_output=True, text=True, timeout=120, cwd=paths[0].parent)


def directive(unit: Path, key: str) -> list[str]:
    return re.findall(rf"^{key}=(.*)$", unit.read_text(), re.M)


def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def exec_argv(unit: Path) -> list[str]:
    """ExecStart as systemd runs it: ``$NAME`` (unbraced) split into words from the
    unit's example environment file."""
    (line,) = directive(unit, "ExecStart")
    env: dict[str, str] = {}
    for name in directive(unit, "EnvironmentFile"):
        example = UNITS_DIR / (Path(name.lstrip("-")).name + ".example")
        if example.exists():
            env.update(env_file(example))
    argv: list[str] = []
    for word in shlex.split(line):
        if word.startswith("$") and not word.startswith("${"):
            argv += env[word[1:]].split()
        else:
            argv.append(word)
    return argv


def test_there_is_a_unit_per_daemon() -> None:
    assert [u.name for u in UNITS] == ["databus-bootstrap.service",
                                       "databus-dashboard.service",
                                       "databus-relay.service",
                                       "databus-replicate.service"]


def test_every_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    done = verify(local_copies(tmp_path))
    # Unknown keys and bad values are warnings (status 0): any output is a failure.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    # As shipped, ExecStart names the install path: verify checks it exists.
    shipped = verify([UNITS_DIR / "databus-relay.service"])
    if not Path(INSTALLED).exists():
        assert INSTALLED in shipped.stdout + shipped.stderr


def test_a_unit_with_a_typo_fails_verify(tmp_path: Path) -> None:
    (copy,) = local_copies(tmp_path, [UNITS_DIR / "databus-relay.service"])
    copy.write_text(copy.read_text().replace("ProtectSystem=strict", "ProtectSystm=strict"))
    done = verify([copy])
    assert "ProtectSystm" in done.stdout + done.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.stem)
def test_the_hardening_rates_ok(unit: Path, tmp_path: Path) -> None:
    (copy,) = local_copies(tmp_path, [unit])
    done = subprocess.run([tool("systemd-analyze"), "security", "--offline=true",
                           "--no-pager", str(copy)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) < 3.0, done.stdout
    text = unit.read_text()
    for wanted in ("User=databus", "ProtectSystem=strict", "NoNewPrivileges=yes",
                   "PrivateTmp=yes", "ProtectHome=yes", "SystemCallFilter=@system-service",
                   "Restart=on-failure", "KillSignal=SIGTERM"):
        assert wanted in text.splitlines(), wanted
    # Relay workers talk to the main process over unix sockets.
    assert "AF_UNIX" in directive(unit, "RestrictAddressFamilies")[0].split()
    for key in ("RestartSec", "TimeoutStopSec", "LimitNOFILE"):
        assert int(directive(unit, key)[0]) > 0, key


def allowed_syscalls(group: str) -> set[str]:
    """The system calls of a ``systemd-analyze syscall-filter`` group, nested groups
    expanded."""
    done = subprocess.run([tool("systemd-analyze"), "syscall-filter"], capture_output=True,
                          text=True, timeout=60, check=True)
    groups: dict[str, set[str]] = {}
    current = ""
    for line in done.stdout.splitlines():
        if line.startswith("@"):
            current = line.strip()
            groups[current] = set()
        elif line.startswith("    ") and current and not line.strip().startswith("#"):
            groups[current].add(line.strip())

    def expand(name: str) -> set[str]:
        out: set[str] = set()
        for each in groups.get(name, ()):
            out |= expand(each) if each.startswith("@") else {each}
        return out

    return expand(group)


def test_the_relays_needs_are_in_its_system_call_filter() -> None:
    # mmap (the buffers), socketpair and prctl/setsid (worker processes) are in
    # @system-service; @system-service is what every unit allows.
    allowed = allowed_syscalls("@system-service")
    assert {"mmap", "munmap", "msync", "socketpair", "prctl", "setsid", "clone",
            "execve", "accept4", "epoll_wait"} <= allowed


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.stem)
def test_exec_start_parses_with_the_databus_parser(unit: Path) -> None:
    argv = exec_argv(unit)
    assert argv[0] == INSTALLED
    parser = build_parser()
    commands = next(a for a in parser._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    if argv[1] not in commands:
        pytest.skip(f"databus {argv[1]} is not in this build")
    args = parser.parse_args(argv[1:])  # SystemExit(2) on anything it does not take
    assert args.command == argv[1] and callable(args.handler)
    if unit.name in CONFIGS:
        name = CONFIGS[unit.name]
        assert args.config == f"/etc/databus/{name}.toml"


@pytest.mark.parametrize("unit", sorted(CONFIGS), ids=lambda u: u.removesuffix(".service"))
def test_the_example_configs_load_with_the_example_secrets(
        unit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name = CONFIGS[unit]
    secrets = env_file(UNITS_DIR / f"{name}.env.example")
    for key in re.findall(r"\$\{(\w+)\}", (ROOT / "deploy" / f"{name}.toml").read_text()):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(Exception, match=r"not set|environment"):
        load_config(ROOT / "deploy" / f"{name}.toml")
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    config = load_config(ROOT / "deploy" / f"{name}.toml")
    assert getattr(config, name) is not None


def test_sysusers_and_tmpfiles_make_the_user_and_its_directories(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    done = subprocess.run([tool("systemd-sysusers"), f"--root={root}",
                           str(UNITS_DIR / "databus.sysusers.conf")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (entry,) = [line for line in (root / "etc" / "passwd").read_text().splitlines()
                if line.startswith("databus:")]
    uid, gid = int(entry.split(":")[2]), int(entry.split(":")[3])
    assert entry.endswith(":/var/lib/databus:/usr/sbin/nologin")
    done = subprocess.run([tool("systemd-tmpfiles"), f"--root={root}", "--create",
                           str(UNITS_DIR / "databus.tmpfiles.conf")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    etc, state = (root / "etc" / "databus").stat(), (root / "var/lib/databus/relay").stat()
    assert (etc.st_uid, etc.st_gid, etc.st_mode & 0o777) == (0, gid, 0o750)
    assert (state.st_uid, state.st_gid, state.st_mode & 0o777) == (uid, gid, 0o750)
