"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.bootstrap._storage import BootstrapStorage, open_storage
from tests.integration.bootstrap_support import BACKENDS, drop_schema, storage_url


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BootstrapStorage]:
    url = storage_url(request.param, tmp_path, request, span=100)
    storage = open_storage(url)
    try:
        yield storage
    finally:
        storage.close()
        if request.param == "postgresql":
            drop_schema(request.getfixturevalue("postgres_server"), url)
