"""fetchers/_failures.py: the fix text of a quarantine, and the name rule the fetchers and
``databus pg setup`` use, which must be the relay catalog's (relay/_catalog.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from databus.errors import ConfigError
from databus.fetchers._failures import heal_fix, servable_name
from databus.relay._catalog import RelayCatalog

NAMES = ["shop.orders", "ws.a b", "ws.a,b", "ws.tab\there", "ws.new\nline", "x.\x00",
         "sch.über", "a.b-c", "s." + "t" * 260, "", "db.\u00a0nbsp", 'ws."quoted"']


@pytest.mark.parametrize("name", NAMES)
def test_servable_name_is_the_relay_catalogs_rule(tmp_path: Path, name: str) -> None:
    catalog = RelayCatalog(tmp_path / "catalog.json").for_buffer("b", 0)
    try:
        catalog.source_id(name)
        accepted = True
    except ConfigError:
        accepted = False
    assert servable_name(name) == accepted


def test_the_fix_ends_with_the_heal_command_quoted_for_a_shell() -> None:
    assert heal_fix("shop.orders", "do x") == (
        "do x; then databus relay heal --relay URL --source shop.orders")
    assert heal_fix("ws.a b", "rename it").endswith("--source 'ws.a b'")
