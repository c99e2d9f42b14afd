"""Shared helpers of the dump benchmarks (``dump.py`` for MariaDB, ``dump_pg.py`` for
PostgreSQL): a ``databus relay`` child process with an admin token for the dump API, one
timed dump (``POST /v1/admin/dumps`` until ``GET /v1/dumps`` shows it done), the
``parallelism`` field that relays before issue 29 refuse, and the plot of the time of a
dump by parallelism. Not a benchmark by itself.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _relay_proc import RelayProcess, cpu_seconds, machine_cpu, tree_cpu_seconds

TOKEN = "bench-admin-token"
POLL_S = 0.05
MIB = 1 << 20


class ParallelismUnsupported(RuntimeError):
    """The relay answered 400 to a ``parallelism`` field: it predates issue 29."""


class AdminRelay(RelayProcess):
    """``RelayProcess`` on ``uri`` with an admin token for the dump API."""

    # Where the relays' temp dirs (data dir: buffer, dumps.json) go; None: the system's.
    parent_dir: str | None = None

    def __init__(self, uri: str, capacity_mb: int) -> None:
        saved, tempfile.tempdir = tempfile.tempdir, self.parent_dir or tempfile.tempdir
        try:
            super().__init__(uri, capacity_mb)
        finally:
            tempfile.tempdir = saved
        text = self.config_path.read_text()
        self.config_path.write_text(text.replace(
            "\n[[relay.buffers]]", f'admin_token = "{TOKEN}"\n\n[[relay.buffers]]', 1))

    def start(self, timeout: float = 30) -> None:
        super().start(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the fetcher reads the log: dumps can run
            fetcher = self.buffer_status().get("fetcher") or {}
            # (a PostgreSQL logical fetcher with nothing to read yet has no source_scn,
            # but a read_through time once it streams)
            if fetcher.get("state") == "running" and (
                    fetcher.get("source_scn") is not None or fetcher.get("read_through")):
                return
            time.sleep(0.05)
        raise TimeoutError(f"the relay's fetcher did not start: {self.buffer_status()}")

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body or {}).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())

    def start_dump(self, source: str, chunk_rows: int, delay_ms: int = 0,
                   parallelism: int | None = None) -> str:
        """POST a dump of ``source``; ``parallelism`` is sent only when given (a relay
        before issue 29 answers 400 to the unknown field: ``ParallelismUnsupported``)."""
        body: dict[str, Any] = {"sources": [source], "chunk_rows": chunk_rows,
                                "delay_ms": delay_ms}
        if parallelism is not None:
            body["parallelism"] = parallelism
        try:
            return str(self.post("/v1/admin/dumps", body)["id"])
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            if parallelism is not None and exc.code == 400 and "parallelism" in text:
                raise ParallelismUnsupported(text) from None
            raise RuntimeError(f"POST /v1/admin/dumps {body}: {exc.code} {text}") from None

    def dump(self, dump_id: str) -> dict[str, Any]:
        """The dump as ``GET /v1/dumps`` lists it."""
        for doc in self.get_json("/v1/dumps")["dumps"]:
            if doc["id"] == dump_id:
                return doc  # type: ignore[no-any-return]
        raise KeyError(dump_id)


def relay_capacity_mb(rows: int) -> int:
    # ~190 bytes per dumped row (header, key, Avro value): the whole dump fits, so
    # nothing is evicted while it runs; a 20,000-row chunk is well under a quarter.
    return max(64, rows * 300 // MIB + 1)


@dataclass
class DumpRun:
    chunk_rows: int
    rows: int
    chunks: int
    overtaken: int
    seconds: float  # POST .. done seen in GET /v1/dumps
    relay_seconds: float  # the relay's own finished_at - created_at
    relay_cpu: float
    db_cpu: float  # the database server's main process (MariaDB: all of it)
    machine_busy: float  # cores, whole machine
    steal: float
    parallelism: int | None = None  # as sent; None: not sent (the relay's default)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def run_dump(relay: AdminRelay, source: str, chunk_rows: int, db_pid: int | None,
             parallelism: int | None = None, *, db_tree: bool = False) -> DumpRun:
    """One dump of ``source`` on a started relay, timed from the POST until ``GET
    /v1/dumps`` shows it finished; raises unless it is ``done``. ``db_tree``: the
    database's CPU is that of ``db_pid`` and its children (PostgreSQL's backends)."""
    db_cpu_of = tree_cpu_seconds if db_tree else cpu_seconds
    cpu0 = cpu_seconds(relay.pid)
    db0 = db_cpu_of(db_pid) if db_pid else 0.0
    busy0, steal0, tot0 = machine_cpu()
    t0 = time.perf_counter()
    dump_id = relay.start_dump(source, chunk_rows, parallelism=parallelism)
    while True:
        doc = relay.dump(dump_id)
        if doc["state"] in ("done", "failed", "cancelled"):
            seconds = time.perf_counter() - t0
            break
        time.sleep(POLL_S)
    relay_cpu = cpu_seconds(relay.pid) - cpu0
    db_cpu = (db_cpu_of(db_pid) - db0) if db_pid else float("nan")
    busy1, steal1, tot1 = machine_cpu()
    if doc["state"] != "done":
        raise RuntimeError(f"dump {doc['state']}: {doc.get('error')} {doc['tables']}")
    tables = doc["tables"]  # one source; summed in case a relay lists a table's ranges
    wall = max(tot1 - tot0, 1e-9) / (os.cpu_count() or 1)
    return DumpRun(
        chunk_rows=chunk_rows, rows=sum(int(t["rows"]) for t in tables),
        chunks=sum(int(t.get("chunks") or 0) for t in tables),
        overtaken=sum(int(t.get("overtaken") or 0) for t in tables), seconds=seconds,
        relay_seconds=float(doc["finished_at"]) - float(doc["created_at"]),
        relay_cpu=relay_cpu, db_cpu=db_cpu, machine_busy=(busy1 - busy0) / wall,
        steal=(steal1 - steal0) / wall, parallelism=parallelism)


def dump_line(d: DumpRun, ref_rate: float | None = None, db: str = "mariadb",
              ref_name: str = "raw scan") -> str:
    par = "" if d.parallelism is None else f" parallelism={d.parallelism}"
    out = (f"dump chunk_rows={d.chunk_rows:6d}{par}: {d.rows:,} rows in {d.chunks} chunks, "
           f"{d.seconds:7.2f} s (relay's own {d.relay_seconds:.2f} s), {d.rate:9,.0f} rows/s")
    if ref_rate is not None:
        out += f", ratio to {ref_name} {d.rate / ref_rate:.3f}"
    return out + (f"  |  cpu: relay {d.relay_cpu / d.seconds:.2f}, {db} "
                  f"{d.db_cpu / d.seconds:.2f}, machine {d.machine_busy:.2f}, "
                  f"steal {d.steal:.2f} cores")


def parse_parallelism(text: str) -> list[int]:
    return [int(p) for p in text.split(",") if p.strip()]


def plot_parallelism(series: dict[str, list[DumpRun]], refs: dict[str, float], rows: int,
                     path: Path, title: str) -> str:
    """Seconds to dump ``rows`` rows by parallelism, one line per series; ``refs``:
    horizontal lines (label: seconds), the references of the same run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no parallelism plot (make bench-deps)"
    if not any(series.values()):
        return "no parallelism series measured: no plot"
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for label, runs in series.items():
        if runs:
            ax.plot([d.parallelism for d in runs], [d.seconds for d in runs], "o-",
                    label=label)
    styles = iter([":", "--", "-.", (0, (1, 3)), (0, (5, 5))])
    for label, seconds in refs.items():
        ax.axhline(seconds, color="grey", linestyle=next(styles, ":"),
                   label=f"{label} ({seconds:.2f} s)")
    xs = sorted({d.parallelism for runs in series.values() for d in runs
                 if d.parallelism is not None})
    ax.set_xticks(xs)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("parallelism (POST /v1/admin/dumps)")
    ax.set_ylabel(f"seconds to dump {rows:,} rows")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.suptitle(f"{os.cpu_count()} cores, Python {platform.python_version()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot saved to {path}"
