"""No ``asyncio.wait_for`` in the package (issue 27): on Python 3.11 it loses a
cancellation that arrives as the awaited operation completes. A group member's pull
task, cancelled to end its stream at a rebalance, went on reading its stream for good
(every event applied, the rebalance never taken); ``asyncio.timeout`` has no such race.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CALL = re.compile(r"\bwait_for\(")


def package_dirs() -> list[Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return sorted({ROOT / d for d in config["tool"]["setuptools"]["package-dir"].values()})


def test_the_package_uses_asyncio_timeout_not_wait_for() -> None:
    found = []
    for folder in package_dirs():
        for path in folder.rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if CALL.search(code) and "wait_for(" in code and "asyncio" in code:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "asyncio.wait_for can lose a cancellation:\n" + "\n".join(found)
