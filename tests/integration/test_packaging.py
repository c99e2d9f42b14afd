"""The wheel and the sdist carry what an operator needs, and a fresh virtualenv that
installs only the built wheel runs ``databus init`` and the configs it writes.

Built from a copy of the source tree (nothing is written into the checkout): the sdist
with setuptools' PEP 517 hooks, then the wheel from the unpacked sdist (so the sdist
is proven complete). The compiled modules are left out (Cython hidden from the build:
setup.py then builds the pure-Python wheel), which keeps the build to seconds; what is
checked is the files. Every package folder of the tree, the example configs and the
``init`` templates (``databus.deploy``), ``deploy/systemd``, ``deploy/prometheus`` and
``deploy/grafana`` (whatever they hold), the dashboard's static files and the docs must
be in both.

The fresh venv installs the wheel with ``--no-deps`` and borrows the dependencies from
the test's own virtualenv (a ``.pth`` line, which does not run the checkout's editable
finder); with ``DATABUS_TEST_TIER=full`` pip resolves them from the index instead.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures._procs import free_port
from tests.relay_harness import get_url
from tests.tiers import FULL
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# pyproject's package-dir: import root -> folder.
ROOTS = {"databus": "databus", "databus/relay": "relay", "databus/bootstrap": "bootstrap",
         "databus/client": "client", "databus/fetchers": "fetchers",
         "databus/spark_jobs": "spark_jobs", "databus/replicator": "replicator",
         "databus/deploy": "deploy", "databus/docs": "docs"}
_BUILD_PRODUCTS = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".typecheck",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", "*.so", "*.c")


def _skip(folder: str, names: list[str]) -> set[str]:
    """What the copy leaves out: build products, and the top-level tests and benchmarks."""
    skipped = set(_BUILD_PRODUCTS(folder, names))
    if Path(folder) == ROOT:
        skipped |= {"tests", "benchmarks"} & set(names)
    return skipped
# Hides Cython from setup.py: the pure-Python build, in seconds.
_NO_CYTHON = "import sys; sys.modules['Cython'] = sys.modules['Cython.Build'] = None; "


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{argv}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _hook(hook: str, src: Path, out: Path, deps: Path) -> Path:
    env = {**os.environ, "PYTHONPATH": str(deps)}
    name = _run([sys.executable, "-c", _NO_CYTHON + "from setuptools import build_meta; "
                 f"print(build_meta.{hook}({str(out)!r}))"], src, env).strip().splitlines()[-1]
    return out / name


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(sdist, wheel)."""
    base = tmp_path_factory.mktemp("packaging")
    deps = base / "build-deps"  # setuptools new enough for PEP 660/bdist_wheel itself
    _run([sys.executable, "-m", "pip", "install", "-q", "--target", str(deps),
          "setuptools>=70.1"], base)
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=_skip)
    dist = base / "dist"
    dist.mkdir()
    sdist = _hook("build_sdist", src, dist, deps)
    with tarfile.open(sdist) as tar:
        tar.extractall(base / "unpacked", filter="data")
    [unpacked] = (base / "unpacked").iterdir()
    wheel = _hook("build_wheel", unpacked, dist, deps)
    yield sdist, wheel


def _expected_files() -> set[str]:
    """Paths (as installed, ``databus/...``) the wheel must hold: every module and
    package data file of the tree that ships."""
    want = set()
    for installed, folder in ROOTS.items():
        top = ROOT / folder
        for path in top.rglob("*"):
            rel = path.relative_to(top)
            # Cython sources are the sdist's (the wheel carries the compiled modules).
            if not path.is_file() or "__pycache__" in rel.parts or path.suffix in (
                    ".c", ".so", ".pyc", ".pyx", ".pxi", ".h"):
                continue
            if installed != "databus" or rel.parts[0] not in ("deploy", "docs"):
                want.add(f"{installed}/{rel.as_posix()}")
    return want


def test_wheel_and_sdist_hold_the_package_configs_docs_and_assets(
        built: tuple[Path, Path]) -> None:
    sdist, wheel = built
    with zipfile.ZipFile(wheel) as zf:
        in_wheel = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in in_wheel
                            if n.endswith(".dist-info/entry_points.txt"))
    missing = sorted(_expected_files() - in_wheel)
    assert not missing, f"not in the wheel: {missing[:20]}"
    for needed in ("databus/security/__init__.py", "databus/init/_cli.py",
                   "databus/deploy/relay.toml", "databus/deploy/spark-submit.sh",
                   "databus/deploy/init/relay.toml.in", "databus/docs/relay.md",
                   "databus/py.typed"):
        assert needed in in_wheel
    assert "init = databus.init._cli" in entry_points
    with tarfile.open(sdist) as tar:
        in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    tracked = {p.relative_to(ROOT).as_posix() for folder in ("deploy", "docs")
               for p in (ROOT / folder).rglob("*") if p.is_file()
               and "__pycache__" not in p.parts}
    tracked |= {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.pyx")
                if ".venv" not in p.parts}
    tracked |= {"README.md", "pyproject.toml", "setup.py", "MANIFEST.in"}
    static = ROOT / "databus" / "dashboard" / "static"
    if static.is_dir():
        tracked |= {p.relative_to(ROOT).as_posix() for p in static.rglob("*") if p.is_file()}
    missing = sorted(tracked - in_sdist)
    assert not missing, f"not in the sdist: {missing[:20]}"


def test_a_fresh_venv_with_only_the_wheel_runs_init_and_its_configs(
        built: tuple[Path, Path], tmp_path: Path) -> None:
    _, wheel = built
    venv = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    if FULL:
        _run([str(python), "-m", "pip", "install", "-q", str(wheel)], tmp_path, timeout=900)
    else:
        _run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp_path)
        # The dependencies, borrowed: a path line only (the .pth files of that folder,
        # the checkout's editable finder among them, are not run).
        fresh_site = _run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"], tmp_path).strip()
        Path(fresh_site, "borrowed-deps.pth").write_text(
            sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PATH": f"{venv / 'bin'}:{env.get('PATH', '')}", "DATABUS_ADMIN_TOKEN": "tok",
            "PYTHONUNBUFFERED": "1"}
    where = _run([str(python), "-c", "import databus, databus.deploy; "
                  "print(databus.__file__)"], tmp_path, env)
    assert where.startswith(str(venv)), where  # the wheel's, not the checkout's
    if (ROOT / "databus" / "dashboard" / "static" / "index.html").is_file():
        # The dashboard's page is found where it serves it from.
        _run([str(python), "-c", "from importlib import resources; assert resources.files("
              "'databus.dashboard').joinpath('static', 'index.html').is_file()"], tmp_path, env)
    databus = str(venv / "bin" / "databus")
    db = tmp_path / "shop.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
    conn.execute("INSERT INTO orders VALUES (1, 'a')")
    conn.commit()
    conn.close()
    uri = f"sqlite://{db}?tables=orders"
    _run([databus, "txlog", "install", "--source", uri], tmp_path, env)
    _run([databus, "dump", "setup", "--source", uri], tmp_path, env)
    port = free_port()
    conf = tmp_path / "conf"
    out = _run([databus, "init", "sqlite", "--source", uri, "--dir", str(conf),
                "--relay-port", str(port), "--bootstrap-port", str(free_port()),
                "--capacity-mb", "8"], tmp_path, env)
    assert "wrote relay.toml, bootstrap.toml, replicate.toml" in out
    for name in ("relay.toml", "bootstrap.toml", "replicate.toml"):
        json.loads(_run([databus, "check-config", str(conf / name)], tmp_path, env))
    with open(tmp_path / "relay.log", "wb") as log:
        relay = subprocess.Popen([databus, "relay", "--config", str(conf / "relay.toml")],
                                 stdout=log, stderr=log, env=env, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert relay.poll() is None, (tmp_path / "relay.log").read_text()
            try:
                status = json.loads(get_url(url + "/v1/status"))
            except OSError:
                return False  # not listening yet
            return bool(status["ready"])
        wait_until(ready, "the wheel's relay ready", 60,
                   diagnose=(tmp_path / "relay.log").read_text)
    finally:
        relay.terminate()
        assert relay.wait(timeout=30) == 0, (tmp_path / "relay.log").read_text()
