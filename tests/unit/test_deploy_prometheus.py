"""deploy/prometheus: the recording and alert rules pass ``promtool check rules``, and
the unit tests in deploy/prometheus/tests pass ``promtool test rules``: each alert fires
on synthetic series and stays silent on others (Debian's ``prometheus`` package,
installed by ``make deps``). A broken rule makes them fail (checked by mutating one)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures._procs import in_ci

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted(RULES.glob("*.yml"))
TEST_FILES = sorted((RULES / "tests").glob("*.yml"))


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool not found (Debian package prometheus: make deps)"
        if in_ci():
            pytest.fail(f"{message} (CI=true: a missing prerequisite is a failure)")
        pytest.skip(message)
    return found


def run(*args: str, cwd: Path = RULES) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def alerts() -> dict[str, str]:
    """Each alert's name and its rule's text (up to the next rule), read as lines (the
    files' layout is ours; promtool checks them as YAML)."""
    text = (RULES / "databus-alerts.yml").read_text()
    parts = re.split(r"^      - alert: ", text, flags=re.M)[1:]
    out: dict[str, str] = {}
    for part in parts:
        name, _, body = part.partition("\n")
        assert name not in out, f"alert {name} twice"
        out[name] = body
    return out


def test_promtool_checks_the_rules() -> None:
    assert RULE_FILES and TEST_FILES
    done = run("check", "rules", *map(str, RULE_FILES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = run("test", "rules", *(str(p.relative_to(RULES)) for p in TEST_FILES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_silent_and_tells_the_fix() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for path in TEST_FILES:
        # Each check is "alertname: X" then its "exp_alerts:" line ([] when silent).
        for name, expected in re.findall(r"alertname: (\w+)\n\s+exp_alerts:(.*)\n",
                                         path.read_text()):
            (silent if expected.split("#")[0].strip() == "[]" else fired).add(name)
    rules = alerts()
    assert len(rules) >= 14
    assert set(rules) - fired == set(), "alerts never tested firing"
    assert set(rules) - silent == set(), "alerts never tested silent"
    for name, body in rules.items():
        assert re.search(r"^\s+severity: (critical|warning)$", body, re.M), name
        assert re.search(r"^\s+summary: \S", body, re.M), name
        assert re.search(r"^\s+description: >\n\s+\S", body, re.M), name


def test_a_broken_rule_fails_the_unit_tests(tmp_path: Path) -> None:
    # The unit tests are not vacuous: a threshold moved, or a metric renamed, fails them.
    shutil.copytree(RULES, tmp_path / "prometheus")
    alerts_file = tmp_path / "prometheus" / "databus-alerts.yml"
    original = alerts_file.read_text()
    for old, new in [("databus_relay_fetcher_lag_seconds > 300",
                      "databus_relay_fetcher_lag_seconds > 3000"),
                     ("databus_relay_dumps_failed_total", "databus_relay_dumps_failed")]:
        assert old in original
        alerts_file.write_text(original.replace(old, new))
        done = run("test", "rules", *(f"tests/{p.name}" for p in TEST_FILES),
                   cwd=tmp_path / "prometheus")
        assert done.returncode != 0, f"still passes with {new!r}"
        assert "FAILED" in done.stdout + done.stderr
