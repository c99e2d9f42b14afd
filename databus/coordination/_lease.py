"""The leader's lease: how fencing works without a ZooKeeper round trip per window.

ZooKeeper ends a session ``session_timeout`` after it last heard from the client, and
only then can another member win the election and start a new epoch. The leader holds
a lease that ends ``length`` (half the session timeout) after the *sending* of the last
request ZooKeeper answered while the leader still held its epoch (``confirm``): that
request reached ZooKeeper after it was sent, so the session was alive and the epoch
current until at least then, and the lease ends well before any successor can exist.
Before each window is committed the leader checks the lease against the monotonic
clock (``valid``, no I/O). A leader paused by SIGSTOP, a long GC, or cut off from
ZooKeeper finds its lease run out when it runs again, because the monotonic clock kept
going: it commits nothing until a new confirmation, which its expired session cannot
give. The margin (the other half of the session timeout) covers the clock rates of two
machines and the time a commit takes after its check.

Pure: the clock is injected (tests drive it by hand).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Lease"]


class Lease:
    def __init__(self, length_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if length_s <= 0:
            raise ValueError("a lease needs a positive length")
        self.length_s = length_s
        self._clock = clock
        self._lock = threading.Lock()
        self._until = float("-inf")  # no lease until the first confirmation
        self._revoked = False

    def now(self) -> float:
        return self._clock()

    def confirm(self, sent_at: float) -> None:
        """ZooKeeper answered a request sent at ``sent_at`` (``now()`` then) and the
        epoch was still ours: the lease runs to ``sent_at + length``."""
        with self._lock:
            if not self._revoked:
                self._until = max(self._until, sent_at + self.length_s)

    def revoke(self) -> None:
        """The term is over (session lost, epoch moved on, shutdown): for good."""
        with self._lock:
            self._revoked = True
            self._until = float("-inf")

    def valid(self) -> bool:
        # No lock: called per event by consumer-group members. ``_until`` is one float
        # (an atomic read); ``revoke`` sets it to -inf, so a revoked lease reads invalid.
        return self._clock() < self._until

    def remaining(self) -> float:
        with self._lock:
            return max(0.0, self._until - self._clock()) if not self._revoked else 0.0
