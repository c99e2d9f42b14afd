"""Fuzz every endpoint of a real in-process relay (synthetic source) with hypothesis:
no 5xx, every error JSON with a code of docs/relay.md's table (issue 12)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

from databus.client._relay_stream import StreamFramer
from tests.http_fuzz import (
    Request,
    auth_headers,
    bodies,
    check_response,
    checkpoints,
    filters,
    fingerprints,
    fits,
    fuzz_settings,
    int_texts,
    json_text,
    queries,
    send,
    server_thread,
    source_lists,
    token_ok,
)
from tests.http_support import RELAY_ERRORS
from tests.relay_harness import ADMIN_TOKEN, RunningRelay, relay_config, running_relay

SOURCE = "synthetic.events"
LOAD = "synthetic://?rate=0&keys=50&event_bytes=120&events_per_window=3&limit=40&seed=9"


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # A short max_wait_ms: a fuzzed wait_ms that is valid must not make a slow test.
    config = relay_config(tmp_path_factory.mktemp("fuzz"), {"load": LOAD}, max_wait_ms=20)

    def factory() -> AbstractAsyncContextManager[RunningRelay]:
        return running_relay(config)

    with server_thread(factory) as running:
        yield running.url


STREAM_PARAMS = {
    "checkpoint": json_text(checkpoints(sources=1)),
    "filter": json_text(filters([SOURCE])),
    "sources": source_lists([SOURCE]),
    "max_bytes": int_texts(),
    "wait_ms": int_texts(),
}


@fuzz_settings(250)
@given(q=queries(STREAM_PARAMS))
def test_stream_parameters(relay: str, q: tuple[tuple[tuple[str, str], ...], str]) -> None:
    request = Request("GET", "/v1/stream", q[0], q[1])
    assume(fits(request))
    status, headers, body = send(relay, request)
    check_response(request, status, headers, body, RELAY_ERRORS)
    event(f"status {status}")  # --hypothesis-show-statistics: how many got through
    if status == 200:
        assert headers["content-type"].startswith("application/x-databus-events")
        if headers.get("x-databus-streaming") == "1":  # an unknown-looking follow=1
            StreamFramer().feed(body)
        else:
            assert "x-databus-checkpoint" in headers


STREAMING_PARAMS = {
    **STREAM_PARAMS,
    "follow": st.one_of(st.sampled_from(["true", "1", "yes", "TRUE", "false", "0", ""]),
                        st.text(max_size=8)),
    "heartbeat_ms": int_texts(),
    "client_id": st.one_of(st.text(max_size=40), st.text(min_size=250, max_size=300),
                           st.sampled_from(['a"b', "x\\y", "n\nl", "}{", "\x00"])),
}


@fuzz_settings(150)
@given(q=queries(STREAMING_PARAMS))
def test_streaming_parameters(relay: str, q: tuple[tuple[tuple[str, str], ...], str]) -> None:
    """follow=true with everything else fuzzed: a JSON error, a poll, or a stream whose
    first bytes are whole frames (a catch-up then heartbeats, or an in-band error)."""
    request = Request("GET", "/v1/stream", q[0], q[1])
    assume(fits(request))
    status, headers, body = send(relay, request)
    check_response(request, status, headers, body, RELAY_ERRORS)
    streaming = headers.get("x-databus-streaming") == "1"
    event(f"status {status}{' streaming' if streaming else ''}")
    if status == 200 and streaming:
        frames = StreamFramer().feed(body)
        assert all(f.kind in {"write", "heartbeat", "error"} for f in frames)


@fuzz_settings(250)
@given(path=st.one_of(st.sampled_from(["/v1/sources", "/v1/schemas", "/v1/status", "/metrics",
                                       "/healthz", "/v1/stream", "/v1/nope", "/v1/admin/flush",
                                       "/v1/schemas/", "/", "/v1/dumps", "/v1/admin/dumps",
                                       "/v1/dumps/0abc", "/v1/dumps/zz",
                                       "/v1/admin/dumps/0abc/pause",
                                       "/v1/admin/dumps/0abc/cancel"]),
                      fingerprints().map(lambda fp: "/v1/schemas/" + fp)),
       method=st.sampled_from(["GET", "GET", "POST", "PUT", "DELETE"]),
       q=queries({"source": source_lists([SOURCE]), "sources": source_lists([SOURCE])}))
def test_every_endpoint_and_method(relay: str, path: str, method: str,
                                   q: tuple[tuple[tuple[str, str], ...], str]) -> None:
    request = Request(method, path, q[0], q[1])
    assume(fits(request))
    status, headers, body = send(relay, request)
    check_response(request, status, headers, body, RELAY_ERRORS)


@fuzz_settings(250)
@given(auth=auth_headers(ADMIN_TOKEN), body=bodies())
def test_admin_headers_and_bodies(relay: str, auth: tuple[tuple[bytes, bytes], ...],
                                  body: bytes) -> None:
    request = Request("POST", "/v1/admin/flush", headers=auth, body=body)
    status, headers, payload = send(relay, request)
    check_response(request, status, headers, payload, RELAY_ERRORS)
    if not token_ok(auth, ADMIN_TOKEN):
        assert status == 401, (auth, status)


def _dump_bodies() -> st.SearchStrategy[bytes]:
    """Dump requests: every field, of the right and of the wrong types and ranges."""
    key = st.one_of(st.integers(), st.text(max_size=8), st.lists(
        st.one_of(st.integers(), st.text(max_size=4), st.none(), st.booleans()), max_size=3))
    fields = st.fixed_dictionaries({}, optional={
        "sources": st.one_of(st.just([SOURCE]), st.just(SOURCE), source_lists([SOURCE]),
                             st.lists(st.text(max_size=12), max_size=3), st.integers()),
        "buffer": st.one_of(st.just("load"), st.text(max_size=6), st.integers(), st.none()),
        "keys": st.one_of(st.lists(key, max_size=4), st.integers(), st.text(max_size=5)),
        "chunk_rows": st.one_of(st.integers(-5, 2_000_000), st.booleans(), st.text(max_size=3)),
        "delay_ms": st.one_of(st.integers(-5, 4_000_000), st.floats(allow_nan=False)),
        "other": st.integers(),
    })
    return st.one_of(fields.map(lambda d: json.dumps(d).encode()), bodies())


@fuzz_settings(150)
@given(body=_dump_bodies(), action=st.sampled_from(["", "pause", "resume", "cancel"]),
       ident=st.one_of(st.just("0123abcd"), st.text(max_size=40).map(
           lambda t: t.encode("utf-8", "surrogatepass").hex()[:40]),
           st.sampled_from(["..", "%00", "ABC", "x" * 33])))
def test_dump_endpoints(relay: str, body: bytes, action: str, ident: str) -> None:
    """Dumps of the synthetic source fail at once (it cannot be dumped); every request
    about them, valid or not, gets a documented answer."""
    auth = ((b"Authorization", f"Bearer {ADMIN_TOKEN}".encode()),)
    path = f"/v1/admin/dumps/{ident}/{action}" if action else "/v1/admin/dumps"
    request = Request("POST", path, headers=auth, body=body)
    assume(fits(request))
    status, headers, payload = send(relay, request)
    check_response(request, status, headers, payload, RELAY_ERRORS)
    if status == 201:
        ident = json.loads(payload)["id"]
    for follow in (Request("GET", f"/v1/dumps/{ident}"), Request("GET", "/v1/dumps"),
                   Request("POST", f"/v1/admin/dumps/{ident}/cancel", headers=auth)):
        if fits(follow):
            check_response(follow, *send(relay, follow), RELAY_ERRORS)


def test_fuzz_helpers_see_a_5xx(tmp_path: Path) -> None:
    """The property can fail: a 500 or an undocumented code is reported."""
    request = Request("GET", "/x")
    with pytest.raises(AssertionError):
        check_response(request, 500, {"content-type": "application/json"},
                       b'{"error": "internal_error", "message": ""}', RELAY_ERRORS)
    with pytest.raises(AssertionError):
        check_response(request, 400, {"content-type": "application/json"},
                       b'{"error": "bad_event", "message": ""}', RELAY_ERRORS)
    with pytest.raises(AssertionError):
        check_response(request, 400, {"content-type": "text/plain"}, b"400: Bad", RELAY_ERRORS)
