"""What the producer and the applier share: each owns one background task, started by
``start()`` and cancelled, then awaited, by ``close()`` (so nothing outlives it)."""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod


class BackgroundComponent(ABC):
    task_name = "databus-component"

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
        self._closed()

    async def wait(self) -> None:
        """Until the task ends: only by ``close`` or a fatal error, raised here."""
        if self._task is not None:
            await self._task

    @abstractmethod
    async def _run(self) -> None: ...

    @abstractmethod
    def _closed(self) -> None:
        """Called once the task is gone (a status update, say)."""
