"""``databus dashboard`` in a real browser (headless Debian chromium driven by
Playwright) against real processes: two relays in a leader-follower cluster on a SQLite
source, a pair of bootstrap services on one PostgreSQL store, a replicator following
the cluster, and two consumers (a consumer group of two members), all registered on the
3-node ZooKeeper ensemble.

- every value the page shows is the value of the document it was drawn from, and every
  value of that document is on the page (``data-field``/``data-value``, and the text of
  the "every value" table); that document is what ``databus status --json`` prints for
  the same flags (run as a command once the system is quiet: the same fields, the same
  values but for the clocks and rates);
- a new window at the relay is on the page within 2 s;
- a killed leader is shown as it happens: the relay DOWN, the other member leading;
- a quarantined source is shown as it happens: its row with reason and fix, the verdict
  "not ready";
- the password of the relay URLs the dashboard was given is nowhere on the page nor in
  its JSON (shown as ``ops:***@``).

The test notes the page's ``/v1/dashboard`` answers (``page.on("response")``) and reads
their bodies outside the event handler: a ``page.route`` handler would hold the page's
polls whenever the test sleeps or waits outside Playwright.

``DATABUS_DASHBOARD_SCREENSHOTS=DIR`` keeps the two screenshots in DIR (docs/img has
the ones of docs/operations.md); otherwise they go to the test's temp dir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures._procs import in_ci
from tests.fixtures.servers import EnsembleChroot, PostgresServer
from tests.integration.bootstrap_support import BootstrapProcess, drop_schema, storage_url
from tests.integration.cluster_support import SESSION_S, OrdersWriter, cluster_toml, wait_for
from tests.integration.group_support import MemberProcess
from tests.relay_harness import RelayProcess, free_port, get_url, start_databus
from tests.unit.test_txlog_support import SqliteSource

pytestmark = pytest.mark.integration

DATABUS = str(Path(sys.executable).with_name("databus"))
CHROMIUM = "/usr/bin/chromium"
DDL = "CREATE TABLE orders (id INTEGER PRIMARY KEY, qty INTEGER)"
# The relays are named to the dashboard with a password in their URLs (sent as Basic
# auth, which they ignore): the page must never show it.
SECRET = "dash-pw-6f1c9e"
PROMISE_S = 2.0  # the page shows a change within 2 s of the services showing it
# Fields that move by themselves (clocks, rates, lags in seconds): compared with the
# command's document by presence only.
VOLATILE = {"generated_at", "age_s", "last_window_age_s", "idle_s", "first_seen",
            "last_seen", "updated_at", "since", "input_bytes_per_second",
            "events_per_second", "bytes_per_second", "rows_per_second", "lag_seconds",
            "lag_ms", "applier_lag_seconds", "producer_lag_seconds", "update_ratio"}

# Every data-field element of the page with its value and text, and the sample drawn.
SHOWN = """() => ({
  generated: document.body.getAttribute("data-generated-at"),
  fields: [...document.querySelectorAll("[data-field]")].map((el) => [
    el.getAttribute("data-field"), el.getAttribute("data-value"), el.textContent,
    el.closest("tr") ? el.closest("tr").getAttribute("data-testid") : null]),
})"""


class Deployment:
    """The processes (module docstring), started in order, killed at the end."""

    def __init__(self, tmp_path: Path, zk: EnsembleChroot, store_url: str) -> None:
        self.tmp = tmp_path
        self.zk = zk
        self.src = SqliteSource(tmp_path / "shop.db", DDL)
        self.src.install("orders")
        self.src.txn("INSERT INTO orders (id, qty) VALUES (1, 1)")
        self.relays = []
        for i in range(2):
            home = tmp_path / f"relay{i}"
            home.mkdir()
            self.relays.append(RelayProcess(home, {"src": self.src.uri("orders", poll_ms=20)},
                                            workers=1, extra_toml=cluster_toml(zk)))
        self.boots = []
        for name in ("boot-a", "boot-b"):
            home = tmp_path / name
            home.mkdir()
            self.boots.append(BootstrapProcess(
                home, store_url, [r.url for r in self.relays], "producer,applier,server",
                applier={"poll_interval_ms": 50, "batch_rows": 500},
                cluster={"zookeeper": zk.hosts, "name": "shop-boot",
                         "session_timeout_s": SESSION_S}))
        self.replicator_port = free_port()
        self.replicator_config = tmp_path / "replicate.toml"
        self.replicator_config.write_text(
            "[replicate]\n" 'name = "copy"\n' f'zookeeper = "{zk.hosts}"\n'
            'cluster = "shop"\n' f'target = "sqlite:///{tmp_path / "replica.db"}"\n'
            f"batch_ms = 50\nmetrics_port = {self.replicator_port}\n"
            "[[replicate.tables]]\n" 'source = "shop.orders"\n')
        self.procs: list[subprocess.Popen[bytes]] = []
        self.members: list[MemberProcess] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def replicator(self) -> str:
        return f"http://127.0.0.1:{self.replicator_port}"

    def service_flags(self) -> list[str]:
        return ["--relay", *(r.url.replace("http://", f"http://ops:{SECRET}@")
                             for r in self.relays),
                "--bootstrap", *(b.url for b in self.boots),
                "--replicator", self.replicator, "--zookeeper", self.zk.hosts]

    def start(self) -> None:
        for relay in self.relays:
            relay.start()
        for boot in self.boots:
            boot.start()
        self.procs.append(start_databus(["replicate", "--config", str(self.replicator_config)],
                                        self.replicator_port, self.tmp / "replicate.log"))
        follower = self.follower()
        for i in range(2):  # the consumers read from the member that will not be killed
            member = MemberProcess(self.tmp, f"indexer-{i}", follower.url, self.zk.hosts, 4,
                                   group="indexer")
            member.args += ["--source", "shop.orders"]
            self.members.append(member.start())
        self.procs.append(start_databus(
            ["dashboard", *self.service_flags(), "--port", str(self.port), "--interval", "1",
             "--timeout", "2"], self.port, self.tmp / "dashboard.log"))

    def leader(self) -> RelayProcess:
        def one() -> RelayProcess | None:
            live = [r for r in self.relays if r.proc is not None and r.proc.poll() is None]
            leaders = [r for r in live if r.status()["buffers"]["src"]["cluster"]["role"]
                       == "leader"]
            return leaders[0] if len(leaders) == 1 else None
        found: RelayProcess = wait_for(one, "exactly one leader")
        return found

    def follower(self) -> RelayProcess:
        leader = self.leader()
        return next(r for r in self.relays if r is not leader)

    def stop(self) -> None:
        for member in self.members:
            if member.proc is not None and member.proc.poll() is None:
                member.kill()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(20)
        for boot in self.boots:
            boot.kill()
        for relay in self.relays:
            if relay.proc is not None and relay.proc.poll() is None:
                relay.kill()
        self.src.close()


@pytest.fixture
def chromium() -> str:
    """Debian's chromium, checked before any process is started."""
    if not Path(CHROMIUM).exists():
        if in_ci():
            pytest.fail("no /usr/bin/chromium (CI=true: make deps installs it)")
        pytest.skip("no /usr/bin/chromium (make deps installs it)")
    return CHROMIUM


@pytest.fixture
def deployment(tmp_path: Path, zookeeper_chroot: EnsembleChroot,
               postgres_server: PostgresServer, request: pytest.FixtureRequest
               ) -> Iterator[Deployment]:
    store_url = storage_url("postgresql", tmp_path, request)
    deploy = Deployment(tmp_path, zookeeper_chroot, store_url)
    try:
        deploy.start()
        yield deploy
    finally:
        deploy.stop()
        drop_schema(postgres_server, store_url)


# -- comparing the page with the documents ----------------------------------------------


def field(*parts: Any) -> str:
    """A path as the page writes it in data-field: "." and "%" of a key escaped."""
    return ".".join(str(p).replace("%", "%25").replace(".", "%2E") for p in parts)


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(data-field path, value) of every scalar, empty list and empty object."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, (*path, str(key)))
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            yield from leaves(item, (*path, str(i)))
    else:
        yield field(*path), value


def resolve(doc: Any, path: str) -> Any:
    for part in path.split("."):
        part = part.replace("%2E", ".").replace("%25", "%")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def raw_text(value: Any) -> str:
    """How the "every value" table writes ``value`` (dashboard.js ``fmtRaw``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == [] or value == {}:
        return json.dumps(value)
    return str(value)


def check_page_against(doc: dict[str, Any], fields: list[list[Any]]) -> int:
    """Every element's value is ``doc``'s at its path; every leaf of ``doc`` is shown, in
    the "every value" table with its text. Returns how many leaves were checked."""
    by_path: dict[str, list[list[Any]]] = {}
    for path, value, text, row in fields:
        assert json.loads(value) == resolve(doc, path), (path, value)
        by_path.setdefault(path, []).append([value, text, row])
    checked = 0
    for path, value in leaves(doc):
        shown = by_path.get(path)
        assert shown, f"{path} = {value!r} is not on the page"
        [text] = [t for _v, t, row in shown if row == "value"]
        if isinstance(value, float) and not isinstance(value, bool):
            assert float(text) == value, (path, text, value)
        else:
            assert text == raw_text(value), (path, text, value)
        checked += 1
    return checked


def same_as_command(page_doc: dict[str, Any], command_doc: dict[str, Any]) -> list[str]:
    """The differences between the page's document and the command's (none: [])."""
    ours, theirs = dict(leaves(page_doc)), dict(leaves(command_doc))
    diffs = [f"only on the page: {p}" for p in ours.keys() - theirs.keys()]
    diffs += [f"only in the command: {p}" for p in theirs.keys() - ours.keys()]
    for path in ours.keys() & theirs.keys():
        if path.rsplit(".", 1)[-1] not in VOLATILE and ours[path] != theirs[path]:
            diffs.append(f"{path}: page {ours[path]!r}, command {theirs[path]!r}")
    return sorted(diffs)


class Page:
    """The dashboard in chromium, and the documents it was sent (by generated_at)."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.responses: list[Any] = []  # the newest /v1/dashboard answers, bodies unread
        self.sent: dict[float, dict[str, Any]] = {}
        page.on("response", self._record)

    def _record(self, response: Any) -> None:
        # Only noted here: reading a body inside an event handler would hold the page.
        if "/v1/dashboard" in response.url and response.ok:
            self.responses = [*self.responses[-29:], response]

    def document(self, generated_at: float) -> dict[str, Any] | None:
        """The document of the answer the page got for the sample ``generated_at``."""
        while self.responses:
            status: dict[str, Any] = self.responses.pop(0).json()["status"]
            self.sent[status["generated_at"]] = status
        return self.sent.get(generated_at)

    def shown(self) -> tuple[dict[str, Any], list[list[Any]]]:
        """The document the page shows now, and its fields (read at one instant)."""
        def drawn() -> tuple[dict[str, Any], list[list[Any]]] | None:
            now = self.page.evaluate(SHOWN)
            doc = self.document(float(now["generated"] or "nan"))
            return (doc, now["fields"]) if doc is not None else None
        found: tuple[dict[str, Any], list[list[Any]]] = wait_for(drawn, "a drawn sample", 10)
        return found

    def value(self, field: str) -> Any:
        values = self.page.evaluate(
            "(f) => [...document.querySelectorAll(`[data-field=\"${f}\"]`)]"
            ".map((el) => el.getAttribute('data-value'))", field)
        return json.loads(values[0]) if values else None

    def within_promise(self, check: Callable[[], Any], what: str) -> float:
        """Seconds until ``check()`` holds on the page (fails past the promise + 3 s)."""
        started = time.monotonic()
        wait_for(check, what, PROMISE_S + 3, max_interval=0.05)
        return time.monotonic() - started


def shown(relay: RelayProcess) -> str:
    """A relay's URL as the status document shows it: the password masked."""
    return relay.url.replace("http://", "http://ops:***@")


def relay_index(deploy: Deployment, relay: RelayProcess) -> int:
    return deploy.relays.index(relay)


def test_the_dashboard_shows_the_status_live(chromium: str, deployment: Deployment,
                                             tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    deploy = deployment
    kept = os.environ.get("DATABUS_DASHBOARD_SCREENSHOTS")
    shots = Path(kept or tmp_path)
    leader = deploy.leader()
    survivor = next(r for r in deploy.relays if r is not leader)
    writer = OrdersWriter(deploy.src.path, pause_s=0.02)
    writer.start()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = Page(browser.new_page(viewport={"width": 1440, "height": 1100}))
            errors: list[str] = []
            page.page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.page.goto(deploy.url)
            wait_for(lambda: json.loads(get_url(deploy.url + "/healthz"))["ok"],
                     "the dashboard's first sample", 10)

            # Everything up: the leader, both bootstrap services, the replicator applying,
            # the group's two members consuming.
            def steady() -> bool:
                doc, _ = page.shown()
                groups = doc.get("groups") or []
                return bool(doc["ready"] and doc["clusters"].get("clusters")
                            and page.value("clusters.clusters.0.buffers.0.leader")
                            == leader.url
                            and groups and len(groups[0]["members"]) == 2
                            and all(len(r.get("consumers") or []) >= 2
                                    for r in doc["relays"] if r["url"] == shown(survivor)))
            wait_for(steady, "the page shows every service up, a leader and the group", 60)
            # points on the sparklines (more for the docs)
            page.page.wait_for_timeout(30_000 if kept else 3_000)
            writer.stop()
            page.page.screenshot(path=str(shots / "dashboard.png"))

            # 1. The page is its document, and the document is the command's.
            page.page.click("#all-values summary")

            last: list[list[str]] = [[]]

            def agrees() -> int | None:
                doc, fields = page.shown()
                done = subprocess.run([DATABUS, "status", *deploy.service_flags(), "--json",
                                       "--timeout", "2"], capture_output=True, text=True,
                                      timeout=60, check=False)
                last[0] = same_as_command(doc, json.loads(done.stdout))
                return None if last[0] else check_page_against(doc, fields)
            try:
                checked = wait_for(agrees, "the page's document equal to databus status "
                                   "--json", 30)
            except AssertionError:
                raise AssertionError(f"page and command differ: {last[0]}") from None
            assert checked > 200, checked
            sparks = page.page.locator('[data-testid="spark"]')
            assert sparks.count() >= 6
            assert max(int(sparks.nth(i).get_attribute("data-points") or 0)
                       for i in range(sparks.count())) >= 3
            page.page.click("#all-values summary")

            # 2. A new window: at the relay, then on the page within the promise.
            i = relay_index(deploy, leader)
            before = leader.status()["buffers"]["src"]["max_scn"]
            deploy.src.txn("INSERT INTO orders (id, qty) VALUES (5000, 2)")
            wait_for(lambda: leader.status()["buffers"]["src"]["max_scn"] > before,
                     "the window at the relay", 10, max_interval=0.02)
            took = page.within_promise(
                lambda: (page.value(f"relays.{i}.buffers.0.max_scn") or 0) > before,
                "the new window on the page")
            assert took <= PROMISE_S, took

            # 3. The leader killed: DOWN at once, the other member leads.
            leader.kill()
            took = page.within_promise(lambda: page.value(f"relays.{i}.error") is not None,
                                       "the killed relay shown down")
            assert took <= PROMISE_S, took
            wait_for(lambda: survivor.status()["buffers"]["src"]["cluster"]["role"]
                     == "leader", "the survivor leads", SESSION_S * 6)
            took = page.within_promise(
                lambda: page.value("clusters.clusters.0.buffers.0.leader") == survivor.url,
                "the new leader on the page")
            assert took <= PROMISE_S, took

            # 4. A row the table's schema cannot carry: the source is quarantined.
            deploy.src.txn("INSERT INTO orders (id, qty) VALUES (6666, 'not a number')")
            wait_for(lambda: survivor.status()["buffers"]["src"]["quarantined"],
                     "the source quarantined at the relay", 20, max_interval=0.02)
            took = page.within_promise(
                lambda: page.page.locator('[data-testid="quarantined"]').count() > 0,
                "the quarantined source on the page")
            assert took <= PROMISE_S, took
            row = page.page.locator('[data-testid="quarantined"]').first
            assert "shop.orders" in row.inner_text() and "QUARANTINED" in row.inner_text()
            assert "databus relay heal" in row.inner_text()  # the fix, as the relay says it
            verdict = page.page.locator('[data-testid="verdict"]').inner_text()
            assert "down" in verdict or "not ready" in verdict
            page.page.evaluate("window.scrollTo(0, 0)")
            page.page.screenshot(path=str(shots / "dashboard-incident.png"))

            # Nothing secret and nothing broken on the page.
            assert errors == []
            html = page.page.content()
            assert "Traceback" not in html
            assert SECRET not in html and shown(survivor) in html
            assert all(SECRET not in json.dumps(doc) for doc in page.sent.values())
            assert SECRET not in get_url(deploy.url + "/v1/status").decode()
        finally:
            browser.close()
