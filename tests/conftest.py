"""Settings shared by every test."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from databus import _redact


def pytest_configure(config: pytest.Config) -> None:
    """``DATABUS_EVENT_LOOP=uvloop pytest ...`` runs the in-process servers of the tests
    (every ``asyncio.run``) on uvloop, as ``databus relay`` runs on it: the serving code
    touches transports, whose uvloop implementations differ from asyncio's."""
    if os.environ.get("DATABUS_EVENT_LOOP", "").strip().lower() == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


@pytest.fixture(autouse=True)
def _isolated_secret_registry() -> Iterator[None]:
    """Each test starts with no registered secret: the registry is process-wide (as it
    must be in a relay or bootstrap process), and a short secret of one test would
    otherwise mask ordinary words in the messages a later test asserts on."""
    _redact.forget_all()
    yield
    _redact.forget_all()
