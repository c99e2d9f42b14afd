"""The postgres_server fixture gives a TCP-reachable server ready for logical decoding."""

from __future__ import annotations

import psycopg2

from tests.fixtures.servers import PostgresServer


def test_query_and_logical_wal_level(postgres_server: PostgresServer) -> None:
    with psycopg2.connect(postgres_server.dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_database(), current_user, 6 * 7")
        assert cur.fetchone() == ("test", "postgres", 42)
        cur.execute("SHOW wal_level")
        assert cur.fetchone() == ("logical",)
    conn.close()


def test_restart_keeps_the_data(postgres_server: PostgresServer) -> None:
    conn = psycopg2.connect(**postgres_server.connect_kwargs())
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE restart_probe (id int PRIMARY KEY)")
        cur.execute("INSERT INTO restart_probe VALUES (1)")
    conn.close()

    postgres_server.restart()

    conn = psycopg2.connect(postgres_server.dsn)
    with conn.cursor() as cur:
        cur.execute("SELECT id FROM restart_probe")
        assert cur.fetchall() == [(1,)]
    conn.close()
