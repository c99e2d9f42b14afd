"""The PostgreSQL logical decoding fetcher end to end (issue 18): ``databus pg setup`` on a
fresh database, a ``databus relay`` process reading its slot through pgoutput, and a
client. Every window must be one source transaction (each transaction here writes a
``tag`` of its own into every row it touches), in commit order, with the right rows."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.servers import PostgresServer
from tests.integration.pg_logical_support import (
    PgDatabase,
    consume,
    fetcher_of,
    logical_relay,
    status,
    wait_for,
)

pytestmark = pytest.mark.integration

ORDERS = ("CREATE TABLE orders (id int PRIMARY KEY, qty int NOT NULL, note text, "
          "price numeric(10,2), tag int NOT NULL)")


@pytest.fixture
def db(postgres_server: PostgresServer) -> Iterator[PgDatabase]:
    database = PgDatabase(postgres_server, ORDERS)
    try:
        yield database
    finally:
        database.drop()








def tags_of(windows: list[tuple[int, list[Any]]]) -> list[set[int]]:
    return [{v["tag"] for _s, op, _k, v in events if op == "UPSERT"} for _scn, events in
            windows]


def test_every_window_is_one_transaction_in_commit_order(db: PgDatabase,
                                                         tmp_path: Path) -> None:
    db.setup("public.orders")
    with logical_relay(tmp_path, db.uri("public.orders")) as relay:
        for tag in range(1, 41):
            base = tag * 10
            db.txn(*(f"INSERT INTO orders VALUES ({base + i}, {i}, 'n{tag}', {tag}.5, {tag})"
                     for i in range(tag % 4 + 1)),
                   f"UPDATE orders SET qty = qty + 1, tag = {tag} WHERE id = {base}")
        db.txn("DELETE FROM orders WHERE id = 10", "UPDATE orders SET tag = 99 WHERE id = 20")
        windows = consume(relay, ["public.orders"], lambda w: len(w) >= 41).windows
        assert len(windows) == 41
        scns = [scn for scn, _ in windows]
        assert scns == sorted(scns) and len(set(scns)) == 41
        assert tags_of(windows[:40]) == [{tag} for tag in range(1, 41)]
        for (_scn, events), tag in zip(windows[:40], range(1, 41), strict=True):
            inserted = tag % 4 + 1
            assert len(events) == inserted + 1  # the inserts, then the update
            first = events[0][3]
            assert first["note"] == f"n{tag}" and str(first["price"]) == f"{tag}.50"
        last = windows[40][1]
        assert [(op, key) for _s, op, key, _v in last] == [("DELETE", 10), ("UPSERT", 20)]
        assert last[0][3] is None
        # The slot is confirmed and its lag reported.
        details = wait_for(lambda: fetcher_of(relay)["details"].get("slot_confirmed_lsn")
                           and fetcher_of(relay)["details"], "slot statistics")
        assert details["slot_lag_bytes"] >= 0
        with urllib.request.urlopen(relay.url + "/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert 'databus_relay_fetcher_slot_lag_bytes{buffer="pg"}' in metrics


def test_relay_killed_in_a_large_transaction_delivers_it_whole_once(
        db: PgDatabase, tmp_path: Path) -> None:
    """A 100,000-row transaction is one window; the relay killed while it streams it
    restarts and delivers it whole, once."""
    db.setup("public.orders")
    with logical_relay(tmp_path, db.uri("public.orders"), capacity_mb=64) as relay:
        db.txn("INSERT INTO orders VALUES (1, 1, 'first', 1, 1)")
        consume(relay, ["public.orders"], lambda w: len(w) >= 1)
        db.txn("INSERT INTO orders SELECT g, g, 'big', 2.5, 2 FROM "
               "generate_series(2, 100001) g")
        # Kill it while the window is being written: once the server has sent part of
        # the transaction (the slot's walsender is past its start), before the relay's
        # buffer has the window.
        committed_at = time.monotonic()
        wait_for(lambda: db.rows("SELECT sent_lsn > '0/0' FROM pg_stat_replication "
                                 f"WHERE application_name = 'databus-{db.slot}'"),
                 "the walsender streaming")
        time.sleep(0.2)
        max_scn = status(relay)["buffers"]["pg"]["max_scn"]
        relay.kill(signal.SIGKILL)
        print(f"killed {time.monotonic() - committed_at:.2f} s after the commit; buffer "
              f"max SCN then {max_scn}")
        db.txn("INSERT INTO orders VALUES (200000, 3, 'after', 3, 3)")
        relay.start()
        windows = consume(relay, ["public.orders"], lambda w: len(w) >= 3, timeout=120)
        windows_list = windows.windows
        assert tags_of(windows_list) == [{1}, {2}, {3}]
        # Whether the kill came before the big window was in the buffer (the usual case:
        # it is read again from the slot) or after (it stays), it is there whole, once.
        assert max_scn in (windows_list[0][0], windows_list[1][0])
        assert len(windows_list[1][1]) == 100_000
        assert sorted(k for _s, _o, k, _v in windows_list[1][1]) == list(range(2, 100002))
