"""The streaming source's pure parts: offsets (round trip, the end of a micro-batch,
refusal of another partition count or source list) and options (checked at once, no
secret in a message)."""

from __future__ import annotations

import json

import pytest

from databus.checkpoint import Checkpoint
from databus.spark_jobs.stream import _offsets, _options
from databus.spark_jobs.stream._rows import key_json

SOURCES = ("shop.orders",)


def test_an_offset_round_trips_through_json() -> None:
    first = _offsets.nothing_read(2, SOURCES)
    text = json.dumps(first.to_json())
    assert _offsets.parse(text, partitions=2, sources=SOURCES) == first
    assert json.loads(text)["checkpoints"] == {"0": {"mode": "online", "window_offset": -1,
                                                     "window_scn": -1},
                                               "1": {"mode": "online", "window_offset": -1,
                                                     "window_scn": -1}}


def test_the_end_of_a_batch_is_after_the_newest_window() -> None:
    start = _offsets.Offset(2, SOURCES, (Checkpoint(5), Checkpoint(9)))
    end = _offsets.advanced_to(start, 9)
    assert end.checkpoints == (Checkpoint(9), Checkpoint(9))
    assert _offsets.advanced_to(end, 9) is end  # nothing new: the start itself
    assert _offsets.advanced_to(start, None) is start  # an empty buffer


def test_another_partition_count_or_source_list_is_refused() -> None:
    written = _offsets.nothing_read(2, SOURCES).to_json()
    with pytest.raises(_offsets.OffsetMismatch, match=r"partitions=2.*partitions=4"):
        _offsets.parse(written, partitions=4, sources=SOURCES)
    with pytest.raises(_offsets.OffsetMismatch, match="sources"):
        _offsets.parse(written, partitions=2, sources=("shop.items",))
    broken = {**written, "checkpoints": {"0": {"window_scn": 3}}}
    with pytest.raises(_offsets.OffsetError, match="one checkpoint for each"):
        _offsets.parse(broken, partitions=2, sources=SOURCES)
    partial = {**written, "checkpoints": {"0": {"window_scn": 3, "window_offset": 1},
                                          "1": {"window_scn": 3}}}
    with pytest.raises(_offsets.OffsetError, match="whole window"):
        _offsets.parse(partial, partitions=2, sources=SOURCES)


def test_options_are_checked_at_once_without_echoing_the_token() -> None:
    good = {"relays": "http://r1:1, http://r2:2/", "sources": "shop.orders",
            "partitions": "4", "token": "s3cret-token"}
    opts = _options.parse(good)
    assert opts.relays == ("http://r1:1", "http://r2:2") and opts.partitions == 4
    assert "s3cret" not in repr(opts)
    cases = [({"sources": "shop.orders"}, "needs relays"),
             ({**good, "partitions": "0"}, "partitions must be between 1"),
             ({**good, "partitions": "two"}, "partitions must be an integer"),
             ({**good, "sources": "orders"}, "not a source name"),
             ({**good, "relays": "r1:1"}, "not an http"),
             ({**good, "parttions": "2"}, "unknown option.*parttions"),
             ({**good, "starting": "now"}, "starting is"),
             ({**good, "scn": "5"}, "batch reads")]
    for options, message in cases:
        with pytest.raises(_options.OptionError, match=message) as info:
            _options.parse(options)
        assert "s3cret" not in str(info.value)
    with pytest.raises(_options.OptionError, match="needs bootstrap"):
        _options.parse(good, streaming=False)


def test_keys_as_json_text() -> None:
    assert key_json(42) == "42"
    assert key_json("alice") == '"alice"'
    assert key_json((1, "eu")) == '[1,"eu"]'
    assert key_json(b"\x01\xff") == '"01ff"'


def test_value_columns_named_like_row_columns_get_a_prefix() -> None:
    from databus.spark_jobs.stream._rows import ColumnClashError, value_column_names

    assert value_column_names(["id", "qty"], source="s.t") == ["id", "qty"]
    # Spark resolves names case-insensitively: Key clashes with key.
    assert value_column_names(["id", "Key", "timestamp", "value", "seq"], source="s.t") == [
        "id", "value_Key", "value_timestamp", "value_value", "value_seq"]
    # The prefixed name is a column of the table too: no name of its own is left.
    with pytest.raises(ColumnClashError, match=r"'key' clashes.*'value_key' is taken"):
        value_column_names(["key", "value_key"], source="s.t")
    with pytest.raises(ColumnClashError):
        value_column_names(["value_key", "key"], source="s.t")
