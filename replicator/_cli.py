"""``databus replicate --config replicate.toml`` and ``databus replicate assess --config
replicate.toml [--json]`` (docs/replicator.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal

from databus.config import load_config
from databus.errors import ConfigError

log = logging.getLogger("databus.replicator")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replicate", help="keep tables in a target database equal to their source")
    parser.add_argument("action", nargs="?", choices=["run", "assess"], default="run",
                        help="run (default), or assess: report what would block it")
    parser.add_argument("--config", required=True, help="TOML file with a [replicate] section")
    parser.add_argument("--json", action="store_true", help="assess: print JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config).replicate
    if config is None:
        raise ConfigError(f"{args.config}: no [replicate] section")
    if args.action == "assess":
        from databus.replicator._assess import assess, render
        from databus.replicator.targets import open_target

        reports = asyncio.run(assess(config, open_target(config.target)))
        if args.json:
            print(json.dumps({"replication": config.name,
                              "blocking": any(r.blocking for r in reports),
                              "tables": [r.to_json() for r in reports]}, indent=2))
        else:
            print(render(reports))
        return 1 if any(r.blocking for r in reports) else 0

    from databus.replicator._replicator import Replicator

    replicator = Replicator(config)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, replicator.stop)
        await replicator.run_async()

    asyncio.run(main())
    return 0
