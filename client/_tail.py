"""``databus tail``: print a relay's stream as JSON lines, like kcat.

    databus tail --relay http://127.0.0.1:11190 --sources shop.orders [--from-scn N]
                 [--from-earliest] [--filter JSON] [--count N] [--exit]
                 [--client-id ID] [--no-streaming]
    databus tail --zookeeper zk1:2181,zk2:2181/chroot --cluster shop ...

``https://`` relays (DESIGN 18): ``--ca-file`` (the CA that signs their
certificates), ``--cert-file``/``--key-file`` (mutual TLS) and the reader token
``--token`` (or ``DATABUS_TOKEN``, which keeps it out of the process list). A relay
whose certificate does not verify, or that refuses the token (401, 403), ends the
command with one line naming the relay and why (exit status 1).

``--zookeeper``/``--cluster`` find the relays among the members of a relay cluster
(docs/clusters.md, "Discovery") and follow the membership while tailing; a ZooKeeper
that does not answer within ``--zookeeper-timeout`` seconds is an error at start.

Without ``--from-scn``/``--from-earliest`` it starts at the relay's newest window and
follows. One line per row change::

    {"scn": 42, "source": "shop.orders", "op": "upsert", "key": 7, "value": {...},
     "timestamp": "2026-11-22T01:02:03.456789+00:00"}

Bytes are printed as base64, decimals and dates as strings, and floats that are not
finite as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (JSON has no such
numbers; databus._json.dumps).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import sys
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, TextIO
from uuid import UUID

from databus._json import dumps
from databus._signals import stop_on_signals
from databus.checkpoint import Checkpoint
from databus.client._checkpoint_store import MemoryCheckpointStore
from databus.client._client import DatabusClient
from databus.client._consumer import CallbackResult, Consumer
from databus.client._events import DataEvent
from databus.errors import ConfigError
from databus.security._client_tools import add_client_args, credentials_from

log = logging.getLogger("databus.tail")

def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("tail", help="print a relay's events as JSON lines")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--relay", action="append",
                       help="relay URL (repeat for failover)")
    where.add_argument("--zookeeper", metavar="HOSTS",
                       help="find the relays in ZooKeeper instead: the connect string "
                            "(host:port[,host:port...][/chroot]); needs --cluster")
    parser.add_argument("--cluster", help="the relay cluster's name (with --zookeeper)")
    parser.add_argument("--zookeeper-timeout", type=float, default=10.0, metavar="S",
                        help="give up when ZooKeeper does not answer within S seconds at "
                             "start (default 10)")
    parser.add_argument("--sources", default="", help="comma-separated logical sources")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-scn", type=int, help="print windows after this SCN")
    start.add_argument("--from-earliest", action="store_true",
                       help="print everything the relay holds")
    parser.add_argument("--filter", help="server-side filter spec (JSON)")
    parser.add_argument("--count", type=int, default=0, help="exit after N events")
    parser.add_argument("--exit", action="store_true",
                        help="exit once caught up with the relay")
    parser.add_argument("--client-id",
                        help="name shown for this consumer in the relay's /v1/consumers "
                             "(default: databus-tail@HOST)")
    parser.add_argument("--no-streaming", dest="streaming", action="store_false",
                        help="long-poll the relay instead of following it with a "
                             "streaming subscription")
    add_client_args(parser)
    parser.set_defaults(handler=run)


def to_jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def event_line(event: DataEvent) -> str:
    return dumps(
        {
            "scn": event.scn,
            "source": event.source,
            "op": event.op.name.lower(),
            "key": to_jsonable(event.key),
            "value": to_jsonable(event.value),
            "timestamp": event.timestamp.isoformat(),
            **({"from_dump": True} if event.from_dump else {}),
        },
        ensure_ascii=False,
    )


def marker_line(kind: str, source: str, scn: int, outcome: str | None = None) -> str:
    """A dump marker as its own JSON line: ``{"marker": "dump_start", ...}`` (an end:
    plus ``"outcome"``)."""
    line: dict[str, object] = {"marker": kind, "source": source, "scn": scn}
    if outcome is not None:
        line["outcome"] = outcome
    return dumps(line, ensure_ascii=False)


class _Printer(Consumer):
    def __init__(self, out: TextIO, count: int) -> None:
        self.out = out
        self.remaining = count
        self.done = False
        self.scn = -1
        self.client: DatabusClient | None = None

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        if self.done:
            return CallbackResult.SUCCESS  # stopping: events already fetched are not printed
        self.out.write(event_line(event) + "\n")
        if self.remaining:
            self.remaining -= 1
            if self.remaining == 0:
                self.done = True
                if self.client is not None:
                    self.client.stop()
        return CallbackResult.SUCCESS

    def on_start_data_event_sequence(self, scn: int) -> CallbackResult:
        self.scn = scn
        return CallbackResult.SUCCESS

    def on_dump_start(self, source: str) -> CallbackResult:
        if not self.done:
            self.out.write(marker_line("dump_start", source, self.scn) + "\n")
        return CallbackResult.SUCCESS

    def on_dump_end(self, source: str, outcome: str = "done") -> CallbackResult:
        if not self.done:
            self.out.write(marker_line("dump_end", source, self.scn, outcome) + "\n")
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        self.out.flush()
        return CallbackResult.SUCCESS


async def tail(args: argparse.Namespace, out: TextIO) -> None:
    store = MemoryCheckpointStore()
    if args.from_scn is not None:
        store.store(Checkpoint(args.from_scn))
    zookeeper = getattr(args, "zookeeper", None)
    cluster = getattr(args, "cluster", None)
    if zookeeper is not None and not cluster:
        raise ConfigError("--zookeeper needs --cluster (the relay cluster's name)")
    if cluster and zookeeper is None:
        raise ConfigError("--cluster goes with --zookeeper (relay discovery)")
    discovery: dict[str, Any] = {}
    if zookeeper is not None:
        discovery = {"zookeeper": zookeeper, "cluster": cluster,
                     "zookeeper_timeout": getattr(args, "zookeeper_timeout", 10.0)}
    credentials = credentials_from(args)
    client = DatabusClient(
        args.relay or (),
        **discovery,
        sources=[s for s in args.sources.split(",") if s],
        checkpoint_store=store,
        filter=args.filter,
        start_from="earliest" if args.from_earliest else "latest",
        poll_wait_ms=200 if args.exit else 1000,
        name="databus-tail",
        # getattr: namespaces built by hand (embedders, tests) may not have it.
        client_id=getattr(args, "client_id", None),
        streaming=getattr(args, "streaming", True),
        ca_file=credentials.ca_file, cert_file=credentials.cert_file,
        key_file=credentials.key_file,
        token=credentials.token.reveal() if credentials.token is not None else None,
    )
    printer = _Printer(out, args.count)
    printer.client = client
    client.register(printer)
    # SIGINT/SIGTERM: one line, the stream ends, exit status 0 (databus/_signals.py).
    remove = stop_on_signals(client.stop, "databus tail", log)
    run = asyncio.create_task(client.run_async())
    run.add_done_callback(lambda _: remove())
    if args.exit:
        while not run.done():
            await asyncio.sleep(0.05)
            if client.metrics.caught_up:
                client.stop()
                break
    await run


def run(args: argparse.Namespace) -> int:
    try:
        asyncio.run(tail(args, sys.stdout))
    except BrokenPipeError:  # `databus tail ... | head`
        return 0
    return 0
