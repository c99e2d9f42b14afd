"""Consumer groups, the pure part: which member owns which partition, and the filter
that makes the relay send a member exactly its partitions (DESIGN section 15, issue 17).

No I/O. The coordinator (ZooKeeper membership, the rebalance protocol, per-partition
checkpoints) is built on top of these and is not here yet.

Partitions
    A group splits each source into ``partitions`` (P) partitions. The partition of an
    event is the relay's ``mod`` filter bucket of the header's numeric partition key:
    ``abs(partition_key) % P`` (``databus.filters.ModFilter.passes``). For keys that are
    not a single integer the partition key is ``stable_key_hash`` of the key bytes, which
    is never negative, so the same function gives the ``hash`` filter's bucket: one
    ``mod`` filter covers every key kind and the relay never has to read key bytes.

Assignment (``assign``)
    Balanced: with M members, every member gets ``P // M`` or ``P // M + 1``
    partitions and each partition has exactly one owner. Sticky: a current member
    keeps what it owned before, up to its new quota; the partitions that move are those
    of departed members, the excess of members above their quota, and (not counted as
    moves) partitions nobody owned. The ``P % M`` larger quotas go to the members that
    owned the most before (ties: member name order), which is what makes the number of
    moved partitions the least any balanced assignment allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from databus.errors import ConfigError
from databus.filters import BucketSet, FilterSpec, ModFilter

# A group's partition count is a configuration value; every member holds its partition
# numbers (and a checkpoint per partition), so an absurd count is refused, not tried.
MAX_PARTITIONS = 1 << 16


def _check_partitions(partitions: object) -> int:
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise ConfigError(
            f"partitions must be an integer, got {type(partitions).__name__}"
        )
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(
            f"partitions must be in [1, {MAX_PARTITIONS}], got {partitions}"
        )
    return partitions


def _check_partition(value: object, partitions: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: partition {value!r} is not an integer")
    if not 0 <= value < partitions:
        raise ConfigError(
            f"{where}: partition {value} is out of range [0, {partitions})"
        )
    return value


def partition_of(partition_key: int, partitions: int) -> int:
    """The partition of an event whose header carries ``partition_key``.

    The relay's ``mod`` filter bucket (``ModFilter.passes``: ``abs(pkey) % n``, with
    the mathematical ``abs``, so -2**63 lands in ``2**63 % n``): the filter of
    ``member_filter`` passes an event exactly when this partition is one it names.
    """
    n = _check_partitions(partitions)
    if isinstance(partition_key, bool) or not isinstance(partition_key, int):
        raise ConfigError(
            f"partition key must be an integer, got {type(partition_key).__name__}"
        )
    return abs(partition_key) % n


def _check_members(members: Sequence[str]) -> list[str]:
    if isinstance(members, str):
        raise ConfigError("members must be a sequence of names, not one string")
    names = list(members)
    if not names:
        raise ConfigError("a group assignment needs at least one member")
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"member names must be non-empty strings, got {name!r}")
        if name in seen:
            raise ConfigError(f"member {name!r} is listed twice")
        seen.add(name)
    return sorted(names)


def _check_previous(
    previous: Mapping[str, Sequence[int]], partitions: int
) -> dict[str, list[int]]:
    owner_of: dict[int, str] = {}
    checked: dict[str, list[int]] = {}
    for member in sorted(previous, key=str):
        if not isinstance(member, str) or not member:
            raise ConfigError(
                f"previous assignment: member names must be non-empty strings, got {member!r}"
            )
        owned = previous[member]
        if isinstance(owned, str | bytes) or not isinstance(owned, Iterable):
            raise ConfigError(
                f"previous assignment of {member!r}: expected a sequence of partitions, "
                f"got {type(owned).__name__}"
            )
        parts: list[int] = []
        for value in owned:
            part = _check_partition(value, partitions, f"previous assignment of {member!r}")
            if part in owner_of:
                other = owner_of[part]
                raise ConfigError(
                    f"previous assignment: partition {part} is named twice "
                    f"({other!r} and {member!r})"
                    if other != member
                    else f"previous assignment: partition {part} is named twice by {member!r}"
                )
            owner_of[part] = member
            parts.append(part)
        checked[member] = sorted(parts)
    return checked


def assign(
    members: Sequence[str],
    partitions: int,
    previous: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """The partitions of each member: balanced, sticky, deterministic.

    ``members``: the current members' names (any order, no duplicates).
    ``partitions``: P, the group's partition count; partitions are ``0 .. P-1``.
    ``previous``: the assignment in force, if any; it may name departed members and
    may leave partitions unowned (they are handed out like a departed member's), but
    must not name a partition twice or one outside ``0 .. P-1``.

    Returns every member (sorted by name, those with nothing included) mapped to its
    partitions in ascending order. With M members each gets ``P // M`` or one more;
    the ``P % M`` larger shares go to the members that held the most before, ties by
    name. Each current member keeps the lowest-numbered of its previous partitions up
    to its share; the freed ones (departed members', over-share excess, unowned) go,
    lowest first, to the members below their share, in the same order. The result
    does not depend on the order of ``members`` or of ``previous``, and
    ``assign(m, P, assign(m, P, x)) == assign(m, P, x)``.

    Raises ``ConfigError`` for no members, a duplicate or empty member name, P outside
    ``[1, MAX_PARTITIONS]``, or a bad ``previous``.
    """
    names = _check_members(members)
    count = _check_partitions(partitions)
    before = _check_previous(previous, count) if previous is not None else {}

    base, extra = divmod(count, len(names))
    # Who gets the larger share: those holding most already (keeps the most in place).
    ranked = sorted(names, key=lambda name: (-len(before.get(name, ())), name))
    quota = {name: base + (1 if rank < extra else 0) for rank, name in enumerate(ranked)}

    result: dict[str, list[int]] = {}
    kept: set[int] = set()
    for name in names:
        keep = before.get(name, [])[: quota[name]]
        result[name] = list(keep)
        kept.update(keep)
    free = iter([p for p in range(count) if p not in kept])
    for name in ranked:
        owned = result[name]
        while len(owned) < quota[name]:
            owned.append(next(free))
    return {name: tuple(sorted(result[name])) for name in names}


def member_filter(
    source_names: Iterable[str], owned_partitions: Iterable[int], partitions: int
) -> FilterSpec:
    """The server-side filter that streams a member exactly its partitions.

    One ``mod`` filter per source, ``n`` = P and the owned partitions as buckets: the
    relay (and the bootstrap service, which pushes it down to SQL) passes an event of
    these sources iff ``partition_of(its partition key, P)`` is owned. Raises
    ``ConfigError`` for no sources, a partition out of range, or no partitions at all
    (a member with nothing assigned, when members outnumber partitions, has nothing to
    stream; a filter that passes nothing is refused by ``databus.filters``).
    """
    count = _check_partitions(partitions)
    if isinstance(source_names, str):
        raise ConfigError("source_names must be a sequence of names, not one string")
    sources = list(source_names)
    if not sources:
        raise ConfigError("a member filter needs at least one source")
    for name in sources:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"source names must be non-empty strings, got {name!r}")
    owned = sorted({_check_partition(p, count, "member filter") for p in owned_partitions})
    if not owned:
        raise ConfigError(
            "a member that owns no partitions has nothing to stream: do not open a stream "
            "for it (there are more members than partitions)"
        )
    mod = ModFilter(count, BucketSet.of(owned))
    return FilterSpec(dict.fromkeys(sources, mod))
