"""Chained relays over TLS with a reader token (DESIGN 18, issue 31): ``relay+https://``.

The upstream is a real relay over the synthetic source. Most tests put a ``TLSGate``
(test_client_security_support.py) in front of it: HTTPS with the test PKI's
certificate, a token check answering the relay's JSON 401, and revocation that cuts
open streams at a chosen moment (what the chain does then is the subject). The
downstream is a real relay whose buffer chains through the gate. The last test runs
the same story against a relay serving ``[relay.tls]`` and ``[[relay.readers]]``
itself (a ``databus relay`` process restarted with the token taken away and then
given back).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from databus.fetchers.relay import ChainURI
from tests.fixtures._certs import PKI
from tests.integration.test_client_security_support import TLSGate
from tests.relay_harness import (
    RelayProcess,
    RunningRelay,
    relay_config,
    running_relay,
    stream_body,
    stream_body_at,
)
from tests.waiting import async_wait_until

SOURCES = "shop.items,shop.orders"
TOKEN = "chain-reader-token-7f3a9c"



def synthetic(limit: int, *, rate: int = 0) -> str:
    return (f"synthetic://?rate={rate}&limit={limit}&events_per_window=3&keys=400"
            f"&event_bytes=200&update_ratio=0.5&seed=31&source={SOURCES}")


def secure_chain(upstream: str, **params: str) -> str:
    host = upstream.removeprefix("https://")
    query = urllib.parse.urlencode({"sources": SOURCES, **params}, safe=",/")
    return f"relay+https://{host}/?{query}"


async def fetcher_of(relay: RunningRelay, buffer: str) -> dict[str, Any]:
    return (await relay.json("/v1/status"))["buffers"][buffer]["fetcher"]  # type: ignore[no-any-return]


async def wait_error(relay: RunningRelay, buffer: str, text: str) -> dict[str, Any]:
    """The fetcher of ``buffer`` once it is failed (or backing off) with ``text`` in its
    error. A first refusal right after windows were stored is retried at once, so the
    fetcher may be running again for a moment with the error still shown: the promise
    is the state it settles in while the refusal lasts."""
    async def matching() -> Any:
        fetcher = await fetcher_of(relay, buffer)
        settled = fetcher.get("state") in ("failed", "backoff")
        return fetcher if settled and text in (fetcher.get("last_error") or "") else None

    found: dict[str, Any] = await async_wait_until(
        matching, f"fetcher of {buffer} to say {text!r}", 20, max_interval=0.05)
    return found


def windows_of(body: bytes) -> list[int]:
    from databus.event import iter_events

    return [h.scn for _, h in iter_events(body) if h.is_eow]


def test_chain_uri_credentials_stay_out_of_the_upstream_requests(pki: PKI) -> None:
    chain = ChainURI.parse(secure_chain("https://127.0.0.1:1", ca_file=str(pki.ca),
                                        token=TOKEN))
    assert chain.upstreams == ("https://127.0.0.1:1",)
    assert chain.credentials.token is not None and chain.credentials.token.reveal() == TOKEN
    assert TOKEN not in repr(chain)


def test_revoked_upstream_token_is_a_clear_retried_error_then_resumes_without_gap(
        tmp_path: Path, pki: PKI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)

    async def main() -> None:
        up_config = relay_config(tmp_path / "up", {"src": synthetic(240, rate=240)},
                                 workers=1)
        async with running_relay(up_config) as up, \
                TLSGate(up.url, pki, tokens=[TOKEN]) as gate:
            uri = secure_chain(gate.url, ca_file=str(pki.ca), token=TOKEN)
            down_config = relay_config(tmp_path / "down", {"copy": uri}, workers=1)
            async with running_relay(down_config) as down:
                await down.wait_for_scn("copy", 10)
                assert set(gate.authorizations) == {f"Bearer {TOKEN}"}
                gate.revoke(TOKEN)  # the upstream no longer knows this relay's token
                fetcher = await wait_error(down, "copy", "refused this relay")
                assert fetcher["state"] in ("failed", "backoff")
                assert "revoked" in fetcher["last_error"]
                assert "401 unauthorized" in fetcher["last_error"]
                # Not ready while refused. Each retry's attempt reports "running" until
                # the upstream answers it (a few ms), so one look may fall in one: the
                # answer must be 503 within a few looks, with the reason.
                async def refused_ready() -> tuple[int, str] | None:
                    answer = await down.get("/readyz")
                    text = await answer.text()
                    return (answer.status, text) if answer.status == 503 else None

                _, ready_text = await async_wait_until(
                    refused_ready, "/readyz answering 503 while refused", 10)
                assert "refused this relay" in ready_text
                # Retried with backoff, not in a hot loop: a few tries a second at most
                # (the test relay's backoff grows to 0.5 s).
                before = gate.refused
                await asyncio.sleep(1.5)
                assert 1 <= gate.refused - before <= 30
                held = (await down.json("/v1/status"))["buffers"]["copy"]["max_scn"]
                gate.grant(TOKEN)  # restarted with the token granted again
                await up.wait_for_scn("src", 240, timeout=30)
                await down.wait_for_scn("copy", 240, timeout=30)
                last = await fetcher_of(down, "copy")
                assert last["state"] == "running", (last["last_error"], last)
                copy = await stream_body(down)
                assert copy == await stream_body(up)  # byte for byte: no gap, no double
                assert windows_of(copy) == list(range(1, 241))
                assert held is not None and held < 240
                everything = json.dumps(await down.json("/v1/status")) + ready_text
                assert TOKEN not in everything
        assert TOKEN not in caplog.text
        assert "refused this relay" in caplog.text

    asyncio.run(main())


@pytest.mark.parametrize("case", ["wrong_ca", "wrong_host", "no_tls"])
def test_upstream_certificate_that_does_not_verify_is_a_clear_error(
        tmp_path: Path, pki: PKI, case: str) -> None:
    async def main() -> None:
        up_config = relay_config(tmp_path / "up", {"src": synthetic(30)}, workers=1)
        cert = pki.wrong_host if case == "wrong_host" else pki.server
        async with running_relay(up_config) as up, \
                TLSGate(up.url, pki, tokens=[TOKEN], cert=cert,
                        tls=case != "no_tls") as gate:
            ca = pki.other_ca if case == "wrong_ca" else pki.ca
            host = gate.url.split("://", 1)[1]
            uri = secure_chain(f"https://{host}", ca_file=str(ca), token=TOKEN)
            down_config = relay_config(tmp_path / "down", {"copy": uri}, workers=1)
            async with running_relay(down_config) as down:
                expected = {"wrong_ca": "does not verify: unable to get local issuer",
                            "wrong_host": "mismatch",
                            "no_tls": "TLS handshake"}[case]
                fetcher = await wait_error(down, "copy", expected)
                assert fetcher["state"] in ("failed", "backoff")
                assert TOKEN not in fetcher["last_error"]
                assert (await down.json("/v1/status"))["buffers"]["copy"]["max_scn"] is None

    asyncio.run(main())


@pytest.mark.parametrize("case", ["wrong_token", "no_token", "forbidden"])
def test_an_empty_chained_buffer_refused_by_its_upstream_says_why(
        tmp_path: Path, pki: PKI, case: str) -> None:
    """Refused from the first request on (``initial_scn``, an empty buffer): the fix
    named for each kind of refusal; nothing stored."""
    async def main() -> None:
        up_config = relay_config(tmp_path / "up", {"src": synthetic(30)}, workers=1)
        async with running_relay(up_config) as up, \
                TLSGate(up.url, pki, tokens=[TOKEN], forbidden=["known-but-not-granted"]
                        ) as gate:
            params = {"ca_file": str(pki.ca)}
            if case != "no_token":
                params["token"] = {"wrong_token": "not-the-token-1",
                                   "forbidden": "known-but-not-granted"}[case]
            down_config = relay_config(tmp_path / "down",
                                       {"copy": secure_chain(gate.url, **params)},
                                       workers=1)
            async with running_relay(down_config) as down:
                expected = {"wrong_token": "wrong, or it was revoked there",
                            "no_token": "this relay presents none",
                            "forbidden": "grant this relay's reader the sources"}[case]
                fetcher = await wait_error(down, "copy", expected)
                assert fetcher["state"] == "failed"
                status = await down.json("/v1/status")
                assert status["buffers"]["copy"]["max_scn"] is None
                assert "not-the-token-1" not in json.dumps(status)

    asyncio.run(main())


def test_real_upstream_relay_with_tls_and_readers(tmp_path: Path, pki: PKI) -> None:
    """End to end with the relay's own TLS and readers: the upstream restarted without
    the chain's token, then with it again."""
    def upstream(granted: bool) -> str:
        readers = [("ops", "ops-token-5e1d")] + ([("chain", TOKEN)] if granted else [])
        toml = (f'[relay.tls]\ncert_file = "{pki.server.cert}"\n'
                f'key_file = "{pki.server.key}"\n')
        for name, token in readers:
            toml += (f'[[relay.readers]]\nname = "{name}"\ntoken = "{token}"\n'
                     'sources = ["shop.*"]\n')
        return toml

    (tmp_path / "up").mkdir()
    up = RelayProcess(tmp_path / "up", {"src": synthetic(600, rate=300)}, workers=1,
                      extra_toml=upstream(True))
    up.start()
    up_url = f"https://127.0.0.1:{up.port}"

    async def main() -> None:
        uri = secure_chain(up_url, ca_file=str(pki.ca), token=TOKEN)
        down_config = relay_config(tmp_path / "down", {"copy": uri}, workers=1)
        async with running_relay(down_config) as down:
            await down.wait_for_scn("copy", 10, timeout=30)
            up.kill()
            up.config_path.write_text(up.config_path.read_text().replace(
                upstream(True), upstream(False)))
            up.start()
            fetcher = await wait_error(down, "copy", "refused this relay")
            assert fetcher["state"] in ("failed", "backoff")
            up.kill()
            up.config_path.write_text(up.config_path.read_text().replace(
                upstream(False), upstream(True)))
            up.start()
            from databus.security import ClientCredentials, client_session

            creds = ClientCredentials.of(ca_file=pki.ca, token=TOKEN)
            async with client_session(creds) as session:
                async def caught_up() -> bool:
                    async with session.get(f"{up_url}/v1/status") as resp:
                        top = (await resp.json())["buffers"]["src"]["max_scn"]
                    mine = (await down.json("/v1/status"))["buffers"]["copy"]["max_scn"]
                    return bool(top == 600 and mine == 600)

                await async_wait_until(caught_up, "the chain to catch up", 60)
                assert await stream_body(down) == await stream_body_at(session, up_url,
                                                                       64 << 20)

    try:
        asyncio.run(main())
    finally:
        if up.proc is not None and up.proc.poll() is None:
            up.kill()
