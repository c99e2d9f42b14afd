"""The relay's HTTP API against a real relay fed by the synthetic fetcher."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from databus.event import HEADER_SIZE
from tests.relay_harness import (
    ADMIN_TOKEN,
    parse_windows,
    relay_config,
    running_relay,
    stream_all,
)
from tests.waiting import async_wait_until

LOAD = "synthetic://?rate=0&keys=1000&event_bytes=300&events_per_window=3&limit=40&seed=1"


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_stream_serves_whole_windows_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            windows, cp = await stream_all(r)
            assert [w.scn for w in windows] == list(range(1, 41))
            assert all(len(w.events) == 3 == w.eow_count for w in windows)
            assert json.loads(cp) == {"mode": "online", "window_scn": 40, "window_offset": -1}
            # From a checkpoint in the middle: exactly the later windows.
            later, _ = await stream_all(r, json.dumps({"window_scn": 25}))
            assert [w.scn for w in later] == list(range(26, 41))

    run(main())


def test_small_max_bytes_resumes_mid_window(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            whole, _ = await stream_all(r)
            pieces, _ = await stream_all(r, max_bytes=700)
            # Bodies are concatenated before parsing, so a split window reads whole again.
            assert [(w.scn, w.events, w.eow_count) for w in pieces] == [
                (w.scn, w.events, w.eow_count) for w in whole
            ]
            async with await r.get("/v1/stream", max_bytes=HEADER_SIZE) as resp:
                assert resp.status == 200
                assert await resp.read() == b""
                assert int(resp.headers["X-Databus-Pending-Event-Size"]) > HEADER_SIZE

    run(main())


def test_sources_schemas_status_metrics_healthz(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            sources = (await r.json("/v1/sources"))["sources"]
            assert [s["name"] for s in sources] == ["synthetic.events"]
            fp = sources[0]["schema_fingerprint"]
            schema = await r.json(f"/v1/schemas/{fp}")
            assert schema["fingerprint"] == fp and schema["schema"]["type"] == "record"
            versions = await r.json("/v1/schemas", source="synthetic.events")
            assert [v["fingerprint"] for v in versions["versions"]] == [fp]
            status = (await r.json("/v1/status"))["buffers"]["load"]
            assert status["max_scn"] == 40 and status["windows"] == 40
            assert status["events"] == 120 and status["capacity_bytes"] == 4 << 20
            assert status["fetcher"]["state"] in {"running", "idle", "stopped"}
            async with await r.get("/metrics") as resp:
                text = await resp.text()
            assert 'databus_relay_buffer_max_scn{buffer="load"} 40' in text
            assert await r.json("/healthz") == {"status": "ok"}

    run(main())


@pytest.mark.parametrize(
    "params,status,code",
    [
        ({"checkpoint": "{not json"}, 400, "bad_request"),
        ({"checkpoint": '{"window_scn": -7}'}, 400, "bad_request"),
        ({"filter": "{oops"}, 400, "bad_request"),
        ({"filter": '{"synthetic.events": {"type": "mod", "n": 0, "buckets": "[0]"}}'}, 400,
         "bad_request"),
        ({"max_bytes": "-1"}, 400, "bad_request"),
        ({"max_bytes": "lots"}, 400, "bad_request"),
        ({"max_bytes": str(1 << 40)}, 400, "bad_request"),
        ({"wait_ms": str(10**9)}, 400, "bad_request"),
        ({"sources": "no.such"}, 404, "unknown_source"),
        ({"filter": '{"no.such": {"type": "mod", "n": 2, "buckets": "[0]"}}'}, 404,
         "unknown_source"),
    ],
)
def test_bad_requests_get_json_errors(
    tmp_path: Path, params: dict[str, str], status: int, code: str
) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            async with await r.get("/v1/stream", **params) as resp:
                assert resp.status == status
                body = await resp.json()
                assert body["error"] == code and body["message"]
            # The relay is unaffected.
            windows, _ = await stream_all(r)
            assert len(windows) == 40

    run(main())


def test_unknown_paths_and_schemas_are_json_404(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            for path in ("/v1/nope", "/v1/schemas/0000000000000001"):
                async with await r.get(path) as resp:
                    assert resp.status == 404
                    assert (await resp.json())["error"] in {"not_found", "unknown_schema"}
            async with await r.get("/v1/schemas/xyz") as resp:
                assert resp.status == 400

    run(main())


def test_fell_off_the_relay_gets_410_with_min_scn(tmp_path: Path) -> None:
    source = "synthetic://?rate=0&event_bytes=2500&events_per_window=4&limit=400&seed=2"
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": source}, capacity_mb=1)) as r:
            await r.wait_for_scn("load", 400)
            status = (await r.json("/v1/status"))["buffers"]["load"]
            assert status["min_scn"] > 1
            async with await r.get("/v1/stream", checkpoint='{"window_scn": 1}') as resp:
                assert resp.status == 410
                body = await resp.json()
            assert body["error"] == "scn_not_found" and body["min_scn"] == status["min_scn"]

    run(main())


def test_filters_partition_the_stream(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            everything, _ = await stream_all(r)
            all_keys = sorted(k for w in everything for _, k, _ in w.events)
            seen: list[object] = []
            for bucket in range(3):
                spec = {"synthetic.events": {"type": "mod", "n": 3, "buckets": [bucket]}}
                windows, cp = await stream_all(r, filter=json.dumps(spec))
                # Filtered windows still end with their EOW, so the checkpoint advances.
                assert [w.scn for w in windows] == list(range(1, 41))
                assert json.loads(cp)["window_scn"] == 40
                keys = [k for w in windows for _, k, _ in w.events]
                assert all(k % 3 == bucket for k in keys)  # type: ignore[operator]
                seen += keys
            assert sorted(seen) == all_keys  # type: ignore[type-var]

    run(main())


def test_long_poll_answers_when_a_window_lands(tmp_path: Path) -> None:
    slow = "synthetic://?rate=5&events_per_window=1&seed=3"

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": slow})) as r:
            await r.wait_for_scn("load", 1)
            status = (await r.json("/v1/status"))["buffers"]["load"]
            since = status["max_scn"]
            cp = json.dumps({"window_scn": since})
            buffer = r.relay.buffers["load"]

            async def landed() -> float:
                """When the window after ``since`` is seen in the buffer (at or after it
                lands: a late look can only make the answer seem earlier)."""
                await async_wait_until(lambda: (buffer.state().max_scn or 0) > since,
                                       f"a window after {since}", 20, max_interval=0.02)
                return time.monotonic()

            landing = asyncio.create_task(landed())
            # One window every 200 ms; a poll that wrongly waited out its wait_ms would
            # answer after 30 s.
            wait_ms = 30_000
            async with await r.get("/v1/stream", checkpoint=cp, wait_ms=wait_ms) as resp:
                windows = parse_windows(await resp.read())
            answered = time.monotonic()
            landed_at = await landing
            assert windows and windows[0].scn == since + 1
            # When the window landed, not when wait_ms ran out.
            assert answered - landed_at < wait_ms / 1000 / 2, answered - landed_at

    run(main())


def test_long_poll_times_out_empty(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            start = time.monotonic()
            async with await r.get("/v1/stream", checkpoint='{"window_scn": 40}',
                                   wait_ms=300) as resp:
                assert resp.status == 200 and await resp.read() == b""
                assert json.loads(resp.headers["X-Databus-Checkpoint"])["window_scn"] == 40
            # Empty once its 300 ms passed, not before; the 20 s bound only tells it from
            # never, or the 60 s max_wait_ms, with slack for a busy machine.
            assert 0.25 < time.monotonic() - start < 20

    run(main())


def test_200_long_polls_do_not_slow_the_writer(tmp_path: Path) -> None:
    source = "synthetic://?rate=400&events_per_window=1&event_bytes=200&seed=4"

    async def writer_rate(r: object, seconds: float) -> float:
        first = (await r.json("/v1/status"))["buffers"]["load"]["max_scn"]  # type: ignore[attr-defined]
        await asyncio.sleep(seconds)
        last = (await r.json("/v1/status"))["buffers"]["load"]["max_scn"]  # type: ignore[attr-defined]
        return (last - first) / seconds

    async def poller(r: object, stop: asyncio.Event) -> int:
        cp = '{"window_scn": -2}'
        polls = 0
        while not stop.is_set():
            async with await r.get("/v1/stream", checkpoint=cp, wait_ms=2000) as resp:  # type: ignore[attr-defined]
                await resp.read()
                cp = resp.headers["X-Databus-Checkpoint"]
                if json.loads(cp)["window_scn"] < 0:
                    cp = json.dumps({"window_scn": int(resp.headers["X-Databus-Max-Scn"])})
            polls += 1
        return polls

    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": source})) as r:
            await r.wait_for_scn("load", 10)
            alone = await writer_rate(r, 2.0)
            stop = asyncio.Event()
            tasks = [asyncio.create_task(poller(r, stop)) for _ in range(200)]
            await asyncio.sleep(0.5)
            loaded = await writer_rate(r, 2.0)
            stop.set()
            polls = await asyncio.gather(*tasks)
            assert sum(polls) > 200
            assert loaded >= 0.8 * alone, (alone, loaded)

    run(main())


def test_admin_needs_the_token(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            url = r.url + "/v1/admin/flush"
            async with r.session.post(url) as resp:
                assert resp.status == 401 and (await resp.json())["error"] == "unauthorized"
            async with r.session.post(url, headers={"Authorization": "Bearer nope"}) as resp:
                assert resp.status == 401
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with r.session.post(url, headers=headers) as resp:
                assert resp.status == 200 and (await resp.json())["flushed"] == ["load"]

    run(main())


# -- issue 12: parameters a client can send never make a 5xx ------------------------------

DEEP = "[" * 1500
HUGE_INT = "9" * 5000


@pytest.mark.parametrize(
    "params,status,code",
    [
        # Defect 3: RecursionError and the int digit limit were 500s.
        ({"checkpoint": DEEP}, 400, "bad_request"),
        ({"filter": DEEP}, 400, "bad_request"),
        ({"filter": '{"a": ' * 40 + "1" + "}" * 40}, 400, "bad_request"),
        ({"filter": json.dumps({"synthetic.events": {"type": "mod", "n": 3,
                                                     "buckets": f"[{HUGE_INT}]"}})},
         400, "bad_request"),
        ({"filter": json.dumps({"synthetic.events": {"type": "mod", "n": 3,
                                                     "buckets": f"[0-{HUGE_INT}]"}})},
         400, "bad_request"),
        ({"filter": '{"synthetic.events": {"type": "mod", "n": 3, "buckets": [' + HUGE_INT
                    + "]}}"}, 400, "bad_request"),
        ({"checkpoint": '{"window_scn": ' + HUGE_INT + "}"}, 400, "bad_request"),
        # Defect 6: an impossible checkpoint (beyond int64) was a 200 and a long poll.
        ({"checkpoint": json.dumps({"window_scn": 2**64})}, 400, "bad_request"),
        ({"checkpoint": json.dumps({"window_scn": 2**63})}, 400, "bad_request"),
        ({"checkpoint": json.dumps({"window_scn": 10**30})}, 400, "bad_request"),
        ({"checkpoint": json.dumps({"window_scn": 5, "window_offset": 2**64})}, 400,
         "bad_request"),
        # A bootstrap checkpoint's window_scn is not a position on the relay.
        ({"checkpoint": json.dumps({"mode": "bootstrap_snapshot", "window_scn": -1,
                                    "bootstrap_start_scn": 3, "bootstrap_source_index": 0})},
         400, "bad_request"),
        # Odd spellings: duplicate keys, NaN, repeated parameters, non-ASCII digits.
        ({"checkpoint": '{"window_scn": 1, "window_scn": 30}'}, 400, "bad_request"),
        ({"checkpoint": '{"window_scn": NaN}'}, 400, "bad_request"),
        ({"max_bytes": "\uff11\uff12"}, 400, "bad_request"),
        ({"max_bytes": "1_000"}, 400, "bad_request"),
        ({"wait_ms": " 5"}, 400, "bad_request"),
        ({"max_bytes": HUGE_INT}, 400, "bad_request"),
        ({"sources": "x" * 1000}, 400, "bad_request"),
        ({"sources": "synthetic.events\x00"}, 400, "bad_request"),
    ],
)
def test_hostile_parameters_get_4xx_json(
    tmp_path: Path, params: dict[str, str], status: int, code: str
) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            async with await r.get("/v1/stream", **{"wait_ms": "5000", **params}) as resp:
                body = await resp.json()
                assert (resp.status, body["error"]) == (status, code), body
                assert len(body["message"]) < 400  # never the whole hostile value back

    run(main())


def test_repeated_parameters_and_odd_encodings(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            await r.wait_for_scn("load", 40)
            for query in ("checkpoint=%7B%22window_scn%22%3A1%7D&checkpoint=%7B%7D",
                          "max_bytes=1&max_bytes=2", "checkpoint=%ff%fe", "checkpoint=%",
                          "filter=%zz", "checkpoint=%00", "sources=a&sources=b"):
                async with r.session.get(f"{r.url}/v1/stream?{query}") as resp:
                    body = await resp.json()
                    assert resp.status == 400 and body["error"] == "bad_request", query
            for path in ("/v1/schemas/" + "9" * 500, "/v1/schemas/\uff11\uff12",
                         "/v1/schemas/0x" + "f" * 17, "/v1/schemas/-1"):
                async with r.session.get(r.url + path) as resp:
                    assert resp.status == 400, path
                    assert (await resp.json())["error"] == "bad_request"
            async with await r.get("/v1/schemas", source="s" * 5000) as resp:
                assert resp.status == 400

    run(main())


async def _raw_post(url: str, path: str, headers: bytes, body: bytes = b"") -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 + b"Content-Length: " + str(len(body)).encode() + b"\r\n" + headers
                 + b"\r\n" + body)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), payload


def test_admin_token_header_that_is_not_utf8_is_401(tmp_path: Path) -> None:
    """Defect 3: Secret.__eq__ encoded a surrogate-escaped header and raised (500)."""
    async def main() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r:
            token = ADMIN_TOKEN.encode()
            for value in (b"Bearer \xed\xa0\x80", b"Bearer " + token + b"\x80",
                          b"Bearer \xff\xfe", b"\xff", b"Bearer " + token[:-1] + b"\xc3\xa9",
                          b"bearer", b"Basic " + token):
                status, payload = await _raw_post(r.url, "/v1/admin/flush",
                                                  b"Authorization: " + value + b"\r\n")
                assert status == 401, value
                assert json.loads(payload)["error"] == "unauthorized"
            # Two Authorization headers: ambiguous, refused even if one is right.
            two = b"Authorization: Bearer " + token + b"\r\nAuthorization: Bearer x\r\n"
            assert (await _raw_post(r.url, "/v1/admin/flush", two))[0] == 401
            good = b"Authorization: Bearer " + token + b"\r\n"
            assert (await _raw_post(r.url, "/v1/admin/flush", good))[0] == 200
            assert (await _raw_post(r.url, "/v1/admin/flush", good, b"{}"))[0] == 200
            for body in (b"[" * 1500, b"nope", b"[1]", b'{"x": 1}', b"\xff" * 10):
                status, payload = await _raw_post(r.url, "/v1/admin/flush", good, body)
                assert status == 400 and json.loads(payload)["error"] == "bad_request"
            # Over 64 KiB: its own code (issue 27, item 10).
            status, payload = await _raw_post(r.url, "/v1/admin/flush", good, b" " * 70_000)
            assert status == 413 and json.loads(payload)["error"] == "body_too_large"

    run(main())


def test_error_table_in_the_docs_lists_every_code_with_its_status() -> None:
    from tests.http_support import RELAY_ERRORS

    doc = (Path(__file__).parents[2] / "docs" / "relay.md").read_text()
    for code, status in RELAY_ERRORS.items():
        assert f"| `{code}` | {status} |" in doc, code
