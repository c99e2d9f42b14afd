"""One consumer decoding and dispatching 2.5 KB events from a prefilled relay, as ratios
of raw fastavro decoding of the same records and of a Redis Streams consumer reading
the same payloads, all in the same run (issues 6 and 14).

    .venv/bin/python benchmarks/client_throughput.py [--events 40000] [--repeat 3]
        [--no-redis]

The relay is a ``databus relay`` process prefilled by the synthetic fetcher. The client
(``DatabusClient``, one no-op consumer, default options: checkpoint after every window
to a memory store) pulls everything: HTTP, CRC and window checks, Avro decode, the
dispatcher and the callbacks. References, each on the same value bytes:

- raw fastavro: ``fastavro.schemaless_reader`` in a loop (no I/O);
- the peer: a ``redis-server`` (Debian's, started here on a free port, nothing on
  disk) holding the same payloads in one stream, read by redis-py with hiredis
  (``XREAD COUNT 1000`` until all are read) with a no-op callback per entry, and again
  decoding each payload with fastavro (what a consumer of Avro payloads does; the
  DatabusClient always decodes).

Goals (issue 14): DatabusClient >= 1.0x the Redis consumer's events/s with 20 events
per window and >= 0.5x with one; >= 0.5 of raw fastavro decode with 20 per window.
``make bench-deps`` installs redis-py and hiredis.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import time
import urllib.request

from _relay_proc import RedisServer, RelayProcess, code_version, loadavg
from fastavro import schemaless_reader

from databus.client import Consumer, DatabusClient, DataEvent, MemoryCheckpointStore, Window
from databus.event import iter_events
from databus.schemas import Schema


class Counter(Consumer):
    def __init__(self, target: int) -> None:
        self.events = 0
        self.target = target
        self.client: DatabusClient | None = None

    decode = True

    def on_data_event(self, event: DataEvent) -> None:
        if self.decode:
            event.value  # noqa: B018  (decodes it)
        self.events += 1

    def on_end_data_event_sequence(self, scn: int) -> None:
        if scn >= self.target and self.client is not None:
            self.client.stop()


class WindowCounter(Consumer):
    """The batch API: one call per whole window."""

    def __init__(self, target: int) -> None:
        self.events = 0
        self.target = target
        self.client: DatabusClient | None = None

    decode = False

    def on_window(self, window: Window) -> None:
        if self.decode:
            for e in window.events:
                e.value  # noqa: B018  (decodes it)
        self.events += len(window.events)
        if window.scn >= self.target and self.client is not None:
            self.client.stop()


class EventsCounter(Consumer):
    """The batch API: one call per response's whole windows."""

    def __init__(self, target: int) -> None:
        self.events = 0
        self.target = target
        self.client: DatabusClient | None = None

    decode = False

    def on_events(self, events: list[DataEvent]) -> None:
        if self.decode:
            for e in events:
                e.value  # noqa: B018  (decodes it)
        self.events += len(events)
        if events and events[-1].scn >= self.target and self.client is not None:
            self.client.stop()


APIS = {"callbacks": Counter, "on_window": WindowCounter, "on_events": EventsCounter}


def client_rate(url: str, windows: int, events: int, api: str = "on_window",
                decode: bool = False, sources: tuple[str, ...] | None = None) -> float:
    counter = APIS[api](windows)
    counter.decode = decode  # type: ignore[attr-defined]
    client = DatabusClient([url], sources=list(sources) if sources else (),
                           checkpoint_store=MemoryCheckpointStore(),
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


def redis_fill(port: int, values: list[bytes], events: int) -> None:
    import redis

    r = redis.Redis(port=port)
    r.delete("bench")
    pipe = r.pipeline(transaction=False)
    for i in range(events):
        pipe.xadd("bench", {"v": values[i % len(values)]})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    assert r.xlen("bench") == events


def redis_rate(port: int, events: int, schema: Schema | None) -> float:
    """Events/s of one redis-py (hiredis) consumer: XREAD 1000 at a time, a callback
    per entry (decoding the payload with fastavro when ``schema`` is given)."""
    import redis
    from redis.utils import HIREDIS_AVAILABLE

    assert HIREDIS_AVAILABLE, "pip install hiredis (make bench-deps): the peer uses it"
    r = redis.Redis(port=port)
    parsed = schema.parsed if schema is not None else None
    seen = 0

    def on_entry(fields: dict[bytes, bytes]) -> None:
        nonlocal seen
        if parsed is not None:
            schemaless_reader(io.BytesIO(fields[b"v"]), parsed, None)
        seen += 1

    last = "0"
    start = time.perf_counter()
    while seen < events:
        reply = r.xread({"bench": last}, count=1000)
        for _stream, entries in reply:
            for _entry_id, fields in entries:
                on_entry(fields)
            last = entries[-1][0]
    elapsed = time.perf_counter() - start
    assert seen == events
    return events / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--events-per-window", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--apis", nargs="+", default=["callbacks", "on_window", "on_events"],
                        choices=sorted(APIS))
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis peer")
    args = parser.parse_args()
    from databus import batch

    print(f"# client throughput: {args.events} events of 2500 bytes, best of {args.repeat}; "
          f"event core {batch.IMPLEMENTATION}; {code_version()}; {loadavg()}")
    print("# 'values read': the consumer reads every event.value (decoding it); "
          "'keys only': it does not (values are checked, never decoded)")
    print("| events per window | API | values | DatabusClient, events/s "
          "| raw fastavro decode | Redis consumer | Redis + fastavro decode "
          "| ÷ Redis | ÷ Redis + decode |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for per_window in args.events_per_window:
        windows = args.events // per_window
        source = (f"synthetic://?rate=0&keys=100000&event_bytes=2500"
                  f"&events_per_window={per_window}&limit={windows}&seed=3")
        # Room for every event twice over: an evicted window would be lost to the count.
        capacity = max(64, args.events * 2 * 2700 // (1 << 20) + 16)
        ours: dict[tuple[str, bool], float] = {}
        with RelayProcess(source, capacity) as relay:
            relay.wait_for_scn(windows)
            values, schema = raw_values(relay.url)  # the first 64 MiB: a sample is enough
            events = windows * per_window
            for api in args.apis:
                for decode in (True, False):
                    if api == "callbacks" and not decode:
                        continue  # the callback consumer above never reads values
                    ours[(api, decode)] = max(
                        client_rate(relay.url, windows, events, api, decode)
                        for _ in range(args.repeat))
            raw = max(fastavro_rate(values, schema) for _ in range(args.repeat))
        peer = peer_decode = float("nan")
        if not args.no_redis:
            with RedisServer() as server:
                redis_fill(server.port, values, events)
                peer = max(redis_rate(server.port, events, None) for _ in range(args.repeat))
                peer_decode = max(redis_rate(server.port, events, schema)
                                  for _ in range(args.repeat))
        for (api, decode), rate in ours.items():
            print(f"| {per_window} | {api} | {'read' if decode else 'keys only'} "
                  f"| {rate:,.0f} | {raw:,.0f} | {peer:,.0f} | {peer_decode:,.0f} "
                  f"| {rate / peer:.2f} | {rate / peer_decode:.2f} |")


if __name__ == "__main__":
    main()
