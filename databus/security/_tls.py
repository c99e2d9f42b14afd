"""TLS contexts for listeners and for clients (DESIGN 18, docs/security.md).

``server_context`` builds one listener's ``ssl.SSLContext`` from a ``TLSConfig``:
TLS 1.2 or newer (``min_version``), the certificate chain and key, and under mutual
TLS the client CA, with client certificates verified whenever one is presented
(``CERT_OPTIONAL``: a reader may prove itself by a token instead) or always
(``require_client_cert``). ``CertificateReloader`` loads the files again when they
change, into the same context, so a renewed certificate is served to new connections
without a restart.

``client_context`` builds a client's: the server is always verified (host name and
chain), against ``ca_file`` or the system's CAs; a client certificate is presented
when one is given.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

from databus.config._security import TLSConfig
from databus.errors import ConfigError

log = logging.getLogger("databus.security")

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TLSFileError(ConfigError):
    """A certificate, key or CA file that cannot be read or does not hold what it
    should (the message names the setting and the file, never its content)."""

    code = "tls_config_error"


def _load_chain(context: ssl.SSLContext, cert: Path, key: Path, setting: str) -> None:
    try:
        context.load_cert_chain(os.fspath(cert), os.fspath(key))
    except FileNotFoundError as exc:
        # load_cert_chain's error names no file (filename None): find the missing one.
        missing = exc.filename or next((p for p in (cert, key) if not p.exists()), cert)
        raise TLSFileError(f"{setting}: no such file: {missing}") from None
    except PermissionError as exc:
        unreadable = exc.filename or next(
            (p for p in (cert, key) if not os.access(p, os.R_OK)), cert)
        raise TLSFileError(f"{setting}: cannot read {unreadable}: permission denied"
                           ) from None
    except (ssl.SSLError, OSError) as exc:
        raise TLSFileError(f"{setting}: {cert} and {key} are not a PEM certificate "
                           f"chain and its private key ({exc.__class__.__name__}: "
                           f"{getattr(exc, 'reason', None) or exc})") from None


def _load_ca(context: ssl.SSLContext, ca: Path, setting: str) -> None:
    try:
        context.load_verify_locations(cafile=os.fspath(ca))
    except FileNotFoundError:
        raise TLSFileError(f"{setting}: no such file: {ca}") from None
    except PermissionError:
        raise TLSFileError(f"{setting}: cannot read {ca}: permission denied") from None
    except (ssl.SSLError, OSError) as exc:
        raise TLSFileError(f"{setting}: {ca} holds no PEM CA certificate "
                           f"({getattr(exc, 'reason', None) or exc})") from None


def server_context(config: TLSConfig, setting: str = "tls") -> ssl.SSLContext:
    """A listener's TLS context (module docstring); ``TLSFileError`` in one line
    naming ``setting`` when a file is missing or wrong."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS[config.min_version]
    context.options |= ssl.OP_NO_COMPRESSION
    _load_chain(context, config.cert_file, config.key_file,
                f"{setting}.cert_file/{setting}.key_file")
    if config.client_ca_file is not None:
        _load_ca(context, config.client_ca_file, f"{setting}.client_ca_file")
        context.verify_mode = (ssl.CERT_REQUIRED if config.require_client_cert
                               else ssl.CERT_OPTIONAL)
    return context


def _mtimes(paths: list[Path]) -> tuple[float | None, ...]:
    out: list[float | None] = []
    for path in paths:
        try:
            out.append(os.stat(path).st_mtime_ns)
        except OSError:
            out.append(None)
    return tuple(out)


class CertificateReloader:
    """Loads a listener's certificate, key and client CA again when their files
    change (``check()``, called every few seconds by the daemon), into the context the
    listener serves with: new connections get the new certificate, open ones keep
    theirs. A failed load keeps the old certificate and says why, once per change."""

    def __init__(self, config: TLSConfig, context: ssl.SSLContext,
                 setting: str = "tls") -> None:
        self.config = config
        self.context = context
        self.setting = setting
        self._paths = [config.cert_file, config.key_file]
        if config.client_ca_file is not None:
            self._paths.append(config.client_ca_file)
        self._seen = _mtimes(self._paths)
        self.reloads = 0
        self.error: str | None = None

    def check(self) -> bool:
        """Reload when a file changed since the last look; True when it did."""
        now = _mtimes(self._paths)
        if now == self._seen:
            return False
        self._seen = now
        try:
            _load_chain(self.context, self.config.cert_file, self.config.key_file,
                        f"{self.setting}.cert_file/{self.setting}.key_file")
            if self.config.client_ca_file is not None:
                _load_ca(self.context, self.config.client_ca_file,
                         f"{self.setting}.client_ca_file")
        except TLSFileError as exc:
            self.error = exc.message
            log.error("TLS: kept the previous certificate: %s; fix the files, they are "
                      "read again when they change", exc.message)
            return False
        self.error = None
        self.reloads += 1
        log.info("TLS: loaded the changed certificate files of %s", self.setting)
        return True


def client_context(ca_file: str | os.PathLike[str] | None = None,
                   cert_file: str | os.PathLike[str] | None = None,
                   key_file: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """A client's TLS context: verifies the server's chain and host name against
    ``ca_file`` (else the system's CAs), presents ``cert_file``/``key_file`` when
    given (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file is not None:
        _load_ca(context, Path(ca_file), "ca_file")
    if cert_file is not None:
        _load_chain(context, Path(cert_file), Path(key_file if key_file is not None
                                                     else cert_file),
                    "cert_file/key_file")
    elif key_file is not None:
        raise TLSFileError("key_file is given without cert_file")
    return context
