"""The log applier: moves log rows into the snapshot, and runs retention.

Each batch is one store transaction (``BootstrapStorage.apply``): whole windows, the
newest row per key, and the applied SCN together, so a crash loses the batch and its
position together and the restarted applier does it again. When it is behind it works
back to back; when caught up it polls. Retention runs here because only the applier
knows how far the snapshot has absorbed the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from databus.bootstrap._component import BackgroundComponent, ComponentStatus
from databus.bootstrap._storage import BootstrapStorage
from databus.errors import DatabusError

log = logging.getLogger("databus.bootstrap.applier")


@dataclass
class ApplierStatus(ComponentStatus):
    applied_scn: int | None = None
    batches: int = 0
    rows: int = 0
    retention_runs: int = 0
    log_floor_scn: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "applied_scn": self.applied_scn,
                "batches": self.batches, "rows": self.rows,
                "rows_per_second": round(self.rows / self.elapsed, 1),
                "retention_runs": self.retention_runs, "log_floor_scn": self.log_floor_scn}


class LogApplier(BackgroundComponent):
    """Owns one background task (``start``/``close``)."""

    task_name = "databus-bootstrap-applier"
    component = "applier"
    log = log
    status: ApplierStatus

    def __init__(
        self,
        storage: BootstrapStorage,
        *,
        batch_rows: int = 5000,
        poll_interval: float = 0.2,
        retention_hours: float | None = None,
        retention_max_log_bytes: int | None = None,
        retention_interval: float = 60.0,
        backoff_max: float = 5.0,
    ) -> None:
        self.storage = storage
        self.batch_rows = batch_rows
        self.poll_interval = poll_interval
        self.retention_hours = retention_hours
        self.retention_max_log_bytes = retention_max_log_bytes
        self.retention_interval = retention_interval
        self.backoff_max = backoff_max
        super().__init__()
        self.status = ApplierStatus()

    def apply_available(self) -> int:
        """Apply until caught up (blocking); the number of rows applied."""
        rows = 0
        while (result := self.storage.apply(max_rows=self.batch_rows,
                                            fence=self.fence)) is not None:
            rows += result.rows
            self.status.batches += 1
            self.status.rows += result.rows
            self.status.applied_scn = result.to_scn
        return rows

    def retain(self) -> dict[str, Any]:
        """One retention pass (blocking)."""
        older = (time.time_ns() - int(self.retention_hours * 3600e9)
                 if self.retention_hours is not None else None)
        cut = self.storage.retention_cut(older_than_ns=older,
                                         max_log_bytes=self.retention_max_log_bytes)
        self.status.retention_runs += 1
        if cut is None:
            return {"cut_scn": None, "windows_dropped": 0}
        result = self.storage.retain(cut_scn=cut, fence=self.fence)
        self.status.log_floor_scn = result.log_floor_scn
        if result.windows_dropped:
            log.info("retention dropped %d windows; the log now starts after SCN %s",
                     result.windows_dropped, result.log_floor_scn)
        return {"cut_scn": cut, "windows_dropped": result.windows_dropped,
                "tombstones_purged": result.tombstones_purged,
                "log_floor_scn": result.log_floor_scn}

    @property
    def _retention_on(self) -> bool:
        return self.retention_hours is not None or self.retention_max_log_bytes is not None

    async def _run(self) -> None:
        delay = self.poll_interval
        next_retention = time.monotonic() + self.retention_interval
        self.status.state = "running"
        while True:
            try:
                await self.take_fence()
                rows = await asyncio.to_thread(self.apply_available)
                if self._retention_on and time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + self.retention_interval
                    await asyncio.to_thread(self.retain)
                self.status.state = "running"
                delay = self.poll_interval
            except asyncio.CancelledError:
                raise
            except DatabusError as exc:
                if not exc.retriable:
                    self._gave_up(exc)
                    raise
                rows = 0
                self._retrying(exc)
                delay = min(self.backoff_max, max(delay * 2, self.poll_interval))
            if not rows:
                await asyncio.sleep(delay)
