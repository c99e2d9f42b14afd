"""The credential flags of the command-line clients and the ``relay+https://`` URI
(DESIGN 18, issue 31): parsing only, no server (the servers are in
tests/integration/test_client_security.py and test_chain_security.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from databus import _redact
from databus.cli import build_parser
from databus.config import BufferConfig, redact_uri
from databus.errors import ConfigError
from databus.fetchers.relay import ChainURI
from databus.fetchers.relay._uri import chain_uri
from databus.security import ClientCredentials
from databus.security._client_tools import connection_problem, credentials_from

TOKEN = "cli-reader-token-93ab"
FLAGS = ["--ca-file", "/pki/ca.pem", "--cert-file", "/pki/me.crt", "--key-file",
         "/pki/me.key"]

# Every command that talks to relays or bootstrap services, with what else it needs.
READ_COMMANDS = {
    "tail": ["tail", "--relay", "https://r:1"],
    "status": ["status", "--relay", "https://r:1"],
    "cluster status": ["cluster", "status", "--zookeeper", "zk:2181", "--probe"],
    "dump status": ["dump", "status", "--relay", "https://r:1"],
}
ADMIN_COMMANDS = {
    "dump start": ["dump", "start", "--relay", "https://r:1"],
    "dump pause": ["dump", "pause", "--relay", "https://r:1"],
    "dump resume": ["dump", "resume", "--relay", "https://r:1"],
    "dump cancel": ["dump", "cancel", "--relay", "https://r:1"],
    "relay heal": ["relay", "heal", "--relay", "https://r:1", "--source", "db.t"],
}


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABUS_TOKEN", raising=False)
    monkeypatch.delenv("DATABUS_ADMIN_TOKEN", raising=False)


@pytest.mark.parametrize("name", sorted(READ_COMMANDS))
def test_read_commands_take_the_four_flags(name: str) -> None:
    args = parse([*READ_COMMANDS[name], *FLAGS, "--token", TOKEN])
    creds = credentials_from(args)
    assert creds.ca_file == Path("/pki/ca.pem")
    assert creds.cert_file == Path("/pki/me.crt") and creds.key_file == Path("/pki/me.key")
    assert creds.token is not None and creds.token.reveal() == TOKEN
    assert creds.headers() == {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("name", sorted(READ_COMMANDS))
def test_the_token_comes_from_the_environment_when_the_flag_is_absent(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABUS_TOKEN", TOKEN)
    creds = credentials_from(parse(READ_COMMANDS[name]))
    assert creds.token is not None and creds.token.reveal() == TOKEN
    # The flag wins over the variable.
    creds = credentials_from(parse([*READ_COMMANDS[name], "--token", "flag-token-1"]))
    assert creds.token is not None and creds.token.reveal() == "flag-token-1"


@pytest.mark.parametrize("name", sorted(ADMIN_COMMANDS))
def test_admin_commands_keep_token_for_the_admin_and_take_a_reader_token(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse([*ADMIN_COMMANDS[name], *FLAGS, "--token", "admin-token-x1",
                  "--reader-token", TOKEN])
    assert args.token == "admin-token-x1"
    creds = credentials_from(args)
    assert creds.token is not None and creds.token.reveal() == TOKEN
    assert creds.ca_file == Path("/pki/ca.pem")
    monkeypatch.setenv("DATABUS_TOKEN", "env-reader-token")
    creds = credentials_from(parse(ADMIN_COMMANDS[name]))
    assert creds.token is not None and creds.token.reveal() == "env-reader-token"


def test_no_flags_is_a_plain_client() -> None:
    assert credentials_from(parse(READ_COMMANDS["status"])).empty


def test_a_key_without_its_certificate_is_one_line() -> None:
    with pytest.raises(ConfigError, match="--key-file needs --cert-file"):
        credentials_from(parse([*READ_COMMANDS["tail"], "--key-file", "/k.pem"]))


def test_a_missing_ca_file_is_one_line_at_start(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    from databus.cli import main

    code = main(["status", "--relay", "https://127.0.0.1:1", "--ca-file",
                 str(tmp_path / "nope.pem"), "--token", TOKEN])
    err = capsys.readouterr().err
    assert code == 1 and "ca_file: no such file" in err and "Traceback" not in err
    assert TOKEN not in err


# -- relay+https:// ---------------------------------------------------------------------


def test_relay_https_uri_parses_its_credentials(tmp_path: Path) -> None:
    uri = (f"relay+https://a:1,[::1]:2/?sources=db.t&ca_file={tmp_path}/ca.pem"
           f"&cert_file=/c.crt&key_file=/c.key&token={TOKEN}&follow=false")
    chain = ChainURI.parse(uri)
    assert chain.upstreams == ("https://a:1", "https://[::1]:2")
    assert chain.secure and not chain.follow
    assert chain.credentials == ClientCredentials.of(
        ca_file=tmp_path / "ca.pem", cert_file="/c.crt", key_file="/c.key", token=TOKEN)
    assert TOKEN not in repr(chain) and TOKEN not in str(chain)


def test_relay_http_keeps_working_and_may_carry_a_token() -> None:
    chain = ChainURI.parse("relay+http://h:11190/?sources=db.t")
    assert chain.upstreams == ("http://h:11190",) and chain.credentials.empty
    assert not chain.secure
    chain = ChainURI.parse(f"relay+http://h/?sources=db.t&token={TOKEN}")
    assert chain.credentials.headers() == {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("uri,message", [
    ("relay+http://h/?sources=db.t&ca_file=/ca.pem", r"write relay\+https://"),
    ("relay+https://h/?sources=db.t&key_file=/k.pem", "key_file needs cert_file"),
    ("relay+https://h/?sources=db.t&token=", "token is empty"),
    ("relay+https://h/?sources=db.t&token=a&token=b", "given twice"),
    ("relay+httpz://h/?sources=db.t", r"or relay\+https://"),
])
def test_bad_credential_parameters_are_config_errors(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ChainURI.parse(uri)


def test_the_token_of_a_source_uri_is_hidden_everywhere() -> None:
    _redact.forget_all()
    try:
        secret = "chain-tok/with%2Fescapes"
        uri = f"relay+https://h:1/?sources=db.t&token={secret}&ca_file=/ca.pem"
        assert "token=***" in redact_uri(uri) and secret not in redact_uri(uri)
        BufferConfig(name="copy", capacity_mb=4, source=uri)  # registers the token
        decoded = ChainURI.parse(uri).credentials.token
        assert decoded is not None
        text = f"GET with Authorization: Bearer {decoded.reveal()} ({uri})"
        assert decoded.reveal() not in _redact.redact(text)
        assert secret not in _redact.redact(text)
    finally:
        _redact.forget_all()


def test_chain_uri_builds_what_parse_reads() -> None:
    creds = ClientCredentials.of(ca_file="/pki/ca.pem", cert_file="/c.crt",
                                 key_file="/c.key", token="t&k=n")
    uri = chain_uri("https://leader:11190/", ["db.a", "db.b"], creds)
    assert uri.startswith("relay+https://leader:11190/?sources=db.a,db.b&")
    chain = ChainURI.parse(uri)
    assert chain.credentials == creds and chain.sources == ("db.a", "db.b")
    assert ChainURI.parse(chain_uri("http://l:1", ["db.a"])).credentials.empty


# -- one line for a TLS refusal ----------------------------------------------------------


def test_connection_problem_is_none_for_what_tls_did_not_cause() -> None:
    assert connection_problem("https://h:1", ConnectionRefusedError(111, "refused")) is None
    assert connection_problem("https://h:1", TimeoutError()) is None


def test_a_plain_server_closing_without_answer_is_not_taken_for_tls() -> None:
    """A relay going away (accept, then close) is not a TLS port: the client retries
    it rather than giving up (client/_failover.py, "TLS")."""
    import asyncio

    from databus.security._client_tools import speaks_tls

    async def main() -> None:
        async def close_at_once(reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            assert not await speaks_tls(f"http://127.0.0.1:{port}", timeout=2)

    asyncio.run(main())


def test_a_chained_relay_with_a_missing_ca_file_does_not_start(tmp_path: Path) -> None:
    from databus.fetchers._api import FetcherContext
    from databus.fetchers.relay import RelayChainFetcher
    from databus.security import TLSFileError

    class _Catalog:
        def source_id(self, name: str) -> int:
            return 1

        def register_schema(self, name: str, schema: object) -> object:
            return schema

    uri = f"relay+https://h:1/?sources=db.t&ca_file={tmp_path}/missing.pem&token={TOKEN}"
    with pytest.raises(TLSFileError, match="ca_file: no such file") as caught:
        RelayChainFetcher(uri, FetcherContext("copy", 0, _Catalog()))  # type: ignore[arg-type]
    assert TOKEN not in str(caught.value)
