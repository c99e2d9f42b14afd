"""SCN arithmetic of the binlog fetcher: (file number << 32) | end position."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from databus.fetchers.mysql import binlog_file_number, make_scn, split_scn
from databus.fetchers.mysql._scn import BinlogPosition

files = st.integers(min_value=0, max_value=(1 << 31) - 1)
positions = st.integers(min_value=0, max_value=(1 << 32) - 1)


@given(files, positions)
def test_make_and_split_are_inverse(number: int, position: int) -> None:
    scn = make_scn(number, position)
    assert 0 <= scn < 1 << 63  # fits the signed 64-bit SCN of the wire format
    assert split_scn(scn) == (number, position)


@given(files, positions, files, positions)
def test_order_is_file_then_position(f1: int, p1: int, f2: int, p2: int) -> None:
    assert (make_scn(f1, p1) < make_scn(f2, p2)) == ((f1, p1) < (f2, p2))


def test_a_rotation_moves_the_scn_forward() -> None:
    end_of_big_file = make_scn(7, (1 << 32) - 1)
    start_of_next = make_scn(8, 4)
    assert start_of_next > end_of_big_file


@pytest.mark.parametrize(
    ("name", "number"),
    [("binlog.000001", 1), ("mysql-bin.123456", 123456), ("/var/log/x.y.0001234567", 1234567),
     ("binlog.999999", 999999)],
)
def test_binlog_file_number(name: str, number: int) -> None:
    assert binlog_file_number(name) == number


@pytest.mark.parametrize("name", ["binlog", "binlog.", "binlog.00a1", "binlog.99999999999"])
def test_bad_binlog_file_names(name: str) -> None:
    with pytest.raises(ValueError):
        binlog_file_number(name)


@pytest.mark.parametrize(("number", "position"), [(-1, 4), (1 << 31, 4), (1, -1), (1, 1 << 32)])
def test_out_of_range(number: int, position: int) -> None:
    with pytest.raises(ValueError):
        make_scn(number, position)


def test_split_rejects_negative_scns() -> None:
    with pytest.raises(ValueError):
        split_scn(-1)


def test_position_scn_and_text() -> None:
    position = BinlogPosition("binlog.000003", 1234)
    assert position.scn == (3 << 32) | 1234
    assert str(position) == "binlog.000003:1234"
