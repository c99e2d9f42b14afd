"""What the command-line clients share about credentials (DESIGN 18): the four flags,
the ``ClientCredentials`` they make, and one line for a connection that TLS refused.

``add_client_args(parser)`` adds ``--ca-file``, ``--cert-file``, ``--key-file`` and
``--token`` (the reader token; ``DATABUS_TOKEN`` when the flag is absent, so that it
need not be in the process list). Admin commands (``databus dump start``, ``databus
relay heal``) keep ``--token`` for the admin token and take the reader token as
``--reader-token`` instead (``admin=True``). ``credentials_from(args)`` builds the
``ClientCredentials``; ``check_files(credentials, urls)`` loads the TLS files once when
an ``https://`` URL is among ``urls``, so a missing or wrong file is one line at start.

``connection_problem(url, exc)`` says in one line why a connection to ``url`` failed
when TLS is the cause, for aiohttp's and urllib's exceptions alike: a certificate that
does not verify (with the reason OpenSSL gives: an unknown CA, a host name the
certificate does not list, an expiry), a handshake that failed (an ``https://`` URL of
a plain HTTP port), or a server that closed the connection without answering an
``http://`` request (a TLS port asked in plain HTTP). ``tls_error`` wraps it as
``TLSVerifyError``. Tokens never appear: the messages name URLs and files only.
"""

from __future__ import annotations

import argparse
import http.client
import os
import ssl
import urllib.error
from collections.abc import Iterable
from typing import Any

from databus.errors import ConfigError, TLSVerifyError
from databus.security._credentials import ClientCredentials

__all__ = ["ADMIN_TOKEN_ENV", "TOKEN_ENV", "add_client_args", "check_files",
           "connection_problem", "credentials_from", "speaks_tls", "tls_error"]

# Where the command-line clients read the reader token from when --token is absent.
TOKEN_ENV = "DATABUS_TOKEN"
# Where the admin commands read the admin token from (databus dump, databus relay heal).
ADMIN_TOKEN_ENV = "DATABUS_ADMIN_TOKEN"


def add_client_args(parser: argparse.ArgumentParser, *, admin: bool = False) -> None:
    """The TLS and token flags of a command that talks to relays or bootstrap services
    (module docstring). ``admin``: ``--token`` is the admin token (its own flag and
    variable, added by the command) and the reader token is ``--reader-token``."""
    group = parser.add_argument_group(
        "TLS and credentials", "for https:// servers and servers with readers "
        "(docs/security.md)")
    group.add_argument("--ca-file", metavar="PEM",
                       help="the CA that signs the servers' certificates (default: the "
                            "system's CAs)")
    group.add_argument("--cert-file", metavar="PEM",
                       help="a client certificate to present (mutual TLS)")
    group.add_argument("--key-file", metavar="PEM",
                       help="the client certificate's private key (default: in --cert-file)")
    if admin:
        group.add_argument("--reader-token", metavar="TOKEN",
                           help=f"a reader token for the reads (default: ${TOKEN_ENV}; a "
                                "command-line argument is visible in ps)")
    else:
        group.add_argument("--token", metavar="TOKEN",
                           help=f"the reader token (default: ${TOKEN_ENV}; a "
                                "command-line argument is visible in ps: prefer the "
                                "variable)")


def credentials_from(args: argparse.Namespace) -> ClientCredentials:
    """The ``ClientCredentials`` of the flags ``add_client_args`` added; the reader
    token from ``$DATABUS_TOKEN`` when its flag is absent. A key without its
    certificate is a ``ConfigError``."""
    flag = "reader_token" if hasattr(args, "reader_token") else "token"
    token = getattr(args, flag, None) or os.environ.get(TOKEN_ENV) or None
    try:
        return ClientCredentials.of(ca_file=getattr(args, "ca_file", None),
                                    cert_file=getattr(args, "cert_file", None),
                                    key_file=getattr(args, "key_file", None), token=token)
    except ValueError as exc:
        raise ConfigError(f"--key-file needs --cert-file ({exc})") from None


def check_files(credentials: ClientCredentials, urls: Iterable[str]) -> None:
    """Load the TLS files now when one of ``urls`` is ``https://`` (``TLSFileError``
    in one line for a missing or wrong file), rather than at the first request."""
    if not credentials.empty and any(credentials.ssl_for(u) is not None for u in urls):
        credentials.ssl_context()


def _causes(exc: BaseException) -> Iterable[Any]:
    """``exc`` and what it wraps: urllib's ``reason``, aiohttp's ``certificate_error``
    and ``os_error``, ``__cause__``/``__context__`` (a few levels)."""
    seen: list[Any] = []
    todo: list[Any] = [exc]
    while todo and len(seen) < 8:
        item = todo.pop(0)
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        for attr in ("certificate_error", "reason", "os_error", "__cause__", "__context__"):
            inner = getattr(item, attr, None)
            if isinstance(inner, BaseException):
                todo.append(inner)
    return seen


def _verify_hint(reason: str) -> str:
    low = reason.lower()
    if "hostname mismatch" in low or "ip address mismatch" in low:
        return ("the certificate is not issued for this host name: connect by a name "
                "it lists")
    if "expired" in low or "not yet valid" in low:
        return "the certificate is out of its validity period: renew it"
    return "the CA that signs it is not trusted here: give it as --ca-file, or ca_file="


def connection_problem(url: str, exc: BaseException) -> str | None:
    """One line saying why a connection to ``url`` failed when TLS is the cause (module
    docstring); None when it is not (a refused connection, a timeout)."""
    for cause in _causes(exc):
        # aiohttp's own exceptions subclass ssl's: the one OpenSSL raised says why.
        if isinstance(cause, ssl.SSLCertVerificationError) and hasattr(cause,
                                                                        "verify_message"):
            reason = str(cause.verify_message or cause.reason or cause)
            return (f"the TLS certificate of {url} does not verify: {reason} "
                    f"({_verify_hint(reason)})")
    for cause in _causes(exc):
        if isinstance(cause, ssl.SSLError) and hasattr(cause, "reason"):
            reason = str(getattr(cause, "reason", None) or cause)
            hint = ""
            if "wrong_version" in reason.lower() or "record layer" in reason.lower() \
                    or "packet length" in reason.lower():
                hint = " (a plain http:// server asked over https://?)"
            elif "certificate" in reason.lower() or "alert" in reason.lower():
                hint = (" (the server wants a client certificate it trusts: "
                        "--cert-file/--key-file)")
            return f"the TLS handshake with {url} failed: {reason}{hint}"
    if url.lower().startswith("http://"):
        import aiohttp

        for cause in _causes(exc):
            if isinstance(cause, aiohttp.ServerDisconnectedError | http.client.RemoteDisconnected
                          | ConnectionResetError | http.client.BadStatusLine):
                return (f"{url} closed the connection without answering: if it serves TLS, "
                        "use https:// (and --ca-file)")
    return None


async def speaks_tls(url: str, timeout: float = 2.0) -> bool:
    """Whether the server of ``url`` (``http(s)://host:port``) completes a TLS
    handshake (its certificate not checked): a plain ``http://`` request that it closed
    without answering was then a request to a TLS port, not a server going away."""
    import asyncio
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        return False
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(parts.hostname, parts.port or 80,
                                                      ssl=context)
    except (OSError, TimeoutError, ssl.SSLError):
        return False
    writer.close()
    try:
        async with asyncio.timeout(timeout):
            await writer.wait_closed()
    except (OSError, TimeoutError, ssl.SSLError):
        pass
    return True


def tls_error(url: str, exc: BaseException) -> TLSVerifyError | None:
    """``connection_problem`` as a ``TLSVerifyError``, or None."""
    problem = connection_problem(url, exc)
    return None if problem is None else TLSVerifyError(problem)


def url_error_reason(exc: urllib.error.URLError | OSError) -> str:
    """What urllib says went wrong, without the class name noise."""
    reason = getattr(exc, "reason", exc)
    return str(reason) or type(reason).__name__
