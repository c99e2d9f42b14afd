"""``databus bootstrap --config bootstrap.toml``: run the bootstrap service until
SIGINT/SIGTERM (producer, applier and server, or the ones ``--run`` names)."""

from __future__ import annotations

import argparse
import dataclasses
import logging

from databus._event_loop import choose as choose_event_loop
from databus._serving import run_app
from databus.config import load_config, redact_uri
from databus.errors import ConfigError

log = logging.getLogger("databus.bootstrap")

_PARTS = ("producer", "applier", "server")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bootstrap", help="run the bootstrap service (log writer, log applier, server)")
    parser.add_argument("--config", required=True, help="TOML file with a [bootstrap] section")
    parser.add_argument("--run", help="comma-separated subset of producer,applier,server "
                        "(overrides bootstrap.run)")
    parser.add_argument("--host", help="override bootstrap.host")
    parser.add_argument("--port", type=int, help="override bootstrap.port")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from databus.bootstrap._service import build_app, open_configured_storage

    config = load_config(args.config).bootstrap
    if config is None:
        raise ConfigError(f"{args.config}: no [bootstrap] section")
    if args.run:
        parts = tuple(p.strip() for p in args.run.split(",") if p.strip())
        bad = [p for p in parts if p not in _PARTS]
        if bad or not parts:
            raise ConfigError(f"--run takes a subset of {','.join(_PARTS)}, got {args.run!r}")
        config = dataclasses.replace(config, run=parts)
    host = args.host or config.host
    port = config.port if args.port is None else args.port
    # Chosen before anything is opened: a config asking for a missing uvloop fails here.
    loop = choose_event_loop(config.event_loop, "bootstrap.event_loop")
    storage = open_configured_storage(config)
    log.info("bootstrap store %s; running %s", redact_uri(config.storage), ", ".join(config.run))
    # databus._serving, not web.run_app: connection limits, timeouts, JSON protocol errors.
    log.info("event loop: %s", loop.describe())
    run_app(build_app(config, storage), host=host, port=port, loop_factory=loop.factory,
            on_listen=lambda h, p: log.info("bootstrap service listening on http://%s:%d",
                                            h, p))
    return 0
