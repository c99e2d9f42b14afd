"""The relay's security as ``databus relay`` processes run it (DESIGN 18): the start
refused when anyone beyond this machine could read anonymously, TLS and readers in
every worker process (relay.workers > 1), requests a worker forwards to the main
process judged with the client certificate the worker saw, a renewed certificate served
without a restart, and a plain-HTTP client on the TLS port."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from databus.security import client_context
from tests.fixtures._certs import PKI
from tests.relay_harness import free_port, start_databus

pytestmark = pytest.mark.integration

TOKEN = "tok-proc-orders-81c2"
ALL_TOKEN = "tok-proc-all-3b9d"
METRICS_TOKEN = "tok-proc-metrics-77e0"


def write_config(tmp_path: Path, port: int, *, host: str = "127.0.0.1", workers: int = 1,
                 security: str = "", top: str = "") -> Path:
    path = tmp_path / "relay.toml"
    path.write_text("\n".join([
        "[relay]", f"data_dir = {json.dumps(str(tmp_path / 'relay'))}", f"port = {port}",
        f'host = "{host}"', f"workers = {workers}", 'admin_token = "adm-proc-1"', top,
        "[[relay.buffers]]", 'name = "shop"', "capacity_mb = 4",
        'source = "synthetic://?rate=200&keys=50&events_per_window=2'
        '&source=shop.orders,shop.items"', security]) + "\n")
    return path


def secure_section(pki: PKI, cert: Path, key: Path) -> str:
    return "\n".join([
        "[relay.tls]", f"cert_file = {json.dumps(str(cert))}",
        f"key_file = {json.dumps(str(key))}", f"client_ca_file = {json.dumps(str(pki.ca))}",
        "[[relay.readers]]", 'name = "orders"', f'token = "{TOKEN}"',
        'sources = ["shop.orders"]',
        "[[relay.readers]]", 'name = "all"', f'token = "{ALL_TOKEN}"', 'sources = ["*"]',
        "[[relay.readers]]", 'name = "svc"', 'client_cert_cn = "svc-orders"',
        'sources = ["shop.orders"]'])


def databus_exe() -> str:
    return str(Path(sys.executable).with_name("databus"))


def test_anonymous_beyond_loopback_is_refused_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, host="0.0.0.0")
    done = subprocess.run([databus_exe(), "relay", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    said = (done.stderr + done.stdout).strip()
    assert len(said.splitlines()) == 1 and "allow_anonymous_readers" in said, said
    assert "Traceback" not in said
    # --host beyond loopback on the command line: refused the same way.
    config = write_config(tmp_path, port)
    done = subprocess.run([databus_exe(), "relay", "--config", str(config), "--host",
                           "0.0.0.0"], capture_output=True, text=True, timeout=60)
    said = (done.stderr + done.stdout).strip()
    assert done.returncode != 0 and len(said.splitlines()) == 1, said
    assert "allow_anonymous_readers" in said
    # Said so: it starts.
    config = write_config(tmp_path, port, host="0.0.0.0", top="allow_anonymous_readers = true")
    proc = start_databus(["relay", "--config", str(config)], port, tmp_path / "relay.log")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _serial(port: int, ca: Path) -> int:
    context = client_context(ca)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def _plain_http(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /v1/sources HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + ALL_TOKEN.encode() + b"\r\nConnection: close\r\n\r\n")
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionError):
            pass
    return answer


async def _get(url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None
               ) -> tuple[int, dict[str, str], Any]:
    # A new connection each time: the kernel spreads them over the processes.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            ssl=context, force_close=True), headers=headers or {}) as session, \
            session.get(url) as resp:
        body = await resp.read()
        try:
            doc = json.loads(body)
        except ValueError:
            doc = body
        return resp.status, dict(resp.headers), doc


def test_workers_serve_tls_readers_and_a_renewed_certificate(tmp_path: Path,
                                                             pki: PKI) -> None:
    port = free_port()
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    config = write_config(tmp_path, port, workers=2,
                          top=f'metrics_token = "{METRICS_TOKEN}"',
                          security=secure_section(pki, cert, key))
    log_path = tmp_path / "relay.log"
    proc = start_databus(["relay", "--config", str(config)], port, log_path)
    base = f"https://localhost:{port}"
    plain = client_context(pki.ca)
    svc = pki.client("svc-orders")
    mtls = client_context(pki.ca, svc.cert, svc.key)
    try:
        async def main() -> None:
            # Until both processes serve (the worker's header says which answered).
            workers_seen: set[str] = set()
            deadline = time.monotonic() + 30
            while len(workers_seen) < 2 and time.monotonic() < deadline:
                status, headers, _ = await _get(base + "/v1/sources", plain,
                                                {"Authorization": f"Bearer {TOKEN}"})
                if status == 200:
                    workers_seen.add(headers.get("X-Databus-Worker", "main"))
            assert len(workers_seen) == 2, workers_seen
            for _ in range(8):
                status, _, doc = await _get(base + "/v1/stream", plain)
                assert status == 401, doc
                status, _, doc = await _get(base + "/v1/stream?sources=shop.items", plain,
                                            {"Authorization": f"Bearer {TOKEN}"})
                assert status == 403, doc
                status, _, doc = await _get(base + "/v1/sources", mtls)
                assert status == 200 and [s["name"] for s in doc["sources"]] == [
                    "shop.orders"], doc
                # /v1/consumers is served by the main process: forwarded by a worker
                # with the certificate's CN, judged there.
                status, headers, doc = await _get(base + "/v1/consumers", mtls)
                assert status == 200, doc
                # A CN claimed in a header is believed from no client.
                status, _, doc = await _get(base + "/v1/consumers", plain,
                                            {"X-Databus-Forwarded-Cn": "svc-orders"})
                assert status == 401, doc
                status, _, doc = await _get(base + "/metrics", plain)
                assert status == 401, doc
                status, _, _ = await _get(base + "/metrics", plain,
                                          {"Authorization": f"Bearer {METRICS_TOKEN}"})
                assert status == 200
            for _ in range(4):
                answer = await asyncio.to_thread(_plain_http, port)
                assert b"shop" not in answer and b" 200 " not in answer
            status, _, _ = await _get(base + "/v1/sources", plain,
                                      {"Authorization": f"Bearer {TOKEN}"})
            assert status == 200

        asyncio.run(main())
        # Renewal: new files in place; every process serves them to new connections.
        before = _serial(port, pki.ca)
        renewed = pki.server_for("renewed")
        shutil.copy(renewed.key, tmp_path / "new.key")
        shutil.copy(renewed.cert, tmp_path / "new.crt")
        os.replace(tmp_path / "new.key", key)
        os.replace(tmp_path / "new.crt", cert)
        wanted = _serial_of(renewed.cert)
        assert wanted != before
        deadline = time.monotonic() + 20
        seen: list[int] = []
        while time.monotonic() < deadline:
            seen = [_serial(port, pki.ca) for _ in range(12)]
            if set(seen) == {wanted}:
                break
            time.sleep(0.2)
        assert set(seen) == {wanted}, (seen, wanted)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log = log_path.read_text("utf-8", "replace")
    assert "Traceback" not in log, log[-3000:]
    for token in (TOKEN, ALL_TOKEN, METRICS_TOKEN):
        assert token not in log
    assert "https://" in log


def _serial_of(cert: Path) -> int:
    from cryptography import x509

    return int(x509.load_pem_x509_certificate(cert.read_bytes()).serial_number)
