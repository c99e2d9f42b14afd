"""Waiting in a kazoo Lock on a member's session, and holding it (one thread).

The relay's per-buffer elections and the bootstrap's per-component locks are the same
loop: wait until connected, queue in the Lock (identifier: the member's URL, which
``Lock.contenders()`` shows), run ``hold(session)`` while holding it (it returns when
the term is over: session lost, fenced, stopping), then ``on_end()`` and release, and
queue again. ``cancel`` ends a wait in the queue (shutdown).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from databus._limited_log import limited
from databus.coordination._member import ZooKeeperMember
from databus.errors import DatabusError

__all__ = ["LockContender"]

log = logging.getLogger("databus.coordination")


class LockContender:
    def __init__(self, member: ZooKeeperMember, lock_path: str, name: str,
                 hold: Callable[[int | None], None], on_end: Callable[[], None]) -> None:
        self.member = member
        self.lock_path = lock_path
        self.name = name
        self.hold = hold
        self.on_end = on_end
        self.lock: Any = None  # the kazoo Lock of the current round
        self._thread: threading.Thread | None = None

    @property
    def holding_node(self) -> str | None:
        """The path of our node in the Lock while we hold it."""
        lock = self.lock
        if lock is None or not lock.is_acquired or not lock.node:
            return None
        return f"{self.lock_path}/{lock.node}"

    def start(self, thread_name: str) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name=thread_name)
        self._thread.start()

    def cancel(self) -> None:
        lock = self.lock
        if lock is not None:
            lock.cancel()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        from kazoo.exceptions import CancelledError, KazooException

        member = self.member
        while not member.stopping.is_set():
            if not member.connected.wait(0.2):
                continue
            session = member.session_id()
            try:
                self.lock = member.client.Lock(self.lock_path, identifier=member.url)
                if not self.lock.acquire(blocking=True):
                    continue
                if member.stopping.is_set():
                    break
                self.hold(session)
            except CancelledError:
                continue
            except (KazooException, DatabusError, OSError, TimeoutError) as exc:
                limited(log).warning("%s: lock round failed: %s", self.name, exc, kind=self.name)
                time.sleep(0.5)
            finally:
                self.on_end()
                lock, self.lock = self.lock, None
                if lock is not None:
                    try:
                        lock.release()
                    except Exception:  # the session may be gone with the node
                        log.debug("lock release of %s failed", self.name, exc_info=True)
