"""A failed fetcher never looks healthy (issue 28, DESIGN 17), on the real MariaDB.

Each cause at start-up (a wrong password, missing grants, ``binlog_format=STATEMENT``,
``binlog_row_metadata=MINIMAL``): the relay's ``/readyz`` is 503 naming the fetcher with
the cause in its message and the fix, ``databus_component_up`` is 0, the fetcher's
restarts are counted, ``/v1/status`` lists it as not ready and ``databus status`` exits
1. Each is fixable at the source while the relay runs: once fixed, without a restart,
``/readyz`` is 200, the metric 1, ``databus status`` exits 0 and a new row is captured.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pymysql
import pytest

from databus.cli import main
from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import (
    BUFFER,
    fresh_database,
    source_uri,
    wait_for_scn,
    wait_until,
)
from tests.relay_harness import RunningRelay, relay_config, running_relay

pytestmark = pytest.mark.integration

DB = "bl_ready"
USER = "bl_ready_user"
PASSWORD = "pw-ready-12345"


@dataclass
class Case:
    break_it: list[str]  # root statements that break the source for the relay
    fix_it: list[str]  # root statements that fix it
    says: str  # in the fetcher's message
    own_user: bool  # the relay connects as USER (else as the fixture's user)


GRANTS = f"GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO '{USER}'@'127.0.0.1'"
CASES = {
    "wrong_password": Case(
        [f"CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY 'not-{PASSWORD}'", GRANTS],
        [f"ALTER USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'"],
        "access denied", own_user=True),
    "missing_grants": Case(
        [f"CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'",
         f"GRANT BINLOG MONITOR, SELECT ON *.* TO '{USER}'@'127.0.0.1'"],
        [GRANTS], "lacks a privilege", own_user=True),
    "binlog_format": Case(["SET GLOBAL binlog_format = 'STATEMENT'"],
                          ["SET GLOBAL binlog_format = 'ROW'"],
                          "binlog_format is STATEMENT", own_user=False),
    "binlog_row_metadata": Case(["SET GLOBAL binlog_row_metadata = 'MINIMAL'"],
                                ["SET GLOBAL binlog_row_metadata = 'FULL'"],
                                "binlog_row_metadata is MINIMAL", own_user=False),
}


def root(server: MariaDBServer, *statements: str) -> None:
    conn = pymysql.connect(autocommit=True, **server.root_connect_kwargs())
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


async def databus_status(url: str) -> int:
    """``databus status --json --relay URL``'s exit status (the command in a thread)."""
    def run() -> int:
        with contextlib.redirect_stdout(io.StringIO()):
            return main(["status", "--json", "--relay", url])
    return await asyncio.to_thread(run)


async def readyz(r: RunningRelay) -> tuple[int, dict[str, object]]:
    async with await r.get("/readyz") as resp:
        return resp.status, await resp.json()


async def metrics(r: RunningRelay) -> str:
    async with await r.get("/metrics") as resp:
        return await resp.text()


UP = f'databus_component_up{{buffer="{BUFFER}",component="fetcher",daemon="relay"}}'


@pytest.mark.parametrize("cause", list(CASES))
def test_a_failed_fetcher_is_not_ready_until_fixed(mariadb_server: MariaDBServer,
                                                   tmp_path: Path, cause: str) -> None:
    case = CASES[cause]
    sql = fresh_database(mariadb_server, DB)
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    uri = source_uri(mariadb_server, f"{DB}.t")
    if case.own_user:
        uri = uri.replace(f"{mariadb_server.user}:{mariadb_server.password}@",
                          f"{USER}:{PASSWORD}@")
    undo: Callable[[], None] = lambda: None  # noqa: E731
    root(mariadb_server, f"DROP USER IF EXISTS '{USER}'@'127.0.0.1'")
    root(mariadb_server, *case.break_it)
    undo = lambda: root(mariadb_server, *case.fix_it)  # noqa: E731

    async def run() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: uri})) as r:
            # Not ready, with the cause and the fix; retried, and the retries counted.
            await wait_until(r, lambda s: s["fetcher"]["state"] == "failed"
                             and s["fetcher"]["restarts"] >= 2, what="failed, retried")
            status, doc = await readyz(r)
            assert status == 503 and doc["ready"] is False, doc
            [fetcher] = [c for c in doc["components"]  # type: ignore[attr-defined]
                         if c["component"] == "fetcher"]
            assert fetcher["error"] == "fetcher_failed"
            assert case.says in fetcher["message"], fetcher
            assert PASSWORD not in str(doc)
            assert "no restart needed" in fetcher["fix"]
            page = await metrics(r)
            assert f"{UP} 0.0" in page
            restarts = next(line for line in page.splitlines() if line.startswith(
                f'databus_relay_fetcher_restarts_total{{buffer="{BUFFER}"}}'))
            assert float(restarts.split()[-1]) >= 2
            full = await r.json("/v1/status")
            assert full["ready"] is False
            assert full["not_ready"][0]["message"] == fetcher["message"]
            assert await databus_status(r.url) == 1
            # Fixed at the source, the relay running: ready again, and capturing.
            undo()
            await wait_until(r, lambda s: s["fetcher"]["state"] == "running",
                             what="running again")
            status, doc = await readyz(r)
            assert status == 200 and doc["ready"] is True, doc
            assert f"{UP} 1.0" in await metrics(r)
            assert await databus_status(r.url) == 0
            scn = sql.txn("INSERT INTO t VALUES (1, 'after the fix')")
            await wait_for_scn(r, scn)

    try:
        asyncio.run(run())
    finally:
        undo()
        root(mariadb_server, f"DROP USER IF EXISTS '{USER}'@'127.0.0.1'")
        sql.close()
