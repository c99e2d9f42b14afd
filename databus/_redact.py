"""Keeping configured secrets out of every log line, error message and status field.

A process-wide registry holds every secret string the process was configured with:
each ``Secret`` (admin tokens) registers its value when it is built, and every URI
that may carry a password (relay sources, bootstrap storage, checkpoint-store DSNs)
registers the password through ``register_uri``. ``redact(text)`` replaces each of them
by ``***`` in any text, in every spelling a driver or library may echo it in:

- the raw value, its percent-decoded and percent-encoded forms (drivers quote the URL
  they were given, or the decoded password, or re-encode it);
- the escaped forms Python's own reprs produce: ``repr(bytes)`` (aiohttp logs a bad
  header as ``b'Authorization: Bearer ...'``), ``ascii()``/``unicode_escape`` and JSON
  escapes of non-ASCII characters;
- for URI passwords, the pieces between URL delimiters (``@ : / ? #``) of at least
  ``MIN_FRAGMENT`` characters: a URL parser that splits an unencoded password at one of
  them echoes a piece as a host name or port.

Secrets shorter than ``MIN_SECRET`` characters are not searched for: replacing every
``a`` of a log would make it unreadable, and such a secret is no secret anyway.

``install_log_redaction()`` (called by the ``databus`` command line and the demo, and
on the first registration) makes every ``LogRecord`` of the process redacted when it
is created, whoever logs it (our code, aiohttp, psycopg2, kazoo, asyncio), plus a
filter on the root handlers for records built by other means, and ``sys.excepthook``
and ``threading.excepthook`` for tracebacks that reach stderr without logging.
``DatabusError`` redacts its message when it is built, so HTTP error bodies, status
fields and CLI errors are covered as well.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import threading
import traceback
from collections.abc import Iterable
from types import TracebackType
from typing import Any
from urllib.parse import quote, quote_plus, unquote

__all__ = [
    "MASK",
    "MIN_FRAGMENT",
    "MIN_SECRET",
    "RedactingFilter",
    "forget_all",
    "install_log_redaction",
    "redact",
    "register_secret",
    "register_uri",
    "registered_forms",
    "split_password",
    "uri_password",
]

MASK = "***"
MIN_SECRET = 3
MIN_FRAGMENT = 4

_lock = threading.Lock()
_forms: set[str] = set()
# Longest first, so a secret that contains another is replaced whole. None: nothing
# registered (the fast path of redact()).
_pattern: re.Pattern[str] | None = None

# scheme://user:password@rest, the password running to the LAST '@' (as in
# databus.config.redact_uri): an unencoded '@ / ? #' in a password still hides it all.
_URI_USERINFO_RE = re.compile(
    r"^[A-Za-z][A-Za-z0-9+.\-]*://(?P<user>[^:@/?#]*):(?P<password>.*)@[^@]*$", re.DOTALL
)
_QUERY_SECRET_RE = re.compile(
    r"[?&](?:password|passwd|pwd|secret|token|access_token|api_key|apikey)=(?P<value>[^&#]*)",
    re.IGNORECASE,
)
_URL_DELIMITERS_RE = re.compile(r"[@:/?#]")


def _spellings(value: str) -> set[str]:
    """``value`` as drivers, reprs and encoders may print it."""
    forms = {value, unquote(value)}
    with contextlib.suppress(UnicodeError):  # lone surrogates cannot be percent-encoded
        forms |= {quote(value, safe=""), quote(value), quote_plus(value)}
    for form in list(forms):
        encoded = form.encode("utf-8", "surrogatepass")
        forms.add(repr(encoded)[2:-1])  # b'...' without the quotes
        forms.add(repr(form)[1:-1])  # str repr: printable non-ASCII kept, \x7f escaped
        forms.add(ascii(form)[1:-1])
        forms.add(form.encode("unicode_escape").decode("ascii"))
        forms.add(json.dumps(form)[1:-1])
        forms.add(json.dumps(form, ensure_ascii=False)[1:-1])
        # A latin-1 decoding of the UTF-8 bytes: what a driver that guesses the wrong
        # charset prints for non-ASCII characters.
        forms.add(encoded.decode("latin-1"))
    return {f for f in forms if len(f) >= MIN_SECRET}


def _rebuild() -> None:
    global _pattern
    ordered = sorted(_forms, key=len, reverse=True)
    _pattern = re.compile("|".join(re.escape(f) for f in ordered)) if ordered else None


def register_secret(value: str, *, fragments: bool = False) -> None:
    """Hide ``value`` (in all its spellings) from every message from now on.

    ``fragments``: also hide its pieces between URL delimiters (for URI passwords).
    """
    if not isinstance(value, str) or len(value) < MIN_SECRET:
        return
    forms = _spellings(value)
    if fragments:
        for piece in _URL_DELIMITERS_RE.split(unquote(value)) + _URL_DELIMITERS_RE.split(value):
            if len(piece) >= MIN_FRAGMENT and piece != value:
                forms |= _spellings(piece)
    with _lock:
        if forms <= _forms:
            return
        _forms.update(forms)
        _rebuild()
    install_log_redaction(handlers=False)


def uri_password(uri: str) -> str | None:
    """The password part of ``uri`` as written (not decoded), or None."""
    match = _URI_USERINFO_RE.match(uri)
    if match is None or not match.group("password"):
        return None
    return match.group("password")


def split_password(uri: str) -> tuple[str, str | None]:
    """``uri`` without its password, and the password percent-decoded (or None).

    For drivers that take the password as a separate argument: the driver then never
    parses it, so it cannot choke on an unencoded ``%``, ``@`` or ``/`` in it and quote
    it back in an error. Decoding is lenient like ``urllib.parse.unquote``: a valid
    ``%XX`` is decoded, any other ``%`` is kept as written. The password runs to the
    last ``@`` of the URI (an ``@`` in the query must be written ``%40``).
    """
    match = _URI_USERINFO_RE.match(uri)
    if match is None:
        return uri, None
    start, end = match.span("password")
    # Drop ":password" but keep "user@...".
    return uri[: start - 1] + uri[end:], unquote(match.group("password"))


def register_uri(uri: str) -> None:
    """Register the password of ``uri`` and its secret-looking query values."""
    if not isinstance(uri, str):
        return
    password = uri_password(uri)
    if password is not None:
        register_secret(password, fragments=True)
    for match in _QUERY_SECRET_RE.finditer(uri):
        register_secret(match.group("value"), fragments=True)


def registered_forms() -> frozenset[str]:
    """Every string currently redacted (for tests)."""
    with _lock:
        return frozenset(_forms)


def forget_all() -> None:
    """Empty the registry. For test suites, where one process plays many configurations:
    a secret of one test (say ``"set"``) must not mask words in the next one's messages."""
    global _pattern
    with _lock:
        _forms.clear()
        _pattern = None


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    pattern = _pattern
    if pattern is None or not text:
        return text
    return pattern.sub(MASK, text)


def redact_all(values: Iterable[str]) -> list[str]:
    return [redact(v) for v in values]


# --- logging ---------------------------------------------------------------------------

_MARK = "_databus_redacted"


def _redact_record(record: logging.LogRecord) -> None:
    """Rewrite ``record`` in place so that no registered secret survives formatting."""
    if _pattern is None or getattr(record, _MARK, False):
        return
    setattr(record, _MARK, True)
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: let the handler report it as usual
        message = None
    if message is not None:
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[0] is not None:
        text = record.exc_text or "".join(traceback.format_exception(*record.exc_info)).rstrip()
        clean = redact(text)
        if clean != text:
            # The formatter prints exc_text when set; drop exc_info so that no handler
            # formats the exception again from the live objects.
            record.exc_text, record.exc_info = clean, None
    elif record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


class RedactingFilter(logging.Filter):
    """A handler filter that redacts records (it never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        _redact_record(record)
        return True


_installed_factory = False
_installed_hooks = False


def _install_factory() -> None:
    global _installed_factory
    with _lock:
        if _installed_factory:
            return
        _installed_factory = True
        previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _redact_record(record)
        return record

    logging.setLogRecordFactory(factory)


def _install_hooks() -> None:
    global _installed_hooks
    with _lock:
        if _installed_hooks:
            return
        _installed_hooks = True
    previous_excepthook = sys.excepthook
    previous_threading_hook = threading.excepthook

    def excepthook(kind: type[BaseException], value: BaseException,
                   tb: TracebackType | None) -> None:
        if _pattern is None:
            previous_excepthook(kind, value, tb)
            return
        sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))

    def threading_hook(args: threading.ExceptHookArgs) -> None:
        if _pattern is None or args.exc_type is SystemExit:
            previous_threading_hook(args)
            return
        name = args.thread.name if args.thread is not None else "?"
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value,
                                                  args.exc_traceback))
        sys.stderr.write(redact(f"Exception in thread {name}:\n{text}"))

    sys.excepthook = excepthook
    threading.excepthook = threading_hook


def install_log_redaction(*, handlers: bool = True) -> None:
    """Redact every log record of the process from now on (idempotent).

    ``handlers``: also put a ``RedactingFilter`` on the root logger's current handlers
    and install the exception hooks (the command line does, after configuring logging).
    """
    _install_factory()
    if handlers:
        _install_hooks()
        for handler in logging.getLogger().handlers:
            if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(RedactingFilter())
