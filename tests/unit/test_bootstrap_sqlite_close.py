"""The SQLite bootstrap store closed while other threads still use it: a component's
thread can outlive its task (a thread cannot be cancelled), so ``close()`` may come in
the middle of an apply. Closing a sqlite3 connection under a running statement crashed
the whole test process (a segmentation fault in CI); now the thread using a connection
closes it when its transaction ends, and every later call is a clear error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from databus.bootstrap import BootstrapStorage, open_storage
from databus.errors import StorageUnavailableError


def test_close_waits_for_the_transaction_in_flight(tmp_path: Path) -> None:
    store = open_storage(f"sqlite:///{tmp_path / 'b.db'}")
    inside, release = threading.Event(), threading.Event()
    seen: list[object] = []

    def apply() -> None:
        try:
            with store._transaction(write=True) as cur:  # the seam under test
                inside.set()
                release.wait(10)
                cur.execute("SELECT count(*) FROM dbus_windows")
                seen.append(cur.fetchone()[0])
        except BaseException as exc:  # surfaced below
            seen.append(exc)

    thread = threading.Thread(target=apply)
    thread.start()
    assert inside.wait(10)
    store.close()  # while the other thread is inside its transaction
    release.set()
    thread.join(10)
    assert seen == [0]  # its transaction finished on its connection
    with pytest.raises(StorageUnavailableError, match="closed"):
        store.positions()


def _busy(store: BootstrapStorage, stop: threading.Event,
          errors: list[BaseException]) -> None:
    while not stop.is_set():
        try:
            store.apply(max_rows=100)
            store.state()
        except StorageUnavailableError:
            return  # closed: the clear error
        except BaseException as exc:
            errors.append(exc)
            return


def test_close_during_busy_threads_never_crashes(tmp_path: Path) -> None:
    for round_ in range(20):
        store = open_storage(f"sqlite:///{tmp_path / f'b{round_}.db'}")
        stop = threading.Event()
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_busy, args=(store, stop, errors))
                   for _ in range(3)]
        for t in threads:
            t.start()
        store.close()
        stop.set()
        for t in threads:
            t.join(10)
        assert not errors, errors
