"""One consumer decoding and dispatching 2.5 KB events from a prefilled relay, as a
ratio of raw fastavro decoding of the same records in the same run (issue 6).

    .venv/bin/python benchmarks/client_throughput.py [--events 40000] [--repeat 3]

The relay is a ``databus relay`` process prefilled by the synthetic fetcher. The client
(``DatabusClient``, one no-op consumer, default options: checkpoint after every window
to a memory store) pulls everything: HTTP, CRC and window checks, Avro decode, the
dispatcher and the callbacks. The reference decodes the same value bytes with
``fastavro.schemaless_reader`` in a loop. Goal: >= 0.5.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import time
import urllib.request

from _relay_proc import RelayProcess, code_version, loadavg
from fastavro import schemaless_reader

from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
from databus.event import iter_events
from databus.schemas import Schema


class Counter(Consumer):
    def __init__(self, target: int) -> None:
        self.events = 0
        self.target = target
        self.client: DatabusClient | None = None

    def on_data_event(self, event: DataEvent) -> None:
        self.events += 1

    def on_end_data_event_sequence(self, scn: int) -> None:
        if scn >= self.target and self.client is not None:
            self.client.stop()


def client_rate(url: str, windows: int, events: int) -> float:
    counter = Counter(windows)
    client = DatabusClient([url], checkpoint_store=MemoryCheckpointStore(),
                           max_request_bytes=4 << 20, max_buffered_bytes=16 << 20)
    counter.client = client
    client.register(counter)
    start = time.perf_counter()
    asyncio.run(client.run_async())
    elapsed = time.perf_counter() - start
    assert counter.events == events, (counter.events, events)
    return events / elapsed


def raw_values(url: str) -> tuple[list[bytes], Schema]:
    with urllib.request.urlopen(f"{url}/v1/stream?max_bytes=67108864", timeout=60) as resp:
        body = resp.read()
    with urllib.request.urlopen(f"{url}/v1/schemas?source=synthetic.events") as resp:
        import json

        schema = Schema(json.loads(resp.read())["versions"][0]["schema"])
    values = []
    for off, h in iter_events(body):
        if h.source_id >= 0:
            start = off + 56 + h.key_length
            values.append(body[start : off + h.total_length])
    return values, schema


def fastavro_rate(values: list[bytes], schema: Schema) -> float:
    parsed = schema.parsed
    start = time.perf_counter()
    for v in values:
        schemaless_reader(io.BytesIO(v), parsed, None)
    return len(values) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--events-per-window", type=int, nargs="+", default=[1, 20])
    args = parser.parse_args()
    print(f"# client throughput: {args.events} events of 2500 bytes, best of {args.repeat}; "
          f"{code_version()}; {loadavg()}")
    print("| events per window | raw fastavro decode, events/s | DatabusClient, events/s "
          "| ratio |")
    print("|---:|---:|---:|---:|")
    for per_window in args.events_per_window:
        windows = args.events // per_window
        source = (f"synthetic://?rate=0&keys=100000&event_bytes=2500"
                  f"&events_per_window={per_window}&limit={windows}&seed=3")
        # Room for every event twice over: an evicted window would be lost to the count.
        capacity = max(64, args.events * 2 * 2700 // (1 << 20) + 16)
        with RelayProcess(source, capacity) as relay:
            relay.wait_for_scn(windows)
            values, schema = raw_values(relay.url)  # the first 64 MiB: a sample is enough
            events = windows * per_window
            ours = max(client_rate(relay.url, windows, events) for _ in range(args.repeat))
            raw = max(fastavro_rate(values, schema) for _ in range(args.repeat))
        print(f"| {per_window} | {raw:,.0f} | {ours:,.0f} | {ours / raw:.3f} |")


if __name__ == "__main__":
    main()
