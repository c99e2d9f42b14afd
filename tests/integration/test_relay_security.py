"""The relay's readers and TLS (DESIGN 18, docs/relay.md "Security"), on a real relay
app served over TLS in this process: who may read what on every endpoint, narrowing of
subscriptions to a reader's grant, mutual TLS, and what a wrong client gets.

The relay's buffer ``shop`` holds ``shop.orders`` and ``shop.items`` (synthetic source,
a fixed number of windows). Readers: ``orders`` (token, ``shop.orders``), ``shop``
(token, ``shop.*``), ``all`` (token, ``*``), ``other`` (token, ``other.*``), ``svc``
(certificate CN ``svc-orders``, ``shop.orders``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from databus._serving import AppRunner
from databus.config import ReaderConfig, Secret, TLSConfig
from databus.event import iter_events
from databus.relay._access import tls_for
from databus.relay._relay import Relay
from databus.relay._server import RESTRICTED_HEADER, create_app
from databus.security import client_context
from tests.fixtures._certs import PKI
from tests.relay_harness import relay_config
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

TOKENS = {"orders": "tok-orders-7f3a9", "shop": "tok-shop-c41e2", "all": "tok-all-99b01",
          "other": "tok-other-5d6e7"}
METRICS_TOKEN = "tok-metrics-0aa3c"
WINDOWS = 30


def readers() -> tuple[ReaderConfig, ...]:
    grants = {"orders": ("shop.orders",), "shop": ("shop.*",), "all": ("*",),
              "other": ("other.*",)}
    return (*(ReaderConfig(name=n, sources=grants[n], token=Secret(t))
              for n, t in TOKENS.items()),
            ReaderConfig(name="svc", sources=("shop.orders",), client_cert_cn="svc-orders"))


@dataclass
class SecureRelay:
    url: str
    port: int
    pki: PKI
    relay: Relay

    def session(self, token: str | None = None, cert: Any = None) -> aiohttp.ClientSession:
        context = client_context(self.pki.ca, cert.cert if cert else None,
                                 cert.key if cert else None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context),
                                     headers=headers)

    async def get(self, path: str, token: str | None = None, cert: Any = None,
                  **params: str) -> tuple[int, dict[str, str], bytes]:
        async with self.session(token, cert) as session, \
                session.get(self.url + path, params=params) as resp:
            return resp.status, dict(resp.headers), await resp.read()

    async def json(self, path: str, token: str | None = None, **params: str) -> Any:
        status, _, body = await self.get(path, token, **params)
        assert status == 200, body
        return json.loads(body)


@asynccontextmanager
async def secure_relay(tmp_path: Path, pki: PKI) -> AsyncIterator[SecureRelay]:
    config = relay_config(
        tmp_path, {"shop": f"synthetic://?rate=0&limit={WINDOWS}&events_per_window=2"
                           "&keys=50&source=shop.orders,shop.items"},
        tls=TLSConfig(cert_file=pki.server.cert, key_file=pki.server.key,
                      client_ca_file=pki.ca),
        readers=readers(), metrics_token=Secret(METRICS_TOKEN))
    relay = Relay(config, backoff_initial=0.05, backoff_max=0.5)
    app = create_app(relay)
    runner = AppRunner(app)
    await runner.setup()
    context, _ = tls_for(config)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        secure = SecureRelay(f"https://localhost:{port}", port, pki, relay)

        async def filled() -> bool:
            doc = await secure.json("/v1/status", METRICS_TOKEN)
            return doc["buffers"]["shop"]["max_scn"] == WINDOWS

        await async_wait_until(filled, "the synthetic windows", 20, max_interval=0.05)
        yield secure
    finally:
        await runner.cleanup()


def with_relay(tmp_path: Path, pki: PKI,
               body: Callable[[SecureRelay], Awaitable[None]]) -> None:
    async def main() -> None:
        async with secure_relay(tmp_path, pki) as relay:
            await body(relay)

    asyncio.run(main())


def error_of(body: bytes) -> str:
    return str(json.loads(body)["error"])


async def ids(secure: SecureRelay) -> dict[str, int]:
    doc = await secure.json("/v1/sources", TOKENS["all"])
    return {s["name"]: s["id"] for s in doc["sources"]}


def data_sources(body: bytes) -> list[int]:
    return [h.source_id for _, h in iter_events(body) if h.source_id >= 0]


def test_no_or_wrong_credential_is_401_and_health_stays_open(tmp_path: Path, pki: PKI) -> None:
    async def body(secure: SecureRelay) -> None:
        for path in ("/v1/stream", "/v1/sources", "/v1/schemas?source=shop.orders",
                     "/v1/consumers"):
            status, _, body = await secure.get(path)
            assert (status, error_of(body)) == (401, "unauthorized"), (path, body)
            status, _, body = await secure.get(path, "tok-orders-7f3a8")  # one char off
            assert (status, error_of(body)) == (401, "unauthorized"), (path, body)
            assert b"tok-orders" not in body
        for path in ("/healthz", "/readyz"):
            assert (await secure.get(path))[0] == 200
        # An admin endpoint does not take a reader's token.
        async with secure.session(TOKENS["all"]) as session, \
                session.post(secure.url + "/v1/admin/flush") as resp:
            assert resp.status == 401

    with_relay(tmp_path, pki, body)


def test_ungranted_sources_are_403(tmp_path: Path, pki: PKI) -> None:
    async def body(secure: SecureRelay) -> None:
        orders = TOKENS["orders"]
        status, _, body = await secure.get("/v1/stream", orders, sources="shop.items")
        assert (status, error_of(body)) == (403, "forbidden")
        status, _, body = await secure.get("/v1/stream", orders, sources="shop.orders,shop.items",
                                           follow="true")
        assert (status, error_of(body)) == (403, "forbidden")
        # A filter cannot widen the grant.
        status, _, body = await secure.get(
            "/v1/stream", orders, sources="shop.orders",
            filter='{"shop.items": {"type": "hash", "n": 2, "buckets": [0]}}')
        assert (status, error_of(body)) == (403, "forbidden"), body
        status, _, body = await secure.get("/v1/schemas", orders, source="shop.items")
        assert (status, error_of(body)) == (403, "forbidden")
        items_fp = (await secure.json("/v1/schemas", TOKENS["all"],
                                      source="shop.items"))["versions"][0]["fingerprint"]
        orders_fp = (await secure.json("/v1/schemas", orders,
                                       source="shop.orders"))["versions"][0]["fingerprint"]
        status, _, body = await secure.get(f"/v1/schemas/{items_fp}", orders)
        assert (status, error_of(body)) == (403, "forbidden")
        if items_fp != orders_fp:
            assert (await secure.get(f"/v1/schemas/{orders_fp}", orders))[0] == 200
        # A reader granted nothing in the buffer gets nothing from it.
        status, _, body = await secure.get("/v1/stream", TOKENS["other"])
        assert (status, error_of(body)) == (403, "forbidden")
        assert (await secure.json("/v1/sources", TOKENS["other"]))["sources"] == []

    with_relay(tmp_path, pki, body)


def test_a_subscription_without_sources_is_narrowed_to_the_grant(tmp_path: Path, pki: PKI) -> None:
    async def body(secure: SecureRelay) -> None:
        known = await ids(secure)
        _, _, everything = await secure.get("/v1/stream", TOKENS["all"], max_bytes=str(1 << 22))
        assert set(data_sources(everything)) == {known["shop.orders"], known["shop.items"]}
        for follow in ("false", "true"):
            params = {"max_bytes": str(1 << 22)}
            if follow == "true":
                params["follow"] = "true"
                async with secure.session(TOKENS["orders"]) as session, \
                        session.get(secure.url + "/v1/stream", params=params) as resp:
                    assert resp.status == 200
                    assert resp.headers[RESTRICTED_HEADER] == "1"
                    body = b""
                    while max((h.scn for _, h in iter_events(body)), default=0) < WINDOWS:
                        body += await asyncio.wait_for(resp.content.readany(), 10)
            else:
                status, headers, body = await secure.get("/v1/stream", TOKENS["orders"], **params)
                assert status == 200 and headers[RESTRICTED_HEADER] == "1"
            got = data_sources(body)
            assert got and set(got) == {known["shop.orders"]}, follow
            assert len(got) == data_sources(everything).count(known["shop.orders"])
        # Every source of the buffer granted: nothing narrowed, nothing missing.
        status, headers, body = await secure.get("/v1/stream", TOKENS["shop"],
                                                 max_bytes=str(1 << 22))
        assert status == 200 and data_sources(body) == data_sources(everything)
        # Explicit sources too: a restricted reader's windows are never checked whole.
        assert (await secure.get("/v1/stream", TOKENS["orders"],
                                 sources="shop.orders"))[1][RESTRICTED_HEADER] == "1"
        assert RESTRICTED_HEADER not in (await secure.get("/v1/stream", TOKENS["all"]))[1]
        listed = await secure.json("/v1/sources", TOKENS["orders"])
        assert [s["name"] for s in listed["sources"]] == ["shop.orders"]

    with_relay(tmp_path, pki, body)


def test_mutual_tls_reader_and_refused_certificates(tmp_path: Path, pki: PKI) -> None:
    async def body(secure: SecureRelay) -> None:
        pki = secure.pki
        status, _, body = await secure.get("/v1/sources", cert=pki.client("svc-orders"))
        assert status == 200
        assert [s["name"] for s in json.loads(body)["sources"]] == ["shop.orders"]
        status, _, body = await secure.get("/v1/stream", cert=pki.client("svc-orders"),
                                           sources="shop.items")
        assert (status, error_of(body)) == (403, "forbidden")
        # A valid certificate of no reader: 401.
        assert (await secure.get("/v1/sources", cert=pki.client("nobody")))[0] == 401
        # Expired, or from another CA: the handshake fails (TLS 1.3: at the first read).
        for cert in (pki.expired_client("svc-orders"), pki.other_client("svc-orders")):
            with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
                await secure.get("/v1/sources", cert=cert)
        # A client that does not trust the relay's CA does not talk to it.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                ssl=client_context(pki.other_ca))) as session:
            with pytest.raises(aiohttp.ClientError):
                await session.get(secure.url + "/healthz")
        assert (await secure.get("/v1/sources", TOKENS["orders"]))[0] == 200  # still serving

    with_relay(tmp_path, pki, body)


def test_plain_http_to_the_tls_port_gets_no_data(tmp_path: Path, pki: PKI,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    async def body(secure: SecureRelay) -> None:
        caplog.set_level(logging.DEBUG)

        def plain() -> bytes:
            with socket.create_connection(("127.0.0.1", secure.port), timeout=5) as sock:
                sock.sendall(b"GET /v1/sources HTTP/1.1\r\nHost: x\r\nAuthorization: "
                             b"Bearer " + TOKENS["all"].encode()
                             + b"\r\nConnection: close\r\n\r\n")
                answer = b""
                try:
                    while chunk := sock.recv(65536):
                        answer += chunk
                except (TimeoutError, ConnectionError):
                    pass
                return answer

        for _ in range(5):
            answer = await asyncio.to_thread(plain)
            assert b"shop" not in answer and b"HTTP/1.1 200" not in answer
        assert (await secure.get("/v1/sources", TOKENS["orders"]))[0] == 200
        text = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
        assert "Traceback" not in text and caplog.text.count("Traceback") == 0
        assert sum(1 for r in caplog.records if r.levelno >= logging.WARNING) <= 1, text

    with_relay(tmp_path, pki, body)


def test_operational_pages_take_the_metrics_token(tmp_path: Path, pki: PKI) -> None:
    async def body(secure: SecureRelay) -> None:
        for path in ("/metrics", "/v1/status", "/v1/dumps"):
            status, _, body = await secure.get(path)
            assert (status, error_of(body)) == (401, "unauthorized"), path
            assert (await secure.get(path, METRICS_TOKEN))[0] == 200, path
            assert (await secure.get(path, TOKENS["orders"]))[0] == 200, path  # a reader
        # The metrics token reads no data.
        status, _, body = await secure.get("/v1/stream", METRICS_TOKEN)
        assert status == 401

    with_relay(tmp_path, pki, body)


def test_consumers_carry_their_reader(tmp_path: Path, pki: PKI) -> None:
    async def body(secure: SecureRelay) -> None:
        for name in ("orders", "shop"):
            status, _, _ = await secure.get("/v1/stream", TOKENS[name], client_id=f"app-{name}")
            assert status == 200
        own = (await secure.json("/v1/consumers", TOKENS["orders"]))["consumers"]
        assert [(c["client_id"], c["reader"]) for c in own] == [("app-orders", "orders")]
        every = (await secure.json("/v1/consumers", TOKENS["all"]))["consumers"]
        assert {(c["client_id"], c["reader"]) for c in every} == {
            ("app-orders", "orders"), ("app-shop", "shop")}
        metrics = (await secure.get("/metrics", METRICS_TOKEN))[2].decode()
        assert 'client_id="app-orders"' in metrics and 'reader="orders"' in metrics
        for token in (*TOKENS.values(), METRICS_TOKEN):
            assert token not in metrics

    with_relay(tmp_path, pki, body)


def test_tokens_are_never_shown(tmp_path: Path, pki: PKI, caplog: pytest.LogCaptureFixture) -> None:
    async def body(secure: SecureRelay) -> None:
        caplog.set_level(logging.DEBUG)
        seen = []
        for path in ("/v1/status", "/metrics", "/v1/consumers", "/v1/sources", "/v1/stream",
                     "/v1/stream?sources=shop.items", "/v1/schemas?source=shop.items"):
            for token in (None, TOKENS["orders"], TOKENS["orders"] + "x", METRICS_TOKEN):
                _, headers, body = await secure.get(path, token)
                seen.append(json.dumps(headers) + body.decode("latin-1"))
        for secret in (*TOKENS.values(), METRICS_TOKEN):
            for text in (*seen, caplog.text):
                assert secret not in text

    with_relay(tmp_path, pki, body)


def test_the_dump_admin_client_talks_tls(tmp_path: Path, pki: PKI) -> None:
    """``databus dump``/``relay heal``'s client: the relay's CA from ``--ca-file``; the
    admin token opens ``/v1/dumps`` under a metrics token."""
    from databus.errors import TLSVerifyError
    from databus.relay.dumps import RelayAdmin
    from databus.relay.dumps._admin_client import RelayAnswerError
    from databus.security import ClientCredentials
    from tests.relay_harness import ADMIN_TOKEN

    async def body(secure: SecureRelay) -> None:
        trusted = ClientCredentials.of(ca_file=pki.ca)
        admin = RelayAdmin(secure.url, ADMIN_TOKEN, credentials=trusted)
        assert await asyncio.to_thread(admin.dumps) == []
        with pytest.raises(RelayAnswerError) as refused:
            await asyncio.to_thread(RelayAdmin(secure.url, credentials=trusted).dumps)
        assert refused.value.status == 401
        with pytest.raises(TLSVerifyError, match="does not verify"):
            await asyncio.to_thread(RelayAdmin(secure.url, ADMIN_TOKEN).dumps)

    with_relay(tmp_path, pki, body)


def test_cluster_members_read_peers_with_the_cluster_credentials(tmp_path: Path,
                                                                  pki: PKI) -> None:
    """``ClusterMember.http_json`` (a follower reading its leader's /v1/status and
    /v1/sources) presents ``[relay.cluster]`` ca_file and token."""
    from databus.config import RelayClusterConfig
    from databus.relay.cluster._member import ClusterMember

    def member(**credentials: Any) -> ClusterMember:
        return ClusterMember(RelayClusterConfig(zookeeper="127.0.0.1:1/x", name="c",
                                                **credentials), "https://me:1")

    async def body(secure: SecureRelay) -> None:
        good = member(ca_file=pki.ca, token=Secret(TOKENS["shop"]))
        status = await asyncio.to_thread(good.http_json, secure.url + "/v1/status")
        assert status["buffers"]["shop"]["max_scn"] == WINDOWS
        sources = await asyncio.to_thread(good.http_json, secure.url + "/v1/sources")
        assert {s["name"] for s in sources["sources"]} == {"shop.orders", "shop.items"}
        with pytest.raises(OSError):  # urllib's HTTPError 401 is an OSError
            await asyncio.to_thread(member(ca_file=pki.ca).http_json,
                                    secure.url + "/v1/sources")
        with pytest.raises(OSError):  # the relay's certificate is not trusted
            await asyncio.to_thread(member(token=Secret(TOKENS["shop"])).http_json,
                                    secure.url + "/v1/sources")

    with_relay(tmp_path, pki, body)
