"""``databus spark ...``: clear one-line errors before any JVM starts (wrong store or
source URL, no Java, a refused plan), and the summary at the end of a run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from databus.cli import main
from tests.fixtures.servers import PostgresServer
from tests.integration.spark_support import Stores, append, make_stores, random_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DATABUS = str(Path(sys.executable).with_name("databus"))


@pytest.fixture
def stores(postgres_server: PostgresServer) -> Iterator[Stores]:
    yield from make_stores(postgres_server)


def _store_with_log(stores: Stores) -> str:
    url = stores.url()
    append(stores.open(url), random_log(11, windows=40))
    return url


@pytest.mark.parametrize(("store", "message"), [
    ("postgresql://nobody:secret@127.0.0.1:1/db?schema=x",
     "cannot connect to the bootstrap store postgresql://nobody:***@127.0.0.1:1/db"),
    ("mysql://u:p@127.0.0.1/db", "bootstrap store URL must look like postgresql://"),
    ("sqlite:///tmp/bootstrap.db", "the Spark jobs need the PostgreSQL bootstrap store"),
])
def test_a_wrong_store_url_is_one_clear_line(store: str, message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spark", "compact", "--store", store]) == 1
    err = capsys.readouterr().err
    assert message in err and "secret" not in err and "Traceback" not in err


def test_a_wrong_source_url_and_a_refused_plan(stores: Stores,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    url = _store_with_log(stores)
    assert main(["spark", "seed", "--store", url, "--from-mysql",
                 "mysql://u:pw-xyz@127.0.0.1:1/", "--table", "a.b", "--lock"]) == 1
    err = capsys.readouterr().err
    assert "databus spark: error: seeding: lost or no connection to u@127.0.0.1:1" in err
    assert "pw-xyz" not in err
    assert main(["spark", "compact", "--store", url, "--target-scn", str(10**12)]) == 1
    assert "is beyond the log's end" in capsys.readouterr().err


def test_no_java_is_one_clear_line(stores: Stores, tmp_path: Path) -> None:
    url = _store_with_log(stores)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # no java on it
    done = subprocess.run([DATABUS, "spark", "compact", "--store", url], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "Java not found: Spark needs a Java 17+ runtime" in done.stderr
    assert "Traceback" not in done.stderr
    env["JAVA_HOME"] = str(tmp_path)
    done = subprocess.run([DATABUS, "spark", "compact", "--store", url], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "is not an executable" in done.stderr


def test_a_run_ends_with_its_summary(spark: SparkSession, stores: Stores,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    url = _store_with_log(stores)
    assert main(["spark", "compact", "--store", url]) == 0  # runs on the session's Spark
    out = capsys.readouterr().out
    assert "compact: rows in " in out and ", SCN " in out and "rows/s" in out
    assert "shop.orders" in out


def test_seed_and_export_from_the_command_line(spark: SparkSession, stores: Stores,
                                               tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    dump = tmp_path / "dump.parquet"
    table = pa.table({"id": pa.array(range(50), pa.int64()),
                      "name": [f"n{i}" for i in range(50)]})
    pq.write_table(table.replace_schema_metadata({"databus.scn": "777"}), dump)
    url = stores.url()
    assert main(["spark", "seed", "--store", url, "--from-parquet", str(dump),
                 "--source", "shop.people", "--key", "id"]) == 0
    assert "seed: rows in 50, rows out 50, SCN 777" in capsys.readouterr().out
    out = tmp_path / "export"
    assert main(["spark", "export", "--store", url, "--source", "shop.people",
                 "--out", str(out)]) == 0
    assert "export: rows in 50, rows out 50, SCN 777" in capsys.readouterr().out
    assert (out / "_databus_scn").read_text() == "777\n"
    assert sorted(pq.read_table(out).column("id").to_pylist()) == list(range(50))
