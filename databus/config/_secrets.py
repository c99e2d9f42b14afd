"""Secrets in config values: ``Secret`` (prints as ``***``) and ``redact_uri``."""

from __future__ import annotations

import hmac
import re

from databus._redact import register_secret

# --- secrets ---------------------------------------------------------------------------


# A value that looks like a URI (scheme://...): its password is redacted and registered.
_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


class Secret:
    """A secret string that prints as ``***``; ``reveal()`` gives the value.

    Deliberately not a ``str`` subclass: a str subclass leaks through concatenation,
    slicing, ``json.dumps`` and format specs even when ``__str__`` is overridden.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"Secret wraps a str, got {type(value).__name__}")
        self._value = value
        # From now on the value is cut out of every log line and error message of the
        # process, whoever prints it (databus._redact).
        register_secret(value)

    def reveal(self) -> str:
        """The secret value. Call it only where the value is used, never to log it."""
        return self._value

    def __repr__(self) -> str:
        return "***"

    def __str__(self) -> str:
        return "***"

    def __format__(self, format_spec: str) -> str:
        return format("***", format_spec)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        # Constant time: tokens are compared against what clients send. surrogatepass:
        # a header that was not UTF-8 reaches us with lone surrogates; it must compare
        # unequal, not raise.
        return hmac.compare_digest(self._value.encode("utf-8", "surrogatepass"),
                                   other._value.encode("utf-8", "surrogatepass"))

    def __hash__(self) -> int:
        return hash((Secret, self._value))


# user:password@ with everything up to the LAST '@' taken as the password, so that an
# unencoded '@', '/', '?' or '#' in a password can never leak (at worst we redact more).
_URI_PASSWORD_RE = re.compile(
    r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:@/?#]*):(?P<password>.*)@(?P<tail>[^@]*)$",
    re.DOTALL,
)
_QUERY_SECRET_RE = re.compile(
    r"(?P<key>[?&](?:password|passwd|pwd|secret|token|access_token|api_key|apikey)=)[^&#]*",
    re.IGNORECASE,
)


def redact_uri(uri: str) -> str:
    """``uri`` with its password (and secret-looking query values) replaced by ``***``.

    ``mysql://repl:pw@host/db`` -> ``mysql://repl:***@host/db``; ``?password=x`` ->
    ``?password=***``. URIs without a password come back unchanged. Everything from the
    first ``:`` of the authority to the last ``@`` counts as the password, so a password
    with unencoded ``@ / ? #`` is still hidden; the price is over-redaction of the rare
    URI that has an ``@`` in its query.
    """
    match = _URI_PASSWORD_RE.match(uri)
    if match is not None and match.group("password"):
        uri = f"{match.group('head')}:***@{match.group('tail')}"
    return _QUERY_SECRET_RE.sub(lambda m: m.group("key") + "***", uri)


