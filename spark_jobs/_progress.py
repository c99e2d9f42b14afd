"""Progress of a job: named phases, and inside them the Spark tasks done (rich).

Jobs report through ``Progress`` so that the library stays silent (``Progress()``)
and the command line shows a live view (``RichProgress``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Progress:
    """Silent progress (the library default)."""

    @contextlib.contextmanager
    def phase(self, description: str) -> Iterator[None]:
        yield

    def note(self, text: str) -> None:
        """A line worth keeping in the output (a decision the job made)."""


class RichProgress(Progress):
    """One progress line per phase on stderr; while a phase runs, a poller reads Spark's
    status tracker and shows the tasks of the running stages as the bar."""

    def __init__(self, spark: SparkSession | None = None, *, interval: float = 0.25) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as Bars

        self.console = Console(stderr=True)
        self.spark = spark
        self.interval = interval
        self._bars = Bars(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                          MofNCompleteColumn(), TextColumn("tasks"), TimeElapsedColumn(),
                          console=self.console, transient=False)

    def __enter__(self) -> RichProgress:
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()

    def note(self, text: str) -> None:
        self._bars.console.print(f"  [dim]{text}[/dim]")

    @contextlib.contextmanager
    def phase(self, description: str) -> Iterator[None]:
        task = self._bars.add_task(description, total=None)
        stop = threading.Event()
        poller = None
        if self.spark is not None:
            poller = threading.Thread(target=self._poll, args=(task, stop), daemon=True,
                                      name="databus-spark-progress")
            poller.start()
        try:
            yield
        finally:
            stop.set()
            if poller is not None:
                poller.join(timeout=2)
            total = self._bars.tasks[task].total
            self._bars.update(task, completed=total or 1, total=total or 1)
            self._bars.stop_task(task)

    def _poll(self, task: Any, stop: threading.Event) -> None:
        assert self.spark is not None
        tracker = self.spark.sparkContext.statusTracker()
        done_before = 0  # tasks of stages that finished while this phase ran
        seen: dict[int, tuple[int, int]] = {}
        while not stop.wait(self.interval):
            try:
                active = tracker.getActiveStageIds()
                for stage_id in active:
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        seen[stage_id] = (info.numCompletedTasks, info.numTasks)
                for stage_id in [s for s in seen if s not in active]:
                    done_before += seen.pop(stage_id)[1]
            except Exception:  # the JVM going away at the end of a job: stop polling
                return
            completed = done_before + sum(d for d, _ in seen.values())
            total = done_before + sum(t for _, t in seen.values())
            if total:
                self._bars.update(task, completed=completed, total=total)
