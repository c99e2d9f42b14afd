"""``databus replicate --config replicate.toml`` and ``databus replicate assess --config
replicate.toml [--json]`` (docs/replicator.md).

The run shows the progress of a copy through the bootstrap service on stderr: the
formatting and the when are ``_progress.py``'s; this shell reads the replicator's stats
on a timer and writes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import time
from typing import TYPE_CHECKING

from databus._json import dumps as dumps_json
from databus._signals import stop_on_signals
from databus.config import ReplicateConfig, load_config
from databus.errors import ConfigError

if TYPE_CHECKING:
    from databus.replicator._assess import TableReport
    from databus.replicator._progress import ProgressPrinter
    from databus.replicator._replicator import Replicator

log = logging.getLogger("databus.replicator")

# How often a terminal line is redrawn.
_TTY_REFRESH_S = 0.5


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replicate", help="keep tables in a target database equal to their source")
    parser.add_argument("action", nargs="?", choices=["run", "assess"], default="run",
                        help="run (default), or assess: report what would block it")
    parser.add_argument("--config", required=True, help="TOML file with a [replicate] section")
    parser.add_argument("--json", action="store_true", help="assess: print JSON")
    parser.add_argument("--progress-interval", type=float, default=5.0, metavar="SECONDS",
                        help="run: when stderr is not a terminal, a progress line of a "
                        "copy through the bootstrap service at most this often (default 5)")
    parser.add_argument("--no-progress", action="store_true",
                        help="run: no progress lines on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config).replicate
    if config is None:
        raise ConfigError(f"{args.config}: no [replicate] section")
    if args.action == "assess":
        from databus.replicator._assess import render

        reports = asyncio.run(_assess(config))
        if args.json:
            print(dumps_json({"replication": config.name,
                              "blocking": any(r.blocking for r in reports),
                              "tables": [r.to_json() for r in reports]}, indent=2))
        else:
            print(render(reports))
        return 1 if any(r.blocking for r in reports) else 0

    from databus.replicator._replicator import Replicator

    replicator = Replicator(config)
    printer = None if args.no_progress else _stderr_printer(args.progress_interval)

    async def main() -> None:
        # One line, then the run ends by itself: exit status 0 (databus/_signals.py).
        remove = stop_on_signals(replicator.stop, f"replication {config.name}", log)
        showing = (asyncio.create_task(_show_progress(replicator, printer))
                   if printer is not None else None)
        try:
            await replicator.run_async()
        finally:
            remove()
            if showing is not None and printer is not None:
                showing.cancel()
                consumer = replicator.consumer
                printer.finish(consumer.stats.copy_view() if consumer is not None else None)

    asyncio.run(main())
    return 0


async def _assess(config: ReplicateConfig) -> list[TableReport]:
    """``assess``, with each table's row estimate from the bootstrap service when one is
    configured (the count the progress of the initial copy measures against)."""
    from databus.replicator._assess import assess
    from databus.replicator._status import bootstrap_rows
    from databus.replicator.targets import open_target

    rows = (await bootstrap_rows(config.bootstrap, credentials=config.credentials)
            if config.bootstrap else None)
    if config.bootstrap and rows is None:
        log.warning("no bootstrap service answered: no row estimates")
    return await assess(config, open_target(config.target), bootstrap_rows=rows)


def _stderr_printer(interval_s: float) -> ProgressPrinter:
    from databus.replicator._progress import ProgressPrinter

    stream = sys.stderr

    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    tty = stream.isatty()
    printer = ProgressPrinter(write, tty=tty, interval_s=max(interval_s, 0.1),
                              width=shutil.get_terminal_size().columns if tty else None)
    if tty:
        # A log record written to the same terminal erases the progress line first
        # (else it is glued to the line's end); the next tick draws it again.
        for handler in logging.getLogger().handlers:
            if getattr(handler, "stream", None) is stream:
                handler.addFilter(_ClearFirst(printer))
    return printer


class _ClearFirst(logging.Filter):
    def __init__(self, printer: ProgressPrinter) -> None:
        super().__init__()
        self.printer = printer

    def filter(self, record: logging.LogRecord) -> bool:
        self.printer.clear()
        return True


async def _show_progress(replicator: Replicator, printer: ProgressPrinter) -> None:
    tick = _TTY_REFRESH_S if printer.tty else min(1.0, printer.interval_s)
    while True:
        await asyncio.sleep(tick)
        consumer = replicator.consumer
        if consumer is not None:
            printer.update(consumer.stats.copy_view(), time.monotonic())
