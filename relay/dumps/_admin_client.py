"""A blocking HTTP client of a relay's dump endpoints (``docs/dumps.md``): what
``databus dump`` and the replicator's ``initial_copy = "dump"`` use. No event loop:
a CLI and a start-up step need none.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from databus._redact import register_secret
from databus.errors import ConfigError, ConnectionLostError, DatabusError
from databus.security import NO_CREDENTIALS, ClientCredentials

__all__ = ["TOKEN_ENV", "RelayAdmin", "RelayAnswerError"]

# Where ``databus dump`` reads the admin token from.
TOKEN_ENV = "DATABUS_ADMIN_TOKEN"


class RelayAnswerError(DatabusError):
    """The relay answered a request with an error (its JSON error, as it sent it)."""

    code = "relay_error"

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"relay answered {status} {code}: {message}")
        self.status = status
        self.error_code = code


class RelayAdmin:
    """The dump endpoints of one relay, over plain blocking HTTP (a CLI needs no loop)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 10.0,
                 credentials: ClientCredentials = NO_CREDENTIALS) -> None:
        if "://" not in url:
            url = "http://" + url
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"--relay must be an http(s) URL, e.g. http://127.0.0.1:11190 "
                              f"(got {url!r})")
        self.base = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # TLS trust and a client certificate for https:// relays (DESIGN 18); the admin
        # token is the credential (it also opens /v1/dumps under a metrics_token).
        self.credentials = credentials
        if token:
            register_secret(token)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                *, admin: bool = False) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if admin:
            if not self.token:
                raise ConfigError(f"this command needs the relay's admin token: set "
                                  f"{TOKEN_ENV} (or pass --token)")
            headers["Authorization"] = f"Bearer {self.token}"
        elif self.token:
            # /v1/dumps is an operational page: the admin token opens it (metrics_token).
            headers["Authorization"] = f"Bearer {self.token}"
        elif self.credentials.token is not None:
            headers.update(self.credentials.headers())
        req = urllib.request.Request(self.base + path, data=data, headers=headers,
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout,
                                        context=self.credentials.ssl_for(self.base)
                                        ) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise _answer_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConnectionLostError(f"cannot reach the relay at {self.base}: {reason}",
                                      retriable=True) from None
        except ValueError:
            raise RelayAnswerError(200, "bad_response",
                                   f"{self.base}{path} did not answer JSON") from None

    def start(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", "/v1/admin/dumps", body, admin=True))

    def dumps(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/v1/dumps")["dumps"])

    def dump(self, ident: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/dumps/{urllib.parse.quote(ident, safe='')}"))

    def control(self, ident: str, action: str) -> dict[str, Any]:
        path = f"/v1/admin/dumps/{urllib.parse.quote(ident, safe='')}/{action}"
        return dict(self.request("POST", path, {}, admin=True))


def _answer_error(exc: urllib.error.HTTPError) -> RelayAnswerError:
    try:
        doc = json.loads(exc.read())
        code, message = str(doc["error"]), str(doc.get("message", ""))
    except Exception:
        code, message = "http_error", f"HTTP {exc.code} without a JSON error body"
    return RelayAnswerError(exc.code, code, message)
