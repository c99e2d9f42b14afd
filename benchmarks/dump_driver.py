"""Which driver the MySQL dump reads its chunks with (issue 29): pymysql, mysqlclient
(MySQLdb, on libmariadb) and, when installed, MariaDB's own ``mariadb`` connector,
reading a table in the dump's keyset chunks, alone and then with the rows encoded to
``(event key, Avro value)`` as ``MysqlDumpSource`` does. Every figure is a ratio of a
raw pymysql streaming ``SELECT *`` of the same rows in the same run.

    .venv/bin/python benchmarks/dump_driver.py [--rows 1000000] [--chunk 10000]
        [--repeat 3]

Setup: a throwaway MariaDB started as the test fixture starts it, one table
``bench.items`` of ``--rows`` rows with the 8 columns of ``fetcher_mysql.py`` (BIGINT
key, INT, VARCHAR(16), DECIMAL(12,2), SMALLINT, DOUBLE, a VARCHAR(100) that is NULL
every third row, DATETIME(6)), loaded as ``dump.py`` loads it. Each variant reads every
row once per repeat (the best repeat counts) in chunks of ``--chunk`` rows:

- ``raw stream``: pymysql, ``SELECT * FROM items`` on an unbuffered cursor (the base);
- ``raw chunks``: pymysql, ``SELECT * ... WHERE id > ? ORDER BY id LIMIT n``;
- ``<driver> driver``: the dump's own chunk ``SELECT`` (``_select``'s expressions and
  the key columns; mysqlclient without conversions, as ``_dump_driver`` connects);
- ``<driver> + <twin>``: that, and the rows encoded to ``(key, value)`` as the dump
  does (``python``: the reference twin ``_rows_python``, the path before issue 29;
  ``native``: ``_rows.encode_rows`` with the compiled twin, which reads mysqlclient's
  text: on pymysql's typed values it would decline every row, so that pair is left
  out).

The pymysql + python variant is the dump's path before issue 29, mysqlclient + native
its path after it. (Written by a helper on a branch of its own, adapted to the modules
main has.)
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import pymysql
import pymysql.cursors
from _mariadb import MariaDBServer, connect, mariadb
from dump import SOURCE, load

from databus.fetchers.mysql import _dump_driver, _rows, _rows_python
from databus.fetchers.mysql._dump import MysqlDumpSource, _key_after
from databus.fetchers.mysql._select import TableLayout, table_layout

# A driver's chunk read: its rows, and the result's field types when they are raw.
Select = Callable[[str, Sequence[Any]], tuple[list[tuple[Any, ...]], list[int] | None]]


def chunk_sql(layout: TableLayout, first: bool, limit: int) -> str:
    select, keys = MysqlDumpSource._select(None, layout)  # type: ignore[arg-type]
    if not first:
        select += " WHERE " + _key_after(keys, len(keys))
    return select + f" ORDER BY {', '.join(keys)} LIMIT {limit}"


def read_all(select: Select, layout: TableLayout, limit: int,
             encode: Callable[[list[tuple[Any, ...]], _rows.RowPlan], Any] | None) -> int:
    n = len(layout.columns)
    plan = _rows.row_plan(layout)
    after: list[Any] | None = None
    total = 0
    while True:
        rows, types = select(chunk_sql(layout, after is None, limit), after or [])
        typed = plan.with_types(types) if types is not None else plan
        if encode is not None:
            encode(rows, typed)
        total += len(rows)
        if len(rows) < limit:
            return total
        after = typed.typed(rows[-1][n:], n)


def pymysql_select(server: MariaDBServer) -> Select:
    conn = connect(server, "bench")

    def select(sql: str, params: Sequence[Any]) -> tuple[list[tuple[Any, ...]], None]:
        with conn.cursor() as cur:
            cur.execute(sql, list(params) or None)
            return list(cur.fetchall()), None

    return select


def mysqldb_select(server: MariaDBServer) -> Select:
    import MySQLdb

    kw = server.connect_kwargs(database="bench")
    conn = MySQLdb.connect(host=kw["host"], port=kw["port"], user=kw["user"],
                           password=kw["password"], database="bench", charset="utf8mb4",
                           autocommit=True, conv=_dump_driver._encoders())

    def select(sql: str, params: Sequence[Any]) -> tuple[list[tuple[Any, ...]], list[int]]:
        return _dump_driver.select_raw(conn, sql, list(params))

    return select


def mariadb_select(server: MariaDBServer) -> Select | None:
    try:
        import mariadb as connector
    except ImportError:
        return None
    kw = server.connect_kwargs(database="bench")
    conn = connector.connect(host=kw["host"], port=kw["port"], user=kw["user"],
                             password=kw["password"], database="bench", autocommit=True)

    def select(sql: str, params: Sequence[Any]) -> tuple[list[tuple[Any, ...]], None]:
        cur = conn.cursor()
        cur.execute(sql.replace("%s", "?"), tuple(params))
        rows = list(cur.fetchall())
        cur.close()
        return rows, None  # typed values, as pymysql's

    return select


def raw_stream(server: MariaDBServer) -> int:
    conn = connect(server, "bench", cursorclass=pymysql.cursors.SSCursor)
    count = 0
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {SOURCE}")
        for _ in cur:
            count += 1
    conn.close()
    return count


def raw_chunks(server: MariaDBServer, limit: int) -> int:
    conn = connect(server, "bench")
    after, count = -1, 0
    with conn.cursor() as cur:
        while True:
            cur.execute(f"SELECT * FROM {SOURCE} WHERE id > %s ORDER BY id LIMIT {limit}",
                        (after,))
            rows = cur.fetchall()
            count += len(rows)
            if len(rows) < limit:
                return count
            after = rows[-1][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}, load average before: {os.getloadavg()}")
    with mariadb() as server:
        print(f"loaded {args.rows} rows in {load(server, args.rows):.1f} s")
        conn = connect(server, "bench")
        with conn.cursor() as cur:
            layout = table_layout(cur, "bench", "items")
        assert layout is not None
        drivers: dict[str, Select] = {"pymysql": pymysql_select(server),
                                      "mysqlclient": mysqldb_select(server)}
        maria = mariadb_select(server)
        if maria is not None:
            drivers["mariadb"] = maria
        variants: dict[str, Callable[[], int]] = {
            "raw stream": lambda: raw_stream(server),
            "raw chunks": lambda: raw_chunks(server, args.chunk),
        }
        for name, select in drivers.items():
            variants[f"{name} driver"] = (
                lambda s=select: read_all(s, layout, args.chunk, None))
            variants[f"{name} + python"] = (
                lambda s=select: read_all(s, layout, args.chunk, _rows_python.encode_rows))
            if name == "mysqlclient":
                variants[f"{name} + native"] = (
                    lambda s=select: read_all(s, layout, args.chunk, _rows.encode_rows))
        best: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, run in variants.items():
                t0 = time.perf_counter()
                count = run()
                seconds = time.perf_counter() - t0
                assert count == args.rows, (name, count)
                best[name] = min(best.get(name, seconds), seconds)
        base = best["raw stream"]
        print(f"{'variant':<24} {'us/row':>8} {'x raw stream':>13}")
        for name, seconds in best.items():
            print(f"{name:<24} {seconds / args.rows * 1e6:8.2f} {seconds / base:13.2f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
