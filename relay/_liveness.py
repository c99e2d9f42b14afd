"""Whether windows can still come: the main process's liveness stamp, read by its
workers (docs/relay.md, "Workers", "When the main process stops answering").

A worker serves from the buffer files on its own, so it stays responsive while the main
process, which holds every buffer's writer, is stopped (SIGSTOP, a debugger, a swapped
out or frozen VM). Its streams' heartbeats then promised windows that could not come,
and consumers stayed on a relay whose leadership had passed to another member.

So the main process stamps a small shared file, ``data_dir/relay.live``, from its event
loop every ``STAMP_INTERVAL_S``; a worker reads the stamp before it tells a consumer that
nothing is new (a heartbeat, an empty long poll), before it forwards a request and on
``/healthz`` and ``/readyz``. A stamp older than ``stale_after_s`` means the main process
stopped answering: the worker ends its idle streams with an in-band ``unavailable``
error event, answers long polls at the tail, forwarded requests, ``/healthz`` and
``/readyz`` with 503, and the consumers fail over. Windows a consumer has not read yet
are still served (they are in the file, and reads check that they were not torn).

Layout (little-endian, 40 bytes)::

    0   8s  magic  b"DBLIVE01"
    8   I   pid of the main process
    12  I   flags: 1 = the relay is out of its ZooKeeper session (``session_judge``)
    16  q   stamp: CLOCK_MONOTONIC nanoseconds (system-wide: comparable across processes)
    24  q   the same stamp again, written second: a reader that sees two different
            values read during a write and reads again
    32  d   stale_after_s the main process applies (informational)

The same goes for a cluster member out of its ZooKeeper session: disconnected for
longer than its session timeout, its session is gone (another member leads, or is about
to; as a leader its lease ran out, as a follower it may follow one that no longer
leads). Its main process then answers as a worker with a stale stamp does, with
``session_lost``, and sets a flag in the stamp so its workers do too.

The rules themselves (``judge``, ``session_judge``) are pure functions of the stamp's
age and of the time out of session.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from databus.errors import DatabusError

__all__ = [
    "LIVE_FILENAME",
    "MIN_STALE_S",
    "SESSION_LOST",
    "STALE_S",
    "STAMP_INTERVAL_S",
    "MainUnavailable",
    "SessionLostError",
    "Stamp",
    "StampReader",
    "StampWriter",
    "judge",
    "session_judge",
    "stale_after_s",
]

LIVE_FILENAME = "relay.live"
# How often the main process stamps (from its event loop).
STAMP_INTERVAL_S = 0.25
# The oldest stamp a worker trusts on a relay outside a cluster: under a second of
# missed stamps is a busy loop, not a stopped process; a consumer of a single-process
# relay notices one stopped in 5 s (five missed 1 s heartbeats).
STALE_S = 3.0
# Four stamps: a shorter bound would take a busy loop for a stopped one.
MIN_STALE_S = 4 * STAMP_INTERVAL_S

_MAGIC = b"DBLIVE01"
_LAYOUT = struct.Struct("<8sIIqqd")
_SIZE = _LAYOUT.size
SESSION_LOST = 1


class MainUnavailable(DatabusError):
    """This relay's main process, which holds the buffers' writers, is not answering
    (stopped, restarting or stopping): a worker cannot promise new windows nor answer
    for it; retry here later or on another relay."""

    code = "unavailable"
    http_status = 503
    retriable = True


class SessionLostError(DatabusError):
    """This relay, a cluster member, has been out of its ZooKeeper session for longer
    than the session timeout: it cannot lead, nor know whom to follow, so it promises no
    new window; retry on another relay."""

    code = "session_lost"
    http_status = 503
    retriable = True


def session_judge(disconnected_s: float, session_timeout_s: float) -> SessionLostError | None:
    """None while a cluster member may still be in its session: connected, or
    disconnected for at most its session timeout (the session survives a reconnect
    within it)."""
    if disconnected_s <= session_timeout_s:
        return None
    return SessionLostError(
        f"this relay has been disconnected from ZooKeeper for {disconnected_s:.1f} s "
        f"(more than its session timeout, {session_timeout_s:g} s): its session is over, "
        "so no new window can be promised from it; retry on another relay")


def stale_after_s(session_timeout_s: float | None) -> float:
    """How old a stamp may be before a worker says the main process stopped answering:
    ``STALE_S``, or half the ZooKeeper session timeout when that is shorter, but never
    under ``MIN_STALE_S``. Half the session is a leader's lease
    (relay/cluster/_member.py): a main process silent that long can no longer append,
    and another member is about to lead."""
    if session_timeout_s is None:
        return STALE_S
    return max(MIN_STALE_S, min(STALE_S, session_timeout_s / 2))


@dataclass(frozen=True, slots=True)
class Stamp:
    pid: int
    monotonic_ns: int
    stale_after_s: float
    flags: int = 0


def judge(stamp: Stamp | None, *, now_ns: int, main_pid: int,
          stale_after_s: float) -> MainUnavailable | SessionLostError | None:
    """None while the main process ``main_pid`` answers; else why not. A missing stamp,
    or one of another process (a relay that ran before on this data dir), counts as not
    answering; so does one older than ``stale_after_s``. A fresh stamp with the
    ``SESSION_LOST`` flag: the main process's own verdict."""
    if stamp is None or stamp.pid != main_pid:
        return MainUnavailable(f"this relay's main process (pid {main_pid}) has not "
                               "started answering; retry")
    age_s = (now_ns - stamp.monotonic_ns) / 1e9
    if age_s > stale_after_s:
        return MainUnavailable(
            f"this relay's main process (pid {main_pid}) has not answered for "
            f"{age_s:.1f} s (more than {stale_after_s:g} s): no new window can come "
            "from this relay now; retry here later or on another relay")
    if stamp.flags & SESSION_LOST:
        return SessionLostError("this relay is out of its ZooKeeper session: no new "
                                "window can be promised from it; retry on another relay")
    return None


class StampWriter:
    """The main process's side: creates (or takes over) the file and stamps it."""

    def __init__(self, data_dir: Path, stale_after: float) -> None:
        self.path = data_dir / LIVE_FILENAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, _SIZE)
            self._map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        self._pid = os.getpid()
        self._stale_after = stale_after
        self.stamp()

    def stamp(self, flags: int = 0, now_ns: int | None = None) -> None:
        now = time.monotonic_ns() if now_ns is None else now_ns
        _LAYOUT.pack_into(self._map, 0, _MAGIC, self._pid, flags, now, now,
                          self._stale_after)

    def close(self) -> None:
        self._map.close()


class StampReader:
    """A worker's side: the file mapped read-only."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LIVE_FILENAME
        self._map: mmap.mmap | None = None

    def read(self) -> Stamp | None:
        """The current stamp; None when there is none (yet)."""
        if self._map is None:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            try:
                if os.fstat(fd).st_size < _SIZE:
                    return None
                self._map = mmap.mmap(fd, _SIZE, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
        for _ in range(3):
            magic, pid, flags, first, second, stale = _LAYOUT.unpack_from(self._map, 0)
            if magic != _MAGIC:
                return None
            if first == second:
                break
        # Written under us each time: the older of the two is a stamp it did write.
        return Stamp(pid, min(first, second), stale, flags)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
