"""Server-side filters (docs/filters.md): which events of a source a consumer gets.

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

from databus.filters._buckets import INT64_MAX, INT64_MIN, BucketSet, Paramstyle
from databus.filters._source_filters import (
    HashFilter,
    IntervalFilter,
    ModFilter,
    RangeFilter,
    SourceFilter,
)
from databus.filters._spec import FilterSpec

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
