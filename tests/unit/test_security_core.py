"""The security core (databus/security): grants, reader identification, TLS
contexts and the config checks around them, on real TLS handshakes over loopback."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest

from databus.config import ConfigFieldError, Secret
from databus.config._security import ReaderConfig, TLSConfig, check_readers, is_loopback
from databus.security import (
    ClientCredentials,
    Grant,
    Readers,
    TLSFileError,
    bearer_token,
    client_context,
    server_context,
)
from databus.security._tls import CertificateReloader
from tests.fixtures._certs import PKI


def test_grants_match_names_databases_and_everything() -> None:
    grant = Grant(("shop.orders", "crm.*"))
    assert grant.allows("shop.orders")
    assert not grant.allows("shop.items")
    assert grant.allows("crm.people")
    assert not grant.allows("crmx.people")
    assert not grant.allows("crm")
    assert not grant.allows("shop.orders2")
    assert grant.narrow(["shop.items", "shop.orders", "crm.x"]) == ["shop.orders", "crm.x"]
    assert grant.refused(["shop.items", "shop.orders"]) == ["shop.items"]
    assert Grant(("*",)).allows("any.thing")
    assert Grant.all().allows("x.y")


def _readers() -> Readers:
    return Readers([
        ReaderConfig(name="orders", sources=("shop.orders",), token=Secret("tok-orders-1"),
                     tokens=(Secret("tok-orders-2"),)),
        ReaderConfig(name="shop", sources=("shop.*",), client_cert_cn="shop-reader"),
    ])


def test_readers_are_told_apart_by_token_or_certificate() -> None:
    readers = _readers()
    assert readers.identify(b"tok-orders-1", None).name == "orders"  # type: ignore[union-attr]
    assert readers.identify(b"tok-orders-2", None).name == "orders"  # type: ignore[union-attr]
    assert readers.identify(None, "shop-reader").name == "shop"  # type: ignore[union-attr]
    assert readers.identify(None, None) is None
    assert readers.identify(b"tok-orders-", None) is None
    assert readers.identify(b"", None) is None
    # A wrong token is refused even with a certificate that names a reader.
    assert readers.identify(b"wrong", "shop-reader") is None
    assert readers.identify(None, "someone-else") is None
    assert Readers().identify(None, None).anonymous  # type: ignore[union-attr]


def test_bearer_token_parsing() -> None:
    assert bearer_token([]) is None
    assert bearer_token([b"Bearer abc"]) == b"abc"
    assert bearer_token([b"bearer  abc "]) == b"abc"
    assert bearer_token([b"Basic abc"]) == b""
    assert bearer_token([b"Bearer a", b"Bearer b"]) == b""


def test_reader_config_is_checked() -> None:
    with pytest.raises(ConfigFieldError, match="needs a credential"):
        ReaderConfig(name="r", sources=("a.b",))
    with pytest.raises(ConfigFieldError, match=r"not db\.table"):
        ReaderConfig(name="r", sources=("a",), token=Secret("t" * 20))
    with pytest.raises(ConfigFieldError, match="grant at least one"):
        ReaderConfig(name="r", sources=(), token=Secret("t" * 20))
    one = ReaderConfig(name="a", sources=("a.b",), token=Secret("same-token-123"))
    two = ReaderConfig(name="b", sources=("a.b",), token=Secret("same-token-123"))
    with pytest.raises(ConfigFieldError, match="two readers"):
        check_readers(host="127.0.0.1", tls=None, readers=(one, two),
                      allow_anonymous_readers=False, metrics_token=None)
    cert = ReaderConfig(name="c", sources=("a.b",), client_cert_cn="c")
    with pytest.raises(ConfigFieldError, match="client_ca_file"):
        check_readers(host="127.0.0.1", tls=None, readers=(cert,),
                      allow_anonymous_readers=False, metrics_token=None)
    with pytest.raises(ConfigFieldError, match="allow_anonymous_readers"):
        check_readers(host="0.0.0.0", tls=None, readers=(),
                      allow_anonymous_readers=False, metrics_token=None)
    check_readers(host="0.0.0.0", tls=None, readers=(),
                  allow_anonymous_readers=True, metrics_token=None)
    check_readers(host="::1", tls=None, readers=(), allow_anonymous_readers=False,
                  metrics_token=None)
    assert is_loopback("localhost") and is_loopback("127.0.0.2") and is_loopback("[::1]")
    assert not is_loopback("10.0.0.1") and not is_loopback("relay.example")


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str = "localhost"
               ) -> str | None:
    """One TLS handshake over loopback; the CN of the client certificate the server
    verified (None: none), or raises what the client or the server raised."""

    async def run() -> str | None:
        seen: list[str | None] = []
        failed: list[BaseException] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                cert = writer.get_extra_info("peercert")
                cn = None
                for rdn in (cert or {}).get("subject", ()):
                    for key, value in rdn:
                        if key == "commonName":
                            cn = value
                seen.append(cn)
                writer.write(b"ok")
                await writer.drain()
            except Exception as exc:
                failed.append(exc)
            finally:
                writer.close()

        srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server)
        port = srv.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname=host)
            if await reader.read(2) != b"ok":
                # TLS 1.3: the server refuses a client certificate after the client
                # finished its side of the handshake; the client sees the connection end.
                raise ConnectionError("the server refused the handshake")
            writer.close()
        finally:
            srv.close()
        return seen[0] if seen else None

    return asyncio.run(run())


def test_tls_server_and_client_contexts(pki: PKI, tmp_path: Path) -> None:
    config = TLSConfig(cert_file=pki.server.cert, key_file=pki.server.key,
                       client_ca_file=pki.ca)
    server = server_context(config)
    assert _handshake(server, client_context(pki.ca)) is None
    good = pki.client("alice")
    assert _handshake(server, client_context(pki.ca, good.cert, good.key)) == "alice"
    # A client certificate from another CA, or an expired one: no handshake.
    other = pki.other_client("alice")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _handshake(server, client_context(pki.ca, other.cert, other.key))
    expired = pki.expired_client("alice")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _handshake(server, client_context(pki.ca, expired.cert, expired.key))
    # The client verifies the server: another CA, or a name the certificate is not for.
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, client_context(pki.other_ca))
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, client_context(pki.ca), host="relay.example")


def test_tls_files_errors_name_the_setting(pki: PKI, tmp_path: Path) -> None:
    missing = TLSConfig(cert_file=tmp_path / "nope.crt", key_file=pki.server.key)
    with pytest.raises(TLSFileError, match="no such file"):
        server_context(missing, "relay.tls")
    swapped = TLSConfig(cert_file=pki.server.cert, key_file=pki.client("x").key)
    with pytest.raises(TLSFileError, match=r"relay\.tls\.cert_file"):
        server_context(swapped, "relay.tls")
    with pytest.raises(TLSFileError, match="no PEM CA"):
        client_context(pki.server.key)
    with pytest.raises(ValueError):
        ClientCredentials.of(key_file="k.pem")


def test_certificate_reloader_serves_the_renewed_certificate(pki: PKI, tmp_path: Path
                                                              ) -> None:
    cert, key = tmp_path / "s.crt", tmp_path / "s.key"
    cert.write_bytes(pki.wrong_host.cert.read_bytes())
    key.write_bytes(pki.wrong_host.key.read_bytes())
    config = TLSConfig(cert_file=cert, key_file=key)
    context = server_context(config)
    reloader = CertificateReloader(config, context)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(context, client_context(pki.ca))
    assert not reloader.check()
    renewed = pki.server_for("renewed")
    cert.write_bytes(renewed.cert.read_bytes())
    key.write_bytes(renewed.key.read_bytes())
    os.utime(cert, ns=(1, 1))
    assert reloader.check() and reloader.reloads == 1
    assert _handshake(context, client_context(pki.ca)) is None
    # A broken file keeps the certificate in use and says why.
    key.write_bytes(b"not a key")
    os.utime(key, ns=(2, 2))
    assert not reloader.check() and reloader.error
    assert _handshake(context, client_context(pki.ca)) is None


def test_credentials_hide_the_token() -> None:
    creds = ClientCredentials.of(token="secret-token-value")
    assert "secret-token-value" not in repr(creds)
    assert creds.headers() == {"Authorization": "Bearer secret-token-value"}
    assert creds.ssl_for("http://x") is None
    assert ClientCredentials().empty


def test_a_requested_pattern_overlaps_a_grant() -> None:
    from databus.security import overlaps

    orders = Grant(("shop.orders",))
    assert overlaps("shop.*", orders) and overlaps("*", orders)
    assert overlaps("shop.orders", orders) and not overlaps("shop.items", orders)
    assert not overlaps("crm.*", orders) and not overlaps("shopx.*", orders)
    assert overlaps("crm.*", Grant(("crm.*",))) and overlaps("crm.*", Grant(("*",)))
    assert overlaps("anything.*", Grant.all())
