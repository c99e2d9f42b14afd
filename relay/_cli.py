"""``databus relay --config relay.toml``: run a relay until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging

from databus._serving import run_app
from databus.config import load_config, redact_uri
from databus.errors import ConfigError

log = logging.getLogger("databus.relay")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("relay", help="run a relay (buffers, fetchers, HTTP API)")
    parser.add_argument("--config", required=True, help="TOML file with a [relay] section")
    parser.add_argument("--host", help="override relay.host")
    parser.add_argument("--port", type=int, help="override relay.port")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from databus.relay._relay import Relay
    from databus.relay._server import create_app

    config = load_config(args.config).relay
    if config is None:
        raise ConfigError(f"{args.config}: no [relay] section")
    host = args.host or config.host
    port = config.port if args.port is None else args.port
    relay = Relay(config)
    for buffer in config.buffers:
        log.info("buffer %s (%d MiB) <- %s", buffer.name, buffer.capacity_mb,
                 redact_uri(buffer.source))
    # databus._serving, not web.run_app: connection limits, timeouts, JSON protocol errors.
    run_app(create_app(relay), host=host, port=port,
            on_listen=lambda h, p: log.info("relay listening on http://%s:%d", h, p))
    return 0
