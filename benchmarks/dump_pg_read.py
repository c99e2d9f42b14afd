"""PostgreSQL dump chunk reads (issue 29, items 2 and 3): rows/s of each way of reading
and encoding a table in keyset chunks, as ratios to a raw ``COPY ... TO STDOUT`` of the
whole table measured in the same run.

    .venv/bin/python benchmarks/dump_pg_read.py [--rows 1000000] [--chunk 10000]
        [--repeat 3] [--no-txlog]

Table: ``bench(id bigint PRIMARY KEY, k int, c varchar(120), price numeric(12,2),
qty smallint, score double precision, note text (NULL every other row), at
timestamp)``, about 120 bytes a row. Every reader runs in chunks of ``--chunk`` rows,
``WHERE id > cursor ORDER BY id LIMIT n``, each chunk in its own REPEATABLE READ READ
ONLY transaction, on one connection:

- ``raw COPY``: ``COPY (SELECT <columns> FROM bench) TO STDOUT`` of the whole table
  into a list of bytes (the reference);
- ``SELECT text``: the chunk SELECT with every column read as text by psycopg2 (what
  the logical dump did), driver only; ``+ encode``: each row then through the
  reference path (``TableCodec.convert`` + ``key`` + ``encode``);
- ``COPY text``: the chunk as ``COPY (SELECT ...) TO STDOUT``, driver only; ``+ encode
  (native|python)``: then ``transcode_copy_rows`` of that twin;
- ``COPY binary``: the chunk as ``COPY ... (FORMAT binary)``, driver only (for the
  choice: its decoding would be a second grammar);
- ``LogicalDumpSource``, ``TxlogDumpSource``: the dump sources' own ``read_chunk`` loop
  (catalog queries per chunk included), into DumpRows; the TxLog source needs
  ``databus txlog install`` on the table (done here).

Each figure is the best of ``--repeat`` runs; the raw COPY runs again before every
reader (its best is over all those runs, so the ratios are if anything low); the load
average is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as benchmarks/x.py: make ``tests`` importable
    sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402
import psycopg2.extensions  # noqa: E402

from benchmarks._pg import PostgresServer, postgres  # noqa: E402
from databus.cli import main as databus_main  # noqa: E402
from databus.fetchers._api import FetcherContext, fetcher_class  # noqa: E402
from databus.fetchers.postgres import _transcode  # noqa: E402
from databus.fetchers.postgres._changes import TableCodec  # noqa: E402
from databus.fetchers.postgres._dump import LogicalDumpSource  # noqa: E402
from databus.fetchers.postgres._transcode_python import reference_row  # noqa: E402
from databus.relay._catalog import RelayCatalog  # noqa: E402

COLUMNS = "id, k, c, price, qty, score, note, at"


def load(server: PostgresServer, rows: int) -> None:
    conn = psycopg2.connect(**server.connect_kwargs())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS bench")
        cur.execute("CREATE TABLE bench (id bigint PRIMARY KEY, k int NOT NULL, "
                    "c varchar(120) NOT NULL, price numeric(12,2) NOT NULL, qty smallint "
                    "NOT NULL, score double precision NOT NULL, note text, at timestamp "
                    "NOT NULL)")
        cur.execute(
            "INSERT INTO bench SELECT i, (i::bigint * 7919) % 1000003, "
            "'customer-' || lpad((i % 99991)::text, 6, '0') || ' of the benchmark table', "
            "round(((i * 37) % 1000000) / 100.0, 2), i % 30000, (i % 1000) / 7.0, "
            "CASE WHEN i % 2 = 0 THEN 'a note\twith a tab, ' || i ELSE NULL END, "
            "timestamp '2024-01-01' + (i || ' seconds')::interval "
            f"FROM generate_series(1, {rows}) i")
        cur.execute("VACUUM ANALYZE bench")
    conn.close()


def connect(server: PostgresServer) -> Any:
    conn = psycopg2.connect(**server.connect_kwargs())
    conn.autocommit = True
    return conn


class Sink:
    __slots__ = ("parts", "write")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.write = self.parts.append


def raw_copy(conn: Any, rows: int) -> float:
    with conn.cursor() as cur:
        sink = Sink()
        start = time.perf_counter()
        cur.copy_expert(f"COPY (SELECT {COLUMNS} FROM bench) TO STDOUT", sink)
        data = b"".join(sink.parts)
        elapsed = time.perf_counter() - start
    assert data.count(b"\n") == rows
    return rows / elapsed


def chunked(conn: Any, rows: int, chunk: int,
            read: Callable[[Any, str, list[Any]], tuple[int, Any]]) -> float:
    """rows/s of reading the table in keyset chunks with ``read(cur, sql, params)``,
    which gives (rows read, the last key)."""
    total = 0
    last: Any = None
    start = time.perf_counter()
    with conn.cursor() as cur:
        while True:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if last is None:
                sql, params = f"SELECT {COLUMNS} FROM bench ORDER BY id LIMIT %s", [chunk]
            else:
                sql = f"SELECT {COLUMNS} FROM bench WHERE id > %s::bigint ORDER BY id LIMIT %s"
                params = [last, chunk]
            n, last = read(cur, sql, params)
            cur.execute("COMMIT")
            total += n
            if n < chunk:
                break
    elapsed = time.perf_counter() - start
    assert total == rows, (total, rows)
    return rows / elapsed


def text_caster(cur: Any) -> None:
    cur.execute("SELECT oid FROM pg_type WHERE typname IN ('int8', 'int4', 'varchar', "
                "'numeric', 'int2', 'float8', 'text', 'timestamp')")
    oids = tuple(r[0] for r in cur.fetchall())
    psycopg2.extensions.register_type(psycopg2.extensions.new_type(
        oids, "BENCH_TEXT", lambda value, _cur: value), cur)


def select_reader(codec: TableCodec | None) -> Callable[[Any, str, list[Any]], tuple[int, Any]]:
    def read(cur: Any, sql: str, params: list[Any]) -> tuple[int, Any]:
        text_caster(cur)
        cur.execute(sql, params)
        rows = cur.fetchall()
        if codec is not None:
            for row in rows:
                reference_row(row, codec)
        return len(rows), (rows[-1][0] if rows else None)
    return read


def copy_reader(twin: str | None, binary: bool = False
                ) -> Callable[[Any, str, list[Any]], tuple[int, Any]]:
    codec_box: list[TableCodec] = []

    def read(cur: Any, sql: str, params: list[Any]) -> tuple[int, Any]:
        sink = Sink()
        fmt = " (FORMAT binary)" if binary else ""
        cur.copy_expert(f"COPY ({cur.mogrify(sql, params).decode()}) TO STDOUT{fmt}", sink)
        data = b"".join(sink.parts)
        if binary:
            # A message a row (the first one after the 19-byte header), then the trailer.
            n = len(sink.parts) - 1
            row = sink.parts[-2][19 if n == 1 else 0:] if n else b""
            # the last key: the row's first field (int8: 8 bytes after 2 + 4)
            last = int.from_bytes(row[6:14], "big", signed=True) if n else None
            return n, last
        if twin is None:
            n = data.count(b"\n")
            last = data[data.rfind(b"\n", 0, len(data) - 1) + 1:].split(b"\t", 1)[0]
            return n, (last.decode() if n else None)
        rows, cursor = _transcode.twin(twin).transcode_copy_rows(data, codec_box[0])
        return len(rows), (cursor[0] if cursor else None)
    return read, codec_box  # type: ignore[return-value]


def dump_source_rate(source: Any, name: str, rows: int, chunk: int) -> float:
    total = 0
    after = None
    start = time.perf_counter()
    while True:
        got = source.read_chunk(name, after, chunk)
        total += len(got.rows)
        after = got.cursor
        if got.done:
            break
    elapsed = time.perf_counter() - start
    assert total == rows, (total, rows)
    return rows / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-txlog", action="store_true")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, transcode "
          f"{_transcode.IMPLEMENTATION}, {args.rows} rows, chunks of {args.chunk}")
    with postgres() as server, tempfile.TemporaryDirectory() as tmp:
        load(server, args.rows)
        conn = connect(server)
        url = server.url()
        logical_uri = f"{url}?tables=public.bench&slot=bench&publication=bench"
        catalog = RelayCatalog(Path(tmp) / "catalog.json")
        context = FetcherContext("bench", 0, catalog.for_buffer("bench", 0))
        logical = fetcher_class(logical_uri)(logical_uri, context).open_dump_source()
        assert isinstance(logical, LogicalDumpSource)
        with conn.cursor() as cur:
            cur.execute("CREATE PUBLICATION bench FOR TABLE bench")
            cur.execute("BEGIN")
            codec, _key, _types = logical._table(cur, "public.bench")
            cur.execute("COMMIT")
        assert codec.plan is not None
        txlog: Any = None
        if not args.no_txlog:
            txlog_uri = url.replace("postgresql://", "postgresql+txlog://", 1) + "?tables=bench"
            with contextlib.redirect_stdout(io.StringIO()):
                assert databus_main(["txlog", "install", "--source", txlog_uri]) == 0
            txlog = fetcher_class(txlog_uri)(txlog_uri, context).open_dump_source()
            (txlog_name,) = txlog.tables()

        readers: dict[str, Callable[[], float]] = {"raw COPY": lambda: raw_copy(conn, args.rows)}
        native_read, box = copy_reader("native" if _transcode.IMPLEMENTATION == "native"
                                       else "python")
        python_read, box2 = copy_reader("python")
        box.append(codec)
        box2.append(codec)
        plain_copy, _ = copy_reader(None)
        binary_copy, _ = copy_reader(None, binary=True)
        readers.update({
            "SELECT text": lambda: chunked(conn, args.rows, args.chunk, select_reader(None)),
            "SELECT text + encode (reference)": lambda: chunked(
                conn, args.rows, args.chunk, select_reader(codec)),
            "COPY text": lambda: chunked(conn, args.rows, args.chunk, plain_copy),
            "COPY binary": lambda: chunked(conn, args.rows, args.chunk, binary_copy),
            f"COPY text + encode ({_transcode.IMPLEMENTATION})": lambda: chunked(
                conn, args.rows, args.chunk, native_read),
            "COPY text + encode (python twin)": lambda: chunked(
                conn, args.rows, args.chunk, python_read),
            "LogicalDumpSource.read_chunk": lambda: dump_source_rate(
                logical, "public.bench", args.rows, args.chunk),
        })
        if txlog is not None:
            readers["TxlogDumpSource.read_chunk"] = lambda: dump_source_rate(
                txlog, txlog_name, args.rows, args.chunk)
        best: dict[str, float] = {}
        loads = []
        for _ in range(args.repeat):
            for name, run in readers.items():
                # The reference again before every reader: its best is taken over as
                # many runs as all the readers', on a machine whose load comes and goes.
                best["raw COPY"] = max(best.get("raw COPY", 0.0), readers["raw COPY"]())
                best[name] = max(best.get(name, 0.0), run())
                loads.append(os.getloadavg()[0])
        logical.close()
        if txlog is not None:
            txlog.close()
        conn.close()
    ref = best["raw COPY"]
    print(f"load average during the runs: {min(loads):.2f}-{max(loads):.2f}")
    print("| reader | rows/s | ÷ raw COPY |\n|---|---:|---:|")
    for name, rate in best.items():
        print(f"| {name} | {rate:,.0f} | {rate / ref:.2f} |")


if __name__ == "__main__":
    main()
