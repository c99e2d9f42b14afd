"""Consumer groups, the pure part (databus.client.group._assignment): the assignment is
balanced, covering, deterministic and sticky (it moves the fewest partitions any
balanced assignment allows), and a member's filter makes the relay's read rules serve
exactly the events of its partitions.
"""

from __future__ import annotations

import itertools
import os
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from databus import batch
from databus._hashing import stable_key_hash
from databus.batch import FilterPlan, ReadState
from databus.client import assign as exported_assign
from databus.client import partition_of as exported_partition_of
from databus.client.group._assignment import (
    MAX_PARTITIONS,
    assign,
    member_filter,
    partition_of,
)
from databus.errors import ConfigError
from databus.event import (
    HEADER_SIZE,
    Key,
    KeyKind,
    Op,
    WindowChecksum,
    encode_eow,
    encode_event,
    iter_events,
)
from databus.filters import BucketSet, FilterSpec, HashFilter, ModFilter

pytestmark = pytest.mark.twin("databus.batch")

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# -- helpers ------------------------------------------------------------------------


def _check_balanced(result: Mapping[str, tuple[int, ...]], members: Sequence[str],
                    partitions: int) -> None:
    assert list(result) == sorted(members)
    sizes = [len(p) for p in result.values()]
    assert max(sizes) - min(sizes) <= 1
    owners = Counter(p for parts in result.values() for p in parts)
    assert sorted(owners) == list(range(partitions))
    assert set(owners.values()) == {1}
    for parts in result.values():
        assert list(parts) == sorted(parts)


def _moves(previous: Mapping[str, Sequence[int]], result: Mapping[str, Sequence[int]]) -> int:
    """Partitions owned before whose owner changed (unowned ones handed out do not count)."""
    new_owner = {p: m for m, parts in result.items() for p in parts}
    return sum(1 for m, parts in previous.items() for p in parts if new_owner[p] != m)


def _least_moves(previous: Mapping[str, Sequence[int]], members: Sequence[str],
                 partitions: int) -> int:
    """The exact minimum of ``_moves`` over every balanced assignment.

    A balanced assignment gives q = P // M to every member and one more to r = P % M of
    them. Member i can keep at most min(c_i, its share) of its c_i partitions; departed
    members keep none. The most that stays is sum(min(c_i, q)) plus one for each of the r
    larger shares given to a member with c_i > q: min(r, #{c_i > q}). Every partition
    owned before that does not stay moves."""
    q, r = divmod(partitions, len(members))
    counts = [len(previous.get(m, ())) for m in members]
    stay = sum(min(c, q) for c in counts) + min(r, sum(1 for c in counts if c > q))
    return sum(len(parts) for parts in previous.values()) - stay


def _brute_force_least_moves(previous: Mapping[str, Sequence[int]], members: Sequence[str],
                             partitions: int) -> int:
    """The same minimum by trying every owner for every partition (tiny cases only)."""
    best = None
    for owners in itertools.product(members, repeat=partitions):
        sizes = Counter(owners)
        sizes_all = [sizes.get(m, 0) for m in members]
        if max(sizes_all) - min(sizes_all) > 1:
            continue
        result = {m: [p for p, o in enumerate(owners) if o == m] for m in members}
        moves = _moves(previous, result)
        best = moves if best is None else min(best, moves)
    assert best is not None
    return best


_names = st.text(alphabet="abcdefghij", min_size=1, max_size=3)


@st.composite
def _previous(draw: st.DrawFn, partitions: int) -> dict[str, list[int]]:
    """Any valid previous assignment: partitions spread over members old and new, some
    left unowned, unbalanced on purpose."""
    names = draw(st.lists(_names, min_size=0, max_size=6, unique=True))
    out: dict[str, list[int]] = {n: [] for n in names}
    if not names:
        return out
    for p in range(partitions):
        owner = draw(st.one_of(st.none(), st.sampled_from(names)))
        if owner is not None:
            out[owner].append(p)
    return out


# -- examples -----------------------------------------------------------------------


def test_four_members_sixty_four_partitions_sixteen_each() -> None:
    result = assign(["d", "b", "a", "c"], 64)
    assert result == {
        "a": tuple(range(0, 16)),
        "b": tuple(range(16, 32)),
        "c": tuple(range(32, 48)),
        "d": tuple(range(48, 64)),
    }
    assert exported_assign is assign and exported_partition_of is partition_of


def test_a_member_leaves_its_sixteen_spread_six_five_five_and_nothing_else_moves() -> None:
    before = assign(["a", "b", "c", "d"], 64)
    after = assign(["a", "c", "d"], 64, before)
    _check_balanced(after, ["a", "c", "d"], 64)
    gained = {m: sorted(set(after[m]) - set(before[m])) for m in after}
    assert sorted(len(g) for g in gained.values()) == [5, 5, 6]
    assert len(gained["a"]) == 6  # the larger share: the first name among equals
    for m in after:
        assert set(before[m]) <= set(after[m])  # nothing of theirs moved
    assert sorted(p for g in gained.values() for p in g) == list(before["b"])
    assert _moves(before, after) == 16 == _least_moves(before, ["a", "c", "d"], 64)


def test_a_member_joins_and_takes_only_what_the_others_have_in_excess() -> None:
    before = assign(["a", "b", "c"], 64)
    assert [len(p) for p in before.values()] == [22, 21, 21]
    after = assign(["a", "b", "c", "e"], 64, before)
    _check_balanced(after, ["a", "b", "c", "e"], 64)
    assert _moves(before, after) == 16
    for m in ("a", "b", "c"):
        assert set(after[m]) <= set(before[m])


def test_the_larger_shares_go_to_those_who_hold_more_so_nothing_moves() -> None:
    # b holds 6, a 5, c 5: giving the 16th partition's share to "a" by name would move one.
    previous = {"a": list(range(0, 5)), "b": list(range(5, 11)), "c": list(range(11, 16))}
    assert assign(["a", "b", "c"], 16, previous) == {m: tuple(p) for m, p in previous.items()}


def test_more_members_than_partitions_some_get_nothing() -> None:
    result = assign(["m1", "m2", "m3", "m4", "m5"], 3)
    _check_balanced(result, ["m1", "m2", "m3", "m4", "m5"], 3)
    assert result == {"m1": (0,), "m2": (1,), "m3": (2,), "m4": (), "m5": ()}


def test_partitions_nobody_owned_are_handed_out_and_do_not_count_as_moves() -> None:
    before = assign(["a", "b"], 8)  # a: 0-3, b: 4-7; the count grows to 12
    after = assign(["a", "b"], 12, before)
    assert after == {"a": (0, 1, 2, 3, 8, 9), "b": (4, 5, 6, 7, 10, 11)}
    assert _moves(before, after) == 0


@pytest.mark.parametrize(("members", "partitions", "previous", "message"), [
    ([], 4, None, "at least one member"),
    ("ab", 4, None, "not one string"),
    (["a", "a"], 4, None, "listed twice"),
    (["a", ""], 4, None, "non-empty strings"),
    (["a", 3], 4, None, "non-empty strings"),
    (["a"], 0, None, "partitions must be in"),
    (["a"], -3, None, "partitions must be in"),
    (["a"], MAX_PARTITIONS + 1, None, "partitions must be in"),
    (["a"], True, None, "must be an integer"),
    (["a"], 4.0, None, "must be an integer"),
    (["a"], 4, {"a": [4]}, "out of range [0, 4)"),
    (["a"], 4, {"a": [-1]}, "out of range"),
    (["a"], 4, {"a": [1], "b": [1]}, "partition 1 is named twice ('a' and 'b')"),
    (["a"], 4, {"a": [2, 2]}, "named twice by 'a'"),
    (["a"], 4, {"a": ["1"]}, "is not an integer"),
    (["a"], 4, {"a": [True]}, "is not an integer"),
    (["a"], 4, {"a": "01"}, "expected a sequence"),
    (["a"], 4, {"": [0]}, "non-empty strings"),
])
def test_bad_inputs_are_config_errors(members: object, partitions: object, previous: object,
                                      message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        assign(members, partitions, previous)  # type: ignore[arg-type]
    assert message in str(excinfo.value)


# -- properties of the assignment -----------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(members=st.lists(_names, min_size=1, max_size=12, unique=True),
       partitions=st.integers(1, 200), data=st.data())
def test_balanced_covering_and_sticky_against_any_previous(
        members: list[str], partitions: int, data: st.DataObject) -> None:
    previous = data.draw(_previous(partitions))
    result = assign(members, partitions, previous)
    _check_balanced(result, members, partitions)
    assert _moves(previous, result) == _least_moves(previous, members, partitions)
    q = partitions // len(members)
    for m in members:
        had = set(previous.get(m, ()))
        now = set(result[m])
        # A member keeps min(what it had, its share): only the excess leaves it.
        assert len(had & now) == min(len(had), len(now))
        if len(had) > len(now):
            assert len(now) >= q
        if had and len(had) <= len(now):
            assert had <= now


@settings(max_examples=150, deadline=None)
@given(members=st.lists(_names, min_size=1, max_size=3, unique=True),
       partitions=st.integers(1, 6), data=st.data())
def test_least_moves_formula_agrees_with_brute_force(
        members: list[str], partitions: int, data: st.DataObject) -> None:
    previous = data.draw(_previous(partitions))
    least = _brute_force_least_moves(previous, members, partitions)
    assert _least_moves(previous, members, partitions) == least
    assert _moves(previous, assign(members, partitions, previous)) == least


@settings(max_examples=200, deadline=None)
@given(members=st.lists(_names, min_size=1, max_size=10, unique=True),
       partitions=st.integers(1, 100), seed=st.integers(0, 2**32), data=st.data())
def test_deterministic_whatever_the_order_of_members_and_previous(
        members: list[str], partitions: int, seed: int, data: st.DataObject) -> None:
    previous = data.draw(_previous(partitions))
    rng = random.Random(seed)
    shuffled_members = rng.sample(members, len(members))
    items = list(previous.items())
    rng.shuffle(items)
    shuffled_previous = {m: tuple(rng.sample(parts, len(parts))) for m, parts in items}
    first = assign(members, partitions, previous)
    again = assign(shuffled_members, partitions, shuffled_previous)
    assert first == again
    assert list(first) == list(again)  # same key order too
    assert repr(first) == repr(assign(tuple(members), partitions, previous))


@settings(max_examples=200, deadline=None)
@given(members=st.lists(_names, min_size=1, max_size=10, unique=True),
       partitions=st.integers(1, 100), data=st.data())
def test_idempotent_a_balanced_assignment_is_a_fixed_point(
        members: list[str], partitions: int, data: st.DataObject) -> None:
    fresh = assign(members, partitions)
    assert assign(members, partitions, fresh) == fresh
    # Any balanced, complete assignment of the same members stays as it is.
    reached = assign(members, partitions, data.draw(_previous(partitions)))
    assert assign(members, partitions, reached) == reached


@settings(max_examples=100, deadline=None)
@given(partitions=st.integers(1, 128), initial=st.integers(1, 6),
       steps=st.lists(st.tuples(st.sampled_from(["join", "leave", "both"]),
                                st.integers(0, 1000)), min_size=1, max_size=25))
def test_joins_and_leaves_in_sequence_move_the_fewest_partitions(
        partitions: int, initial: int, steps: list[tuple[str, int]]) -> None:
    members = [f"m{i}" for i in range(initial)]
    current = assign(members, partitions)
    _check_balanced(current, members, partitions)
    fresh = initial
    for action, pick in steps:
        new_members = list(members)
        if action in ("leave", "both") and len(new_members) > 1:
            new_members.pop(pick % len(new_members))
        if action in ("join", "both"):
            new_members.append(f"m{fresh}")
            fresh += 1
        nxt = assign(new_members, partitions, current)
        _check_balanced(nxt, new_members, partitions)
        assert _moves(current, nxt) == _least_moves(current, new_members, partitions)
        departed = sum(len(current[m]) for m in members if m not in new_members)
        # A pure leave moves exactly the leaver's partitions; a pure join moves exactly
        # the newcomer's share (it takes nothing nobody else had in excess).
        if action == "leave" and len(new_members) < len(members):
            assert _moves(current, nxt) == departed
        if action == "join":
            assert _moves(current, nxt) == len(nxt[new_members[-1]])
        members, current = new_members, nxt


# -- partitions and filters -----------------------------------------------------------


def test_partition_of_is_the_mod_filter_bucket() -> None:
    assert partition_of(10, 4) == 2
    assert partition_of(-10, 4) == 2  # abs, as the mod filter
    assert partition_of(INT64_MIN, 10) == (1 << 63) % 10  # the mathematical abs
    assert partition_of(INT64_MAX, 1) == 0
    with pytest.raises(ConfigError):
        partition_of(5, 0)
    with pytest.raises(ConfigError):
        partition_of("5", 4)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(pkey=st.integers(INT64_MIN, INT64_MAX), partitions=st.integers(1, 1000))
def test_partition_of_passes_exactly_one_mod_bucket(pkey: int, partitions: int) -> None:
    part = partition_of(pkey, partitions)
    assert 0 <= part < partitions
    assert ModFilter(partitions, BucketSet.of([part])).passes(pkey)
    if partitions > 1:
        others = BucketSet.of([p for p in range(partitions) if p != part])
        assert not ModFilter(partitions, others).passes(pkey)


def test_member_filter_is_one_mod_filter_per_source() -> None:
    spec = member_filter(["shop.orders", "shop.items"], [5, 0, 1, 2, 7], 16)
    assert spec.to_json() == {
        "shop.items": {"type": "mod", "n": 16, "buckets": "[0-2,5,7]"},
        "shop.orders": {"type": "mod", "n": 16, "buckets": "[0-2,5,7]"},
    }
    assert FilterSpec.parse(spec.to_json_text()) == spec  # what goes in filter=


@pytest.mark.parametrize(("sources", "owned", "partitions", "message"), [
    ([], [0], 4, "at least one source"),
    ("shop.orders", [0], 4, "not one string"),
    ([""], [0], 4, "non-empty strings"),
    (["s"], [], 4, "owns no partitions"),
    (["s"], [4], 4, "out of range"),
    (["s"], [0], 0, "partitions must be in"),
])
def test_member_filter_bad_inputs(sources: object, owned: list[int], partitions: int,
                                  message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        member_filter(sources, owned, partitions)  # type: ignore[arg-type]


def _core_twins() -> list[ModuleType]:
    twins = [batch.twin("python")]
    if batch.native_available():
        twins.append(batch.twin("native"))
    elif os.environ.get("CI"):
        pytest.fail("the compiled batch module is not built")
    return twins


_keys: st.SearchStrategy[Key] = st.one_of(
    st.integers(INT64_MIN, INT64_MAX),
    st.sampled_from([0, 1, -1, INT64_MIN, INT64_MAX]),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.tuples(st.integers(-5, 5), st.text(max_size=3)),
)


@settings(max_examples=150, deadline=None)
@given(keys=st.lists(_keys, min_size=1, max_size=40), partitions=st.integers(1, 64),
       data=st.data())
def test_the_relay_serves_exactly_the_events_of_the_owned_partitions(
        keys: list[Key], partitions: int, data: st.DataObject) -> None:
    owned = data.draw(st.sets(st.integers(0, partitions - 1), min_size=1))
    sources = {"shop.orders": 0, "shop.items": 1}
    spec = member_filter(list(sources), owned, partitions)
    # As the relay builds its plan (relay/_server.py): a filter per source id.
    plan = FilterPlan(filters={sources[n]: f for n, f in spec.filters.items()},
                      needs_key=any(f.needs_key for f in spec.filters.values()))
    events = [encode_event(scn=7, source_id=i % 2, op=Op.UPSERT, key=k, value=b"v")
              for i, k in enumerate(keys)]
    check = WindowChecksum()
    for e in events:
        check.add_event(e)
    body = b"".join([*events, encode_eow(scn=7, event_count=check.count, checksum=check.crc)])

    expected = []
    for offset, header in iter_events(body):
        if header.source_id < 0:
            continue
        key = body[offset + HEADER_SIZE:offset + HEADER_SIZE + header.key_length]
        if partition_of(header.partition_key, partitions) in owned:
            expected.append((header.source_id, key))
        # Non-integer keys: the mod bucket of the pkey is the hash filter's bucket.
        if header.key_kind is not KeyKind.INT:
            assert header.partition_key == stable_key_hash(key)
            assert HashFilter(partitions, BucketSet.of(owned)).passes(0, key) == (
                partition_of(header.partition_key, partitions) in owned)

    for core in _core_twins():
        st_ = ReadState(0, 1 << 30, cp_scn=0, cp_offset=-1)
        core.select_events(body, 0, len(body), st_, core.compile_filter(plan))
        served_body = core.gather(body, st_.runs, st_.cp_size)
        served = [(h.source_id,
                   served_body[o + HEADER_SIZE:o + HEADER_SIZE + h.key_length])
                  for o, h in iter_events(served_body) if h.source_id >= 0]
        assert served == expected, core.IMPLEMENTATION
        assert st_.cp_scn == 7  # the EOW passes: the checkpoint moves past the window


@settings(max_examples=100, deadline=None)
@given(members=st.lists(_names, min_size=1, max_size=8, unique=True),
       partitions=st.integers(1, 64),
       pkeys=st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=1, max_size=50))
def test_the_members_filters_split_the_stream_exactly_once(
        members: list[str], partitions: int, pkeys: list[int]) -> None:
    result = assign(members, partitions)
    specs = [member_filter(["s"], parts, partitions) for parts in result.values() if parts]
    for pkey in pkeys:
        assert sum(spec.passes("s", pkey) for spec in specs) == 1
