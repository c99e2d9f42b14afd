"""The per-source filters (mod, hash, range, interval): ``passes`` for the relay, ``to_sql``
for the bootstrap service. Both must agree on every key."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Container
from dataclasses import dataclass, field
from typing import ClassVar

from databus._hashing import stable_key_hash
from databus.errors import FilterError
from databus.filters._buckets import (
    INT64_MAX,
    INT64_MIN,
    BucketSet,
    Paramstyle,
    _as_int,
    _type_name,
)

# Plain or qualified identifiers, or a double-quoted one: column names go into SQL text.
_COLUMN_RE = re.compile(
    r'(?:[A-Za-z_][A-Za-z0-9_$]*|"[^"]+")(?:\.(?:[A-Za-z_][A-Za-z0-9_$]*|"[^"]+"))?'
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


