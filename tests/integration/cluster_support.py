"""What the cluster tests share: the ``[relay.cluster]`` section of a relay's config,
polling helpers, and a writer of small transactions into a SQLite ``orders`` source
(``id INTEGER PRIMARY KEY, qty INTEGER``, captured by triggers)."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from databus.fetchers.txlog import seal_sqlite_transaction
from databus.security import ClientCredentials
from tests.fixtures.servers import EnsembleChroot
from tests.relay_harness import get_url
from tests.waiting import wait_until

T = TypeVar("T")

SESSION_S = 2.0  # the ZooKeeper session of the cluster tests' members


def cluster_toml(zk: EnsembleChroot, name: str = "shop", *, zookeeper: str | None = None,
                 credentials: ClientCredentials | None = None) -> str:
    """``[relay.cluster]`` in leader-follower mode on the test's chroot (``zookeeper``:
    another connect string for it, e.g. with ``digest:`` credentials); ``credentials``:
    what the members present to each other (``ca_file``, ``cert_file``, ``key_file``,
    ``token``)."""
    lines = ["[relay.cluster]",
             f"zookeeper = {json.dumps(zookeeper or zk.hosts)}",
             f'name = "{name}"',
             'mode = "leader-follower"',
             f"session_timeout_s = {SESSION_S}"]
    if credentials is not None:
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(credentials, key)
            if path is not None:
                lines.append(f"{key} = {json.dumps(str(path))}")
        if credentials.token is not None:
            lines.append(f"token = {json.dumps(credentials.token.reveal())}")
    return "\n".join(lines) + "\n"


def get_json(url: str, credentials: ClientCredentials | None = None) -> Any:
    """``GET url`` as JSON, presenting ``credentials`` (TLS trust, token) if given."""
    return json.loads(get_url(url, credentials))


def wait_for(check: Callable[[], T], what: str, timeout: float = 30, *,
             max_interval: float = 0.5) -> T:
    """``check()``'s first truthy answer (:func:`tests.waiting.wait_until`); an OSError
    (a member starting, paused or gone) counts as not yet."""
    return wait_until(check, what, timeout, max_interval=max_interval, ignore=(OSError,))


class OrdersWriter(threading.Thread):
    """Transactions of 1 to 3 upserts over ``keys`` keys (a share of them deletes) into
    the SQLite source at ``path``, sealed as the TxLog capture needs, until stopped."""

    def __init__(self, path: Path, seed: int = 16, *, keys: int = 200,
                 delete_share: float = 0.0, pause_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.seed = seed
        self.keys = keys
        self.delete_share = delete_share
        self.pause_s = pause_s
        self.halt = threading.Event()
        self.count = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=10)
        rng = random.Random(self.seed)
        try:
            while not self.halt.is_set():
                conn.execute("BEGIN IMMEDIATE")
                for _ in range(rng.randint(1, 3)):
                    key = rng.randint(1, self.keys)
                    if self.delete_share and rng.random() < self.delete_share:
                        conn.execute("DELETE FROM orders WHERE id = ?", (key,))
                    else:
                        conn.execute("INSERT INTO orders (id, qty) VALUES (?, ?) ON "
                                     "CONFLICT(id) DO UPDATE SET qty = excluded.qty",
                                     (key, rng.randrange(1000)))
                seal_sqlite_transaction(conn)
                conn.execute("COMMIT")
                self.count += 1
                time.sleep(self.pause_s)
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
        finally:
            conn.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        assert self.error is None, self.error
