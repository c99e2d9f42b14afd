"""Log floods (issue 27, item 12): an upstream whose checkpoint header stands 50 SCNs
behind its body makes a chained relay read the same windows over and over, hundreds of
answers a second; it produced 66,550 WARNING lines in 5 s. Whatever the chained relay
does with such answers, its log stays a few lines: repeated warnings become one line
with a count per interval (databus._limited_log).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tests.hostile_upstream import hostile_upstream
from tests.integration.test_relay_chaining import chained, config, synthetic
from tests.relay_harness import running_relay
from tests.waiting import async_wait_until

WINDOWS = 200
# Answers the hostile upstream must have given before the log is counted: the flood
# happened (each answer repeats up to 50 windows the chained relay holds).
ANSWERS = 200


def test_an_upstream_lying_50_scns_behind_floods_no_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)

    async def main() -> int:
        async with running_relay(config(tmp_path, "up", {"src": synthetic(WINDOWS)})) as up:
            await up.wait_for_scn("src", WINDOWS)
            async with hostile_upstream(up.url, up.session, "behind",
                                        times=1 << 30) as lying:
                down = config(tmp_path, "down", {"copy": chained(
                    lying.url, follow="false", wait_ms="100", backoff_max_s="0.05")})
                async with running_relay(down):
                    await async_wait_until(lambda: lying.attacks >= ANSWERS,
                                           f"{ANSWERS} answers of the lying upstream", 60)
                return lying.attacks

    answers = asyncio.run(main())
    warnings = [r for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("databus")]
    # A handful of kinds, each at most twice (its first line, then its count) in a run
    # far shorter than a few intervals; 50 lines per answer before.
    assert len(warnings) <= 12, (answers, [r.getMessage() for r in warnings][:20])
