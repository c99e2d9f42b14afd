"""The bootstrap HTTP fuzz tests (tests/unit/test_http_fuzz_bootstrap.py) on a
PostgreSQL store: out-of-range numbers there are psycopg2 errors, not SQLite's
OverflowError, and must be refused before they reach SQL all the same."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.bootstrap._storage import open_storage
from tests.http_support import fill_store
from tests.integration.bootstrap_support import drop_schema, storage_url
from tests.unit.test_http_fuzz_bootstrap import (
    Boot,
    serve,
)
from tests.unit.test_http_fuzz_bootstrap import (
    test_bootstrap_admin_headers_and_bodies as test_pg_admin_headers_and_bodies,
)
from tests.unit.test_http_fuzz_bootstrap import (
    test_bootstrap_every_endpoint_and_method as test_pg_every_endpoint_and_method,
)
from tests.unit.test_http_fuzz_bootstrap import (
    test_bootstrap_stream_parameters as test_pg_stream_parameters,
)
from tests.unit.test_http_fuzz_bootstrap import (
    test_the_collected_checkpoints_cover_every_phase as test_pg_checkpoints_cover_every_phase,
)

pytestmark = pytest.mark.integration

__all__ = ["test_pg_admin_headers_and_bodies", "test_pg_checkpoints_cover_every_phase",
           "test_pg_every_endpoint_and_method", "test_pg_stream_parameters"]


@pytest.fixture(scope="module")
def boot(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Boot]:
    tmp: Path = tmp_path_factory.mktemp("pgfuzz")
    url = storage_url("postgresql", tmp, request, span=10)
    storage = open_storage(url, log_partition_span=10)
    try:
        fill_store(storage)
        yield from serve(storage)
    finally:
        storage.close()
        drop_schema(request.getfixturevalue("postgres_server"), url)
