"""``databus dashboard``: the live web view of relays, bootstrap services, replicators
and, with ``--zookeeper``, the clusters and consumer groups.

::

    databus dashboard --relay URL [URL ...] [--bootstrap URL [URL ...]]
                      [--replicator URL [URL ...]] [--zookeeper HOSTS]
                      [--host H] [--port P] [--interval S] [--timeout S] [--history S]
                      [--ca-file PEM] [--cert-file PEM --key-file PEM] [--token TOKEN]

The service flags are ``databus status``'s (the same checks, the same credentials:
``--token`` or ``DATABUS_TOKEN`` is the reader token presented to the services, never
sent to the browser). It serves on ``--host`` (default 127.0.0.1: the page has no login
of its own; bind another address only behind a proxy that has) and ``--port`` (default
11195) until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from databus.errors import ConfigError

__all__ = ["DEFAULT_PORT", "register", "run"]

DEFAULT_PORT = 11195
log = logging.getLogger("databus.dashboard")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dashboard", help="a live web page of every service, the clusters and the groups",
        description="Serve one web page that shows, live, what `databus status` shows "
        "(readiness, buffers, fetchers, consumers, dumps, bootstrap services, replicators) "
        "and, with --zookeeper, the relay and bootstrap clusters and the consumer groups, "
        "with sparklines of the last minutes (docs/operations.md, \"Dashboard\").")
    from databus._status_view import add_service_args

    add_service_args(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to serve on (default %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="port to serve on (default %(default)s)")
    parser.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                        help="take a status sample every SECONDS (default %(default)g)")
    parser.add_argument("--timeout", type=float, default=2.0, metavar="SECONDS",
                        help="per request to a service (default %(default)g)")
    parser.add_argument("--history", type=float, default=600.0, metavar="SECONDS",
                        help="how far back the sparklines go (default %(default)g)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from databus._redact import register_uri
    from databus._status_view import normalize_url
    from databus.security._client_tools import check_files, credentials_from

    if not (args.relay or args.bootstrap or args.replicator or args.zookeeper):
        raise ConfigError("name at least one service: --relay URL, --bootstrap URL, "
                          "--replicator URL or --zookeeper HOSTS")
    if args.interval <= 0 or args.timeout <= 0 or args.history < 10 * args.interval:
        raise ConfigError("--interval and --timeout take a number of seconds > 0, "
                          "--history at least 10 intervals")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be between 0 and 65535, got {args.port}")
    for url in [*args.relay, *args.bootstrap, *args.replicator]:
        register_uri(url)  # before anything can print it
    relays = [normalize_url(u) for u in args.relay]
    bootstraps = [normalize_url(u) for u in args.bootstrap]
    replicators = [normalize_url(u) for u in args.replicator]
    credentials = credentials_from(args)
    check_files(credentials, [*relays, *bootstraps, *replicators])
    asyncio.run(serve(relays, bootstraps, replicators, args, credentials))
    return 0


async def serve(relays: Sequence[str], bootstraps: Sequence[str],
                replicators: Sequence[str], args: argparse.Namespace,
                credentials: Any) -> None:
    """Sample and serve until cancelled (Ctrl-C, SIGTERM)."""
    import aiohttp
    from aiohttp import web

    from databus._serving import ListenError
    from databus._status_view import collect
    from databus.dashboard._history import History
    from databus.dashboard._server import Sampler, make_app
    from databus.security import client_session

    async with client_session(credentials, limit=100,
                              timeout=aiohttp.ClientTimeout(total=None)) as session:
        def sample() -> Any:
            return collect(session, relays, bootstraps, args.timeout, replicators,
                           args.zookeeper)

        sampler = Sampler(sample, interval_s=args.interval, timeout_s=args.timeout,
                          history=History(args.history,
                                          max_points=int(args.history / args.interval) + 2))
        runner = web.AppRunner(make_app(sampler), access_log=None)
        await runner.setup()
        try:
            try:
                await web.TCPSite(runner, args.host, args.port).start()
            except OSError as exc:
                raise ListenError(f"cannot listen on {args.host}:{args.port}: "
                                  f"{exc.strerror or exc}") from None
            where = f"[{args.host}]" if ":" in args.host else args.host
            log.info("dashboard on http://%s:%d/ (%d relay(s), %d bootstrap service(s), "
                     "%d replicator(s)%s)", where, args.port, len(relays), len(bootstraps),
                     len(replicators), ", ZooKeeper" if args.zookeeper else "")
            if args.host not in ("127.0.0.1", "::1", "localhost"):
                log.warning("dashboard: serving on %s: anyone who reaches it sees the "
                            "topology (the page has no login; put it behind a proxy "
                            "that has one)", args.host)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
