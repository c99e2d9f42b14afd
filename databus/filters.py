"""Server-side filters (DESIGN section 4, paper 3.7): which events of a source a consumer gets.

Pure logic, no I/O. The relay calls ``passes`` on every event header it serves, so each
filter precomputes what it needs (a frozenset of allowed buckets) when it is built. The
bootstrap service pushes the same filter down to SQL with ``to_sql``; both must give the
same answer for every key, which the tests check against a real SQLite.

Every event has a numeric partition key ``pkey`` (int64: the primary key when it is a
single integer, else ``stable_key_hash`` of the key bytes) and its key bytes. Per
logical source there is at most one filter:

``mod``
    bucket = ``abs(pkey) % n``; passes if the bucket is in ``buckets``. ``abs`` is the
    mathematical one, so -2**63 lands in bucket ``2**63 % n`` (Databus' Java
    ``Math.abs`` leaves it negative and never passes it).
``range`` with ``size`` and ``ids`` (the Databus form)
    passes if ``pkey // size`` is in ``ids``: size 100, ids ``[3-4]`` pass 300..499.
    ``//`` floors and ids are >= 0, so a negative pkey never passes this form.
``range`` with ``lo`` and ``hi``
    passes if ``lo <= pkey < hi``. ``hi`` may be 2**63 to include the largest int64.
``hash``
    bucket = ``stable_key_hash(key bytes) % n``; passes if the bucket is in ``buckets``.

Sources without a filter pass everything.

Bucket (and range) id sets are written as Databus range strings, ``"[0,3-4]"`` (brackets
optional), or as JSON lists whose items are ints, ``"a-b"`` strings or ``[a, b]`` pairs:
``[0, "3-4"]``, ``[0, [3, 4]]``. Ranges are inclusive; overlaps merge; an empty set is an
error (a filter that passes nothing is always a mistake).

JSON spec, canonical form (what ``FilterSpec.to_json`` writes)::

    {"shop.orders": {"type": "mod", "n": 100, "buckets": "[0,3-4]"},
     "shop.items": {"type": "range", "size": 100, "ids": "[3-4]"},
     "shop.carts": {"type": "range", "lo": 0, "hi": 1000},
     "shop.users": {"type": "hash", "n": 16, "buckets": "[0-3]"}}

Databus form, also accepted (``partitionType`` is upper case as in Databus; ``HASH`` is
our extension, ``NONE`` means no filter)::

    {"sources": {"shop.orders": {"partitionType": "MOD",
                                 "mod": {"numBuckets": 100, "buckets": "[0,3-4]"}},
                 "shop.items": {"partitionType": "RANGE",
                                "range": {"size": 100, "partitions": "[3-4]"}}}}

A top-level key ``sources`` therefore always means the Databus form. Unknown types,
unknown fields and wrong value types raise ``FilterError`` naming the source and field.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Container, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import ClassVar, Literal

from databus._hashing import stable_key_hash
from databus._json import loads_bounded
from databus.errors import FilterError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "BucketSet",
    "FilterSpec",
    "HashFilter",
    "IntervalFilter",
    "ModFilter",
    "Paramstyle",
    "RangeFilter",
    "SourceFilter",
]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

Paramstyle = Literal["format", "qmark"]

# Above this many allowed buckets building a frozenset per request costs more than it
# saves (the relay parses a spec per poll); bisect over the ranges instead.
_FROZENSET_LIMIT = 4096

# A spec with a few thousand single bucket ids is still well under this.
_MAX_TEXT_CHARS = 256 * 1024

_ITEM_RE = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")
# Plain or qualified identifiers, or a double-quoted one: column names go into SQL text.
_COLUMN_RE = re.compile(
    r'(?:[A-Za-z_][A-Za-z0-9_$]*|"[^"]+")(?:\.(?:[A-Za-z_][A-Za-z0-9_$]*|"[^"]+"))?'
)


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


def _check_column(column: str | None, what: str, filter_type: str) -> str:
    if column is None:
        raise FilterError(
            f"a {filter_type} filter cannot be pushed down to SQL without a {what} column"
        )
    if not _COLUMN_RE.fullmatch(column):
        raise FilterError(f"invalid SQL column name {column!r}")
    return column


def _placeholders(paramstyle: Paramstyle) -> tuple[str, str]:
    """The parameter placeholder and the spelling of SQL's modulo operator."""
    if paramstyle == "format":
        # psycopg2/pymysql run ``query % params``: a literal % must be doubled.
        return "%s", "%%"
    if paramstyle == "qmark":
        return "?", "%"
    raise FilterError(f"unknown paramstyle {paramstyle!r} (use 'format' or 'qmark')")


def _membership_sql(
    expr: str, expr_params: list[object], ph: str, buckets: BucketSet
) -> tuple[str, list[object]]:
    """``expr`` in ``buckets``: ``IN (...)`` for single ids, BETWEEN for runs.

    ``expr_params`` are the params of ``expr``, repeated for each occurrence.
    """
    singles = [lo for lo, hi in buckets.ranges if lo == hi]
    terms: list[str] = []
    params: list[object] = []
    if singles:
        terms.append(f"{expr} IN ({', '.join([ph] * len(singles))})")
        params.extend((*expr_params, *singles))
    for lo, hi in buckets.ranges:
        if lo < hi:
            terms.append(f"{expr} BETWEEN {ph} AND {ph}")
            params.extend((*expr_params, lo, hi))
    return "(" + " OR ".join(terms) + ")", params


class SourceFilter(ABC):
    """The filter of one logical source. Subclasses are frozen dataclasses."""

    type_name: str = ""
    # Whether ``passes`` reads the key bytes; readers skip copying them when no filter does.
    needs_key: ClassVar[bool] = False

    @abstractmethod
    def passes(self, pkey: int, key: bytes = b"") -> bool:
        """True if the event with partition key ``pkey`` and key bytes ``key`` passes."""

    @abstractmethod
    def to_json(self) -> dict[str, object]:
        """The canonical JSON object of this filter (with ``type``)."""

    @abstractmethod
    def to_sql(
        self,
        pkey_column: str | None,
        hash_column: str | None = None,
        *,
        paramstyle: Paramstyle = "format",
    ) -> tuple[str, list[object]]:
        """A parenthesised WHERE fragment and its params, equivalent to ``passes``.

        ``pkey_column`` holds the event's pkey, ``hash_column`` ``stable_key_hash`` of
        its key bytes. Raises ``FilterError`` if the column this filter needs is None:
        a filter is never silently dropped into a full scan. With ``paramstyle``
        "format" (psycopg2, pymysql) placeholders are ``%s`` and SQL's modulo is written
        ``%%``, so the fragment must go through ``execute(sql, params)``; "qmark"
        (sqlite3) uses ``?`` and ``%``.
        """


@dataclass(frozen=True)
class _BucketFilter(SourceFilter):
    """Shared by ``mod`` and ``hash``: a number of buckets and the set that passes."""

    n: int
    buckets: BucketSet
    _allowed: Container[int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        _check_buckets(self.n, self.buckets, "n", "buckets")
        object.__setattr__(self, "_allowed", self.buckets._lookup)

    def to_json(self) -> dict[str, object]:
        return {"type": self.type_name, "n": self.n, "buckets": str(self.buckets)}


@dataclass(frozen=True)
class ModFilter(_BucketFilter):
    """Passes if ``abs(pkey) % n`` is in ``buckets``."""

    type_name = "mod"

    def passes(self, pkey: int, key: bytes = b"") -> bool:
        return abs(pkey) % self.n in self._allowed

    def to_sql(
        self,
        pkey_column: str | None,
        hash_column: str | None = None,
        *,
        paramstyle: Paramstyle = "format",
    ) -> tuple[str, list[object]]:
        column = _check_column(pkey_column, "pkey", "mod")
        ph, mod = _placeholders(paramstyle)
        # abs(col % n), not abs(col) % n: equal because SQL's % truncates toward zero,
        # and abs(-2**63) overflows BIGINT in PostgreSQL, MySQL and SQLite.
        expr = f"abs({column} {mod} {ph})"
        return _membership_sql(expr, [self.n], ph, self.buckets)


@dataclass(frozen=True)
class HashFilter(_BucketFilter):
    """Passes if ``stable_key_hash(key) % n`` is in ``buckets``; ignores ``pkey``."""

    needs_key: ClassVar[bool] = True
    type_name = "hash"

    def passes(self, pkey: int, key: bytes = b"") -> bool:
        return stable_key_hash(key) % self.n in self._allowed

    def to_sql(
        self,
        pkey_column: str | None,
        hash_column: str | None = None,
        *,
        paramstyle: Paramstyle = "format",
    ) -> tuple[str, list[object]]:
        column = _check_column(hash_column, "key-hash", "hash")
        ph, mod = _placeholders(paramstyle)
        # stable_key_hash is never negative, so SQL's % agrees with Python's here.
        expr = f"({column} {mod} {ph})"
        return _membership_sql(expr, [self.n], ph, self.buckets)


@dataclass(frozen=True)
class RangeFilter(SourceFilter):
    """The Databus range form: passes if ``pkey // size`` is in ``ids``.

    Negative pkeys never pass (floor division gives a negative id, and ids are >= 0).
    """

    size: int
    ids: BucketSet
    type_name = "range"
    _allowed: Container[int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        size = _as_int(self.size, "size")
        if not 1 <= size <= INT64_MAX:
            raise FilterError(f"field 'size': must be in [1, 2**63-1], got {size}")
        if not isinstance(self.ids, BucketSet):
            raise FilterError(f"field 'ids': expected a BucketSet, got {_type_name(self.ids)}")
        if self.ids.max * size > INT64_MAX:
            # No int64 pkey can reach it, and its SQL bounds would overflow BIGINT.
            raise FilterError(
                f"field 'ids': range id {self.ids.max} * size {size} is beyond the int64 keys"
            )
        object.__setattr__(self, "_allowed", self.ids._lookup)

    def passes(self, pkey: int, key: bytes = b"") -> bool:
        return pkey // self.size in self._allowed

    def to_json(self) -> dict[str, object]:
        return {"type": "range", "size": self.size, "ids": str(self.ids)}

    def to_sql(
        self,
        pkey_column: str | None,
        hash_column: str | None = None,
        *,
        paramstyle: Paramstyle = "format",
    ) -> tuple[str, list[object]]:
        column = _check_column(pkey_column, "pkey", "range")
        ph, _ = _placeholders(paramstyle)
        # pkey // size in [a, b]  <=>  a*size <= pkey <= (b+1)*size - 1: index-friendly.
        terms: list[str] = []
        params: list[object] = []
        for lo, hi in self.ids.ranges:
            terms.append(f"{column} BETWEEN {ph} AND {ph}")
            params.extend((lo * self.size, min((hi + 1) * self.size - 1, INT64_MAX)))
        return "(" + " OR ".join(terms) + ")", params


@dataclass(frozen=True)
class IntervalFilter(SourceFilter):
    """The explicit range form: passes if ``lo <= pkey < hi`` (``hi`` up to 2**63)."""

    lo: int
    hi: int
    type_name = "range"

    def __post_init__(self) -> None:
        lo = _as_int(self.lo, "lo")
        hi = _as_int(self.hi, "hi")
        if not INT64_MIN <= lo <= INT64_MAX:
            raise FilterError(f"field 'lo': {lo} is not an int64")
        if not INT64_MIN < hi <= INT64_MAX + 1:
            raise FilterError(f"field 'hi': {hi} is outside (-2**63, 2**63]")
        if lo >= hi:
            raise FilterError(f"fields 'lo', 'hi': lo ({lo}) must be less than hi ({hi})")

    def passes(self, pkey: int, key: bytes = b"") -> bool:
        return self.lo <= pkey < self.hi

    def to_json(self) -> dict[str, object]:
        return {"type": "range", "lo": self.lo, "hi": self.hi}

    def to_sql(
        self,
        pkey_column: str | None,
        hash_column: str | None = None,
        *,
        paramstyle: Paramstyle = "format",
    ) -> tuple[str, list[object]]:
        column = _check_column(pkey_column, "pkey", "range")
        ph, _ = _placeholders(paramstyle)
        terms: list[str] = []
        params: list[object] = []
        # Bounds every int64 satisfies are left out: 2**63 does not fit a BIGINT param.
        if self.lo > INT64_MIN:
            terms.append(f"{column} >= {ph}")
            params.append(self.lo)
        if self.hi <= INT64_MAX:
            terms.append(f"{column} < {ph}")
            params.append(self.hi)
        if not terms:
            return "(1 = 1)", []
        return "(" + " AND ".join(terms) + ")", params


def _check_buckets(n: object, buckets: object, n_field: str, buckets_field: str) -> None:
    count = _as_int(n, n_field)
    if not 1 <= count <= INT64_MAX:
        raise FilterError(f"field {n_field!r}: must be in [1, 2**63-1], got {count}")
    if not isinstance(buckets, BucketSet):
        raise FilterError(
            f"field {buckets_field!r}: expected a BucketSet, got {_type_name(buckets)}"
        )
    if buckets.max >= count:
        raise FilterError(
            f"field {buckets_field!r}: bucket id {buckets.max} is out of range [0, {count})"
        )


# --- parsing ---------------------------------------------------------------------------


def _object(value: object, what: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise FilterError(f"{what}: expected a JSON object, got {_type_name(value)}")
    return value


def _check_fields(
    obj: Mapping[str, object], allowed: Iterable[str], required: Iterable[str], where: str = ""
) -> None:
    prefix = f"{where}." if where else ""
    allowed_set = set(allowed)
    for name in obj:
        if name not in allowed_set:
            expected = ", ".join(sorted(allowed_set))
            raise FilterError(f"field {prefix + name!r}: unknown field (expected {expected})")
    for name in required:
        if name not in obj:
            raise FilterError(f"field {prefix + name!r}: missing")


def _parse_canonical(obj: Mapping[str, object]) -> SourceFilter:
    kind = obj.get("type")
    if kind is None:
        raise FilterError("field 'type': missing (one of 'mod', 'range', 'hash')")
    if kind in ("mod", "hash"):
        _check_fields(obj, ("type", "n", "buckets"), ("n", "buckets"))
        n = _as_int(obj["n"], "n")
        buckets = BucketSet.parse(obj["buckets"], "buckets")
        return ModFilter(n, buckets) if kind == "mod" else HashFilter(n, buckets)
    if kind == "range":
        if "size" in obj or "ids" in obj:
            if "lo" in obj or "hi" in obj:
                raise FilterError("fields 'size'/'ids' and 'lo'/'hi' exclude each other")
            _check_fields(obj, ("type", "size", "ids"), ("size", "ids"))
            return RangeFilter(_as_int(obj["size"], "size"), BucketSet.parse(obj["ids"], "ids"))
        _check_fields(obj, ("type", "lo", "hi"), ("lo", "hi"))
        return IntervalFilter(_as_int(obj["lo"], "lo"), _as_int(obj["hi"], "hi"))
    raise FilterError(
        f"field 'type': unknown filter type {_short(kind)} (one of 'mod', 'range', 'hash')"
    )


_DATABUS_TYPES = {"MOD": "mod", "RANGE": "range", "HASH": "hash"}


def _parse_databus(obj: Mapping[str, object]) -> SourceFilter | None:
    kind = obj.get("partitionType")
    if kind is None:
        raise FilterError("field 'partitionType': missing (one of 'MOD', 'RANGE', 'HASH', 'NONE')")
    if kind == "NONE":
        _check_fields(obj, ("partitionType",), ())
        return None
    sub_name = _DATABUS_TYPES.get(kind) if isinstance(kind, str) else None
    if sub_name is None:
        raise FilterError(
            f"field 'partitionType': unknown partition type {_short(kind)} "
            "(one of 'MOD', 'RANGE', 'HASH', 'NONE')"
        )
    _check_fields(obj, ("partitionType", sub_name), (sub_name,))
    sub = _object(obj[sub_name], f"field {sub_name!r}")
    if sub_name == "range":
        _check_fields(sub, ("size", "partitions"), ("size", "partitions"), "range")
        size = _as_int(sub["size"], "range.size")
        ids = BucketSet.parse(sub["partitions"], "range.partitions")
        with _renamed({"size": "range.size", "ids": "range.partitions"}):
            return RangeFilter(size, ids)
    _check_fields(sub, ("numBuckets", "buckets"), ("numBuckets", "buckets"), sub_name)
    n = _as_int(sub["numBuckets"], f"{sub_name}.numBuckets")
    buckets = BucketSet.parse(sub["buckets"], f"{sub_name}.buckets")
    with _renamed({"n": f"{sub_name}.numBuckets", "buckets": f"{sub_name}.buckets"}):
        return ModFilter(n, buckets) if sub_name == "mod" else HashFilter(n, buckets)


@contextmanager
def _renamed(names: Mapping[str, str]) -> Iterator[None]:
    """Report the Databus field names the user wrote in errors, not ours."""
    try:
        yield
    except FilterError as exc:
        message = exc.message
        for ours, theirs in names.items():
            message = message.replace(f"field {ours!r}", f"field {theirs!r}")
        raise FilterError(message) from None


@dataclass(frozen=True)
class FilterSpec:
    """The filters of a request: at most one ``SourceFilter`` per logical source name."""

    filters: Mapping[str, SourceFilter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, source_filter in self.filters.items():
            if not isinstance(name, str) or not name:
                raise FilterError(f"source name must be a non-empty string, got {name!r}")
            if not isinstance(source_filter, SourceFilter):
                raise FilterError(
                    f"filter for source {name!r}: expected a SourceFilter, "
                    f"got {_type_name(source_filter)}"
                )
        # A read-only copy: the spec is shared between requests and must not change.
        object.__setattr__(self, "filters", MappingProxyType(dict(sorted(self.filters.items()))))

    def __hash__(self) -> int:
        return hash(tuple(self.filters.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FilterSpec):
            return NotImplemented
        return dict(self.filters) == dict(other.filters)

    @classmethod
    def parse(cls, spec: str | bytes | Mapping[str, object] | FilterSpec | None) -> FilterSpec:
        """From JSON text or an already decoded object, canonical or Databus form.

        None, empty text and ``{}`` give the empty spec (everything passes).
        """
        if spec is None:
            return cls()
        if isinstance(spec, FilterSpec):
            return spec
        if isinstance(spec, str | bytes):
            # Consumers resend the same text on every poll; specs are immutable.
            return _parse_text(spec)
        return _parse_decoded(dict(spec))

    def to_json(self) -> dict[str, object]:
        """The canonical JSON object; ``parse(spec.to_json()) == spec``."""
        return {name: f.to_json() for name, f in self.filters.items()}

    def to_json_text(self) -> str:
        """``to_json`` as compact JSON text, for a ``filter=`` query parameter."""
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @property
    def is_empty(self) -> bool:
        """True if no source is filtered."""
        return not self.filters

    def for_source(self, name: str) -> SourceFilter | None:
        """The filter of source ``name``, or None if it passes everything."""
        return self.filters.get(name)

    def passes(self, source: str, pkey: int, key: bytes = b"") -> bool:
        """True if the event of ``source`` with ``pkey`` and ``key`` passes."""
        source_filter = self.filters.get(source)
        return source_filter is None or source_filter.passes(pkey, key)

    def to_sql(
        self,
        source: str,
        pkey_column: str | None,
        hash_column: str | None = None,
        *,
        paramstyle: Paramstyle = "format",
    ) -> tuple[str, list[object]]:
        """``SourceFilter.to_sql`` of ``source``'s filter; ``("(1 = 1)", [])`` if none."""
        source_filter = self.filters.get(source)
        if source_filter is None:
            return "(1 = 1)", []
        try:
            return source_filter.to_sql(pkey_column, hash_column, paramstyle=paramstyle)
        except FilterError as exc:
            raise FilterError(f"filter for source {source!r}: {exc.message}") from None


@lru_cache(maxsize=256)
def _parse_text(text: str | bytes) -> FilterSpec:
    if not text.strip():
        return FilterSpec()
    try:
        # Bounded: the text comes from clients (size, nesting and number length).
        decoded: object = loads_bounded(text, max_chars=_MAX_TEXT_CHARS)
    except ValueError as exc:
        raise FilterError(f"filter spec is not valid JSON: {exc}") from None
    return _parse_decoded(decoded)


def _parse_decoded(decoded: object) -> FilterSpec:
    top = _object(decoded, "filter spec")
    databus_form = "sources" in top
    if databus_form:
        if len(top) != 1:
            extra = sorted(k for k in top if k != "sources")
            raise FilterError(
                f"filter spec: 'sources' (the Databus form) cannot be mixed with {extra}"
            )
        top = _object(top["sources"], "filter spec field 'sources'")
    filters: dict[str, SourceFilter] = {}
    for name, value in top.items():
        if not name:
            raise FilterError("filter spec: source name must not be empty")
        try:
            obj = _object(value, "value")
            parsed = _parse_databus(obj) if databus_form else _parse_canonical(obj)
        except FilterError as exc:
            raise FilterError(f"filter for source {name!r}: {exc.message}") from None
        if parsed is not None:
            filters[name] = parsed
    return FilterSpec(filters)
