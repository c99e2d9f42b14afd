"""``databus relay --config relay.toml``: run a relay until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import socket

from databus._event_loop import choose as choose_event_loop
from databus._serving import run_app
from databus.config import load_config, redact_uri
from databus.errors import ConfigError

log = logging.getLogger("databus.relay")

# In the data dir: held by the relay running on it (databus/_hold.py).
LOCK_FILENAME = "relay.lock"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("relay", help="run a relay (buffers, fetchers, HTTP API)")
    parser.add_argument("--config", required=True, help="TOML file with a [relay] section")
    parser.add_argument("--host", help="override relay.host")
    parser.add_argument("--port", type=int, help="override relay.port")
    # How the main process starts a worker (relay/_workers.py); not for people.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from databus._hold import hold
    from databus._serving import listen_sockets
    from databus.relay._relay import Relay
    from databus.relay._server import create_app

    config = load_config(args.config).relay
    if config is None:
        raise ConfigError(f"{args.config}: no [relay] section")
    if args.worker is not None:
        from databus.relay._worker import run_worker

        return run_worker(config, args.worker)
    host = args.host or config.host
    port = config.port if args.port is None else args.port
    # Chosen before anything is opened: a config asking for a missing uvloop fails here.
    loop = choose_event_loop(config.event_loop, "relay.event_loop")
    # Safe start (DESIGN 17): the port first, then the data dir, before any file in it
    # is opened and before the fetchers, the cluster's lease or the workers start. A
    # second relay on a used port or a held data dir fails in one line and touches
    # nothing of the first.
    processes = config.serving_processes
    listeners = None
    sockets: list[socket.socket] = []
    if processes > 1:
        from databus.relay._workers import Listeners

        listeners = Listeners(host, port)
    else:
        sockets = listen_sockets(host, port)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    held = hold(config.data_dir / LOCK_FILENAME, f"relay data dir {config.data_dir}",
                "another relay runs on it: stop that one first, or give this one another "
                "relay.data_dir")
    try:
        relay = Relay(config)
        for buffer in config.buffers:
            log.info("buffer %s (%d MiB) <- %s", buffer.name, buffer.capacity_mb,
                     redact_uri(buffer.source))
        # databus._serving, not web.run_app: connection limits, timeouts, JSON errors.
        log.info("event loop: %s", loop.describe())
        app = create_app(relay)
        unix_path = None
        if listeners is not None:
            from databus.relay._workers import enable_workers

            log.info("serving from %d processes (relay.workers)", processes)
            sockets, unix_path = enable_workers(
                app, relay, count=processes - 1, config_path=os.path.abspath(args.config),
                host=host, port=port, log_level=args.log_level, listeners=listeners)
        got = run_app(app, host=host, port=port, loop_factory=loop.factory,
                      sockets=sockets, unix_path=unix_path,
                      on_listen=lambda h, p: log.info("relay listening on http://%s:%d",
                                                      h, p))
        log.info("relay stopped (%s)", got)
    finally:
        held.release()
    return 0
