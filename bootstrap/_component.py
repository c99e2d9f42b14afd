"""What the producer and the applier share: each owns one background task, started by
``start()`` and cancelled, then awaited, by ``close()`` (so nothing outlives it), and a
status for /v1/status with how its last failure went.

Each start takes a new fencing token for the component from the store (``fence``,
before anything is read) and presents it with every write: a component started later,
in this process or another one on the same store, makes this one's writes fail with
``FencedError`` (its state becomes "fenced"). A cluster member (bootstrap/_cluster.py)
adds a ``guard``, its lease, checked before each commit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from databus._limited_log import limited
from databus._redact import redact
from databus.bootstrap._storage import BootstrapStorage, Fence, FencedError


@dataclass
class ComponentStatus:
    """Fields every component reports; subclasses add their own progress counters."""

    state: str = "starting"
    errors: int = 0
    last_error: str | None = None
    started_at: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return max(1e-9, time.monotonic() - self.started_at)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "errors": self.errors, "last_error": self.last_error}


class BackgroundComponent(ABC):
    task_name = "databus-component"
    component = ""  # "producer" | "applier": whose fencing token it takes
    status: ComponentStatus
    log: logging.Logger
    storage: BootstrapStorage

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self.fence: Fence | None = None  # taken by the task when it starts
        self.guard: Callable[[], None] | None = None  # a cluster member's lease check

    def start(self) -> None:
        self.fence = None
        self.status.state = "starting"
        self._task = asyncio.create_task(self._run(), name=self.task_name)

    @property
    def running(self) -> bool:
        """Started, and its task has not ended."""
        return self._task is not None and not self._task.done()

    async def take_fence(self) -> Fence:
        """This start's fencing token (once per start: a retry keeps it)."""
        if self.fence is None:
            token = await asyncio.to_thread(self.storage.take_fence, self.component)
            self.fence = Fence(self.component, token, self.guard)
            self.log.info("%s: fencing token %d", self.component, token)
        return self.fence

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.status.state = "stopped"

    async def wait(self) -> None:
        """Until the task ends: only by ``close`` or a fatal error, raised here."""
        if self._task is not None:
            await self._task

    @abstractmethod
    async def _run(self) -> None: ...

    def _gave_up(self, exc: BaseException) -> None:
        """A non-retriable error ends the task."""
        self.status.state = "fenced" if isinstance(exc, FencedError) else "failed"
        self.status.last_error = redact(str(exc))
        self.log.error("%s stopped: %s", self.task_name, exc)

    def _retrying(self, exc: BaseException) -> None:
        self.status.errors += 1
        self.status.state = "retrying"
        self.status.last_error = redact(str(exc))
        limited(self.log).warning("%s: %s; retrying", self.task_name, exc, kind=self.task_name)
