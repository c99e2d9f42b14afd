"""The replicator as a client of TLS relays and bootstrap services with readers, and its
own status server over TLS with a metrics token (DESIGN 18, docs/replicator.md
"Security"), on real servers in this process: a SQLite source captured by triggers, a
relay served over TLS behind a token gate (test_bootstrap_security.py's ``tls_relay``),
a bootstrap service with ``[bootstrap.tls]`` and ``[[bootstrap.readers]]``, a SQLite
target.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from databus.config import ReplicateConfig, from_mapping
from databus.errors import ForbiddenError, UnauthorizedError
from databus.relay.dumps import RelayAdmin, RelayAnswerError
from databus.replicator._initial_copy import request_dump
from databus.replicator._replicator import Replicator
from databus.replicator._status import bootstrap_rows
from databus.security import ClientCredentials, client_session
from tests.fixtures._certs import PKI
from tests.integration.test_bootstrap_security import (
    ALL,
    METRICS,
    Gate,
    relay_readers,
    tls_bootstrap,
    tls_relay,
)
from tests.relay_harness import ADMIN_TOKEN, free_port, relay_config
from tests.unit.test_replicator_sqlite import (
    DDL,
    source_rows,
    target_rows,
    target_scn,
    workload,
)
from tests.unit.test_txlog_support import SqliteSource
from tests.waiting import async_wait_until

pytestmark = pytest.mark.integration

REPL_METRICS = "tok-repl-metrics-5ee5"


def replicate_config(pki: PKI, target: Path, relay_url: str, **extra: Any) -> ReplicateConfig:
    data: dict[str, Any] = {
        "name": "shop-copy", "relays": [relay_url], "target": f"sqlite:///{target}",
        "tables": [{"source": "shop.orders"}], "batch_rows": 50, "batch_ms": 50,
        "ca_file": str(pki.ca), "token": ALL,
        "metrics_port": free_port(), "metrics_token": REPL_METRICS,
        "tls": {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)}}
    data.update(extra)
    return from_mapping(ReplicateConfig, data)


async def get(url: str, pki: PKI, token: str | None = None) -> tuple[int, Any]:
    async with client_session(ClientCredentials.of(ca_file=pki.ca, token=token)) as session, \
            session.get(url) as resp:
        text = await resp.text()
        try:
            return resp.status, await resp.json(content_type=None)
        except ValueError:
            return resp.status, text


def test_a_replicator_copies_through_tls_relay_and_bootstrap_with_its_token(
        tmp_path: Path, pki: PKI) -> None:
    src = SqliteSource(tmp_path / "shop.db", DDL)
    src.install("orders")
    target = tmp_path / "replica.db"
    rng = random.Random(31)
    workload(src, rng, 40)

    async def main() -> None:
        gate = Gate({ALL: "ok"})
        relay_cfg = relay_config(tmp_path, {"src": src.uri("orders")},
                                 readers=relay_readers(gate))
        async with tls_relay(relay_cfg, pki, gate) as relay, \
                tls_bootstrap(tmp_path, pki, relay.url) as service:
            config = replicate_config(pki, target, relay.url, bootstrap=[service.url])
            status_url = f"https://localhost:{config.metrics_port}"
            replicator = Replicator(config)
            task = asyncio.create_task(replicator.run_async())
            try:
                await async_wait_until(lambda: task.done() or (
                    target.exists() and target_rows(target) == source_rows(src)
                    and target_scn(target, "shop-copy") is not None),
                    "the target equal to the source", 60,
                    ignore=(sqlite3.OperationalError,))
                assert not task.done(), task.exception()
                # The status server: HTTPS; /v1/status and /metrics need the metrics
                # token, /healthz and /readyz do not.
                for path in ("/v1/status", "/metrics"):
                    for token in (None, "wrong", ALL):
                        status, body = await get(status_url + path, pki, token)
                        assert status == 401, (path, token, body)
                        assert body["error"] == "unauthorized"
                status, doc = await get(status_url + "/v1/status", pki, REPL_METRICS)
                assert status == 200 and doc["state"] == "running", doc
                status, page = await get(status_url + "/metrics", pki, REPL_METRICS)
                assert status == 200 and "databus_replicator_applied_scn" in page
                for path in ("/healthz", "/readyz"):
                    status, _ = await get(status_url + path, pki)
                    assert status == 200, path
                async with aiohttp.ClientSession() as plain:
                    with pytest.raises(aiohttp.ClientError):
                        async with plain.get(f"http://127.0.0.1:{config.metrics_port}"
                                             "/healthz") as resp:
                            await resp.read()
                # The copy came from the bootstrap service, which asks for a reader's
                # credential on every read: the replicator's token, over TLS.
                assert doc["initial_copy"]["state"] == "done", doc["initial_copy"]
                _, served, _ = await service.get("/metrics", METRICS)
                assert 'databus_bootstrap_bootstraps_total{strategy="snapshot"} 1.0' in \
                    served.decode(), served
                # The copy's estimate reads the bootstrap's /v1/status, which asks for a
                # credential too (the metrics token is set): the replicator's works.
                assert await bootstrap_rows([service.url], credentials=config.credentials
                                            ) == {"shop.orders": len(source_rows(src))}
                assert await bootstrap_rows([service.url], credentials=ClientCredentials.of(
                    ca_file=pki.ca)) is None
                # Every request the relay saw came over TLS with the token.
                assert gate.seen and all(secure and token == ALL
                                         for _, secure, token in gate.seen)
                workload(src, rng, 10)  # and it follows the stream
                await async_wait_until(lambda: target_rows(target) == source_rows(src),
                                       "the target following the source", 30)
            finally:
                replicator.stop()
                await asyncio.wait_for(task, 20)

    asyncio.run(main())
    src.close()


@pytest.mark.parametrize("token, error", [("tok-revoked-12ab", UnauthorizedError),
                                          ("tok-narrow-0b0b0b", ForbiddenError)])
def test_a_refused_replicator_stops_and_says_what_to_fix(
        tmp_path: Path, pki: PKI, token: str, error: type[Exception]) -> None:
    src = SqliteSource(tmp_path / "shop.db", DDL)
    src.install("orders")
    workload(src, random.Random(7), 5)

    async def main() -> None:
        gate = Gate({ALL: "ok", "tok-narrow-0b0b0b": "forbidden"})
        relay_cfg = relay_config(tmp_path, {"src": src.uri("orders")},
                                 readers=relay_readers(gate))
        async with tls_relay(relay_cfg, pki, gate) as relay:
            config = replicate_config(pki, tmp_path / "replica.db", relay.url, token=token)
            replicator = Replicator(config)
            task = asyncio.create_task(replicator.run_async())
            status_url = f"https://localhost:{config.metrics_port}"
            try:
                async def stopped() -> Any:
                    status, doc = await get(status_url + "/v1/status", pki, REPL_METRICS)
                    return doc if status == 200 and doc["state"] == "stopped" else None

                doc = await async_wait_until(stopped, "the replicator stopped", 30,
                                             ignore=(aiohttp.ClientError,))
                assert doc["error"] == error.code  # type: ignore[attr-defined]
                assert "reader" in doc["fix"] and "restart" in doc["fix"], doc
                assert token not in repr(doc)
                status, ready = await get(status_url + "/readyz", pki)
                assert status == 503 and not ready["ready"]
                # Stopped: the relay is not asked again and again.
                before = len(gate.seen)
                await asyncio.sleep(1)
                assert len(gate.seen) == before
            finally:
                replicator.stop()
                with pytest.raises(error):
                    await asyncio.wait_for(task, 20)

    asyncio.run(main())
    src.close()


def test_the_dump_request_presents_the_reader_token_and_the_admin_token(
        tmp_path: Path, pki: PKI) -> None:
    """``initial_copy = "dump"``: reads with the reader's token, the dump request with
    the relay's admin token, all over TLS."""
    src = SqliteSource(tmp_path / "shop.db", DDL)
    src.install("orders")

    async def main() -> None:
        gate = Gate({ALL: "ok", ADMIN_TOKEN: "ok"})
        # The relay's readers: ALL only (the admin token is the relay's admin token).
        relay_cfg = relay_config(tmp_path, {"src": src.uri("orders")},
                                 readers=relay_readers(Gate({ALL: "ok"})))
        async with tls_relay(relay_cfg, pki, gate) as relay:
            admin = RelayAdmin(relay.url, ADMIN_TOKEN,
                               credentials=ClientCredentials.of(ca_file=pki.ca, token=ALL))
            listed = await asyncio.to_thread(admin.request, "GET", "/v1/sources")
            assert [s["name"] for s in listed["sources"]] == ["shop.orders"]
            assert gate.seen[-1] == ("/v1/sources", True, ALL)
            await asyncio.to_thread(admin.request, "GET", "/v1/dumps")
            # The admin request carries the admin token (whatever the relay answers).
            with pytest.raises(RelayAnswerError):  # 404: no such endpoint
                await asyncio.to_thread(admin.request, "POST", "/v1/admin/nope", {},
                                        admin=True)
            assert gate.seen[-1] == ("/v1/admin/nope", True, ADMIN_TOKEN)
            wrong = RelayAdmin(relay.url, ADMIN_TOKEN,
                               credentials=ClientCredentials.of(ca_file=pki.ca, token="nope"))
            with pytest.raises(RelayAnswerError) as refused:
                await asyncio.to_thread(wrong.request, "GET", "/v1/sources")
            assert refused.value.status == 401
            # The replicator's dump request turns it into UnauthorizedError (it stops).
            config = replicate_config(pki, tmp_path / "t.db", relay.url, token="nope",
                                      initial_copy="dump", relay_admin_token=ADMIN_TOKEN)
            with pytest.raises(UnauthorizedError):
                await asyncio.to_thread(request_dump, config, (relay.url,))

    asyncio.run(main())
    src.close()


def test_daemons_end_to_end_over_tls_with_readers(tmp_path: Path, pki: PKI) -> None:
    """``databus relay`` with ``[relay.tls]`` and ``[[relay.readers]]``, ``databus
    bootstrap`` whose producer reads it with its token, ``databus replicate`` reading
    both with its own: the target ends equal to the source, and the relay refuses a
    request without a token.
"""
    import ssl
    import subprocess
    import urllib.error
    import urllib.request

    from tests.relay_harness import start_databus
    from tests.waiting import wait_until

    src = SqliteSource(tmp_path / "shop.db", DDL)
    src.install("orders")
    rng = random.Random(11)
    workload(src, rng, 30)
    relay_port, boot_port, repl_port = free_port(), free_port(), free_port()
    tls = [f'cert_file = "{pki.server.cert}"', f'key_file = "{pki.server.key}"']
    (tmp_path / "relay.toml").write_text("\n".join([
        "[relay]", f'data_dir = "{tmp_path / "relay"}"', f"port = {relay_port}",
        "[relay.tls]", *tls,
        "[[relay.buffers]]", 'name = "src"', "capacity_mb = 4",
        f'source = "{src.uri("orders")}"',
        "[[relay.readers]]", 'name = "bootstrap"', 'token = "tok-e2e-producer"',
        'sources = ["shop.*"]',
        "[[relay.readers]]", 'name = "replicator"', 'token = "tok-e2e-replicator"',
        'sources = ["shop.orders"]']) + "\n")
    (tmp_path / "bootstrap.toml").write_text("\n".join([
        "[bootstrap]", f'storage = "sqlite:///{tmp_path / "boot.db"}"', f"port = {boot_port}",
        "[bootstrap.tls]", *tls,
        "[bootstrap.producer]", f'relays = ["https://localhost:{relay_port}"]',
        "poll_wait_ms = 100", f'ca_file = "{pki.ca}"', 'token = "tok-e2e-producer"',
        "[[bootstrap.readers]]", 'name = "replicator"', 'token = "tok-e2e-replicator"',
        'sources = ["shop.*"]']) + "\n")
    target = tmp_path / "replica.db"
    (tmp_path / "replicate.toml").write_text("\n".join([
        "[replicate]", 'name = "shop-copy"', f'relays = ["https://localhost:{relay_port}"]',
        f'bootstrap = ["https://localhost:{boot_port}"]', f'target = "sqlite:///{target}"',
        f'ca_file = "{pki.ca}"', 'token = "tok-e2e-replicator"', "batch_ms = 50",
        f"metrics_port = {repl_port}", 'metrics_token = "tok-e2e-metrics"',
        "[replicate.tls]", *tls,
        "[[replicate.tables]]", 'source = "shop.orders"']) + "\n")
    context = ssl.create_default_context(cafile=str(pki.ca))

    def status_of(url: str, token: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        timeout=10, context=context) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(start_databus(["relay", "--config", str(tmp_path / "relay.toml")],
                                   relay_port, tmp_path / "relay.log"))
        relay = f"https://localhost:{relay_port}"
        assert status_of(relay + "/healthz") == 200
        assert status_of(relay + "/v1/sources") == 401
        assert status_of(relay + "/v1/sources", "tok-e2e-replicator") == 200
        procs.append(start_databus(["bootstrap", "--config", str(tmp_path / "bootstrap.toml")],
                                   boot_port, tmp_path / "bootstrap.log"))
        procs.append(start_databus(["replicate", "--config", str(tmp_path / "replicate.toml")],
                                   repl_port, tmp_path / "replicate.log"))
        wait_until(lambda: target.exists() and _equal(target, src), "the target equal to "
                   "the source", 60, ignore=(sqlite3.OperationalError,))
        workload(src, rng, 10)
        wait_until(lambda: _equal(target, src), "the target following the source", 60,
                   ignore=(sqlite3.OperationalError,))
        status_url = f"https://localhost:{repl_port}/v1/status"
        assert status_of(status_url) == 401
        assert status_of(status_url, "tok-e2e-metrics") == 200
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        src.close()


def _equal(target: Path, src: SqliteSource) -> bool:
    return target_rows(target) == source_rows(src) and target_scn(target, "shop-copy") \
        is not None


def test_a_missing_status_certificate_stops_the_replicator_before_the_target(
        tmp_path: Path, pki: PKI) -> None:
    from databus.security import TLSFileError

    config = replicate_config(pki, tmp_path / "replica.db", "https://localhost:1",
                              tls={"cert_file": str(tmp_path / "nope.crt"),
                                   "key_file": str(pki.server.key)})
    with pytest.raises(TLSFileError, match=r"replicate\.tls\.cert_file.*nope\.crt"):
        asyncio.run(Replicator(config).run_async())
    assert not (tmp_path / "replica.db").exists()  # the target was not opened
