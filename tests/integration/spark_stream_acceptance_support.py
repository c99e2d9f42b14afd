"""Shared by the Spark streaming source's acceptance test and benchmark: sysbench-shaped
tables on MariaDB, their ``oltp_write_only`` workload written in Python, an
order-independent checksum of a table computed by MariaDB and the same over a Parquet
table of the ``databus`` source, and ``databus spark stream`` as a child process.

The tables are sysbench's (``sbtest1..N``: ``id``, ``k``, ``c CHAR(120)``,
``pad CHAR(60)``, the values in sysbench's shape). The workload is sysbench's
``oltp_write_only`` transaction (an index update, a non-index update, a delete and an
insert of the same row) on a random table, plus, in one transaction out of ten, a delete
that stays and an insert of a new id, so that the final state has holes and new rows
(sysbench's own mix never leaves one).

The checksum of a table is ``(COUNT(*), SUM(CRC32(CONCAT_WS('|', id, k, c, pad))))``:
MariaDB computes it with that SQL, :func:`parquet_checksums` with ``zlib.crc32`` over
the same text of each row of the Parquet table.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.fixtures.servers import MariaDBServer
from tests.integration.binlog_support import Sql

Checksum = tuple[int, int]  # (rows, sum of the rows' CRC32)


def table_ddl(name: str) -> str:
    """sysbench's table (the secondary index on ``k`` included)."""
    return (f"CREATE TABLE `{name}` (id INT NOT NULL AUTO_INCREMENT, k INT NOT NULL "
            "DEFAULT 0, c CHAR(120) NOT NULL DEFAULT '', pad CHAR(60) NOT NULL "
            "DEFAULT '', PRIMARY KEY (id), KEY k_1 (k))")


def _digits(rng: random.Random, groups: int) -> str:
    """sysbench's ``c`` (10 groups: 119 characters) and ``pad`` (5 groups: 59) of 11
    digits, joined by ``-``."""
    return "-".join(f"{rng.randrange(10 ** 11):011d}" for _ in range(groups))


def row_values(rng: random.Random, row_id: int, rows: int) -> str:
    return (f"({row_id}, {rng.randint(1, rows)}, '{_digits(rng, 10)}', "
            f"'{_digits(rng, 5)}')")


def fill(sql: Sql, tables: Sequence[str], rows: int, seed: int = 33, batch: int = 500,
         *, after_each: Callable[[], None] | None = None, every: int = 4) -> None:
    """sysbench's ``prepare``: ``rows`` rows in each table, ``batch`` per transaction;
    ``after_each()`` after every ``every`` transactions and at the end."""
    rng = random.Random(seed)
    done = 0
    for table in tables:
        for first in range(1, rows + 1, batch):
            values = ", ".join(row_values(rng, i, rows)
                               for i in range(first, min(first + batch, rows + 1)))
            sql.txn(f"INSERT INTO `{table}` (id, k, c, pad) VALUES {values}")
            done += 1
            if after_each is not None and done % every == 0:
                after_each()
    if after_each is not None:
        after_each()


class Writer(threading.Thread):
    """``oltp_write_only`` transactions at about ``rate`` per second until stopped."""

    def __init__(self, server: MariaDBServer, database: str, tables: Sequence[str],
                 rows: int, rate: float, seed: int = 34) -> None:
        super().__init__(daemon=True, name="sysbench-writer")
        self.sql = Sql(server, database)
        self.tables = list(tables)
        self.rows = rows
        self.rate = rate
        self.rng = random.Random(seed)
        self.next_id = rows + 1
        self.halt = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def statements(self) -> list[str]:
        rng = self.rng
        table = rng.choice(self.tables)
        pick = rng.randint(1, self.rows)
        out = [f"UPDATE `{table}` SET k = k + 1 WHERE id = {rng.randint(1, self.rows)}",
               f"UPDATE `{table}` SET c = '{_digits(rng, 10)}' WHERE id = "
               f"{rng.randint(1, self.rows)}",
               f"DELETE FROM `{table}` WHERE id = {pick}"]
        if rng.random() < 0.1:  # the delete stays; a new row elsewhere
            out.append(f"INSERT INTO `{table}` (id, k, c, pad) VALUES "
                       f"{row_values(rng, self.next_id, self.rows)}")
            self.next_id += 1
        else:
            out.append(f"INSERT INTO `{table}` (id, k, c, pad) VALUES "
                       f"{row_values(rng, pick, self.rows)}")
        return out

    def run(self) -> None:
        period = 1.0 / self.rate
        due = time.monotonic()
        try:
            while not self.halt.is_set():
                self.sql.txn(*self.statements())
                self.transactions += 1
                due += period
                pause = due - time.monotonic()
                if pause > 0:
                    self.halt.wait(pause)
                else:
                    due = time.monotonic()  # behind: no burst to catch up
        except BaseException as exc:
            self.error = exc

    def stop(self) -> int:
        """Stop, re-raise what failed, and return the number of transactions."""
        self.halt.set()
        self.join(60)
        self.sql.close()
        if self.error is not None:
            raise self.error
        return self.transactions


def crc(row_id: object, k: object, c: object, pad: object) -> int:
    return zlib.crc32(f"{row_id}|{k}|{c}|{pad}".encode())


def source_checksums(sql: Sql, tables: Iterable[str]) -> dict[str, Checksum]:
    """Each table's checksum, computed by MariaDB."""
    out = {}
    for table in tables:
        count, total = sql.query(f"SELECT COUNT(*), COALESCE(SUM(CRC32(CONCAT_WS('|', id, "
                                 f"k, c, pad))), 0) FROM `{table}`")[0]
        out[table] = (int(count), int(total))
    return out


def parquet_rows(path: Path) -> list[dict[str, Any]]:
    """The published rows of a table written by ``apply_changes`` (several sources:
    the ``value`` column is JSON), read with pyarrow, not Spark."""
    import pyarrow.parquet as pq

    commit = json.loads((path / "_databus" / "commit.json").read_text())
    table = pq.read_table(path / commit["dir"])
    return table.to_pylist()  # type: ignore[no-any-return]


def parquet_checksums(rows: Iterable[dict[str, Any]], database: str,
                      tables: Iterable[str]) -> dict[str, Checksum]:
    """Each source table's checksum over the Parquet table's rows."""
    sums = {t: [0, 0] for t in tables}
    for row in rows:
        table = row["source"].removeprefix(database + ".")
        value = json.loads(row["value"])
        figures = sums.setdefault(table, [0, 0])
        figures[0] += 1
        figures[1] += crc(value["id"], value["k"], value["c"], value["pad"])
    return {t: (n, s) for t, (n, s) in sums.items()}


# -- `databus spark stream` as a child process -------------------------------------------

SPARK_CONF = ("spark.ui.enabled=false", "spark.driver.host=127.0.0.1",
              "spark.driver.bindAddress=127.0.0.1", "spark.sql.shuffle.partitions=2",
              "spark.default.parallelism=2", "spark.driver.memory=1g",
              "spark.sql.session.timeZone=UTC")


class StreamJob:
    """``databus spark stream`` in a session (process group) of its own, so that a
    SIGKILL takes the driver, its JVM and its Python workers at once."""

    def __init__(self, work: Path, relay: str, bootstrap: str, sources: Sequence[str],
                 partitions: int, *, trigger: float = 1.0) -> None:
        self.table = work / "table"
        self.checkpoint = work / "checkpoint"
        self.log_path = work / "stream.log"
        exe = Path(sys.executable).with_name("databus")
        self.args = [str(exe), "spark", "stream", "--relay", relay, "--bootstrap", bootstrap,
                     "--sources", ",".join(sources), "--to", str(self.table),
                     "--checkpoint", str(self.checkpoint), "--partitions", str(partitions),
                     "--trigger", str(trigger), "--master", "local[2]",
                     "--conf", f"spark.local.dir={work / 'spark-local'}"]
        for item in SPARK_CONF:
            self.args += ["--conf", item]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n--- start {self.starts}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=log, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1",
                     "PYSPARK_PYTHON": sys.executable})

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the driver's whole process group (driver, JVM, Python workers)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.running():
            self.kill()

    def log(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-6000:]

    def batches(self) -> tuple[int, int]:
        """(the newest batch with an offset, the newest committed batch), -1 for none."""
        def newest(name: str) -> int:
            directory = self.checkpoint / name
            if not directory.is_dir():
                return -1
            ids = [int(p.name) for p in directory.iterdir() if p.name.isdigit()]
            return max(ids, default=-1)

        return newest("offsets"), newest("commits")

    def committed_positions(self) -> list[int]:
        """The window SCN each partition stands after in the newest committed batch's
        end offset (empty before the first commit)."""
        committed = self.batches()[1]
        if committed < 0:
            return []
        lines = (self.checkpoint / "offsets" / str(committed)).read_text().splitlines()
        offset = json.loads(lines[2])  # "v1", the batch's metadata, then the source's
        return [int(c["window_scn"]) for c in offset["checkpoints"].values()]
