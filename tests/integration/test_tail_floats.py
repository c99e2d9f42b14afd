"""``databus tail`` over a real float column (issue 27, item 11): PostgreSQL's
``double precision`` and ``real`` hold NaN, Infinity and -Infinity; every line tail
prints is strict JSON (no bare ``NaN``), those values as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"``, finite ones as numbers.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.servers import PostgresServer
from tests.integration.test_txlog_postgres import fresh_database
from tests.relay_harness import RelayProcess

pytestmark = pytest.mark.integration

ROWS = {1: "'NaN'", 2: "'Infinity'", 3: "'-Infinity'", 4: "1.5", 5: "-0.25"}
WANT = {1: "NaN", 2: "Infinity", 3: "-Infinity", 4: 1.5, 5: -0.25}


def _strict(line: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"not JSON: a bare {name} in {line!r}")
    return json.loads(line, parse_constant=refuse)


def test_tail_prints_non_finite_floats_as_strict_json(
        postgres_server: PostgresServer, tmp_path: Path) -> None:
    pg = fresh_database(postgres_server, "tail_floats")
    pg.run("CREATE TABLE readings (id INTEGER PRIMARY KEY, d DOUBLE PRECISION, "
           "r REAL)")
    uri = pg.uri("readings")
    databus = str(Path(sys.executable).with_name("databus"))
    subprocess.run([databus, "txlog", "install", "--source", uri], check=True,
                   capture_output=True, timeout=120)
    for key, value in ROWS.items():
        pg.txn(f"INSERT INTO readings VALUES ({key}, {value}, {value})")
    relay = RelayProcess(tmp_path, {"src": uri})
    relay.start()
    try:
        tail = subprocess.run(
            [databus, "tail", "--relay", relay.url, "--sources", "public.readings",
             "--from-earliest", "--count", str(len(ROWS))],
            capture_output=True, text=True, timeout=120)
    finally:
        relay.kill()
        pg.conn.close()
    assert tail.returncode == 0, tail.stderr[-3000:]
    lines = [line for line in tail.stdout.splitlines() if line.strip()]
    docs = [_strict(line) for line in lines]
    assert {d["key"]: d["value"]["d"] for d in docs} == WANT
    reals = {d["key"]: d["value"]["r"] for d in docs}
    assert reals[1] == "NaN" and reals[2] == "Infinity" and reals[3] == "-Infinity"
    assert all(isinstance(reals[k], float) and math.isfinite(reals[k]) for k in (4, 5))
