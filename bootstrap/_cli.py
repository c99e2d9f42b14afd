"""``databus bootstrap --config bootstrap.toml``: run the bootstrap service until
SIGINT/SIGTERM (producer, applier and server, or the ones ``--run`` names)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import TYPE_CHECKING

from databus._event_loop import choose as choose_event_loop
from databus._serving import listen_sockets, run_app
from databus.config import load_config, redact_uri
from databus.errors import ConfigError

if TYPE_CHECKING:
    from databus.bootstrap._storage import StoreHold

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
    from databus.bootstrap._service import build_app, listener_tls, open_configured_storage

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
    # [bootstrap.tls]: a missing or wrong certificate file fails here, in one line.
    tls = listener_tls(config)
    # Safe start (DESIGN 17): the port, then the store, then this process's hold on the
    # producer and the applier, all before either takes its fencing token (when the
    # service starts). A second service started by mistake on a used port or on a store
    # whose producer or applier another one runs fails here in one line, fencing nobody.
    sockets = listen_sockets(host, port)
    holds: list[StoreHold] = []
    storage = open_configured_storage(config)
    try:
        if config.cluster is None:  # a cluster's services share the store by design
            for part in ("producer", "applier"):
                if part in config.run:
                    holds.append(storage.hold(part))
        log.info("bootstrap store %s; running %s", redact_uri(config.storage),
                 ", ".join(config.run))
        # databus._serving, not web.run_app: connection limits, timeouts, JSON errors.
        log.info("event loop: %s", loop.describe())
        app = build_app(config, storage, tls)
    except BaseException:
        for each in holds:
            each.release()
        storage.close()
        for sock in sockets:
            sock.close()
        raise
    try:
        # ssl_context: databus._serving.run_app serves HTTPS on the sockets with it.
        scheme = "https" if tls is not None else "http"
        got = run_app(app, host=host, port=port, loop_factory=loop.factory,
                      sockets=sockets, ssl_context=tls,
                      on_listen=lambda h, p: log.info("bootstrap service listening on "
                                                      "%s://%s:%d", scheme, h, p))
        log.info("bootstrap service stopped (%s)", got)
    finally:
        for each in holds:
            each.release()
    return 0
