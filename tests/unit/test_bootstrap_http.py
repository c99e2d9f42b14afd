"""The bootstrap server's HTTP parameters against the real server on a SQLite store
(issue 12, defects 3-5): every value a client can send is a 200 or a documented 4xx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.bootstrap._storage import BootstrapStorage, open_storage
from tests.http_support import (
    BOOT_TOKEN,
    BOOT_WINDOWS,
    BOOTSTRAP_ERRORS,
    fill_store,
    raw_request,
    running_bootstrap,
)

HUGE_INT = "9" * 5000
DEEP = "[" * 1500


def _snapshot(**fields: object) -> str:
    return json.dumps({"mode": "bootstrap_snapshot", "window_scn": -1,
                       "bootstrap_start_scn": 5, "bootstrap_source_index": 0, **fields})


def _catchup(**fields: object) -> str:
    return json.dumps({"mode": "bootstrap_catchup", "window_scn": 5, "bootstrap_start_scn": 5,
                       "bootstrap_target_scn": 10, "bootstrap_source_index": 0, **fields})


HOSTILE = [
    # Defect 3 on the bootstrap server: RecursionError, int digit limit.
    {"checkpoint": DEEP},
    {"filter": DEEP},
    {"filter": json.dumps({"shop.a": {"type": "mod", "n": 3, "buckets": f"[{HUGE_INT}]"}})},
    {"filter": '{"shop.a": {"type": "mod", "n": 3, "buckets": [' + HUGE_INT + "]}}"},
    # Defect 4: SQLite's OverflowError on SCNs beyond int64.
    {"checkpoint": json.dumps({"window_scn": 2**63})},
    {"checkpoint": json.dumps({"window_scn": 10**30})},
    {"checkpoint": json.dumps({"window_scn": 7, "window_offset": 2**64})},
    {"checkpoint": _snapshot(window_scn=3, bootstrap_since_scn=2**64)},
    {"checkpoint": _catchup(bootstrap_target_scn=2**64)},
    {"checkpoint": _catchup(window_scn=2**64)},
    {"checkpoint": _snapshot(window_scn=3, bootstrap_since_scn=3,
                             bootstrap_last_key=f"{2**70}:00")},
    {"checkpoint": _snapshot(bootstrap_last_key="1:00")},  # a delta key in a full snapshot
    {"checkpoint": _snapshot(bootstrap_last_key=f"{HUGE_INT}:00")},
    {"checkpoint": _snapshot(bootstrap_last_key="\uff11:00")},
    {"checkpoint": _snapshot(bootstrap_last_key="zz")},
    {"checkpoint": _snapshot(bootstrap_source_index=2**70)},
    {"checkpoint": _snapshot(bootstrap_source_index=2)},
    # Was 400 with the undocumented code bad_event (encode_eow refused the SCN).
    {"checkpoint": _snapshot(bootstrap_start_scn=2**64)},
    {"checkpoint": json.dumps({"window_scn": -2})},
    {"max_bytes": HUGE_INT},
    {"max_bytes": "\u0661\u0662"},
    {"sources": "shop.a," + "x" * 1000},
    # A client_id as on the relay: at most 256 characters.
    {"client_id": "x" * 257},
]


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BootstrapStorage]:
    store = open_storage(f"sqlite:///{tmp_path_factory.mktemp('boot') / 'b.db'}")
    fill_store(store)
    yield store
    store.close()


@pytest.mark.parametrize("params", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_parameters_are_bad_request(storage: BootstrapStorage,
                                            params: dict[str, str]) -> None:
    async def main() -> None:
        async with running_bootstrap(storage) as boot, \
                await boot.get("/v1/bootstrap/stream", **params) as resp:
            assert resp.content_type == "application/json", await resp.read()
            body = await resp.json()
            assert resp.status == 400 and body["error"] == "bad_request", (
                params, resp.status, body)
            assert len(body["message"]) < 400

    asyncio.run(main())


def test_int64_extremes_reach_sql_and_work(storage: BootstrapStorage) -> None:
    top = 2**63 - 1

    async def main() -> None:
        async with running_bootstrap(storage) as boot:
            async with await boot.get("/v1/bootstrap/stream",
                                      checkpoint=json.dumps({"window_scn": top})) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers["X-Databus-Bootstrap-Phase"] == "done"
            async with await boot.get("/v1/bootstrap/stream",
                                      checkpoint=_catchup(bootstrap_target_scn=top)) as resp:
                assert resp.status == 200, await resp.text()
                # A target the store never reached is waited for, and says so.
                assert await resp.read() == b""
                assert "behind" in resp.headers["X-Databus-Bootstrap-Waiting"]

    asyncio.run(main())


def test_a_client_id_is_accepted_and_ignored(storage: BootstrapStorage) -> None:
    async def main() -> None:
        async with running_bootstrap(storage) as boot:
            for client_id in ("c" * 256, 'odd "id"\n}\u2603'):
                async with await boot.get("/v1/bootstrap/stream", client_id=client_id,
                                          checkpoint=json.dumps({"window_scn": 7})) as resp:
                    assert resp.status == 200, await resp.text()

    asyncio.run(main())


def test_a_filter_on_an_unknown_source_is_unknown_source_as_on_the_relay(
    storage: BootstrapStorage
) -> None:
    """Defect 5: the bootstrap server served unfiltered data for such a filter."""
    spec = json.dumps({"shop.zzz": {"type": "mod", "n": 2, "buckets": "[0]"}})

    async def main() -> None:
        async with running_bootstrap(storage) as boot:
            for params in ({"filter": spec}, {"filter": spec, "sources": "shop.a"}):
                async with await boot.get("/v1/bootstrap/stream",
                                          checkpoint='{"window_scn": -1}', **params) as resp:
                    assert resp.status == 404
                    body = await resp.json()
                    assert body["error"] == "unknown_source" and "shop.zzz" in body["message"]
            # A filter on a known source that is not requested is accepted (as on the relay).
            ok = json.dumps({"shop.b": {"type": "mod", "n": 2, "buckets": "[0]"}})
            async with await boot.get("/v1/bootstrap/stream", checkpoint='{"window_scn": -1}',
                                      sources="shop.a", filter=ok) as resp:
                assert resp.status == 200

    asyncio.run(main())


def test_repeated_parameters_odd_encodings_and_admin_bodies(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'b.db'}")
    fill_store(storage)

    async def main() -> None:
        async with running_bootstrap(storage) as boot:
            for query in (b"checkpoint=%7B%22window_scn%22%3A-1%7D&checkpoint=%7B%7D",
                          b"sources=shop.a&sources=shop.b", b"checkpoint=%ff",
                          b"filter=%", b"max_bytes=%EF%BC%91"):
                status, _, payload = await raw_request(boot.url, "GET",
                                                       b"/v1/bootstrap/stream?" + query)
                assert (status, json.loads(payload)["error"]) == (400, "bad_request"), query
            token = BOOT_TOKEN.encode()
            for value in (b"Bearer \xed\xa0\x80", b"Bearer " + token + b"\x80", b"\xff"):
                status, _, payload = await raw_request(
                    boot.url, "POST", b"/v1/admin/retain", b"Authorization: " + value + b"\r\n")
                assert (status, json.loads(payload)["error"]) == (401, "unauthorized")
            auth = b"Authorization: Bearer " + token + b"\r\n"
            for body in (b"[" * 1500, b"{" * 5, b"[]", b'{"cut_scn": ' + HUGE_INT.encode() + b"}"):
                status, _, payload = await raw_request(boot.url, "POST", b"/v1/admin/retain",
                                                       auth, body)
                assert (status, json.loads(payload)["error"]) == (400, "bad_request"), body
            status, _, payload = await raw_request(boot.url, "POST", b"/v1/admin/retain", auth)
            assert status == 200, payload
            status, _, payload = await raw_request(boot.url, "GET", b"/v1/admin/retain")
            assert (status, json.loads(payload)["error"]) == (405, "method_not_allowed")
            # The store is fine afterwards: a full snapshot still reads.
            async with await boot.get("/v1/bootstrap/stream",
                                      checkpoint='{"window_scn": -1}') as resp:
                assert resp.status == 200

    asyncio.run(main())
    storage.close()


def test_error_table_in_the_docs_matches_the_codes_the_tests_accept() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "bootstrap.md").read_text()
    for code, status in BOOTSTRAP_ERRORS.items():
        assert f"| `{code}` | {status} |" in doc, code
    assert BOOT_WINDOWS > 0


@pytest.mark.parametrize("path", ["/v1/bootstrap/schemas/" + "9" * 400,
                                  "/v1/bootstrap/schemas/0x" + "f" * 17,
                                  "/v1/bootstrap/schemas/\uff11"])
def test_bad_fingerprints_are_400(storage: BootstrapStorage, path: str) -> None:

    async def main() -> None:
        async with running_bootstrap(storage) as boot, \
                boot.session.get(boot.url + path) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"] == "bad_request"

    asyncio.run(main())
