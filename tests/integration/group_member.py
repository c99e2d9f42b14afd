"""One consumer-group member as a process of its own, for the group tests and the
group benchmark (``python -m tests.integration.group_member ...``).

It consumes the synthetic source's ``synthetic.events`` (``id`` = key, ``seq`` = the
event's number in the stream) and appends what it applies to ``--out``, one line each,
flushed at the end of every window (before its checkpoint is committed)::

    E <scn> <key> <seq> <partition>     an event applied
    A <p,p,...>                         on_partitions_assigned
    V <p,p,...>                         on_partitions_revoked
    R <scn>                             on_rollback (events after scn come again)

A member killed with SIGKILL leaves at most a torn last line, which readers skip.
``--work-us`` spins that long per event (a consumer doing work).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import IO

from databus.client import (
    CallbackResult,
    Consumer,
    DatabusClient,
    DataEvent,
    PostgresCheckpointStore,
    ZooKeeperCoordinator,
)


class Recorder(Consumer):
    def __init__(self, out: IO[str], partitions: int, work_us: float) -> None:
        self.out = out
        self.partitions = partitions
        self.work_s = work_us / 1e6
        self.lines: list[str] = []

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        if self.work_s:
            until = time.perf_counter() + self.work_s
            while time.perf_counter() < until:
                pass
        value = event.value or {}
        self.lines.append(f"E {event.scn} {value.get('id')} {value.get('seq')} "
                          f"{abs(event.partition_key) % self.partitions}\n")
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        self._flush()
        return CallbackResult.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        self.lines.clear()  # never applied
        self._write(f"R {scn}\n")
        return CallbackResult.SUCCESS

    def on_partitions_assigned(self, partitions: tuple[int, ...]) -> None:
        self._write(f"A {','.join(map(str, partitions))}\n")

    def on_partitions_revoked(self, partitions: tuple[int, ...]) -> None:
        self._write(f"V {','.join(map(str, partitions))}\n")

    def _write(self, line: str) -> None:
        self._flush()
        self.out.write(line)
        self.out.flush()

    def _flush(self) -> None:
        if self.lines:
            self.out.write("".join(self.lines))
            self.lines.clear()
            self.out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--relay", required=True)
    parser.add_argument("--zookeeper", required=True)
    parser.add_argument("--group", default="indexer")
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--work-us", type=float, default=0.0)
    parser.add_argument("--session-timeout", type=float, default=4.0)
    parser.add_argument("--source", default="synthetic.events")
    parser.add_argument("--checkpoint-dsn", default=None,
                        help="per-partition checkpoints in this PostgreSQL database")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args.out, "a", encoding="utf-8") as out:
        client = DatabusClient(
            [args.relay], sources=[args.source], group=args.group,
            coordinator=ZooKeeperCoordinator(args.zookeeper,
                                             session_timeout=args.session_timeout),
            partitions=args.partitions, client_id=args.name, backoff_max=0.5,
            checkpoint_store=(PostgresCheckpointStore(args.checkpoint_dsn, args.group)
                              if args.checkpoint_dsn else None))
        client.register(Recorder(out, args.partitions, args.work_us))
        signal.signal(signal.SIGTERM, lambda *_: client.stop())
        client.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
