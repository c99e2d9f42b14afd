"""Server-side filters (DESIGN section 4): semantics, parsing, and SQL push-down on SQLite."""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from databus._hashing import stable_key_hash
from databus.errors import FilterError
from databus.filters import (
    INT64_MAX,
    INT64_MIN,
    BucketSet,
    FilterSpec,
    HashFilter,
    IntervalFilter,
    ModFilter,
    Paramstyle,
    RangeFilter,
    SourceFilter,
)

SRC = "shop.orders"
EXTREME_KEYS = [INT64_MIN, INT64_MIN + 1, -1000, -101, -100, -99, -1, 0, 1, 99, 100, INT64_MAX]


def one(filter_json: dict[str, object]) -> SourceFilter:
    found = FilterSpec.parse({SRC: filter_json}).for_source(SRC)
    assert found is not None
    return found


def key_bytes(pkey: int) -> bytes:
    return pkey.to_bytes(8, "big", signed=True)


# --- the Databus-compatible cases -------------------------------------------------------


def test_mod_buckets_of_100_pass_exactly_keys_with_those_remainders() -> None:
    spec = FilterSpec.parse(json.dumps({SRC: {"type": "mod", "n": 100, "buckets": "[0,3-4]"}}))
    passed = {k for k in range(1000) if spec.passes(SRC, k, key_bytes(k))}
    assert passed == {k for k in range(1000) if k % 100 in {0, 3, 4}}


def test_mod_uses_absolute_value_for_negative_keys() -> None:
    f = one({"type": "mod", "n": 100, "buckets": "[3]"})
    assert f.passes(-3) and f.passes(-103) and f.passes(3)
    assert not f.passes(-97)
    # Python's abs is exact: -2**63 lands in bucket 2**63 % n (Java's Math.abs would not).
    g = one({"type": "mod", "n": 10, "buckets": [(1 << 63) % 10]})
    assert g.passes(INT64_MIN)


def test_range_size_100_ids_3_4_pass_exactly_300_to_499() -> None:
    spec = FilterSpec.parse({SRC: {"type": "range", "size": 100, "ids": "[3-4]"}})
    passed = {k for k in range(-1000, 2000) if spec.passes(SRC, k, b"")}
    assert passed == set(range(300, 500))


def test_range_ids_form_never_passes_negative_keys() -> None:
    f = one({"type": "range", "size": 100, "ids": "[0-9]"})
    assert not any(f.passes(k) for k in (-1, -100, -999, INT64_MIN))
    assert f.passes(0) and f.passes(999) and not f.passes(1000)


def test_interval_form_is_half_open() -> None:
    f = one({"type": "range", "lo": -5, "hi": 5})
    assert {k for k in range(-20, 20) if f.passes(k)} == set(range(-5, 5))
    top = one({"type": "range", "lo": 0, "hi": 1 << 63})
    assert top.passes(INT64_MAX) and not top.passes(-1)


def test_hash_filter_buckets_by_stable_hash_of_key_bytes() -> None:
    f = one({"type": "hash", "n": 8, "buckets": "[2,5]"})
    for i in range(500):
        key = f"user-{i}".encode()
        # pkey is irrelevant for hash filters.
        assert f.passes(12345, key) == (stable_key_hash(key) % 8 in {2, 5})


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 100])
def test_n_mod_consumers_together_see_every_key_exactly_once(n: int) -> None:
    consumers = [FilterSpec.parse({SRC: {"type": "mod", "n": n, "buckets": [i]}}) for i in range(n)]
    keys = [*range(-600, 600), *EXTREME_KEYS]
    seen = Counter(k for c in consumers for k in keys if c.passes(SRC, k, key_bytes(k)))
    assert seen == Counter(keys)


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_n_hash_consumers_together_see_every_key_exactly_once(n: int) -> None:
    consumers = [
        FilterSpec.parse({SRC: {"type": "hash", "n": n, "buckets": [i]}}) for i in range(n)
    ]
    keys = [f"k{i}".encode() for i in range(2000)] + [b""]
    seen = Counter(k for c in consumers for k in keys if c.passes(SRC, 0, k))
    assert seen == Counter(keys)


@given(
    n=st.integers(1, 64),
    keys=st.lists(st.integers(INT64_MIN, INT64_MAX), max_size=50),
    raw=st.lists(st.binary(max_size=16), max_size=50),
)
def test_partitioning_is_exact_for_any_keys(n: int, keys: list[int], raw: list[bytes]) -> None:
    mods = [ModFilter(n, BucketSet.of([i])) for i in range(n)]
    hashes = [HashFilter(n, BucketSet.of([i])) for i in range(n)]
    for k in keys:
        assert sum(f.passes(k) for f in mods) == 1
    for b in raw:
        assert sum(f.passes(0, b) for f in hashes) == 1


def test_unfiltered_sources_pass_everything() -> None:
    spec = FilterSpec.parse({SRC: {"type": "mod", "n": 2, "buckets": "[0]"}})
    assert spec.passes("shop.items", 1, b"x")
    assert spec.for_source("shop.items") is None
    assert not spec.passes(SRC, 1, b"")
    empty = FilterSpec.parse(None)
    assert empty.is_empty and not spec.is_empty
    assert FilterSpec.parse("") == FilterSpec.parse("{}") == FilterSpec.parse(b" ") == empty
    assert empty.passes(SRC, 123, b"")


# --- parsing ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "buckets",
    ["[0,3-4]", "0,3-4", " [ 0 , 3 - 4 ] ", "[4,3,0,3-4]", [0, "3-4"], [0, [3, 4]], [4, 0, "3"]],
)
def test_bucket_forms_are_equivalent(buckets: object) -> None:
    parsed = BucketSet.parse(buckets)
    assert parsed == BucketSet(((0, 0), (3, 4)))
    assert str(parsed) == "[0,3-4]"
    assert list(parsed) == [0, 3, 4]
    assert parsed.count == 3 and parsed.max == 4


def test_bucket_set_merges_overlapping_and_adjacent_ranges() -> None:
    assert BucketSet.of([(5, 9), 1, (2, 3), 4, (7, 12)]).ranges == ((1, 12),)
    assert str(BucketSet.parse("[1-2,4-5,3]")) == "[1-5]"


def test_large_bucket_sets_use_range_lookup() -> None:
    f = ModFilter(10**9, BucketSet.of([(0, 10**6), (5 * 10**8, 6 * 10**8)]))
    assert f.passes(10**6) and not f.passes(10**6 + 1)
    assert f.passes(-(5 * 10**8)) and f.passes(10**9 + 6 * 10**8)
    assert not f.passes(10**9 - 1)


def test_databus_form_matches_canonical_form() -> None:
    databus = {
        "sources": {
            "shop.orders": {
                "partitionType": "MOD",
                "mod": {"numBuckets": 100, "buckets": "[0,3-4]"},
            },
            "x.y": {"partitionType": "RANGE", "range": {"size": 100, "partitions": "[3-4]"}},
            "x.h": {"partitionType": "HASH", "hash": {"numBuckets": 4, "buckets": [1]}},
            "x.none": {"partitionType": "NONE"},
        }
    }
    canonical = {
        "shop.orders": {"type": "mod", "n": 100, "buckets": "[0,3-4]"},
        "x.y": {"type": "range", "size": 100, "ids": "[3-4]"},
        "x.h": {"type": "hash", "n": 4, "buckets": "[1]"},
    }
    spec = FilterSpec.parse(json.dumps(databus))
    assert spec == FilterSpec.parse(canonical)
    assert spec.to_json() == canonical
    assert spec.for_source("x.none") is None


def test_constructed_filters_round_trip() -> None:
    spec = FilterSpec(
        {
            "a.b": ModFilter(10, BucketSet.of([1, (4, 6)])),
            "a.c": RangeFilter(1000, BucketSet.of([0, 2])),
            "a.d": IntervalFilter(-10, 10),
            "a.e": HashFilter(3, BucketSet.of([2])),
        }
    )
    text = spec.to_json_text()
    assert FilterSpec.parse(text) == spec
    assert hash(FilterSpec.parse(text)) == hash(spec)
    assert json.loads(text)["a.b"] == {"type": "mod", "n": 10, "buckets": "[1,4-6]"}


def test_filter_spec_is_immutable() -> None:
    spec = FilterSpec.parse({SRC: {"type": "mod", "n": 2, "buckets": "[0]"}})
    with pytest.raises(TypeError):
        spec.filters["x.y"] = IntervalFilter(0, 1)  # type: ignore[index]


@st.composite
def bucket_sets(draw: st.DrawFn, limit: int) -> BucketSet:
    items = draw(
        st.lists(
            st.one_of(
                st.integers(0, limit - 1),
                st.tuples(st.integers(0, limit - 1), st.integers(0, 50)).map(
                    lambda t: (t[0], min(t[0] + t[1], limit - 1))
                ),
            ),
            min_size=1,
            max_size=8,
        )
    )
    return BucketSet.of(items)


@st.composite
def source_filters(draw: st.DrawFn) -> SourceFilter:
    kind = draw(st.sampled_from(["mod", "hash", "range", "interval"]))
    if kind in ("mod", "hash"):
        n = draw(st.one_of(st.integers(1, 200), st.integers(1, INT64_MAX)))
        buckets = draw(bucket_sets(min(n, 1 << 40)))
        return ModFilter(n, buckets) if kind == "mod" else HashFilter(n, buckets)
    if kind == "range":
        size = draw(st.one_of(st.integers(1, 1000), st.integers(1, INT64_MAX)))
        ids = draw(bucket_sets(INT64_MAX // size + 1))
        return RangeFilter(size, ids)
    lo = draw(st.integers(INT64_MIN, INT64_MAX))
    hi = draw(st.integers(lo + 1, INT64_MAX + 1))
    return IntervalFilter(lo, hi)


names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).filter(
    lambda s: s != "sources"
)


@given(st.dictionaries(names, source_filters(), max_size=5))
def test_specs_round_trip_through_json(filters: dict[str, SourceFilter]) -> None:
    spec = FilterSpec(filters)
    again = FilterSpec.parse(json.dumps(spec.to_json()))
    assert again == spec
    assert again.to_json() == spec.to_json()
    assert FilterSpec.parse(spec.to_json()) == spec


INVALID: list[tuple[object, str]] = [
    ({SRC: {"type": "mod", "n": 0, "buckets": "[0]"}}, "'n'"),
    ({SRC: {"type": "mod", "n": -3, "buckets": "[0]"}}, "'n'"),
    ({SRC: {"type": "mod", "n": 1 << 63, "buckets": "[0]"}}, "'n'"),
    ({SRC: {"type": "mod", "n": 100, "buckets": "[0,100]"}}, "out of range"),
    ({SRC: {"type": "hash", "n": 4, "buckets": "[2-4]"}}, "out of range"),
    ({SRC: {"type": "mod", "n": 100, "buckets": "[4-3]"}}, "reversed"),
    ({SRC: {"type": "mod", "n": 100, "buckets": "[0,,1]"}}, "malformed"),
    ({SRC: {"type": "mod", "n": 100, "buckets": "[0,1"}}, "brackets"),
    ({SRC: {"type": "mod", "n": 100, "buckets": "[-1]"}}, "malformed"),
    ({SRC: {"type": "mod", "n": 100, "buckets": "[a]"}}, "malformed"),
    ({SRC: {"type": "mod", "n": 100, "buckets": "[]"}}, "no ids"),
    ({SRC: {"type": "mod", "n": 100, "buckets": []}}, "no ids"),
    ({SRC: {"type": "mod", "n": 100, "buckets": [-1]}}, "negative"),
    ({SRC: {"type": "mod", "n": 100, "buckets": [[4, 3]]}}, "invalid range"),
    ({SRC: {"type": "mod", "n": 100, "buckets": [[1, 2, 3]]}}, "list items"),
    ({SRC: {"type": "mod", "n": 100, "buckets": [True]}}, "bool"),
    ({SRC: {"type": "mod", "n": 100, "buckets": 3}}, "'buckets': expected a range string"),
    ({SRC: {"type": "mod", "n": "100", "buckets": "[0]"}}, "'n': expected an integer, got str"),
    ({SRC: {"type": "mod", "n": 100.0, "buckets": "[0]"}}, "'n': expected an integer, got float"),
    ({SRC: {"type": "mod", "n": True, "buckets": "[0]"}}, "'n': expected an integer, got bool"),
    ({SRC: {"type": "mod", "buckets": "[0]"}}, "'n': missing"),
    ({SRC: {"type": "mod", "n": 10, "buckets": "[0]", "bucket": 1}}, "'bucket': unknown field"),
    ({SRC: {"type": "range", "lo": 5, "hi": 5}}, "lo (5) must be less than hi (5)"),
    ({SRC: {"type": "range", "lo": 6, "hi": 5}}, "must be less than"),
    ({SRC: {"type": "range", "lo": 0, "hi": (1 << 63) + 1}}, "'hi'"),
    ({SRC: {"type": "range", "lo": INT64_MIN - 1, "hi": 0}}, "'lo'"),
    ({SRC: {"type": "range", "lo": 0}}, "'hi': missing"),
    ({SRC: {"type": "range", "size": 0, "ids": "[0]"}}, "'size'"),
    ({SRC: {"type": "range", "size": 10, "ids": "[0]", "lo": 0}}, "exclude each other"),
    ({SRC: {"type": "range", "size": 1 << 62, "ids": "[2]"}}, "beyond the int64"),
    ({SRC: {"type": "range"}}, "'lo': missing"),
    ({SRC: {"type": "bogus"}}, "unknown filter type 'bogus'"),
    ({SRC: {"type": "MOD", "n": 1, "buckets": "[0]"}}, "unknown filter type 'MOD'"),
    ({SRC: {"n": 1}}, "'type': missing"),
    ({SRC: [1, 2]}, "expected a JSON object, got array"),
    ([1], "filter spec: expected a JSON object, got array"),
    ("{not json", "not valid JSON"),
    ({"": {"type": "mod", "n": 1, "buckets": "[0]"}}, "must not be empty"),
    ({"sources": {SRC: {"partitionType": "FOO"}}}, "unknown partition type 'FOO'"),
    ({"sources": {SRC: {"partitionType": "MOD"}}}, "'mod': missing"),
    (
        {"sources": {SRC: {"partitionType": "MOD", "mod": {"numBuckets": 0, "buckets": "[0]"}}}},
        "'mod.numBuckets'",
    ),
    (
        {"sources": {SRC: {"partitionType": "MOD", "mod": {"numBuckets": 2, "buckets": "[2]"}}}},
        "'mod.buckets': bucket id 2 is out of range [0, 2)",
    ),
    (
        {"sources": {SRC: {"partitionType": "MOD", "mod": {"numBuckets": 2, "bucket": "[1]"}}}},
        "'mod.bucket': unknown field",
    ),
    (
        {"sources": {SRC: {"partitionType": "RANGE", "range": {"size": 0, "partitions": "[1]"}}}},
        "'range.size'",
    ),
    (
        {
            "sources": {
                SRC: {
                    "partitionType": "MOD",
                    "mod": {"numBuckets": 2, "buckets": "[1]"},
                    "range": {"size": 1, "partitions": "[1]"},
                }
            }
        },
        "'range': unknown field",
    ),
    ({"sources": {SRC: {"partitionType": "NONE", "mod": {}}}}, "'mod': unknown field"),
    ({"sources": {}, SRC: {}}, "cannot be mixed"),
    ({"sources": [1]}, "expected a JSON object"),
    # Issue 12: nesting, numbers past the int digit limit, in every spelling.
    ("[" * 1500, "nested deeper than"),
    ('{"a":' * 1000 + "1" + "}" * 1000, "nested deeper than"),
    ({SRC: {"type": "mod", "n": 3, "buckets": "[" + "9" * 5000 + "]"}}, "beyond the int64"),
    ({SRC: {"type": "mod", "n": 3, "buckets": "[0-" + "9" * 5000 + "]"}}, "beyond the int64"),
    ({SRC: {"type": "mod", "n": 3, "buckets": ["9" * 5000]}}, "beyond the int64"),
    ({SRC: {"type": "range", "size": 1, "ids": "[" + "9" * 20 + "]"}}, "beyond the int64"),
    ('{"x": {"type": "mod", "n": 3, "buckets": [' + "9" * 5000 + "]}}", "5000 digits"),
    ('{"x": {"type": "mod", "n": ' + "9" * 5000 + ', "buckets": [0]}}', "5000 digits"),
    ('{"x": {"type": "mod", "n": NaN, "buckets": [0]}}', "NaN is not JSON"),
    ('{"x": 1, "x": 2}', "duplicate key"),
]


@pytest.mark.parametrize(("spec", "message"), INVALID)
def test_invalid_specs_raise_filter_error(spec: object, message: str) -> None:
    text = spec if isinstance(spec, str) else json.dumps(spec)
    with pytest.raises(FilterError) as info:
        FilterSpec.parse(text)
    assert message in info.value.message
    if isinstance(spec, dict) and SRC in json.dumps(spec):
        assert repr(SRC) in info.value.message, "the error must name the source"
    assert info.value.code == "bad_request" and not info.value.retriable


def test_invalid_direct_construction_raises_filter_error() -> None:
    with pytest.raises(FilterError):
        ModFilter(0, BucketSet.of([0]))
    with pytest.raises(FilterError):
        ModFilter(3, "[0]")  # type: ignore[arg-type]
    with pytest.raises(FilterError):
        BucketSet(((3, 4), (0, 1)))
    with pytest.raises(FilterError):
        BucketSet(())
    with pytest.raises(FilterError):
        FilterSpec({"a.b": "mod"})  # type: ignore[dict-item]


# --- SQL push-down, checked against SQLite ---------------------------------------------


def format_to_qmark(sql: str) -> str:
    """What psycopg2/pymysql do to a "format" query, spelled for sqlite3."""
    return re.sub(r"%([s%])", lambda m: "?" if m.group(1) == "s" else "%", sql)


@pytest.fixture(scope="module")
def db() -> Iterable[sqlite3.Connection]:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE ev (pkey INTEGER NOT NULL, khash INTEGER NOT NULL, k BLOB)")
    yield conn
    conn.close()


def sql_passes(
    conn: sqlite3.Connection,
    f: SourceFilter,
    keys: list[int],
    paramstyle: Paramstyle,
) -> Counter[int]:
    conn.execute("DELETE FROM ev")
    conn.executemany(
        "INSERT INTO ev VALUES (?, ?, ?)",
        [(k, stable_key_hash(key_bytes(k)), key_bytes(k)) for k in keys],
    )
    where, params = f.to_sql("pkey", "khash", paramstyle=paramstyle)
    if paramstyle == "format":
        where = format_to_qmark(where)
    assert where.count("?") == len(params)
    rows = conn.execute(f"SELECT pkey FROM ev WHERE {where}", params).fetchall()
    return Counter(r[0] for r in rows)


def py_passes(f: SourceFilter, keys: list[int]) -> Counter[int]:
    return Counter(k for k in keys if f.passes(k, key_bytes(k)))


SQL_CASES = [
    {"type": "mod", "n": 100, "buckets": "[0,3-4]"},
    {"type": "mod", "n": 7, "buckets": "[0-6]"},
    {"type": "mod", "n": 10, "buckets": [(1 << 63) % 10, 1]},
    {"type": "mod", "n": INT64_MAX, "buckets": "[0,1]"},
    {"type": "hash", "n": 5, "buckets": "[1,3-4]"},
    {"type": "range", "size": 100, "ids": "[3-4]"},
    {"type": "range", "size": 100, "ids": "[0,2,5-7]"},
    {"type": "range", "size": 1 << 62, "ids": "[1]"},
    {"type": "range", "size": 3, "ids": [[0, INT64_MAX // 3]]},
    {"type": "range", "lo": -100, "hi": 100},
    {"type": "range", "lo": INT64_MIN, "hi": 0},
    {"type": "range", "lo": 0, "hi": 1 << 63},
    {"type": "range", "lo": INT64_MIN, "hi": 1 << 63},
]
SQL_KEYS = [*range(-1200, 1200, 7), *range(-5, 6), *EXTREME_KEYS, (1 << 62) + 5, 2 * (1 << 62) - 1]


@pytest.mark.parametrize("paramstyle", ["format", "qmark"])
@pytest.mark.parametrize("case", SQL_CASES, ids=lambda c: json.dumps(c))
def test_sql_push_down_matches_passes(
    db: sqlite3.Connection, case: dict[str, object], paramstyle: Paramstyle
) -> None:
    f = one(case)
    assert sql_passes(db, f, SQL_KEYS, paramstyle) == py_passes(f, SQL_KEYS)


@settings(max_examples=150, deadline=None)
@given(
    f=source_filters(),
    keys=st.lists(
        st.one_of(st.integers(INT64_MIN, INT64_MAX), st.integers(-3000, 3000)),
        min_size=1,
        max_size=40,
    ),
    paramstyle=st.sampled_from(["format", "qmark"]),
)
def test_sql_push_down_matches_passes_for_any_filter(
    db: sqlite3.Connection, f: SourceFilter, keys: list[int], paramstyle: Paramstyle
) -> None:
    # Keys near the filter's own boundaries are where off-by-ones live.
    if isinstance(f, IntervalFilter):
        keys += [k for k in (f.lo - 1, f.lo, f.hi - 1, f.hi) if INT64_MIN <= k <= INT64_MAX]
    if isinstance(f, RangeFilter):
        for lo, hi in f.ids.ranges:
            edges = (lo * f.size - 1, lo * f.size, (hi + 1) * f.size - 1, (hi + 1) * f.size)
            keys += [k for k in edges if INT64_MIN <= k <= INT64_MAX]
    assert sql_passes(db, f, keys, paramstyle) == py_passes(f, keys)


def test_sql_fragment_shapes() -> None:
    mod = one({"type": "mod", "n": 100, "buckets": "[0,3-4]"})
    assert mod.to_sql("pkey", None) == (
        "(abs(pkey %% %s) IN (%s) OR abs(pkey %% %s) BETWEEN %s AND %s)",
        [100, 0, 100, 3, 4],
    )
    assert mod.to_sql("t.pkey", None, paramstyle="qmark")[0].startswith("(abs(t.pkey % ?) IN")
    rng = one({"type": "range", "size": 100, "ids": "[3-4]"})
    assert rng.to_sql("pkey", None) == ("(pkey BETWEEN %s AND %s)", [300, 499])
    assert one({"type": "range", "lo": 1, "hi": 9}).to_sql('"Key"', None) == (
        '("Key" >= %s AND "Key" < %s)',
        [1, 9],
    )
    assert IntervalFilter(INT64_MIN, 1 << 63).to_sql("pkey") == ("(1 = 1)", [])


def test_sql_push_down_never_falls_back_to_a_full_scan() -> None:
    spec = FilterSpec.parse(
        {
            "a.h": {"type": "hash", "n": 4, "buckets": "[0]"},
            "a.m": {"type": "mod", "n": 4, "buckets": "[0]"},
        }
    )
    with pytest.raises(FilterError, match="cannot be pushed down") as info:
        spec.to_sql("a.h", "pkey", None)
    assert "'a.h'" in info.value.message
    with pytest.raises(FilterError, match="cannot be pushed down"):
        spec.to_sql("a.m", None, "khash")
    assert spec.to_sql("a.m", "pkey", None, paramstyle="qmark")[1] == [4, 0]
    assert spec.to_sql("a.other", None, None) == ("(1 = 1)", [])


@pytest.mark.parametrize("column", ["pkey; DROP TABLE ev", "", "a b", "1abc", 'x"y"z', "a.b.c"])
def test_sql_push_down_rejects_unsafe_column_names(column: str) -> None:
    with pytest.raises(FilterError, match="invalid SQL column name"):
        ModFilter(4, BucketSet.of([0])).to_sql(column, None)


def test_unknown_paramstyle_is_rejected() -> None:
    with pytest.raises(FilterError, match="paramstyle"):
        ModFilter(4, BucketSet.of([0])).to_sql("pkey", None, paramstyle="named")  # type: ignore[arg-type]
