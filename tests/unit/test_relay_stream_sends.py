"""How a streaming subscription hands its writes to the transport (relay/_streaming.py,
``Follow._write`` and ``chunk_sends``): the bytes on the wire are exactly one HTTP chunk
per write, whatever the sends; and a consumer that falls behind while the ring wraps
gets whole windows, in order, each once, or an in-band ``scn_not_found``."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path

import aiohttp
import pytest

from databus.client._relay_stream import StreamFramer
from databus.event import Op, decode_eow, decode_event, encode_event, iter_events
from databus.relay import _streaming
from databus.relay._streaming import MIN_TAKEN, SMALL_PART, chunk_sends
from tests.relay_harness import relay_config, running_relay

pytestmark = pytest.mark.twin("databus.batch")

LIMIT = 20
LOAD = f"synthetic://?rate=0&keys=1000&event_bytes=300&events_per_window=3&limit={LIMIT}&seed=1"


def framed(parts: list[bytes]) -> bytes:
    size = sum(len(p) for p in parts)
    return b"%x\r\n" % size + b"".join(parts) + b"\r\n"


def wire(sends: list[list[bytes | memoryview]]) -> bytes:
    return b"".join(bytes(buf) for send in sends for buf in send)


# -- chunk_sends -----------------------------------------------------------------------


def test_sends_of_a_write_and_its_checkpoint_event() -> None:
    events = bytes(range(256)) * 40  # 10,240 bytes
    cp = b"C" * 90
    sends = chunk_sends([events, cp], len(events) + len(cp), 4096)
    assert wire(sends) == framed([events, cp])
    # The size line rides with the first 4 KiB of events, the checkpoint event and the
    # closing CRLF with the last events: three sends, no send of framing alone.
    assert [[bytes(b) for b in s] for s in sends] == [
        [b"%x\r\n" % (len(events) + len(cp)), events[:4096]],
        [events[4096:8192]],
        [events[8192:], cp, b"\r\n"],
    ]
    # The event bytes are views of the write's own bytes, not copies.
    for send in sends:
        for buf in send:
            if isinstance(buf, memoryview):
                assert buf.obj is events


def test_a_write_that_fits_one_piece_is_one_send_of_the_parts_themselves() -> None:
    events = b"e" * 70_000
    cp = b"c" * 100
    sends = chunk_sends([events, cp], len(events) + len(cp), 1 << 20)
    assert len(sends) == 1
    assert sends[0][1] is events and sends[0][2] is cp
    assert wire(sends) == framed([events, cp])


def test_a_checkpoint_event_alone_and_an_empty_part() -> None:
    cp = b"x" * 120
    assert wire(chunk_sends([cp], len(cp), 64)) == framed([cp])
    assert len(chunk_sends([cp], len(cp), 64)) == 1
    assert wire(chunk_sends([b"", cp], len(cp), 64)) == framed([cp])


def test_sends_are_the_chunk_exactly_whatever_the_sizes() -> None:
    rng = random.Random(30)
    sizes = [0, 1, SMALL_PART - 1, SMALL_PART, SMALL_PART + 1, 65_535, 65_536, 300_001]
    for _ in range(300):
        parts = [rng.randbytes(rng.choice(sizes)) for _ in range(rng.randint(1, 3))]
        piece = rng.choice([1000, 4096, 65_536, 1 << 20])
        sends = chunk_sends(parts, sum(len(p) for p in parts), piece)
        assert wire(sends) == framed(parts)
        for send in sends:
            assert send  # no empty send
            # At most one piece of the big parts per send; the framing and small parts
            # (a checkpoint event) ride along.
            assert sum(len(b) for b in send if isinstance(b, memoryview)
                       or len(b) > SMALL_PART) <= piece
        assert bytes(sends[0][0]).endswith(b"\r\n")
        assert bytes(sends[-1][-1]) == b"\r\n"


# -- a stream behind a wrapping ring ------------------------------------------------------


def data_event(scn: int, i: int, size: int) -> bytes:
    return encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=scn * 10 + i,
                        value=bytes([scn % 251]) * size)


@pytest.mark.parametrize("vectored", [True, False], ids=["writelines", "writes"])
@pytest.mark.parametrize("piece", [3000, 1 << 20], ids=["small-sends", "default-sends"])
def test_a_reader_behind_a_wrapping_ring_gets_whole_windows_in_order_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vectored: bool, piece: int) -> None:
    """A writer wraps a 1 MiB ring many times over while streams read it: one keeps up,
    one stops reading for a while (its writes wait on the socket while the ring wraps
    under the windows after them), one asks for small writes. Each gets, before any
    in-band ``scn_not_found``, the windows after its start in SCN order with no gap
    and none twice, each window's data events byte for byte as written, its EOW's
    count right."""
    monkeypatch.setattr(_streaming, "STREAM_PIECE", piece)
    monkeypatch.setattr(_streaming, "STREAM_PIECE_COPYING", piece)
    monkeypatch.setattr(_streaming, "_vectored", lambda transport: vectored)
    sends_seen: list[int] = []
    real_chunk_sends = _streaming.chunk_sends

    def counting(parts: list[bytes], size: int, p: int) -> list[list[bytes | memoryview]]:
        out: list[list[bytes | memoryview]] = real_chunk_sends(parts, size, p)
        sends_seen.append(len(out))
        return out

    monkeypatch.setattr(_streaming, "chunk_sends", counting)
    written: dict[int, list[bytes]] = {}
    lock = threading.Lock()

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD}, capacity_mb=1)) as r:
            await r.wait_for_scn("load", LIMIT)
            buffer = r.relay.buffers["load"]
            stop = threading.Event()
            rng = random.Random(11)

            def write() -> None:
                scn = LIMIT
                while not stop.is_set():
                    scn += 1
                    events = [data_event(scn, i, rng.randint(10, 40_000))
                              for i in range(rng.randint(1, 4))]
                    with lock:
                        written[scn] = events
                    buffer.append_window(scn, events)
                    time.sleep(0.0005)

            async def open_at(scn: int, max_bytes: int) -> aiohttp.ClientResponse:
                resp = await r.session.get(r.url + "/v1/stream", params={
                    "follow": "true", "checkpoint": json.dumps({"window_scn": scn}),
                    "max_bytes": str(max_bytes)})
                assert resp.status == 200, await resp.text()
                return resp

            streams = [(await open_at(LIMIT, 4 << 20), 0.0),
                       (await open_at(LIMIT, 4 << 20), 0.6),
                       (await open_at(LIMIT, 20_000), 0.0)]
            writer = asyncio.create_task(asyncio.to_thread(write))

            async def consume(resp: aiohttp.ClientResponse, stall: float) -> tuple[bytes, bool]:
                framer = StreamFramer()
                body = bytearray()
                fell_off = False
                deadline = time.monotonic() + 2.5
                first = True
                while time.monotonic() < deadline and not fell_off:
                    chunk = await asyncio.wait_for(resp.content.readany(), 10)
                    if not chunk:
                        break
                    for f in framer.feed(chunk):
                        if f.kind == "write":
                            body += f.body
                        elif f.kind == "error":
                            assert f.error is not None
                            assert f.error["error"] == "scn_not_found", f.error
                            fell_off = True
                    if first and stall:
                        first = False
                        await asyncio.sleep(stall)  # read nothing while the ring wraps
                resp.close()
                return bytes(body), fell_off

            try:
                results = await asyncio.gather(*(consume(s, stall) for s, stall in streams))
            finally:
                stop.set()
                await writer
            for body, _ in results:
                check_windows(body, written, after=LIMIT)
            # The stalled reader met the wrap: it fell off, or had everything served
            # before the ring came round (either way, whole windows up to there).
            assert any(len(body) > 0 for body, _ in results)

    asyncio.run(main())
    assert sends_seen  # big writes (framing and events in one send at least) ran
    if piece < 65_536:
        assert any(n > 1 for n in sends_seen), sends_seen  # and writes of several sends


def check_windows(body: bytes, written: dict[int, list[bytes]], *, after: int) -> None:
    """``body`` is the windows after ``after`` in order, none missing, none twice, each
    the writer's exact events followed by its EOW (every CRC checked by decode_event),
    then at most the first events of the next window (a write of fewer bytes than a
    window ends inside it)."""
    expect = after + 1
    events: list[bytes] = []
    scn = None
    for off, header in iter_events(body):
        event = decode_event(body, off)
        if header.is_eow:
            assert header.scn == expect, (header.scn, expect)
            assert events == written[header.scn]
            assert decode_eow(event).event_count == len(events)
            expect += 1
            events = []
            scn = None
            continue
        assert not header.is_control
        assert scn is None or header.scn == scn
        scn = header.scn
        events.append(body[off:off + header.total_length])
    if events:  # a small-write stream cut off inside a window: a prefix of the next one
        assert scn == expect
        assert events == written[expect][:len(events)]


# -- waiting on a full transport ----------------------------------------------------------


class FakeTransport:
    """A transport whose buffer holds ``size`` bytes, ``step`` fewer at each look (the
    consumer taking some), never below ``floor``."""

    def __init__(self, size: int, step: int, floor: int) -> None:
        self.size, self.step, self.floor = size, step, floor
        self.looks = 0

    def get_write_buffer_size(self) -> int:
        self.looks += 1
        size = self.size
        self.size = max(self.floor, size - self.step)
        return size

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class StuckWriter:
    """A writer whose drain waits until ``release`` is set (never, unless told)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waits = 0

    async def drain(self) -> None:
        self.waits += 1
        await self.release.wait()


def test_a_consumer_that_takes_bytes_slowly_is_not_cut_one_that_takes_none_is() -> None:
    """Waiting on a transport over its limit: a consumer that takes ``MIN_TAKEN`` bytes
    per timeout goes on however long the send takes it; one that takes nothing, or a
    trickle, is cut after one timeout without progress."""
    async def main() -> None:
        # The buffer shrinks between the waits (the consumer takes some bytes each
        # timeout), then the drain completes: no cut, however many timeouts it took.
        writer = StuckWriter()
        shrinking = FakeTransport(10_000_000, MIN_TAKEN, 0)

        async def release_later() -> None:
            await asyncio.sleep(0.25)
            writer.release.set()

        task = asyncio.create_task(release_later())
        await _streaming._drain(writer, shrinking, 0.05)  # type: ignore[arg-type]
        await task
        # Timed out several times (two looks at the buffer each), each time after
        # progress, on one drain.
        assert shrinking.looks >= 6 and writer.waits == 1
        # A buffer that stops shrinking: cut one timeout after its last progress.
        stuck = FakeTransport(900_000, 100_000, 800_000)
        writer = StuckWriter()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await _streaming._drain(writer, stuck, 0.05)  # type: ignore[arg-type]
        assert stuck.looks == 4  # one timeout with progress, then one without
        assert time.monotonic() - t0 < 5
        # A trickle (less than MIN_TAKEN per timeout) is cut as if it took nothing, as
        # a wait on one 64 KiB piece cut it.
        trickle = FakeTransport(900_000, MIN_TAKEN // 4, 0)
        with pytest.raises(TimeoutError):
            await _streaming._drain(StuckWriter(), trickle, 0.05)  # type: ignore[arg-type]
        assert trickle.looks == 2

    asyncio.run(main())


# -- catch-up writes beside each other ---------------------------------------------------

BACKLOG = 6000  # windows of one 2.5 KB event: about 15 MiB
BIG = (f"synthetic://?rate=0&keys=100000&event_bytes=2500&events_per_window=1"
       f"&limit={BACKLOG}&seed=3")


@pytest.mark.parametrize("lane_held", [False, True], ids=["free-lane", "busy-lane"])
def test_catching_up_streams_end_each_write_with_its_checkpoint_in_the_same_chunk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lane_held: bool) -> None:
    """Four streams catch up on a 15 MiB backlog at once, 8 MiB per write. With the
    server's bulk lane taken (``busy-lane``: another big body being built, all along)
    and ``SHORT_BODY`` below the first slice, every write ends after its first slice.
    Either way the checkpoint event goes in a write's last chunk, never in a chunk of
    its own after events, and each stream's events are exactly what polls serve, in
    order, once."""
    from databus.relay._streaming import Follow
    from tests.relay_harness import stream_body

    lone_checkpoints: list[int] = []
    writes: list[int] = []
    real_write = Follow._write

    async def spy(self: Follow, parts: list[bytes], timeout: float) -> None:
        writes.append(len(parts))
        if len(parts) == 1 and len(parts[0]) <= SMALL_PART and self.position.window_scn > 0:
            lone_checkpoints.append(len(parts[0]))
        await real_write(self, parts, timeout)

    monkeypatch.setattr(Follow, "_write", spy)

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": BIG}, capacity_mb=32)) as r:
            await r.wait_for_scn("load", BACKLOG)
            polled = await stream_body(r)

            async def catch_up() -> bytes:
                resp = await r.session.get(r.url + "/v1/stream", params={
                    "follow": "true", "checkpoint": json.dumps({"window_scn": -1}),
                    "max_bytes": str(8 << 20)})
                assert resp.status == 200
                framer = StreamFramer()
                body = bytearray()
                done = False
                while not done:
                    chunk = await asyncio.wait_for(resp.content.readany(), 60)
                    assert chunk
                    for f in framer.feed(chunk):
                        assert f.kind != "error", f.error
                        if f.kind == "write":
                            body += f.body
                            assert f.checkpoint is not None
                            done = f.checkpoint.window_scn >= BACKLOG
                resp.close()
                return bytes(body)

            if lane_held:
                from databus._serving import SERVING

                monkeypatch.setattr(_streaming, "SHORT_BODY", 16 * 1024)
                await r.app[SERVING].bulk.acquire()  # type: ignore[index]
            bodies = await asyncio.gather(*(catch_up() for _ in range(4)))
            if lane_held:
                r.app[SERVING].bulk.release()  # type: ignore[index]
            for body in bodies:
                assert body == polled

    asyncio.run(main())
    assert not lone_checkpoints, lone_checkpoints
    if lane_held:  # one chunk per write: the first slice and the checkpoint event
        assert len(writes) >= 4 * 200 and set(writes) == {2}, writes[:20]


def test_a_slow_consumer_survives_several_timeouts_of_aiohttps_own_drain() -> None:
    """The real aiohttp writer and protocol: a drain that outlives one timeout (the
    consumer taking bytes slowly) goes on and returns once the protocol resumes; one
    timeout must not leave the protocol's drain waiter cancelled."""
    from aiohttp.base_protocol import BaseProtocol
    from aiohttp.http_writer import StreamWriter

    async def main() -> None:
        loop = asyncio.get_running_loop()
        protocol = BaseProtocol(loop)
        transport = FakeTransport(10_000_000, MIN_TAKEN, 0)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        writer = StreamWriter(protocol, loop)
        protocol.pause_writing()

        async def resume_later() -> None:
            await asyncio.sleep(0.3)
            protocol.resume_writing()

        task = asyncio.create_task(resume_later())
        await _streaming._drain(writer, transport, 0.05)  # type: ignore[arg-type]
        await task
        # And the connection's next wait works too.
        protocol.pause_writing()
        task = asyncio.create_task(resume_later())
        await _streaming._drain(writer, transport, 0.05)  # type: ignore[arg-type]
        await task

    asyncio.run(main())
