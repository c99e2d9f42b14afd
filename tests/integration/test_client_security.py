"""The client tools over TLS with reader tokens (DESIGN 18, issue 31): ``databus
tail``, ``status``, ``dump``, ``relay heal``, ``cluster status --probe`` and
``DatabusClient``.

The server is a real relay (synthetic source) behind a ``TLSGate``
(test_client_security_support.py): HTTPS with a throwaway PKI's certificate and a
bearer-token check answering the relay's JSON 401, until the relay serves TLS and
readers itself. Each refusal is one line naming the URL and why, exit status 1, no
traceback: a CA that did not sign the certificate, a certificate for another host
name, ``http://`` asked of a TLS port (not a hang), a token refused. Tokens never
appear in what the tools print.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.cli import main
from databus.client import CallbackResult, Consumer, DatabusClient
from databus.relay.cluster._cli import probe_members
from databus.security import ClientCredentials
from tests.fixtures._certs import PKI
from tests.fixtures.servers import EnsembleChroot
from tests.integration.test_client_security_support import TLSGate
from tests.relay_harness import ADMIN_TOKEN, RunningRelay, relay_config, running_relay

SOURCES = "shop.items,shop.orders"
READER = "reader-token-2b7e51"
NOT_GRANTED = "known-but-not-granted-77"
WINDOWS = 20


def synthetic(limit: int) -> str:
    return (f"synthetic://?rate=0&limit={limit}&events_per_window=3&keys=50"
            f"&event_bytes=100&update_ratio=0.5&seed=7&source={SOURCES}")


@contextlib.contextmanager
def _captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def run_cli(*argv: str) -> tuple[int, str, str]:
    with _captured() as (out, err):
        code = main(["--log-level", "ERROR", *argv])
    return code, out.getvalue(), err.getvalue()


async def arun(*argv: str) -> tuple[int, str, str]:
    # The CLI blocks; the in-process relay needs this loop meanwhile.
    return await asyncio.to_thread(run_cli, *argv)


@contextlib.asynccontextmanager
async def gated(tmp_path: Path, pki: PKI, **gate: Any) -> AsyncIterator[tuple[RunningRelay,
                                                                             TLSGate]]:
    config = relay_config(tmp_path / "relay", {"src": synthetic(WINDOWS)}, workers=1)
    async with running_relay(config) as relay:
        await relay.wait_for_scn("src", WINDOWS)
        async with TLSGate(relay.url, pki, **gate) as g:
            yield relay, g


# Each way a connection is refused, and what the line says.
REFUSALS = {
    "wrong_ca": "does not verify: unable to get local issuer certificate",
    "wrong_host": "mismatch, certificate is not valid for '127.0.0.1'",
    "http_to_tls": "closed the connection without answering: if it serves TLS, use https://",
    "no_token": "401 unauthorized",
    "forbidden": "403 forbidden",
}


def refusal_setup(case: str, pki: PKI) -> tuple[dict[str, Any], list[str], str | None]:
    """(gate options, extra CLI flags, env token) for one refusal ``case``."""
    gate: dict[str, Any] = {"tokens": [READER], "forbidden": [NOT_GRANTED]}
    flags = ["--ca-file", str(pki.other_ca if case == "wrong_ca" else pki.ca)]
    if case == "wrong_host":
        gate["cert"] = pki.wrong_host
    if case == "forbidden":
        return gate, flags, NOT_GRANTED
    return gate, flags, None if case == "no_token" else READER


def url_for(case: str, gate: TLSGate) -> str:
    return gate.url.replace("https://", "http://") if case == "http_to_tls" else gate.url


def assert_one_line(code: int, err: str, expected: str, url: str) -> None:
    assert code == 1, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert expected in lines[0] and url in lines[0], lines[0]
    assert READER not in err and NOT_GRANTED not in err


# -- databus tail and DatabusClient -----------------------------------------------------


def test_tail_over_tls_with_the_token_from_the_environment(
        tmp_path: Path, pki: PKI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABUS_TOKEN", READER)

    async def main_() -> None:
        async with gated(tmp_path, pki, tokens=[READER]) as (_, gate):
            code, out, err = await arun("tail", "--relay", gate.url, "--ca-file",
                                        str(pki.ca), "--sources", SOURCES,
                                        "--from-earliest", "--exit")
            assert code == 0, err
            lines = [json.loads(line) for line in out.splitlines()]
            assert len(lines) == 3 * WINDOWS
            assert {line["source"] for line in lines} <= set(SOURCES.split(","))
            assert gate.authorizations and set(gate.authorizations) == {f"Bearer {READER}"}
            assert READER not in out + err

    asyncio.run(main_())


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_tail_refused_is_one_line(tmp_path: Path, pki: PKI, case: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    gate_options, flags, token = refusal_setup(case, pki)
    if token is not None:
        monkeypatch.setenv("DATABUS_TOKEN", token)
    else:
        monkeypatch.delenv("DATABUS_TOKEN", raising=False)

    async def main_() -> None:
        async with gated(tmp_path, pki, **gate_options) as (_, gate):
            url = url_for(case, gate)
            code, _, err = await arun("tail", "--relay", url, *flags, "--sources", SOURCES,
                                      "--from-earliest", "--exit")
            assert_one_line(code, err, REFUSALS[case], url)

    asyncio.run(main_())


class _Count(Consumer):
    def __init__(self) -> None:
        self.events = 0

    def on_data_event(self, event: Any) -> CallbackResult:
        self.events += 1
        return CallbackResult.SUCCESS


def test_databus_client_presents_ca_and_token(tmp_path: Path, pki: PKI) -> None:
    async def main_() -> None:
        async with gated(tmp_path, pki, tokens=[READER]) as (_, gate):
            client = DatabusClient([gate.url], sources=SOURCES.split(","),
                                   start_from="earliest", poll_wait_ms=200,
                                   ca_file=pki.ca, token=READER)
            counter = _Count()
            client.register(counter)
            run = asyncio.create_task(client.run_async())
            for _ in range(400):
                if counter.events >= 3 * WINDOWS or run.done():
                    break
                await asyncio.sleep(0.025)
            client.stop()
            await run
            assert counter.events == 3 * WINDOWS
            assert set(gate.authorizations) == {f"Bearer {READER}"}
            assert READER not in repr(client.credentials)

    asyncio.run(main_())


# -- databus status ---------------------------------------------------------------------


def test_status_over_tls_with_a_token(tmp_path: Path, pki: PKI) -> None:
    async def main_() -> None:
        async with gated(tmp_path, pki, tokens=[READER]) as (_, gate):
            code, out, err = await arun("status", "--relay", gate.url, "--json",
                                        "--ca-file", str(pki.ca), "--token", READER)
            doc = json.loads(out)
            assert doc["ok"] and "error" not in doc["relays"][0], doc
            assert doc["relays"][0]["buffers"][0]["max_scn"] == WINDOWS
            assert set(gate.authorizations) == {f"Bearer {READER}"}
            assert READER not in out + err
            # The tables as well (not --json).
            code, out, err = await arun("status", "--relay", gate.url,
                                        "--ca-file", str(pki.ca), "--token", READER)
            assert code == 0 and "src" in out and READER not in out + err

    asyncio.run(main_())


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_status_shows_a_refusal_as_the_services_error(
        tmp_path: Path, pki: PKI, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    gate_options, flags, token = refusal_setup(case, pki)
    monkeypatch.delenv("DATABUS_TOKEN", raising=False)

    async def main_() -> None:
        async with gated(tmp_path, pki, **gate_options) as (_, gate):
            url = url_for(case, gate)
            extra = [] if token is None else ["--token", token]
            code, out, err = await arun("status", "--relay", url, "--json", "--timeout",
                                        "5", *flags, *extra)
            assert code == 1 and "Traceback" not in err, err
            entry = json.loads(out)["relays"][0]
            assert REFUSALS[case] in entry["error"], entry
            assert READER not in out + err and NOT_GRANTED not in out + err

    asyncio.run(main_())


# -- databus dump and databus relay heal ------------------------------------------------


def test_dump_and_heal_send_the_reader_and_admin_tokens(
        tmp_path: Path, pki: PKI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABUS_TOKEN", READER)
    monkeypatch.setenv("DATABUS_ADMIN_TOKEN", ADMIN_TOKEN)
    ca = ["--ca-file", str(pki.ca)]

    async def main_() -> None:
        async with gated(tmp_path, pki, tokens=[READER, ADMIN_TOKEN]) as (_, gate):
            code, out, err = await arun("dump", "status", "--relay", gate.url, *ca)
            assert code == 0, err
            assert gate.authorizations[-1] == f"Bearer {READER}"
            # An admin request: the admin token; the relay answers (a synthetic
            # source cannot be dumped), in one line.
            code, out, err = await arun("dump", "start", "--relay", gate.url, *ca,
                                        "--sources", "shop.items")
            assert code == 1 and "relay answered" in err and "Traceback" not in err, err
            assert gate.authorizations[-1] == f"Bearer {ADMIN_TOKEN}"
            # pause reads the dumps first: with the reader token.
            seen = len(gate.authorizations)
            code, out, err = await arun("dump", "pause", "--relay", gate.url, *ca)
            assert code == 1 and "no active dump" in err, err
            assert gate.authorizations[seen:] == [f"Bearer {READER}"]
            code, out, err = await arun("relay", "heal", "--relay", gate.url, *ca,
                                        "--source", "shop.items")
            assert code == 1 and "relay answered" in err and "Traceback" not in err, err
            assert gate.authorizations[-1] == f"Bearer {ADMIN_TOKEN}"
            assert READER not in out + err and ADMIN_TOKEN not in out + err

    asyncio.run(main_())


@pytest.mark.parametrize("case", ["wrong_ca", "wrong_host", "http_to_tls", "no_token",
                                  "forbidden"])
@pytest.mark.parametrize("command", ["dump status", "dump cancel", "relay heal"])
def test_dump_and_heal_refused_are_one_line(tmp_path: Path, pki: PKI, case: str,
                                            command: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    gate_options, flags, token = refusal_setup(case, pki)
    # The reads send the reader token (the admin token when there is none), the admin
    # requests the admin token: here the one the gate refuses or does not grant.
    monkeypatch.delenv("DATABUS_TOKEN", raising=False)
    if token is not None:
        monkeypatch.setenv("DATABUS_TOKEN", token)
    refused_admin = {"no_token": "unknown-admin-token", "forbidden": NOT_GRANTED}
    monkeypatch.setenv("DATABUS_ADMIN_TOKEN", refused_admin.get(case, ADMIN_TOKEN))
    if case in refused_admin:
        gate_options["tokens"] = [READER]

    async def main_() -> None:
        async with gated(tmp_path, pki, **gate_options) as (_, gate):
            url = url_for(case, gate)
            extra = ["--source", "shop.items"] if command == "relay heal" else []
            code, _, err = await arun(*command.split(), "--relay", url, *flags, *extra)
            expected = {"no_token": "answered 401", "forbidden": "answered 403"}.get(
                case, REFUSALS[case])
            assert_one_line(code, err, expected, url)
            assert ADMIN_TOKEN not in err and "unknown-admin-token" not in err

    asyncio.run(main_())


# -- databus cluster status --probe -----------------------------------------------------


def test_cluster_status_probe_uses_the_credentials(tmp_path: Path, pki: PKI) -> None:
    async def main_() -> None:
        async with gated(tmp_path, pki, tokens=None) as (_, gate):
            doc: dict[str, Any] = {"clusters": [{"members": [
                {"url": gate.url}, {"url": gate.url.replace("https://", "http://")}]}]}
            good = ClientCredentials.of(ca_file=pki.ca, token=READER)
            await asyncio.to_thread(probe_members, doc, good, timeout=5)
            ready, plain = doc["clusters"][0]["members"]
            assert ready["probe"] == "ready"
            assert REFUSALS["http_to_tls"] in plain["probe"]
            assert gate.authorizations[0] == f"Bearer {READER}"
            bad = ClientCredentials.of(ca_file=pki.other_ca)
            await asyncio.to_thread(probe_members, doc, bad, timeout=5)
            assert REFUSALS["wrong_ca"] in doc["clusters"][0]["members"][0]["probe"]

    asyncio.run(main_())


# -- discovery: https:// members on ZooKeeper ---------------------------------------------


def test_discovered_https_members_are_read_with_the_credentials(
        tmp_path: Path, pki: PKI, zookeeper_chroot: EnsembleChroot) -> None:
    """A relay cluster's member registered with an https:// URL: DatabusClient(zookeeper=
    ...) reads it with ca_file and token, ``cluster status --probe`` asks it with them."""
    zk = zookeeper_chroot.client()
    hosts = zookeeper_chroot.hosts

    async def main_() -> None:
        async with gated(tmp_path, pki, tokens=[READER]) as (_, gate):
            zk.create("/databus/relays/shop/members/member-", json.dumps({
                "url": gate.url, "mode": "independent", "updated_at": time.time(),
                "buffers": {"src": {"role": "independent", "max_scn": WINDOWS}}}).encode(),
                ephemeral=True, sequence=True, makepath=True)
            client = DatabusClient(zookeeper=hosts, cluster="shop",
                                   sources=SOURCES.split(","), start_from="earliest",
                                   poll_wait_ms=200, ca_file=pki.ca, token=READER)
            counter = _Count()
            client.register(counter)
            run = asyncio.create_task(client.run_async())
            for _ in range(600):
                if counter.events >= 3 * WINDOWS or run.done():
                    break
                await asyncio.sleep(0.025)
            client.stop()
            await run
            assert counter.events == 3 * WINDOWS
            assert set(gate.authorizations) == {f"Bearer {READER}"}
            code, out, err = await arun("cluster", "status", "--zookeeper", hosts,
                                        "--probe", "--ca-file", str(pki.ca), "--json",
                                        "--token", READER)
            member = json.loads(out)["clusters"][0]["members"][0]
            assert code == 0 and member["url"] == gate.url and member["probe"] == "ready"
            code, out, err = await arun("cluster", "status", "--zookeeper", hosts,
                                        "--probe", "--ca-file", str(pki.other_ca))
            assert code == 0 and REFUSALS["wrong_ca"] in out, out + err
            assert READER not in out + err

    asyncio.run(main_())
