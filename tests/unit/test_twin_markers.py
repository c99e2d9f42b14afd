"""Every module with a compiled twin has tests marked ``twin``: the run on the pure-Python
twins (``DATABUS_PURE_PYTHON=1 pytest -m twin``, the last step of ``make test``) takes
only those, so a twin without marked tests would never be run as the reference.

A compiled twin is a ``.pyx`` file of the package: ``<package>/_native.pyx`` replaces the
package's event core (``databus.batch``), ``<package>/_<name>_native.pyx`` replaces
``<package>._<name>``. A test names the module it exercises:
``pytest.mark.twin("databus.batch")``.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _package_dirs() -> dict[str, Path]:
    """Import package -> source folder, from pyproject's package-dir mapping."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {package: ROOT / folder for package, folder in mapping.items()}


def modules_with_twins() -> set[str]:
    found: set[str] = set()
    for package, folder in _package_dirs().items():
        for pyx in folder.rglob("*.pyx"):
            parts = pyx.relative_to(folder).with_suffix("").parts
            dotted = ".".join([package, *parts[:-1]])
            stem = parts[-1]
            if stem == "_native":
                found.add(dotted)
            elif stem.endswith("_native"):
                found.add(f"{dotted}.{stem.removesuffix('_native')}")
    return found


def twin_marks() -> dict[str, set[str]]:
    """Module named by a ``pytest.mark.twin(...)`` -> the test files that carry it."""
    marks: dict[str, set[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "twin"
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr == "mark"):
                for arg in node.args:
                    assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), (
                        f"{path}: pytest.mark.twin takes module names as strings")
                    marks.setdefault(arg.value, set()).add(path.name)
    return marks


def test_the_twins_are_found() -> None:
    assert {"databus.batch", "databus.fetchers.postgres._transcode"} <= modules_with_twins()


def test_every_module_with_a_compiled_twin_has_twin_marked_tests() -> None:
    marks = twin_marks()
    missing = sorted(modules_with_twins() - set(marks))
    assert not missing, (f"modules with a compiled twin but no pytest.mark.twin(...) test: "
                         f"{missing}; the pure-Python run would never test them")


def test_every_twin_mark_names_a_module_with_a_twin() -> None:
    unknown = {module: files for module, files in twin_marks().items()
               if module not in modules_with_twins()}
    assert not unknown, f"pytest.mark.twin names modules with no compiled twin: {unknown}"
