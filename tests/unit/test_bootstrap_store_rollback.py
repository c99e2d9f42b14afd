"""A bootstrap store that goes back in time under a bootstrap in progress (a restore, a
crash that lost commits made with synchronous_commit off, a failover to a lagging
replica). The snapshot in progress promised rows at least as new as its start SCN and a
catch-up from there: served from the older store, the changes in between would never
reach the consumer. The server serves nothing and hands the checkpoint back until the
producer and the applier have written them again, and the consumer ends with every row.
This failed in CI once, by chance, against a crash-restarted PostgreSQL; here the
rollback is a SQLite backup restored under the bootstrap, every time."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from databus.bootstrap import open_storage
from databus.bootstrap._serve import Bootstrapper, ServePolicy
from databus.bootstrap._storage import LogWindow, stored_event
from databus.checkpoint import Checkpoint
from databus.event import Op, decode_event, encode_event, iter_events
from databus.filters import FilterSpec

pytestmark = pytest.mark.twin("databus.batch")

SOURCE = "shop.items"


def _window(scn: int, keys: range) -> LogWindow:
    return LogWindow(scn, scn * 1000, [
        stored_event(SOURCE, encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=k,
                                          value=f"{k}@{scn}".encode(), timestamp_ns=scn))
        for k in keys])


def _write(store: object, scns: range) -> None:
    for scn in scns:  # window scn writes keys scn*10 .. scn*10+9
        store.append([_window(scn, range(scn * 10, scn * 10 + 10))],  # type: ignore[attr-defined]
                     Checkpoint(scn), log_floor_scn=0 if scn == 1 else None)
        store.apply(max_rows=1000)  # type: ignore[attr-defined]


def _copy(src: Path, dst: Path) -> None:
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def test_a_store_restored_under_a_snapshot_is_waited_for(tmp_path: Path) -> None:
    db = tmp_path / "boot.db"
    store = open_storage(f"sqlite:///{db}")
    _write(store, range(1, 21))
    _copy(db, tmp_path / "older.db")  # the store as of SCN 20
    _write(store, range(21, 41))
    server = Bootstrapper(store, ServePolicy(batch_rows=50))
    spec = FilterSpec.parse(None)
    replica: dict[object, bytes] = {}

    def take(body: bytes) -> None:
        for offset, header in iter_events(body):
            if header.source_id >= 0:
                event = decode_event(body, offset)
                replica[event.key] = event.value

    served = server.serve(Checkpoint.flexible(), [SOURCE], spec, 2000)  # snapshot at 40
    take(bytes(served.body))
    assert not served.done and served.checkpoint.bootstrap_start_scn == 40
    _copy(tmp_path / "older.db", db)  # restored under the bootstrap: back to SCN 20
    waiting = server.serve(served.checkpoint, [SOURCE], spec, 2000)
    assert waiting.body == b"" and waiting.checkpoint == served.checkpoint
    assert waiting.waiting is not None and "behind" in waiting.waiting
    _write(store, range(21, 41))  # the producer and the applier write it all again
    checkpoint = served.checkpoint
    while True:
        served = server.serve(checkpoint, [SOURCE], spec, 2000)
        take(bytes(served.body))
        checkpoint = served.checkpoint
        if served.done:
            break
    assert checkpoint.window_scn >= 40
    expected = {k: f"{k}@{k // 10}".encode() for k in range(10, 410)}
    assert replica == expected
    store.close()
