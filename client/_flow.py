"""The client's two pieces of plumbing between its pull loop and its runner: the
checkpoint writer (a thread that persists the newest committed checkpoint) and the
byte budget (flow control: bytes handed to the runner and not yet dispatched)."""

from __future__ import annotations

import asyncio
import logging
import threading

from databus.checkpoint import Checkpoint
from databus.client._checkpoint_store import CheckpointStore

__all__ = ["ByteBudget", "CheckpointWriter"]

log = logging.getLogger("databus.client")


class CheckpointWriter:
    """Persists the newest committed checkpoint from a thread of its own."""

    def __init__(self, store: CheckpointStore | None) -> None:
        self.store = store
        self._cond = threading.Condition()
        self._latest: Checkpoint | None = None
        self._written: Checkpoint | None = None
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="databus-checkpoint",
                                        daemon=True)
        if store is not None:
            self._thread.start()

    def submit(self, checkpoint: Checkpoint) -> None:
        with self._cond:
            self._latest = checkpoint
            self._cond.notify()

    def _main(self) -> None:
        assert self.store is not None
        while True:
            with self._cond:
                while self._latest is self._written and not self._closed:
                    self._cond.wait()
                if self._latest is self._written:
                    return
                # Windows committed while a write is in progress coalesce: the next
                # write takes only the newest checkpoint.
                checkpoint = self._latest
            try:
                if checkpoint is not None:
                    self.store.store(checkpoint)
            except Exception as exc:  # reported to the client loop, which stops
                log.error("checkpoint store failed: %s", exc)
                self.error = exc
            with self._cond:
                self._written = checkpoint
                self._cond.notify_all()

    def flush_and_close(self, timeout: float = 10.0) -> None:
        if self.store is None:
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)


class ByteBudget:
    """Flow control: bytes handed to the runner and not yet dispatched."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)

    def take(self, n: int) -> None:
        self.used += n

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)
        self._freed.set()

    def reset(self) -> None:
        self.used = 0
        self._freed.set()

    async def wait_for(self, n: int, pinned: int = 0) -> None:
        """Until ``n`` bytes are free, or all but ``pinned`` bytes (what the decoder
        holds, released by no one but the caller) have been dispatched."""
        while self.free < n and self.used > pinned:
            self._freed.clear()
            await self._freed.wait()
