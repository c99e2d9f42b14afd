"""The mariadb_server fixture gives a ROW-binlog server a binlog reader can follow over TCP."""

from __future__ import annotations

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent

from tests.fixtures.servers import MariaDBServer


def _write_rows(server: MariaDBServer, table: str) -> list[dict[str, object]]:
    """All rows of WriteRowsEvents for ``test.<table>``, read from the first binlog on.

    Without a position the reader would start at the *current* file, which after a restart
    no longer holds the earlier inserts; is_mariadb stays False because with it (and no GTID
    auto-position) log_file/log_pos are ignored.
    """
    stream = BinLogStreamReader(
        connection_settings=server.replication_settings(),
        server_id=4242,
        only_events=[WriteRowsEvent],
        only_schemas=[server.database],
        only_tables=[table],
        blocking=False,
        log_file=server.binary_logs()[0],
        log_pos=4,
        resume_stream=True,
    )
    try:
        return [row["values"] for event in stream for row in event.rows]
    finally:
        stream.close()


def test_insert_is_read_back_from_binlog(mariadb_server: MariaDBServer) -> None:
    conn = pymysql.connect(**mariadb_server.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@binlog_format, @@binlog_row_image, @@binlog_row_metadata")
            assert cur.fetchone() == ("ROW", "FULL", "FULL")
            cur.execute(
                "CREATE TABLE fixture_probe (id INT PRIMARY KEY, name VARCHAR(40), score DOUBLE)"
            )
            cur.execute("INSERT INTO fixture_probe VALUES (7, 'seven', 7.5)")
    finally:
        conn.close()

    # FULL row metadata lets the reader name the columns without querying the schema.
    assert _write_rows(mariadb_server, "fixture_probe") == [
        {"id": 7, "name": "seven", "score": 7.5}
    ]


def test_url_and_restart_keep_the_data(mariadb_server: MariaDBServer) -> None:
    assert mariadb_server.url() == f"mysql://databus:databus-pw@127.0.0.1:{mariadb_server.port}/"
    conn = pymysql.connect(**mariadb_server.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE restart_probe (id INT PRIMARY KEY)")
            cur.execute("INSERT INTO restart_probe VALUES (1)")
    finally:
        conn.close()

    logs_before = mariadb_server.binary_logs()
    mariadb_server.restart()
    # A restart rotates the binlog; the reader must follow the rotation to find the row.
    assert len(mariadb_server.binary_logs()) == len(logs_before) + 1

    conn = pymysql.connect(**mariadb_server.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM restart_probe")
            assert cur.fetchall() == ((1,),)
    finally:
        conn.close()
    assert _write_rows(mariadb_server, "restart_probe") == [{"id": 1}]
