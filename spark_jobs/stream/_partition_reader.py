"""One input partition's read (runs on an executor; I/O): mod bucket ``i`` of ``P``
from its start checkpoint up to and including window N, through ``DatabusClient``.

The client does all the work and all the checks of any consumer: CRCs and whole
windows, failover between relays, the bootstrap (snapshot, then catch-up, with the same
filter) when the partition has read nothing yet or its checkpoint fell off the relays.
``stop_at_scn=N`` ends it once its position is after window N; windows with no event of
this bucket move that position too (the relay sends their ends). A relay window past N
(the relay has no window N: another member, which the driver asked, had one) ends it as
well, and its rows are not handed to Spark: the next micro-batch starts after N and reads
them.

The client runs on its own thread and event loop; whole windows are gathered into
Arrow record batches (``_arrow_rows``) of about ``BATCH_ROWS`` rows, which reach the
generator through a small queue, so memory holds a few batches, not the micro-batch. A
rollback after rows were taken (a window found bad after it was delivered, which the
client then replays) fails the task instead of repeating those rows: Spark runs the task
again from the same start checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from databus.checkpoint import Checkpoint
from databus.client import CallbackResult, Consumer, DatabusClient, MemoryCheckpointStore
from databus.client._events import Window
from databus.errors import DatabusError
from databus.spark_jobs.stream._arrow_rows import BATCH_ROWS, RowBatches
from databus.spark_jobs.stream._options import SourceOptions

_DONE = object()


class PartitionReadError(DatabusError):
    """A partition's read failed (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """What one task reads: picklable (an ``InputPartition``'s value)."""

    partition: int
    partitions: int
    start: dict[str, Any]  # checkpoint JSON
    stop_at_scn: int
    avro_schema: dict[str, Any] | None  # one source: decode with it (typed columns)


class _Collector(Consumer):
    """Gathers whole windows' rows (on the client's dispatch thread) and hands them over
    as record batches of at least ``batch_rows`` rows; ``flush`` hands the rest."""

    def __init__(self, read: PartitionRead, batches: RowBatches, out: queue.Queue[object],
                 batch_rows: int = BATCH_ROWS) -> None:
        self.read = read
        self.batches = batches
        self.batch_rows = batch_rows
        self.out = out
        self.taken = False
        self.windows = 0
        self.error: PartitionReadError | None = None
        self._lock = threading.Lock()

    def on_window(self, window: Window) -> CallbackResult | None:
        self.windows += 1
        if window.scn > self.read.stop_at_scn and not window.from_bootstrap:
            # The relay read has no window N (docs/clusters.md: a member that read a
            # trigger-captured source again may lack a window another one has): this
            # one ends the read and belongs to the next micro-batch, which starts
            # after N. Handed now, it would be handed again there.
            return None
        if window.events:
            with self._lock:
                self.batches.add(window.events)
                self.taken = True
                if len(self.batches) >= self.batch_rows:
                    self.out.put(self.batches.take())
        return None

    def flush(self) -> None:
        with self._lock:
            batch = self.batches.take()
            if batch is not None:
                self.out.put(batch)

    def on_rollback(self, scn: int) -> CallbackResult | None:
        if self.taken:
            self.error = PartitionReadError(
                f"partition {self.read.partition}: the client rolled back to SCN {scn} "
                "after rows were taken for Spark; failing the task (it is read again "
                "from its start checkpoint)")
            return CallbackResult.ERROR_FATAL
        return None


class _LastWarning(logging.Handler):
    """The last WARNING (or worse) of ``databus.client`` logged on one thread (the
    partition's client): why a read that makes no progress does not, for its error."""

    def __init__(self, thread: str) -> None:
        super().__init__(logging.WARNING)
        self.thread = thread
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.threadName == self.thread:
            try:
                self.message = record.getMessage()
            except Exception:  # a bad record must not break the read
                self.message = str(record.msg)


def _client(opts: SourceOptions, read: PartitionRead) -> DatabusClient:
    spec = None
    if read.partitions > 1:
        spec = {s: {"type": "mod", "n": read.partitions, "buckets": [read.partition]}
                for s in opts.sources}
    reader = ({opts.sources[0]: read.avro_schema} if read.avro_schema is not None else None)
    return DatabusClient(
        **opts.client_kwargs(), bootstrap=list(opts.bootstrap) or None, filter=spec,
        checkpoint_store=MemoryCheckpointStore(Checkpoint.from_json(dict(read.start))),
        stop_at_scn=read.stop_at_scn, reader_schemas=reader,
        # A slow Spark consumer must not count as a failed callback.
        callback_timeout=24 * 3600.0, retry_budget=0,
        # A bulk reader: larger answers, fewer round trips (as a replicator's).
        max_request_bytes=4 << 20, max_buffered_bytes=16 << 20,
        name=f"spark-databus-{read.partition}of{read.partitions}",
        client_id=f"spark-databus-{read.partition}of{read.partitions}")


def read_partition(opts: SourceOptions, read: PartitionRead, batches: RowBatches,
                   relay_timeout: float,
                   make_client: Callable[[SourceOptions, PartitionRead], DatabusClient] = _client,
                   ) -> Iterator[pa.RecordBatch]:
    """The rows of ``read`` as record batches, in commit order."""
    out: queue.Queue[object] = queue.Queue(maxsize=4)
    client = make_client(opts, read)
    collector = _Collector(read, batches, out)
    client.register(collector)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(client.run_async())
            if collector.error is None:
                collector.flush()
        except BaseException as exc:
            failure.append(exc)
        finally:
            out.put(_DONE)

    thread = threading.Thread(target=run, name=f"databus-partition-{read.partition}",
                              daemon=True)
    warned = _LastWarning(thread.name)
    client_log = logging.getLogger("databus.client")
    client_log.addHandler(warned)
    thread.start()
    last_progress = time.monotonic()
    seen = (-2, 0, 0)
    try:
        while True:
            try:
                item = out.get(timeout=1.0)
            except queue.Empty:
                m = client.metrics
                now_seen = (m.committed_scn if m.committed_scn is not None else -2,
                            collector.windows, m.bootstraps)
                if now_seen != seen:
                    seen, last_progress = now_seen, time.monotonic()
                elif time.monotonic() - last_progress > relay_timeout:
                    # A healthy read moves: windows, checkpoints (filtered windows
                    # too) or bootstrap batches. Bad answers are retried for ever by
                    # the client (they never reach Spark): bounded here.
                    client.stop()
                    why = (f"; the client's last warning: {warned.message[:500]}"
                           if warned.message else "")
                    raise PartitionReadError(
                        f"partition {read.partition}: no progress in {relay_timeout:.0f} s "
                        f"(relays failing, answering what does not check out, or not "
                        "answering; the executor's WARNING lines of databus.client say "
                        f"why){why}") from None
                continue
            if item is _DONE:
                break
            last_progress = time.monotonic()
            assert isinstance(item, pa.RecordBatch)
            yield item
    finally:
        client.stop()
        thread.join(30)
        client_log.removeHandler(warned)
    if collector.error is not None:
        raise collector.error
    if failure:
        error = failure[0]
        if isinstance(error, PartitionReadError):
            raise error
        raise PartitionReadError(f"partition {read.partition}: {type(error).__name__}: "
                                 f"{error}") from error
