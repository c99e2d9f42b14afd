"""Fuzz every endpoint of the real bootstrap server on a SQLite store with hypothesis:
no 5xx, every error JSON with a code of docs/bootstrap.md's table (issue 12).

The same tests run on PostgreSQL in tests/integration/test_http_fuzz_bootstrap.py (they
import these functions and give them their own ``boot`` fixture)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

from databus.bootstrap._storage import BootstrapStorage, open_storage
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
from tests.http_support import (
    BOOT_SOURCES,
    BOOT_TOKEN,
    BOOT_WINDOWS,
    BOOTSTRAP_ERRORS,
    RunningBootstrap,
    fill_store,
    running_bootstrap,
)

NAMES = list(BOOT_SOURCES)
EXAMPLES = 150


@dataclass
class Boot:
    url: str
    # Checkpoints this server sent while walking a few bootstraps to their end.
    checkpoints: list[dict[str, Any]]


def walk(url: str, start: dict[str, Any], **params: str) -> list[dict[str, Any]]:
    """Follow one bootstrap from ``start`` to done; every checkpoint on the way."""
    seen = [start]
    cp = start
    for _ in range(200):
        query = tuple({"checkpoint": json.dumps(cp), "max_bytes": "400", **params}.items())
        status, headers, body = send(url, Request("GET", "/v1/bootstrap/stream", query))
        assert status == 200, body
        cp = json.loads(headers["x-databus-checkpoint"])
        seen.append(cp)
        if headers["x-databus-bootstrap-phase"] == "done":
            return seen
    raise AssertionError(f"bootstrap from {start} did not end: {seen[-3:]}")


def serve(storage: BootstrapStorage) -> Iterator[Boot]:
    """The server on ``storage`` in a thread, with checkpoints collected from it."""
    def factory() -> AbstractAsyncContextManager[RunningBootstrap]:
        return running_bootstrap(storage, batch_rows=5)

    with server_thread(factory) as running:
        url = running.url
        collected = walk(url, {"window_scn": -1})
        collected += walk(url, {"window_scn": BOOT_WINDOWS // 2})
        collected += walk(url, {"window_scn": 3}, sources="shop.b,shop.a")
        collected += walk(url, {"window_scn": -1}, filter=json.dumps(
            {"shop.a": {"type": "mod", "n": 2, "buckets": "[1]"}}))
        yield Boot(url, collected)


@pytest.fixture(scope="module")
def boot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boot]:
    storage = open_storage(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'b.db'}")
    fill_store(storage)
    yield from serve(storage)
    storage.close()


@st.composite
def stream_queries(draw: st.DrawFn, boot: Boot) -> tuple[tuple[tuple[str, str], ...], str]:
    params = {
        "checkpoint": json_text(checkpoints(len(NAMES), boot.checkpoints)),
        "filter": json_text(filters(NAMES)),
        "sources": source_lists(NAMES),
        "max_bytes": int_texts(),
    }
    return draw(queries(params))


@fuzz_settings(EXAMPLES)
@given(data=st.data())
def test_bootstrap_stream_parameters(boot: Boot, data: st.DataObject) -> None:
    q = data.draw(stream_queries(boot))
    request = Request("GET", "/v1/bootstrap/stream", q[0], q[1])
    assume(fits(request))
    status, headers, body = send(boot.url, request)
    check_response(request, status, headers, body, BOOTSTRAP_ERRORS)
    event(f"status {status}")  # --hypothesis-show-statistics: how many got through
    if status == 200:
        assert headers["content-type"].startswith("application/x-databus-events")
        json.loads(headers["x-databus-checkpoint"])


@fuzz_settings(EXAMPLES)
@given(path=st.one_of(st.sampled_from(["/v1/bootstrap/sources", "/v1/bootstrap/stream",
                                       "/v1/status", "/metrics", "/healthz", "/v1/nope",
                                       "/v1/admin/retain", "/v1/bootstrap/schemas/", "/"]),
                      fingerprints().map(lambda fp: "/v1/bootstrap/schemas/" + fp)),
       method=st.sampled_from(["GET", "GET", "POST", "PUT", "DELETE"]),
       q=queries({"sources": source_lists(NAMES), "source": source_lists(NAMES)}))
def test_bootstrap_every_endpoint_and_method(
    boot: Boot, path: str, method: str, q: tuple[tuple[tuple[str, str], ...], str]
) -> None:
    request = Request(method, path, q[0], q[1])
    assume(fits(request))
    status, headers, body = send(boot.url, request)
    check_response(request, status, headers, body, BOOTSTRAP_ERRORS)


@fuzz_settings(EXAMPLES // 2)
@given(auth=auth_headers(BOOT_TOKEN), body=bodies())
def test_bootstrap_admin_headers_and_bodies(
    boot: Boot, auth: tuple[tuple[bytes, bytes], ...], body: bytes
) -> None:
    request = Request("POST", "/v1/admin/retain", headers=auth, body=body)
    status, headers, payload = send(boot.url, request)
    check_response(request, status, headers, payload, BOOTSTRAP_ERRORS)
    if not token_ok(auth, BOOT_TOKEN):
        assert status == 401, (auth, status)


def test_the_collected_checkpoints_cover_every_phase(boot: Boot) -> None:
    modes = {cp.get("mode", "online") for cp in boot.checkpoints}
    assert modes == {"online", "bootstrap_snapshot", "bootstrap_catchup"}
    assert any("bootstrap_last_key" in cp for cp in boot.checkpoints)
