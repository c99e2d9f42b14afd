"""One input partition's read (spark_jobs/stream/_partition_reader.py) against a real
relay, without Spark: a micro-batch planned up to window N on one relay and read from a
member that has no window N (a trigger-captured source read again after a fail-over:
a transaction whose rows were all changed again has no window there, docs/clusters.md)
hands no window past N; the next micro-batch, which starts after N, reads it. Every
change once across the two batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from databus.checkpoint import Checkpoint
from databus.spark_jobs.stream import _options
from databus.spark_jobs.stream._arrow_rows import RowBatches
from databus.spark_jobs.stream._partition_reader import PartitionRead, read_partition
from tests.integration.spark_stream_support import ServerThread, captured
from tests.relay_harness import relay_config, running_relay
from tests.unit.test_spark_stream_arrow_rows import struct
from tests.unit.test_txlog_support import BUFFER, CapturedWindow, SqliteSource
from tests.waiting import wait_until


def _read(url: str, start: Checkpoint, stop: int) -> list[tuple[Any, ...]]:
    opts = _options.parse({"relays": url, "sources": "shop.items", "relayTimeout": "30"})
    batches = RowBatches(struct(None), 0, None)  # the value JSON column
    return [tuple(row.values())
            for batch in read_partition(opts, PartitionRead(0, 1, start.to_json(), stop, None),
                                        batches, opts.relay_timeout)
            for row in batch.to_pylist()]


def test_a_window_past_the_batch_end_is_left_to_the_next_batch(tmp_path: Path) -> None:
    db = SqliteSource(tmp_path / "shop.db",
                      "CREATE TABLE items (id INTEGER PRIMARY KEY, qty INTEGER)")
    db.install("items")
    db.txn("INSERT INTO items (id, qty) VALUES (1, 1)")
    db.txn("INSERT INTO items (id, qty) VALUES (2, 2)")
    db.txn("INSERT INTO items (id, qty) VALUES (3, 3)")
    db.txn("UPDATE items SET qty = 10 WHERE id = 2")  # window 2 has no row left
    with ServerThread(running_relay(relay_config(tmp_path, {BUFFER: db.uri("items")}))
                      ) as relay:
        def three() -> list[CapturedWindow] | None:
            windows = captured(relay)
            return windows if len(windows) == 3 else None

        windows = wait_until(three, "the three windows at the relay", 30)
        assert windows is not None
        first, missing, last = (w.scn for w in windows)
        assert [w.changes[0].key for w in windows] == [1, 3, 2]
        # Planned up to the coalesced transaction's SCN (another member held its
        # window): this relay's next window is past it, and not handed on.
        coalesced = first + 1
        assert coalesced < missing
        batch1 = _read(relay.value.url, Checkpoint.flexible(), coalesced)
        batch2 = _read(relay.value.url, Checkpoint(coalesced), last)
    assert [(r[0], r[3]) for r in batch1] == [(first, "1")]
    assert [(r[0], r[3]) for r in batch2] == [(missing, "3"), (last, "2")]
    db.close()
