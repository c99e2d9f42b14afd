"""``relay.workers``: a ``databus relay`` serving from several processes (docs/relay.md,
"Workers"), as real processes with a synthetic source.

- Requests spread over the processes (``X-Databus-Worker``), ``/v1/status`` lists the
  workers, and every endpoint answers whichever process took the connection.
- A worker killed with SIGKILL while 20 consumers pull (half polling, half streaming):
  each reconnects and resumes from its checkpoint; every window is seen, whole, in SCN
  order, every CRC checked, nothing before a checkpoint served again; the worker is
  started again and ``/v1/consumers`` counts what every process served.
- Killing the main process ends its workers; the relay restarts with workers and serves
  everything it had.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from databus.client._relay_stream import StreamFramer
from databus.relay._workers import WORKER_HEADER
from tests.relay_harness import ADMIN_TOKEN, RelayProcess, Window, parse_windows
from tests.waiting import async_wait_until, wait_until

EPW = 5
SOURCE = f"synthetic://?rate=200&events_per_window={EPW}&event_bytes=300&keys=500&seed=15"


def relay_with_workers(tmp_path: Path, workers: int) -> RelayProcess:
    relay = RelayProcess(tmp_path, {"load": SOURCE}, capacity_mb=16, workers=workers)
    text = relay.config_path.read_text().replace(
        "[relay]\n", f'[relay]\nadmin_token = "{ADMIN_TOKEN}"\n', 1)
    relay.config_path.write_text(text)
    return relay


def wait_for(relay: RelayProcess, ready: Any, timeout: float = 20) -> dict[str, Any]:
    """The first ``/v1/status`` that ``ready(status)`` accepts
    (:func:`tests.waiting.wait_until`). A connection the kernel gave a worker that is
    being killed is reset: asked again, as any client would."""
    doc: dict[str, Any] = {}

    def accepted() -> dict[str, Any] | None:
        nonlocal doc
        doc = relay.status()
        return doc if ready(doc) else None

    found = wait_until(accepted, "a /v1/status as wanted", timeout,
                       ignore=(OSError,),  # urllib's URLError too
                       diagnose=lambda: f"last status: {doc}")
    assert found is not None
    return found


def workers_running(count: int) -> Any:
    def ready(doc: dict[str, Any]) -> bool:
        workers = doc["workers"]
        return len(workers) == count and all(w["state"] == "running" for w in workers) \
            and (doc["buffers"]["load"]["max_scn"] or 0) > 50
    return ready


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_requests_spread_over_processes_and_every_endpoint_answers(tmp_path: Path) -> None:
    relay = relay_with_workers(tmp_path, workers=2)
    relay.start()
    try:
        doc = wait_for(relay, workers_running(1))
        worker_pid = doc["workers"][0]["pid"]
        main_pid = relay.proc.pid if relay.proc is not None else -1

        async def main() -> None:
            pids: set[str] = set()
            for attempt in range(200):  # a fresh connection each: either process may take it
                async with aiohttp.ClientSession() as session, session.get(
                        f"{relay.url}/v1/stream", params={"max_bytes": "100000"}) as resp:
                    assert resp.status == 200
                    parse_windows(await resp.read())
                    pids.add(resp.headers[WORKER_HEADER])
                if len(pids) == 2 and attempt >= 20:
                    break
            assert pids == {str(main_pid), str(worker_pid)}
            # Every endpoint, from both processes: their answers agree.
            for _ in range(2):
                for path, want in [("/v1/status", 200), ("/v1/consumers", 200),
                                   ("/metrics", 200), ("/v1/sources", 200),
                                   ("/v1/schemas?source=synthetic.events", 200),
                                   ("/healthz", 200), ("/v1/dumps", 200), ("/nope", 404)]:
                    answers = await every_process(relay.url, "GET", path)
                    assert {s for s, _ in answers.values()} == {want}, (path, answers)
                    if path == "/v1/sources":
                        assert len({b for _, b in answers.values()}) == 1
            flushed = await every_process(relay.url, "POST", "/v1/admin/flush",
                                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert {s for s, _ in flushed.values()} == {200}
            refused = await every_process(relay.url, "POST", "/v1/admin/flush")
            assert {json.loads(b)["error"] for _, b in refused.values()} == {"unauthorized"}
            wrong = await every_process(relay.url, "POST", "/v1/stream")
            assert {s for s, _ in wrong.values()} == {405}
            metrics = (await every_process(relay.url, "GET", "/metrics"))
            assert all(b"databus_relay_stream_events_total" in b for _, b in metrics.values())

        asyncio.run(main())
    finally:
        relay.kill(signal.SIGTERM)  # a clean stop ends the workers too
    assert not alive(worker_pid)
    log = relay.log_path.read_text()
    assert "Traceback" not in log, log


async def every_process(url: str, method: str, path: str, *,
                        headers: dict[str, str] | None = None) -> dict[str, tuple[int, bytes]]:
    """``method path`` on fresh connections until both processes answered it:
    {pid: (status, body)}."""
    out: dict[str, tuple[int, bytes]] = {}
    for _ in range(200):
        async with aiohttp.ClientSession() as session, \
                session.request(method, url + path, headers=headers) as resp:
            out[resp.headers[WORKER_HEADER]] = (resp.status, await resp.read())
        if len(out) == 2:
            return out
    raise AssertionError(f"{method} {path} reached only {sorted(out)}")


# -- a worker killed under 20 consumers --------------------------------------------------


async def listed_ids(url: str) -> list[str]:
    async with aiohttp.ClientSession() as session, \
            session.get(f"{url}/v1/consumers") as resp:
        return [c["client_id"] for c in (await resp.json())["consumers"]]


@dataclass
class Consumer:
    """Pulls with its checkpoint over one connection; when the connection breaks, it
    opens another and resumes from the checkpoint of the last body it accepted."""

    name: str
    streaming: bool
    checkpoint: str | None = None
    first_scn: int | None = None
    last_scn: int | None = None
    partial: Window | None = None  # a window a body ended inside (max_bytes)
    windows: int = 0
    served_again: int = 0
    reconnects: int = 0
    pids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def accept(self, body: bytes, checkpoint: str) -> None:
        windows = parse_windows(body)  # every CRC checked
        if self.partial is not None and windows and windows[0].scn == self.partial.scn:
            windows[0].events[:0] = self.partial.events
        self.partial = None
        for w in windows:
            if w.eow_count < 0:
                self.partial = w  # continued by the next body (its checkpoint says so)
                continue
            assert len(w.events) == w.eow_count == EPW, (self.name, w.scn)
            if self.last_scn is not None and w.scn <= self.last_scn:
                self.served_again += 1
                continue
            assert self.last_scn is None or w.scn == self.last_scn + 1, \
                (self.name, self.last_scn, w.scn)
            if self.first_scn is None:
                self.first_scn = w.scn
            self.last_scn = w.scn
            self.windows += 1
        self.checkpoint = checkpoint

    async def run(self, url: str, until: asyncio.Event) -> None:
        while not until.is_set():
            try:
                async with aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=1),
                        timeout=aiohttp.ClientTimeout(total=None, sock_read=5)) as session:
                    if self.streaming:
                        await self._stream(session, url, until)
                    else:
                        await self._poll(session, url, until)
            except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
                self.reconnects += 1
                self.errors.append(type(exc).__name__)
                await asyncio.sleep(0.05)

    def _params(self, **more: str) -> dict[str, str]:
        params = {"client_id": self.name, "max_bytes": "30000", **more}
        if self.checkpoint is not None:
            params["checkpoint"] = self.checkpoint
        return params

    async def _poll(self, session: aiohttp.ClientSession, url: str,
                    until: asyncio.Event) -> None:
        while not until.is_set():
            async with session.get(f"{url}/v1/stream",
                                   params=self._params(wait_ms="500")) as resp:
                assert resp.status == 200, await resp.text()
                body = await resp.read()
                self.pids.append(resp.headers[WORKER_HEADER])
                self.accept(body, resp.headers["X-Databus-Checkpoint"])

    async def _stream(self, session: aiohttp.ClientSession, url: str,
                      until: asyncio.Event) -> None:
        async with session.get(f"{url}/v1/stream",
                               params=self._params(follow="true", heartbeat_ms="200")) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers.get("X-Databus-Streaming") == "1"
            self.pids.append(resp.headers[WORKER_HEADER])
            framer = StreamFramer()
            async for data in resp.content.iter_any():
                for frame in framer.feed(data):
                    assert frame.kind != "error", frame.error
                    if frame.kind == "write":
                        assert frame.checkpoint is not None
                        self.accept(frame.body, frame.checkpoint.dumps())
                if until.is_set():
                    return
            raise ConnectionResetError("the stream ended")


def test_worker_killed_while_serving_20_consumers(tmp_path: Path) -> None:
    relay = relay_with_workers(tmp_path, workers=2)
    relay.start()
    try:
        doc = wait_for(relay, workers_running(1))
        victim = str(doc["workers"][0]["pid"])
        consumers = [Consumer(f"c{i}", streaming=i % 2 == 1) for i in range(20)]

        async def main() -> None:
            until = asyncio.Event()
            tasks = [asyncio.create_task(c.run(relay.url, until)) for c in consumers]
            try:
                await async_wait_until(
                    lambda: all(c.windows for c in consumers)
                    and any(c.pids and c.pids[-1] == victim for c in consumers),
                    "every consumer served, some by the victim")
                on_victim = [c for c in consumers if c.pids and c.pids[-1] == victim]
                assert on_victim, [c.pids[-1:] for c in consumers]
                seen_before = {c.name: len(c.pids) for c in consumers}
                os.kill(int(victim), signal.SIGKILL)
                restarted = await asyncio.to_thread(wait_for, relay, lambda d: (
                    d["workers"][0]["restarts"] == 1 and d["workers"][0]["state"] == "running"))
                assert str(restarted["workers"][0]["pid"]) != victim
                await async_wait_until(lambda: all(c.pids[-1] != victim for c in on_victim),
                                       "the victim's consumers served by another process")
                # Everyone catches up with what the relay has now, then stops.
                target = (await asyncio.to_thread(wait_for, relay, lambda d: True)
                          )["buffers"]["load"]["max_scn"]
                await async_wait_until(
                    lambda: all((c.last_scn or 0) >= target for c in consumers),
                    f"every consumer at SCN {target}", 15,
                    diagnose=lambda: str([(c.name, c.last_scn, c.errors) for c in consumers]))
                for c in on_victim:  # they lost their connection, and came back elsewhere
                    assert victim not in c.pids[seen_before[c.name] + 1:], (c.name, c.pids)
                    assert c.pids[-1] != victim
                # Every consumer, whichever process served it (workers report to the
                # main one).
                assert {c.name for c in consumers} <= set(await listed_ids(relay.url))
            finally:
                until.set()
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
            # Stopped: a streaming consumer's row goes with its stream, whichever process
            # held it (the workers report closings too); a polling one stays until its
            # expiry.
            streaming = {c.name for c in consumers if c.streaming}

            async def streams_gone() -> bool:
                return not streaming & set(await listed_ids(relay.url))

            await async_wait_until(streams_gone, "the streaming consumers' rows gone", 10)
            polling = {c.name for c in consumers if not c.streaming}
            assert polling <= set(await listed_ids(relay.url))

        asyncio.run(main())
    finally:
        relay.kill()
    for c in consumers:
        # From the oldest window held when it started to the target, each once: no gap
        # (checked as they came), nothing before a checkpoint served again.
        assert c.first_scn is not None and c.last_scn is not None
        assert c.windows == c.last_scn - c.first_scn + 1, c
        assert c.served_again == 0, c
    # Streams on the worker broke mid-response (a poll between requests may move to a
    # new connection without an error: aiohttp opens one when the idle one closed).
    assert sum(c.reconnects for c in consumers) >= 1
    assert "Traceback" not in relay.log_path.read_text()


# -- the main process dies ---------------------------------------------------------------


def pull_everything(url: str) -> list[Window]:
    async def main() -> list[Window]:
        body, checkpoint = b"", None
        async with aiohttp.ClientSession() as session:
            while True:
                params = {"max_bytes": "1000000"}
                if checkpoint is not None:
                    params["checkpoint"] = checkpoint
                async with session.get(f"{url}/v1/stream", params=params) as resp:
                    assert resp.status == 200, await resp.text()
                    chunk = await resp.read()
                    checkpoint = resp.headers["X-Databus-Checkpoint"]
                if not chunk:
                    return parse_windows(body)
                body += chunk
    return asyncio.run(main())


def test_killing_the_main_process_ends_its_workers_and_a_restart_serves_it_all(
        tmp_path: Path) -> None:
    relay = relay_with_workers(tmp_path, workers=3)
    relay.start()
    try:
        doc = wait_for(relay, workers_running(2))
        pids = [w["pid"] for w in doc["workers"]]
        before = pull_everything(relay.url)
    finally:
        relay.kill()  # SIGKILL; returns once nothing accepts on the port
    assert len(before) > 50
    wait_until(lambda: not any(alive(pid) for pid in pids), "the workers gone", 5,
               diagnose=lambda: f"alive: {[p for p in pids if alive(p)]}")

    relay.start()
    try:
        doc = wait_for(relay, lambda d: workers_running(2)(d)
                       and d["buffers"]["load"]["max_scn"] > before[-1].scn)
        assert not {w["pid"] for w in doc["workers"]} & set(pids)
        after = pull_everything(relay.url)
    finally:
        relay.kill()
    by_scn = {w.scn: w for w in after}
    for w in before:  # every complete window it had, byte for byte
        assert by_scn[w.scn] == w
    scns = [w.scn for w in after]
    assert scns == list(range(scns[0], scns[0] + len(scns)))
    assert "Traceback" not in relay.log_path.read_text()
