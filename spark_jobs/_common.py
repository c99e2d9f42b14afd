"""What every job shares: errors, the summary, the SparkSession and Java checks.

PySpark is imported lazily (inside functions) so that ``databus --help`` and the checks
that run before Spark starts (store reachable, target SCN valid, Java present) stay
fast and work without a JVM.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from databus.errors import DatabusError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_DIR = Path(os.environ.get("DATABUS_JAVA_DIR", "/usr/share/java"))
POSTGRES_JAR = "postgresql.jar"  # Debian's libpostgresql-jdbc-java
MARIADB_JAR = "mariadb-java-client.jar"  # Debian's libmariadb-java
POSTGRES_DRIVER = "org.postgresql.Driver"
MARIADB_DRIVER = "org.mariadb.jdbc.Driver"


class SparkJobError(DatabusError):
    """A Spark job could not run or failed; the message says why in one line."""

    code = "spark_job_error"


class JobRefused(SparkJobError):
    """The job would produce a wrong snapshot (or none) and was not started."""

    code = "spark_job_refused"


@dataclass
class JobSummary:
    """What a job did, printed at its end and returned to callers."""

    job: str
    scn: int | None = None  # the SCN the written snapshot / export is consistent at
    rows_in: int = 0
    rows_out: int = 0
    seconds: float = 0.0
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def rows_per_second(self) -> float:
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0


@contextmanager
def timed(summary: JobSummary) -> Iterator[JobSummary]:
    start = time.monotonic()
    try:
        yield summary
    finally:
        summary.seconds = time.monotonic() - start


# -- prerequisites --------------------------------------------------------------------


def find_java() -> str:
    """The ``java`` Spark will launch, or ``SparkJobError`` saying how to get one."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise SparkJobError(
            f"JAVA_HOME is {home} but {candidate} is not an executable: point JAVA_HOME at a "
            "Java 17+ runtime (apt-get install openjdk-17-jre-headless) or unset it"
        )
    found = shutil.which("java")
    if found is None:
        raise SparkJobError(
            "Java not found: Spark needs a Java 17+ runtime on PATH or in JAVA_HOME "
            "(apt-get install openjdk-17-jre-headless)"
        )
    return found


def jdbc_jar(name: str) -> Path:
    """A JDBC driver jar from ``DATABUS_JAVA_DIR`` (default /usr/share/java)."""
    path = JAVA_DIR / name
    if not path.is_file():
        package = "libpostgresql-jdbc-java" if name == POSTGRES_JAR else "libmariadb-java"
        raise SparkJobError(
            f"JDBC driver {path} not found (apt-get install {package}, or set "
            "DATABUS_JAVA_DIR to the directory holding it)"
        )
    return path


def spark_session(*, master: str | None, app: str, jars: Sequence[Path],
                  config: dict[str, str] | None = None) -> tuple[SparkSession, bool]:
    """The active SparkSession if there is one (spark-submit, tests, notebooks), else a new
    one on ``master`` (default ``local[*]``) with ``jars``; and whether it is new (then the
    caller stops it)."""
    find_java()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    # Python workers must run this interpreter (the venv), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    from pyspark import SparkConf

    conf = SparkConf()
    if master:
        builder = builder.master(master)
    elif not conf.contains("spark.master"):  # spark-submit sets it
        builder = builder.master("local[*]")
    if jars and not conf.contains("spark.jars"):
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    settings = {"spark.ui.showConsoleProgress": "false", **(config or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:
        raise SparkJobError(f"cannot start Spark: {java_message(exc)}") from None
    session.sparkContext.setLogLevel("WARN")
    return session, True


# -- errors out of the JVM --------------------------------------------------------------

_JAVA_EXC_RE = re.compile(r"((?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)):\s*(.*)")
_NOISE = ("org.apache.spark.SparkException", "py4j.protocol.Py4JJavaError",
          "java.util.concurrent.ExecutionException")


def java_message(exc: BaseException) -> str:
    """The root cause of a Py4J / Spark exception as one line (the deepest ``x.y.Error:
    message`` in its text), instead of a 200-line Java stack trace."""
    text = str(exc)
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        match = _JAVA_EXC_RE.search(line.strip())
        if match is not None and match.group(1) not in _NOISE:
            found.append((match.group(1), match.group(2).strip()))
    if found:
        # "Caused by" chains print the root last; keep the last one with a message.
        name, message = next(((n, m) for n, m in reversed(found) if m), found[-1])
        return f"{name.rsplit('.', 1)[-1]}: {message}" if message else name
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:500]


def run_spark(what: str, action: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a Spark action, turning JVM errors into ``SparkJobError`` naming ``what``."""
    try:
        return action(*args, **kwargs)
    except DatabusError:
        raise
    except Exception as exc:
        if type(exc).__module__.startswith(("py4j", "pyspark")):
            raise SparkJobError(f"{what}: {java_message(exc)}") from exc
        raise
