"""What users read speaks in the project's own words and stays inside the repository.

User docs (README.md and docs/*.md, but for the developer pages docs/decisions.md and
docs/testing.md) and every ``databus ... --help`` text: no reference to the design
document, to issue numbers or to the papers (none of which a user has), and every
relative link points to a file of the repository that exists."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEVELOPER_DOCS = {"decisions.md", "testing.md"}
USER_DOCS = [ROOT / "README.md",
             *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in DEVELOPER_DOCS)]

# Jargon only the project's developers can resolve.
JARGON = [
    (re.compile(r"\bDESIGN\b"), "the design document"),
    (re.compile(r"\bissues?\s*#?\d+", re.I), "an issue number"),
    (re.compile(r"\bissues?'s?\s+(size|run)", re.I), "an issue's size or run"),
    (re.compile(r"\bpaper\s+\d", re.I), "a paper number"),
    (re.compile(r"\bseed\s+0\d\d\b", re.I), "a seed number"),
    (re.compile(r"shared/(DESIGN|papers)"), "a path outside the repository"),
]

_FENCE = re.compile(r"```.*?```", re.S)
_INLINE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _jargon(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in JARGON:
            match = pattern.search(line)
            if match:
                found.append(f"line {number}: {what}: {match.group(0)!r}")
    return found


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_user_docs_have_no_jargon(doc: Path) -> None:
    assert _jargon(doc.read_text()) == [], doc.relative_to(ROOT)


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.name)
def test_user_doc_links_stay_in_the_repository(doc: Path) -> None:
    assert _broken_links(doc) == [], doc.relative_to(ROOT)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    for text in ("contracts in DESIGN section 4", "see DESIGN 17", "(issue 28)",
                 "Built (issue 19)", "at the issue's size", "paper 000 section 3.2",
                 "[design](../shared/DESIGN.md)"):
        assert _jargon(text), text
    assert _jargon("a design choice; issues are tracked; 17 tables") == []
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "concepts.md").write_text("")
    probe = tmp_path / "docs" / "probe.md"
    probe.write_text("[a](../../shared/DESIGN.md) [b](nothere.md) [c](concepts.md#x) "
                     "[d](https://example.org) `[e](inline.md)` [f](#top)")
    assert _broken_links(probe, tmp_path) == ["../../shared/DESIGN.md: outside the repository",
                                              "nothere.md: no such file"]


def _broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    text = _INLINE.sub("", _FENCE.sub("", doc.read_text()))
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s)://, mailto:, an anchor of the same page
        path = target.split("#", 1)[0]
        resolved = (doc.parent / path).resolve()
        if not resolved.is_relative_to(root):
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
    return broken


def _parsers(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, str]]:
    yield prog, parser.format_help()
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


HELP = dict(_parsers(build_parser(), "databus"))


def test_every_command_is_walked() -> None:
    for command in ("databus relay", "databus bootstrap", "databus tail",
                    "databus dump start", "databus cluster status", "databus replicate",
                    "databus group status", "databus status", "databus check-config"):
        assert command in HELP, sorted(HELP)


@pytest.mark.parametrize("command", sorted(HELP))
def test_help_has_no_jargon(command: str) -> None:
    assert _jargon(HELP[command]) == [], command


def test_help_as_printed() -> None:
    """The texts walked above are what ``--help`` prints (one command, end to end)."""
    out = subprocess.run([sys.executable, "-m", "databus.cli", "tail", "--help"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert _jargon(out) == []
    assert out.split("\n\n", 1)[1] == HELP["databus tail"].split("\n\n", 1)[1]
