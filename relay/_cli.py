"""``databus relay --config relay.toml``: run a relay until SIGINT/SIGTERM.

``databus relay heal --relay URL --source NAME [--token TOKEN]``: take a quarantined
source out of quarantine and dump it (DESIGN 17; ``POST /v1/admin/sources/{name}/heal``).
The admin token comes from ``--token`` or ``DATABUS_ADMIN_TOKEN``, as for ``databus
dump``; an ``https://`` relay takes ``--ca-file`` (and ``--cert-file``/``--key-file``
under mutual TLS; databus.security._client_tools). Exit 0 with what was done, 1 with
the relay's error (``not_quarantined``, ``unknown_source``, ...)."""

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
    parser.add_argument("--config", help="TOML file with a [relay] section (required to "
                        "run a relay)")
    parser.add_argument("--host", help="override relay.host")
    parser.add_argument("--port", type=int, help="override relay.port")
    # How the main process starts a worker (relay/_workers.py); not for people.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)
    actions = parser.add_subparsers(dest="relay_command", metavar="ACTION")
    heal = actions.add_parser(
        "heal", help="take a quarantined source out of quarantine and dump it")
    heal.add_argument("--relay", required=True, help="the relay's URL, e.g. "
                      "http://127.0.0.1:11190")
    heal.add_argument("--source", required=True, help="the quarantined source (db.table)")
    heal.add_argument("--token", help="admin token (default: $DATABUS_ADMIN_TOKEN)")
    from databus.security._client_tools import add_client_args

    add_client_args(heal, admin=True)
    heal.set_defaults(handler=run_heal)
    resize = actions.add_parser(
        "resize", help="change a buffer's capacity, offline, keeping every window")
    resize.add_argument("--config", required=True, dest="resize_config",
                        help="the relay's TOML file")
    resize.add_argument("--buffer", required=True, help="the buffer's name")
    resize.add_argument("--capacity-mb", required=True, type=int, help="the new capacity")
    resize.set_defaults(handler=run_resize)


def run_resize(args: argparse.Namespace) -> int:
    from databus._hold import hold
    from databus.relay._resize import resize_buffer

    config = load_config(args.resize_config).relay
    if config is None:
        raise ConfigError(f"{args.resize_config}: no [relay] section")
    # Offline: the relay holds its data dir while it runs (one line if it does).
    held = hold(config.data_dir / LOCK_FILENAME, f"relay data dir {config.data_dir}",
                "the relay runs: stop it first (a buffer is resized offline)")
    try:
        done = resize_buffer(config, args.buffer, args.capacity_mb)
    finally:
        held.release()
    scns = ("empty" if done.min_scn is None else f"SCN {done.min_scn}..{done.max_scn}")
    print(f"buffer {done.buffer}: {done.old_capacity_mb:g} MiB -> {done.new_capacity_mb} MiB, "
          f"{done.windows:,} windows kept ({scns}, {done.used_bytes:,} bytes); set "
          f"capacity_mb = {done.new_capacity_mb} for it in {args.resize_config} before "
          "starting the relay")
    return 0


def run_heal(args: argparse.Namespace) -> int:
    import urllib.parse

    from databus.relay.dumps._admin_client import TOKEN_ENV, RelayAdmin
    from databus.security._client_tools import credentials_from

    admin = RelayAdmin(args.relay, args.token or os.environ.get(TOKEN_ENV) or None,
                       timeout=30.0, credentials=credentials_from(args))
    path = f"/v1/admin/sources/{urllib.parse.quote(args.source, safe='')}/heal"
    doc = admin.request("POST", path, {}, admin=True)
    dump = doc.get("dump") or {}
    print(f"source {doc['source']} (buffer {doc['buffer']}) is out of quarantine (it was "
          f"quarantined at SCN {doc['quarantined_scn']}); its changes are captured again.")
    if dump.get("id"):
        print(f"healing dump {dump['id']} started: follow it with "
              f"databus dump status --relay {args.relay} {dump['id']}")
    if not doc.get("fetcher_restarted", True):
        print("warning: the buffer's fetcher has not started again yet; see its state "
              "in databus status")
    return 0


def run(args: argparse.Namespace) -> int:
    from databus._hold import hold
    from databus._serving import listen_sockets
    from databus.relay._relay import Relay
    from databus.relay._server import create_app

    if not args.config:
        raise ConfigError("databus relay needs --config FILE (or an action: heal)")
    config = load_config(args.config).relay
    if config is None:
        raise ConfigError(f"{args.config}: no [relay] section")
    if args.worker is not None:
        from databus.relay._worker import run_worker

        return run_worker(config, args.worker)
    host = args.host or config.host
    port = config.port if args.port is None else args.port
    from databus.relay._access import check_anonymous, tls_for

    if host != config.host:
        check_anonymous(config, host)  # relay.host was checked with the config
    # The certificate files read now: a wrong one fails here, in one line.
    ssl_context, reloader = tls_for(config)
    scheme = "https" if ssl_context is not None else "http"
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
        if reloader is not None:
            from databus.relay._server import TLS_RELOADER
            from databus.security import watch_certificates

            app[TLS_RELOADER] = reloader
            watch_certificates(app, reloader)
        unix_path = None
        if listeners is not None:
            from databus.relay._workers import enable_workers

            log.info("serving from %d processes (relay.workers)", processes)
            sockets, unix_path = enable_workers(
                app, relay, count=processes - 1, config_path=os.path.abspath(args.config),
                host=host, port=port, log_level=args.log_level, listeners=listeners)
        got = run_app(app, host=host, port=port, loop_factory=loop.factory,
                      sockets=sockets, unix_path=unix_path, ssl_context=ssl_context,
                      on_listen=lambda h, p: log.info("relay listening on %s://%s:%d",
                                                      scheme, h, p))
        log.info("relay stopped (%s)", got)
    finally:
        held.release()
    return 0
