"""SCN arithmetic for MySQL/MariaDB binlogs (DESIGN section 2).

A window's SCN is ``(binlog file number << 32) | end position of the transaction``: the
file number is the numeric extension of the binlog file name (``binlog.000042`` -> 42)
and the end position is the byte offset just after the transaction's last event (its
XID or COMMIT), which is where the next transaction starts. SCNs therefore increase in
commit order, also across a rotation (the file number goes up, the position starts
again near 4), and an SCN names the exact place to resume reading after that
transaction: ``(file, position)``.

Positions are 32-bit in the binlog protocol itself, and file numbers stay far below
2**31, so an SCN always fits a signed 64-bit integer. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["BinlogPosition", "binlog_file_number", "make_scn", "split_scn"]

_POS_BITS = 32
_POS_MASK = (1 << _POS_BITS) - 1
_MAX_FILE_NUMBER = (1 << 31) - 1
# The first event of every binlog file starts after its 4-byte magic number.
FIRST_EVENT_POSITION = 4
_NUMBER_RE = re.compile(r"\.(\d+)\Z")


def binlog_file_number(file_name: str) -> int:
    """The number of a binlog file: ``binlog.000042`` -> 42 (``ValueError`` if none)."""
    match = _NUMBER_RE.search(file_name)
    if match is None:
        raise ValueError(f"binlog file name {file_name!r} has no numeric extension")
    number = int(match.group(1))
    if number > _MAX_FILE_NUMBER:
        raise ValueError(f"binlog file number {number} does not fit an SCN")
    return number


def make_scn(file_number: int, position: int) -> int:
    """The SCN of the transaction that ends at ``position`` in binlog file ``file_number``."""
    if not 0 <= file_number <= _MAX_FILE_NUMBER:
        raise ValueError(f"binlog file number {file_number} out of range")
    if not 0 <= position <= _POS_MASK:
        raise ValueError(f"binlog position {position} does not fit 32 bits")
    return (file_number << _POS_BITS) | position


def split_scn(scn: int) -> tuple[int, int]:
    """``(file number, position)`` of an SCN made by ``make_scn``."""
    if scn < 0:
        raise ValueError(f"a binlog SCN is never negative, got {scn}")
    return scn >> _POS_BITS, scn & _POS_MASK


@dataclass(frozen=True, slots=True)
class BinlogPosition:
    """A place in the binlog: a file name and a byte offset in it."""

    file: str
    position: int

    @property
    def scn(self) -> int:
        return make_scn(binlog_file_number(self.file), self.position)

    def __str__(self) -> str:
        return f"{self.file}:{self.position}"
