"""Settings shared by every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from databus import _redact


@pytest.fixture(autouse=True)
def _isolated_secret_registry() -> Iterator[None]:
    """Each test starts with no registered secret: the registry is process-wide (as it
    must be in a relay or bootstrap process), and a short secret of one test would
    otherwise mask ordinary words in the messages a later test asserts on."""
    _redact.forget_all()
    yield
    _redact.forget_all()
