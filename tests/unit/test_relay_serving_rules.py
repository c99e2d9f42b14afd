"""The serving rules of DESIGN section 3, each as its own test against the HTTP API
(Databus' ``testStreamScn`` cases), plus wrap-around eviction at window boundaries,
rollback and SCN regression.

Most tests need windows whose SCNs are not consecutive (the gaps of a real source), so
their relay runs ``IdleFetcher``: it registers one logical source and writes nothing,
and the test writes windows straight into ``relay.buffers[BUFFER]``. While the fetcher
idles the test is the buffer's only writer, as the buffer requires; everything is read
back over HTTP. The wrap-around test uses the synthetic fetcher at full speed instead.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

import pytest

import databus.relay._fetcher_host as fetcher_host
from databus._http import STATS
from databus.checkpoint import Checkpoint
from databus.event import HEADER_SIZE, Op, decode_event, encode_event, iter_events
from databus.fetchers._api import Fetcher, FetcherContext, WindowSink
from databus.fetchers.synthetic import (
    SyntheticGenerator,
    SyntheticParams,
    SyntheticSource,
    synthetic_schema,
)
from databus.relay._buffer import EventBuffer, ScnOrderError, WindowTooLargeError
from tests.relay_harness import (
    RunningRelay,
    Window,
    parse_windows,
    relay_config,
    running_relay,
    stream_all,
)
from tests.waiting import async_wait_until

pytestmark = pytest.mark.twin("databus.batch")

BUFFER = "rows"
SOURCE = "test.rows"
MIB = 1 << 20

# The windows most tests start from: SCNs with gaps, four events each (keys scn*10+i).
GAPPY = [10, 20, 30, 40, 50]

# The wait_ms of a long poll that must answer when a window lands: a poll that wrongly
# waited it out would take 30 s, so "well before it" (HALF_WAIT_S) tells the two apart
# however slow the machine, with no threshold that only holds on a fast one.
LONG_WAIT_MS = 30_000
HALF_WAIT_S = LONG_WAIT_MS / 1000 / 2


def run(coro: Any) -> None:
    asyncio.run(coro)


# -- a relay whose fetcher idles --------------------------------------------------------


class IdleFetcher(Fetcher):
    """Registers ``SOURCE`` (at construction, so the id exists before the first request)
    and then idles until stopped. ``?start_after=N`` makes an empty buffer start after
    SCN N. ``script``, when set, writes through the sink before idling."""

    scheme: ClassVar[str] = "idle"
    script: ClassVar[Callable[[WindowSink], None] | None] = None

    def __init__(self, uri: str, context: FetcherContext) -> None:
        super().__init__(uri, context)
        query = dict(parse_qsl(urlsplit(uri).query))
        self._start_after = int(query["start_after"]) if "start_after" in query else None
        context.catalog.source_id(SOURCE)
        context.catalog.register_schema(SOURCE, synthetic_schema(SOURCE))

    def initial_scn(self) -> int | None:
        return self._start_after

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        if IdleFetcher.script is not None:
            IdleFetcher.script(sink)
        stop.wait()


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]
    windows: list[Window] = field(default_factory=list)
    error: dict[str, Any] | None = None

    @property
    def checkpoint(self) -> dict[str, Any]:
        return json.loads(self.headers["X-Databus-Checkpoint"])  # type: ignore[no-any-return]

    @property
    def scns(self) -> list[int]:
        return [w.scn for w in self.windows]


@dataclass
class Rows:
    """The idle relay and its one buffer, written by the test."""

    r: RunningRelay
    source_id: int

    @property
    def buffer(self) -> EventBuffer:
        return self.r.relay.buffers[BUFFER]

    def event(self, scn: int, key: int, size: int = 40) -> bytes:
        return encode_event(scn=scn, source_id=self.source_id, op=Op.UPSERT, key=key,
                            value=bytes([key % 251]) * size, timestamp_ns=scn * 1000)

    def write(self, scn: int, count: int = 4, size: int = 40) -> None:
        self.buffer.append_window(scn, [self.event(scn, scn * 10 + i, size)
                                        for i in range(count)])

    async def stream(self, checkpoint: dict[str, Any] | None = None, **params: Any) -> Reply:
        if checkpoint is not None:
            params["checkpoint"] = json.dumps(checkpoint)
        async with await self.r.get("/v1/stream", **params) as resp:
            body = await resp.read()
            reply = Reply(resp.status, body, dict(resp.headers))
        if reply.status == 200:
            reply.windows = parse_windows(body)
        else:
            reply.error = json.loads(body)
        return reply

    async def status(self) -> dict[str, Any]:
        return (await self.r.json("/v1/status"))["buffers"][BUFFER]  # type: ignore[no-any-return]

    def long_polls(self) -> int:
        """How many long polls wait for a window now."""
        assert self.r.app is not None
        return self.r.app[STATS].long_polls

    async def parked(self) -> None:
        """Until a long poll waits for a window: what the test writes next lands while it
        waits (after a fixed sleep, on a busy machine, it could land before the request)."""
        await async_wait_until(lambda: self.long_polls() >= 1, "a long poll waiting", 20)


def keys(window: Window) -> list[object]:
    return [k for _, k, _ in window.events]


@pytest.fixture
def idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """``async with idle(start_after=None, windows=GAPPY) as rows``: an idle relay whose
    buffer (1 MiB) holds ``windows`` (four 40-byte events each)."""
    monkeypatch.setattr(fetcher_host, "fetcher_class", lambda uri: IdleFetcher)
    monkeypatch.setattr(IdleFetcher, "script", None)

    @asynccontextmanager
    async def start(start_after: int | None = None,
                    windows: list[int] = GAPPY) -> AsyncIterator[Rows]:
        uri = "idle://?" + (f"start_after={start_after}" if start_after is not None else "")
        async with running_relay(relay_config(tmp_path, {BUFFER: uri}, capacity_mb=1)) as r:
            rows = Rows(r, r.relay.catalog.source(SOURCE).id)

            async def started() -> bool:
                return (await rows.status())["fetcher"]["state"] != "starting"

            # The host thread has called start_after (or not) once the fetcher runs.
            await async_wait_until(started, "the idle fetcher running", 20)
            for scn in windows:
                rows.write(scn)
            yield rows

    return start


async def evicting(rows: Rows, scns: range) -> dict[str, Any]:
    """Write 180 KB windows at ``scns`` (about five fit in 1 MiB); the buffer status."""
    for scn in scns:
        rows.write(scn, count=3, size=60_000)
    status = await rows.status()
    assert status["prev_scn"] >= scns[0]  # something was evicted
    return status


# -- the rules --------------------------------------------------------------------------


def test_since_max_is_nothing_new_and_a_long_poll_waits_for_the_next_window(
    idle: Callable[..., Any],
) -> None:
    async def main() -> None:
        async with idle() as rows:
            reply = await rows.stream({"window_scn": 50, "window_offset": -1})
            assert reply.status == 200 and reply.body == b""
            assert reply.checkpoint == {"mode": "online", "window_scn": 50, "window_offset": -1}
            assert reply.headers["X-Databus-Max-Scn"] == "50"

            landed: list[float] = []

            async def land_later() -> None:
                await rows.parked()
                rows.write(57)
                landed.append(time.monotonic())

            writer = asyncio.create_task(land_later())
            reply = await rows.stream({"window_scn": 50}, wait_ms=LONG_WAIT_MS)
            answered = time.monotonic()
            await writer
            assert reply.scns == [57] and keys(reply.windows[0]) == [570, 571, 572, 573]
            assert reply.checkpoint["window_scn"] == 57
            # When the window landed, not when wait_ms ran out.
            assert landed[0] <= answered < landed[0] + HALF_WAIT_S, answered - landed[0]

    run(main())


def test_since_ahead_of_max_waits_for_a_window_after_since(idle: Callable[..., Any]) -> None:
    """A checkpoint from a replica that is ahead (decisions.md): nothing now, and a long
    poll answers only for a window after the checkpoint, not for any new window."""

    async def main() -> None:
        async with idle() as rows:
            reply = await rows.stream({"window_scn": 70})
            assert reply.status == 200 and reply.body == b""
            assert reply.checkpoint["window_scn"] == 70

            landed: list[float] = []

            async def land_later() -> None:
                await rows.parked()
                rows.write(60)  # new, but not after 70: the poll keeps waiting
                await asyncio.sleep(0.3)  # time for a wrong answer to 60 to show
                assert rows.long_polls() == 1, "window 60 ended the long poll"
                rows.write(80)
                landed.append(time.monotonic())

            writer = asyncio.create_task(land_later())
            reply = await rows.stream({"window_scn": 70}, wait_ms=LONG_WAIT_MS)
            answered = time.monotonic()
            await writer
            # Not ended by 60 (it would have answered empty), answered when 80 landed.
            assert reply.scns == [80]
            assert landed[0] <= answered < landed[0] + HALF_WAIT_S, answered - landed[0]

    run(main())


@pytest.mark.parametrize("since", [5, 10, 20, 30, 40])
def test_since_in_prev_to_max_serves_from_the_first_window_after_it(
    idle: Callable[..., Any], since: int
) -> None:
    async def main() -> None:
        async with idle(start_after=5) as rows:
            assert (await rows.status())["prev_scn"] == 5
            reply = await rows.stream({"window_scn": since, "window_offset": -1})
            assert reply.status == 200
            assert reply.scns == [s for s in GAPPY if s > since]
            for w in reply.windows:
                assert keys(w) == [w.scn * 10 + i for i in range(4)] and w.eow_count == 4
            assert reply.checkpoint == {"mode": "online", "window_scn": 50, "window_offset": -1}

    run(main())


@pytest.mark.parametrize("since", [6, 9, 11, 15, 19, 21, 39, 49])
def test_since_between_two_windows_serves_from_the_next_window(
    idle: Callable[..., Any], since: int
) -> None:
    async def main() -> None:
        async with idle(start_after=5) as rows:
            reply = await rows.stream({"window_scn": since})
            assert reply.status == 200
            nxt = min(s for s in GAPPY if s > since)
            assert reply.scns[0] == nxt
            assert reply.scns == [s for s in GAPPY if s >= nxt]
            assert all(w.eow_count == len(w.events) == 4 for w in reply.windows)

    run(main())


def test_since_below_prev_is_410_scn_not_found_with_the_current_min_scn(
    idle: Callable[..., Any],
) -> None:
    async def main() -> None:
        async with idle(windows=[]) as rows:
            status = await evicting(rows, range(10, 210, 10))
            prev, low = status["prev_scn"], status["min_scn"]
            assert low == prev + 10
            for since in (0, 10, prev - 10, prev - 1):
                # A long poll does not wait on a checkpoint that can never be served:
                # it answers well before its wait_ms.
                start = time.monotonic()
                reply = await rows.stream({"window_scn": since}, wait_ms=LONG_WAIT_MS)
                assert time.monotonic() - start < HALF_WAIT_S
                assert reply.status == 410, since
                assert reply.error is not None
                assert reply.error["error"] == "scn_not_found" and reply.error["message"]
                assert reply.error["min_scn"] == low
            # The edges that are still served: prev itself and SCNs between prev and min.
            for since in (prev, prev + 5):
                reply = await rows.stream({"window_scn": since})
                assert reply.status == 200
                assert reply.scns == list(range(low, 210, 10))
                assert reply.headers["X-Databus-Min-Scn"] == str(low)

    run(main())


@pytest.mark.parametrize("k", [0, 1, 3, 4])
def test_partial_window_held_is_served_from_its_k_plus_first_event(
    idle: Callable[..., Any], k: int
) -> None:
    async def main() -> None:
        async with idle() as rows:
            reply = await rows.stream({"window_scn": 30, "window_offset": k})
            assert reply.status == 200
            assert reply.scns == [30, 40, 50]
            first = reply.windows[0]
            assert keys(first) == [300 + i for i in range(k, 4)]
            assert first.eow_count == 4  # the EOW still counts the whole window
            assert reply.checkpoint == {"mode": "online", "window_scn": 50, "window_offset": -1}
            # One event at a time: the offset the relay hands back resumes exactly.
            one = len(rows.event(30, 300))
            reply = await rows.stream({"window_scn": 30, "window_offset": k}, max_bytes=one)
            if k < 4:
                assert reply.body and keys(reply.windows[0]) == [300 + k]
                assert reply.checkpoint == {"mode": "online", "window_scn": 30,
                                            "window_offset": k + 1}
            else:
                assert reply.scns == [30] and reply.windows[0].events == []
                assert reply.checkpoint["window_scn"] == 30
                assert reply.checkpoint["window_offset"] == -1

    run(main())


def test_partial_window_offset_counts_events_that_passed_the_filter(
    idle: Callable[..., Any],
) -> None:
    async def main() -> None:
        async with idle() as rows:
            even = json.dumps({SOURCE: {"type": "mod", "n": 2, "buckets": [0]}})
            one = len(rows.event(30, 300))
            first = await rows.stream({"window_scn": 20}, filter=even, max_bytes=one)
            assert first.checkpoint == {"mode": "online", "window_scn": 30, "window_offset": 1}
            # 300 passed and was consumed; 301 and 303 never pass; 302 is next.
            rest = await rows.stream(first.checkpoint, filter=even)
            assert keys(rest.windows[0]) == [302] and rest.windows[0].eow_count == 4
            assert [keys(w) for w in rest.windows[1:]] == [[400, 402], [500, 502]]

    run(main())


def test_partial_window_not_arrived_yet_is_waited_for(idle: Callable[..., Any]) -> None:
    """A partial checkpoint of a window newer than max (a replica behind the one the
    consumer came from, decisions.md): served from its (k+1)-th event once it lands."""

    async def main() -> None:
        async with idle() as rows:
            reply = await rows.stream({"window_scn": 60, "window_offset": 2})
            assert reply.status == 200 and reply.body == b""
            assert reply.checkpoint == {"mode": "online", "window_scn": 60, "window_offset": 2}

            async def land_later() -> None:
                await rows.parked()
                rows.write(60)

            writer = asyncio.create_task(land_later())
            reply = await rows.stream({"window_scn": 60, "window_offset": 2},
                                      wait_ms=LONG_WAIT_MS)
            await writer
            assert reply.scns == [60] and keys(reply.windows[0]) == [602, 603]

    run(main())


def test_partial_window_evicted_is_410(idle: Callable[..., Any]) -> None:
    async def main() -> None:
        async with idle(windows=[]) as rows:
            status = await evicting(rows, range(10, 210, 10))
            prev, low = status["prev_scn"], status["min_scn"]
            for scn in (10, prev - 10, prev):  # W <= prev_scn: evicted
                reply = await rows.stream({"window_scn": scn, "window_offset": 1})
                assert reply.status == 410, scn
                assert reply.error is not None
                assert reply.error["error"] == "scn_not_found"
                assert reply.error["min_scn"] == low
            # The oldest window held is still served from its (k+1)-th event.
            reply = await rows.stream({"window_scn": low, "window_offset": 1})
            assert reply.status == 200 and reply.scns[0] == low
            assert keys(reply.windows[0]) == [low * 10 + 1, low * 10 + 2]

    run(main())


def test_an_empty_buffer_is_not_an_error(idle: Callable[..., Any]) -> None:
    async def main() -> None:
        # Never started: nothing held, nothing evicted.
        async with idle(windows=[]) as rows:
            for cp in (None, {"window_scn": -1}, {"window_scn": -2}, {"window_scn": 0},
                       {"window_scn": 12345}):
                reply = await rows.stream(cp)
                assert reply.status == 200 and reply.body == b"", cp
                assert reply.headers["X-Databus-Min-Scn"] == "-1"
                assert reply.headers["X-Databus-Max-Scn"] == "-1"
            assert (await rows.stream()).checkpoint["window_scn"] == -1

            async def land_later() -> None:
                await rows.parked()
                rows.write(3)

            # A flexible long poll on the empty buffer gets the first window that lands.
            writer = asyncio.create_task(land_later())
            reply = await rows.stream(None, wait_ms=LONG_WAIT_MS)
            await writer
            assert reply.scns == [3]

    run(main())


def test_an_empty_buffer_that_started_after_an_scn(idle: Callable[..., Any]) -> None:
    async def main() -> None:
        async with idle(start_after=100, windows=[]) as rows:
            for cp in (None, {"window_scn": -2}, {"window_scn": 100}, {"window_scn": 150}):
                reply = await rows.stream(cp)
                assert reply.status == 200 and reply.body == b"", cp
                assert reply.headers["X-Databus-Max-Scn"] == "100"
            # Older than where the buffer started: not held, never was.
            reply = await rows.stream({"window_scn": 99})
            assert reply.status == 410 and reply.error is not None
            assert reply.error["min_scn"] == 100

    run(main())


def test_from_the_latest_serves_only_windows_after_the_current_max(
    idle: Callable[..., Any],
) -> None:
    async def main() -> None:
        async with idle() as rows:
            reply = await rows.stream({"window_scn": -2})
            assert reply.status == 200 and reply.body == b""
            assert reply.headers["X-Databus-Max-Scn"] == "50"
            rows.write(60)
            # The max the first answer reported is where the consumer goes on from.
            nxt = await rows.stream({"window_scn": int(reply.headers["X-Databus-Max-Scn"])})
            assert nxt.scns == [60]
            # "Latest" is always after the max of the moment: 60 is not served now.
            again = await rows.stream({"window_scn": -2})
            assert again.body == b"" and again.headers["X-Databus-Max-Scn"] == "60"

    run(main())


def test_from_the_latest_long_poll_answers_with_the_next_window(
    idle: Callable[..., Any],
) -> None:
    """A long poll "from the latest" must answer as soon as a window after the max (of
    the time of the request) lands, like any other long poll (DESIGN section 6)."""

    async def main() -> None:
        async with idle() as rows:

            landed: list[float] = []

            async def land_later() -> None:
                await rows.parked()
                rows.write(60)
                landed.append(time.monotonic())

            writer = asyncio.create_task(land_later())
            reply = await rows.stream({"window_scn": -2}, wait_ms=LONG_WAIT_MS)
            answered = time.monotonic()
            await writer
            # (Were it to answer empty, its X-Databus-Max-Scn of 60 would make the consumer
            # go on after 60: window 60 would be lost to it.)
            assert reply.scns == [60], (
                reply.scns, reply.checkpoint, reply.headers["X-Databus-Max-Scn"])
            assert reply.checkpoint["window_scn"] == 60
            # When the window landed, not when wait_ms ran out.
            assert landed[0] <= answered < landed[0] + HALF_WAIT_S, answered - landed[0]

    run(main())


def test_flexible_serves_everything_held(idle: Callable[..., Any]) -> None:
    async def main() -> None:
        async with idle(start_after=5) as rows:
            for cp in (None, {"window_scn": -1}, {"window_scn": -1, "window_offset": -1}):
                reply = await rows.stream(cp)
                assert reply.scns == GAPPY, cp
                assert all(keys(w) == [w.scn * 10 + i for i in range(4)] for w in reply.windows)
            # Under a filter every window still comes with its EOW.
            spec = json.dumps({SOURCE: {"type": "mod", "n": 1000, "buckets": [999]}})
            reply = await rows.stream(None, filter=spec)
            assert reply.scns == GAPPY and all(w.events == [] for w in reply.windows)
            # After eviction: everything still held, from the current min, whole.
            status = await evicting(rows, range(60, 260, 10))
            reply = await rows.stream(None)
            assert reply.scns == list(range(status["min_scn"], 260, 10))
            assert all(len(w.events) == w.eow_count == 3 for w in reply.windows)

    run(main())


# -- wrap-around eviction -------------------------------------------------------------------

LIMIT = 5000
WRAP_EPW = 7
WRAP = (f"synthetic://?rate=0&keys=5000&event_bytes=1000&events_per_window={WRAP_EPW}"
        f"&update_ratio=0.5&seed=11&limit={LIMIT}")


def test_wraparound_evicts_whole_windows_only(tmp_path: Path) -> None:
    """A 1 MiB buffer driven past its capacity over thirty times (7-event windows of about
    7 KB that do not divide the ring, so laps end in padding): at every moment it holds
    whole consecutive windows, min_scn moves by whole windows, and what is served starts
    at the first event of the oldest window and equals what the source wrote."""

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": WRAP}, capacity_mb=1)) as r:
            samples = 0
            reads = 0
            gen: SyntheticGenerator | None = None
            while True:
                doc = (await r.json("/v1/status"))["buffers"]["load"]
                if doc["min_scn"] is not None:
                    samples += 1
                    # Nothing evicted yet (the buffer never started: -1), or whole windows.
                    assert doc["prev_scn"] == (doc["min_scn"] - 1 or -1), doc
                    assert doc["windows"] == doc["max_scn"] - doc["min_scn"] + 1, doc
                    assert doc["events"] == WRAP_EPW * doc["windows"], doc
                    assert doc["used_bytes"] <= doc["capacity_bytes"] == MIB
                    gen = gen or await synthetic_generator(r, WRAP)
                    # A flexible read that stops after one event starts a whole window.
                    async with await r.get("/v1/stream", max_bytes=1500) as resp:
                        body = await resp.read()
                        low = int(resp.headers["X-Databus-Min-Scn"])
                    if resp.status == 200 and body:
                        (_off, header), = list(iter_events(body))
                        assert header.scn >= doc["min_scn"]
                        assert body == gen.window(header.scn, header.timestamp_ns)[0]
                        assert json.loads(resp.headers["X-Databus-Checkpoint"]) == {
                            "mode": "online", "window_scn": header.scn, "window_offset": 1}
                        assert header.scn <= low  # min at the time of the read
                        reads += 1
                    else:
                        assert resp.status in (200, 410)
                if doc["max_scn"] == LIMIT:
                    break
                await asyncio.sleep(0)
            assert samples >= 5 and reads >= 5, (samples, reads)
            assert gen is not None
            windows, _ = await stream_all(r)
            doc = (await r.json("/v1/status"))["buffers"]["load"]
            low = doc["min_scn"]
            window_bytes = len(b"".join(gen.window(1))) + HEADER_SIZE + 8
            assert LIMIT * window_bytes / MIB > 30  # laps of the ring
            assert low > 1 and doc["prev_scn"] == low - 1
            assert [w.scn for w in windows] == list(range(low, LIMIT + 1))
            assert all(len(w.events) == w.eow_count == WRAP_EPW for w in windows)
            # The oldest window served is whole and byte-identical to the source's.
            served = await raw_window(r, low)
            ts = decode_event(served[0]).header.timestamp_ns
            assert served[:-1] == gen.window(low, ts)

    run(main())


async def synthetic_generator(r: RunningRelay, uri: str) -> SyntheticGenerator:
    """The generator the relay's synthetic fetcher runs, rebuilt from /v1/sources."""
    params = SyntheticParams.from_uri(uri)
    entries = {s["name"]: s for s in (await r.json("/v1/sources"))["sources"]}
    sources = [SyntheticSource(n, entries[n]["id"], int(entries[n]["schema_fingerprint"], 16))
               for n in params.sources]
    return SyntheticGenerator(params, sources, entries[params.sources[0]]["partition_id"])


async def raw_window(r: RunningRelay, scn: int) -> list[bytes]:
    """The raw events (EOW last) of window ``scn`` as served."""
    async with await r.get("/v1/stream", checkpoint=json.dumps({"window_scn": scn - 1})) as resp:
        assert resp.status == 200
        body = await resp.read()
    out = []
    for off, header in iter_events(body):
        if header.scn != scn:
            break
        out.append(body[off : off + header.total_length])
    return out


# -- rollback and SCN regression -------------------------------------------------------------


def test_an_open_or_rolled_back_window_is_never_visible(idle: Callable[..., Any]) -> None:
    async def main() -> None:
        async with idle() as rows:
            buffer = rows.buffer
            buffer.start_window(60)
            for i in range(3):
                buffer.append(rows.event(60, 9000 + i))
            # While it is open: not served, not counted, and it wakes no long poll.
            reply = await rows.stream({"window_scn": 50})
            assert reply.body == b""
            start = time.monotonic()
            reply = await rows.stream({"window_scn": 50}, wait_ms=300)
            assert reply.body == b"" and time.monotonic() - start >= 0.25
            status = await rows.status()
            assert (status["max_scn"], status["windows"], status["events"]) == (50, 5, 20)
            buffer.rollback()
            assert (await rows.stream({"window_scn": 50})).body == b""
            # The same SCN can be written again; only the new content is ever served.
            buffer.append_window(60, [rows.event(60, 7)])
            reply = await rows.stream({"window_scn": 50})
            assert reply.scns == [60] and keys(reply.windows[0]) == [7]
            assert reply.windows[0].eow_count == 1
            whole, _ = await stream_all(rows.r)
            assert [(w.scn, keys(w)) for w in whole][-2:] == [(50, [500, 501, 502, 503]),
                                                             (60, [7])]

    run(main())


def test_rolling_back_a_window_that_evicted_keeps_the_eviction_consistent(
    idle: Callable[..., Any],
) -> None:
    async def main() -> None:
        async with idle(windows=[]) as rows:
            status = await evicting(rows, range(10, 110, 10))
            buffer = rows.buffer
            buffer.start_window(110)
            for i in range(3):  # pushes out two or three more windows, then is dropped
                buffer.append(rows.event(110, 1100 + i, 150_000))
            buffer.rollback()
            after = await rows.status()
            assert after["prev_scn"] > status["prev_scn"] and after["max_scn"] == 100
            assert after["prev_scn"] == after["min_scn"] - 10
            reply = await rows.stream(None)
            assert reply.scns == list(range(after["min_scn"], 110, 10))
            assert all(len(w.events) == w.eow_count == 3 for w in reply.windows)
            gone = await rows.stream({"window_scn": status["min_scn"]})
            assert gone.status == 410 and gone.error is not None
            assert gone.error["min_scn"] == after["min_scn"]

    run(main())


def test_scn_regression_fails_the_fetcher_and_readers_see_nothing_of_it(
    idle: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetcher writing an SCN that goes backwards is stopped for good (retrying cannot
    help); what the relay had is served unchanged."""

    def script(sink: WindowSink) -> None:
        for scn in (10, 20, 30):
            sink.start_window(scn)
            sink.append(encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=scn, value=b"x"))
            sink.end_window()
        sink.start_window(25)

    monkeypatch.setattr(IdleFetcher, "script", script)

    async def main() -> None:
        async with idle(windows=[]) as rows:

            async def failed() -> dict[str, Any] | None:
                fetcher: dict[str, Any] = (await rows.status())["fetcher"]
                return fetcher if fetcher["state"] == "failed" else None

            fetcher = await async_wait_until(failed, "the fetcher failed", 20)
            assert fetcher["last_error"].startswith("ScnOrderError")
            assert fetcher["restarts"] == 0
            reply = await rows.stream(None)
            assert reply.scns == [10, 20, 30]
            assert [keys(w) for w in reply.windows] == [[10], [20], [30]]

    run(main())


def test_scn_regression_below_prev_is_rejected_once_eviction_emptied_the_buffer(
    tmp_path: Path,
) -> None:
    """A window too large for the buffer evicts everything before it is refused; the
    empty buffer still remembers the last SCN and refuses anything not after it."""
    with EventBuffer(tmp_path / "ring.buf", 64 * 1024) as buffer:
        for scn in (10, 20, 30):
            buffer.append_window(scn, [encode_event(scn=scn, source_id=1, op=Op.UPSERT,
                                                    key=scn, value=b"v" * 10_000)])
        # It evicts the three while it still could fit, then stops evicting.
        with pytest.raises(WindowTooLargeError):
            buffer.append_window(40, [encode_event(scn=40, source_id=1, op=Op.UPSERT, key=i,
                                                   value=b"v" * 10_000) for i in range(8)])
        state = buffer.state()
        assert (state.min_scn, state.max_scn, state.prev_scn) == (None, None, 30)
        for scn in (5, 29, 30):
            with pytest.raises(ScnOrderError):
                buffer.start_window(scn)
        buffer.append_window(31, [encode_event(scn=31, source_id=1, op=Op.UPSERT, key=1,
                                               value=b"v")])
        assert buffer.state().min_scn == buffer.state().max_scn == 31


def test_eviction_of_windows_before_the_serving_point_is_not_scn_not_found(
    tmp_path: Path,
) -> None:
    """The scan starts at an index entry at or before the checkpoint and skips the
    windows up to it. If the writer evicts some of those skipped windows while the read
    is under way, the consumer has lost nothing: what it asked for is still held (since
    >= prev_scn), so it must not be told scn_not_found (it would bootstrap for nothing).
    The predicate, called from inside the read, stands in for the writer thread."""

    def event(scn: int, key: int) -> bytes:
        return encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=key, value=b"v" * 900)

    # One index entry (window 1): every scan starts at the head.
    with EventBuffer(tmp_path / "ring.buf", 64 * 1024, index_every_bytes=1 << 30) as buffer:
        for scn in range(1, 41):
            buffer.append_window(scn, [event(scn, scn)])
        evicted = False

        def writer_meanwhile(source_id: int, pkey: int, key: bytes) -> bool:
            nonlocal evicted
            if not evicted:  # at the first event served (window 31): evict windows 1..k
                evicted = True
                for scn in range(41, 71):
                    buffer.append_window(scn, [event(scn, scn)])
            return True

        result = buffer.read(Checkpoint(30), max_bytes=1 << 20, predicate=writer_meanwhile)
        state = buffer.state()
        assert evicted and 1 < state.min_scn <= 30 < state.max_scn  # type: ignore[operator]
        # Window 30 was consumed and 31..40 were never touched: serve them.
        scns = [h.scn for _, h in iter_events(result.data) if h.is_eow]
        assert scns[0] == 31 and scns == sorted(set(scns))
