"""Quarantined sources of a relay (DESIGN 17; docs/relay.md, "Quarantined sources"):
the records, the file that keeps them, and the marker that carries them in the stream.

A fetcher that meets a failure belonging to one logical source calls
``FetcherContext.quarantine``; the fetcher host records it here
(``QuarantineStore.add``) before it returns, so a relay restarted after the fetcher
resumed past the failing SCN still knows. ``quarantine.json`` in the data dir::

    {"version": 1, "quarantined": [
        {"buffer": "shop", "source": "shop.orders", "scn": 1234, "reason": "...",
         "fix": "...", "since": 1700000000.0, "marker_scn": 1234, "healing": false,
         "heal_dump": null, "heal_marked": false}]}

``marker_scn`` is the window that holds the record's marker (None until one landed);
``healing`` is set by ``databus relay heal`` when it lifts the quarantine; the record
is removed once both the heal's dump is recorded (``heal_dump``: its id, ``""`` when a
dump of the source was active already) and the heal marker has landed
(``heal_marked``): a relay that dies in between finishes the heal at start (``heal_step``).
Written atomically with fsync (databus/_fileio.py).

The **marker** is a control event (source id -8, docs/wire-format.md) written into the
window in which the source was set aside, and into the first window after a heal:
canonical JSON ``{"fix":..,"reason":..,"scn":X,"source":S,"state":"quarantined"}`` or
``{"source":S,"state":"healed"}``. It travels with the windows, so a chained relay or a
cluster follower, which copies windows, learns of the quarantine (and of its heal)
from its upstream and records it too. Consumers ignore it (an unknown control event).

Everything here is pure except the two file classes (``QuarantineStore`` for the main
process, ``QuarantineView`` for worker processes, which read the file).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from databus._fileio import write_atomically
from databus._json import loads_bounded
from databus._redact import redact
from databus.errors import EventFormatError, NotQuarantinedError, SourceQuarantinedError
from databus.event import QUARANTINE_SOURCE_ID, EventHeader, encode_control
from databus.fetchers._api import SourceFailure

__all__ = ["QUARANTINE_FILENAME", "Quarantine", "QuarantineMarker", "QuarantineStore",
           "QuarantineView", "decode_quarantine_marker", "encode_quarantine_marker"]

log = logging.getLogger("databus.relay.quarantine")

QUARANTINE_FILENAME = "quarantine.json"
_VERSION = 1
_MAX_TEXT = 2000  # reason and fix are shown to people: bounded


def _text(value: str) -> str:
    return value if len(value) <= _MAX_TEXT else value[:_MAX_TEXT - 3] + "..."


@dataclass(frozen=True, slots=True)
class Quarantine:
    """One quarantined source of one buffer."""

    buffer: str
    source: str
    scn: int  # the window in which the failure was met: its events from there are out
    reason: str
    fix: str
    since: float  # time.time() when it was set aside
    marker_scn: int | None = None
    healing: bool = False
    heal_dump: str | None = None  # the heal's dump, once recorded ("": none needed)
    heal_marked: bool = False  # the heal marker landed in a window

    def to_json(self) -> dict[str, Any]:
        """As ``/v1/status`` lists it under the buffer's ``quarantined``."""
        return {"source": self.source, "scn": self.scn, "reason": self.reason,
                "fix": self.fix, "since": self.since}

    def to_record(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "source": self.source, "scn": self.scn,
                "reason": self.reason, "fix": self.fix, "since": self.since,
                "marker_scn": self.marker_scn, "healing": self.healing,
                "heal_dump": self.heal_dump, "heal_marked": self.heal_marked}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Quarantine:
        buffer, source, scn = record["buffer"], record["source"], record["scn"]
        marker, dump = record.get("marker_scn"), record.get("heal_dump")
        if not (isinstance(buffer, str) and isinstance(source, str) and buffer and source
                and isinstance(scn, int) and not isinstance(scn, bool)
                and (marker is None or isinstance(marker, int))
                and (dump is None or isinstance(dump, str))):
            raise ValueError("bad quarantine record")
        return cls(buffer, source, scn, str(record.get("reason", "")),
                   str(record.get("fix", "")), float(record.get("since", 0.0)),
                   marker, bool(record.get("healing", False)), dump,
                   bool(record.get("heal_marked", False)))

    def error(self) -> SourceQuarantinedError:
        """What a consumer of this source gets (in-band, or as a poll's JSON error):
        retriable, the quarantine ends with ``databus relay heal``."""
        return SourceQuarantinedError(
            f"source {self.source} is quarantined at SCN {self.scn}: {self.reason}",
            source=self.source, scn=self.scn, reason=self.reason, fix=self.fix,
            retriable=True)

    def log_line(self) -> str:
        return (f"buffer {self.buffer}: source {self.source} QUARANTINED at SCN {self.scn} "
                f"(its changes from there are not captured; the other sources go on): "
                f"{self.reason}. Fix: {self.fix}")


# -- the marker -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuarantineMarker:
    """A decoded quarantine marker: ``state`` "quarantined" (with scn, reason, fix) or
    "healed"."""

    source: str
    state: Literal["quarantined", "healed"]
    scn: int | None = None
    reason: str = ""
    fix: str = ""


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def encode_quarantine_marker(*, window_scn: int, marker: QuarantineMarker,
                             timestamp_ns: int = 0, partition_id: int = 0) -> bytes:
    """The marker as a control event of window ``window_scn``."""
    doc: dict[str, Any] = {"source": marker.source, "state": marker.state}
    if marker.state == "quarantined":
        doc.update(scn=marker.scn, reason=marker.reason, fix=marker.fix)
    return encode_control(scn=window_scn, source_id=QUARANTINE_SOURCE_ID,
                          payload=_canonical(doc), timestamp_ns=timestamp_ns,
                          partition_id=partition_id)


def decode_quarantine_marker(header: EventHeader, payload: bytes | memoryview) -> QuarantineMarker:
    """The marker in ``payload`` (a -8 control event's value), checked strictly."""
    if header.source_id != QUARANTINE_SOURCE_ID:
        raise EventFormatError("not a quarantine marker", reason="bad field")
    try:
        data = loads_bounded(bytes(payload), max_chars=16384, max_depth=2)
    except ValueError:
        raise EventFormatError("quarantine marker is not JSON", reason="bad value") from None
    if not isinstance(data, dict) or _canonical(data) != bytes(payload):
        raise EventFormatError("quarantine marker is not canonical JSON", reason="bad value")
    source, state = data.get("source"), data.get("state")
    if not isinstance(source, str) or not source:
        raise EventFormatError("quarantine marker source", reason="bad value")
    if state == "healed" and set(data) == {"source", "state"}:
        return QuarantineMarker(source, "healed")
    scn, reason, fix = data.get("scn"), data.get("reason"), data.get("fix")
    if (state != "quarantined" or set(data) != {"source", "state", "scn", "reason", "fix"}
            or not isinstance(scn, int) or isinstance(scn, bool)
            or not isinstance(reason, str) or not isinstance(fix, str)):
        raise EventFormatError("quarantine marker fields", reason="bad value")
    return QuarantineMarker(source, "quarantined", scn, reason, fix)


# -- the file -------------------------------------------------------------------------

_EMPTY: dict[str, Quarantine] = {}


def _by_buffer(records: Iterable[Quarantine]) -> dict[str, dict[str, Quarantine]]:
    """Active (not healing) records by buffer, then by source."""
    out: dict[str, dict[str, Quarantine]] = {}
    for r in records:
        if not r.healing:
            out.setdefault(r.buffer, {})[r.source] = r
    return out



def _load(path: Path) -> list[Quarantine]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("version") != _VERSION:
        raise ValueError(f"{path}: not a version {_VERSION} quarantine file")
    return [Quarantine.from_record(r) for r in doc["quarantined"]]


class QuarantineStore:
    """The main process's quarantined sources, kept in ``quarantine.json`` (thread-safe:
    fetcher threads add, the HTTP thread heals)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            records = _load(path)
        except (ValueError, KeyError, TypeError) as exc:
            # Never guessed at: a quarantine forgotten would serve a source with a hole.
            from databus.errors import ConfigError

            raise ConfigError(f"{path} is damaged ({exc}); restore it or, if every "
                              "quarantine in it was healed, remove it") from None
        self._records: dict[tuple[str, str], Quarantine] = {
            (r.buffer, r.source): r for r in records}
        self.generation = 0  # bumped at each change (caches of ids key on it)
        # Per buffer, its active records: read on every stream read, so built once per
        # change (replaced whole: readers need no lock).
        self._active: dict[str, dict[str, Quarantine]] = _by_buffer(records)

    def _commit(self, records: dict[tuple[str, str], Quarantine]) -> None:
        """Write ``records`` (durably), then make them the store's: a failed write
        changes nothing, so the caller's retry records it again."""
        doc = {"version": _VERSION, "quarantined": [r.to_record() for r in records.values()]}
        write_atomically(self.path, json.dumps(doc, indent=1).encode())
        self._records = records
        self._active = _by_buffer(records.values())
        self.generation += 1

    def _with(self, key: tuple[str, str], record: Quarantine | None) -> None:
        records = dict(self._records)
        if record is None:
            records.pop(key, None)
        else:
            records[key] = record
        self._commit(records)

    def add(self, buffer: str, failure: SourceFailure, *, marker_scn: int | None = None
            ) -> Quarantine | None:
        """Record ``failure`` (durably, before returning); None when the source is in
        quarantine already (the first failure stands)."""
        with self._lock:
            old = self._records.get((buffer, failure.source))
            if old is not None and not old.healing:
                return None
            record = Quarantine(buffer, failure.source, failure.scn,
                                _text(redact(failure.reason)), _text(redact(failure.fix)),
                                time.time(), marker_scn)
            self._with((buffer, failure.source), record)
            return record

    def marked(self, buffer: str, source: str, scn: int) -> None:
        """The record's marker landed in window ``scn``."""
        with self._lock:
            record = self._records.get((buffer, source))
            if record is not None and record.marker_scn is None and not record.healing:
                self._with((buffer, source), replace(record, marker_scn=scn))

    def begin_heal(self, buffer: str, source: str) -> Quarantine:
        """Lift the quarantine of ``source`` (``NotQuarantinedError`` when it is not in
        one): kept, marked healing, until ``heal_step`` says its dump is recorded and its
        heal marker landed."""
        with self._lock:
            record = self._records.get((buffer, source))
            if record is None or record.healing:
                raise NotQuarantinedError(f"source {source} is not quarantined")
            record = replace(record, healing=True)
            self._with((buffer, source), record)
            return record

    def heal_step(self, buffer: str, source: str, *, dump: str | None = None,
                  marked: bool = False) -> None:
        """A step of a heal done: its dump recorded (``dump``: the id, ``""`` for none
        needed) or its marker landed (``marked``); the record goes once both are."""
        with self._lock:
            record = self._records.get((buffer, source))
            if record is None or not record.healing:
                return
            record = replace(record, heal_dump=record.heal_dump if dump is None else dump,
                             heal_marked=record.heal_marked or marked)
            done = record.heal_dump is not None and record.heal_marked
            self._with((buffer, source), None if done else record)

    def remove(self, buffer: str, source: str) -> None:
        with self._lock:
            if (buffer, source) in self._records:
                self._with((buffer, source), None)

    def active(self, buffer: str) -> dict[str, Quarantine]:
        """The sources of ``buffer`` in quarantine now, by name (do not change it)."""
        return self._active.get(buffer, _EMPTY)

    def unmarked(self, buffer: str) -> list[Quarantine]:
        """Active records of ``buffer`` whose marker has not landed yet."""
        return [r for r in self.active(buffer).values() if r.marker_scn is None]

    def healing(self) -> list[Quarantine]:
        """Records whose heal was begun but not finished (a crash in between)."""
        with self._lock:
            return [r for r in self._records.values() if r.healing]


class QuarantineView:
    """A worker process's read-only view of ``quarantine.json``: read again when the
    file changed (``refresh``, on each wake-up from the main process)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._active: dict[str, dict[str, Quarantine]] = {}
        self.refresh()

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._active = None, {}
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            self._active = _by_buffer(_load(self.path))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("reading %s: %s (keeping what was read before)", self.path, exc)
            return
        self._stamp = stamp

    def active(self, buffer: str) -> dict[str, Quarantine]:
        return self._active.get(buffer, _EMPTY)
