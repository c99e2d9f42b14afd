"""Requests per second of one relay as ``relay.workers`` grows (docs/relay.md, "Workers").

    .venv/bin/python benchmarks/relay_workers.py [--workers 1,2] [--clients 8]
        [--duration 4] [--repeat 2] [--max-bytes 4096]

Setup: a ``databus relay`` child process with ``workers = N``, one buffer prefilled by
the synthetic fetcher (``rate=0&limit=20000``, 400-byte events, one per window). Then
``--clients`` client processes each pull ``/v1/stream`` over one persistent HTTP/1.1
connection (``http.client``), from a random checkpoint, ``--max-bytes`` per request, as
fast as they can, for ``--duration`` seconds. Small bodies make each request cost what
the GIL serialises (aiohttp's parsing, the handler, the response), not copying: the case
more processes are for. Figures: requests/s summed over the clients, how many distinct
serving processes answered (``X-Databus-Worker``), the CPU the relay's processes used
(/proc/<pid>/stat) and the machine's busy cores meanwhile.

Each figure is the best of ``--repeat`` runs (other jobs on a shared machine only ever
lower one). The clients run on the same machine: with few cores they take a good part
of them, so the ceiling measured here is the machine's, not the relay's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import sys
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _relay_proc import RelayProcess, code_version, cpu_seconds, loadavg, machine_cpu

LIMIT = 20_000
SOURCE = f"synthetic://?rate=0&limit={LIMIT}&event_bytes=400&events_per_window=1&seed=4"


def client(port: int, seconds: float, max_bytes: int, seed: int,
           out: mp.Queue) -> None:  # type: ignore[type-arg]
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    done = 0
    pids: set[str] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cp = json.dumps({"window_scn": rng.randrange(1, LIMIT - 100)})
        query = urllib.parse.urlencode({"checkpoint": cp, "max_bytes": max_bytes})
        conn.request("GET", f"/v1/stream?{query}")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        pids.add(resp.getheader("X-Databus-Worker") or "main")
        done += 1
    out.put((done, sorted(pids)))


def relay_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


def run(relay: RelayProcess, clients: int, seconds: float,
        max_bytes: int) -> tuple[float, int, float, float]:
    """(requests/s, processes that answered, machine busy cores, relay busy cores)."""
    pids = [relay.pid, *(w["pid"] for w in relay.get_json("/v1/status")["workers"])]
    queue: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    procs = [mp.Process(target=client, args=(relay.port, seconds, max_bytes, i, queue))
             for i in range(clients)]
    busy0, _, total0 = machine_cpu()
    own0 = relay_cpu(pids)
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    elapsed = time.monotonic() - t0
    own = relay_cpu(pids) - own0
    busy1, _, total1 = machine_cpu()
    cores = os.cpu_count() or 1
    busy_cores = (busy1 - busy0) / max(total1 - total0, 1e-9) * cores
    answered = {pid for _, seen in results for pid in seen}
    return sum(n for n, _ in results) / elapsed, len(answered), busy_cores, own / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-bytes", type=int, default=4096)
    args = parser.parse_args()
    print(f"relay_workers: {code_version()}; {os.cpu_count()} cores; {loadavg()}")
    print(f"{args.clients} clients, max_bytes {args.max_bytes}, {args.duration:g} s, "
          f"best of {args.repeat}")
    for workers in (int(w) for w in args.workers.split(",")):
        with RelayProcess(SOURCE, 64, workers=workers) as relay:
            relay.wait_for_scn(LIMIT)
            deadline = time.monotonic() + 30
            while any(w["state"] != "running" for w in relay.get_json("/v1/status")["workers"]):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            best = max((run(relay, args.clients, args.duration, args.max_bytes)
                        for _ in range(args.repeat)), key=lambda r: r[0])
        rate, processes, busy, own = best
        print(f"workers = {workers}: {rate:8.0f} requests/s  served by {processes} "
              f"process(es); the relay used {own:.2f} cores ({rate / own:.0f} requests "
              f"per core-second), the machine {busy:.1f}")


if __name__ == "__main__":
    main()
