"""Offsets of the ``databus`` streaming source (pure: no I/O, no PySpark).

An offset is one Databus checkpoint per input partition, with what the partitions
mean, so that a query restarted on other options cannot misread it::

    {"version": 1, "partitions": 2, "sources": ["shop.orders"], "filter_key": "mod",
     "checkpoints": {"0": {"window_scn": 1234}, "1": {"window_scn": 1234}}}

Partition ``i`` of ``P`` reads the events whose partition key is in mod bucket ``i``
(``abs(partition key) % P == i``, the relay's and the bootstrap service's ``mod``
filter). A checkpoint ``{"window_scn": -1}`` is "nothing read yet": that partition
starts with the bootstrap snapshot when a bootstrap service is configured, else with
the relay's oldest window. Every other checkpoint of an end offset stands after a whole
window (a micro-batch ends at window boundaries only).

An offset written under other ``partitions`` or ``sources`` than the query's is
refused (``OffsetMismatch``) rather than re-partitioned: bucket ``i`` of 2 and bucket
``i`` of 4 are other keys, and re-dividing the checkpoints would lose or repeat rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from databus.checkpoint import Checkpoint, Mode
from databus.errors import CheckpointError, DatabusError

VERSION = 1
FILTER_KEY = "mod"  # the bucket of the partition key: the relay's ``mod`` filter


class OffsetError(DatabusError, ValueError):
    """An offset that cannot be read (not one this source wrote)."""

    code = "bad_offset"


class OffsetMismatch(OffsetError):
    """An offset written by a query with other partitions or sources."""

    code = "offset_mismatch"


@dataclass(frozen=True, slots=True)
class Offset:
    """Checkpoints of partitions 0..P-1 of ``sources``."""

    partitions: int
    sources: tuple[str, ...]
    checkpoints: tuple[Checkpoint, ...]

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "partitions": self.partitions,
                "sources": list(self.sources), "filter_key": FILTER_KEY,
                "checkpoints": {str(i): c.to_json() for i, c in enumerate(self.checkpoints)}}

    def checkpoint(self, partition: int) -> Checkpoint:
        return self.checkpoints[partition]


def starting(partitions: int, sources: Sequence[str], checkpoint: Checkpoint) -> Offset:
    """Every partition at ``checkpoint``."""
    return Offset(partitions, tuple(sources), (checkpoint,) * partitions)


def nothing_read(partitions: int, sources: Sequence[str]) -> Offset:
    """A query's first offset: no partition has read anything."""
    return starting(partitions, sources, Checkpoint.flexible())


def position(checkpoint: Checkpoint) -> int:
    """The SCN a checkpoint stands after, -1 for "nothing read yet"."""
    if checkpoint.mode is not Mode.ONLINE or checkpoint.window_offset >= 0:
        raise OffsetError(f"an offset's checkpoint must stand after a whole window, "
                          f"not {checkpoint.dumps()}")
    return max(checkpoint.window_scn, -1)


def advanced_to(start: Offset, newest_scn: int | None) -> Offset:
    """The end offset of a micro-batch from ``start`` to the relay's newest window
    ``newest_scn`` (None: an empty buffer): every partition behind it moves to "after
    window ``newest_scn``", the others stay (``start`` itself when nothing is new)."""
    if newest_scn is None or newest_scn < 0:
        return start
    ends = tuple(Checkpoint(newest_scn) if position(c) < newest_scn else c
                 for c in start.checkpoints)
    return start if ends == start.checkpoints else Offset(start.partitions, start.sources, ends)


def parse(data: object, *, partitions: int, sources: Sequence[str]) -> Offset:
    """Read an offset Spark hands back (a dict, or its JSON text) and check that it
    belongs to a query with these ``partitions`` and ``sources``."""
    if isinstance(data, str | bytes):
        import json

        try:
            data = json.loads(data)
        except ValueError as exc:
            raise OffsetError(f"the offset is not JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise OffsetError("the offset is not a JSON object (not one the databus source wrote)")
    version = data.get("version")
    if version != VERSION:
        raise OffsetError(f"offset version {version!r} is not supported (this source "
                          f"writes version {VERSION})")
    got_p, got_s = data.get("partitions"), data.get("sources")
    if type(got_p) is not int or not isinstance(got_s, list) or not all(
            isinstance(s, str) for s in got_s):
        raise OffsetError("the offset has no valid 'partitions' or 'sources'")
    if got_p != partitions:
        raise OffsetMismatch(
            f"the query's checkpoint was written with partitions={got_p}, and the query "
            f"now has partitions={partitions}: a changed partition count would re-divide "
            "the keys between partitions, losing or repeating rows. Run the query with "
            f"partitions={got_p}, or start it with a new checkpoint location")
    if sorted(got_s) != sorted(sources):
        raise OffsetMismatch(
            f"the query's checkpoint was written for sources {sorted(got_s)}, and the "
            f"query now reads {sorted(sources)}: start it with a new checkpoint location")
    if data.get("filter_key") != FILTER_KEY:
        raise OffsetError(f"the offset's filter_key {data.get('filter_key')!r} is not "
                          f"{FILTER_KEY!r}")
    raw = data.get("checkpoints")
    if not isinstance(raw, Mapping) or sorted(raw) != sorted(str(i) for i in range(got_p)):
        raise OffsetError(f"the offset must have one checkpoint for each of partitions "
                          f"0..{got_p - 1}")
    checkpoints = []
    for i in range(got_p):
        try:
            value = raw[str(i)]
            checkpoint = Checkpoint.from_json(dict(value) if isinstance(value, Mapping)
                                              else value)
        except CheckpointError as exc:
            raise OffsetError(f"partition {i}'s checkpoint: {exc}") from None
        position(checkpoint)
        checkpoints.append(checkpoint)
    return Offset(got_p, tuple(got_s), tuple(checkpoints))
