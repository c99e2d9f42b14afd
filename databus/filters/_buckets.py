"""Bucket and range id sets (``"[0,3-4]"``, JSON lists) and their fast membership test."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from databus.errors import FilterError

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

Paramstyle = Literal["format", "qmark"]

# Above this many allowed buckets building a frozenset per request costs more than it
# saves (the relay parses a spec per poll); bisect over the ranges instead.
_FROZENSET_LIMIT = 4096


_ITEM_RE = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")



def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _short(value: object) -> str:
    """``repr`` for an error message, cut short: specs come from clients."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _as_int(value: object, field_name: str) -> int:
    # bool is an int subclass; ``true`` for a bucket count is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise FilterError(f"field {field_name!r}: expected an integer, got {_type_name(value)}")
    return value


class _RangeLookup:
    """Membership in sorted disjoint inclusive ranges by bisection (for huge bucket sets)."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, ranges: tuple[tuple[int, int], ...]) -> None:
        self._starts = [lo for lo, _ in ranges]
        self._ends = [hi for _, hi in ranges]

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        i = bisect_right(self._starts, value) - 1
        return i >= 0 and value <= self._ends[i]


@dataclass(frozen=True)
class BucketSet:
    """A non-empty set of non-negative ids, kept as sorted, merged, inclusive ranges.

    Build it with ``BucketSet.of`` (normalises) or ``BucketSet.parse`` (from the JSON
    forms); ``str()`` gives the canonical Databus string, e.g. ``"[0,3-4]"``.
    """

    ranges: tuple[tuple[int, int], ...]
    _lookup: Container[int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.ranges:
            raise FilterError("bucket set is empty: list at least one id")
        prev_hi = -2
        for pair in self.ranges:
            if not (
                isinstance(pair, tuple)
                and len(pair) == 2
                and all(isinstance(i, int) and not isinstance(i, bool) for i in pair)
            ):
                raise FilterError(f"bucket ranges must be (lo, hi) int pairs, got {pair!r}")
            lo, hi = pair
            if lo < 0 or hi < lo or lo <= prev_hi + 1:
                raise FilterError(
                    f"bucket ranges must be sorted, disjoint, non-adjacent and >= 0: "
                    f"{self.ranges!r} (use BucketSet.of to normalise)"
                )
            prev_hi = hi
        lookup: Container[int]
        if self.count <= _FROZENSET_LIMIT:
            lookup = frozenset(i for lo, hi in self.ranges for i in range(lo, hi + 1))
        else:
            lookup = _RangeLookup(self.ranges)
        object.__setattr__(self, "_lookup", lookup)

    @classmethod
    def of(cls, items: Iterable[int | tuple[int, int]]) -> BucketSet:
        """Normalise ids and inclusive ``(lo, hi)`` ranges: sort, merge overlaps/adjacency."""
        pairs: list[tuple[int, int]] = []
        for item in items:
            lo, hi = (item, item) if isinstance(item, int) else item
            if lo < 0 or hi < lo:
                raise FilterError(f"invalid bucket range {lo}-{hi}")
            pairs.append((lo, hi))
        pairs.sort()
        merged: list[tuple[int, int]] = []
        for lo, hi in pairs:
            if merged and lo <= merged[-1][1] + 1:
                if hi > merged[-1][1]:
                    merged[-1] = (merged[-1][0], hi)
            else:
                merged.append((lo, hi))
        return cls(tuple(merged))

    @classmethod
    def parse(cls, value: object, field_name: str = "buckets") -> BucketSet:
        """From ``"[0,3-4]"`` or a JSON list like ``[0, "3-4", [5, 6]]``."""
        items: list[tuple[int, int]] = []
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("[") != text.endswith("]") or text in ("[", "]"):
                raise FilterError(f"field {field_name!r}: unbalanced brackets in {_short(value)}")
            if text.startswith("["):
                text = text[1:-1]
            if not text.strip():
                raise FilterError(f"field {field_name!r}: no ids in {_short(value)}")
            for part in text.split(","):
                items.append(_parse_item(part, value, field_name))
        elif isinstance(value, list):
            if not value:
                raise FilterError(f"field {field_name!r}: no ids in []")
            for element in value:
                items.append(_parse_list_element(element, field_name))
        else:
            raise FilterError(
                f'field {field_name!r}: expected a range string like "[0,3-4]" or a list, '
                f"got {_type_name(value)}"
            )
        try:
            return cls.of(items)
        except FilterError as exc:
            raise FilterError(f"field {field_name!r}: {exc.message}") from None

    @property
    def count(self) -> int:
        """How many ids the set holds."""
        return sum(hi - lo + 1 for lo, hi in self.ranges)

    @property
    def max(self) -> int:
        """The largest id."""
        return self.ranges[-1][1]

    def __contains__(self, bucket: object) -> bool:
        return bucket in self._lookup

    def __iter__(self) -> Iterator[int]:
        for lo, hi in self.ranges:
            yield from range(lo, hi + 1)

    def __str__(self) -> str:
        parts = (str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)
        return "[" + ",".join(parts) + "]"


def _parse_item(part: str, whole: object, field_name: str) -> tuple[int, int]:
    match = _ITEM_RE.fullmatch(part)
    if match is None:
        raise FilterError(
            f"field {field_name!r}: malformed id or range {_short(part.strip())} in {_short(whole)}"
        )
    for digits in match.groups():
        # int() of thousands of digits is slow and, past the interpreter's digit limit,
        # a ValueError; no id beyond int64 is ever valid (ids < n <= 2**63-1).
        if digits is not None and len(digits.lstrip("0")) > 19:
            raise FilterError(
                f"field {field_name!r}: id {digits[:20]}... is beyond the int64 range"
            )
    lo = int(match.group(1))
    hi = lo if match.group(2) is None else int(match.group(2))
    if hi < lo:
        raise FilterError(f"field {field_name!r}: reversed range {lo}-{hi} in {_short(whole)}")
    return lo, hi


def _parse_list_element(element: object, field_name: str) -> tuple[int, int]:
    if isinstance(element, bool):
        raise FilterError(f"field {field_name!r}: expected an id, got bool")
    if isinstance(element, int):
        if element < 0:
            raise FilterError(f"field {field_name!r}: negative id {element}")
        return element, element
    if isinstance(element, str):
        return _parse_item(element, element, field_name)
    if isinstance(element, list) and len(element) == 2:
        lo = _as_int(element[0], field_name)
        hi = _as_int(element[1], field_name)
        if lo < 0 or hi < lo:
            raise FilterError(f"field {field_name!r}: invalid range [{lo}, {hi}]")
        return lo, hi
    raise FilterError(
        f'field {field_name!r}: list items must be ints, "a-b" strings or [a, b] pairs, '
        f"got {_type_name(element)}"
    )


