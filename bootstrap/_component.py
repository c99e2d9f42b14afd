"""What the producer and the applier share: each owns one background task, started by
``start()`` and cancelled, then awaited, by ``close()`` (so nothing outlives it), and a
status for /v1/status with how its last failure went."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from databus._redact import redact


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
    status: ComponentStatus
    log: logging.Logger

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.task_name)

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
        self.status.state = "failed"
        self.status.last_error = redact(str(exc))
        self.log.error("%s stopped: %s", self.task_name, exc)

    def _retrying(self, exc: BaseException) -> None:
        self.status.errors += 1
        self.status.state = "retrying"
        self.status.last_error = redact(str(exc))
        self.log.warning("%s: %s; retrying", self.task_name, exc)
