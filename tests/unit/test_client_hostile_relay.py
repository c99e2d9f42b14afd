"""The client behind a relay proxy that forges events with valid CRCs (issue 12,
defects 10 and 11): a real in-process relay, a real aiohttp proxy in front of it.

Defect 10: a CRC-valid event with a key no encoder writes (non-UTF-8 string, composite
key that is not a JSON array) must be handled like a CRC failure (fail over, ask
again), not crash the client.

Defect 11: a window split over several responses (``max_request_bytes`` smaller than
the window) must not reach the consumer before its EOW count and checksum are checked;
when the check fails, the client asks for the window again from its start. A window
bigger than the client's buffer is delivered before its check, and a failed check
then rolls the consumer back (``on_rollback``) and replays.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from databus._hashing import stable_key_hash
from databus.checkpoint import Checkpoint
from databus.client import CallbackResult, Consumer, DatabusClient, DataEvent
from databus.event import KeyKind
from tests.event_forging import fields, fix_windows, forge, split_events
from tests.relay_harness import relay_config, running_relay, stream_all

LIMIT = 12
PER_WINDOW = 12
# Windows of 12 events of ~300 bytes (~4 KiB): requests of 1,500 bytes split each
# window over three or more responses.
SOURCE = (f"synthetic://?rate=0&keys=40&event_bytes=300&events_per_window={PER_WINDOW}"
          f"&limit={LIMIT}&seed=11")
POISON_TS = 123_456_789  # the timestamp forged events carry


# (request checkpoint, body) -> forged body, or None to pass the body on unchanged.
Forger = Callable[[Checkpoint, Checkpoint, bytes], bytes | None]


class ForgingProxy:
    """Forwards to a relay; ``forger`` may rewrite stream bodies (CRCs recomputed by
    the forger as a hostile relay would) while ``faults`` lasts."""

    def __init__(self, target: str, forger: Forger, faults: int) -> None:
        self.target = target
        self.forger = forger
        self.faults = faults
        self.forged = 0
        self.requests = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        async with aiohttp.ClientSession() as session, session.get(
            self.target + request.path_qs
        ) as resp:
            body = await resp.read()
            headers = {k: v for k, v in resp.headers.items() if k.startswith("X-Databus")}
            status = resp.status
        if request.path == "/v1/stream" and status == 200:
            self.requests += 1
            if body and self.faults > 0:
                sent = Checkpoint.loads(request.query["checkpoint"])
                got = Checkpoint.loads(headers["X-Databus-Checkpoint"])
                forged = self.forger(sent, got, body)
                if forged is not None:
                    self.faults -= 1
                    self.forged += 1
                    body = forged
        return web.Response(body=body, status=status, headers=headers,
                            content_type="application/x-databus-events"
                            if request.path == "/v1/stream" else "application/json")


@contextlib.asynccontextmanager
async def proxy_for(target: str, forger: Forger, faults: int
                    ) -> AsyncIterator[tuple[str, ForgingProxy]]:
    proxy = ForgingProxy(target, forger, faults)
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", proxy
    finally:
        await runner.cleanup()


class Recorder(Consumer):
    """Every callback in order; windows as last delivered; stops at the last window."""

    def __init__(self) -> None:
        self.client: DatabusClient | None = None
        self.trace: list[tuple[str, Any]] = []
        self.windows: dict[int, list[tuple[object, int]]] = {}
        self.current: list[tuple[object, int]] = []
        self.errors: list[BaseException] = []

    def on_start_data_event_sequence(self, scn: int) -> CallbackResult:
        self.trace.append(("start", scn))
        self.current = []
        return CallbackResult.SUCCESS

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        self.trace.append(("data", event.timestamp_ns))
        self.current.append((event.key, event.timestamp_ns))
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        self.trace.append(("end", scn))
        self.windows[scn] = self.current
        if scn >= LIMIT and self.client is not None:
            self.client.stop()
        return CallbackResult.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult:
        self.trace.append(("rollback", scn))
        return CallbackResult.SUCCESS

    def on_error(self, error: BaseException) -> CallbackResult:
        self.errors.append(error)
        return CallbackResult.SUCCESS


async def run_behind(tmp_path: Path, forger: Forger, faults: int, **client_kw: Any
                     ) -> tuple[Recorder, ForgingProxy, dict[int, list[object]]]:
    async with running_relay(relay_config(tmp_path, {"load": SOURCE})) as relay:
        await relay.wait_for_scn("load", LIMIT)
        windows, _ = await stream_all(relay)
        expected = {w.scn: [k for _, k, _ in w.events] for w in windows}
        async with proxy_for(relay.url, forger, faults) as (url, proxy):
            rec = Recorder()
            client_kw.setdefault("max_request_bytes", 1500)
            # The proxy forges whole polled bodies (streams: test_relay_streaming.py).
            client_kw.setdefault("streaming", False)
            client = DatabusClient([url], sources=["synthetic.events"], callback_timeout=5,
                                   backoff_initial=0.01, backoff_max=0.05, poll_wait_ms=100,
                                   **client_kw)
            rec.client = client
            client.register(rec)
            await asyncio.wait_for(client.run_async(), 60)
    return rec, proxy, expected


def poison_last_data_event(body: bytes) -> bytes:
    """Change the last data event's timestamp (CRCs recomputed): a valid event, but not
    the one its window's EOW checksum covers."""
    events = split_events(body)
    last = max(i for i, e in enumerate(events) if fields(e)["source_id"] >= 0)
    events[last] = forge(events[last], timestamp_ns=POISON_TS)
    return b"".join(events)


def ends_mid_window(sent: Checkpoint, got: Checkpoint, body: bytes) -> bytes | None:
    """Forge a response that ends inside a window (its EOW comes in a later one)."""
    if got.window_offset < 0:
        return None
    return poison_last_data_event(body)


def continues_a_window(sent: Checkpoint, got: Checkpoint, body: bytes) -> bytes | None:
    """Forge a response that continues a window begun in an earlier response (the
    second half of a window), whether or not it holds the EOW."""
    if sent.window_offset < 0:
        return None
    return poison_last_data_event(body)


def delivered(rec: Recorder) -> dict[int, list[object]]:
    return {scn: [k for k, _ in events] for scn, events in rec.windows.items()}


def poisoned(trace: list[tuple[str, Any]]) -> int:
    return sum(1 for name, arg in trace if name == "data" and arg == POISON_TS)


def test_non_utf8_and_non_array_keys_with_valid_crcs_are_refetched(tmp_path: Path) -> None:
    """Defect 10: the forged keys make UnicodeDecodeError / TypeError / JSONDecodeError
    deep in the decoder; the client must fail over and ask again instead of dying."""
    bad_keys = [(KeyKind.STRING, b"\xff\xfe"), (KeyKind.COMPOSITE, b"5"),
                (KeyKind.COMPOSITE, b"[1,"), (KeyKind.COMPOSITE, b'{"a":1}')]

    def forger(sent: Checkpoint, got: Checkpoint, body: bytes) -> bytes:
        kind, key = bad_keys[len(bad_keys) - 1 - forger.left]  # type: ignore[attr-defined]
        forger.left -= 1  # type: ignore[attr-defined]
        events = split_events(body)
        first = next(i for i, e in enumerate(events) if fields(e)["source_id"] >= 0)
        events[first] = forge(events[first], key=key, flags=int(kind),
                              partition_key=stable_key_hash(key))
        return b"".join(fix_windows(events))  # the window check passes too

    forger.left = len(bad_keys)  # type: ignore[attr-defined]

    async def main() -> None:
        rec, proxy, expected = await run_behind(tmp_path, forger, len(bad_keys),
                                                max_request_bytes=1 << 20)
        assert proxy.forged == len(bad_keys)
        assert not rec.errors
        assert delivered(rec) == expected
        assert not any(name == "rollback" for name, _ in rec.trace)

    asyncio.run(main())


@pytest.mark.parametrize("forger", [ends_mid_window, continues_a_window],
                         ids=["first-half", "second-half"])
def test_split_window_reaches_the_consumer_only_once_verified(
        tmp_path: Path, forger: Forger) -> None:
    """Defect 11: the forged half passes every CRC; only the window's EOW checksum
    catches it. The consumer must never see a forged event, must get every window
    exactly once, and the client must not retry forever from a checkpoint that already
    counts the forged events."""

    async def main() -> None:
        rec, proxy, expected = await run_behind(tmp_path, forger, 3)
        assert proxy.forged == 3
        assert not rec.errors
        assert poisoned(rec.trace) == 0
        assert delivered(rec) == expected
        starts = [scn for name, scn in rec.trace if name == "start"]
        assert starts == sorted(expected)  # each window once: nothing to roll back
        assert not any(name == "rollback" for name, _ in rec.trace)

    asyncio.run(main())


def test_window_larger_than_the_buffer_still_progresses_and_rolls_back(
        tmp_path: Path) -> None:
    """A window that does not fit in ``max_buffered_bytes`` cannot be held: it is
    delivered as it arrives, and a failed check rolls the consumer back to the last
    checkpoint and replays; the final state is the relay's."""

    async def main() -> None:
        rec, proxy, expected = await run_behind(
            tmp_path, ends_mid_window, 2, max_request_bytes=1500, max_buffered_bytes=2000)
        assert proxy.forged == 2
        assert not rec.errors
        assert delivered(rec) == expected
        assert all(ts != POISON_TS for events in rec.windows.values() for _, ts in events)
        # The forged events were delivered (the window could not be held), then undone.
        assert poisoned(rec.trace) >= 1
        assert any(name == "rollback" for name, _ in rec.trace)

    asyncio.run(main())


def test_window_larger_than_the_buffer_unforged_is_delivered_once(tmp_path: Path) -> None:
    async def main() -> None:
        rec, _, expected = await run_behind(
            tmp_path, ends_mid_window, 0, max_request_bytes=1500, max_buffered_bytes=2000)
        assert delivered(rec) == expected
        assert [scn for name, scn in rec.trace if name == "start"] == sorted(expected)

    asyncio.run(main())
