"""databus._redact: configured secrets never reach a log record, an error or a status."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote

import pytest

from databus import _redact
from databus._redact import (
    install_log_redaction,
    redact,
    register_secret,
    register_uri,
    split_password,
)
from databus.bootstrap._postgres import PostgresStorage
from databus.config import BootstrapConfig, BufferConfig, Secret, describe
from databus.errors import DatabusError, StorageUnavailableError

PASSWORD = "p%zz@Se:crét/9x"
TOKEN = "tök3n-\x7fadmin"


def test_every_spelling_is_redacted() -> None:
    register_secret(PASSWORD)
    for form in (PASSWORD, quote(PASSWORD, safe=""), quote(PASSWORD),
                 repr(PASSWORD.encode())[2:-1], ascii(PASSWORD)[1:-1],
                 PASSWORD.encode("unicode_escape").decode(), "p%zz@Se:cr\\u00e9t/9x",
                 PASSWORD.encode().decode("latin-1")):
        assert redact(f"before {form} after") == "before *** after", form


def test_uri_password_pieces_are_redacted() -> None:
    """libpq quotes the piece of an unencoded password before an '@'."""
    register_uri("postgresql://u:Pg%zzpiece@Secondpart:x@h/db")
    assert redact('invalid percent-encoded token: "Pg%zzpiece"') == (
        'invalid percent-encoded token: "***"')
    assert redact("could not translate host name Secondpart") == (
        "could not translate host name ***")
    assert redact("user u on host h") == "user u on host h"  # nothing else is touched


def test_short_secrets_and_empty_registry() -> None:
    assert redact("anything") == "anything"
    register_secret("ab")  # too short to search for: it would mask ordinary words
    assert redact("tab") == "tab"


def test_secret_and_configs_register_themselves() -> None:
    Secret(TOKEN)
    assert redact(f"Bearer {TOKEN}") == "Bearer ***"
    assert redact(repr(f"Bearer {TOKEN}".encode())) == "b'Bearer ***'"
    BufferConfig(name="b", capacity_mb=1, source="mysql://repl:s3cr%40t-pw@h:3306/?tables=a.b")
    assert redact("password s3cr@t-pw was refused") == "password *** was refused"
    config = BootstrapConfig(storage=f"postgresql://u:{PASSWORD}@h/db", run=("server",))
    assert redact(f"token: {PASSWORD}") == "token: ***"
    assert PASSWORD not in repr(config) and PASSWORD not in str(describe(config))


def test_databus_errors_are_redacted_when_built() -> None:
    register_secret(PASSWORD)
    error = StorageUnavailableError(f'invalid dsn: invalid percent-encoded token: "{PASSWORD}"')
    assert PASSWORD not in str(error) and PASSWORD not in error.message
    assert PASSWORD not in str(error.to_json()) and "***" in error.message
    assert PASSWORD not in str(DatabusError(f"x {quote(PASSWORD, safe='')} y"))


def test_secret_compares_headers_that_are_not_utf8() -> None:
    token = Secret("right-token")
    assert token != Secret("\udcff\ud800 bad")  # lone surrogates: unequal, no exception


@pytest.mark.parametrize(("uri", "rest", "password"), [
    ("postgresql://u:p%zz@ss:wö/rd@127.0.0.1:5/db?schema=x",
     "postgresql://u@127.0.0.1:5/db?schema=x", "p%zz@ss:wö/rd"),
    ("postgresql://u:p%40ss@h/db", "postgresql://u@h/db", "p@ss"),
    ("postgresql://u@h/db", "postgresql://u@h/db", None),
    ("postgresql://h/db", "postgresql://h/db", None),
])
def test_split_password(uri: str, rest: str, password: str | None) -> None:
    assert split_password(uri) == (rest, password)


def _formatted(logger: logging.Logger, emit: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        emit()  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_log_records_are_redacted_whoever_logs() -> None:
    """Defect 8's path: a third party (aiohttp) logs a message, args and a traceback
    that quote the token; the record is redacted when it is created."""
    Secret(TOKEN)
    logger = logging.getLogger("aiohttp.server.test_redact")

    def emit() -> None:
        logger.error("Invalid header value char: %r", f"Authorization: Bearer {TOKEN}\x00"
                     .encode())
        try:
            raise ValueError(f"bad header b'Authorization: Bearer {TOKEN}'")
        except ValueError:
            logger.exception("Error handling request")
        logger.warning(f"inline {TOKEN}")
        logger.info("%s", {"token": TOKEN})

    text = _formatted(logger, emit)
    assert "Error handling request" in text and "ValueError" in text
    assert text.count("***") == 4
    for form in (TOKEN, repr(TOKEN.encode())[2:-1], ascii(TOKEN)[1:-1]):
        assert form not in text


def test_redacting_filter_on_root_handlers() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "token %s", (TOKEN,), None)
    Secret(TOKEN)  # registered after the record was made: the handler filter catches it
    _redact.RedactingFilter().filter(record)
    assert record.getMessage() == "token ***"


def test_uncaught_exceptions_in_a_cli_process_are_redacted(tmp_path: Path) -> None:
    """sys.excepthook and threading.excepthook print tracebacks without logging."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import threading\n"
        "from databus._redact import install_log_redaction\n"
        "from databus.config import Secret\n"
        f"Secret({TOKEN!r})\n"
        "install_log_redaction()\n"
        "def boom():\n"
        f"    raise RuntimeError('thread ' + {TOKEN!r})\n"
        "t = threading.Thread(target=boom); t.start(); t.join()\n"
        f"raise RuntimeError('main ' + {TOKEN!r})\n", encoding="utf-8")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    err = run.stderr.decode("utf-8", "replace")
    assert "thread ***" in err and "main ***" in err, err
    assert TOKEN not in err and ascii(TOKEN)[1:-1] not in err


def test_postgres_storage_never_gives_the_password_to_a_url_parser() -> None:
    """Defect 7 without a server: an unencoded '%' made libpq's URL parser fail with
    'invalid percent-encoded token: "<password>"'. The password now travels as its own
    argument, so the error is about the (closed) port, never the password."""
    url = f"postgresql://u:{PASSWORD}@127.0.0.1:1/db"
    with pytest.raises(StorageUnavailableError) as failure:
        PostgresStorage(url, connect_timeout=1)
    message = failure.value.message
    assert "percent-encoded" not in message and "127.0.0.1" in message
    assert "p%zz" not in message and "crét" not in message and "port 1 failed" in message


def test_threads_share_the_registry() -> None:
    done = threading.Event()

    def register() -> None:
        register_secret("from-a-thread-123")
        done.set()

    threading.Thread(target=register).start()
    assert done.wait(5)
    assert redact("from-a-thread-123") == "***"


def test_install_is_idempotent() -> None:
    install_log_redaction()
    install_log_redaction()
    root = logging.getLogger()
    for handler in root.handlers:
        assert sum(isinstance(f, _redact.RedactingFilter) for f in handler.filters) <= 1


def test_client_relay_and_bootstrap_urls_with_credentials_are_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from databus.client import DatabusClient, MemoryCheckpointStore

    DatabusClient(["http://reader:Relay-Pw-9f3@127.0.0.1:1"],
                  bootstrap=["http://boot:Boot-Pw-77x@127.0.0.1:2"], sources=["a.b"],
                  checkpoint_store=MemoryCheckpointStore())
    with caplog.at_level(logging.WARNING):
        logging.getLogger("databus.client").warning(
            "relay http://reader:Relay-Pw-9f3@127.0.0.1:1 failed; bootstrap Boot-Pw-77x")
    text = caplog.text
    assert "Relay-Pw-9f3" not in text and "Boot-Pw-77x" not in text
    assert "***" in text
