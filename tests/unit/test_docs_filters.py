"""docs/filters.md cannot drift from the code: every spec, bucket set, URL, client call,
config and error message it shows goes through the real parsers here."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from databus.errors import ConfigError, FilterError
from databus.event import encode_key
from databus.fetchers.relay._uri import ChainURI
from databus.filters import BucketSet, FilterSpec

DOC = (Path(__file__).resolve().parents[2] / "docs" / "filters.md").read_text()


def _tables() -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table of the page: its header cells and its rows' cells."""
    tables: list[tuple[list[str], list[list[str]]]] = []
    lines = DOC.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = _cells(lines[i])
            rows: list[list[str]] = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            tables.append((header, rows))
        else:
            i += 1
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def _code(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def _rows(*columns: str) -> list[list[str]]:
    found = [rows for header, rows in _tables() if header[-len(columns):] == list(columns)
             or header[:len(columns)] == list(columns)]
    assert found, f"no table with columns {columns} in docs/filters.md"
    return [row for rows in found for row in rows]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)


def _key(text: str) -> object:
    value = json.loads(text)
    return tuple(value) if isinstance(value, list) else value


SPEC_ROWS = _rows("spec", "passes", "does not pass")


def test_the_tables_are_found() -> None:
    assert len(SPEC_ROWS) >= 10
    assert len(_rows("spec", "message")) >= 15


@pytest.mark.parametrize("row", SPEC_ROWS, ids=lambda r: r[0][:40])
def test_spec_examples(row: list[str]) -> None:
    """Each spec parses, passes exactly the keys the table says, leaves sources it does
    not name alone, and survives its canonical JSON."""
    (text,) = _code(row[1])
    spec = FilterSpec.parse(text)
    decoded = json.loads(text)
    names = list(decoded.get("sources", decoded))
    assert len(names) == 1
    source = names[0]
    for cell, expected in ((row[2], True), (row[3], False)):
        for key_text in _code(cell):
            _, key_bytes, pkey = encode_key(_key(key_text))  # type: ignore[arg-type]
            assert spec.passes(source, pkey, key_bytes) is expected, (text, key_text)
            assert spec.passes("shop.unnamed", pkey, key_bytes)
    assert FilterSpec.parse(spec.to_json_text()) == spec


@pytest.mark.parametrize("row", _rows("written", "ids"), ids=lambda r: r[0])
def test_bucket_set_examples(row: list[str]) -> None:
    (written,) = _code(row[0])
    ids = [int(i) for i in _code(row[1])]
    assert list(BucketSet.parse(json.loads(written))) == ids


@pytest.mark.parametrize("row", _rows("spec", "message"), ids=lambda r: r[0][:40])
def test_error_examples(row: list[str]) -> None:
    (text,) = _code(row[0])
    with pytest.raises(FilterError) as caught:
        FilterSpec.parse(text)
    assert caught.value.message == row[1]


def _url_filters() -> list[str]:
    found = re.findall(r"[?&]filter=([^\s\"&]+)", DOC)
    assert len(found) >= 2
    return found


@pytest.mark.parametrize("encoded", _url_filters())
def test_url_examples(encoded: str) -> None:
    (text,) = parse_qs(f"filter={encoded}")["filter"]
    assert not FilterSpec.parse(text).is_empty


def test_client_example() -> None:
    (block,) = _blocks("python")
    exec(compile(block, "docs/filters.md", "exec"), {})  # builds the client, asserts


def test_tail_example() -> None:
    commands = [line for line in DOC.splitlines() if line.startswith("databus tail ")]
    assert commands
    for command in commands:
        argv = shlex.split(command)
        spec = FilterSpec.parse(argv[argv.index("--filter") + 1])
        assert not spec.is_empty


def test_chained_relay_config_example() -> None:
    (block,) = _blocks("toml")
    buffer = tomllib.loads(block)["relay"]["buffers"][0]
    uri = ChainURI.parse(buffer["source"])
    assert uri.filter_json is not None
    assert FilterSpec.parse(uri.filter_json).for_source("shop.orders") is not None
    # The rule the page states: every source the filter names must be in sources=.
    query = parse_qs(urlsplit(buffer["source"]).query)
    other = buffer["source"].replace(f"sources={query['sources'][0]}", "sources=shop.items")
    with pytest.raises(ConfigError, match="names source"):
        ChainURI.parse(other)


def test_group_example_is_a_member_filter() -> None:
    from databus.client.group._assignment import member_filter

    match = re.search(r"`(\{\"shop.orders\": \{\"type\": \"mod\", \"n\": 64[^`]*)`", DOC)
    assert match is not None
    assert FilterSpec.parse(match.group(1)) == member_filter(["shop.orders"], range(16), 64)
