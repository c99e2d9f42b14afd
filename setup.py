"""The compiled twins: databus.batch (Cython, linked with the machine's zlib) and the
PostgreSQL logical fetcher's fast path (databus.fetchers.postgres._transcode_native).

The package list is made here from pyproject.toml's package-dir: every folder with an
``__init__.py`` under its roots (so a new subpackage cannot be left out of the wheel),
plus ``databus.docs`` (docs/, data only). Everything else about the package is in
pyproject.toml. The extension is optional: on
a machine without a C compiler, zlib headers or Cython the build says so in one
warning line and the package runs on the pure-Python twin (databus.batch._python).
"""

from __future__ import annotations

import os
import sys
import tomllib

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that turns a failed compile into one warning line."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (CCompilerError, PlatformError...)
            self._warn(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(exc)

    @staticmethod
    def _warn(exc: Exception) -> None:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"WARNING: databus: a compiled module was not built ({first}); "
              "the pure-Python twin will be used", file=sys.stderr)


def _extensions() -> list[Extension]:
    exts = [
        Extension(
            "databus.batch._native",
            ["databus/batch/_native.pyx"],
            include_dirs=["databus/batch"],
            libraries=["z"],
            extra_compile_args=["-O3"],
        ),
        # The MySQL/MariaDB dump's rows (its twin: _rows_python).
        Extension(
            "databus.fetchers.mysql._rows_native",
            ["fetchers/mysql/_rows_native.pyx"],
            extra_compile_args=["-O3"],
        ),
        # The replicator's rows straight from Avro bytes (its twin: _avrorow_python).
        Extension(
            "databus.replicator._avrorow_native",
            ["replicator/_avrorow_native.pyx"],
            extra_compile_args=["-O3"],
        ),
        # The replicator's binary COPY rows for PostgreSQL (its twin: _pgcopy_python).
        Extension(
            "databus.replicator.targets._pgcopy_native",
            ["replicator/targets/_pgcopy_native.pyx"],
            extra_compile_args=["-O3"],
        ),
        # The PostgreSQL logical fetcher's fast path (its twin: _transcode_python).
        Extension(
            "databus.fetchers.postgres._transcode_native",
            ["fetchers/postgres/_transcode_native.pyx"],
            extra_compile_args=["-O3"],
        ),
    ]
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("WARNING: databus: Cython is not installed; the pure-Python twin will be used",
              file=sys.stderr)
        return []
    return list(cythonize(exts, language_level=3, quiet=True))


# Packages without an __init__.py that ship data only.
DATA_PACKAGES = ("databus.docs",)


def _packages() -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "pyproject.toml"), "rb") as f:
        roots = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    found = set(DATA_PACKAGES)
    for name, folder in roots.items():
        top = os.path.join(here, folder)
        for path, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            if "__init__.py" not in files:
                dirs[:] = []  # not a package: neither are its folders
                continue
            rel = os.path.relpath(path, top)
            found.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return sorted(found)


setup(packages=_packages(), ext_modules=_extensions(),
      cmdclass={"build_ext": OptionalBuildExt})
