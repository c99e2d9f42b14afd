"""deploy/grafana/databus.json: a Grafana dashboard whose datasource is the
``${DS_PROMETHEUS}`` input, whose every query is PromQL that promtool parses, and whose
metric names (with the alert rules') are checked against what the daemons export: here
against the names their collectors declare, in tests/integration/test_deploy_metric_names.py
against real processes' /metrics. The helpers that read names are shared by both."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures._procs import in_ci

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "databus.json"
RULES = ROOT / "deploy" / "prometheus"
# Series Prometheus makes itself, not the daemons.
PROMETHEUS_OWN = {"up"}


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(doc: dict[str, Any]) -> list[str]:
    """Every PromQL the dashboard runs: its panels' targets and its variables'
    ``label_values(<selector>, label)`` selectors."""
    out = [t["expr"] for p in panels(doc) for t in p.get("targets", [])]
    for variable in doc["templating"]["list"]:
        query = variable["query"]["query"]
        found = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
        assert found, query
        out.append(found.group(1))
    return out


def rule_expressions() -> tuple[list[str], set[str]]:
    """The rules' expressions and the names the recording rules define (read as text:
    each ``expr:`` is one line or a folded block)."""
    exprs: list[str] = []
    recorded: set[str] = set()
    for path in sorted(RULES.glob("*.yml")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if m := re.match(r"^\s+- record: (\S+)$", line):
                recorded.add(m.group(1))
            if m := re.match(r"^(\s+)expr: (.*)$", line):
                if m.group(2).strip() != ">":
                    exprs.append(m.group(2))
                    continue
                block = []
                for more in lines[i + 1:]:
                    if more.strip() and len(more) - len(more.lstrip()) <= len(m.group(1)):
                        break
                    block.append(more.strip())
                exprs.append(" ".join(block))
    return exprs, recorded


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: label values (quoted) left out, then every
    name of the daemons' (``databus_``), a recording rule's (``databus:``) or
    Prometheus's own."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return {w for w in words if w.startswith(("databus_", "databus:")) or w in PROMETHEUS_OWN}


def exported_names(pages: Iterable[str]) -> set[str]:
    """The series names /metrics pages hold, samples or not: a family without samples is
    still declared (``# TYPE``), a counter's series end in ``_total``."""
    names: set[str] = set()
    for page in pages:
        for family in text_string_to_metric_families(page):
            names |= {s.name for s in family.samples}
            names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def unknown_names(exported: set[str]) -> dict[str, set[str]]:
    """Per file, the names it uses that neither the daemons export nor a recording rule
    defines (nor Prometheus makes)."""
    exprs, recorded = rule_expressions()
    known = exported | recorded | PROMETHEUS_OWN
    out = {"rules": set().union(*map(metric_names, exprs)) - known,
           "grafana": set().union(*map(metric_names, dashboard_queries(dashboard()))) - known}
    return {k: v for k, v in out.items() if v}


def test_the_dashboard_takes_its_datasource_as_an_input() -> None:
    doc = dashboard()
    assert [i["name"] for i in doc["__inputs"]] == ["DS_PROMETHEUS"]
    assert doc["__inputs"][0]["pluginId"] == "prometheus"
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids)) > 20
    for panel in panels(doc):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"] and all(t["datasource"] == panel["datasource"]
                                        for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
    for variable in doc["templating"]["list"]:
        assert variable["datasource"]["uid"] == "${DS_PROMETHEUS}"
    titles = " ".join(p["title"] for p in panels(doc)).lower()
    for wanted in ("input rate", "source lag", "consumer lag (seconds)", "consumer lag (scn)",
                   "components", "dump", "replication lag", "bootstrap lag"):
        assert wanted in titles, wanted


def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    # promtool parses PromQL in rule files: each query becomes a recording rule, with
    # Grafana's variables given values.
    promtool = shutil.which("promtool")
    if promtool is None:
        if in_ci():
            pytest.fail("promtool not found (CI=true: a missing prerequisite is a failure)")
        pytest.skip("promtool not found (Debian package prometheus: make deps)")
    queries = dashboard_queries(dashboard())
    lines = ["groups:", "  - name: grafana", "    rules:"]
    for i, query in enumerate(queries):
        promql = query.replace("$__rate_interval", "5m").replace("$job", ".*") \
            .replace("$buffer", ".*")
        lines += [f"      - record: grafana_query_{i}", f"        expr: {json.dumps(promql)}"]
    rules = tmp_path / "grafana.yml"
    rules.write_text("\n".join(lines) + "\n")
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(queries)} rules found" in done.stdout


def test_names_are_read_from_expressions_and_pages() -> None:
    assert metric_names('sum by (job) (rate(databus_relay_x_total{job=~"databus_y"}[5m])) '
                        '/ databus:z:rate5m > 0 or up == 0') == {
        "databus_relay_x_total", "databus:z:rate5m", "up"}
    page = ("# HELP databus_a_total A\n# TYPE databus_a_total counter\n"
            "# HELP databus_b B\n# TYPE databus_b gauge\ndatabus_b{x=\"1\"} 2.0\n")
    assert exported_names([page]) == {"databus_a_total", "databus_b"}
    exprs, recorded = rule_expressions()
    assert "databus:relay_consumer_eviction:seconds" in recorded
    assert any("databus_relay_consumer_eviction_headroom_bytes" in e for e in exprs)
    assert len(exprs) >= 20


def in_process_pages(tmp_path: Path) -> list[str]:
    """/metrics of a relay and a bootstrap server run in this process (the real apps,
    tests/relay_harness.py and tests/http_support.py) and the replicator's page (its
    real collector over a status document)."""
    from databus.bootstrap._storage import open_storage
    from databus.replicator._status import ReplicationStats, metrics_page, status_document
    from tests.http_support import fill_store, running_bootstrap
    from tests.relay_harness import relay_config, running_relay

    load = "synthetic://?rate=0&keys=100&event_bytes=100&events_per_window=1&limit=5"
    store = open_storage(f"sqlite:///{tmp_path / 'boot.db'}")
    fill_store(store)

    async def scrape() -> list[str]:
        async with running_relay(relay_config(tmp_path, {"load": load})) as r:
            await r.wait_for_scn("load", 5)
            async with await r.get("/metrics") as resp:
                relay = await resp.text()
        async with running_bootstrap(store) as b, await b.get("/metrics") as resp:
            boot = await resp.text()
        return [relay, boot]

    try:
        pages = asyncio.run(scrape())
    finally:
        store.close()
    stats = ReplicationStats("r")
    stats.applied({"orders": 3}, 5)
    doc = status_document(stats, relay_max_scn=7, lag_ms=10.0, target="sqlite://",
                          lag_seconds=1.0)
    pages.append(metrics_page(lambda: doc).decode())
    return pages


def test_rules_and_dashboard_use_exported_names_and_a_wrong_one_is_caught(
        tmp_path: Path) -> None:
    declared = exported_names(in_process_pages(tmp_path))
    assert unknown_names(declared) == {}
    assert "databus_relay_fetcher_lag_seconds" in declared
    # A name that is not exported fails: the check is not vacuous.
    assert unknown_names(declared - {"databus_relay_fetcher_lag_seconds"}) == {
        "rules": {"databus_relay_fetcher_lag_seconds"},
        "grafana": {"databus_relay_fetcher_lag_seconds"}}
