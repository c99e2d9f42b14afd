"""Per-partition checkpoints of a consumer group (DESIGN section 15).

Each partition p of a group has its own checkpoint, the envelope of
``_checkpoint_envelope``: by default in the persistent znode
``<group root>/checkpoints/<p>`` (``ZooKeeperPartitions``), or, when the member is given
a ``PostgresCheckpointStore``, in its table's row ``<consumer>#<p>``
(``PostgresPartitions``).
A member streams all its partitions with one filter from one position, so:

- **start** (``plan_start``, pure): the member starts from the *earliest* of its
  partitions' checkpoints, and each partition whose own checkpoint is later skips the
  windows it already has (``skip``: partition -> SCN; an event of partition p in a
  window at or below ``skip[p]`` is dropped before the consumer sees it). A partition
  with no checkpoint yet starts as a new consumer does (``start_from``); partitions in
  the middle of a bootstrap resume it when they agree on where, else the bootstrap
  starts over for all (bootstrap rows are delivered at least once, not skipped).
- **commit** (``GroupCheckpointStore.store``): the window's checkpoint is written to
  every partition the member runs whose checkpoint it moves forward (never backward:
  a partition still skipping keeps its own), all in one transaction. It is
  written only while the session that took the partitions lasts (their owner nodes
  are ephemeral nodes of that session): a member that lost its session writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from databus.checkpoint import Checkpoint, Mode
from databus.client._checkpoint_envelope import decode_envelope, encode_envelope
from databus.client._checkpoint_postgres import PostgresCheckpointStore
from databus.client._checkpoint_store import CheckpointStore, _require_checkpoint
from databus.client._dispatcher import checkpoint_scn
from databus.client._events import DataEvent, Item
from databus.errors import CheckpointError, ConnectionLostError

__all__ = [
    "GroupCheckpointStore",
    "PartitionCheckpoints",
    "PostgresPartitions",
    "StartPlan",
    "ZooKeeperPartitions",
    "plan_start",
    "skip_items",
]

log = logging.getLogger("databus.client.group")


@dataclass(frozen=True)
class StartPlan:
    """Where a member's stream starts (None: as a consumer without a checkpoint) and
    the windows each partition skips (partition -> its checkpoint's SCN)."""

    start: Checkpoint | None
    skip: Mapping[int, int]


def plan_start(checkpoints: Mapping[int, Checkpoint | None], start_from: str) -> StartPlan:
    """Pure: the start of a stream over the partitions of ``checkpoints``."""
    online = {p: cp for p, cp in checkpoints.items()
              if cp is not None and cp.mode is Mode.ONLINE and checkpoint_scn(cp) is not None}
    in_bootstrap = [cp for cp in checkpoints.values()
                    if cp is not None and cp.mode is not Mode.ONLINE]
    missing = [p for p, cp in checkpoints.items() if cp is None]
    skip_all = {p: _scn(cp) for p, cp in online.items()}
    if in_bootstrap:
        # Resume the bootstrap where every partition in it agrees; otherwise from the
        # start (its rows are delivered again: at least once).
        first = in_bootstrap[0]
        same = all(cp.dumps() == first.dumps() for cp in in_bootstrap)
        return StartPlan(first if same else None, skip_all)
    if not online:
        return StartPlan(None, {})
    if missing and start_from == "earliest":
        # The new partitions begin at the earliest the relay (or bootstrap) has.
        return StartPlan(None, skip_all)
    earliest = min(online.values(), key=_scn)
    low = _scn(earliest)
    return StartPlan(earliest, {p: scn for p, scn in skip_all.items() if scn > low})


def _scn(checkpoint: Checkpoint) -> int:
    scn = checkpoint_scn(checkpoint)
    return scn if scn is not None else -1


def skip_items(items: list[Item], skip: Mapping[int, int], partitions: int) -> list[Item]:
    """Pure: ``items`` without the relay events of partitions that already have their
    window (SCN at or below ``skip[p]``). Window ends stay: a window left empty only
    moves the position, with no callbacks (``Dispatcher.feed``)."""
    kept: list[Item] = []
    for item in items:
        if (type(item) is DataEvent and not item.from_bootstrap
                and item.scn <= skip.get(abs(item.partition_key) % partitions, -1)):
            continue
        kept.append(item)
    return kept


class PartitionCheckpoints(Protocol):
    """Where a group keeps its per-partition checkpoints."""

    where: str

    def load(self, partitions: list[int]) -> dict[int, Checkpoint | None]: ...

    def write(self, partitions: list[int], checkpoint: Checkpoint) -> None: ...


class ZooKeeperPartitions:
    """``<group root>/checkpoints/<p>``, through the coordinator's own kazoo client;
    several partitions are written in one transaction."""

    def __init__(self, client: Any, root: str) -> None:
        self.client = client
        self.root = root
        self.where = f"ZooKeeper {root}"
        self._created: set[int] = set()

    def load(self, partitions: list[int]) -> dict[int, Checkpoint | None]:
        """Read after a ``sync``, so that a member that just took a partition reads its
        previous owner's last write."""
        from kazoo.exceptions import NoNodeError

        out: dict[int, Checkpoint | None] = {}
        for p in partitions:
            path = f"{self.root}/{p}"
            self.client.sync(path)
            try:
                raw, _stat = self.client.get(path)
            except NoNodeError:
                out[p] = None
                continue
            out[p] = decode_envelope(
                bytes(raw or b""), where=f"checkpoint znode {path} of partition {p}",
                recovery=f"Restore the znode's data, or delete it to start partition {p} "
                         "without a checkpoint (the member will not start over on its own).")
        return out

    def write(self, partitions: list[int], checkpoint: Checkpoint) -> None:
        from kazoo.exceptions import NodeExistsError

        data = encode_envelope(checkpoint)
        client = self.client
        for p in partitions:
            if p in self._created:
                continue
            client.ensure_path(self.root)
            with contextlib.suppress(NodeExistsError):
                client.create(f"{self.root}/{p}", data)
            self._created.add(p)
        transaction = client.transaction()
        for p in partitions:
            transaction.set_data(f"{self.root}/{p}", data)
        results = transaction.commit()
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise failed[0]


class PostgresPartitions:
    """Rows ``<consumer>#<p>`` of a ``PostgresCheckpointStore``'s table; several
    partitions are written in one transaction."""

    def __init__(self, store: PostgresCheckpointStore) -> None:
        self.store = store
        self.where = f"table {store.table} on {store.server}"

    def load(self, partitions: list[int]) -> dict[int, Checkpoint | None]:
        return self.store.load_partitions(partitions)

    def write(self, partitions: list[int], checkpoint: Checkpoint) -> None:
        self.store.store_partitions(partitions, checkpoint)


def _unavailable() -> tuple[type[BaseException], ...]:
    """The errors that mean "the checkpoint backend cannot take it now"."""
    from kazoo.exceptions import KazooException

    return (KazooException, ConnectionLostError, CheckpointError)


class GroupCheckpointStore(CheckpointStore):
    """The checkpoint store one stream of a member uses: ``load`` gives the planned
    start, ``store`` writes each run partition's checkpoint (see the module docstring).

    ``fenced()`` says whether the session that took the partitions has ended. Then
    nothing is written and ``on_fenced`` (which ends the stream) is called; so it is
    when the backend refuses or cannot take a write."""

    def __init__(self, backend: PartitionCheckpoints, partitions: Iterable[int],
                 plan: StartPlan, fenced: Callable[[], bool],
                 on_fenced: Callable[[], None]) -> None:
        super().__init__()
        self.backend = backend
        self.partitions = tuple(sorted(set(partitions)))
        self.plan = plan
        self._fenced = fenced
        self._on_fenced = on_fenced
        self._lock = threading.Lock()
        self.writes = 0
        # What the next stream would start from, and whether a checkpoint given to
        # ``store`` is not in it (then the windows after it will be delivered again).
        self._persisted: Checkpoint | None = plan.start
        self._behind = False

    def replay_from(self) -> int | None:
        """None when every checkpoint given to ``store`` was written; else the SCN the
        windows after which will come again (-1: from the start)."""
        with self._lock:
            if not self._behind:
                return None
            persisted = self._persisted
        if persisted is None or persisted.mode is not Mode.ONLINE:
            return -1
        return _scn(persisted)

    def __repr__(self) -> str:
        return (f"GroupCheckpointStore({self.backend.where}, "
                f"partitions={list(self.partitions)})")

    def load(self) -> Checkpoint | None:
        return self.plan.start

    def store(self, checkpoint: Checkpoint) -> None:
        _require_checkpoint(checkpoint)
        scn = _scn(checkpoint) if checkpoint.mode is Mode.ONLINE else None
        parts = [p for p in self.partitions
                 if scn is None or self.plan.skip.get(p, -1) < scn]
        if not parts:
            return  # every partition's own checkpoint has this window already
        with self._lock:
            self._behind = True  # until the write below succeeds
            if self._fenced():
                log.warning("group: the session that took partitions %s has ended: their "
                            "checkpoint %s is not written", list(parts), checkpoint.dumps())
                self._on_fenced()
                return
            try:
                self.backend.write(parts, checkpoint)
            except _unavailable() as exc:
                # The backend cannot take it now: end the stream rather than go on with
                # checkpoints that do not stick (every window applied meanwhile would
                # come again). The next stream starts from what was written.
                log.warning("group: checkpoint %s of partitions %s not written to %s "
                            "(%s): stream ended", checkpoint.dumps(), list(parts),
                            self.backend.where, exc)
                self._on_fenced()
                return
            self._persisted, self._behind = checkpoint, False
            self.writes += 1
