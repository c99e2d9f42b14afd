"""``FilterSpec``: a filter per source, parsed from the canonical JSON or the Databus form,
and written back in the canonical one."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

from databus._json import loads_bounded
from databus.errors import FilterError
from databus.filters._buckets import (
    BucketSet,
    Paramstyle,
    _as_int,
    _short,
    _type_name,
)
from databus.filters._source_filters import (
    HashFilter,
    IntervalFilter,
    ModFilter,
    RangeFilter,
    SourceFilter,
)

# A spec with a few thousand single bucket ids is still well under this.
_MAX_TEXT_CHARS = 256 * 1024


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

