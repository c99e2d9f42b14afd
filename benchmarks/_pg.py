"""Shared helpers of the PostgreSQL benchmarks: a throwaway PostgreSQL 15 started exactly
as the test fixture starts it (``tests/fixtures/_postgres.py``: fsync, synchronous_commit
and full_page_writes off), and a fresh schema in it. Not a benchmark by itself.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg2

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the scripts run as benchmarks/x.py: make ``tests`` importable
    sys.path.insert(0, str(ROOT))

from tests.fixtures._postgres import PostgresServer, launch  # noqa: E402
from tests.fixtures._procs import shutdown  # noqa: E402

__all__ = ["PostgresServer", "fresh_schema", "postgres", "vacuum_analyze"]


@contextmanager
def postgres() -> Iterator[PostgresServer]:
    """A fresh PostgreSQL (new datadir, free port), removed on exit."""
    control = launch()
    try:
        yield PostgresServer.from_control(control)
    finally:
        shutdown(control)


def fresh_schema(server: PostgresServer, schema: str) -> str:
    """Drop ``schema`` if it exists; the bootstrap storage URL of it (created on open)."""
    conn = psycopg2.connect(**server.connect_kwargs())
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        conn.close()
    return f"{server.url()}?schema={schema}"


def vacuum_analyze(server: PostgresServer, schema: str) -> None:
    """VACUUM ANALYZE every table of ``schema``: the steady state autovacuum reaches,
    so planner statistics do not depend on how soon after a bulk load one measures."""
    conn = psycopg2.connect(**server.connect_kwargs())
    try:
        conn.autocommit = True  # VACUUM cannot run in a transaction
        with conn.cursor() as cur:
            cur.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n"
                        " ON n.oid = c.relnamespace WHERE n.nspname = %s"
                        " AND c.relkind IN ('r', 'p')", (schema,))
            for (table,) in cur.fetchall():
                cur.execute(f"VACUUM ANALYZE {schema}.{table}")
    finally:
        conn.close()
