"""Who may read what from a bootstrap service (DESIGN 18, docs/bootstrap.md
"Security"), on real servers in this process: a relay with a synthetic source
(``shop.a``, ``shop.b``), a bootstrap service with ``[bootstrap.tls]`` (the ``pki``
fixture's CA), ``[[bootstrap.readers]]`` and a metrics token, and its producer reading
a relay served over TLS that asks for a reader's token.

The relay in these tests is served over TLS by the test and guarded by a small
middleware (``Gate``) that asks for the token, so that the producer's credentials are
tested whether or not the relay enforces its own ``[[relay.readers]]`` yet: the same
readers are in the relay's config, so a relay that enforces them makes the test only
stronger.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from databus.bootstrap._service import build_app, listener_tls, open_configured_storage
from databus.config import BootstrapConfig, RelayConfig, Secret, from_mapping
from databus.config._security import ReaderConfig, TLSConfig
from databus.event import iter_events
from databus.relay._relay import Relay
from databus.relay._server import create_app
from databus.security import ClientCredentials, client_session, server_context
from tests.fixtures._certs import PKI
from tests.integration.test_bootstrap_service import synthetic
from tests.relay_harness import relay_config
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

ALL, A_ONLY, ELSEWHERE = "tok-all-3f9c1d", "tok-a-only-77ab20", "tok-elsewhere-51e0c4"
METRICS = "tok-metrics-c0ffee"
ADMIN = "tok-admin-abad1d"


# -- a relay over TLS that asks for a reader's token -------------------------------------


@dataclass
class Gate:
    """What the test relay accepts: token -> "ok" or "forbidden" (403 on /v1/stream),
    and every request it saw: (path, over TLS, token sent)."""

    tokens: dict[str, str]
    seen: list[tuple[str, bool, str | None]] = field(default_factory=list)

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def gate(request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
            auth = request.headers.get("Authorization")
            token = auth.removeprefix("Bearer ") if auth else None
            self.seen.append((request.path, request.secure, token))
            if request.path in ("/healthz", "/readyz"):
                return await handler(request)
            kind = self.tokens.get(token) if token else None
            if kind is None:
                return web.json_response({"error": "unauthorized", "message":
                                          "the credential given matches no reader"},
                                         status=401)
            if kind == "forbidden" and request.path == "/v1/stream":
                return web.json_response({"error": "forbidden", "message":
                                          "reader 'narrow' is not granted shop.b"},
                                         status=403)
            return await handler(request)
        return gate


@dataclass
class TLSRelay:
    url: str
    relay: Relay
    gate: Gate


def relay_readers(gate: Gate) -> tuple[ReaderConfig, ...]:
    """The gate's tokens as the relay's own ``[[relay.readers]]``."""
    return tuple(ReaderConfig(name=f"reader{i}", token=Secret(token),
                              sources=("shop.*",) if kind == "ok" else ("shop.a",))
                 for i, (token, kind) in enumerate(sorted(gate.tokens.items())))


@asynccontextmanager
async def tls_relay(config: RelayConfig, pki: PKI, gate: Gate) -> AsyncIterator[TLSRelay]:
    """The relay of ``config`` served over HTTPS (the pki's server certificate for
    localhost) behind ``gate``."""
    relay = Relay(config, backoff_initial=0.05, backoff_max=0.5)
    app = create_app(relay)
    app.middlewares.append(gate.middleware())
    context = server_context(TLSConfig(cert_file=pki.server.cert, key_file=pki.server.key))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    port = runner.addresses[0][1]
    try:
        yield TLSRelay(f"https://localhost:{port}", relay, gate)
    finally:
        await runner.cleanup()


async def relay_scn(relay: TLSRelay, pki: PKI, token: str) -> int | None:
    creds = ClientCredentials.of(ca_file=pki.ca, token=token)
    async with client_session(creds) as session, session.get(relay.url + "/v1/status") as resp:
        doc = await resp.json()
    scn = doc["buffers"]["shop"]["max_scn"]
    return None if scn is None else int(scn)


# -- a bootstrap service over TLS with readers --------------------------------------------


@dataclass
class Service:
    url: str
    config: BootstrapConfig
    pki: PKI

    def session(self, token: str | None = None) -> aiohttp.ClientSession:
        return client_session(ClientCredentials.of(ca_file=self.pki.ca, token=token))

    async def get(self, path: str, token: str | None = None, **params: str
                  ) -> tuple[int, Any, dict[str, str]]:
        async with self.session(token) as session, session.get(self.url + path,
                                                               params=params) as resp:
            body = await resp.read()
            try:
                doc: Any = json.loads(body)
            except ValueError:
                doc = body
            return resp.status, doc, dict(resp.headers)


@asynccontextmanager
async def tls_bootstrap(tmp_path: Path, pki: PKI, relay_url: str, *, cert: Path | None = None,
                        key: Path | None = None, **extra: Any) -> AsyncIterator[Service]:
    data: dict[str, Any] = {
        "storage": f"sqlite:///{tmp_path / 'bootstrap.db'}", "port": 0,
        "admin_token": ADMIN, "metrics_token": METRICS,
        "tls": {"cert_file": str(cert or pki.server.cert),
                "key_file": str(key or pki.server.key)},
        "readers": [{"name": "everything", "token": ALL, "sources": ["shop.*"]},
                    {"name": "a-only", "token": A_ONLY, "sources": ["shop.a"]},
                    {"name": "elsewhere", "token": ELSEWHERE, "sources": ["other.*"]}],
        "producer": {"relays": [relay_url], "poll_wait_ms": 100, "max_bytes": 64 * 1024,
                     "ca_file": str(pki.ca), "token": ALL},
        "applier": {"batch_rows": 97, "poll_interval_ms": 20},
        "server": {"batch_rows": 50}}
    data.update(extra)
    config = from_mapping(BootstrapConfig, data)
    storage = open_configured_storage(config)
    tls = listener_tls(config)
    assert tls is not None
    runner = web.AppRunner(build_app(config, storage, tls, cert_check_s=0.1))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
    port = runner.addresses[0][1]
    try:
        yield Service(f"https://localhost:{port}", config, pki)
    finally:
        await runner.cleanup()


async def wait_applied(service: Service, scn: int) -> None:
    async def reached() -> bool:
        status, doc, _ = await service.get("/v1/status", METRICS)
        assert status == 200, doc
        return doc["applied_scn"] is not None and doc["applied_scn"] >= scn

    await async_wait_until(reached, f"the bootstrap applier at SCN {scn}", 60,
                           max_interval=0.1)


async def bootstrap_sources(service: Service, token: str, **params: str
                            ) -> tuple[set[int], list[str]]:
    """A whole bootstrap conversation as ``token``'s reader: the source ids of the
    events served and the phases seen."""
    cp = '{"window_scn": -1}'
    ids: set[int] = set()
    phases: list[str] = []
    for _ in range(1000):
        status, body, headers = await service.get("/v1/bootstrap/stream", token,
                                                  checkpoint=cp, max_bytes="4000", **params)
        assert status == 200, body
        ids |= {h.source_id for _, h in iter_events(body) if not h.is_control}
        cp = headers["X-Databus-Checkpoint"]
        phases.append(headers["X-Databus-Bootstrap-Phase"])
        if phases[-1] == "done":
            return ids, phases
    raise AssertionError("the bootstrap never finished")


def _async(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    import functools

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))
    return run


# -- the tests ----------------------------------------------------------------------------


@_async
async def test_readers_are_asked_on_every_read_and_get_only_their_sources(
        tmp_path: Path, pki: PKI) -> None:
    gate = Gate({ALL: "ok"})
    config = relay_config(tmp_path, {"shop": synthetic(300)}, readers=relay_readers(gate))
    async with tls_relay(config, pki, gate) as relay, \
            tls_bootstrap(tmp_path, pki, relay.url) as service:
        await async_wait_until(lambda: _at(relay, pki, 300), "the relay at SCN 300", 30)
        await wait_applied(service, 300)
        status, doc, _ = await service.get("/v1/bootstrap/sources", ALL)
        assert status == 200
        ids = {s["name"]: s["id"] for s in doc["sources"]}
        assert set(ids) == {"shop.a", "shop.b"}
        fps = {s["name"]: s["schema_fingerprint"] for s in doc["sources"]}
        stream = "/v1/bootstrap/stream"
        start = {"checkpoint": '{"window_scn": -1}'}

        # No credential, a wrong one, or one in the wrong place: 401 on every read.
        for token in (None, ALL[:-1] + "x", "Basic " + ALL):
            for path, params in ((stream, {**start, "sources": "shop.a"}),
                                 ("/v1/bootstrap/sources", {}),
                                 (f"/v1/bootstrap/schemas/{fps['shop.a']}", {})):
                status, body, _ = await service.get(path, token, **params)
                assert (status, body["error"]) == (401, "unauthorized"), (path, token, body)
        # Before a bad request is looked at: who asks comes first.
        status, body, _ = await service.get(stream, None, checkpoint="{nope")
        assert status == 401

        # A reader granted shop.a only.
        status, doc, _ = await service.get("/v1/bootstrap/sources", A_ONLY)
        assert [s["name"] for s in doc["sources"]] == ["shop.a"]
        for sources in ("shop.b", "shop.a,shop.b", "shop.zzz"):
            # shop.zzz does not exist: 403 all the same, so a reader learns nothing of
            # the sources it is not granted.
            status, body, _ = await service.get(stream, A_ONLY, **start, sources=sources)
            assert (status, body["error"]) == (403, "forbidden"), (sources, body)
            assert A_ONLY not in json.dumps(body)
        # A filter never widens: it may not even name a source not granted.
        status, body, _ = await service.get(
            stream, A_ONLY, **start, sources="shop.a",
            filter='{"shop.b": {"type": "mod", "n": 2, "buckets": [0]}}')
        assert (status, body["error"]) == (403, "forbidden"), body
        # A snapshot (or catch-up) request resumed with a checkpoint another reader got,
        # for a source not granted: 403 as well.
        _, _, headers = await service.get(stream, ALL, **start, sources="shop.b",
                                          max_bytes="2000")
        mid = headers["X-Databus-Checkpoint"]
        assert json.loads(mid)["mode"] == "bootstrap_snapshot"
        status, body, _ = await service.get(stream, A_ONLY, checkpoint=mid, sources="shop.b")
        assert (status, body["error"]) == (403, "forbidden")
        status, body, _ = await service.get(f"/v1/bootstrap/schemas/{fps['shop.b']}", A_ONLY)
        assert (status, body["error"]) == (403, "forbidden"), body
        status, body, _ = await service.get(f"/v1/bootstrap/schemas/{fps['shop.a']}", A_ONLY)
        assert status == 200 and body["fingerprint"] == fps["shop.a"]
        # Naming no source: narrowed to the granted ones, snapshot and catch-up alike.
        seen, phases = await bootstrap_sources(service, A_ONLY)
        assert seen == {ids["shop.a"]} and "snapshot" in phases, (seen, phases)
        seen, _ = await bootstrap_sources(service, A_ONLY, sources="shop.a")
        assert seen == {ids["shop.a"]}
        seen, _ = await bootstrap_sources(service, ALL)
        assert seen == {ids["shop.a"], ids["shop.b"]}
        # Granted nothing of this store: refused, not an empty answer.
        status, body, _ = await service.get(stream, ELSEWHERE, **start)
        assert (status, body["error"]) == (403, "forbidden"), body
        status, doc, _ = await service.get("/v1/bootstrap/sources", ELSEWHERE)
        assert (status, doc["sources"]) == (200, [])

        # Operational pages: /healthz and /readyz open; /metrics and /v1/status take the
        # metrics token, the admin token or a reader's credential.
        for path in ("/healthz", "/readyz"):
            status, _, _ = await service.get(path)
            assert status == 200, path
        for path in ("/metrics", "/v1/status"):
            status, body, _ = await service.get(path)
            assert status == 401, path
            status, body, _ = await service.get(path, "not-" + METRICS)
            assert status == 401, path
            for token in (METRICS, ADMIN, A_ONLY):
                status, _, _ = await service.get(path, token)
                assert status == 200, (path, token)
        # Admin keeps the admin token: a reader's is not enough.
        async with service.session(ALL) as session, session.post(
                service.url + "/v1/admin/retain") as resp:
            assert resp.status == 401
        async with service.session(ADMIN) as session, session.post(
                service.url + "/v1/admin/retain") as resp:
            assert resp.status == 200, await resp.text()


def _at(relay: TLSRelay, pki: PKI, scn: int) -> Awaitable[bool]:
    async def reached() -> bool:
        got = await relay_scn(relay, pki, ALL)
        return got is not None and got >= scn
    return reached()


@_async
async def test_tls_is_verified_and_a_renewed_certificate_is_served_without_restart(
        tmp_path: Path, pki: PKI) -> None:
    cert, key = tmp_path / "served.crt", tmp_path / "served.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    gate = Gate({ALL: "ok"})
    config = relay_config(tmp_path, {"shop": synthetic(20)}, readers=relay_readers(gate))
    async with tls_relay(config, pki, gate) as relay, \
            tls_bootstrap(tmp_path, pki, relay.url, cert=cert, key=key,
                          run=["server"]) as service:
        status, _, _ = await service.get("/healthz")
        assert status == 200
        port = int(service.url.rsplit(":", 1)[1])
        # Plain HTTP to the TLS port gets no answer; a client that does not trust the
        # CA (the system's CAs, or another CA) refuses the server.
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(aiohttp.ClientError):
                async with plain.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    await resp.read()
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with plain.get(service.url + "/healthz") as resp:
                    await resp.read()
        other = client_session(ClientCredentials.of(ca_file=pki.other_ca))
        async with other:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with other.get(service.url + "/healthz") as resp:
                    await resp.read()

        # (The handshake blocks: in a thread, the server runs on this loop.)
        before = await asyncio.to_thread(_served_certificate, port, pki)
        assert before == ssl.PEM_cert_to_DER_cert(pki.server.cert.read_text())
        renewed = pki.server_for("renewed")
        shutil.copy(renewed.key, key)
        shutil.copy(renewed.cert, cert)
        expected = ssl.PEM_cert_to_DER_cert(renewed.cert.read_text())

        async def renewed_served() -> bool:
            return await asyncio.to_thread(_served_certificate, port, pki) == expected

        await async_wait_until(renewed_served, "the renewed certificate served", 20)
        status, _, _ = await service.get("/healthz")  # and it still verifies
        assert status == 200


def _served_certificate(port: int, pki: PKI) -> bytes:
    context = ssl.create_default_context(cafile=str(pki.ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            context.wrap_socket(sock, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


@_async
async def test_the_producer_reads_a_tls_relay_with_its_token(tmp_path: Path, pki: PKI) -> None:
    gate = Gate({ALL: "ok"})
    config = relay_config(tmp_path, {"shop": synthetic(200)}, readers=relay_readers(gate))
    async with tls_relay(config, pki, gate) as relay, \
            tls_bootstrap(tmp_path, pki, relay.url) as service:
        await wait_applied(service, 200)
        _, doc, _ = await service.get("/v1/status", METRICS)
        assert doc["components"]["producer"]["state"] == "running"
        # Every request of the producer came over TLS with its token.
        assert gate.seen and all(secure and token == ALL for _, secure, token in gate.seen)
        assert {path for path, _, _ in gate.seen} >= {"/v1/sources", "/v1/stream"}


@pytest.mark.parametrize("token, state", [(None, "unauthorized"),
                                          ("tok-revoked-9911aa", "unauthorized"),
                                          ("tok-narrow-0b0b0b", "forbidden")])
def test_a_refused_producer_says_so_and_does_not_hammer_the_relay(
        tmp_path: Path, pki: PKI, token: str | None, state: str) -> None:
    async def main() -> None:
        gate = Gate({ALL: "ok", "tok-narrow-0b0b0b": "forbidden"})
        config = relay_config(tmp_path, {"shop": synthetic(50)}, readers=relay_readers(gate))
        async with tls_relay(config, pki, gate) as relay:
            producer: dict[str, Any] = {"relays": [relay.url], "poll_wait_ms": 100,
                                        "ca_file": str(pki.ca)}
            if token is not None:
                producer["token"] = token
            async with tls_bootstrap(tmp_path, pki, relay.url, producer=producer) as service:
                async def refused() -> bool:
                    _, doc, _ = await service.get("/v1/status", METRICS)
                    return bool(doc["components"]["producer"]["state"] == state)

                await async_wait_until(refused, f"the producer {state}", 20)
                status, doc, _ = await service.get("/readyz")
                assert status == 503
                [entry] = [c for c in doc["components"] if c["component"] == "producer"]
                assert entry["error"] == f"producer_{state}"
                assert relay.url in entry["message"] and "Fix:" in entry["message"]
                assert "[bootstrap.producer]" in entry["message"] or \
                    "[[relay.readers]]" in entry["message"]
                assert entry["fix"]
                # Asked again every 30 s, not in a loop: over two seconds, at most the
                # requests of one attempt.
                before = len(gate.seen)
                await asyncio.sleep(2)
                assert len(gate.seen) - before <= 3, gate.seen[before:]
                if token is not None:
                    assert token not in json.dumps(doc)

    asyncio.run(main())


@_async
async def test_a_reader_proves_itself_by_its_client_certificate(tmp_path: Path,
                                                                pki: PKI) -> None:
    gate = Gate({ALL: "ok"})
    config = relay_config(tmp_path, {"shop": synthetic(100)}, readers=relay_readers(gate))
    replica = pki.client("replica-1")
    async with tls_relay(config, pki, gate) as relay, tls_bootstrap(
            tmp_path, pki, relay.url,
            tls={"cert_file": str(pki.server.cert), "key_file": str(pki.server.key),
                 "client_ca_file": str(pki.ca)},
            readers=[{"name": "everything", "token": ALL, "sources": ["shop.*"]},
                     {"name": "replica", "client_cert_cn": "replica-1",
                      "sources": ["shop.a"]}]) as service:
        await wait_applied(service, 100)

        async def sources(creds: ClientCredentials) -> tuple[int, Any]:
            async with client_session(creds) as session, session.get(
                    service.url + "/v1/bootstrap/sources") as resp:
                return resp.status, await resp.json()

        status, doc = await sources(ClientCredentials.of(
            ca_file=pki.ca, cert_file=replica.cert, key_file=replica.key))
        assert status == 200 and [s["name"] for s in doc["sources"]] == ["shop.a"]
        # A certificate the listener's CA did not sign is refused at the handshake; one it
        # signed for a CN no reader has, and none at all, are 401.
        stranger = pki.other_client("replica-1")
        with pytest.raises(aiohttp.ClientError):
            await sources(ClientCredentials.of(ca_file=pki.ca, cert_file=stranger.cert,
                                               key_file=stranger.key))
        unknown = pki.client("nobody")
        for creds in (ClientCredentials.of(ca_file=pki.ca, cert_file=unknown.cert,
                                           key_file=unknown.key),
                      ClientCredentials.of(ca_file=pki.ca)):
            status, doc = await sources(creds)
            assert (status, doc["error"]) == (401, "unauthorized")
        # A token still works beside certificates (CERT_OPTIONAL).
        status, doc = await sources(ClientCredentials.of(ca_file=pki.ca, token=ALL))
        assert status == 200 and len(doc["sources"]) == 2


def test_a_missing_certificate_file_fails_the_start_in_one_line(tmp_path: Path,
                                                                pki: PKI) -> None:
    import subprocess
    import sys

    config = tmp_path / "bootstrap.toml"
    config.write_text("\n".join([
        "[bootstrap]", f'storage = "sqlite:///{tmp_path / "b.db"}"', "port = 0",
        'run = ["server"]', "[bootstrap.tls]", f'cert_file = "{tmp_path / "nope.crt"}"',
        f'key_file = "{pki.server.key}"']) + "\n")
    run = subprocess.run([str(Path(sys.executable).with_name("databus")), "bootstrap",
                          "--config", str(config)], capture_output=True, timeout=60)
    said = (run.stdout + run.stderr).decode()
    assert run.returncode != 0
    assert "bootstrap.tls.cert_file" in said and "nope.crt" in said, said
    assert "Traceback" not in said and len(said.strip().splitlines()) == 1, said
    assert not (tmp_path / "b.db").exists()  # nothing opened
