"""Settings shared by every test."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from databus import _limited_log, _redact

# One Hypothesis profile for every run (CI or not): no per-example deadline and no
# "too slow" health check, both of which measure the machine rather than the code (the
# suite must pass with both cores busy); a failure prints the blob that reproduces it
# (``@reproduce_failure``). Tests whose failure could not be replayed otherwise are
# derandomized in their own settings. ``HYPOTHESIS_PROFILE=dev`` keeps Hypothesis' own
# defaults.
settings.register_profile(
    "ci", deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    """``DATABUS_EVENT_LOOP=uvloop pytest ...`` runs the in-process servers of the tests
    (every ``asyncio.run``) on uvloop, as ``databus relay`` runs on it: the serving code
    touches transports, whose uvloop implementations differ from asyncio's."""
    if os.environ.get("DATABUS_EVENT_LOOP", "").strip().lower() == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# Tests that share a pytest-xdist group run one after another on one worker
# (``--dist loadgroup``; docs/testing.md, "Tiers and workers"): every test of the
# SparkSession (one JVM of ~1 GB and a 10 s start, not one per worker) and every test of
# the ZooKeeper ensemble, whose fault injection (kills, pauses, lost quorum, expired
# sessions) and short session timeouts are what the group's tests are about.
GROUPS_BY_FIXTURE = {
    "spark": "spark",
    "zookeeper_ensemble": "zookeeper-ensemble",
    "zookeeper_chroot": "zookeeper-ensemble",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests that must not share a worker's neighbours (above), and start the
    long ones first: the acceptance runs, then the groups, so that the last minutes of a
    parallel run are short tests on both workers rather than one long test on one."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("spark") is not None:
            fixtures.add("spark")
        groups = {GROUPS_BY_FIXTURE[f] for f in fixtures & GROUPS_BY_FIXTURE.keys()}
        for group in sorted(groups)[:1]:
            item.add_marker(pytest.mark.xdist_group(group))

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("acceptance") is not None:
            return 0
        return 1 if item.get_closest_marker("xdist_group") is not None else 2

    items.sort(key=rank)


@pytest.fixture(autouse=True)
def _isolated_secret_registry() -> Iterator[None]:
    """Each test starts with no registered secret: the registry is process-wide (as it
    must be in a relay or bootstrap process), and a short secret of one test would
    otherwise mask ordinary words in the messages a later test asserts on."""
    _redact.forget_all()
    yield
    _redact.forget_all()


@pytest.fixture(autouse=True)
def _isolated_log_limits() -> Iterator[None]:
    """Each test starts with no rate-limited log kind (databus._limited_log is
    process-wide): a warning a test expects is never held back by an earlier test's."""
    _limited_log.forget_all(flush=False)
    yield
